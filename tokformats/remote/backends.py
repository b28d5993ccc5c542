"""Where remote bytes come from: HTTP(S) with the standard library, ``s3://``/``gs://``/``hf://`` through fsspec.

A backend answers four questions about a URL (``stat``: size, ETag, any checksum the store keeps), downloads a byte
range into a file (resuming with HTTP Range/If-Range), lists a prefix when the store can, uploads and deletes. Every
request is retried a bounded number of times with backoff; a URL that keeps failing raises :class:`RemoteError`
naming it and the status. Credentials come from each store's usual environment and configuration (or the URL's user
info, sent as HTTP Basic authentication) and never appear in a message: messages name :func:`public_url` only.

Nothing a store sends is trusted (:class:`Limits`): connecting and receiving an answer's headers takes at most
``connect_timeout`` seconds, a body that sends no byte for ``stall_timeout`` seconds fails, a body never runs past
the size its headers announce (the rest is refused, not stored), and an index file larger than ``max_index_bytes``
is refused before its first byte is kept.
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
from ..fs.paths import is_url, public_url, scrub_secrets

__all__ = ["RemoteError", "NotFoundError", "DeniedError", "OversizeError", "StallError", "RemoteStat", "Limits",
           "Backend", "HTTPBackend", "FsspecBackend", "backend_for", "is_url", "RETRIES"]  # fmt: skip

#: Attempts per request before giving up, and the first backoff (doubled each time, capped at 2 s).
RETRIES = 5
BACKOFF = 0.1
MAX_BACKOFF = 2.0
#: Seconds to connect and receive an answer's headers.
TIMEOUT = 30.0
#: Seconds a body may send nothing before the transfer counts as stalled.
STALL_TIMEOUT = 60.0
#: The largest index file (``SHA256SUMS``, a manifest, ``index.json``, ``state.json``, ``meta.json``) fetched.
MAX_INDEX_BYTES = 64 << 20
#: The fewest bytes a body must deliver per ``stall_timeout`` (a trickle slower than this is a stall).
MIN_BYTES_PER_STALL = 1024
_BLOCK = 1 << 20
_T = TypeVar("_T")


class RemoteError(FormatError):
    """A remote dataset could not be fetched (network, permissions, a wrong checksum)."""

    #: The HTTP status the store answered, when it answered one (404, 403, 503, ...).
    status: int | None = None


class NotFoundError(RemoteError):
    """The store has nothing at the URL (HTTP 404, a missing object)."""


class DeniedError(RemoteError):
    """The store refused the request (HTTP 401/403, no permission): another attempt would not change that."""

    transient = False


class OversizeError(RemoteError):
    """A store sent more than it announced, or an index file is larger than ``max_index_bytes``."""

    transient = False


class StallError(RemoteError):
    """A transfer sent no byte for ``stall_timeout`` seconds (or the answer's headers took ``connect_timeout``)."""


def _env_number(name: str, default: float) -> float:
    """A positive number from environment variable ``name``, else ``default``."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise FormatError(f"${name} is {text!r}; it must be a positive number (unset it for {default:g}).") from None
    if not value > 0:
        raise FormatError(f"${name} is {text!r}; it must be a positive number (unset it for {default:g}).")
    return value


@dataclass(frozen=True)
class Limits:
    """How long and how much a store may take. Each is an option of ``tokformats.open(url, ...)`` and
    :class:`~tokformats.remote.Cache`; None takes the environment variable, else the default.

    Attributes:
        connect_timeout: seconds to connect and receive an answer's headers (``$TOKFORMATS_CONNECT_TIMEOUT``, 30).
        stall_timeout: seconds a transfer may send no byte (``$TOKFORMATS_STALL_TIMEOUT``, 60).
        retries: attempts per request (``$TOKFORMATS_RETRIES``, 5).
        max_index_bytes: the largest index file fetched (``$TOKFORMATS_MAX_INDEX_BYTES``, 64 MiB).
    """

    connect_timeout: float = TIMEOUT
    stall_timeout: float = STALL_TIMEOUT
    retries: int = RETRIES
    max_index_bytes: int = MAX_INDEX_BYTES

    @classmethod
    def of(
        cls,
        connect_timeout: float | None = None,
        stall_timeout: float | None = None,
        retries: int | None = None,
        max_index_bytes: int | None = None,
    ) -> Limits:
        """The limits given, the environment's for those not given, the defaults for the rest (a limit given as 0 is
        refused, not taken for one not given)."""

        def chosen(given: float | None, name: str, default: float) -> float:
            return given if given is not None else _env_number(name, default)

        limits = cls(
            float(chosen(connect_timeout, "TOKFORMATS_CONNECT_TIMEOUT", TIMEOUT)),
            float(chosen(stall_timeout, "TOKFORMATS_STALL_TIMEOUT", STALL_TIMEOUT)),
            int(chosen(retries, "TOKFORMATS_RETRIES", RETRIES)),
            int(chosen(max_index_bytes, "TOKFORMATS_MAX_INDEX_BYTES", MAX_INDEX_BYTES)),
        )
        for name, value in vars(limits).items():
            if not value > 0:
                raise FormatError(f"{name}={value!r}: it must be positive.")
        return limits


@dataclass(frozen=True)
class RemoteStat:
    """What the store says about an object: its size, its ETag and a SHA-256 when it keeps one."""

    size: int
    etag: str | None = None
    sha256: str | None = None


def _safe(url: str) -> str:
    """``url`` without credentials or a query string (signed URLs carry secrets there), for messages."""
    return public_url(url)


def _retrying(what: str, url: str, attempt: Callable[[], _T], retries: int = RETRIES) -> _T:
    """Run ``attempt`` until it succeeds, retrying transient failures with bounded backoff. The error raised names
    :func:`public_url` only and carries no foreign exception (whose message or ``__context__`` may quote a secret)."""
    delay = BACKOFF
    failure = RemoteError(f"{what} {_safe(url)} was not attempted.")  # replaced by each attempt's failure
    for number in range(1, max(retries, 1) + 1):
        try:
            return attempt()
        except NotFoundError as error:
            failure = error
            break
        except RemoteError as error:
            failure = error
            if not getattr(error, "transient", True):
                break
        except (OSError, http.client.HTTPException) as error:
            failure = network_error(what, url, error)
        if number < retries:
            time.sleep(delay)
            delay = min(delay * 2, MAX_BACKOFF)
    if failure.__context__ is not None or failure.__cause__ is not None:
        failure = type(failure)(str(failure))
    raise failure


def network_error(what: str, url: str, error: BaseException) -> RemoteError:
    """A :class:`RemoteError` (transient: worth another attempt) for a foreign network failure, its message
    scrubbed of ``url``'s secrets."""
    if isinstance(error, TimeoutError) or "timed out" in str(error):
        return StallError(f"{what} {public_url(url)} timed out (no answer or no byte within the timeout).")
    detail = scrub_secrets(f"{type(error).__name__}: {error}", url)
    failure = RemoteError(f"{what} {public_url(url)} failed: {detail}")
    failure.transient = not isinstance(error, http.client.HTTPException) or isinstance(  # type: ignore[attr-defined]
        error, http.client.IncompleteRead
    )
    return failure


