"""How a reader reaches its files: one interface whether they are on the local disk or arrive from a store.

A local dataset's files are *pinned* when the reader validates them (device, inode, size, modification time) and
mapped read-only afterwards only while they are still the files that were validated. A dataset opened by URL
(:func:`tokformats.open` on ``https://``, ``s3://``, ...) also has a :class:`LazyFiles`: its index files are present,
and each data file is fetched (verified, and held against eviction) the first time it is read; a header can be read
by range before its file arrives, and is compared with the file when it does.

Formats never ask where their bytes come from: they call the reader's ``_map``, ``_head``, ``_map_lazily`` and
``_fetched``, which are :class:`DatasetFiles`' methods; :mod:`tokformats.remote` provides the :class:`LazyFiles`.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from ..errors import FormatError, NoFilesError, SizeMismatchError
from .arrays import LazyArray, map_file

__all__ = ["LazyFiles", "DatasetFiles", "Pin"]


class LazyFiles(Protocol):
    """The files of a dataset opened by URL, as a reader sees them (:class:`tokformats.remote.lazy.RemoteFiles`):
    paths are the files' places in the local cache folder, whether or not they have arrived yet."""

    #: The dataset's URL (for messages).
    url: str
    #: The cache folder holding the dataset.
    folder: Path
    #: The data file a read fetched last (where prefetching looks ahead from).
    last_read: Path | None

    def names(self, under: Path | None = None) -> list[str]:
        """Every file's name relative to :attr:`folder` (those below ``under``)."""

    def paths(self, suffix: str, under: Path | None = None) -> list[Path]:
        """The paths of the files whose names end with ``suffix`` (below ``under``), sorted."""

    def has(self, path: Path | str) -> bool:
        """Whether the dataset has ``path`` (arrived or not)."""

    def size(self, path: Path | str, implied: int | None = None) -> int:
        """``path``'s size: recorded by the dataset, else ``implied`` by its index (checked on arrival), else the
        store's."""

    def expect(self, path: Path | str, size: int) -> None:
        """Record the size the dataset's index implies for ``path`` (a download of another size is refused)."""

    def fetch(self, path: Path | str, *, ahead: bool = False) -> Path:
        """``path``, brought into the cache (verified) and held; ``ahead``: a prefetch, not a read."""

    def read_range(self, path: Path | str, start: int, stop: int) -> bytes:
        """Bytes ``start:stop`` of ``path`` (from the cached copy, else one ranged request)."""

    def on_release(self, path: Path | str, unload: Callable[[], None]) -> None:
        """Call ``unload`` when the reader stops holding ``path``."""

    def prefetch(self, paths: Sequence[Path]) -> threading.Thread:
        """Fetch ``paths`` in a background thread (returned, started)."""

    def release(self) -> None:
        """Stop holding the files fetched so far."""


#: What a pin records of a file: device, inode, size in bytes, modification time (ns).
Pin = tuple[int, int, int, int]


def _identity(path: Path) -> Pin:
    return _identity_of(os.stat(path))


def _identity_of(info: os.stat_result) -> Pin:
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


def _key(path: Path | str) -> Path:
    """``path`` as the pins' key (a ``Path`` is used as given: building one again parses it again)."""
    return path if isinstance(path, Path) else Path(path)


