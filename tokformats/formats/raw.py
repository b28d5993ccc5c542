"""Raw token streams: token ids back to back, no header (nanoGPT ``train.bin``, oxidizr, dolma).

Layout::

    offset 0: token 0, token 1, ... in the stream's dtype, little-endian; nothing else.

The file records neither its dtype nor document boundaries, so the reader must be told the dtype
(``dtype=``; it refuses to guess and instead describes what the bytes look like under each
candidate) and, optionally, a delimiter: ``eos=ID`` (each document ends with it, the nanoGPT /
oxidizr convention) or ``bos=ID`` (each document starts with it, the llm.c convention).
The file size must be a multiple of the itemsize.

The writer picks uint16 when ``vocab_size <= 65,536``, else uint32, and can append ``eos`` after
each document.
"""

from __future__ import annotations

import warnings
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.documents import add_delimiter, split_offsets
from ..core.dtypes import check_id, parse_dtype, resolve_dtype
from ..core.protocol import PathLike, TokenReader, TokenWriter, checked_delimiters
from ..core.registry import FormatDescriptor, Probe
from ..errors import DataWarning, DTypeError, NoFilesError, SizeMismatchError, option

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = ["Reader", "Writer", "describe_headerless", "undetected_hint", "CANDIDATE_DTYPES"]

#: This format's entry in :data:`tokformats.formats` (the registry finds it here).
DESCRIPTOR = FormatDescriptor(
    "raw", "headerless token stream (dtype must be given)", (".bin",), __name__, detectable=False, order=1000
)

#: The dtypes headerless token files are written in, in the order we describe them.
CANDIDATE_DTYPES = ("uint16", "uint32", "int32")
_SAMPLE_BYTES = 1 << 20
_PREVIEW = 8


