"""Datasets against independent properties: exact oddness and whitening, orthogonality,
the seed-004 point sets, digits standardisation and split, label noise, reproducibility
from seeds, and independence from chunk composition."""

from __future__ import annotations

import typing

import numpy as np
import pytest
import torch
from phasesweep.pipeline.data._datasets import digits_arrays, make_dataset, teacher_fn
from phasesweep.pipeline.data._seeding import generator
from phasesweep.pipeline.grid import expand, make_chunks
from phasesweep.pipeline.spec import DataConfig, SpecError, validate_spec
from phasesweep.pipeline.train._trainer import ChunkTrainer, train_chunk

U = torch.finfo(torch.float64).eps


def _data(**kw) -> DataConfig:
    return DataConfig(**kw)


def _spec(data: dict, grid: dict | None = None, **sections):
    raw = {
        "name": "ds",
        "model": {"depth": 2, "width": 8},
        "data": data,
        "train": {"steps": 2, "lr": 0.1, "log_points": 2},
        "metrics": {"probe_size": 4, "ntk": False},
        "grid": grid or {},
    }
    for k, v in sections.items():
        raw.setdefault(k, {}).update(v)
    return validate_spec(raw)


def _assert_odd(x: torch.Tensor, y: torch.Tensor) -> None:
    """Pairs (x, −x) stored consecutively with y(−x) = −y(x), bit for bit."""
    assert torch.equal(x[1::2], -x[0::2])
    assert torch.equal(y[1::2], -y[0::2])


# -- symmetric ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"whiten": True},
        {"teacher_activation": "relu", "output_dim": 3},
        {"teacher_singular_values": [2.0, 0.5], "output_dim": 2},
        {"whiten": True, "n_train": 40, "input_dim": 20, "n_test": 31},
    ],
)
def test_symmetric_pairs_and_odd_labels_exact(extra):
    cfg = _data(kind="symmetric", **extra)
    ds = make_dataset(cfg, seed=3)
    assert ds.group_size == 2
    assert ds.x_train.shape == (cfg.n_train, cfg.input_dim)
    assert ds.y_train.shape == (cfg.n_train, cfg.output_dim)
    assert ds.x_test.shape == (cfg.n_test, cfg.input_dim)
    _assert_odd(ds.x_train, ds.y_train)
    n_even = cfg.n_test - cfg.n_test % 2
    _assert_odd(ds.x_test[:n_even], ds.y_test[:n_even])
    # labels are not trivially zero, and not all equal
    assert ds.y_train.abs().min() >= 0 and ds.y_train.std() > 0.05


def test_symmetric_default_teacher_is_nonlinear_and_relu_teacher_odd_part_linear():
    # tanh teacher: a linear least-squares fit leaves a residual (something nonlinear to learn)
    cfg = _data(kind="symmetric", n_train=400, input_dim=5)
    ds = make_dataset(cfg, 0)
    w = torch.linalg.lstsq(ds.x_train, ds.y_train).solution
    resid = (ds.x_train @ w - ds.y_train).square().mean() / ds.y_train.square().mean()
    assert resid > 1e-4
    # relu teacher: its odd part (relu(z) - relu(-z))/2 = z/2 is exactly linear
    cfg = _data(kind="symmetric", n_train=400, input_dim=5, teacher_activation="relu")
    ds = make_dataset(cfg, 0)
    w = torch.linalg.lstsq(ds.x_train, ds.y_train).solution
    resid = (ds.x_train @ w - ds.y_train).square().mean() / ds.y_train.square().mean()
    assert resid < 1e-20


@pytest.mark.parametrize("n_train,d", [(64, 10), (20, 10), (1000, 3)])
def test_whitening_is_exact(n_train, d):
    cfg = _data(kind="symmetric", n_train=n_train, input_dim=d, whiten=True)
    x = make_dataset(cfg, 7).x_train
    cov = x.T @ x / n_train
    # rounding: each entry is a sum of n products of O(1) terms: error <= ~n·u
    assert (cov - torch.eye(d, dtype=torch.float64)).abs().max() < 4 * n_train * U
    raw = make_dataset(_data(kind="symmetric", n_train=n_train, input_dim=d), 7).x_train
    assert (raw.T @ raw / n_train - torch.eye(d, dtype=torch.float64)).abs().max() > 1e-3


