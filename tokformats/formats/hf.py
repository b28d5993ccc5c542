"""HF datasets ``save_to_disk`` folders with a token column (``input_ids``), read zero-copy.

Layout (``datasets.Dataset.save_to_disk``; read back by ``datasets.load_from_disk``)::

    FOLDER/
      data-00000-of-0000N.arrow   Arrow IPC *stream* files; the column is list<int32> (or large_list<int64>, ...)
      dataset_info.json           {"features": {"input_ids": {"feature": {"dtype": ...}, "_type": "List"}}, ...}
      state.json                  {"_data_files": [{"filename": ...}, ...], "_fingerprint": ..., ...}

A list column is two buffers per record batch: the values (the tokens, back to back) and the offsets (where each
row starts). The reader maps each ``.arrow`` file once and views every batch's values where they lie in it, so
documents are zero-copy slices of the file; the offsets give the documents. ``state.json``'s file order is the
dataset's row order. A ``DatasetDict`` folder (``dataset_dict.json``) holds one folder per split: open one of them.

Needs ``pyarrow`` (``pip install tokformats[hf]``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ..core.arrays import ConcatenatedArray, TokenArray
from ..core.documents import offsets_from_lengths
from ..core.dtypes import little_endian, resolve_dtype
from ..core.protocol import PathLike, TokenWriter
from ..core.registry import FormatDescriptor, Probe
from ..errors import DTypeError, FormatError, NoFilesError
from ..fs.names import safe_relative_name
from ..fs.untrusted import read_json_object
from ._parts import Part, PartsReader, checked_offsets
from ._shards import DocumentShards

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = ["Reader", "Writer", "detect", "DEFAULT_COLUMN", "MASK_COLUMN"]

#: This format's entry in :data:`tokformats.formats` (the registry finds it here).
DESCRIPTOR = FormatDescriptor(
    "hf", "HF datasets save_to_disk folder with a token column (input_ids)", (".arrow",), __name__, order=80
)

DEFAULT_COLUMN = "input_ids"
#: The loss-mask column beside the tokens: the name TRL's SFT collator reads (``assistant_masks``, what
#: ``transformers``' ``apply_chat_template(return_assistant_tokens_mask=True)`` returns): 1 where a token is trained on.
MASK_COLUMN = "assistant_masks"
STATE = "state.json"
INFO = "dataset_info.json"
DICT = "dataset_dict.json"
#: ``datasets``' default ``writer_batch_size``: rows per Arrow record batch.
BATCH_ROWS = 1000
#: ``datasets``' default ``max_shard_size`` (500 MB), in bytes.
MAX_SHARD_BYTES = 500 * 10**6


class _Batch(NamedTuple):
    """Where one record batch's row offsets lie: its number in its file, the byte ``at`` which its first offset is
    stored (-1: no batch), its row count (``rows + 1`` offsets) and the offsets' dtype."""

    number: int
    at: int
    rows: int
    kind: np.dtype


