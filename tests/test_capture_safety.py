"""Capture safety on the CPU (issue 33): every variant of the non-logged step, as the trainer
takes it on the accelerator's paths (what :class:`~pipeline.train._capture.StepGraph`
captures on CUDA: ``fused_step`` on the static inputs with the step index ``members.step``,
the stepper's buffers dropped before it), runs under :class:`host_reads.CaptureGuard`, which
fails on what a CUDA-graph capture forbids or a GPU would wait for, and on Python values
that change from one step to the next (a capture would freeze them).

The CPU tests run the capturable step eagerly, where none of this fails by itself: before
this guard, a cosine schedule that read its table with ``table[k]`` (a host read of k, and
k frozen into the graph) passed every CPU test and crashed on the first GPU.
"""

from __future__ import annotations

import contextlib
import itertools

import pytest
import torch
from chunks import only_chunk, small_spec
from host_reads import CaptureFault, CaptureGuard
from phasesweep.pipeline.train import _trainer
from phasesweep.pipeline.train._capture import StepGraph
from phasesweep.pipeline.train._linear_step import LinearStep
from phasesweep.pipeline.train._models import EnsembleStep
from phasesweep.pipeline.train._optim import OPTIMIZERS, SCHEDULES
from phasesweep.pipeline.train._trainer import ChunkTrainer

#: The training section of each optimizer and schedule (every one registered).
OPTIMIZER_TRAIN = {"gd": {}, "sgd": {"optimizer": "sgd", "batch_size": 4}}
SCHEDULE_TRAIN = {
    "constant": {},
    "cosine": {"lr_schedule": "cosine", "lr_min_frac": 0.1},
    "norm_adaptive": {"lr_schedule": "norm_adaptive", "lr_c": 0.5},
}
#: Metrics run at logged steps only, outside the captured step: off, for speed.
NO_METRICS = {"ntk": False, "spectra": False, "linearized": False}
LINEAR = {"activation": "linear", "bias": False, "depth": 3}


def _case(model: dict, optimizer: str = "gd", schedule: str = "constant") -> dict:
    return {
        "model": model,
        "train": {"steps": 24, "log_points": 4, **OPTIMIZER_TRAIN[optimizer]}
        | SCHEDULE_TRAIN[schedule],
        "metrics": NO_METRICS,
    }


CASES = {
    # every optimizer with every schedule, on the backprop step and on the factored one
    **{
        f"{o}-{s}-{name}": _case(model, o, s)
        for o, s in itertools.product(OPTIMIZER_TRAIN, SCHEDULE_TRAIN)
        for name, model in {"relu": {}, "linear": LINEAR}.items()
    },
    # every model path of the backprop step
    **{
        f"{act}-{'bias' if bias else 'nobias'}-depth{depth}": _case(
            {"activation": act, "bias": bias, "depth": depth}
        )
        for act, bias, depth in itertools.product(
            ("relu", "tanh", "leaky_relu"), (True, False), (1, 2, 3)
        )
    },
    "leaky_mixed_slopes": {
        **_case({"activation": "leaky_relu"}),
        "grid": {"leaky_slope": [0.0, 0.1, 0.3], "lr": [0.05, 200.0]},
    },
}


def test_the_cases_cover_every_optimizer_and_schedule():
    assert set(OPTIMIZER_TRAIN) == set(OPTIMIZERS) and set(SCHEDULE_TRAIN) == set(SCHEDULES)


def guarded_run(trainer: ChunkTrainer) -> CaptureGuard:
    """Train ``trainer``'s chunk with every non-logged step under a :class:`CaptureGuard`,
    after ``stepper.reset()`` as before a capture; returns the guard."""
    guard, step = CaptureGuard(), trainer.fused_step

    def captured(stepper, *args) -> None:  # noqa: ANN001
        stepper.reset()
        with guard.step():
            step(stepper, *args)

    trainer.fused_step = captured
    trainer.run()
    return guard


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_every_captured_step_variant_is_capture_safe(case):
    trainer = ChunkTrainer(only_chunk(small_spec(**case)), accelerated=True)
    # the model path the case names: a bias-free linear net (depth 1 is one) is factored
    model = trainer.base.model
    factored = not model.bias and (model.activation == "linear" or model.depth == 1)
    assert isinstance(trainer.make_step(), LinearStep if factored else EnsembleStep)
    guard = guarded_run(trainer)
    assert len(guard.steps) >= 10  # the non-logged steps of 24, the logged ones apart
    assert len(guard.steps[0]) > 10  # it saw the step's operators
    guard.assert_values_frozen()


