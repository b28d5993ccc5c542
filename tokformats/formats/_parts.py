"""A corpus stored as token files read one after another, each with its own document offsets.

datatrove (``.ds`` + ``.ds.index``), dolma (``.npy`` + ``.csv.gz``), litdata (chunk headers) and HF ``save_to_disk``
(Arrow list offsets) all store documents this way: a file's tokens lie at a byte offset in it, and the file (or
a sibling) says where its documents end. :class:`PartsReader` maps each part, joins their offsets, and checks
each part's offsets when they are first needed (one vectorised pass, not at open): an index that lies raises
:class:`FormatError` naming the file, never reads another document's tokens.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..core.arrays import ConcatenatedArray, LazyArray, LazyShards, OpenMaps, TokenArray, default_open_maps
from ..core.protocol import TokenReader
from ..errors import FormatError

__all__ = ["Part", "PartTable", "MappedParts", "PartsReader", "checked_offsets", "sibling_masks"]


def sibling_masks(reader: TokenReader, parts: Sequence[Part], paths: list[Path]) -> TokenArray | None:
    """The loss masks stored beside ``parts`` (``paths[k]``: part k's mask file, one byte per token), mapped and
    joined in order; None when no part has one. Some parts with masks and others without is an error. A dataset
    opened by URL fetches the masks it lists when they are first used."""
    remote = reader._remote
    present = [p.is_file() or (remote is not None and remote.has(p)) for p in paths]
    if not any(present):
        return None
    if not all(present):
        missing = paths[present.index(False)]
        raise FormatError(f"{missing} is missing, while other files of {reader.path} have their loss masks.")
    maps = []
    for part, path in zip(parts, paths):
        reader._fetched(path)
        size = path.stat().st_size
        if size != part.tokens:
            raise FormatError(f"{path}: {size:,} loss-mask bytes for {part.tokens:,} tokens in {part.path.name}.")
        reader._pin(path)
        maps.append(reader._map(path, np.dtype("u1")) if part.tokens else np.zeros(0, dtype="u1"))
    return maps[0] if len(maps) == 1 else ConcatenatedArray(maps)


class Part:
    """Where one file's tokens are: ``tokens`` elements of ``dtype`` at byte ``offset`` of ``path``.

    A plain class with slots, not a named tuple: ``collections.namedtuple`` compiles a ``__new__`` with ``eval``
    (~0.05-0.1 ms in a fresh process), paid on every llm.c glob's first open; parts are only ever read by field.
    """

    __slots__ = ("dtype", "offset", "path", "tokens")

    def __init__(self, path: Path, offset: int, tokens: int, dtype: np.dtype) -> None:
        self.path, self.offset, self.tokens, self.dtype = path, offset, tokens, dtype

    def __repr__(self) -> str:
        return f"Part({str(self.path)!r}, offset={self.offset}, tokens={self.tokens}, dtype={self.dtype})"


#: What :func:`os.stat` says of a file at open: (device, inode, size, modification time in ns).
Pin = tuple[int, int, int, int]


class PartTable(Sequence[Part]):
    """Many parts of one dtype at one byte offset (shards of a glob), kept compact: paths as strings, token counts
    and pins (what each file was at open) beside them. A :class:`Part` (and its ``Path``) is made only for the part
    asked for, so 600,000 shards cost a list of names and an array, not 600,000 ``Path`` objects.

    ``pins`` is flat, four ints a part (part ``k``'s pin is ``pins[4 * k : 4 * k + 4]``): no tuple per part, which
    the cyclic garbage collector would track while the open allocates them (it does not track ints)."""

    def __init__(self, paths: list[str], offset: int, counts: np.ndarray, dtype: np.dtype, pins: list[int]) -> None:
        if not len(paths) == len(counts) == len(pins) // 4 or len(pins) % 4:
            raise ValueError(f"{len(paths)} paths, {len(counts)} counts and {len(pins) / 4:g} pins do not match")
        self.paths, self.offset, self.dtype, self.pins = paths, offset, dtype, pins
        self.counts = np.asarray(counts, dtype=np.int64)

    def pin(self, index: int) -> Pin:
        """Part ``index``'s pin: (device, inode, size, modification time in ns) when it was opened."""
        start = 4 * range(len(self.paths))[index]  # IndexError out of range; -1 is the last part
        device, inode, size, modified = self.pins[start : start + 4]
        return device, inode, size, modified

    def __len__(self) -> int:
        return len(self.paths)

    def part(self, index: int) -> Part:
        """Part ``index``."""
        return Part(Path(self.paths[index]), self.offset, int(self.counts[index]), self.dtype)

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, slice):
            return [self.part(k) for k in range(*key.indices(len(self)))]
        return self.part(range(len(self))[key])

    def __iter__(self) -> Iterator[Part]:
        return (self.part(k) for k in range(len(self)))

    @property
    def total_tokens(self) -> int:
        """Tokens of every part together."""
        return int(self.counts.sum())


def checked_offsets(offsets: np.ndarray, count: int, where: str, field: str) -> np.ndarray:
    """``offsets`` (``D + 1`` values, document ``k`` is ``offsets[k]:offsets[k + 1]``) as int64, after checking they
    start at 0, never decrease and end at ``count``; otherwise :class:`FormatError` naming ``where`` and ``field``."""
    values = np.asarray(offsets, dtype=np.int64)
    if len(values) == 0 or values[0] != 0:
        found = "nothing" if len(values) == 0 else f"{int(values[0]):,}"
        raise FormatError(f"{where}: {field} must start at token 0, found {found}.")
    if values[-1] != count:
        raise FormatError(f"{where}: {field} ends at token {int(values[-1]):,}, but the file holds {count:,} tokens.")
    steps = np.diff(values)
    if len(steps) and steps.min() < 0:
        bad = int(np.argmax(steps < 0))
        raise FormatError(
            f"{where}: {field} goes backwards at document {bad:,} (ends at {int(values[bad + 1]):,} after "
            f"{int(values[bad]):,})."
        )
    return values


class MappedParts(TokenReader):
    """A token stream stored as parts (:class:`Part`), mapped one by one; a subclass sets them with
    :meth:`_set_parts` and finds documents its own way (:class:`PartsReader`: per part; llm.c: at a delimiter)."""

    _parts: Sequence[Part]
    #: Whether several local parts are mapped only when a token of them is first read, at most ``open_maps`` at
    #: once (least recently used unmapped first), rather than all at open. A format opts in when it checks a part
    #: as it maps it (:meth:`_open_part`), so that nothing of a part is read before that part is checked.
    maps_on_use: ClassVar[bool] = False
    #: The bound on parts mapped at once when :attr:`maps_on_use` (None: ``core.arrays.default_open_maps()``).
    open_maps: int | None = None

    def _set_parts(self, parts: Sequence[Part]) -> None:
        if isinstance(parts, PartTable):  # one dtype; each file's pin was taken at open and is registered as it maps
            self._parts = parts
            return
        dtypes = {p.dtype for p in parts}
        if len(dtypes) > 1:
            listing = ", ".join(f"{p.path.name}: {p.dtype.name}" for p in parts[:4])
            raise FormatError(f"{parts[0].path.parent}: the files mix token dtypes ({listing}); open them apart.")
        self._parts = parts
        if self._remote is None:  # a dataset opened by URL pins each file as it arrives
            files = self._files
            self._pin(*(p for p in dict.fromkeys(p.path for p in parts) if not files.is_pinned(p)))

    @property
    def path(self) -> Path:
        return self._parts[0].path

    @property
    def files(self) -> list[Path]:
        return list(dict.fromkeys(p.path for p in self._parts))

    @cached_property
    def shards(self) -> list[np.ndarray]:
        """Each part's tokens as its own read-only memory map (for a dataset opened by URL, a
        :class:`~tokformats.arrays.LazyArray` that fetches the file on first use; for several local parts of a format
        that maps on use, :class:`~tokformats.core.arrays.LazyShards`: each mapped when first read, at most
        :attr:`open_maps` at once)."""
        if self._remote is None and self.maps_on_use and len(self._parts) > 1:
            return LazyShards(  # type: ignore[return-value]
                self._part_counts(),
                self.dtype,
                self._open_part,
                self._part_name,
                OpenMaps(self.open_maps or default_open_maps()),
            )
        return [self._map_lazily(p.path, p.dtype, p.offset, p.tokens) for p in self._parts]  # type: ignore[misc]

    def _part_counts(self) -> np.ndarray:
        if isinstance(self._parts, PartTable):
            return self._parts.counts
        return np.array([p.tokens for p in self._parts], dtype=np.int64)

    def _part_name(self, index: int) -> str:
        if isinstance(self._parts, PartTable):
            return self._parts.paths[index]
        return str(self._parts[index].path)

    def _pin_part(self, index: int) -> Part:
        """Part ``index``, its pin (taken at open) registered, so that :meth:`_map` refuses it if it changed since."""
        part = self._parts[index]
        if isinstance(self._parts, PartTable):
            self._files.pin_as(part.path, self._parts.pin(index))
        return part

    def _open_part(self, index: int) -> np.ndarray:
        """Map part ``index`` (pinned at open: a file changed since is refused); a format that defers a part's
        checks to its first use (:attr:`maps_on_use`) makes them here first."""
        part = self._pin_part(index)
        return self._map(part.path, part.dtype, part.offset, part.tokens)

    @cached_property
    def tokens(self) -> TokenArray:
        """Every part's tokens in order: a memmap for one part, a ConcatenatedArray for several."""
        return self.shards[0] if len(self.shards) == 1 else ConcatenatedArray(self.shards)

    def _cached_maps(self) -> tuple[str, ...]:
        return ("tokens", "shards", "_view")

    @property
    def dtype(self) -> np.dtype:
        if isinstance(self._parts, PartTable):  # one dtype for every part: no Part (and Path) made to ask
            return self._parts.dtype
        return self._parts[0].dtype

    @property
    def num_tokens(self) -> int:
        if isinstance(self._parts, PartTable):
            return self._parts.total_tokens
        return sum(p.tokens for p in self._parts)

    def _summary(self) -> dict[str, Any]:
        summary = super()._summary()
        files = len(self._parts) if isinstance(self._parts, PartTable) else len(self.files)  # a table's are distinct
        if files > 1:
            summary["files"] = files
        return summary


class PartsReader(MappedParts):
    """Parts that each record their own documents (an index file, a chunk header, Arrow offsets)."""

    @abstractmethod
    def _part_offsets(self, index: int) -> np.ndarray:
        """``D_k + 1`` offsets of part ``index``'s documents, relative to the part, checked with
        :func:`checked_offsets`; called once per part, when :attr:`offsets` is first used."""

    def _part_documents(self, index: int) -> int:
        """Number of documents in part ``index``; a format whose index records it without the part's data overrides
        this, so that a dataset opened by URL counts its documents without fetching every part."""
        return len(self._part_offsets(index)) - 1

    # A dataset opened by URL finds a document by part: only that part's offsets (and data) are fetched. A local
    # one joins every part's offsets once (the faster path per document).
    @cached_property
    def _document_starts(self) -> np.ndarray:
        counts = [self._part_documents(k) for k in range(len(self._parts))]
        return np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64)

    @cached_property
    def _offsets_by_part(self) -> dict[int, np.ndarray]:
        return {}

    def _offsets_of(self, part: int) -> np.ndarray:
        """Part ``part``'s document offsets (:meth:`_part_offsets`), computed once."""
        offsets = self._offsets_by_part.get(part)
        if offsets is None:
            offsets = self._offsets_by_part[part] = self._part_offsets(part)
        return offsets

    def __len__(self) -> int:
        if self._remote is None or "offsets" in self.__dict__:
            return len(self.offsets) - 1
        return int(self._document_starts[-1])

    def _item(self, index: int) -> np.ndarray:
        if self._remote is not None and "offsets" not in self.__dict__:
            return self._item_by_part(index)
        offsets = self.offsets
        return self._view[offsets.item(index) : offsets.item(index + 1)]

    def _item_by_part(self, index: int) -> np.ndarray:
        part = int(np.searchsorted(self._document_starts, index, side="right")) - 1
        shard = self.shards[part]
        if isinstance(shard, LazyArray):
            shard.data  # noqa: B018 - the part first: its offsets are then read from the verified file
        offsets = self._offsets_of(part)
        local = index - int(self._document_starts[part])
        return self.shards[part][offsets.item(local) : offsets.item(local + 1)]

    def _offsets(self) -> np.ndarray:
        pieces = [np.zeros(1, dtype=np.int64)]
        base = 0
        for k, part in enumerate(self._parts):
            pieces.append(self._part_offsets(k)[1:] + base)
            base += part.tokens
        return np.concatenate(pieces)
