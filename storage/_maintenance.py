"""Keeping a store healthy: ``verify`` (and ``--repair``) and ``compact``.

Both work per sweep, on the store's files directly (they are the truth: a run is
done iff a readable committed ``runs`` file holds it, see ``Store``).

Quarantine: ``verify --repair`` moves unreadable files to
``{root}/quarantine/{their path relative to the root}``, a folder no reader lists.
"""

from __future__ import annotations

import glob
import posixpath
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from phasesweep.storage import schema
from phasesweep.storage._catalog import catalog_connection, snapshot
from phasesweep.storage._manifest import encode_entry, manifest_entry
from phasesweep.storage._parquet import parquet_bytes
from phasesweep.storage._store import Store, as_store, sentences

#: Files of an attempt without a commit, and hidden temp files, younger than this are
#: left alone by ``verify --repair``: they may belong to a write in progress.
ORPHAN_MIN_AGE_S = 3600.0

#: Rows per merged file written by ``compact`` (bounds its memory).
COMPACT_ROWS_PER_FILE = 2_000_000

QUARANTINE = "quarantine"

_KEYS = {"runs": ["run_id", "attempt", "chunk_id", "status", "finished_at", "steps", "depth"]}
_KEYS["trajectories"] = ["run_id", "attempt", "step"]
_KEYS["layers"] = ["run_id", "attempt", "step", "layer"]


@dataclass
class Report:
    """What ``verify`` found (``problems``) and what ``--repair``/``compact`` did (``actions``);
    after a repair, what a ``verify`` then finds (``left``: None when nothing was repaired)."""

    problems: list[str] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    left: list[str] | None = None

    @property
    def ok(self) -> bool:
        """Whether the store is healthy now: no problem found, or none left after the
        repair (so ``verify --repair && phasesweep run …`` goes on exactly when the next
        ``verify`` would pass)."""
        return not (self.problems if self.left is None else self.left)


def verify(
    store: Store | str | None,
    sweep: str | None = None,
    repair: bool = False,
    *,
    min_age_s: float = ORPHAN_MIN_AGE_S,
) -> Report:
    """Check a sweep (or every sweep) of the store; with ``repair``, fix what can be fixed.

    Problems found:

    - a Parquet file that cannot be read whole, or a manifest entry that is not a
      valid entry (repair: moved to the quarantine);
    - an orphan: a ``trajectories``/``layers`` file none of whose attempts has a
      readable committed ``runs`` file, or a hidden temp file ``.NAME.RANDOM.tmp``
      left by a killed writer, older than ``min_age_s`` (repair: deleted);
    - a committed attempt without a manifest entry, or whose entry disagrees with
      the files (repair: the entry is written anew from the files); an entry whose
      attempt has no committed ``runs`` file (repair: moved to the quarantine);
    - a run_id with more than one row that is not 'failed' across the sweep's
      ``runs`` files (a duplicate commit; the catalog shows one; not repaired);
    - a run whose ``trajectories`` or ``layers`` rows are gone: a completed run (as
      the catalog shows it) without rows of its attempt, or a run (not failed) of an
      attempt that lost a file of that table to damage, with none of its rows left or
      with rows that ran on into the damaged file (repair: the run's row is taken out of
      its attempt's ``runs`` files, which go to the quarantine as they were, or the whole
      attempt with its manifest entry when that leaves none: the run is no longer
      done, so a relaunch trains exactly these runs again);
    - a completed run with a step twice in ``trajectories`` (not repaired).

    The report's problems are those found before repairing; with ``repair`` the store is
    verified again afterwards and ``left`` holds what that finds (a repaired store verifies
    clean but for duplicates). Repairing twice does nothing the second time.
    """
    store = as_store(store)
    report = Report()
    for name in [sweep] if sweep is not None else known_sweeps(store):
        _verify_sweep(store, name, repair, min_age_s, report)
    if repair:
        report.left = verify(store, sweep, min_age_s=min_age_s).problems
    return report