def test_whitening_maps_test_set_with_the_training_map():
    cfg = _data(kind="symmetric", n_train=64, input_dim=4, whiten=True, n_test=4000)
    x = make_dataset(cfg, 0).x_test
    cov = x.T @ x / x.shape[0]  # same map, fresh Gaussian sample: I up to sampling error
    assert (cov - torch.eye(4, dtype=torch.float64)).abs().max() < 0.5


def test_symmetric_label_noise_keeps_labels_odd():
    clean = make_dataset(_data(kind="symmetric"), 1)
    cfg = _data(kind="symmetric", label_noise=0.3, label_noise_symmetric=True, n_train=2000)
    noisy = make_dataset(cfg, 1)
    _assert_odd(noisy.x_train, noisy.y_train)
    base = make_dataset(_data(kind="symmetric", n_train=2000), 1)
    eps = noisy.y_train - base.y_train
    assert torch.allclose(eps[1::2], -eps[0::2], atol=1e-15)
    # the noise has std 0.3: sampling error of a std over 1000 draws is ~0.3/sqrt(2000)
    assert abs(float(eps[0::2].std()) - 0.3) < 5 * 0.3 / np.sqrt(2000)
    assert torch.equal(noisy.x_train, base.x_train) and torch.equal(noisy.y_test, base.y_test)
    assert clean.y_train.shape == (64, 1)


def test_iid_label_noise_breaks_oddness_and_has_its_std():
    base = make_dataset(_data(kind="symmetric", n_train=4000), 2)
    noisy = make_dataset(_data(kind="symmetric", n_train=4000, label_noise=0.2), 2)
    eps = noisy.y_train - base.y_train
    assert not torch.equal(noisy.y_train[1::2], -noisy.y_train[0::2])
    assert abs(float(eps.std()) - 0.2) < 5 * 0.2 / np.sqrt(2 * 4000)
    # test labels stay clean; other kinds get noise too
    assert torch.equal(noisy.y_test, base.y_test)
    t0 = make_dataset(_data(kind="teacher"), 0)
    t1 = make_dataset(_data(kind="teacher", label_noise=0.1), 0)
    assert torch.equal(t0.x_train, t1.x_train) and not torch.equal(t0.y_train, t1.y_train)


# -- perturbed symmetric -------------------------------------------------------------------


def test_perturbed_symmetric_delta_zero_is_symmetric_and_delta_moves_one_point():
    sym = make_dataset(_data(kind="symmetric", whiten=True, n_train=32, input_dim=6), 4)
    p0 = make_dataset(_data(kind="perturbed_symmetric", whiten=True, n_train=32, input_dim=6), 4)
    for name in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(sym, name), getattr(p0, name))
    assert p0.group_size == 2
    cfg = _data(kind="perturbed_symmetric", whiten=True, n_train=32, input_dim=6, delta=0.05)
    p = make_dataset(cfg, 4)
    diff = p.x_train - sym.x_train
    assert torch.count_nonzero(diff.abs().sum(1)) == 1 and diff[-1].abs().sum() > 0
    x = sym.x_train[-1]
    assert torch.isclose(diff[-1].norm(), 0.05 * x.norm(), rtol=1e-12)
    assert abs(float(diff[-1] @ x)) < 1e-12 * float(x @ x)  # orthogonal to the point
    assert torch.equal(p.y_train, sym.y_train)
    _assert_odd(p.x_train[:-2], p.y_train[:-2])


def test_perturbed_symmetric_paper_points():
    cfg = _data(kind="perturbed_symmetric", layout="paper", n_train=6, input_dim=2, delta=0.1)
    ds = make_dataset(cfg, 0)
    want = [[1, 1], [-1, -1], [1, -1], [-1, 1], [-1, 0], [1, 0.1]]
    assert torch.equal(ds.x_train, torch.tensor(want, dtype=torch.float64))
    assert ds.y_train.flatten().tolist() == [1, -1, 1, -1, 1, -1]
    # no linear function fits the labels (the least-squares residual is bounded away from 0)
    w = torch.linalg.lstsq(ds.x_train, ds.y_train).solution
    assert (ds.x_train @ w - ds.y_train).square().mean() > 0.5
    # the test set cycles through the points
    assert torch.equal(ds.x_test[:6], ds.x_train) and torch.equal(ds.x_test[6:12], ds.x_train)
    w0 = make_dataset(cfg.model_copy(update={"delta": 0.0}), 0)
    _assert_odd(w0.x_train, w0.y_train)