class DatasetFiles:
    """A reader's access to its files: pins, read-only maps of pinned files, and, for a dataset opened by URL
    (``remote``), fetching on first use and headers read by range.

    Args:
        remote: the dataset's :class:`LazyFiles` when it was opened by URL, else None.
        hold: called with ``remote`` whenever a file is fetched (the reader keeps it until ``close()``).
        format: the reader's format name, for messages.
    """

    def __init__(self, remote: LazyFiles | None, hold: Callable[[Any], None], format: str) -> None:
        self.remote = remote
        self._hold = hold
        self._format = format
        self._pins: dict[Path, Pin] = {}
        #: Headers read by range before their file arrived, compared with the file when it does.
        self._ranged_heads: dict[Path, bytes] = {}

    # -- local files ------------------------------------------------------------------------------------
    def pin(self, *paths: Path) -> None:
        """Remember what ``paths`` are now: the files this open validated. :meth:`map` refuses to map one that has
        changed since, so a dataset replaced on disk after ``open`` is never read with the old index."""
        for path in paths:
            self._pins[_key(path)] = _identity(path)

    def pin_as(self, path: Path, identity: Pin) -> None:
        """Pin ``path`` as ``identity`` (device, inode, size, modification time), taken by a ``stat`` made at open
        (a glob of many shards is stat'ed in one pass and pinned as each shard is first mapped)."""
        self._pins[_key(path)] = identity

    def pinned_size(self, path: Path) -> int:
        """The size in bytes pinned ``path`` had when it was pinned."""
        return self._pins[_key(path)][2]

    def is_pinned(self, path: Path) -> bool:
        """Whether ``path`` was pinned (validated at open, or fetched)."""
        return _key(path) in self._pins

    def check_pin(self, path: Path) -> None:
        """Raise if pinned ``path`` is no longer the file that was opened."""
        pinned = self._pins.get(_key(path))
        if pinned is not None and _identity(path) != pinned:
            raise self._changed(path)

    def _changed(self, path: Path) -> FormatError:
        return FormatError(
            f"{path} changed on disk since this {self._format} reader opened it (replaced, truncated or "
            "rewritten); open the dataset again."
        )

    def map(
        self, path: Path, dtype: np.dtype, offset: int = 0, count: int | None = None, *, pin: bool = False
    ) -> np.ndarray:
        """A read-only map of a pinned file, after checking it is still the file that was opened (for a dataset
        opened by URL, fetched again first if eviction took it while the reader was closed). The check compares
        the pin with the ``fstat`` of the descriptor mapped (one ``open`` and one ``fstat``, and no window between
        a check of the path and the map).

        ``pin``: pin the file as it is now, from that same ``fstat`` (an open that validates what it maps); a path
        that is not a regular file is then :class:`NoFilesError`, as it would be for a reader's ``is_file`` check.
        """
        if self.remote is not None and not os.path.exists(path) and self.remote.has(path):
            self.fetched(path)
        key = _key(path)
        pinned = self._pins.get(key)

        def opened(info: os.stat_result) -> None:
            identity = _identity_of(info)
            if pin:
                if not stat.S_ISREG(info.st_mode):
                    raise NoFilesError(f"{path} is not a file.")
                self._pins[key] = identity
            elif pinned is not None and identity != pinned:
                raise self._changed(path)

        try:
            return map_file(path, dtype, offset, count, opened=opened)
        except FormatError:
            raise
        except FileNotFoundError:
            if pin:
                raise NoFilesError(f"{path} does not exist.") from None
            raise
        except ValueError as error:  # "mmap length is greater than file size": shrunk under an unpinned map
            raise SizeMismatchError(f"{path}: cannot map it as opened ({error}).") from None

    # -- files that arrive on first use ------------------------------------------------------------------
    def fetched(self, path: Path) -> Path:
        """``path``, brought into the cache first (verified, and held until the reader closes) when the dataset was
        opened by URL; pinned as fetched. A header read earlier by range (:meth:`head`) must agree."""
        if self.remote is None:
            return path
        self._hold(self.remote)
        self.remote.fetch(path)
        self.pin(path)
        ranged = self._ranged_heads.pop(_key(path), None)
        if ranged is not None:
            with open(path, "rb") as handle:
                if handle.read(len(ranged)) != ranged:
                    raise FormatError(
                        f"{path}: its header differs from the one read by range before the file was downloaded "
                        "(the store changed it in between); open the dataset again."
                    )
        return path

    def head(self, path: Path, size: int) -> bytes:
        """The first ``size`` bytes of ``path`` (a header); for a dataset opened by URL whose file has not arrived,
        one ranged request, remembered and compared with the file when it arrives."""
        if self.remote is not None and not self.is_pinned(path):
            head = self.remote.read_range(path, 0, size)
            self._ranged_heads[_key(path)] = head
            return head
        with open(path, "rb") as handle:
            return handle.read(size)

    def map_lazily(self, path: Path, dtype: np.dtype, offset: int, count: int) -> np.ndarray | LazyArray:
        """:meth:`map` for a local dataset; for one opened by URL, a :class:`LazyArray` of ``count`` elements that
        fetches ``path`` the first time a value of it is read."""
        if self.remote is None:
            return self.map(path, dtype, offset, count)
        return self.lazy_array(path, count, dtype, lambda: self.map(self.fetched(path), dtype, offset, count))

    def lazy_array(self, path: Path, count: int, dtype: npt.DTypeLike, load: Callable[[], np.ndarray]) -> LazyArray:
        """A :class:`LazyArray` over data file ``path`` of a dataset opened by URL, unloaded when the reader stops
        holding the file (its working set moved on under ``max_cache_bytes``)."""
        array = LazyArray(count, dtype, load, str(path))
        if self.remote is not None:
            self.remote.on_release(path, array.unload)
        return array

    def prefetch(self, data_files: Sequence[Path], count: int) -> threading.Thread | None:
        """For a dataset opened by URL, download the ``count`` data files after the one read last (the first
        ``count`` when none was) in a background thread (returned, started); None for a local dataset."""
        remote = self.remote
        if remote is None:
            return None
        self._hold(remote)
        first = data_files.index(remote.last_read) + 1 if remote.last_read in data_files else 0
        return remote.prefetch(list(dict.fromkeys(data_files[first : first + count])))
