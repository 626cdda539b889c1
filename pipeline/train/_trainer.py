"""The vectorized ensemble trainer: one chunk of grid points trains as one ensemble.

Per step, for all members at once: forward and hand-written backward
(:class:`pipeline.train._models.EnsembleStep`; bias-free linear nets in factored form,
:class:`pipeline.train._linear_step.LinearStep`), loss-crossing events, divergence
masks, and the update ``θ ← θ − η_k ∇L`` with a per-member ``η_k``. Nothing in
the step synchronises with the host or loops over members; the host is
consulted only at logged steps, where metrics are recorded and their rows reach the
host in one copy.

On a GPU a step of a small net is a few dozen kernels of microseconds each, so their
launches would bound it: there the non-logged step is captured once as a CUDA graph
and replayed (:class:`StepGraph`). It reads its step index and learning-rate schedule
from device tensors and updates its state in place (:class:`LoopState`), so the graph
freezes no Python value; on the CPU the same step runs eagerly with Python integers,
as fast as before (``tests/test_device_paths.py`` checks the two give identical results).

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
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import torch
from phasesweep.pipeline.data._datasets import DataBatch, data_seed, make_datasets, stack
from phasesweep.pipeline.data._seeding import derive_seed, permutations
from phasesweep.pipeline.grid import Chunk, member_lr, step_rows
from phasesweep.pipeline.train._device import accelerated as is_accelerated
from phasesweep.pipeline.train._init import init_params
from phasesweep.pipeline.train._linear_step import LinearStep, linear_step_applies
from phasesweep.pipeline.train._models import (
    DEVICE_MEMORY_FRACTION,
    EnsembleMLP,
    EnsembleStep,
    Params,
    equal_blocks,
    free_device_bytes,
    shares_input,
)
from phasesweep.pipeline.train._runs import runs_table
from phasesweep.pipeline.train.metrics._metrics import MetricRecorder, probe_count
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
    def from_state(cls, state: dict, pinned: bool = False) -> _Log:
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


@dataclass
class LoopState:
    """Per-member state of the step loop besides θ, on the training device and updated in
    place (a captured step replays on these very tensors): the gradient-flow time of step
    k (``time_now``) and of step k − 1, the loss at step k − 1, the initial loss and what
    derives from it (the crossing targets, (E, F), and the divergence limit), whether each
    member is alive, its first crossing times (E, F), the step it stopped at, the index
    of the step being taken (for a captured step: no Python value is frozen into it) and
    the step's η (E,)."""

    time_now: Tensor
    prev_time: Tensor
    prev_loss: Tensor | None
    loss0: Tensor | None
    alive: Tensor
    crossing: Tensor
    final_step: Tensor
    step: Tensor
    eta: Tensor
    target: Tensor | None = None
    limit: Tensor | None = None

    #: keys of a checkpoint (:meth:`ChunkTrainer.run`'s ``state()``) that this holds
    SAVED = ("time_now", "alive", "crossing", "final_step", "loss0", "prev_loss", "prev_time")

    @classmethod
    def fresh(cls, E: int, steps: int, dtype: torch.dtype, device: torch.device) -> LoopState:
        time_now = torch.zeros(E, dtype=dtype, device=device)
        return cls(
            time_now=time_now,
            prev_time=time_now.clone(),
            prev_loss=None,
            loss0=None,
            alive=torch.ones(E, dtype=torch.bool, device=device),
            crossing=torch.full((E, len(CROSSING_FRACTIONS)), math.nan, dtype=dtype, device=device),
            final_step=torch.full((E,), steps, dtype=torch.int64, device=device),
            step=torch.zeros((), dtype=torch.int64, device=device),
            eta=torch.zeros(E, dtype=dtype, device=device),
        )

    @classmethod
    def resumed(cls, resume: dict, device: torch.device) -> LoopState:
        """From a checkpoint, wherever its tensors were loaded: moved to ``device``."""
        saved = {key: resume[key].to(device) for key in cls.SAVED}
        return cls(
            **saved,
            step=torch.tensor(resume["k"], dtype=torch.int64, device=device),
            eta=torch.zeros_like(saved["time_now"]),
        )

    def state(self) -> dict[str, Tensor]:
        """The saved tensors, copied to the host (a checkpoint outlives these buffers)."""
        return {key: getattr(self, key).to("cpu", copy=True) for key in self.SAVED}

    def begin(self, loss: Tensor, divergence_factor: float) -> None:
        """Step 0's loss: the initial loss and the previous step's."""
        self.loss0 = loss.clone()
        self.prev_loss = loss.clone()
        self.prev_time.copy_(self.time_now)
        self.derive(divergence_factor)

    def derive(self, divergence_factor: float) -> None:
        fracs = torch.tensor(CROSSING_FRACTIONS, dtype=self.loss0.dtype, device=self.loss0.device)
        self.target = fracs * self.loss0.unsqueeze(1)
        self.limit = divergence_factor * self.loss0

    def check(self, loss: Tensor, k: int | Tensor) -> None:
        """Events and divergence at step ``k`` (an int, or a tensor: see ``step``), in place.

        Events: the first crossing of frac·L0, linearly interpolated in t. Divergence: a
        loss that is not finite or exceeds the limit stops the member at k."""
        hit = torch.lt(loss.unsqueeze(1), self.target)
        hit.logical_and_(self.crossing.isnan()).logical_and_(self.alive.unsqueeze(1))
        w = self.prev_loss.unsqueeze(1) - self.target
        w.div_((self.prev_loss - loss).unsqueeze(1)).clamp_(0, 1).nan_to_num_(1.0)
        w.mul_((self.time_now - self.prev_time).unsqueeze(1)).add_(self.prev_time.unsqueeze(1))
        torch.where(hit, w, self.crossing, out=self.crossing)
        bad = torch.isfinite(loss).logical_not_()
        bad.logical_or_(loss > self.limit).logical_and_(self.alive)
        if isinstance(k, Tensor):
            torch.where(bad, k, self.final_step, out=self.final_step)
        else:
            self.final_step.masked_fill_(bad, k)
        self.alive.logical_and_(bad.logical_not_())

    def advance(self, loss: Tensor, eta: Tensor) -> None:
        """Step k's loss and time become the previous ones; the clock moves by η (E,)."""
        self.prev_loss.copy_(loss)
        self.prev_time.copy_(self.time_now)
        self.time_now.add_(eta)


