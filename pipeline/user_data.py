"""A researcher's own arrays as a dataset (``data.kind: arrays``), validated on load.

``data.path`` names a ``.npz`` file, or a directory of ``NAME.npy`` files, holding

- ``x_train`` (n, d), ``y_train`` (n, k) or (n,), ``x_test`` (n', d), ``y_test`` (n', k)
  or (n',): any real numeric dtype, read as float64;
- optionally ``subspace_basis`` (d, d_x), d_x < d, orthonormal columns spanning the
  data subspace: its orthogonal complement is the codimension of the
  ``transversal_grad_sq`` metric (as for ``subspace`` data).

Every array must be finite, and the shapes must agree (rows of x and y, d of both x,
k of both y). Any problem is a ``ValueError`` naming the file and the array (the
spec validator turns it into a ``SpecError``: exit 2, nothing written). The arrays are
read once per file version (path, size and modification time) and returned read-only.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import numpy as np

REQUIRED = ("x_train", "y_train", "x_test", "y_test")
BASIS = "subspace_basis"
#: largest |VᵀV − I| entry accepted for ``subspace_basis``.
ORTHONORMAL_TOL = 1e-8


def load_arrays(path: str) -> tuple[dict[str, np.ndarray], str]:
    """The validated arrays of ``path`` (y as 2-D float64, read-only) and the SHA-256 of
    the file's bytes (of the .npy files in name order for a directory)."""
    p = Path(path)
    try:
        files = _files(p)
        stamp = tuple((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    except OSError as e:
        raise ValueError(f"{path}: cannot read ({e.strerror})") from None
    return _load(str(p), stamp)


def _files(p: Path) -> list[Path]:
    if p.is_dir():
        return sorted(p.glob("*.npy"))
    if p.suffix != ".npz":
        raise ValueError(f"{p}: give a .npz file or a directory of NAME.npy files")
    p.stat()  # OSError if missing
    return [p]


@functools.lru_cache(maxsize=8)
def _load(path: str, stamp: tuple) -> tuple[dict[str, np.ndarray], str]:
    p = Path(path)
    digest = hashlib.sha256()
    raw: dict[str, np.ndarray] = {}
    try:
        if p.is_dir():
            for f in sorted(p.glob("*.npy")):
                digest.update(f.read_bytes())
                raw[f.stem] = np.load(f, allow_pickle=False)
        else:
            digest.update(p.read_bytes())
            with np.load(p, allow_pickle=False) as npz:
                raw = {k: npz[k] for k in npz.files}
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: cannot read the arrays ({e})") from None
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
    return arrays, digest.hexdigest()


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
