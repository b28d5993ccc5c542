"""llm.c token shards (``{name}_{split}_{index:06d}.bin``, or ``{name}_{index:06d}.bin``), as written by llm.c's
``write_datafile``.

Layout (little-endian; llm.c uses the host's order, which is little-endian everywhere it runs)::

    offset 0     int32  magic    20240520 (GPT-2 family) or 20240801 (Llama-3 family)
    offset 4     int32  version  1 with 20240520 (tokens uint16), 7 with 20240801 (tokens uint32)
    offset 8     int32  ntok     number of tokens (< 2**31)
    offset 12    1012 bytes of zeros (the rest of a 256-int32 header), never read by llm.c
    offset 1024  ntok tokens

tokformats records how documents are delimited in three of the unused ints when the convention is not llm.c's
own (a delimiter other than the family's before each document, a delimiter after each document, or no
boundaries): int 3 is ``CONVENTION_MARK`` (the bytes ``tokf``), int 4 the kind (1 ``bos``, 2 ``eos``, 3 none),
int 5 the delimiter id. llm.c's readers ignore these ints; a shard in llm.c's own convention keeps them zero,
byte-identical to llm.c's ``write_datafile``.

The file size must be exactly ``1024 + ntok * itemsize``: llm.c's C loader refuses anything else,
and seeks with an ``int``, so a shard must stay below 2 GiB. There is no dtype field; (magic,
version) decide it. Each document is *preceded* by a delimiter (GPT-2 ``<|endoftext|>`` 50256,
Llama-3 ``<|begin_of_text|>`` 128000), which llm.c does not record, and documents run across
shard boundaries. A reader finds the delimiter only where the file establishes it: the convention
tokformats recorded, or the family's own id in the stream; otherwise it reads one stream and warns.
Several shards (a glob or a list) read as one corpus in sorted order, the way the C loader globs and sorts them.
"""

from __future__ import annotations

import itertools
import operator
import os
import re
import struct
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ..core.documents import add_delimiter, split_offsets
from ..core.dtypes import check_id, resolve_dtype
from ..core.protocol import PathLike, TokenWriter, checked_delimiters
from ..core.registry import FormatDescriptor, Probe
from ..errors import ConfigError, DataWarning, FormatError, HeaderError, NoFilesError, SizeMismatchError, option
from ..fs.paths import expand_path_texts
from ..fs.untrusted import existing_regular, require_regular, require_regular_mode
from ._parts import MappedParts, Part, PartTable

if TYPE_CHECKING:
    import numpy.typing as npt

    from ..core.files import LazyFiles
    from .llmc_vocab import Vocab

__all__ = [
    "Reader",
    "Writer",
    "detect",
    "Family",
    "FAMILIES",
    "HEADER_BYTES",
    "HEADER_INTS",
    "read_header",
    "read_convention",
    "shard_name",
]

#: This format's entry in :data:`tokformats.formats` (the registry finds it here).
DESCRIPTOR = FormatDescriptor(
    "llmc", "llm.c token shards (1 KiB header, uint16/uint32)", (".bin",), __name__, order=20
)

HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
#: The C loader seeks with a signed 32-bit offset: a shard must be smaller than this.
MAX_SHARD_BYTES = 1 << 31


# The functional form with the types as objects (``typing`` compiles a class form's string annotations one by one).
# A named tuple (public: it compares by value and unpacks), though its ``eval`` costs ~0.05 ms at import.
Family = NamedTuple(  # noqa: UP014 - see above
    "Family", [("name", str), ("magic", int), ("version", int), ("dtype", np.dtype), ("delimiter", int)]
)
Family.__doc__ = "A model family's shard flavour: its magic, version, token dtype and document delimiter."


GPT2 = Family("gpt2", 20240520, 1, np.dtype("<u2"), 50256)
LLAMA3 = Family("llama3", 20240801, 7, np.dtype("<u4"), 128000)
#: Shard families by magic number.
FAMILIES: dict[int, Family] = {GPT2.magic: GPT2, LLAMA3.magic: LLAMA3}

#: Magics of other llm.c files, so that a wrong file gets a precise message.
OTHER_MAGICS = {
    20240328: "an llm.c tokenizer vocabulary (format 'llmc-vocab')",
    20240522: "an llm.c evaluation file (HellaSwag-style)",
    20240326: "an llm.c GPT-2 model checkpoint",
    20240327: "an llm.c debug state",
    20240527: "an llm.c training state",
    20240803: "an llm.c Llama-3 model checkpoint",
}

