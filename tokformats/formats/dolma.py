"""OLMo / dolma token memmaps: ``NAME.npy`` (headerless, *not* NumPy's format) + ``NAME.csv.gz``.

Layout (dolma's ``tokenizer/memmap_writer.py``; read by OLMo-core's ``NumpyFSLDataset`` and
``iter_document_indices``)::

    NAME.npy     the tokens, little-endian, no header: uint16 by default, uint32 for larger vocabularies
    NAME.csv.gz  one row per document, no header: start,end,id,src,loc (token offsets, end exclusive; the source
                 document's id, its source file and line)

Neither file records the dtype (dolma issues #142 and #152 are users reading with the wrong one). The reader takes
it from the metadata: the last row's end times the itemsize is the file size, and only one itemsize fits. Without
the ``.csv.gz`` the dtype must be given and documents are found at ``eos=`` (as OLMo-core does from the array).
Loss masks (optional): ``NAME.label_mask.npy`` beside ``NAME.npy``, headerless bool (one byte, 0 or 1, per token), what
OLMo-core's numpy datasets take as ``label_mask_paths`` and serve as each instance's ``label_mask``.

A folder reads as every ``*.npy`` below it that has its ``.csv.gz``, sorted by path. dolma's writer starts a new file
before a document would bring it to ``max_tokens`` (default 512 Mi tokens); so does this one.
"""

from __future__ import annotations

import csv
import io
import os
import zlib
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.arrays import TokenArray
from ..core.documents import add_delimiter, offsets_from_lengths, split_offsets
from ..core.dtypes import check_id, parse_dtype, resolve_dtype
from ..core.protocol import PathLike, TokenWriter, checked_delimiters
from ..core.registry import FormatDescriptor, Probe
from ..errors import DTypeError, NoFilesError, SizeMismatchError, option
from ..fs.paths import expand_paths
from ..fs.untrusted import is_regular, require_regular
from ._dolma_rows import (
    GzipRows,
    RowStream,
    format_rows,
    parse_rows,
    rows_text,
    scan_rows,
    start_end_columns,
    tail_scan,
)
from ._parts import Part, PartsReader, checked_offsets, sibling_masks
from ._shards import DocumentShards

if TYPE_CHECKING:
    import numpy.typing as npt

    from ..core.files import LazyFiles

__all__ = ["Reader", "Writer", "detect", "read_metadata", "DEFAULT_MAX_TOKENS"]

#: This format's entry in :data:`tokformats.formats` (the registry finds it here).
DESCRIPTOR = FormatDescriptor(
    "dolma", "OLMo / dolma token memmaps: headerless NAME.npy + NAME.csv.gz", (".npy",), __name__, order=90
)

#: dolma's ``MemmapWriter.DEFAULT_MAX_TOKENS``.
DEFAULT_MAX_TOKENS = 512 * 1024 * 1024
METADATA_SUFFIX = ".csv.gz"
#: Replaces ``.npy`` in a memmap's name to name its loss-mask file.
LABEL_MASK_SUFFIX = ".label_mask.npy"
#: The gzip level and deflate strategy of the rows the writer compresses (any level reads the same). Level 1 with
#: run-length matching only (``Z_RLE``): for 1,000,000 rows (35 MB of text) 15.6 MB in a third of level 1's time
#: (12.0 MB), against 9.8 MB and ~20x the time at gzip's default level 9 (what dolma's and OLMo-core's writers get);
#: the rows are ~2% of the tokens' size either way.
ROWS_COMPRESSION = 1
ROWS_STRATEGY = zlib.Z_RLE
#: Batches of at least this many documents have their rows formatted and compressed on a helper thread.
_BACKGROUND_ROWS = 4096
_ITEMSIZES: dict[int, np.dtype] = {1: np.dtype("u1"), 2: np.dtype("<u2"), 4: np.dtype("<u4"), 8: np.dtype("<u8")}
_NUMPY_MAGIC = b"\x93NUMPY"


