"""The Python API behind ``import phasesweep``: the CLI's operations as functions.

Private module: use the names re-exported by :mod:`phasesweep`. Every function takes
``store`` as a ``Store``, a URI (a path, ``file://PATH`` or ``s3://BUCKET/PREFIX``) or
None (``$PHASESWEEP_STORE``, else ``./results``), and reports bad input with the same
exceptions the CLI turns into one-line errors with exit code 2: :class:`SpecError`
(spec, override or argument), :class:`StoreError` (missing or unreachable store),
:class:`UnknownSweepError` (a sweep the store does not hold) and ``duckdb.Error`` (SQL);
:func:`input_errors` lists them.

The command line (:mod:`phasesweep._cli`) imports nothing else of the package: what its
commands need beyond the public functions is here too, below them (damaged files
collected instead of warned about, the answer to ``phasesweep query``, leaving Ray).

Concurrency: the store is the single source of truth and may be written while it is
read. A connection or DataFrame is a snapshot of the files present when it was opened;
open a new one to see chunks committed later. Writers (``run``, ``analyze``) may run
in other processes at the same time (see :class:`~phasesweep.storage.Store`).
"""

from __future__ import annotations

import contextlib
import difflib
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the run use case imports Ray's driver: only on first use
    import duckdb
    import pandas as pd
    import pyarrow as pa
    from phasesweep.pipeline.grid import Point
    from phasesweep.pipeline.refine._refine import RefineOutcome
    from phasesweep.pipeline.run._driver import SweepOutcome
    from phasesweep.pipeline.run._launch import Plan, Status
    from phasesweep.pipeline.spec import SweepSpec
    from phasesweep.storage import Store
    from phasesweep.storage._maintenance import Report
    from phasesweep.storage._store import Damage

    from phasesweep._gallery import Evaluation

    SpecSource = str | Path | Mapping[str, Any] | SweepSpec

#: Names ``table`` accepts instead of SQL: the catalog's views.
TABLES = (
    "runs",
    "trajectories",
    "layers",
    "summaries",
    "plateaus",
    "scaling_fits",
    "boundaries",
    "gallery_checks",
    "manifest",
)


class StoreError(ValueError):
    """The store URI is unusable, names no existing store (for reading), or cannot be reached."""

    def __init__(self, uri: str, reason: str) -> None:
        self.uri, self.reason = uri, reason
        super().__init__(f"store {uri}: {reason}")


class UnknownSweepError(LookupError):
    """The store holds no sweep of this name. ``close`` lists similar stored names."""

    def __init__(self, sweep: str, store_uri: str, known: Sequence[str]) -> None:
        self.sweep, self.known = sweep, list(known)
        self.close = difflib.get_close_matches(sweep, self.known, n=3, cutoff=0.6)
        if self.close:
            hint = "; did you mean " + " or ".join(repr(n) for n in self.close) + "?"
        elif self.known:
            shown = ", ".join(self.known[:10]) + (" …" if len(self.known) > 10 else "")
            hint = f"; it holds: {shown}"
        else:
            hint = "; it holds no sweeps"
        super().__init__(f"no sweep {sweep!r} in the store {store_uri}{hint}")

    def __str__(self) -> str:  # LookupError would show the args tuple
        return self.args[0]


def open_store(store: Store | str | Path | None = None, *, must_exist: bool = True) -> Store:
    """The store at ``store``, checked: reachable, and (``must_exist``) already there.

    A local store exists when its directory does; an object store when its prefix
    holds any object. Reading commands need an existing store (a typo in a path is
    not an empty store); ``run`` creates it in a new or empty folder. A folder (or prefix)
    that holds something but no store's folders is "not a phasesweep store", for reading
    and writing alike. Raises :class:`StoreError`.
    """
    from phasesweep.storage import Store, resolve_store_uri

    if isinstance(store, Store):
        opened = store
    else:
        try:
            opened = Store.open(store)
        except ValueError as e:
            raise StoreError(resolve_store_uri(store), str(e)) from None
    try:
        exists = opened.exists()
        foreign = opened.foreign()
    except Exception as e:  # botocore/aiohttp connection errors have no common base
        raise StoreError(opened.uri, f"cannot reach it: {_first_line(e)}") from None
    if foreign:
        shown = ", ".join(foreign[:3]) + (", …" if len(foreign) > 3 else "")
        raise StoreError(
            opened.uri,
            f"not a phasesweep store: it holds {shown} and no store's folders (give --store "
            "the folder `phasesweep run` wrote, or a new or empty one to create a store)",
        )
    if must_exist and not exists:
        raise StoreError(
            opened.uri,
            "no store there (give --store, or set $PHASESWEEP_STORE; `phasesweep run` creates one)",
        )
    return opened


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")


