"""Memory-mapped arrays: one file (including the empty case) or several files seen as one.

``np.memmap`` refuses empty files and zero-length maps; :func:`map_file` returns an empty array
there so that every reader handles an empty corpus without a special case.
:class:`ConcatenatedArray` presents several 1-D arrays (one per shard) as one array that slices
like a NumPy array: a slice inside one part is a zero-copy view, a slice across parts one copy.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import stat
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, overload

import numpy as np

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = [
    "map_file",
    "ConcatenatedArray",
    "LazyArray",
    "OpenMaps",
    "LazyShards",
    "default_open_maps",
    "GrowableArray",
    "TokenArray",
    "CHUNK_ELEMENTS",
    "iter_chunks",
]

#: Elements processed per step by chunked scans: large enough for numpy to run at memory speed,
#: small enough that temporaries (a bool mask, a cast) stay a few tens of MB whatever the corpus size.
CHUNK_ELEMENTS = 1 << 24


def map_file(
    path: str | os.PathLike[str],
    dtype: npt.DTypeLike,
    offset: int = 0,
    count: int | None = None,
    *,
    opened: Callable[[os.stat_result], None] | None = None,
) -> np.ndarray:
    """Map ``count`` elements of ``dtype`` from ``path`` starting at byte ``offset``, read-only.

    ``count=None`` maps everything from ``offset`` to the end of the file. The result is an ``np.memmap`` built
    directly over an ``mmap`` (``np.memmap()`` itself spends more on path handling than the map costs), unmapped
    once no array views it. A zero-length result is a plain empty array, because zero bytes cannot be mapped.
    ``opened`` is called with the ``fstat`` of the descriptor that is mapped, before the map is made (a pin checked or
    taken there concerns the very file mapped, with no ``stat`` of the path beside it); it may raise.
    """
    dt = np.dtype(dtype)
    if dt.kind not in "iuf" or dt.fields is not None:  # never map bytes as Python objects: that crashes
        raise TypeError(f"refusing to map {path} as {dt}: only integer and floating dtypes are mapped")
    # O_NONBLOCK: opening a FIFO returns at once (its fstat then says what it is) instead of waiting for a writer.
    descriptor = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        info = os.fstat(descriptor)
        if opened is not None:
            opened(info)
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), os.fspath(path))
        size = info.st_size
        if count is None:
            count = (size - offset) // dt.itemsize
        if count == 0:
            return np.empty(0, dtype=dt)
        if offset < 0 or offset + count * dt.itemsize > size:
            raise ValueError(f"mmap length is greater than file size: {offset + count * dt.itemsize} > {size}")
        mapped = mmap.mmap(descriptor, offset + count * dt.itemsize, access=mmap.ACCESS_READ)
    finally:
        os.close(descriptor)
    array = np.frombuffer(mapped, dtype=dt, count=count, offset=offset).view(np.memmap)
    array.filename, array.offset, array.mode = os.path.abspath(path), offset, "r"
    setattr(array, "_mmap", mapped)  # noqa: B010 - what np.memmap keeps (not in NumPy's type stubs)
    return array


class ConcatenatedArray:
    """Several 1-D arrays of one dtype, indexed as their concatenation.

    Indexing with an integer gives a scalar; with a slice, an ndarray (a view when the slice lies in
    one part, else a copy); with an integer array, the gathered elements. ``np.asarray`` materialises
    the whole thing, so prefer slices or :meth:`iter_chunks` on large corpora. ``sum``, ``min`` and
    ``max`` reduce part by part without materialising.
    """

    def __init__(self, parts: Sequence[np.ndarray]) -> None:
        if not len(parts):
            raise ValueError("ConcatenatedArray needs at least one part")
        if isinstance(parts, LazyShards):  # lengths known without making (or mapping) any part
            self.parts: Sequence[Any] = parts
            lengths = parts.lengths
            self.dtype: np.dtype = parts.dtype
        else:
            dtypes = {p.dtype for p in parts}
            if len(dtypes) != 1:
                raise ValueError(f"all parts must share one dtype, found {sorted(map(str, dtypes))}")
            self.parts = tuple(parts)
            lengths = np.fromiter((len(p) for p in parts), dtype=np.int64, count=len(parts))
            self.dtype = parts[0].dtype
        #: ``starts[k]`` is the global index of part k's first element; ``starts[-1]`` the total length.
        self.starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)

    def __len__(self) -> int:
        return int(self.starts[-1])

    @property
    def shape(self) -> tuple[int]:
        """``(len(self),)``, as for a 1-D ndarray."""
        return (len(self),)

    @property
    def ndim(self) -> int:
        """Always 1."""
        return 1

    @property
    def size(self) -> int:
        """Number of elements."""
        return len(self)

    @property
    def nbytes(self) -> int:
        """Bytes the elements occupy."""
        return len(self) * self.dtype.itemsize

    def __repr__(self) -> str:
        return f"ConcatenatedArray(parts={len(self.parts)}, length={len(self)}, dtype={self.dtype})"

    def _part_of(self, index: int) -> int:
        return int(np.searchsorted(self.starts, index, side="right")) - 1

    def _range(self, start: int, stop: int) -> np.ndarray:
        if stop <= start:
            return np.empty(0, dtype=self.dtype)
        first = self._part_of(start)
        last = self._part_of(stop - 1)
        if first == last:
            base = int(self.starts[first])
            piece: np.ndarray = self.parts[first][start - base : stop - base]
            return piece
        pieces = []
        for k in range(first, last + 1):
            base = int(self.starts[k])
            pieces.append(self.parts[k][max(start - base, 0) : min(stop - base, len(self.parts[k]))])
        return np.concatenate(pieces)

    @overload
    def __getitem__(self, key: int | np.integer[Any]) -> Any: ...
    @overload
    def __getitem__(self, key: slice | np.ndarray | list[int]) -> np.ndarray: ...
    def __getitem__(self, key: Any) -> Any:
        n = len(self)
        if isinstance(key, (int, np.integer)):
            i = int(key)
            if i < 0:
                i += n
            if not 0 <= i < n:
                raise IndexError(f"index {int(key)} is out of range for {n} elements")
            k = self._part_of(i)
            return self.parts[k][i - int(self.starts[k])]
        if isinstance(key, slice):
            start, stop, step = key.indices(n)
            if step == 1:
                return self._range(start, stop)
            if step > 0:
                return self._range(start, stop)[::step]
            # Negative step: take the covered range forwards, then step backwards through it.
            lo = stop + 1
            return self._range(lo, start + 1)[::-1][::-step]
        indices = np.asarray(key)
        if indices.dtype == bool:
            raise IndexError("boolean masks are not supported on a ConcatenatedArray; use np.asarray first")
        if indices.dtype.kind not in "iu":
            raise IndexError(f"only integers, slices and integer arrays are valid indices, not {indices.dtype}")
        flat = indices.astype(np.int64).ravel()
        flat = np.where(flat < 0, flat + n, flat)
        if flat.size and (flat.min() < 0 or flat.max() >= n):
            raise IndexError(f"an index is out of range for {n} elements")
        owner = np.searchsorted(self.starts, flat, side="right") - 1
        out = np.empty(flat.shape, dtype=self.dtype)
        for k in np.unique(owner):
            mask = owner == k
            out[mask] = self.parts[k][flat[mask] - self.starts[k]]
        return out.reshape(indices.shape)

    def __iter__(self) -> Iterator[Any]:
        for part in self.parts:
            yield from part

    def __array__(self, dtype: npt.DTypeLike | None = None, copy: bool | None = None) -> np.ndarray:
        # part by part into one array, not np.concatenate(parts): that would hold every part's map at once
        whole = np.empty(len(self), dtype=self.dtype if dtype is None else dtype)
        for k, part in enumerate(self.parts):
            whole[self.starts[k] : self.starts[k + 1]] = part[:]
        return whole

    def iter_chunks(self, chunk: int = CHUNK_ELEMENTS) -> Iterator[np.ndarray]:
        """Yield consecutive views of at most ``chunk`` elements covering the whole array."""
        for part in self.parts:
            yield from iter_chunks(part, chunk)

    def sum(self) -> Any:
        """Sum of all elements, with NumPy's accumulator dtype for this dtype."""
        return np.add.reduce([part.sum() for part in self.parts])

    def min(self) -> Any:
        """Smallest element; ``ValueError`` when empty, as NumPy."""
        return min(p.min() for p in self.parts if len(p)) if len(self) else np.empty(0, self.dtype).min()

    def max(self) -> Any:
        """Largest element; ``ValueError`` when empty, as NumPy."""
        return max(p.max() for p in self.parts if len(p)) if len(self) else np.empty(0, self.dtype).max()


