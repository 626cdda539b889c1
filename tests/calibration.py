"""Loss curves with known answers, from closed forms (independent of the trainer).

They calibrate the detectors of ``analysis`` (tests, benchmarks/scale_analysis.py) and
build synthetic sweeps: stores whose curves are closed forms, with ``runs`` rows from the
pipeline's own row assembler (``pipeline/train/_runs.py``) over validated ``RunConfig``s,
as a launch writes them. Conventions are phasesweep's: loss ``1/(2n) Σ ||f(x) - y||²``,
gradient-flow time ``t``. Imported as ``calibration`` (tests/ is on the tests' path; the
benchmark puts it there).

- Whitened two-layer linear net, small balanced init: in the singular basis of
  the input-output correlation Σ_yx (singular values ``s_i``) every mode's
  strength ``u_i = a_i b_i`` follows ``du/dt = 2u(s - u)``, the logistic
  ``u(t) = s e^{2st} / (e^{2st} - 1 + s/u0)``; the loss is ``½ Σ (s_i - u_i)²``
  (Saxe et al.; seeds/004, Corollary after Theorem 4.1, for bias-free ReLU on
  symmetric data). With well-separated ``s_i`` and small ``u0`` it shows one
  plateau per mode, at the levels ``½ Σ_{j >= i} s_j²``, left near
  ``t_i ≈ log(s_i/u0) / (2 s_i)``.
- Whitened depth-L linear net, balanced init ``a_l = u0^(1/L)`` for every layer:
  ``du/dt = L u^(2 - 2/L) (s - u)``; its time course is tabulated by quadrature
  of ``t(u) = ∫ du / (L u^(2-2/L) (s - u))`` (exact up to quadrature error).
  For small ``u0 = α^L`` the escape takes ``t ∝ α^-(L-2)`` (L >= 3).
- Bias-free ReLU on the XOR-like data of seeds/004 (Fig. 4, points
  ``[0,1], [2,0], [0,-3], [-4,0]``, labels ±1): each point is fitted by its
  own set of neurons, i.e. by an independent one-dimensional two-layer linear
  net; point i (radius ``r_i``) is the logistic mode with rate ``2 r_i |y_i| / n``.
  Four drops, largest radius first; levels ½, 3/8, 1/4, 1/8.
- Lazy (kernel) training: ``Σ_k c_k e^{-2 λ_k t}``, log-convex, no plateau.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import yaml
from phasesweep.pipeline import Point, RunConfig, validate_spec
from phasesweep.pipeline.grid import iter_points
from phasesweep.pipeline.train._runs import runs_table
from phasesweep.storage import Store
from phasesweep.storage.schema import CROSSING_COLUMNS, CROSSING_FRACTIONS, log_steps, to_table
from scipy import integrate


def logged_times(lr: float, steps: int, log_points: int = 100) -> np.ndarray:
    """Gradient-flow times of the steps the trainer logs (``storage.schema.log_steps``: step 0
    and the last included) at constant ``lr``."""
    return log_steps(steps, log_points) * lr


def logistic_mode(t: np.ndarray, s: float, u0: float, rate: float | None = None) -> np.ndarray:
    """``u(t) = s e^{kt} / (e^{kt} - 1 + s/u0)`` with ``k = rate`` (default ``2s``)."""
    k = 2.0 * s if rate is None else rate
    e = np.exp(np.minimum(k * np.asarray(t, dtype=np.float64), 700.0))
    return s * e / (e - 1.0 + s / u0)


def two_layer_linear_loss(t: np.ndarray, s: Sequence[float], u0: float) -> np.ndarray:
    """Loss ``½ Σ (s_i - u_i(t))²`` of a whitened two-layer linear net (balanced init ``u0``)."""
    return 0.5 * sum((si - logistic_mode(t, si, u0)) ** 2 for si in s)


def two_layer_escape_time(s: float, u0: float, frac: float) -> float:
    """Exact time at which the mode of strength ``s`` reaches ``u = frac * s``."""
    return float(np.log(frac / (1.0 - frac) * (s / u0 - 1.0)) / (2.0 * s))


def deep_linear_mode(t: np.ndarray, s: float, u0: float, depth: int) -> np.ndarray:
    """``u(t)`` solving ``du/dt = L u^(2-2/L) (s - u)``, ``u(0) = u0 < s``, by quadrature."""
    t = np.asarray(t, dtype=np.float64)
    # Tabulate t(u) on a grid dense in log(u) and in log(s - u).
    lo = np.log(u0)
    grid_a = np.exp(np.linspace(lo, np.log(s / 2), 4000))
    grid_b = s - np.exp(np.linspace(np.log(s / 2), np.log(s * 1e-15), 4000))[1:]
    u = np.concatenate([grid_a, grid_b])
    power = 2.0 - 2.0 / depth

    # integrate in x = log u on the first half and in y = log(s - u) on the second.
    def rate_u(uu):
        return depth * uu**power * (s - uu)

    x = np.log(grid_a)
    f_a = grid_a / rate_u(grid_a)  # dt/dx
    t_a = integrate.cumulative_trapezoid(f_a, x, initial=0.0)
    w = s - np.concatenate([[grid_a[-1]], grid_b])
    y = np.log(w)
    f_b = -w / rate_u(s - w)  # dt/dy
    t_b = t_a[-1] + integrate.cumulative_trapezoid(f_b, y, initial=0.0)[1:]
    tt = np.concatenate([t_a, t_b])
    return np.interp(t, tt, u, left=u0, right=s)


def deep_linear_loss(
    t: np.ndarray, s: Sequence[float], u0: float | Sequence[float], depth: int
) -> np.ndarray:
    """Loss ``½ Σ (s_i - u_i(t))²`` of a whitened depth-L linear net, modes independent."""
    u0s = np.broadcast_to(np.asarray(u0, dtype=np.float64), (len(s),))
    if depth == 2:
        return 0.5 * sum((si - logistic_mode(t, si, ui)) ** 2 for si, ui in zip(s, u0s))
    return 0.5 * sum((si - deep_linear_mode(t, si, ui, depth)) ** 2 for si, ui in zip(s, u0s))


XOR_POINTS = np.array([[0.0, 1.0], [2.0, 0.0], [0.0, -3.0], [-4.0, 0.0]])
XOR_LABELS = np.array([1.0, -1.0, 1.0, -1.0])


def xor_relu_loss(
    t: np.ndarray,
    w_init: float = 1e-6,
    points: np.ndarray = XOR_POINTS,
    labels: np.ndarray = XOR_LABELS,
) -> np.ndarray:
    """Loss of a two-layer bias-free ReLU net on XOR-like data, as independent linear nets.

    Point i is fitted by ``f(x_i) = v_i(t)``, the logistic with ``v(0) = w_init²·r_i``
    (input weight and output weight both of size ``w_init``) and rate ``2 r_i |y_i| / n``,
    from ``d v/dt = (2 r_i / n) v (|y_i| - v)``.
    """
    n = len(labels)
    r = np.linalg.norm(points, axis=1)
    total = 0.0
    for ri, yi in zip(r, np.abs(labels)):
        v = logistic_mode(t, yi, w_init**2 * ri, rate=2.0 * ri * yi / n)
        total = total + (yi - v) ** 2
    return total / (2.0 * n)


def lazy_loss(t: np.ndarray, rates: Sequence[float], weights: Sequence[float]) -> np.ndarray:
    """Kernel-regime loss ``Σ_k c_k e^{-2 λ_k t}``."""
    t = np.asarray(t, dtype=np.float64)
    return sum(c * np.exp(-2.0 * lam * t) for lam, c in zip(rates, weights))


def synthetic_sweep(
    init_scales: Sequence[float] = tuple(np.logspace(-3, 0, 7)),
    widths: Sequence[int] = (16, 64, 256),
    depths: Sequence[int] = (2, 3),
    seeds: Sequence[int] = (0, 1, 2),
    noise_sigmas: Sequence[float] = (0.0,),
    singular_values: Sequence[float] = (2.0,),
    lr: float = 0.01,
    steps: int = 10**5,
    log_points: int = 100,
    diverge: Callable[[float, int], bool] | None = None,
    fail_first: bool = False,
) -> dict[str, pa.Table]:
    """``runs``, ``trajectories`` and ``layers`` of a sweep whose curves are closed forms.

    Every run is a whitened depth-L linear net (:func:`deep_linear_loss`) with
    balanced init ``u0 = min(α^L (1 + 0.1 seed), s_min / 2)``. Its order parameters
    are made up but monotone and known: final ``kernel_distance = 1 / (1 + α² width / 4)``,
    ``param_rel_change = 1 / (1 + α sqrt(width))``, both growing with the progress
    ``1 - L(t)/L0``; ``transversal_grad_sq`` ends at ``σ² / depth``. Layers carry
    top singular values ``u^(1/L)`` over a random bulk ``α (1, 0.5, 0.25)``.
    ``diverge(α, width)`` marks runs diverged (trajectory cut at a quarter of the
    steps with an infinite last loss); ``fail_first`` makes the first run failed.
    The tables have the store's schemas (``storage.schema``), for ``Store.write_chunk``.
    """
    t = logged_times(lr, steps, log_points)
    step = np.round(t / lr).astype(np.int64)
    points: list[Point] = []
    outcome: dict[str, list] = {
        k: []
        for k in (
            "status",
            "final_train_loss",
            "initial_train_loss",
            "final_step",
            "final_time",
            "error",
        )
    }
    traj: dict[str, list] = {
        k: []
        for k in (
            "run_id",
            "step",
            "time",
            "train_loss",
            "test_loss",
            "param_rel_change",
            "kernel_distance",
            "transversal_grad_sq",
        )
    }
    layers: dict[str, list] = {
        k: []
        for k in ("run_id", "step", "layer", "fro_norm", "rel_change", "top_sv", "delta_top_sv")
    }
    s = np.asarray(singular_values, dtype=np.float64)
    k = 0
    for depth in depths:
        for width in widths:
            for sigma in noise_sigmas:
                for alpha in init_scales:
                    for seed in seeds:
                        rid = f"r{k:06d}"
                        k += 1
                        failed = fail_first and k == 1
                        diverged = (not failed) and diverge is not None and diverge(alpha, width)
                        u0 = min(alpha**depth * (1 + 0.1 * seed), s.min() / 2)
                        loss = deep_linear_loss(t, s, u0, depth)
                        progress = np.clip(1 - loss / loss[0], 0, 1)
                        kd = progress / (1 + alpha**2 * width / 4)
                        prc = progress / (1 + alpha * np.sqrt(width))
                        tv = sigma**2 / depth * progress
                        n = len(t)
                        if diverged:
                            n = int(np.searchsorted(step, steps // 4)) + 1
                            loss = loss.copy()
                            loss[n - 1] = np.inf
                        status = "failed" if failed else "diverged" if diverged else "completed"
                        config = RunConfig.model_validate(
                            {
                                "model": {
                                    "depth": depth,
                                    "width": width,
                                    "init_scale": float(alpha),
                                    "activation": "linear",
                                    "bias": False,
                                    "parameterization": "standard",
                                },
                                "data": {"kind": "teacher", "noise_sigma": float(sigma)},
                                "train": {
                                    "lr": lr,
                                    "seed": int(seed),
                                    "steps": steps,
                                    "log_points": log_points,
                                },
                            }
                        )
                        points.append(Point(rid, config, {}))
                        for key, v in (
                            ("status", status),
                            ("final_train_loss", None if failed else float(loss[n - 1])),
                            ("initial_train_loss", None if failed else float(loss[0])),
                            ("final_step", None if failed else int(step[n - 1])),
                            ("final_time", None if failed else float(t[n - 1])),
                            ("error", "synthetic failure" if failed else None),
                        ):
                            outcome[key].append(v)
                        if failed:
                            continue
                        traj["run_id"] += [rid] * n
                        traj["step"] += step[:n].tolist()
                        traj["time"] += t[:n].tolist()
                        traj["train_loss"] += loss[:n].tolist()
                        traj["test_loss"] += (loss[:n] * 1.1).tolist()
                        traj["kernel_distance"] += kd[:n].tolist()
                        traj["param_rel_change"] += prc[:n].tolist()
                        traj["transversal_grad_sq"] += tv[:n].tolist()
                        u = np.clip(s[0] - np.sqrt(np.maximum(2 * loss[:n], 0)), 0, None)
                        u = np.nan_to_num(u, nan=0.0, posinf=0.0)
                        for layer in range(1, depth + 1):
                            lead = np.maximum(u, u0) ** (1.0 / depth)
                            bulk = alpha * np.array([1.0, 0.5, 0.25])
                            layers["run_id"] += [rid] * n
                            layers["step"] += step[:n].tolist()
                            layers["layer"] += [layer] * n
                            layers["fro_norm"] += np.sqrt(lead**2 + (bulk**2).sum()).tolist()
                            layers["rel_change"] += (lead / (alpha * 1.15)).tolist()
                            layers["top_sv"] += [
                                sorted([float(a + alpha), *bulk[1:].tolist()], reverse=True)
                                for a in lead
                            ]
                            layers["delta_top_sv"] += [
                                [float(a), float(a) * 1e-3, float(a) * 1e-4] for a in lead
                            ]
    runs = runs_table(points, "unassigned", None, outcome)
    # the tables may be split into chunks: Store.write_chunk sets chunk_id where it is NULL
    column = runs.schema.get_field_index("chunk_id")
    runs = runs.set_column(column, "chunk_id", pa.nulls(len(runs), pa.string()))
    return {
        "runs": runs,
        "trajectories": to_table("trajectories", traj),
        "layers": to_table("layers", layers),
    }


# --------------------------------------------------------------------------- scale sweeps

#: The grid of :func:`scale_sweep_chunks`, outermost axis first; the seed axis, innermost,
#: sets the size. A chunk holds runs of one (depth, width), as the pipeline packs shapes.
SCALE_DEPTHS = (2, 3)
SCALE_WIDTHS = (16, 64, 256, 1024)
SCALE_INIT_SCALES = tuple(float(a) for a in np.logspace(-3, 0, 16))
SCALE_POINTS_PER_SEED = len(SCALE_DEPTHS) * len(SCALE_WIDTHS) * len(SCALE_INIT_SCALES)
#: ``Σ_yx``'s singular values: two modes, so a small init shows two plateaus.
SCALE_SINGULAR_VALUES = (2.0, 0.5)
SCALE_LR = 0.05
#: every this many-th run (by grid index) failed: no trajectory, an error message.
SCALE_FAIL_EVERY = 9973
#: logged steps with singular values (``metrics.spectra_budget``): every this many-th.
SCALE_SPECTRA_EVERY = 10
#: singular values per list (``metrics.top_k``), and their init bulk relative to α.
SCALE_BULK = (1.0, 0.8, 0.6, 0.5, 0.4)


def scale_sweep_size(n_runs: int) -> tuple[int, int]:
    """(seeds, runs) of the smallest scale sweep with at least ``n_runs`` runs: whole
    seeds of :data:`SCALE_POINTS_PER_SEED` points each."""
    seeds = max(1, -(-int(n_runs) // SCALE_POINTS_PER_SEED))
    return seeds, seeds * SCALE_POINTS_PER_SEED


def scale_sweep_spec(sweep: str, n_runs: int, steps: int = 2000, log_points: int = 100) -> str:
    """The YAML spec of :func:`scale_sweep_chunks`' sweep (as a launch stores it)."""
    import yaml

    seeds, _ = scale_sweep_size(n_runs)
    spec = {
        "name": sweep,
        "description": "synthetic scale sweep: closed-form loss curves of whitened linear nets",
        "model": {"depth": 2, "width": 16, "activation": "linear", "bias": False},
        "data": {"kind": "teacher", "n_train": 64, "input_dim": 10},
        "train": {"lr": SCALE_LR, "steps": steps, "log_points": log_points},
        "grid": {
            "depth": list(SCALE_DEPTHS),
            "width": list(SCALE_WIDTHS),
            "init_scale": {"logspace": [-3, 0, len(SCALE_INIT_SCALES)]},
            "seed": {"range": [0, seeds]},
        },
    }
    return yaml.safe_dump(spec, sort_keys=False)


