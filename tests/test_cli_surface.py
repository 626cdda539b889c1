"""The command line's habits, as real invocations: --version, help with examples, SQL from
stdin or a file, one-line errors with exit 2 (SQL, missing or unreachable store, unknown
sweep) and no traceback unless --debug, and the table, CSV and JSON output formats."""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import socket
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from phasesweep.storage import run_query

from phasesweep import _cli as cli

GRID = {"init_scale": [0.01, 0.1, 1.0, 3.0], "width": [16, 256], "depth": [2], "seed": [0, 1]}


@pytest.fixture(scope="module")
def store(synthetic_store) -> Path:
    """A store holding sweep ``synth`` (closed-form curves; init 3 at width 256 diverges)."""
    s, _ = synthetic_store("synth", GRID)
    return Path(s.root)


def _run(phasesweep_cli, args, stdin=None, timeout=300, env=None):
    proc = phasesweep_cli(args, env_extra=env, stdin=None if stdin is None else -1)
    out, err = proc.communicate(stdin, timeout=timeout)
    return proc.returncode, out, err


def _fingerprint(root: Path) -> dict:
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _one_line_error(err: str) -> None:
    assert "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("phasesweep: "), err


def test_version(phasesweep_cli):
    code, out, _ = _run(phasesweep_cli, ["--version"])
    assert code == 0 and out.strip() == f"phasesweep {version('phasesweep')}"


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return action.choices


def test_every_subcommand_has_examples_and_every_option_a_help(phasesweep_cli):
    parser = cli.build_parser()
    subs = _subparsers(parser)
    assert {"run", "status", "query", "analyze", "plot", "report"} <= set(subs)
    for name, sub in [("phasesweep", parser), *subs.items()]:
        assert "examples:" in (sub.epilog or ""), name
        examples = sub.epilog.split("examples:", 1)[1]
        assert f"phasesweep {'' if sub is parser else name}" in examples, name
        for action in sub._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            assert action.help and action.help != argparse.SUPPRESS, (name, action.dest)
    # as printed by the real command, examples keep their line breaks
    code, out, _ = _run(phasesweep_cli, ["query", "--help"])
    assert code == 0
    assert '\n  echo "SHOW TABLES" | phasesweep query -\n' in out


def test_sql_from_stdin_at_file_and_file_option(phasesweep_cli, store, tmp_path):
    sql = "SELECT count(*) AS n FROM runs WHERE status = 'diverged'"
    expected = [{"n": run_query(store, sql)[1][0][0]}]
    assert expected[0]["n"] > 0
    (tmp_path / "q.sql").write_text(sql + "\n")
    base = ["--store", str(store), "--format", "json"]
    for args, stdin in (
        (["query", "-", *base], sql),
        (["query", f"@{tmp_path / 'q.sql'}", *base], None),
        (["query", "--file", str(tmp_path / "q.sql"), *base], None),
    ):
        code, out, err = _run(phasesweep_cli, args, stdin=stdin)
        assert code == 0, err
        assert json.loads(out) == expected
    for args in (["query", *base], ["query", "SELECT 1", "--file", str(tmp_path / "q.sql"), *base]):
        code, _, err = _run(phasesweep_cli, args)
        assert code == 2 and "--file" in err
        _one_line_error(err)
    code, _, err = _run(phasesweep_cli, ["query", f"@{tmp_path / 'none.sql'}", *base])
    assert code == 2 and "none.sql" in err and "cannot read" in err


@pytest.mark.parametrize(
    "sql,shown",
    [
        ("SELEC 1", "Parser Error"),
        ("SELECT no_such_column FROM runs", "Binder Error"),
        ("SELECT * FROM runz", 'Did you mean "runs"'),
        ("SELECT 'abc'::INTEGER", "Conversion Error"),
    ],
)
def test_sql_errors_are_one_line_exit_2(phasesweep_cli, store, sql, shown):
    code, out, err = _run(phasesweep_cli, ["query", sql, "--store", str(store)])
    assert code == 2 and out == ""
    assert "SQL error" in err and shown in err
    _one_line_error(err)


def test_debug_shows_the_traceback(phasesweep_cli, store):
    code, _, err = _run(phasesweep_cli, ["--debug", "query", "SELEC 1", "--store", str(store)])
    assert code == 2
    assert "Traceback" in err and err.rstrip().endswith('syntax error at or near "SELEC"')


def test_unexpected_error_is_one_line_exit_3_with_traceback_under_debug(capsys, store, monkeypatch):
    from phasesweep import _api

    def broken(*args, **kwargs):
        raise RuntimeError("something broke\nsecond line")

    monkeypatch.setattr(_api, "analyze", broken)
    assert cli.main(["analyze", "synth", "--store", str(store)]) == 3
    err = capsys.readouterr().err
    _one_line_error(err)
    assert "RuntimeError: something broke" in err and "--debug" in err
    assert cli.main(["--debug", "analyze", "synth", "--store", str(store)]) == 3
    assert "Traceback" in capsys.readouterr().err


