"""The results store: Parquet tables, atomic chunk commits, DuckDB catalog, read-only queries.

See DESIGN.md ("The data path", "Store tables") and ``storage.schema``.
"""

from phasesweep.storage import schema
from phasesweep.storage.catalog import open_catalog
from phasesweep.storage.query import (
    ReadOnlyQueryError,
    query_table,
    read_only_connection,
    run_query,
)
from phasesweep.storage.store import Store, resolve_store_uri

__all__ = [
    "ReadOnlyQueryError",
    "Store",
    "open_catalog",
    "query_table",
    "read_only_connection",
    "resolve_store_uri",
    "run_query",
    "schema",
]
