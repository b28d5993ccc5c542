"""Best-fit-decreasing bin packing of document lengths into rows, in NumPy, O(N log N) for the sort and O(N) after.

The result is exactly the optimized best-fit decreasing of arXiv 2404.10830 (OLMo-core's ``InstancePacker``):
items taken longest first (ties in index order), each into the open row with the least room that still holds it
(the oldest such row on ties), a new row when none does. Instead of one segment-tree query per item, items of
equal length are placed together: with the rows' free room counted per value, a run of ``k`` items of length
``d`` fills the rows of least room ``>= d`` in ascending order, each taking ``room // d`` of them (after one item
its room is still the least that fits, so the next item goes to the same row), then new rows take
``capacity // d`` each. Every step of that is one vectorised operation over the rows touched, and there are at
most ``capacity`` distinct lengths.
"""

from __future__ import annotations

import numpy as np

from ..errors import ConfigError

__all__ = ["best_fit_decreasing", "bos_aligned_rows"]


class _RoomQueues:
    """The open rows by free room: for each room value ``1..capacity-1`` a FIFO of row ids (chunks of arrays)."""

    def __init__(self, capacity: int) -> None:
        self.count = np.zeros(capacity + 1, dtype=np.int64)
        self._chunks: list[list[np.ndarray]] = [[] for _ in range(capacity + 1)]
        self._head = np.zeros(capacity + 1, dtype=np.int64)  # rows already taken from the first chunk

    def push(self, room: int, rows: np.ndarray) -> None:
        """Rows that now have ``room`` free, oldest first, behind the ones already there."""
        if len(rows):
            self._chunks[room].append(rows)
            self.count[room] += len(rows)

    def take(self, room: int, n: int) -> np.ndarray:
        """The ``n`` oldest rows with ``room`` free, removed from the queue."""
        chunks, taken, need = self._chunks[room], [], n
        while need:
            first = chunks[0]
            head = int(self._head[room])
            got = first[head : head + need]
            taken.append(got)
            need -= len(got)
            if head + len(got) == len(first):
                chunks.pop(0)
                self._head[room] = 0
            else:
                self._head[room] = head + len(got)
        self.count[room] -= n
        return taken[0] if len(taken) == 1 else np.concatenate(taken)


