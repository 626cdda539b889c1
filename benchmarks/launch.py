"""A launch's fixed cost: ``.venv/bin/python -m benchmarks.launch [--quick]``.

What a user waits for beyond training when ``phasesweep run`` trains almost nothing:
Python and its imports, starting (or joining) Ray, Tune's trials starting (each
actor imports torch), the commit, shutdown. The unit is the baseline the issue
names, measured side by side in the same run: ``python -c "import torch, ray,
pyarrow, duckdb"``.

Each sample is a fresh process. One repeat takes, in this order:

- **import**: the baseline above;
- **embedded**: ``phasesweep run`` of a tiny sweep (25 points, 10 steps, two chunks:
  two Tune trials) into a fresh store: the default, a private Ray started and stopped
  by the launch;
- **embedded, again**: the same command right after, on a new sweep name so that it
  trains again (a second launch in a row pays the same: nothing outlives a launch);
- **standing**: the same launch with ``--address standing``, which joins the standing
  local Ray (:mod:`pipeline.run._standing`) a first launch started before the repeats (that
  first launch, which pays the start, is reported apart).

Fixed cost = wall time − training time, where training time is the longest chunk's
``chunk_wall_seconds`` from the store (the chunks run side by side). Medians over the
repeats are reported, with the ratio to the import baseline (target ≤ 2).
Results go to ``benchmarks/results/{mode}.launch.{json,md}``. Run it on an idle
machine: every figure is a wall time of processes that start other processes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
TARGET = 2.0
TINY = [
    "--set",
    "train.steps=10",
    "--set",
    "grid.width=[16]",
    "--set",
    "analysis.at_time=null",  # 10 steps reach no t of the quickstart's analysis
    "--no-progress",
]


def _wall(cmd: list[str], env: dict[str, str] | None = None) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, capture_output=True, cwd=ROOT)
    return time.perf_counter() - start


def _training_seconds(store: Path, sweep: str) -> float:
    """The longest chunk's wall time in the store (chunks train side by side)."""
    table = ds.dataset(store / "runs", format="parquet", partitioning="hive").to_table(
        columns=["chunk_wall_seconds"], filter=ds.field("sweep") == sweep
    )
    rows = table["chunk_wall_seconds"].to_pylist()
    if not rows:
        raise RuntimeError(f"the launch stored no runs of {sweep}")
    return max(rows)


def _launch(store: Path, sweep: str, extra: list[str], env: dict[str, str]) -> dict[str, float]:
    cmd = [str(BIN / "phasesweep"), "run", "sweeps/quickstart.yaml", "--store", str(store)]
    wall = _wall([*cmd, "--set", f"name={sweep}", *TINY, *extra], env)
    training = _training_seconds(store, sweep)
    return {"wall_s": wall, "training_s": training, "fixed_s": wall - training}


def _standing_env(folder: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PHASESWEEP_STANDING_DIR"] = folder
    return env


def run(repeats: int, out_dir: Path | None) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="launch-bench-"))
    folder = tempfile.mkdtemp(prefix="ps-", dir="/tmp")  # short: Ray's socket paths
    env = _standing_env(folder)
    standing = ["--address", "standing"]
    samples: dict[str, list[dict[str, float]]] = {
        k: [] for k in ("import", "embedded", "embedded_again", "standing")
    }
    try:
        first = _launch(work / "first", "first", standing, env)  # starts the standing Ray
        for r in range(repeats):
            base = _wall([sys.executable, "-c", "import torch, ray, pyarrow, duckdb"], env)
            samples["import"].append({"wall_s": base, "fixed_s": base})
            store = work / f"s{r}"
            samples["embedded"].append(_launch(store, f"tiny{r}a", [], env))
            samples["embedded_again"].append(_launch(store, f"tiny{r}b", [], env))
            samples["standing"].append(_launch(store, f"tiny{r}c", standing, env))
            print(f"repeat {r + 1}/{repeats}: " + ", ".join(
                f"{k} {v[-1]['fixed_s']:.2f} s" for k, v in samples.items()
            ), file=sys.stderr, flush=True)  # fmt: skip
    finally:
        subprocess.run([str(BIN / "phasesweep"), "standing", "stop"], env=env, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(folder, ignore_errors=True)
    base = statistics.median(s["fixed_s"] for s in samples["import"])
    rows = {
        k: {
            m: statistics.median(s[m] for s in v) for m in v[0]
        } | {"ratio_to_import": statistics.median(s["fixed_s"] for s in v) / base}
        for k, v in samples.items()
    }  # fmt: skip
    result = {
        "repeats": repeats,
        "load": " ".join(f"{x:.1f}" for x in os.getloadavg()),
        "standing_first": first,
        "standing_dir": folder,
        "median": rows,
        "samples": samples,
    }
    if out_dir is not None:
        mode = "quick" if repeats < 3 else "full"
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / f"{mode}.launch.json").write_text(json.dumps(result, indent=1) + "\n")
        (out_dir / f"{mode}.launch.md").write_text(markdown(result))
    return result


LABELS = {
    "import": '`python -c "import torch, ray, pyarrow, duckdb"` (the unit)',
    "embedded": "`phasesweep run` tiny sweep, embedded Ray (default)",
    "embedded_again": "the same, second launch in a row",
    "standing": "the same with `--address standing` (the standing Ray already up)",
}


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "# A launch's fixed cost",
        "",
        f"- {result['repeats']} repeats, medians; load average at the end {result['load']}",
        f"- the first `--address standing` launch, which starts the standing Ray: "
        f"{result['standing_first']['wall_s']:.2f} s",
        "",
        "| launch | wall s | training s | fixed s | fixed / import | target ≤ 2 |",
        "|---|---|---|---|---|---|",
    ]
    for k, row in result["median"].items():
        met = "" if k == "import" else ("yes" if row["ratio_to_import"] <= TARGET else "**no**")
        lines.append(
            f"| {LABELS[k]} | {row['wall_s']:.2f} | {row.get('training_s', 0.0):.3f} | "
            f"{row['fixed_s']:.2f} | {row['ratio_to_import']:.2f} | {met} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.launch", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="one repeat (a smoke run)")
    ap.add_argument("--repeats", type=int, default=5, help="repeats of the full run")
    ap.add_argument("--out", type=Path, default=RESULTS, help="directory for the results")
    args = ap.parse_args(argv)
    print(markdown(run(1 if args.quick else args.repeats, args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
