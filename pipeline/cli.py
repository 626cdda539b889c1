"""The ``phasesweep`` command line (see DESIGN.md for the contract).

Exit codes: 0 all points done (a diverged run is done); 1 some points failed
after retries; 2 invalid spec or arguments — the message names the key and the
value, and nothing is written to the store.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import math
import re
import sys
import urllib.parse
from collections.abc import Sequence
from pathlib import Path

from phasesweep.pipeline.spec import excerpt

EXIT_OK, EXIT_FAILED, EXIT_INVALID, EXIT_INTERRUPTED = 0, 1, 2, 130


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        """One line (no usage block), exit 2: argparse's own message names the argument."""
        self.exit(EXIT_INVALID, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _store_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--store",
        type=_store_uri,
        default=None,
        help="store URI: a path, file://… or s3://bucket/prefix "
        "(default: $PHASESWEEP_STORE, else ./results)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="phasesweep", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("run", help="launch a sweep (skips the points the store already holds)")
    run.add_argument("spec", type=Path, metavar="SPEC.yaml")
    _store_arg(run)
    run.add_argument(
        "--address",
        type=_address,
        default=None,
        help="Ray cluster to join: auto, host:port or ray://host:port; local forces the "
        "embedded one (default: $RAY_ADDRESS, else a private embedded local Ray)",
    )
    run.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a dotted key of the spec; VALUE is YAML (repeatable)",
    )
    run.add_argument(
        "--dry-run", action="store_true", help="print points, chunks and estimates; write nothing"
    )
    run.add_argument("--cpus-per-trial", type=_bounded(float, 0, strict=True), default=1.0)
    run.add_argument("--gpus-per-trial", type=_bounded(float, 0, strict=False), default=0.0)
    run.add_argument("--max-retries", type=_bounded(int, 0, strict=False), default=2)
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.add_argument(
        "--extend",
        action="store_true",
        help="add new grid values to a stored sweep (its base config must stay the same)",
    )

    status = sub.add_parser("status", help="counts of stored runs by sweep and status")
    status.add_argument("sweep", nargs="?", metavar="SWEEP")
    _store_arg(status)

    query = sub.add_parser("query", help="run a read-only SQL query over the store")
    query.add_argument("sql", metavar="SQL")
    _store_arg(query)
    query.add_argument("--format", choices=("table", "csv", "json"), default="table")

    for name, help_ in (
        ("analyze", "write summaries, plateaus and scaling fits of a sweep"),
        ("plot", "regenerate a sweep's figures"),
        ("report", "write a sweep's self-contained HTML report"),
    ):
        p = sub.add_parser(name, help=help_)
        p.add_argument("sweep", metavar="SWEEP")
        _store_arg(p)
        if name != "analyze":
            p.add_argument(
                "--out",
                type=Path,
                default=None,
                help="output directory (default: inside the store)",
            )
    refine = sub.add_parser(
        "refine",
        help="find where a metric crosses a level along one axis, line by line (Optuna)",
        description="Bisect AXIS between the sweep's grid points where the seed-mean final "
        "METRIC crosses LEVEL, for every value of the other grid axes; new runs go to the "
        "sweep SWEEP__refine_METRIC, the estimates to the boundaries table. Example: "
        "phasesweep refine lazy_rich --metric kernel_distance --level 0.01 --budget 200",
    )
    refine.add_argument("sweep", metavar="SWEEP")
    refine.add_argument("--metric", required=True, help="a trajectories or runs column")
    refine.add_argument("--level", required=True, type=float, help="the level of the metric")
    refine.add_argument("--axis", default="init_scale", help="grid axis to search")
    refine.add_argument(
        "--budget", type=int, default=None, help="most runs the refinement trains in all"
    )
    refine.add_argument(
        "--tol",
        type=float,
        default=None,
        help="stop a line when its bracket is this wide (log10 units on a log axis; "
        "default: the grid's finest spacing / 16)",
    )
    refine.add_argument(
        "--per-line",
        type=_bounded(int, 1, strict=False),
        default=1,
        help="points per line per batch (1: bisection)",
    )
    _store_arg(refine)
    refine.add_argument("--address", default=None, help="Ray address, as for run")
    refine.add_argument(
        "--in-process", action="store_true", help="train batches in this process, not on Ray"
    )

    verify = sub.add_parser(
        "verify",
        help="check the store's files (exit 1 with a list of problems); --repair fixes them",
        description="Check that every file is readable, manifest and files agree, no run is "
        "stored twice and every completed run has its trajectories and layers. "
        "Example: phasesweep verify lazy_rich --store s3://bucket/results --repair",
    )
    verify.add_argument("sweep", nargs="?", metavar="SWEEP", help="one sweep (default: all)")
    _store_arg(verify)
    verify.add_argument(
        "--repair",
        action="store_true",
        help="quarantine unreadable files, drop orphans and leftover temp files, "
        "rewrite missing or wrong manifest entries",
    )

    compact = sub.add_parser(
        "compact",
        help="merge a sweep's chunk files into few large ones (queries answer the same)",
        description="Example: phasesweep compact lazy_rich --store ./results",
    )
    compact.add_argument("sweep", nargs="?", metavar="SWEEP", help="one sweep (default: all)")
    _store_arg(compact)
    return parser


