"""The results store: hive-partitioned Parquet tables on a local disk or an object store.

Layout under the store root::

    {table}/sweep={name}/part-{chunk_id}-{attempt}.parquet  trajectories, layers, runs
    {table}/sweep={name}/data.parquet                       summaries, plateaus, scaling_fits
    manifest/sweep={name}/{chunk_id}-{attempt}.json         one per committed chunk attempt
    specs/{name}.yaml                                       the sweep spec as launched

Files never contain the ``sweep`` column: it comes from the directory name.
"""

from __future__ import annotations

import contextlib
import glob
import json
import math
import os
import posixpath
import re
import shutil
import struct
import uuid
import warnings
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
from fsspec import AbstractFileSystem
from phasesweep.storage import schema
from phasesweep.storage._backends import Backend, open_backend
from phasesweep.storage._manifest import check_entry, encode_entry, manifest_entry, sort_entries
from phasesweep.storage._parquet import ParquetStream, encode_tables
from phasesweep.storage._writer import atomic_file, put_atomic

from phasesweep._config import SWEEP_NAME

#: Store used when neither ``--store`` nor ``$PHASESWEEP_STORE`` is given.
DEFAULT_STORE = "./results"

#: The folders a store's root may hold (see the layout above; ``claims`` and
#: ``checkpoints`` of launches under way, ``quarantine`` of ``verify --repair``): a
#: root that holds something, none of it these, is not a store (``Store.foreign``).
ROOT_NAMES = frozenset({*schema.TABLES, "manifest", "specs", "claims", "checkpoints", "quarantine"})

_CHUNK_ID = re.compile(r"[A-Za-z0-9_.-]+")
_TABLES = schema.TABLES
_MAGIC = b"PAR1"
#: Smallest possible Parquet file: magic, (empty) footer, footer length, magic.
_MIN_PARQUET = 2 * len(_MAGIC) + 4


class DamagedFileWarning(UserWarning):
    """A reader skipped a store file it cannot read (see ``Store.damaged_files``);
    ``damage`` names it (None when the warning was made without one)."""

    def __init__(self, message: str, damage: Damage | None = None) -> None:
        super().__init__(message)
        self.damage = damage


@dataclass(frozen=True)
class Damage:
    """A store file that readers skip: ``path`` on the store's file system and why."""

    path: str
    reason: str


def resolve_store_uri(uri: str | os.PathLike[str] | None) -> str:
    """``uri`` if given, else ``$PHASESWEEP_STORE``, else ``./results``."""
    if uri is not None:
        return os.fspath(uri)
    return os.environ.get("PHASESWEEP_STORE") or DEFAULT_STORE


