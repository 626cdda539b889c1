"""Analysis at scale: ``.venv/bin/python -m benchmarks.scale_analysis [--runs N ...]``.

Time and peak memory of ``phasesweep analyze``, ``plot``, ``report``, ``status`` and
``query`` (``SELECT count(*)`` and the README's example queries) on a synthetic sweep of
10⁵ and 10⁶ runs (``scale_sweep_chunks`` of tests/calibration.py: closed-form loss
curves with every default metric, log-spaced logged steps, layers with singular values,
one file per table and 1024 runs, as a launch writes them). Each command runs as the
user runs it, in a process of its own; its peak RSS is that process's own
(``os.wait4``), its time the process's wall time, start-up and imports included.

The issue's targets (issue 24, item 5): every command within 2 GiB; ``analyze`` at
most 2 min, ``plot`` and ``report`` at most 30 s, at 10⁶ runs.

The store is built once per size under ``--workdir`` (default: a folder in the system's
temp directory) and kept for the next run; building 10⁶ runs takes minutes and about
1.5 GB of disk. Run it on an idle machine: every figure is a wall time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[1]
SWEEP = "scale"
GIB = 2**30

#: The targets of issue 24, item 5, at 10⁶ runs: seconds per command, and memory.
TARGET_SECONDS = {"analyze": 120.0, "plot": 30.0, "report": 30.0}
TARGET_RSS = 2 * GIB

#: ``phasesweep query`` statements measured: a count, and the README's examples.
QUERIES = {
    "query_count": "SELECT count(*) FROM runs",
    "query_status": "SELECT status, count(*) FROM runs GROUP BY ALL",
    "query_kernel_at_t": (
        "SELECT r.width, r.init_scale, avg(t.kernel_distance) AS kernel_distance "
        "FROM runs r JOIN trajectories t USING (sweep, run_id) "
        f"WHERE r.sweep = '{SWEEP}' AND t.time BETWEEN 9 AND 11 "
        "GROUP BY ALL ORDER BY r.init_scale, r.width"
    ),
}


def child(argv: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``argv`` in a process of its own: its exit code, wall and CPU seconds and peak memory
    (bytes): the largest sum of the resident sets of it and its descendants (``analyze``'s
    workers), sampled every 20 ms, and at least its own peak (``os.wait4``'s
    ``ru_maxrss``). Its output is kept in ``output`` (the last 2000 characters)."""
    import psutil

    with tempfile.TemporaryFile() as out:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        tree = psutil.Process(proc.pid)
        peak = 0
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            peak = max(peak, _tree_rss(tree))
            time.sleep(0.02)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read().decode(errors="replace")
    return {
        "rc": proc.returncode,
        "seconds": wall,
        "cpu_seconds": usage.ru_utime + usage.ru_stime,  # its descendants' included
        "peak_rss": max(peak, usage.ru_maxrss * 1024),
        "output": text[-2000:],
    }


def _tree_rss(proc) -> int:
    """Resident bytes of ``proc`` (a ``psutil.Process``) and its descendants now."""
    import psutil

    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):  # ended meanwhile
            total += p.memory_info().rss
    return total


def build_store(n_runs: int, workdir: Path, **options: Any) -> tuple[Path, int, float | None]:
    """The store of the scale sweep with ``n_runs`` runs under ``workdir``, built unless a
    complete one is there: ``(root, runs, build seconds or None when reused)``.
    ``options``: those of ``scale_sweep_chunks`` of tests/calibration.py."""
    sys.path.insert(0, str(ROOT))  # the synthetic sweeps are test data, not the package's
    from phasesweep.storage import Store

    from tests.calibration import scale_sweep_size, write_scale_sweep

    runs = scale_sweep_size(n_runs)[1]
    key = "-".join([str(runs), *(f"{k}{v}" for k, v in sorted(options.items()))])
    root = workdir / f"store-{key}"
    done = root / "BUILT"
    if done.exists():
        return root, runs, None
    if root.exists():
        import shutil

        shutil.rmtree(root)
    start = time.perf_counter()
    write_scale_sweep(Store.open(str(root)), SWEEP, n_runs, **options)
    seconds = time.perf_counter() - start
    done.write_text(f"{runs}\n")
    return root, runs, seconds


def commands(root: Path, out: Path) -> dict[str, list[str]]:
    """The measured command lines, in the order they run (``analyze`` first: ``plot``
    and ``report`` then draw from its tables)."""
    cli = [str(BIN / "phasesweep")]
    store = ["--store", str(root)]
    cmds = {
        "analyze": [*cli, "analyze", SWEEP, *store],
        "plot": [*cli, "plot", SWEEP, *store, "--out", str(out / "plot")],
        "report": [*cli, "report", SWEEP, *store, "--out", str(out / "report")],
        "status": [*cli, "status", SWEEP, *store],
    }
    for name, sql in QUERIES.items():
        cmds[name] = [*cli, "query", sql, *store]
    return cmds


def measure(n_runs: int, workdir: Path | str, **options: Any) -> dict[str, Any]:
    """Time and peak RSS of every command of :func:`commands` on the scale sweep of
    ``n_runs`` runs (built under ``workdir`` unless there): ``{"runs", "build_seconds",
    "store_bytes", "files", "commands": {name: {"seconds", "cpu_seconds", "MiB"}}}``
    (``MiB``: the peak memory of :func:`child`); ``store_bytes`` and ``files``: the chunk
    tables' (as a launch writes them). A command that fails raises ``RuntimeError``."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    root, runs, build = build_store(n_runs, workdir, **options)
    out = Path(tempfile.mkdtemp(dir=workdir, prefix="out-"))
    results = {}
    for name, argv in commands(root, out).items():
        res = child(argv)
        if res["rc"] != 0:
            raise RuntimeError(f"{name} exited {res['rc']}: {res['output']}")
        results[name] = {
            "seconds": res["seconds"],
            "cpu_seconds": res["cpu_seconds"],
            "MiB": res["peak_rss"] / 2**20,
        }
    files = [f for t in ("runs", "trajectories", "layers") for f in root.glob(f"{t}/*/*.parquet")]
    return {
        "runs": runs,
        "build_seconds": build,
        "store_bytes": sum(f.stat().st_size for f in files),
        "files": len(files),
        "commands": results,
    }


def table(results: list[dict[str, Any]]) -> str:
    """The results as a Markdown table, with the targets (judged at 10⁶ runs and more)."""
    lines = [
        "| runs | command | seconds | CPU seconds | peak RSS (MiB) | target |",
        "|---:|---|---:|---:|---:|---|",
    ]
    for res in results:
        for name, c in res["commands"].items():
            goal = []
            if name in TARGET_SECONDS:
                goal.append(f"≤ {TARGET_SECONDS[name]:.0f} s")
            goal.append(f"≤ {TARGET_RSS / 2**20:.0f} MiB")
            met = c["MiB"] * 2**20 <= TARGET_RSS and c["seconds"] <= TARGET_SECONDS.get(name, 1e30)
            judged = " (met)" if met else " (**missed**)"
            lines.append(
                f"| {res['runs']:,} | {name} | {c['seconds']:.1f} | {c['cpu_seconds']:.1f} | "
                f"{c['MiB']:.0f} | {', '.join(goal)}"
                f"{judged if res['runs'] >= 10**6 else ''} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, nargs="+", default=[10**5, 10**6])
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "ps-scale")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    results = [measure(n, args.workdir) for n in args.runs]
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
