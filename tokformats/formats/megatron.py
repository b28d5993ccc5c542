"""Megatron-LM indexed datasets: ``PREFIX.bin`` (tokens) + ``PREFIX.idx`` (index).

``.idx`` layout, little-endian, no padding (so the arrays are unaligned; NumPy handles that)::

    offset 0          9 bytes  magic b"MMIDIDX\\x00\\x00"
    offset 9          u64      version, always 1
    offset 17         u8       dtype code of the .bin tokens (DTYPE_CODES)
    offset 18         u64      N: number of sequences
    offset 26         u64      M: entries in document_indices (documents + 1)
    offset 34         N int32  sequence_lengths (tokens)
    offset 34+4N      N int64  sequence_pointers (byte offset of each sequence in .bin)
    offset 34+12N     M int64  document_indices: [0, end_0, ..., end_{D-1}], non-decreasing, last == N
    offset 34+12N+8M  N int8   sequence_modes, multimodal files only (told apart by the file size)

``.bin`` is every sequence's tokens back to back. A *sequence* is Megatron's unit (``IndexedDataset[i]``);
a *document* is a run of sequences (several with ``--split-sentences``). tokformats documents are
Megatron documents; ``Reader.sequences`` gives Megatron's view.

Loss masks live in a sibling indexed dataset, ``PREFIX_loss_mask.bin`` + ``PREFIX_loss_mask.idx`` (LOSS_MASK_SUFFIX):
dtype code 1 (uint8), one byte (0 or 1) per token, with the same sequence lengths and document indices, so that
megatron-core opens it as an ``IndexedDataset`` and ``mask_dataset[i]`` lines up with ``dataset[i]``.

Writers match megatron-core's ``IndexedDatasetBuilder`` byte for byte, with three differences that are
fixes: ids that do not fit the dtype are refused instead of wrapped, the index is kept in NumPy arrays
(not Python lists) with pointers summed in int64, and both files appear atomically (``.idx`` last).
"""

from __future__ import annotations

import mmap
import os
import shlex
import struct
import weakref
from collections.abc import Iterable, Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from ..core.arrays import GrowableArray
from ..core.documents import offsets_from_lengths
from ..core.dtypes import as_token_array, check_lengths, little_endian, resolve_dtype
from ..core.protocol import PathLike, TokenReader, TokenWriter, checked_position
from ..core.registry import FormatDescriptor, Probe
from ..errors import ConfigError, DTypeError, FormatError, HeaderError, NoFilesError, SizeMismatchError
from ..fs.atomic import AtomicFiles, naming_output
from ..fs.filecopy import append_file, append_open_file
from ..fs.paths import expand_path_texts, is_pattern

if TYPE_CHECKING:
    import numpy.typing as npt

    from ..core.files import LazyFiles

__all__ = [
    "Reader",
    "Writer",
    "Sequences",
    "merge",
    "detect",
    "resolve_prefix",
    "optimal_dtype",
    "MAGIC",
    "VERSION",
    "DTYPE_CODES",
    "HEADER",
    "LOSS_MASK_SUFFIX",
    "loss_mask_prefix",
]

#: This format's entry in :data:`tokformats.formats` (the registry finds it here).
DESCRIPTOR = FormatDescriptor(
    "megatron",
    "Megatron-LM indexed dataset (PREFIX.bin + PREFIX.idx)",
    (".bin", ".idx"),
    __name__,
    order=30,
    default=True,  # what tokenize writes unless told: the format most pretraining stacks read
)

MAGIC = b"MMIDIDX\x00\x00"
#: Sequences per block whose pointers are checked together on first access (``1 << _BLOCK_BITS``): one block's
#: pointers and lengths (48 KiB) lie within the pages a first read faults in.
_BLOCK_BITS = 12
_UNSEEN, _SEEN, _CHECKED, _LYING = 0, 1, 2, 3
VERSION = 1
#: ``<9s`` magic, ``<Q`` version, ``<B`` dtype code, ``<Q`` N, ``<Q`` M: 34 bytes.
HEADER = struct.Struct("<9sQBQQ")
#: Megatron's dtype codes (megatron.core.datasets.indexed_dataset.DType).
DTYPE_CODES: dict[int, np.dtype] = {
    1: np.dtype("u1"),
    2: np.dtype("i1"),
    3: np.dtype("<i2"),
    4: np.dtype("<i4"),
    5: np.dtype("<i8"),
    6: np.dtype("<f8"),
    7: np.dtype("<f4"),
    8: np.dtype("<u2"),
}
_CODE_OF = {dtype: code for code, dtype in DTYPE_CODES.items()}
#: Codes fairseq used that Megatron rejects.
_FAIRSEQ_CODES = {9: "uint32", 10: "uint64"}
_MAX_SEQUENCE = np.iinfo(np.int32).max
#: Appended to a dataset's prefix to name the sibling indexed dataset holding its loss masks.
LOSS_MASK_SUFFIX = "_loss_mask"


def loss_mask_prefix(prefix: PathLike) -> Path:
    """The prefix of the sibling dataset holding ``prefix``'s loss masks (``PREFIX_loss_mask``)."""
    return Path(f"{resolve_prefix(prefix)}{LOSS_MASK_SUFFIX}")


def optimal_dtype(vocab_size: int) -> np.dtype:
    """Megatron's ``DType.optimal_dtype``: uint16 when ``vocab_size < 65,500``, else int32 (not uint32)."""
    return np.dtype("<u2") if vocab_size < 65500 else np.dtype("<i4")


def resolve_prefix(path: PathLike) -> Path:
    """The dataset prefix of a prefix, a ``.bin`` or an ``.idx`` path."""
    text = str(path)
    for suffix in (".idx", ".bin"):
        if text.endswith(suffix) and (Path(text[: -len(suffix)] + ".idx").exists() or not Path(text).exists()):
            return Path(text[: -len(suffix)])
    return Path(text)


