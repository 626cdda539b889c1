"""``scripts/gpu-check`` without a GPU (issue 33): on a copy of the script and pyproject.toml,
with a fake Python (the real one, whose installed versions a ``sitecustomize`` overrides;
its ``-m venv``, ``-m pip``, ``-m pytest`` and ``-m benchmarks.*`` only logged), what it
decides to install and from where, what it runs, and that it stops on a torch outside the
project's range; and what ``scripts/gpu-bench`` runs after it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[1]

#: The versions this file's fake Python reports: ``name=version`` (``name=`` for none), and
#: ``sys.base_prefix`` reset to ``sys.prefix`` (no virtual environment) where asked.
SITECUSTOMIZE = """
import importlib.metadata as metadata
import os
import sys

fake = dict(p.split("=") for p in os.environ.get("FAKE_VERSIONS", "").split(",") if p)
real = metadata.version


def version(name):
    if name.lower() in fake:
        if not fake[name.lower()]:
            raise metadata.PackageNotFoundError(name)
        return fake[name.lower()]
    return real(name)


metadata.version = version
if os.environ.get("FAKE_NO_VENV"):
    sys.base_prefix = sys.prefix
"""


def torch_range() -> tuple[str, str]:
    """pyproject.toml's torch range, (lowest, first excluded)."""
    found = re.search(r'"torch>=([\d.]+),<([\d.]+)"', (ROOT / "pyproject.toml").read_text())
    assert found, "pyproject.toml states torch as a range"
    return found.group(1), found.group(2)


def test_every_stated_torch_range_is_pyprojects():
    """The prose that repeats the range (the README, scripts/setup, this script) states
    pyproject.toml's, so widening it cannot leave a stale copy behind."""
    wanted = torch_range()
    for name, copies in [("README.md", 2), ("scripts/setup", 1), ("scripts/gpu-check", 1)]:
        stated = re.findall(
            r"torch\s*(?:>=|≥)\s*([\d.]+),\s*<\s*([\d.]+)", (ROOT / name).read_text()
        )
        assert stated == [wanted] * copies, name


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A tree holding the script and pyproject.toml, and a fake ``python`` in ``bin``."""
    (tmp_path / "scripts").mkdir()
    for script in ("gpu-check", "gpu-bench"):
        shutil.copy(ROOT / "scripts" / script, tmp_path / "scripts")
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    fake = tmp_path / "bin" / "python"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\n"
        f'echo "PYTHONPATH=$PYTHONPATH $0 $*" >> {tmp_path}/log\n'
        'case "$1 $2" in\n'
        '"-m venv") mkdir -p "$4/bin" && cp "$0" "$4/bin/python"; exit 0 ;;\n'
        '"-m pip" | "-m pytest") exit 0 ;;\n'
        '"-m benchmarks."*) [ "$2" = "$FAKE_FAILS" ] && exit 3; exit 0 ;;\n'
        "esac\n"
        f'PYTHONPATH={site} exec {sys.executable} "$@"\n'
    )
    fake.chmod(0o755)
    return tmp_path


def logged(tree: Path, what: str) -> list[str]:
    """The fake Python's logged calls with ``-m what``."""
    calls = (tree / "log").read_text().splitlines()
    return [c for c in calls if f" -m {what}" in c]


