"""Every ready sweep in sweeps/ validates, expands, packs into chunks, and documents
itself: a header comment naming the phenomenon, the expected outcome and its run time."""

from __future__ import annotations

import pytest
import yaml
from phasesweep.pipeline.grid import expand, make_chunks
from phasesweep.pipeline.spec import load_spec_and_raw
from sweep_runner import SWEEPS

FILES = sorted(SWEEPS.glob("*.yaml"))
PHENOMENA = [
    "lazy_rich",
    "width_laziness",
    "saddle_escape",
    "lowdim_noise",
    "biasfree_linear",
    "balancedness",
]


def test_every_phenomenon_has_a_sweep():
    names = {f.stem for f in FILES}
    assert set(PHENOMENA) <= names


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_sweep_validates_and_expands(path):
    spec, raw = load_spec_and_raw(path)
    assert spec.name == path.stem
    points = expand(spec)
    assert len(points) >= 2
    assert len({p.run_id for p in points}) == len(points)
    chunks = make_chunks(points, spec)
    assert sum(len(c.points) for c in chunks) == len(points)
    assert spec.grid, "a ready sweep sweeps something"


@pytest.mark.parametrize("path", [SWEEPS / f"{n}.yaml" for n in PHENOMENA], ids=PHENOMENA)
def test_sweep_header_states_phenomenon_outcome_and_run_time(path):
    header = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        header.append(line.lower())
    text = "\n".join(header)
    assert "phenomenon" in text and "expected" in text
    assert "run time" in text and "2 cpu cores" in text and "minute" in text
    assert "seed 00" in text  # names the research it reproduces


@pytest.mark.parametrize(
    "name,overrides",
    [
        ("saddle_escape", ["grid.depth=[3]", "model.width=8"]),
        ("lazy_rich", ["grid.width=[16]", "grid.depth=[2]"]),
        # a dotted axis (data.delta) is set by replacing the whole grid: --set splits KEY on dots
        (
            "biasfree_linear",
            ["grid={data.kind: [perturbed_symmetric], data.delta: [0.01, 0.1], seed: [0]}"],
        ),
    ],
)
def test_overrides_apply_like_set(name, overrides):
    spec, _ = load_spec_and_raw(SWEEPS / f"{name}.yaml", overrides)
    points = expand(spec)
    assert points
    for text in overrides:
        key, _, value = text.partition("=")
        axes = list(yaml.safe_load(value)) if key == "grid" else [key[len("grid.") :]]
        for p in points:
            assert all(a in p.coords for a in axes if key.startswith("grid"))