def scale_sweep_chunks(
    sweep: str,
    n_runs: int,
    *,
    runs_per_file: int = 1024,
    steps: int = 2000,
    log_points: int = 100,
) -> Iterator[tuple[str, dict[str, pa.Table]]]:
    """``(chunk_id, tables)`` of a synthetic sweep of ``scale_sweep_size(n_runs)[1]`` runs,
    one chunk at a time (memory bounded by one chunk), shaped as a launch writes them.

    The grid is depth × width × init scale α (:data:`SCALE_INIT_SCALES`) × seed; a chunk
    holds at most ``runs_per_file`` runs of one (depth, width), so the store gets a file
    per table and chunk, as from a launch. Every run logs the steps of ``log_points`` over
    ``steps`` steps at lr :data:`SCALE_LR`. Its train loss is the whitened two-layer linear
    net's closed form (:func:`two_layer_linear_loss`, modes :data:`SCALE_SINGULAR_VALUES`)
    from the balanced init ``u0 = min(α^depth (1 + 0.1 (seed mod 10)), s_min / 2)``: two
    plateaus at small α. The trainer's other default metrics are smooth made-up functions
    of the run's progress ``1 - L/L0`` (``kernel_distance = progress / (1 + α² width / 4)``,
    ``param_rel_change = progress / (1 + α sqrt(width))``, as :func:`synthetic_sweep`), NULL
    where the trainer leaves them NULL on teacher data. The largest α diverges at width
    1024 (half-way; its last loss is infinite); every :data:`SCALE_FAIL_EVERY`-th run failed
    (no trajectory). ``layers`` has top singular values at every
    :data:`SCALE_SPECTRA_EVERY`-th logged step and NULL at the others. The points, their
    run ids and configs are those of the grid of :func:`scale_sweep_spec` (as a launch of
    it expands them), and their ``runs`` rows come from ``pipeline.train._runs``.
    """
    seeds, _ = scale_sweep_size(n_runs)
    spec = validate_spec(yaml.safe_load(scale_sweep_spec(sweep, n_runs, steps, log_points)))
    points = iter_points(spec)  # in grid order: depth, width, init scale, seed (fastest)
    block = len(SCALE_INIT_SCALES) * seeds  # runs of one (depth, width)
    shapes = [(d, w) for d in SCALE_DEPTHS for w in SCALE_WIDTHS]
    for b, (depth, width) in enumerate(shapes):
        for lo in range(0, block, runs_per_file):
            local = np.arange(lo, min(lo + runs_per_file, block))
            chunk_id = f"d{depth}-w{width}-{lo // runs_per_file:05d}"
            chunk = list(itertools.islice(points, len(local)))
            largest = local // seeds == len(SCALE_INIT_SCALES) - 1  # the largest α
            yield chunk_id, _scale_chunk(chunk_id, chunk, b * block + local, largest)