class StepGraph:
    """The non-logged step as a CUDA graph: eager for :data:`GRAPH_WARMUP` steps (on a side
    stream, as torch's graph capture asks), then captured once and replayed at every
    non-logged step after. ``step()`` must take its step index and schedule from device
    tensors and update its state in place (see :meth:`ChunkTrainer.fused_step`).

    The stepper's cached buffers are dropped before the capture (``reset``), so that the
    ones the graph writes are allocated during the capture, in the graph's own memory
    pool, which lives as long as the graph does."""

    def __init__(self, step: Callable[[], None], stepper) -> None:  # noqa: ANN001
        self.step, self.stepper = step, stepper
        self.warm = 0
        self.replays = 0  # steps taken by the graph (the capture's included)
        self.graph: torch.cuda.CUDAGraph | None = None

    def __call__(self) -> None:
        if self.graph is not None:
            self.graph.replay()
            self.replays += 1
            return
        if self.warm < GRAPH_WARMUP:
            self.warm += 1
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.step()
            torch.cuda.current_stream().wait_stream(side)
            return
        self.stepper.reset()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            self.step()
        self.graph = graph
        graph.replay()  # the capture recorded the step; this takes it
        self.replays += 1


#: Eager non-logged steps before the step is captured as a CUDA graph.
GRAPH_WARMUP = 3


