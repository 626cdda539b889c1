"""Storage is one interface: outside storage/ no module reaches a store's file system
(``store.fs``) or asks which kind of store it is (``is_local``); a backend is one class
chosen by the URI's scheme (:mod:`storage._backends`)."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest
from phasesweep.storage import Store
from phasesweep.storage._backends import BACKENDS, LocalBackend, S3Backend, open_backend

ROOT = Path(__file__).resolve().parents[1]
#: Every folder of package code but storage/ (phasesweep/'s links to them are not followed).
OUTSIDE = ["pipeline", "analysis", "phasesweep"]
FORBIDDEN = {"fs", "is_local"}


def _modules() -> list[Path]:
    found = []
    for folder in OUTSIDE:
        for base, _, names in os.walk(ROOT / folder):  # links to folders are not followed
            found += [Path(base) / n for n in names if n.endswith(".py")]
    return sorted(found)


def test_no_module_outside_storage_uses_the_stores_file_system():
    modules = _modules()
    assert {"_driver.py", "_api.py", "_plotting.py"} <= {p.name for p in modules}
    uses = [
        f"{path.relative_to(ROOT)}:{node.lineno}: .{node.attr}"
        for path in modules
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr in FORBIDDEN
    ]
    assert not uses, "outside storage/, go through Store's methods:\n" + "\n".join(uses)


def test_a_backend_is_chosen_by_the_uris_scheme(tmp_path):
    assert {"file": LocalBackend, "s3": S3Backend} == BACKENDS
    local = Store.open(f"file://{tmp_path}")
    assert isinstance(local.backend, LocalBackend) and local.uri == str(tmp_path)
    assert Store.open(str(tmp_path)) == local
    assert isinstance(open_backend("s3://bucket/prefix"), S3Backend)
    with pytest.raises(ValueError, match="use a local path, file://PATH or s3://BUCKET/PREFIX"):
        open_backend("gs://bucket")


def test_a_local_store_exists_when_its_folder_does_and_copies_files_in_and_out(tmp_path):
    store = Store.open(str(tmp_path / "store"))
    assert not store.exists()
    assert store.local_path("figures/x") == f"{tmp_path}/store/figures/x"
    source = tmp_path / "a.txt"
    source.write_text("hello")
    store.upload(str(source), "figures/s/a.txt")
    assert store.exists()
    copy = tmp_path / "b.txt"
    assert store.download("figures/s/a.txt", str(copy)) and copy.read_text() == "hello"
    assert not store.download("figures/s/missing.txt", str(tmp_path / "c.txt"))
    assert not (tmp_path / "c.txt").exists()
