"""HF datatrove token files (``DocumentTokenizer``; read by nanotron and ``DatatroveFolderDataset``).

One output is up to four files (datatrove's ``pipeline/tokens/tokenizer.py``, ``TokenizedFile``)::

    NAME.ds           the tokens, little-endian, no header: uint16 when the vocabulary has at most 65,536 ids,
                      else uint32 (``token_size`` 2 or 4)
    NAME.ds.index     uint64 little-endian END offset (in tokens) of each document; no leading 0
    NAME.ds.loss      optional: one byte (bool) per token, the loss mask
    NAME.ds.metadata  text: "TOKENIZER|TOKEN_SIZE", the token count, and the count in metric units ("1.23 MT")

The files name neither the dtype nor the document count; the reader takes the dtype from ``.ds.metadata`` when
it is there, else from the index (its last end times the token size is the file size). A folder (datatrove's
output folder, with ``00000_unshuffled.ds``, ``00001_unshuffled.ds``, ...) reads as one corpus in the order
``DatatroveFolderDataset`` lists it: every ``*.ds`` below the folder, sorted by path. Documents carry an EOS only
when the tokenizer's post-processor added one; the writer stores what it is given.
"""

from __future__ import annotations

import os
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.arrays import ConcatenatedArray
from ..core.dtypes import resolve_dtype
from ..core.protocol import PathLike, TokenWriter
from ..core.registry import FormatDescriptor, Probe
from ..core.reports import Problem
from ..errors import DTypeError, FormatError, NoFilesError, SizeMismatchError, option
from ..fs.paths import expand_paths
from ..fs.untrusted import read_file, require_regular
from ._parts import Part, PartsReader, checked_offsets

if TYPE_CHECKING:
    import numpy.typing as npt

    from ..core.files import LazyFiles

__all__ = ["Reader", "Writer", "detect", "metric", "output_filename"]

#: This format's entry in :data:`tokformats.formats` (the registry finds it here).
DESCRIPTOR = FormatDescriptor(
    "datatrove",
    "HF datatrove token files: NAME.ds + NAME.ds.index (+ .ds.loss, .ds.metadata)",
    (".ds",),
    __name__,
    order=60,
)

INDEX = ".index"
LOSS = ".loss"
METADATA = ".metadata"
_TOKEN_DTYPES: dict[int, np.dtype] = {2: np.dtype("<u2"), 4: np.dtype("<u4")}


def output_filename(save_filename: str | None, rank: int, name: str = "unshuffled") -> str:
    """The name datatrove's ``DocumentTokenizer`` gives rank ``rank``'s file: ``{save_filename}_{rank:05d}_{name}.ds``
    (without the prefix when ``save_filename`` is None); ``name`` is ``unshuffled`` or ``doc_shuffled``."""
    return "_".join(part for part in (save_filename, f"{rank:05d}", f"{name}.ds") if part)


