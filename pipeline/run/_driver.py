"""Run a sweep's chunks as Ray Tune trials; the Parquet store keeps the results.

Tune is the scheduler, not the results store: each trial trains one chunk
(:mod:`pipeline.run._trial`), writes its tables to the store (atomically, ``runs``
last), and reports a few numbers. Tune keeps no checkpoints and its loggers are off;
its experiment directory lives in a folder private to the launch (:func:`launch_folder`)
that the launch removes at its end, or the next launch after a kill.

Ray: a private embedded instance unless ``--address`` or ``$RAY_ADDRESS`` names a
cluster (:func:`pipeline.run._ray.connect`); an unreachable address fails within seconds.

Exactly once: trials claim their points in the store (:mod:`phasesweep.storage._claims`).
A launch that finds points claimed by a live other launch waits for them and trains
those whose holder died or stopped. A kill loses at most
``execution.commit_every_seconds`` of a chunk: a relaunch packs the same chunks (chunks
of the whole grid, less stored points) and so finds their checkpoints.

SIGINT (Ctrl-C) or SIGTERM (:mod:`pipeline.run._signals`): the launch sets its stop
marker; its trials checkpoint, end and mark nothing failed; never-started trials end at
once; the launch reports itself interrupted (exit 130, or 143 for SIGTERM). A second
signal stops at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import stat
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
from phasesweep.pipeline.grid import Chunk, Grid, Point, group_tag
from phasesweep.pipeline.run._auth import private_folder
from phasesweep.pipeline.run._plan import ChunkTask, expand_task
from phasesweep.pipeline.run._progress import Progress
from phasesweep.pipeline.run._ray import connect, embedded_processes, remove_embedded
from phasesweep.pipeline.run._signals import Interrupted, on_stop_signals
from phasesweep.pipeline.run._standing import alive
from phasesweep.pipeline.run._trial import chunk_trial, encode_chunks, stored_reads
from phasesweep.pipeline.train._runs import runs_table
from phasesweep.storage import Store
from phasesweep.storage._claims import Claims
from phasesweep.storage._stop import StopMarker


@dataclass
class SweepOutcome:
    """What a launch did: points trained, skipped as already stored, diverged, failed."""

    total: int
    skipped: int
    trained: int = 0
    diverged: int = 0
    failed: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    #: points whose training went on from a checkpoint of an earlier, killed attempt.
    resumed: int = 0
    #: the launch was stopped by SIGINT or SIGTERM (finished work kept, running chunks
    #: checkpointed, nothing marked failed).
    interrupted: bool = False
    #: which of the two stopped it (None while not interrupted).
    interrupted_by: signal.Signals | None = None

    def raise_if_interrupted(self) -> None:
        """Raise :class:`~pipeline.run._signals.Interrupted` if a stop signal stopped the
        launch: for callers that would go on to more work (a refine's next batch, the
        gallery's analysis of a sweep left partly trained), which must stop there too."""
        if self.interrupted:
            raise Interrupted(self.interrupted_by or signal.SIGINT)


def failed_runs_table(points: Sequence[Point], chunk_id: str, error: str) -> pa.Table:
    """``runs`` rows with status 'failed' for points whose trial failed after retries."""
    from datetime import datetime, timezone

    n = len(points)
    outcome = {
        "status": ["failed"] * n,
        "finished_at": [datetime.now(timezone.utc)] * n,
        "error": [error[-2000:]] * n,
    }
    return runs_table(points, chunk_id, None, outcome)


@contextlib.contextmanager
def launch_folder() -> Iterator[str]:
    """A local folder private to this launch (Tune's experiment directory goes here).

    Folders live under ``$TMPDIR/phasesweep-tune-$UID/``, checked before use like the
    Ray state folder (:func:`pipeline.run._auth.private_folder`: this account's, mode 0700,
    no link; a folder another account planted there is refused, exit 2); each holds a
    lock file its launch keeps locked (``flock``) until it ends. The lock dies with its
    process, even on SIGKILL, so every launch first removes the folders whose lock it
    can take: no launch's temporary files outlive the next one. The base folder is
    removed when empty.
    """
    base = os.path.join(tempfile.gettempdir(), f"phasesweep-tune-{os.getuid()}")
    with contextlib.suppress(FileNotFoundError):
        st = os.lstat(base)
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022:
            os.chmod(base, 0o700)  # an earlier version's folder: others could read it, not write
    private_folder(Path(base))
    for name in os.listdir(base):
        folder = os.path.join(base, name)
        try:
            fd = os.open(os.path.join(folder, "lock"), os.O_RDWR)
        except OSError:
            continue  # being created (the lock comes first) or not ours
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # its launch is alive
        finally:
            os.close(fd)
        shutil.rmtree(folder, ignore_errors=True)
    folder = tempfile.mkdtemp(prefix="l", dir=base)
    fd = os.open(os.path.join(folder, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        os.close(fd)
        with contextlib.suppress(OSError):
            os.rmdir(base)


#: Seconds between Tune's saves of its experiment state (every trial's config and last
#: result, O(trials) each): the store is the record of a launch and a launch never
#: resumes a Tune experiment, so Tune saves it rarely ("auto" would spend up to 5 % of
#: the driver's time on it in a 10⁴-trial launch).
TUNE_STATE_EVERY_S = 3600


@contextlib.contextmanager
def _light_tune(cpus_per_trial: float, gpus_per_trial: float) -> Iterator[None]:
    """Tune settings that keep a launch of 10³–10⁴ trials light, for this launch, where
    the user's environment does not set them: pending trials (each a placement group) at
    most twice the trials that run at once (Tune's default keeps 200 pending), rare
    experiment-state saves (:data:`TUNE_STATE_EVERY_S`)."""
    import ray

    resources = ray.cluster_resources()
    slots = resources.get("CPU", 1) // max(cpus_per_trial, 1e-9)
    if gpus_per_trial > 0:
        slots = min(slots, resources.get("GPU", 0) // gpus_per_trial)
    ours = {
        "TUNE_MAX_PENDING_TRIALS_PG": str(max(4, 2 * int(slots))),
        "TUNE_GLOBAL_CHECKPOINT_S": str(TUNE_STATE_EVERY_S),
    }
    ours = {k: v for k, v in ours.items() if k not in os.environ}
    os.environ.update(ours)
    try:
        yield
    finally:
        for key in ours:
            os.environ.pop(key, None)


class _Chunks:
    """The chunks of a launch by index: explicit :class:`Chunk` s or :class:`ChunkTask` s
    of ``grid``, expanded only where the driver must look at their points (a trial that
    failed or found points busy elsewhere)."""

    def __init__(
        self, items: Sequence[Chunk | ChunkTask], grid: Grid | None, planned_at: float | None
    ) -> None:
        self.items, self.grid, self.planned_at = items, grid, planned_at

    def __len__(self) -> int:
        return len(self.items)

    def chunk_id(self, i: int) -> str:
        return self.items[i].chunk_id

    def size(self, i: int) -> tuple[int, int]:
        """(members to train, steps per member) of chunk i."""
        item = self.items[i]
        if isinstance(item, ChunkTask):
            return item.size - item.stored_count, item.steps
        return len(item.points), item.points[0].config.train.steps if item.points else 0

    def points(self, i: int) -> tuple[Point, ...]:
        item = self.items[i]
        return expand_task(self.grid, item).points if isinstance(item, ChunkTask) else item.points

    def trial_config(self, i: int) -> tuple[int, ChunkTask | tuple]:
        """What trial i receives (``config["chunk"]``): its index and its chunk."""
        item = self.items[i]
        return i, item if isinstance(item, ChunkTask) else encode_chunks([item])[0]

    def unstored(self, store: Store, sweep: str, i: int) -> list[Point]:
        """Chunk i's points the store does not hold (read as its trial reads them)."""
        item = self.items[i]
        points = self.points(i)
        planned_at = self.planned_at if isinstance(item, ChunkTask) else None
        if not points:
            return []
        reads = stored_reads(group_tag(points[0].config), item.chunk_id, planned_at)
        done = store.done_among(sweep, [p.run_id for p in points], reads)
        return [p for p in points if p.run_id not in done]

    def claims(self, store: Store, sweep: str, points: Sequence[Point]) -> Claims:
        """The claims of these points' group (:func:`pipeline.grid._groups.group_tag`)."""
        return Claims(store, sweep, group=group_tag(points[0].config))


def run_chunks(
    store: Store,
    sweep: str,
    chunks: Sequence[Chunk | ChunkTask],
    *,
    total: int,
    skipped: int,
    grid: Grid | None = None,
    planned_at: float | None = None,
    address: str | None = None,
    cpus_per_trial: float = 1,
    gpus_per_trial: float = 0,
    max_retries: int = 2,
    progress: bool = True,
    commit_every: float = 300.0,
) -> SweepOutcome:
    """Schedule ``chunks`` as Tune trials and wait; returns what happened.

    ``chunks``: explicit :class:`Chunk` s, or :class:`ChunkTask` s of ``grid`` planned at
    ``planned_at`` (:func:`pipeline.run._plan.plan_chunks`): each trial receives its own
    chunk only and ``grid`` once. Points of trials that still fail after ``max_retries``
    retries are stored with status ``failed`` (a relaunch trains them again). Points
    another launch is training (live claims) are waited for: when their holder commits
    they count as done, when it dies or stops they are trained here. SIGINT (Ctrl-C)
    or SIGTERM stops the launch: trials checkpoint and end, nothing is marked failed,
    ``outcome.interrupted`` and ``outcome.interrupted_by`` are set; a second signal
    raises :class:`~pipeline.run._signals.Interrupted` (a ``KeyboardInterrupt``) at once.
    """
    outcome = SweepOutcome(total=total, skipped=skipped)
    if not chunks:
        return outcome
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # the new console output ignores verbose=0
    os.environ.setdefault("TUNE_RESULT_BUFFER_LENGTH", "1")
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"  # ours below stops trials cleanly
    connect(address)
    launch_id = uuid.uuid4().hex[:12]
    stop = StopMarker.of(store, sweep, launch_id)
    work = _Chunks(chunks, grid, planned_at)
    bar = Progress(sweep, [work.size(i) for i in range(len(work))], skipped, total, progress)

    def on_stop(signum: signal.Signals) -> None:
        stop.set()  # first: _end_if_ray_stops acts once interrupted_by is set, and clears it
        outcome.interrupted, outcome.interrupted_by = True, signum

    def wind_up() -> None:
        stop.clear()
        bar.close()

    pending = list(range(len(work)))
    try:
        with (
            on_stop_signals(on_stop),
            _end_if_ray_stops(outcome, wind_up),
            launch_folder() as folder,
            _light_tune(cpus_per_trial, gpus_per_trial),
        ):
            while pending and not outcome.interrupted:
                errors, busy, clean = _fit(
                    store, sweep, work, pending, folder, bar, outcome,
                    launch_id=launch_id, commit_every=commit_every,
                    cpus_per_trial=cpus_per_trial, gpus_per_trial=gpus_per_trial,
                    max_retries=max_retries,
                )  # fmt: skip
                if outcome.interrupted:
                    break
                rerun = []
                for i in pending:
                    if i in clean:  # the trial stored or found stored every point
                        continue
                    lost = work.unstored(store, sweep, i)
                    if not lost:
                        continue
                    held = work.claims(store, sweep, lost).held([p.run_id for p in lost])
                    if i in errors or i not in busy:
                        lost = [p for p in lost if p.run_id not in held]
                        message = errors.get(i, "trial ended without storing its points")
                        if lost:
                            store.write_chunk(
                                sweep,
                                work.chunk_id(i),
                                {"runs": failed_runs_table(lost, work.chunk_id(i), message)},
                            )
                            outcome.failed += [p.run_id for p in lost]
                            outcome.errors.append(message)
                            bar.points(len(lost))
                        if not held:
                            continue
                    rerun.append(i)
                pending = _wait_for_others(store, sweep, work, rerun, bar, outcome)
    finally:
        wind_up()
    return outcome


#: Seconds between a stopped launch's looks at whether its embedded Ray still runs.
RAY_WATCH = 0.2


@contextlib.contextmanager
def _end_if_ray_stops(outcome: SweepOutcome, wind_up: Callable[[], None]) -> Iterator[None]:
    """While the block runs: once a stop signal has stopped the launch, if a process of
    its embedded Ray ends too (the signal reached them: sent to the whole process group,
    or by a batch scheduler to every process of the job), end the launch at once. Its
    trials are gone with Ray, and Ray's client would block the launch for a minute,
    waiting for its head, then abort it with the stop marker and Ray's folder left
    behind. Instead ``wind_up()`` runs, what is left of Ray is ended and its folder
    removed, one line says so, and the process exits (``os._exit``: 128 + the signal's
    number) as a kill would, keeping the chunks' last checkpoints. Nothing where the
    launch runs on a standing Ray or a cluster, whose processes are not the launch's."""
    ray_pids = embedded_processes()
    if not ray_pids:
        yield
        return
    ended = threading.Event()

    def watch() -> None:
        while not ended.wait(RAY_WATCH):
            signum = outcome.interrupted_by
            if signum is None or all(map(alive, ray_pids)):
                continue
            wind_up()
            remove_embedded()
            print(
                f"phasesweep: interrupted ({signum.name}), which stopped the embedded Ray "
                "too: running chunks keep their last checkpoints; run the same command "
                "again to go on",
                file=sys.stderr,
                flush=True,
            )
            os._exit(128 + signum)

    thread = threading.Thread(target=watch, name="phasesweep-ray-watch", daemon=True)
    thread.start()
    try:
        yield
    finally:
        ended.set()
        thread.join()


def _fit(
    store: Store,
    sweep: str,
    work: _Chunks,
    indices: list[int],
    folder: str,
    bar: Progress,
    outcome: SweepOutcome,
    *,
    launch_id: str,
    commit_every: float,
    cpus_per_trial: float,
    gpus_per_trial: float,
    max_retries: int,
) -> tuple[dict[int, str], set[int], set[int]]:
    """One Tune run over chunks ``indices`` of ``work``; returns the error message of each
    chunk whose trial failed after retries, the chunks with points busy elsewhere, and
    the chunks whose trial ended cleanly (every point stored by it or found stored)."""
    from ray import tune

    busy: set[int] = set()
    clean: set[int] = set()

    class _Results(tune.Callback):
        def on_trial_result(self, iteration, trials, trial, result, **info):  # noqa: ANN001
            i = trial.config["chunk"][0]
            if not result.get("final"):
                bar.running(i, result.get("member_steps", 0))
                return
            outcome.trained += result.get("points", 0)
            outcome.skipped += result.get("skipped", 0)
            outcome.resumed += result.get("resumed", 0)
            outcome.diverged += result.get("diverged", 0)
            if result.get("busy"):
                busy.add(i)
            if not result.get("interrupted"):
                bar.finished(i, result.get("points", 0) + result.get("skipped", 0))
                if not result.get("busy"):
                    clean.add(i)

    trainable = tune.with_resources(
        tune.with_parameters(
            chunk_trial,
            store_uri=store.uri,
            sweep=sweep,
            grid=work.grid,
            planned_at=work.planned_at,
            launch_id=launch_id,
            commit_every=commit_every,
        ),
        {"cpu": cpus_per_trial, "gpu": gpus_per_trial},
    )
    tuner = tune.Tuner(
        trainable,
        param_space={"chunk": tune.grid_search([work.trial_config(i) for i in indices])},
        tune_config=tune.TuneConfig(reuse_actors=True),
        run_config=tune.RunConfig(
            name=f"{sweep}-{uuid.uuid4().hex[:6]}",
            storage_path=folder,
            failure_config=tune.FailureConfig(max_failures=max_retries),
            verbose=0,
            # silent at verbose 0; in a notebook Tune's own would clear the cell's output
            progress_reporter=tune.CLIReporter(),
            callbacks=[_Results()],
        ),
    )
    results = tuner.fit()
    # A trial whose worker died before it started has no config: it counts as failed
    # with the first error seen.
    errors = [r for r in results if r.error is not None]
    fallback = _describe(errors[0].error) if errors else None
    by_chunk = {r.config["chunk"][0]: _describe(r.error) for r in errors if r.config}
    if fallback is not None:
        reported = {r.config["chunk"][0] for r in results if r.config and r.error is None}
        by_chunk.update({i: fallback for i in indices if i not in reported and i not in by_chunk})
    return by_chunk, busy, clean - set(by_chunk)


#: Seconds between looks at the store while waiting for points another launch trains.
WAIT_POLL = 2.0


def _wait_for_others(
    store: Store,
    sweep: str,
    work: _Chunks,
    indices: list[int],
    bar: Progress,
    outcome: SweepOutcome,
) -> list[int]:
    """Wait until no point of these chunks is both unstored and claimed by a live lease;
    returns the chunks that still have unstored points (to train here)."""
    if indices:
        bar.note("waiting for points in progress by another launch")
    while indices and not outcome.interrupted:
        lost = {i: work.unstored(store, sweep, i) for i in indices}
        indices = [i for i in indices if lost[i]]
        if not any(
            work.claims(store, sweep, lost[i]).held([p.run_id for p in lost[i]]) for i in indices
        ):
            break
        time.sleep(WAIT_POLL)
    bar.note("")
    return indices


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"