# -- orthogonal and XOR -------------------------------------------------------------------


def test_orthogonal_inputs_are_pairwise_orthogonal_with_pm1_labels():
    cfg = _data(kind="orthogonal", n_train=20, input_dim=25, n_test=50)
    ds = make_dataset(cfg, 5)
    gram = ds.x_train @ ds.x_train.T
    off = gram - torch.diag(torch.diagonal(gram))
    assert off.abs().max() < 50 * U * gram.diagonal().max()
    y = ds.y_train.flatten()
    assert y.tolist() == [1.0, -1.0] * 10
    norms = ds.x_train.norm(dim=1)
    assert ((norms[y > 0] >= 1.5) & (norms[y > 0] <= 2.5)).all()
    assert ((norms[y < 0] >= 0.5) & (norms[y < 0] <= 1.5)).all()
    # test points reuse the training directions with their labels
    dirs = ds.x_train / norms.unsqueeze(1)
    cos = (ds.x_test[:20] / ds.x_test[:20].norm(dim=1, keepdim=True) * dirs).sum(1)
    assert torch.allclose(cos, torch.ones(20, dtype=torch.float64), atol=1e-14)
    assert torch.equal(ds.y_test[:20], ds.y_train)


def test_orthogonal_and_xor_paper_points():
    o = make_dataset(_data(kind="orthogonal", layout="paper", n_train=2, input_dim=2), 0)
    assert o.x_train.tolist() == [[2.0, 1.0], [-0.5, 1.0]]
    assert o.y_train.flatten().tolist() == [1, -1]
    assert float(o.x_train[0] @ o.x_train[1]) == 0.0
    x = make_dataset(_data(kind="xor", layout="paper", n_train=4, input_dim=2), 0)
    assert x.x_train.tolist() == [[0, 1], [2, 0], [0, -3], [-4, 0]]
    assert x.y_train.flatten().tolist() == [1, -1, 1, -1]


@pytest.mark.parametrize("kind,count", [("orthogonal", 2), ("xor", 4), ("perturbed_symmetric", 6)])
def test_paper_layouts_with_copies_train_identically(kind, count):
    """n_train a multiple of the point count: copies leave the loss and its gradient unchanged."""
    runs = {}
    for n in (count, 3 * count):
        spec = _spec(
            {"kind": kind, "layout": "paper", "n_train": n, "input_dim": 2, "delta": 0.1},
            model={"width": 16, "activation": "relu", "init_scale": 0.3},
            train={"steps": 40, "lr": 0.05},
        )
        (chunk,) = make_chunks(expand(spec), spec)
        x = ChunkTrainer(chunk).batch.x_train[0]
        assert torch.equal(x, x[torch.arange(n) % count])
        runs[n] = train_chunk(chunk)["trajectories"].to_pandas()
    a, b = runs[count], runs[3 * count]
    np.testing.assert_allclose(a.train_loss, b.train_loss, rtol=1e-12)
    np.testing.assert_allclose(a.param_norm, b.param_norm, rtol=1e-12)


def test_xor_clusters_and_noise():
    cfg = _data(kind="xor", n_train=4000, input_dim=5, noise_sigma=0.2)
    ds = make_dataset(cfg, 1)
    clean = make_dataset(cfg.model_copy(update={"noise_sigma": 0.0}), 1)
    centers = clean.x_train[:4]
    assert torch.allclose(centers.norm(dim=1), torch.tensor([1.0, 2, 3, 4], dtype=torch.float64))
    assert abs(float(centers[0] @ centers[1])) < 1e-14  # u1 ⟂ u2
    noise = ds.x_train - clean.x_train
    assert abs(float(noise.std()) - 0.2) < 5 * 0.2 / np.sqrt(noise.numel())
    # same-label centers lie on one axis, with opposite signs
    assert float(centers[0] @ centers[2]) == pytest.approx(-3.0)
    assert torch.equal(ds.y_train, clean.y_train)


# -- subspace ------------------------------------------------------------------------------


def test_subspace_sigma_zero_codimension_exactly_zero_unrotated():
    cfg = _data(kind="subspace", input_dim=8, subspace_dim=3, rotate=False)
    ds = make_dataset(cfg, 0)
    assert (
        torch.count_nonzero(ds.x_train[:, 3:]) == 0 and torch.count_nonzero(ds.x_test[:, 3:]) == 0
    )
    rot = make_dataset(cfg.model_copy(update={"rotate": True}), 0)
    assert (rot.x_train @ rot.codim_basis).abs().max() < 1e-14