class _Timer:
    """Seconds of the step loop spent in logged-step metrics. On CUDA the metrics are timed
    by events on the stream (no host synchronisation), read once the loop has ended."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.events: list[tuple] = []
        self.seconds = 0.0
        self._mark = 0.0

    def begin(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.events.append((event,))
        else:
            self._mark = time.perf_counter()

    def end(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.events[-1] += (event,)
        else:
            self.seconds += time.perf_counter() - self._mark

    def total(self) -> float:
        """All metrics seconds (after the stream has been synchronised)."""
        return self.seconds + sum(a.elapsed_time(b) for a, b in self.events) / 1000.0


class ChunkTrainer:
    """Trains one :class:`~pipeline.grid._chunks.Chunk` as a vectorized ensemble.

    ``device``: torch device for the whole chunk; ``node_id``: the Ray node training it
    (stored in ``runs``; None outside Ray). Construction draws data and initial weights
    (one loop over members, outside the training loop).

    ``accelerated`` (default: whether ``device`` is not the CPU, see
    :func:`pipeline.train._device.accelerated`): take the accelerator's paths, the same
    arithmetic in another order of kernels: the non-logged step with its step index and
    schedule read from device tensors (captured as a CUDA graph on CUDA), the logged rows
    packed into one copy per logged step, the metrics in one block and the spectra by the
    batched Jacobi method. Tests set it on the CPU to run those paths where no GPU is.
    """

    def __init__(
        self,
        chunk: Chunk,
        device: str | torch.device = "cpu",
        node_id: str | None = None,
        *,
        accelerated: bool | None = None,
    ) -> None:
        self.chunk = chunk
        self.node_id = node_id
        self.configs = [p.config for p in chunk.points]
        base = self.configs[0]
        self.base = base
        self.device = torch.device(device)
        self.accelerated = is_accelerated(self.device) if accelerated is None else accelerated
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
        # one slope for all: a float, known here without reading the device (and the
        # activations' in-place kernels take it)
        slopes = [c.model.leaky_slope for c in self.configs]
        self.net = EnsembleMLP(
            base.model,
            self.batch.input_dim,
            self.batch.output_dim,
            leaky_slope=vec(slopes) if len(set(slopes)) > 1 else float(slopes[0]),
        )
        self.params0 = init_params(
            self.net,
            [c.model for c in self.configs],
            [c.train.seed for c in self.configs],
            self.dtype,
            self.device,
        )
        self.lr = vec([member_lr(c) for c in self.configs])
        sgd_seeds = [derive_seed(c.train.seed, "sgd") for c in self.configs]
        self.sgd_seeds = torch.tensor(sgd_seeds, device=self.device)
        self._perm: Tensor | None = None  # this epoch's group permutation, (E, groups)
        # members sharing their inputs and their SGD seed share each minibatch's inputs too
        self._shared_batches = shares_input(self.batch.x_train) and len(set(sgd_seeds)) == 1
        self._schedule: Tensor | None = None  # the cosine factor of every step, on the device

    # -- learning-rate schedule --------------------------------------------------------
    def _cosine(self, k: int) -> float:
        t = self.base.train
        return t.lr_min_frac + (1 - t.lr_min_frac) * 0.5 * (1 + math.cos(math.pi * k / t.steps))

    def _eta(self, k: int | Tensor, params: Params) -> Tensor:
        """η_k (E,) before the alive mask. ``k`` a tensor (0-dim, on the device): the
        cosine factor is read from a table of every step's (the same floats), so that a
        captured step holds no Python value of k."""
        t = self.base.train
        if t.lr_schedule == "constant":
            return self.lr
        if t.lr_schedule == "cosine":
            if not isinstance(k, Tensor):
                return self.lr * self._cosine(k)
            if self._schedule is None:
                factors = [self._cosine(j) for j in range(t.steps + 1)]
                self._schedule = torch.tensor(factors, dtype=self.dtype, device=self.device)
            return self.lr * self._schedule[k]
        # norm-adaptive: η = min(η_max, c ‖θ‖^(2−L)), ‖θ‖/√L for lr_norm layer_rms
        depth = self.net.depth
        norm = params.sq_norm().sqrt()
        if t.lr_norm == "layer_rms":
            norm = norm / math.sqrt(depth)
        return torch.minimum(self.lr, t.lr_c * norm.pow(2 - depth))

    def make_step(self) -> EnsembleStep | LinearStep:
        """The step engine of this chunk: :class:`~pipeline.train._linear_step.LinearStep` for
        bias-free linear nets where it needs fewer flops, else
        :class:`~pipeline.train._models.EnsembleStep`."""
        if linear_step_applies(self.net, self.base.model.bias, step_rows(self.base)):
            return LinearStep(self.net, self.E)
        return EnsembleStep(self.net, self.E)

    # -- minibatches ---------------------------------------------------------------------
    def minibatch(self, k: int) -> tuple[Tensor, Tensor]:
        """Member-wise minibatch of step k (without replacement within an epoch; groups kept).

        Members that share their training inputs and SGD seed get one (batch, d) input
        matrix expanded over E (see :func:`pipeline.train._models.shares_input`)."""
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
        numbers only, on the host), which ``resume`` takes to continue from step ``k``
        exactly as if never stopped (e.g. after a kill, from a checkpoint), wherever its
        tensors were loaded: what trains moves to this trainer's device, the logged rows
        stay on the host. The hook may raise to stop.

        Host synchronisation: none in a non-logged step; at a logged step one copy of its
        rows (and the batched spectra's convergence reads where they are computed).
        """
        started = time.perf_counter()
        t, b = self.base.train, self.batch
        steps = t.steps
        logged = set(log_steps(steps, t.log_points).tolist())
        params = self.params0.clone()
        recorder = _member_blocks(
            lambda net, params0, batch: MetricRecorder.for_run(
                net, params0, batch, self.base, sorted(logged), jacobi=self.accelerated
            ),
            self,
        )
        sgd = t.optimizer == "sgd"
        self._perm = None
        cuda = self.device.type == "cuda"
        members = LoopState.fresh(self.E, steps, self.dtype, self.device)
        log = _Log(pinned=cuda)

        stepper = self.make_step()
        self._stepper = stepper
        grads = None
        earlier_s = 0.0
        start = 0
        if resume is not None:
            start, earlier_s = resume["k"], resume["wall_s"]
            params = Params(
                [w.to(self.device) for w in resume["weights"]],
                None if resume["biases"] is None else [v.to(self.device) for v in resume["biases"]],
            )
            members = LoopState.resumed(resume, self.device)
            members.derive(t.divergence_factor)
            log = _Log.from_state(resume["log"], pinned=cuda)

        def state() -> dict:
            host = lambda ts: [x.to("cpu", copy=True) for x in ts]  # noqa: E731
            return {
                "k": k,
                "wall_s": earlier_s + time.perf_counter() - started,
                "weights": host(params.weights),
                "biases": None if params.biases is None else host(params.biases),
                **members.state(),
                "log": log.state(),
            }

        # the non-logged step: with the step index as a device tensor where accelerated
        # (nothing frozen: capturable), on static inputs (SGD: minibatches copied in)
        device_clock = self.accelerated
        xs, ys = b.x_train, b.y_train
        if sgd and device_clock:
            xs, ys = _static_batch(*self.minibatch(start))

        graph = None
        if cuda and device_clock:
            graph = StepGraph(
                lambda: self.fused_step(stepper, members, params, xs, ys, members.step), stepper
            )
        #: the captured non-logged step (None off CUDA); read by tests/test_gpu.py
        self.step_graph = graph
        timer = _Timer(self.device)
        mark = time.perf_counter()
        for k in range(start, steps + 1):
            if hook is not None and k % HOOK_EVERY == 0 and k > start:
                hook(k, state)
            if k not in logged:
                x, y = xs, ys
                if sgd:
                    x, y = self.minibatch(k)
                    if device_clock:
                        x, y = _copy_batch(xs, ys, x, y)
                if graph is not None:
                    graph()
                else:
                    clock = members.step if device_clock else k
                    self.fused_step(stepper, members, params, x, y, clock)
                continue
            # a logged step: the metrics need θ_k and ∇L(θ_k), so gradients first, the
            # update after them
            x, y = self.minibatch(k) if sgd else (b.x_train, b.y_train)
            loss, grads = stepper.loss_and_grads(params, x, y, grads)
            if members.loss0 is None:
                members.begin(loss, t.divergence_factor)
            members.check(loss, k)
            timer.begin()
            self.log_step(log, k, params, grads, loss, members, recorder)
            timer.end()
            if k == steps:
                break
            eta = self._eta(k, params) * members.alive
            for p, g in zip(params.tensors(), grads.tensors()):
                p.sub_(g.mul_(eta.view(-1, *([1] * (g.dim() - 1)))))
            members.advance(loss, eta)
            if device_clock:
                members.step.fill_(k + 1)

        if cuda:
            torch.cuda.synchronize(self.device)
        loop_s = time.perf_counter() - mark
        metrics_s = timer.total()
        log.settle()
        wall = earlier_s + time.perf_counter() - started
        final = {
            "alive": members.alive.cpu().numpy(),
            "final_step": members.final_step.cpu().numpy(),
            "loss0": members.loss0.cpu().numpy().astype(np.float64),
            "crossing": members.crossing.cpu().numpy().astype(np.float64),
        }
        tables = self._tables(log, final, wall)
        #: seconds spent in the step loop (training), in logged-step metrics, and the rest
        #: (setup, tables); read by benchmarks/.
        self.timing = {
            "train_s": loop_s - metrics_s,
            "metrics_s": metrics_s,
            "other_s": time.perf_counter() - started - loop_s,
        }
        return tables

    def fused_step(
        self,
        stepper: EnsembleStep | LinearStep,
        m: LoopState,
        params: Params,
        x: Tensor,
        y: Tensor,
        k: int | Tensor,
    ) -> None:
        """Non-logged step k: θ ← θ − η∇L in one pass of the stepper, then the events, the
        divergence check and the clock, all in place.

        η uses ``alive`` before this step's check, so a member that diverges at this step
        takes one more step. Nothing stored depends on it: the member is stopped at this
        step all the same, its rows end, its clock stops, and its parameters are zeroed
        at the next logged step. ``k`` a tensor (``m.step``): read on the device and
        advanced there, so the step freezes no Python value (CUDA-graph capturable)."""
        torch.mul(self._eta(k, params), m.alive, out=m.eta)
        loss = stepper.step(params, x, y, m.eta)
        m.check(loss, k)
        m.advance(loss, m.eta.mul_(m.alive))
        if isinstance(k, Tensor):
            k.add_(1)

    def log_step(
        self,
        log: _Log,
        k: int,
        params: Params,
        grads: Params,
        loss: Tensor,
        members: LoopState,
        recorder: MetricRecorder | _BlockedRecorder,
    ) -> None:
        b = self.batch
        if self.base.train.optimizer == "sgd":  # full-batch loss and gradient (new buffers:
            # the minibatch gradient in `grads` is still to be applied)
            loss, grads = self._stepper.loss_and_grads(params, b.x_train, b.y_train)
        test_loss = self._stepper.loss(params, b.x_test, b.y_test)
        traj = {"time": members.time_now, "train_loss": loss, "test_loss": test_loss}
        values, layers = recorder.record(params, grads, step=k, time=members.time_now)
        traj.update(values)
        log.add(k, members.alive, traj, layers)
        # dead members: zero their parameters so nothing non-finite lingers (a mask, not
        # a test of whether any died: no host read)
        dead = members.alive.logical_not()
        for p in params.tensors():
            p.masked_fill_(dead.view(-1, *([1] * (p.dim() - 1))), 0.0)

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