def one_prefix(path: Any) -> Path:
    """The one dataset ``path`` names: a prefix or either of its files, a list of those naming one dataset
    (``[PREFIX]``, ``[PREFIX.bin, PREFIX.idx]``), or a glob whose matches are one dataset's files (``data/owt.*``).

    Raises:
        NoFilesError: a glob that matches nothing, or an empty list.
        ConfigError: it names several datasets; Megatron opens one (the message says how to merge them).
    """
    if isinstance(path, (str, os.PathLike)) and (
        not is_pattern(os.fspath(path)) or os.path.exists(f"{os.fspath(path)}.idx")  # a prefix spelling [, * or ?
    ):
        return resolve_prefix(path)
    prefixes = list(dict.fromkeys(resolve_prefix(text) for text in expand_path_texts(path)))
    if len(prefixes) == 1:
        return prefixes[0]
    raise ConfigError(_several_datasets(path, prefixes))


def _several_datasets(path: Any, prefixes: list[Path]) -> str:
    """Why ``path``, naming the datasets ``prefixes``, does not open, and the merge that makes them one (as a command
    and in Python: both run as printed)."""
    given = repr(os.fspath(path)) if isinstance(path, (str, os.PathLike)) else "the list of paths"
    shown = ", ".join(map(str, prefixes[:3])) + (f" and {len(prefixes) - 3} more" if len(prefixes) > 3 else "")
    merged = str(prefixes[0].parent / "merged")
    command = shlex.join(["tokformats", "merge", *map(str, prefixes), "-o", merged])
    call = f"tokformats.megatron.merge({[str(p) for p in prefixes]!r}, {merged!r})"
    return (
        f"a Megatron dataset is opened by one PREFIX (or its .bin or .idx); {given} names {len(prefixes)} datasets: "
        f"{shown}. To read them as one, merge them first: {command} (in Python, {call})."
    )


def detect(probe: Probe) -> bool:
    """True when the path (a prefix, ``.bin`` or ``.idx``) has an ``.idx`` starting with Megatron's magic."""
    return probe.sibling(str(resolve_prefix(probe.path)) + ".idx").head(len(MAGIC)) == MAGIC


def undetected_hint(probe: Probe) -> str | None:
    """For a ``.bin`` no format recognises: name the Megatron index it lacks, if that is what is missing."""
    if not probe.is_file or probe.path.suffix != ".bin":
        return None
    index = probe.path.with_suffix(".idx")
    if probe.sibling(str(index)).exists:
        return None
    return f"If it is the data of a Megatron dataset, its index {index} is missing."


