"""A corpus stored as token files read one after another, each with its own document offsets.

datatrove (``.ds`` + ``.ds.index``), dolma (``.npy`` + ``.csv.gz``), litdata (chunk headers) and HF ``save_to_disk``
(Arrow list offsets) all store documents this way: a file's tokens lie at a byte offset in it, and the file (or
a sibling) says where its documents end. :class:`PartsReader` maps each part, joins their offsets, and checks
each part's offsets when they are first needed (one vectorised pass, not at open): an index that lies raises
:class:`FormatError` naming the file, never reads another document's tokens.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path

import numpy as np

from ..core.arrays import ConcatenatedArray, LazyArray, TokenArray
from ..core.protocol import TokenReader
from ..errors import FormatError
from ._parts import MappedParts, Part, PartTable

# The parts' classes too: the 0.1 path ``tokformats.parts`` (tokformats._moved) names this module and all of them.
__all__ = ["PartsReader", "checked_offsets", "sibling_masks", "Part", "PartTable", "MappedParts"]


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