# -- the guard catches what it must ---------------------------------------------------------


class _TableIndexedOnTheHost(SCHEDULES["cosine"]):
    """The cosine schedule before the fix (d9b54e3): its table indexed with the step
    tensor, ``table[k]``, which reads k back to the host."""

    def __call__(self, k, params):  # noqa: ANN001
        if isinstance(k, int):
            return super().__call__(k, params)
        return self.lr * self.table[k]


class _FactorOnTheHost(SCHEDULES["cosine"]):
    """η from the host's step counter: no host read, but a Python value that changes per
    step (a capture would freeze η_k of the captured step)."""

    calls = 0

    def __call__(self, k, params):  # noqa: ANN001
        self.calls += 1
        return super().__call__(self.calls, params)


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        (_TableIndexedOnTheHost, "host read in a captured step: aten._local_scalar_dense"),
        (_FactorOnTheHost, "differs from step 0"),
    ],
)
def test_the_guard_fails_on_the_old_cosine_schedule(monkeypatch, schedule, message):
    monkeypatch.setitem(_trainer.SCHEDULES, "cosine", schedule)
    trainer = ChunkTrainer(only_chunk(small_spec(**_case({}, "gd", "cosine"))), accelerated=True)
    with pytest.raises(CaptureFault, match=message):
        guarded_run(trainer).assert_values_frozen()


FAULTS = {
    "item": (lambda t: t.sum().item(), "host read"),
    "bool": (lambda t: bool(t.all()), "host read"),
    "tolist": (lambda t: t.tolist(), "host read"),
    "numpy": (lambda t: t.numpy(), "host read"),
    "cpu": (lambda t: t.cpu(), "host read"),
    "tensor index": (lambda t: t[t.argmax()], "host read"),
    "torch.tensor": (lambda t: t + torch.tensor([1.0, 2.0, 3.0]), "tensor made from host data"),
    "new_tensor": (lambda t: t.new_tensor([1.0]), "tensor made from host data"),
    "nonzero": (lambda t: t.nonzero(), "host read"),
    "masked_select": (lambda t: t.masked_select(t > 1), "host read"),
    "boolean mask": (lambda t: t[t > 1], "host read"),
    "unique": (lambda t: t.unique(), "data-dependent shape"),
    "to meta": (lambda t: t.to("meta"), "copy between devices"),
    "copy_ from meta": (lambda t: torch.empty(3).copy_(t.to("meta")), "copy between devices"),
}


@pytest.mark.parametrize(("fault", "what"), FAULTS.values(), ids=FAULTS.keys())
def test_the_guard_fails_on_what_a_capture_forbids(fault, what):
    t = torch.arange(3.0)
    with pytest.raises(CaptureFault, match=what), CaptureGuard().step():
        fault(t)


def test_the_guard_lets_a_capturable_step_through():
    t, k, table = torch.arange(3.0), torch.tensor(1), torch.arange(10.0)
    guard = CaptureGuard()
    for _ in range(3):
        with guard.step():
            t.mul_(table.index_select(0, k.view(1))).add_(0.5)
            torch.where(t > 1, k, t, out=t)
            k.add_(1)
    guard.assert_values_frozen()
    assert t.tolist() == [3.0, 3.0, 3.0] and int(k) == 4  # the device's k, step after step


def test_step_graph_drops_the_buffers_then_captures_the_step_once(monkeypatch):
    """StepGraph's own sequence, with CUDA's streams and graphs stood in for: eager warm-up
    steps, then ``reset`` and one step inside the capture, replays after."""
    events = []

    class Fake:
        def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
            pass

        def __enter__(self) -> None:
            events.append("capture")

        def __exit__(self, *exc) -> None:  # noqa: ANN002
            events.append("end")

        def wait_stream(self, other) -> None:  # noqa: ANN001
            pass

        def replay(self) -> None:
            events.append("replay")

    for name in ("Stream", "CUDAGraph", "graph"):
        monkeypatch.setattr(torch.cuda, name, Fake)
    monkeypatch.setattr(torch.cuda, "stream", lambda side: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", Fake)

    class Stepper:
        def reset(self) -> None:
            events.append("reset")

    graph = StepGraph(lambda: events.append("step"), Stepper())
    for _ in range(5):
        graph()
    assert events == ["step"] * 3 + ["reset", "capture", "step", "end", "replay", "replay"]
    assert graph.replays == 2
