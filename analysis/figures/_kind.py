"""What every figure kind is made of, and the helpers they share.

A kind (one module of this package each) is a :class:`FigureKind`: it says when it
is among a sweep's default figures, fills the unset fields of its ``PlotSpec`` from
the swept axes (:meth:`~FigureKind.resolve`), loads its frames from the catalog
(:meth:`~FigureKind.query`) and draws them (:meth:`~FigureKind.draw`), and carries
its caption for the report. A figure that cannot be drawn raises
:class:`Unavailable` with a one-line reason.
"""

from __future__ import annotations

import textwrap
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import pyarrow as pa
from matplotlib import pyplot as plt
from matplotlib import ticker as mticker
from matplotlib.axes import Axes
from matplotlib.figure import Figure, FigureBase
from phasesweep.analysis import _style as style
from phasesweep.analysis._phase import AXES
from phasesweep.analysis.config import AnalysisConfig, PlotSpec, StoredSweep
from phasesweep.storage import sql_condition
from phasesweep.storage._catalog import sql_string

from phasesweep._config import SpecError

#: swept axes that may serve as second axis / hue / facet, in order of preference.
Y_PREFERENCE = ("width", "depth", "noise_sigma", "lr", "n_train", "activation", "leaky_slope")


class Unavailable(Exception):
    """This figure cannot be drawn from this sweep's data; ``str(e)`` says why, in one line."""


@dataclass(frozen=True)
class Levels:
    """The values a ``runs`` column takes in a sweep: the smallest and the largest (None
    where it is NULL in every run)."""

    low: Any
    high: Any

    @property
    def varies(self) -> bool:
        """Whether the column takes more than one value (NULL aside)."""
        return self.low is not None and self.low != self.high


