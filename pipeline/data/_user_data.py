"""A researcher's own arrays, validated on load: a dataset (``data.kind: arrays``) and
initial weights (``model.init: file``).

``data.path`` names a ``.npz`` file, or a directory of ``NAME.npy`` files or
``NAME.parquet`` tables (one numeric column per feature, in order), holding

- ``x_train`` (n, d), ``y_train`` (n, k) or (n,), ``x_test`` (n', d), ``y_test`` (n', k)
  or (n',): any real numeric dtype, read as float64;
- optionally ``subspace_basis`` (d, d_x), d_x < d, orthonormal columns spanning the
  data subspace: its orthogonal complement is the codimension of the
  ``transversal_grad_sq`` metric (as for ``subspace`` data).

Initial weights (``model.init_path``, same file forms): ``W1`` … ``WL`` of shape
(fan_out, fan_in), shared by every member, and/or ``W1_seed0`` … for the member with
that ``train.seed``; checked against the model's widths and depth (the spec's
``model`` section) and its input and output dims and grid seeds (the whole spec).

Every array must be finite, and the shapes must agree (rows of x and y, d of both x,
k of both y). Any problem is a ``ValueError`` naming the file and the array (the
spec validator turns it into a ``SpecError``: exit 2, nothing written). The arrays are
read once per file version (path, size and modification time) and returned read-only.
"""

from __future__ import annotations

import functools
import hashlib
import re
from pathlib import Path
from typing import Any

import numpy as np

REQUIRED = ("x_train", "y_train", "x_test", "y_test")
BASIS = "subspace_basis"
#: largest |VᵀV − I| entry accepted for ``subspace_basis``.
ORTHONORMAL_TOL = 1e-8


def load_arrays(path: str) -> tuple[dict[str, np.ndarray], str]:
    """The validated data arrays of ``path`` (y as 2-D float64, read-only) and the SHA-256
    of the file's bytes (of the .npy files in name order for a directory)."""
    raw, sha = read(path)
    arrays = {name: _array(path, name, raw) for name in REQUIRED}
    for name in ("y_train", "y_test"):
        if arrays[name].ndim == 1:
            arrays[name] = arrays[name][:, None]
    for name in REQUIRED:
        if arrays[name].ndim != 2 or 0 in arrays[name].shape:
            raise ValueError(f"{path}: array {name} has shape {arrays[name].shape}, want 2-D")
    for split in ("train", "test"):
        nx, ny = len(arrays[f"x_{split}"]), len(arrays[f"y_{split}"])
        if nx != ny:
            raise ValueError(f"{path}: array y_{split} has {ny} rows but x_{split} has {nx}")
    for a, b in (("x_test", "x_train"), ("y_test", "y_train")):
        if arrays[a].shape[1] != arrays[b].shape[1]:
            raise ValueError(
                f"{path}: array {a} has {arrays[a].shape[1]} columns but {b} has "
                f"{arrays[b].shape[1]}"
            )
    if BASIS in raw:
        arrays[BASIS] = _basis(path, _array(path, BASIS, raw), arrays["x_train"].shape[1])
    for a in arrays.values():
        a.flags.writeable = False
    return arrays, sha


#: initial weights: ``W<l>`` shared by all members, ``W<l>_seed<s>`` for train.seed s.
WEIGHT_NAME = re.compile(r"^W([1-9][0-9]*)(?:_seed([0-9]+))?$")


def load_weights(path: str) -> tuple[dict[str, np.ndarray], str]:
    """The initial weights of ``path`` (names ``W1``…, or ``W1_seed0``…; each a finite real
    2-D (fan_out, fan_in) array, float64, read-only) and the files' SHA-256."""
    raw, sha = read(path)
    out = {}
    for name in raw:
        if not WEIGHT_NAME.match(name):
            raise ValueError(f"{path}: array {name}: weights are named W1, W2, … or W1_seed0, …")
        a = _array(path, name, raw)
        if a.ndim != 2 or 0 in a.shape:
            raise ValueError(f"{path}: array {name} has shape {a.shape}, want (fan_out, fan_in)")
        a.flags.writeable = False
        out[name] = a
    return out, sha


def _parquet(f: Path) -> np.ndarray:
    """A Parquet table as a (rows, columns) array, columns in file order (nulls read as
    NaN; text columns give a text array, which the checks reject)."""
    import pyarrow.parquet as pq

    table = pq.read_table(f)
    cols = [c.to_numpy(zero_copy_only=False) for c in table.columns]
    return np.column_stack(cols) if cols else np.zeros((table.num_rows, 0))


def check_weights(path: str, weights: dict[str, np.ndarray], dims: list[int | None]) -> None:
    """Every array of ``weights`` fits the model of layer sizes ``dims`` (d_0 … d_L; None:
    not known here, not checked), and every layer has a shared or a per-seed array."""
    depth = len(dims) - 1
    layers = {name: int(WEIGHT_NAME.match(name).group(1)) for name in weights}
    for name, l in layers.items():
        if l > depth:
            raise ValueError(f"{path}: array {name}: the model has {depth} layers")
        _check_shape(path, name, weights[name], dims[l], dims[l - 1])
    for l in range(1, depth + 1):
        if l not in layers.values():
            raise ValueError(f"{path}: array W{l} is missing (layer {l} of {depth})")