@dataclass(frozen=True)
class Store:
    """A store at ``uri``; open it with ``Store.open``.

    Concurrency: any number of processes may call ``write_chunk`` for the same
    sweep at once (every attempt writes files under its own fresh attempt id,
    and directory creation tolerates races). What the store does not do is
    arbitrate between two attempts that carry the same run: the caller drops
    the runs in ``done_run_ids`` before training, and attempts of one chunk are
    serialized by the scheduler. Should a duplicate slip through anyway (e.g. a
    worker presumed dead that still commits), the catalog shows the earliest one.
    A run whose rows are all 'failed' is not done: a relaunch commits it again,
    and the catalog prefers that row (see ``done_run_ids``).
    ``write_analysis`` and ``write_spec`` replace a file: the last writer wins.
    ``maintenance.compact`` may run beside writers and readers (see its order).

    Damage: readers (``done_run_ids``, ``manifest``, the catalog) skip files that
    ``readable_files`` finds damaged and warn (``DamagedFileWarning``);
    ``damaged_files`` lists them, ``maintenance.verify`` finds the rest.
    Writes go through ``put`` and never follow a symbolic link out of the store.

    Where the files live is the ``backend``'s business (:mod:`storage._backends`: a local
    folder, an S3 prefix, chosen by the URI's scheme); nothing outside storage reaches
    its file system.

    Attributes:
        backend: the store root on its file system.
    """

    backend: Backend

    @classmethod
    def open(cls, uri: str | os.PathLike[str] | None = None) -> Store:
        """Open a store (creates nothing): a local path, ``file://PATH`` or ``s3://BUCKET/PREFIX``
        (:func:`storage._backends.open_backend`).

        ``None`` resolves through ``resolve_store_uri``. For S3 the endpoint is
        ``$PHASESWEEP_S3_ENDPOINT``, else ``$AWS_ENDPOINT_URL``, else AWS; the
        credentials come from the usual AWS environment variables and files.
        """
        return cls(open_backend(resolve_store_uri(uri)))

    @property
    def uri(self) -> str:
        """Canonical URI: an absolute local path, or ``s3://bucket/prefix``."""
        return self.backend.uri

    @property
    def fs(self) -> AbstractFileSystem:
        """The fsspec file system holding the store (storage's own modules only)."""
        return self.backend.fs

    @property
    def root(self) -> str:
        """Path of the store root on ``fs`` (no protocol)."""
        return self.backend.root

    @property
    def is_local(self) -> bool:
        """Whether the store is a folder on this machine. Kept for users of the public
        ``Store``; code of ours asks the store to act (``local_path``, ``upload``, ``exists``)
        instead of branching on where it lives."""
        return self.backend.local

    @property
    def arrow_fs(self) -> pafs.FileSystem:
        """The store's file system for ``pyarrow.dataset``."""
        return self.backend.arrow_fs

    def url(self, path: str) -> str:
        """Full URL of a path on ``fs`` (as DuckDB reads it)."""
        return self.backend.url(path)

    def exists(self) -> bool:
        """Whether the store is there: a local folder, or an object-store prefix holding an
        object. Errors reaching an object store propagate."""
        return self.backend.root_exists()

    def foreign(self) -> list[str]:
        """What the root holds when it holds something but no store: its names (sorted),
        none of which is one of :data:`ROOT_NAMES`. Empty for a store, an empty folder or
        prefix, or a missing one: so a mistyped path that exists (a folder of specs, a
        home directory) is never read as an empty store, nor written into by ``run``."""
        names = self.backend.root_names()
        return [] if not names or ROOT_NAMES.intersection(names) else names

    def local_path(self, relative: str) -> str | None:
        """``relative`` (a '/'-separated path under the root) as a path of this machine
        where the store is a local folder; None for an object store."""
        return f"{self.root}/{relative}" if self.backend.local else None

    def download(self, relative: str, local: str) -> bool:
        """Copy the store's file at ``relative`` to the local path ``local``; False (and
        nothing written) where the store holds no such file."""
        try:
            self.fs.get_file(f"{self.root}/{relative}", local)
        except FileNotFoundError:
            with contextlib.suppress(FileNotFoundError):  # a partial copy
                os.remove(local)
            return False
        return True

    def upload(self, local: str, relative: str) -> None:
        """Put the local file ``local`` into the store at ``relative``, atomically."""
        with (
            open(local, "rb") as f,
            atomic_file(self.fs, f"{self.root}/{relative}", root=self.root) as out,
        ):
            shutil.copyfileobj(f, out)

    def table_dir(self, table: str) -> str:
        """Path of a table's directory on ``fs`` (it may not exist)."""
        if table not in _TABLES:
            raise ValueError(f"unknown table {table!r}; known: {sorted(_TABLES)}")
        return f"{self.root}/{table}"

    def files(self, table: str, sweep: str | None = None) -> list[str]:
        """Sorted paths (on ``fs``) of the table's Parquet files, of one sweep or of all.

        Every file, damaged or not; readers use ``readable_files``.
        """
        if sweep is not None:
            check_sweep(sweep)
        return sorted(self._glob(self._pattern(table, sweep)))

    def readable_files(self, table: str, sweep: str | None = None) -> list[str]:
        """``files`` without the damaged ones, each of which is reported as a ``DamagedFileWarning``.

        The check is cheap and structural (one listing with sizes, then the last 8
        bytes of every file, batched): a file shorter than an empty Parquet file
        (e.g. zero bytes), without the trailing ``PAR1`` magic, or whose footer
        length does not fit the file (a truncated file) is damaged. Damage inside a
        well-formed frame (a flipped bit in a page) is found by ``maintenance.verify``,
        which reads every file whole. A file deleted since the listing is left out
        without a warning (compaction removes files; see ``maintenance.compact``).
        """
        if sweep is not None:
            check_sweep(sweep)
        good, bad = self._check_parquet(self._listing(table, sweep))
        _warn(bad)
        return good

    def damaged_files(self, sweep: str | None = None) -> list[Damage]:
        """Files that readers skip, of one sweep or of all: Parquet files of every table
        failing the check of ``readable_files``, and manifest entries that are not valid
        JSON of the entry's shape. Sorted by path."""
        if sweep is not None:
            check_sweep(sweep)
        bad: list[Damage] = []
        for table in _TABLES:
            bad += self._check_parquet(self._listing(table, sweep))[1]
        bad += self.read_manifest(sweep)[1]
        return sorted(bad, key=lambda d: d.path)

    def _pattern(self, table: str, sweep: str | None) -> str:
        return f"{self.table_dir(table)}/sweep={sweep or '*'}/*.parquet"

    def _glob(self, pattern: str, detail: bool = False) -> list[str] | dict[str, dict]:
        """``fs.glob`` of a pattern below the root (as the path helpers build them) that
        takes the root literally: a root such as ``results[v2]`` would otherwise be read
        as a pattern and match nothing."""
        assert pattern.startswith(self.root + "/"), pattern
        return self.fs.glob(glob.escape(self.root) + pattern[len(self.root) :], detail=detail)

    def _listing(self, table: str, sweep: str | None) -> dict[str, dict]:
        """``glob(detail=True)`` of the table's files, taken again if a file vanishes
        between the directory listing and its ``stat`` (compaction removes files)."""
        for _ in range(4):
            with contextlib.suppress(FileNotFoundError):
                return self._glob(self._pattern(table, sweep), detail=True)
        return self._glob(self._pattern(table, sweep), detail=True)

    def _check_parquet(self, listing: dict[str, dict]) -> tuple[list[str], list[Damage]]:
        """Split a ``glob(detail=True)`` listing into readable paths (sorted) and damage."""
        sizes = {p: int(info["size"]) for p, info in listing.items()}
        bad = [
            Damage(p, f"{n} bytes, too short for Parquet")
            for p, n in sizes.items()
            if n < _MIN_PARQUET
        ]
        candidates = sorted(p for p, n in sizes.items() if n >= _MIN_PARQUET)
        good = []
        tails = self._tails(candidates, [sizes[p] for p in candidates])
        for path, tail in zip(candidates, tails):
            if tail is None:  # removed since the listing (compaction)
                continue
            footer_len, magic = struct.unpack("<I4s", tail)
            if magic != _MAGIC:
                bad.append(Damage(path, "no Parquet footer (truncated or not Parquet)"))
            elif footer_len + _MIN_PARQUET > sizes[path]:
                bad.append(Damage(path, f"footer of {footer_len} bytes exceeds the file"))
            else:
                good.append(path)
        return good, bad

    def _tails(self, paths: list[str], sizes: list[int]) -> list[bytes | None]:
        """The last 8 bytes of every path (``None`` for a file that vanished)."""
        if not paths:
            return []
        got = self.backend.tails(paths, sizes)
        return [None if isinstance(t, FileNotFoundError) else _bytes_or_raise(t) for t in got]

    def read_files(self, paths: list[str]) -> list[bytes | Exception]:
        """The whole contents of ``paths``, in order: the exception instead where a file
        cannot be read (``FileNotFoundError`` for one that vanished). One batched,
        concurrent request per file on object stores. Paths are taken literally
        (``fs.cat`` of a list expands glob characters in them, e.g. a root ``a[1]``)."""
        if not paths:
            return []
        return self.fs.cat_ranges(paths, [0] * len(paths), [None] * len(paths), on_error="return")

    def sweeps(self) -> list[str]:
        """Sorted names of the sweeps with a spec or at least one committed chunk."""
        names = {_sweep_of(p) for p in self.files("runs")}
        names.update(posixpath.basename(p)[: -len(".yaml")] for p in self._glob(self._spec("*")))
        return sorted(names)

    def done_run_ids(self, sweep: str) -> set[str]:
        """run_ids of ``sweep`` with a committed ``runs`` row whose status is not 'failed'.

        Completed and diverged runs are done; a run that only has 'failed' rows
        (its trial failed after all retries) is trained again on relaunch, and
        the catalog then shows the new row instead of the failed one. Reads only
        the ``run_id`` and ``status`` columns of the sweep's ``runs`` files.
        """
        for _ in range(4):
            with contextlib.suppress(FileNotFoundError):  # removed by a compaction meanwhile
                return self._done_run_ids(sweep)
        return self._done_run_ids(sweep)

    def _done_run_ids(self, sweep: str) -> set[str]:
        return set(self._done(self.readable_files("runs", sweep), ["run_id"])["run_id"].to_pylist())

    def done_rows(self, sweep: str) -> pa.Table:
        """``run_id`` and ``chunk_id`` of the sweep's done runs (see ``done_run_ids``), one
        row per run id (the earliest file's where a run was stored twice): what a plan
        reads to skip the chunks the store holds. Columns are read, not rows built."""
        for _ in range(4):
            with contextlib.suppress(FileNotFoundError):  # removed by a compaction meanwhile
                table = self._done(self.readable_files("runs", sweep), ["run_id", "chunk_id"])
                break
        else:
            table = self._done(self.readable_files("runs", sweep), ["run_id", "chunk_id"])
        if table.num_rows == 0:
            return table
        first = pc.index_in(table.column("run_id").unique(), table.column("run_id"))
        return table.take(first)

    def done_among(
        self,
        sweep: str,
        run_ids: Collection[str],
        select: Callable[[str | None, float], bool],
    ) -> set[str]:
        """The run ids of ``run_ids`` that are done (see ``done_run_ids``), reading only
        the sweep's ``runs`` files that ``select(chunk_id, mtime)`` picks: ``chunk_id`` of
        a file named ``part-{chunk_id}-{attempt}.parquet`` (None for other names, e.g.
        compacted files), ``mtime`` its modification time (epoch seconds). One listing of
        the folder; only the picked files are checked for damage and read, with the
        run ids as a filter. What a trial reads to skip its stored points."""
        if not run_ids:
            return set()
        for _ in range(4):
            with contextlib.suppress(FileNotFoundError):  # removed by a compaction meanwhile
                return self._done_among(sweep, run_ids, select)
        return self._done_among(sweep, run_ids, select)

    def _done_among(self, sweep, run_ids, select) -> set[str]:  # noqa: ANN001
        check_sweep(sweep)
        listing = {
            path: info
            for path, info in self._listing("runs", sweep).items()
            if select(chunk_of(path), _mtime(info))
        }
        good, bad = self._check_parquet(listing)
        _warn(bad)
        wanted = pa.array(list(run_ids), pa.string())
        done = self._done(good, ["run_id"], ds.field("run_id").isin(wanted))
        return set(done.column("run_id").to_pylist())

    def _done(self, paths: list[str], columns: list[str], where=None) -> pa.Table:  # noqa: ANN001
        """``columns`` of the done rows (status not 'failed') of the ``runs`` files ``paths``."""
        if not paths:
            return pa.table({c: pa.array([], pa.string()) for c in columns})
        status = ds.field("status")
        done = status.is_null() | (status != "failed")
        dataset = ds.dataset(paths, filesystem=self.arrow_fs, format="parquet")
        return dataset.to_table(columns=columns, filter=done if where is None else done & where)

    def write_chunk(
        self, sweep: str, chunk_id: str, tables: dict[str, pa.Table], *, threads: int = 1
    ) -> None:
        """Commit one attempt of a chunk: its ``trajectories``, ``layers`` and ``runs`` rows.

        ``tables`` maps table names of ``schema.CHUNK_TABLES`` to Arrow tables with
        the schema's columns in any order (compatible types are cast, e.g. int to
        float64; anything else is a ``ValueError`` naming table and column).
        ``runs`` is required and non-empty with distinct run_ids; ``trajectories``
        and ``layers`` may be absent or empty, and may only hold runs of ``runs``.
        The store sets ``attempt`` (a fresh id per call) in every table, overwriting
        any values given, and ``chunk_id`` in ``runs`` where it is absent or NULL; a
        ``chunk_id`` that names another chunk is a ``ValueError``.

        All tables are validated and encoded before anything is written (on up to
        ``threads`` threads: the CPUs the caller was given, see
        :func:`~storage._parquet.encode_tables`). Then every table goes to its own file
        atomically, ``runs`` last: the ``runs`` file is the commit, and rows of an
        attempt that dies before it stay invisible in the catalog. A manifest entry
        follows the commit. See the class docstring on concurrency.
        """
        check_sweep(sweep)
        if not _CHUNK_ID.fullmatch(chunk_id):
            raise ValueError(f"chunk_id {chunk_id!r} must match {_CHUNK_ID.pattern}")
        unknown = set(tables) - set(schema.CHUNK_TABLES)
        if unknown:
            raise ValueError(
                f"unknown chunk tables {sorted(unknown)}; known: {list(schema.CHUNK_TABLES)}"
            )
        if "runs" not in tables or tables["runs"].num_rows == 0:
            raise ValueError("write_chunk needs a non-empty 'runs' table: it is the commit")
        runs = tables["runs"]
        if "chunk_id" in runs.column_names:
            other = set(runs.column("chunk_id").to_pylist()) - {chunk_id, None}
            if other:
                raise ValueError(
                    f"runs.chunk_id: rows of chunk {sorted(other)[:3]} "
                    f"given to write_chunk of chunk {chunk_id!r}"
                )
        tables = {**tables, "runs": _set(runs, "chunk_id", chunk_id)}  # where absent or NULL
        attempt = uuid.uuid4().hex[:12]
        ready = {}
        for name in schema.CHUNK_TABLES:  # runs last
            if name in tables:
                table = _set(tables[name], "attempt", attempt)
                ready[name] = schema.to_table(name, table, complete=True)
        run_ids = ready["runs"].column("run_id")
        if pc.count_distinct(run_ids).as_py() != len(run_ids) or run_ids.null_count:
            raise ValueError("runs: run_id must be non-null and distinct within a chunk")
        for name in ("trajectories", "layers"):
            if (
                name in ready
                and not pc.all(pc.is_in(ready[name].column("run_id"), run_ids), min_count=0).as_py()
            ):
                raise ValueError(f"{name}: holds run_ids that are not in the chunk's runs table")

        ready = {name: table for name, table in ready.items() if table.num_rows}
        encoded = encode_tables(ready, threads)
        files = []
        for name, table in ready.items():  # runs last: the commit
            path = f"{self.table_dir(name)}/sweep={sweep}/part-{chunk_id}-{attempt}.parquet"
            data = encoded[name]
            self.put(path, data)
            files.append(
                {
                    "table": name,
                    "path": self.relative(path),
                    "rows": table.num_rows,
                    "bytes": len(data),
                }
            )
        entry = manifest_entry(sweep, chunk_id, attempt, run_ids.to_pylist(), files)
        self.put(self.manifest_path(sweep, chunk_id, attempt), encode_entry(entry))

    def put(self, path: str, data: bytes) -> None:
        """``put_atomic`` of ``data`` at ``path`` (on ``fs``, inside the store): never through
        a symbolic link that leads out of the store."""
        put_atomic(self.fs, path, data, root=self.root)

    def write_analysis(self, sweep: str, name: str, table: pa.Table) -> None:
        """Replace the ``sweep`` partition of analysis table ``name`` with ``table``, atomically.

        ``name`` is one of ``schema.ANALYSIS_TABLES``; ``table`` is validated and
        cast like in ``write_chunk`` and may be empty. The partition is a single
        file replaced in one step, so readers see the old rows or the new ones.
        On object stores a reader that is in the middle of reading the old file
        when it is replaced may fail and has to retry. A partition too large for
        memory is written piece by piece with :meth:`analysis_writer`.
        """
        self._analysis_path(sweep, name)
        table = schema.to_table(name, table, complete=True)  # before anything is written
        with self.analysis_writer(sweep, name) as write:
            write(table)

    @contextlib.contextmanager
    def analysis_writer(self, sweep: str, name: str) -> Iterator[Callable[[pa.Table], None]]:
        """``write_analysis`` of the tables given, in order, to the function this yields:
        each is validated and written as it comes (memory holds one row group), and the
        partition is replaced, atomically, when the block ends. An error inside the block
        leaves the old partition as it was and no file behind."""
        path = self._analysis_path(sweep, name)
        with (
            atomic_file(self.fs, path, root=self.root) as f,
            ParquetStream(f, schema.ANALYSIS_TABLES[name]) as out,
        ):
            yield lambda table: out.write(schema.to_table(name, table, complete=True))

    def read_analysis(self, sweep: str, name: str) -> pa.Table:
        """The ``sweep`` partition of analysis table ``name`` (no rows where it has none; a
        damaged file is skipped as ``readable_files`` does), in the schema's columns."""
        paths = self.readable_files(name, sweep)
        if not paths:
            return schema.ANALYSIS_TABLES[name].empty_table()
        dataset = ds.dataset(paths, filesystem=self.arrow_fs, format="parquet")
        return dataset.to_table()

    def _analysis_path(self, sweep: str, name: str) -> str:
        check_sweep(sweep)
        if name not in schema.ANALYSIS_TABLES:
            raise ValueError(
                f"unknown analysis table {name!r}; known: {list(schema.ANALYSIS_TABLES)}"
            )
        return f"{self.table_dir(name)}/sweep={sweep}/data.parquet"

    def write_spec(self, sweep: str, text: str) -> None:
        """Store the sweep's YAML spec as launched (UTF-8), replacing an earlier one."""
        check_sweep(sweep)
        self.put(self._spec(sweep), text.encode())

    def read_spec(self, sweep: str) -> str | None:
        """The spec stored by ``write_spec``, or ``None``."""
        check_sweep(sweep)
        try:
            return self.fs.cat_file(self._spec(sweep)).decode()
        except FileNotFoundError:
            return None

    def manifest(self, sweep: str | None = None) -> list[dict]:
        """Manifest entries of one sweep (or of all), oldest first.

        One entry per committed chunk attempt: ``sweep, chunk_id, attempt,
        finished_at`` (ISO 8601, UTC), ``n_runs, run_ids`` and ``files`` (each
        ``table``, ``path`` relative to the store root, ``rows``, ``bytes``).
        A damaged entry (truncated, not JSON, wrong shape) is skipped and reported
        as a ``DamagedFileWarning``.
        """
        if sweep is not None:
            check_sweep(sweep)
        entries, bad = self.read_manifest(sweep)
        _warn(bad)
        return entries

    def manifest_paths(self, sweep: str | None = None) -> list[str]:
        """Paths (on ``fs``) of the manifest entry files, of one sweep or of all, sorted."""
        return sorted(self._glob(f"{self._manifest_dir(sweep or '*')}/*.json"))

    def manifest_path(self, sweep: str, chunk_id: str, attempt: str) -> str:
        """Path (on ``fs``) of the manifest entry of one committed chunk attempt."""
        return f"{self._manifest_dir(sweep)}/{chunk_id}-{attempt}.json"

    def read_manifest(self, sweep: str | None) -> tuple[list[dict], list[Damage]]:
        """The valid entries (oldest first) and the damaged entry files."""
        paths = self.manifest_paths(sweep)
        if not paths:
            return [], []
        entries, bad = [], []
        for path, blob in zip(paths, self.read_files(paths), strict=True):
            if isinstance(blob, FileNotFoundError):
                continue
            try:
                entries.append(check_entry(json.loads(_bytes_or_raise(blob))))
            except (ValueError, TypeError, KeyError) as e:
                bad.append(Damage(path, f"manifest entry unreadable: {sentences(str(e))}"))
        return sort_entries(entries), bad

    def _manifest_dir(self, sweep: str) -> str:
        return f"{self.root}/manifest/sweep={sweep}"

    def _spec(self, sweep: str) -> str:
        return f"{self.root}/specs/{sweep}.yaml"

    def relative(self, path: str) -> str:
        """``path`` on ``fs`` relative to the store root, '/'-separated."""
        return self.backend.relative(path)


