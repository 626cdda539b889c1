"""The results store: Parquet tables, atomic chunk commits, DuckDB catalog, read-only queries,
verification and compaction.

See DESIGN.md ("The data path", "Store tables") and ``storage.schema``.
"""

from phasesweep.storage import schema
from phasesweep.storage.catalog import open_catalog
from phasesweep.storage.maintenance import compact, verify
from phasesweep.storage.query import (
    ReadOnlyQueryError,
    query_table,
    run_query,
)
from phasesweep.storage.store import DamagedFileWarning, Store, resolve_store_uri
from phasesweep.storage.writer import UnsafePathError, safe_output_path

__all__ = [
    "DamagedFileWarning",
    "ReadOnlyQueryError",
    "Store",
    "UnsafePathError",
    "compact",
    "open_catalog",
    "query_table",
    "resolve_store_uri",
    "run_query",
    "safe_output_path",
    "schema",
    "verify",
]