def label_mask_path(path: Path) -> Path:
    """``NAME.label_mask.npy`` beside ``NAME.npy``: its loss mask, one bool per token."""
    return path.with_name(path.name[: -len(".npy")] + LABEL_MASK_SUFFIX)


def metadata_path(path: Path) -> Path:
    """``NAME.csv.gz`` beside ``NAME.npy``."""
    return path.with_name(path.name[: -len(".npy")] + METADATA_SUFFIX if path.name.endswith(".npy") else path.name)


def read_start_end(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """The ``start`` and ``end`` columns of a ``.csv.gz`` (what a reader needs), parsed vectorised; rows the fast
    parser does not take are read by :func:`read_metadata`, with its checks and messages."""
    data = rows_text(path)
    columns = start_end_columns(data)
    if columns is not None:
        return columns
    starts, ends, _ = parse_rows(path, data)
    return starts, ends


def read_metadata(path: Path) -> tuple[np.ndarray, np.ndarray, list[list[str]]]:
    """The rows of a ``.csv.gz``: ``(starts, ends, rest)`` where ``rest`` holds each row's other fields
    (id, src, loc) as text. Decompression is bounded by the file's size (a zip bomb is refused)."""
    return parse_rows(path, rows_text(path))


def _is_memmap(path: Path | Probe) -> bool:
    probe = path if isinstance(path, Probe) else Probe(path)
    if not probe.path.name.endswith(".npy") or not probe.is_file:
        return False
    if probe.head(len(_NUMPY_MAGIC)) == _NUMPY_MAGIC:
        return False  # NumPy's own .npy (the "sequences" format)
    return probe.sibling(metadata_path(probe.path)).head(2) == b"\x1f\x8b"


def _folder_files(folder: Path) -> list[Path]:
    """The memmaps of a folder: every headerless ``.npy`` below it beside a ``.csv.gz`` entry of any kind (a
    damaged, unreadable or dangling one included: reading it then fails loudly, never drops the file). A ``.csv.gz``
    whose ``.npy`` is missing, or a headerless ``.npy`` without its ``.csv.gz`` among ones that have theirs, is an
    error: dropping either would make the dataset silently smaller."""
    rows = {p for p in folder.rglob("*" + METADATA_SUFFIX) if not p.name.startswith(".")}
    memmaps = [
        p
        for p in folder.rglob("*.npy")
        if not p.name.startswith(".")
        and not p.name.endswith(LABEL_MASK_SUFFIX)  # a memmap's loss mask, not a memmap of its own
        and is_regular(p)
        and Probe(p).head(len(_NUMPY_MAGIC)) != _NUMPY_MAGIC
    ]
    for metadata in sorted(rows):
        data = metadata.with_name(metadata.name[: -len(METADATA_SUFFIX)] + ".npy")
        if not is_regular(data):
            state = "does not exist" if not os.path.lexists(data) else "is not a regular file"
            raise NoFilesError(f"{data} {state}, but {metadata.name} beside it records its documents.")
    paired = [p for p in memmaps if metadata_path(p) in rows]
    if paired:
        for p in memmaps:
            if metadata_path(p) not in rows:
                raise NoFilesError(
                    f"{metadata_path(p)} is missing: {p.name}'s documents are recorded there (the other .npy files "
                    f"of {folder} have theirs)."
                )
    return sorted(paired)


def _remote_files(remote: LazyFiles, folder: Path) -> list[Path]:
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
    """A memmap's ``.csv.gz`` rows and ``.label_mask.npy`` loss mask (when there are any)."""
    if not name.endswith(".npy") or name.endswith(LABEL_MASK_SUFFIX):
        return []
    return [(name[: -len(".npy")] + METADATA_SUFFIX, False), (name[: -len(".npy")] + LABEL_MASK_SUFFIX, False)]


def remote_lazy(folder: Path, names: list[str]) -> bool:
    """Whether a folder opened by URL can fetch its ``.npy`` files on first use: each has its ``.csv.gz`` rows
    (fetched at open), which give its documents."""
    data = [n for n in names if n.endswith(".npy") and not n.endswith(LABEL_MASK_SUFFIX)]  # masks are no memmaps
    return bool(data) and all(n[: -len(".npy")] + METADATA_SUFFIX in names for n in data)


class Reader(PartsReader):
    """dolma memmaps: a ``.npy`` (with its ``.csv.gz``), several (a glob or list), or a folder, as one corpus.

    Args:
        path: a ``.npy`` file, a glob, a list, or a folder (every ``.npy`` below it with its ``.csv.gz``).
        dtype: the token dtype; inferred from the ``.csv.gz`` when omitted (required without one).
        eos: without a ``.csv.gz``, end documents after each occurrence of this id (OLMo-core's fallback).
        remote: set by ``tokformats.open(URL)``: the dataset's files, each ``.npy`` fetched on first use.

    ``document_metadata(i)`` gives the ``id``, ``src`` and ``loc`` dolma recorded for document ``i``.

    Rows are read where they are used. The open reads each file's last row, which the dtype is checked against:
    from the file's marked last gzip member (tokformats' writer puts it there), else by streaming the rows (one
    gzip member, as dolma's and OLMo-core's writers write them); told the dtype, a dataset of several files streams
    each file's rows when a token of it is first read (or its documents counted, or its offsets used), not at open.
    Document ``i`` parses its file's rows up to its own; ``len()`` counts rows; ``offsets`` parse them all. Each row
    is checked before it is used.
    """

    format = "dolma"
    #: Several files are mapped when a token of them is first read, and (told the dtype) checked then.
    maps_on_use = True

    def __init__(
        self,
        path: PathLike | list[PathLike],
        *,
        dtype: npt.DTypeLike | None = None,
        eos: int | None = None,
        remote: LazyFiles | None = None,
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
        #: Each part's rows, parsed as far as they have been used; their other fields are read when first used
        #: (:meth:`document_metadata`).
        self._rows: dict[int, RowStream] = {}
        self._fields: dict[int, list[list[str]]] = {}
        # When some files have their rows, every file must: one without would be split another way, or not at all.
        self._rows_expected = remote is None and any(os.path.lexists(metadata_path(f)) for f in files)
        #: Parts whose last row the open did not read (:meth:`_check_last_row` reads it before they are used).
        self._unchecked: set[int] = set()
        defer = dtype is not None and remote is None and len(files) > 1  # each file is then mapped on use
        self._set_parts([self._part(k, file, dtype, defer) for k, file in enumerate(files)])
        if self._parts:  # the parts' dtype known (given, or read from the rows): an eos it cannot hold is refused
            self.eos = checked_delimiters(path, self._parts[0].dtype, eos, None)[0]
        self.shards  # noqa: B018 - one file mapped now (what was validated is what is read); several: on use

    def _part(self, k: int, file: Path, dtype: npt.DTypeLike | None, defer: bool) -> Part:
        """Part ``k``: its size and dtype checked against its rows' last end (read from the file's marked last
        member, else streamed, not parsed: a given dtype that disagrees with the rows is refused before any token
        is served; all of the rows for a dataset opened by URL); the rows' fields are parsed on first use. With
        ``defer`` (a given dtype, several local files), a file without a marked last member is not streamed here:
        :meth:`_check_last_row` streams it before a token of it is read, its documents are counted or its offsets
        used."""
        metadata = metadata_path(file)
        has_rows = os.path.lexists(metadata) or self._rows_expected
        last = scan = None
        if has_rows and self._remote is None:
            # the last row from the file's own last member when it is marked as such (tokformats writes it apart),
            # else one streamed pass, now or (defer) where the file is first used; an unreadable file is an error
            scan = tail_scan(metadata)
            if scan is None and defer:
                self._unchecked.add(k)
            else:
                scan = scan or scan_rows(metadata)
                last = scan.last_end
        if has_rows and k not in self._unchecked and (self._remote is not None or last is None):
            _, ends = read_start_end(metadata)  # rows that are not plain lines (or fetched whole): all of them decide
            last = int(ends[-1]) if len(ends) else 0
        size = self._data_size(file, dtype, last)
        chosen = self._fitted_dtype(file, dtype, last, size)
        if has_rows:
            self._rows[k] = RowStream(metadata, size // chosen.itemsize, scan)
        return Part(file, 0, size // chosen.itemsize, chosen)

    def _fitted_dtype(self, file: Path, dtype: npt.DTypeLike | None, last: int | None, size: int) -> np.dtype:
        """The dtype of ``file`` (``size`` bytes) whose rows end at token ``last`` (None: not read yet): the one
        itemsize that makes ``last`` tokens fill the file, which a given ``dtype`` must be."""
        metadata = metadata_path(file)
        inferred = None
        if last:
            fits = [d for s, d in _ITEMSIZES.items() if last * s == size]
            if not fits:
                raise SizeMismatchError(
                    f"{file}: {metadata.name} ends at token {last:,}, but {size:,} bytes is not that many uint8, "
                    "uint16, uint32 or uint64 tokens: one of the two files is truncated or from another output."
                )
            inferred = fits[0]
        chosen = self._chosen_dtype(file, dtype, inferred, size)
        if size % chosen.itemsize:
            raise SizeMismatchError(f"{file}: {size:,} bytes is not a whole number of {chosen.name} tokens.")
        return chosen

    def _check_last_row(self, index: int) -> None:
        """The check the open deferred for part ``index`` (see :meth:`_part`): its rows streamed once (the same
        pass counts them for ``len()``), the last row's end checked against the file's size and the given dtype,
        as the open checks it. Rows that are not plain lines are parsed whole (which checks the last end too)."""
        if index not in self._unchecked:
            return
        part, rows = self._parts[index], self._rows[index]
        last = None if rows.complete else rows.scan().last_end  # rows parsed to the end already: their last end
        if last is None:
            ends = rows.columns()[1]
            last = int(ends[-1]) if len(ends) else 0
        self._fitted_dtype(part.path, part.dtype, last, part.tokens * part.dtype.itemsize)
        self._unchecked.discard(index)

    def _open_part(self, index: int) -> np.ndarray:
        """Map part ``index`` (several files are mapped when a token of them is first read), its last row checked
        first when the open did not (:meth:`_check_last_row`)."""
        self._check_last_row(index)
        return super()._open_part(index)

    @staticmethod
    def _chosen_dtype(file: Path, dtype: npt.DTypeLike | None, inferred: np.dtype | None, size: int) -> np.dtype:
        """The dtype given (which must agree with the rows'), else the rows', else uint16 for an empty file."""
        metadata = metadata_path(file)
        if dtype is not None:
            chosen = parse_dtype(dtype)
            if inferred is not None and inferred != chosen:
                raise DTypeError(
                    f"{file}: dtype {chosen.name} was given, but {metadata.name} and the file size say {inferred.name}."
                )
            return chosen
        if inferred is not None:
            return inferred
        if size == 0:
            return _ITEMSIZES[2]
        raise DTypeError(
            f"{file}: the file records no dtype and has no {METADATA_SUFFIX} to infer it from; pass "
            f"{option('dtype', repr('uint16'))} or {option('dtype', repr('uint32'))} (and {option('eos', 'ID')})."
        )

    def _data_size(self, file: Path, dtype: npt.DTypeLike | None, last: int | None) -> int:
        """The size of ``file``; for a dataset opened by URL, from its records, else its rows' last end and
        ``dtype`` (the download is checked against it), else the store's."""
        if self._remote is None:
            size = require_regular(file) if file.exists() else None
            if size is None:
                raise NoFilesError(f"{file} does not exist.")
            return size
        if not self._remote.has(file):
            raise NoFilesError(f"{file} is not a file of {self._remote.url}.")
        implied = None
        if last is not None and dtype is not None:
            implied = last * parse_dtype(dtype).itemsize
        return self._remote.size(file, implied)

    def _part_offsets(self, index: int) -> np.ndarray:
        part = self._parts[index]
        rows = self._rows.get(index)
        if rows is None:
            return split_offsets(self.shards[index], eos=self.eos)
        self._check_last_row(index)
        _, ends = rows.columns()  # every row checked as it was parsed: they tile the file, within its tokens
        return checked_offsets(np.concatenate([[0], ends]), part.tokens, str(rows.path), "end")

    def __len__(self) -> int:
        """The number of documents: each file's rows counted (decompressed, not parsed: a row's fields are parsed and
        checked where the row is used); once :attr:`offsets` are known, theirs."""
        if "offsets" in self.__dict__ or self._remote is not None:
            return super().__len__()
        return int(self._document_starts[-1])

    def _part_documents(self, index: int) -> int:
        """Part ``index``'s documents: its rows counted (not parsed), or its documents at ``eos``."""
        rows = self._rows.get(index)
        self._check_last_row(index)  # the pass that counts the rows finds the last one: checked as at open
        return rows.total() if rows is not None else len(self._offsets_of(index)) - 1

    def __getitem__(self, key: Any) -> Any:
        """Document ``key`` (or a list, for a slice). A document counted from the start is found reading its file's
        rows only up to its own (the first document: the first rows of the first file); a negative index or a slice
        needs them all (:attr:`offsets`)."""
        if isinstance(key, (int, np.integer)) and key >= 0 and "offsets" not in self.__dict__:
            return self._item_from_rows(int(key))
        return super().__getitem__(key)

    def _item_from_rows(self, index: int) -> np.ndarray:
        """Document ``index``, reading each file's rows only as far as needed to find it (once every part's rows are
        counted, its part is found by bisection rather than by walking the parts)."""
        local, first = index, 0
        if "_document_starts" in self.__dict__:
            starts = self._document_starts
            first = min(int(np.searchsorted(starts, index, side="right")) - 1, len(self._parts) - 1)
            local -= int(starts[first])
        for k in range(first, len(self._parts)):
            rows = self._rows.get(k)
            if rows is None:  # documents at eos: found in the tokens
                offsets = self._offsets_of(k)
                count = len(offsets) - 1
                if local < count:
                    return self.shards[k][offsets.item(local) : offsets.item(local + 1)]
            else:
                rows.ensure(local + 1)
                count = rows.count
                if local < count:
                    start, end = rows.row(local)
                    return self.shards[k][start:end]
            local -= count
        raise IndexError(f"index {index} is out of range for {len(self)} items in {self.path}")

    @cached_property
    def label_masks(self) -> TokenArray | None:
        """The ``NAME.label_mask.npy`` bytes of every token (uint8, 1 = trained on), or None without them."""
        return sibling_masks(self, self._parts, [label_mask_path(p.path) for p in self._parts])

    @property
    def loss_masks(self) -> TokenArray | None:
        """The label masks of every token (see :attr:`tokformats.TokenReader.loss_masks`)."""
        return self.label_masks

    def _cached_maps(self) -> tuple[str, ...]:
        return (*super()._cached_maps(), "label_masks")

    def document_metadata(self, index: int) -> dict[str, str | None]:
        """The ``id``, ``src`` and ``loc`` fields dolma recorded for document ``index`` (None without metadata)."""
        position = int(index) + len(self) if int(index) < 0 else int(index)
        for k in range(len(self._parts)):
            rows = self._rows.get(k)
            count = len(rows.columns()[1]) if rows is not None else len(self._part_offsets(k)) - 1
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
    stores_loss_mask = True
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
        self._rows: Any = None  # the current shard's GzipRows
        self._mask: Any = None  # the current shard's label-mask file, when the dataset stores masks
        self.shard_paths: list[Path] = []

    def _start(self, index: int) -> Any:
        final = self.path / f"part-0-{index:05d}.npy"
        handle = self._files.create(final)
        self.shard_paths.append(final)
        if self.loss_masked:
            self._mask = self._files.create(label_mask_path(final))
        # the rows are compressed as each batch arrives (no second pass over them at the shard's end), at a level
        # that costs little next to writing the tokens (ROWS_COMPRESSION)
        # the last row in a gzip member of its own: an open finds its end (the dtype check) without decompressing
        # every row (_dolma_rows.tail_scan); the rows read as one text by every gzip reader
        self._rows = GzipRows(
            self._files.create(metadata_path(final)), ROWS_COMPRESSION, ROWS_STRATEGY, last_row_apart=True
        )
        return handle

    def _end(self, handle: Any, tokens: int) -> None:
        self._files.finish(handle)
        if self._mask is not None:
            self._files.finish(self._mask)
        self._rows.close()
        self._files.finish(self._rows.handle)

    def write(
        self,
        item: npt.ArrayLike,
        loss_mask: npt.ArrayLike | None = None,
        *,
        id: str | None = None,
        src: str | None = None,
        loc: int | None = None,
    ) -> None:
        """Append one document (and its loss mask), optionally with the ``id``, ``src`` and ``loc`` its metadata
        row records."""
        self._fields = (id, src, loc)
        try:
            super().write(item, loss_mask)
        finally:
            self._fields = (None, None, None)

    def _write_tokens(self, flat: np.ndarray, lengths: np.ndarray) -> None:
        self._write_rows(flat, lengths, None)

    def _write_masked(self, flat: np.ndarray, lengths: np.ndarray, mask: np.ndarray) -> None:
        self._write_rows(flat, lengths, mask)

    def _write_rows(self, flat: np.ndarray, lengths: np.ndarray, mask: np.ndarray | None) -> None:
        """Tokens (and their mask: the writer's own ``eos`` is trained on) into shards, and one row per document."""
        if self.eos is not None:
            if mask is not None:
                mask, _ = add_delimiter(mask, lengths, 1)
            flat, lengths = add_delimiter(flat, lengths, self.eos)
        offsets = offsets_from_lengths(lengths) if mask is not None else None
        for first, stop, piece in self._shards.pieces(flat, lengths):
            start = self._shards.filled
            self._shards.current.write(np.ascontiguousarray(piece).data)
            if offsets is not None and mask is not None:
                self._mask.write(np.ascontiguousarray(mask[offsets.item(first) : offsets.item(stop)]).data)
            ends = start + np.cumsum(lengths[first:stop], dtype=np.int64)
            starts = np.concatenate([[start], ends[:-1]])
            self._write_row_text(starts, ends, self.num_documents + first)

    def _write_row_text(self, starts: np.ndarray, ends: np.ndarray, number: int) -> None:
        """The rows of documents ``number ...`` (``starts``/``ends`` in the current shard), as csv writes them."""
        id_, src, loc = self._fields
        if self._fields == (None, None, None):  # the batch path: every row's bytes at once
            source = self._quoted_source.encode("utf-8")
            if len(ends) < _BACKGROUND_ROWS:
                self._rows.write(format_rows(starts, ends, number, source))
            else:  # formatted and compressed while the next tokens are written
                self._rows.write(lambda: format_rows(starts, ends, number, source), background=True)
            return
        lines = io.StringIO()
        rows = csv.writer(lines)
        for k, (row_start, row_end) in enumerate(zip(starts.tolist(), ends.tolist())):
            rows.writerow(
                (
                    row_start,
                    row_end,
                    number + k if id_ is None else id_,
                    self.source if src is None else src,
                    number + k if loc is None else loc,
                )
            )
        self._rows.write(lines.getvalue().encode("utf-8"))

    def _finish(self) -> None:
        self._shards.finish()

    def abort(self) -> None:
        """Discard everything written (a batch of rows being compressed is let finish first)."""
        if self._rows is not None:
            self._rows.abandon()
        super().abort()
