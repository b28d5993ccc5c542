"""litdata token chunks (``litdata.optimize(..., item_loader=TokensLoader())``, as LitGPT prepares data).

Layout (litdata's ``streaming/writer.py``, ``BinaryWriter._create_chunk``)::

    FOLDER/
      index.json        {"chunks": [{"chunk_bytes", "chunk_size", "dim", "filename"}, ...],
                         "config": {"item_loader": "TokensLoader", "data_format": ["no_header_numpy:5"], ...}}
      chunk-0-0.bin     uint32 N (documents in the chunk), uint32 offsets[N + 1] (absolute byte offsets of each
      chunk-0-1.bin     document in the chunk), then the documents' ids back to back
      ...

``dim`` is the chunk's token count; ``data_format`` names the dtype by its index in litdata's table of NumPy
types (``no_header_numpy:K``) or of torch types (``no_header_tensor:K``). A chunk holds whole documents: the
writer closes it before a document would bring it past ``chunk_size`` tokens (a larger document gets a chunk of
its own). ``StreamingDataset(FOLDER, item_loader=TokensLoader(block_size=L))`` reads blocks of L tokens that never
cross a chunk; this reader gives the documents the chunks record.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.documents import offsets_from_lengths
from ..core.dtypes import resolve_dtype
from ..core.protocol import PathLike, TokenWriter
from ..core.registry import FormatDescriptor, Probe
from ..errors import FormatError, NoFilesError, SizeMismatchError
from ..fs.names import safe_relative_name
from ..fs.untrusted import read_json_object
from ._parts import Part, PartsReader, checked_offsets
from ._shards import DocumentShards

if TYPE_CHECKING:
    import numpy.typing as npt

    from ..core.files import LazyFiles

__all__ = ["Reader", "Writer", "detect", "data_format_dtype", "NUMPY_DTYPES", "TORCH_DTYPES", "DEFAULT_CHUNK_TOKENS"]

#: This format's entry in :data:`tokformats.formats` (the registry finds it here).
DESCRIPTOR = FormatDescriptor(
    "litdata", "litdata TokensLoader folder: index.json + chunk-R-K.bin", (".json",), __name__, order=70
)

INDEX = "index.json"
#: litdata's ``_NUMPY_SCTYPES`` (``no_header_numpy:K`` is entry K); only the numeric ones can hold tokens.
NUMPY_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32",
                "float64")  # fmt: skip
#: litdata's ``_TORCH_DTYPES_MAPPING`` (``no_header_tensor:K``), as NumPy dtypes (None: none that maps).
TORCH_DTYPES = ("float32", "float32", "float64", "float64", None, None, None, None, "float16", "float16", None,
                "uint8", "int8", "int16", "int16", "int32", "int32", "int64", "int64", None, "uint16")  # fmt: skip
#: LitGPT's ``chunk_size`` for pretraining data: 8,012 blocks of 2,049 tokens.
DEFAULT_CHUNK_TOKENS = 2049 * 8012
_HEADER = np.dtype("<u4")


def _index(folder: Path) -> dict[str, Any] | None:
    path = folder / INDEX
    return read_json_object(path) if path.is_file() else None


def detect(probe: Probe) -> bool:
    """True for a folder whose ``index.json`` names litdata's ``TokensLoader``."""
    if not probe.is_dir or INDEX not in probe.entries:
        return False
    if b'"TokensLoader"' not in probe.child(INDEX).head(1 << 20):  # litdata writes the name as a JSON string
        return False
    try:
        index = _index(probe.path)
    except FormatError:
        return False
    config = (index or {}).get("config")
    return isinstance(config, dict) and config.get("item_loader") == "TokensLoader"


def data_format_dtype(data_format: Any, where: str) -> np.dtype:
    """The dtype a ``config.data_format`` entry (``["no_header_numpy:5"]``) names."""
    entry = data_format[0] if isinstance(data_format, list) and data_format else data_format
    serializer, _, number = str(entry).partition(":")
    table = {"no_header_numpy": NUMPY_DTYPES, "no_header_tensor": TORCH_DTYPES}.get(serializer)
    if table is None or not number.isdigit():
        raise FormatError(f"{where}: config.data_format is {data_format!r}; TokensLoader chunks use "
                          "'no_header_numpy:K' or 'no_header_tensor:K'.")  # fmt: skip
    name = table[int(number)] if int(number) < len(table) else None
    if name is None:
        raise FormatError(f"{where}: config.data_format {entry!r} is not a numeric dtype litdata can store tokens in.")
    return np.dtype(name).newbyteorder("<")


#: The index a folder URL is read from, and uploaded last by ``publish``.
REMOTE_INDEX = (INDEX,)
PUBLISHED_LAST = (INDEX,)


