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


def decode_entries(blobs: list[bytes]) -> list[dict]:
    """Parse entries, oldest first (ties broken by chunk id and attempt)."""
    entries = [json.loads(b) for b in blobs]
    return sorted(entries, key=lambda e: (e["finished_at"], e["chunk_id"], e["attempt"]))


def manifest_table(entries: list[dict]) -> pa.Table:
    """Entries as an Arrow table with the ``MANIFEST`` schema."""
    rows = [{**e, "finished_at": datetime.fromisoformat(e["finished_at"])} for e in entries]
    return pa.Table.from_pylist(rows, schema=MANIFEST)