class _BatchLayout(NamedTuple):
    """Where every record batch of one file lies, one array element per batch: the byte ``at`` which its row
    offsets are stored (-1: no rows), its row count, and its tokens (``tokens`` of them from byte ``start``)."""

    at: np.ndarray
    rows: np.ndarray
    start: np.ndarray
    tokens: np.ndarray

    @classmethod
    def of(
        cls, file: Path, whole: Any, column: str, chunks: list[Any], offsets: np.dtype, dtype: np.dtype
    ) -> _BatchLayout:
        """The layout of ``chunks`` (the token column of each record batch, read zero-copy from the mapped file
        ``whole``): a few attribute reads per batch, then each batch's first and last offsets read together and
        checked vectorised (its tokens must lie in the file); the offsets between are checked where they are used."""
        base, size, item = whole.address, offsets.itemsize, dtype.itemsize
        rows = np.fromiter((len(chunk) for chunk in chunks), np.int64, len(chunks))
        # (list offset, list buffers, values offset) per batch; buffers: validity, offsets, values' validity, values.
        # An IPC reader drops a validity buffer whose null count is 0, so a values' validity means nulls to count.
        kept = [(chunk.offset, chunk.buffers(), chunk.values.offset) for chunk in chunks]
        for number, (_, buffers, _) in enumerate(kept):
            if buffers[2] is not None and chunks[number].values.null_count:
                raise FormatError(f"{file}: column {column!r} has null token ids.")
        empty = rows == 0  # Arrow may leave an empty array's buffers out
        at = np.fromiter(
            (-1 if buffers[1] is None else buffers[1].address - base + first * size for first, buffers, _ in kept),
            np.int64,
            len(kept),
        )
        values = np.fromiter(
            # -1: no values buffer, or an empty one at address 0 (a batch whose rows are all empty)
            (-1 if not buffers[3] else buffers[3].address - base + shift * item for _, buffers, shift in kept),
            np.int64,
            len(kept),
        )
        bad = ~empty & ((at < 0) | (at + (rows + 1) * size > whole.size))
        if bad.any():
            raise FormatError(f"{file}: column {column!r} has a damaged offsets buffer.")
        at[empty] = -1
        first, last = _offsets_at(whole, np.where(empty, 0, at), offsets), _offsets_at(whole, at + rows * size, offsets)
        first[empty], last[empty] = 0, 0
        count = last - first
        start = np.where(values < 0, 0, values + first * dtype.itemsize)  # rows all empty: no values buffer
        outside = (first < 0) | (count < 0) | (start < 0) | (start + count * dtype.itemsize > whole.size)
        outside = ~empty & (outside | ((values < 0) & (count > 0)))
        if outside.any():
            number = int(np.flatnonzero(outside)[0])
            raise FormatError(
                f"{file}: record batch {number}'s {column!r} tokens lie outside the file "
                f"(offsets {int(first[number]):,} to {int(last[number]):,}); it is damaged."
            )
        start[empty] = 0
        return cls(at, rows, start, count)


def _offsets_at(whole: Any, positions: np.ndarray, kind: np.dtype) -> np.ndarray:
    """The offsets (of dtype ``kind``) stored at byte ``positions`` of ``whole``, as int64 (positions are in range)."""
    raw = np.frombuffer(whole, np.uint8)
    gathered = raw[np.clip(positions, 0, None)[:, None] + np.arange(kind.itemsize)]
    values: np.ndarray = gathered.view(kind).reshape(-1).astype(np.int64)
    return values


def _pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.ipc  # the submodule the reader and writer use
    except ImportError:
        raise ImportError(
            "HF save_to_disk folders are Arrow files: install pyarrow (pip install 'tokformats[hf]')."
        ) from None
    return pyarrow


def detect(probe: Probe) -> bool:
    """True for a folder with ``state.json`` listing ``.arrow`` files, or a ``DatasetDict`` folder."""
    if not probe.is_dir:
        return False
    names = probe.entries
    if DICT in names:
        return True
    return STATE in names and INFO in names and any(n.endswith(".arrow") for n in names)


#: The index a folder URL is read from, and uploaded last by ``publish``.
REMOTE_INDEX = (STATE,)
PUBLISHED_LAST = (STATE, INFO)


_SHARD = re.compile(r"^data-(\d+)-of-(\d+)\.arrow$")


def _check_shard_names(state: Path, names: list[str]) -> None:
    """The redundancy ``state.json``'s file list holds: no file twice, and ``data-K-of-N.arrow`` names (what
    ``save_to_disk`` writes) numbering 0..N-1 with N the number listed; a list that breaks it was damaged, and
    reading it would drop or repeat a file's rows."""
    if len(set(names)) != len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise FormatError(f"{state}: '_data_files' lists {twice!r} more than once.")
    numbered = [_SHARD.match(n) for n in names]
    if names and all(numbered):
        found = sorted((int(m.group(1)), int(m.group(2))) for m in numbered if m)
        if found != [(k, len(names)) for k in range(len(names))]:
            raise FormatError(
                f"{state}: '_data_files' should name data-00000-of-{len(names):05d}.arrow ... "
                f"data-{len(names) - 1:05d}-of-{len(names):05d}.arrow, found {names!r:.300}."
            )


