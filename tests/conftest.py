"""Shared fixtures and the test tiers. Storage fixtures are prefixed ``store_``;
``capture`` records the parameters the trainer's metric recorder saw at every logged step;
``tiny_spec`` writes the smallest sweep that runs the whole pipeline and ``phasesweep_cli``
starts the CLI in a process of its own; ``shared_ray`` is the ``--address`` of one local
Ray that the session's launches in such processes share; ``synthetic_store`` fills a store
with a sweep whose curves are closed forms (:func:`calibration.synthetic_sweep`).

Tiers (pyproject.toml lists the markers): ``slow`` marks the scientific reproductions,
``heavy`` tests with tens of seconds of work (every figure of a store, reports,
benchmarks), ``ray`` a test that starts or joins Ray and ``process`` one that runs Python
(the CLI, a probe) in a process of its own. The fixtures above mark the tests that use
them (:data:`MARK_BY_FIXTURE`); a test that starts Ray or Python itself carries the
marker, and fails without it, so that the fast tier (``PHASESWEEP_FAST=1 bash
scripts/test``: ``-m "not slow and not heavy and not ray and not process"``) stays fast."""

from __future__ import annotations

import copy
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
import phasesweep.pipeline.train._trainer as trainer_mod
import pyarrow as pa
import pytest
import torch
import yaml
from calibration import synthetic_sweep
from phasesweep.pipeline.run import _standing
from phasesweep.pipeline.run._ray import STANDING
from phasesweep.pipeline.train._models import Params
from phasesweep.pipeline.train.metrics._metrics import MetricRecorder
from phasesweep.storage import Store, schema

# Tests train in this process with one intra-op thread, as a trial does with the one CPU
# Ray gives it: on 2 cores, torch's default of 2 threads ran small batched ops ~50x slower,
# and far slower still on a busy machine (each thread spins at its barriers).
torch.set_num_threads(1)

# The processes the tests start stand for a user's commands at a terminal, where Ctrl-C
# (SIGINT) interrupts them. A test run started as a background job of a non-interactive
# shell (`bash scripts/test &`, `nohup ... &`) has SIGINT ignored, as POSIX has the shell
# do, and every process it starts inherits that: a launch then ignores a SIGINT that
# comes during its Ray's start-up, so the Ctrl-C tests passed or failed by how the run was
# started (and by which tests ran before them in the worker). Python's own handler makes
# the processes started from here begin with SIGINT at its default, as from a terminal.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

_STORE_FILLED = ("attempt", "chunk_id")  # set by Store.write_chunk


def _store_column(field: pa.Field, n: int, rng: np.random.Generator) -> pa.Array:
    t = field.type
    if pa.types.is_floating(t):
        values = rng.standard_normal(n)
        return pa.array(values, t, mask=np.arange(n) % 4 == 3)  # some NULLs
    if pa.types.is_integer(t):
        return pa.array(rng.integers(1, 1000, n), t)
    if pa.types.is_boolean(t):
        return pa.array(rng.random(n) < 0.5)
    if pa.types.is_string(t):
        return pa.array([f"{field.name}-{i}" for i in range(n)], t)
    if pa.types.is_list(t):
        return pa.array([list(rng.standard_normal(3)) for _ in range(n)], t)
    if pa.types.is_timestamp(t):
        start = datetime(2026, 1, 1, tzinfo=timezone.utc)
        return pa.array([start + timedelta(seconds=int(s)) for s in rng.integers(0, 10**6, n)], t)
    raise TypeError(f"no test values for {field}")


def _store_table(target: pa.Schema, n: int, rng: np.random.Generator, **given) -> pa.Table:
    return pa.table(
        {
            f.name: given[f.name] if f.name in given else _store_column(f, n, rng)
            for f in target
            if f.name not in _STORE_FILLED
        }
    )


@pytest.fixture
def store_make_table() -> Callable[..., pa.Table]:
    """Factory: ``make(target_schema, n, seed=0, **columns)`` -> a table of random values.

    Columns given as keyword arguments (Arrow arrays or lists) are used as they are.
    """

    def make(target: pa.Schema, n: int, seed: int = 0, **given) -> pa.Table:
        return _store_table(target, n, np.random.default_rng(seed), **given)

    return make