def _sweep_store(sweep: str, store: Store | str | Path | None, *, runs: bool = True) -> Store:
    """The existing store at ``store``, which must hold ``sweep`` (:class:`UnknownSweepError`)
    and, with ``runs``, some of its runs (:class:`StoreError`: only its spec is stored)."""
    opened = open_store(store)
    known = opened.sweeps()
    if sweep not in known:
        raise UnknownSweepError(sweep, opened.uri, known)
    if runs and not opened.files("runs", sweep):
        raise StoreError(opened.uri, f"sweep {sweep!r} has no runs yet, only its spec: run it")
    return opened


def load_spec(source: SpecSource, overrides: Sequence[str] = ()) -> SweepSpec:
    """Validate a sweep spec after applying ``overrides``.

    ``source``: a YAML file path, a dict as in YAML, or a :class:`SweepSpec`.
    ``overrides``: ``"KEY=VALUE"`` strings as ``phasesweep run --set`` takes them
    (dotted KEY, YAML VALUE), applied in order. Raises :class:`SpecError` naming the
    dotted key and the value. Writes nothing.
    """
    from phasesweep.pipeline.run._launch import resolve_spec

    return resolve_spec(source, overrides)[0]


def expand(spec: SpecSource) -> list[Point]:
    """The grid points of ``spec`` (anything :func:`load_spec` takes), in grid order.

    Each :class:`~phasesweep.pipeline.Point` has the ``run_id`` the store files it under,
    the resolved ``config`` and its ``coords`` on the grid axes (the last varies fastest).
    """
    from phasesweep.pipeline.grid import expand as expand_grid
    from phasesweep.pipeline.spec import SweepSpec

    return expand_grid(spec if isinstance(spec, SweepSpec) else load_spec(spec))


def plan(
    source: SpecSource,
    store: Store | str | Path | None = None,
    *,
    overrides: Sequence[str] = (),
    address: str | None = None,
    cpus_per_trial: float = 1.0,
    gpus_per_trial: float = 0.0,
    device_memory: float | None = None,
    extend: bool = False,
) -> Plan:
    """What :func:`run` would do, without writing anything (``phasesweep run --dry-run``).

    The :class:`~phasesweep.Plan` holds the grid's size (``total``), how many of its
    points the store holds (``skipped``), the chunks to train as descriptors
    (``tasks``; ``chunks`` and ``todo`` expand them into points, for small grids),
    ``peak_bytes`` (memory of the largest chunk) and ``flops`` (training work). It grows
    with the chunks, not the points: a 10⁷-point grid plans in seconds. ``address`` is
    only used to count the cluster's trial slots. With ``gpus_per_trial`` the chunks are
    sized for GPU trials: ``device_memory`` (GiB of one GPU; default
    ``$PHASESWEEP_DEVICE_MEMORY``, else measured on the GPU) lets a machine without one
    plan for it. The spec's ``plots:`` are checked too, so a typo fails before a launch.
    The relaunch rules of :func:`run` apply.
    """
    from phasesweep.pipeline.run._launch import plan_sweep

    planned = plan_sweep(
        source,
        open_store(store, must_exist=False),
        overrides=overrides,
        address=address,
        cpus_per_trial=cpus_per_trial,
        gpus_per_trial=gpus_per_trial,
        device_memory=device_memory,
        extend=extend,
    )
    if planned.spec.plots:  # the figure kinds import matplotlib: only when there are plots
        from phasesweep.analysis._plotting import check_plots

        check_plots(planned.spec.plots)
    return planned


