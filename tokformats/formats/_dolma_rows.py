"""dolma's ``.csv.gz`` rows (``start,end,id,src,loc``): the two columns a reader needs, parsed with NumPy, and
read only as far as they are used; and the rows a writer writes, formatted with NumPy and compressed as they come.

Opening a dolma file reads only its last row (which the dtype is checked against): from the marked gzip member
the writer puts it in (:func:`tail_scan`), else by one streamed pass that also counts the rows (:func:`scan_rows`;
for a dataset of several files told the dtype, when the file is first used); the first document decompresses the
first few kilobytes; the offsets decompress the rest. Every row is checked as it is parsed, before any document is
read with it: the rows tile the file (each starts where the previous one ends, the first at 0), an end never
precedes its start nor passes the file's tokens, and the last one ends at its last token. A file changed since it
was opened, a truncated gzip stream, a zip bomb and rows that are not rows are
:class:`~tokformats.errors.FormatError` naming the file (and the row and field).
"""

from __future__ import annotations

import csv
import io
import os
import struct
import threading
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ..errors import FormatError
from ..fs.untrusted import MAX_DEFLATE_RATIO, existing_regular

__all__ = [
    "GzipRows",
    "RowScan",
    "RowStream",
    "format_rows",
    "parse_rows",
    "rows_text",
    "scan_rows",
    "start_end_columns",
    "tail_scan",
]

_DIGITS = 19  # an int64 holds every number of up to 18 digits; longer ones go to the csv parser
_ROWS_PER_STEP = 1 << 18
#: Bytes of decompressed rows counted per NumPy step (:func:`_filled_lines`).
_LINES_STEP = 1 << 22
_POWERS_OF_TEN = 10 ** np.arange(_DIGITS, dtype=np.int64)
#: Compressed bytes read for a file's first rows (~400 rows of dolma's writer); each later read doubles, to 16 MiB.
_FIRST_READ = 1 << 12
_LARGEST_READ = 1 << 24
_GZIP = 16 + zlib.MAX_WBITS
#: The gzip header of the member holding a file's last row, as :class:`GzipRows` writes it with ``last_row_apart``:
#: the FEXTRA flag and one subfield ``TR`` ("tokformats row") saying so. The byte between the two pieces records the
#: compression level. Other tools' files do not carry it: their last row is found by the streamed pass.
_TAIL_HEAD = b"\x1f\x8b\x08\x04\x00\x00\x00\x00"
_TAIL_MARK = b"\xff\x0c\x00TR\x08\x00last row"
#: Compressed bytes read back from the end of a file for its last row's member (a row of up to ~60,000 bytes).
_TAIL_READ = 1 << 16


def _budget(size: int) -> int:
    """The most a ``.csv.gz`` of ``size`` bytes may decompress to (more is a zip bomb)."""
    return max(size * MAX_DEFLATE_RATIO, 1 << 20)


def _regular_size(path: Path) -> int:
    """The rows file's size: it must exist (listed, it may be a broken link or gone since) and hold something."""
    size = existing_regular(path, " (a broken link?); its .npy's documents are recorded there")
    if size == 0:
        raise FormatError(f"{path} is empty: not a gzip file of start,end rows; its .npy cannot be split.")
    return size


def rows_text(path: Path) -> bytes:
    """The decompressed ``.csv.gz``, bounded by the file's size (a zip bomb is refused)."""
    return b"".join(_inflated(path, _identity(path)))


def _identity(path: Path) -> tuple[int, int, int, int]:
    """(device, inode, size, modification time): what a file was when first read, to refuse it if it changes."""
    _regular_size(path)
    info = os.stat(path)
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


