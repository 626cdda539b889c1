"""Who may use a Ray that phasesweep starts or joins: Ray's token authentication, and the
private folders that hold its token and its session files.

A Ray head runs any code a client sends it, as the account that started it; a local
one listens on loopback, which every account of the machine reaches. Ray's token
authentication (``RAY_AUTH_MODE=token``) makes every RPC present a shared secret, read
from ``$RAY_AUTH_TOKEN``, else the file ``$RAY_AUTH_TOKEN_PATH``, else
``~/.ray/auth_token``. So a local Ray is only as private as the file that holds its
token and the folder around it:

- :func:`private_folder`: a folder is trusted only if it is this account's, not a
  symbolic link, mode 0700, in a parent others cannot swap it out of; anything else is
  refused (:class:`SpecError`, exit 2) with the fix, never repaired or followed.
- :func:`token_file`: the token, written once with an exclusive create, mode 0600.
- :func:`private_temp_dir`: Ray's session files (logs, sockets) in a 0700 folder, not
  in the shared ``/tmp/ray`` (Ray makes its temp folder world-writable).
- :func:`token_env` / :func:`use_token`: the settings a Ray and its drivers need;
  :func:`warn_open`: one line on stderr when a launch's Ray runs without a token.

See SECURITY.md for what this does and does not protect against.
"""

from __future__ import annotations

import os
import secrets
import stat
import sys
import tempfile
from pathlib import Path

from phasesweep._config import SpecError

MODE, TOKEN, TOKEN_PATH = "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"
#: The value of ``$RAY_AUTH_MODE`` that turns authentication off.
DISABLED = "disabled"
#: Where a folder that fails :func:`private_folder` can be replaced.
FOLDER_ENV = "PHASESWEEP_STANDING_DIR"


def disabled_by_user() -> bool:
    """Whether the caller's environment turns Ray's token authentication off."""
    return os.environ.get(MODE, "").strip().lower() == DISABLED


def _refuse(path: Path, problem: str, fix: str) -> SpecError:
    return SpecError(
        f"${FOLDER_ENV}" if os.environ.get(FOLDER_ENV) else "state folder",
        str(path),
        f"{problem}; {fix}, or set ${FOLDER_ENV} to a new folder of your own",
        "environment" if os.environ.get(FOLDER_ENV) else "setup",
    )


def private_folder(path: Path, create: bool = True) -> bool:
    """Check that ``path`` is a folder only this account can use, creating it (mode 0700)
    when it is missing and ``create``; returns whether it exists.

    Refused (:class:`SpecError`, exit 2, naming the path and the fix): a symbolic link,
    anything but a folder, a folder another account owns (it may have planted it, and
    the files in it), a mode other than 0700, or a parent that other accounts may write
    to without the sticky bit (they could swap the folder after this check).
    """
    parent = path.parent
    if create:
        parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        else:  # 0700 whatever the umask; the folder itself, never a link put in its place
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            os.fchmod(fd, 0o700)
            os.close(fd)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    up = os.stat(parent)  # following links: /var/run -> /run is fine
    if up.st_mode & stat.S_IWOTH and not up.st_mode & stat.S_ISVTX:
        raise _refuse(path, f"its parent {parent} is writable by every account", "move it")
    if stat.S_ISLNK(st.st_mode):
        raise _refuse(path, "is a symbolic link", f"remove the link (rm {path})")
    if not stat.S_ISDIR(st.st_mode):
        raise _refuse(path, "is not a folder", f"remove it (rm {path})")
    if st.st_uid != os.getuid():
        raise _refuse(
            path,
            f"is owned by uid {st.st_uid}, not by you (uid {os.getuid()}): another account "
            "may have planted it",
            "have root or its owner remove it",
        )
    mode = stat.S_IMODE(st.st_mode)
    if mode != 0o700:
        raise _refuse(
            path,
            f"has mode {mode:04o}, not 0700",
            f"remove it (rm -r {path}), or chmod 700 {path} if no other account could write to it",
        )
    return True


def token_file(folder: Path) -> Path:
    """The token file ``folder/auth_token`` (``folder`` checked by :func:`private_folder`),
    written by the first caller: 256 random bits in hex, as Ray's own tokens, created
    complete under a temporary name and linked into place (``link`` fails if the name
    exists, so concurrent first callers agree on one token), mode 0600. Never rewritten:
    the Rays that use it read it again whenever they start a process."""
    path = folder / "auth_token"
    if not os.path.lexists(path):
        draft = folder / f".auth_token.{secrets.token_hex(4)}"
        fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, secrets.token_hex(32).encode())
            os.fsync(fd)
            os.close(fd)
            os.link(draft, path)
        except FileExistsError:
            pass  # another launch wrote it first: use that one
        finally:
            os.unlink(draft)
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise SpecError(
            "token file", str(path), "is not a file of yours with mode 0600; remove it", "setup"
        )
    return path


def token_env(path: Path | None) -> dict[str, str]:
    """Ray's settings for a Ray whose token is the file ``path``; None: authentication
    off (``RAY_AUTH_MODE=disabled``)."""
    return {MODE: DISABLED} if path is None else {MODE: "token", TOKEN_PATH: str(path)}


def use_token(env: dict[str, str], keep_token: bool = False) -> None:
    """Make :func:`token_env`'s settings ``env`` this process's, and ``$RAY_AUTH_TOKEN``
    (which would override the file) not, unless ``keep_token``; then :func:`refresh_ray`."""
    os.environ.update(env)
    if not keep_token:
        os.environ.pop(TOKEN, None)
    refresh_ray()


def refresh_ray() -> None:
    """Make Ray read its token settings from the environment again (it caches them per
    process), so that a process that used another Ray before (a notebook, a test
    session) presents the token the environment now names. Only while not connected."""
    raylet = sys.modules.get("ray._raylet")  # compiled: its names are invisible to pyright
    if raylet is not None:
        raylet.Config.initialize("")  # as Ray does when it turns token auth on itself
        raylet.AuthenticationTokenLoader.instance().reset_cache()


def private_temp_dir() -> str:
    """A new 0700 folder under ``$TMPDIR`` with Ray's temp folder inside it (returned:
    ``…/ps-ray-XXXXXXXX/r``; short, since Ray's socket paths live in it). Ray makes its
    temp folder and session folders world-writable; the private parent keeps other
    accounts out of the logs and sockets. Remove the parent when done."""
    return os.path.join(tempfile.mkdtemp(prefix="ps-ray-"), "r")


def joined_without_token() -> bool:
    """After ``ray.init``: whether this process runs without token authentication (Ray
    sets ``$RAY_AUTH_MODE`` when it turns authentication on by itself)."""
    return os.environ.get(MODE, "").strip().lower() != "token"


def warn_open(what: str, why: str) -> None:
    """One line on stderr: the Ray of this launch runs without token authentication."""
    print(
        f"phasesweep: warning: {what} runs without token authentication ({why}): any "
        "account or host that reaches it can run code as its owner; see SECURITY.md",
        file=sys.stderr,
        flush=True,
    )
