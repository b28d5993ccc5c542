"""Text sources for tokenization: files (``.txt``, ``.json``, ``.jsonl``, ``.parquet``, each optionally ``.gz``
or ``.zst``), globs, folders, or any Python iterable of strings (one string is a path: :func:`resolve_inputs`).

A source yields *records* in a fixed order; each record has a position ``(input, index)`` that never depends
on batching, so that a run can be resumed from a checkpoint and documents can be assigned to splits
reproducibly. A record holds one text per requested key (one text for ``.txt`` and iterables), or, read
``whole`` (chat data), the parsed record itself (a JSON object, a Parquet row, an iterable's item).
"""

from __future__ import annotations

import gzip
import io
import json
import os
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ..errors import ConfigError, FormatError, NoFilesError, option
from ..fs.paths import is_pattern, pattern_matches

__all__ = [
    "Record",
    "Input",
    "resolve_inputs",
    "iter_records",
    "read_by_line",
    "opens_json_array",
    "SourceError",
    "TEXT_SUFFIXES",
    "UNITS",
    "check_unit",
]

#: Suffixes tokformats reads text from (before an optional .gz/.zst).
TEXT_SUFFIXES = (".txt", ".text", ".md", ".rst", ".json", ".jsonl", ".ndjson", ".parquet", ".py")
UNITS = ("line", "file", "paragraph")
_BOM = b"\xef\xbb\xbf"  # UTF-8's byte order mark


class SourceError(FormatError):
    """A record cannot be read (invalid JSON, missing key, non-UTF-8 bytes); names the file and line."""


@dataclass(frozen=True)
class Input:
    """One input: a file path, or an in-memory iterable (``path`` is None).

    A *piece* of a file (a partition of one large input) has ``start``/``stop``: byte offsets at line starts for
    JSON Lines and text, row-group numbers for Parquet; ``first_record`` is how many records the file has before
    the piece, so that its records keep their positions in the whole file (``stop`` None: to the end).
    """

    path: Path | None
    iterable: Any = None
    start: int = 0
    stop: int | None = None
    first_record: int = 0

    @property
    def name(self) -> str:
        return str(self.path) if self.path is not None else "<iterable>"

    @property
    def size(self) -> int | None:
        """Bytes to read (of the piece when a byte range; the whole file's for Parquet row groups)."""
        if self.path is None:
            return None
        if self.stop is not None and _base_suffix(self.path) != ".parquet":
            return self.stop - self.start
        return self.path.stat().st_size

    @property
    def is_piece(self) -> bool:
        """Whether this is part of a file rather than all of it."""
        return self.start > 0 or self.stop is not None


@dataclass
class Record:
    """One record: its position and its texts (one per key). ``texts`` is None for a skipped bad record; a record
    read whole has no texts (``()``) and its parsed ``value``."""

    input: int
    index: int
    texts: tuple[str, ...] | None
    error: str | None = None
    value: Any = None
    #: Byte offset of the record's first byte in the (decompressed) input; -1 where bytes have no meaning (Parquet
    #: rows, JSON arrays, in-memory texts). What ``tokenize``'s provenance sidecar records.
    offset: int = -1


def _base_suffix(path: Path) -> str:
    name = path.name.lower()
    for compression in (".gz", ".zst"):
        if name.endswith(compression):
            name = name[: -len(compression)]
    return Path(name).suffix


def read_by_line(source: Input) -> bool:
    """Whether ``source``'s first records are read without reading the whole of it: a file of JSON Lines or text
    (compressed or not), not an iterable (which may be read once only), a Parquet row group or a ``.json`` that
    may be one array."""
    return source.path is not None and _base_suffix(source.path) not in (".json", ".parquet")


def _exists(text: str) -> bool:
    if not text.strip():  # Path("") is the current folder; an empty text is a document
        return False
    try:
        return Path(text).exists() or (is_pattern(text) and bool(pattern_matches(text, recursive=True)))
    except OSError:  # a "name" too long for the file system is text
        return False