def known_sweeps(store: Store) -> list[str]:
    """Sorted names of the sweeps with a spec or any file (damaged ones included)."""
    names = set(store.sweeps())
    for table in schema.CHUNK_TABLES:
        names.update(_sweep_of(p) for p in store.files(table))
    names.update(_sweep_of(p) for p in store.manifest_paths())
    return sorted(names)


def _sweep_of(path: str) -> str:
    return posixpath.basename(posixpath.dirname(path)).removeprefix("sweep=")


def _verify_sweep(store: Store, sweep: str, repair: bool, min_age: float, report: Report) -> None:
    def problem(text: str) -> None:
        report.problems.append(f"{sweep}: {text}")

    def act(text: str) -> None:
        report.actions.append(f"{sweep}: {text}")

    keys: dict[str, dict[str, pa.Table]] = {}  # table -> path -> key columns
    damaged: dict[str, list[str]] = defaultdict(list)  # table -> its unreadable files
    for table in schema.TABLES:
        keys[table] = {}
        for path in store.files(table, sweep):
            try:
                whole = pq.read_table(path, filesystem=store.arrow_fs)
                if table in _KEYS:
                    keys[table][path] = whole.select(_KEYS[table])
            except (OSError, ValueError, KeyError, pa.ArrowException) as e:
                problem(f"unreadable file {store.relative(path)}: {sentences(str(e))}")
                damaged[table].append(path)
                if repair:
                    act(f"quarantined {_quarantine(store, path)}")

    for path in _temp_files(store, sweep):
        if _age(store, path) >= min_age:
            problem(f"leftover temp file {store.relative(path)}")
            if repair:
                store.fs.rm_file(path)
                act(f"removed {store.relative(path)}")

    committed: dict[str, list[str]] = defaultdict(list)  # attempt -> its runs files
    for path, t in keys["runs"].items():
        for attempt in set(t.column("attempt").to_pylist()):
            committed[attempt].append(path)
    attempt_files: dict[str, list[tuple[str, str]]] = defaultdict(list)  # attempt -> tables
    for table in ("trajectories", "layers"):
        for path, t in keys[table].items():
            attempts = set(t.column("attempt").to_pylist())
            if attempts & set(committed):
                for a in attempts:
                    attempt_files[a].append((table, path))
            elif _age(store, path) >= min_age:
                problem(f"orphan file {store.relative(path)} (no committed runs file)")
                if repair:
                    store.fs.rm_file(path)
                    act(f"removed {store.relative(path)}")

    _verify_manifest(store, sweep, keys, committed, attempt_files, repair, problem, act)

    if not keys["runs"]:
        return
    runs = pa.concat_tables(keys["runs"].values(), promote_options="permissive").to_pylist()
    done = Counter(r["run_id"] for r in runs if r["status"] != "failed")
    for run_id, n in sorted(done.items()):
        if n > 1:
            problem(f"run {run_id} has {n} committed rows that are not 'failed'")
    steps: dict[tuple[str, str, str], Counter] = defaultdict(Counter)  # (table, run, attempt)
    for table in ("trajectories", "layers"):
        for t in keys[table].values():
            for r, a, s in zip(*(t.column(c).to_pylist() for c in ("run_id", "attempt", "step"))):
                steps[table, r, a][s] += 1
    for run in _shown(runs):
        counts = steps.get(("trajectories", run["run_id"], run["attempt"]))
        if run["status"] == "completed" and counts and max(counts.values()) > 1:
            problem(f"completed run {run['run_id']} has a step twice in trajectories")
    lost = _lost_runs(store, keys, runs, steps, damaged)
    for (_, run_id), why in sorted(lost.items()):
        problem(f"{why[0]} run {run_id} {why[1]}")
    if repair:
        by_attempt: dict[str, set[str]] = defaultdict(set)
        for attempt, run_id in lost:
            by_attempt[attempt].add(run_id)
        for attempt, run_ids in sorted(by_attempt.items()):
            _drop_runs(store, sweep, attempt, run_ids, committed[attempt], attempt_files, act)


