"""OLMo / dolma token memmaps: ``NAME.npy`` (headerless, *not* NumPy's format) + ``NAME.csv.gz``.

Layout (dolma's ``tokenizer/memmap_writer.py``; read by OLMo-core's ``NumpyFSLDataset`` and
``iter_document_indices``)::

    NAME.npy     the tokens, little-endian, no header: uint16 by default, uint32 for larger vocabularies
    NAME.csv.gz  one row per document, no header: start,end,id,src,loc (token offsets, end exclusive; the source
                 document's id, its source file and line)

Neither file records the dtype (dolma issues #142 and #152 are users reading with the wrong one). The reader takes
it from the metadata: the last row's end times the itemsize is the file size, and only one itemsize fits. Without
the ``.csv.gz`` the dtype must be given and documents are found at ``eos=`` (as OLMo-core does from the array).
A folder reads as every ``*.npy`` below it that has its ``.csv.gz``, sorted by path. dolma's writer starts a new file
before a document would bring it to ``max_tokens`` (default 512 Mi tokens); so does this one.
"""

from __future__ import annotations

import csv
import gzip
import io
import os
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.documents import add_delimiter, split_offsets
from ..core.dtypes import check_id, parse_dtype, resolve_dtype
from ..core.protocol import PathLike, TokenWriter
from ..core.registry import FormatDescriptor, Probe
from ..errors import DTypeError, FormatError, NoFilesError, SizeMismatchError, option
from ..fs.paths import expand_paths
from ..fs.untrusted import MAX_DEFLATE_RATIO, require_regular
from ._parts import Part, PartsReader, checked_offsets
from ._shards import DocumentShards

if TYPE_CHECKING:
    import numpy.typing as npt

    from ..remote.lazy import RemoteFiles

__all__ = ["Reader", "Writer", "detect", "read_metadata", "DEFAULT_MAX_TOKENS"]

#: This format's entry in :data:`tokformats.formats` (the registry finds it here).
DESCRIPTOR = FormatDescriptor(
    "dolma", "OLMo / dolma token memmaps: headerless NAME.npy + NAME.csv.gz", (".npy",), __name__, order=90
)

#: dolma's ``MemmapWriter.DEFAULT_MAX_TOKENS``.
DEFAULT_MAX_TOKENS = 512 * 1024 * 1024
METADATA_SUFFIX = ".csv.gz"
#: The gzip level of the rows the writer compresses (any level reads the same).
ROWS_COMPRESSION = 1
_ITEMSIZES: dict[int, np.dtype] = {1: np.dtype("u1"), 2: np.dtype("<u2"), 4: np.dtype("<u4"), 8: np.dtype("<u8")}
_NUMPY_MAGIC = b"\x93NUMPY"


def metadata_path(path: Path) -> Path:
    """``NAME.csv.gz`` beside ``NAME.npy``."""
    return path.with_name(path.name[: -len(".npy")] + METADATA_SUFFIX if path.name.endswith(".npy") else path.name)


def _rows_text(path: Path) -> bytes:
    """The decompressed ``.csv.gz``, bounded by the file's size (a zip bomb is refused)."""
    size = require_regular(path)
    budget = max(size * MAX_DEFLATE_RATIO, 1 << 20)
    try:
        with gzip.open(path, "rb") as handle:
            data = handle.read(budget + 1)
    except (OSError, EOFError, zlib.error) as error:
        raise FormatError(f"{path}: not a readable gzip file ({error}).") from None
    if len(data) > budget:
        raise FormatError(f"{path}: decompresses to more than {budget:,} bytes; refusing it as corrupt.")
    return data


_DIGITS = 19  # an int64 holds every number of up to 18 digits; longer ones go to the csv parser
_ROWS_PER_STEP = 1 << 18
_POWERS_OF_TEN = 10 ** np.arange(_DIGITS, dtype=np.int64)


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


def _start_end_columns(data: bytes) -> tuple[np.ndarray, np.ndarray] | None:
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