def run_script(
    tree: Path,
    *args: str,
    versions: str = "",
    venv: bool = True,
    script: str = "gpu-check",
    fails: str = "",
) -> subprocess.CompletedProcess:
    """Run ``script`` of ``tree`` with its fake Python; ``fails``: the benchmark module
    whose run exits 3."""
    env = {
        **os.environ,
        "PYTHON": str(tree / "bin" / "python"),
        "FAKE_VERSIONS": versions,
        "FAKE_FAILS": fails,
    }
    env.pop("PYTHONPATH", None)
    if not venv:
        env["FAKE_NO_VENV"] = "1"
    return subprocess.run(
        ["bash", str(tree / "scripts" / script), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


@pytest.mark.parametrize("script", ["gpu-check", "gpu-bench"])
def test_the_script_parses(script):
    subprocess.run(["bash", "-n", str(ROOT / "scripts" / script)], check=True)


def test_a_machine_with_everything_installs_nothing_and_runs_the_tier_from_the_tree(tree):
    low, _ = torch_range()
    done = run_script(tree, "--dry-run", "-x", "-k", "resume", versions=f"torch={low}.0+cu130")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"gpu-check: {tree}/bin/python has what the tier needs: installing nothing"
    assert lines[1] == (
        f"gpu-check: would run: env PYTHONPATH={tree} {tree}/bin/python -m pytest -m gpu "
        "--noconftest -p no:cacheprovider -rs tests/test_gpu.py -x -k resume"
    )
    assert not (tree / ".venv-gpu").exists()


@pytest.mark.parametrize("wheels", [False, True])
def test_what_is_missing_or_too_old_is_installed_from_wheels_where_they_are(tree, wheels):
    if wheels:
        (tree / "wheels").mkdir()
    done = run_script(tree, "--dry-run", versions="pydantic=,pyyaml=5.4.1,pandas=2.2.0")
    assert done.returncode == 0, done.stderr
    source = "./wheels" if wheels else "PyPI"
    assert done.stdout.splitlines()[0] == (
        f"gpu-check: installing pydantic>=2.6 pyyaml>=6 from {source} into {tree}/bin/python"
    )


def test_outside_a_virtual_environment_it_installs_into_one_that_sees_the_machines_packages(
    tree,
):
    done = run_script(tree, "--dry-run", versions="pytest=", venv=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == (
        "gpu-check: installing pytest>=8 from PyPI into .venv-gpu/bin/python"
    )
    assert ".venv-gpu/bin/python -m pytest" in done.stdout
    assert not (tree / ".venv-gpu").exists()  # a dry run makes nothing


@pytest.mark.parametrize("torch", ["", "2.10.1+cu128", "1.13.0"])
def test_no_torch_or_an_older_one_stops_it_naming_the_range(tree, torch):
    low, high = torch_range()
    done = run_script(tree, "--dry-run", versions=f"torch={torch},pydantic=")
    assert done.returncode == 2 and done.stdout == ""
    have = f"torch {torch}" if torch else "no torch"
    assert f"has {have}; the project needs torch>={low},<{high}" in done.stderr


def test_a_newer_torch_runs_with_a_warning(tree):
    _, high = torch_range()
    done = run_script(tree, "--dry-run", versions=f"torch={high}.1")
    assert done.returncode == 0
    assert f"torch {high}.1 is newer than the range tested (<{high})" in done.stderr
    assert "installing nothing" in done.stdout


def test_outside_a_virtual_environment_it_makes_one_and_installs_offline_from_wheels(tree):
    """The commands a run without --dry-run gives: .venv-gpu made seeing the machine's
    packages, pip asked for the missing need only, with no index, and the tier run there."""
    (tree / "wheels").mkdir()
    done = run_script(tree, "-x", versions="pytest=", venv=False)
    assert done.returncode == 0, done.stderr
    assert logged(tree, "venv") == [
        f"PYTHONPATH= {tree}/bin/python -m venv --system-site-packages .venv-gpu"
    ]
    assert logged(tree, "pip") == [
        "PYTHONPATH= .venv-gpu/bin/python -m pip install -q --no-index --find-links wheels pytest>=8"
    ]
    assert logged(tree, "pytest") == [
        f"PYTHONPATH={tree} .venv-gpu/bin/python -m pytest -m gpu --noconftest "
        "-p no:cacheprovider -rs tests/test_gpu.py -x"
    ]
    assert "GPU: none usable: the tier is skipped" in done.stdout  # this machine's torch


def test_with_everything_there_it_runs_the_tier_and_nothing_else(tree):
    done = run_script(tree)
    assert done.returncode == 0, done.stderr
    assert logged(tree, "venv") == logged(tree, "pip") == []
    assert len(logged(tree, "pytest")) == 1


def test_gpu_bench_runs_the_tier_then_each_benchmark_with_its_python_past_a_failure(tree):
    """scripts/gpu-bench on a machine outside a virtual environment: the tier installs
    into .venv-gpu, and every benchmark runs with that Python into the folder given, the
    one after a failed benchmark too; the failure sets the exit status."""
    (tree / "wheels").mkdir()
    done = run_script(
        tree, "out", versions="pydantic=", venv=False, script="gpu-bench", fails="benchmarks.gpu"
    )
    assert done.returncode == 1
    assert "gpu-bench: benchmarks.gpu failed" in done.stderr
    assert len(logged(tree, "pytest")) == 1
    assert logged(tree, "benchmarks") == [
        f"PYTHONPATH={tree} .venv-gpu/bin/python -m {step} --out out"
        for step in (
            "benchmarks.gpu",
            "benchmarks.metrics_work --device cuda --members 71429",
            "benchmarks.gpu_pair",
        )
    ]
    assert (tree / "out").is_dir()
    ok = run_script(tree, "out", versions="pydantic=", venv=False, script="gpu-bench")
    assert ok.returncode == 0, ok.stderr