def run(
    source: SpecSource,
    store: Store | str | Path | None = None,
    *,
    overrides: Sequence[str] = (),
    address: str | None = None,
    cpus_per_trial: float = 1.0,
    gpus_per_trial: float = 0.0,
    max_retries: int = 2,
    progress: bool = True,
    extend: bool = False,
) -> SweepOutcome:
    """Train every point of the sweep the store does not hold yet (``phasesweep run``).

    Same store, same resume semantics (stored points are skipped, failed ones trained
    again), same Ray default (an embedded local Ray private to this call unless
    ``address`` names a cluster: ``auto``, ``host:port`` or ``ray://host:port``; or
    ``standing``: this user's standing local Ray, started on demand, left running for
    the next launch and stopped after idling or by ``phasesweep standing stop``). The
    store is created if missing. Returns a :class:`~phasesweep.SweepOutcome`
    (``trained``, ``diverged``, ``skipped``, ``failed`` run ids, ``errors``).

    Relaunch: a spec whose grid is a part of the one stored under its name (same base
    config; ``execution`` may change) trains what the store lacks of it and leaves the
    stored spec's grid whole. One that adds grid values needs ``extend=True`` (the
    stored grid then takes the values of both, so :func:`status` counts against it);
    any other change is refused (:class:`SpecError` listing the changes and naming a
    free sweep name: ``overrides=["name=NEW"]`` runs it as a sweep of its own). The
    spec's ``plots:`` are checked before anything is written.

    Concurrency: the embedded Ray stays up in this process after the call (later calls
    reuse it; ``ray.shutdown()`` ends it). Any number of launches of one sweep may run at
    once, here or on other machines: points are claimed in the store, so none trains
    twice (leases expire after ``$PHASESWEEP_LEASE_TTL`` seconds when a holder on
    another host dies; hosts' clocks must agree to well within that). Stop signals: the
    first Ctrl-C or SIGTERM stops the launch cleanly (``interrupted``); a second, or SIGTERM
    outside the call, raises ``Interrupted`` (a ``KeyboardInterrupt``), which uncaught
    ends the script by that signal once its exit hooks ran (143, 130).
    """
    planned = plan(
        source,
        store,
        overrides=overrides,
        address=address,
        cpus_per_trial=cpus_per_trial,
        gpus_per_trial=gpus_per_trial,
        extend=extend,
    )
    return execute(
        planned,
        address=address,
        cpus_per_trial=cpus_per_trial,
        gpus_per_trial=gpus_per_trial,
        max_retries=max_retries,
        progress=progress,
    )


def execute(
    plan: Plan,
    *,
    address: str | None = None,
    cpus_per_trial: float = 1.0,
    gpus_per_trial: float = 0.0,
    max_retries: int = 2,
    progress: bool = True,
) -> SweepOutcome:
    """Train a :class:`~phasesweep.Plan` made by :func:`plan`: store its spec, then train
    its chunks (:func:`run` is ``execute(plan(...))``; ``phasesweep run`` shows the plan's
    counts in between).

    Give the ``address``, ``cpus_per_trial`` and ``gpus_per_trial`` the plan was made
    with: its chunks are sized for them. ``max_retries``: retries of a failed trial
    before its points are stored as failed; ``progress``: a bar, widget or periodic line
    while training. Nothing is written when Ray cannot be reached (:class:`SpecError` on
    ``address``). Returns a :class:`~phasesweep.SweepOutcome`.
    """
    from phasesweep.pipeline.run._launch import execute as execute_plan

    return execute_plan(
        plan,
        address=address,
        cpus_per_trial=cpus_per_trial,
        gpus_per_trial=gpus_per_trial,
        max_retries=max_retries,
        progress=progress,
    )


def status(sweep: str | None = None, store: Store | str | Path | None = None) -> Status:
    """Stored runs by sweep and status (``phasesweep status``).

    Returns a :class:`~phasesweep.Status`: ``counts`` as
    ``(sweep, status, runs)`` tuples; with ``sweep``, ``total`` is its grid size from
    the stored spec and ``done`` the runs completed or diverged.
    """
    from phasesweep.pipeline.run._launch import sweep_status

    opened = open_store(store) if sweep is None else _sweep_store(sweep, store, runs=False)
    return sweep_status(opened, sweep)


def checkpointed(sweep: str | None = None, store: Store | str | Path | None = None) -> int:
    """How many chunks of ``sweep`` (default: of every sweep) were checkpointed mid-training
    by a launch that was stopped: the training that running the sweep again resumes."""
    from phasesweep.storage._checkpoints import Checkpoint

    return Checkpoint.count(open_store(store), sweep)


