"""Every documented example runs as written, in the order a newcomer meets it: the
quickstart, then the README's shell, Python and SQL examples, the Python API reference's
example (docs/reference/api.md) and every ``--help`` example, one after another in one
folder and one store (``./results``), each exiting 0. Of the README's: the relaunch of a
part of the grid trains nothing, ``status`` counts the whole grid, the Python example adds
a sweep of its own beside the quickstart, and each SQL query returns rows.

The examples are read from the documents and the commands themselves, not copied here,
so an example that changes is tested as it now reads. What a newcomer on one machine
cannot run is left out, each for a reason said below (a cluster, a bucket, a sweep the
quickstart does not make). The quickstart's spec is the repository's with fewer steps
(``train.steps``, and ``analysis.at_time`` at the same fraction), so the whole runs in
about two minutes on 2 cores; every launch joins the session's shared Ray
(``$RAY_ADDRESS``), as a launch on a cluster would.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent

#: Examples a newcomer on one machine cannot run, and why (matched in the command).
SKIPPED = {
    "s3://": "needs an object store",
    "--address auto": "needs a Ray cluster",
    "lazy_rich": "a sweep the quickstart does not make (sweeps/lazy_rich.yaml trains for long)",
    "standing stop": "would stop the Ray that the test session shares",
    "refine quickstart": "an adaptive search of many launches: tests/test_refine.py runs it",
    "saddle_escape": "trains for long (its own tests run it shortened)",
    "gallery --full": "every result at its paper's range: hours (tests/test_gallery.py checks each)",
}

#: The quickstart as scripts/quickstart runs it.
QUICKSTART = [
    "phasesweep run sweeps/quickstart.yaml",
    "phasesweep analyze quickstart",
    "phasesweep plot quickstart --out results/figures/quickstart",
    "phasesweep report quickstart --out results/figures/quickstart",
]


def _blocks(text: str, language: str) -> list[str]:
    """The fenced code blocks of ``language`` in a Markdown text."""
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def _shell_lines(block: str) -> list[str]:
    """The ``phasesweep`` command lines of a shell block or a ``--help`` epilog."""
    lines = [line.strip() for line in block.splitlines()]
    return [line for line in lines if re.match(r"(phasesweep |echo .*\| phasesweep )", line)]


def _help_examples() -> list[str]:
    from phasesweep._cli._main import COMMANDS

    return [line for c in COMMANDS for line in _shell_lines(c.examples)]


def _skipped(command: str) -> str | None:
    return next((why for what, why in SKIPPED.items() if what in command), None)


#: What a README shell example must print (stderr or stdout), once the quickstart's 100
#: points are stored: a relaunch of a part of the grid trains nothing, and status counts
#: the whole grid.
README_SAYS = {
    "phasesweep run sweeps/quickstart.yaml --set 'grid.width=[64,256]'": (
        "50 points; skipping 50 already stored; training 0"
    ),
    "phasesweep status quickstart": "100 of 100 points done, 0 remaining",
}


@pytest.mark.process
@pytest.mark.ray
@pytest.mark.heavy
def test_every_documented_example_runs_in_order(tmp_path, shared_ray):
    from phasesweep.pipeline.run._standing import driver_env
    from phasesweep.storage import run_query

    from phasesweep import standing_address

    assert shared_ray == "standing"
    shutil.copytree(REPO / "sweeps", tmp_path / "sweeps")
    spec = yaml.safe_load((REPO / "sweeps" / "quickstart.yaml").read_text())
    shorter = 300 / spec["train"]["steps"]
    spec["train"]["steps"] = 300
    spec["analysis"]["at_time"] = spec["analysis"]["at_time"] * shorter
    (tmp_path / "sweeps" / "quickstart.yaml").write_text(yaml.safe_dump(spec))
    readme = (REPO / "README.md").read_text()
    api = (REPO / "docs" / "reference" / "api.md").read_text()
    # the phase-diagram query, saved as a newcomer saves it for `query @phase.sql`
    (phase_sql,) = [b for b in _blocks(readme, "sql") if "AS value" in b]
    (tmp_path / "phase.sql").write_text(phase_sql)

    bin_dir = Path(sys.executable).parent
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(REPO),
        "RAY_ADDRESS": standing_address() or "",
        **driver_env(),  # its token
        "MPLBACKEND": "Agg",
    }
    env.pop("PHASESWEEP_STORE", None)

    steps: list[tuple[str, list[str]]] = [("quickstart", ["bash", "-c", c]) for c in QUICKSTART]
    for block in _blocks(readme, "bash"):
        steps += [("README", ["bash", "-c", c]) for c in _shell_lines(block)]
    for block in _blocks(readme, "python"):
        steps.append(("README", [sys.executable, "-c", block]))
    for block in _blocks(readme, "sql"):
        steps.append(("README", ["phasesweep", "query", block]))
    inline = re.search(r"`(from phasesweep\.analysis import [^`]*)`", readme)
    assert inline, "the README names the phase diagram's query"
    steps.append(("README", [sys.executable, "-c", inline.group(1)]))
    # the reference's examples are docstrings' literal blocks: "::", then indented lines
    literal = re.findall(r"::\n\n((?:    .*\n|\n)+)", api)
    example = [textwrap.dedent(b) for b in literal if "phasesweep.run(" in b]
    assert example, "the API reference has an example that runs a sweep"
    steps.append(("api.md", [sys.executable, "-c", example[0]]))
    steps += [("--help", ["bash", "-c", c]) for c in _help_examples()]

    ran, checked = [], set()
    for where, argv in steps:
        command = argv[-1]
        if _skipped(command):
            continue
        proc = subprocess.run(
            argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
        )
        ran.append(command)
        assert proc.returncode == 0, (
            f"{where} example exits {proc.returncode}: {shlex.join(argv)[:300]}\n"
            f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
        )
        assert "Traceback" not in proc.stderr, (where, command, proc.stderr[-3000:])
        if where != "README":
            continue
        for start, said in README_SAYS.items():
            if command.startswith(start):
                assert said in proc.stdout + proc.stderr, (command, said, proc.stderr)
                checked.add(start)
        if argv[0] == sys.executable and "quickstart_short" in command:
            _, rows = run_query(
                tmp_path / "results", "SELECT sweep, count(*) FROM runs GROUP BY ALL ORDER BY 1"
            )
            assert rows == [("quickstart", 100), ("quickstart_short", 100)], rows
            checked.add("quickstart_short")
        if argv[:2] == ["phasesweep", "query"]:
            _, rows = run_query(tmp_path / "results", command.strip().rstrip(";"))
            assert rows and rows[0][-1] is not None, (command, rows[:3])
            checked.add("sql")
    assert len(ran) >= 25, ran
    assert checked == {*README_SAYS, "quickstart_short", "sql"}, checked