def write_scale_sweep(store: Store, sweep: str, n_runs: int, **options) -> int:
    """Write the spec and every chunk of :func:`scale_sweep_chunks` into ``store`` (through
    ``Store.write_chunk``, as a launch commits them); returns the number of runs.
    ``options``: those of :func:`scale_sweep_chunks` (``steps`` and ``log_points`` also go
    into the spec)."""
    spec_keys = {k: options[k] for k in ("steps", "log_points") if k in options}
    store.write_spec(sweep, scale_sweep_spec(sweep, n_runs, **spec_keys))
    for chunk_id, tables in scale_sweep_chunks(sweep, n_runs, **options):
        store.write_chunk(sweep, chunk_id, tables)
    return scale_sweep_size(n_runs)[1]


def _scale_chunk(
    chunk_id: str, points: list[Point], index: np.ndarray, largest: np.ndarray
) -> dict[str, pa.Table]:
    """The tables of chunk ``chunk_id`` of :func:`scale_sweep_chunks`: grid points ``points``
    of one (depth, width), ``index`` their indices in the grid, ``largest`` whether their
    init scale is the grid's largest."""
    first = points[0].config
    depth, width = first.model.depth, first.model.width
    steps, log_points = first.train.steps, first.train.log_points
    logged = log_steps(steps, log_points)
    t = logged * SCALE_LR
    n, k = len(index), len(logged)
    alpha = np.array([p.config.model.init_scale for p in points])[:, None]  # (n, 1)
    seed = np.array([p.config.train.seed for p in points])
    failed = index % SCALE_FAIL_EVERY == SCALE_FAIL_EVERY - 1
    diverged = ~failed & largest & (width >= 1024)
    n_rows = np.where(failed, 0, np.where(diverged, k // 2, k))
    s = np.asarray(SCALE_SINGULAR_VALUES)
    u0 = np.minimum(alpha**depth * (1 + 0.1 * (seed % 10))[:, None], s.min() / 2)
    loss = two_layer_linear_loss(t[None, :], s, u0)  # (n, k)
    last = np.maximum(n_rows - 1, 0)
    loss[diverged, last[diverged]] = np.inf
    with np.errstate(invalid="ignore"):
        progress = np.nan_to_num(np.clip(1 - loss / loss[:, :1], 0, 1), nan=1.0)
    lazy = 1 / (1 + alpha**2 * width / 4)
    curves = {
        "step": np.broadcast_to(logged, (n, k)),
        "time": np.broadcast_to(t, (n, k)),
        "train_loss": loss,
        "test_loss": loss * 1.1 + 1e-3,
        "param_rel_change": progress / (1 + alpha * np.sqrt(width)),
        "kernel_distance": progress * lazy,
        "act_flip_frac": np.zeros((n, k)),
        "kernel_alignment": 0.3 + 0.6 * progress * lazy,
        "ntk_eig_min": alpha**2 * (1 + progress),
        "ntk_eig_max": alpha**2 * width * (1 + progress),
        "dead_frac": np.zeros((n, k)),
        "grad_norm": (1 - progress) * np.sqrt(progress + 1e-12),
        "param_norm": alpha * np.sqrt(width) * (1 + progress),
        "output_norm": progress,
        "kernel_rel_change": 2 * progress * lazy,
        "probe_test_loss": loss * 1.2,
        "lin_test_loss": loss[:, :1] * np.exp(-(alpha**2) * t),
        "lin_distance": progress * (1 - lazy),
    }
    keep = np.arange(k)[None, :] < n_rows[:, None]  # (n, k): the rows written
    row_run = np.nonzero(keep)[0]
    run_ids = pa.array([p.run_id for p in points], pa.string())
    traj = {"run_id": run_ids.take(pa.array(row_run)), **{c: v[keep] for c, v in curves.items()}}

    # layers: `depth` rows per logged row; singular values every SCALE_SPECTRA_EVERY-th step
    layer_row = np.repeat(np.arange(len(row_run)), depth)
    layer = np.tile(np.arange(1, depth + 1), len(row_run))
    lead = (progress * s[0] + u0)[keep][layer_row] ** (1 / depth)
    a = alpha[row_run[layer_row], 0]
    bulk = a[:, None] * np.asarray(SCALE_BULK)
    at_sv = (np.arange(k) % SCALE_SPECTRA_EVERY == 0) | (n_rows[:, None] - 1 == np.arange(k))
    sv_rows = at_sv[keep][layer_row]
    top = bulk.copy()
    top[:, 0] += lead
    top[~sv_rows] = np.nan
    delta = lead[:, None] * np.logspace(0, -4, len(SCALE_BULK))
    delta[~sv_rows] = np.nan
    fro = np.sqrt(lead**2 + (bulk**2).sum(1))
    layers = {
        "run_id": run_ids.take(pa.array(row_run[layer_row])),
        "step": traj["step"][layer_row],
        "layer": layer,
        "fro_norm": fro,
        "rel_change": lead / fro,
        "top_sv": top,
        "stable_rank": fro**2 / (bulk[:, 0] + lead) ** 2,
        "balance_defect": np.where(
            layer < depth, 1e-3 * SCALE_LR * traj["time"][layer_row], np.nan
        ),
        "delta_top_sv": delta,
    }

    final = loss[np.arange(n), last]
    status = np.where(failed, "failed", np.where(diverged, "diverged", "completed"))
    crossings = {}
    for c, f in zip(CROSSING_COLUMNS, CROSSING_FRACTIONS):
        below = keep & (loss < f * loss[:, :1])
        crossings[c] = np.where(below.any(1), t[np.argmax(below, axis=1)], np.nan)
    ok = ~failed
    outcome = {
        "status": status,
        "final_train_loss": np.where(ok, final, np.nan),
        "final_test_loss": np.where(ok, final * 1.1 + 1e-3, np.nan),
        "wall_seconds": np.full(n, 0.01),
        "device": ["cpu"] * n,
        "finished_at": [datetime(2026, 1, 1, tzinfo=timezone.utc)] * n,
        "input_dim": np.full(n, 10),
        "initial_train_loss": np.where(ok, loss[:, 0], np.nan),
        "final_step": pa.array(logged[last], pa.int64(), mask=failed),
        "final_time": np.where(ok, t[last], np.nan),
        "init_fro_norms": np.broadcast_to(alpha * np.sqrt(width), (n, depth)).copy(),
        **crossings,
        "chunk_size": np.full(n, n),
        "chunk_wall_seconds": np.full(n, 0.01 * n),
        "error": np.where(failed, "synthetic failure", None),
        "torch_threads": np.ones(n, dtype=np.int64),
    }
    return {
        "trajectories": to_table("trajectories", traj),
        "layers": to_table("layers", layers),
        "runs": runs_table(points, chunk_id, None, outcome),
    }
