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


@dataclass
class LoggedRows:
    """Host-side accumulation of logged rows: lists of (E,)-shaped numpy arrays per step.

    :meth:`add` packs a logged step's values into one (E, columns) float64 block on the
    device and copies it to the host in one transfer, asynchronous into pinned memory on
    CUDA (``pinned``); :meth:`settle` waits for the copies and unpacks them into the
    lists, which everything else reads."""

    steps: list[int] = field(default_factory=list)
    alive: list[np.ndarray] = field(default_factory=list)
    traj: dict[str, list[np.ndarray]] = field(default_factory=dict)
    layers: dict[str, list[np.ndarray]] = field(default_factory=dict)
    pinned: bool = False
    #: packed host blocks not unpacked yet, with their columns: (table, name, shape)
    _pending: list[tuple[Tensor, list[tuple[str, str, tuple[int, ...]]]]] = field(
        default_factory=list
    )
    _copied: object = None  # the CUDA event after the last copy

    def state(self) -> dict:
        """The rows so far as tensors (what ``torch.load(weights_only=True)`` reads back)."""
        self.settle()
        as_t = lambda arrays: [torch.from_numpy(a) for a in arrays]  # noqa: E731
        return {
            "steps": list(self.steps),
            "alive": as_t(self.alive),
            "traj": {k: as_t(v) for k, v in self.traj.items()},
            "layers": {k: as_t(v) for k, v in self.layers.items()},
        }

    @classmethod
    def from_state(cls, state: dict, pinned: bool = False) -> LoggedRows:
        """The log of :meth:`state`, its rows on the host wherever the tensors were loaded."""
        as_np = lambda tensors: [t.cpu().numpy() for t in tensors]  # noqa: E731
        return cls(
            list(state["steps"]),
            as_np(state["alive"]),
            {k: as_np(v) for k, v in state["traj"].items()},
            {k: as_np(v) for k, v in state["layers"].items()},
            pinned,
        )

    def add(
        self, step: int, alive: Tensor, traj: dict[str, Tensor], layers: dict[str, Tensor]
    ) -> None:
        E = alive.shape[0]
        values = [("alive", "", alive)]
        values += [("traj", k, v) for k, v in traj.items()]
        values += [("layers", k, v) for k, v in layers.items()]
        packed = torch.cat([v.detach().reshape(E, -1).to(torch.float64) for *_, v in values], 1)
        if self.pinned:
            host = torch.empty(packed.shape, dtype=torch.float64, pin_memory=True)
            host.copy_(packed, non_blocking=True)
            self._copied = torch.cuda.Event()
            self._copied.record()
        else:
            host = packed.cpu()
        self.steps.append(step)
        self._pending.append((host, [(t, k, tuple(v.shape[1:])) for t, k, v in values]))

    def settle(self) -> None:
        """Wait for the copies of :meth:`add` and unpack them into the lists."""
        if self._copied is not None:
            self._copied.synchronize()
            self._copied = None
        for host, columns in self._pending:
            block = host.numpy()
            start = 0
            for table, name, shape in columns:
                stop = start + math.prod(shape)
                value = block[:, start:stop].reshape(block.shape[0], *shape)
                start = stop
                if table == "alive":
                    self.alive.append(value != 0)
                else:
                    store = self.traj if table == "traj" else self.layers
                    store.setdefault(name, []).append(value)
        self._pending.clear()


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
    alive = np.stack(log.alive, 1)  # (E, n_log)
    run_ids = pa.array(members.run_ids, pa.string())
    rows = alive.reshape(-1)
    # the run ids of the rows kept by ``mask`` (E · per_member,), gathered by Arrow: no
    # Python string per row
    of_member = lambda per_member, mask: run_ids.take(  # noqa: E731
        np.repeat(np.arange(E), per_member)[mask]
    )

    traj_cols: dict[str, np.ndarray | pa.Array] = {
        "run_id": of_member(n_log, rows),
        "step": np.tile(steps, E)[rows],
    }
    for name, values in log.traj.items():
        traj_cols[name] = np.stack(values, 1).reshape(-1)[rows]
    trajectories = to_table("trajectories", traj_cols, int(rows.sum()))

    layer_rows = np.repeat(rows, depth)
    layer_cols: dict[str, np.ndarray | pa.Array] = {
        "run_id": of_member(n_log * depth, layer_rows),
        "step": np.tile(np.repeat(steps, depth), E)[layer_rows],
        "layer": np.tile(np.arange(1, depth + 1, dtype=np.int32), E * n_log)[layer_rows],
    }
    for name, values in log.layers.items():
        arr = np.stack(values, 1)  # (E, n_log, depth[, k]): lists NaN-padded to k
        layer_cols[name] = arr.reshape(E * n_log * depth, *arr.shape[3:])[layer_rows]
    layers = to_table("layers", layer_cols, int(layer_rows.sum()))

    return {
        "trajectories": trajectories,
        "layers": layers,
        "runs": _runs(chunk, node_id, log, final, wall, input_dim, init_weights, device),
    }


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
    last_train = np.stack(log.traj["train_loss"], 1)
    last_test = np.stack(log.traj["test_loss"], 1)
    last_time = np.stack(log.traj["time"], 1)
    logged_alive = np.stack(log.alive, 1)
    # index of the last logged step each member was alive at
    last_idx = logged_alive.shape[1] - 1 - np.argmax(logged_alive[:, ::-1], axis=1)
    pick = lambda a: a[np.arange(E), last_idx]  # noqa: E731
    # ‖W_l(0)‖_F per member, summed on the device: one (E, depth) copy to the host
    init_fro = torch.stack(
        [w.detach().reshape(E, -1).double().square().sum(1).sqrt() for w in init_weights], 1
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
