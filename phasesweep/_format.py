"""Query results as text: an aligned table, CSV or strict JSON (``phasesweep query``).

Rows are tuples of the Python values Arrow gives (``None`` for NULL, ``float`` with NaN
and infinities, ``list`` for DuckDB lists, ``dict`` for structs, tz-aware ``datetime``,
``Decimal``). CSV and JSON are for other programs: CSV lines end in ``\\n`` and lists or
structs are JSON text; JSON is strict (RFC 8259: NaN and infinities become ``null``).
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import math
from collections.abc import Sequence
from decimal import Decimal
from typing import Any, TextIO

#: Widest table cell, in characters; longer values end in "…".
MAX_CELL = 40


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
    names: Sequence[str], rows: Sequence[Sequence[Any]], out: TextIO, max_cell: int = MAX_CELL
) -> None:
    """Aligned columns (numbers to the right), cells clipped to ``max_cell`` characters,
    then a line with the row count."""
    cells = [[_clip(_cell(v), max_cell) for v in row] for row in rows]
    heads = [_clip(n, max_cell) for n in names]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(heads)]
    numeric = [
        bool(rows)
        and all(
            r[i] is None or (isinstance(r[i], int | float | Decimal) and not isinstance(r[i], bool))
            for r in rows
        )
        for i in range(len(names))
    ]

    def line(values: Sequence[str]) -> str:
        padded = (v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric))
        return "  ".join(padded).rstrip()

    out.write(line(heads) + "\n")
    out.write("  ".join("-" * w for w in widths) + "\n")
    for c in cells:
        out.write(line(c) + "\n")
    out.write(f"({len(rows)} row{'' if len(rows) == 1 else 's'})\n")
