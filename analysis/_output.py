"""Writing figures and reports into an output folder without following symbolic links.

A figure's file is written under a temporary name in the folder and renamed onto
its final name: a reader never sees half a file, and a rename replaces a link
rather than writing through it. Before that, a folder that is a link (or a file),
or a link planted at a file's name, is refused with :class:`OutputError`, so that
``plot --out DIR`` never overwrites a file outside ``DIR``.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from phasesweep._config import SpecError


class OutputError(SpecError):
    """An output folder or file that cannot be written safely (one line; CLI exit 2)."""

    def __init__(self, path: Path | str, reason: str) -> None:
        super().__init__("--out", str(path)[:200], reason, what="argument")


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return path.lstat()
    except FileNotFoundError:
        return None


def prepare_dir(path: Path | str, create: bool = True) -> Path:
    """``path`` checked (and created with ``create``) as an output folder.

    Raises :class:`OutputError` if ``path`` is a symbolic link, or exists and is not
    a folder, or cannot be created.
    """
    out = Path(path)
    st = _lstat(out)
    if st is not None:
        if stat.S_ISLNK(st.st_mode):
            raise OutputError(out, "is a symbolic link; give the folder it points to, or another")
        if not stat.S_ISDIR(st.st_mode):
            raise OutputError(out, "exists and is not a folder")
        return out
    if create:
        try:
            out.mkdir(parents=True)
        except FileExistsError:  # made meanwhile (another writer): check it again
            return prepare_dir(out, create=False)
        except OSError as e:
            raise OutputError(out, f"cannot create the folder: {e.strerror}") from None
    return out


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_file(folder: Path, name: str, data: bytes) -> Path:
    """Write ``data`` as ``folder/name`` atomically; refuse a link or folder at that name."""
    target = folder / name
    st = _lstat(target)
    if st is not None and not stat.S_ISREG(st.st_mode):
        what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
        raise OutputError(target, f"is {what}; refusing to replace it")
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # as open() would make it, not mkstemp's 0600
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, target)  # replaces the name itself, never what a link points to
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
