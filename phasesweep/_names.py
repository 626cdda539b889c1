"""Names the spec and the store both check, kept free of heavy imports (the spec loads light).

A sweep's name is its store partition key (the directory ``sweep=NAME`` of every table).
"""

from __future__ import annotations

import re

#: What a sweep name may be: it names the store partition (``sweep=NAME``) and a file name.
#: Use ``fullmatch`` (``$`` would accept a trailing newline).
SWEEP_NAME = re.compile(r"[a-z0-9_-]+")