@pytest.fixture
def store_make_chunk() -> Callable[..., dict[str, pa.Table]]:
    """Factory: ``make(run_ids, steps=3, depth=2, seed=0)`` -> tables for ``Store.write_chunk``.

    Random float64 values (every 4th NULL), all schema columns except the ones the
    store fills (``attempt``, ``chunk_id``); ``steps`` logged steps per run and
    ``depth`` layers per step. ``finished_at`` can be fixed with ``finished_at=``.
    """

    def make(
        run_ids: list[str],
        steps: int = 3,
        depth: int = 2,
        seed: int = 0,
        finished_at: datetime | None = None,
    ) -> dict[str, pa.Table]:
        rng = np.random.default_rng(seed)
        n = len(run_ids)
        runs_given = {"run_id": pa.array(run_ids), "status": pa.array(["completed"] * n)}
        if finished_at is not None:
            runs_given["finished_at"] = pa.array([finished_at] * n, pa.timestamp("us", tz="UTC"))
        return {
            "trajectories": _store_table(
                schema.TRAJECTORIES,
                n * steps,
                rng,
                run_id=pa.array(np.repeat(run_ids, steps)),
                step=pa.array(np.tile(np.arange(steps), n)),
            ),
            "layers": _store_table(
                schema.LAYERS,
                n * steps * depth,
                rng,
                run_id=pa.array(np.repeat(run_ids, steps * depth)),
                step=pa.array(np.tile(np.repeat(np.arange(steps), depth), n)),
                layer=pa.array(np.tile(np.arange(1, depth + 1), n * steps), pa.int32()),
            ),
            "runs": _store_table(schema.RUNS, n, rng, **runs_given),
        }

    return make


@pytest.fixture
def store_current() -> Callable[[Store, str, pa.Table], pa.Table]:
    """Factory: ``current(store, sweep, summaries)`` -> ``summaries`` with the source
    columns of the sweep's stored ``runs`` rows of the same run_id (what ``analyze``
    records), so that the catalog shows them as current (its views hide the rest)."""

    def current(store: Store, sweep: str, summaries: pa.Table) -> pa.Table:
        from phasesweep.storage import open_catalog

        runs = (
            open_catalog(store)
            .sql("SELECT run_id, attempt, finished_at FROM runs WHERE sweep = ?", params=[sweep])
            .to_arrow_table()
        )
        at = {r: i for i, r in enumerate(runs["run_id"].to_pylist())}
        rows = pa.array([at[r] for r in summaries["run_id"].to_pylist()], pa.int64())
        for column, source in (
            ("source_attempt", "attempt"),
            ("source_finished_at", "finished_at"),
        ):
            i = summaries.schema.get_field_index(column)
            summaries = summaries.set_column(
                i,
                summaries.schema.field(i),
                runs[source].take(rows).cast(summaries.schema.field(i).type),
            )
        return summaries

    return current


class Capture(MetricRecorder):
    """The real recorder, also keeping the parameters it saw at every logged step."""

    instances: list[Capture] = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen: list[Params] = []
        Capture.instances.append(self)

    def record(self, params, grads, **kwargs):
        self.seen.append(params.clone())
        return super().record(params, grads, **kwargs)


@pytest.fixture
def capture(monkeypatch):
    """Swap the trainer's MetricRecorder for :class:`Capture`; returns the class."""
    Capture.instances = []
    monkeypatch.setattr(trainer_mod, "MetricRecorder", Capture)
    return Capture


#: The smallest sweep that runs the whole pipeline: 2 init scales × 3 seeds of a
#: 3 → 8 → 1 net, 20 steps, 5 logged steps, chunks of at most 3 points.
TINY_SPEC: dict[str, Any] = {
    "name": "tiny",
    "model": {"depth": 2, "width": 8},
    "data": {"n_train": 8, "n_test": 8, "input_dim": 3},
    "train": {"steps": 20, "log_points": 5},
    "metrics": {"probe_size": 4},
    "execution": {"max_chunk_size": 3},
    "grid": {"init_scale": [0.5, 1.0], "seed": [0, 1, 2]},
}