def member_weights(
    path: str, weights: dict[str, np.ndarray], dims: list[int], seed: int
) -> list[np.ndarray]:
    """Layers 1..L of the member with train.seed ``seed``: its ``W<l>_seed<s>``, else the
    shared ``W<l>``; checked against ``dims``."""
    out = []
    for l in range(1, len(dims)):
        name = next((n for n in (f"W{l}_seed{seed}", f"W{l}") if n in weights), None)
        if name is None:
            raise ValueError(f"{path}: array W{l}_seed{seed} (or W{l}) is missing")
        _check_shape(path, name, weights[name], dims[l], dims[l - 1])
        out.append(weights[name])
    return out


def _check_shape(path: str, name: str, a: np.ndarray, fan_out, fan_in) -> None:
    for want, got in zip((fan_out, fan_in), a.shape):
        if want is not None and want != got:
            shown = ", ".join("?" if w is None else str(w) for w in (fan_out, fan_in))
            raise ValueError(f"{path}: array {name} has shape {a.shape}, the model needs ({shown})")


def read(path: str) -> tuple[dict[str, np.ndarray], str]:
    """All arrays of a .npz file or a directory of NAME.npy / NAME.parquet files (cached per
    file version)
    and the SHA-256 of their bytes."""
    p = Path(path)
    try:
        files = _files(p)
        stamp = tuple((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    except OSError as e:
        raise ValueError(f"{path}: cannot read ({e.strerror})") from None
    return _read(str(p), stamp)


def _files(p: Path) -> list[Path]:
    if p.is_dir():
        return sorted([*p.glob("*.npy"), *p.glob("*.parquet")])
    if p.suffix != ".npz":
        raise ValueError(f"{p}: give a .npz file or a directory of NAME.npy / .parquet files")
    p.stat()  # OSError if missing
    return [p]


@functools.lru_cache(maxsize=8)
def _read(path: str, stamp: tuple) -> tuple[dict[str, np.ndarray], str]:
    p = Path(path)
    digest = hashlib.sha256()
    raw: dict[str, np.ndarray] = {}
    try:
        if p.is_dir():
            for f in _files(p):
                digest.update(f.read_bytes())
                raw[f.stem] = (
                    _parquet(f) if f.suffix == ".parquet" else np.load(f, allow_pickle=False)
                )
        else:
            digest.update(p.read_bytes())
            with np.load(p, allow_pickle=False) as npz:
                raw = {k: npz[k] for k in npz.files}
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: cannot read the arrays ({e})") from None
    for a in raw.values():
        a.flags.writeable = False
    return raw, digest.hexdigest()


def _array(path: str, name: str, raw: dict[str, np.ndarray]) -> np.ndarray:
    if name not in raw:
        raise ValueError(f"{path}: array {name} is missing (found: {sorted(raw)[:8]})")
    a = raw[name]
    if a.dtype.kind not in "fiu":
        raise ValueError(f"{path}: array {name} has dtype {a.dtype}, want a real number type")
    a = np.array(a, dtype=np.float64)
    bad = ~np.isfinite(a)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"{path}: array {name} has {int(bad.sum())} non-finite values (first at {where})"
        )
    return a


def _basis(path: str, basis: np.ndarray, d: int) -> np.ndarray:
    if basis.ndim != 2 or basis.shape[0] != d or not 0 < basis.shape[1] < d:
        raise ValueError(
            f"{path}: array {BASIS} has shape {basis.shape}, want (input_dim, d_x) = ({d}, d_x) "
            f"with 0 < d_x < {d}"
        )
    gram_err = np.abs(basis.T @ basis - np.eye(basis.shape[1])).max()
    if gram_err > ORTHONORMAL_TOL:
        raise ValueError(f"{path}: array {BASIS} is not orthonormal (|VᵀV − I| = {gram_err:.2g})")
    return basis


def codim_basis(basis: np.ndarray) -> np.ndarray:
    """(d, d − d_x) orthonormal basis of the orthogonal complement of ``basis`` (d, d_x)."""
    _, _, vh = np.linalg.svd(basis.T, full_matrices=True)
    return vh[basis.shape[1] :].T


def user_file_path(
    raw: Any, selector: tuple[str, str], path_key: str, sha_key: str, what: str
) -> str | None:
    """The file path of a section that reads the researcher's own files (``init: file``,
    ``data.kind: arrays``); None when ``selector`` does not pick that mode (its path and
    hash keys must then be absent)."""
    if not isinstance(raw, dict):
        return None
    key, value = selector
    if raw.get(key) != value:
        if raw.get(path_key) is not None or raw.get(sha_key) is not None:
            raise ValueError(f"{path_key} and {sha_key} apply to {what} only")
        return None
    path = raw.get(path_key)
    if not isinstance(path, str) or not path:
        raise ValueError(f"{what} needs {path_key} (a .npz file or a directory)")
    return path
