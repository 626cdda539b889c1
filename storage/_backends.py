"""Where a store's files live: one class per kind of location, chosen by the URI's scheme.

:class:`~storage._store.Store` is the interface every caller uses; a backend is what it
reads and writes through. A new kind of store (another object store) is one subclass of
:class:`Backend` and one :func:`register` of its scheme; nothing outside this module asks
which kind a store is.
"""

from __future__ import annotations

import os
import posixpath
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import pyarrow.fs as pafs
from fsspec import AbstractFileSystem
from fsspec.implementations.local import LocalFileSystem

#: URI scheme -> backend class (:func:`register`); a URI without a scheme is local.
BACKENDS: dict[str, type[Backend]] = {}


def register(cls: type[Backend]) -> type[Backend]:
    """Class decorator: the backend of URIs ``{cls.scheme}://…``."""
    BACKENDS[cls.scheme] = cls
    return cls


def open_backend(uri: str) -> Backend:
    """The backend of ``uri``: a local path, or ``SCHEME://…`` of a registered scheme.
    ``ValueError`` for a scheme that no backend serves, or a URI its backend rejects."""
    scheme, sep, _ = uri.partition("://")
    if not sep:
        return LocalBackend.from_uri(uri)
    if scheme not in BACKENDS:
        *forms, last = [b.form for b in BACKENDS.values()]
        known = ", ".join(["a local path", *forms])
        raise ValueError(f"unsupported store URI {uri!r}: use {known} or {last}")
    return BACKENDS[scheme].from_uri(uri)


@dataclass(frozen=True)
class Backend(ABC):
    """A store root on a file system.

    Attributes:
        uri: canonical URI of the root (an absolute local path, or ``SCHEME://…``).
        fs: fsspec file system holding the store.
        root: path of the store root on ``fs`` (no protocol).
    """

    uri: str
    fs: AbstractFileSystem
    root: str

    scheme: ClassVar[str]
    #: How a URI of this backend is written, for messages (``s3://BUCKET/PREFIX``).
    form: ClassVar[str]
    #: Whether paths on ``fs`` are paths of this machine's file system: DuckDB reads them
    #: itself, files are read one at a time (no request latency to hide), and a killed
    #: writer can leave a hidden temp file behind (:mod:`storage._writer`).
    local: ClassVar[bool] = False

    @classmethod
    @abstractmethod
    def from_uri(cls, uri: str) -> Backend:
        """The backend of ``uri`` (opens nothing remote, creates nothing)."""

    @property
    def arrow_fs(self) -> pafs.FileSystem:
        """The file system for ``pyarrow.dataset``."""
        return pafs.PyFileSystem(pafs.FSSpecHandler(self.fs))

    def url(self, path: str) -> str:
        """Full URL of a path on ``fs`` (as DuckDB reads it)."""
        return f"{self.scheme}://{path}"

    def relative(self, path: str) -> str:
        """``path`` on ``fs`` relative to the root, '/'-separated."""
        return path[len(self.root) + 1 :]

    def root_exists(self) -> bool:
        """Whether the store is there (an object store: its prefix holds an object)."""
        return self.fs.exists(self.root)

    def root_names(self) -> list[str]:
        """Sorted names of what the root holds, one level deep (none where it is missing)."""
        try:
            listed = self.fs.ls(self.root, detail=False)
        except FileNotFoundError:
            return []
        return sorted(posixpath.basename(str(p).rstrip("/")) for p in listed)

    def tails(self, paths: list[str], sizes: list[int]) -> list[bytes | BaseException]:
        """The last 8 bytes of every path (of the given sizes): a ``FileNotFoundError`` in
        place of one that vanished, another exception where one cannot be read. One
        batched, concurrent request per file."""
        return self.fs.cat_ranges(paths, [n - 8 for n in sizes], sizes, on_error="return")


@register
@dataclass(frozen=True)
class LocalBackend(Backend):
    """A folder of this machine: a path or ``file://PATH``."""

    scheme: ClassVar[str] = "file"
    form: ClassVar[str] = "file://PATH"
    local: ClassVar[bool] = True

    @classmethod
    def from_uri(cls, uri: str) -> LocalBackend:
        root = os.path.abspath(os.path.expanduser(uri.removeprefix("file://")))
        return cls(root, LocalFileSystem(), root)

    @property
    def arrow_fs(self) -> pafs.FileSystem:
        return pafs.LocalFileSystem()

    def url(self, path: str) -> str:
        return path

    def relative(self, path: str) -> str:
        return posixpath.relpath(path, self.root)

    def root_exists(self) -> bool:
        return self.fs.isdir(self.root)

    def root_names(self) -> list[str]:
        try:
            return sorted(os.listdir(self.root))
        except FileNotFoundError:
            return []
        except NotADirectoryError:  # a file where the store should be: not a store
            return [posixpath.basename(self.root)]

    def tails(self, paths: list[str], sizes: list[int]) -> list[bytes | BaseException]:
        tails: list[bytes | BaseException] = []
        for path, size in zip(paths, sizes):
            try:
                with open(path, "rb") as f:
                    f.seek(size - 8)
                    tails.append(f.read(8))
            except FileNotFoundError as e:
                tails.append(e)
        return tails


@register
@dataclass(frozen=True)
class S3Backend(Backend):
    """An S3 (or S3-compatible) bucket and prefix: ``s3://BUCKET/PREFIX``.

    The endpoint is ``$PHASESWEEP_S3_ENDPOINT``, else ``$AWS_ENDPOINT_URL``, else AWS;
    the credentials come from the usual AWS environment variables and files.
    """

    scheme: ClassVar[str] = "s3"
    form: ClassVar[str] = "s3://BUCKET/PREFIX"

    @classmethod
    def from_uri(cls, uri: str) -> S3Backend:
        root = uri.removeprefix("s3://").strip("/")
        if not root:
            raise ValueError(f"store URI {uri!r} names no bucket")
        endpoint = os.environ.get("PHASESWEEP_S3_ENDPOINT") or os.environ.get("AWS_ENDPOINT_URL")
        import s3fs

        # No listings cache: a reader must see chunks committed after it started.
        fs = s3fs.S3FileSystem(
            endpoint_url=endpoint, use_listings_cache=False, skip_instance_cache=True
        )
        return cls(f"s3://{root}", fs, root)