def _place_run(
    queues: _RoomQueues, length: int, k: int, capacity: int, next_row: int
) -> tuple[np.ndarray, np.ndarray, int]:
    """Place ``k`` items of ``length``: ``(rows, items per row, next free row id)``, rows in placement order."""
    rooms = np.flatnonzero(queues.count[length:capacity]) + length  # ascending: best fit first
    per_row = rooms // length
    holds = np.cumsum(queues.count[rooms] * per_row)
    stop = int(np.searchsorted(holds, k, side="left"))  # rooms[:stop] are emptied; rooms[stop] maybe in part
    rows, takes, rest = [], [], []
    for position in range(min(stop + 1, len(rooms))):
        room, each = int(rooms[position]), int(per_row[position])
        left = k - (int(holds[position - 1]) if position else 0)
        n = min(int(queues.count[room]), -(-left // each))
        chosen = queues.take(room, n)
        take = np.full(n, each, dtype=np.int64)
        take[-1] = min(each, left - each * (n - 1))
        rows.append(chosen)
        takes.append(take)
        rest.append(room - take * length)
    left = k - sum(int(take.sum()) for take in takes)
    if left:
        each = capacity // length
        n = -(-left // each)
        take = np.full(n, each, dtype=np.int64)
        take[-1] = left - each * (n - 1)
        rows.append(np.arange(next_row, next_row + n, dtype=np.int64))
        takes.append(take)
        rest.append(capacity - take * length)
        next_row += n
    all_rows, all_takes, all_rest = np.concatenate(rows), np.concatenate(takes), np.concatenate(rest)
    _requeue(queues, all_rows, all_rest)
    return all_rows, all_takes, next_row


def _requeue(queues: _RoomQueues, rows: np.ndarray, rest: np.ndarray) -> None:
    """Rows with room left join the queue of that room, in the order they were filled."""
    keep = rest > 0
    rows, rest = rows[keep], rest[keep]
    if not len(rows):
        return
    order = np.argsort(rest, kind="stable")
    rows, rest = rows[order], rest[order]
    cuts = np.flatnonzero(np.diff(rest)) + 1
    for group_rows, room in zip(np.split(rows, cuts), rest[np.concatenate([[0], cuts])].tolist()):
        queues.push(int(room), group_rows)


def best_fit_decreasing(lengths: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """Pack items of ``lengths`` (each ``1..capacity``) into rows of ``capacity``.

    Returns ``(items, row_offsets)``: the item indices row after row, each row's in placement order
    (longest first), and ``rows + 1`` int64 offsets into ``items``. Rows are numbered in the order they opened.
    """
    lengths = np.asarray(lengths)
    if len(lengths) and (int(lengths.min()) < 1 or int(lengths.max()) > capacity):
        raise ConfigError(
            f"best_fit_decreasing packs items of 1..{capacity} tokens; found lengths {int(lengths.min())} to "
            f"{int(lengths.max())} (fragment or truncate longer documents, drop empty ones first)."
        )
    order = np.argsort(-lengths.astype(np.int64), kind="stable")
    sorted_lengths = lengths[order]
    queues = _RoomQueues(capacity)
    row_of = np.empty(len(lengths), dtype=np.int64)
    cuts = np.flatnonzero(np.diff(sorted_lengths)) + 1
    starts = np.concatenate([[0], cuts]).astype(np.int64)
    stops = np.concatenate([cuts, [len(lengths)]]).astype(np.int64)
    next_row = 0
    for start, stop in zip(starts.tolist(), stops.tolist()):
        if start == stop:
            continue
        rows, takes, next_row = _place_run(queues, int(sorted_lengths[start]), stop - start, capacity, next_row)
        row_of[start:stop] = np.repeat(rows, takes)
    by_row = np.argsort(row_of, kind="stable")  # placement order within a row
    offsets = np.zeros(next_row + 1, dtype=np.int64)
    np.cumsum(np.bincount(row_of, minlength=next_row), out=offsets[1:])
    return order[by_row], offsets


def bos_aligned_rows(
    lengths: np.ndarray, capacity: int, buffer: int, order: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """nanochat's BOS-aligned best-fit cropping: every row starts at a document start and is filled exactly.

    Documents enter a buffer of ``buffer`` in ``order``; each row takes, while it has room, the longest buffered
    document that fits whole, and when none fits, the shortest one cropped to the room left (the rest of that
    document is dropped). Returns ``(documents, pieces lengths, row_offsets)``: the document of each piece, its
    length (a prefix of the document), and ``rows + 1`` offsets. Empty documents are skipped; the last row is
    the only one that can be short (the documents ran out).
    """
    import bisect

    lengths = np.asarray(lengths, dtype=np.int64)
    queue = [int(d) for d in order if lengths[d] > 0]
    waiting: list[tuple[int, int]] = []  # (length, document), sorted
    documents: list[int] = []
    pieces: list[int] = []
    rows = [0]
    room = capacity
    position = 0
    while position < len(queue) or waiting:
        while len(waiting) < buffer and position < len(queue):
            document = queue[position]
            bisect.insort(waiting, (int(lengths[document]), document))
            position += 1
        fits = bisect.bisect_right(waiting, (room, len(lengths))) - 1
        if fits >= 0:  # the longest that fits whole (on equal lengths, the highest document number)
            length, document = waiting.pop(fits)
        else:  # none fits: the shortest, cropped to the room left
            _, document = waiting.pop(0)
            length = room
        documents.append(document)
        pieces.append(length)
        room -= length
        if room == 0:
            rows.append(len(pieces))
            room = capacity
    if room != capacity:
        rows.append(len(pieces))
    return np.array(documents, dtype=np.int64), np.array(pieces, dtype=np.int64), np.array(rows, dtype=np.int64)
