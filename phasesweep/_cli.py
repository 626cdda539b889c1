"""The ``phasesweep`` command line: a thin layer over the Python API (:mod:`phasesweep`).

Exit codes: 0 all points done (a diverged run is done); 1 some points failed
after retries, or problems in the store (``verify``; damaged files under ``status`` or
``query``); 2 invalid spec, arguments, SQL or store, or an unknown sweep — one
line that names the key and the value, and nothing is written to the store;
3 an unexpected error (a bug or the environment: one line, ``--debug`` shows the
traceback); 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import math
import re
import sys
import traceback
import urllib.parse
import warnings
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from phasesweep.pipeline.spec import excerpt

if TYPE_CHECKING:
    from phasesweep.storage._store import Damage

EXIT_OK, EXIT_FAILED, EXIT_INVALID, EXIT_UNEXPECTED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        """One line (no usage block), exit 2: argparse's own message names the argument."""
        self.exit(EXIT_INVALID, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _store_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--store",
        type=_store_uri,
        default=None,
        metavar="URI",
        help="store URI: a path, file://… or s3://bucket/prefix "
        "(default: $PHASESWEEP_STORE, else ./results)",
    )


def _subcommand(sub: argparse._SubParsersAction, name: str, help_: str, examples: str):
    """A subcommand whose help ends with ``examples`` (shell lines, shown as written)."""
    return sub.add_parser(
        name,
        help=help_,
        description=help_[0].upper() + help_[1:] + ".",
        epilog="examples:\n" + examples,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def build_parser() -> argparse.ArgumentParser:
    from phasesweep import __version__

    parser = _Parser(
        prog="phasesweep",
        description="Phase diagrams of neural-network training dynamics: run grids of tiny "
        "trainings on Ray, query the Parquet store with SQL, draw figures and reports.",
        epilog="examples:\n"
        "  phasesweep run sweeps/quickstart.yaml --dry-run\n"
        '  phasesweep query "SELECT status, count(*) FROM runs GROUP BY ALL"\n'
        "  phasesweep SUBCOMMAND --help\n\n"
        "exit codes: 0 done; 1 some points failed after retries, or problems in the store "
        "(verify; damaged files under status or query); 2 invalid spec, "
        "arguments, SQL or store; 3 unexpected error; 130 interrupted",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"phasesweep {__version__}")
    parser.add_argument(
        "--debug", action="store_true", help="show the Python traceback of an error"
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = _subcommand(
        sub,
        "run",
        "launch a sweep (skips the points the store already holds)",
        "  phasesweep run sweeps/quickstart.yaml --dry-run\n"
        "  phasesweep run sweeps/quickstart.yaml --set 'grid.width=[64,256]'    # a part of its grid\n"
        "  phasesweep run sweeps/quickstart.yaml --set 'grid.seed=[5,6]' --extend  # more seeds\n"
        "  phasesweep run sweeps/quickstart.yaml --set name=quickstart_short --set train.steps=300 "
        "--set analysis.at_time=150  # another config: a sweep of its own\n"
        "  phasesweep run sweeps/saddle_escape.yaml --address auto --store s3://bucket/ps",
    )
    run.add_argument("spec", type=Path, metavar="SPEC.yaml", help="the sweep spec (YAML)")
    _store_arg(run)
    run.add_argument(
        "--address",
        type=_address,
        default=None,
        help="Ray cluster to join: auto, host:port or ray://host:port; local forces the "
        "embedded one; standing joins this user's standing local Ray, starting it if none "
        "runs (see 'phasesweep standing') (default: $RAY_ADDRESS, else a private embedded "
        "local Ray)",
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
    run.add_argument(
        "--cpus-per-trial",
        type=_bounded(float, 0, strict=True),
        default=1.0,
        metavar="N",
        help="CPUs (and torch threads) per Ray trial, > 0 (default: 1)",
    )
    run.add_argument(
        "--gpus-per-trial",
        type=_bounded(float, 0, strict=False),
        default=0.0,
        metavar="F",
        help="GPUs per Ray trial, >= 0; fractions share a GPU (default: 0)",
    )
    run.add_argument(
        "--device-memory",
        type=_bounded(float, 0, strict=True),
        default=None,
        metavar="GIB",
        help="memory of one GPU in GiB, to plan GPU trials (--gpus-per-trial) where no GPU "
        "can be seen, e.g. a --dry-run on a laptop (default: $PHASESWEEP_DEVICE_MEMORY, "
        "else measured on the GPU)",
    )
    run.add_argument(
        "--max-retries",
        type=_bounded(int, 0, strict=False),
        default=2,
        metavar="N",
        help="retries of a failed trial before its points are stored as failed (default: 2)",
    )
    run.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress display (by default a bar on a terminal, a widget in a notebook, "
        "else a line every $PHASESWEEP_PROGRESS_EVERY seconds, 30 if unset)",
    )
    run.add_argument(
        "--extend",
        action="store_true",
        help="train grid values that a stored sweep lacks as part of it (its base config "
        "stays the same; the stored grid takes the values of both)",
    )

    status = _subcommand(
        sub,
        "status",
        "counts of stored runs by sweep and status",
        "  phasesweep status\n  phasesweep status quickstart --store results",
    )
    status.add_argument(
        "sweep", nargs="?", metavar="SWEEP", help="one sweep, with its grid size (default: all)"
    )
    _store_arg(status)

    query = _subcommand(
        sub,
        "query",
        "run a read-only SQL query over the store",
        '  phasesweep query "SELECT status, count(*) FROM runs GROUP BY ALL"\n'
        "  phasesweep query @phase.sql --format csv > phase.csv\n"
        '  echo "SHOW TABLES" | phasesweep query -\n'
        '  phasesweep query "DESCRIBE trajectories"',
    )
    query.add_argument(
        "sql",
        nargs="?",
        metavar="SQL",
        help="one read-only SQL statement; - reads it from standard input, @FILE from FILE",
    )
    query.add_argument(
        "--file", "-f", type=Path, metavar="FILE", help="read the SQL from FILE (instead of SQL)"
    )
    _store_arg(query)
    query.add_argument(
        "--allow-partial",
        action="store_true",
        help="answer from the files that can be read when some the query reads are damaged "
        "(default: no answer, exit 1; `phasesweep verify --repair` fixes the store)",
    )
    query.add_argument(
        "--format",
        choices=("table", "csv", "json"),
        default="table",
        help="table: aligned, wide cells clipped, row count last (default); "
        "csv: header and \\n line ends, lists as JSON; json: an array of objects, NaN as null "
        "(csv and json: every row)",
    )
    query.add_argument(
        "--max-rows",
        type=_bounded(int, 0, strict=False),
        default=None,
        metavar="N",
        help="table: rows shown of a longer result, the first and last N/2, 0 for all "
        "(default: 40)",
    )

    for name, help_, example in (
        ("analyze", "write summaries, plateaus and scaling fits of a sweep", ""),
        ("plot", "regenerate a sweep's figures (PNG and SVG)", " --out figures"),
        ("report", "write a sweep's self-contained HTML report", " --out report"),
    ):
        p = _subcommand(
            sub,
            name,
            help_,
            f"  phasesweep {name} quickstart\n  phasesweep {name} quickstart --store results"
            + example,
        )
        p.add_argument("sweep", metavar="SWEEP", help="the sweep's name (see `phasesweep status`)")
        _store_arg(p)
        if name != "analyze":
            p.add_argument(
                "--out",
                type=Path,
                default=None,
                metavar="DIR",
                help="output directory (default: STORE/figures/SWEEP)",
            )
    refine = _subcommand(
        sub,
        "refine",
        "find where a metric crosses a level along one axis, line by line (Optuna): new "
        "runs go to the sweep SWEEP__refine_METRIC, the estimates to the boundaries table",
        "  phasesweep refine lazy_rich --metric kernel_distance --level 0.01 --budget 200\n"
        "  phasesweep refine quickstart --metric param_rel_change --level 0.1 --axis init_scale\n"
        "\nthe search is an Optuna journal in the store (docs/refine.md); its trials:\n"
        "  optuna trials --storage-class JournalFileBackend \\\n"
        "    --storage results/refine/sweep=lazy_rich__refine_kernel_distance/journal.log \\\n"
        "    --study-name 'kernel_distance|0.01|model.init_scale'",
    )
    refine.add_argument(
        "sweep", metavar="SWEEP", help="the sweep to refine (its grid is the start)"
    )
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
    refine.add_argument("--address", type=_address, default=None, help="Ray address, as for run")
    refine.add_argument(
        "--in-process", action="store_true", help="train batches in this process, not on Ray"
    )

    verify = _subcommand(
        sub,
        "verify",
        "check that every file is readable, manifest and files agree, no run is stored twice "
        "and every completed run has its trajectories and layers (exit 1 with a list of "
        "problems); --repair fixes what it can",
        "  phasesweep verify\n  phasesweep verify lazy_rich --store s3://bucket/results --repair",
    )
    verify.add_argument("sweep", nargs="?", metavar="SWEEP", help="one sweep (default: all)")
    _store_arg(verify)
    verify.add_argument(
        "--repair",
        action="store_true",
        help="quarantine unreadable files, drop orphans and leftover temp files, "
        "rewrite missing or wrong manifest entries, and take runs whose rows are lost out "
        "of their commit (quarantined as it was), so a relaunch trains them again",
    )

    compact = _subcommand(
        sub,
        "compact",
        "merge a sweep's chunk files into few large ones (queries answer the same)",
        "  phasesweep compact lazy_rich --store ./results",
    )
    compact.add_argument("sweep", nargs="?", metavar="SWEEP", help="one sweep (default: all)")
    _store_arg(compact)

    standing = _subcommand(
        sub,
        "standing",
        "show or stop this user's standing local Ray, the one 'run --address standing' "
        "starts on demand and reuses (it also stops itself after idling)",
        "  phasesweep run sweeps/quickstart.yaml --address standing   # starts it\n"
        "  phasesweep standing status\n  phasesweep standing stop",
    )
    standing.add_argument(
        "action",
        choices=["status", "stop"],
        help="status: its address, if one runs; stop: end it and every process it started",
    )
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
    if text in ("auto", "local", "standing"):
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
            f"{excerpt(text)} is not auto, local, standing, HOST:PORT or ray://HOST:PORT"
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


def _open_store(uri: str | None, must_exist: bool = False) -> object:
    """The store at ``uri`` (``must_exist``: already there); else an argument error (exit 2)."""
    from phasesweep.pipeline.spec import SpecError

    from phasesweep._api import StoreError, open_store

    try:
        return open_store(uri, must_exist=must_exist)
    except StoreError as e:
        raise SpecError("--store", e.uri, e.reason, what="argument") from None


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
    from phasesweep.pipeline.run._launch import execute

    from phasesweep import _api

    plan = _api.plan(
        args.spec,
        _open_store(args.store),
        overrides=args.overrides,
        address=None if args.dry_run else args.address,
        cpus_per_trial=args.cpus_per_trial,
        gpus_per_trial=args.gpus_per_trial,
        device_memory=args.device_memory,
        extend=args.extend,
    )
    name = plan.spec.name
    if args.dry_run:
        _print_plan(plan)
        return EXIT_OK
    print(
        f"sweep {name}: {plan.total} points; skipping {plan.skipped} already "
        f"stored; training {plan.to_train} in {len(plan.tasks)} chunks",
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


def _print_plan(plan: object) -> None:
    """``run --dry-run``: points, chunks (the first few, and every size used), device,
    memory and work."""
    tasks = plan.tasks
    print(
        f"sweep {plan.spec.name}: {plan.total} points, {plan.skipped} already stored, "
        f"{plan.to_train} to train in {len(tasks)} chunks"
    )
    for t in tasks[:20]:
        cfg = plan.group_config(t)
        print(
            f"  chunk {t.chunk_id}: {t.size - t.stored_count} members, depth {cfg.model.depth}, "
            f"width {cfg.model.width}, n_train {cfg.data.n_train}, steps {t.steps}"
        )
    if len(tasks) > 20:
        print(f"  … {len(tasks) - 20} more chunks")
    sizes = sorted({t.size for t in tasks})
    if sizes:
        shown = ", ".join(map(str, sizes[:8])) + (" …" if len(sizes) > 8 else "")
        print(f"chunk sizes (members): {shown}")
    if plan.device_memory is not None:
        print(f"device: GPU trials of {plan.device_memory / 2**30:.1f} GiB each")
    print(f"memory: about {plan.peak_bytes / 2**20:.1f} MiB for the largest chunk")
    print(
        f"work: {plan.flops / 1e12:.3g} TFLOP of training "
        f"(about {plan.flops / 5e9 / 60:.1f} core-minutes at 5 GFLOP/s per core)"
    )


def cmd_status(args: argparse.Namespace) -> int:
    from phasesweep import _api
    from phasesweep._format import write_table

    store = _open_store(args.store, must_exist=True)
    with _skipped_files():  # said below, with the damage the counts do not read
        status = _api.status(args.sweep, store)
    if not status.counts:
        print("no runs stored" + (f" for sweep {args.sweep}" if args.sweep else ""))
    else:
        write_table(["sweep", "status", "runs"], status.counts, sys.stdout)
    if status.total is not None:
        print(
            f"{status.done} of {status.total} points done, {status.total - status.done} remaining"
        )
    damaged = store.damaged_files(args.sweep)
    if damaged:
        print(_damage_line(damaged, "the counts leave out what is in"), file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


@contextlib.contextmanager
def _skipped_files() -> Iterator[dict[str, Damage]]:
    """The store files readers skip as damaged while the block runs (path → its
    :class:`Damage`), collected instead of shown as Python warnings."""
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


def _damage_line(damage: Iterable[Damage], what: str, more: str = "") -> str:
    """One line for damaged store files: ``what`` they cost, which (the first three) and
    the fix."""
    files = sorted(damage, key=lambda d: d.path)
    named = "; ".join(f"{d.path} ({d.reason})" for d in files[:3])
    if len(files) > 3:
        named += f"; and {len(files) - 3} more"
    s = "" if len(files) == 1 else "s"
    return (
        f"phasesweep: {what} {len(files)} damaged store file{s}: {named}; "
        f"`phasesweep verify --repair` fixes the store{more}"
    )


class _SqlError(Exception):
    """An SQL statement DuckDB rejected (parser, binder, catalog, conversion, …)."""


def _read_sql(args: argparse.Namespace) -> str:
    """The SQL text of ``query``: the argument, ``-`` (stdin), ``@FILE`` or ``--file FILE``."""
    from phasesweep.pipeline.spec import SpecError

    if (args.sql is None) == (args.file is None):
        raise SpecError(
            "SQL", args.sql, "give the SQL, - (stdin), @FILE or --file FILE", "argument"
        )
    if args.sql == "-":
        return sys.stdin.read()
    path = args.file if args.file is not None else None
    if args.sql is not None and args.sql.startswith("@"):
        path = Path(args.sql[1:])
    if path is None:
        return args.sql
    try:
        return path.read_text()
    except OSError as e:
        raise SpecError("--file", str(path), f"cannot read: {e.strerror}", "argument") from None


def cmd_query(args: argparse.Namespace) -> int:
    import duckdb
    from phasesweep.storage._catalog import tables_read

    from phasesweep import _api, _format

    sql = _read_sql(args)
    store = _open_store(args.store, must_exist=True)
    try:
        with _skipped_files() as skipped:
            table = _api.arrow_table(sql, store)
    except duckdb.Error as e:
        raise _SqlError(f"SQL error: {_paragraph(e)}") from e
    read = tables_read(sql)
    missing = [d for d in skipped.values() if store.relative(d.path).split("/")[0] in read]
    if missing and not args.allow_partial:
        print(
            _damage_line(
                missing,
                "no answer: it would leave out what is in",
                ", --allow-partial answers from the rest",
            ),
            file=sys.stderr,
        )
        return EXIT_FAILED
    rows = _format.ArrowRows(table)
    if args.format == "csv":
        _format.write_csv(table.column_names, rows, sys.stdout)
    elif args.format == "json":
        _format.write_json(table.column_names, rows, sys.stdout)
    else:
        max_rows = _format.MAX_ROWS if args.max_rows is None else args.max_rows
        more = "; --max-rows 0 shows all, --format csv|json gives all"
        _format.write_table(table.column_names, rows, sys.stdout, max_rows=max_rows, more=more)
    if missing:
        print(_damage_line(missing, "a partial answer: it leaves out what is in"), file=sys.stderr)
    return EXIT_OK


def _paragraph(error: BaseException) -> str:
    """The first paragraph of an error message on one line (DuckDB's name the problem,
    then "Did you mean …?", then a blank line and the SQL with a caret)."""
    text = str(error).strip().split("\n\n")[0]
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def cmd_analysis(args: argparse.Namespace) -> int:
    from phasesweep import _api

    store = _open_store(args.store, must_exist=True)
    if args.command == "analyze":
        counts = _api.analyze(args.sweep, store)
        print(", ".join(f"{k}: {v} rows" for k, v in counts.items()))
    elif args.command == "plot":
        for path in _api.plot(args.sweep, store, args.out):
            print(path)
    else:
        print(_api.report(args.sweep, store, args.out))
    return EXIT_OK


def cmd_refine(args: argparse.Namespace) -> int:
    from phasesweep.pipeline.refine._refine import refine

    from phasesweep._format import write_table

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
    rows = [tuple(None if _isnan(v) else v for v in r) for r in b[cols].itertuples(index=False)]
    write_table(cols, rows, sys.stdout)
    return EXIT_FAILED if out.failed else EXIT_OK


def _isnan(v: object) -> bool:
    return isinstance(v, float) and v != v


def cmd_verify(args: argparse.Namespace) -> int:
    from phasesweep.storage._maintenance import verify

    store = _open_store(args.store, must_exist=True)
    report = _maintain(verify, store, args.sweep, repair=args.repair)
    for line in report.problems:
        print(f"problem: {line}")
    for line in report.actions:
        print(f"repaired: {line}")
    if report.ok:
        print(f"ok: {store.uri}" + (f" sweep {args.sweep}" if args.sweep else ""))
    return EXIT_OK if report.ok else EXIT_FAILED


def cmd_compact(args: argparse.Namespace) -> int:
    from phasesweep.storage._maintenance import compact

    store = _open_store(args.store, must_exist=True)
    report = _maintain(compact, store, args.sweep)
    for line in report.actions:
        print(line)
    if not report.actions:
        print("nothing to compact")
    return EXIT_OK


def _maintain(func, store: object, sweep: str | None, **kwargs: object) -> object:
    """``func(store, sweep, **kwargs)``; a bad sweep name is an argument error and a sweep
    the store does not hold an unknown one (exit 2 both)."""
    from phasesweep.pipeline.spec import SpecError
    from phasesweep.storage._maintenance import known_sweeps
    from phasesweep.storage._store import check_sweep

    from phasesweep._api import UnknownSweepError

    if sweep is not None:
        try:
            check_sweep(sweep)
        except ValueError as e:
            raise SpecError("SWEEP", sweep, str(e), what="argument") from None
        known = known_sweeps(store)
        if sweep not in known:
            raise UnknownSweepError(sweep, store.uri, known)
    return func(store, sweep, **kwargs)


def cmd_standing(args: argparse.Namespace) -> int:
    from phasesweep.pipeline.run import _standing

    if args.action == "stop":
        print("stopped" if _standing.stop() else "no standing Ray is running")
        return EXIT_OK
    found = _standing.address()
    print(f"running at {found}" if found else "no standing Ray is running")
    return EXIT_OK


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
    "standing": cmd_standing,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (see the module docstring)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # argparse: --help/--version (0) or a usage error (2), printed
        return int(e.code or 0)
    try:
        with _skipped_files() as skipped:
            code = COMMANDS[args.command](args)
        if skipped:
            print(_damage_line(skipped.values(), "skipped"), file=sys.stderr)
        return code
    except BrokenPipeError:  # e.g. `phasesweep query ... | head`
        sys.stderr.close()
        return EXIT_OK
    except KeyboardInterrupt:
        _traceback(args)
        print("phasesweep: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:
        _traceback(args)
        if isinstance(e, _user_errors()):
            return _fail(str(e))
        print(
            f"phasesweep: unexpected error: {type(e).__name__}: {_paragraph(e)}"
            + ("" if args.debug else " (rerun with --debug for the traceback)"),
            file=sys.stderr,
        )
        return EXIT_UNEXPECTED


def console() -> None:
    """The ``phasesweep`` command: :func:`main`, then Ray left at once if the command
    used it (:func:`pipeline.run._ray.disconnect`), rather than in Ray's exit hook, which
    costs each launch half a second more."""
    code = main()
    if "ray" in sys.modules:  # only commands that launched imported it
        from phasesweep.pipeline.run._ray import disconnect

        disconnect()
    sys.exit(code)


def _user_errors() -> tuple[type[Exception], ...]:
    """Errors in what the user gave (exit 2): spec, arguments, store, sweep name, SQL."""
    from phasesweep.pipeline.spec import SpecError
    from phasesweep.storage import ReadOnlyQueryError

    from phasesweep._api import StoreError, UnknownSweepError

    return (SpecError, StoreError, UnknownSweepError, ReadOnlyQueryError, _SqlError)


def _traceback(args: argparse.Namespace) -> None:
    if args.debug:
        traceback.print_exc()


if __name__ == "__main__":
    console()