def remote_files(folder: Path) -> list[dict[str, Any]]:
    """The chunks ``index.json`` lists, with their sizes."""
    chunks = (_index(folder) or {}).get("chunks")
    listed = chunks if isinstance(chunks, list) else []
    return [
        {"name": c["filename"], "size": c.get("chunk_bytes")} for c in listed if isinstance(c, dict) and "filename" in c
    ]


def remote_lazy(folder: Path, names: list[str]) -> bool:
    """Whether a folder opened by URL can fetch its chunks on first use: ``index.json`` gives every chunk's
    documents, tokens and bytes."""
    return INDEX in names and (folder / INDEX).is_file()


class Reader(PartsReader):
    """A litdata ``TokensLoader`` folder as a corpus: the documents each chunk records, chunks in index order.

    Args:
        path: the folder holding ``index.json``.
        remote: set by ``tokformats.open(URL)``: the dataset's files, each chunk fetched on first use.
    """

    format = "litdata"

    def __init__(self, path: PathLike, *, remote: LazyFiles | None = None) -> None:
        super().__init__(path, remote=remote)
        self._remote = remote
        self._folder = Path(path)
        index = _index(self._folder)
        where = str(self._folder / INDEX)
        if index is None:
            raise NoFilesError(f"{self._folder} has no {INDEX}: it is not a litdata folder.")
        config, chunks = index.get("config"), index.get("chunks")
        if not isinstance(config, dict) or not isinstance(chunks, list):
            raise FormatError(f"{where}: needs a 'config' object and a 'chunks' list.")
        if config.get("item_loader") != "TokensLoader":
            raise FormatError(f"{where}: config.item_loader is {config.get('item_loader')!r}, not 'TokensLoader'.")
        for key in ("compression", "encryption"):
            if config.get(key):
                raise FormatError(
                    f"{where}: config.{key} is {config[key]!r}; tokformats maps chunks in place and reads "
                    "uncompressed, unencrypted ones only (optimize without it)."
                )
        self.config = config
        dtype = data_format_dtype(config.get("data_format"), where)
        parts = []
        for k, chunk in enumerate(chunks):
            if not isinstance(chunk, dict) or not isinstance(chunk.get("filename"), str):
                raise FormatError(f"{where}: chunks[{k}] has no 'filename'.")
            name = safe_relative_name(chunk["filename"], where=f"{where}: chunks[{k}].filename", folder=self._folder)
            file = self._folder / name
            if Path(chunk["filename"]).name != chunk["filename"]:
                raise FormatError(f"{where}: chunks[{k}].filename {chunk['filename']!r} is not a plain file name.")
            if not (file.is_file() if remote is None else remote.has(file)):
                raise NoFilesError(f"{file} is listed in {where} but does not exist.")
            items, dim = chunk.get("chunk_size"), chunk.get("dim")
            if not isinstance(items, int) or not isinstance(dim, int) or items < 0 or dim < 0:
                raise FormatError(f"{where}: chunks[{k}] needs integer 'chunk_size' and 'dim', found {chunk}.")
            header = (items + 2) * _HEADER.itemsize
            size = file.stat().st_size if remote is None else remote.size(file)
            expected = header + dim * dtype.itemsize
            recorded = chunk.get("chunk_bytes")
            if size != expected or (isinstance(recorded, int) and recorded != size):
                # The chunk is exactly its header and tokens, and index.json records its size: a chunk that is
                # longer was replaced or appended to, and its header would point into bytes the index never named.
                said = f" and chunk_bytes {recorded:,}" if isinstance(recorded, int) else ""
                raise SizeMismatchError(
                    f"{file}: {INDEX} says {items:,} documents and {dim:,} {dtype.name} tokens "
                    f"({expected:,} bytes{said}), but the file has {size:,} bytes: "
                    f"{'truncated' if size < expected else 'changed or from another dataset'}."
                )
            parts.append(Part(file, header, dim, dtype))
        if not parts:
            raise NoFilesError(f"{where} lists no chunks.")
        self._set_parts(parts)
        self.shards  # noqa: B018 - map now: what was validated is what is read

    def _part_documents(self, index: int) -> int:
        return self._parts[index].offset // _HEADER.itemsize - 2  # the header: count, then count + 1 offsets

    def _part_offsets(self, index: int) -> np.ndarray:
        part = self._parts[index]
        if self._remote is not None and not self._files.is_pinned(part.path):
            # A chunk not fetched yet: its header alone, by one ranged request (`lengths` of a corpus opened by URL
            # need every chunk's header, not every chunk); checked against the chunk when it arrives.
            header = np.frombuffer(self._head(part.path, part.offset), dtype=_HEADER)
        else:
            header = self._map(self._fetched(part.path), _HEADER, 0, part.offset // _HEADER.itemsize)
        items = len(header) - 2
        if int(header[0]) != items:
            raise FormatError(f"{part.path}: the header counts {int(header[0]):,} documents, {INDEX} {items:,}.")
        starts = header[1:].astype(np.int64) - part.offset
        if (starts % part.dtype.itemsize).any():
            raise FormatError(f"{part.path}: a document offset is not on a {part.dtype.name} boundary.")
        return checked_offsets(starts // part.dtype.itemsize, part.tokens, str(part.path), "offsets")

    @property
    def path(self) -> Path:
        return self._folder

    @property
    def metadata(self) -> dict[str, Any]:
        return {"config": self.config, "chunks": len(self._parts)}


class Writer(TokenWriter):
    """Writes a litdata folder that ``StreamingDataset(..., item_loader=TokensLoader(block_size=L))`` reads.

    Args:
        path: the folder.
        vocab_size: uint16 up to 65,536 ids, else uint32.
        dtype: the token dtype instead (one of litdata's NumPy types).
        chunk_size: tokens per chunk (LitGPT's 2,049 x 8,012 by default); a chunk closes before a document would
            bring it past this, as litdata's writer does.
        overwrite: replace the folder's chunks and index.

    Chunks are named ``chunk-0-K.bin`` (one writer: litdata's rank 0) and ``index.json`` is written last.
    """

    format = "litdata"

    @classmethod
    def existing_outputs(cls, path: PathLike) -> list[Path]:
        folder = Path(path)
        if not folder.is_dir():
            return []
        return sorted(folder.glob("chunk-*.bin")) + ([folder / INDEX] if (folder / INDEX).exists() else [])

    def __init__(
        self,
        path: PathLike,
        *,
        vocab_size: int | None = None,
        dtype: npt.DTypeLike | None = None,
        chunk_size: int = DEFAULT_CHUNK_TOKENS,
        overwrite: bool = False,
    ) -> None:
        chosen = resolve_dtype(dtype, vocab_size, format=self.format, allowed=NUMPY_DTYPES)
        super().__init__(path, dtype=chosen, vocab_size=vocab_size, overwrite=overwrite)
        self._files.check_destination(self.path / INDEX)
        if overwrite:
            folder = self.path
            self._files.remove_on_commit(lambda: self.existing_outputs(folder))
        self.chunk_size = chunk_size
        self._shards = DocumentShards(chunk_size, self._start, self._end)
        self._pieces: list[tuple[np.ndarray, np.ndarray]] = []
        self._chunks: list[dict[str, Any]] = []

    def _start(self, index: int) -> Path:
        self._pieces = []
        return self.path / f"chunk-0-{index}.bin"

    def _end(self, final: Path, tokens: int) -> None:
        # The header needs every document's offset, so a chunk is assembled in memory (litdata does the same:
        # its chunks are a few tens of MB) and written at once.
        flat = np.concatenate([f for f, _ in self._pieces]) if self._pieces else np.zeros(0, self.dtype)
        lengths = np.concatenate([n for _, n in self._pieces]) if self._pieces else np.zeros(0, np.int64)
        header = (len(lengths) + 2) * _HEADER.itemsize
        offsets = offsets_from_lengths(lengths) * self.dtype.itemsize
        if header + int(offsets[-1]) >= 1 << 32:
            raise FormatError(f"{final}: a chunk of {header + int(offsets[-1]):,} bytes does not fit litdata's "
                              "uint32 offsets; lower chunk_size.")  # fmt: skip
        handle = self._files.create(final)
        handle.write(np.array([len(lengths)], dtype=_HEADER).tobytes())
        handle.write((offsets + header).astype(_HEADER).tobytes())
        handle.write(np.ascontiguousarray(flat).data)
        self._files.finish(handle)
        size = header + int(offsets[-1])
        self._chunks.append({"chunk_bytes": size, "chunk_size": len(lengths), "dim": tokens, "filename": final.name})
        self._pieces = []

    def _write_tokens(self, flat: np.ndarray, lengths: np.ndarray) -> None:
        for first, stop, piece in self._shards.pieces(flat, lengths):
            # Copies: a chunk's rows wait here for later batches, and the caller may refill its arrays before then.
            self._pieces.append((piece.copy(), lengths[first:stop].copy()))

    def _finish(self) -> None:
        self._shards.finish()
        config = {
            "chunk_bytes": None,
            "chunk_size": self.chunk_size,
            "compression": None,
            "compression_batch_size": None,
            "compression_level": None,
            "data_format": [f"no_header_numpy:{NUMPY_DTYPES.index(self.dtype.name)}"],
            "data_spec": json.dumps([1, {"type": None, "context": None, "children_spec": []}]),
            "encryption": None,
            "ipc_compression": None,
            "item_loader": "TokensLoader",
            "types": "json",
        }
        index = {"chunks": self._chunks, "config": config, "updated_at": str(time.time())}
        self._files.create(self.path / INDEX).write(json.dumps(index, sort_keys=True).encode("utf-8"))

