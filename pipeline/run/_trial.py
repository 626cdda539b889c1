"""One trial: train a chunk's points that the store lacks and no one else trains, and commit.

A trial claims its points in the store (:mod:`phasesweep.storage._claims`: exclusive
create, leases renewed while it trains, taken over when the holder dies), re-reads the
done run ids, trains only what it got and releases after its commit; a retried trial
whose first attempt committed trains nothing.

Bounded loss: the members of a chunk train in lock step and finish together, so a
chunk cannot commit finished members early; instead the trial checkpoints the whole
ensemble's state into the store every ``execution.commit_every_seconds`` of training
(:class:`~phasesweep.storage._checkpoints.Checkpoint`, keyed by the exact point set) and
whoever trains those points next resumes from it, bit for bit as if never stopped.

Stop: an interrupted launch sets its :class:`~phasesweep.storage._stop.StopMarker`; its
trials checkpoint, end and mark nothing failed.

Progress: trials report their chunk's member-steps every :data:`PROGRESS_EVERY`
seconds from the trainer's step hook (the hook reads the clock only every
:data:`~phasesweep.pipeline.train._trainer.HOOK_EVERY` steps).

Tests inject faults into trials (which run in Ray workers, out of reach of a monkeypatch)
through one seam: :data:`HOOKS_ENV` names a Python file whose functions a trial calls
at fixed points (:func:`trial_hook`).
"""

from __future__ import annotations

import functools
import importlib.util
import io
import math
import os
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from phasesweep.pipeline.grid import (
    GROUP_TAG_LEN,
    LAYOUT_LEN,
    Chunk,
    Grid,
    Point,
    group_tag,
    tagged,
)
from phasesweep.pipeline.run._plan import ChunkTask, expand_task
from phasesweep.pipeline.spec import RunConfig
from phasesweep.storage import Store
from phasesweep.storage._checkpoints import Checkpoint
from phasesweep.storage._claims import Claims, Renewer
from phasesweep.storage._stop import StopMarker

#: Environment variable naming a Python file of trial hooks, the one seam for tests that
#: inject faults into trials: ``before_training(run_ids)`` is called with the points a
#: trial is about to train (it may raise: the trial fails), ``after_checkpoint(step,
#: hook)`` after each checkpoint with the trial's :class:`StepHook` (it may wait, calling
#: ``hook.progress(step)`` and ``hook.stopped()``; True stops the trial). Either may be
#: absent. Unset in normal use; ``tests/trial_faults.py`` is the project's.
HOOKS_ENV = "PHASESWEEP_TRIAL_HOOKS"