def read_start_end(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """The ``start`` and ``end`` columns of a ``.csv.gz`` (what a reader needs), parsed vectorised; rows the fast
    parser does not take are read by :func:`read_metadata`, with its checks and messages."""
    data = _rows_text(path)
    columns = _start_end_columns(data)
    if columns is not None:
        return columns
    starts, ends, _ = _parse_rows(path, data)
    return starts, ends


def read_metadata(path: Path) -> tuple[np.ndarray, np.ndarray, list[list[str]]]:
    """The rows of a ``.csv.gz``: ``(starts, ends, rest)`` where ``rest`` holds each row's other fields
    (id, src, loc) as text. Decompression is bounded by the file's size (a zip bomb is refused)."""
    return _parse_rows(path, _rows_text(path))


def _parse_rows(path: Path, data: bytes) -> tuple[np.ndarray, np.ndarray, list[list[str]]]:
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
    except (ValueError, UnicodeDecodeError) as error:
        if isinstance(error, FormatError):
            raise
        raise FormatError(f"{path}: the start,end columns must be integers ({error}).") from None
    return np.array(starts, dtype=np.int64), np.array(ends, dtype=np.int64), rest


def _is_memmap(path: Path | Probe) -> bool:
    probe = path if isinstance(path, Probe) else Probe(path)
    if not probe.path.name.endswith(".npy") or not probe.is_file:
        return False
    if probe.head(len(_NUMPY_MAGIC)) == _NUMPY_MAGIC:
        return False  # NumPy's own .npy (the "sequences" format)
    return probe.sibling(metadata_path(probe.path)).head(2) == b"\x1f\x8b"


def _folder_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.npy") if not p.name.startswith(".") and _is_memmap(p))


def _remote_files(remote: RemoteFiles, folder: Path) -> list[Path]:
    """The memmaps of a folder opened by URL: every ``.npy`` below ``folder`` published with its ``.csv.gz``."""
    return [p for p in remote.paths(".npy", folder) if remote.has(metadata_path(p))]


def detect(probe: Probe) -> bool:
    """True for a headerless ``.npy`` with a gzip ``.csv.gz`` beside it, or a folder of them."""
    if probe.is_dir:
        direct = [n for n in probe.entries if n.endswith(".npy")]
        if direct:
            return any(_is_memmap(probe.child(n)) for n in direct[:4])
        return bool(_folder_files(probe.path)[:1])
    return _is_memmap(probe)


#: Uploaded last by ``publish``: the rows readers take the dtype and documents from.
PUBLISHED_LAST = ("*.csv.gz",)


def remote_companions(name: str) -> list[tuple[str, bool]]:
    """A memmap's ``.csv.gz`` rows (when there are any)."""
    return [(name[: -len(".npy")] + METADATA_SUFFIX, False)] if name.endswith(".npy") else []


def remote_lazy(folder: Path, names: list[str]) -> bool:
    """Whether a folder opened by URL can fetch its ``.npy`` files on first use: each has its ``.csv.gz`` rows
    (fetched at open), which give its documents."""
    data = [n for n in names if n.endswith(".npy")]
    return bool(data) and all(n[: -len(".npy")] + METADATA_SUFFIX in names for n in data)


class Reader(PartsReader):
    """dolma memmaps: a ``.npy`` (with its ``.csv.gz``), several (a glob or list), or a folder, as one corpus.

    Args:
        path: a ``.npy`` file, a glob, a list, or a folder (every ``.npy`` below it with its ``.csv.gz``).
        dtype: the token dtype; inferred from the ``.csv.gz`` when omitted (required without one).
        eos: without a ``.csv.gz``, end documents after each occurrence of this id (OLMo-core's fallback).
        remote: set by ``tokformats.open(URL)``: the dataset's files, each ``.npy`` fetched on first use.

    ``document_metadata(i)`` gives the ``id``, ``src`` and ``loc`` dolma recorded for document ``i``.
    """

    format = "dolma"

    def __init__(
        self,
        path: PathLike | list[PathLike],
        *,
        dtype: npt.DTypeLike | None = None,
        eos: int | None = None,
        remote: RemoteFiles | None = None,
    ) -> None:
        super().__init__(path, dtype=dtype, eos=eos, remote=remote)
        self._remote = remote
        if isinstance(path, (str, os.PathLike)) and Path(path).is_dir():
            files = _remote_files(remote, Path(path)) if remote is not None else _folder_files(Path(path))
            if not files:
                raise NoFilesError(f"{path} holds no dolma .npy files with their {METADATA_SUFFIX}.")
        else:
            files = expand_paths(path)
        self.eos = eos
        #: Each part's (starts, ends) rows; their other fields are read when first used (:meth:`document_metadata`).
        self._rows: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._fields: dict[int, list[list[str]]] = {}
        self._set_parts([self._part(k, file, dtype) for k, file in enumerate(files)])
        self.shards  # noqa: B018 - map now: what was validated is what is read

    def _part(self, k: int, file: Path, dtype: npt.DTypeLike | None) -> Part:
        metadata = metadata_path(file)
        if metadata.is_file():
            self._rows[k] = read_start_end(metadata)
        size = self._data_size(k, file, dtype)
        inferred = None
        if k in self._rows:
            ends = self._rows[k][1]
            last = int(ends[-1]) if len(ends) else 0
            fits = [d for s, d in _ITEMSIZES.items() if last * s == size]
            if last and not fits:
                raise SizeMismatchError(
                    f"{file}: {metadata.name} ends at token {last:,}, but {size:,} bytes is not that many uint8, "
                    "uint16, uint32 or uint64 tokens: one of the two files is truncated or from another output."
                )
            inferred = fits[0] if last else None
        if dtype is not None:
            chosen = parse_dtype(dtype)
            if inferred is not None and inferred != chosen:
                raise DTypeError(
                    f"{file}: dtype {chosen.name} was given, but {metadata.name} and the file size say {inferred.name}."
                )
        elif inferred is not None:
            chosen = inferred
        elif size == 0:
            chosen = _ITEMSIZES[2]
        else:
            raise DTypeError(
                f"{file}: the file records no dtype and has no {METADATA_SUFFIX} to infer it from; pass "
                f"{option('dtype', repr('uint16'))} or {option('dtype', repr('uint32'))} (and {option('eos', 'ID')})."
            )
        if size % chosen.itemsize:
            raise SizeMismatchError(f"{file}: {size:,} bytes is not a whole number of {chosen.name} tokens.")
        return Part(file, 0, size // chosen.itemsize, chosen)

    def _data_size(self, k: int, file: Path, dtype: npt.DTypeLike | None) -> int:
        """The size of ``file``; for a dataset opened by URL, from its records, else its rows and ``dtype`` (the
        download is checked against it), else the store's."""
        if self._remote is None:
            size = require_regular(file) if file.exists() else None
            if size is None:
                raise NoFilesError(f"{file} does not exist.")
            return size
        if not self._remote.has(file):
            raise NoFilesError(f"{file} is not a file of {self._remote.url}.")
        rows = self._rows.get(k)
        implied = None
        if rows is not None and dtype is not None:
            implied = (int(rows[1][-1]) if len(rows[1]) else 0) * parse_dtype(dtype).itemsize
        return self._remote.size(file, implied)

    def _part_offsets(self, index: int) -> np.ndarray:
        part = self._parts[index]
        if index not in self._rows:
            return split_offsets(self.shards[index], eos=self.eos)
        starts, ends = self._rows[index]
        where = str(metadata_path(part.path))
        if len(starts) and (starts[0] != 0 or (starts[1:] != ends[:-1]).any()):
            bad = 0 if starts[0] != 0 else int(np.argmax(starts[1:] != ends[:-1])) + 1
            raise FormatError(
                f"{where}: row {bad + 1} starts at token {int(starts[bad]):,}, not where the previous document ends "
                "(the rows must tile the file)."
            )
        return checked_offsets(np.concatenate([[0], ends]), part.tokens, where, "end")

    def document_metadata(self, index: int) -> dict[str, str | None]:
        """The ``id``, ``src`` and ``loc`` fields dolma recorded for document ``index`` (None without metadata)."""
        position = int(index) + len(self) if int(index) < 0 else int(index)
        for k in range(len(self._parts)):
            rows = self._rows.get(k)
            count = len(rows[1]) if rows is not None else len(self._part_offsets(k)) - 1
            if position < count:
                if rows is not None and k not in self._fields:
                    self._fields[k] = read_metadata(metadata_path(self._parts[k].path))[2]
                fields = self._fields[k][position] if rows is not None else []
                padded = [*fields, None, None, None][:3]
                return {"id": padded[0], "src": padded[1], "loc": padded[2]}
            position -= count
        raise IndexError(f"document {index} is out of range for {len(self):,} documents in {self.path}")

    @property
    def metadata(self) -> dict[str, Any]:
        return {
            "eos": self.eos,
            "files": [
                {"path": str(p.path), "tokens": p.tokens, "metadata": k in self._rows}
                for k, p in enumerate(self._parts)
            ],
        }


class Writer(TokenWriter):
    """Writes dolma memmaps into a folder: ``part-0-00000.npy`` + ``part-0-00000.csv.gz``, then ``-00001``, ...

    Args:
        path: the output folder.
        vocab_size: uint16 up to 65,536 ids, else uint32.
        dtype: the token dtype instead (uint8, uint16, uint32 or uint64).
        max_tokens: a new file starts before a document would bring one to this many tokens (dolma's rule).
        source: the ``src`` field of every row (dolma records the source file); ``id`` and ``loc`` are the
            document's number unless :meth:`write` is given them.
        eos: appended after every document when given.
        overwrite: replace the folder's existing memmaps.

    The ``.csv.gz`` is written with a zero gzip timestamp, so the output is byte-for-byte reproducible.
    """

    format = "dolma"
    #: Fields :meth:`write` was given for the document being written (None: the defaults).
    _fields: tuple[Any, Any, Any] = (None, None, None)

    @classmethod
    def existing_outputs(cls, path: PathLike) -> list[Path]:
        folder = Path(path)
        return sorted(folder.glob("part-*.npy")) + sorted(folder.glob("part-*.csv.gz")) if folder.is_dir() else []

    def __init__(
        self,
        path: PathLike,
        *,
        vocab_size: int | None = None,
        dtype: npt.DTypeLike | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        source: str = "",
        eos: int | None = None,
        overwrite: bool = False,
    ) -> None:
        chosen = resolve_dtype(dtype, vocab_size, format=self.format, allowed=tuple(_ITEMSIZES.values()))
        super().__init__(path, dtype=chosen, vocab_size=vocab_size, overwrite=overwrite)
        self.source = source
        quoted = io.StringIO()
        csv.writer(quoted).writerow([source])
        #: ``source`` as csv writes it in a row (quoted when it holds a comma, a quote or a line break).
        self._quoted_source = quoted.getvalue()[: -len("\r\n")] if source else ""  # a lone "" row reads '""'
        self.eos = check_id(eos, chosen, vocab_size, "eos")
        existing = self.existing_outputs(self.path)
        if existing and not overwrite:
            self._files.check_destination(existing[0])
        if overwrite:
            folder = self.path
            self._files.remove_on_commit(lambda: self.existing_outputs(folder))
        self._shards = DocumentShards(max_tokens, self._start, self._end, strict=True)
        self._rows: Any = None
        self._row_writer: Any = None
        self.shard_paths: list[Path] = []

    def _start(self, index: int) -> Any:
        final = self.path / f"part-0-{index:05d}.npy"
        handle = self._files.create(final)
        self._rows = io.StringIO()
        self._row_writer = csv.writer(self._rows)
        self.shard_paths.append(final)
        return handle

    def _end(self, handle: Any, tokens: int) -> None:
        self._files.finish(handle)
        final = self.shard_paths[-1]
        rows = self._files.create(final.with_name(final.name[: -len(".npy")] + METADATA_SUFFIX))
        # level 1: the rows are ~2% of the data and level 9 (gzip's default) spent more time than writing the tokens
        with gzip.GzipFile(fileobj=rows, mode="wb", mtime=0, filename="", compresslevel=ROWS_COMPRESSION) as packed:
            packed.write(self._rows.getvalue().encode("utf-8"))
        self._files.finish(rows)

    def write(
        self, item: npt.ArrayLike, *, id: str | None = None, src: str | None = None, loc: int | None = None
    ) -> None:
        """Append one document, optionally with the ``id``, ``src`` and ``loc`` its metadata row records."""
        self._fields = (id, src, loc)
        try:
            super().write(item)
        finally:
            self._fields = (None, None, None)

    def _write_tokens(self, flat: np.ndarray, lengths: np.ndarray) -> None:
        if self.eos is not None:
            flat, lengths = add_delimiter(flat, lengths, self.eos)
        for first, stop, piece in self._shards.pieces(flat, lengths):
            start = self._shards.filled
            self._shards.current.write(np.ascontiguousarray(piece).data)
            ends = start + np.cumsum(lengths[first:stop], dtype=np.int64)
            starts = np.concatenate([[start], ends[:-1]])
            id_, src, loc = self._fields
            number = self.num_documents + first
            if self._fields == (None, None, None):  # the batch path: every row's text at once, as csv writes it
                source, numbers = self._quoted_source, range(number, number + len(ends))
                self._rows.write(
                    "".join(
                        f"{a},{b},{n},{source},{n}\r\n" for a, b, n in zip(starts.tolist(), ends.tolist(), numbers)
                    )
                )
                continue
            for k, (row_start, row_end) in enumerate(zip(starts.tolist(), ends.tolist())):
                self._row_writer.writerow(
                    (
                        row_start,
                        row_end,
                        number + k if id_ is None else id_,
                        self.source if src is None else src,
                        number + k if loc is None else loc,
                    )
                )

    def _finish(self) -> None:
        self._shards.finish()