def _looks_like_path(text: str) -> bool:
    return (
        len(text) < 4096
        and not any(c.isspace() for c in text)
        and ("/" in text or os.sep in text or _base_suffix(Path(text)) in TEXT_SUFFIXES)
    )


#: What a missing path given as one string adds: the one-string rule, and how texts are passed instead.
_ONE_STRING = " (one string is a path or glob; in-memory texts are a list or an iterable of strings)"


def resolve_inputs(inputs: Any) -> list[Input]:
    """Expand paths, globs and folders (recursively, sorted) into inputs, or take an iterable of texts as one input.

    One ``str`` or ``Path`` is always a path, a glob or a folder; so are ``Path`` objects in a list. A list (or
    tuple) of strings is paths when every one names something that exists (or is a glob that matches), texts when
    none does and they do not all look like paths (no whitespace, a ``/`` or a text suffix); a mix is refused
    (a typo would otherwise tokenize a file name as text). Any other iterable (a generator, a ``datasets`` column)
    is an iterable of texts. A missing path raises :class:`~tokformats.NoFilesError` naming it.
    """
    if isinstance(inputs, (str, os.PathLike)):
        return _resolve_paths([inputs], _ONE_STRING if isinstance(inputs, str) else "")
    if not isinstance(inputs, (list, tuple)):
        return [Input(None, inputs)]
    items = list(inputs)
    if not items:
        raise NoFilesError("no input was given.")
    if not all(isinstance(i, (str, os.PathLike)) for i in items):
        return [Input(None, items)]
    if _are_texts(items):
        return [Input(None, items)]
    return _resolve_paths(items)


def _are_texts(items: list[str | os.PathLike[str]]) -> bool:
    """Whether a list of strings is in-memory texts: no ``Path`` among them, none names a file, and not every one
    looks like a path (then they are missing paths, refused by the caller)."""
    if any(isinstance(i, os.PathLike) for i in items):
        return False
    texts = [str(i) for i in items]
    return not any(_exists(t) for t in texts) and not all(_looks_like_path(t) for t in texts)


def _resolve_paths(items: list[str | os.PathLike[str]], hint: str = "") -> list[Input]:
    """The files every path, glob or folder names, in order; a missing one raises, its message ending in ``hint``."""
    resolved: list[Input] = []
    for item in items:
        resolved.extend(_files_named(os.fspath(item), hint))
    return resolved


def _files_named(text: str, hint: str) -> list[Input]:
    if not text:  # Path("") is the current folder: an empty name must not read the files around it
        raise NoFilesError(f"an empty path names no file{hint}.")
    path = Path(text)
    try:
        is_dir, is_file = path.is_dir(), path.is_file()
    except OSError as exc:  # a name too long for the file system (a document passed as one string, say)
        shown = text if len(text) <= 80 else f"{text[:80]}..."  # not the OSError's copy of the whole text
        raise NoFilesError(f"{shown!r} is not a file name this system accepts ({exc.strerror}){hint}.") from None
    if is_dir:
        files = sorted(p for p in path.rglob("*") if p.is_file() and _base_suffix(p) in TEXT_SUFFIXES)
        if not files:
            raise NoFilesError(f"the folder {path} holds no text files ({', '.join(TEXT_SUFFIXES)}).")
        return [Input(p) for p in files]
    if is_file:
        return [Input(path)]
    if is_pattern(text):
        matches = pattern_matches(text, recursive=True)
        if not matches:
            raise NoFilesError(f"the pattern {text!r} matches no file{hint}.")
        return [Input(m) for m in matches if m.is_file()]
    raise NoFilesError(f"{path} does not exist{hint}.")


class _Counting(io.RawIOBase):
    """A raw file wrapper counting bytes read from disk (compressed bytes, for progress); reads at most ``limit``
    bytes when given (a piece's byte range)."""

    def __init__(self, raw: IO[bytes], limit: int | None = None) -> None:
        self.raw, self.count, self.limit = raw, 0, limit

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self.limit is not None:
            buffer = memoryview(buffer)[: max(self.limit - self.count, 0)]
            if not len(buffer):
                return 0
        n = self.raw.readinto(buffer)  # type: ignore[attr-defined]
        self.count += n or 0
        return n or 0

    def close(self) -> None:
        self.raw.close()
        super().close()


