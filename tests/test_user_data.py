"""data.kind arrays: the researcher's own arrays, trained on exactly, validated on load."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from phasesweep.pipeline.grid import expand, make_chunks
from phasesweep.pipeline.spec import SpecError, validate_spec
from phasesweep.pipeline.train._trainer import ChunkTrainer


def _arrays(d=4, k=2, n=10, n_test=6, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "x_train": rng.standard_normal((n, d)),
        "y_train": rng.standard_normal((n, k)),
        "x_test": rng.standard_normal((n_test, d)),
        "y_test": rng.standard_normal((n_test, k)),
    }


def _spec(path, **data):
    return validate_spec(
        {
            "name": "byo",
            "model": {"depth": 2, "width": 8},
            "data": {"kind": "arrays", "path": str(path), **data},
            "train": {"steps": 3, "log_points": 2, "lr": 0.01},
            "metrics": {"probe_size": 4},
            "grid": {"seed": [0, 1]},
        }
    )


def test_npz_arrays_are_the_training_data_and_fix_the_sizes(tmp_path):
    a = _arrays()
    a["y_test"] = a["y_test"][:, :1].ravel()  # 1-D labels are one output column...
    a["y_train"] = a["y_train"][:, :1].ravel()
    a["x_train"] = a["x_train"].astype(np.float32)  # ... and any real dtype reads as float64
    path = tmp_path / "data.npz"
    np.savez(path, **a)
    spec = _spec(path)
    assert (spec.data.n_train, spec.data.n_test, spec.data.input_dim, spec.data.output_dim) == (
        10,
        6,
        4,
        1,
    )
    (chunk,) = make_chunks(expand(spec), spec)
    b = ChunkTrainer(chunk).batch
    for e in range(2):  # both seeds train on the very same arrays
        assert torch.equal(b.x_train[e], torch.from_numpy(a["x_train"].astype(np.float64)))
        assert torch.equal(b.y_train[e, :, 0], torch.from_numpy(a["y_train"]))
        assert torch.equal(b.x_test[e], torch.from_numpy(a["x_test"]))
        assert torch.equal(b.y_test[e, :, 0], torch.from_numpy(a["y_test"]))
    assert b.codim_basis is None
    # the run ids follow the contents: other arrays at the same path, other runs
    ids = {p.run_id for p in expand(spec)}
    a["y_test"] = a["y_test"] + 1.0
    np.savez(path, **a)
    assert ids.isdisjoint(p.run_id for p in expand(_spec(path)))


def test_directory_of_npy_files_with_a_subspace_basis(tmp_path):
    a = _arrays(d=5, k=1)
    q, _ = np.linalg.qr(np.random.default_rng(1).standard_normal((5, 5)))
    a["subspace_basis"] = q[:, :2]
    for name, v in a.items():
        np.save(tmp_path / f"{name}.npy", v)
    spec = _spec(tmp_path)
    assert spec.data.subspace_dim == 2
    (chunk,) = make_chunks(expand(spec), spec)
    v = ChunkTrainer(chunk).batch.codim_basis[0].numpy()
    # the codimension: orthonormal and orthogonal to the given basis (to round-off)
    assert v.shape == (5, 3)
    assert np.abs(v.T @ v - np.eye(3)).max() < 1e-14
    assert np.abs(v.T @ q[:, :2]).max() < 1e-14


@pytest.mark.parametrize(
    "change,match",
    [
        (lambda a: a.pop("y_test"), "y_test is missing"),
        (lambda a: a["x_train"].__setitem__((3, 1), np.nan), r"x_train has 1 non-finite.*\(3, 1\)"),
        (lambda a: a.__setitem__("y_train", a["y_train"][:-1]), "y_train has 9 rows but x_train"),
        (lambda a: a.__setitem__("x_test", a["x_test"][:, :3]), "x_test has 3 columns"),
        (lambda a: a.__setitem__("y_train", a["y_train"] > 0), "y_train has dtype bool"),
        (lambda a: a.__setitem__("subspace_basis", np.ones((4, 2))), "not orthonormal"),
    ],
)
def test_bad_arrays_name_the_file_and_the_array(tmp_path, change, match):
    a = _arrays()
    change(a)
    path = tmp_path / "bad.npz"
    np.savez(path, **a)
    with pytest.raises(SpecError, match=match) as err:
        _spec(path)
    assert err.value.key == "data" and str(path) in str(err.value)


def test_sizes_given_must_match_and_paths_must_exist(tmp_path):
    path = tmp_path / "data.npz"
    np.savez(path, **_arrays())
    with pytest.raises(SpecError, match="input_dim is 3 but the arrays"):
        _spec(path, input_dim=3)
    with pytest.raises(SpecError, match="cannot read"):
        _spec(tmp_path / "missing.npz")
    with pytest.raises(SpecError, match="give a .npz file"):
        _spec(tmp_path / "data.csv")
    with pytest.raises(SpecError, match="kind arrays only"):
        validate_spec({"name": "x", "data": {"kind": "teacher", "path": str(path)}})


def test_cli_exits_2_and_writes_nothing_for_bad_arrays(tmp_path, phasesweep_cli):
    a = _arrays()
    a["x_test"][0, 0] = np.inf
    np.savez(tmp_path / "bad.npz", **a)
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"name: byo\ndata: {{kind: arrays, path: {tmp_path / 'bad.npz'}}}\n")
    store = tmp_path / "store"
    proc = phasesweep_cli(["run", str(spec), "--store", str(store)])
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, err
    assert "x_test" in err and "bad.npz" in err
    assert not store.exists() or not any(store.rglob("*"))


# -- initial weights from a file -----------------------------------------------------------


def _init_spec(path, grid=None, **model):
    return validate_spec(
        {
            "name": "byo_init",
            "model": {"depth": 3, "width": 5, "init": "file", "init_path": str(path), **model},
            "data": {"kind": "teacher", "input_dim": 4, "output_dim": 2, "n_train": 8},
            "train": {"steps": 2, "log_points": 2, "lr": 0.01},
            "metrics": {"probe_size": 4},
            "grid": grid or {"seed": [0, 1]},
        }
    )


def test_init_file_shared_and_per_seed_weights(tmp_path):
    rng = np.random.default_rng(3)
    w = {
        "W1": rng.standard_normal((5, 4)),
        "W1_seed1": rng.standard_normal((5, 4)),
        "W2": rng.standard_normal((5, 5)),
        "W3": rng.standard_normal((2, 5)),
    }
    path = tmp_path / "w.npz"
    np.savez(path, **w)
    spec = _init_spec(path, grid={"seed": [0, 1], "init_scale": [1.0, 0.5]})
    (chunk,) = make_chunks(expand(spec), spec)
    tr = ChunkTrainer(chunk)
    for e, p in enumerate(chunk.points):
        g, seed = p.config.model.init_scale, p.config.train.seed
        first = w["W1_seed1"] if seed == 1 else w["W1"]  # its own, else the shared one
        for got, want in zip(tr.params0.weights, [first, w["W2"], w["W3"]]):
            assert torch.equal(got[e], g * torch.from_numpy(want))


@pytest.mark.parametrize(
    "weights,grid,match",
    [
        ({"W1": (5, 3)}, None, r"W1 has shape \(5, 3\), the model needs \(5, 4\)"),
        ({"W3": (2, 4)}, None, r"W3 has shape \(2, 4\), the model needs \(\?, 5\)"),
        ({"W2": None}, None, "W2 is missing"),
        ({"W4": (2, 5)}, None, "W4: the model has 3 layers"),
        ({"W1": None, "W1_seed0": (5, 4)}, None, "W1_seed1 \\(or W1\\) is missing"),
        ({}, {"seed": [0], "width": [5, 6]}, r"W1 has shape \(5, 4\), the model needs \(6, \?\)"),
        ({"W2": "nan"}, None, "W2 has 1 non-finite"),
        ({"B1": (5, 4)}, None, "array B1: weights are named"),
    ],
)
def test_bad_init_files_name_the_file_and_the_array(tmp_path, weights, grid, match):
    rng = np.random.default_rng(0)
    w = {"W1": (5, 4), "W2": (5, 5), "W3": (2, 5)}
    w.update(weights)
    arrays = {}
    for name, shape in w.items():
        if shape is None:
            continue
        if shape == "nan":
            arrays[name] = rng.standard_normal((5, 5))
            arrays[name][2, 2] = np.nan
        else:
            arrays[name] = rng.standard_normal(shape)
    path = tmp_path / "w.npz"
    np.savez(path, **arrays)
    with pytest.raises(SpecError, match=match) as err:
        expand(_init_spec(path, grid=grid))
    assert str(path) in str(err.value)


def test_cli_exits_2_and_writes_nothing_for_a_bad_init_file(tmp_path, phasesweep_cli):
    np.savez(tmp_path / "w.npz", W1=np.ones((4, 10)), W2=np.full((1, 3), np.nan))
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "name: byo\nmodel: {width: 4, init: file, init_path: " + str(tmp_path / "w.npz") + "}\n"
    )
    store = tmp_path / "store"
    proc = phasesweep_cli(["run", str(spec), "--store", str(store)])
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, err
    assert "W2" in err and "w.npz" in err and "non-finite" in err
    assert not store.exists() or not any(store.rglob("*"))


def test_directory_of_parquet_tables(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    a = _arrays(d=3, k=1)
    for name, v in a.items():
        cols = {f"c{j}": v[:, j] for j in range(v.shape[1])}
        pq.write_table(pa.table(cols), tmp_path / f"{name}.parquet")
    spec = _spec(tmp_path)
    (chunk,) = make_chunks(expand(spec), spec)
    b = ChunkTrainer(chunk).batch
    assert torch.equal(b.x_train[0], torch.from_numpy(a["x_train"]))
    assert torch.equal(b.y_test[1], torch.from_numpy(a["y_test"]))
    # a null in a table is a non-finite value of that array
    pq.write_table(pa.table({"c0": pa.array([1.0, None] + [0.0] * 4)}), tmp_path / "y_test.parquet")
    with pytest.raises(SpecError, match="y_test has 1 non-finite"):
        _spec(tmp_path)
