"""The results store: Parquet tables, atomic chunk commits, DuckDB catalog, read-only queries,
verification and compaction.

See DESIGN.md ("The data path", "Store tables") and :mod:`storage.schema`, the one public
module (the tables, their column docs and ``to_table``); the ``_`` modules behind the
names re-exported here are private details that may move.
"""

from typing import TYPE_CHECKING

from phasesweep.storage import schema

#: The trainer needs only :mod:`storage.schema`, and a GPU machine that runs it alone
#: (``scripts/gpu-check``) need not have DuckDB or fsspec: the rest is imported on first
#: access (:mod:`phasesweep._lazy`).
if TYPE_CHECKING:
    from phasesweep.storage._catalog import open_catalog
    from phasesweep.storage._maintenance import compact, verify
    from phasesweep.storage._query import (
        ReadOnlyQueryError,
        query_table,
        run_query,
        sql_condition,
    )
    from phasesweep.storage._store import DamagedFileWarning, Store, resolve_store_uri
    from phasesweep.storage._writer import UnsafePathError, safe_output_path
else:
    from phasesweep._lazy import lazy_exports

    __getattr__, __dir__ = lazy_exports(globals())

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
    "sql_condition",
    "verify",
]
