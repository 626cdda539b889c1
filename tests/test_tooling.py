"""The contributor's tooling, each piece doing the real thing: the package layout as a
wheel and a type checker see it (``phasesweep/pipeline`` etc. link to the top-level
folders), the type check's gate (``scripts/typecheck.py``), the guard that keeps the
test tiers honest and the Ctrl-C the processes that tests start take (``tests/conftest.py``)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import RAY_DIR, spawned_marker

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ["pipeline", "storage", "analysis"]


def _python(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=600
    )


@pytest.mark.process
def test_the_wheel_holds_every_module_of_the_layout_under_phasesweep(tmp_path):
    source = tmp_path / "source"
    patterns = shutil.ignore_patterns(".*", "build", "*.egg-info", "__pycache__")

    def skip(folder: str, names: list[str]) -> set[str]:
        # the store's results/ at the top, not the gallery's package of that name
        return patterns(folder, names) | (
            {"results"} & set(names) if Path(folder) == ROOT else set()
        )

    shutil.copytree(ROOT, source, symlinks=True, ignore=skip)
    build = "from setuptools import build_meta; print(build_meta.build_wheel(__import__('sys').argv[1]))"
    done = _python("-c", build, str(tmp_path / "dist"), cwd=source)
    assert done.returncode == 0, done.stderr
    # setuptools warns, at every install, of an importable folder missing from `packages`
    # (the quickstart would print its 30 lines): each one is listed
    assert "would be ignored" not in done.stderr, done.stderr
    wheel = zipfile.ZipFile(tmp_path / "dist" / done.stdout.split()[-1])
    packaged = {n for n in wheel.namelist() if n.startswith("phasesweep/")}
    expected = {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "phasesweep").rglob("*.py")
        if "__pycache__" not in p.parts
    }
    for folder in FOLDERS:
        expected |= {
            f"phasesweep/{p.relative_to(ROOT).as_posix()}"
            for p in (ROOT / folder).rglob("*.py")
            if "__pycache__" not in p.parts
        }
    # the gallery's ready sweeps, copied through the link phasesweep/_gallery/sweeps
    expected |= {f"phasesweep/_gallery/sweeps/{p.name}" for p in (ROOT / "sweeps").glob("*.yaml")}
    assert packaged == expected
    info = wheel.getinfo("phasesweep/_gallery/sweeps/quickstart.yaml")
    assert wheel.read(info) == (ROOT / "sweeps" / "quickstart.yaml").read_bytes()
    for folder in FOLDERS:  # copies of the files, not links
        info = wheel.getinfo(f"phasesweep/{folder}/__init__.py")
        assert wheel.read(info) == (ROOT / folder / "__init__.py").read_bytes()


@pytest.mark.process
def test_the_type_check_resolves_the_layout_and_fails_on_every_unresolved_import(tmp_path):
    """With the project's own rules, and the checkout as the only way to find phasesweep
    (the editable install's import hook is invisible to a static tool): the layout's
    imports resolve; a missing module and a name a module lacks fail; a finding the
    project keeps at warning does not."""
    files = {
        "layout.py": (
            "import phasesweep._cli\n"
            "from phasesweep.analysis.figures import FigureKind\n"
            "from phasesweep.storage import Store\n"
        ),
        "missing.py": "import phasesweep.no_such_module\nfrom phasesweep.storage import NoSuchName\n",
        "warned.py": 'import re\n\nre.match("a", "b").group()\n',
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    config = {
        "extends": str(ROOT / "pyproject.toml"),
        "include": ["."],
        "exclude": [],
        "extraPaths": [str(ROOT)],
    }
    (tmp_path / "pyrightconfig.json").write_text(json.dumps(config))
    done = _python(str(ROOT / "scripts" / "typecheck.py"), "--project", str(tmp_path), cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    *failing, summary = done.stdout.strip().splitlines()
    assert [line.split(":")[:2] for line in failing] == [
        [str(tmp_path / "missing.py"), "1"],
        [str(tmp_path / "missing.py"), "2"],
    ], done.stdout
    assert "no_such_module" in failing[0] and '"NoSuchName" is unknown import symbol' in failing[1]
    assert summary == "pyright: 2 failing, 1 warnings in 3 files"


def test_spawned_processes_are_told_apart():
    ray_dir = Path(RAY_DIR)
    assert spawned_marker(None, [sys.executable, "-c", "pass"]) == "process"
    assert spawned_marker(None, ["python3", "-m", "phasesweep._cli"]) == "process"
    assert spawned_marker(None, [str(ray_dir / "core" / "src" / "ray" / "raylet")]) == "ray"
    assert spawned_marker(None, [sys.executable, str(ray_dir / "dashboard" / "x.py")]) == "ray"
    assert spawned_marker(b"/usr/bin/git", [b"git", b"status"]) is None
    assert spawned_marker(None, "chromium --headless") is None


def _inner_pytest(tmp_path: Path, tests: str, launcher: tuple[str, ...] = ()):
    """A pytest session of its own in ``tmp_path`` over the test module ``tests``, with this
    project's conftest; returns ``run(*pytest_args) -> stdout``. ``launcher``: Python code run
    first in the session's process, which then becomes pytest (``os.execv``)."""
    (tmp_path / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    process: x\n    ray: x\n")
    (tmp_path / "test_inner.py").write_text(tests)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    # the conftest's own imports of the test helpers beside it (calibration, ...)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "tests"), env.get("PYTHONPATH")]))
    pytest_argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rf"]
    if launcher:
        code = "\n".join([*launcher, f"os.execv(sys.executable, {pytest_argv!r} + sys.argv[1:])"])
        pytest_argv = [sys.executable, "-c", code]

    def run(*args: str) -> str:
        inner = [*pytest_argv, *args]
        return subprocess.run(inner, cwd=tmp_path, capture_output=True, text=True, env=env).stdout

    return run


@pytest.mark.process
def test_a_test_that_starts_python_without_its_marker_fails(tmp_path):
    pytest_ = _inner_pytest(
        tmp_path,
        "import subprocess, sys\n"
        "import pytest\n\n"
        "def test_unmarked():\n"
        "    subprocess.run([sys.executable, '-c', 'pass'], check=True)\n\n"
        "@pytest.mark.process\n"
        "def test_marked():\n"
        "    subprocess.run([sys.executable, '-c', 'pass'], check=True)\n\n"
        "def test_other_programs():\n"
        "    subprocess.run(['git', '--version'], check=True, capture_output=True)\n\n"
        "def test_uses_the_cli_fixture(phasesweep_cli):\n"
        "    assert phasesweep_cli(['--version']).communicate(timeout=300)[0]\n",
    )
    out = pytest_()
    assert "1 failed, 3 passed" in out, out
    assert "FAILED test_inner.py::test_unmarked" in out
    why = "this test starts Python in a process of its own: mark it @pytest.mark.process"
    assert why in out, out
    out = pytest_("-m", "not process")  # the fixture marked the test that uses it
    assert "1 failed, 1 passed, 2 deselected" in out, out


@pytest.mark.process
def test_processes_a_test_starts_take_ctrl_c_even_where_the_run_ignores_it(tmp_path):
    """A test session started with SIGINT ignored (a background job of a non-interactive
    shell): the processes its tests start still begin with Python's Ctrl-C handler, as at
    a terminal, so the Ctrl-C tests do not depend on how the run was started."""
    pytest_ = _inner_pytest(
        tmp_path,
        "import subprocess, sys\n"
        "import pytest\n\n"
        "@pytest.mark.process\n"
        "def test_child_handler():\n"
        "    code = 'import signal; print(signal.getsignal(signal.SIGINT))'\n"
        "    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True)\n"
        "    assert 'default_int_handler' in out.stdout, out\n",
        launcher=("import os, signal, sys", "signal.signal(signal.SIGINT, signal.SIG_IGN)"),
    )
    out = pytest_()
    assert "1 passed" in out, out


def test_the_readme_gives_the_fast_tier_that_scripts_test_runs(pytestconfig):
    script = (ROOT / "scripts" / "test").read_text()
    expression = re.search(r'markers=\(-m "([^"]+)"\)', script).group(1)
    readme = (ROOT / "README.md").read_text()
    assert "PHASESWEEP_FAST=1 bash scripts/test" in readme
    assert f'pytest -m "{expression}"' in readme
    left_out = set(re.findall(r"not (\w+)", expression))
    registered = {line.split(":")[0] for line in pytestconfig.getini("markers")}
    assert left_out == {"slow", "heavy", "ray", "process"} and left_out <= registered


def test_the_environment_scripts_setup_made_holds_the_torch_it_pins():
    """The project's install must keep the torch installed before it: resolving its
    dependencies once traded 2.13.0's CPU wheel for a 7 GB CUDA build of a newer release,
    and every test still passed. Checked where the tests run in the checkout's ``.venv``
    (CI, the README's commands); any other environment brings its own torch."""
    if Path(sys.prefix).resolve() != (ROOT / ".venv").resolve():
        pytest.skip(f"not scripts/setup's environment: {sys.prefix}")
    import torch

    pinned = re.search(r'^torch="torch==([\d.]+)"$', (ROOT / "scripts" / "setup").read_text(), re.M)
    assert pinned, "scripts/setup pins torch"
    assert torch.__version__.split("+")[0] == pinned.group(1), torch.__version__


@pytest.mark.process
@pytest.mark.heavy
def test_the_set_up_is_quiet_about_the_editable_install_and_still_shows_errors(tmp_path):
    """Issue 32: the quickstart printed setuptools' warning about editable installs.
    scripts/setup as written (less torch's install, and the dependencies: what it installs
    is not the point) in a copy of the checkout, with the pip it installs: the install
    succeeds and says nothing of it; a broken pyproject.toml still fails loudly."""
    source = tmp_path / "source"
    patterns = shutil.ignore_patterns(".*", "build", "*.egg-info", "__pycache__")

    def skip(folder: str, names: list[str]) -> set[str]:
        # the store's results/ at the top, not the gallery's package of that name
        return patterns(folder, names) | (
            {"results"} & set(names) if Path(folder) == ROOT else set()
        )

    shutil.copytree(ROOT, source, symlinks=True, ignore=skip)
    setup = (ROOT / "scripts" / "setup").read_text()
    installs_torch = 'pip install -q "$torch"'
    assert '-e ".[' in setup and installs_torch in setup
    lines = [line for line in setup.splitlines() if installs_torch not in line]
    script = source / "scripts" / "setup"
    script.write_text("\n".join(lines).replace('-e ".[', '--no-deps -e ".[') + "\n")

    # nothing of this session's: its checkout on the path, its warning filters
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONWARNINGS")}

    def set_up() -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", str(script)], cwd=source, capture_output=True, text=True, timeout=600, env=env
        )

    done = set_up()
    assert done.returncode == 0, done.stderr
    assert "Editable installation" not in done.stdout + done.stderr, done.stderr
    assert "careful" not in done.stdout + done.stderr, done.stderr
    found = subprocess.run(
        [str(source / ".venv" / "bin" / "python"), "-c",
         "import importlib.util; print(importlib.util.find_spec('phasesweep').origin)"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert found.stdout.strip() == str(source / "phasesweep" / "__init__.py"), found.stderr

    pyproject = source / "pyproject.toml"
    pyproject.write_text(pyproject.read_text() + "\n[project\n")
    broken = set_up()
    assert broken.returncode != 0
    assert "ERROR" in broken.stderr and "TOMLDecodeError" in broken.stderr, broken.stderr
