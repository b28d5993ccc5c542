"""The local cache of remote datasets: files appear only complete and verified, downloads resume, processes share.

Layout: ``CACHE_DIR/{name}-{digest}/`` per dataset URL (``~/.cache/tokformats`` unless ``cache_dir=`` or
``$TOKFORMATS_CACHE``), mirroring the dataset's relative file names. A file is downloaded to ``NAME.partial`` (with
``NAME.partial.json`` recording the ETag it came from), checked (size, then SHA-256 from the dataset's own record,
a ``SHA256SUMS`` sidecar or the store), fsynced and renamed: a name in the cache is always a whole, verified file.
An interrupted download resumes with a Range request when the object is unchanged (``If-Range``), else restarts.

Processes on one node (ranks, DataLoader workers) take a file lock per file: one downloads, the others wait and
then map it. Readers hold a shared lock on each file they use (:class:`Lease`); ``max_cache_bytes`` evicts the
least recently used files no reader holds. ``offline=True`` (or ``TOKFORMATS_OFFLINE=1``) uses only what is cached.

Nothing found in the cache or sent by a store is trusted: a name becomes a path only after
:func:`~tokformats.remote.cachefiles.dataset_name`; links planted in a shared root are never followed; a cached file
is used only when it matches what the dataset's records say now (its SHA-256, recorded at download in
``.tokformats-meta/``); a cached index file is revalidated with the store once per :class:`Cache`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import os
import re
import stat
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

from ..fs.journal import fsync_folder
from ..fs.names import safe_relative_name
from ..fs.paths import public_url, scrub_secrets
from . import backends
from .backends import (
    Backend,
    DeniedError,
    Limits,
    NotFoundError,
    OversizeError,
    RemoteError,
    RemoteStat,
    _safe,
    backend_for,
)
from .byte_progress import ByteProgress
from .cachefiles import (
    LOCKS,
    META,
    PARTIAL,
    UnsafeCacheError,
    clear_non_file,
    dataset_name,
    open_no_follow,
    own_folder,
    read_meta,
    regular_file,
    write_meta,
)
from .sums import MAX_SUMS_LINE, SUMS, IndexFormatError, parse_sums_line
from .transfer import ChecksumError, Hashing, Restart, Transfer

__all__ = ["Cache", "Lease", "ChecksumError", "NotCachedError", "UnsafeCacheError", "default_cache_dir",
           "offline_default", "file_sha256", "SUMS", "IndexFormatError"]  # fmt: skip

_READ_ONLY = (errno.EROFS, errno.EACCES, errno.EPERM)
_HASH_BLOCK = 1 << 22


class NotCachedError(NotFoundError):
    """Offline mode, and the file is not in the cache."""


def default_cache_dir() -> Path:
    """``$TOKFORMATS_CACHE``, else ``~/.cache/tokformats``."""
    return Path(os.environ.get("TOKFORMATS_CACHE") or "~/.cache/tokformats").expanduser()


def offline_default() -> bool:
    """Whether ``$TOKFORMATS_OFFLINE`` asks for cached files only."""
    return os.environ.get("TOKFORMATS_OFFLINE", "").lower() in ("1", "true", "yes")


def file_sha256(path: Path) -> str:
    """The SHA-256 (hex) of a file, read in blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(_HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _touch(path: Path) -> None:
    """Mark ``path`` used now for least-recently-used eviction: its access time only (its modification time is part
    of what open readers pinned, so it never changes once the file is in place)."""
    info = path.stat()
    with contextlib.suppress(OSError):  # a read-only cache is used as it is: the access time is only a hint
        os.utime(path, ns=(time.time_ns(), info.st_mtime_ns))


def _folder_name(url: str) -> str:
    """A readable, unique folder name for a dataset URL: its last path part plus a digest of the whole URL (without
    user info or query string: those never appear in a folder name, and do not change what the dataset is)."""
    base = public_url(url).rstrip("/")
    tail = re.sub(r"[^A-Za-z0-9._-]+", "_", base.rsplit("/", 1)[-1])[:48] or "dataset"
    return f"{tail}-{hashlib.sha256(base.encode('utf-8')).hexdigest()[:16]}"


@contextlib.contextmanager
def _locked(path: Path, kind: int) -> Iterator[int]:
    own_folder(path.parent)
    descriptor = open_no_follow(path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(descriptor, kind)
        yield descriptor
    finally:
        os.close(descriptor)  # closing releases the lock


class Lease:
    """Shared locks on cached files a reader uses, so that eviction leaves them alone; released by :meth:`release`
    (readers opened from a URL release it when closed or collected)."""

    def __init__(self, locks: list[Path] | None = None) -> None:
        self._descriptors: list[int] = []
        self._guard = threading.Lock()  # downloading threads add to one lease
        for lock in locks or []:
            self.add(lock)

    def add(self, lock: Path) -> None:
        """Hold ``lock`` too (nothing to hold in a read-only cache: nobody can evict from it)."""
        try:
            own_folder(lock.parent)
            descriptor = open_no_follow(lock, os.O_RDWR | os.O_CREAT)
        except OSError as error:
            if error.errno in _READ_ONLY:
                return
            raise
        fcntl.flock(descriptor, fcntl.LOCK_SH)
        with self._guard:
            self._descriptors.append(descriptor)

    def release(self) -> None:
        """Drop the locks."""
        with self._guard:
            while self._descriptors:
                os.close(self._descriptors.pop())

    def __del__(self) -> None:
        self.release()


class Cache:
    """The cached copy of one remote dataset.

    Args:
        url: the dataset's base URL (a folder, or the folder holding a file or prefix). User info and a query string
            (a signed URL's) are used for requests and never shown.
        cache_dir: the cache root (see :func:`default_cache_dir`).
        max_cache_bytes: evict least-recently-used files (of every dataset under the root) no reader holds once the
            root holds more.
        offline: never touch the network; a file not cached is an error.
        backend: the store (chosen from the URL's scheme by default).
        query: a query string sent with the dataset's requests (a token), or only with ``query_for``'s.
        query_for: the one file ``query`` is for (a presigned URL signs one object): the other files (its
            ``SHA256SUMS``, its companions) are asked for without it, and a refusal of an optional one counts as
            absent.
        connect_timeout, stall_timeout, retries, max_index_bytes: the store's :class:`~tokformats.remote.backends.
            Limits` (None: ``$TOKFORMATS_CONNECT_TIMEOUT``, ... else the defaults).
        revalidate: ask the store once per :class:`Cache` whether a cached index file (``SHA256SUMS``, a manifest)
            is still the published one (its ETag and size), so a republished dataset is seen; False trusts the
            cached copy (``offline=True`` never asks).
    """

    def __init__(
        self,
        url: str,
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        max_cache_bytes: float | None = None,
        offline: bool | None = None,
        backend: Backend | None = None,
        query: str | None = None,
        query_for: str | None = None,
        connect_timeout: float | None = None,
        stall_timeout: float | None = None,
        retries: int | None = None,
        max_index_bytes: int | None = None,
        revalidate: bool = True,
    ) -> None:
        base, _, own_query = url.partition("?")
        self._base = base.rstrip("/")
        self.query = query or own_query or None
        self.query_for = query_for
        self.url = public_url(self._base)
        self.root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        self.folder = self.root / _folder_name(self.url)
        self.max_cache_bytes = None if max_cache_bytes is None else int(max_cache_bytes)
        self.offline = offline_default() if offline is None else offline
        self.limits = Limits.of(connect_timeout, stall_timeout, retries, max_index_bytes)
        self.revalidate = revalidate
        self._backend = backend
        self._fresh: dict[str, bool] = {}  # index files revalidated by this cache: whether the cached copy is current
        #: Where downloads report the bytes that arrive (a ``fetch``'s progress bar), or None.
        self.progress: ByteProgress | None = None

    @property
    def source(self) -> str:
        """The dataset's URL as given (user info and query included): for requests and pickling, never messages."""
        return self._base + (f"?{self.query}" if self.query else "")

    @property
    def listing_url(self) -> str:
        """The URL whose listing is the dataset (no query string)."""
        return self._base

    @property
    def backend(self) -> Backend:
        """The store (made on first use: offline work never needs it)."""
        if self._backend is None:
            self._backend = backend_for(self._base, self.limits)
        return self._backend

    def url_of(self, name: str) -> str:
        """The URL of file ``name`` of the dataset (with the query string: show it with ``_safe`` only)."""
        quoted = urllib.parse.quote(name, safe="/") if self._base.startswith(("http:", "https:")) else name
        signed = self.query and (self.query_for is None or name == self.query_for)
        return f"{self._base}/{quoted}" + (f"?{self.query}" if signed else "")

    def check_name(self, name: object, where: str | None = None) -> str:
        """``name`` when it may be a file of this dataset (see :func:`~tokformats.remote.cachefiles.dataset_name`);
        ``where`` names the index and entry it came from."""
        where = where or f"{self.url}/"
        checked = dataset_name(name, where=where)
        if "/" in checked:  # the folders on the way: never a link (the file itself: see path())
            safe_relative_name(checked.rsplit("/", 1)[0], where=where, folder=self.folder)
        return checked

    def path(self, name: str) -> Path:
        """Where file ``name`` is (or will be) cached: the name is checked first, and the dataset's cache folder must
        be a folder, never a link planted in a shared root."""
        try:
            info = os.lstat(self.folder)
        except FileNotFoundError:
            info = None
        if info is not None and not stat.S_ISDIR(info.st_mode):
            raise UnsafeCacheError(
                f"{self.folder} (the cache of {self.url}/) is a link or a file, not a folder; tokformats never follows "
                f"it. Remove it (rm {self.folder}) and open the dataset again."
            )
        path = self.folder / self.check_name(name)
        clear_non_file(path)  # a link planted where the file goes is removed, never followed
        return path

    def lock_path(self, name: str) -> Path:
        """The lock readers hold (shared) while they use ``name``, and eviction takes (exclusive, never waiting)."""
        return self.folder / LOCKS / (name.replace("/", "%2F") + ".lock")

    def download_lock_path(self, name: str) -> Path:
        """The lock one process holds while it downloads ``name`` (the others wait on it). Apart from
        :meth:`lock_path`, so that a download never waits for readers: two processes each holding one file and
        fetching the other's would otherwise wait for each other forever."""
        return self.folder / LOCKS / (name.replace("/", "%2F") + ".download")

    def lease(self, names: list[str]) -> Lease:
        """Shared locks on cached files, held while a reader uses them."""
        return Lease([self.lock_path(n) for n in names])

    def cached(self, name: str, *, size: int | None = None, sha256: str | None = None) -> Path | None:
        """The cached file ``name`` when it is there (complete and verified; a regular file, never a link) and is
        of the ``size`` and ``sha256`` given (what the dataset's records say now), else None."""
        path = self.path(name)
        return path if self._verified(name, path, size, sha256) else None

    def _writable(self) -> bool:
        """Whether files can be added to the cache (False on a read-only mount or folder)."""
        probe = self.folder
        while not probe.exists() and probe != probe.parent:  # the nearest folder that exists decides
            probe = probe.parent
        return os.access(probe, os.W_OK) and not os.statvfs(probe).f_flag & os.ST_RDONLY

    def not_cached(self, name: str) -> NotCachedError:
        """The error for file ``name`` when offline mode is on and it is not cached."""
        return NotCachedError(
            f"{_safe(self.url_of(name))} is not in the cache ({self.folder}) and offline mode is on "
            "(offline=True or TOKFORMATS_OFFLINE)."
        )

    def stat(self, name: str) -> RemoteStat:
        """What the store says about file ``name`` (its size), without downloading it."""
        if self.offline:
            raise self.not_cached(name)
        return self.backend.stat(self.url_of(name))

    # -- fetching ---------------------------------------------------------------------------------------
    def fetch(
        self, name: str, *, size: int | None = None, sha256: str | None = None, adopt: Path | None = None
    ) -> Path:
        """The local path of file ``name``, downloading it first when it is not cached (or the cached copy is not
        what the records say, or, for an index file, no longer what the store publishes).

        Args:
            size / sha256: what the dataset's own records say the file is (checked; a mismatch deletes it).
            adopt: a file already on disk that may be this one (NeuroShard's ``genesis_shard_N.pt``): used, by
                copy, only when it verifies against ``size`` and ``sha256``.
        """
        target = self.path(name)
        if self._current(name, target, size, sha256):
            _touch(target)
            return target
        if adopt is not None and sha256 is not None and self._verifies(adopt, size, sha256):
            return self._place_copy(adopt, target)
        if self.offline:
            raise self.not_cached(name)
        if not self._writable():  # a read-only cache serves what it holds, as offline mode does
            raise NotCachedError(f"{_safe(self.url_of(name))} is not in the cache ({self.folder}), which is read-only.")
        with _locked(self.download_lock_path(name), fcntl.LOCK_EX):  # one process downloads; the others wait here
            if self._current(name, target, size, sha256):
                _touch(target)
                return target
            self._download(name, target, size, sha256, self.limits.max_index_bytes if _is_parsed(name) else None)
            self._fresh[name] = True
        return target

    def _verified(self, name: str, target: Path, size: int | None, sha256: str | None) -> bool:
        """Whether ``target`` is a regular file (a planted link is removed, never followed) of the size and SHA-256
        the records give (the digest recorded at download, else computed once and recorded)."""
        info = regular_file(target)
        if info is None:
            clear_non_file(target)
            return False
        if size is not None and info.st_size != size:
            return False
        if sha256 is None:
            return True
        meta = read_meta(self.folder, name)
        known = meta.get("sha256") if meta.get("size") == info.st_size else None
        if not isinstance(known, str):
            known = file_sha256(target)
            write_meta(self.folder, name, size=info.st_size, etag=meta.get("etag"), sha256=known)
        return known == sha256.lower()

    @staticmethod
    def _verifies(path: Path, size: int | None, sha256: str) -> bool:
        """Whether ``path`` is a regular file of ``size`` bytes with SHA-256 ``sha256``."""
        info = regular_file(path)
        return info is not None and (size is None or info.st_size == size) and file_sha256(path) == sha256.lower()

    def _current(self, name: str, target: Path, size: int | None, sha256: str | None) -> bool:
        """Whether the cached ``target`` may be used: :meth:`_verified`, and, for an index file, still the one the
        store publishes (asked once per cache, unless offline or ``revalidate=False``)."""
        if not self._verified(name, target, size, sha256):
            return False
        info = target.stat()
        meta = read_meta(self.folder, name)
        if self.offline or not self.revalidate or not _is_index(name):
            return True
        if name not in self._fresh:
            try:
                remote = self.backend.stat(self.url_of(name))
            except RemoteError:  # gone, or the store cannot be asked now: the verified cached copy stands
                remote = RemoteStat(info.st_size, meta.get("etag"))
            same_etag = meta.get("etag") == remote.etag if meta.get("etag") and remote.etag else True
            self._fresh[name] = remote.size == info.st_size and same_etag
        return self._fresh[name]

    def fetch_held(
        self,
        name: str,
        lease: Lease,
        *,
        size: int | None = None,
        sha256: str | None = None,
        adopt: Path | None = None,
        keep: frozenset[Path] | set[Path] = frozenset(),
        listed_by: str | None = None,
    ) -> Path:
        """:meth:`fetch`, then hold ``name`` in ``lease`` (eviction spares it) and evict down to
        ``max_cache_bytes`` (sparing ``keep`` too: the files a fetch under way is bringing). ``listed_by``: the index
        that names the file, said by a :class:`NotFoundError`."""
        for _ in range(3):  # another process's eviction may take the file between our fetch and our lease
            try:
                path = self.fetch(name, size=size, sha256=sha256, adopt=adopt)
            except NotFoundError as error:
                if listed_by is None:
                    raise
                raise type(error)(f"{error} It is listed by {listed_by}.") from None
            lease.add(self.lock_path(name))
            if path.is_file():
                self.evict(keep={path, *keep})
                return path
        raise RemoteError(
            f"{_safe(self.url_of(name))} keeps being evicted before it can be used; raise max_cache_bytes."
        )

    def _place_copy(self, source: Path, target: Path) -> Path:
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_name(target.name + PARTIAL)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        descriptor = open_no_follow(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        with open(source, "rb") as reader, os.fdopen(descriptor, "wb") as writer:
            while block := reader.read(_HASH_BLOCK):
                writer.write(block)
            writer.flush()
            os.fsync(writer.fileno())
        os.replace(temporary, target)
        write_meta(self.folder, self.check_name(self.name_of(target)), size=target.stat().st_size, etag=None,
                   sha256=file_sha256(target))  # fmt: skip
        fsync_folder(target.parent)
        return target

    def name_of(self, path: Path) -> str:
        """The dataset's name of a path in its cache folder."""
        return path.relative_to(self.folder).as_posix()

    def _download(self, name: str, target: Path, size: int | None, sha256: str | None, cap: int | None) -> None:
        """Download ``name`` to ``NAME.partial`` (resuming what an earlier attempt left), verify, fsync, rename.

        One request per attempt: the answer's headers give the object's size and ETag (checked against ``size``
        and ``cap`` before the first byte is kept; recorded beside the partial, so that a resume sends ``If-Range``
        with it). A body longer than announced, a wrong size or checksum, or a 404 deletes the partial."""
        target.parent.mkdir(parents=True, exist_ok=True)
        transfer = Transfer(self.url_of(name), target, size, cap)
        failure: BaseException | None = None
        attempts = max(self.limits.retries, 1)  # as many as any other request makes (``retries``: attempts)
        for attempt in range(1, attempts + 1):
            try:
                complete = self._attempt(transfer, name)
            except (NotFoundError, DeniedError, ChecksumError, OversizeError) as error:  # no attempt would mend them
                transfer.discard(only_empty=isinstance(error, (NotFoundError, DeniedError)))
                failure = error
                break
            except Restart:
                transfer.discard()
                continue
            except (OSError, RemoteError) as error:
                if attempt >= attempts or not getattr(error, "transient", True):
                    failure = RemoteError(
                        f"downloading {_safe(transfer.url)} failed after {attempt} attempt{'s' * (attempt != 1)}: "
                        f"{scrub_secrets(str(error), transfer.url)}"
                    )
                    break
                transfer.resume()  # keep what arrived, resume after it
                time.sleep(min(backends.BACKOFF * 2**attempt, backends.MAX_BACKOFF))
                continue
            if complete:
                break
            transfer.resume()  # the connection ended early without an error
        else:
            failure = RemoteError(f"downloading {_safe(transfer.url)} did not complete after {attempt} attempts.")
        if failure is not None:
            raise _detached(failure)
        remote = transfer.answer()  # an attempt completed
        expected = (sha256 or remote.sha256 or "").lower() or None
        found = transfer.digest.hexdigest()
        self._verify(transfer.url, transfer.partial, transfer.record, remote.size, expected, found)
        os.replace(transfer.partial, target)
        write_meta(self.folder, name, size=remote.size, etag=remote.etag, sha256=found)
        transfer.record.unlink(missing_ok=True)
        fsync_folder(target.parent)

    def _attempt(self, transfer: Transfer, name: str) -> bool:
        """One request of ``transfer`` (of file ``name``), appended to its partial file (opened without following a
        link); whether the partial now holds the whole object."""
        start = transfer.held()
        progress = self.progress
        descriptor = open_no_follow(transfer.partial, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        with os.fdopen(descriptor, "ab") as handle:
            if progress is not None:
                progress.at(name, start)  # a resume counts what the partial file holds; a restart goes back to 0
            report = None if progress is None else functools.partial(progress.at, name)
            sink = Hashing(handle, transfer.digest, start, report)

            def answered(stat: RemoteStat, whole: bool) -> None:
                transfer.answered(stat, whole, sink, start)
                if progress is not None:
                    progress.size(name, stat.size)

            try:
                self.backend.download(transfer.url, sink, start, transfer.recorded.get("etag"),  # type: ignore[arg-type]
                                      answered)  # fmt: skip
            finally:
                sink.close()  # what arrived is on disk (and hashed) before resuming after it
            transfer.digest = sink.digest
            handle.flush()
            os.fsync(handle.fileno())
        return transfer.held() >= transfer.answer().size

    @staticmethod
    def _verify(url: str, partial: Path, record: Path, size: int, expected: str | None, found: str) -> None:
        actual = partial.stat().st_size
        problem = None
        if actual != size:
            problem = f"{actual:,} bytes arrived, {size:,} were expected"
        elif expected is not None and found != expected:
            problem = f"its SHA-256 is {found}, the published one is {expected}"
        if problem:
            partial.unlink(missing_ok=True)
            record.unlink(missing_ok=True)
            raise ChecksumError(f"{_safe(url)}: {problem}; the download was deleted (nothing wrong is used).")

    def sums(self) -> dict[str, str]:
        """The dataset's ``SHA256SUMS`` sidecar (``sha256  name`` lines) as ``{name: sha256}``, or empty. Read line
        by line in bounded memory; a line that is not UTF-8 ``digest  name`` text, or names a file that cannot be
        one of the dataset's, raises :class:`IndexFormatError` naming the URL and the line."""
        try:
            path = self.fetch(SUMS)
        except NotFoundError:
            return {}
        except DeniedError:
            if self.query_for is None:
                raise
            return {}  # a presigned URL of one file: the store lets nothing else be read
        where = f"{self.url}/{SUMS}"
        sums: dict[str, str] = {}
        with open(path, "rb") as handle:
            for number, raw in enumerate(iter(lambda: handle.readline(MAX_SUMS_LINE + 1), b""), 1):
                line = parse_sums_line(raw, f"{where}, line {number}")
                if line is None:
                    continue
                digest, name = line
                sums[self.check_name(name, f"{where}, line {number}")] = digest
        return sums

    def forget_others(self, names: set[str]) -> list[Path]:
        """Delete the cached files of this dataset that ``names`` (its files now, by its ``SHA256SUMS`` or index)
        does not hold and no reader holds: an earlier version's leftovers, which a reader of the cached folder would
        otherwise see beside the current files. Returns what was deleted."""
        if regular_file(self.folder) is not None or not self.folder.is_dir() or self.folder.is_symlink():
            return []
        removed = []
        for path in self.folder.rglob("*"):
            name = path.relative_to(self.folder).as_posix()
            if name in names or LOCKS in path.parts or META in path.parts or regular_file(path) is None:
                continue
            if name.endswith((PARTIAL, PARTIAL + ".json")):
                continue
            with contextlib.suppress(BlockingIOError), _locked(self.lock_path(name), fcntl.LOCK_EX | fcntl.LOCK_NB):
                path.unlink()
                (self.folder / META / (name.replace("/", "%2F") + ".json")).unlink(missing_ok=True)
                removed.append(path)
        return removed

    # -- eviction ---------------------------------------------------------------------------------------
    def evict(self, keep: frozenset[Path] | set[Path] = frozenset()) -> list[Path]:
        """Delete least-recently-used cached files, of any dataset under the root, that no reader holds and that are
        not in ``keep`` (the files a fetch under way is bringing), until the root holds at most ``max_cache_bytes``;
        returns what was deleted."""
        if self.max_cache_bytes is None or not self.root.is_dir():
            return []
        files = []
        for folder in self.root.iterdir():
            if folder.is_symlink() or not folder.is_dir():  # a planted link: whatever it points at is not the cache's
                continue
            for path in folder.rglob("*"):
                if path in keep or LOCKS in path.parts or META in path.parts:
                    continue
                if not path.name.endswith((PARTIAL, PARTIAL + ".json")) and regular_file(path) is not None:
                    files.append(path)
        total = sum(p.stat().st_size for p in files)
        removed = []
        for path in sorted(files, key=lambda p: p.stat().st_atime):
            if total <= self.max_cache_bytes:
                break
            dataset, *parts = path.relative_to(self.root).parts
            lock = self.root / dataset / LOCKS / ("%2F".join(parts) + ".lock")  # lock_path() of that dataset
            with contextlib.suppress(BlockingIOError), _locked(lock, fcntl.LOCK_EX | fcntl.LOCK_NB):
                size = path.stat().st_size
                path.unlink()
                (self.root / dataset / META / ("%2F".join(parts) + ".json")).unlink(missing_ok=True)
                total -= size
                removed.append(path)
        return removed


def _is_parsed(name: str) -> bool:
    """Whether ``name`` is an index file read into memory as text (``SHA256SUMS``, a JSON index such as a manifest,
    ``index.json``, ``state.json``, ``meta.json``): its size is capped by ``max_index_bytes``. Binary indexes that are
    mapped, never parsed (a Megatron ``.idx``, a datatrove ``.ds.index``), are not."""
    return name == SUMS or (name.endswith(".json") and _is_index(name))


def _is_index(name: str) -> bool:
    """Whether ``name`` is an index file (``SHA256SUMS``, or one a format's readers key on): capped in size and
    revalidated when cached."""
    from .hooks import index_file

    return name == SUMS or index_file(name)


def _detached(error: BaseException) -> BaseException:
    """``error`` without a foreign ``__context__``/``__cause__`` (whose text may quote a signed URL)."""
    if error.__context__ is None and error.__cause__ is None:
        return error
    clean = type(error)(*error.args)
    if hasattr(error, "transient"):
        clean.transient = error.transient  # type: ignore[attr-defined]
    return clean
