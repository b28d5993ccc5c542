"""Cutting ``tokenize``'s inputs into partitions of about equal size, files split where they can be.

The inputs are laid end to end and cut at ``parts - 1`` evenly spaced offsets. A cut inside a file that can be
split moves forward to the next line start (uncompressed JSON Lines, and text read a document per line) or to the
nearest row-group boundary (Parquet); inside any other file (compressed, a JSON array, text read per file or
paragraph) it moves to the file's end. Each partition is then a run of whole files and at most two pieces (its
first and last file may be parts of one). A piece records how many records its file has before it, so every
record keeps its position in the whole file: the split assignment, error messages and the output do not depend on
the partitioning. Counting those records reads the file once up to its last cut (about a second per GB).
"""

from __future__ import annotations

from bisect import bisect_right
from itertools import accumulate

from .sources import Input, _base_suffix

__all__ = ["partition_inputs", "splittable", "describe", "PARTITION_BYTES"]

#: The default partition size: ``tokenize(executor=...)`` without ``partitions`` makes one per input file, and more
#: where the inputs hold more than this many bytes per partition.
PARTITION_BYTES = 64 << 20

_LINE_SUFFIXES = (".jsonl", ".ndjson", ".json")
_TEXT_SUFFIXES = (".txt", ".text", ".md", ".rst", ".py")
_CHUNK = 1 << 24


def splittable(source: Input, unit: str) -> str | None:
    """How ``source`` can be cut: ``"lines"``, ``"row_groups"`` or None (only whole)."""
    if source.path is None or source.is_piece:
        return None
    name = source.path.name.lower()
    if name.endswith((".gz", ".zst")):
        return None
    suffix = _base_suffix(source.path)
    if suffix == ".parquet":
        return "row_groups"
    if suffix in _LINE_SUFFIXES:
        if suffix == ".json":
            with open(source.path, "rb") as handle:
                if handle.read(256).lstrip()[:1] == b"[":
                    return None
        return "lines"
    if suffix in _TEXT_SUFFIXES and unit == "line":
        return "lines"
    return None


def _line_cuts(source: Input, offsets: list[int]) -> list[tuple[int, int]]:
    """For each wanted offset (ascending), the first line start at or after it and the lines before that start;
    offsets at or past the end are dropped. One sequential read up to the last cut."""
    path = source.path
    if path is None:  # only files are cut into pieces
        raise ValueError("an iterable input has no lines to cut")
    starts: list[int] = []
    size = path.stat().st_size
    with open(path, "rb") as handle:
        for offset in offsets:
            handle.seek(max(offset - 1, 0))
            if offset > 0:
                handle.readline()  # to just past the newline ending the line that holds offset - 1
            start = handle.tell() if offset > 0 else 0
            if 0 < start < size and (not starts or start > starts[-1]):
                starts.append(start)
        cuts: list[tuple[int, int]] = []
        handle.seek(0)
        position, lines = 0, 0
        for start in starts:
            while position < start:
                chunk = handle.read(min(_CHUNK, start - position))
                lines += chunk.count(b"\n")
                position += len(chunk)
            cuts.append((start, lines))
    return cuts


def _row_group_cuts(source: Input, fractions: list[float]) -> list[tuple[int, int]]:
    """For each wanted fraction of the file's bytes, the last row-group boundary at or before it and the rows
    before that boundary."""
    import pyarrow.parquet as pq

    metadata = pq.ParquetFile(source.path).metadata
    sizes = [metadata.row_group(g).total_byte_size for g in range(metadata.num_row_groups)]
    rows = [0, *accumulate(metadata.row_group(g).num_rows for g in range(metadata.num_row_groups))]
    ends = list(accumulate(sizes))
    total = ends[-1] if ends else 0
    cuts: list[tuple[int, int]] = []
    for fraction in fractions:
        group = min(bisect_right(ends, fraction * total), len(sizes))
        if 0 < group < len(sizes) and (not cuts or group > cuts[-1][0]):
            cuts.append((group, rows[group]))
    return cuts


def _cuts_in_files(inputs: list[Input], parts: int, unit: str) -> dict[int, list[tuple[int, int]]]:
    """Where each splittable file is cut, ``{file: [(offset or row group, records before), ...]}``, and ``-1``:
    the files a partition starts with (a cut falling inside a file that cannot be split)."""
    sizes = [max(i.size or 0, 1) for i in inputs]
    ends = list(accumulate(sizes))
    wanted: dict[int, list[int]] = {}
    starts_at: set[int] = set()
    for k in range(1, parts):
        target = ends[-1] * k // parts
        f = bisect_right(ends, target)
        if f >= len(inputs):
            continue
        offset = target - (ends[f] - sizes[f])
        if offset == 0:
            starts_at.add(f)
        elif splittable(inputs[f], unit):
            wanted.setdefault(f, []).append(offset)
        elif f + 1 < len(inputs):
            starts_at.add(f + 1)
    cuts: dict[int, list[tuple[int, int]]] = {-1: [(f, 0) for f in sorted(starts_at)]}
    for f, offsets in wanted.items():
        if splittable(inputs[f], unit) == "row_groups":
            cuts[f] = _row_group_cuts(inputs[f], [o / sizes[f] for o in offsets])
        else:
            cuts[f] = _line_cuts(inputs[f], offsets)
    return cuts


def _piece(source: Input, start: tuple[int, int] | None, stop: tuple[int, int] | None) -> Input:
    """``source`` from cut ``start`` to cut ``stop`` (None: its beginning / its end)."""
    begin, first_record = start or (0, 0)
    return Input(source.path, source.iterable, begin, None if stop is None else stop[0], first_record)


def partition_inputs(inputs: list[Input], parts: int, unit: str = "line") -> list[tuple[int, list[Input]]]:
    """``inputs`` cut into at most ``parts`` partitions of about equal size: ``(number of the first input, its
    inputs and pieces)``, in input order. Joined in order, the partitions' records are the inputs' records."""
    if parts <= 1 or not inputs:
        return [(0, list(inputs))]
    cuts = _cuts_in_files(inputs, parts, unit)
    # Every boundary as (file, cut index in that file or -1 for the file's start), in reading order.
    boundaries = sorted({(f, -1) for f, _ in cuts.pop(-1)} | {(f, k) for f, c in cuts.items() for k in range(len(c))})
    boundaries = [b for b in boundaries if b != (0, -1)]
    partitions: list[tuple[int, list[Input]]] = []
    begin: tuple[int, int] = (0, -1)
    for end in [*boundaries, (len(inputs), -1)]:
        group: list[Input] = []
        for f in range(begin[0], min(end[0], len(inputs) - 1) + 1):
            if f == end[0] and end[1] < 0:
                break  # the next partition starts with this file
            file_cuts = cuts.get(f, [])
            start = file_cuts[begin[1]] if f == begin[0] and begin[1] >= 0 else None
            stop = file_cuts[end[1]] if f == end[0] and end[1] >= 0 else None
            group.append(_piece(inputs[f], start, stop) if start or stop else inputs[f])
        if group:
            partitions.append((begin[0], group))
        begin = end
    return partitions


def describe(partitions: list[tuple[int, list[Input]]]) -> list[str]:
    """One line per partition (for logs and tests): its pieces as ``name[start:stop]``."""
    return [
        " + ".join(f"{i.name}[{i.start}:{'' if i.stop is None else i.stop}]" if i.is_piece else i.name for i in group)
        for _, group in partitions
    ]