def default_open_maps() -> int:
    """How many shard maps a reader keeps at once by default: a quarter of this process's file-descriptor limit
    (``ulimit -n``; each map holds a descriptor), between 16 and 1,024."""
    try:  # POSIX's sysconf gives the soft limit without importing ``resource`` (a fresh process's first open)
        soft = os.sysconf("SC_OPEN_MAX")
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows): maps hold no descriptor there
        return 1024
    if soft < 0:  # unlimited
        return 1024
    return max(16, min(1024, soft // 4))


class OpenMaps:
    """A bound on how many :class:`LazyArray` hold their data at once: a least-recently-used set of loaded arrays.

    Loading one more than ``limit`` unloads the one used longest ago. A mapped shard holds a file descriptor
    (Python's ``mmap`` keeps one per map), so a reader of 600,000 shards that kept every shard it touched mapped
    would fail with "Too many open files"; under this bound it keeps ``limit``. An array the caller still views
    stays valid: unloading only drops the reader's reference.
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"open_maps must be at least 1, found {limit}")
        self.limit = int(limit)
        self._loaded: OrderedDict[int, LazyArray] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._loaded)

    def loaded(self, array: LazyArray) -> None:
        """Record that ``array`` just loaded its data; unload the least recently used beyond the limit."""
        with self._lock:
            self._loaded[id(array)] = array
            self._loaded.move_to_end(id(array))
            evicted = [self._loaded.popitem(last=False)[1] for _ in range(len(self._loaded) - self.limit)]
        for old in evicted:  # outside the lock: unload() calls forget()
            old.unload()

    def used(self, array: LazyArray) -> None:
        """Record a use of loaded ``array`` (it becomes the most recently used)."""
        with contextlib.suppress(KeyError):  # unloaded meanwhile (another thread's eviction)
            self._loaded.move_to_end(id(array))

    def forget(self, array: LazyArray) -> None:
        """``array`` unloaded its data (by eviction or by its owner)."""
        with self._lock:
            self._loaded.pop(id(array), None)


class LazyArray:
    """A 1-D array whose length and dtype are known before its data: the data comes from ``load()`` on first use
    (a remote shard fetched when a document in it is first read; a local shard mapped when a token of it is first
    read). A loaded array of another length or dtype raises :class:`tokformats.FormatError` naming ``where``.
    With ``open_maps``, at most that many arrays sharing it hold their data at once."""

    def __init__(
        self,
        length: int,
        dtype: npt.DTypeLike,
        load: Callable[[], np.ndarray],
        where: str,
        open_maps: OpenMaps | None = None,
    ) -> None:
        self._length, self.dtype, self._load, self.where = int(length), np.dtype(dtype), load, where
        self._data: np.ndarray | None = None
        self._open_maps = open_maps

    @property
    def loaded(self) -> bool:
        """Whether the data is there yet."""
        return self._data is not None

    def unload(self) -> None:
        """Drop the data (its map closes once no view of it remains); the next use loads it again."""
        self._data = None
        if self._open_maps is not None:
            self._open_maps.forget(self)

    @property
    def data(self) -> np.ndarray:
        """The data, loading it the first time (and again after :meth:`unload`)."""
        data = self._data  # one read: another thread may unload it meanwhile
        if data is not None:
            if self._open_maps is not None:
                self._open_maps.used(self)
            return data
        from ..errors import FormatError

        data = self._load()
        if len(data) != self._length or data.dtype != self.dtype:
            raise FormatError(
                f"{self.where}: holds {len(data):,} {data.dtype.name} values; its index said {self._length:,} "
                f"{self.dtype.name}."
            )
        self._data = data
        if self._open_maps is not None:
            self._open_maps.loaded(self)
        return data

    def __len__(self) -> int:
        return self._length

    @property
    def shape(self) -> tuple[int]:
        """``(length,)``, known without loading."""
        return (self._length,)

    def __getitem__(self, key: Any) -> Any:
        return self.data[key]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.data)

    def __array__(self, dtype: npt.DTypeLike | None = None, copy: bool | None = None) -> np.ndarray:
        return np.asarray(self.data, dtype=dtype)

    def sum(self) -> Any:
        """The sum of the values (loads them)."""
        return self.data.sum()

    def min(self) -> Any:
        """The smallest value (loads them)."""
        return self.data.min()

    def max(self) -> Any:
        """The largest value (loads them)."""
        return self.data.max()


class LazyShards(Sequence[LazyArray]):
    """Shards of known lengths, each a :class:`LazyArray` made the first time it is asked for and mapped the first
    time a value of it is read, at most ``open_maps`` mapped at once. Opening a glob of 600,000 shards then builds
    no object per shard; reading them keeps a bounded number of maps (and file descriptors).

    Args:
        lengths: each shard's number of elements.
        dtype: their dtype.
        load: ``load(k)`` maps shard ``k`` (checking it first).
        where: ``where(k)`` names shard ``k`` in messages.
        open_maps: the bound shared by the shards' maps.
    """

    def __init__(
        self,
        lengths: np.ndarray,
        dtype: npt.DTypeLike,
        load: Callable[[int], np.ndarray],
        where: Callable[[int], str],
        open_maps: OpenMaps,
    ) -> None:
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.dtype = np.dtype(dtype)
        self._load, self._where, self.open_maps = load, where, open_maps
        self._made: dict[int, LazyArray] = {}

    def __len__(self) -> int:
        return len(self.lengths)

    def _shard(self, index: int) -> LazyArray:
        array = self._made.get(index)
        if array is None:
            if len(self._made) > 2 * self.open_maps.limit + 64:  # forget the unmapped ones: memory stays bounded
                self._made = {k: a for k, a in self._made.items() if a.loaded}
            load, length = self._load, int(self.lengths[index])
            array = LazyArray(length, self.dtype, lambda: load(index), self._where(index), self.open_maps)
            self._made[index] = array
        return array

    @overload
    def __getitem__(self, key: int) -> LazyArray: ...
    @overload
    def __getitem__(self, key: slice) -> list[LazyArray]: ...
    def __getitem__(self, key: int | slice) -> LazyArray | list[LazyArray]:
        positions = range(len(self))
        if isinstance(key, slice):
            return [self._shard(k) for k in positions[key]]
        return self._shard(positions[key])

    def __iter__(self) -> Iterator[LazyArray]:
        return (self._shard(k) for k in range(len(self)))


#: What ``Reader.tokens`` returns: a memmap for one file, a ConcatenatedArray for several.
TokenArray = np.ndarray | ConcatenatedArray


def iter_chunks(array: TokenArray, chunk: int = CHUNK_ELEMENTS) -> Iterator[np.ndarray]:
    """Yield consecutive slices of at most ``chunk`` elements covering ``array``."""
    if isinstance(array, ConcatenatedArray):
        yield from array.iter_chunks(chunk)
        return
    for start in range(0, len(array), chunk):
        yield array[start : start + chunk]


class GrowableArray:
    """A 1-D array that grows by appending, with amortised doubling: an index kept as NumPy, not lists.

    Writers use it for per-sequence lengths and similar index columns, so that memory stays
    ``itemsize`` bytes per entry (a Python list of ints costs ~36 bytes per entry).
    """

    def __init__(self, dtype: npt.DTypeLike, capacity: int = 1024) -> None:
        self._data = np.empty(max(capacity, 1), dtype=dtype)
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def _reserve(self, extra: int) -> None:
        needed = self._size + extra
        if needed > len(self._data):
            grown = np.empty(max(needed, 2 * len(self._data)), dtype=self._data.dtype)
            grown[: self._size] = self._data[: self._size]
            self._data = grown

    def append(self, value: Any) -> None:
        """Add one value."""
        self._reserve(1)
        self._data[self._size] = value
        self._size += 1

    def extend(self, values: npt.ArrayLike) -> None:
        """Add many values (cast to this array's dtype; callers check ranges first)."""
        array = np.asarray(values)
        self._reserve(len(array))
        self._data[self._size : self._size + len(array)] = array
        self._size += len(array)

    def view(self) -> np.ndarray:
        """The values so far (a view: valid until the next append)."""
        return self._data[: self._size]
