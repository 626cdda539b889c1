"""The results store: Parquet tables, atomic chunk commits, DuckDB catalog, read-only queries,
verification and compaction.

See DESIGN.md ("The data path", "Store tables") and :mod:`storage.schema`, the one public
module (the tables, their column docs and ``to_table``); the ``_`` modules behind the
names re-exported here are private details that may move.
"""

from phasesweep.storage import schema

from phasesweep._lazy import lazy_exports

#: Public name -> the module that defines it, imported on first access: the trainer needs
#: only :mod:`storage.schema`, and a GPU machine that runs it alone (``scripts/gpu-check``)
#: need not have DuckDB or fsspec.
_EXPORTS = {
    "DamagedFileWarning": "phasesweep.storage._store",
    "ReadOnlyQueryError": "phasesweep.storage._query",
    "Store": "phasesweep.storage._store",
    "UnsafePathError": "phasesweep.storage._writer",
    "compact": "phasesweep.storage._maintenance",
    "open_catalog": "phasesweep.storage._catalog",
    "query_table": "phasesweep.storage._query",
    "resolve_store_uri": "phasesweep.storage._store",
    "run_query": "phasesweep.storage._query",
    "safe_output_path": "phasesweep.storage._writer",
    "sql_condition": "phasesweep.storage._query",
    "verify": "phasesweep.storage._maintenance",
}

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
__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