def remote_files(folder: Path) -> list[dict[str, Any]]:
    """``dataset_info.json`` and the ``.arrow`` files ``state.json`` lists."""
    state = read_json_object(folder / STATE)
    listed = state.get("_data_files")
    entries = listed if isinstance(listed, list) else []
    files = [e["filename"] for e in entries if isinstance(e, dict) and isinstance(e.get("filename"), str)]
    return [{"name": INFO, "required": False}] + [{"name": name} for name in files]


class Reader(PartsReader):
    """A ``save_to_disk`` folder's token column as a corpus: one document per row.

    Args:
        path: the folder (holding ``state.json``); for a ``DatasetDict``, the split's folder.
        column: the list column holding the token ids (``input_ids``).
        mask_column: the list column holding the loss masks (``assistant_masks``), read when present: 0/1 per token,
            with the same row lengths as ``column``.
    """

    format = "hf"

    def __init__(self, path: PathLike, *, column: str = DEFAULT_COLUMN, mask_column: str = MASK_COLUMN) -> None:
        super().__init__(path, column=column, mask_column=mask_column)
        pa = _pyarrow()
        self._folder = Path(path)
        self.column = column
        self.mask_column = mask_column
        #: Per record batch, where its mask values are (None: the files have no mask column).
        self._mask_parts: list[Part] | None = None
        if (self._folder / DICT).is_file():
            splits = read_json_object(self._folder / DICT).get("splits", [])
            listing = ", ".join(str(self._folder / str(s)) for s in splits) or "none listed"
            raise FormatError(f"{self._folder} is a DatasetDict; open one split's folder: {listing}.")
        if not (self._folder / STATE).is_file():
            raise NoFilesError(f"{self._folder} has no {STATE}: it is not a save_to_disk folder.")
        state = read_json_object(self._folder / STATE)
        entries = state.get("_data_files")
        if not isinstance(entries, list) or not all(isinstance(e, dict) and isinstance(e.get("filename"), str)
                                                    for e in entries):  # fmt: skip
            raise FormatError(
                f"{self._folder / STATE}: '_data_files' must be a list of {{'filename': NAME}} entries (names as "
                f"strings), found {entries!r:.200}."
            )
        _check_shard_names(self._folder / STATE, [e["filename"] for e in entries])
        self.info = read_json_object(self._folder / INFO) if (self._folder / INFO).is_file() else {}
        parts: list[Part] = []
        #: Per part, where its record batch's offsets lie in its file (read when a row of it is first read).
        self._batches: list[_Batch] = []
        for k, entry in enumerate(entries):
            where = f"{self._folder / STATE}: _data_files[{k}].filename"
            file = self._folder / safe_relative_name(entry["filename"], where=where, folder=self._folder)
            if Path(entry["filename"]).name != entry["filename"]:
                raise FormatError(f"{self._folder / STATE}: data file {entry['filename']!r} is not a plain file name.")
            if not file.is_file():
                raise NoFilesError(f"{file} is listed in {self._folder / STATE} but does not exist.")
            parts.extend(self._file_parts(pa, file))
        if not parts:  # no rows at all: an empty corpus of the column's dtype
            parts.append(Part(self._folder / STATE, 0, 0, np.dtype("<i4")))
            self._batches.append(_Batch(0, -1, 0, np.dtype("<i4")))
        self._set_parts(parts)

    def _file_parts(self, pa: Any, file: Path) -> list[Part]:
        """One part per record batch: where its values lie in the file, and its row offsets."""
        try:
            whole = pa.memory_map(os.fspath(file)).read_buffer()
            stream = pa.ipc.open_stream(whole)
            schema = stream.schema
            names = schema.names
        except (pa.lib.ArrowException, OSError, UnicodeDecodeError) as error:
            raise FormatError(f"{file}: not an Arrow IPC stream ({error}).") from None
        if self.column not in names:
            raise FormatError(
                f"{file}: there is no column {self.column!r}; the columns are {names}. Pass column=NAME."
            )
        kind = schema.field(self.column).type
        if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)) or not pa.types.is_integer(kind.value_type):
            raise FormatError(f"{file}: column {self.column!r} is {kind}; a token column is a list of integers.")
        dtype = little_endian(kind.value_type.to_pandas_dtype())
        masked = self._mask_type(pa, file, schema)
        offsets_type = np.dtype("<i8") if pa.types.is_large_list(kind) else np.dtype("<i4")
        try:
            # one C++ pass over the stream's messages (zero-copy on the map: every buffer stays inside the file),
            # the structure of each record batch checked as batch.validate() checks it; the token column's offsets
            # are read and checked where they are used (_part_offsets), and no other column is read
            table = stream.read_all()
            table.validate()
            chunks = table.column(self.column).chunks
            layout = _BatchLayout.of(file, whole, self.column, chunks, offsets_type, dtype)
            mask_chunks = table.column(self.mask_column).chunks if masked is not None else None
        except (pa.lib.ArrowException, OSError, UnicodeDecodeError) as error:  # a truncated or corrupted stream
            raise FormatError(f"{file}: the Arrow stream is damaged ({error}).") from None
        parts = []
        for number, (at, rows, start, count) in enumerate(zip(*(column.tolist() for column in layout))):
            self._batches.append(_Batch(number, at, rows, offsets_type))
            parts.append(Part(file, start, count, dtype))
            if mask_chunks is not None and self._mask_parts is not None and masked is not None:
                if rows == 0:
                    self._mask_parts.append(Part(file, 0, 0, masked))
                    continue
                raw = np.frombuffer(whole, offsets_type, count=rows + 1, offset=at)
                self._mask_parts.append(self._mask_part(pa, file, whole, mask_chunks[number], raw, masked))
        return parts

    def _mask_type(self, pa: Any, file: Path, schema: Any) -> np.dtype | None:
        """The mask column's value dtype when ``file`` has one (all files must agree), else None."""
        if self.mask_column not in schema.names:
            if self._mask_parts:
                raise FormatError(f"{file}: there is no column {self.mask_column!r}, while earlier files have one.")
            self._mask_parts = None
            return None
        kind = schema.field(self.mask_column).type
        if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)) or not (
            pa.types.is_integer(kind.value_type) or pa.types.is_boolean(kind.value_type)
        ):
            raise FormatError(f"{file}: column {self.mask_column!r} is {kind}; a loss-mask column is a list of 0/1.")
        if pa.types.is_boolean(kind.value_type):  # bit-packed: not one byte per token
            raise FormatError(f"{file}: column {self.mask_column!r} is a list of bool; store it as uint8 0/1.")
        if self._mask_parts is None:
            self._mask_parts = []
        return little_endian(kind.value_type.to_pandas_dtype())

    def _mask_part(self, pa: Any, file: Path, whole: Any, rows: Any, offsets: np.ndarray, dtype: np.dtype) -> Part:
        """Where one record batch's mask values (its list array ``rows``) lie in ``file``; its rows must have the
        tokens' lengths."""
        values = rows.values
        kind = np.int64 if pa.types.is_large_list(rows.type) else np.int32
        raw = np.frombuffer(rows.buffers()[1], kind, count=len(rows) + 1, offset=rows.offset * np.dtype(kind).itemsize)
        if len(raw) != len(offsets) or not np.array_equal(np.diff(raw), np.diff(offsets)) or values.null_count:
            raise FormatError(
                f"{file}: column {self.mask_column!r} must hold one 0/1 per token of {self.column!r} in every row."
            )
        first = int(raw[0]) if len(raw) else 0
        count = int(raw[-1]) - first if len(raw) else 0
        start = values.buffers()[1].address - whole.address + (values.offset + first) * dtype.itemsize
        if start < 0 or start + count * dtype.itemsize > whole.size:
            raise FormatError(f"{file}: a record batch's loss masks lie outside the file; it is damaged.")
        return Part(file, start, count, dtype)

    @cached_property
    def loss_masks(self) -> TokenArray | None:
        """The mask column's values of every token (uint8; see :attr:`tokformats.TokenReader.loss_masks`)."""
        if self._mask_parts is None:
            return None
        views = []
        for part in self._mask_parts:
            raw = self._file_maps[part.path][part.offset : part.offset + part.tokens * part.dtype.itemsize]
            values = raw.view(np.ndarray).view(part.dtype)
            if part.dtype != np.dtype("u1"):  # transformers' masks are int64 lists: narrowed here, once
                if len(values) and (values.min() < 0 or values.max() > 1):
                    raise FormatError(f"{part.path}: column {self.mask_column!r} holds values other than 0 and 1.")
                values = values.astype(np.uint8)
            views.append(values)
        if not views:  # a mask column and no rows
            return np.zeros(0, dtype=np.uint8)
        return views[0] if len(views) == 1 else ConcatenatedArray(views)

    @cached_property
    def _file_maps(self) -> dict[Path, np.ndarray]:
        """Each ``.arrow`` file mapped once (as bytes); every batch's tokens are views of it."""
        return {path: self._file_map(path) for path in dict.fromkeys(p.path for p in self._parts)}

    def _file_map(self, path: Path) -> np.ndarray:
        """``path`` mapped (as bytes), once: a row read maps only its own file."""
        maps = self.__dict__.setdefault("_maps_by_file", {})
        if path not in maps:
            maps[path] = self._map(path, np.dtype("u1"))
        return maps[path]  # type: ignore[no-any-return]

    @cached_property
    def shards(self) -> list[np.ndarray]:
        """Each record batch's tokens: a view of the mapped file."""
        views = []
        for part in self._parts:
            if part.tokens == 0:
                views.append(np.zeros(0, dtype=part.dtype))
                continue
            raw = self._file_maps[part.path][part.offset : part.offset + part.tokens * part.dtype.itemsize]
            views.append(raw.view(np.ndarray).view(part.dtype))
        return views

    def _cached_maps(self) -> tuple[str, ...]:
        return (*super()._cached_maps(), "_file_maps", "_maps_by_file", "loss_masks")

    def _part_offsets(self, index: int) -> np.ndarray:
        """Record batch ``index``'s row offsets, read from its mapped file and checked (from 0, never backwards,
        ending at its tokens), when a row of it is first read."""
        part, batch = self._parts[index], self._batches[index]
        if batch.at < 0:  # no rows at all
            return np.zeros(1, dtype=np.int64)
        raw = self._file_map(part.path).view(np.ndarray)[batch.at : batch.at + (batch.rows + 1) * batch.kind.itemsize]
        stored = raw.view(batch.kind)  # the batch's own offsets as stored (rows may start past 0)
        offsets = stored.astype(np.int64) - int(stored[0])
        where = f"{part.path} (record batch {batch.number})"
        return checked_offsets(offsets, part.tokens, where, f"{self.column} offsets")

    def _part_documents(self, index: int) -> int:
        return self._batches[index].rows

    @cached_property
    def _document_starts(self) -> np.ndarray:
        """Where each record batch's rows start among all rows (from the row counts recorded at open)."""
        counts = np.array([batch.rows for batch in self._batches], dtype=np.int64)
        return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    def __len__(self) -> int:
        """Rows: each record batch's row count, recorded in its header (its offsets are read where they are used)."""
        return int(self._document_starts[-1])

    def _item(self, index: int) -> np.ndarray:
        """Row ``index``: its record batch found by row counts, that batch's offsets read and checked once."""
        if "offsets" in self.__dict__:
            return super()._item(index)
        part = int(np.searchsorted(self._document_starts, index, side="right")) - 1
        offsets = self._offsets_of(part)
        local = index - int(self._document_starts[part])
        return self._shard(part)[offsets.item(local) : offsets.item(local + 1)]

    def _shard(self, index: int) -> np.ndarray:
        """Record batch ``index``'s tokens: a view of its mapped file."""
        if "shards" in self.__dict__:
            return self.shards[index]
        part = self._parts[index]
        if part.tokens == 0:
            return np.zeros(0, dtype=part.dtype)
        raw = self._file_map(part.path)[part.offset : part.offset + part.tokens * part.dtype.itemsize]
        return raw.view(np.ndarray).view(part.dtype)

    @property
    def path(self) -> Path:
        return self._folder

    @property
    def files(self) -> list[Path]:
        return [p for p in super().files if p.suffix == ".arrow"]

    @property
    def metadata(self) -> dict[str, Any]:
        return {"column": self.column, "features": self.info.get("features"), "record_batches": len(self._parts)}