def as_store(store_or_uri: Store | str | None) -> Store:
    """``store_or_uri`` itself if it is a ``Store``, else ``Store.open(store_or_uri)``."""
    return store_or_uri if isinstance(store_or_uri, Store) else Store.open(store_or_uri)


def _warn(damage: list[Damage]) -> None:
    for d in damage:
        message = (
            f"skipping damaged store file {d.path}: {d.reason} "
            "(`phasesweep verify --repair` fixes the store)"
        )
        warnings.warn(DamagedFileWarning(message, d), stacklevel=3)


#: Characters of an error message that a one-line report keeps (whole sentences).
MESSAGE_CHARS = 300


def sentences(text: str, limit: int = MESSAGE_CHARS) -> str:
    """``text`` (an error message) on one line, of at most ``limit`` characters where that
    ends a sentence: the whole sentences that fit, or the first sentence whole when it alone
    is longer. A report line is never cut mid-sentence ("…Either the file is corrupted or")."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    ends = [m.end() for m in re.finditer(r"[.!?](?=\s)", flat)] + [len(flat)]
    fitting = [e for e in ends if e <= limit]
    cut = fitting[-1] if fitting else ends[0]
    return flat[:cut] + (" …" if cut < len(flat) else "")


def _bytes_or_raise(value: bytes | BaseException) -> bytes:
    if isinstance(value, BaseException):
        raise value
    return value


def check_sweep(sweep: str) -> None:
    """``ValueError`` unless ``sweep`` is a valid sweep name."""
    if not SWEEP_NAME.fullmatch(sweep):
        raise ValueError(f"sweep name {sweep!r} must match {SWEEP_NAME.pattern}")


def chunk_of(path: str) -> str | None:
    """The chunk id of a table file named ``part-{chunk_id}-{attempt}.parquet`` (as
    ``write_chunk`` names them), else None (e.g. a compacted file)."""
    name = posixpath.basename(path)
    if not (name.startswith("part-") and name.endswith(".parquet")):
        return None
    chunk, sep, _ = name[len("part-") : -len(".parquet")].rpartition("-")
    return chunk if sep and chunk else None


def _mtime(info: dict) -> float:
    """Modification time (epoch seconds) from an fsspec listing entry (local or S3); inf
    where the entry has none (a reader that skips old files then reads it)."""
    value = info.get("mtime", info.get("LastModified", info.get("last_modified")))
    if value is None:
        return math.inf
    return value.timestamp() if hasattr(value, "timestamp") else float(value)


def _sweep_of(path: str) -> str:
    """Sweep name of a partition file path ``.../sweep=NAME/file``."""
    return posixpath.basename(posixpath.dirname(path)).removeprefix("sweep=")


def _set(table: pa.Table, column: str, value: str) -> pa.Table:
    """``table`` with string ``column`` set to ``value`` in every row (replaced or appended)."""
    values = pa.repeat(pa.scalar(value, pa.string()), table.num_rows)
    if column in table.column_names:
        return table.set_column(table.column_names.index(column), column, values)
    return table.append_column(column, values)
