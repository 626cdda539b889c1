"""Atomic file writes: Parquet encoding settings and the all-or-nothing put.

A reader (DuckDB glob, ``Store.files``) must never see a half-written file:

- local file systems: the bytes go to a hidden temp name in the target directory
  that does not end in ``.parquet``/``.json`` (``.NAME.RANDOM.tmp``), are flushed
  and fsynced, then ``os.replace``-d onto the final name, and the directory is
  fsynced so the rename survives a power loss. On any error the temp file is
  removed; only a hard kill between open and replace can leave one behind, and
  its name matches no reader's pattern.
- object stores: the whole object is uploaded in one PUT (s3fs switches to a
  multipart upload above its block size; S3 makes that object visible only when
  the upload completes), so there is no partial object to see.
"""

from __future__ import annotations

import contextlib
import math
import os
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
from fsspec import AbstractFileSystem
from fsspec.implementations.local import LocalFileSystem

#: Upper bound on rows per Parquet row group.
MAX_ROW_GROUP = 1_000_000


def parquet_bytes(table: pa.Table) -> bytes:
    """Encode ``table`` as a Parquet file in memory: zstd, statistics on, balanced row groups.

    Row groups hold at most ``MAX_ROW_GROUP`` rows and are of equal size, so a
    table of at least 100k rows never ends in a tiny trailing group.
    """
    n_groups = max(1, math.ceil(table.num_rows / MAX_ROW_GROUP))
    sink = pa.BufferOutputStream()
    floats = [f.name for f in table.schema if pa.types.is_floating(f.type)]
    strings = [f.name for f in table.schema if pa.types.is_string(f.type)]
    pq.write_table(
        table,
        sink,
        compression="zstd",
        row_group_size=max(1, math.ceil(table.num_rows / n_groups)),
        write_statistics=True,
        # Measurements don't repeat: dictionaries only pay for the (few, long) strings,
        # and byte-stream-split floats encode ~2.5x faster and compress better.
        use_dictionary=strings,
        column_encoding=dict.fromkeys(floats, "BYTE_STREAM_SPLIT"),
    )
    return sink.getvalue().to_pybytes()


def put_atomic(fs: AbstractFileSystem, path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` on ``fs`` so that readers see all of it or nothing.

    Replaces an existing file at ``path`` atomically. Safe to call concurrently
    for different paths; for the same path the last writer wins.
    """
    if isinstance(fs, LocalFileSystem):
        _put_local(path, data)
    else:
        fs.pipe_file(path, data)


def _put_local(path: str, data: bytes) -> None:
    directory, name = os.path.split(path)
    _makedirs_durable(directory)
    tmp = os.path.join(directory, f".{name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(directory)


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