@pytest.fixture
def tiny_spec(tmp_path) -> Callable[..., Path]:
    """Factory: ``write({"train.steps": 400, ...})`` writes :data:`TINY_SPEC` with those
    dotted keys set to ``tmp_path / "spec.yaml"`` and returns the path."""

    def write(changes: dict[str, Any] | None = None) -> Path:
        spec = copy.deepcopy(TINY_SPEC)
        for dotted, value in (changes or {}).items():
            *parents, last = dotted.split(".")
            node = spec
            for key in parents:
                node = node.setdefault(key, {})
            node[last] = value
        path = tmp_path / "spec.yaml"
        path.write_text(yaml.safe_dump(spec))
        return path

    return write


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short TMPDIR of the test's own (Ray's socket paths live under it, and must stay
    short): a launch started with it keeps its Tune folders, Ray's temp files and DuckDB's
    spill folder there, apart from other tests and sessions, and a launch the test kills
    (which cleans nothing up) leaves nothing in the machine's /tmp."""
    path = Path(tempfile.mkdtemp(prefix="ps", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def session_state_folder() -> Iterator[None]:
    """The state folder (``$PHASESWEEP_STANDING_DIR``: the token of every local Ray a launch
    starts) of this session's own, unless the environment names one: without it, the first
    embedded launch of a run wrote its token into this user's real state folder
    (``/tmp/phasesweep-ray-$UID``), which outlived the run. Tests of the default location
    unset the variable themselves; ``shared_ray`` sets its own while it runs."""
    if os.environ.get("PHASESWEEP_STANDING_DIR"):
        yield
        return
    folder = tempfile.mkdtemp(prefix="ps-state-", dir="/tmp")
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("PHASESWEEP_STANDING_DIR", folder)
            yield
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def inductor_cache_folder(tmp_path_factory) -> Iterator[None]:
    """Torch's compiler cache (``$TORCHINDUCTOR_CACHE_DIR``) in this session's temporary
    folder, unless the environment names one: the profiler and the flop counter the GPU
    benchmarks' smoke tests run make it, by default as ``torchinductor_$USER`` in the
    machine's /tmp, which outlived the run."""
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        yield
        return
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.mktemp("inductor")))
        yield


@pytest.fixture
def phasesweep_cli() -> Callable[..., subprocess.Popen]:
    """Factory: ``start(args, env_extra=None, **popen_kwargs)`` starts ``python -m
    phasesweep._cli *args`` in a process of its own, with this environment plus ``env_extra``
    and text stdout/stderr piped (``communicate()`` them)."""

    def start(args: list[str], env_extra: dict[str, str] | None = None, **kw) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "phasesweep._cli", *args],
            env=dict(os.environ, **(env_extra or {})),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            **kw,
        )

    return start


@pytest.fixture(scope="session")
def synthetic_store(tmp_path_factory) -> Callable[..., tuple[Store, str]]:
    """Factory: ``make(sweep, grid, description=None, **kwargs)`` -> (store, spec text).

    A new store holding one chunk of :func:`~calibration.synthetic_sweep` over
    ``grid`` (``init_scale``, ``width``, ``depth``, ``seed`` and optionally
    ``noise_sigma``), 10⁶ steps, where the points with init scale ≥ 3 and width ≥ 256
    diverge; ``kwargs`` go to ``synthetic_sweep``. The spec (name, description, grid) is
    stored too, so the swept axes are known."""

    def make(
        sweep: str, grid: dict[str, list], description: str | None = None, **kwargs
    ) -> tuple[Store, str]:
        store = Store.open(str(tmp_path_factory.mktemp("store")))
        if "noise_sigma" in grid:
            kwargs["noise_sigmas"] = grid["noise_sigma"]
        tables = synthetic_sweep(
            init_scales=grid["init_scale"],
            widths=grid["width"],
            depths=grid["depth"],
            seeds=grid["seed"],
            steps=10**6,
            diverge=lambda a, w: a >= 3.0 and w >= 256,
            **kwargs,
        )
        store.write_chunk(sweep, "c0", tables)
        spec = {"name": sweep, "grid": grid}
        if description is not None:
            spec["description"] = description
        spec_text = yaml.safe_dump(spec)
        store.write_spec(sweep, spec_text)
        return store, spec_text

    return make


