"""The ``phasesweep`` command line (see DESIGN.md for the contract).

Exit codes: 0 all points done (a diverged run is done); 1 some points failed
after retries; 2 invalid spec or arguments — the message names the key and the
value, and nothing is written to the store.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

EXIT_OK, EXIT_FAILED, EXIT_INVALID = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse exits 2 as well; keep its message
        self.print_usage(sys.stderr)
        self.exit(EXIT_INVALID, f"{self.prog}: error: {message}\n")


def _store_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--store",
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
        default=None,
        help="Ray address: auto or ray://host:port (default: an embedded local Ray)",
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
    """An argparse type: ``kind(text)``, which must be > low (strict) or >= low."""

    def parse(text: str) -> object:
        value = kind(text)
        if value < low or (strict and value == low):
            raise argparse.ArgumentTypeError(
                f"must be {'>' if strict else '>='} {low}, got {text!r}"
            )
        return value

    parse.__name__ = kind.__name__
    return parse


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
    import yaml
    from phasesweep.pipeline.driver import flops_estimate, run_chunks, trial_slots
    from phasesweep.pipeline.grid import expand, make_chunks, member_bytes
    from phasesweep.pipeline.spec import load_spec

    spec, raw = load_spec(args.spec, args.overrides)
    points = expand(spec)
    if not points:
        return _fail(f"grid of {args.spec} has no points")
    store = _open_store(args.store)
    done = store.done_run_ids(spec.name)
    todo = [p for p in points if p.run_id not in done]
    # at least one chunk per concurrent trial, so no core idles on a small grid
    slots = trial_slots(None if args.dry_run else args.address, args.cpus_per_trial)
    chunks = make_chunks(todo, spec, min_chunks=slots)
    if args.dry_run:
        peak = max((len(c.points) * member_bytes(c.points[0].config) for c in chunks), default=0)
        flops = flops_estimate(todo)
        print(
            f"sweep {spec.name}: {len(points)} points, {len(done & {p.run_id for p in points})} "
            f"already stored, {len(todo)} to train in {len(chunks)} chunks"
        )
        for c in chunks[:20]:
            cfg = c.points[0].config
            print(
                f"  chunk {c.chunk_id}: {len(c.points)} members, depth {cfg.model.depth}, "
                f"width {cfg.model.width}, n_train {cfg.data.n_train}, steps {cfg.train.steps}"
            )
        if len(chunks) > 20:
            print(f"  … {len(chunks) - 20} more chunks")
        print(f"memory: about {peak / 2**20:.1f} MiB for the largest chunk")
        print(
            f"work: {flops / 1e12:.3g} TFLOP of training "
            f"(about {flops / 5e9 / 60:.1f} core-minutes at 5 GFLOP/s per core)"
        )
        return EXIT_OK
    store.write_spec(spec.name, yaml.safe_dump(raw, sort_keys=False))
    print(
        f"sweep {spec.name}: {len(points)} points; skipping {len(points) - len(todo)} already "
        f"stored; training {len(todo)} in {len(chunks)} chunks",
        file=sys.stderr,
    )
    outcome = run_chunks(
        store,
        spec.name,
        chunks,
        total=len(points),
        skipped=len(points) - len(todo),
        address=args.address,
        cpus_per_trial=args.cpus_per_trial,
        gpus_per_trial=args.gpus_per_trial,
        max_retries=args.max_retries,
        progress=not args.no_progress,
    )
    print(
        f"sweep {spec.name}: trained {outcome.trained} ({outcome.diverged} diverged), "
        f"skipped {outcome.skipped}, failed {len(outcome.failed)}",
        file=sys.stderr,
    )
    for err in dict.fromkeys(outcome.errors):
        print(f"  failure: {err}", file=sys.stderr)
    return EXIT_FAILED if outcome.failed else EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    from phasesweep.storage import run_query

    store = _open_store(args.store)
    where = ""
    if args.sweep is not None:
        where = f"WHERE sweep = '{_sql_str(args.sweep)}'"
    sql = (
        f"SELECT sweep, status, count(*) AS runs FROM runs {where} "
        "GROUP BY sweep, status ORDER BY sweep, status"
    )
    names, rows = run_query(store, sql)
    if not rows:
        print("no runs stored" + (f" for sweep {args.sweep}" if args.sweep else ""))
        return EXIT_OK
    _print_table(names, rows)
    if args.sweep is not None:
        total = _spec_points(store, args.sweep)
        stored = sum(r[2] for r in rows if r[1] != "failed")
        if total is not None:
            print(f"{stored} of {total} points done, {total - stored} remaining")
    return EXIT_OK


def _spec_points(store: object, sweep: str) -> int | None:
    from phasesweep.pipeline.grid import expand
    from phasesweep.pipeline.spec import parse_yaml, validate_spec

    text = store.read_spec(sweep)
    return None if text is None else len(expand(validate_spec(parse_yaml(text))))


def _sql_str(text: str) -> str:
    return text.replace("'", "''")


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
