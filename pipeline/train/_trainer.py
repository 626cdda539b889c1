"""The vectorized ensemble trainer: one chunk of grid points trains as one ensemble.

Per step, for all members at once: forward and hand-written backward
(:class:`pipeline.train._models.EnsembleStep`; bias-free linear nets in factored form,
:class:`pipeline.train._linear_step.LinearStep`), loss-crossing events, divergence
masks, and the update of θ with a per-member ``η_k`` (the optimizer and the schedule of
:mod:`pipeline.train._optim`: gd and sgd take ``θ ← θ − η_k ∇L``). Nothing in
the step synchronises with the host or loops over members; the host is
consulted only at logged steps, where metrics are recorded and their rows reach the
host in one copy.

On a GPU a step of a small net is a few dozen kernels of microseconds each, so their
launches would bound it: there the non-logged step is captured once as a CUDA graph
and replayed (:class:`~pipeline.train._capture.StepGraph`). It reads its step index and
learning-rate schedule from device tensors and updates its state in place
(:class:`~pipeline.train._state.LoopState`), so the graph
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

The logged rows and the tables built from them are :mod:`pipeline.train._tables`; the
metrics in blocks of members, :mod:`pipeline.train._metric_blocks`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import torch
from phasesweep.pipeline.data._datasets import (
    DataBatch,
    Dataset,
    data_seed,
    make_datasets,
    stack,
)
from phasesweep.pipeline.grid import Chunk, Members
from phasesweep.pipeline.train._capture import StepGraph, copy_batch, static_batch
from phasesweep.pipeline.train._device import accelerated as is_accelerated
from phasesweep.pipeline.train._init import init_ensemble
from phasesweep.pipeline.train._linear_step import LinearStep, linear_step_applies
from phasesweep.pipeline.train._metric_blocks import BlockedRecorder, member_blocks
from phasesweep.pipeline.train._models import EnsembleMLP, EnsembleStep, Params
from phasesweep.pipeline.train._optim import OPTIMIZERS, SCHEDULES
from phasesweep.pipeline.train._state import LoopState
from phasesweep.pipeline.train._tables import LoggedRows, chunk_tables
from phasesweep.pipeline.train.metrics._metrics import MetricRecorder
from phasesweep.storage.schema import log_steps
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
    (stored in ``runs``; None outside Ray). Construction makes data once per seed, draws
    initial weights once per seed and gathers them per member on the device, and reads the
    members' fields column-wise (:class:`~pipeline.grid._members.Members`); its seconds
    are :attr:`setup_s`, counted in :meth:`run`'s timing and wall columns.

    ``accelerated`` (default: whether ``device`` is not the CPU, see
    :func:`pipeline.train._device.accelerated`): take the accelerator's paths, the same
    arithmetic in another order of kernels: the non-logged step with its step index and
    schedule read from device tensors (captured as a CUDA graph on CUDA), the logged rows
    packed into one copy per logged step, the metrics in one block, and the spectra and
    the kernel predictor by fixed sequences of batched matmuls. Tests set it on the CPU to run those paths where no GPU is.
    """

    def __init__(
        self,
        chunk: Chunk,
        device: str | torch.device = "cpu",
        node_id: str | None = None,
        *,
        accelerated: bool | None = None,
    ) -> None:
        started = time.perf_counter()
        self.chunk = chunk
        self.node_id = node_id
        members = chunk.members
        self.members = members
        base = members.first()
        self.base = base
        self.device = torch.device(device)
        self.accelerated = is_accelerated(self.device) if accelerated is None else accelerated
        self.dtype = getattr(torch, base.train.dtype)
        configure_tf32(self.device, base.train.allow_tf32)
        E = len(members)
        self.E = E
        self.batch: DataBatch = stack(_datasets(members), self.dtype, self.device)
        # one slope for all: a float, known here without reading the device (and the
        # activations' in-place kernels take it)
        slopes = members.column("model", "leaky_slope")
        self.net = EnsembleMLP(
            base.model,
            self.batch.input_dim,
            self.batch.output_dim,
            leaky_slope=self._vector(slopes) if len(set(slopes)) > 1 else float(slopes[0]),
        )
        self.params0 = init_ensemble(
            self.net,
            members.models["model"],  # type: ignore[arg-type]
            members.index["model"],
            members.column("train", "seed"),
            self.dtype,
            self.device,
        )
        self.optimizer = OPTIMIZERS[base.train.optimizer](members.configs(), self.device)
        self.schedule = SCHEDULES[base.train.lr_schedule](
            self._vector(members.learning_rates()), base.train, self.net.depth
        )
        #: seconds the constructor took (data, initial weights, learning rates): counted
        #: in :meth:`run`'s timing and wall columns
        self.setup_s = time.perf_counter() - started

    def _vector(self, values: np.ndarray) -> Tensor:
        """A per-member value (E,) as a tensor of the chunk's dtype on its device."""
        return torch.from_numpy(np.asarray(values, dtype=np.float64)).to(self.device, self.dtype)

    def make_step(self) -> EnsembleStep | LinearStep:
        """The step engine of this chunk: :class:`~pipeline.train._linear_step.LinearStep` for
        bias-free linear nets where it needs fewer flops, else
        :class:`~pipeline.train._models.EnsembleStep`."""
        if linear_step_applies(self.net, self.base.model.bias, self.optimizer.step_rows(self.base)):
            return LinearStep(self.net, self.E)
        return EnsembleStep(self.net, self.E)

    def minibatch(self, k: int) -> tuple[Tensor, Tensor]:
        """The (x, y) of this chunk's data that step k trains on (its optimizer's choice:
        the whole training set for full-batch gd)."""
        return self.optimizer.minibatch(self.batch, k)

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
        rows, and besides on the CPU's paths the LAPACK spectra's check that the kernels are
        finite, on the accelerator's the kernel predictor's one read per block of
        n_train + 1 logged steps (its number of halvings).
        """
        started = time.perf_counter() - self.setup_s  # the constructor's seconds count
        t, b = self.base.train, self.batch
        steps = t.steps
        logged = set(log_steps(steps, t.log_points).tolist())
        params = self.params0.clone()
        recorder_started = time.perf_counter()
        metrics = self.base.metrics
        times = None  # the logged steps' clock, for the accelerated kernel predictor
        if self.accelerated and metrics.ntk and metrics.linearized:
            times = self.schedule.clock(sorted(logged))
        recorder = member_blocks(
            lambda net, params0, batch, block: MetricRecorder.for_run(
                net,
                params0,
                batch,
                self.base,
                sorted(logged),
                accelerated=self.accelerated,
                clock=None if times is None else times[block],
            ),
            self.net,
            self.params0,
            b,
            metrics,
            self.device,
            self.accelerated,
        )
        cuda = self.device.type == "cuda"
        if cuda:  # the recorder's set-up (references, the kernel predictor) is metrics work
            torch.cuda.synchronize(self.device)
        recorder_s = time.perf_counter() - recorder_started
        full_batch = self.optimizer.full_batch
        members = LoopState.fresh(self.E, steps, self.dtype, self.device)
        log = LoggedRows(len(logged), pinned=cuda)

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
            log = LoggedRows.from_state(resume["log"], len(logged), pinned=cuda)
            self.optimizer.load_state(resume)
            self.schedule.load_state(resume)

        def state() -> dict:
            host = lambda ts: [x.to("cpu", copy=True) for x in ts]  # noqa: E731
            return {
                "k": k,
                "wall_s": earlier_s + time.perf_counter() - started,
                "weights": host(params.weights),
                "biases": None if params.biases is None else host(params.biases),
                **members.state(),
                **self.optimizer.state(),
                **self.schedule.state(),
                "log": log.state(),
            }

        # the non-logged step: with the step index as a device tensor where accelerated
        # (nothing frozen: capturable), on static inputs (SGD: minibatches copied in)
        device_clock = self.accelerated
        xs, ys = b.x_train, b.y_train
        if not full_batch and device_clock:
            xs, ys = static_batch(*self.minibatch(start))

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
                if not full_batch:
                    x, y = self.minibatch(k)
                    if device_clock:
                        x, y = copy_batch(xs, ys, x, y)
                if graph is not None:
                    graph()
                else:
                    clock = members.step if device_clock else k
                    self.fused_step(stepper, members, params, x, y, clock)
                continue
            # a logged step: the metrics need θ_k and ∇L(θ_k), so gradients first, the
            # update after them
            x, y = self.minibatch(k)
            loss, grads = stepper.loss_and_grads(params, x, y, grads)
            if members.loss0 is None:
                members.begin(loss, t.divergence_factor)
            members.check(loss, k)
            timer.begin()
            self.log_step(log, k, params, grads, loss, members, recorder)
            timer.end()
            if k == steps:
                break
            eta = self.schedule(k, params) * members.alive
            self.optimizer.update(params, grads, eta)
            members.advance(loss, eta)
            if device_clock:
                members.step.fill_(k + 1)

        if cuda:
            torch.cuda.synchronize(self.device)
        loop_s = time.perf_counter() - mark
        metrics_s = timer.total()
        log.settle()
        wall = earlier_s + time.perf_counter() - started
        tables = chunk_tables(
            self.chunk,
            self.node_id,
            log,
            members.final(),
            wall,
            self.net.depth,
            b.input_dim,
            self.params0.weights,
            self.device,
        )
        #: seconds spent in the step loop (training), in the metrics (the recorder's set-up
        #: and the logged steps' metrics), in the constructor (data, initial weights:
        #: ``setup_s``), and the rest (the tables); read by benchmarks/.
        self.timing = {
            "train_s": loop_s - metrics_s,
            "metrics_s": metrics_s + recorder_s,
            "setup_s": self.setup_s,
            "other_s": time.perf_counter() - started - loop_s - self.setup_s - recorder_s,
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
        """Non-logged step k: the optimizer's step with the schedule's η (gd, sgd: θ ← θ − η∇L
        in one pass of the stepper), then the events, the divergence check and the clock,
        all in place.

        η uses ``alive`` before this step's check, so a member that diverges at this step
        takes one more step. Nothing stored depends on it: the member is stopped at this
        step all the same, its rows end, its clock stops, and its parameters are zeroed
        at the next logged step. ``k`` a tensor (``m.step``): read on the device and
        advanced there, so the step freezes no Python value (CUDA-graph capturable)."""
        torch.mul(self.schedule(k, params), m.alive, out=m.eta)
        loss = self.optimizer.step(stepper, params, x, y, m.eta)
        m.check(loss, k)
        m.advance(loss, m.eta.mul_(m.alive))
        if isinstance(k, Tensor):
            k.add_(1)

    def log_step(
        self,
        log: LoggedRows,
        k: int,
        params: Params,
        grads: Params,
        loss: Tensor,
        members: LoopState,
        recorder: MetricRecorder | BlockedRecorder,
    ) -> None:
        b = self.batch
        if not self.optimizer.full_batch:  # full-batch loss and gradient (new buffers:
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


def _datasets(members: Members) -> list[Dataset]:
    """Each member's dataset, made once per distinct (data config, data seed): the data
    seed (:func:`~pipeline.data._datasets.data_seed`) once per distinct (data config,
    train seed)."""
    data, seeds = members.index["data"], members.column("train", "seed").astype(np.int64)
    # the distinct pairs by a 1-D key (data index, seed's rank): sorting rows is 10× slower
    seed_values, seed_rank = np.unique(seeds, return_inverse=True)
    key = data.astype(np.int64) * len(seed_values) + seed_rank.reshape(-1)
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    configs = [members.models["data"][d] for d in data[first].tolist()]
    made = make_datasets(
        [(c, data_seed(c, s)) for c, s in zip(configs, seeds[first].tolist())]  # type: ignore[arg-type]
    )
    return [made[i] for i in inverse.reshape(-1).tolist()]


def train_chunk(
    chunk: Chunk,
    device: str | torch.device = "cpu",
    hook: StepHook | None = None,
    resume: dict | None = None,
    node_id: str | None = None,
) -> dict[str, pa.Table]:
    """Train ``chunk`` as one ensemble and return its tables (see :class:`ChunkTrainer`)."""
    return ChunkTrainer(chunk, device, node_id).run(hook, resume)