def _static_batch(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """Buffers shaped like a minibatch (a shared input stays one expanded (batch, d)
    matrix), holding it: the inputs of a captured step, refilled by :func:`_copy_batch`."""
    xs = x[0].clone().expand_as(x) if shares_input(x) else x.clone()
    return xs, y.clone()


def _copy_batch(xs: Tensor, ys: Tensor, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """Minibatch (x, y) copied into the buffers of :func:`_static_batch`; returns them."""
    if shares_input(xs):
        xs[0].copy_(x[0])
    else:
        xs.copy_(x)
    ys.copy_(y)
    return xs, ys


#: Most members whose metrics are computed in one batch on the CPU. Past this, the batched
#: metric ops of a chunk stream from memory and cost more per member (benchmarks/: about
#: twice as much at 1024 members as at 256), so larger chunks record theirs in blocks.
METRICS_BLOCK = 256

#: Working set (bytes) of one block of members' metrics on CPU (see :func:`metrics_block`).
#: Measured on the project's 2-core machines at width 64, depth 3, 64 probe inputs (16
#: members a block): right after training steps, one logged step's trajectory metrics
#: took 77-90 ms per 256 members in blocks of 16 or 32 and 125-139 ms in one block.
METRICS_BLOCK_BYTES = 6 << 20


def metrics_block(
    dims: Sequence[int],
    probe: int,
    itemsize: int,
    device: torch.device,
    accelerated: bool | None = None,
    kernels: bool = True,
) -> int:
    """Most members per block of metrics.

    On CPU as many as fit :data:`METRICS_BLOCK_BYTES` (at most :data:`METRICS_BLOCK`) with
    the probe activations and sensitivities (probe × Σ widths, twice), a few probe × probe
    kernels (where ``kernels``: the NTK metrics are on) and three copies of θ each. ``accelerated`` (default: off the CPU): as many as
    fit :data:`~pipeline.train._models.DEVICE_MEMORY_FRACTION` of the device's free memory with,
    besides, four copies of the largest matrix the batched spectra rotate; no limit where
    the device does not report it. On a GPU that is the whole chunk: a logged step costs
    one pass of the metrics' kernels, not one per cache-sized block."""
    n_params = sum(a * b for a, b in zip(dims[:-1], dims[1:]))
    per_member = itemsize * (2 * probe * sum(dims[1:]) + 4 * probe * probe * kernels + 3 * n_params)
    if not (is_accelerated(device) if accelerated is None else accelerated):
        return max(1, min(METRICS_BLOCK, METRICS_BLOCK_BYTES // per_member))
    largest = max([probe * probe] + [a * b for a, b in zip(dims[:-1], dims[1:])])
    per_member += itemsize * 4 * largest
    free = free_device_bytes(device)
    return sys.maxsize if free is None else max(1, int(DEVICE_MEMORY_FRACTION * free) // per_member)


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
        trainer.net.dims,
        probe,
        trainer.params0.weights[0].element_size(),
        trainer.device,
        trainer.accelerated,
        kernels=trainer.base.metrics.ntk,
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
