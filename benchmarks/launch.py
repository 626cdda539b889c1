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
- **named cluster**: the same launch with ``--address`` to a Ray head started once on
  loopback (``ray start --head``) before the repeats: a second launch in a row that
  reuses a running Ray (the cluster's own start-up, paid once, is reported apart).

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
import signal
import socket
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
TINY = ["--set", "train.steps=10", "--set", "grid.width=[16]", "--no-progress"]


def _wall(cmd: list[str], env: dict[str, str] | None = None) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, capture_output=True, cwd=ROOT)
    return time.perf_counter() - start


def _training_seconds(store: Path, sweep: str) -> float:
    """The longest chunk's wall time in the store (chunks train side by side)."""
    table = ds.dataset(store / "runs", format="parquet", partitioning="hive").to_table(
        columns=["sweep", "chunk_wall_seconds"]
    )
    rows = [
        s for w, s in zip(table["sweep"].to_pylist(), table["chunk_wall_seconds"].to_pylist())
        if w == sweep
    ]  # fmt: skip
    if not rows:
        raise RuntimeError(f"the launch stored no runs of {sweep}")
    return max(rows)


def _launch(store: Path, sweep: str, extra: list[str], env: dict[str, str]) -> dict[str, float]:
    cmd = [str(BIN / "phasesweep"), "run", "sweeps/quickstart.yaml", "--store", str(store)]
    wall = _wall([*cmd, "--set", f"name={sweep}", *TINY, *extra], env)
    training = _training_seconds(store, sweep)
    return {"wall_s": wall, "training_s": training, "fixed_s": wall - training}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _head_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    # a loopback head without Ray's token auth (it would look for ~/.ray's token)
    env.update(RAY_AUTH_MODE="disabled", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    return env


def _head(port: int, temp_dir: str, env: dict[str, str]) -> subprocess.Popen:
    """``ray start --head --block`` on loopback in a session of its own (killed whole at the
    end, so no other Ray on the machine is touched), with a private temp folder."""
    command = [
        str(BIN / "ray"), "start", "--head", "--block", f"--port={port}",
        "--node-ip-address=127.0.0.1", "--include-dashboard=false",
        f"--num-cpus={os.cpu_count()}", "--disable-usage-stats", f"--temp-dir={temp_dir}",
    ]  # fmt: skip
    return subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip


def _wait_for_head(
    port: int, head: subprocess.Popen, env: dict[str, str], timeout: float = 120.0
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if head.poll() is not None:
            raise RuntimeError(f"ray start --head exited with {head.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except OSError:
            time.sleep(0.1)
            continue
        # the GCS answers before the raylet has registered: wait until a driver can join
        join = "import ray, sys; ray.init(address=sys.argv[1], log_to_driver=False)"
        subprocess.run(
            [sys.executable, "-c", join, f"127.0.0.1:{port}"],
            env=env, check=True, capture_output=True, timeout=timeout,
        )  # fmt: skip
        return
    raise TimeoutError(f"no Ray head on 127.0.0.1:{port} after {timeout:.0f} s")


def _kill_session(leader: subprocess.Popen) -> None:
    """SIGKILL every process of ``leader``'s session (the head's GCS, raylet, workers)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[3]) == leader.pid:
                os.kill(int(stat.parent.name), signal.SIGKILL)
        except (OSError, ValueError):
            continue
    leader.wait(timeout=60)


def run(repeats: int, out_dir: Path | None) -> dict[str, Any]:
    env = _head_env()
    port = _free_port()
    work = Path(tempfile.mkdtemp(prefix="launch-bench-"))
    samples: dict[str, list[dict[str, float]]] = {
        k: [] for k in ("import", "embedded", "embedded_again", "named_cluster")
    }
    head_dir = tempfile.mkdtemp(prefix="ps-", dir="/tmp")  # short: Ray's socket paths
    start = time.perf_counter()
    head = _head(port, head_dir, env)
    try:
        _wait_for_head(port, head, env)
        head_s = time.perf_counter() - start
        for r in range(repeats):
            base = _wall([sys.executable, "-c", "import torch, ray, pyarrow, duckdb"], env)
            samples["import"].append({"wall_s": base, "fixed_s": base})
            store = work / f"s{r}"
            samples["embedded"].append(_launch(store, f"tiny{r}a", [], env))
            samples["embedded_again"].append(_launch(store, f"tiny{r}b", [], env))
            named = ["--address", f"127.0.0.1:{port}"]
            samples["named_cluster"].append(_launch(store, f"tiny{r}c", named, env))
            print(f"repeat {r + 1}/{repeats}: " + ", ".join(
                f"{k} {v[-1]['fixed_s']:.2f} s" for k, v in samples.items()
            ), file=sys.stderr, flush=True)  # fmt: skip
    finally:
        _kill_session(head)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(head_dir, ignore_errors=True)
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
        "cluster_start_s": head_s,
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
    "named_cluster": "the same with `--address` to a running loopback Ray head",
}


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "# A launch's fixed cost",
        "",
        f"- {result['repeats']} repeats, medians; load average at the end {result['load']}",
        f"- starting the loopback head (`ray start --head`, once): "
        f"{result['cluster_start_s']:.2f} s",
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