@functools.cache
def _load_hooks(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("phasesweep_trial_hooks", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"${HOOKS_ENV}: no Python file at {path!r}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def trial_hook(name: str) -> Callable[..., Any] | None:
    """The function ``name`` of the :data:`HOOKS_ENV` file, or None (unset, or not defined
    there). The file is loaded once per process."""
    path = os.environ.get(HOOKS_ENV)
    return getattr(_load_hooks(path), name, None) if path else None


def encode_chunks(chunks: Sequence[Chunk]) -> list[tuple[str, list[tuple[str, str]]]]:
    """Compact, picklable chunks: (chunk_id, [(run_id, config JSON), ...])."""
    return [
        (c.chunk_id, [(p.run_id, p.config.model_dump_json()) for p in c.points]) for c in chunks
    ]


def decode_chunk(chunk_id: str, members: list[tuple[str, str]]) -> Chunk:
    """The chunk of one item of :func:`encode_chunks`."""
    points = tuple(Point(rid, RunConfig.model_validate_json(cfg), {}) for rid, cfg in members)
    return Chunk(chunk_id, points)


#: Seconds between a trial's progress reports during a chunk (read at the step hook).
PROGRESS_EVERY = 2.0
#: Seconds between a trial's looks for its launch's stop marker.
STOP_POLL = 2.0


class Stopped(Exception):
    """The launch was interrupted: the trial checkpointed its chunk and stops."""


def _load_checkpoint(checkpoint: Checkpoint) -> dict | None:
    """The checkpoint's training state, or None. Its tensors load onto the CPU whatever the
    device that wrote it or the device that resumes: the trainer moves what trains to its
    device and keeps the logged rows on the host (:meth:`ChunkTrainer.run`)."""
    import torch

    data = checkpoint.read()
    if data is None:
        return None
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


class StepHook:
    """The trainer's step hook in a trial: progress reports, checkpoints, stop.

    Every ``commit_every`` seconds of training (and when the launch is interrupted)
    the whole ensemble's state is written to the store, so a kill loses at most that
    much training of the chunk: the next holder of its points resumes from there.
    """

    def __init__(
        self,
        checkpoint: Checkpoint,
        stop: StopMarker,
        commit_every: float,
        report: Callable[[dict], None],
        members: int,
    ) -> None:
        self.checkpoint, self.stop = checkpoint, stop
        self.commit_every, self.report, self.members = commit_every, report, members
        self.last_commit = self.last_report = self.last_poll = -math.inf

    def stopped(self) -> bool:
        """Whether the launch has been interrupted (its stop marker is set)."""
        return self.stop.is_set()

    def progress(self, k: int) -> None:
        """Report ``k`` steps of every member, if :data:`PROGRESS_EVERY` seconds have passed
        since the last report."""
        if time.monotonic() - self.last_report >= PROGRESS_EVERY:
            self.report({"member_steps": k * self.members})
            self.last_report = time.monotonic()

    def __call__(self, k: int, state: Callable[[], dict]) -> None:
        import torch

        now = time.monotonic()
        if self.last_commit == -math.inf:  # the first call: training has begun
            self.last_commit = self.last_poll = now
        self.progress(k)
        stop = False
        if now - self.last_poll >= STOP_POLL:
            stop, self.last_poll = self.stopped(), now
        if stop or now - self.last_commit >= self.commit_every:
            buf = io.BytesIO()
            torch.save(state(), buf)
            self.checkpoint.write(buf.getvalue())
            self.last_commit = time.monotonic()
            after = trial_hook("after_checkpoint")
            stop = stop or (after is not None and bool(after(k, self)))
        if stop:
            raise Stopped


#: Seconds of slack between the plan's time stamp and the modification times of store
#: files written by other hosts: a file of another layout changed less than this before
#: the plan is read again by the trials. Twice the default lease TTL: hosts' clocks must
#: agree to well within the TTL already (:mod:`phasesweep.storage._claims`).
CLOCK_SLACK = 120.0


def stored_reads(
    group: str, chunk_id: str, planned_at: float | None
) -> Callable[[str | None, float], bool]:
    """Which ``runs`` files a trial of chunk ``chunk_id`` of ``group`` (the group tag of
    its points) reads to find its stored points (a ``select`` for
    :meth:`Store.done_among`): every file of its own chunk id; a file of another chunk
    of its group, unless the plan made both (``planned_at`` given: a chunk id that shares
    the first :data:`~pipeline.grid._groups.LAYOUT_LEN` digits with its own cuts the group the
    same way, and holds none of its points); a file whose chunk id has no group tag
    (older stores, compacted files). Files of other chunk ids older than ``planned_at``
    (less :data:`CLOCK_SLACK`) are skipped: the plan read them and left their points
    out of the chunk. ``planned_at`` None: explicit points, no plan: all of those are
    read."""
    layout = chunk_id[:LAYOUT_LEN] if planned_at is not None else None

    def select(chunk: str | None, mtime: float) -> bool:
        if chunk == chunk_id:
            return True
        if (
            chunk is not None
            and tagged(chunk)
            and (chunk[:GROUP_TAG_LEN] != group or chunk[:LAYOUT_LEN] == layout)
        ):
            return False
        return planned_at is None or mtime >= planned_at - CLOCK_SLACK

    return select


def train_and_store(
    store_uri: str,
    sweep: str,
    chunk: Chunk,
    device: str,
    node_id: str | None = None,
    *,
    launch_id: str = "",
    commit_every: float = 300.0,
    report=lambda metrics: None,  # noqa: ANN001
    planned_at: float | None = None,
) -> dict[str, Any]:
    """Train the chunk's members that the store does not hold and no one else is
    training, and commit them.

    Claims the points first (:mod:`phasesweep.storage._claims`, in the chunk's group),
    then reads which of them the store holds, from the files that can hold them
    (:func:`stored_reads`: its own chunk's, and other layouts' newer than ``planned_at``,
    when the plan made the chunk; none of the rest of the sweep), resumes from a checkpoint of exactly these points if
    one exists, checkpoints every ``commit_every`` seconds, stops (checkpointed) when the
    launch's stop marker appears, and commits only the points it still owns.
    ``report`` receives progress dicts during training. Returns the small summary a
    Tune trial reports: ``points`` trained, ``skipped`` (stored already), ``busy``
    (claimed by a live other holder), ``diverged``, ``resumed`` (from a checkpoint)
    and ``interrupted``.
    """
    import torch
    from phasesweep.pipeline.train._trainer import train_chunk

    store = Store.open(store_uri)
    summary = {"points": 0, "skipped": 0, "busy": 0, "diverged": 0, "interrupted": False}
    stop = StopMarker.of(store, sweep, launch_id)
    if stop.is_set():
        summary["interrupted"] = True
        return summary
    if not len(chunk):
        return summary
    members = chunk.members  # column-wise: no Python object per point on this path
    group = group_tag(members.first())
    claims = Claims(store, sweep, group=group)
    lease, busy = claims.acquire(
        members.run_ids, holder=f"launch {launch_id} chunk {chunk.chunk_id}"
    )
    try:
        with Renewer(lease):
            done = store.done_among(
                sweep, lease.run_ids, stored_reads(group, chunk.chunk_id, planned_at)
            )
            mine = np.array(
                [i for i, r in enumerate(members.run_ids) if r in lease.run_ids and r not in done],
                dtype=np.int64,
            )
            summary.update(busy=len(busy), skipped=len(members) - len(mine) - len(busy))
            if not len(mine):
                return summary
            ids = [members.run_ids[i] for i in mine.tolist()]
            before = trial_hook("before_training")
            if before is not None:
                before(ids)
            checkpoint = Checkpoint.of(store, sweep, chunk.chunk_id, ids)
            hook = StepHook(checkpoint, stop, commit_every, report, len(mine))
            started = time.perf_counter()
            resume = _load_checkpoint(checkpoint)
            summary["resumed"] = 0 if resume is None else len(mine)
            try:
                tables = train_chunk(
                    Chunk(chunk.chunk_id, members.take(mine)),
                    device,
                    hook=hook,
                    resume=resume,
                    node_id=node_id,
                )
            except Stopped:
                summary["interrupted"] = True
                return summary
            owned = lease.owned()  # a stall past the TTL may have lost points to another launch
            if len(owned) < len(mine):
                keep = pa.array(sorted(owned))
                tables = {
                    k: t.filter(pc.is_in(t.column("run_id"), keep)) for k, t in tables.items()
                }
                summary["busy"] += len(mine) - len(owned)
            if tables["runs"].num_rows:  # encoded on the trial's threads (its CPUs)
                store.write_chunk(sweep, chunk.chunk_id, tables, threads=torch.get_num_threads())
            checkpoint.remove()
            status = tables["runs"].column("status").to_pylist()
            summary.update(
                points=len(status),
                diverged=status.count("diverged"),
                seconds=time.perf_counter() - started,
            )
            return summary
    finally:
        lease.release()


def chunk_trial(
    config: dict[str, Any],
    store_uri: str,
    sweep: str,
    grid: Grid | None,
    planned_at: float | None,
    launch_id: str,
    commit_every: float,
) -> None:
    """Tune trainable: one chunk, ``config["chunk"]``: a :class:`ChunkTask` of ``grid``
    (expanded here: the trial receives its own chunk only) or explicit points
    (:func:`encode_chunks`). Threads = the CPUs Ray gave this trial."""
    import ray
    import torch
    from phasesweep.pipeline.train._device import trial_device
    from ray import tune

    assigned = ray.get_runtime_context().get_assigned_resources()
    torch.set_num_threads(max(1, int(assigned.get("CPU", 1))))
    device = str(trial_device(assigned))  # a GPU given and unusable: a clear error
    _, item = config["chunk"]
    if isinstance(item, ChunkTask):
        chunk, plan = expand_task(grid, item), {"planned_at": planned_at}
    else:
        chunk, plan = decode_chunk(*item), {}
    node = ray.get_runtime_context().get_node_id()
    summary = train_and_store(
        store_uri,
        sweep,
        chunk,
        device,
        node,
        launch_id=launch_id,
        commit_every=commit_every,
        report=tune.report,
        **plan,
    )
    tune.report({**summary, "final": True})