def test_subspace_noise_scales_the_same_draws():
    cfg = _data(kind="subspace", input_dim=8, subspace_dim=3, n_train=2000)
    x = {s: make_dataset(cfg.model_copy(update={"noise_sigma": s}), 2) for s in (0.0, 0.1, 0.3)}
    d1, d3 = x[0.1].x_train - x[0.0].x_train, x[0.3].x_train - x[0.0].x_train
    assert torch.allclose(d3, 3 * d1, atol=1e-14)
    assert torch.equal(x[0.1].y_train, x[0.0].y_train)
    v = x[0.1].codim_basis
    # codim noise lies in the codimension, with std sigma there
    assert torch.allclose(d1, d1 @ v @ v.T, atol=1e-14)
    assert abs(float((d1 @ v).std()) - 0.1) < 5 * 0.1 / np.sqrt(2000 * 5)
    iso = make_dataset(cfg.model_copy(update={"noise_sigma": 0.1, "noise": "isotropic"}), 2)
    u = torch.linalg.svd(x[0.0].x_train, full_matrices=False).Vh[:3].T
    assert (iso.x_train - iso.x_train @ v @ v.T).sub(x[0.0].x_train).abs().max() > 0.01
    assert u.shape == (8, 3)


# -- teacher -------------------------------------------------------------------------------


def test_teacher_linear_singular_values_and_relu_homogeneity():
    cfg = _data(
        kind="teacher", input_dim=6, output_dim=3, teacher_singular_values=[3.0, 1.0], n_train=200
    )
    ds = make_dataset(cfg, 0)
    w = torch.linalg.lstsq(ds.x_train, ds.y_train).solution
    sv = torch.linalg.svdvals(w)
    assert torch.allclose(sv, torch.tensor([3.0, 1.0, 0.0], dtype=torch.float64), atol=1e-12)
    f = teacher_fn(_data(kind="teacher", teacher_width=7), generator(0, "x"), 4, "relu")
    x = torch.randn(10, 4, dtype=torch.float64)
    assert torch.allclose(f(2.5 * x), 2.5 * f(x), rtol=1e-14)
    assert not torch.allclose(f(-x), -f(x))


# -- digits --------------------------------------------------------------------------------


def test_digits_standardised_two_classes():
    cfg = _data(kind="digits", classes=[0, 1], n_train=300, n_test=60)
    assert cfg.input_dim == 64 and cfg.output_dim == 1
    ds = make_dataset(cfg, 0)
    assert ds.x_train.shape == (300, 64) and ds.y_test.shape == (60, 1)
    assert set(ds.y_train.flatten().tolist()) == {-1.0, 1.0}
    assert torch.isfinite(ds.x_train).all() and torch.isfinite(ds.x_test).all()
    live = ds.x_train.std(0, correction=0) > 0
    n_live = int(live.sum())
    assert 20 < n_live < 64  # digits 0 and 1 leave some border pixels blank
    zeros, ones = torch.zeros(n_live, dtype=torch.float64), torch.ones(n_live, dtype=torch.float64)
    assert torch.allclose(ds.x_train[:, live].mean(0), zeros, atol=1e-12)
    assert torch.allclose(ds.x_train[:, live].std(0, correction=0), ones, rtol=1e-12)
    # pixels constant on the training split are 0 in both splits (no division by zero)
    assert torch.count_nonzero(ds.x_train[:, ~live]) == 0
    assert torch.count_nonzero(ds.x_test[:, ~live]) == 0


def test_digits_split_is_disjoint_complete_and_deterministic():
    cfg = _data(kind="digits", classes=[3, 8], n_train=200, n_test=157)  # all 183 + 174 images
    a, b, c = make_dataset(cfg, 0), make_dataset(cfg, 0), make_dataset(cfg, 1)
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_test, b.y_test)
    assert not torch.equal(a.y_train, c.y_train)
    images, target = digits_arrays()
    sel = np.isin(target, [3, 8])
    both = torch.cat([a.x_train, a.x_test]).numpy()
    # per pixel, train ∪ test is the class-3/8 images mapped by one increasing affine map:
    # so the split is a partition of exactly those images (no overlap, none missing)
    for j in range(64):
        s, r = np.sort(both[:, j]), np.sort(images[sel][:, j])
        if np.ptp(r) == 0 or np.ptp(s) == 0:
            continue
        coef = np.polyfit(s, r, 1)
        assert coef[0] > 0 and np.abs(np.polyval(coef, s) - r).max() < 1e-9, j
    labels = torch.cat([a.y_train, a.y_test]).flatten()
    assert int((labels > 0).sum()) == int((target == 8).sum())  # second listed class → +1
    assert int((labels < 0).sum()) == int((target == 3).sum())