READ_COMMANDS = [
    ["status"],
    ["status", "synth"],
    ["query", "SELECT 1"],
    ["analyze", "synth"],
    ["plot", "synth"],
    ["report", "synth"],
]


@pytest.mark.parametrize("args", READ_COMMANDS, ids=lambda a: a[0])
def test_missing_store_is_an_error_not_an_empty_store(phasesweep_cli, tmp_path, args):
    missing = tmp_path / "no_such_store"
    code, out, err = _run(phasesweep_cli, [*args, "--store", str(missing)])
    assert code == 2 and out == ""
    # the path as given, or cut in the middle where long
    assert f"--store = '{str(missing)[:12]}" in err and "no store there" in err
    _one_line_error(err)
    assert not missing.exists()


@pytest.fixture
def closed_port() -> int:
    """A loopback TCP port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("args", [["status"], ["query", "SELECT 1"]], ids=lambda a: a[0])
def test_unreachable_s3_endpoint_is_one_line_exit_2(phasesweep_cli, closed_port, args):
    env = {
        "PHASESWEEP_S3_ENDPOINT": f"http://127.0.0.1:{closed_port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    code, out, err = _run(phasesweep_cli, [*args, "--store", "s3://bucket/prefix"], env=env)
    assert code == 2 and out == ""
    assert "s3://bucket/prefix" in err and "cannot reach it" in err and str(closed_port) in err
    _one_line_error(err)


@pytest.mark.parametrize(
    "args", [["status", "synt"], ["analyze", "synt"], ["plot", "synt"], ["report", "synt"]]
)
def test_unknown_sweep_exits_2_with_did_you_mean_and_writes_nothing(phasesweep_cli, store, args):
    before = _fingerprint(store)
    code, out, err = _run(phasesweep_cli, [*args, "--store", str(store)])
    assert code == 2 and out == ""
    assert "no sweep 'synt'" in err and "did you mean 'synth'?" in err
    _one_line_error(err)
    assert _fingerprint(store) == before


def test_unknown_sweep_far_from_any_name_lists_the_stored_ones(phasesweep_cli, store):
    code, _, err = _run(phasesweep_cli, ["status", "quickstart", "--store", str(store)])
    assert code == 2 and "it holds: synth" in err


def test_a_sweep_with_only_its_spec_has_a_status_and_nothing_to_analyze(
    phasesweep_cli, synthetic_store
):
    s, _ = synthetic_store("other", GRID)
    s.write_spec("planned", "name: planned\ngrid: {seed: [0, 1]}\n")
    code, out, err = _run(phasesweep_cli, ["status", "planned", "--store", s.root])
    assert code == 0, err
    assert "no runs stored for sweep planned" in out
    for command in ("analyze", "plot", "report"):
        code, out, err = _run(phasesweep_cli, [command, "planned", "--store", s.root])
        assert code == 2 and "'planned' has no runs yet" in err
        _one_line_error(err)


def test_interrupt_exits_130_without_traceback(capsys, store, monkeypatch):
    from phasesweep import _api

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(_api, "analyze", interrupted)
    assert cli.main(["analyze", "synth", "--store", str(store)]) == 130
    assert capsys.readouterr().err == "phasesweep: interrupted\n"


def test_show_tables_lists_only_the_views(phasesweep_cli, store):
    code, out, err = _run(phasesweep_cli, ["query", "SHOW TABLES", "--store", str(store)])
    assert code == 0, err
    names = [line.strip() for line in out.splitlines()[2:-1]]
    assert names == sorted(
        [
            "runs",
            "trajectories",
            "layers",
            "summaries",
            "plateaus",
            "scaling_fits",
            "boundaries",
            "gallery_checks",
            "manifest",
        ]
    )


def test_table_output_counts_rows_and_clips_wide_cells(phasesweep_cli, store):
    sql = "SELECT repeat('x', 100) AS wide, 7 AS n, [1.5, NULL] AS l UNION ALL SELECT 'y', 8, []"
    code, out, err = _run(phasesweep_cli, ["query", sql, "--store", str(store)])
    assert code == 0, err
    lines = out.splitlines()
    assert lines[-1] == "(2 rows)"
    head, rule, first, second = lines[:4]
    assert head.split() == ["wide", "n", "l"]
    assert first.startswith("x" * 39 + "…") and "x" * 41 not in first
    assert first.split()[1:] == ["7", "[1.5,", "null]"]  # lists shown as JSON
    assert max(len(word) for word in rule.split()) == cli_max_cell()
    code, out, _ = _run(phasesweep_cli, ["query", "SELECT 1 AS one", "--store", str(store)])
    assert out.splitlines()[-1] == "(1 row)"


def test_a_long_result_shows_its_first_and_last_rows_as_a_table_and_all_as_csv_or_json(
    phasesweep_cli, store
):
    """As DuckDB's shell: a table shows 40 rows of a longer result (the first and last 20)
    and counts the rest; --max-rows N shows N, 0 all; csv and json give every row."""
    sql = "SELECT i, i * i AS sq FROM range(100) t(i) ORDER BY i"
    at = ["--store", str(store)]
    code, out, err = _run(phasesweep_cli, ["query", sql, *at, "--format", "csv"])
    assert code == 0, err
    every = [tuple(map(int, line.split(","))) for line in out.splitlines()[1:]]
    assert every == [(i, i * i) for i in range(100)]  # the independent listing
    code, out, _ = _run(phasesweep_cli, ["query", sql, *at, "--format", "json"])
    assert len(json.loads(out)) == 100

    def table(*extra: str) -> tuple[list[tuple[int, int] | None], str]:
        code, out, err = _run(phasesweep_cli, ["query", sql, *at, *extra])
        assert code == 0, err
        lines = out.splitlines()
        body = [
            None if ln.split() == ["…", "…"] else tuple(map(int, ln.split())) for ln in lines[2:-1]
        ]
        return body, lines[-1]

    body, count = table()
    assert body == [*every[:20], None, *every[-20:]]
    assert count.startswith("(100 rows, 40 shown; --max-rows 0 shows all")
    body, count = table("--max-rows", "7")
    assert body == [*every[:4], None, *every[-3:]] and count.startswith("(100 rows, 7 shown")
    body, count = table("--max-rows", "0")
    assert body == every and count == "(100 rows)"
    body, count = table("--max-rows", "100")
    assert body == every and count == "(100 rows)"


def cli_max_cell() -> int:
    from phasesweep._format import MAX_CELL

    return MAX_CELL


def test_csv_has_lf_line_ends_and_lists_as_json(phasesweep_cli, store):
    sql = (
        "SELECT run_id, status, init_fro_norms, final_train_loss, {'a': 1, 'b': [2]} AS s "
        "FROM runs ORDER BY run_id"
    )
    # bytes as written (text mode would turn \r\n into \n)
    proc = subprocess.run(
        [sys.executable, "-m", "phasesweep._cli", "query", sql, "--store", str(store)]
        + ["--format", "csv"],
        capture_output=True,
        timeout=300,
    )
    raw = proc.stdout
    assert proc.returncode == 0, proc.stderr
    assert b"\r" not in raw and raw.endswith(b"\n")
    rows = list(csv.reader(io.StringIO(raw.decode())))
    names, expected = run_query(store, sql)
    assert rows[0] == names and len(rows) == len(expected) + 1
    for got, want in zip(rows[1:], expected):
        assert got[0] == want[0] and got[1] == want[1]
        assert (json.loads(got[2]) if got[2] else None) == want[2]
        assert (float(got[3]) if got[3] else None) == want[3]  # NULL is an empty field
        assert json.loads(got[4]) == {"a": 1, "b": [2]}


def test_json_is_strict_with_null_for_nan_and_arrays_for_lists(phasesweep_cli, store):
    sql = (
        "SELECT 'nan'::DOUBLE AS a, 'inf'::DOUBLE AS b, -'inf'::DOUBLE AS c, "
        "[1.0, 'nan'::DOUBLE, NULL] AS l, 2.5::DECIMAL(4, 1) AS d, "
        "TIMESTAMPTZ '2026-01-02 03:04:05+00' AS t"
    )
    code, out, err = _run(phasesweep_cli, ["query", sql, "--store", str(store), "--format", "json"])
    assert code == 0, err

    def refuse(token):
        raise AssertionError(f"non-standard JSON token {token}")

    assert json.loads(out, parse_constant=refuse) == [
        {
            "a": None,
            "b": None,
            "c": None,
            "l": [1.0, None, None],
            "d": 2.5,
            "t": "2026-01-02T03:04:05+00:00",
        }
    ]
    # a real column: every value matches the store's, NaN-free
    sql = "SELECT run_id, final_train_loss, init_fro_norms FROM runs ORDER BY run_id"
    code, out, _ = _run(phasesweep_cli, ["query", sql, "--store", str(store), "--format", "json"])
    got = json.loads(out, parse_constant=refuse)
    _, rows = run_query(store, sql)
    assert [(r["run_id"], r["final_train_loss"], r["init_fro_norms"]) for r in got] == [
        (i, None if v is None or not math.isfinite(v) else v, lst) for i, v, lst in rows
    ]


def test_status_of_a_known_sweep_and_of_all(phasesweep_cli, store):
    code, out, err = _run(phasesweep_cli, ["status", "synth", "--store", str(store)])
    assert code == 0, err
    _, rows = run_query(store, "SELECT status, count(*) FROM runs GROUP BY ALL ORDER BY ALL")
    for status, n in rows:
        assert any(line.split() == ["synth", status, str(n)] for line in out.splitlines()), out
    total = len(GRID["init_scale"]) * len(GRID["width"]) * len(GRID["seed"])
    assert f"{total} of {total} points done, 0 remaining" in out
