"""Shard roll-over, written once for every sharded writer.

Two ways of cutting an output into files exist among the owners' tools:

- :class:`StreamShards`: the token stream is cut every ``capacity`` tokens and documents run across shard
  boundaries (llm.c's ``write_datafile`` shards, Time-MoE's ``data-K-of-N.bin``, NeuroShard's ``shard_N.pt``).
- :class:`DocumentShards`: shards hold whole documents; a document that does not fit starts the next shard, and a
  document larger than a whole shard gets one of its own (dolma's memmaps, litdata's chunks, datatrove's
  ``max_tokens_per_file``, HF ``save_to_disk`` shards).

A writer gives both the same two callbacks: ``start(index)`` opens shard ``index`` and returns its handle (any
object), ``end(handle, tokens)`` closes it once its size is known (patching a header, naming the file).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ..core.documents import offsets_from_lengths

__all__ = ["StreamShards", "DocumentShards"]


def _write_to_handle(handle: Any, piece: np.ndarray) -> None:
    handle.write(np.ascontiguousarray(piece).data)


class _Shards:
    """The state both kinds share: the open shard, its fill, and how many were started."""

    def __init__(self, capacity: int, start: Callable[[int], Any], end: Callable[[Any, int], None]) -> None:
        if capacity <= 0:
            raise ValueError(f"a shard must hold at least one token; the capacity given is {capacity}")
        self.capacity = capacity
        self._start, self._end = start, end
        #: The handle of the shard being written (None before the first).
        self.current: Any = None
        #: Tokens in the current shard.
        self.filled = 0
        #: Shards started so far.
        self.count = 0

    def roll(self) -> None:
        """End the current shard (if any) and start the next."""
        if self.current is not None:
            self._end(self.current, self.filled)
        self.current = self._start(self.count)
        self.count += 1
        self.filled = 0

    def finish(self, *, empty_shard: bool = True, last: bool = True) -> None:
        """End the last shard. ``empty_shard``: an output without tokens still gets one (empty) shard, as the
        owners' writers do. ``last=False`` leaves the open shard unended (a partial shard kept for later)."""
        if self.current is None and empty_shard:
            self.roll()
        if self.current is not None and last:
            self._end(self.current, self.filled)
            self.current = None


class StreamShards(_Shards):
    """Cuts a token stream into shards of exactly ``capacity`` tokens (the last may be shorter); documents run
    across shard boundaries. ``write(handle, piece)`` puts a piece into a shard (by default ``handle.write``)."""

    def __init__(
        self,
        capacity: int,
        start: Callable[[int], Any],
        end: Callable[[Any, int], None],
        write: Callable[[Any, np.ndarray], None] = _write_to_handle,
    ) -> None:
        super().__init__(capacity, start, end)
        self._write = write

    def write(self, flat: np.ndarray) -> None:
        """Append tokens, starting new shards as each fills."""
        position = 0
        while position < len(flat):
            if self.current is None or self.filled == self.capacity:
                self.roll()
            piece = flat[position : position + self.capacity - self.filled]
            self._write(self.current, piece)
            self.filled += len(piece)
            position += len(piece)


class DocumentShards(_Shards):
    """Cuts documents into shards of at most ``capacity`` tokens, never splitting a document.

    ``strict=True`` keeps every shard *below* ``capacity`` (dolma's writer refuses a document when
    ``written + length >= max_tokens``). A document too large for any shard is written alone in one.
    """

    def __init__(
        self, capacity: int, start: Callable[[int], Any], end: Callable[[Any, int], None], *, strict: bool = False
    ) -> None:
        super().__init__(capacity, start, end)
        self._room = capacity - 1 if strict else capacity

    def runs(self, lengths: np.ndarray) -> Iterator[tuple[int, int]]:
        """``(first, stop)`` ranges of ``lengths`` that go into the current shard, rolling shards in between.

        One ``searchsorted`` per shard, not a Python step per document.
        """
        ends = np.cumsum(lengths, dtype=np.int64)
        first, before = 0, 0  # the run's first document, and the tokens before it
        while first < len(lengths):
            if self.current is None:
                self.roll()
            stop = int(np.searchsorted(ends, before + self._room - self.filled, side="right"))
            if stop == first:  # document `first` does not fit here
                if self.filled:
                    self.roll()
                    continue
                stop = first + 1  # larger than any shard: alone in one
            yield first, stop
            end = int(ends[stop - 1])
            self.filled += end - before
            first, before = stop, end
            if first < len(lengths):
                self.roll()

    def pieces(self, flat: np.ndarray, lengths: np.ndarray) -> Iterator[tuple[int, int, np.ndarray]]:
        """``(first, stop, tokens)`` of each run of documents (``flat`` ids, ``lengths``) that goes into
        :attr:`current`; :attr:`filled` still counts the tokens before the run while the caller writes it."""
        offsets = offsets_from_lengths(lengths)
        for first, stop in self.runs(lengths):
            yield first, stop, flat[offsets.item(first) : offsets.item(stop)]
