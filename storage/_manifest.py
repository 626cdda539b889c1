"""The sweep manifest: one small JSON file per committed chunk attempt.

``{root}/manifest/sweep={name}/{chunk_id}-{attempt}.json`` is written after the
attempt's ``runs`` file, so it records a commit that already happened. It is a
log for humans, ``status`` and ``verify``; the ``runs`` table stays the truth
about which runs are done (a crash between the ``runs`` file and the manifest
entry leaves a done chunk without an entry, which ``verify`` can report).
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pyarrow as pa

FILE_ENTRY = pa.struct(
    [
        ("table", pa.string()),
        ("path", pa.string()),  # relative to the store root, '/'-separated
        ("rows", pa.int64()),
        ("bytes", pa.int64()),  # size of the Parquet file in bytes
    ]
)

#: Schema of the catalog's ``manifest`` view (the ``sweep`` column comes first).
MANIFEST = pa.schema(
    [
        ("sweep", pa.string()),
        ("chunk_id", pa.string()),
        ("attempt", pa.string()),
        ("finished_at", pa.timestamp("us", tz="UTC")),  # when the entry was written
        ("n_runs", pa.int64()),
        ("run_ids", pa.list_(pa.string())),
        ("files", pa.list_(FILE_ENTRY)),
    ]
)


def manifest_entry(
    sweep: str, chunk_id: str, attempt: str, run_ids: list[str], files: list[dict]
) -> dict:
    """A manifest entry as a JSON-ready dict; ``finished_at`` is now, ISO 8601 in UTC."""
    return {
        "sweep": sweep,
        "chunk_id": chunk_id,
        "attempt": attempt,
        "finished_at": datetime.now(timezone.utc).isoformat(),
        "n_runs": len(run_ids),
        "run_ids": run_ids,
        "files": files,
    }


def encode_entry(entry: dict) -> bytes:
    return json.dumps(entry, indent=1).encode()


def check_entry(entry: object) -> dict:
    """``entry`` if it has the shape of a manifest entry, else ``ValueError`` naming what is off.

    Checked: it is a JSON object with every key of ``MANIFEST`` of the right JSON
    type, ``finished_at`` is ISO 8601, ``n_runs`` matches ``run_ids`` and each file
    names its table, path, rows and bytes. A truncated or garbled entry fails here
    (or already in ``json.loads``) instead of deep inside a reader.
    """
    if not isinstance(entry, dict):
        raise ValueError(f"not a JSON object: {type(entry).__name__}")
    kinds = {
        "sweep": str,
        "chunk_id": str,
        "attempt": str,
        "finished_at": str,
        "n_runs": int,
        "run_ids": list,
        "files": list,
    }
    for key, kind in kinds.items():
        if not isinstance(entry.get(key), kind):
            raise ValueError(f"{key!r} missing or not a {kind.__name__}")
    datetime.fromisoformat(entry["finished_at"])
    if not all(isinstance(r, str) for r in entry["run_ids"]) or entry["n_runs"] != len(
        entry["run_ids"]
    ):
        raise ValueError("'run_ids' must be n_runs strings")
    for f in entry["files"]:
        if not (
            isinstance(f, dict)
            and isinstance(f.get("table"), str)
            and isinstance(f.get("path"), str)
            and isinstance(f.get("rows"), int)
            and isinstance(f.get("bytes"), int)
        ):
            raise ValueError(f"bad file record {str(f)[:100]!r}")
    return entry


def sort_entries(entries: list[dict]) -> list[dict]:
    """Entries oldest first (ties broken by chunk id and attempt)."""
    return sorted(entries, key=lambda e: (e["finished_at"], e["chunk_id"], e["attempt"]))


def manifest_table(entries: list[dict]) -> pa.Table:
    """Entries as an Arrow table with the ``MANIFEST`` schema."""
    rows = [{**e, "finished_at": datetime.fromisoformat(e["finished_at"])} for e in entries]
    return pa.Table.from_pylist(rows, schema=MANIFEST)