def _lost_runs(
    store: Store,
    keys: dict[str, dict[str, pa.Table]],
    runs: list[dict],
    steps: dict[tuple[str, str, str], Counter],
    damaged: dict[str, list[str]],
) -> dict[tuple[str, str], tuple[str, str]]:
    """Runs whose ``trajectories`` or ``layers`` rows are gone, as ``(attempt, run_id) ->
    (status, what is wrong)``: see :func:`verify`.

    Rows run on into a damaged file only in an attempt with several files per table (a
    compaction's, sorted by run, step and layer): the last run of the file ahead of it
    unless its last row is its last step (and layer), the first run of the file behind
    it unless its first row is step 0 (and layer 1). A diverged run's last step is not
    known here: it counts as lost.
    """
    lost: dict[tuple[str, str], tuple[str, str]] = {}
    for run in _shown(runs):
        for table in ("trajectories", "layers"):
            if run["status"] == "completed" and not steps.get(
                (table, run["run_id"], run["attempt"])
            ):
                lost[run["attempt"], run["run_id"]] = ("completed", f"has no {table} rows")
    by_key = {(r["attempt"], r["run_id"]): r for r in runs if r["status"] != "failed"}
    for table, bad in damaged.items():
        if table not in ("trajectories", "layers"):
            continue
        for path in bad:
            attempt = _attempt_of(path, {a for a, _ in by_key})
            if attempt is None:
                continue  # an uncommitted attempt's file: nothing of it is shown
            rel = store.relative(path)
            for (a, run_id), r in by_key.items():
                if a == attempt and not steps.get((table, run_id, attempt)):
                    lost[a, run_id] = (r["status"], f"has no {table} rows (lost with {rel})")
            files = sorted(
                [p for p, t in keys[table].items() if _attempt_of(p, {attempt})] + [path]
            )
            at = files.index(path)
            edges = []  # (a row next to the damaged file, whether it is the last before it)
            if at > 0 and (t := keys[table].get(files[at - 1])) is not None:
                edges.append((t.slice(t.num_rows - 1).to_pylist()[0], True))
            if at + 1 < len(files) and (t := keys[table].get(files[at + 1])) is not None:
                edges.append((t.slice(0, 1).to_pylist()[0], False))
            for row, ahead in edges:
                key = (attempt, row["run_id"])
                r = by_key.get(key)
                if r is None or key in lost:
                    continue
                if ahead:  # its last row must be its last step (and layer)
                    whole = r["status"] == "completed" and row["step"] == r["steps"]
                    whole = whole and row.get("layer", r["depth"]) == r["depth"]
                else:  # its first row must be step 0 (and layer 1)
                    whole = row["step"] == 0 and row.get("layer", 1) == 1
                if not whole:
                    lost[key] = (r["status"], f"has lost some {table} rows (with {rel})")
    return lost


def _attempt_of(path: str, attempts: set[str]) -> str | None:
    """The attempt among ``attempts`` whose files ``path`` names (``…-{attempt}.parquet``)."""
    name = posixpath.basename(path)
    found = [a for a in attempts if name.endswith(f"-{a}.parquet")]
    return max(found, key=len) if found else None