def _guess(sample: bytes, size: int) -> tuple[str, str | None]:
    """A hint (never used to read) about which candidate dtype the bytes look like, and that dtype if one is
    probable."""
    if size % 2:
        return f"no candidate dtype divides the file size ({size:,} bytes is odd): it is truncated or not ids", None
    if size % 4:
        return "only uint16 divides the file size, so it is probably uint16", "uint16"
    words = np.frombuffer(sample[: len(sample) // 4 * 4], dtype="<u4")
    if words.size == 0:
        return "the file is empty", None
    too_large = float(np.mean(words >= 1 << 20))
    if too_large > 0.01:
        return (
            f"as uint32, {too_large:.0%} of values exceed 2**20 (no tokenizer is that large): probably uint16",
            "uint16",
        )
    halves = np.frombuffer(sample[: len(sample) // 4 * 4], dtype="<u2")
    if halves[1::2].any():
        return "the values read as uint32 are plausible ids; uint32/int32 is likely, but uint16 is possible", "uint32"
    return "as uint16, every second value is 0: probably uint32 (or int32, identical for ids below 2**31)", "uint32"


def implausible(sample: bytes, dtype: np.dtype) -> str | None:
    """Why ids read from ``sample`` as ``dtype`` look wrong (a dtype that only happens to divide the file size),
    or None. Only patterns no real token stream shows count: ids past any vocabulary, or every second id 0."""
    usable = len(sample) // 4 * 4
    if usable < 64:
        return None
    if dtype.itemsize == 4:
        values = np.frombuffer(sample[:usable], dtype=dtype)
        huge = float(np.mean((values >= 1 << 20) | (values < 0)))
        if huge > 0.5:
            return (
                f"read as {dtype.name}, {huge:.0%} of the first ids are negative or above 2**20 (no tokenizer is that "
                f"large); the file is probably uint16: pass {option('dtype', repr('uint16'))}"
            )
    elif dtype.itemsize == 2:
        halves = np.frombuffer(sample[:usable], dtype=dtype)
        if not halves[1::2].any() and halves[0::2].any():
            return (
                f"read as {dtype.name}, every second id is 0; the file is probably uint32 (or int32): "
                f"pass {option('dtype', repr('uint32'))}"
            )
    return None


def describe_headerless(path: Path) -> str:
    """Explain how to open ``path`` as a raw stream, with what its bytes look like under each candidate dtype."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            sample = handle.read(_SAMPLE_BYTES)
    except OSError as exc:
        return f"It cannot be read ({exc})."
    lines = [
        f"A headerless token stream records no dtype: pass {option('format', repr('raw'))} and "
        f"{option('dtype', 'DTYPE')} "
        f"(the file has {size:,} bytes). Its bytes read as:"
    ]
    for name in CANDIDATE_DTYPES:
        dt = np.dtype(name).newbyteorder("<")
        if size % dt.itemsize:
            lines.append(f"  {name}: impossible, {size:,} bytes is not a multiple of {dt.itemsize}")
            continue
        values = np.frombuffer(sample[: len(sample) // dt.itemsize * dt.itemsize], dtype=dt)
        head = values[:_PREVIEW].tolist()
        top = int(values.max()) if values.size else None
        lines.append(f"  {name}: {size // dt.itemsize:,} tokens, starting {head}, largest in the first MiB {top}")
    hint, probable = _guess(sample, size)
    if probable is not None:
        dtype = option("dtype", repr(probable))
        hint += f"; open it with {option('format', repr('raw'))}{' ' if dtype.startswith('--') else ', '}{dtype}"
    lines.append(f"Hint: {hint}.")
    return "\n".join(lines)


def undetected_hint(probe: Probe) -> str | None:
    """For a file no format recognises: how to open it as a raw stream, with its bytes under each dtype."""
    return describe_headerless(probe.path) if probe.is_file else None


class Reader(TokenReader):
    """A headerless token stream, memory-mapped.

    Args:
        path: the ``.bin`` file.
        dtype: the token dtype (required: the file does not record it).
        eos: split documents after each occurrence of this id (the id stays in the document).
        bos: split documents before each occurrence of this id.
    """

    format = "raw"

    def __init__(
        self, path: PathLike, dtype: npt.DTypeLike | None = None, *, eos: int | None = None, bos: int | None = None
    ) -> None:
        super().__init__(path, dtype=dtype, eos=eos, bos=bos)
        self._path = Path(path)
        if not self._path.is_file():
            raise NoFilesError(f"{self._path} does not exist or is not a file.")
        if dtype is None:
            raise DTypeError(f"{self._path}: a dtype is required for raw streams. " + describe_headerless(self._path))
        self._dtype = parse_dtype(dtype)
        self.eos, self.bos = checked_delimiters(self._path, self._dtype, eos, bos)
        self._size = self._path.stat().st_size
        if self._size % self._dtype.itemsize:
            raise SizeMismatchError(
                f"{self._path}: the file size ({self._size:,} bytes) is not a multiple of the {self._dtype.name} "
                f"itemsize ({self._dtype.itemsize}): the file is truncated or its dtype is not {self._dtype.name}."
            )
        self._pin(self._path)
        self.tokens  # noqa: B018 - map now: what was validated is what is read
        problem = implausible(self.tokens.view(np.uint8)[: 1 << 16].tobytes(), self._dtype)
        if problem:
            self.warnings.append(f"{self._path}: {problem}.")
            warnings.warn(DataWarning(self.warnings[-1]), stacklevel=3)

    @property
    def path(self) -> Path:
        return self._path

    @cached_property
    def tokens(self) -> np.ndarray:
        """The whole stream as a read-only ``np.memmap`` (an empty array for an empty file)."""
        return self._map(self._path, self._dtype)

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def num_tokens(self) -> int:
        return self._size // self._dtype.itemsize

    def _offsets(self) -> np.ndarray:
        return split_offsets(self.tokens, eos=self.eos, bos=self.bos)

    @property
    def metadata(self) -> dict[str, Any]:
        return {"eos": self.eos, "bos": self.bos, "bytes": self._size}


class Writer(TokenWriter):
    """Writes a headerless token stream.

    Args:
        path: the output file.
        vocab_size: ids must be below it; uint16 up to 65,536 ids, else uint32.
        dtype: explicit dtype instead (for example ``int32`` for legacy llm.c files).
        eos: appended after every document when given.
        overwrite: replace an existing file.
    """

    format = "raw"
    boundaries = "eos"  # nanoGPT and oxidizr streams end each document with EOS
    stores_dtype = False  # a headerless stream: its reader must be told

    @classmethod
    def output_path(cls, output: PathLike, key: str, split: str | None, several_keys: bool) -> Path:
        return Path(f"{super().output_path(output, key, split, several_keys)}.bin")

    def __init__(
        self,
        path: PathLike,
        *,
        vocab_size: int | None = None,
        dtype: npt.DTypeLike | None = None,
        eos: int | None = None,
        overwrite: bool = False,
    ) -> None:
        chosen = resolve_dtype(dtype, vocab_size, format=self.format)
        super().__init__(path, dtype=chosen, vocab_size=vocab_size, overwrite=overwrite)
        self.eos = check_id(eos, chosen, vocab_size, "eos")
        self._file = self._files.create(self.path)

    def read_with(self) -> dict[str, Any]:
        """``format``, ``dtype`` and the delimiter: a headerless stream records none of them."""
        return {"format": "raw", "dtype": self.dtype.name, **super().read_with()}

    def _write_tokens(self, flat: np.ndarray, lengths: np.ndarray) -> None:
        if self.eos is not None:
            flat, _ = add_delimiter(flat, lengths, self.eos)
        self._file.write(np.ascontiguousarray(flat).data)

    def _finish(self) -> None:
        """Nothing to patch: a raw stream is complete once its tokens are written."""