def _open_binary(path: Path, counter: list[_Counting], start: int = 0, stop: int | None = None) -> IO[bytes]:
    handle = open(path, "rb", buffering=0)  # noqa: SIM115 - closed with the returned stream
    if start:
        handle.seek(start)
    raw = _Counting(handle, None if stop is None else stop - start)
    counter.append(raw)
    name = path.name.lower()
    if name.endswith(".gz"):
        return gzip.GzipFile(fileobj=io.BufferedReader(raw, 1 << 20), mode="rb")  # type: ignore[return-value]
    if name.endswith(".zst"):
        try:
            import zstandard
        except ImportError:
            raise FormatError(f"{path}: reading .zst needs the zstandard package (pip install zstandard).") from None
        reader = zstandard.ZstdDecompressor().stream_reader(io.BufferedReader(raw, 1 << 20))
        return io.BufferedReader(reader, 1 << 20)  # for peek() and fast line iteration
    return io.BufferedReader(raw, 1 << 20)


def _decode(path: Path, number: int, line: bytes) -> str:
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SourceError(f"{path}, line {number}: not UTF-8 ({exc.reason} at byte {exc.start}).") from None


_orjson: Any
try:  # an optional faster parser (pip install tokformats[fast]); json stays the judge of what it refuses
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None


def _parse_line(path: Path, number: int, line: bytes) -> Any:
    """One JSONL record. orjson parses it when installed; anything orjson refuses (invalid UTF-8, NaN, lone
    surrogates, integers past 64 bits) goes to ``json``, which accepts or words the error exactly as before."""
    if _orjson is not None:
        try:
            return _orjson.loads(line)
        except _orjson.JSONDecodeError:
            pass
    return json.loads(_decode(path, number, line))


def _json_record(input_index: int, path: Path, number: int, value: Any, keys: tuple[str, ...] | None) -> Record:
    """A parsed JSON record: whole (``keys`` None) or its texts; a bad one carries its error."""
    if keys is None:
        return Record(input_index, number, (), value=value)
    try:
        return Record(input_index, number, _json_texts(path, number, value, keys))
    except SourceError as exc:
        return Record(input_index, number, None, str(exc))


def _json_texts(path: Path, number: int, value: Any, keys: tuple[str, ...]) -> tuple[str, ...]:
    if not isinstance(value, dict):
        raise SourceError(
            f"{path}, line {number}: expected a JSON object with {list(keys)}, found {type(value).__name__}."
        )
    texts = []
    for key in keys:
        if key not in value:
            raise SourceError(f"{path}, line {number}: the record has no key {key!r} (keys: {sorted(value)[:8]}).")
        text = value[key]
        if not isinstance(text, str):
            raise SourceError(f"{path}, line {number}: {key!r} is a {type(text).__name__}, not a string.")
        texts.append(text)
    return tuple(texts)


def opens_json_array(head: bytes) -> bool:
    """Whether a ``.json`` file whose first bytes are ``head`` is one JSON array (not one object per line), a
    byte order mark before it or not."""
    return head.removeprefix(_BOM).lstrip()[:1] == b"["


def _skip_bom(stream: IO[bytes]) -> int:
    """Skip a UTF-8 byte order mark opening a file, as Python's ``utf-8-sig`` does (some editors write one): it is
    not text, and a JSON parser refuses it. Returns the bytes skipped, so that offsets stay the file's."""
    if stream.peek(len(_BOM))[: len(_BOM)] != _BOM:  # type: ignore[attr-defined]
        return 0
    stream.read(len(_BOM))
    return len(_BOM)


