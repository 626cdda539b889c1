"""The non-logged step captured once as a CUDA graph and replayed.

On a GPU a step of a small net is a few dozen kernels of microseconds each, so their
launches would bound it: the captured step launches them as one. A captured step freezes
every Python value and every tensor address it saw, so what it reads must sit in device
buffers that stay put: its step index and state (:class:`~pipeline.train._state.LoopState`),
its learning rates (tables of :mod:`pipeline.train._optim`, indexed on the device) and,
for minibatches, static input buffers refilled before each replay (:func:`static_batch`,
:func:`copy_batch`).

A CPU runs this step eagerly, where a host read or a frozen value goes unseen:
``tests/test_capture_safety.py`` runs every variant of it (optimizer, schedule, model path,
factored linear step) under a guard that fails on what a capture forbids.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from phasesweep.pipeline.train._models import shares_input
from torch import Tensor


class StepGraph:
    """The non-logged step as a CUDA graph: eager for :data:`GRAPH_WARMUP` steps (on a side
    stream, as torch's graph capture asks), then captured once and replayed at every
    non-logged step after. ``step()`` must take its step index and schedule from device
    tensors and update its state in place (see
    :meth:`pipeline.train._trainer.ChunkTrainer.fused_step`).

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


def static_batch(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """Buffers shaped like a minibatch (a shared input stays one expanded (batch, d)
    matrix), holding it: the inputs of a captured step, refilled by :func:`copy_batch`."""
    xs = x[0].clone().expand_as(x) if shares_input(x) else x.clone()
    return xs, y.clone()


def copy_batch(xs: Tensor, ys: Tensor, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """Minibatch (x, y) copied into the buffers of :func:`static_batch`; returns them."""
    if shares_input(xs):
        xs[0].copy_(x[0])
    else:
        xs.copy_(x)
    ys.copy_(y)
    return xs, ys
