"""The store's Parquet encoding: zstd, statistics on, byte-stream-split floats, balanced
row groups; a table in memory (:func:`parquet_bytes`), several tables at once on threads
(:func:`encode_tables`) or one streamed into a file (:class:`ParquetStream`).

Only pyarrow: a GPU machine that trains and writes chunks without fsspec or DuckDB
(``benchmarks/gpu.py``) encodes its tables as a trial does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

#: Upper bound on rows per Parquet row group.
MAX_ROW_GROUP = 1_000_000


def parquet_bytes(table: pa.Table) -> bytes:
    """Encode ``table`` as a Parquet file in memory: zstd, statistics on, balanced row groups.

    Row groups hold at most ``MAX_ROW_GROUP`` rows and are of equal size, so a
    table of at least 100k rows never ends in a tiny trailing group.
    """
    n_groups = max(1, math.ceil(table.num_rows / MAX_ROW_GROUP))
    sink = pa.BufferOutputStream()
    pq.write_table(
        table,
        sink,
        row_group_size=max(1, math.ceil(table.num_rows / n_groups)),
        **_encoding(table.schema),
    )
    return sink.getvalue().to_pybytes()


def encode_tables(tables: Mapping[str, pa.Table], threads: int = 1) -> dict[str, bytes]:
    """:func:`parquet_bytes` of each of ``tables``, on up to ``threads`` threads at once.

    pyarrow encodes one file on one thread and releases the GIL while it does, so a
    chunk's three tables (trajectories and layers about two fifths of the time each, runs
    the rest) encode in about half the time on three threads. The bytes are those of
    :func:`parquet_bytes`, whatever ``threads``. Cost: every encoded file is held in
    memory at once (compressed, a fraction of the tables themselves). ``threads`` should
    be the CPUs the caller was given (a Ray trial's), not the machine's.
    """
    if threads <= 1 or len(tables) <= 1:
        return {name: parquet_bytes(table) for name, table in tables.items()}
    with ThreadPoolExecutor(min(threads, len(tables))) as pool:
        encoded = pool.map(parquet_bytes, tables.values())
        return dict(zip(tables, encoded, strict=True))


def _encoding(schema: pa.Schema) -> dict:
    """The Parquet writer's settings for a table of ``schema``: zstd, statistics on."""
    floats = [f.name for f in schema if pa.types.is_floating(f.type)]
    repeated = [f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_integer(f.type)]
    return {
        "compression": "zstd",
        "write_statistics": True,
        # Measurements don't repeat: dictionaries only pay for the (few, long) strings and
        # the integers, which are steps, layers and config fields (a chunk's tables encode
        # ~10 % faster and 2 % smaller than with plain integers), and byte-stream-split
        # floats encode ~2.5x faster and compress better.
        "use_dictionary": repeated,
        "column_encoding": dict.fromkeys(floats, "BYTE_STREAM_SPLIT"),
    }


#: Rows a :class:`ParquetStream` gathers into one row group.
STREAM_ROW_GROUP = 131_072


class ParquetStream:
    """A Parquet file of ``schema`` written table by table into ``file`` (the settings of
    :func:`parquet_bytes`): rows are gathered into row groups of
    :data:`STREAM_ROW_GROUP`, so memory holds one row group, whatever the file's size.
    A context manager: leaving the block writes the footer (also after an error, so that
    the file object can be closed; :func:`atomic_file` then discards it)."""

    def __init__(self, file: BinaryIO, schema: pa.Schema, row_group: int | None = None):
        self._writer = pq.ParquetWriter(file, schema, **_encoding(schema))
        self._schema = schema
        self._row_group = row_group or STREAM_ROW_GROUP
        self._pending: list[pa.Table] = []
        self._rows = 0

    def write(self, table: pa.Table) -> None:
        """Append ``table``'s rows (its schema must be the file's)."""
        if not table.schema.equals(self._schema):
            raise ValueError(f"table of schema {table.schema} written to a file of {self._schema}")
        self._pending.append(table)
        self._rows += table.num_rows
        if self._rows >= self._row_group:
            self._flush()

    def _flush(self) -> None:
        if self._rows:
            rows = pa.concat_tables(self._pending)
            self._writer.write_table(rows, row_group_size=max(self._row_group, rows.num_rows))
        self._pending, self._rows = [], 0

    def __enter__(self) -> ParquetStream:
        return self

    def __exit__(self, *exc) -> None:
        try:
            if exc[0] is None:
                self._flush()
        finally:
            self._writer.close()