class Sequences(Sequence[np.ndarray]):
    """Megatron's own unit: the sequences of an indexed dataset (``IndexedDataset[i]``)."""

    def __init__(self, reader: Reader) -> None:
        self._reader = reader

    def __len__(self) -> int:
        return self._reader._sequences

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, slice):
            return [self[i] for i in range(*key.indices(len(self)))]
        return self.get(self._index(key))

    def _index(self, key: Any) -> int:
        return checked_position(int(key), len(self), "sequence", "sequences", f" in {self._reader.path}")

    def get(self, index: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens ``offset .. offset + length`` of sequence ``index`` (``IndexedDataset.get``, bounds-checked)."""
        index = self._index(index)
        size = self._reader._index[0].item(index)
        if length is None:
            length = size - offset
        if offset < 0 or length < 0 or offset + length > size:
            raise IndexError(
                f"offset {offset} and length {length} fall outside sequence {index}, which has {size} tokens"
            )
        reader = self._reader
        start = reader._span(index, index + 1, f"sequence {index}")[0] + offset
        if reader._random_index is not None:
            reader._end_random_index()
        return reader._view[start : start + length]

    @property
    def lengths(self) -> np.ndarray:
        """Tokens per sequence (int32, as stored)."""
        return self._reader.sequence_lengths


#: Uploaded last by ``publish``: the ``.idx`` is what readers key on.
PUBLISHED_LAST = ("*.idx",)


def remote_companions(name: str) -> list[tuple[str, bool]]:
    """The files fetched with ``name`` from a URL: a prefix's ``.idx`` and ``.bin`` (and its ``PREFIX_loss_mask``
    files when there are any), a ``.bin``'s ``.idx`` (when there is one: an llm.c ``.bin`` has none), and the
    loss-mask files of the prefix of a ``.bin`` or ``.idx``."""
    for suffix, other in ((".bin", ".idx"), (".idx", ".bin")):
        if name.endswith(suffix):
            prefix = name[: -len(suffix)]
            masks = f"{prefix}{LOSS_MASK_SUFFIX}"
            extra = [] if prefix.endswith(LOSS_MASK_SUFFIX) else [(f"{masks}.idx", False), (f"{masks}.bin", False)]
            return [(prefix + other, suffix == ".idx"), *extra]
    if "." in Path(name).name:
        return []
    masks = f"{name}{LOSS_MASK_SUFFIX}"  # a prefix's loss masks, when the store has them
    return [(f"{name}.idx", False), (f"{name}.bin", False), (f"{masks}.idx", False), (f"{masks}.bin", False)]


def _advised(mapped: np.ndarray, advice: int) -> mmap.mmap | None:
    """Give the kernel ``advice`` on the pages of ``mapped`` (an ``np.memmap`` of ``core.arrays.map_file``);
    returns its ``mmap`` (None where there is none: an empty file, or a platform without ``madvise``)."""
    handle = getattr(mapped, "_mmap", None)
    if not isinstance(handle, mmap.mmap) or not hasattr(handle, "madvise"):
        return None
    handle.madvise(advice)
    return handle


def remote_lazy(folder: Path, names: list[str]) -> bool:
    """Whether a dataset opened by URL can fetch its ``.bin`` on first use: its ``.idx`` (fetched at open) gives
    every sequence and document, so ``len()``, ``lengths`` and a training sample index need no token."""
    return any(n.endswith(".idx") and n[:-4] + ".bin" in names and (folder / n).is_file() for n in names)


class Reader(TokenReader):
    """A Megatron indexed dataset, memory-mapped; documents are Megatron documents.

    Args:
        path: the prefix (``data/owt_text_document``), or either of its two files.
        multimodal: force the presence or absence of ``sequence_modes``; by default told from the file size.
        remote: set by ``tokformats.open(URL)``: the ``.bin`` is fetched when a token is first read.
    """

    format = "megatron"
    #: The ``.idx`` map made at open, advised ``MADV_RANDOM`` (each fault reads its page, not megabytes around it)
    #: until the first read or a use of the index whole (:meth:`_end_random_index`); a weak reference.
    _random_index: weakref.ref[mmap.mmap] | None = None

    def __init__(self, path: PathLike, *, multimodal: bool | None = None, remote: LazyFiles | None = None) -> None:
        super().__init__(path, multimodal=multimodal, remote=remote)
        self._remote = remote
        self.prefix = one_prefix(path)
        self.idx_path = Path(f"{self.prefix}.idx")
        self.bin_path = Path(f"{self.prefix}.bin")
        # Each local file is opened once: pinned from the fstat of the descriptor that is mapped (no stat beside it).
        index = self._map_at_open(self.idx_path)
        data = self._map_at_open(self.bin_path) if remote is None else None
        if remote is not None and not (self.bin_path.is_file() or remote.has(self.bin_path)):
            raise NoFilesError(
                f"{self.bin_path} does not exist; a Megatron dataset needs both PREFIX.bin and PREFIX.idx."
            )
        advised = _advised(index, mmap.MADV_RANDOM)  # before the header is read from it: single pages until then
        self._random_index = weakref.ref(advised) if advised is not None else None  # never keeps it mapped
        self.__dict__["_index_at_open"] = index
        self._read_index(multimodal, index.view(np.ndarray))
        if data is not None:  # what was validated is what is read: the .bin mapped at open, as its tokens
            self.__dict__["tokens"] = data.view(self._dtype)
        self.tokens  # noqa: B018 - by URL: the .bin's lazy array, made now

    def _map_at_open(self, path: Path) -> np.ndarray:
        """``path`` mapped whole as bytes and pinned as mapped; :class:`NoFilesError` when it is not a file."""
        try:
            return self._map(path, np.dtype(np.uint8), pin=True)
        except NoFilesError:
            what = "does not exist" if not os.path.exists(path) else "is not a regular file"
            raise NoFilesError(
                f"{path} {what}; a Megatron dataset needs both PREFIX.bin and PREFIX.idx as files."
            ) from None

    def _read_index(self, multimodal: bool | None, index: np.ndarray) -> None:
        path = self.idx_path
        size = len(index)
        head = index[: HEADER.size].tobytes()
        if len(head) < len(MAGIC) or head[: len(MAGIC)] != MAGIC:
            raise HeaderError(f"{path}: the magic is {head[:9]!r}; a Megatron index starts with {MAGIC!r}.")
        if len(head) < HEADER.size:
            raise SizeMismatchError(
                f"{path}: the header needs {HEADER.size} bytes (magic, version, dtype code, N, M), the file has {size}."
            )
        _, version, code, count, entries = HEADER.unpack(head)
        if version != VERSION:
            raise HeaderError(f"{path}: header field 'version' is {version}; Megatron writes and reads only 1.")
        if code not in DTYPE_CODES:
            extra = f" ({_FAIRSEQ_CODES[code]}, a fairseq-era code Megatron rejects)" if code in _FAIRSEQ_CODES else ""
            raise HeaderError(f"{path}: header field 'dtype code' is {code}{extra}; known codes are 1-8.")
        plain = HEADER.size + 12 * count + 8 * entries
        if size == plain:
            has_modes = False
        elif size == plain + count:
            has_modes = True
        elif size == 26 + 12 * count:
            raise HeaderError(
                f"{path} is a fairseq-era index (no document indices, {size:,} bytes = 26 + 12 * N); "
                "Megatron-LM and tokformats read only indexes with document indices. Re-build it with Megatron's tools."
            )
        else:
            raise SizeMismatchError(
                f"{path}: with N = {count:,} sequences and M = {entries:,} document indices the index should have "
                f"{plain:,} bytes ({plain + count:,} if multimodal), but it has {size:,}."
            )
        if multimodal is not None and multimodal != has_modes:
            state = "has" if has_modes else "has no"
            raise HeaderError(f"{path}: multimodal={multimodal} was asked for, but the index {state} sequence modes.")
        if entries < 1:
            raise HeaderError(f"{path}: header field 'M' is 0; document_indices always holds at least the leading 0.")
        self.dtype_code = code
        self._dtype = DTYPE_CODES[code]
        self._layout = (count, entries, has_modes)
        self._validate(count)

    @cached_property
    def _index(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        """The ``.idx`` arrays, mapped (again after :meth:`close`): lengths, pointers, document indices, modes."""
        count, entries, has_modes = self._layout
        mapped = self.__dict__.pop("_index_at_open", None)  # the map made at open: single pages until the first read
        if mapped is None:
            mapped = self._map(self.idx_path, np.dtype(np.uint8))
        # A plain ndarray view of the map: slicing an np.memmap runs Python code on every access.
        index = mapped.view(np.ndarray)
        start = HEADER.size
        lengths = index[start : start + 4 * count].view("<i4")
        start += 4 * count
        pointers = index[start : start + 8 * count].view("<i8")
        start += 8 * count
        document_indices = index[start : start + 8 * entries].view("<i8")
        start += 8 * entries
        modes = index[start : start + count].view("i1") if has_modes else None
        return lengths, pointers, document_indices, modes

    def _end_random_index(self) -> None:
        """The ``.idx`` map back to the kernel's read-ahead: the open and the first read are done (they faulted
        single pages: the header, the first entries, the entries read), and what follows may use the index whole."""
        advised = self._random_index() if self._random_index is not None else None
        self._random_index = None
        if advised is not None and not advised.closed:
            advised.madvise(mmap.MADV_NORMAL)

    @property
    def sequence_lengths(self) -> np.ndarray:
        """Tokens per sequence (int32, as stored)."""
        self._end_random_index()
        return self._index[0]

    @property
    def sequence_pointers(self) -> np.ndarray:
        """Byte offset of each sequence in the ``.bin`` (int64, as stored)."""
        self._end_random_index()
        return self._index[1]

    @property
    def document_indices(self) -> np.ndarray:
        """``[0, end_0, ..., N]``: where each document's sequences end (int64, as stored)."""
        self._end_random_index()
        return self._index[2]

    @property
    def sequence_modes(self) -> np.ndarray | None:
        """Each sequence's mode (int8), for multimodal indexes; None otherwise."""
        return self._index[3]

    def _cached_maps(self) -> tuple[str, ...]:
        return ("tokens", "_view", "_index", "_index_at_open", "_loss_reader")

    def _validate(self, count: int) -> None:
        """What opening checks, touching only the pages a first read touches anyway (megatron-core's open faults in
        no far page, and neither does this): the first pointer, and the ``.bin``'s size against the dtype. The
        document indices (starting at 0, ending at N) are checked where documents are used whole, and each access
        checks the ones it reads; the checks at the far end (the last sequence ending
        where the ``.bin`` ends) and the O(index) ones (indices in order, lengths non-negative and adding up to the
        ``.bin``, every pointer) run where they are used: a block of pointers is checked, vectorised, the first time
        an access lands in it (:meth:`_span`), the whole index where it is used whole (:attr:`lengths`,
        :meth:`problems`), so a lying index raises instead of serving other tokens."""
        path = self.idx_path
        itemsize = self._dtype.itemsize
        bin_size = self._pinned_size(self.bin_path) if self._remote is None else self._remote.size(self.bin_path)
        first_pointer = self._index[1].item(0) if count else 0  # the map made at open, read single pages
        if first_pointer != 0:
            raise SizeMismatchError(
                f"{path}: the first sequence must start at byte 0; sequence_pointers[0] is {first_pointer}."
            )
        if bin_size % itemsize or (not count and bin_size):
            raise SizeMismatchError(
                f"{self.bin_path}: the file has {bin_size:,} bytes, not a whole number of {self._dtype.name} tokens "
                f"{'' if count else 'for an index of no sequences '}(truncated, or not this index's data)."
            )
        self._num_tokens = bin_size // itemsize
        self._end_checked = False  # set by the first _check_end that passes
        self._sequences = count
        self._itemsize = itemsize
        #: One state per block of ``1 << _BLOCK_BITS`` sequences: _UNSEEN, _SEEN (read once, by the per-access
        #: check), _CHECKED (every pointer of it checked at once, :meth:`_check_block`), _LYING (that check failed).
        self._checked_blocks = bytearray((count >> _BLOCK_BITS) + 1)

    def _check_end(self) -> None:
        """The last sequence must end where the ``.bin`` ends (checked where the far end is used: the last block's
        first access, :attr:`sequence_offsets`, :attr:`num_tokens`, :meth:`problems`); once it passes, not again."""
        if self._end_checked:
            return
        count, itemsize = self._sequences, self._dtype.itemsize
        lengths, pointers = self.sequence_lengths, self.sequence_pointers
        end = int(pointers[-1]) + int(lengths[-1]) * itemsize if count else 0
        if end != self._num_tokens * itemsize or (count and lengths[-1] < 0):
            raise SizeMismatchError(
                f"{self.bin_path}: the index's sequences end at byte {end:,} ({end // itemsize:,} "
                f"{self._dtype.name} tokens), but the file has {self._num_tokens * itemsize:,} bytes (truncated, or "
                "not this index's data)."
            )
        self._end_checked = True

    def _check_block(self, block: int) -> bool:
        """Check, vectorised, every pointer of sequence block ``block`` (and the links to its neighbours): each
        follows from its predecessor's pointer and length, is a whole number of tokens, and the block lies in the
        ``.bin`` (the last block ends exactly where it ends). True (and remembered) when all hold; False leaves the
        block to the per-access check, which names the pointer that lies."""
        lengths, pointers, _, _ = self._index
        itemsize, count = self._dtype.itemsize, self._sequences
        low = max((block << _BLOCK_BITS) - 1, 0)
        high = min((block + 1) << _BLOCK_BITS, count)
        if high == count:
            self._check_end()
        where = np.asarray(pointers[low : high + 1], dtype=np.int64)
        sizes = np.asarray(lengths[low : high + 1], dtype=np.int64)
        ends = where[: high - low] + sizes[: high - low] * itemsize
        follows = bool((where[1:] == ends[: len(where) - 1]).all()) if len(where) > 1 else True
        tail = int(ends[-1]) == self._num_tokens * itemsize if high == count else int(ends[-1]) <= int(where[-1])
        sound = (
            follows
            and tail
            and bool((sizes >= 0).all())
            and not (where % itemsize).any()
            and int(where[0]) >= 0
            and int(ends.max(initial=0)) <= self._num_tokens * itemsize
        )
        self._checked_blocks[block] = _CHECKED if sound else _LYING
        return sound

    def _block_checked(self, block: int) -> bool:
        """Whether the pointers of ``block`` are all checked: the first access to a block checks what it touches
        (a single read costs no vectorised pass), the second checks the whole block once."""
        state = self._checked_blocks[block]
        if state == _CHECKED:
            return True
        if state == _UNSEEN:
            self._checked_blocks[block] = _SEEN
            return False
        return state == _SEEN and self._check_block(block)

    # -- the protocol ----------------------------------------------------------------------
    @property
    def path(self) -> Path:
        return self.prefix

    @property
    def files(self) -> list[Path]:
        return [self.bin_path, self.idx_path]

    @cached_property
    def tokens(self) -> np.ndarray:
        """Every sequence's tokens back to back (the ``.bin``), memory-mapped (for a dataset opened by URL, a
        :class:`~tokformats.arrays.LazyArray` that fetches the ``.bin`` on first use)."""
        return self._map_lazily(self.bin_path, self._dtype, 0, self._num_tokens)  # type: ignore[return-value]

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def num_tokens(self) -> int:
        """The tokens of the ``.bin``, once the index's far end agrees (its last sequence ends where the file does):
        a truncated ``.bin`` raises :class:`SizeMismatchError` here, never a count the index contradicts."""
        self._check_end()
        return self._num_tokens

    @cached_property
    def sequence_offsets(self) -> np.ndarray:
        """``N + 1`` int64 token offsets of sequences (from lengths, summed in int64), checked against the ``.bin``."""
        self._check_end()
        lengths = self.sequence_lengths
        if len(lengths) and lengths.min() < 0:  # a lying length could cancel another in the sum
            where = int(np.argmin(lengths))
            raise HeaderError(f"{self.idx_path}: sequence_lengths[{where}] is negative ({int(lengths[where])}).")
        offsets = offsets_from_lengths(lengths)
        if offsets[-1] != self._num_tokens:
            raise SizeMismatchError(
                f"{self.bin_path}: the index's sequence_lengths add up to {int(offsets[-1]):,} {self._dtype.name} "
                f"tokens, but the file holds {self._num_tokens:,}."
            )
        offsets.flags.writeable = False
        return offsets

    def _offsets(self) -> np.ndarray:
        di = self.document_indices
        if di[0] != 0 or di[-1] != self._sequences:
            raise HeaderError(
                f"{self.idx_path}: document_indices must start at 0 and end at N = {self._sequences:,}; "
                f"found {int(di[0])} and {int(di[-1])}."
            )
        if len(di) > 1 and not (di[1:] >= di[:-1]).all():
            where = int(np.argmax(di[1:] < di[:-1]))
            raise HeaderError(
                f"{self.idx_path}: document_indices decrease at entry {where + 1} ({int(di[where])} then "
                f"{int(di[where + 1])})."
            )
        offsets: np.ndarray = self.sequence_offsets[di]
        return offsets

    def __len__(self) -> int:
        count: int = self._layout[1] - 1  # M - 1, from the header: no array touched
        return count

    def _span(self, first: int, stop: int, what: str) -> tuple[int, int]:
        """Token range of sequences ``first..stop-1`` by their pointers, in O(sequences + 2): each pointer must
        follow from its predecessor's pointer and length, including the neighbours just outside the range, and the
        range must lie in the ``.bin``, so a lying pointer (or length) is caught by whichever access touches it
        instead of serving other tokens. (Several pointers lying in step can only be found by :meth:`problems`.)"""
        itemsize = self._dtype.itemsize
        lengths, pointers, _, _ = self._index
        if stop == first + 1 and self._block_checked(first >> _BLOCK_BITS):
            start = pointers.item(first) // itemsize  # its block's pointers are checked: two scalar reads
            return start, start + lengths.item(first)
        if stop == first + 1:  # one sequence of a block not checked whole: five scalar reads
            pointer, length = pointers.item(first), lengths.item(first)
            before = pointers.item(first - 1) + lengths.item(first - 1) * itemsize if first else 0
            after = pointers.item(stop) if stop < self._sequences else self._num_tokens * itemsize
            start = pointer // itemsize
            if (
                before == pointer
                and after == pointer + length * itemsize
                and pointer % itemsize == 0
                and 0 <= start <= start + length <= self._num_tokens
            ):
                return start, start + length
            # else: fall through, to name the pointer that lies
        if stop == self._sequences:
            self._check_end()  # the last sequence: it must end where the .bin ends
        low = first - 1 if first else 0
        high = stop + 1 if stop < self._sequences else stop
        pointers, lengths = pointers[low:high].tolist(), lengths[low:high].tolist()  # beats a dozen .item() calls
        for j in range(len(pointers) - 1):
            if pointers[j + 1] != pointers[j] + lengths[j] * itemsize:
                raise HeaderError(
                    f"{self.idx_path}: sequence_pointers[{low + j + 1}] is {pointers[j + 1]:,}, but sequence "
                    f"{low + j} ends at byte {pointers[j] + lengths[j] * itemsize:,}; the index is corrupt ({what})."
                )
        start = pointers[first - low] // itemsize
        end = pointers[stop - 1 - low] // itemsize + lengths[stop - 1 - low]
        if pointers[first - low] % itemsize or not 0 <= start <= end <= self._num_tokens:
            raise HeaderError(
                f"{self.idx_path}: {what} spans tokens {start:,}..{end:,} by its sequence_pointers, outside the "
                f"{self._num_tokens:,} tokens of {self.bin_path}."
            )
        return start, end

    def __getitem__(self, key: Any) -> Any:
        """One document by index, or a list of documents by slice (the protocol's); a plain ``int`` naming a
        document of one sequence in a checked block (:meth:`_check_block`) is served here without the general path."""
        if key.__class__ is int and 0 <= key < self._layout[1] - 1:
            lengths, pointers, document_indices, _ = self._index
            first = document_indices.item(key)
            one = document_indices.item(key + 1) == first + 1 and 0 <= first < self._sequences
            if one and self._checked_blocks[first >> _BLOCK_BITS] == _CHECKED:
                start = pointers.item(first) // self._itemsize
                return self._view[start : start + lengths.item(first)]
        return super().__getitem__(key)

    def _item(self, index: int) -> np.ndarray:
        # Like Megatron's reader, locate data through sequence_pointers: O(1) per document, no cumsum over the
        # whole index first; unlike it, check the pointers touched (verify() checks them all).
        document_indices = self._index[2]
        first, stop = document_indices.item(index), document_indices.item(index + 1)
        if first == stop:
            return self._view[0:0]
        if not 0 <= first < stop <= self._sequences:
            raise HeaderError(
                f"{self.idx_path}: document_indices[{index}..{index + 1}] are {first} and {stop}; they must increase "
                f"within the {self._sequences:,} sequences."
            )
        start, end = self._span(first, stop, f"document {index}")
        if self._random_index is not None:
            self._end_random_index()
        return self._view[start:end]

    def sample_units(self) -> tuple[np.ndarray, np.ndarray]:
        """Megatron's GPTDataset samples from *sequences* (``IndexedDataset[i]``), not documents."""
        return self.sequence_lengths, self.sequence_offsets

    @cached_property
    def _loss_reader(self) -> Reader | None:
        """The sibling ``PREFIX_loss_mask`` dataset, checked to line up with this one, or None without it."""
        prefix = loss_mask_prefix(self.prefix)
        index, data = Path(f"{prefix}.idx"), Path(f"{prefix}.bin")
        if self._remote is not None:  # by URL: asked of the store once, then both files fetched (and held)
            if not self._remote.has(index):
                return None
            self._fetched(index)
            self._fetched(data)
        if not index.is_file():
            return None
        masks = Reader(prefix)
        if masks.dtype != np.dtype("u1") or not np.array_equal(masks.sequence_lengths, self.sequence_lengths):
            raise SizeMismatchError(
                f"{prefix}.idx: a loss-mask dataset must be uint8 with the same sequence lengths as {self.idx_path}; "
                f"found {masks.dtype.name} with {len(masks.sequence_lengths):,} sequences ({masks.num_tokens:,} "
                f"tokens) for {len(self.sequence_lengths):,} ({self.num_tokens:,} tokens)."
            )
        if not np.array_equal(masks.document_indices, self.document_indices):
            raise SizeMismatchError(f"{prefix}.idx: its document_indices differ from {self.idx_path}'s.")
        return masks

    @property
    def loss_masks(self) -> np.ndarray | None:
        """The ``PREFIX_loss_mask.bin`` bytes of every token (see :attr:`tokformats.TokenReader.loss_masks`)."""
        masks = self._loss_reader
        return None if masks is None else masks.tokens

    def close(self) -> None:
        masks = self.__dict__.get("_loss_reader")
        if masks is not None:
            masks.close()
        super().close()

    @property
    def sequences(self) -> Sequences:
        """Megatron's unit: ``len(r.sequences)``, ``r.sequences[j]``, ``r.sequences.get(j, offset, length)``."""
        return Sequences(self)

    @property
    def multimodal(self) -> bool:
        """Whether the index stores per-sequence modes."""
        return self.sequence_modes is not None

    @property
    def metadata(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "dtype_code": self.dtype_code,
            "sequences": len(self.sequence_lengths),
            "documents": len(self.document_indices) - 1,
            "multimodal": self.multimodal,
        }

    def _summary(self) -> dict[str, Any]:
        summary = super()._summary()
        summary["sequences"] = len(self.sequence_lengths)
        return summary

    def _problems(self) -> list[Any]:
        """What opening does not check: every sequence pointer equals the running byte offset."""
        from ..core.reports import Problem

        try:
            self._offsets()  # document indices in order, lengths non-negative and adding up to the .bin
        except FormatError as error:
            return [Problem(str(self.idx_path), "index", str(error))]
        expected = self.sequence_offsets[:-1] * self._dtype.itemsize
        bad = np.flatnonzero(self.sequence_pointers != expected)
        if not bad.size:
            return []
        k = int(bad[0])
        return [
            Problem(
                str(self.idx_path),
                f"sequence_pointers[{k}]",
                f"is {int(self.sequence_pointers[k]):,}, but the sequences before it end at byte {int(expected[k]):,}; "
                f"{bad.size:,} pointers disagree",
            )
        ]


