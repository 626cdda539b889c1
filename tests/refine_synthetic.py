"""A synthetic sweep for the refine tests: the trainer is replaced by a closed form.

``final_train_loss`` of a run at init scale g, width w and seed s is

    L(g, w, s) = LEVEL - tanh(3 (log10 g - U_STAR[w])) + OFFSET[s]

with the offsets summing to zero, so the seed mean crosses LEVEL exactly at
log10 g = U_STAR[w], and seed s crosses at U_STAR[w] + artanh(OFFSET[s]) / 3. Width
4096 crosses outside the grid's range: its line is never bracketed (L > LEVEL there).

:func:`install` swaps :func:`pipeline.train._trainer.train_chunk` for the closed form, which
appends every run_id it "trains" to a log file (so tests can count trainings across
processes) and can block forever in a chosen call (so a test can kill the process in
the middle of a batch). Run as a script it refines a store in a process of its own:
``python refine_synthetic.py STORE LOG BLOCK_AT DELAY`` (BLOCK_AT 0: never).
"""

from __future__ import annotations

import math
import os
import sys
import time

import yaml

LEVEL = 0.5
U_STAR = {16: -0.43, 256: -0.77, 4096: 3.0}  # not on a bisection point
OFFSET = {0: -0.1, 1: 0.1}
#: the parent sweep: init scales 10^-2 ... 10^1 (one decade apart), 3 widths, 2 seeds.
PARENT = {
    "name": "synth",
    "model": {"depth": 2, "width": 16},
    "data": {"n_train": 8, "n_test": 8, "input_dim": 3},
    "train": {"steps": 10, "log_points": 2},
    "grid": {
        "init_scale": {"logspace": [-2, 1, 4]},
        "width": sorted(U_STAR),
        "seed": sorted(OFFSET),
    },
}
#: tolerance of the tests (log10 units): one decade needs exactly 4 bisections.
TOL = 0.07


def loss(g: float, w: int, s: int) -> float:
    return LEVEL - math.tanh(3 * (math.log10(g) - U_STAR[w])) + OFFSET[s]


def seed_crossing(w: int, s: int) -> float:
    """log10 g where seed ``s`` of width ``w`` crosses LEVEL."""
    return U_STAR[w] + math.atanh(OFFSET[s]) / 3


def install(
    log_path: str, block_at: int | None = None, delay: float = 0.0, fail_at: int | None = None
):
    """Replace the trainer by the closed form (see the module docstring). ``block_at``:
    the call (1-based, counted in this process) that never returns; ``delay``: seconds
    every call takes (so that two processes overlap); ``fail_at``: the call that raises.
    Returns the real trainer."""
    import phasesweep.pipeline.train._trainer as trainer

    calls = [0]

    def train_chunk(chunk, device="cpu", hook=None, resume=None, node_id=None):  # its signature
        calls[0] += 1
        if calls[0] == block_at:
            with open(log_path + ".blocked", "w") as f:
                f.write(str(os.getpid()))
            while True:
                time.sleep(1)
        if calls[0] == fail_at:
            raise RuntimeError("synthetic training failure")
        time.sleep(delay)
        pts = chunk.points
        with open(log_path, "a") as f:
            f.write("".join(p.run_id + "\n" for p in pts))
        return {"runs": runs_rows(pts, chunk.chunk_id, node_id)}

    real, trainer.train_chunk = trainer.train_chunk, train_chunk
    return real


def runs_rows(points, chunk_id: str, node_id: str | None):
    """The ``runs`` rows of ``points``, completed with the closed-form final loss."""
    from phasesweep.pipeline.train._runs import runs_table

    cfg = [p.config for p in points]
    outcome = {
        "status": ["completed"] * len(cfg),
        "final_train_loss": [loss(c.model.init_scale, c.model.width, c.train.seed) for c in cfg],
    }
    return runs_table(points, chunk_id, node_id, outcome)


def make_parent(store) -> None:
    """Store the parent sweep's spec and its runs (closed form, no log)."""
    from phasesweep.pipeline.grid import expand, make_chunks
    from phasesweep.pipeline.spec import validate_spec

    spec = validate_spec(PARENT)
    store.write_spec(spec.name, yaml.safe_dump(PARENT))
    for c in make_chunks(expand(spec), spec):
        store.write_chunk(spec.name, c.chunk_id, {"runs": runs_rows(c.points, c.chunk_id, None)})


def run(
    store_uri: str,
    log_path: str,
    block_at: int | None = None,
    delay: float = 0.0,
    fail_at: int | None = None,
    **kw,
):
    """Refine the parent's final_train_loss at LEVEL in this process."""
    import phasesweep.pipeline.train._trainer as trainer
    from phasesweep.pipeline.refine._refine import refine

    real = install(log_path, block_at, delay, fail_at)
    try:
        return refine(
            store_uri,
            "synth",
            "final_train_loss",
            LEVEL,
            tol=TOL,
            use_ray=False,
            poll_seconds=0.2,
            log=lambda msg: None,
            **kw,
        )
    finally:
        trainer.train_chunk = real


def trained(log_path: str) -> list[str]:
    """run_ids the closed form trained, in every process, in order (repeats kept)."""
    if not os.path.exists(log_path):
        return []
    with open(log_path) as f:
        return f.read().split()


if __name__ == "__main__":
    out = run(sys.argv[1], sys.argv[2], int(sys.argv[3]) or None, float(sys.argv[4]))
    print(out.trained)
