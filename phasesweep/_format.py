"""Query results as text: an aligned table, CSV or strict JSON (``phasesweep query``);
and counts in words (:func:`counted`) for every command's messages.

Rows are tuples of the Python values Arrow gives (``None`` for NULL, ``float`` with NaN
and infinities, ``list`` for DuckDB lists, ``dict`` for structs, tz-aware ``datetime``,
``Decimal``); :class:`ArrowRows` gives them from an Arrow table, converting only the rows
read. CSV and JSON are for other programs: every row, CSV lines end in ``\\n`` and lists
or structs are JSON text; JSON is strict (RFC 8259: NaN and infinities become ``null``).
The table is for people: like the DuckDB shell's, it shows the first and last rows of a
long result and counts the rest.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import math
from collections.abc import Iterator, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any, TextIO, overload

if TYPE_CHECKING:
    import pyarrow as pa

#: Widest table cell, in characters; longer values end in "…".
MAX_CELL = 40

#: Rows the table shows of a longer result by default (half from each end), as DuckDB's shell.
MAX_ROWS = 40


class ArrowRows(Sequence[tuple]):
    """The rows of an Arrow table as tuples of Python values, converted when read: a slice
    converts only its rows, iteration one record batch at a time."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table

    def __len__(self) -> int:
        return self.table.num_rows

    @overload
    def __getitem__(self, index: int) -> tuple: ...
    @overload
    def __getitem__(self, index: slice) -> list[tuple]: ...
    def __getitem__(self, index: int | slice) -> tuple | list[tuple]:
        if isinstance(index, int):
            return self[index : index + 1 or None][0]
        start, stop, step = index.indices(len(self))
        part = _tuples(self.table.slice(start, max(0, stop - start)))
        return part[::step]

    def __iter__(self) -> Iterator[tuple]:
        for batch in self.table.to_batches():
            yield from _tuples(batch)


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun`` in the number it takes: "1 chunk", "0 chunks", "12 chunks"
    (every noun of the messages takes an "s")."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _tuples(table: pa.Table | pa.RecordBatch) -> list[tuple]:
    return list(zip(*(column.to_pylist() for column in table.columns)))


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON data: non-finite floats -> None, decimals -> float, times
    -> ISO 8601 text, durations -> seconds, bytes -> hex, structs and lists recursively."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Decimal):
        return jsonable(float(value))
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return str(value)  # UUID, IP addresses, …


def write_json(names: Sequence[str], rows: Sequence[Sequence[Any]], out: TextIO) -> None:
    """An array of one object per row, keyed by column name; strict JSON."""
    records = [dict(zip(names, (jsonable(v) for v in row))) for row in rows]
    out.write(json.dumps(records, allow_nan=False) + "\n")


def _csv_cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple | dict):
        return json.dumps(jsonable(value), allow_nan=False)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    return value


def write_csv(names: Sequence[str], rows: Sequence[Sequence[Any]], out: TextIO) -> None:
    """A header line, then one line per row; NULL is an empty field, lists are JSON."""
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(names)
    writer.writerows([_csv_cell(v) for v in row] for row in rows)


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list | tuple | dict):
        return json.dumps(jsonable(value), ensure_ascii=False)
    return str(value)


def _clip(text: str, width: int) -> str:
    text = text.replace("\n", " ")
    return text if len(text) <= width else text[: width - 1] + "…"


def write_table(
    names: Sequence[str],
    rows: Sequence[Sequence[Any]],
    out: TextIO,
    max_cell: int = MAX_CELL,
    *,
    max_rows: int | None = None,
    more: str = "",
) -> None:
    """Aligned columns (numbers to the right), cells clipped to ``max_cell`` characters,
    then a line with the row count.

    With ``max_rows`` (None or 0: all), a longer result shows its first and last
    ``max_rows / 2`` rows (only those are read from ``rows``) with a line of ``…``
    between them, and the count line says how many are shown, then ``more``.
    """
    n = len(rows)
    cut = bool(max_rows) and n > max_rows
    head = rows[: max_rows - max_rows // 2] if cut else rows
    tail = rows[n - max_rows // 2 :] if cut else []
    shown = [*head, *tail]
    cells = [[_clip(_cell(v), max_cell) for v in row] for row in shown]
    heads = [_clip(n, max_cell) for n in names]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(heads)]
    numeric = [
        bool(shown)
        and all(
            r[i] is None or (isinstance(r[i], int | float | Decimal) and not isinstance(r[i], bool))
            for r in shown
        )
        for i in range(len(names))
    ]

    def line(values: Sequence[str]) -> str:
        padded = (v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric))
        return "  ".join(padded).rstrip()

    out.write(line(heads) + "\n")
    out.write("  ".join("-" * w for w in widths) + "\n")
    for i, c in enumerate(cells):
        if cut and i == len(head):
            out.write(line(["…"] * len(names)) + "\n")
        out.write(line(c) + "\n")
    count = f"{n} row{'' if n == 1 else 's'}"
    out.write(f"({count}, {len(shown)} shown{more})\n" if cut else f"({count})\n")