class Writer(TokenWriter):
    """Writes a ``save_to_disk`` folder that ``datasets.load_from_disk`` opens: one ``input_ids`` column.

    Args:
        path: the folder.
        vocab_size: ids must be below it; the column is int32 (what ``datasets`` stores tokenizer output as)
            unless ``dtype`` says otherwise.
        dtype: the column's value type (any integer dtype).
        column: the column name.
        mask_column: the loss-mask column's name (``assistant_masks``, TRL's), written when writes carry masks.
        max_shard_bytes: a new ``.arrow`` file starts before one would exceed this (``datasets``' 500 MB).
        overwrite: replace an existing folder's files.

    Rows go in record batches of 1,000, as ``datasets`` writes them; ``state.json``'s fingerprint is a hash of the
    data, so the same documents give the same folder.
    """

    format = "hf"
    conventional_dtype = None
    stores_loss_mask = True

    @classmethod
    def existing_outputs(cls, path: PathLike) -> list[Path]:
        folder = Path(path)
        if not folder.is_dir():
            return []
        return sorted(folder.glob("data-*.arrow")) + [p for p in (folder / STATE, folder / INFO) if p.exists()]

    def __init__(
        self,
        path: PathLike,
        *,
        vocab_size: int | None = None,
        dtype: npt.DTypeLike | None = None,
        column: str = DEFAULT_COLUMN,
        mask_column: str = MASK_COLUMN,
        max_shard_bytes: int = MAX_SHARD_BYTES,
        overwrite: bool = False,
    ) -> None:
        chosen = resolve_dtype(dtype, vocab_size, format=self.format, default="int32", rule=lambda _: np.int32)
        if chosen.kind not in "iu":
            raise DTypeError(f"hf: a token column holds integers; {chosen.name} was asked for.")
        super().__init__(path, dtype=chosen, vocab_size=vocab_size, overwrite=overwrite)
        self._pa = _pyarrow()
        self.column = column
        self._files.check_destination(self.path / STATE)
        if overwrite:
            folder = self.path
            self._files.remove_on_commit(lambda: self.existing_outputs(folder))
        self.mask_column = mask_column
        self._value_type = self._pa.from_numpy_dtype(chosen)
        self._features: dict[str, Any] = {}
        self._schema: Any = None  # made when the first shard starts: the first write says whether masks are stored
        self._shards = DocumentShards(max(1, max_shard_bytes // chosen.itemsize), self._start, self._end)
        self._stream: Any = None
        self._pending: list[tuple[np.ndarray, np.ndarray, np.ndarray | None]] = []  # rows not yet in a record batch
        self._pending_rows = 0
        self._shard_names: list[Path] = []
        self._digest = hashlib.sha256()

    def _make_schema(self) -> None:
        """The columns: the tokens, and the loss masks (uint8) when this dataset stores them."""
        pa = self._pa
        # "Sequence" is what every datasets release reads (5.x reads it as List; 2.x-3.x know no "List").
        columns = [(self.column, self._value_type)] + ([(self.mask_column, pa.uint8())] if self.loss_masked else [])
        self._features = {
            name: {"feature": {"dtype": str(kind), "_type": "Value"}, "_type": "Sequence"} for name, kind in columns
        }
        metadata = {"huggingface": json.dumps({"info": {"features": self._features}})}
        self._schema = pa.schema([(name, pa.list_(kind)) for name, kind in columns], metadata=metadata)

    def _start(self, index: int) -> Any:
        if self._schema is None:
            self._make_schema()
        final = self.path / f"data-{index:05d}-of-?.arrow"  # renamed at commit, when the count is known
        handle = self._files.create(final)
        self._shard_names.append(final)
        self._stream = self._pa.ipc.new_stream(handle, self._schema)
        return handle

    def _end(self, handle: Any, tokens: int) -> None:
        self._flush(everything=True)
        self._stream.close()
        self._files.finish(handle)

    def _flush(self, *, everything: bool) -> None:
        """Write full record batches of the pending rows (and the rest when ``everything``)."""
        if not self._pending:
            return
        flat = np.concatenate([f for f, _, _ in self._pending])
        lengths = np.concatenate([n for _, n, _ in self._pending])
        masks = [m for _, _, m in self._pending if m is not None]
        mask = np.concatenate(masks) if masks else None
        offsets = offsets_from_lengths(lengths)
        whole = len(lengths) if everything else len(lengths) // BATCH_ROWS * BATCH_ROWS
        for first in range(0, whole, BATCH_ROWS):
            stop = min(first + BATCH_ROWS, whole)
            span = slice(offsets[first], offsets[stop])
            starts = offsets[first : stop + 1] - offsets[first]
            self._write_batch(flat[span], starts, None if mask is None else mask[span])
        rest = slice(offsets[whole], None)
        left = (flat[rest], lengths[whole:], None if mask is None else mask[rest])
        self._pending = [left] if whole < len(lengths) else []
        self._pending_rows = len(lengths) - whole

    def _write_batch(self, values: np.ndarray, offsets: np.ndarray, mask: np.ndarray | None) -> None:
        pa = self._pa
        starts = pa.array(offsets.astype(np.int32))
        columns = [pa.ListArray.from_arrays(starts, pa.array(values))]
        if mask is not None:
            columns.append(pa.ListArray.from_arrays(starts, pa.array(mask, type=pa.uint8())))
        self._stream.write_batch(pa.record_batch(columns, schema=self._schema))
        self._digest.update(offsets.tobytes())
        self._digest.update(values.tobytes())
        if mask is not None:
            self._digest.update(mask.tobytes())

    def _write_tokens(self, flat: np.ndarray, lengths: np.ndarray) -> None:
        self._write_rows(flat, lengths, None)

    def _write_masked(self, flat: np.ndarray, lengths: np.ndarray, mask: np.ndarray) -> None:
        self._write_rows(flat, lengths, mask)

    def _write_rows(self, flat: np.ndarray, lengths: np.ndarray, mask: np.ndarray | None) -> None:
        offsets = offsets_from_lengths(lengths) if mask is not None else None
        for first, stop, piece in self._shards.pieces(flat, lengths):
            part = None if mask is None or offsets is None else mask[offsets.item(first) : offsets.item(stop)].copy()
            # Copies: rows wait here for a later batch, and the caller may refill its arrays before then.
            self._pending.append((piece.copy(), lengths[first:stop].copy(), part))
            self._pending_rows += stop - first
            if self._pending_rows >= BATCH_ROWS:
                self._flush(everything=False)

    def _finish(self) -> None:
        self._shards.finish()  # an output without rows gets one empty shard (and so its schema)
        total = len(self._shard_names)
        names = []
        for k, provisional in enumerate(self._shard_names):
            final = provisional.with_name(f"data-{k:05d}-of-{total:05d}.arrow")
            self._files.retarget(provisional, final)
            names.append(final.name)
        info = {"citation": "", "description": "", "features": self._features, "homepage": "", "license": ""}
        state: dict[str, Any] = {
            "_data_files": [{"filename": name} for name in names],
            "_fingerprint": self._digest.hexdigest()[:16],
            "_format_columns": None,
            "_format_kwargs": {},
            "_format_type": None,
            "_output_all_columns": False,
            "_split": None,
        }
        self._files.create(self.path / INFO).write(json.dumps(info, indent=2).encode("utf-8"))
        self._files.create(self.path / STATE).write(json.dumps(state, indent=2).encode("utf-8"))