def connect(store: Store | str | Path | None = None) -> duckdb.DuckDBPyConnection:
    """A new DuckDB connection over the store with the views ``runs``, ``trajectories``,
    ``layers``, ``summaries``, ``plateaus``, ``scaling_fits``, ``boundaries``,
    ``gallery_checks`` and ``manifest``.

    Locked as for ``phasesweep query``: SQL on it reads the store's table files and no
    other file, reaches no network, loads no extension and cannot unlock itself;
    in-memory tables may still be created. DuckDB cannot make a file read-only, so do
    not pass it SQL you did not write: use :func:`table` or :func:`arrow_table`, which
    take one read-only statement only. ``con.sql(...).df()`` gives a DataFrame. The
    views are a snapshot of the files present now; close the connection
    (``con.close()``) when done.
    """
    from phasesweep.storage import open_catalog

    return open_catalog(open_store(store))


def arrow_table(sql: str, store: Store | str | Path | None = None) -> pa.Table:
    """One read-only SQL statement over the store's views, as an Arrow table."""
    from phasesweep.storage import query_table

    return query_table(open_store(store), sql)


def table(
    name_or_sql: str, store: Store | str | Path | None = None, *, sweep: str | None = None
) -> pd.DataFrame:
    """A whole view (``"runs"``, ``"trajectories"``, …; see :data:`TABLES`) or the result
    of one read-only SQL statement, as a pandas DataFrame.

    ``sweep`` keeps a view's rows of that sweep (only with a view name). Columns are
    those of the store reference (docs/reference/store.md): times in gradient-flow
    units ``t = Σ lr``, NULL as NaN/None, lists as arrays. SQL errors raise
    ``duckdb.Error``; statements that are not read-only ``ReadOnlyQueryError``.
    """
    from phasesweep.pipeline.spec import SpecError
    from phasesweep.storage._catalog import sql_string

    if name_or_sql in TABLES:
        sql = f"FROM {name_or_sql}"
        if sweep is not None:
            _sweep_store(sweep, store)
            sql += " WHERE sweep = " + sql_string(sweep)
    elif sweep is not None:
        raise SpecError("sweep", sweep, "only applies to a table name, not to SQL", "argument")
    else:
        sql = name_or_sql
    return arrow_table(sql, store).to_pandas()


def phase_diagram(
    sweep: str,
    store: Store | str | Path | None = None,
    *,
    x: str = "init_scale",
    y: str = "width",
    value: str = "kernel_distance",
    facet: str | None = None,
    where: str | None = None,
) -> pd.DataFrame:
    """The phase diagram of ``sweep`` as a DataFrame: one row per (facet,) x, y cell.

    Columns ``x``, ``y`` (``facet``), ``value`` (mean over the cell's completed runs of
    the final ``value``, e.g. ``kernel_distance``), ``value_sd``, ``n_runs``,
    ``n_completed``, ``n_diverged``, ``n_failed``, ``n_seeds``, ``n_analyzed`` (runs with a
    current summary; ``value`` is NULL in a cell with fewer than ``n_runs``), ``regime``; the query is
    :func:`phasesweep.analysis.phase_diagram_sql`. Needs the sweep's summaries: run
    :func:`analyze` first (without them ``value`` is NULL).
    """
    from phasesweep.analysis import phase_diagram_sql
    from phasesweep.pipeline.spec import SpecError

    opened = _sweep_store(sweep, store)
    try:
        sql = phase_diagram_sql(sweep, x, y, value, facet=facet, where=where)
    except ValueError as e:
        raise SpecError("phase_diagram", (x, y, value, facet), str(e), "argument") from None
    return arrow_table(sql, opened).to_pandas()


def analyze(sweep: str, store: Store | str | Path | None = None) -> dict[str, int]:
    """Compute and store the sweep's ``summaries``, ``plateaus`` and ``scaling_fits``
    (``phasesweep analyze``); returns the rows written per table.

    Each table's partition of the sweep is replaced whole; the last writer wins. Runs
    whose trajectories are damaged get no summary: the others are written, then
    ``DamagedRunsError`` names the files (exit code 1 on the command line).
    """
    from phasesweep import analysis

    return analysis.analyze(_sweep_store(sweep, store), sweep)


def plot(
    sweep: str, store: Store | str | Path | None = None, out: str | Path | None = None
) -> list[Path]:
    """Write every figure of the sweep as PNG and SVG (``phasesweep plot``); their paths.

    ``out``: a directory (default: ``STORE/figures/SWEEP`` for a local store). Analyzes
    the sweep first if it has no summaries. To draw one figure into your own matplotlib
    ``Axes`` and get the ``Figure`` back, use :func:`phasesweep.draw`.
    """
    from phasesweep import analysis

    return analysis.plot(_sweep_store(sweep, store), sweep, out)