def _drop_runs(
    store: Store,
    sweep: str,
    attempt: str,
    run_ids: set[str],
    runs_paths: list[str],
    attempt_files: dict[str, list[tuple[str, str]]],
    act,
) -> None:
    """Take ``run_ids`` out of a committed attempt, so they are no longer done.

    Each ``runs`` file of the attempt that holds them goes to the quarantine as it was
    and is written anew without them; when that leaves the attempt no run, the whole
    attempt goes there instead (its files and manifest entry). The attempt's manifest
    entry is written anew from what is left.
    """
    tables = {p: pq.read_table(p, filesystem=store.arrow_fs) for p in runs_paths}
    left = {
        p: t.filter(pc.invert(pc.is_in(t["run_id"], pa.array(sorted(run_ids)))))
        for p, t in tables.items()
    }
    entries = [e for e in store.read_manifest(sweep)[0] if e["attempt"] == attempt]
    entry_paths = [store.manifest_path(sweep, e["chunk_id"], attempt) for e in entries]
    shown = ", ".join(sorted(run_ids)[:5]) + (" …" if len(run_ids) > 5 else "")
    if not any(t.num_rows for t in left.values()):
        others = {p for _, p in attempt_files.get(attempt, []) if store.fs.exists(p)}
        for path in [*runs_paths, *sorted(others), *entry_paths]:
            act(f"quarantined {_quarantine(store, path)}")
        act(f"attempt {attempt}: runs {shown} are no longer done: a relaunch trains them again")
        return
    for path, table in left.items():
        if table.num_rows < tables[path].num_rows:
            kept = _quarantine(store, path, copy=True)
            store.put(path, parquet_bytes(table))
            act(f"took runs {shown} out of {store.relative(path)} (as it was: {kept})")
    for path in entry_paths:
        store.fs.rm_file(path)
    runs = pa.concat_tables(left.values()).select(_KEYS["runs"])
    files = [(t, p) for t, p in attempt_files.get(attempt, []) if store.fs.exists(p)]
    want = _entry_from_files(store, sweep, runs, files + [("runs", p) for p in runs_paths])
    path = store.manifest_path(sweep, want["chunk_id"], attempt)
    store.put(path, encode_entry(want))
    act(f"wrote {store.relative(path)}")


def _verify_manifest(store, sweep, keys, committed, attempt_files, repair, problem, act) -> None:
    """Manifest entries against the committed attempts and their files."""
    for damage in store.damaged_files(sweep):
        if damage.path.endswith(".json") and store.fs.exists(damage.path):
            problem(f"damaged manifest entry {store.relative(damage.path)}: {damage.reason}")
            if repair:
                act(f"quarantined {_quarantine(store, damage.path)}")
    entries = {e["attempt"]: e for e in store.read_manifest(sweep)[0]}
    for attempt, entry in entries.items():
        path = store.manifest_path(sweep, entry["chunk_id"], attempt)
        if attempt not in committed:
            problem(f"manifest entry {store.relative(path)} has no committed runs file")
            if repair and store.fs.exists(path):
                act(f"quarantined {_quarantine(store, path)}")
    for attempt, runs_paths in sorted(committed.items()):
        runs = pa.concat_tables(keys["runs"][p] for p in runs_paths)
        runs = runs.filter(pa.compute.equal(runs["attempt"], attempt))
        files = attempt_files.get(attempt, []) + [("runs", p) for p in runs_paths]
        want = _entry_from_files(store, sweep, runs, files)
        have = entries.get(attempt)
        if have is not None and _same_entry(have, want):
            continue
        what = "has no manifest entry" if have is None else "disagrees with its manifest entry"
        problem(f"committed attempt {attempt} ({store.relative(runs_paths[0])}) {what}")
        if repair:
            if have is not None:
                store.fs.rm_file(store.manifest_path(sweep, have["chunk_id"], attempt))
            path = store.manifest_path(sweep, want["chunk_id"], attempt)
            store.put(path, encode_entry(want))
            act(f"wrote {store.relative(path)}")


def _entry_from_files(
    store: Store, sweep: str, runs: pa.Table, files: list[tuple[str, str]]
) -> dict:
    """The manifest entry of a committed attempt, from its runs rows and its files."""
    order = list(schema.CHUNK_TABLES)
    records = []
    for table, path in sorted(files, key=lambda tp: (order.index(tp[0]), tp[1])):
        records.append(
            {
                "table": table,
                "path": store.relative(path),
                "rows": pq.read_metadata(path, filesystem=store.arrow_fs).num_rows,
                "bytes": store.fs.size(path),
            }
        )
    chunk_ids = sorted(set(runs.column("chunk_id").to_pylist()) - {None})
    entry = manifest_entry(
        sweep,
        chunk_ids[0] if len(chunk_ids) == 1 else "compact",
        runs.column("attempt")[0].as_py(),
        runs.column("run_id").to_pylist(),
        records,
    )
    finished = [f for f in runs.column("finished_at").to_pylist() if f is not None]
    if finished:
        entry["finished_at"] = max(finished).isoformat()
    return entry