#: The least ``core.arrays.default_open_maps`` gives: a glob of at most this many shards never unmaps one.
_FEWEST_OPEN_MAPS = 16

#: A shard's pin from its ``stat`` (what ``core.files`` compares when it maps the shard), taken by ``map`` (a C loop),
#: not a comprehension that runs bytecode per shard.
_PIN_FIELDS = operator.attrgetter("st_dev", "st_ino", "st_size", "st_mtime_ns")

#: Tokens the reader looks at to find the delimiter when none is given.
DELIMITER_PROBE = 1 << 20

#: Header int 3 of a shard whose document convention tokformats recorded (the bytes ``tokf``, little-endian).
CONVENTION_MARK = int.from_bytes(b"tokf", "little")
#: Header int 4: how documents are delimited (int 5 holds the delimiter id).
CONVENTION_KINDS = {1: "bos", 2: "eos", 3: "none"}
_CONVENTION_CODES = {kind: code for code, kind in CONVENTION_KINDS.items()}


def read_convention(head: bytes) -> tuple[str, int | None] | None:
    """The document convention a shard's header records (``("bos", id)``, ``("eos", id)`` or ``("none", None)``),
    or None when it records none (llm.c's own writer, or a shard in llm.c's convention)."""
    if len(head) < 24:
        return None
    mark, code, value = struct.unpack_from("<3i", head, 12)
    kind = CONVENTION_KINDS.get(code)
    if mark != CONVENTION_MARK or kind is None:
        return None
    return kind, (None if kind == "none" else value)


def shard_name(prefix: PathLike, split: str | None, index: int) -> Path:
    """``{prefix}_{split}_{index:06d}.bin`` (llm.c's naming), or ``{prefix}_{index:06d}.bin`` without a split."""
    return Path(f"{os.fspath(prefix)}{f'_{split}' if split else ''}_{index:06d}.bin")


#: What ``shard_name`` writes for shard ``index`` after the prefix (and split).
_INDEX_GLOB = "[0-9]" * 6


def _pread_head(path: Path | str) -> bytes:
    """The first ``HEADER_BYTES`` of a regular file: one ``open``, ``fstat`` and ``pread`` (no buffered file
    object). Opened without blocking: a FIFO matched by a glob is refused instead of waiting for a writer, and a
    folder, socket or device named like a shard is refused with a :class:`FormatError` (not an ``OSError`` from the
    open or the read)."""
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise
    except OSError:  # a socket cannot be opened at all (ENXIO): say what it is if it is not a file
        require_regular(Path(path))
        raise
    try:
        require_regular_mode(path, os.fstat(descriptor).st_mode)
        return os.pread(descriptor, HEADER_BYTES, 0)
    finally:
        os.close(descriptor)


def _pread_head_or_missing(path: Path | str) -> bytes:
    """:func:`_pread_head`, a missing file raising :class:`NoFilesError`."""
    try:
        return _pread_head(path)
    except FileNotFoundError:
        raise NoFilesError(f"{path} does not exist.") from None


def read_header(path: Path, head: bytes | None = None, size: int | None = None) -> tuple[Family, int]:
    """Validate a shard's header and size exactly as llm.c's loader does; return (family, ntok). ``head`` and
    ``size``: the header bytes and the file size when they come from elsewhere (a shard opened by URL, or a header
    read once at open)."""
    try:
        size = require_regular(path) if size is None else size
        if head is None:
            head = _pread_head(path)
    except FileNotFoundError:
        raise NoFilesError(f"{path} does not exist.") from None
    if len(head) < HEADER_BYTES:
        raise SizeMismatchError(
            f"{path}: an llm.c shard starts with a {HEADER_BYTES}-byte header, but the file has only {size:,} bytes."
        )
    magic, version, ntok = struct.unpack_from("<3i", head)  # not NumPy: its first frombuffer costs ~15 us
    family = FAMILIES.get(magic)
    if family is None:
        other = OTHER_MAGICS.get(magic)
        found = f"{magic} ({other})" if other else str(magic)
        raise HeaderError(
            f"{path}: header field 'magic' is {found}; an llm.c token shard has "
            f"{GPT2.magic} (GPT-2) or {LLAMA3.magic} (Llama-3)."
        )
    if version != family.version:
        raise HeaderError(
            f"{path}: header field 'version' is {version}; with magic {magic} llm.c expects {family.version}."
        )
    if ntok < 0:
        raise HeaderError(f"{path}: header field 'ntok' is negative ({ntok}).")
    expected = HEADER_BYTES + ntok * family.dtype.itemsize
    if size != expected:
        detail = "trailing bytes" if size > expected else "the file is truncated"
        raise SizeMismatchError(
            f"{path}: header field 'ntok' says {ntok:,} {family.dtype.name} tokens, so the file should have "
            f"{expected:,} bytes, but it has {size:,} ({detail})."
        )
    return family, ntok


