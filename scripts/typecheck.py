"""Type check with pyright, configured in pyproject.toml's ``[tool.pyright]``.

Fails on pyright's errors and on every import it cannot resolve: a module, or a name
that a module lacks (``"X" is unknown import symbol``, which pyright files under
``reportAttributeAccessIssue``, one of the rules this project keeps at warning). Warnings
are counted, not listed: an editor shows them, and so does ``.venv/bin/pyright``.

    .venv/bin/python scripts/typecheck.py [PYRIGHT ARGUMENTS]
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

#: The end of pyright's message for ``from module import name`` of a name it lacks.
UNKNOWN_IMPORT = "is unknown import symbol"


def failing(diagnostics: list[dict]) -> list[dict]:
    """The diagnostics that fail the check: errors and unresolved names in imports."""
    return [
        d for d in diagnostics if d["severity"] == "error" or d["message"].endswith(UNKNOWN_IMPORT)
    ]


def main(args: list[str]) -> int:
    pyright = Path(sys.executable).with_name("pyright")
    done = subprocess.run(
        [str(pyright), "--outputjson", *args], capture_output=True, text=True, check=False
    )
    try:
        report = json.loads(done.stdout)
    except ValueError:  # pyright did not get to check anything: its own words say why
        sys.stderr.write(done.stdout + done.stderr)
        return done.returncode or 1
    diagnostics = report["generalDiagnostics"]
    bad = failing(diagnostics)
    for d in bad:
        start = d["range"]["start"]
        where = f"{d['file']}:{start['line'] + 1}:{start['character'] + 1}"
        print(f"{where}: {d['message']} ({d.get('rule', 'error')})")
    warnings = sum(d["severity"] == "warning" and d not in bad for d in diagnostics)
    files = report["summary"]["filesAnalyzed"]
    print(f"pyright: {len(bad)} failing, {warnings} warnings in {files} files")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