def report(
    sweep: str, store: Store | str | Path | None = None, out: str | Path | None = None
) -> Path:
    """Write the sweep's self-contained HTML report (``phasesweep report``); its path."""
    from phasesweep import analysis

    return analysis.report(_sweep_store(sweep, store), sweep, out)


def gallery(
    names: Sequence[str] = (),
    store: Store | str | Path | None = None,
    out: str | Path | None = None,
    *,
    full: bool = False,
    address: str | None = None,
    progress: bool = True,
) -> list[tuple[Evaluation, list[Path]]]:
    """Reproduce the gallery's results named (all for none; ``phasesweep gallery``): train
    what the store lacks of each one's sweep (default size, or the paper's range with
    ``full``), analyze it, check the paper's claim, draw figure, caption and SQL into ``out``
    (default ``STORE/figures/gallery``). Returns each ``Evaluation`` (``passed``,
    ``checks``, ``caption``, ``missing_points``: grid points not done, which make it
    INCOMPLETE; ``failed_points``, ``failure``: those failed after retries, the latest's
    error) with its files. An unknown name is a :class:`SpecError`."""
    from phasesweep._gallery import reproduce_all

    opened = open_store(store, must_exist=False)
    return reproduce_all(names, opened, out, full=full, address=address, progress=progress)


def gallery_entries(names: Sequence[str] = (), *, full: bool = False) -> dict[str, tuple[str, str]]:
    """Result name -> (its line of ``phasesweep gallery --list``: paper, equation, size and
    time on 2 CPU cores; the SQL it reads its numbers with, as ``--show-sql`` prints it)."""
    from phasesweep._gallery import listing, select

    return {r.name: (listing(r, full), r.query(r.sweep_name(full))) for r in select(names)}


def refine(
    sweep: str,
    store: Store | str | Path | None = None,
    *,
    metric: str,
    level: float,
    axis: str = "init_scale",
    budget: int | None = None,
    tol: float | None = None,
    per_line: int = 1,
    address: str | None = None,
    use_ray: bool = True,
) -> RefineOutcome:
    """Find where ``metric`` (a ``trajectories`` or ``runs`` column) crosses ``level``
    along the grid axis ``axis``, line by line (``phasesweep refine``; docs/refine.md).

    Each line of the sweep's grid (its other axes fixed) is searched by an Optuna study
    kept in the store; the new runs go to the sweep ``SWEEP__refine_METRIC`` and the
    estimates to the ``boundaries`` table. A line stops when its bracket is ``tol`` wide
    (log10 units on a log axis; default: the grid's finest spacing / 16), all stop when
    ``budget`` runs were trained in all. ``per_line``: points per line per batch (1:
    bisection). ``use_ray``: train batches as Ray trials (``address`` as for :func:`run`),
    else in this process. Bad arguments raise :class:`SpecError` before anything is
    written; a refine that was stopped goes on where it was when called again.

    Returns the outcome: ``child`` (the new runs' sweep), ``trained`` and ``failed`` runs,
    ``batches``, and ``boundaries`` (a DataFrame: the rows stored, one per line).
    """
    from phasesweep.pipeline.refine._refine import refine as refine_sweep

    return refine_sweep(
        _sweep_store(sweep, store, runs=False),  # an unknown sweep: did you mean …?
        sweep,
        metric,
        level,
        axis=axis,
        budget=budget,
        tol=tol,
        per_line=per_line,
        address=address,
        use_ray=use_ray,
    )


def verify(
    sweep: str | None = None, store: Store | str | Path | None = None, *, repair: bool = False
) -> Report:
    """Check one sweep of the store, or all (``phasesweep verify``): every file readable,
    manifest and files agree, no run stored twice, every completed run with its
    trajectories and layers.

    With ``repair``: unreadable files go to the quarantine, orphans and leftover temp
    files are deleted, missing or wrong manifest entries are written anew, and runs whose
    rows are lost are taken out of their commit, so a relaunch trains them again.
    Returns a report: ``problems`` (one line each), ``actions`` (what the repair did) and,
    after a repair, ``left`` (what a verify then finds); ``ok`` when nothing is wrong, or
    nothing is left after the repair.
    """
    from phasesweep.storage import verify as verify_store

    return verify_store(_maintained(store, sweep), sweep, repair=repair)