_SHARD_NAME = r"^(?P<stem>.+)_(?P<index>\d+)\.bin$"  # compiled by ``re``'s cache when a folder is listed


def folder_shards(folder: Path, remote: LazyFiles | None = None) -> list[Path]:
    """The shards of the one split in ``folder`` (``{name}_{split}_{index}.bin``), in order (for a folder opened by
    URL, the listing's ``.bin`` files named so).

    A folder holding several splits (llm.c's ``fineweb10B/`` has ``_train_`` and ``_val_`` shards) is refused with
    the glob of each, rather than read as one corpus that mixes them.
    """
    if remote is not None:
        shards = [p for p in remote.paths(".bin", folder) if p.parent == folder and re.match(_SHARD_NAME, p.name)]
    else:
        shards = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".") and _is_shard(p))
    if not shards:
        raise NoFilesError(f"{folder} holds no llm.c token shards.")
    groups: dict[str, list[Path]] = {}
    for shard in shards:
        match = re.match(_SHARD_NAME, shard.name)
        key = match.group("stem") if match else "(other names)"
        groups.setdefault(key, []).append(shard)
    if len(groups) > 1:
        listing = "; ".join(
            f"{folder / (k + '_*.bin')} ({len(v)} shard{'s' * (len(v) != 1)})" for k, v in sorted(groups.items())
        )
        raise FormatError(f"{folder} holds shards of {len(groups)} splits; open one of them: {listing}.")
    return shards


def _is_shard(path: Path | Probe) -> bool:
    """Whether the file starts with an llm.c token-shard magic and its version."""
    head = (path if isinstance(path, Probe) else Probe(path)).head(8)
    if len(head) < 8:
        return False
    magic, version = int.from_bytes(head[:4], "little", signed=True), int.from_bytes(head[4:8], "little", signed=True)
    family = FAMILIES.get(magic)
    return family is not None and family.version == version


def remote_lazy(folder: Path, names: list[str]) -> bool:
    """Whether shards opened by URL can be fetched on first use: every ``.bin`` is named like an llm.c shard
    (``{name}_{index}.bin``); formats whose index files came with them were asked first. Each shard's header is then
    read by range; documents are found by scanning the tokens, so ``len()`` and documents fetch every shard, while
    ``tokens`` and windows fetch the shards they touch."""
    shards = [n for n in names if n.endswith(".bin")]
    return bool(shards) and all(re.match(_SHARD_NAME, Path(n).name) for n in shards)


def detect(probe: Probe) -> bool:
    """True for a file starting with an llm.c token-shard magic and its version, or a folder of such shards."""
    if probe.is_dir:
        return any(_is_shard(probe.child(name)) for name in [n for n in probe.entries if n.endswith(".bin")][:8])
    return _is_shard(probe)


#: Below this many shards, sizes are checked by a Python loop: NumPy's first call of each operation in a process
#: (~10-50 us each) costs more than the loop, and a glob's first open is often the process's first NumPy work.
_PYTHON_SIZE_CHECK = 512


