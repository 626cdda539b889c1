"""Atomic file writes: the all-or-nothing put (the bytes are :mod:`storage._parquet`'s).

A reader (DuckDB glob, ``Store.files``) must never see a half-written file:

- local file systems: the bytes go to a hidden temp name in the target directory
  that does not end in ``.parquet``/``.json`` (``.NAME.RANDOM.tmp``), are flushed
  and fsynced, then ``os.replace``-d onto the final name, and the directory is
  fsynced so the rename survives a power loss. On any error the temp file is
  removed; only a hard kill between open and replace can leave one behind, and
  its name matches no reader's pattern (``maintenance.verify --repair`` removes it).
  The directories are opened one by one without following symbolic links that
  lead out of the store (``root``), and the temp file is created with
  ``O_NOFOLLOW``: a link planted inside the store cannot redirect a write.
- object stores: the whole object is uploaded in one PUT (s3fs switches to a
  multipart upload above its block size; S3 makes that object visible only when
  the upload completes), so there is no partial object to see.

A file too large to hold in memory is written through :func:`atomic_file` (the same
publication, from a file written piece by piece), a Parquet one with
:class:`~storage._parquet.ParquetStream`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
import uuid
from collections.abc import Iterator
from typing import BinaryIO

from fsspec import AbstractFileSystem
from fsspec.implementations.local import LocalFileSystem


@contextlib.contextmanager
def atomic_file(
    fs: AbstractFileSystem, path: str, *, root: str | None = None
) -> Iterator[BinaryIO]:
    """A binary file to write; when the block ends without an error its bytes replace
    ``path`` on ``fs`` as :func:`put_atomic` does (readers see the old file or all of the
    new one); on an error they are thrown away and ``path`` is left as it was.

    Local file systems: a hidden temp file beside ``path`` (``root``: as in
    :func:`put_atomic`), fsynced and renamed. Object stores: a local temp file, then
    uploaded as one object (``fs.put_file``; S3 shows a multipart upload only once it
    completes). Memory holds none of it: for files too large to build in memory."""
    if isinstance(fs, LocalFileSystem):
        with _local_atomic(path, root) as f:
            yield f
        return
    with tempfile.NamedTemporaryFile(suffix=".tmp") as f:
        yield f
        f.flush()
        fs.put_file(f.name, path)


class UnsafePathError(PermissionError):
    """A write would go through a symbolic link that leads out of its root folder."""


def put_atomic(fs: AbstractFileSystem, path: str, data: bytes, *, root: str | None = None) -> None:
    """Write ``data`` to ``path`` on ``fs`` so that readers see all of it or nothing.

    Replaces an existing file at ``path`` atomically. Safe to call concurrently
    for different paths; for the same path the last writer wins.

    ``root`` (local file systems): the folder the write must stay in, e.g. the
    store root. ``root`` itself may be (or sit under) a symbolic link, the user's
    choice; below it the directories are walked one by one with ``O_NOFOLLOW``
    (created where missing), and a component or target that is a symbolic link is
    refused with ``UnsafePathError`` unless it resolves inside ``root``. Without
    ``root`` only the target's own directory is trusted. Object stores have no
    links.
    """
    if isinstance(fs, LocalFileSystem):
        _put_local(path, data, root)
    else:
        fs.pipe_file(path, data)


def safe_output_path(root: str | os.PathLike[str], name: str) -> str:
    """Absolute path of ``name`` under ``root``, with its folders created, for a writer that
    must not follow symbolic links out of ``root`` (figures, reports).

    ``name`` is a relative '/'-separated path without ``..``. Missing folders below
    ``root`` are created (``root`` too) without following links; a folder or an
    existing target below ``root`` that is a symbolic link leading out of ``root``
    raises ``UnsafePathError``; so does a ``name`` that is absolute or climbs.
    Write the file with ``put_atomic(fs, path, data, root=root)`` (which re-checks
    and never writes through a link), or at least with ``O_NOFOLLOW``.
    """
    root = os.path.abspath(os.fspath(root))
    parts = name.split("/")
    if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise UnsafePathError(f"output name {name[:200]!r} must be a relative path without '..'")
    path = os.path.join(root, *parts)
    fd = _open_dir_inside(root, os.path.dirname(path))
    try:
        _check_target(fd, parts[-1], path, root)
    finally:
        os.close(fd)
    return path


def _put_local(path: str, data: bytes, root: str | None) -> None:
    with _local_atomic(path, root) as f:
        f.write(data)


@contextlib.contextmanager
def _local_atomic(path: str, root: str | None) -> Iterator[BinaryIO]:
    """The local case of :func:`atomic_file` (see the module docstring)."""
    directory, name = os.path.split(os.path.abspath(path))
    dir_fd = _open_dir_inside(os.path.abspath(root) if root else directory, directory)
    try:
        _check_target(dir_fd, name, path, root)
        tmp = f".{name}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            fd = os.open(
                tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=dir_fd
            )
            with os.fdopen(fd, "wb") as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _open_dir_inside(root: str, directory: str) -> int:
    """A file descriptor of ``directory`` (created where missing, durably), reached from
    ``root`` one component at a time without following links that lead out of ``root``."""
    rel = os.path.relpath(directory, root)
    if rel == os.pardir or rel.startswith(os.pardir + os.sep):
        raise UnsafePathError(f"{directory!r} is not inside {root!r}")
    _makedirs_durable(root)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    real_root = os.path.realpath(root)
    here = root
    try:
        for part in [] if rel == os.curdir else rel.split(os.sep):
            here = os.path.join(here, part)
            try:
                os.mkdir(part, dir_fd=fd)
                os.fsync(fd)  # the new entry survives a power loss
            except FileExistsError:  # already there, or created by a concurrent writer
                pass
            try:
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as e:
                if e.errno not in (errno.ELOOP, errno.ENOTDIR) or not os.path.islink(here):
                    raise
                _check_link(here, real_root)
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_target(dir_fd: int, name: str, path: str, root: str | None) -> None:
    """Refuse a target that is a symbolic link leading out of ``root``."""
    try:
        st = os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        _check_link(path, os.path.realpath(root) if root else None)


def _check_link(path: str, real_root: str | None) -> None:
    target = os.path.realpath(path)
    if real_root is None or os.path.commonpath([target, real_root]) != real_root:
        raise UnsafePathError(
            f"refusing to write through symbolic link {path!r} -> {target!r}: "
            f"it leads out of {real_root or os.path.dirname(path)!r}"
        )


def _makedirs_durable(directory: str) -> None:
    """``os.makedirs`` that also fsyncs the parent of every directory it creates."""
    if os.path.isdir(directory):
        return
    parent = os.path.dirname(directory)
    _makedirs_durable(parent)
    try:
        os.mkdir(directory)
    except FileExistsError:  # a concurrent writer created it
        return
    _fsync_dir(parent)


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