def _write_index(
    handle: BinaryIO,
    dtype: np.dtype,
    lengths: np.ndarray,
    document_indices: np.ndarray,
    modes: np.ndarray | None,
) -> None:
    """Write an ``.idx`` exactly as megatron-core's ``_IndexWriter`` does (pointers by int64 cumsum)."""
    pointers = np.zeros(len(lengths), dtype="<i8")
    if len(lengths) > 1:
        np.cumsum(lengths[:-1], dtype=np.int64, out=pointers[1:])
    pointers *= dtype.itemsize
    handle.write(HEADER.pack(MAGIC, VERSION, _CODE_OF[dtype], len(lengths), len(document_indices)))
    handle.write(np.ascontiguousarray(lengths, dtype="<i4").data)
    handle.write(pointers.data)
    handle.write(np.ascontiguousarray(document_indices, dtype="<i8").data)
    if modes is not None:
        handle.write(np.ascontiguousarray(modes, dtype="i1").data)


def _megatron_dtype(dtype: npt.DTypeLike | None, vocab_size: int | None) -> np.dtype:
    return resolve_dtype(dtype, vocab_size, format="megatron", allowed=list(DTYPE_CODES.values()), rule=optimal_dtype)


class Writer(TokenWriter):
    """Writes ``PREFIX.bin`` + ``PREFIX.idx`` byte-identical to megatron-core's ``IndexedDatasetBuilder``.

    Args:
        path: the prefix (a trailing ``.bin``/``.idx`` is stripped).
        vocab_size: ids must be below it; picks the dtype by Megatron's rule (uint16 below 65,500, else int32).
            Other tools use uint16 up to 65,536: pass ``dtype="uint16"`` to match them.
        dtype: explicit dtype (one of Megatron's codes).
        multimodal: store a mode (int8) per sequence.
        empty_documents: how ``write``/``write_batch`` store an empty document: ``"sequence"`` (one empty
            sequence, as ``add_item([])`` + ``end_document()``) or ``"none"`` (a document with no sequence, as
            ``preprocess_data.py``'s ``add_document`` writes it).
        overwrite: replace an existing dataset.

    ``write(ids)`` and ``write_batch(flat, lengths)`` add single-sequence documents; ``write_document``
    adds one document of several sequences; ``add_item`` / ``end_document`` mirror Megatron's builder.
    """

    format = "megatron"
    stores_loss_mask = True
    #: preprocess_data.py writes an empty document as a document without sequences.
    tokenize_options = {"empty_documents": "none"}  # noqa: RUF012
    delimit_empty_documents = False

    @classmethod
    def output_path(cls, output: PathLike, key: str, split: str | None, several_keys: bool) -> Path:
        """``OUTPUT[_SPLIT]_KEY_document``: the key always, as ``preprocess_data.py`` names its outputs."""
        return Path(f"{os.fspath(output)}{f'_{split}' if split else ''}_{key}_document")

    @classmethod
    def existing_outputs(cls, path: PathLike) -> list[Path]:
        prefix = resolve_prefix(path)
        masks = loss_mask_prefix(prefix)
        candidates = (f"{prefix}.idx", f"{prefix}.bin", f"{masks}.idx", f"{masks}.bin")
        return [Path(p) for p in candidates if Path(p).exists()]

    def __init__(
        self,
        path: PathLike,
        *,
        vocab_size: int | None = None,
        dtype: npt.DTypeLike | None = None,
        multimodal: bool = False,
        empty_documents: str = "sequence",
        overwrite: bool = False,
    ) -> None:
        chosen = _megatron_dtype(dtype, vocab_size)
        if empty_documents not in ("sequence", "none"):
            raise ValueError(f"empty_documents must be 'sequence' or 'none', not {empty_documents!r}")
        self.empty_documents = empty_documents
        prefix = resolve_prefix(path)
        super().__init__(prefix, dtype=chosen, vocab_size=vocab_size, overwrite=overwrite)
        self.multimodal = multimodal
        self.bin_path, self.idx_path = Path(f"{prefix}.bin"), Path(f"{prefix}.idx")
        self._files.check_destination(self.idx_path)
        self._bin = self._files.create(self.bin_path)
        self._lengths = GrowableArray(np.int32)
        self._document_indices = GrowableArray(np.int64)
        self._document_indices.append(0)
        self._modes = GrowableArray(np.int8) if multimodal else None
        self._open_sequences = 0  # sequences added by add_item since the last end_document
        self._mask_bin: BinaryIO | None = None  # PREFIX_loss_mask.bin, once a write carries a mask
        self._adopted: Path | None = None  # the file taken whole as the .bin (adopt_data_file): nothing follows it

    # -- Megatron's builder API ----------------------------------------------------------------
    def add_item(self, sequence: npt.ArrayLike, mode: int = 0) -> None:
        """Append one sequence to the current document (``IndexedDatasetBuilder.add_item``)."""
        self._check_open()
        what = f"{self.path}: a sequence of document {self.num_documents:,}"
        flat = self._validated(as_token_array(sequence, what=what), None)
        self._add_sequences(flat, np.array([len(flat)], dtype=np.int64), None if mode is None else [mode])
        self._mask_all(len(flat))
        self._open_sequences += 1

    def end_document(self) -> None:
        """Close the current document (``IndexedDatasetBuilder.end_document``)."""
        self._check_open()
        self._document_indices.append(len(self._lengths))
        self.num_documents += 1
        self._open_sequences = 0

    def write_document(self, sequences: Iterable[npt.ArrayLike], modes: Sequence[int] | None = None) -> None:
        """Append one document made of several sequences (``add_document``, e.g. ``--split-sentences``)."""
        self._check_open()
        what = f"{self.path}: a sequence of document {self.num_documents:,}"
        arrays = [as_token_array(s, what=what) for s in sequences]
        lengths = np.array([len(a) for a in arrays], dtype=np.int64)
        flat = np.concatenate(arrays) if arrays else np.zeros(0, dtype=self.dtype)
        flat = self._validated(flat, None)
        self._add_sequences(flat, lengths, modes)
        self._mask_all(len(flat))
        self.end_document()

    def _mask_all(self, count: int) -> None:
        """Builder-API sequences are trained on: ones in the loss-mask dataset, when this one has masks."""
        self.loss_masked = bool(self.loss_masked)
        if self._mask_bin is not None:
            self._mask_bin.write(np.ones(count, dtype=np.uint8).data)

    # -- the common protocol --------------------------------------------------------------------
    def adopt_data_file(self, path: PathLike, dtype: np.dtype, lengths: np.ndarray) -> bool:
        """Take ``path`` (the ids of single-sequence documents of ``lengths``, in ``dtype``) as the ``.bin``: the
        ``.bin`` is the bare id stream, so only the ``.idx`` is built (from ``lengths``, as ``write_batch`` builds
        it); see :meth:`TokenWriter.adopt_data_file`. Not for a multimodal dataset, one with loss masks, or one
        already written to."""
        self._check_open()
        if self.num_documents or len(self._lengths) or not self._takes_bare_ids(dtype):
            return False
        sizes = self._checked_file_lengths(lengths, str(path), os.stat(path).st_size)
        tokens = int(sizes.sum())
        try:
            self._files.adopt(self.bin_path, path)
        except OSError:  # no hard links here, or another file system: the caller writes the bytes
            return False
        self._index_documents(None, sizes)
        self._adopted = Path(path)
        self.loss_masked = False
        self.num_documents += len(sizes)
        self.num_tokens += tokens
        self.num_trained_tokens += tokens
        return True

    def append_data_file(self, source: BinaryIO, dtype: np.dtype, lengths: np.ndarray) -> bool:
        """Append the open file ``source`` (the ids of single-sequence documents of ``lengths``, in ``dtype``) to
        the ``.bin`` by a kernel copy, and its documents to the index (as ``write_batch`` would); see
        :meth:`TokenWriter.append_data_file`. Not for a multimodal dataset, one with loss masks, or one whose
        ``.bin`` was adopted."""
        self._check_open()
        if self._adopted is not None or not self._takes_bare_ids(dtype):
            return False
        name = str(getattr(source, "name", "the data file"))
        found = os.fstat(source.fileno()).st_size
        sizes = self._checked_file_lengths(lengths, name, found)
        tokens = int(sizes.sum())
        if len(sizes) and sizes.max() > _MAX_SEQUENCE:  # refused before any byte, as _add_sequences would
            self._add_sequences(None, sizes, None)
        start = self._bin.tell()
        try:
            append_open_file(source, self._bin, found, name=name)
        except OSError as error:
            # Nothing of this file stays in the .bin: the writer is as it was before the call.
            self._bin.truncate(start)
            self._bin.seek(start)
            if error.errno is None:  # the source shrank while it was copied
                raise FormatError(str(error)) from None
            raise naming_output(error, self.path) from None  # a full disk names the output, not the temporary
        self._index_documents(None, sizes)
        self.loss_masked = False
        self.num_documents += len(sizes)
        self.num_tokens += tokens
        self.num_trained_tokens += tokens
        return True

    def _takes_bare_ids(self, dtype: np.dtype) -> bool:
        """Whether a file of ids in ``dtype`` can become (part of) the ``.bin`` as it is: a single-modality
        dataset without loss masks, and ids of the ``.bin``'s width in little-endian order."""
        given = np.dtype(dtype)
        return (
            self._modes is None
            and not self.loss_masked
            and given.kind in "iu"
            and given.itemsize == self.dtype.itemsize
            and given.byteorder in ("=", "<", "|")
        )

    def _checked_file_lengths(self, lengths: np.ndarray, name: str, found: int) -> np.ndarray:
        """The document ``lengths`` of a file of ids of ``found`` bytes (named ``name``), checked against its
        size."""
        sizes = check_lengths(lengths, int(np.sum(lengths)), where=f"{self.path}: ")
        tokens = int(sizes.sum())
        if found != tokens * self.dtype.itemsize:
            raise FormatError(
                f"{name} has {found:,} bytes; {len(sizes):,} documents of {tokens:,} {self.dtype.name} ids take "
                f"{tokens * self.dtype.itemsize:,}."
            )
        return sizes

    def _write_tokens(self, flat: np.ndarray, lengths: np.ndarray) -> None:
        """Single-sequence documents (``write`` / ``write_batch``)."""
        self._index_documents(flat, lengths)

    def _index_documents(self, flat: np.ndarray | None, lengths: np.ndarray) -> None:
        """Single-sequence documents of ``lengths`` into the index, and their ids ``flat`` into the ``.bin`` (None:
        the ``.bin`` holds them already)."""
        if self.empty_documents == "none":
            nonempty = lengths > 0
            self._add_sequences(flat, lengths[nonempty], None)
            ends = len(self._lengths) - int(nonempty.sum()) + np.cumsum(nonempty, dtype=np.int64)
        else:
            self._add_sequences(flat, lengths, None)
            ends = len(self._lengths) - len(lengths) + np.arange(1, len(lengths) + 1, dtype=np.int64)
        self._document_indices.extend(ends)

    def _write_masked(self, flat: np.ndarray, lengths: np.ndarray, mask: np.ndarray) -> None:
        if self._mask_bin is None:  # the first write carries a mask: every write will
            self._files.check_destination(Path(f"{loss_mask_prefix(self.path)}.idx"))
            self._mask_bin = self._files.create(Path(f"{loss_mask_prefix(self.path)}.bin"))
        self._write_tokens(flat, lengths)
        self._mask_bin.write(np.ascontiguousarray(mask, dtype=np.uint8).data)

    def _add_sequences(self, flat: np.ndarray | None, lengths: np.ndarray, modes: Sequence[int] | None) -> None:
        if self._adopted is not None and flat is not None:
            raise FormatError(
                f"{self.path}: its .bin is {self._adopted}, taken whole (adopt_data_file); nothing can be written "
                "after it."
            )
        if len(lengths) and lengths.max() > _MAX_SEQUENCE:
            raise FormatError(
                f"{self.path}: a sequence of {int(lengths.max()):,} tokens does not fit Megatron's int32 "
                "sequence_lengths; split it into several sequences."
            )
        if self._modes is not None:
            chosen = np.zeros(len(lengths), np.int8) if modes is None else np.asarray(modes)
            if len(chosen) != len(lengths) or (len(chosen) and (chosen.min() < -128 or chosen.max() > 127)):
                raise FormatError(f"{self.path}: give one int8 mode per sequence ({len(lengths)}), found {modes!r}.")
            self._modes.extend(chosen)
        if flat is not None:
            self._bin.write(np.ascontiguousarray(flat).data)
        self._lengths.extend(lengths)

    def _finish(self) -> None:
        if self._open_sequences:
            self.end_document()  # Megatron would drop them from document_indices; we keep the document
        if self._mask_bin is not None:  # the masks' index before the tokens' .idx, which is renamed last
            masks = self._files.create(Path(f"{loss_mask_prefix(self.path)}.idx"))
            _write_index(masks, np.dtype("u1"), self._lengths.view(), self._document_indices.view(), None)
        handle = self._files.create(self.idx_path)  # created last, so renamed last: .idx means complete
        _write_index(
            handle,
            self.dtype,
            self._lengths.view(),
            self._document_indices.view(),
            None if self._modes is None else self._modes.view(),
        )


