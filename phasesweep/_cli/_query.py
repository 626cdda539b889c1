"""``phasesweep query``: one read-only SQL statement over the store, printed as a table,
CSV or JSON."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from phasesweep import _api, _format
from phasesweep._cli._args import bounded
from phasesweep._cli._base import (
    EXIT_FAILED,
    EXIT_OK,
    Command,
    SqlError,
    add_store,
    damage_line,
    open_store,
    paragraph,
)
from phasesweep._config import SpecError


class Query(Command):
    name = "query"
    help = "run a read-only SQL query over the store"
    examples = (
        '  phasesweep query "SELECT status, count(*) FROM runs GROUP BY ALL"\n'
        "  phasesweep query @phase.sql --format csv > phase.csv\n"
        '  echo "SHOW TABLES" | phasesweep query -\n'
        '  phasesweep query "DESCRIBE trajectories"'
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "sql",
            nargs="?",
            metavar="SQL",
            help="one read-only SQL statement; - reads it from standard input, @FILE from FILE",
        )
        parser.add_argument(
            "--file",
            "-f",
            type=Path,
            metavar="FILE",
            help="read the SQL from FILE (instead of SQL)",
        )
        add_store(parser)
        parser.add_argument(
            "--allow-partial",
            action="store_true",
            help="answer from the files that can be read when some the query reads are damaged "
            "(default: no answer, exit 1; `phasesweep verify --repair` fixes the store)",
        )
        parser.add_argument(
            "--format",
            choices=("table", "csv", "json"),
            default="table",
            help="table: aligned, wide cells clipped, row count last (default); "
            "csv: header and \\n line ends, lists as JSON; json: an array of objects, NaN as null "
            "(csv and json: every row)",
        )
        parser.add_argument(
            "--max-rows",
            type=bounded(int, 0, strict=False),
            default=None,
            metavar="N",
            help="table: rows shown of a longer result, the first and last N/2, 0 for all "
            "(default: 40)",
        )

    def take_action(self, args: argparse.Namespace) -> int:
        import duckdb

        sql = _read_sql(args)
        store = open_store(args.store, must_exist=True)
        try:
            answer = _api.answer(sql, store)
        except duckdb.Error as e:
            raise SqlError(f"SQL error: {paragraph(e)}") from e
        if answer.missing and not args.allow_partial:
            print(
                damage_line(
                    answer.missing,
                    "no answer: it would leave out what is in",
                    ", --allow-partial answers from the rest",
                ),
                file=sys.stderr,
            )
            return EXIT_FAILED
        table = answer.table
        rows = _format.ArrowRows(table)
        if args.format == "csv":
            _format.write_csv(table.column_names, rows, sys.stdout)
        elif args.format == "json":
            _format.write_json(table.column_names, rows, sys.stdout)
        else:
            max_rows = _format.MAX_ROWS if args.max_rows is None else args.max_rows
            more = "; --max-rows 0 shows all, --format csv|json gives all"
            _format.write_table(table.column_names, rows, sys.stdout, max_rows=max_rows, more=more)
        if answer.missing:
            print(
                damage_line(answer.missing, "a partial answer: it leaves out what is in"),
                file=sys.stderr,
            )
        return EXIT_OK


def _read_sql(args: argparse.Namespace) -> str:
    """The SQL text of ``query``: the argument, ``-`` (stdin), ``@FILE`` or ``--file FILE``."""
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