@dataclass
class Context:
    """One sweep as the figures see it: an open catalog, the stored spec, its runs' axes.

    Built once per ``plot``/``report`` call (:func:`analysis._plotting.context`) and
    passed to every figure, so the catalog is opened and the spec loaded once.
    ``levels``: the values of every runs axis (:data:`analysis._phase.AXES`) in the sweep;
    ``axes``: the swept ones besides the seed, in grid order. Nothing here grows with the
    number of runs: figures aggregate in SQL and draw bounded samples (:meth:`sample`).
    """

    con: Any  # duckdb.DuckDBPyConnection
    sweep: str
    spec: StoredSweep | None
    levels: dict[str, Levels]
    axes: list[str]
    #: the spec as stored (YAML text), where the context was made from a store.
    spec_text: str | None = None
    #: the store (a ``storage.Store``), where the context was made from one: chunk rows of
    #: given runs are then read from their attempts' files (:meth:`chunk_rows`).
    store: Any = None
    _counts: dict[str, int] = field(default_factory=dict, repr=False)
    _files: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def cfg(self) -> AnalysisConfig:
        return self.spec.analysis if self.spec is not None else AnalysisConfig()

    def count(self, sql: str) -> int:
        """``SELECT count(*) ... WHERE sweep = ? AND ...`` for this sweep, memoised by ``sql``."""
        if sql not in self._counts:
            self._counts[sql] = int(self.con.execute(sql, [self.sweep]).fetchone()[0])
        return self._counts[sql]

    def df(self, sql: str, params: list | None = None) -> pd.DataFrame:
        """Rows of ``sql``; its first ``?`` is this sweep, then ``params``."""
        return self.con.execute(sql, [self.sweep, *(params or [])]).df()

    def chunk_rows(self, table: str, runs: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
        """``run_id`` and ``columns`` of the rows of chunk table ``table`` (``trajectories``,
        ``layers``) that belong to ``runs`` (``run_id``, ``attempt``: rows of the ``runs``
        view), in no particular order. With a store, only their attempts' files are read
        (``storage._catalog.ChunkFiles``, listed once per table); else the catalog's view."""
        wanted = ["run_id", *columns]
        if self.store is None:
            cols = ", ".join(f'"{c}"' for c in wanted)
            return self.df(
                f"SELECT {cols} FROM {table} WHERE sweep = ? "
                "AND run_id IN (SELECT unnest(?::VARCHAR[]))",
                [runs["run_id"].tolist()],
            )
        from phasesweep.storage._catalog import ChunkFiles

        if table not in self._files:
            paths = self.store.readable_files(table, self.sweep)
            self._files[table] = ChunkFiles(self.store, table, paths)
        keys = pa.table({c: pa.array(runs[c].tolist(), pa.string()) for c in ("run_id", "attempt")})
        return self._files[table].rows(keys, wanted).to_pandas()

    def any_value(self, table: str, column: str) -> bool:
        """Whether ``column`` of chunk table ``table`` holds a value (not NULL) for some run
        of the sweep. With a store, from the files' footers (the null count of each row
        group; a file without statistics is read); else one query of the view. (A file
        of an attempt that never committed counts too: a spec's metrics are the same for
        every chunk.)"""
        if self.store is None:
            found = f"SELECT 1 FROM {table} WHERE sweep = ? AND {column} IS NOT NULL LIMIT 1"
            return bool(self.count(f"SELECT count(*) FROM ({found})"))
        import pyarrow.parquet as pq

        fs = self.store.arrow_fs
        for path in self.store.readable_files(table, self.sweep):
            meta = pq.read_metadata(path, filesystem=fs)
            leaves = [
                i
                for i in range(meta.num_columns)
                if meta.schema.column(i).path.split(".")[0] == column
            ]
            for g in range(meta.num_row_groups):
                for i in leaves:
                    chunk = meta.row_group(g).column(i)
                    stats = chunk.statistics
                    if stats is None or not stats.has_null_count:
                        values = pq.read_table(path, columns=[column], filesystem=fs)[column]
                        if values.null_count < len(values):
                            return True
                    elif stats.null_count < chunk.num_values:
                        return True
        return False

    @contextmanager
    def materialized(self, select: str, params: list | None = None) -> Iterator[str]:
        """The name of a temporary table of the rows of ``select`` (its first ``?`` is this
        sweep, then ``params``), dropped after the block: for a figure that reads one
        selection twice (an aggregate and a sample), so that the views (``runs``: one
        window over every run) are evaluated once."""
        name = f"_figure_rows_{uuid.uuid4().hex[:12]}"
        self.con.execute(f"CREATE TEMP TABLE {name} AS {select}", [self.sweep, *(params or [])])
        try:
            yield name
        finally:
            self.con.execute(f"DROP TABLE IF EXISTS {name}")

    def sample(
        self, select: str, strata: list[str | None], limit: int, params: list | None = None
    ) -> tuple[pd.DataFrame, int]:
        """A sample of at most about ``limit`` rows of ``select`` (SQL with a ``run_id``
        column and the ``strata`` columns; ``params``: its parameters), and how many rows it
        has. The same rows every time (the smallest ``hash(run_id)``), spread evenly over
        the values of ``strata[0]`` (each keeps ``limit / values`` rows, at least one) and,
        within each, taken in turn from the values of ``strata[1:]`` (None entries are left
        out; column names of ``select``'s rows, unquoted)."""
        strata = list(dict.fromkeys(c for c in strata if c))
        outer, inner = _partition(strata[:1]), _partition(strata)
        first = strata[0] if strata else "1"
        rows = self.con.execute(
            f"WITH sel AS MATERIALIZED (SELECT *, hash(run_id) AS _h FROM ({select})), "
            f"n AS (SELECT count(*) AS _total, greatest(count(DISTINCT {first}), 1) AS _groups "
            "FROM sel), "
            f"ranked AS (SELECT *, row_number() OVER ({inner}ORDER BY _h, run_id) AS _k "
            "FROM sel), "
            f"spread AS (SELECT *, row_number() OVER ({outer}ORDER BY _k, _h, run_id) AS _j "
            "FROM ranked) "
            "SELECT spread.* EXCLUDE (_h, _k, _j), n._total FROM spread, n "
            "WHERE _j <= greatest(1, ? // n._groups) ORDER BY run_id",
            [*(params or []), int(limit)],
        ).df()
        total = int(rows["_total"].iloc[0]) if len(rows) else 0
        return rows.drop(columns="_total"), total


def _partition(columns: list[str]) -> str:
    return f"PARTITION BY {', '.join(columns)} " if columns else ""


class FigureKind:
    """One kind of figure. Subclasses set ``kind``, ``caption``, ``order`` and override
    :meth:`query` and :meth:`draw` (and :meth:`default`, :meth:`resolve` as needed)."""

    #: the ``kind:`` of a ``plots:`` entry.
    kind: ClassVar[str]
    #: the report's caption: how to read the figure.
    caption: ClassVar[str] = ""
    #: position among the default figures (smaller first).
    order: ClassVar[int] = 100
    #: PlotSpec fields this kind reads; others given in a spec are errors.
    fields: ClassVar[tuple[str, ...]] = ("where", "name", "title")

    def default(self, ctx: Context) -> PlotSpec | None:
        """This kind's entry among the default figures of ``ctx``'s sweep, or None."""
        return None

    def resolve(self, p: PlotSpec, ctx: Context) -> PlotSpec:
        """``p`` with its unset fields chosen from the swept axes."""
        return p

    def check(self, p: PlotSpec, key: str) -> None:
        """Raise ``SpecError`` (``key.FIELD``) for a field this kind cannot draw."""
        for name in ("x", "y", "facet", "hue"):
            v = getattr(p, name)
            if v is not None and v not in AXES:
                raise SpecError(f"{key}.{name}", v, f"not a runs axis; known: {', '.join(AXES)}")
        for name in ("x", "y", "value", "hue", "facet"):
            if getattr(p, name) is not None and name not in self.fields:
                raise SpecError(f"{key}.{name}", getattr(p, name), f"not used by {self.kind}")

    def name(self, p: PlotSpec) -> str:
        """File name stem of the figure."""
        return p.name or self.kind

    def sql(self, p: PlotSpec, ctx: Context) -> str | None:
        """The single query behind the figure, where there is one (shown in the report)."""
        return None

    def query(self, p: PlotSpec, ctx: Context) -> Any:
        """The frames :meth:`draw` needs (raises :class:`Unavailable` if there are none)."""
        raise NotImplementedError

    def draw(self, data: Any, p: PlotSpec, ax: Axes | None = None) -> Figure:
        """Draw ``data`` (from :meth:`query`) into ``ax``'s place, or a new figure."""
        raise NotImplementedError


# --------------------------------------------------------------------------- resolving


def py(v: Any) -> Any:
    """A numpy scalar as a Python one (for SQL literals)."""
    return v.item() if hasattr(v, "item") else v


def literal(v: Any) -> str:
    """``v`` as an SQL literal."""
    v = py(v)
    return sql_string(v) if isinstance(v, str) else repr(v)


def fixed_where(ctx: Context, free: set[str], where: str | None = None) -> str | None:
    """A condition fixing every swept axis not in ``free`` (and the seed unless free) to one
    value, joined with the user's ``where``. Axes the user's ``where`` names stay as given."""
    if where is not None:
        return where
    conds = []
    seed = ctx.levels.get("seed")
    if "seed" not in free and seed is not None and seed.low is not None:
        conds.append(f"seed = {int(seed.low)}")
    for a in ctx.axes:
        level = ctx.levels.get(a)
        if a in free or level is None or level.low is None:
            continue
        v = level.high if a in ("width", "n_train") else level.low
        conds.append(f"{a} = {literal(v)}")
    return " AND ".join(conds) or None


def first_free(ctx: Context, prefer: tuple[str, ...], taken: set[str], where: str | None):
    """The first swept axis of ``prefer`` (then of the swept axes) not in ``taken`` and not
    named by the user's ``where``; None if every swept axis is taken."""
    for a in (*prefer, *ctx.axes):
        if a in ctx.axes and a not in taken and not (where and a in where):
            return a
    return None


def selected_runs(where: str | None) -> str:
    """A subquery of the sweep's ``runs`` rows matching ``where`` (its one ``?`` is the
    sweep): a relation to join, in which ``where`` reads the runs' own columns."""
    cond = f" AND ({sql_condition(where)})" if where else ""
    return f"(SELECT * FROM runs WHERE sweep = ?{cond})"


def subtitle(where: str | None) -> str:
    return f" [{where}]" if where else ""


def sample_note(shown: int, total: int) -> str:
    """What a figure that draws a sample of its runs adds to its title ("" if it draws all)."""
    return f" — {shown:,} of {total:,} runs shown (a fixed sample)" if shown < total else ""


# --------------------------------------------------------------------------- drawing


def wrap(text: str, width_in: float, size: float = 12) -> str:
    """``text`` wrapped to fit a figure ``width_in`` inches wide at font ``size``."""
    chars = max(int(width_in * 72 / (0.55 * size)), 20)
    return "\n".join(textwrap.wrap(text, chars))


def grid_shape(n: int, max_cols: int = 3) -> tuple[int, int]:
    """(rows, columns) of a grid of ``n`` panels, at most ``max_cols`` wide, with the fewest
    empty cells (the widest such grid): 4 panels of at most 3 columns are 2 x 2, 5 are 2 x 3."""
    n = max(n, 1)
    if n <= max_cols:
        return 1, n
    widths = range(max_cols, (max_cols + 1) // 2 - 1, -1)
    cols = min(widths, key=lambda c: -(-n // c) * c - n)
    return -(-n // cols), cols


def canvas(
    ax: Axes | None, nrows: int, ncols: int, figsize: tuple[float, float], **subplot_kw
) -> tuple[FigureBase, np.ndarray]:
    """A (nrows, ncols) array of panels: in a new figure of ``figsize``, or in a subfigure
    that takes the place of ``ax`` (which is removed).

    A subfigure is a figure of its own inside the caller's: its title, colour bar and
    legend stay inside ``ax``'s place instead of running over the caller's other panels.
    A caller's figure without a layout engine gets matplotlib's constrained layout (the
    one that keeps labels, colour bars and outside legends apart)."""
    if ax is None:
        fig, axes = plt.subplots(
            nrows, ncols, figsize=figsize, squeeze=False, layout="constrained", **subplot_kw
        )
        return fig, axes
    spec = ax.get_subplotspec()
    if spec is None:
        raise ValueError("ax must be a subplot (made by subplots or add_subplot) to draw into")
    root = ax.get_figure(root=True)
    if root.get_layout_engine() is None:
        root.set_layout_engine("constrained")
    parent = ax.get_figure(root=False)
    ax.remove()
    sub = parent.add_subfigure(spec)
    return sub, sub.subplots(nrows, ncols, squeeze=False, **subplot_kw)


def hide_unused(axes: np.ndarray, used: int) -> None:
    """Hide the panels after the first ``used`` (a grid bigger than the facets)."""
    flat = axes.ravel()
    for a in flat[used:]:
        a.set_visible(False)


def width_in(fig: FigureBase) -> float:
    """Width of a figure or subfigure in inches."""
    return fig.bbox.width / fig.dpi


def legend_columns(handles: list, width: float, most: int) -> int:
    """How many legend columns (at most ``most``) fit ``width`` inches at the legend's
    font size: a legend wider than its figure is cut off at the edges."""
    size = plt.rcParams["legend.fontsize"]
    size = size if isinstance(size, int | float) else 9.0
    longest = max((len(h.get_label()) for h in handles), default=1)
    column = (longest * 0.55 * size + 45) / 72  # characters, the handle and the gap
    return max(1, min(most, int(width // column), len(handles)))


def finish(
    fig: FigureBase,
    axes: np.ndarray,
    title: str,
    handles: list | None = None,
    legend_kw: dict | None = None,
    *,
    xlabel: str | None = None,
    ylabel: str | None = None,
) -> Figure:
    """Title, legend (below the panels), ``xlabel`` under each column and ``ylabel`` (one
    for a grid of panels); returns the root figure. The same in a figure of its own
    and in a subfigure in a caller's figure (see :func:`canvas`)."""
    handles = handles or []
    legend_kw = dict(frameon=False, **(legend_kw or {}))
    own = fig is fig.get_figure(root=True)
    width = width_in(fig)
    if handles:
        legend_kw["ncols"] = legend_columns(handles, width, legend_kw.get("ncols", 1))
        legend_kw.setdefault("loc", "outside lower center")
        fig.legend(handles=handles, **legend_kw)
    visible = [a for a in axes.ravel() if a.get_visible()]
    if xlabel:  # under the lowest panel of each column (a figure-wide one would meet the legend)
        for column in axes.T:
            shown = [a for a in column if a.get_visible()]
            if shown:
                shown[-1].set_xlabel(xlabel)
    if ylabel and len(visible) == 1:
        visible[0].set_ylabel(ylabel)
    elif ylabel:
        fig.supylabel(ylabel, fontsize=plt.rcParams["axes.labelsize"])
    size = 15 if own else 12
    fig.suptitle(wrap(title, width, size=size), fontsize=size)
    return fig.get_figure(root=True)


def plain_log_labels(ax: Axes, axis: str = "y") -> None:
    """Plain numbers (0.2, 0.5) on a log ``axis`` spanning less than a decade, where the
    default labels only the powers of ten (often none)."""
    lo, hi = ax.get_ylim() if axis == "y" else ax.get_xlim()
    if lo > 0 and hi / lo < 10:
        target = ax.yaxis if axis == "y" else ax.xaxis
        target.set_major_formatter(mticker.FormatStrFormatter("%.3g"))
        target.set_minor_formatter(mticker.FormatStrFormatter("%.2g"))


def log_ok(values) -> bool:
    """Whether ``values`` (finite ones) are all positive, so a log axis shows them all."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    return len(v) > 0 and bool((v > 0).all())


def spans_decades(values, decades: float = 2.0) -> bool:
    """Whether the positive finite ``values`` span more than ``decades`` decades."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v) & (v > 0)]
    return len(v) > 1 and float(np.log10(v.max() / v.min())) > decades


def hue_colors(values) -> dict:
    """One categorical colour per distinct value, in sorted order."""
    vals = sorted(pd.unique(pd.Series(values).dropna()), key=_sort_key)
    return dict(zip(vals, style.palette(max(len(vals), 1))))


def _sort_key(v):
    return (0, float(v), "") if isinstance(v, (int, float, np.number)) else (1, 0.0, str(v))


def sorted_values(values) -> list:
    """The distinct non-NULL values, numbers before strings, each sorted."""
    return sorted(pd.unique(pd.Series(values).dropna()), key=_sort_key)