def _inflated(path: Path, identity: tuple[int, int, int, int]) -> Iterator[bytes]:
    """The decompressed text of ``path`` in pieces, read in growing steps (the first rows cost a small read); the
    file must still be what ``identity`` says, every gzip member must end, and the whole is bounded."""
    budget, produced, position, step = _budget(identity[2]), 0, 0, _FIRST_READ
    inflate, fed = zlib.decompressobj(_GZIP), False
    while position < identity[2]:
        try:
            with open(path, "rb") as handle:
                info = os.fstat(handle.fileno())
                if (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns) != identity:
                    raise FormatError(f"{path} changed since it was opened; open the dataset again.")
                handle.seek(position)
                packed = handle.read(step)
        except FileNotFoundError:
            raise FormatError(f"{path} was removed since it was opened; open the dataset again.") from None
        if not packed:  # shorter than it was at open, though its size and time say otherwise
            break
        position, step = position + len(packed), min(step * 2, _LARGEST_READ)
        try:
            while packed:
                fed = True
                piece = inflate.decompress(packed, budget + 1 - produced)
                produced += len(piece)
                if produced > budget:
                    raise FormatError(f"{path}: decompresses to more than {budget:,} bytes; refusing it as corrupt.")
                yield piece
                packed = inflate.unconsumed_tail
                if inflate.eof:  # a member ends; gzip allows another after it (as gzip.open reads them)
                    packed, inflate, fed = inflate.unused_data + packed, zlib.decompressobj(_GZIP), False
        except zlib.error as error:
            raise FormatError(f"{path}: not a readable gzip file ({error}).") from None
    if fed:  # the last member never ended
        raise FormatError(
            f"{path}: the gzip stream is truncated (it ends inside a member after {produced:,} bytes of rows)."
        )


