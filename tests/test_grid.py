"""Grid expansion, run ids and chunking."""

from __future__ import annotations

import numpy as np
import pytest
from phasesweep.pipeline.grid import expand, make_chunks, run_id_of
from phasesweep.pipeline.spec import SpecError, validate_spec


def _spec(grid, **extra):
    return validate_spec({"name": "g", "grid": grid, **extra})


def test_cartesian_product_in_spec_order_with_short_names_and_paths():
    pts = expand(
        _spec(
            {
                "init_scale": {"logspace": [-2, 0, 3]},
                "model.width": [8, 16],
                "seed": {"range": [0, 2]},
            }
        )
    )
    assert len(pts) == 12
    assert [p.coords["seed"] for p in pts[:4]] == [0, 1, 0, 1]  # last axis fastest
    np.testing.assert_allclose(sorted({p.config.model.init_scale for p in pts}), [0.01, 0.1, 1.0])
    assert {p.config.model.width for p in pts} == {8, 16}
    assert {p.config.train.seed for p in pts} == {0, 1}
    lin = expand(_spec({"lr": {"linspace": [0.1, 0.3, 3]}}))
    np.testing.assert_allclose([p.config.train.lr for p in lin], [0.1, 0.2, 0.3])


def test_run_ids_are_deterministic_unique_and_depend_on_sweep_and_config():
    spec = _spec({"width": [8, 16], "seed": [0, 1]})
    a, b = expand(spec), expand(spec)
    assert [p.run_id for p in a] == [p.run_id for p in b]
    assert len({p.run_id for p in a}) == 4
    assert all(run_id_of("g", p.config) == p.run_id for p in a)
    other = expand(validate_spec({"name": "h", "grid": {"width": [8, 16], "seed": [0, 1]}}))
    assert not {p.run_id for p in a} & {p.run_id for p in other}
    # the same point reached through --set instead of the grid has the same id
    single = expand(validate_spec({"name": "g", "model": {"width": 16}, "train": {"seed": 1}}))
    assert single[0].run_id in {p.run_id for p in a}


def test_duplicate_values_give_one_point():
    assert len(expand(_spec({"width": [8, 8, 16]}))) == 2


@pytest.mark.parametrize(
    "grid,key",
    [
        ({"width": [8, 0]}, "grid.width"),
        ({"depth": [2, "x"]}, "grid.depth"),
        ({"activation": ["relu", "gelu"]}, "grid.activation"),
        ({"seed": {"range": [3, 3]}}, "grid.seed"),
        ({"width": 8}, "grid.width"),
        ({"train.nope": [1]}, "grid.train.nope"),
    ],
)
def test_invalid_axes_name_the_axis(grid, key):
    with pytest.raises(SpecError) as err:
        expand(_spec(grid))
    assert err.value.key == key


def test_invalid_combination_is_reported():
    with pytest.raises(SpecError, match="combination"):
        expand(_spec({"model.init": ["gaussian", "antisymmetric"], "width": [3, 4]}))


def test_chunks_group_equal_shapes_and_respect_the_size_limit():
    spec = _spec(
        {"width": [8, 16], "init_scale": [0.5, 1.0, 2.0], "seed": {"range": [0, 5]}},
        execution={"max_chunk_size": 4},
    )
    chunks = make_chunks(expand(spec), spec)
    assert sum(len(c.points) for c in chunks) == 30
    for c in chunks:
        assert len(c.points) <= 4
        assert len({p.config.model.width for p in c.points}) == 1
    assert len({c.chunk_id for c in chunks}) == len(chunks)
