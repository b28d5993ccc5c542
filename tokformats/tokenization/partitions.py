"""Cutting ``tokenize``'s inputs into partitions of about equal size, files split where they can be.

The inputs are laid end to end and cut at ``parts - 1`` evenly spaced offsets. A cut inside a file that can be
split moves forward to the next line start (uncompressed JSON Lines, and text read a document per line) or to the
nearest row-group boundary (Parquet); inside any other file (compressed, a JSON array, text read per file or
paragraph) it moves to the file's end. Finding a line start is a seek and a read to the next newline, so planning
reads about one line per cut, not the inputs. Each partition is then a run of whole files and at most two pieces
(its first and last file may be parts of one). A piece records how many records its file has before it, so every
record keeps its position in the whole file: the split assignment (a hash of that position), error messages,
provenance and the output do not depend on the partitioning. :func:`iter_partitions` counts those lines only as
it hands each partition out, from the previous cut in the same file (each byte read once, about 0.35 CPU-seconds
per GB from the page cache): a caller submits the first partition before a byte is counted, and each later one
while the earlier ones encode.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator
from itertools import accumulate
from pathlib import Path

from ..errors import FormatError
from .sources import Input, _base_suffix, opens_json_array

__all__ = ["partition_inputs", "iter_partitions", "count_lines", "splittable", "describe", "PARTITION_BYTES"]

#: The default partition size: ``tokenize(executor=...)`` without ``partitions`` makes one per input file, and more
#: where the inputs hold more than this many bytes per partition.
PARTITION_BYTES = 64 << 20

_LINE_SUFFIXES = (".jsonl", ".ndjson", ".json")
_TEXT_SUFFIXES = (".txt", ".text", ".md", ".rst", ".py")
_CHUNK = 1 << 20  # counting newlines in a reused buffer of this size: the fastest measured (1 MiB vs 16 MiB)


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
                if opens_json_array(handle.read(256)):
                    return None
        return "lines"
    if suffix in _TEXT_SUFFIXES and unit == "line":
        return "lines"
    return None


def _line_cuts(source: Input, offsets: list[int]) -> list[tuple[int, int | None]]:
    """For each wanted offset (ascending), the first line start at or after it; offsets at or past the end are
    dropped. The lines before each start are counted later (None here): one seek and one line read per offset."""
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
    return [(start, None) for start in starts]


def count_lines(path: Path, start: int, stop: int) -> int:
    """The newlines in bytes ``[start, stop)`` of ``path`` (read in a reused buffer, never held whole)."""
    buffer = bytearray(_CHUNK)
    lines = 0
    with open(path, "rb", buffering=0) as handle:
        handle.seek(start)
        position = start
        while position < stop:
            view = memoryview(buffer)[: min(_CHUNK, stop - position)]
            got = handle.readinto(view)
            if not got:  # shrunk since it was planned: the line numbers after this point would all be wrong
                raise FormatError(
                    f"{path} ends at byte {position:,}; it had at least {stop:,} bytes when the run was planned (the "
                    "file changed during the run); rerun once it is complete."
                )
            lines += buffer.count(b"\n", 0, got)
            position += got
    return lines


class _LineCounter:
    """The lines of one file before each of its cuts, asked in ascending order: counted on from the previous cut,
    so that the file is read once however many cuts it has."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.lines = path, 0, 0

    def before(self, offset: int) -> int:
        if offset < self.offset:
            raise ValueError(f"cuts of {self.path} asked out of order: {offset} after {self.offset}")
        self.lines += count_lines(self.path, self.offset, offset)
        self.offset = offset
        return self.lines


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


def _cuts_in_files(inputs: list[Input], parts: int, unit: str) -> dict[int, list[tuple[int, int | None]]]:
    """Where each splittable file is cut, ``{file: [(offset or row group, records before or None: not yet
    counted), ...]}``, and ``-1``: the files a partition starts with (a cut falling inside a file that cannot be
    split)."""
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
    cuts: dict[int, list[tuple[int, int | None]]] = {-1: [(f, 0) for f in sorted(starts_at)]}
    for f, offsets in wanted.items():
        if splittable(inputs[f], unit) == "row_groups":
            cuts[f] = list(_row_group_cuts(inputs[f], [o / sizes[f] for o in offsets]))
        else:
            cuts[f] = _line_cuts(inputs[f], offsets)
    return cuts


def _piece(source: Input, start: tuple[int, int] | None, stop: tuple[int, int | None] | None) -> Input:
    """``source`` from cut ``start`` (its offset and the records before it) to cut ``stop`` (None: its beginning /
    its end)."""
    begin, first_record = start or (0, 0)
    return Input(source.path, source.iterable, begin, None if stop is None else stop[0], first_record)


def partition_inputs(inputs: list[Input], parts: int, unit: str = "line") -> list[tuple[int, list[Input]]]:
    """``inputs`` cut into at most ``parts`` partitions of about equal size: ``(number of the first input, its
    inputs and pieces)``, in input order. Joined in order, the partitions' records are the inputs' records."""
    return list(iter_partitions(inputs, parts, unit))


def iter_partitions(inputs: list[Input], parts: int, unit: str = "line") -> Iterator[tuple[int, list[Input]]]:
    """:func:`partition_inputs` one partition at a time: the first comes before any line is counted, each later
    one after counting the lines of its file since the previous cut (see the module's docstring)."""
    if parts <= 1 or not inputs:
        yield 0, list(inputs)
        return
    cuts = _cuts_in_files(inputs, parts, unit)
    # Every boundary as (file, cut index in that file or -1 for the file's start), in reading order.
    boundaries = sorted({(f, -1) for f, _ in cuts.pop(-1)} | {(f, k) for f, c in cuts.items() for k in range(len(c))})
    boundaries = [b for b in boundaries if b != (0, -1)]
    counters: dict[int, _LineCounter] = {}
    begin: tuple[int, int] = (0, -1)
    for end in [*boundaries, (len(inputs), -1)]:
        group: list[Input] = []
        for f in range(begin[0], min(end[0], len(inputs) - 1) + 1):
            if f == end[0] and end[1] < 0:
                break  # the next partition starts with this file
            file_cuts = cuts.get(f, [])
            start = _counted(inputs[f], file_cuts[begin[1]], counters, f) if f == begin[0] and begin[1] >= 0 else None
            stop = file_cuts[end[1]] if f == end[0] and end[1] >= 0 else None
            group.append(_piece(inputs[f], start, stop) if start or stop else inputs[f])
        if group:
            yield begin[0], group
        begin = end


def _counted(source: Input, cut: tuple[int, int | None], counters: dict[int, _LineCounter], f: int) -> tuple[int, int]:
    """A cut with the records before it: a row group's as planned, a line start's counted now."""
    offset, records = cut
    if records is not None:
        return offset, records
    if source.path is None:  # only files are cut into pieces
        raise ValueError("an iterable input has no lines to count")
    return offset, counters.setdefault(f, _LineCounter(source.path)).before(offset)


def describe(partitions: list[tuple[int, list[Input]]]) -> list[str]:
    """One line per partition (for logs and tests): its pieces as ``name[start:stop]``."""
    return [
        " + ".join(f"{i.name}[{i.start}:{'' if i.stop is None else i.stop}]" if i.is_piece else i.name for i in group)
        for _, group in partitions
    ]