def copy_bounded(
    url: str, read: Callable[[int], bytes], handle: BinaryIO, expected: int, stall_timeout: float | None = None
) -> int:
    """Copy a body from ``read`` to ``handle``, at most ``expected`` bytes (what the store announced): one byte
    more raises :class:`OversizeError` (a body longer than announced is never stored). With ``stall_timeout``, a
    body that trickles (fewer than :data:`MIN_BYTES_PER_STALL` bytes in ``stall_timeout`` seconds) is a
    :class:`StallError` too: ``read`` must then return what has arrived (``read1``). Returns the bytes copied (fewer
    when the connection ended early)."""
    left = expected
    window, arrived = time.monotonic(), 0
    while True:
        try:
            block = read(min(_BLOCK, left + 1))
        except (OSError, http.client.HTTPException) as error:
            failure = network_error("GET", url, error)
            break
        if not block:
            return expected - left
        if len(block) > left:
            raise OversizeError(
                f"{public_url(url)} sent more than the {expected:,} bytes it announced; the download was stopped."
            )
        handle.write(block)
        left -= len(block)
        arrived += len(block)
        if stall_timeout is not None and time.monotonic() - window >= stall_timeout:
            if arrived < MIN_BYTES_PER_STALL:
                failure = StallError(
                    f"GET {public_url(url)} trickles ({arrived:,} bytes in {stall_timeout:g} s, fewer than "
                    f"{MIN_BYTES_PER_STALL:,}): counted as stalled (stall_timeout= or $TOKFORMATS_STALL_TIMEOUT)."
                )
                break
            window, arrived = time.monotonic(), 0
    raise failure


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

    def delete(self, url: str) -> None:
        """Remove the object at ``url`` (``publish(..., prune=True)``)."""
        raise RemoteError(f"{type(self).__name__} cannot delete {public_url(url)}; remove it with the store's tools.")


