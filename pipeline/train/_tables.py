"""The Arrow tables a chunk produces: its logged rows gathered on the host while it trains
(:class:`LoggedRows`), and from them the chunk's ``trajectories``, ``layers`` and ``runs``
tables (:func:`chunk_tables`), in the store's schema (:mod:`storage.schema`).

A member's rows end where it diverged: rows logged while it was not alive are dropped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import torch
from phasesweep.pipeline.grid import Chunk
from phasesweep.pipeline.train._runs import runs_table
from phasesweep.storage.schema import CROSSING_COLUMNS, to_table
from torch import Tensor

#: (table, name, shape) of each value packed into a logged step's block: table "alive",
#: "traj" or "layers"; shape the value's per-member shape
Columns = list[tuple[str, str, tuple[int, ...]]]


@dataclass
class LoggedRows:
    """Host-side rows of a chunk's ``n_log`` logged steps, one array per column: ``alive``
    (E, n_log) bool, ``traj[name]`` (E, n_log), ``layers[name]`` (E, n_log, depth[, k]), the
    first ``len(steps)`` steps filled (member-major: a column's flat rows are the store's
    rows in (run, step) order, with no copy).

    :meth:`add` packs a logged step's values into one (E, columns) float64 block on the
    device and copies it to the host in one transfer, asynchronous into pinned memory on
    CUDA (``pinned``). The block of the previous logged step is unpacked into the columns
    then: on CUDA the device has long finished it, and the host unpacks it while the device
    trains the steps queued since (waiting for it keeps the host at most one logged step
    ahead of the device), so what is left after the loop is one block, not all of them.
    :meth:`settle` waits for and unpacks what is left; everything else reads the columns
    after it."""

    n_log: int
    pinned: bool = False
    steps: list[int] = field(default_factory=list)
    alive: np.ndarray | None = None
    traj: dict[str, np.ndarray] = field(default_factory=dict)
    layers: dict[str, np.ndarray] = field(default_factory=dict)
    #: packed host blocks not unpacked yet: (step's index, block, its columns, CUDA event)
    _pending: list[tuple[int, Tensor, Columns, object]] = field(default_factory=list)

    def state(self) -> dict:
        """The rows so far as tensors, a list of (E,)-shaped ones per column, one per logged
        step (what ``torch.load(weights_only=True)`` reads back)."""
        self.settle()
        n = len(self.steps)
        per_step = lambda a: [torch.from_numpy(a[:, s].copy()) for s in range(n)]  # noqa: E731
        return {
            "steps": list(self.steps),
            "alive": [] if self.alive is None else per_step(self.alive),
            "traj": {k: per_step(v) for k, v in self.traj.items()},
            "layers": {k: per_step(v) for k, v in self.layers.items()},
        }

    @classmethod
    def from_state(cls, state: dict, n_log: int, pinned: bool = False) -> LoggedRows:
        """The log of :meth:`state` (of a log of ``n_log`` steps), its rows on the host
        wherever the tensors were loaded."""
        log = cls(n_log, pinned)
        for s, step in enumerate(state["steps"]):
            traj = {k: v[s] for k, v in state["traj"].items()}
            layers = {k: v[s] for k, v in state["layers"].items()}
            log.steps.append(step)
            for table, name, v in _tabled(state["alive"][s], traj, layers):
                log._column(table, name, v.shape)[:, s] = v.cpu().numpy()
        return log

    def add(
        self, step: int, alive: Tensor, traj: dict[str, Tensor], layers: dict[str, Tensor]
    ) -> None:
        E = alive.shape[0]
        values = _tabled(alive, traj, layers)
        packed = torch.cat([v.detach().reshape(E, -1).to(torch.float64) for *_, v in values], 1)
        copied = None
        if self.pinned:
            host = torch.empty(packed.shape, dtype=torch.float64, pin_memory=True)
            host.copy_(packed, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record()
        else:
            host = packed.cpu()
        self.steps.append(step)
        columns = [(t, k, (E, *v.shape[1:])) for t, k, v in values]
        self._pending.append((len(self.steps) - 1, host, columns, copied))
        self._unpack(keep=1 if self.pinned else 0)

    def settle(self) -> None:
        """Wait for the copies of :meth:`add` and unpack them into the columns."""
        self._unpack(keep=0)

    def _unpack(self, keep: int) -> None:
        """Unpack the pending blocks but the last ``keep``, oldest first."""
        while len(self._pending) > keep:
            s, host, columns, copied = self._pending.pop(0)
            if copied is not None:
                copied.synchronize()  # type: ignore[attr-defined]
            block = host.numpy()
            start = 0
            for table, name, shape in columns:
                stop = start + math.prod(shape[1:])
                self._column(table, name, shape)[:, s] = block[:, start:stop].reshape(shape)
                start = stop

    def _column(self, table: str, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """The host array of a column whose per-step values have ``shape`` (E, ...),
        allocated for ``n_log`` steps on first use."""
        if table == "alive":
            if self.alive is None:
                self.alive = np.zeros((shape[0], self.n_log), dtype=bool)
            return self.alive
        store = self.traj if table == "traj" else self.layers
        if name not in store:  # filled step by step; read up to len(steps) only
            store[name] = np.empty((shape[0], self.n_log, *shape[1:]))
        return store[name]


def _tabled(
    alive: Tensor, traj: dict[str, Tensor], layers: dict[str, Tensor]
) -> list[tuple[str, str, Tensor]]:
    """A logged step's values as (table, name, value), in the order a block packs them."""
    values = [("alive", "", alive)]
    values += [("traj", k, v) for k, v in traj.items()]
    values += [("layers", k, v) for k, v in layers.items()]
    return values


