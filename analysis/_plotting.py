"""``phasesweep plot``: every figure the sweep's spec asks for, from the store.

The spec's ``plots:`` list names the figures (see ``analysis.config.PlotSpec``);
without one, every registered kind (:mod:`analysis.figures`) that applies to the
swept axes is drawn. Unset fields of a plot are filled from the swept axes. Each
figure is written as ``NAME.png`` and ``NAME.svg``; a figure that cannot be drawn
is skipped with a one-line warning, the others are still written.

Entry points: :func:`plot` (the CLI's: a store in, paths out) and :func:`draw`
(the Python API's: one figure into a matplotlib ``Axes``, the ``Figure`` out).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd
from matplotlib import pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from phasesweep.analysis import figures
from phasesweep.analysis._output import prepare_dir
from phasesweep.analysis._phase import AXES
from phasesweep.analysis._style import save
from phasesweep.analysis.config import PlotSpec, StoredSweep, stored_sweep
from phasesweep.analysis.figures import Context, Unavailable
from phasesweep.analysis.figures._kind import Y_PREFERENCE, Levels
from phasesweep.storage import sql_condition
from phasesweep.storage._catalog import sql_string
from phasesweep.storage._store import as_store

from phasesweep._config import SpecError

log = logging.getLogger(__name__)


def swept_axes(levels: dict[str, Levels] | pd.DataFrame, spec: StoredSweep | None) -> list[str]:
    """The runs columns the sweep varies (not seed), in grid order when a spec is known;
    ``levels``: their :class:`Levels` (or a frame of the runs)."""
    if isinstance(levels, pd.DataFrame):
        varies = [a for a in levels if levels[a].nunique(dropna=True) > 1]
    else:
        varies = [a for a, level in levels.items() if level.varies]
    if spec is not None:
        axes = [a for a in spec.grid_axes if a in AXES and a != "seed" and a in varies]
        if axes:
            return axes
    return [a for a in ["init_scale", *Y_PREFERENCE] if a in varies]


def context(
    con: duckdb.DuckDBPyConnection, sweep: str, spec: StoredSweep | None, store=None
) -> Context:
    """The sweep as the figures see it: the range of each axis it may sweep (one aggregate
    over its runs); ``ValueError`` if it has none. ``store``: the ``storage.Store`` ``con``
    reads, if any."""
    have = set(con.sql("SELECT * FROM runs LIMIT 0").columns)
    fallback = ["init_scale", *Y_PREFERENCE]
    grid = [a for a in spec.grid_axes if a in AXES] if spec is not None else fallback
    count, levels = _levels(con, sweep, [a for a in dict.fromkeys([*grid, "seed"]) if a in have])
    if not count:
        raise ValueError(f"sweep {sweep!r} has no runs in the store")
    if not any(levels[a].varies for a in grid if a in levels and a != "seed"):
        levels |= _levels(con, sweep, [a for a in fallback if a in have and a not in levels])[1]
    return Context(con, sweep, spec, levels, swept_axes(levels, spec), store=store)


def _levels(con: duckdb.DuckDBPyConnection, sweep: str, cols: list[str]):
    """(runs of ``sweep``, the :class:`Levels` of each of the runs columns ``cols``)."""
    stats = "".join(f", min({a}), max({a})" for a in cols)
    row = con.execute(f"SELECT count(*){stats} FROM runs WHERE sweep = ?", [sweep]).fetchone()
    return row[0], {a: Levels(*row[1 + 2 * i : 3 + 2 * i]) for i, a in enumerate(cols)}


def default_plots(ctx: Context) -> list[PlotSpec]:
    """One figure per registered kind that applies to the sweep (see each kind's ``default``)."""
    return [p for k in figures.kinds() if (p := figures.get(k).default(ctx)) is not None]


def check(p: PlotSpec, index: int, ctx: Context | None = None) -> None:
    """Raise ``SpecError`` (key ``plots[i].FIELD``) for a plot that cannot be drawn: an
    unknown kind, axis or value, a ``where`` that is not one SQL condition
    (``storage.sql_condition``), or (given a sweep) one that does not bind."""
    key = f"plots[{index}]"
    try:
        kind = figures.get(p.kind)
    except KeyError as e:
        raise SpecError(f"{key}.kind", p.kind, str(e.args[0]).split("; ", 1)[1]) from None
    kind.check(p, key)
    if p.where:
        try:
            sql_condition(p.where)  # before any SQL holds it
        except ValueError as e:
            raise SpecError(f"{key}.where", p.where, str(e)) from None
    if p.where and ctx is not None:
        try:  # bound, not run: a relation is built lazily, a bad name fails here
            ctx.con.sql(
                f"SELECT run_id FROM runs WHERE sweep = {sql_string(ctx.sweep)} AND ({p.where})"
            )
        except duckdb.Error as e:
            raise SpecError(f"{key}.where", p.where, str(e).splitlines()[0]) from None


def check_plots(plots: Sequence[PlotSpec] | None) -> None:
    """Validate the kinds and fields of a spec's ``plots`` without a store (before a launch)."""
    for i, p in enumerate(plots or ()):
        check(p, i)


def plots_for(ctx: Context) -> list[PlotSpec]:
    """The resolved plots of the sweep (the spec's, else the defaults), checked."""
    spec = ctx.spec
    plots = list(spec.plots) if spec is not None and spec.plots is not None else default_plots(ctx)
    for i, p in enumerate(plots):
        check(p, i, ctx)
    resolved = [figures.get(p.kind).resolve(p, ctx) for p in plots]
    for i, p in enumerate(resolved):
        check(p, i, ctx)
    return resolved


@dataclass(frozen=True)
class Rendered:
    """A figure written by :func:`render_all`."""

    name: str
    spec: PlotSpec  # resolved
    paths: list[Path]  # NAME.png, NAME.svg
    sql: str | None = None  # the single query behind the figure, where there is one

    @property
    def caption(self) -> str:
        return figures.get(self.spec.kind).caption


def render_all(ctx: Context, out_dir: Path | str) -> list[Rendered]:
    """Draw every figure of the sweep into ``out_dir``; a figure that cannot be drawn is
    skipped with a one-line warning naming it and why. Bad ``plots:`` entries raise
    ``SpecError`` before anything is written.

    The next figure's query runs on a thread of its own while this one is drawn and saved
    (one query ahead, so one figure's frames wait at most): the queries are mostly DuckDB's
    and Arrow's work, which does not hold the GIL, the drawing matplotlib's (at 10⁶ runs
    the default figures' queries take 12 s, their drawing 8 s). The catalog connection is
    used by that thread alone meanwhile."""
    plots = plots_for(ctx)
    out = prepare_dir(out_dir)
    done: list[Rendered] = []
    used: set[str] = set()
    with ThreadPoolExecutor(1) as thread:
        for p, query in zip(plots, _one_ahead(thread, plots, ctx)):
            kind = figures.get(p.kind)
            name = base = kind.name(p)
            n = 2
            while name in used:
                name, n = f"{base}_{n}", n + 1
            used.add(name)
            try:
                fig = kind.draw(query.result(), p)
            except Unavailable as e:
                log.warning("figure %s (%s) of sweep %s skipped: %s", name, p.kind, ctx.sweep, e)
                continue
            except Exception as e:  # one figure failing must not lose the others
                first = (str(e).splitlines() or [""])[0][:200]
                log.warning(
                    "figure %s (%s) of sweep %s skipped: %s: %s",
                    name,
                    p.kind,
                    ctx.sweep,
                    type(e).__name__,
                    first,
                )
                plt.close("all")
                continue
            done.append(Rendered(name, p, save(fig, out, name), kind.sql(p, ctx)))
    return done


def _one_ahead(thread: Executor, plots: Sequence[PlotSpec], ctx: Context) -> Iterator[Future]:
    """The future of each plot's query, in order; the next plot's query is submitted
    before this one's future is handed out."""
    pending: Future | None = None
    for p in plots:
        submitted = thread.submit(figures.get(p.kind).query, p, ctx)
        if pending is not None:
            yield pending
        pending = submitted
    if pending is not None:
        yield pending


def default_out_dir(store, sweep: str) -> Path:
    """Where figures go without ``--out``: ``STORE/figures/SWEEP`` for a local store,
    ``./figures/SWEEP`` for an object store (copied into the store too, see :func:`plot`)."""
    local = store.local_path(f"figures/{sweep}")
    return Path(local) if local is not None else Path("figures") / sweep


@contextmanager
def open_sweep(store, sweep: str) -> Iterator[Context]:
    """The sweep's :class:`Context` over one catalog connection, analyzing first the runs
    that have no current summary (new points, points trained again after a repair, an
    extended grid: ``analyze(..., unanalyzed=True)``; the connection is then reopened once,
    to see the new tables). Damage that keeps runs from being analyzed stops it
    (:class:`analysis._analyze.DamagedRunsError` names the files and what to do)."""
    from phasesweep.analysis._analyze import analyze
    from phasesweep.storage import open_catalog
    from phasesweep.storage._catalog import UNANALYZED_SQL

    text = store.read_spec(sweep)
    spec = stored_sweep(text, sweep)
    con = open_catalog(store)
    try:
        (n,) = con.execute(f"SELECT count(*) FROM ({UNANALYZED_SQL})", {"sweep": sweep}).fetchone()
        if n:
            con.close()
            analyze(store, sweep, unanalyzed=True)
            con = open_catalog(store)
        ctx = context(con, sweep, spec, store)
        ctx.spec_text = text
        yield ctx
    finally:
        con.close()


def upload(store, sweep: str, paths: list[Path]) -> None:
    """Copy ``paths`` into ``STORE/figures/SWEEP/`` (object stores)."""
    for p in paths:
        store.upload(str(p), f"figures/{sweep}/{p.name}")


def plot(store, sweep: str, out_dir: Path | str | None = None) -> list[Path]:
    """Regenerate every figure of ``sweep``; returns the PNG and SVG paths written.

    ``store``: a ``storage.Store`` or URI. Runs ``analyze`` first if the sweep has
    no summaries yet. Without ``out_dir`` the figures go to :func:`default_out_dir`;
    for an object store they are also uploaded to ``STORE/figures/SWEEP/``. A
    figure that cannot be drawn is skipped with a warning. ``out_dir`` that is a
    file or a symbolic link (or holds one at a figure's name) raises
    :class:`analysis._output.OutputError` and nothing is written there.
    """
    store = as_store(store)
    out = Path(out_dir) if out_dir is not None else default_out_dir(store, sweep)
    prepare_dir(out, create=False)
    with open_sweep(store, sweep) as ctx:
        done = render_all(ctx, out)
    paths = [p for r in done for p in r.paths]
    if out_dir is None and store.local_path("figures") is None:
        upload(store, sweep, paths)
    return paths


def draw(
    kind: str,
    source: Any,
    sweep: str,
    ax: Axes | None = None,
    **options: Any,
) -> Figure:
    """Draw one figure of ``sweep`` in the place of ``ax`` (or as a new figure) and return
    the ``Figure``.

    ``kind``: a registered figure kind (:func:`analysis.figures.kinds`);
    ``source``: a ``storage.Store``, a store URI, or an open catalog connection
    (``storage.open_catalog``; its sweep must be analyzed, or figures that need the
    summaries are unavailable); ``options``: fields of a ``plots:`` entry (``x``,
    ``y``, ``value``, ``hue``, ``facet``, ``where``, ``title``), unset ones chosen
    from the swept axes as ``plot`` does. With ``ax`` (a subplot), the figure becomes a
    subfigure in ``ax``'s place (``ax`` is removed; its panels, title, colour bar and
    legend are ``fig.subfigs[-1]``'s), so several figures share one figure without
    overlapping; a figure without a layout engine gets the constrained layout.
    Raises :class:`analysis.figures.Unavailable` (with the reason) when the sweep has
    nothing to draw, ``SpecError`` for bad options.
    """
    try:
        p = PlotSpec(kind=kind, **options)
    except Exception as e:
        raise SpecError("options", options, str(e).splitlines()[0], what="argument") from None
    check(p, 0)
    if isinstance(source, duckdb.DuckDBPyConnection):
        ctx = context(source, sweep, None)
        return _draw_one(p, ctx, ax)
    store = as_store(source)
    with open_sweep(store, sweep) as ctx:
        return _draw_one(p, ctx, ax)


def _draw_one(p: PlotSpec, ctx: Context, ax: Axes | None) -> Figure:
    kind = figures.get(p.kind)
    check(p, 0, ctx)
    p = kind.resolve(p, ctx)
    return kind.draw(kind.query(p, ctx), p, ax)