class _SafeRedirects(urllib.request.HTTPRedirectHandler):
    """Redirects to HTTP(S) only (urllib also follows ``ftp://``), and never with the ``Authorization`` header to
    another host (urllib forwards every header but the body's)."""

    def redirect_request(
        self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any, newurl: str
    ) -> urllib.request.Request | None:
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is None:
            return None
        target = urllib.parse.urlsplit(newurl)
        if target.scheme not in ("http", "https"):
            refused = f"a redirect to {target.scheme}:// is refused"
            raise urllib.error.HTTPError(req.full_url, code, refused, headers, fp)
        if target.netloc != urllib.parse.urlsplit(req.full_url).netloc:
            new.remove_header("Authorization")
        return new


_OPENER = urllib.request.build_opener(_SafeRedirects)


class HTTPBackend(Backend):
    """HTTP(S) with ``urllib``: HEAD for the size and ETag, ranged GETs with ``If-Range``, PUT to publish, DELETE to
    prune. User info in a URL (``https://user:token@host/...``) is sent as Basic authentication, never in the URL."""

    def __init__(self, headers: dict[str, str] | None = None, limits: Limits | None = None) -> None:
        self.headers = {"User-Agent": "tokformats", **(headers or {})}
        self.limits = limits or Limits.of()

    def _request(self, url: str, method: str = "GET", headers: dict[str, str] | None = None, data: Any = None) -> Any:
        """A request for ``url`` with its user info moved into an ``Authorization`` header."""
        parts = urllib.parse.urlsplit(url)
        sent = {**self.headers, **(headers or {})}
        if parts.username is not None:
            secret = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
            sent["Authorization"] = "Basic " + base64.b64encode(secret.encode("utf-8")).decode("ascii")
            host = parts.hostname or ""
            host = f"[{host}]" if ":" in host else host
            parts = parts._replace(netloc=f"{host}:{parts.port}" if parts.port else host)
        return urllib.request.Request(urllib.parse.urlunsplit(parts), data=data, method=method, headers=sent)

    def _open(self, request: urllib.request.Request, url: str) -> Any:
        """The answer to ``request`` (its headers within ``connect_timeout``; its body then read with
        ``stall_timeout``), or a :class:`RemoteError` naming :func:`public_url` only, with no foreign context."""
        failure: RemoteError
        try:
            answer = _OPENER.open(request, timeout=self.limits.connect_timeout)
        except urllib.error.HTTPError as error:
            error.close()
            if error.code == 404:
                failure = NotFoundError(f"{public_url(url)} does not exist (HTTP 404).")
            elif error.code in (401, 403):
                failure = DeniedError(f"{public_url(url)} answered HTTP {error.code} {str(error.reason)[:200]}.")
            else:
                failure = RemoteError(f"{public_url(url)} answered HTTP {error.code} {str(error.reason)[:200]}.")
                failure.transient = error.code >= 500 or error.code == 429  # type: ignore[attr-defined]
            failure.status = error.code
        except (OSError, http.client.HTTPException, ValueError) as error:
            failure = network_error(request.get_method(), url, error)
        else:
            _set_read_timeout(answer, self.limits.stall_timeout)
            return answer
        raise failure

    def stat(self, url: str) -> RemoteStat:
        def head() -> RemoteStat:
            with self._open(self._request(url, "HEAD"), url) as answer:
                return self._stat_of(url, answer.headers, True)

        return _retrying("HEAD", url, head, self.limits.retries)

    def download(
        self, url: str, handle: BinaryIO, start: int, etag: str | None, answered: Answered = _accept
    ) -> None:
        headers = {}
        if start:
            headers["Range"] = f"bytes={start}-"
            if etag:
                headers["If-Range"] = etag
        with self._open(self._request(url, headers=headers), url) as answer:
            whole = answer.status != 206  # a 200: the whole object (a changed one, or a server without ranges)
            stat = self._stat_of(url, answer.headers, whole)
            if not whole and not (answer.headers.get("Content-Range") or "").startswith(f"bytes {start}-"):
                raise RemoteError(f"{public_url(url)} answered a request for bytes {start:,}- with another range.")
            answered(stat, whole)
            size = stat.size - (0 if whole else start)
            copy_bounded(url, answer.read1, handle, size, self.limits.stall_timeout)  # read1: what has arrived

    def read_range(self, url: str, start: int, stop: int) -> bytes:
        if stop <= start:
            return b""

        def get() -> bytes:
            request = self._request(url, headers={"Range": f"bytes={start}-{stop - 1}"})
            failure: RemoteError | None = None
            with self._open(request, url) as answer:
                try:
                    data: bytes = answer.read(stop - start + 1) if answer.status == 206 else answer.read(stop)[start:]
                except (OSError, http.client.HTTPException) as error:
                    failure = network_error("GET", url, error)
            if failure is not None:
                raise failure
            if len(data) != stop - start:
                raise ConnectionError(f"{len(data):,} bytes of range {start:,}-{stop - 1:,} arrived")
            return data

        return _retrying("GET", url, get, self.limits.retries)

    @staticmethod
    def _stat_of(url: str, headers: Any, whole: bool) -> RemoteStat:
        """The whole object's size (``Content-Length`` of a 200, the total of a 206's ``Content-Range``), ETag and
        SHA-256 header."""
        if whole:
            length = headers.get("Content-Length")
        else:
            length = (headers.get("Content-Range") or "").rpartition("/")[2]
        if length is None or not str(length).strip().isdigit() or len(str(length).strip()) > 18:
            raise RemoteError(f"{public_url(url)} gives no size (Content-Length, Content-Range); it cannot be checked.")
        etag, sha256 = headers.get("ETag"), headers.get("X-Checksum-Sha256")
        return RemoteStat(int(length), etag[:1024] if etag else None, sha256[:128] if sha256 else None)

    def upload(self, path: str, url: str) -> None:
        def put() -> None:
            with open(path, "rb") as source:
                size = os.fstat(source.fileno()).st_size
                request = self._request(url, "PUT", {"Content-Length": str(size)}, data=source)
                with self._open(request, url):
                    pass

        _retrying("PUT", url, put, self.limits.retries)

    def delete(self, url: str) -> None:
        def remove() -> None:
            with self._open(self._request(url, "DELETE"), url):
                pass

        _retrying("DELETE", url, remove, self.limits.retries)