def metric(value: int, unit: str = "T") -> str:
    """A count with an SI prefix and three significant digits, as datatrove writes the third line of
    ``.ds.metadata`` (``humanize.metric(count, unit="T")``): ``0.00 T``, ``999 T``, ``1.23 MT``."""
    import math

    exponent = math.floor(math.log10(abs(value))) if value else 0
    scaled = value / 10 ** (exponent // 3 * 3)
    digits = max(0, 3 - exponent % 3 - 1)
    if round(abs(scaled), digits) >= 10 ** (exponent % 3 + 1):  # 999.5 rounds up into the next prefix
        exponent += 1
        scaled = value / 10 ** (exponent // 3 * 3)
        digits = max(0, 3 - exponent % 3 - 1)
    prefix = "kMGTPEZYRQ"[exponent // 3 - 1] if exponent >= 3 else ""
    return f"{scaled:.{digits}f} {prefix}{unit}"


def _data_path(path: Path) -> Path:
    """The ``.ds`` file of any of an output's files (``x.ds.index`` -> ``x.ds``)."""
    for suffix in (INDEX, LOSS, METADATA):
        if path.name.endswith(".ds" + suffix):
            return path.with_name(path.name[: -len(suffix)])
    return path


def _folder_files(folder: Path) -> list[Path]:
    """Every ``*.ds`` below ``folder``, sorted by path (as ``DatatroveFolderDataset`` lists them). A ``.ds`` that is
    not a readable file (a FIFO, a folder, a broken link), or missing while its index or metadata is there, is an
    error: leaving it out would make the dataset silently smaller."""
    found = []
    for entry in sorted(folder.rglob("*.ds")):
        if entry.name.startswith("."):
            continue
        try:
            require_regular(entry)
        except FileNotFoundError:
            raise NoFilesError(f"{entry} is a broken link; it is one of {folder}'s token files.") from None
        found.append(entry)
    listed = set(found)
    for companion in sorted(folder.rglob("*.ds.*")):
        data = _data_path(companion)
        if not companion.name.startswith(".") and data != companion and data not in listed:
            raise NoFilesError(f"{data} is missing, but {companion.name} beside it belongs to it.")
    return found


def _metadata_token_size(path: Path) -> int | None:
    """The token size recorded in ``NAME.ds.metadata`` (its first line ends with ``|TOKEN_SIZE``), or None."""
    metadata = Path(os.fspath(path) + METADATA)
    if not metadata.is_file():
        return None
    first = read_file(metadata)[:4096].decode("utf-8", "replace").split("\n", 1)[0]
    field = first.rsplit("|", 1)[-1].strip()
    if not field.isdigit() or int(field) not in _TOKEN_DTYPES:
        raise FormatError(
            f"{metadata}: the first line should end with '|2' or '|4' (the token size in bytes), found {first!r}."
        )
    return int(field)


def _last_end(path: Path) -> int | None:
    """The last document end ``NAME.ds.index`` records (the file's token count), or None without one."""
    index = Path(os.fspath(path) + INDEX)
    try:
        index_size = index.stat().st_size
    except OSError:
        return None
    if index_size < 8 or index_size % 8:
        return None
    with open(index, "rb") as handle:
        handle.seek(index_size - 8)
        return int(np.frombuffer(handle.read(8), dtype="<u8")[0])


def _index_token_size(path: Path, data_size: int | None = None) -> int | None:
    """The token size that makes the index's last end match the file size (``data_size``, else the file's), or None
    when it says nothing (no index, or no tokens)."""
    try:
        data_size = path.stat().st_size if data_size is None else data_size
    except OSError:
        return None
    last = _last_end(path)
    if last is None or not data_size:
        return None
    fits = [size for size in _TOKEN_DTYPES if last * size == data_size]
    return fits[0] if fits else None


def _checked_indexes(files: list[Path]) -> list[bool]:
    """Whether each file has its ``.ds.index``. An index that is there but unreadable (a FIFO, a folder, a broken
    link) is an error, and so is a file without one among files that have theirs: either would otherwise read as
    one document (datatrove's ``save_index=False``), silently merging that file's documents."""
    indexed = []
    for file in files:
        index = Path(os.fspath(file) + INDEX)
        if not os.path.lexists(index):
            indexed.append(False)
            continue
        try:
            require_regular(index)
        except FileNotFoundError:
            raise NoFilesError(f"{index} is a broken link; {file.name}'s document ends are recorded there.") from None
        indexed.append(True)
    for file, has_index in zip(files, indexed):
        # Outputs are written with an index or all without (save_index): one missing among indexed ones was lost.
        if not has_index and (any(indexed) or next(file.parent.glob("*.ds" + INDEX), None) is not None):
            missing = Path(os.fspath(file) + INDEX)
            raise NoFilesError(
                f"{missing} is missing, but the other files of this dataset have their index: without it "
                f"{file.name} would read as one document."
            )
    return indexed


def _is_output(path: Path) -> bool:
    """A ``.ds`` file whose index (or metadata) agrees with its size."""
    if not path.is_file() or not path.name.endswith(".ds"):
        return False
    index = Path(os.fspath(path) + INDEX)
    if not index.is_file():
        return False
    if path.stat().st_size == 0:
        return index.stat().st_size % 8 == 0
    try:
        return _index_token_size(path) is not None or _metadata_token_size(path) is not None
    except FormatError:
        return False


def detect(probe: Probe) -> bool:
    """True for a ``.ds`` file (or any of its siblings) whose ``.ds.index`` matches its size, or a folder of them."""
    if probe.is_dir:
        direct = [probe.path / n for n in probe.entries if n.endswith(".ds")]
        return any(_is_output(p) for p in (direct or _folder_files(probe.path))[:4])
    if not probe.path.name.endswith((".ds", INDEX, LOSS, METADATA)):
        return False
    return _is_output(_data_path(probe.path))


#: Uploaded last by ``publish``.
PUBLISHED_LAST = ("*.ds.index", "*.ds.metadata")


def remote_companions(name: str) -> list[tuple[str, bool]]:
    """A ``.ds`` file's index, loss mask and metadata (each when it exists)."""
    return [(name + suffix, False) for suffix in (INDEX, METADATA, LOSS)] if name.endswith(".ds") else []


def remote_lazy(folder: Path, names: list[str]) -> bool:
    """Whether a folder opened by URL can fetch its ``.ds`` files on first use: each has its ``.ds.index``
    (fetched at open), which gives its documents and, with ``.ds.metadata``, its size."""
    data = [n for n in names if n.endswith(".ds")]
    return bool(data) and all(n + INDEX in names for n in data)


class Reader(PartsReader):
    """A datatrove ``.ds`` file, several (a glob or list), or a folder of them, as one corpus.

    Args:
        path: a ``.ds`` file (or its ``.index``), a glob, a list, or a folder (every ``*.ds`` below it, sorted).
        dtype: the token dtype when neither ``.ds.metadata`` nor the index records it (``uint16`` or ``uint32``).
        remote: set by ``tokformats.open(URL)``: the dataset's files, each ``.ds`` fetched on first use.

    Without a ``.ds.index`` (datatrove's ``save_index=False``) a file reads as one document. :meth:`loss_mask`
    gives the ``.ds.loss`` bytes of a document (uint8) when the files have them.
    """

    format = "datatrove"

    def __init__(
        self, path: PathLike | list[PathLike], *, dtype: npt.DTypeLike | None = None, remote: LazyFiles | None = None
    ) -> None:
        super().__init__(path, dtype=dtype, remote=remote)
        self._remote = remote
        if isinstance(path, (str, os.PathLike)) and Path(path).is_dir():
            files = remote.paths(".ds", Path(path)) if remote is not None else _folder_files(Path(path))
            if not files:
                raise NoFilesError(f"{path} holds no datatrove .ds files.")
        else:
            files = [_data_path(p) for p in expand_paths(path)]
        for file in files:
            if not (file.is_file() or (remote is not None and remote.has(file))):
                raise NoFilesError(f"{file} does not exist.")
        #: Which files had a ``.ds.index`` at open: one that disappears later is an error, not one document.
        self._indexed = _checked_indexes(files)  # before any index is read: a FIFO would block the read
        parts = [self._part(file, dtype) for file in files]
        self._set_parts(parts)
        self.shards  # noqa: B018 - map now: what was validated is what is read

    def _data_size(self, file: Path, dtype: npt.DTypeLike | None) -> int:
        """The size of ``file``; for a dataset opened by URL, from its records, else its index and metadata (the
        download is checked against it), else the store's."""
        if self._remote is None:
            return file.stat().st_size
        last, token_size = _last_end(file), _metadata_token_size(file)
        if token_size is None and dtype is not None:
            token_size = resolve_dtype(dtype, None, format="datatrove", allowed=("uint16", "uint32")).itemsize
        return self._remote.size(file, last * token_size if last is not None and token_size is not None else None)

    def _part(self, file: Path, dtype: npt.DTypeLike | None) -> Part:
        size = self._data_size(file, dtype)
        recorded = _metadata_token_size(file) or _index_token_size(file, size)
        if dtype is not None:
            chosen = resolve_dtype(dtype, None, format="datatrove", allowed=("uint16", "uint32"))
            if recorded is not None and recorded != chosen.itemsize:
                raise DTypeError(
                    f"{file}: dtype {chosen.name} was given, but the files record a token size of {recorded} bytes."
                )
        elif recorded is not None:
            chosen = _TOKEN_DTYPES[recorded]
        elif size == 0:
            chosen = _TOKEN_DTYPES[2]
        else:
            raise DTypeError(
                f"{file}: neither {file.name}{METADATA} nor a matching {file.name}{INDEX} records the token size; "
                f"pass {option('dtype', repr('uint16'))} or {option('dtype', repr('uint32'))}."
            )
        if size % chosen.itemsize:
            raise SizeMismatchError(
                f"{file}: {size:,} bytes is not a whole number of {chosen.name} tokens: the file is truncated."
            )
        index = Path(os.fspath(file) + INDEX)
        if index.is_file() and index.stat().st_size % 8:
            raise SizeMismatchError(
                f"{index}: {index.stat().st_size:,} bytes is not a whole number of uint64 document ends: truncated."
            )
        return Part(file, 0, size // chosen.itemsize, chosen)

    def _part_offsets(self, index: int) -> np.ndarray:
        part = self._parts[index]
        index_path = Path(os.fspath(part.path) + INDEX)
        if not self._indexed[index]:
            return np.array([0, part.tokens], dtype=np.int64)
        if not index_path.is_file():
            raise NoFilesError(f"{index_path} was there when the reader opened and is gone; open the dataset again.")
        self._check_pin(part.path)
        ends = np.fromfile(index_path, dtype="<u8")
        return checked_offsets(np.concatenate([[0], ends.astype(np.int64)]), part.tokens, str(index_path), "ends")

    @cached_property
    def loss(self) -> ConcatenatedArray | np.ndarray | None:
        """The ``.ds.loss`` bytes of every token (uint8, 1 = counted in the loss), or None without loss files."""
        paths = [Path(os.fspath(p.path) + LOSS) for p in self._parts]
        if not all(p.is_file() or (self._remote is not None and self._remote.has(p)) for p in paths):
            return None
        maps = []
        for part, path in zip(self._parts, paths):
            self._fetched(path)
            if path.stat().st_size != part.tokens:
                raise SizeMismatchError(
                    f"{path}: {path.stat().st_size:,} loss bytes for {part.tokens:,} tokens in {part.path.name}."
                )
            maps.append(self._map(path, np.dtype("u1")) if part.tokens else np.zeros(0, dtype="u1"))
        return maps[0] if len(maps) == 1 else ConcatenatedArray(maps)

    @property
    def loss_masks(self) -> ConcatenatedArray | np.ndarray | None:
        """The ``.ds.loss`` bytes of every token (see :attr:`tokformats.TokenReader.loss_masks`)."""
        return self.loss

    def _cached_maps(self) -> tuple[str, ...]:
        return (*super()._cached_maps(), "loss")

    @property
    def metadata(self) -> dict[str, Any]:
        def tokenizer(part: Part) -> str | None:
            path = Path(os.fspath(part.path) + METADATA)
            return read_file(path)[:4096].decode("utf-8", "replace").split("\n", 1)[0] if path.is_file() else None

        return {
            "token_size": self.dtype.itemsize,
            "files": [
                {"path": str(p.path), "tokens": p.tokens, "tokenizer": tokenizer(p)} for p in self._parts
            ],
            "loss": self.loss is not None,
        }

    def _problems(self) -> list[Any]:
        found = []
        for part in self._parts:
            metadata = Path(os.fspath(part.path) + METADATA)
            if not metadata.is_file():
                continue
            lines = read_file(metadata)[:4096].decode("utf-8", "replace").split("\n")
            if len(lines) < 2 or lines[1].strip() != str(part.tokens):
                recorded = lines[1] if len(lines) > 1 else "nothing"
                found.append(Problem(str(metadata), "token count", f"is {recorded!r}, the file holds {part.tokens:,}"))
        return found


class Writer(TokenWriter):
    """Writes ``NAME.ds``, ``NAME.ds.index`` and ``NAME.ds.metadata`` byte-identical to datatrove's
    ``TokenizedFile`` (``DocumentTokenizer`` with ``shuffle_documents=False`` and its default final metadata); with
    loss masks (``write(doc, loss_mask=...)``), ``NAME.ds.loss`` too, one byte (0 or 1) per token, as
    ``DocumentTokenizer(save_loss_metadata=True)`` writes it.

    Args:
        path: the ``.ds`` file (``.ds`` is appended when missing).
        vocab_size: uint16 up to 65,536 ids, else uint32 (datatrove's rule).
        dtype: ``uint16`` or ``uint32`` instead.
        tokenizer_name: the tokenizer name or path recorded in ``.ds.metadata`` (datatrove records the one it ran).
        save_index: write ``.ds.index`` (datatrove's default; without it the file is one document to readers).
        overwrite: replace existing files.
    """

    format = "datatrove"
    tokenizer_name_option = "tokenizer_name"  # DocumentTokenizer records its tokenizer_name_or_path
    stores_loss_mask = True

    @classmethod
    def output_path(cls, output: PathLike, key: str, split: str | None, several_keys: bool) -> Path:
        return Path(f"{super().output_path(output, key, split, several_keys)}.ds")

    @classmethod
    def existing_outputs(cls, path: PathLike) -> list[Path]:
        data = _ds_path(path)
        siblings = (INDEX, METADATA, LOSS)
        return [p for p in (data, *(Path(os.fspath(data) + suffix) for suffix in siblings)) if p.exists()]

    def __init__(
        self,
        path: PathLike,
        *,
        vocab_size: int | None = None,
        dtype: npt.DTypeLike | None = None,
        tokenizer_name: str | None = None,
        save_index: bool = True,
        overwrite: bool = False,
    ) -> None:
        chosen = resolve_dtype(dtype, vocab_size, format=self.format, allowed=("uint16", "uint32"))
        super().__init__(_ds_path(path), dtype=chosen, vocab_size=vocab_size, overwrite=overwrite)
        self.tokenizer_name = tokenizer_name
        self.save_index = save_index
        self._ends: list[np.ndarray] = []
        self._tokens = self._files.create(self.path)
        self._loss: Any = None

    def _write_tokens(self, flat: np.ndarray, lengths: np.ndarray) -> None:
        self._tokens.write(np.ascontiguousarray(flat).data)
        self._ends.append(self.num_tokens + np.cumsum(lengths, dtype=np.int64))

    def _write_masked(self, flat: np.ndarray, lengths: np.ndarray, mask: np.ndarray) -> None:
        if self._loss is None:  # the first write carries a mask: every write will
            self._loss = self._files.create(Path(os.fspath(self.path) + LOSS))
        self._write_tokens(flat, lengths)
        self._loss.write(np.ascontiguousarray(mask, dtype=np.uint8).data)

    def _finish(self) -> None:
        if self.save_index:
            index = self._files.create(Path(os.fspath(self.path) + INDEX))
            for ends in self._ends:
                index.write(ends.astype("<u8").tobytes())
        token_size = self.dtype.itemsize
        # datatrove writes "Unknown Tokenizer|SIZE|SIZE" when it has no name, which its own DocumentTokenizerMerger
        # cannot split (one "|" expected): the name alone is written instead.
        name = self.tokenizer_name or "Unknown Tokenizer"
        text = "\n".join([f"{name}|{token_size}", str(self.num_tokens), metric(self.num_tokens, unit="T")])
        self._files.create(Path(os.fspath(self.path) + METADATA)).write(text.encode("utf-8"))


def _ds_path(path: PathLike) -> Path:
    """``path`` ending in ``.ds``."""
    text = os.fspath(path)
    return Path(text if text.endswith(".ds") else text + ".ds")
