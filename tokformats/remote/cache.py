"""The local cache of remote datasets: files appear only complete and verified, downloads resume, processes share.

Layout: ``CACHE_DIR/{name}-{digest}/`` per dataset URL (``~/.cache/tokformats`` unless ``cache_dir=`` or
``$TOKFORMATS_CACHE``), mirroring the dataset's relative file names. A file is downloaded to ``NAME.partial`` (with
``NAME.partial.json`` recording the ETag it came from), checked (size, then SHA-256 from the dataset's own record,
a ``SHA256SUMS`` sidecar or the store), fsynced and renamed: a name in the cache is always a whole, verified file.
An interrupted download resumes with a Range request when the object is unchanged (``If-Range``), else restarts.

Processes on one node (ranks, DataLoader workers) take a file lock per file: one downloads, the others wait and
then map it. Readers hold a shared lock on each file they use (:class:`Lease`); ``max_cache_bytes`` evicts the
least recently used files no reader holds. ``offline=True`` (or ``TOKFORMATS_OFFLINE=1``) uses only what is cached.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import queue
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from ..fs.journal import fsync_folder, start_writeback
from . import backends
from .backends import RETRIES, Backend, NotFoundError, RemoteError, RemoteStat, _safe, backend_for

__all__ = ["Cache", "Lease", "ChecksumError", "NotCachedError", "default_cache_dir", "offline_default", "file_sha256"]

LOCKS = ".tokformats-locks"
_READ_ONLY = (errno.EROFS, errno.EACCES, errno.EPERM)
PARTIAL = ".partial"
_HASH_BLOCK = 1 << 22
#: Bytes a download writes between asking the kernel to start writing them back.
_WRITEBACK_BYTES = 8 << 20


class ChecksumError(RemoteError):
    """A downloaded file is not what was published (size or SHA-256); it was deleted."""


class _Restart(Exception):
    """The object changed since the partial download began: start over."""


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
    """A readable, unique folder name for a dataset URL: its last path part plus a digest of the whole URL."""
    base = url.rstrip("/")
    tail = re.sub(r"[^A-Za-z0-9._-]+", "_", base.rsplit("/", 1)[-1])[:48] or "dataset"
    return f"{tail}-{hashlib.sha256(base.encode('utf-8')).hexdigest()[:16]}"


class _Hashing:
    """A file handle that hashes what is written through it, in a second thread: reading the next block from the
    network overlaps hashing and writing the previous one (``hashlib`` and file writes release the GIL). The queue is
    short, so memory stays a few blocks."""

    def __init__(self, handle: BinaryIO, digest: Any) -> None:
        self.handle, self.digest = handle, digest
        self._blocks: queue.Queue[bytes | None] = queue.Queue(maxsize=8)
        self._error: BaseException | None = None
        self._worker = threading.Thread(target=self._run, daemon=True)
        self._worker.start()

    def _run(self) -> None:
        unsynced = 0
        while (block := self._blocks.get()) is not None:
            if self._error is None:
                try:
                    self.digest.update(block)
                    self.handle.write(block)
                    unsynced += len(block)
                    if unsynced >= _WRITEBACK_BYTES:  # the disk writes overlap the download; the fsync waits less
                        self.handle.flush()
                        start_writeback(self.handle.fileno())
                        unsynced = 0
                except BaseException as error:  # handed to the downloading thread
                    self._error = error

    def write(self, data: bytes) -> int:
        if self._error is not None:
            raise self._error
        self._blocks.put(bytes(data))
        return len(data)

    def restart(self) -> None:
        """Empty the file and the hash (before any block of this attempt was written): the store sends the whole
        object."""
        self.handle.truncate(0)
        self.digest = hashlib.sha256()

    def close(self) -> None:
        """Wait until every block is hashed and written; raise what the worker met."""
        self._blocks.put(None)
        self._worker.join()
        if self._error is not None:
            raise self._error


@contextlib.contextmanager
def _locked(path: Path, kind: int) -> Iterator[int]:
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
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
            lock.parent.mkdir(parents=True, exist_ok=True)
            descriptor = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
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
        url: the dataset's base URL (a folder, or the folder holding a file or prefix).
        cache_dir: the cache root (see :func:`default_cache_dir`).
        max_cache_bytes: evict least-recently-used files (of every dataset under the root) no reader holds once the
            root holds more.
        offline: never touch the network; a file not cached is an error.
        backend: the store (chosen from the URL's scheme by default).
    """

    def __init__(
        self,
        url: str,
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        max_cache_bytes: float | None = None,
        offline: bool | None = None,
        backend: Backend | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        self.folder = self.root / _folder_name(self.url)
        self.max_cache_bytes = None if max_cache_bytes is None else int(max_cache_bytes)
        self.offline = offline_default() if offline is None else offline
        self._backend = backend

    @property
    def backend(self) -> Backend:
        """The store (made on first use: offline work never needs it)."""
        if self._backend is None:
            self._backend = backend_for(self.url)
        return self._backend

    def url_of(self, name: str) -> str:
        """The URL of file ``name`` of the dataset."""
        return f"{self.url}/{name}"

    def path(self, name: str) -> Path:
        """Where file ``name`` is (or will be) cached."""
        return self.folder / name

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

    def cached(self, name: str) -> Path | None:
        """The cached file ``name`` when it is there (complete and verified), else None."""
        path = self.path(name)
        return path if path.is_file() else None

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
        """The local path of file ``name``, downloading it first when it is not cached.

        Args:
            size / sha256: what the dataset's own records say the file is (checked; a mismatch deletes it).
            adopt: a file already on disk that may be this one (NeuroShard's ``genesis_shard_N.pt``): used, by
                copy, only when it verifies against ``size`` and ``sha256``.
        """
        target = self.path(name)
        if target.is_file():
            _touch(target)
            return target
        if (
            adopt is not None
            and sha256 is not None
            and adopt.is_file()
            and (size is None or adopt.stat().st_size == size)
            and file_sha256(adopt) == sha256.lower()
        ):
            return self._place_copy(adopt, target)
        if self.offline:
            raise self.not_cached(name)
        if not self._writable():  # a read-only cache serves what it holds, as offline mode does
            raise NotCachedError(f"{_safe(self.url_of(name))} is not in the cache ({self.folder}), which is read-only.")
        with _locked(self.download_lock_path(name), fcntl.LOCK_EX):  # one process downloads; the others wait here
            if target.is_file():
                _touch(target)
                return target
            self._download(name, target, size, sha256)
        return target

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
        with open(source, "rb") as reader, open(temporary, "wb") as writer:
            while block := reader.read(_HASH_BLOCK):
                writer.write(block)
            writer.flush()
            os.fsync(writer.fileno())
        os.replace(temporary, target)
        fsync_folder(target.parent)
        return target

    def _download(self, name: str, target: Path, size: int | None, sha256: str | None) -> None:
        """Download ``name`` to ``NAME.partial`` (resuming what an earlier attempt left), verify, fsync, rename.

        One request per attempt: the answer's headers give the object's size and ETag (checked against ``size``
        before the first byte is kept; recorded beside the partial, so that a resume sends ``If-Range`` with it)."""
        url = self.url_of(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + PARTIAL)
        record = target.with_name(target.name + PARTIAL + ".json")
        digest, recorded = self._resume_point(partial, record)
        remote: RemoteStat | None = None
        restarts = 0
        for attempt in range(1, RETRIES + 2):
            start = partial.stat().st_size if partial.exists() else 0
            try:
                with open(partial, "ab") as handle:
                    sink = _Hashing(handle, digest)

                    def answered(stat: RemoteStat, whole: bool, sink: _Hashing = sink, start: int = start) -> None:
                        nonlocal remote, recorded, restarts
                        if size is not None and stat.size != size:
                            raise ChecksumError(
                                f"{_safe(url)} has {stat.size:,} bytes, but the dataset's records say {size:,}: the "
                                "store holds another version of the file (republished?)."
                            )
                        if start and (whole or recorded.get("size") != stat.size):  # changed, or Range ignored
                            restarts += 1
                            if restarts > 2:
                                changing = RemoteError(f"{_safe(url)} keeps changing while it downloads.")
                                changing.transient = False  # type: ignore[attr-defined]
                                raise changing
                            if not whole:
                                raise _Restart
                            sink.restart()  # this answer is the whole object: keep it, from its first byte
                        if {"etag": stat.etag, "size": stat.size} != recorded:
                            recorded = {"etag": stat.etag, "size": stat.size}
                            record.write_text(json.dumps(recorded))
                        remote = stat

                    try:
                        self.backend.download(url, sink, start, recorded.get("etag"), answered)  # type: ignore[arg-type]
                    finally:
                        sink.close()  # what arrived is on disk (and hashed) before resuming after it
                    digest = sink.digest
                    handle.flush()
                    os.fsync(handle.fileno())
            except (NotFoundError, ChecksumError):  # another attempt would not mend them
                raise
            except _Restart:
                partial.unlink(missing_ok=True)
                digest, recorded = hashlib.sha256(), {}
                continue
            except (OSError, RemoteError) as error:
                if attempt > RETRIES or not getattr(error, "transient", True):
                    raise RemoteError(f"downloading {_safe(url)} failed after {attempt} attempts: {error}") from None
                digest, recorded = self._resume_point(partial, record)  # keep what arrived, resume after it
                time.sleep(min(backends.BACKOFF * 2**attempt, backends.MAX_BACKOFF))
                continue
            if remote is None:  # answered() runs before the first byte: a backend that never called it is broken
                raise RemoteError(f"downloading {_safe(url)}: the store sent no size or status before its body.")
            if partial.stat().st_size < remote.size:  # the connection ended early without an error
                digest, recorded = self._resume_point(partial, record)
                continue
            break
        else:
            raise RemoteError(f"downloading {_safe(url)} did not complete after {RETRIES + 1} attempts.")
        expected = (sha256 or remote.sha256 or "").lower() or None
        self._verify(url, partial, record, remote.size, expected, digest.hexdigest())
        os.replace(partial, target)
        record.unlink(missing_ok=True)
        fsync_folder(target.parent)

    @staticmethod
    def _resume_point(partial: Path, record: Path) -> tuple[Any, dict[str, Any]]:
        """``(SHA-256 of what a partial download holds, the object's recorded ETag and size)`` when it can be resumed
        (its record names a strong ETag to send with ``If-Range``); otherwise the partial is removed."""
        digest = hashlib.sha256()
        if not partial.exists():
            return digest, {}
        try:
            before = json.loads(record.read_text())
        except (OSError, ValueError):
            before = {}
        etag, size = before.get("etag"), before.get("size")
        if not isinstance(etag, str) or etag.startswith("W/") or not isinstance(size, int) or (
            partial.stat().st_size > size
        ):  # fmt: skip
            partial.unlink()
            return digest, {}
        with open(partial, "rb") as handle:
            while block := handle.read(_HASH_BLOCK):
                digest.update(block)
        return digest, {"etag": etag, "size": size}

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
        """The dataset's ``SHA256SUMS`` sidecar (``sha256  name`` lines) as ``{name: sha256}``, or empty."""
        try:
            path = self.fetch("SHA256SUMS")
        except NotFoundError:
            return {}
        sums = {}
        for line in path.read_text(encoding="utf-8").splitlines():
            digest, _, name = line.strip().partition("  ")
            if re.fullmatch(r"[0-9a-fA-F]{64}", digest) and name:
                sums[name.lstrip("*")] = digest.lower()
        return sums

    # -- eviction ---------------------------------------------------------------------------------------
    def evict(self, keep: frozenset[Path] | set[Path] = frozenset()) -> list[Path]:
        """Delete least-recently-used cached files, of any dataset under the root, that no reader holds and that are
        not in ``keep`` (the files a fetch under way is bringing), until the root holds at most ``max_cache_bytes``;
        returns what was deleted."""
        if self.max_cache_bytes is None or not self.root.is_dir():
            return []
        files = []
        for folder in self.root.iterdir():
            if not folder.is_dir():
                continue
            for path in folder.rglob("*"):
                if path in keep or LOCKS in path.parts or path.name.endswith((PARTIAL, PARTIAL + ".json")):
                    continue
                if path.is_file():
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
                total -= size
                removed.append(path)
        return removed
