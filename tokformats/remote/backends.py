"""Where remote bytes come from: HTTP(S) with the standard library, ``s3://``/``gs://``/``hf://`` through fsspec.

A backend answers four questions about a URL (``stat``: size, ETag, any checksum the store keeps), downloads a byte
range into a file (resuming with HTTP Range/If-Range), lists a prefix when the store can, and uploads. Every request
is retried a bounded number of times with backoff; a URL that keeps failing raises :class:`RemoteError` naming it
and the status. Credentials come from each store's usual environment and configuration and never appear in a
message.
"""

from __future__ import annotations

import base64
import http.client
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO, ClassVar, TypeVar

from ..errors import FormatError
from ..fs.paths import URL_SCHEMES as _SCHEMES
from ..fs.paths import is_url

__all__ = ["RemoteError", "NotFoundError", "RemoteStat", "Backend", "HTTPBackend", "FsspecBackend", "backend_for",
           "is_url", "RETRIES"]  # fmt: skip

#: Attempts per request before giving up, and the first backoff (doubled each time, capped at 2 s).
RETRIES = 5
BACKOFF = 0.1
MAX_BACKOFF = 2.0
#: Seconds a connection may stay silent before the attempt counts as failed.
TIMEOUT = 30.0
_BLOCK = 1 << 20
_T = TypeVar("_T")


class RemoteError(FormatError):
    """A remote dataset could not be fetched (network, permissions, a wrong checksum)."""


class NotFoundError(RemoteError):
    """The store has nothing at the URL (HTTP 404, a missing object)."""


@dataclass(frozen=True)
class RemoteStat:
    """What the store says about an object: its size, its ETag and a SHA-256 when it keeps one."""

    size: int
    etag: str | None = None
    sha256: str | None = None


