"""What the command line says: counts in the right number, errors that name the argument
and point to the right help, defaults in ``--help``, a did-you-mean for a sweep."""

from __future__ import annotations

import argparse

import pytest

from phasesweep._cli import main
from phasesweep._cli._main import build_parser
from phasesweep._format import counted


def test_counted_says_one_in_the_singular():
    assert [counted(n, "chunk") for n in (0, 1, 2)] == ["0 chunks", "1 chunk", "2 chunks"]


def test_a_dry_run_of_one_chunk_says_chunk(tmp_path, capsys, tiny_spec):
    spec = tiny_spec({"grid.seed": [0], "grid.init_scale": [1.0]})
    assert main(["run", str(spec), "--store", str(tmp_path / "s"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "1 to train in 1 chunk\n" in out and ": 1 member, depth 2" in out, out


@pytest.mark.parametrize("argv", [["status", "a", "b"], ["status", "--bogus"]])
def test_an_extra_argument_is_named_with_the_subcommands_help(capsys, argv):
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (
        f"phasesweep status: error: unrecognized arguments: {argv[-1]} "
        "(see phasesweep status --help)"
    )


def test_refine_help_shows_every_default():
    """Each option of ``refine`` that has a default says it (argparse's help does not)."""
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    refine = sub.choices["refine"]
    options = [a for a in refine._actions if a.option_strings and a.dest != "help"]
    assert {a.dest for a in options if not a.required} >= {"axis", "budget", "tol", "per_line"}
    for a in options:
        if not a.required:
            assert "default" in (a.help or ""), a.option_strings


def test_refine_of_an_unknown_sweep_offers_the_close_names(synthetic_store, capsys):
    grid = {"init_scale": [0.1, 1.0], "width": [16], "depth": [2], "seed": [0]}
    store, _ = synthetic_store("quickstart", grid)
    argv = ["refine", "quickstrt", "--metric", "param_rel_change", "--level", "0.1"]
    assert main([*argv, "--store", store.uri, "--in-process"]) == 2
    err = capsys.readouterr().err
    assert "no sweep 'quickstrt'" in err and "did you mean 'quickstart'?" in err, err


@pytest.mark.parametrize(
    "sql,shown",
    [
        ("SELECT * FROM run", 'Did you mean "runs"?'),
        ("SELECT * FROM summary", 'Did you mean "summaries"?'),
        (
            "SELECT * FROM tables",
            "The store's tables: boundaries, gallery_checks, layers, manifest, plateaus",
        ),
        (
            "SELECT * FROM duckdb_table",
            "The store's tables: boundaries, gallery_checks, layers, manifest",
        ),
        ("INSTALL httpfs", "INSTALL statement not allowed, queries are read-only"),
        ("FORCE INSTALL httpfs", "INSTALL statement not allowed, queries are read-only"),
        ("LOAD httpfs", "LOAD statement not allowed, queries are read-only"),
    ],
)
def test_a_refused_query_names_our_tables_and_what_it_is(synthetic_store, capsys, sql, shown):
    """DuckDB's guesses (its own ``duckdb_tables``, ``information_schema.tables``) are not
    tables of the store: the suggestion is the store's closest table, or all of them."""
    store, _ = synthetic_store("q", {"init_scale": [0.1], "width": [16], "depth": [2], "seed": [0]})
    assert main(["query", sql, "--store", store.uri]) == 2
    err = capsys.readouterr().err
    assert shown in err and '"duckdb_' not in err and "information_schema" not in err, err
    assert err.count("Did you mean") <= 1, err


def test_status_names_the_checkpoints_a_relaunch_resumes(synthetic_store, capsys):
    """After a Ctrl-C the store holds checkpoints of the chunks in training: ``status``
    says how many, and that running the sweep again resumes them; none, nothing said."""
    from phasesweep.storage._checkpoints import Checkpoint

    store, _ = synthetic_store(
        "ck", {"init_scale": [0.1], "width": [16], "depth": [2], "seed": [0]}
    )
    assert main(["status", "ck", "--store", store.uri]) == 0
    assert "checkpointed" not in capsys.readouterr().out
    for chunk in ("c0", "c1"):
        Checkpoint.of(store, "ck", chunk, [f"{chunk}-run"]).write(b"state")
    Checkpoint.of(store, "other", "c0", ["r"]).write(b"state")  # another sweep's
    assert main(["status", "ck", "--store", store.uri]) == 0
    out = capsys.readouterr().out
    assert "2 chunks checkpointed mid-training" in out and "resumes" in out, out
    assert main(["status", "--store", store.uri]) == 0
    assert "3 chunks checkpointed mid-training" in capsys.readouterr().out