def _token_counts(sizes: list[int], itemsize: int) -> tuple[np.ndarray, int | None]:
    """Each shard's token count from its file size, and the index of the first size no shard of ``itemsize``-byte
    tokens can have (shorter than the header, or a body that is no whole number of tokens), or None."""
    if len(sizes) < _PYTHON_SIZE_CHECK:
        bodies = [size - HEADER_BYTES for size in sizes]
        bad = next((k for k, body in enumerate(bodies) if body < 0 or body % itemsize), None)
        return np.array([body // itemsize for body in bodies], dtype=np.int64), bad
    body = np.array(sizes, dtype=np.int64)
    body -= HEADER_BYTES
    # One reduction per rule, in place (a glob's first open is often the process's first NumPy work, and each
    # operation's first call costs ~10-20 us): every body at least empty, and a whole number of tokens, which for
    # the families' itemsizes (2 and 4, powers of two) shows in the low bits of the bodies' OR. Which size is wrong
    # is looked for only when one is.
    if np.minimum.reduce(body) < 0 or np.bitwise_or.reduce(body) & (itemsize - 1):
        return body // itemsize, int(np.flatnonzero((body < 0) | (body % itemsize != 0))[0])
    body //= itemsize
    return body, None


class Reader(MappedParts):
    """One llm.c shard, or several (a glob or a list) read as one corpus in sorted order.

    Args:
        path: a shard, a glob such as ``"data/fineweb_train_*.bin"``, a list of shards, or a folder holding the
            shards of one split.
        bos: the delimiter that precedes each document. ``"auto"`` (default): the convention the first shard's
            header records (tokformats writes it there when it is not llm.c's), else the family's delimiter
            (50256 for GPT-2, 128000 for Llama-3) when it occurs near the start of the stream; else the
            convention is unknown and the stream reads as one document, with a warning naming the options to
            pass. An id; or ``None`` to read the whole stream as one document. ``bos_rule`` says which applied.
        eos: the delimiter that ends each document instead (a stream written with an end-of-text id appended).
        open_maps: how many shards of a glob stay mapped at once (each map holds a file descriptor); the least
            recently read is unmapped beyond it. Default: a quarter of ``ulimit -n``, between 16 and 1,024.
        remote: set by ``tokformats.open(URL)``: each shard is fetched when a token of it is first read.

    Opening several local shards costs one ``stat`` per shard and one header read: each shard's token count comes
    from its size, and its header is checked, as llm.c's loader checks it, when the shard is first mapped (before
    any token of it is read; ``verify()`` reads them all). Shards are mapped when first read, at most
    ``open_maps`` at once, so a glob of 600,000 shards opens in a fraction of a second and reads under a small
    ``ulimit -n``.
    """

    format = "llmc"

    maps_on_use = True
    #: The shards' model family (magic, version, dtype, delimiter).
    family: Family

    def __init__(
        self,
        path: PathLike | list[PathLike],
        *,
        bos: int | str | None = "auto",
        eos: int | None = None,
        open_maps: int | None = None,
        remote: LazyFiles | None = None,
    ) -> None:
        super().__init__(path, bos=bos, eos=eos, remote=remote)
        self._remote = remote
        texts = expand_path_texts(path)
        # a folder of shards: asked of a plain path only (a glob's text is no file: no stat of it here)
        if isinstance(path, (str, os.PathLike)) and texts == [os.fspath(path)] and os.path.isdir(texts[0]):
            texts = sorted(os.fspath(p) for p in folder_shards(Path(path), remote))
        elif len(texts) > 1 and not isinstance(path, (str, os.PathLike)):  # a glob's matches come sorted
            texts = sorted(texts)
        if open_maps is not None:
            self.open_maps = self._init_kwargs["open_maps"] = int(open_maps)
        elif len(texts) <= _FEWEST_OPEN_MAPS:  # the default bound is never below this: no need to ask the rlimit
            self.open_maps = _FEWEST_OPEN_MAPS
        #: Shards whose header was read and checked under their pin (at open: the first); the rest at first map.
        self._headers_checked: set[int] = set()
        if remote is None and len(texts) > 1:
            table, first_head = self._local_shards(texts)
            self._set_parts(table)
        else:
            paths = [Path(t) for t in texts]
            if remote is None:  # one local shard: its header read once
                size = existing_regular(paths[0])
                first_head = _pread_head_or_missing(paths[0])
                headers = [read_header(paths[0], first_head, size)]
            else:  # each header by one ranged request; the shard itself arrives on first use
                heads = [self._head(p, HEADER_BYTES) for p in paths]
                headers = [read_header(p, head, remote.size(p)) for p, head in zip(paths, heads)]
                first_head = heads[0]
            self._check_one_family(paths, [family for family, _ in headers])
            self.family = headers[0][0]
            self._set_parts([Part(p, HEADER_BYTES, ntok, self.family.dtype) for p, (_, ntok) in zip(paths, headers)])
        self.shards  # noqa: B018 - map now (several local shards: as each is first read, after its header)
        self.eos: int | None = None
        if isinstance(bos, str) and bos != "auto":
            raise ConfigError(f"{Path(texts[0])}: bos must be an id, None or 'auto', not {bos!r}.")
        if eos is not None or bos != "auto":  # given: each an id the shards' dtype holds, never both
            given_bos = None if bos == "auto" else bos
            self.eos, self.bos = checked_delimiters(Path(texts[0]), self.family.dtype, eos, given_bos)
            self.bos_rule = "given"
        else:
            self._convention(read_convention(first_head))
        # pickles re-open with the delimiter found here
        self._init_kwargs["bos"] = self.bos if self.bos_rule != "unknown" else None
        self._init_kwargs["eos"] = self.eos

    def _local_shards(self, texts: list[str]) -> tuple[PartTable, bytes]:
        """Local shards, each costing one ``stat`` (its pin: size, inode, time) and nothing more: its token count
        comes from its size; the first shard's header is read now, once (it decides the family and the document
        convention), and every other header is checked, as llm.c's loader checks it, when the shard is first
        mapped (:meth:`_open_part`), before any token of it is read. A size no shard of the family can have is
        refused now, with its header's message. Returns the table and the first shard's header."""
        try:
            infos = map(os.stat, texts)  # each result dropped once its pin is taken: no list of 600,000 of them
            # four ints a shard in one flat list, all in C loops (PartTable.pins); a first shard that is no regular
            # file is refused by its header's read just below (_pread_head)
            pins = list(itertools.chain.from_iterable(map(_PIN_FIELDS, infos)))
        except FileNotFoundError:
            missing = next((text for text in texts if not os.path.exists(text)), texts[0])
            raise NoFilesError(f"{missing} does not exist.") from None
        first_head = _pread_head_or_missing(texts[0])
        sizes = pins[2::4]
        self.family, _ = read_header(Path(texts[0]), first_head, size=sizes[0])
        self._headers_checked.add(0)
        itemsize = self.family.dtype.itemsize
        counts, impossible = _token_counts(sizes, itemsize)
        table = PartTable(texts, HEADER_BYTES, counts, self.family.dtype, pins)
        if impossible is not None:
            where = Path(texts[impossible])
            self._files.pin_as(where, table.pin(impossible))
            self._checked_header(where)  # raises: its header says what is wrong with its size
            raise SizeMismatchError(f"{where}: {sizes[impossible]:,} bytes is no {itemsize}-byte shard.")
        return table, first_head

    def _checked_header(self, path: Path) -> int:
        """Shard ``path``'s header, validated against its pinned size and this corpus's family; its ``ntok``."""
        family, ntok = read_header(path, size=self._pinned_size(path))
        self._check_one_family([path], [self.family, family])
        return ntok

    @staticmethod
    def _check_one_family(paths: list[Path], families: list[Family]) -> None:
        names = sorted({family.name for family in families})
        if len(names) > 1:
            raise HeaderError(f"{paths[0].parent}: the shards mix model families {names}; open them separately.")

    def _open_part(self, index: int) -> np.ndarray:
        """Map shard ``index`` after checking its header against its size and the corpus's family (the first
        shard's was checked at open, under the same pin, which the map checks again)."""
        if index not in self._headers_checked:
            part = self._pin_part(index)
            self._check_pin(part.path)
            if self._checked_header(part.path) != part.tokens:  # the pin holds the size, so only a bug gets here
                raise SizeMismatchError(f"{part.path}: header field 'ntok' disagrees with the size pinned at open.")
            self._headers_checked.add(index)
        return super()._open_part(index)

    def _convention(self, recorded: tuple[str, int | None] | None) -> None:
        """Set the delimiter from what establishes it: the header's record, else the family's own id in the
        stream; else none, with a warning (never a guess the data does not support)."""
        if recorded is not None:
            kind, value = recorded
            self.bos = value if kind == "bos" else None
            self.eos = value if kind == "eos" else None
            self.bos_rule = "recorded"
            return
        found = self._family_delimiter()
        if found is not None:
            self.bos, self.bos_rule = found, "family"
            return
        self.bos, self.bos_rule = None, "unknown"
        self._unknown = self._unknown_convention()
        self.warnings.append(f"{self._unknown_where()}: {self._unknown}")
        warnings.warn(DataWarning(self.warnings[-1]), stacklevel=4)

    def _family_delimiter(self) -> int | None:
        """The family's own delimiter (50256, 128000) when the stream starts with it or it occurs among the first
        ``DELIMITER_PROBE`` tokens (a single shard from the middle of a corpus starts mid-document); else None.
        An empty corpus takes the family's: there is nothing to mis-split."""
        counts = self._part_counts()  # not the parts: no Part (and Path) made per shard passed over
        first_shard = next((k for k in range(len(counts)) if counts[k]), None)
        if first_shard is None:
            return self.family.delimiter
        shard = self.shards[first_shard]
        delimiter = self.family.delimiter
        if int(shard[0]) == delimiter:  # llm.c's own shards: one page read, not DELIMITER_PROBE tokens
            return delimiter
        probe = np.asarray(shard[:DELIMITER_PROBE])
        return delimiter if (probe == delimiter).any() else None

    def _unknown_where(self) -> str:
        return str(self.path) if self.num_shards == 1 else f"{self.path.parent}/ ({self.num_shards} shards)"

    def _unknown_convention(self) -> str:
        """Why the stream reads as one document, and the options that split it, with ids taken from the data."""
        tokens = self.tokens
        first, last = int(tokens[0]), int(tokens[len(tokens) - 1])
        return (
            f"the document delimiter is unknown: the header records none and the {self.family.name} "
            f"delimiter {self.family.delimiter} does not occur, so the stream reads as one document. If each "
            f"document starts with an id (this stream starts with {first}), pass {option('bos', str(first))}; if "
            f"each ends with one (it ends with {last}), pass {option('eos', str(last))}."
        )

    def _problems(self) -> list[Any]:
        """An unknown document convention is a problem to ``verify``: the documents cannot be checked."""
        from ..core.reports import Problem

        if self.bos_rule != "unknown":
            return []
        return [Problem(str(self.path), "delimiter", self._unknown)]

    @property
    def num_shards(self) -> int:
        """Number of shard files."""
        return len(self._parts)

    def _offsets(self) -> np.ndarray:
        return split_offsets(self.tokens, bos=self.bos, eos=self.eos)

    @property
    def metadata(self) -> dict[str, Any]:
        return {
            "magic": self.family.magic,
            "version": self.family.version,
            "family": self.family.name,
            "bos": self.bos,
            "eos": self.eos,
            "bos_rule": self.bos_rule,
            "shards": [{"path": str(p.path), "ntok": p.tokens} for p in self._parts],
        }

    def batches(
        self, batch_size: int, seq_len: int, *, rank: int = 0, world_size: int = 1
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """One epoch of ``(inputs, targets)`` batches exactly as llm.c's unshuffled C loader yields them.

        Window ``k`` of process ``rank`` starts at token ``(k * world_size + rank) * B * T`` of the
        current shard and reads ``B * T + 1`` tokens; a shard yields ``(ntok - 1) // (world_size * B * T)``
        windows, then the next shard in sorted order follows. Arrays are int32 of shape ``(B, T)``.
        """
        span = batch_size * seq_len
        if span <= 0 or not 0 <= rank < world_size:
            raise ValueError(
                "need batch_size > 0, seq_len > 0 and 0 <= rank < world_size; "
                f"got {batch_size}, {seq_len}, {rank}, {world_size}"
            )
        for shard in self.shards:
            windows = max(len(shard) - 1, 0) // (world_size * span)
            for k in range(windows):
                start = (k * world_size + rank) * span
                window = np.asarray(shard[start : start + span + 1], dtype=np.int32)
                yield window[:-1].reshape(batch_size, seq_len), window[1:].reshape(batch_size, seq_len)


class Writer(TokenWriter):
    """Writes llm.c shards ``{path}_{split}_{index:06d}.bin``, byte-identical to llm.c's ``write_datafile``.

    Args:
        path: the shard prefix, e.g. ``"out/fineweb"``.
        vocab_size: picks the family: GPT-2 (uint16) up to 65,536 ids, else Llama-3 (uint32).
        dtype: ``uint16`` or ``uint32`` instead of ``vocab_size``.
        split: a split name for the file names (``OUTPUT_{split}_000000.bin``, as llm.c's scripts name train and
            val shards); by default none (``OUTPUT_000000.bin``).
        shard_size: tokens per shard (llm.c's default 10**8); capped so that no shard reaches 2 GiB.
        bos: when given, written before every document (llm.c's delimiter convention).
        overwrite: replace existing shards of the same prefix and split (stale higher-numbered ones are removed).
    """

    format = "llmc"
    boundaries = "bos"  # llm.c's writers put the delimiter before each document

    @classmethod
    def output_path(cls, output: PathLike, key: str, split: str | None, several_keys: bool) -> Path:
        """The shard prefix: a split goes into the shard names (``OUTPUT_{split}_{index:06d}.bin``)."""
        return super().output_path(output, key, None, several_keys)

    @classmethod
    def split_options(cls, split: str | None) -> dict[str, Any]:
        return {"split": split} if split else {}

    @classmethod
    def existing_outputs(cls, path: PathLike) -> list[Path]:
        prefix = Path(path)
        return sorted(prefix.parent.glob(f"{prefix.name}_*000000.bin")) if prefix.parent.is_dir() else []

    def __init__(
        self,
        path: PathLike,
        *,
        vocab_size: int | None = None,
        dtype: npt.DTypeLike | None = None,
        split: str | None = None,
        shard_size: int = 10**8,
        bos: int | None = None,
        overwrite: bool = False,
    ) -> None:
        chosen = resolve_dtype(dtype, vocab_size, format=self.format, allowed=("uint16", "uint32"))
        super().__init__(path, dtype=chosen, vocab_size=vocab_size, overwrite=overwrite)
        self.family = GPT2 if chosen.itemsize == 2 else LLAMA3
        capacity = (MAX_SHARD_BYTES - 1 - HEADER_BYTES) // chosen.itemsize
        if shard_size <= 0:
            raise ValueError(f"shard_size must be positive, found {shard_size}")
        self.shard_size = min(shard_size, capacity)
        self.split = split
        self.bos = check_id(bos, chosen, vocab_size, "bos")
        self._header = np.zeros(HEADER_INTS, dtype="<i4")
        self._header[:2] = (self.family.magic, self.family.version)
        from ._shards import StreamShards  # the writer's alone: opening shards need not import it

        self._shards = StreamShards(self.shard_size, self._open_shard, self._close_shard)
        self.shard_paths: list[Path] = []
        self._files.check_destination(shard_name(self.path, split, 0))
        if overwrite:
            pattern = shard_name(Path(self.path).name, split, 0).name.replace("000000", _INDEX_GLOB)
            self._files.remove_on_commit(lambda: sorted(Path(self.path).parent.glob(pattern)))

    def convention(self) -> tuple[str, int | None] | None:
        """The document convention the shards' headers record: the delimiter this writer inserts, else the one
        declared (:meth:`declare_delimiter`); None when it is llm.c's own (the family's delimiter before each
        document) or unknown, so that such shards stay byte-identical to llm.c's ``write_datafile``."""
        found = ("bos", self.bos) if self.bos is not None else self.declared
        return None if found == ("bos", self.family.delimiter) else found

    def read_with(self) -> dict[str, Any]:
        """Nothing: the header records any convention that is not llm.c's own (:meth:`convention`)."""
        return {}

    def _header_of(self, tokens: int) -> np.ndarray:
        header = self._header.copy()
        header[2] = tokens
        recorded = self.convention()
        if recorded is not None:
            kind, value = recorded
            header[3:6] = (CONVENTION_MARK, _CONVENTION_CODES[kind], 0 if value is None else value)
        return header

    def _open_shard(self, index: int) -> Any:
        final = shard_name(self.path, self.split, index)
        shard = self._files.create(final)
        shard.write(self._header_of(0).tobytes())  # ntok is patched when the shard is closed
        self.shard_paths.append(final)
        return shard

    def _close_shard(self, shard: Any, tokens: int) -> None:
        header = self._header_of(tokens)
        shard.seek(0)
        shard.write(header.tobytes())
        self._files.finish(shard)

    def _write_tokens(self, flat: np.ndarray, lengths: np.ndarray) -> None:
        if self.bos is not None:
            flat, _ = add_delimiter(flat, lengths, self.bos, before=True)
        self._shards.write(flat)

    def _finish(self) -> None:
        self._shards.finish()  # an empty corpus is one empty shard, as write_datafile would write


# The vocabulary is llm.c's too: ``tokformats.llmc.Vocab`` (its own module holds the format), imported when asked
# for, so that opening shards does not import it.
__all__ += ["Vocab"]


def __getattr__(name: str) -> Any:
    """``Vocab``, imported on first use (PEP 562)."""
    if name == "Vocab":
        from .llmc_vocab import Vocab

        return Vocab
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