def test_digits_one_hot_all_classes():
    cfg = _data(kind="digits")
    assert cfg.input_dim == 64 and cfg.output_dim == 10
    ds = make_dataset(cfg, 0)
    assert torch.equal(ds.y_train.sum(1), torch.ones(64, dtype=torch.float64))
    three = _data(kind="digits", classes=[1, 4, 7])
    assert three.output_dim == 3
    assert make_dataset(three, 0).y_train.shape == (64, 3)


@pytest.mark.parametrize(
    "data,key",
    [
        ({"kind": "digits", "input_dim": 32}, "input_dim"),
        ({"kind": "digits", "classes": [3, 8], "output_dim": 2}, "output_dim"),
        ({"kind": "digits", "classes": [3]}, "classes"),
        ({"kind": "digits", "classes": [3, 8], "n_train": 300, "n_test": 100}, "n_train"),
        ({"kind": "symmetric", "n_train": 63}, "n_train"),
        ({"kind": "symmetric", "whiten": True, "n_train": 10, "input_dim": 10}, "whiten"),
        ({"kind": "teacher", "whiten": True}, "whiten"),
        ({"kind": "teacher", "label_noise_symmetric": True}, "label_noise_symmetric"),
        ({"kind": "orthogonal", "n_train": 11, "input_dim": 10}, "n_train"),
        ({"kind": "xor", "output_dim": 2}, "output_dim"),
        ({"kind": "xor", "layout": "paper", "n_train": 6, "input_dim": 2}, "n_train"),
        ({"kind": "orthogonal", "layout": "paper", "n_train": 2, "input_dim": 3}, "input_dim"),
        ({"kind": "perturbed_symmetric", "input_dim": 1}, "input_dim"),
    ],
)
def test_invalid_data_specs_name_the_key(data, key):
    """Cross-field checks are reported on ``data`` with a message naming the field."""
    with pytest.raises(SpecError) as e:
        _spec(data)
    assert e.value.key == "data" and key in e.value.reason


def test_digits_dims_in_the_resolved_config_and_the_batch():
    spec = _spec({"kind": "digits", "classes": [0, 1], "n_train": 16, "n_test": 8})
    (point,) = expand(spec)
    assert point.config.data.input_dim == 64 and point.config.data.output_dim == 1
    trainer = ChunkTrainer(make_chunks([point], spec)[0])
    assert trainer.batch.input_dim == 64 and trainer.batch.output_dim == 1


# -- seeds and chunks ------------------------------------------------------------------------


KINDS = [
    {"kind": "teacher"},
    {"kind": "subspace", "noise_sigma": 0.1},
    {"kind": "symmetric", "whiten": True, "label_noise": 0.1, "label_noise_symmetric": True},
    {"kind": "perturbed_symmetric", "delta": 0.1},
    {"kind": "orthogonal", "n_train": 8},
    {"kind": "xor", "noise_sigma": 0.1},
    {"kind": "digits", "classes": [2, 7]},
]


@pytest.mark.parametrize("kw", KINDS, ids=lambda kw: kw["kind"])
def test_reproducible_from_the_seed(kw):
    cfg = _data(**kw)
    a, b, c = make_dataset(cfg, 11), make_dataset(cfg, 11), make_dataset(cfg, 12)
    for name in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(a, name), getattr(b, name))
    assert not torch.equal(a.x_train, c.x_train)
    assert a.x_train.dtype == torch.float64


