"""The vectorized ensemble trainer: one chunk of grid points trains as one ensemble.

Per step, for all members at once: forward and hand-written backward
(:class:`pipeline._models.EnsembleStep`; bias-free linear nets in factored form,
:class:`pipeline._linear_step.LinearStep`), loss-crossing events, divergence
masks, and the update ``θ ← θ − η_k ∇L`` with a per-member ``η_k``. Nothing in
the step synchronises with the host or loops over members; the host is
consulted only at logged steps, where metrics are recorded.

Clock: row ``step = k`` holds θ_k (after k updates) and the gradient-flow time
``t_k = Σ_{j<k} η_j``. Full-batch GD evaluates the full training loss every
step; SGD evaluates its minibatch loss every step (events and divergence use
it) and the full training loss at logged steps.

Divergence: a member whose loss is not finite or exceeds
``divergence_factor`` × its initial loss is stopped (η = 0, parameters zeroed
at the next logged step so no NaN/Inf lingers) and stored as ``diverged`` with
the rows logged before it diverged; the others go on unaffected.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import torch
from phasesweep.pipeline._datasets import DataBatch, data_seed, make_datasets, stack
from phasesweep.pipeline._grid import Chunk, member_lr, step_rows
from phasesweep.pipeline._init import init_params
from phasesweep.pipeline._linear_step import LinearStep, linear_step_applies
from phasesweep.pipeline._metrics import MetricRecorder, probe_count
from phasesweep.pipeline._models import (
    EnsembleMLP,
    EnsembleStep,
    Params,
    equal_blocks,
    shares_input,
)
from phasesweep.pipeline._runs import runs_table
from phasesweep.pipeline._seeding import derive_seed, permutations
from phasesweep.storage.schema import CROSSING_COLUMNS, CROSSING_FRACTIONS, log_steps, to_table
from torch import Tensor


def configure_tf32(device: torch.device, allow: bool) -> None:
    """On CUDA, TF32 matmuls silently lose float32 precision: off unless the spec asks.

    A process-wide setting of torch; trials train one chunk at a time, so it holds
    for the whole chunk."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = allow
        torch.backends.cudnn.allow_tf32 = allow


#: ``hook(k, state)``: called before step k; ``state()`` snapshots the training state.
StepHook = Callable[[int, Callable[[], dict]], None]

#: Steps between calls of the step hook: a modulo per step, the hook itself reads the clock.
HOOK_EVERY = 16


@dataclass
class _Log:
    """Host-side accumulation of logged rows: lists of (E,)-shaped numpy arrays per step."""

    steps: list[int] = field(default_factory=list)
    alive: list[np.ndarray] = field(default_factory=list)
    traj: dict[str, list[np.ndarray]] = field(default_factory=dict)
    layers: dict[str, list[np.ndarray]] = field(default_factory=dict)

    def state(self) -> dict:
        """The rows so far as tensors (what ``torch.load(weights_only=True)`` reads back)."""
        as_t = lambda arrays: [torch.from_numpy(a) for a in arrays]  # noqa: E731
        return {
            "steps": list(self.steps),
            "alive": as_t(self.alive),
            "traj": {k: as_t(v) for k, v in self.traj.items()},
            "layers": {k: as_t(v) for k, v in self.layers.items()},
        }

    @classmethod
    def from_state(cls, state: dict) -> _Log:
        as_np = lambda tensors: [t.numpy() for t in tensors]  # noqa: E731
        return cls(
            list(state["steps"]),
            as_np(state["alive"]),
            {k: as_np(v) for k, v in state["traj"].items()},
            {k: as_np(v) for k, v in state["layers"].items()},
        )

    def add(
        self, step: int, alive: Tensor, traj: dict[str, Tensor], layers: dict[str, Tensor]
    ) -> None:
        self.steps.append(step)
        self.alive.append(alive.cpu().numpy())
        for store, values in ((self.traj, traj), (self.layers, layers)):
            for k, v in values.items():
                store.setdefault(k, []).append(v.detach().to("cpu", torch.float64).numpy())


