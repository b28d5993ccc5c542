"""Data files that arrive on first use: a dataset folder opened by URL whose readers know every file's size from
its index files (fetched at open), so that reading the first document never downloads the 500th shard.

A reader opened this way gets a :class:`RemoteFiles` as its ``remote=`` option: the files the dataset has (its
listing, ``SHA256SUMS`` or index), what their records say (size, SHA-256), and :meth:`RemoteFiles.fetch` to bring
one into the cache (verified, and leased against eviction until the reader is closed). Readers wrap each data file
in a :class:`~tokformats.arrays.LazyArray` whose ``load`` fetches it.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..errors import SizeMismatchError
from ..fs.paths import public_url
from .backends import NotFoundError
from .cache import Cache, Lease

__all__ = ["RemoteFiles"]


class RemoteFiles:
    """The files of a dataset folder opened by URL, cached under ``folder`` as they are first used.

    Args:
        url: the folder's URL (no trailing slash needed).
        folder: the cache folder holding the dataset (its index files are already there).
        entries: every file of the dataset, by name relative to the folder: ``{"size", "sha256", "listed_by"}``
            (each may be None).
        options: the cache's options (``cache_dir``, ``max_cache_bytes``, ``offline``).
        index: the index files readers read at open (fetched now, and held).

    It pickles as its description (a DataLoader worker opens its own cache and lease) and is held by its reader:
    :meth:`release` (the reader's ``close()``) drops the lease on the files fetched so far.
    """

    def __init__(
        self,
        url: str,
        folder: Path,
        entries: dict[str, dict[str, Any]],
        options: dict[str, Any],
        index: Sequence[str] = (),
    ) -> None:
        self.url = url.rstrip("/")
        self.folder = Path(folder)
        self.entries = entries
        self.options = options
        self.index = list(index)
        self._cache: Cache | None = None
        #: The file a read fetched last (where :meth:`prefetch` of a reader looks ahead from).
        self.last_read: Path | None = None
        self._index_lease = Lease()
        #: Leases on the data files fetched, oldest first (released beyond the working set, see :meth:`_shrink`).
        self._held: OrderedDict[str, Lease] = OrderedDict()
        self._unloaders: dict[str, list[weakref.WeakMethod[Callable[[], None]]]] = {}
        self._guard = threading.Lock()
        self._hold_index()

    def __reduce__(self) -> tuple[Any, ...]:
        return (RemoteFiles, (self.url, self.folder, self.entries, self.options, self.index))

    def __repr__(self) -> str:
        return f"RemoteFiles({public_url(self.url)!r}, files={len(self.entries)})"

    @property
    def cache(self) -> Cache:
        """The dataset's cache (made on first use)."""
        if self._cache is None:
            self._cache = Cache(self.url, **self.options)
        return self._cache

    def name_of(self, path: Path | str) -> str:
        """The dataset's name for a path in its cache folder."""
        return Path(path).relative_to(self.folder).as_posix()

    def names(self, under: Path | None = None) -> list[str]:
        """Every file of the dataset (below folder ``under`` of the cache, when given), sorted."""
        prefix = "" if under is None or Path(under) == self.folder else self.name_of(under) + "/"
        return sorted(n for n in self.entries if n.startswith(prefix))

    def paths(self, suffix: str, under: Path | None = None) -> list[Path]:
        """The cache paths of the dataset's files whose names end with ``suffix`` (below ``under``), sorted."""
        return [self.folder / n for n in self.names(under) if n.endswith(suffix) and not Path(n).name.startswith(".")]

    def has(self, path: Path | str) -> bool:
        """Whether ``path`` (in the cache folder) is a file of the dataset, cached yet or not. A file only guessed
        (an optional companion such as ``.ds.loss``) is asked of the store once."""
        try:
            name = self.name_of(path)
        except ValueError:
            return False
        entry = self.entries.get(name)
        if entry is None:
            return False
        if entry.get("maybe"):
            try:
                self.size(path)  # what the records say, the cached copy's, or one HEAD: NotFoundError when absent
            except NotFoundError:
                del self.entries[name]
                return False
            entry["maybe"] = False
        return True

    def recorded_size(self, path: Path | str) -> int | None:
        """The size in bytes the dataset's records give ``path``, or None when they say nothing."""
        size = self.entries.get(self.name_of(path), {}).get("size")
        return size if isinstance(size, int) else None

    def size(self, path: Path | str, implied: int | None = None) -> int:
        """The size of ``path`` in bytes: what the dataset's records say, else ``implied`` (what a reader's index
        files make it; the download is checked against it), else the cached copy's, else the store's (one HEAD
        request; no data is downloaded)."""
        recorded = self.recorded_size(path)
        if recorded is not None:
            return recorded
        if implied is not None:
            self.expect(path, implied)
            return implied
        name = self.name_of(path)
        cached = self._cached(name)
        size = cached.stat().st_size if cached is not None else self.cache.stat(name).size
        self.entries.setdefault(name, {})["size"] = size
        return size

    def expect(self, path: Path | str, size: int) -> None:
        """Record that the dataset's index makes ``path`` ``size`` bytes: the download is checked against it (and
        deleted when it differs). Records that already disagree raise :class:`SizeMismatchError` now."""
        entry = self.entries.setdefault(self.name_of(path), {})
        known = entry.get("size")
        if isinstance(known, int) and known != size:
            raise SizeMismatchError(
                f"{self.cache.url}/{self.name_of(path)}: the dataset's index makes it {size:,} bytes, its listing says "
                f"{known:,}."
            )
        entry["size"] = size

    def fetch(self, path: Path | str, *, ahead: bool = False) -> Path:
        """``path``, downloaded into the cache first when it is not there (checked against the size and SHA-256 the
        dataset records), and held against eviction until :meth:`release`, or until the reader's working set
        outgrows ``max_cache_bytes`` (:meth:`_shrink`). ``ahead``: a prefetch, not a read."""
        name = self.name_of(path)
        if not ahead:
            self.last_read = Path(path)
        if self._index_released:  # the reader is used again after close(): its index files come back first
            self._hold_index()
        lease = Lease()
        found = self._fetch(name, lease)
        with self._guard:
            previous = self._held.pop(name, None)
            self._held[name] = lease  # the newest
        if previous is not None:
            previous.release()
        self._shrink()
        return found

    def _hold_index(self) -> None:
        """Fetch (again, if eviction took them) and hold the index files, for as long as the reader lives."""
        self._index_released = False
        for name in self.index:
            self._fetch(name, self._index_lease)

    def _fetch(self, name: str, lease: Lease) -> Path:
        entry = self.entries.get(name, {})
        return self.cache.fetch_held(name, lease, size=entry.get("size"), sha256=entry.get("sha256"),
                                     adopt=self._adoptable(name), listed_by=entry.get("listed_by"))  # fmt: skip

    def on_release(self, path: Path | str, unload: Callable[[], None]) -> None:
        """Call ``unload`` (a bound method, held weakly) when this reader stops holding ``path`` (so that the map
        of an evictable file is dropped and the file is fetched again if it is read again)."""
        with self._guard:
            self._unloaders.setdefault(self.name_of(path), []).append(weakref.WeakMethod(unload))

    def _shrink(self) -> None:
        """With ``max_cache_bytes`` set, stop holding the oldest data files once those held exceed half of it (the
        other half is room for the files being prefetched and for other readers), keeping the file read last and the
        newest two: a reader streaming through a dataset larger than the cache keeps a bounded working set instead
        of everything it read."""
        budget = self.cache.max_cache_bytes
        if budget is None:
            return
        dropped: list[weakref.WeakMethod[Callable[[], None]]] = []
        released: list[str] = []
        reading = None if self.last_read is None else self.name_of(self.last_read)
        with self._guard:
            sizes = {n: self.recorded_size(self.folder / n) or 0 for n in self._held}
            total = sum(sizes.values())
            for name in [n for n in list(self._held)[:-2] if n != reading]:  # oldest first, not the one being read
                if total <= budget // 2:
                    break
                self._held.pop(name).release()
                total -= sizes[name]
                released.append(name)
                dropped += self._unloaders.pop(name, [])
        for reference in dropped:
            unload = reference()
            if unload is not None:
                unload()
        if released:
            self.cache.evict()  # what was just released may go now

    def read_range(self, path: Path | str, start: int, stop: int) -> bytes:
        """Bytes ``start:stop`` of ``path``: from the cached copy when there is one, else one ranged request (not
        verified: a reader checks them against the file once it arrives)."""
        name = self.name_of(path)
        cached = self._cached(name)
        if cached is not None:
            with open(cached, "rb") as handle:
                handle.seek(start)
                return handle.read(max(stop - start, 0))
        if self.cache.offline:
            raise self.cache.not_cached(name)
        return self.cache.backend.read_range(self.cache.url_of(name), start, stop)

    def _cached(self, name: str) -> Path | None:
        """The cached copy of ``name`` when it is what the dataset's records say now (a copy of an earlier,
        republished version is not)."""
        entry = self.entries.get(name, {})
        size, sha256 = entry.get("size"), entry.get("sha256")
        return self.cache.cached(name, size=size if isinstance(size, int) else None,
                                 sha256=sha256 if isinstance(sha256, str) else None)  # fmt: skip

    def _adoptable(self, name: str) -> Path | None:
        from .hooks import adopted

        return adopted(self.cache.root, name)

    def prefetch(self, paths: Sequence[Path]) -> threading.Thread:
        """Fetch ``paths`` in a background thread (returned, started); a failure there is raised again when the
        file is read."""

        def run() -> None:
            for path in paths:
                try:
                    self.fetch(path, ahead=True)
                except Exception:  # reading the file fetches it again, and raises the error where it is used
                    return

        thread = threading.Thread(target=run, name="tokformats-prefetch", daemon=True)
        thread.start()
        return thread

    def release(self) -> None:
        """Drop the leases on the files fetched so far (they may be evicted once no reader holds them)."""
        with self._guard:
            held, self._held = list(self._held.values()), OrderedDict()
        for lease in held:
            lease.release()
        self._index_lease.release()
        self._index_released = True