def chunk_tables(
    chunk: Chunk,
    node_id: str | None,
    log: LoggedRows,
    final: dict[str, np.ndarray],
    wall: float,
    depth: int,
    input_dim: int,
    init_weights: list[Tensor],
    device: torch.device,
) -> dict[str, pa.Table]:
    """The chunk's ``trajectories``, ``layers`` and ``runs`` tables.

    ``log``: the rows of every logged step; ``final``: the loop's state at its end
    (:meth:`~pipeline.train._state.LoopState.final`); ``wall``: seconds the chunk took
    (checkpointed runs included); ``depth``: weight matrices per net; ``init_weights``:
    θ(0)'s weights, each (E, fan_out, fan_in); ``device``: where it trained (named in
    ``runs``)."""
    members = chunk.members
    E = len(members)
    n_log = len(log.steps)
    steps = np.asarray(log.steps, dtype=np.int64)
    assert log.alive is not None, "no logged step"
    rows = log.alive[:, :n_log].reshape(-1)  # (E · n_log,): the rows kept
    layer_rows = np.repeat(rows, depth)
    every = bool(rows.all())  # no member diverged: every row is kept, no gather
    run_ids = pa.array(members.run_ids, pa.string())

    def kept(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """The rows of ``values`` that ``mask`` keeps (all of them, uncopied, where every
        member lived)."""
        return values if every else values[mask]

    traj_cols: dict[str, np.ndarray | pa.Array] = {
        "run_id": repeat_ids(run_ids, n_log, None if every else rows),
        "step": kept(np.tile(steps, E), rows),
    }
    for name, values in log.traj.items():
        traj_cols[name] = kept(values[:, :n_log].reshape(-1), rows)
    trajectories = to_table("trajectories", traj_cols, int(rows.sum()))

    layer_cols: dict[str, np.ndarray | pa.Array] = {
        "run_id": repeat_ids(run_ids, n_log * depth, None if every else layer_rows),
        "step": kept(np.tile(np.repeat(steps, depth), E), layer_rows),
        "layer": kept(np.tile(np.arange(1, depth + 1, dtype=np.int32), E * n_log), layer_rows),
    }
    for name, values in log.layers.items():  # (E, n_log, depth[, k]): lists NaN-padded to k
        layer_cols[name] = kept(values[:, :n_log].reshape(-1, *values.shape[3:]), layer_rows)
    layers = to_table("layers", layer_cols, int(layer_rows.sum()))

    return {
        "trajectories": trajectories,
        "layers": layers,
        "runs": _runs(chunk, node_id, log, final, wall, input_dim, init_weights, device),
    }


def repeat_ids(ids: pa.StringArray, times: int, keep: np.ndarray | None) -> pa.StringArray:
    """Each of ``ids`` ``times`` times in a row, the rows ``keep`` (a mask of
    ``len(ids) · times``) keeps or all of them: the run ids of a table's rows, with no
    Python string per row. Ids of one length (the grid's 16 hex digits) are repeated as a
    byte matrix, in about a third of the time of Arrow's ``take``, which does other ids."""
    offsets = np.frombuffer(ids.buffers()[1], np.int32, len(ids) + 1, ids.offset * 4)
    width = int(offsets[1] - offsets[0]) if len(ids) else 0
    rows = len(ids) * times if keep is None else int(keep.sum())
    if not width or (np.diff(offsets) != width).any() or rows * width >= 2**31:
        index = np.repeat(np.arange(len(ids)), times)
        return ids.take(index if keep is None else index[keep])
    data = np.frombuffer(ids.buffers()[2], np.uint8, len(ids) * width, int(offsets[0]))
    repeated = np.repeat(data.reshape(-1, width), times, axis=0)
    repeated = repeated if keep is None else repeated[keep]
    starts = np.arange(0, (rows + 1) * width, width, dtype=np.int32)
    return pa.StringArray.from_buffers(rows, pa.py_buffer(starts), pa.py_buffer(repeated))


def _runs(
    chunk: Chunk,
    node_id: str | None,
    log: LoggedRows,
    final: dict[str, np.ndarray],
    wall: float,
    input_dim: int,
    init_weights: list[Tensor],
    device: torch.device,
) -> pa.Table:
    E = len(chunk.members)
    alive_end = final["alive"]
    n_log = len(log.steps)
    last_train = log.traj["train_loss"][:, :n_log]
    last_test = log.traj["test_loss"][:, :n_log]
    last_time = log.traj["time"][:, :n_log]
    logged_alive = log.alive[:, :n_log]  # type: ignore[index]
    # index of the last logged step each member was alive at
    last_idx = n_log - 1 - np.argmax(logged_alive[:, ::-1], axis=1)
    pick = lambda a: a[np.arange(E), last_idx]  # noqa: E731
    # ‖W_l(0)‖_F per member, reduced on the device without a squared copy of the weights:
    # one (E, depth) copy to the host
    init_fro = torch.stack(
        [
            torch.linalg.vector_norm(w.detach().reshape(E, -1), dim=1, dtype=torch.float64)
            for w in init_weights
        ],
        1,
    )
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    outcome = {
        "status": pa.array(np.where(alive_end, "completed", "diverged")),
        "final_train_loss": np.where(alive_end, pick(last_train), np.nan),
        "final_test_loss": np.where(alive_end, pick(last_test), np.nan),
        "wall_seconds": np.full(E, wall / E),
        "device": pa.repeat(pa.scalar(device_name), E),
        "finished_at": pa.repeat(pa.scalar(datetime.now(timezone.utc)), E),
        "input_dim": np.full(E, input_dim),
        "initial_train_loss": last_train[:, 0],
        "final_step": final["final_step"],
        "final_time": pick(last_time),
        "init_fro_norms": init_fro.cpu().numpy(),
        "chunk_size": np.full(E, E),
        "chunk_wall_seconds": np.full(E, wall),
        "torch_threads": np.full(E, torch.get_num_threads()),
    }
    for j, name in enumerate(CROSSING_COLUMNS):
        outcome[name] = final["crossing"][:, j]
    return runs_table(chunk.members, chunk.chunk_id, node_id, outcome)