def _bounded(kind: type, low: float, strict: bool) -> object:
    """An argparse type: ``kind(text)``, finite and > low (strict) or >= low."""
    wanted = f"{'an integer' if kind is int else 'a finite number'} {'>' if strict else '>='} {low}"

    def parse(text: str) -> object:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or value < low or (strict and value == low):
            raise argparse.ArgumentTypeError(f"{excerpt(text)} is not {wanted}")
        return value

    parse.__name__ = kind.__name__
    return parse


_HOSTNAME = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*\.?")


def _address(text: str) -> str:
    """An argparse type for ``--address``: ``auto``, ``local``, ``HOST:PORT`` or
    ``ray://HOST:PORT`` (HOST a host name, an IPv4 address or ``[IPv6]``). Syntax only:
    whether a cluster answers there is checked when connecting."""
    if text in ("auto", "local"):
        return text
    rest = text.removeprefix("ray://")
    try:
        parts = urllib.parse.urlsplit("//" + rest)
        host, port = parts.hostname, parts.port
    except ValueError:
        host = port = None
    if host and parts.netloc.startswith("["):
        host = host if _is_ip(host) else None
    elif host and not (_is_ip(host) or _HOSTNAME.fullmatch(host)):
        host = None
    if not host or not port or "/" in rest or parts.username or parts.password:
        raise argparse.ArgumentTypeError(
            f"{excerpt(text)} is not auto, local, HOST:PORT or ray://HOST:PORT"
        )
    return text


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _store_uri(text: str) -> str:
    """An argparse type for ``--store``: not empty (that would be the current folder),
    and a local store is not a file nor below one."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            f"{excerpt(text)} is empty (give a path, file://PATH or s3://BUCKET/PREFIX)"
        )
    if "://" not in text or text.startswith("file://"):
        path = Path(text.removeprefix("file://")).expanduser().absolute()
        for folder in (path, *path.parents):
            if folder.exists():
                if not folder.is_dir():
                    what = "is a file" if folder == path else f"is below the file {folder}"
                    raise argparse.ArgumentTypeError(f"{excerpt(text)} {what}, not a store folder")
                break
    return text


def _open_store(uri: str | None) -> object:
    """The store at ``uri``; an unusable URI is an argument error (exit 2)."""
    from phasesweep.pipeline.spec import SpecError
    from phasesweep.storage import Store

    try:
        return Store.open(uri)
    except ValueError as e:
        raise SpecError("--store", uri, str(e), what="argument") from None


def _fail(message: str) -> int:
    print(f"phasesweep: {message}", file=sys.stderr)
    return EXIT_INVALID


def cmd_run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except KeyboardInterrupt:  # a second Ctrl-C, or one before training started
        print("phasesweep: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _run(args: argparse.Namespace) -> int:
    from phasesweep.pipeline.launch import execute, plan_sweep

    plan = plan_sweep(
        args.spec,
        _open_store(args.store),
        overrides=args.overrides,
        address=None if args.dry_run else args.address,
        cpus_per_trial=args.cpus_per_trial,
        extend=args.extend,
    )
    name = plan.spec.name
    if args.dry_run:
        print(
            f"sweep {name}: {plan.total} points, {plan.skipped} already stored, "
            f"{len(plan.todo)} to train in {len(plan.chunks)} chunks"
        )
        for c in plan.chunks[:20]:
            cfg = c.points[0].config
            print(
                f"  chunk {c.chunk_id}: {len(c.points)} members, depth {cfg.model.depth}, "
                f"width {cfg.model.width}, n_train {cfg.data.n_train}, steps {cfg.train.steps}"
            )
        if len(plan.chunks) > 20:
            print(f"  … {len(plan.chunks) - 20} more chunks")
        print(f"memory: about {plan.peak_bytes / 2**20:.1f} MiB for the largest chunk")
        print(
            f"work: {plan.flops / 1e12:.3g} TFLOP of training "
            f"(about {plan.flops / 5e9 / 60:.1f} core-minutes at 5 GFLOP/s per core)"
        )
        return EXIT_OK
    print(
        f"sweep {name}: {plan.total} points; skipping {plan.skipped} already "
        f"stored; training {len(plan.todo)} in {len(plan.chunks)} chunks",
        file=sys.stderr,
    )
    outcome = execute(
        plan,
        address=args.address,
        cpus_per_trial=args.cpus_per_trial,
        gpus_per_trial=args.gpus_per_trial,
        max_retries=args.max_retries,
        progress=not args.no_progress,
    )
    print(
        f"sweep {name}: trained {outcome.trained} ({outcome.diverged} diverged, "
        f"{outcome.resumed} resumed from checkpoints), "
        f"skipped {outcome.skipped}, failed {len(outcome.failed)}",
        file=sys.stderr,
    )
    for err in dict.fromkeys(outcome.errors):
        print(f"  failure: {err}", file=sys.stderr)
    if outcome.interrupted:
        print(
            f"sweep {name}: interrupted; finished work is stored, running chunks are "
            "checkpointed: run the same command again to go on",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    return EXIT_FAILED if outcome.failed else EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    from phasesweep.pipeline.launch import sweep_status

    status = sweep_status(_open_store(args.store), args.sweep)
    if not status.counts:
        print("no runs stored" + (f" for sweep {args.sweep}" if args.sweep else ""))
        return EXIT_OK
    _print_table(["sweep", "status", "runs"], status.counts)
    if status.total is not None:
        print(
            f"{status.done} of {status.total} points done, {status.total - status.done} remaining"
        )
    return EXIT_OK


def cmd_query(args: argparse.Namespace) -> int:
    import csv

    from phasesweep.storage import ReadOnlyQueryError, run_query

    try:
        names, rows = run_query(_open_store(args.store), args.sql)
    except ReadOnlyQueryError as e:
        return _fail(str(e))
    if args.format == "csv":
        w = csv.writer(sys.stdout)
        w.writerow(names)
        w.writerows(rows)
    elif args.format == "json":
        print(json.dumps([dict(zip(names, r)) for r in rows], default=str))
    else:
        _print_table(names, rows)
    return EXIT_OK


def _print_table(names: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    def fmt(v: object) -> str:
        if v is None:
            return "NULL"
        if isinstance(v, float):
            return f"{v:.6g}"
        return str(v)

    cells = [[fmt(v) for v in r] for r in rows]
    widths = [max([len(n)] + [len(c[i]) for c in cells]) for i, n in enumerate(names)]
    print("  ".join(n.ljust(w) for n, w in zip(names, widths)))
    print("  ".join("-" * w for w in widths))
    for c in cells:
        print("  ".join(v.ljust(w) for v, w in zip(c, widths)))


def cmd_analysis(args: argparse.Namespace) -> int:
    from phasesweep import analysis

    store = _open_store(args.store)
    if args.sweep not in store.sweeps():
        return _fail(f"SWEEP = {args.sweep!r}: no such sweep in the store {store.uri}")
    if args.command == "analyze":
        counts = analysis.analyze(store, args.sweep)
        print(", ".join(f"{k}: {v} rows" for k, v in counts.items()))
    elif args.command == "plot":
        for path in analysis.plot(store, args.sweep, args.out):
            print(path)
    else:
        print(analysis.report(store, args.sweep, args.out))
    return EXIT_OK


def cmd_refine(args: argparse.Namespace) -> int:
    from phasesweep.pipeline.refine import refine

    out = refine(
        _open_store(args.store),
        args.sweep,
        args.metric,
        args.level,
        axis=args.axis,
        budget=args.budget,
        tol=args.tol,
        per_line=args.per_line,
        address=args.address,
        use_ray=not args.in_process,
    )
    b = out.boundaries
    print(
        f"sweep {out.child}: trained {out.trained} runs in {out.batches} batches, "
        f"failed {out.failed}",
        file=sys.stderr,
    )
    cols = [
        "line",
        "boundary",
        "bracket_low",
        "bracket_high",
        "seed_spread",
        "bracketed",
        "converged",
        "n_runs",
    ]
    _print_table(
        cols, [tuple(None if _isnan(v) else v for v in r) for r in b[cols].itertuples(index=False)]
    )
    return EXIT_FAILED if out.failed else EXIT_OK


def _isnan(v: object) -> bool:
    return isinstance(v, float) and v != v


def cmd_verify(args: argparse.Namespace) -> int:
    from phasesweep.storage.maintenance import verify

    store = _open_store(args.store)
    report = _maintain(verify, store, args.sweep, repair=args.repair)
    for line in report.problems:
        print(f"problem: {line}")
    for line in report.actions:
        print(f"repaired: {line}")
    if report.ok:
        print(f"ok: {store.uri}" + (f" sweep {args.sweep}" if args.sweep else ""))
    return EXIT_OK if report.ok else EXIT_FAILED


def cmd_compact(args: argparse.Namespace) -> int:
    from phasesweep.storage.maintenance import compact

    store = _open_store(args.store)
    report = _maintain(compact, store, args.sweep)
    for line in report.actions:
        print(line)
    if not report.actions:
        print("nothing to compact")
    return EXIT_OK


def _maintain(func, store: object, sweep: str | None, **kwargs: object) -> object:
    """``func(store, sweep, **kwargs)``; a bad sweep name is an argument error (exit 2)."""
    from phasesweep.pipeline.spec import SpecError
    from phasesweep.storage.store import check_sweep

    if sweep is not None:
        try:
            check_sweep(sweep)
        except ValueError as e:
            raise SpecError("SWEEP", sweep, str(e), what="argument") from None
    return func(store, sweep, **kwargs)


COMMANDS = {
    "run": cmd_run,
    "status": cmd_status,
    "query": cmd_query,
    "analyze": cmd_analysis,
    "plot": cmd_analysis,
    "report": cmd_analysis,
    "refine": cmd_refine,
    "verify": cmd_verify,
    "compact": cmd_compact,
}


def main(argv: Sequence[str] | None = None) -> int:
    from phasesweep.pipeline.spec import SpecError

    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # argparse: --help (0) or a usage error (2), already printed
        return int(e.code or 0)
    try:
        return COMMANDS[args.command](args)
    except SpecError as e:
        return _fail(str(e))
    except BrokenPipeError:  # e.g. `phasesweep query ... | head`
        sys.stderr.close()
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