def _invalid_json(path: Path, number: int, exc: json.JSONDecodeError) -> str:
    """Where a line's JSON breaks: json's message ("Invalid control character at") and the column it gives."""
    return f"{path}, line {number}: invalid JSON ({exc.msg.removesuffix(' at')} at column {exc.colno})."


def _file_records(
    input_index: int, source: Input, keys: tuple[str, ...] | None, unit: str, skip: int, counter: list[_Counting]
) -> Iterator[Record]:
    path = source.path
    if path is None:  # the caller routes iterables elsewhere
        raise ValueError("an iterable input has no file records")
    suffix = _base_suffix(path)
    if suffix == ".parquet":
        yield from _parquet_records(input_index, source, keys, skip)
        return
    with _open_binary(path, counter, source.start, source.stop) as stream:
        # a piece of a file starts at its byte offset (only uncompressed files are cut), never at a BOM
        start = source.start or _skip_bom(stream)
        # .json is either one JSON array or, as Megatron's preprocess_data reads it, one object per line (only
        # the latter is ever cut into pieces).
        array = suffix == ".json" and not source.is_piece and opens_json_array(stream.peek(256))  # type: ignore[attr-defined]
        if suffix in (".jsonl", ".ndjson", ".json") and not array:
            offset = start
            for number, line in enumerate(stream, start=source.first_record + 1):
                at, offset = offset, offset + len(line)
                if number <= skip:
                    continue
                if line.isspace():  # not line.strip(): that copies every line (a line read is never empty)
                    yield Record(input_index, number, None, None)  # blank line: nothing, but keeps positions
                    continue
                try:
                    value = _parse_line(path, number, line)
                except json.JSONDecodeError as exc:
                    yield Record(input_index, number, None, _invalid_json(path, number, exc))
                    continue
                except SourceError as exc:
                    yield Record(input_index, number, None, str(exc))
                    continue
                record = _json_record(input_index, path, number, value, keys)
                record.offset = at
                yield record
            return
        if array:
            try:
                items = json.load(stream)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise SourceError(f"{path}: not a valid JSON array ({exc}).") from None
            for number, value in enumerate(items, start=1):
                if number > skip:
                    record = _json_record(input_index, path, number, value, keys)
                    if record.error is not None:
                        record.error = record.error.replace("line", "item")
                    yield record
            return
        if keys is None:
            kind = suffix or "text"
            raise SourceError(f"{path}: chat data is read from JSON Lines, JSON or Parquet files, not {kind}.")
        if unit == "file":
            yield from _whole_file_record(input_index, path, stream, skip, start)
        elif unit == "line":
            yield from _line_records(input_index, path, stream, skip, source.first_record, start)
        else:
            yield from _paragraph_records(input_index, path, stream, skip, start)


def _whole_file_record(input_index: int, path: Path, stream: IO[bytes], skip: int, offset: int) -> Iterator[Record]:
    if skip >= 1:
        return
    data = stream.read()
    try:
        yield Record(input_index, 1, (data.decode("utf-8"),), offset=offset)
    except UnicodeDecodeError as exc:
        bad_line = data[: exc.start].count(b"\n") + 1
        yield Record(input_index, 1, None, f"{path}, line {bad_line}: not UTF-8 ({exc.reason}).")


def _line_records(
    input_index: int, path: Path, stream: IO[bytes], skip: int, first_record: int, offset: int
) -> Iterator[Record]:
    for number, line in enumerate(stream, start=first_record + 1):
        at, offset = offset, offset + len(line)
        if number <= skip:
            continue
        try:
            text = _decode(path, number, line).rstrip("\r\n")
        except SourceError as exc:
            yield Record(input_index, number, None, str(exc))
            continue
        yield Record(input_index, number, (text,) if text else None, offset=at)