def _set_read_timeout(answer: Any, seconds: float) -> None:
    """Make every further read of ``answer``'s body wait at most ``seconds`` for a byte (urllib's one ``timeout``
    also bounds connecting; the body gets its own)."""
    raw = getattr(getattr(answer, "fp", None), "raw", None)
    sock = getattr(raw, "_sock", None)
    if sock is not None:
        sock.settimeout(seconds)


class FsspecBackend(Backend):
    """``s3://``, ``gs://``, ``hf://`` through fsspec (``pip install 'tokformats[remote]'`` and the store's package:
    s3fs, gcsfs or huggingface_hub)."""

    PACKAGES: ClassVar[dict[str, str]] = {"s3": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "hf": "huggingface_hub"}

    def __init__(self, scheme: str, limits: Limits | None = None, **options: Any) -> None:
        self.limits = limits or Limits.of()
        try:
            import fsspec
        except ImportError:
            raise ImportError(f"{scheme}:// URLs need fsspec: pip install 'tokformats[remote]'.") from None
        if scheme == "s3" and "config_kwargs" not in options:  # botocore's own timeouts and retries: the limits'
            options = {**options, "config_kwargs": {
                "connect_timeout": self.limits.connect_timeout,
                "read_timeout": self.limits.stall_timeout,
                "retries": {"max_attempts": self.limits.retries},
            }}  # fmt: skip
        try:
            self.fs = fsspec.filesystem(scheme, **options)
        except ImportError:
            package = self.PACKAGES.get(scheme, scheme)
            raise ImportError(f"{scheme}:// URLs need {package}: pip install {package}.") from None
        self.scheme = scheme

    def _call(self, what: str, url: str, function: Callable[[], _T], retries: int | None = None) -> _T:
        def attempt() -> _T:
            failure: RemoteError
            try:
                return function()
            except FileNotFoundError:
                failure = NotFoundError(f"{_safe(url)} does not exist.")
            except PermissionError as error:
                failure = DeniedError(f"{what} {_safe(url)} was refused: {scrub_secrets(str(error), url)}")
            raise failure

        return _retrying(what, url, attempt, self.limits.retries if retries is None else retries)

    def stat(self, url: str) -> RemoteStat:
        return self._stat_of(url, self._call("stat", url, lambda: self.fs.info(url)))

    @staticmethod
    def _stat_of(url: str, info: dict[str, Any]) -> RemoteStat:
        if info.get("type") == "directory":
            raise NotFoundError(f"{_safe(url)} is a prefix, not an object.")
        checksum = info.get("ChecksumSHA256")
        sha256 = base64.b64decode(checksum).hex() if isinstance(checksum, str) and "-" not in checksum else None
        size = info.get("size")
        if not isinstance(size, int) or size < 0:
            raise RemoteError(f"{public_url(url)} gives no size ({size!r:.40}); it cannot be checked.")
        return RemoteStat(size, info.get("ETag"), sha256)

    def download(
        self, url: str, handle: BinaryIO, start: int, etag: str | None, answered: Answered = _accept
    ) -> None:
        def read() -> None:
            with self.fs.open(url, "rb", block_size=_BLOCK) as source:
                stat = self._stat_of(url, getattr(source, "details", None) or self.fs.info(url))
                whole = not start or bool(etag and stat.etag and stat.etag != etag)  # changed since: all of it
                answered(stat, whole)
                source.seek(0 if whole else start)
                copy_bounded(url, source.read, handle, stat.size - (0 if whole else start))

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

    def delete(self, url: str) -> None:
        self._call("DELETE", url, lambda: self.fs.rm_file(url))


def backend_for(url: str, limits: Limits | None = None, **options: Any) -> Backend:
    """The backend of ``url``'s scheme."""
    if "://" not in url:  # a local path: it has no scheme to name
        raise RemoteError(f"{url} is not a URL; pass a store's folder URL ({', '.join(_SCHEMES)}).")
    scheme = url.split("://", 1)[0].lower()
    if scheme in ("http", "https"):
        return HTTPBackend(options.get("headers"), limits)
    if scheme in FsspecBackend.PACKAGES:
        return FsspecBackend(scheme, limits, **options)
    raise RemoteError(f"tokformats cannot fetch {scheme}:// URLs; it knows {', '.join(_SCHEMES)}.")