def compact(sweep: str | None = None, store: Store | str | Path | None = None) -> Report:
    """Merge the chunk files of one sweep, or of all, into few large ones per table
    (``phasesweep compact``); every query answers the same. Returns a report whose
    ``actions`` say what was merged (none: nothing to compact)."""
    from phasesweep.storage import compact as compact_store

    return compact_store(_maintained(store, sweep), sweep)


def _maintained(store: Store | str | Path | None, sweep: str | None) -> Store:
    """The existing store for ``verify`` or ``compact``, holding ``sweep`` (if given) as
    a spec or any file, damaged ones included (:class:`UnknownSweepError`); a bad sweep
    name is an argument error (:class:`SpecError`)."""
    from phasesweep.pipeline.spec import SpecError
    from phasesweep.storage._maintenance import known_sweeps
    from phasesweep.storage._store import check_sweep

    opened = open_store(store)
    if sweep is not None:
        try:
            check_sweep(sweep)
        except ValueError as e:
            raise SpecError("SWEEP", sweep, str(e), what="argument") from None
        known = known_sweeps(opened)
        if sweep not in known:
            raise UnknownSweepError(sweep, opened.uri, known)
    return opened


def standing_address() -> str | None:
    """``host:port`` of this user's standing local Ray if one runs, else None
    (``phasesweep standing status``). ``run(..., address="standing")`` starts it on
    demand; it stops itself after idling."""
    from phasesweep.pipeline.run._standing import address

    return address()


def stop_standing() -> bool:
    """Stop this user's standing local Ray and every process it started (``phasesweep
    standing stop``); False when none was running. Launches still connected to it lose
    their running trials: a relaunch trains what they lost."""
    from phasesweep.pipeline.run._standing import stop

    return stop()


# --- for the command line: what its commands need beyond the functions above -------------


def input_errors() -> tuple[type[Exception], ...]:
    """The exceptions that mean bad input (spec, argument, store, sweep name, a statement
    that is not read-only SQL): the CLI's one-line errors with exit code 2."""
    from phasesweep.pipeline.spec import SpecError
    from phasesweep.storage import ReadOnlyQueryError

    return (SpecError, StoreError, UnknownSweepError, ReadOnlyQueryError)


def failures() -> tuple[type[Exception], ...]:
    """The exceptions that mean work left undone for a reason the message names (damaged
    store files kept runs from being analyzed): the CLI's one-line errors with exit code 1."""
    from phasesweep.analysis._analyze import DamagedRunsError

    return (DamagedRunsError,)


@contextlib.contextmanager
def collect_damage() -> Iterator[dict[str, Damage]]:
    """The store files readers skip as damaged while the block runs (path -> its
    ``Damage``: ``path`` and ``reason``), collected instead of shown as
    ``DamagedFileWarning`` warnings; other warnings are shown as usual."""
    from phasesweep.storage import DamagedFileWarning

    skipped: dict[str, Damage] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("always", DamagedFileWarning)
        show = warnings.showwarning

        def collect(message, category, *args, **kwargs) -> None:  # noqa: ANN001
            if isinstance(message, DamagedFileWarning) and message.damage is not None:
                skipped[message.damage.path] = message.damage
            else:
                show(message, category, *args, **kwargs)

        warnings.showwarning = collect
        yield skipped


@dataclass
class Answer:
    """The answer to one SQL statement, and the damaged files it leaves out."""

    table: pa.Table
    #: damaged files of the tables the statement reads, which the answer skipped
    missing: list[Damage]


def answer(sql: str, store: Store | str | Path | None = None) -> Answer:
    """One read-only SQL statement over the store's views (``phasesweep query``): the
    Arrow table of :func:`arrow_table`, and the damaged files it skipped that it would have
    read (``storage._query.damage_read``: a damaged file of another table, or of a sweep
    its filters leave out, cannot change the answer)."""
    from phasesweep.storage import query_table
    from phasesweep.storage._query import damage_read

    opened = open_store(store)
    with collect_damage() as skipped:
        table = query_table(opened, sql)
    return Answer(table, damage_read(opened, sql, list(skipped.values())))


def disconnect_ray() -> None:
    """Leave Ray now if this process started or joined it (a private local Ray stops, a
    standing one or a cluster goes on), rather than in Ray's exit hook, which first waits
    half a second for worker logs a launch never shows."""
    from phasesweep.pipeline.run._ray import disconnect

    disconnect()