@pytest.fixture(scope="session")
def shared_ray() -> Iterator[str]:
    """``--address`` of the one local Ray that this session's (under pytest-xdist, this
    worker's) launches in processes of their own share (the CLI's:
    ``phasesweep_cli([..., "--address", shared_ray])``): a standing local Ray
    (:mod:`pipeline.run._standing`) in a folder of the session's, stopped at its end (or by
    its own watchdog two idle minutes after a killed session). Joining it takes a fraction
    of a second, where a launch on an embedded Ray starts and stops one.
    For tests whose subject is not the embedded instance itself, and whose trials need
    nothing from the launch's environment (trials run in the shared instance's).

    Not for launches in this process: Ray keeps much of the first instance's settings for
    the life of a process (its session, its token's path), so a test process that ran an
    embedded launch is no place to join another instance."""
    folder = tempfile.mkdtemp(prefix="ps-", dir="/tmp")  # short: Ray's socket paths
    previous = os.environ.get("PHASESWEEP_STANDING_DIR")
    os.environ["PHASESWEEP_STANDING_DIR"] = folder  # where the CLI's processes find it
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(_standing.IDLE_ENV, "2")
            _standing.ensure()
        _standing.hold()  # in use while this session lives
        yield STANDING
    finally:
        _standing.stop()
        if previous is None:
            os.environ.pop("PHASESWEEP_STANDING_DIR", None)
        else:
            os.environ["PHASESWEEP_STANDING_DIR"] = previous
        shutil.rmtree(folder, ignore_errors=True)


# Tiers ------------------------------------------------------------------------------

#: Fixtures that put the tests using them in a tier (pyproject.toml lists the markers).
MARK_BY_FIXTURE = {"phasesweep_cli": "process", "shared_ray": "ray"}

#: Where Ray's own programs and scripts live (found without importing Ray).
RAY_DIR = os.path.join(importlib.util.find_spec("ray").submodule_search_locations[0], "")

#: What a test that needs the marker starts, in words.
_STARTS = {"ray": "Ray", "process": "Python in a process of its own"}

#: Markers the running test's own processes call for; None between tests.
_started: set[str] | None = None


def spawned_marker(executable: str | bytes | None, args: Any) -> str | None:
    """The marker a test needs that starts this process (``subprocess.Popen``'s audit
    event arguments): ``ray`` for Ray's programs, ``process`` for a Python interpreter,
    None for anything else (git, a browser)."""
    argv = [args] if isinstance(args, str | bytes) else list(args)
    words = [os.fsdecode(w) for w in [executable or argv[0], *argv]]
    if any(w.startswith(RAY_DIR) for w in words):
        return "ray"
    program = os.path.basename(words[0])
    return "process" if program.startswith("python") or words[0] == sys.executable else None


def _audit(event: str, args: tuple) -> None:
    if event == "subprocess.Popen" and _started is not None:
        marker = spawned_marker(args[0], args[1])
        if marker:
            _started.add(marker)


sys.addaudithook(_audit)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for fixture, marker in MARK_BY_FIXTURE.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(marker)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """Fail a test whose body starts Ray or Python without the marker that says so."""
    global _started
    _started = set()
    try:
        result = yield
    finally:
        started, _started = _started, None
    missing = sorted(started - {m.name for m in item.iter_markers()})
    if missing:
        pytest.fail(
            f"this test starts {' and '.join(_STARTS[m] for m in missing)}: mark it "
            + " and ".join(f"@pytest.mark.{m}" for m in missing)
            + " (the fast tier leaves such tests out)",
            pytrace=False,
        )
    return result