def _integer_column(text: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> np.ndarray | None:
    """The integers written as plain digits at ``text[starts[k]:stops[k]]``, parsed for every row at once: the
    digits right-aligned in a rows x width matrix (zeros before a field's start), times the powers of ten. None when
    any field is not 1 to 18 ASCII digits."""
    widths = stops - starts
    if not len(widths):
        return np.zeros(0, dtype=np.int64)
    if widths.min() < 1 or widths.max() >= _DIGITS:
        return None
    width = int(widths.max())
    places = np.arange(-width, 0)
    scale = _POWERS_OF_TEN[width - 1 :: -1] if width > 1 else _POWERS_OF_TEN[:1]
    values = np.empty(len(starts), dtype=np.int64)
    for first in range(0, len(starts), _ROWS_PER_STEP):  # bounded temporaries: rows x width at a time
        rows = slice(first, first + _ROWS_PER_STEP)
        positions = stops[rows, None] + places
        digits = text[np.maximum(positions, 0)] - np.uint8(ord("0"))  # uint8: below '0' wraps above 9
        digits *= positions >= starts[rows, None]
        if (digits > 9).any():
            return None
        values[rows] = digits.astype(np.int64) @ scale
    return values


def start_end_columns(data: bytes) -> tuple[np.ndarray, np.ndarray] | None:
    """The first two columns of dolma's rows, vectorised: rows are lines, each ``start,end,...`` in plain digits.
    None when the text is anything else (a quoted field spanning lines, signs, spaces): the csv parser reads it."""
    text = np.frombuffer(data, dtype=np.uint8)
    newlines = np.flatnonzero(text == ord("\n"))
    quotes = np.flatnonzero(text == ord('"'))
    if quotes.size and (np.searchsorted(quotes, newlines) % 2).any():
        return None  # a newline inside quotes: rows are not lines
    line_starts = np.concatenate([[0], newlines + 1])
    line_ends = np.concatenate([newlines, [len(text)]])
    carriage = line_ends > line_starts
    carriage[carriage] = text[line_ends[carriage] - 1] == ord("\r")
    line_ends = line_ends - carriage
    keep = line_ends > line_starts  # the csv reader skips empty rows
    line_starts, line_ends = line_starts[keep], line_ends[keep]
    commas = np.flatnonzero(text == ord(","))
    first = np.searchsorted(commas, line_starts)
    if first.size and (first >= len(commas)).any():
        return None
    first_comma = commas[np.minimum(first, len(commas) - 1)]
    if (first_comma >= line_ends).any():
        return None  # a row of one field: the csv parser names it
    second = np.minimum(first + 1, len(commas) - 1)
    second_comma = np.where((first + 1 < len(commas)) & (commas[second] < line_ends), commas[second], line_ends)
    starts = _integer_column(text, line_starts, first_comma)
    ends = _integer_column(text, first_comma + 1, second_comma)
    if starts is None or ends is None:
        return None
    return starts, ends


def parse_rows(path: Path, data: bytes) -> tuple[np.ndarray, np.ndarray, list[list[str]]]:
    """Every row of ``data`` with the csv parser: ``(starts, ends, rest)``, ``rest`` holding each row's other
    fields (id, src, loc) as text; what :func:`start_end_columns` does not take (quoted fields, odd numbers)."""
    starts, ends, rest = [], [], []
    try:
        for number, row in enumerate(csv.reader(io.StringIO(data.decode("utf-8")))):
            if not row:
                continue
            if len(row) < 2:
                raise FormatError(f"{path}: row {number + 1} has {len(row)} field(s); expected start,end,id,src,loc.")
            starts.append(int(row[0]))
            ends.append(int(row[1]))
            rest.append(row[2:])
    except csv.Error as error:  # a field past csv's size limit, a stray NUL: not rows dolma writes
        raise FormatError(f"{path}: not CSV rows of start,end,id,src,loc ({error}).") from None
    except (ValueError, UnicodeDecodeError) as error:
        if isinstance(error, FormatError):
            raise
        raise FormatError(f"{path}: the start,end columns must be integers ({error}).") from None
    try:
        return np.array(starts, dtype=np.int64), np.array(ends, dtype=np.int64), rest
    except OverflowError:
        bad = next(v for v in (*starts, *ends) if not -(2**63) <= v < 2**63)
        raise FormatError(f"{path}: a start or end is {bad}; token offsets must fit int64.") from None


class RowStream:
    """The ``start,end`` columns of one ``.csv.gz``, decompressed and parsed as far as they have been asked for,
    each piece checked against ``tokens`` (the tokens of its ``.npy``) before it is used."""

    def __init__(self, path: Path, tokens: int, scan: RowScan | None = None) -> None:
        self.path = path
        self.tokens = tokens
        # a scan made at open: its file is the one read from now on (a change since is refused), its count is len()'s
        self._identity = scan.identity if scan is not None else _identity(path)
        self._pieces: Iterator[bytes] | None = None
        self._tail = b""  # decompressed text after the last whole line
        self._starts: list[np.ndarray] = []
        self._ends: list[np.ndarray] = []
        self._firsts: list[int] = []  # the number of the first row of each parsed piece
        self.count = 0
        self.complete = False
        self._columns: tuple[np.ndarray, np.ndarray] | None = None
        self._error: FormatError | None = None  # what stopped the parse: raised again by every later use
        self._total: int | None = scan.rows if scan is not None else None
        self._scan = scan if scan is not None and scan.rows is not None else None  # a whole pass, not tail_scan's

    def scan(self) -> RowScan:
        """The streamed pass over the rows (decompressed and counted, no field parsed), made once: the last row's
        end and the number of rows, of the file as it was first read."""
        if self._scan is None:
            self._scan = scan_rows(self.path, self._identity)
        return self._scan

    def total(self) -> int:
        """How many rows there are: all decompressed and counted (a row is a line that is not blank, as the
        parser takes them); their fields are parsed, and checked, where they are used."""
        if self._total is None:
            counted = None if self.complete else self.scan().rows
            if counted is None:  # parsed already, or quoted fields (a row may span lines): the parse counts
                self.columns()
                counted = self.count
            self._total = counted
        return self._total

    def ensure(self, rows: int) -> None:
        """Parse until at least ``rows`` rows are known, or all of them."""
        if self.count >= rows or self.complete:
            return
        if self._error is not None:
            raise self._error
        try:
            while self.count < rows and not self.complete:
                self._advance()
        except FormatError as error:  # kept: raised when a row at or past the bad one is asked for
            self._error, self._pieces = error, None
            if self.count < rows:
                raise

    def row(self, index: int) -> tuple[int, int]:
        """The (start, end) of row ``index`` (0-based, blank lines skipped), parsed and checked first."""
        self.ensure(index + 1)
        if index >= self.count:
            raise IndexError(f"{self.path} has {self.count:,} rows; row {index + 1:,} does not exist")
        piece = int(np.searchsorted(self._firsts, index, side="right")) - 1
        local = index - self._firsts[piece]
        return self._starts[piece].item(local), self._ends[piece].item(local)

    def columns(self) -> tuple[np.ndarray, np.ndarray]:
        """Every row's (starts, ends), all parsed and checked (the last ending at the file's last token)."""
        if self._columns is None:
            self.ensure(1 << 62)
            empty = np.zeros(0, dtype=np.int64)
            starts = np.concatenate(self._starts) if self._starts else empty
            ends = np.concatenate(self._ends) if self._ends else empty
            self._columns = (starts, ends)
            self._starts, self._ends, self._firsts = [starts], [ends], [0]
        return self._columns

    def _advance(self) -> None:
        if self._pieces is None:
            self._pieces = _inflated(self.path, self._identity)
        piece = next(self._pieces, None)
        text = self._tail + (piece or b"")
        if piece is not None:
            cut = text.rfind(b"\n") + 1
            text, self._tail = text[:cut], text[cut:]  # a piece of whole lines: a row split by a quoted line
            # break shows as a newline inside quotes, which start_end_columns refuses
        columns = start_end_columns(text) if text else (np.zeros(0, np.int64), np.zeros(0, np.int64))
        if columns is None:
            self._parse_slowly()
            return
        self._accept(*columns)
        if piece is None:
            self._finish()

    def _parse_slowly(self) -> None:
        """Rows the vectorised parser does not take (quoted fields spanning lines, odd numbers), by the csv parser
        over the whole file; the rows parsed so far are parsed again, and checked again."""
        starts, ends, _ = parse_rows(self.path, b"".join(_inflated(self.path, self._identity)))
        self._starts, self._ends, self._firsts, self.count = [], [], [], 0
        self._accept(starts, ends)
        self._finish()

    def _accept(self, starts: np.ndarray, ends: np.ndarray) -> None:
        """Rows ``self.count ...`` checked, then kept: each starts where the previous one ends (the first at 0), no
        end precedes its start or passes the file's tokens. The rows before a bad one are kept (they are readable);
        the bad one raises, now and whenever a later row is asked for."""
        if not len(starts):
            return
        previous = self._ends[-1].item(-1) if self._ends else 0
        expected = np.concatenate([[previous], ends[:-1]])
        problems = [
            (starts != expected, self._tiling),
            (ends < starts, self._backwards),
            (ends > self.tokens, self._past),
        ]
        found = [(int(np.argmax(bad)), describe) for bad, describe in problems if bad.any()]
        first, describe = min(found, key=lambda item: item[0]) if found else (len(starts), None)
        if first:
            self._starts.append(starts[:first])
            self._ends.append(ends[:first])
            self._firsts.append(self.count)
            self.count += first
        if describe is not None:
            what = describe(int(starts[first]), int(ends[first]), int(expected[first]))
            raise FormatError(f"{self.path}: row {self.count + 1}{what}")

    def _tiling(self, start: int, end: int, expected: int) -> str:
        return (
            f" starts at token {start:,}, not where the previous document ends ({expected:,}): the rows must tile "
            "the file."
        )

    def _backwards(self, start: int, end: int, expected: int) -> str:
        return f": end is token {end:,}, before its start {start:,} (expected end >= start)."

    def _past(self, start: int, end: int, expected: int) -> str:
        tokens = self.tokens
        return f": end is token {end:,}, past the {tokens:,} tokens of its .npy (expected at most {tokens:,})."

    def _finish(self) -> None:
        last = self._ends[-1].item(-1) if self._ends else 0
        if last != self.tokens:
            raise FormatError(
                f"{self.path}: the last row (row {self.count:,}) ends at token {last:,}, but its .npy holds "
                f"{self.tokens:,} tokens (expected the rows to end at its last token)."
            )
        self.complete = True
        self._pieces = None


def _filled_lines(text: bytes, stop: int) -> int:
    """The lines of ``text[:stop]`` (which ends with a newline, or is empty) that are not blank (nothing, or
    ``\\r``), found with NumPy a few megabytes at a time (the temporaries stay in cache; ``bytes.find`` of a
    two-byte pattern such as ``\\n\\n`` is several times slower than this over text full of newlines)."""
    data = np.frombuffer(text, dtype=np.uint8, count=stop)
    filled, previous = 0, -1  # previous: the newline before the step's first line
    for first in range(0, stop, _LINES_STEP):
        ends = np.flatnonzero(data[first : first + _LINES_STEP] == ord("\n")) + first
        if not len(ends):
            continue
        starts = np.concatenate([[previous + 1], ends[:-1] + 1])
        blank = (ends == starts) | ((ends == starts + 1) & (data[ends - 1] == ord("\r")))
        filled += len(ends) - int(np.count_nonzero(blank))
        previous = int(ends[-1])
    return filled


class RowScan(NamedTuple):
    """One streamed pass over a rows file (decompressed, no field parsed): the file as it was read, its last row's
    ``end`` and its number of rows; either is None where the rows are not plain lines (a quote anywhere; a last
    row that is not ``start,end,...`` in digits): the whole parse decides those."""

    identity: tuple[int, int, int, int]
    last_end: int | None
    rows: int | None


def scan_rows(path: Path, identity: tuple[int, int, int, int] | None = None) -> RowScan:
    """:class:`RowScan` of ``path`` (as it was when ``identity`` was taken, if given): the last non-blank line kept,
    the rows counted as :func:`start_end_columns` finds them (lines that are not blank)."""
    identity = _identity(path) if identity is None else identity
    rows, tail, last = 0, b"", b""
    for piece in _inflated(path, identity):
        if b'"' in piece:  # a quoted field may span lines: only the parse can say where rows end
            return RowScan(identity, None, None)
        text = tail + piece
        cut = text.rfind(b"\n") + 1
        rows += _filled_lines(text, cut)
        end = cut  # the last non-blank line before the cut, found without copying the piece
        while end and text[end - 1] in b"\r\n":
            end -= 1
        if end:
            last = text[text.rfind(b"\n", 0, end) + 1 : end]
        tail = text[cut:]
    if tail.rstrip(b"\r"):
        rows, last = rows + 1, tail
    line = last.strip(b"\r\n")
    if not line:
        return RowScan(identity, 0, rows)  # no rows
    return RowScan(identity, _row_end(line), rows)


def tail_scan(path: Path) -> RowScan | None:
    """:class:`RowScan` of ``path`` from its last gzip member alone, when that member is one :class:`GzipRows`
    marks as holding the last row, decodes cleanly to the end of the file (its CRC and size checked by zlib) and
    holds exactly one plain row; else None (the streamed pass decides). The rows are not counted here."""
    identity = _identity(path)
    try:
        with open(path, "rb") as handle:
            info = os.fstat(handle.fileno())
            if (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns) != identity:
                raise FormatError(f"{path} changed while it was opened; open the dataset again.")
            begin = max(identity[2] - _TAIL_READ, 0)
            packed = os.pread(handle.fileno(), identity[2] - begin, begin)
    except FileNotFoundError:
        raise FormatError(f"{path} was removed while it was opened; open the dataset again.") from None
    mark = len(packed)
    for _ in range(4):  # the last marked member; a marker's bytes inside compressed data are passed over
        mark = packed.rfind(_TAIL_MARK, 0, mark)
        if mark < len(_TAIL_HEAD) + 1:
            return None
        line = _member_row(packed[mark - len(_TAIL_HEAD) - 1 :])
        if line is not None:
            end = _row_end(line)
            return RowScan(identity, end, None) if end is not None else None
    return None


def _member_row(packed: bytes) -> bytes | None:
    """The one row of the gzip member ``packed`` (which must end exactly where ``packed`` does), or None."""
    if not packed.startswith(_TAIL_HEAD):
        return None
    inflate = zlib.decompressobj(_GZIP)
    try:
        text = inflate.decompress(packed, _TAIL_READ)
    except zlib.error:  # not a member (marker bytes inside compressed data), or a damaged one
        return None
    if not inflate.eof or inflate.unused_data or inflate.unconsumed_tail:
        return None
    if not text.endswith(b"\n") or text.count(b"\n") != 1 or b'"' in text or not text.strip(b"\r\n"):
        return None
    return text.strip(b"\r\n")


def _row_end(line: bytes) -> int | None:
    """The ``end`` of the row ``line`` (no line ending), or None when its second field is not plain digits."""
    fields = line.split(b",")
    if len(fields) < 2 or not fields[1].isdigit() or len(fields[1]) >= _DIGITS:
        return None
    return int(fields[1])


def _digits(values: np.ndarray) -> np.ndarray:
    """Non-negative integers as a matrix of ASCII digits, one row each, right-aligned; the positions before a
    number's first digit hold 0 (no character: dropped when the rows are joined)."""
    top = int(values.max()) if len(values) else 0
    width = len(str(top))
    quotient: np.ndarray = values.astype(np.uint32 if top < 2**32 else np.uint64)
    matrix = np.empty((width, len(values)), dtype=np.uint8)  # digit by digit, each a contiguous row: then .T
    for place in range(width - 1, -1, -1):
        shifted: np.ndarray = quotient // 10
        matrix[place] = quotient - shifted * 10
        quotient = shifted
    matrix += ord("0")
    digits = np.searchsorted(10 ** np.arange(1, width, dtype=np.int64), values, side="right") + 1
    matrix[np.arange(width)[:, None] < (width - digits)] = 0
    return matrix.T


def format_rows(starts: np.ndarray, ends: np.ndarray, first: int, source: bytes) -> bytes:
    """Rows ``start,end,N,source,N`` (``N`` numbering the documents from ``first``) with csv's line ending, for
    every document at once: what ``csv.writer`` writes for them, byte for byte (``source`` already quoted as it
    quotes it)."""
    count = len(ends)
    if count == 0:
        return b""
    if b"\0" in source:  # the formatter's filler cannot mark it: these rows one by one
        pairs = zip(starts.tolist(), ends.tolist(), range(first, first + count))
        return b"".join(b"%d,%d,%d,%s,%d\r\n" % (a, b, n, source, n) for a, b, n in pairs)
    numbers = _digits(np.arange(first, first + count, dtype=np.int64))
    end_digits = _digits(ends)
    if 0 <= starts[0] <= ends.max() and (starts[1:] == ends[:-1]).all():
        start_digits = np.empty_like(end_digits)  # each start is the previous end: its digits, shifted down a row
        start_digits[1:] = end_digits[:-1]
        start_digits[0] = _digits(np.array([starts[0], ends.max()], dtype=np.int64))[0]  # the widths agree
    else:
        start_digits = _digits(starts)
    comma = np.full((count, 1), ord(","), dtype=np.uint8)
    line_end = np.broadcast_to(np.frombuffer(b"\r\n", dtype=np.uint8), (count, 2))
    named = np.broadcast_to(np.frombuffer(source, dtype=np.uint8), (count, len(source)))
    table = np.hstack([start_digits, comma, end_digits, comma, numbers, comma, named, comma, numbers, line_end])
    text: bytes = table[table != 0].tobytes()
    return text


class GzipRows:
    """Rows compressed into ``handle`` as they are written: one gzip member, the header ``gzip.GzipFile`` writes
    with ``mtime=0`` and no file name (the output is byte-for-byte reproducible; with the default ``strategy``, the
    bytes ``GzipFile`` writes at ``level``).

    With ``last_row_apart``, the last row is held back and written as a gzip member of its own, marked in its
    header (an FEXTRA subfield ``TR``), so that a reader finds the last row's end from the file's last bytes
    (:func:`tail_scan`) instead of decompressing every row. Multi-member gzip is standard: ``gzip.open``, zlib and
    OLMo-core's reader (``gzip.open``) read the rows as one text. Rows must be whole lines.

    ``write(rows, background=True)`` formats and compresses a batch's rows on a helper thread while the caller goes
    on (writing the batch's tokens: zlib and file writes release the GIL); the next ``write`` or ``close`` waits for
    it first, so rows stay in order, at most one batch is in flight, and a failure is raised there (and by every
    later ``write`` and ``close``: a file missing a batch's rows is never ended as if whole)."""

    def __init__(
        self, handle: Any, level: int, strategy: int = zlib.Z_DEFAULT_STRATEGY, *, last_row_apart: bool = False
    ) -> None:
        self.handle = handle
        self._level, self._strategy = level, strategy
        self._deflate = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS, zlib.DEF_MEM_LEVEL, strategy)
        self._crc = 0
        self._size = 0
        self._pending: threading.Thread | None = None
        self._failure: BaseException | None = None
        self._held: bytes | None = b"" if last_row_apart else None  # the last row so far, not yet compressed
        handle.write(b"\x1f\x8b\x08\x00\x00\x00\x00\x00" + self._level_byte() + b"\xff")

    def _level_byte(self) -> bytes:
        return b"\x02" if self._level == 9 else b"\x04" if self._level == 1 else b"\x00"  # what GzipFile records

    def write(self, rows: bytes | Callable[[], bytes], *, background: bool = False) -> None:
        """Compress ``rows`` (or what ``rows()`` makes) into the file; on a helper thread when ``background``."""
        self._wait()
        if background:
            self._pending = threading.Thread(target=self._compress_caught, args=(rows,), daemon=True)
            self._pending.start()
        else:
            self._compress(rows)

    def close(self) -> None:
        """End the member: the rest of the compressed stream, its CRC and its size."""
        self._wait()
        self.handle.write(self._deflate.flush() + struct.pack("<II", self._crc, self._size & 0xFFFFFFFF))
        if self._held:  # the last row: a member of its own, marked as such
            deflate = zlib.compressobj(self._level, zlib.DEFLATED, -zlib.MAX_WBITS, zlib.DEF_MEM_LEVEL, self._strategy)
            packed = deflate.compress(self._held) + deflate.flush()
            trailer = struct.pack("<II", zlib.crc32(self._held), len(self._held) & 0xFFFFFFFF)
            self.handle.write(_TAIL_HEAD + self._level_byte() + _TAIL_MARK + packed + trailer)

    def abandon(self) -> None:
        """Let a batch in flight finish, and drop what it raised (the file is being discarded)."""
        if self._pending is not None:
            self._pending.join()
        self._pending, self._failure = None, None

    def _compress(self, rows: bytes | Callable[[], bytes]) -> None:
        text = rows() if callable(rows) else rows
        if self._held is None or not text:
            self._deflate_text(text)
            return
        cut = text.rfind(b"\n", 0, len(text) - 1) + 1  # where the batch's last row starts
        self._deflate_text(self._held)
        self._deflate_text(memoryview(text)[:cut])  # no copy of the batch's rows
        self._held = text[cut:]

    def _deflate_text(self, text: bytes | memoryview) -> None:
        if not len(text):
            return
        self._crc = zlib.crc32(text, self._crc)
        self._size += len(text)
        self.handle.write(self._deflate.compress(text))

    def _compress_caught(self, rows: bytes | Callable[[], bytes]) -> None:
        try:
            self._compress(rows)
        except BaseException as error:  # raised in the caller's thread by the next write or close
            self._failure = error

    def _wait(self) -> None:
        if self._pending is not None:
            self._pending.join()
            self._pending = None
        if self._failure is not None:  # kept: a later write or close raises it again, so rows never go missing
            raise self._failure
