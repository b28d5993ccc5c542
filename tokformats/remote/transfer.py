"""One file's download into the cache: a partial file resumed across attempts, hashed as it arrives, checked against
what the store announces and what the dataset records before a byte is kept. Neither the partial file nor its resume
record is ever followed when a link was planted in its place."""

from __future__ import annotations

import hashlib
import json
import os
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from ..fs.journal import start_writeback
from .backends import OversizeError, RemoteError, RemoteStat, _safe
from .cachefiles import PARTIAL, clear_non_file, open_no_follow, read_record, regular_file, write_no_follow

__all__ = ["ChecksumError", "Transfer", "Hashing", "Restart"]

_HASH_BLOCK = 1 << 22
#: Bytes a download writes between asking the kernel to start writing them back.
_WRITEBACK_BYTES = 8 << 20


class ChecksumError(RemoteError):
    """A downloaded file is not what was published (size or SHA-256); it was deleted."""


class Restart(Exception):
    """The object changed since the partial download began: start over."""


class Hashing:
    """A file handle that hashes what is written through it, in a second thread: reading the next block from the
    network overlaps hashing and writing the previous one (``hashlib`` and file writes release the GIL). The queue is
    short, so memory stays a few blocks. ``on_position`` (a progress bar's) is told how many bytes the file holds
    after each block, counting from ``start`` (what the partial file held before)."""

    def __init__(
        self, handle: BinaryIO, digest: Any, start: int = 0, on_position: Callable[[int], None] | None = None
    ) -> None:
        self.handle, self.digest = handle, digest
        self.position, self._on_position = start, on_position
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
        self.position += len(data)
        if self._on_position is not None:
            self._on_position(self.position)
        return len(data)

    def restart(self) -> None:
        """Empty the file and the hash (before any block of this attempt was written): the store sends the whole
        object."""
        self.handle.truncate(0)
        self.digest = hashlib.sha256()
        self.position = 0
        if self._on_position is not None:
            self._on_position(0)

    def close(self) -> None:
        """Wait until every block is hashed and written; raise what the worker met."""
        self._blocks.put(None)
        self._worker.join()
        if self._error is not None:
            raise self._error


class Transfer:
    """One file's download: its partial file and resume record (never followed when they are links), what the
    store said of the object, and the SHA-256 of what arrived."""

    def __init__(self, url: str, target: Path, size: int | None, cap: int | None) -> None:
        self.url, self.size, self.cap = url, size, cap
        self.partial = target.with_name(target.name + PARTIAL)
        self.record = target.with_name(target.name + PARTIAL + ".json")
        self.remote: RemoteStat | None = None
        self.restarts = 0
        self.digest: Any = hashlib.sha256()
        self.recorded: dict[str, Any] = {}
        self.resume()

    def answer(self) -> RemoteStat:
        """What the store said of the object (its size, ETag, checksum), once an attempt has been answered."""
        if self.remote is None:  # answered() runs before the first byte: a backend that never called it is broken
            raise RemoteError(f"downloading {_safe(self.url)}: the store sent no size or status before its body.")
        return self.remote

    def held(self) -> int:
        """Bytes the partial file holds."""
        info = regular_file(self.partial)
        return info.st_size if info is not None else 0

    def resume(self) -> None:
        """Hash what the partial file holds, when it can be resumed (its record names a strong ETag to send with
        ``If-Range`` and a size it does not exceed); otherwise remove it."""
        clear_non_file(self.partial)
        clear_non_file(self.record)
        self.digest, self.recorded = hashlib.sha256(), {}
        info = regular_file(self.partial)
        if info is None:
            return
        before = read_record(self.record)
        etag, size = before.get("etag"), before.get("size")
        if not isinstance(etag, str) or etag.startswith("W/") or not isinstance(size, int) or info.st_size > size:
            self.discard()
            return
        with os.fdopen(open_no_follow(self.partial, os.O_RDONLY), "rb") as handle:
            while block := handle.read(_HASH_BLOCK):
                self.digest.update(block)
        self.recorded = {"etag": etag, "size": size}

    def discard(self, only_empty: bool = False) -> None:
        """Delete the partial file and its record (``only_empty``: only when nothing arrived, as after a 404)."""
        if only_empty and self.held():
            return
        self.partial.unlink(missing_ok=True)
        self.record.unlink(missing_ok=True)
        self.digest, self.recorded = hashlib.sha256(), {}

    def answered(self, stat: RemoteStat, whole: bool, sink: Hashing, start: int) -> None:
        """What the store says of the object, before its first byte: checked against the cap and the records."""
        if self.cap is not None and stat.size > self.cap:
            raise OversizeError(
                f"{_safe(self.url)} is {stat.size:,} bytes, more than the {self.cap:,} allowed for an index file "
                "(raise the cap with max_index_bytes= or $TOKFORMATS_MAX_INDEX_BYTES)."
            )
        if self.size is not None and stat.size != self.size:
            raise ChecksumError(
                f"{_safe(self.url)} has {stat.size:,} bytes, but the dataset's records say {self.size:,}: the store "
                "holds another version of the file (republished?)."
            )
        if start and (whole or self.recorded.get("size") != stat.size):  # changed, or Range ignored
            self.restarts += 1
            if self.restarts > 2:
                changing = RemoteError(f"{_safe(self.url)} keeps changing while it downloads.")
                changing.transient = False  # type: ignore[attr-defined]
                raise changing
            if not whole:
                raise Restart
            sink.restart()  # this answer is the whole object: keep it, from its first byte
        if {"etag": stat.etag, "size": stat.size} != self.recorded:
            self.recorded = {"etag": stat.etag, "size": stat.size}
            write_no_follow(self.record, json.dumps(self.recorded))
        self.remote = stat