def _safe(url: str) -> str:
    """``url`` without credentials or a query string (signed URLs carry secrets there), for messages."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))


def _retrying(what: str, url: str, attempt: Callable[[], _T], retries: int = RETRIES) -> _T:
    """Run ``attempt`` until it succeeds, retrying transient failures with bounded backoff."""
    delay = BACKOFF
    for number in range(1, retries + 1):
        try:
            return attempt()
        except NotFoundError:
            raise
        except RemoteError as error:
            if number == retries or not getattr(error, "transient", True):
                raise
        except (OSError, TimeoutError) as error:
            if number == retries:
                raise RemoteError(f"{what} {_safe(url)} failed after {retries} attempts: {error}") from None
        time.sleep(delay)
        delay = min(delay * 2, MAX_BACKOFF)
    raise AssertionError("unreachable")  # the loop returns or raises


#: ``answered(stat, whole)``: called by :meth:`Backend.download` before the first byte.
Answered = Callable[[RemoteStat, bool], None]


def _accept(stat: RemoteStat, whole: bool) -> None:
    """The default :data:`Answered`: any answer will do."""


class Backend(ABC):
    """The operations the cache and ``publish`` need from a store."""

    @abstractmethod
    def stat(self, url: str) -> RemoteStat:
        """Size, ETag and checksum of the object at ``url``; :class:`NotFoundError` when there is none."""

    @abstractmethod
    def download(
        self, url: str, handle: BinaryIO, start: int, etag: str | None, answered: Answered = _accept
    ) -> None:
        """Write the object's bytes from ``start`` (with ``If-Range: etag``) to ``handle``, or all of them when the
        store sends the whole object (it ignored the range, or the object changed since ``etag``). Before the first
        byte, ``answered(stat, whole)`` hears what the store says of the whole object and whether it sends all of
        it: it may raise to stop, or empty ``handle`` for a whole object. One request, no separate ``HEAD``."""

    @abstractmethod
    def read_range(self, url: str, start: int, stop: int) -> bytes:
        """Bytes ``start:stop`` of the object at ``url`` (a header, without downloading the object)."""

    def listing(self, url: str) -> list[str] | None:
        """Names of the objects under the prefix ``url`` (relative to it), or None when the store cannot list."""
        return None

    @abstractmethod
    def upload(self, path: str, url: str) -> None:
        """Store local file ``path`` at ``url``."""


class HTTPBackend(Backend):
    """HTTP(S) with ``urllib``: HEAD for the size and ETag, ranged GETs with ``If-Range``, PUT to publish."""

    def __init__(self, headers: dict[str, str] | None = None) -> None:
        self.headers = {"User-Agent": "tokformats", **(headers or {})}

    def _open(self, request: urllib.request.Request, url: str) -> Any:
        try:
            return urllib.request.urlopen(request, timeout=TIMEOUT)
        except urllib.error.HTTPError as error:
            if error.code == 404:
                raise NotFoundError(f"{_safe(url)} does not exist (HTTP 404).") from None
            failure = RemoteError(f"{_safe(url)} answered HTTP {error.code} {error.reason}.")
            failure.transient = error.code >= 500 or error.code == 429  # type: ignore[attr-defined]
            raise failure from None

    def stat(self, url: str) -> RemoteStat:
        def head() -> RemoteStat:
            with self._open(urllib.request.Request(url, method="HEAD", headers=self.headers), url) as answer:
                return self._stat_of(url, answer.headers, True)

        return _retrying("HEAD", url, head)

    def download(
        self, url: str, handle: BinaryIO, start: int, etag: str | None, answered: Answered = _accept
    ) -> None:
        headers = dict(self.headers)
        if start:
            headers["Range"] = f"bytes={start}-"
            if etag:
                headers["If-Range"] = etag
        with self._open(urllib.request.Request(url, headers=headers), url) as answer:
            whole = answer.status != 206  # a 200: the whole object (a changed one, or a server without ranges)
            answered(self._stat_of(url, answer.headers, whole), whole)
            try:
                while block := answer.read(_BLOCK):
                    handle.write(block)
            except http.client.HTTPException as error:  # IncompleteRead: the connection ended mid-body
                raise ConnectionError(f"{_safe(url)}: the connection ended early ({error!r})") from None

    def read_range(self, url: str, start: int, stop: int) -> bytes:
        if stop <= start:
            return b""

        def get() -> bytes:
            headers = {**self.headers, "Range": f"bytes={start}-{stop - 1}"}
            with self._open(urllib.request.Request(url, headers=headers), url) as answer:
                data: bytes = answer.read() if answer.status == 206 else answer.read(stop)[start:]
            if len(data) != stop - start:
                raise ConnectionError(f"{_safe(url)}: {len(data):,} bytes of range {start:,}-{stop - 1:,} arrived")
            return data

        return _retrying("GET", url, get)

    @staticmethod
    def _stat_of(url: str, headers: Any, whole: bool) -> RemoteStat:
        """The whole object's size (``Content-Length`` of a 200, the total of a 206's ``Content-Range``), ETag and
        SHA-256 header."""
        if whole:
            length = headers.get("Content-Length")
        else:
            length = (headers.get("Content-Range") or "").rpartition("/")[2]
        if length is None or not str(length).strip().isdigit():
            raise RemoteError(f"{_safe(url)} gives no size (Content-Length, Content-Range); it cannot be checked.")
        return RemoteStat(int(length), headers.get("ETag"), headers.get("X-Checksum-Sha256"))

    def upload(self, path: str, url: str) -> None:
        def put() -> None:
            with open(path, "rb") as source:
                size = os.fstat(source.fileno()).st_size
                request = urllib.request.Request(
                    url, data=source, method="PUT", headers={**self.headers, "Content-Length": str(size)}
                )
                with self._open(request, url):
                    pass

        _retrying("PUT", url, put)


class FsspecBackend(Backend):
    """``s3://``, ``gs://``, ``hf://`` through fsspec (``pip install 'tokformats[remote]'`` and the store's package:
    s3fs, gcsfs or huggingface_hub)."""

    PACKAGES: ClassVar[dict[str, str]] = {"s3": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "hf": "huggingface_hub"}

    def __init__(self, scheme: str, **options: Any) -> None:
        try:
            import fsspec
        except ImportError:
            raise ImportError(f"{scheme}:// URLs need fsspec: pip install 'tokformats[remote]'.") from None
        try:
            self.fs = fsspec.filesystem(scheme, **options)
        except ImportError:
            package = self.PACKAGES.get(scheme, scheme)
            raise ImportError(f"{scheme}:// URLs need {package}: pip install {package}.") from None
        self.scheme = scheme

    def _call(self, what: str, url: str, function: Callable[[], _T], retries: int = RETRIES) -> _T:
        def attempt() -> _T:
            try:
                return function()
            except FileNotFoundError:
                raise NotFoundError(f"{_safe(url)} does not exist.") from None
            except PermissionError as error:
                failure = RemoteError(f"{what} {_safe(url)} was refused: {error}")
                failure.transient = False  # type: ignore[attr-defined]
                raise failure from None

        return _retrying(what, url, attempt, retries)

    def stat(self, url: str) -> RemoteStat:
        return self._stat_of(url, self._call("stat", url, lambda: self.fs.info(url)))

    @staticmethod
    def _stat_of(url: str, info: dict[str, Any]) -> RemoteStat:
        if info.get("type") == "directory":
            raise NotFoundError(f"{_safe(url)} is a prefix, not an object.")
        checksum = info.get("ChecksumSHA256")
        sha256 = base64.b64decode(checksum).hex() if isinstance(checksum, str) and "-" not in checksum else None
        return RemoteStat(int(info["size"]), info.get("ETag"), sha256)

    def download(
        self, url: str, handle: BinaryIO, start: int, etag: str | None, answered: Answered = _accept
    ) -> None:
        def read() -> None:
            with self.fs.open(url, "rb", block_size=_BLOCK) as source:
                stat = self._stat_of(url, getattr(source, "details", None) or self.fs.info(url))
                whole = not start or bool(etag and stat.etag and stat.etag != etag)  # changed since: all of it
                answered(stat, whole)
                source.seek(0 if whole else start)
                while block := source.read(_BLOCK):
                    handle.write(block)

        self._call("GET", url, read, retries=1)  # the cache retries, resuming after what arrived

    def read_range(self, url: str, start: int, stop: int) -> bytes:
        data: bytes = self._call("GET", url, lambda: self.fs.cat_file(url, start=start, end=stop))
        if len(data) != max(stop - start, 0):
            raise RemoteError(f"{_safe(url)}: {len(data):,} bytes of range {start:,}-{stop - 1:,} arrived.")
        return data

    def listing(self, url: str) -> list[str] | None:
        base = url.rstrip("/") + "/"
        found = self._call("list", url, lambda: self.fs.find(base))
        root = base.split("://", 1)[1]
        return sorted(str(p)[len(root) :] for p in found if str(p).startswith(root))

    def upload(self, path: str, url: str) -> None:
        self._call("PUT", url, lambda: self.fs.put_file(path, url))


def backend_for(url: str, **options: Any) -> Backend:
    """The backend of ``url``'s scheme."""
    if "://" not in url:  # a local path: it has no scheme to name
        raise RemoteError(f"{url} is not a URL; pass a store's folder URL ({', '.join(_SCHEMES)}).")
    scheme = url.split("://", 1)[0].lower()
    if scheme in ("http", "https"):
        return HTTPBackend(options.get("headers"))
    if scheme in FsspecBackend.PACKAGES:
        return FsspecBackend(scheme, **options)
    raise RemoteError(f"tokformats cannot fetch {scheme}:// URLs; it knows {', '.join(_SCHEMES)}.")