def _same_entry(have: dict, want: dict) -> bool:
    def files(e: dict) -> set:
        return {(f["table"], f["path"], f["rows"], f["bytes"]) for f in e["files"]}

    return (
        have["chunk_id"] == want["chunk_id"]
        and sorted(have["run_ids"]) == sorted(want["run_ids"])
        and files(have) == files(want)
    )


def _shown(runs: list[dict]) -> list[dict]:
    """The row per run_id that the catalog's ``runs`` view shows (same order as its SQL)."""
    best: dict[str, dict] = {}

    def key(r: dict) -> tuple:
        f = r["finished_at"]
        return (r["status"] == "failed", f is None, f or datetime.min, r["attempt"])

    for r in runs:
        if r["run_id"] not in best or key(r) < key(best[r["run_id"]]):
            best[r["run_id"]] = r
    return list(best.values())


def _temp_files(store: Store, sweep: str) -> list[str]:
    """Hidden temp files of killed local writers in the sweep's folders."""
    if not store.backend.local:
        return []  # an object store's PUT leaves no partial object
    found = []
    dirs = [
        f"{store.table_dir(t)}/sweep={sweep}"
        for t in (*schema.CHUNK_TABLES, *schema.ANALYSIS_TABLES)
    ]
    dirs.append(posixpath.dirname(store.manifest_path(sweep, "x", "y")))
    for d in dirs:
        found += store.fs.glob(f"{glob.escape(d)}/.*.tmp")
    return sorted(found)


def _age(store: Store, path: str) -> float:
    """Seconds since ``path`` was last modified."""
    modified = store.fs.modified(path)
    if modified.tzinfo is None:
        modified = modified.replace(tzinfo=timezone.utc)
    return time.time() - modified.timestamp()


def _quarantine(store: Store, path: str, copy: bool = False) -> str:
    """Move (or ``copy``) ``path`` under the quarantine folder; returns its new path
    relative to the root."""
    rel = store.relative(path)
    target = f"{store.root}/{QUARANTINE}/{rel}"
    if store.fs.exists(target):
        target = f"{target}.{uuid.uuid4().hex[:8]}"
    store.fs.makedirs(posixpath.dirname(target), exist_ok=True)
    (store.fs.copy if copy else store.fs.mv)(path, target)
    return store.relative(target)


def compact(
    store: Store | str | None,
    sweep: str | None = None,
    *,
    rows_per_file: int = COMPACT_ROWS_PER_FILE,
) -> Report:
    """Merge each sweep's chunk files into few large ones per table; queries answer the same.

    The merged files hold exactly the rows the catalog shows for the sweep (rows of
    uncommitted attempts, of superseded 'failed' rows and of duplicate commits are
    left out), sorted by run and step, at most ``rows_per_file`` rows per file,
    under a new attempt id ``-{19 digits counting down with time}{6 hex}``: every
    column keeps its value except ``attempt``. Damaged files are left alone (see
    ``verify``), and so are files of attempts that commit after compaction began.

    Order, so that a reader (whose snapshot lists ``runs``, then ``trajectories``
    and ``layers``, then ``runs`` again; see ``storage._catalog``) never sees a row
    twice or zero times:

    1. list the sweep's readable files (the snapshot to replace);
    2. write the merged ``trajectories`` and ``layers`` files: invisible, as no
       ``runs`` row carries the new attempt yet;
    3. write the merged ``runs`` files: the commit. A reader listing them next to
       the old ones gets both copies of a run's row, equal but for ``attempt``;
       the view shows the copy with the smallest attempt, the merged one (its id
       sorts before every chunk attempt and every earlier compaction's), whose
       ``trajectories``/``layers`` files were written before it;
    4. write the manifest entry of the new attempt;
    5. remove the old ``runs`` files: their runs stay visible through the merged
       copy; old rows of the other tables become invisible;
    6. remove the old ``trajectories`` and ``layers`` files. A reader that listed
       ``runs`` before step 3 and the others after step 6 would miss rows, but
       step 5 lies between, so its second listing of ``runs`` differs from the
       first and it takes its lists anew;
    7. remove the old attempts' manifest entries.

    A catalog opened before step 5 that reads afterwards finds files gone and
    fails; reopen it. Run one ``compact`` of a sweep at a time; ``run`` may go on.
    """
    store = as_store(store)
    report = Report()
    for name in [sweep] if sweep is not None else store.sweeps():
        _compact_sweep(store, name, rows_per_file, report)
    return report