@pytest.mark.parametrize(
    "data,grid",
    [
        (
            {"kind": "symmetric", "whiten": True},
            {"seed": [0, 1, 2], "data.label_noise": [0.0, 0.2]},
        ),
        ({"kind": "perturbed_symmetric"}, {"seed": [0, 1], "data.delta": [0.0, 0.01, 0.1]}),
        ({"kind": "subspace"}, {"seed": [0, 1], "noise_sigma": [0.0, 0.1]}),
        ({"kind": "xor"}, {"data.seed": [3, 4], "noise_sigma": [0.0, 0.5]}),
    ],
)
def test_member_data_independent_of_chunk_composition(data, grid):
    spec = _spec(data, grid)
    points = expand(spec)
    (chunk,) = make_chunks(points, spec)
    together = ChunkTrainer(chunk).batch
    for i, p in enumerate(points):
        alone = ChunkTrainer(make_chunks([p], spec)[0]).batch
        for name in ("x_train", "y_train", "x_test", "y_test"):
            same = torch.equal(getattr(together, name)[i], getattr(alone, name)[0])
            assert same, (p.coords, name)


def test_sgd_minibatches_keep_symmetric_pairs():
    spec = _spec(
        {"kind": "symmetric", "n_train": 32},
        {"seed": [0, 1, 2]},
        train={"optimizer": "sgd", "batch_size": 8},
    )
    (chunk,) = make_chunks(expand(spec), spec)
    trainer = ChunkTrainer(chunk)
    seen = torch.zeros(3, 32)
    for k in range(8):  # two epochs of 4 steps
        x, y = trainer.minibatch(k)
        assert x.shape == (3, 8, 10)
        _assert_odd(x[0], y[0])
        _assert_odd(x[2], y[2])
        if k < 4:
            for e in range(3):
                for row in x[e]:
                    seen[e] += (trainer.batch.x_train[e] == row).all(1).to(seen.dtype)
    assert torch.equal(seen, torch.ones(3, 32))  # every point once per epoch


#: a valid config of every generated kind (``arrays`` reads files: test_user_data).
_ONE_OF_EACH = {
    "teacher": {},
    "subspace": {},
    "symmetric": {},
    "perturbed_symmetric": {},
    "orthogonal": {"n_train": 8, "n_test": 8},
    "xor": {},
    "digits": {"classes": [3, 8], "n_train": 40, "n_test": 20},
}


def test_every_kind_has_its_facts_and_a_generator():
    from phasesweep.pipeline.data._datasets import GENERATORS
    from phasesweep.pipeline.spec import DATA_KINDS, DataKind

    assert list(GENERATORS) == list(DATA_KINDS) == list(typing.get_args(DataKind))
    assert set(_ONE_OF_EACH) == set(DATA_KINDS) - {"arrays"}


@pytest.mark.parametrize("kind", list(_ONE_OF_EACH))
def test_the_facts_of_a_kind_hold_for_its_data(kind):
    """What the spec validates by (pairs, one label per point, paper point counts) is what the
    generator draws."""
    from phasesweep.pipeline.spec import DATA_KINDS

    facts = DATA_KINDS[kind]
    ds = make_dataset(_data(kind=kind, **_ONE_OF_EACH[kind]), seed=3)
    assert (ds.group_size == 2) == facts.paired
    if facts.paired:
        _assert_odd(ds.x_train, ds.y_train)
    if facts.scalar_labels:
        assert ds.y_train.shape[1] == 1
    if facts.paper_points:
        cfg = _data(kind=kind, layout="paper", n_train=2 * facts.paper_points, input_dim=2)
        x = make_dataset(cfg, seed=0).x_train
        assert len(torch.unique(x, dim=0)) == facts.paper_points
        assert torch.equal(x[: facts.paper_points], x[facts.paper_points :])
        assert set(make_dataset(cfg, seed=0).y_train.flatten().tolist()) == {-1.0, 1.0}


def test_stacking_shared_datasets_equals_stacking_each_members_copy():
    """Members sharing a dataset object are stacked once and gathered; the batch is the
    one a stack of every member's own dataset gives, bit for bit."""
    from phasesweep.pipeline.data._datasets import make_datasets, stack

    cfg = _data(kind="teacher", n_train=8, n_test=5, input_dim=3, noise_sigma=0.1)
    members = [(cfg, seed) for seed in (4, 1, 4, 4, 2, 1)]
    shared = make_datasets(members)
    assert len({id(ds) for ds in shared}) == 3
    own = [make_dataset(c, s) for c, s in members]
    got, want = stack(shared, torch.float32, "cpu"), stack(own, torch.float32, "cpu")
    for name in ("x_train", "y_train", "x_test", "y_test"):
        a, b = getattr(got, name), getattr(want, name)
        assert a.shape == b.shape == (6, *b.shape[1:]) and torch.equal(a, b), name
    assert not torch.equal(got.y_test[0], got.y_test[1])  # members are not all one copy