def merge(prefixes: Sequence[PathLike], output: PathLike, *, overwrite: bool = False) -> Reader:
    """Concatenate Megatron datasets into one, byte-identical to Megatron's ``add_index`` chain.

    The ``.bin`` files are copied by the operating system; memory is O(index). All inputs must share
    a dtype and be all multimodal or all not.

    Returns:
        A reader of the merged dataset.
    """
    if not prefixes:
        raise NoFilesError("merge needs at least one dataset prefix.")
    readers = [Reader(p) for p in prefixes]
    first = readers[0]
    for other in readers[1:]:
        if other.dtype != first.dtype:
            raise DTypeError(
                f"cannot merge {other.prefix} ({other.dtype.name}) with {first.prefix} ({first.dtype.name}): "
                "Megatron datasets merge only when their dtypes agree."
            )
        if other.multimodal != first.multimodal:
            raise FormatError(
                f"cannot merge {other.prefix} (multimodal={other.multimodal}) with {first.prefix} "
                f"(multimodal={first.multimodal})."
            )
    masked = [r._loss_reader is not None for r in readers]
    if any(masked) and not all(masked):
        without = readers[masked.index(False)].prefix
        raise FormatError(
            f"cannot merge {without} (no {without}{LOSS_MASK_SUFFIX} loss masks) with datasets that have them: "
            "convert it with masks first, or merge through tokformats.convert."
        )
    prefix = resolve_prefix(output)
    try:
        with AtomicFiles(overwrite=overwrite) as files:
            files.check_destination(Path(f"{prefix}.idx"))
            bin_handle = files.create(Path(f"{prefix}.bin"))
            for reader in readers:
                append_file(reader.bin_path, bin_handle)
            lengths = np.concatenate([r.sequence_lengths for r in readers])
            shifts = np.cumsum([0] + [len(r.sequence_lengths) for r in readers[:-1]], dtype=np.int64)
            document_indices = np.concatenate(
                [np.zeros(1, np.int64)] + [r.document_indices[1:] + shift for r, shift in zip(readers, shifts)]
            )
            modes = np.concatenate([r.sequence_modes for r in readers]) if first.multimodal else None
            if any(masked):  # the masks' files the same way, their index before the tokens' .idx
                mask_prefix = loss_mask_prefix(prefix)
                mask_bin = files.create(Path(f"{mask_prefix}.bin"))
                for reader in readers:
                    append_file(reader._loss_reader.bin_path, mask_bin)  # type: ignore[union-attr]
                mask_index = files.create(Path(f"{mask_prefix}.idx"))
                _write_index(mask_index, np.dtype("u1"), lengths, document_indices, None)
            index = files.create(Path(f"{prefix}.idx"))  # created last, so renamed last
            _write_index(index, little_endian(first.dtype), lengths, document_indices, modes)
    except OSError as error:  # a full disk names the merged dataset, not a hidden temporary (or nothing)
        raise naming_output(error, prefix)  # noqa: B904 - the original is kept as the cause
    finally:
        for reader in readers:
            reader.close()
    return Reader(prefix)