class ChunkTrainer:
    """Trains one :class:`~pipeline._grid.Chunk` as a vectorized ensemble.

    ``device``: torch device for the whole chunk; ``node_id``: the Ray node training it
    (stored in ``runs``; None outside Ray). Construction draws data and initial weights
    (one loop over members, outside the training loop).
    """

    def __init__(
        self, chunk: Chunk, device: str | torch.device = "cpu", node_id: str | None = None
    ) -> None:
        self.chunk = chunk
        self.node_id = node_id
        self.configs = [p.config for p in chunk.points]
        base = self.configs[0]
        self.base = base
        self.device = torch.device(device)
        self.dtype = getattr(torch, base.train.dtype)
        configure_tf32(self.device, base.train.allow_tf32)
        E = len(self.configs)
        self.E = E
        self.batch: DataBatch = stack(
            make_datasets([(c.data, data_seed(c.data, c.train.seed)) for c in self.configs]),
            self.dtype,
            self.device,
        )
        vec = lambda values: torch.tensor(values, dtype=self.dtype, device=self.device)  # noqa: E731
        self.net = EnsembleMLP(
            base.model,
            self.batch.input_dim,
            self.batch.output_dim,
            leaky_slope=vec([c.model.leaky_slope for c in self.configs]),
        )
        self.params0 = init_params(
            self.net,
            [c.model for c in self.configs],
            [c.train.seed for c in self.configs],
            self.dtype,
            self.device,
        )
        self.lr = vec([member_lr(c) for c in self.configs])
        self.sgd_seeds = torch.tensor(
            [derive_seed(c.train.seed, "sgd") for c in self.configs], device=self.device
        )
        self._perm: Tensor | None = None  # this epoch's group permutation, (E, groups)
        # members sharing their inputs and their SGD seed share each minibatch's inputs too
        self._shared_batches = shares_input(self.batch.x_train) and bool(
            (self.sgd_seeds == self.sgd_seeds[0]).all()
        )

    # -- learning-rate schedule --------------------------------------------------------
    def _eta(self, k: int, params: Params) -> Tensor:
        t = self.base.train
        if t.lr_schedule == "constant":
            return self.lr
        if t.lr_schedule == "cosine":
            frac = t.lr_min_frac + (1 - t.lr_min_frac) * 0.5 * (1 + math.cos(math.pi * k / t.steps))
            return self.lr * frac
        # norm-adaptive: η = min(η_max, c ‖θ‖^(2−L)), ‖θ‖/√L for lr_norm layer_rms
        depth = self.net.depth
        norm = params.sq_norm().sqrt()
        if t.lr_norm == "layer_rms":
            norm = norm / math.sqrt(depth)
        return torch.minimum(self.lr, t.lr_c * norm.pow(2 - depth))

    def make_step(self) -> EnsembleStep | LinearStep:
        """The step engine of this chunk: :class:`~pipeline._linear_step.LinearStep` for
        bias-free linear nets where it needs fewer flops, else
        :class:`~pipeline._models.EnsembleStep`."""
        if linear_step_applies(self.net, self.base.model.bias, step_rows(self.base)):
            return LinearStep(self.net, self.E)
        return EnsembleStep(self.net, self.E)

    # -- minibatches ---------------------------------------------------------------------
    def minibatch(self, k: int) -> tuple[Tensor, Tensor]:
        """Member-wise minibatch of step k (without replacement within an epoch; groups kept).

        Members that share their training inputs and SGD seed get one (batch, d) input
        matrix expanded over E (see :func:`pipeline._models.shares_input`)."""
        t, b = self.base.train, self.batch
        g = b.group_size
        n_groups = b.x_train.shape[1] // g
        per_step = max(t.batch_size // g, 1)
        steps_per_epoch = max(n_groups // per_step, 1)
        epoch, pos = divmod(k, steps_per_epoch)
        if pos == 0 or self._perm is None:
            self._perm = permutations(self.sgd_seeds, epoch, n_groups)
        groups = self._perm[:, pos * per_step : (pos + 1) * per_step]
        idx = (groups.unsqueeze(-1) * g + torch.arange(g, device=self.device)).reshape(self.E, -1)
        rows = torch.arange(self.E, device=self.device).unsqueeze(1)
        if self._shared_batches:
            return b.x_train[0, idx[0]].expand(self.E, -1, -1), b.y_train[rows, idx]
        return b.x_train[rows, idx], b.y_train[rows, idx]

    # -- training ------------------------------------------------------------------------
    def run(self, hook: StepHook | None = None, resume: dict | None = None) -> dict[str, pa.Table]:
        """Train every member; returns the chunk's ``runs``, ``trajectories`` and ``layers`` tables.

        ``hook(k, state)`` is called every :data:`HOOK_EVERY` steps before step ``k``;
        ``state()`` returns the whole training state at that point (tensors, lists and
        numbers only), which ``resume`` takes to continue from step ``k`` exactly as if
        never stopped (e.g. after a kill, from a checkpoint). The hook may raise to stop.
        """
        started = time.perf_counter()
        t, b = self.base.train, self.batch
        E = self.E
        steps = t.steps
        logged = set(log_steps(steps, t.log_points).tolist())
        params = self.params0.clone()
        recorder = _member_blocks(
            lambda net, params0, batch: MetricRecorder.for_run(
                net, params0, batch, self.base, sorted(logged)
            ),
            self,
        )
        sgd = t.optimizer == "sgd"
        self._perm = None

        time_now = torch.zeros(E, dtype=self.dtype, device=self.device)
        alive = torch.ones(E, dtype=torch.bool, device=self.device)
        fracs = torch.tensor(CROSSING_FRACTIONS, dtype=self.dtype, device=self.device)
        crossing = torch.full((E, len(fracs)), math.nan, dtype=self.dtype, device=self.device)
        final_step = torch.full((E,), steps, dtype=torch.int64, device=self.device)
        loss0 = prev_loss = prev_time = None
        log = _Log()

        stepper = self.make_step()
        self._stepper = stepper
        grads = None
        train_s = metrics_s = earlier_s = 0.0
        start = 0
        if resume is not None:
            start, earlier_s = resume["k"], resume["wall_s"]
            params = Params(resume["weights"], resume["biases"])
            time_now, alive, crossing = resume["time_now"], resume["alive"], resume["crossing"]
            final_step, loss0 = resume["final_step"], resume["loss0"]
            prev_loss, prev_time = resume["prev_loss"], resume["prev_time"]
            log = _Log.from_state(resume["log"])

        def state() -> dict:
            return {
                "k": k,
                "wall_s": earlier_s + time.perf_counter() - started,
                "weights": list(params.weights),
                "biases": None if params.biases is None else list(params.biases),
                "time_now": time_now,
                "alive": alive,
                "crossing": crossing,
                "final_step": final_step,
                "loss0": loss0,
                "prev_loss": prev_loss,
                "prev_time": prev_time,
                "log": log.state(),
            }

        mark = time.perf_counter()
        for k in range(start, steps + 1):
            if hook is not None and k % HOOK_EVERY == 0 and k > start:
                hook(k, state)
            x, y = self.minibatch(k) if sgd else (b.x_train, b.y_train)
            log_now = k in logged
            if log_now:  # the metrics need θ_k and ∇L(θ_k): gradients first, update below
                loss, grads = stepper.loss_and_grads(params, x, y, grads)
            else:
                # fused: θ ← θ − η∇L in one pass; η uses `alive` before this step's check,
                # so a member that diverges at this step takes one more step. Nothing
                # stored depends on it: the member is stopped at this step all the same,
                # its rows end, its clock stops, and its parameters are zeroed at the
                # next logged step
                eta_k = self._eta(k, params) * alive
                loss = stepper.step(params, x, y, eta_k)
            if loss0 is None:
                loss0 = loss.clone()
                prev_loss, prev_time = loss0, time_now.clone()
            # events: first crossing of frac·L0, linearly interpolated in t
            target = fracs * loss0.unsqueeze(1)
            hit = (loss.unsqueeze(1) < target) & crossing.isnan() & alive.unsqueeze(1)
            denom = (prev_loss - loss).unsqueeze(1)
            w = ((prev_loss.unsqueeze(1) - target) / denom).clamp(0, 1).nan_to_num(1.0)
            t_hit = prev_time.unsqueeze(1) + w * (time_now - prev_time).unsqueeze(1)
            crossing = torch.where(hit, t_hit, crossing)
            # divergence
            bad = (~torch.isfinite(loss) | (loss > t.divergence_factor * loss0)) & alive
            final_step = torch.where(bad, k, final_step)
            alive = alive & ~bad

            if log_now:
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)  # the metrics' timer starts here
                now = time.perf_counter()
                train_s += now - mark
                self._log(log, k, params, grads, loss, time_now, alive, recorder)
                mark = time.perf_counter()
                metrics_s += mark - now
            if k == steps:
                break
            if log_now:
                eta = self._eta(k, params) * alive
                for p, g in zip(params.tensors(), grads.tensors()):
                    p.sub_(g.mul_(eta.view(-1, *([1] * (g.dim() - 1)))))
            else:
                eta = eta_k * alive
            prev_loss, prev_time = loss, time_now.clone()
            time_now = time_now + eta

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        train_s += time.perf_counter() - mark
        wall = earlier_s + time.perf_counter() - started
        final = {
            "alive": alive.cpu().numpy(),
            "final_step": final_step.cpu().numpy(),
            "loss0": loss0.cpu().numpy().astype(np.float64),
            "crossing": crossing.cpu().numpy().astype(np.float64),
        }
        tables = self._tables(log, final, wall)
        #: seconds spent in the step loop (training), in logged-step metrics, and the rest
        #: (setup, tables); read by benchmarks/.
        self.timing = {
            "train_s": train_s,
            "metrics_s": metrics_s,
            "other_s": time.perf_counter() - started - train_s - metrics_s,
        }
        return tables

    def _log(
        self,
        log: _Log,
        k: int,
        params: Params,
        grads: Params,
        loss: Tensor,
        time_now: Tensor,
        alive: Tensor,
        recorder: MetricRecorder | _BlockedRecorder,
    ) -> None:
        b = self.batch
        if self.base.train.optimizer == "sgd":  # full-batch loss and gradient (new buffers:
            # the minibatch gradient in `grads` is still to be applied)
            loss, grads = self._stepper.loss_and_grads(params, b.x_train, b.y_train)
        test_loss = self._stepper.loss(params, b.x_test, b.y_test)
        traj = {"time": time_now, "train_loss": loss, "test_loss": test_loss}
        values, layers = recorder.record(params, grads, step=k, time=time_now)
        traj.update(values)
        log.add(k, alive, traj, layers)
        # dead members: zero their parameters so nothing non-finite lingers
        if not bool(alive.all()):
            keep = alive.to(self.dtype)
            for p in params.tensors():
                p.mul_(keep.view(-1, *([1] * (p.dim() - 1)))).nan_to_num_(0.0)

    # -- tables ----------------------------------------------------------------------------
    def _tables(self, log: _Log, final: dict[str, np.ndarray], wall: float) -> dict[str, pa.Table]:
        E, depth = self.E, self.net.depth
        n_log = len(log.steps)
        steps = np.asarray(log.steps, dtype=np.int64)
        alive = np.stack(log.alive, 1)  # (E, n_log)
        run_ids = np.array([p.run_id for p in self.chunk.points], dtype=object)
        rows = alive.reshape(-1)

        traj_cols: dict[str, np.ndarray] = {
            "run_id": np.repeat(run_ids, n_log)[rows],
            "step": np.tile(steps, E)[rows],
        }
        for name, values in log.traj.items():
            traj_cols[name] = np.stack(values, 1).reshape(-1)[rows]
        trajectories = to_table("trajectories", traj_cols, int(rows.sum()))

        layer_rows = np.repeat(rows, depth)
        layer_cols: dict[str, np.ndarray] = {
            "run_id": np.repeat(run_ids, n_log * depth)[layer_rows],
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
            "runs": self._runs(log, final, wall),
        }

    def _runs(self, log: _Log, final: dict[str, np.ndarray], wall: float) -> pa.Table:
        E = self.E
        alive_end = final["alive"]
        last_train = np.stack(log.traj["train_loss"], 1)
        last_test = np.stack(log.traj["test_loss"], 1)
        last_time = np.stack(log.traj["time"], 1)
        logged_alive = np.stack(log.alive, 1)
        # index of the last logged step each member was alive at
        last_idx = logged_alive.shape[1] - 1 - np.argmax(logged_alive[:, ::-1], axis=1)
        pick = lambda a: a[np.arange(E), last_idx]  # noqa: E731
        init_fro = [
            np.sqrt(np.square(w.detach().cpu().numpy().reshape(E, -1)).sum(1))
            for w in self.params0.weights
        ]
        device = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"
        outcome = {
            "status": np.where(alive_end, "completed", "diverged"),
            "final_train_loss": np.where(alive_end, pick(last_train), np.nan),
            "final_test_loss": np.where(alive_end, pick(last_test), np.nan),
            "wall_seconds": np.full(E, wall / E),
            "device": [device] * E,
            "finished_at": [datetime.now(timezone.utc)] * E,
            "input_dim": [self.batch.input_dim] * E,
            "initial_train_loss": last_train[:, 0],
            "final_step": final["final_step"],
            "final_time": pick(last_time),
            "init_fro_norms": [list(r) for r in np.stack(init_fro, 1)],
            "chunk_size": np.full(E, E),
            "chunk_wall_seconds": np.full(E, wall),
            "torch_threads": np.full(E, torch.get_num_threads()),
        }
        for j, name in enumerate(CROSSING_COLUMNS):
            outcome[name] = final["crossing"][:, j]
        return runs_table(self.chunk.points, self.chunk.chunk_id, self.node_id, outcome)


#: Most members whose metrics are computed in one batch off the CPU. Past this, the batched
#: metric ops of a chunk stream from memory and cost more per member (benchmarks/: about
#: twice as much at 1024 members as at 256), so larger chunks record theirs in blocks.
METRICS_BLOCK = 256

#: Working set (bytes) of one block of members' metrics on CPU (see :func:`metrics_block`).
#: Measured on the project's 2-core machines at width 64, depth 3, 64 probe inputs (16
#: members a block): right after training steps, one logged step's trajectory metrics
#: took 77-90 ms per 256 members in blocks of 16 or 32 and 125-139 ms in one block.
METRICS_BLOCK_BYTES = 6 << 20


def metrics_block(dims: Sequence[int], probe: int, itemsize: int, device: torch.device) -> int:
    """Most members per block of metrics: :data:`METRICS_BLOCK` off the CPU; on CPU as many
    as fit :data:`METRICS_BLOCK_BYTES` with the probe activations and sensitivities
    (probe × Σ widths, twice), a few probe × probe kernels and three copies of θ each."""
    if device.type != "cpu":
        return METRICS_BLOCK
    n_params = sum(a * b for a, b in zip(dims[:-1], dims[1:]))
    per_member = itemsize * (2 * probe * sum(dims[1:]) + 4 * probe * probe + 3 * n_params)
    return max(1, min(METRICS_BLOCK, METRICS_BLOCK_BYTES // per_member))


class _BlockedRecorder:
    """One recorder per block of members, used like one recorder of the whole chunk."""

    def __init__(self, bounds: list[tuple[int, int]], recorders: list) -> None:
        self.bounds, self.recorders = bounds, recorders

    def record(
        self, params: Params, grads: Params, step: int | None = None, time: Tensor | None = None
    ) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        parts = [
            rec.record(
                _slice_params(params, s, e),
                _slice_params(grads, s, e),
                step=step,
                time=None if time is None else time[s:e],
            )
            for (s, e), rec in zip(self.bounds, self.recorders)
        ]
        return tuple(  # type: ignore[return-value]
            {key: torch.cat([p[i][key] for p in parts]) for key in parts[0][i]} for i in range(2)
        )


def _slice_params(p: Params, s: int, e: int) -> Params:
    return Params(
        [w[s:e] for w in p.weights], None if p.biases is None else [v[s:e] for v in p.biases]
    )


def _member_blocks(make, trainer: ChunkTrainer):
    """``make(net, params0, batch)`` for the whole chunk, or per block of at most
    :func:`metrics_block` members (equal sizes ±1) wrapped as one recorder."""
    E = trainer.E
    probe = probe_count(trainer.base.metrics, trainer.batch.x_test.shape[1])
    block = metrics_block(
        trainer.net.dims, probe, trainer.params0.weights[0].element_size(), trainer.device
    )
    if block >= E:
        return make(trainer.net, trainer.params0, trainer.batch)
    bounds = equal_blocks(E, block)
    recorders = []
    for s, e in bounds:
        net = trainer.net.members(s, e)
        b = trainer.batch
        batch = dataclasses.replace(
            b,
            x_train=b.x_train[s:e],
            y_train=b.y_train[s:e],
            x_test=b.x_test[s:e],
            y_test=b.y_test[s:e],
            codim_basis=None if b.codim_basis is None else b.codim_basis[s:e],
        )
        recorders.append(make(net, _slice_params(trainer.params0, s, e), batch))
    return _BlockedRecorder(bounds, recorders)


def train_chunk(
    chunk: Chunk,
    device: str | torch.device = "cpu",
    hook: StepHook | None = None,
    resume: dict | None = None,
    node_id: str | None = None,
) -> dict[str, pa.Table]:
    """Train ``chunk`` as one ensemble and return its tables (see :class:`ChunkTrainer`)."""
    return ChunkTrainer(chunk, device, node_id).run(hook, resume)