def _paragraph_records(input_index: int, path: Path, stream: IO[bytes], skip: int, offset: int) -> Iterator[Record]:
    """Blank-line separated paragraphs, each the file's text between blank lines (its line endings kept, as
    ``unit="file"`` keeps them, but not its last one); a record's index is the line number of its first line."""
    lines: list[str] = []
    first = first_offset = 0
    for number, line in enumerate(stream, start=1):
        at, offset = offset, offset + len(line)
        try:
            text = _decode(path, number, line)
        except SourceError as exc:
            if first > skip or (not lines and number > skip):
                yield Record(input_index, number, None, str(exc))
            lines, first = [], 0
            continue
        if text.strip():
            if not lines:
                first, first_offset = number, at
            lines.append(text)
        elif lines:
            if first > skip:
                yield Record(input_index, first, ("".join(lines).rstrip("\r\n"),), offset=first_offset)
            lines, first = [], 0
    if lines and first > skip:
        yield Record(input_index, first, ("".join(lines).rstrip("\r\n"),), offset=first_offset)


def _parquet_records(
    input_index: int, source: Input, keys: tuple[str, ...] | None, skip: int
) -> Iterator[Record]:
    path = source.path
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise FormatError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow).") from None
    table = pq.ParquetFile(path)
    if keys is None:  # whole rows, as dicts (a chat column of structs reads as lists of dicts)
        row = 0
        for batch in table.iter_batches(batch_size=8192):
            for value in batch.to_pylist():
                row += 1
                if row > skip:
                    yield Record(input_index, row, (), value=value)
        return
    missing = [k for k in keys if k not in table.schema_arrow.names]
    if missing:
        raise SourceError(
            f"{path}: the Parquet file has no column {missing[0]!r} (columns: {table.schema_arrow.names})."
        )
    row = source.first_record
    groups = range(source.start, table.num_row_groups if source.stop is None else source.stop)
    for batch in table.iter_batches(columns=list(keys), batch_size=8192, row_groups=groups):
        columns = [batch.column(k).to_pylist() for k in keys]
        for values in zip(*columns):
            row += 1
            if row <= skip:
                continue
            if any(not isinstance(v, str) for v in values):
                yield Record(input_index, row, None, f"{path}, row {row}: a text column holds a non-string value.")
            else:
                yield Record(input_index, row, tuple(values))


def _iterable_records(input_index: int, iterable: Iterable[Any], skip: int, whole: bool = False) -> Iterator[Record]:
    for number, text in enumerate(iterable, start=1):
        if number <= skip:
            continue
        if whole:
            yield Record(input_index, number, (), value=text)
        elif not isinstance(text, str):
            yield Record(
                input_index, number, None, f"item {number} of the iterable is a {type(text).__name__}, not a string."
            )
        else:
            yield Record(input_index, number, (text,))


def check_unit(unit: Any) -> None:
    """Refuse a ``unit=`` that is not one of :data:`UNITS` (a ``ConfigError`` naming them)."""
    if unit not in UNITS:
        raise ConfigError(f"unit must be one of {', '.join(UNITS)}; found {option('unit', repr(unit))}.")


def iter_records(
    inputs: list[Input],
    keys: tuple[str, ...] | None = ("text",),
    unit: str = "line",
    start: tuple[int, int] = (0, 0),
    counter: list[Any] | None = None,
) -> Generator[Record, None, None]:
    """Every record of every input in order, from position ``start`` = (input, records to skip in it).

    Bad records come back with ``texts=None`` and an ``error`` message; blank lines with neither.
    ``keys=None`` reads each record whole (its ``value``: chat data). ``counter`` collects objects whose ``count``
    is the bytes read from disk so far (for progress).
    """
    check_unit(unit)  # checked by the call, not by the first record: before a run has begun its work
    return _records(inputs, keys, unit, start, counter if counter is not None else [])


def _records(
    inputs: list[Input], keys: tuple[str, ...] | None, unit: str, start: tuple[int, int], counters: list[Any]
) -> Generator[Record, None, None]:
    first_input, skip = start
    for index in range(first_input, len(inputs)):
        source = inputs[index]
        already = skip if index == first_input else 0
        if source.path is None:
            yield from _iterable_records(index, source.iterable, already, whole=keys is None)
        else:
            yield from _file_records(index, source, keys, unit, already, counters)
