"""One look for every phasesweep figure: seaborn theme, labels with units, saving.

Importing this module selects matplotlib's non-interactive Agg backend, so
figures render on headless machines and in Ray workers, unless a backend was chosen
through ``$MPLBACKEND`` (as Jupyter kernels do: a notebook keeps showing figures inline).
"""

from __future__ import annotations

import io
import os
from contextlib import contextmanager
from pathlib import Path

import matplotlib

if not os.environ.get("MPLBACKEND"):
    matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.transforms import Bbox  # noqa: E402
from phasesweep.storage.schema import COLUMNS  # noqa: E402

#: Axis labels, with what the quantity is and its unit (most are dimensionless ratios): the
#: ``label`` of the store columns that figures show (``storage.schema.Column``).
LABELS: dict[str, str] = {
    c.name: c.label
    for table in ("runs", "trajectories", "summaries")
    for c in COLUMNS[table]
    if c.label
}

#: Axes drawn on a log scale when their values are all positive.
LOG_AXES = {"init_scale", "width", "lr", "n_train", "time", "escape_time", "noise_sigma"}

SEQUENTIAL = "viridis"
DIVERGED_COLOR = "#b0b0b0"
NOT_CONVERGED_COLOR = "#e377c2"


def label(name: str) -> str:
    return LABELS.get(name, name.replace("_", " "))


def short_label(name: str) -> str:
    """The label without its parenthesised explanation (legends, titles)."""
    return label(name).split("  (")[0]


def fmt(v) -> str:
    """A compact tick label for an axis value (1e-3, 0.032, 256, relu)."""
    if isinstance(v, (str, bytes)) or v is None:
        return str(v)
    v = float(v)
    if not np.isfinite(v):
        return str(v)
    if v == int(v) and abs(v) < 1e5:
        return str(int(v))
    if v != 0 and (abs(v) < 1e-2 or abs(v) >= 1e4):
        m, e = f"{v:.1e}".split("e")
        m = m.rstrip("0").rstrip(".")
        return f"{m}e{int(e)}"
    return f"{v:.2g}"


@contextmanager
def theme():
    """The phasesweep style, for the duration of a ``with`` block."""
    rc = {
        "figure.dpi": 110,
        "savefig.dpi": 150,
        "savefig.bbox": "tight",
        "axes.titlesize": 12,
        "axes.labelsize": 11,
        "legend.fontsize": 9,
        "legend.title_fontsize": 10,
        "xtick.labelsize": 9,
        "ytick.labelsize": 9,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "svg.fonttype": "none",
        "font.family": "DejaVu Sans",
    }
    import seaborn as sns  # 1 s (it imports scipy.stats): only drawing needs it, not `run`

    with sns.axes_style("ticks"), sns.plotting_context("notebook"), plt.rc_context(rc):
        yield


def palette(n: int) -> list:
    """Categorical colours for n groups (depths, widths, ...)."""
    import seaborn as sns

    return sns.color_palette("colorblind" if n <= 10 else "husl", n)


def save(fig: plt.Figure, out_dir: Path | str, name: str) -> list[Path]:
    """Write ``NAME.png`` and ``NAME.svg`` into ``out_dir``; close the figure; return the paths.

    Each file is written atomically and never through a symbolic link
    (:mod:`analysis._output`).
    """
    from phasesweep.analysis._output import prepare_dir, write_file

    out = prepare_dir(out_dir)
    paths = []
    try:
        box = _freeze_layout(fig)
        for ext in ("png", "svg"):
            buf = io.BytesIO()
            metadata = {"Date": None} if ext == "svg" else None
            fig.savefig(buf, format=ext, bbox_inches=box, metadata=metadata)
            paths.append(write_file(out, f"{name}.{ext}", buf.getvalue()))
    finally:
        plt.close(fig)
    return paths


def _freeze_layout(fig: plt.Figure) -> Bbox | None:
    """Lay ``fig`` out once and keep that layout; the box ``savefig`` would crop to (a
    ``Bbox`` in inches, padded by ``savefig.pad_inches``) where ``savefig.bbox`` is
    ``"tight"``, else None.

    ``savefig`` runs the figure's layout engine (and, for a tight box, measures every
    artist) again for each format, a third of the time a two-format save takes; with the
    layout kept and the box given, each format draws once. Both formats then share the
    layout measured at the PNG's dpi (the PNG is ``savefig``'s, pixel for pixel), where
    ``savefig`` lays the SVG out at 72 dpi: its axes move by a few points.
    """
    shown, dpi = fig.dpi, plt.rcParams["savefig.dpi"]
    fig.set_dpi(shown if dpi == "figure" else dpi)
    try:
        fig.draw_without_rendering()
        box = fig.get_tightbbox() if plt.rcParams["savefig.bbox"] == "tight" else None
    finally:
        fig.set_dpi(shown)
    fig.set_layout_engine("none")
    return box and box.padded(plt.rcParams["savefig.pad_inches"])