def _compact_sweep(store: Store, sweep: str, rows_per_file: int, report: Report) -> None:
    files = snapshot(store, sweep, ("trajectories", "layers"))
    if not files["runs"]:
        return
    committed = set()
    for path in files["runs"]:
        committed.update(_attempts(store, path))
    replace = {"runs": files["runs"]}
    for table in ("trajectories", "layers"):
        replace[table] = [p for p in files[table] if _attempts(store, p) <= committed]
    if all(len(paths) <= 1 for paths in replace.values()):
        return  # one committed attempt in one file per table: nothing to merge
    now = time.time_ns()
    attempt = f"-{10**19 - now:019d}{uuid.uuid4().hex[:6]}"
    con = catalog_connection(store, replace)
    written: list[dict] = []
    try:
        for table, order in (
            ("trajectories", "run_id, step"),
            ("layers", "run_id, step, layer"),
            ("runs", "run_id"),
        ):
            target = schema.CHUNK_TABLES[table]
            columns = ", ".join(
                f"'{attempt}' AS attempt" if c == "attempt" else f'"{c}"' for c in target.names
            )
            reader = con.sql(
                f"SELECT {columns} FROM {table} WHERE sweep = ? ORDER BY {order}", params=[sweep]
            ).to_arrow_reader(rows_per_file)
            for i, batch in enumerate(_batches(reader, rows_per_file)):
                path = f"{store.table_dir(table)}/sweep={sweep}/compact{i:04d}-{attempt}.parquet"
                data = parquet_bytes(batch.cast(target))
                store.put(path, data)
                written.append(
                    {
                        "table": table,
                        "path": store.relative(path),
                        "rows": batch.num_rows,
                        "bytes": len(data),
                    }
                )
        run_ids = con.execute(
            "SELECT run_id FROM runs WHERE sweep = ? ORDER BY run_id", [sweep]
        ).fetchall()
    finally:
        con.close()
    entry = manifest_entry(sweep, "compact", attempt, [r for (r,) in run_ids], written)
    store.put(store.manifest_path(sweep, "compact", attempt), encode_entry(entry))
    old_entries = [
        store.manifest_path(sweep, e["chunk_id"], e["attempt"])
        for e in store.manifest(sweep)
        if e["attempt"] in committed
    ]
    for path in [*replace["runs"], *replace["trajectories"], *replace["layers"], *old_entries]:
        store.fs.rm_file(path)
    n_old = sum(len(p) for p in replace.values())
    report.actions.append(
        f"{sweep}: merged {n_old} files into {len(written)}, {len(run_ids)} runs: one "
        f"attempt, compacted at {datetime.fromtimestamp(now / 1e9, timezone.utc):%Y-%m-%d %H:%M:%S} UTC"
    )


def _attempts(store: Store, path: str) -> set[str]:
    """The attempt ids a Parquet file holds (reads only that column)."""
    column = pq.read_table(path, columns=["attempt"], filesystem=store.arrow_fs).column(0)
    return set(pa.compute.unique(column).to_pylist())


def _batches(reader: pa.RecordBatchReader, rows: int):
    """Tables of at most ``rows`` rows from ``reader`` (the last may be smaller)."""
    pending, n = [], 0
    for batch in reader:
        pending.append(batch)
        n += batch.num_rows
        if n >= rows:
            yield pa.Table.from_batches(pending)
            pending, n = [], 0
    if pending:
        yield pa.Table.from_batches(pending)
