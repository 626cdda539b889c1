"""Helpers for the sweep tests: run a ready sweep in-process with ``--set`` overrides.

``run_sweep("saddle_escape", ["grid.depth=[2,3]", "train.steps=500"])`` loads
``sweeps/saddle_escape.yaml``, applies the overrides exactly as ``phasesweep run --set``
does (:func:`pipeline.spec.load_spec`), expands the grid, packs the chunks and trains
each with :func:`pipeline.train._trainer.train_chunk` (no Ray, no store). The result holds
the ``runs``, ``trajectories`` and ``layers`` tables as pandas frames; ``runs`` also
carries every grid coordinate of its point (e.g. a ``data.delta`` column).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from phasesweep.pipeline.grid import Point, expand, make_chunks
from phasesweep.pipeline.spec import SweepSpec, load_spec_and_raw
from phasesweep.pipeline.train._trainer import train_chunk

SWEEPS = Path(__file__).resolve().parents[1] / "sweeps"


@dataclass
class SweepResult:
    spec: SweepSpec
    points: list[Point]
    runs: pd.DataFrame
    trajectories: pd.DataFrame
    layers: pd.DataFrame

    def traj(self, run_id: str) -> pd.DataFrame:
        """One run's trajectory rows, by step."""
        t = self.trajectories
        return t[t.run_id == run_id].sort_values("step")


def sweep_path(name: str) -> Path:
    return SWEEPS / f"{name}.yaml"


def run_sweep(name: str, overrides: list[str] = ()) -> SweepResult:
    spec, _ = load_spec_and_raw(sweep_path(name), list(overrides))
    points = expand(spec)
    tables: dict[str, list[pd.DataFrame]] = {"runs": [], "trajectories": [], "layers": []}
    for chunk in make_chunks(points, spec):
        out = train_chunk(chunk)
        for key in tables:
            tables[key].append(out[key].to_pandas())
    frames = {k: pd.concat(v, ignore_index=True) for k, v in tables.items()}
    coords = pd.DataFrame([{"run_id": p.run_id, **p.coords} for p in points])
    extra = [c for c in coords.columns if c == "run_id" or c not in frames["runs"].columns]
    runs = frames["runs"].merge(coords[extra], on="run_id")
    return SweepResult(spec, points, runs, frames["trajectories"], frames["layers"])


def first_time_below(times: np.ndarray, values: np.ndarray, level: float) -> float:
    """First time ``values`` falls below ``level``, linearly interpolated; NaN if never."""
    below = np.flatnonzero(values < level)
    if len(below) == 0:
        return float("nan")
    i = below[0]
    if i == 0:
        return float(times[0])
    t0, t1, v0, v1 = times[i - 1], times[i], values[i - 1], values[i]
    return float(t0 + (v0 - level) / (v0 - v1) * (t1 - t0))


def loglog_slope(x, y) -> float:
    """Least-squares slope of log y against log x."""
    return float(np.polyfit(np.log(np.asarray(x, float)), np.log(np.asarray(y, float)), 1)[0])


def geo_mean(values) -> float:
    return float(np.exp(np.mean(np.log(np.asarray(values, float)))))


def store_sweep(path: Path, overrides: list[str], store) -> SweepSpec:  # noqa: ANN001
    """Train the spec at ``path`` with ``overrides`` in-process (no Ray) and commit its
    chunks to ``store`` as a launch does (``Store.write_chunk``, and the spec with its
    overrides, which ``analyze`` reads its settings from); the spec."""
    spec, raw = load_spec_and_raw(path, list(overrides))
    store.write_spec(spec.name, yaml.safe_dump(raw, sort_keys=False))
    for chunk in make_chunks(expand(spec), spec):
        store.write_chunk(spec.name, chunk.chunk_id, train_chunk(chunk))
    return spec
