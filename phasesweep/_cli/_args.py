"""Argument types the commands share (argparse ``type=``): each checks the syntax of one
kind of value and says in one line what it expected (exit 2, nothing written)."""

from __future__ import annotations

import argparse
import ipaddress
import math
import re
import urllib.parse
from collections.abc import Callable
from pathlib import Path

from phasesweep._config import excerpt


def bounded(kind: type, low: float, strict: bool) -> Callable[[str], object]:
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


def address(text: str) -> str:
    """An argparse type for ``--address``: ``auto``, ``local``, ``standing``, ``HOST:PORT``
    or ``ray://HOST:PORT`` (HOST a host name, an IPv4 address or ``[IPv6]``). Syntax only:
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


def store_uri(text: str) -> str:
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
