"""``tokformats.tokenize``: text in, training-ready token files out, in any format tokformats writes.

The run has two phases. *Encoding*: a reader thread parses and decompresses the inputs into batches while the
main thread encodes them with ``Tokenizer.encode_batch_fast`` (which releases the GIL and uses every core) and
appends ids and document lengths to append-only spool files, one pair per output stream (text key x split), in
a work folder beside the output (``OUTPUT.tokenize/``); a third thread re-encodes the documents sampled to check a
faster engine with ``tokenizers`` while the engine goes on (both release the GIL), and every outstanding check is
compared before a checkpoint commits. Every few seconds the spools are fsynced and a checkpoint records how far
each input was consumed and how long each spool is; the last one reads each ids spool back, compares it with its
hash and pins it (:mod:`tokformats.fs.pins`). *Writing*: each stream's spool is fed to the format's writer, whose
files appear atomically (Megatron's ``.bin`` is the spool itself, not read again while its pin holds); then the
work folder is removed.

A run killed at any point resumes with ``resume=True``: spools are cut back to the checkpoint and reading
restarts after the last checkpointed record, so the final files are byte-identical to an uninterrupted run.
The work folder has one owner at a time (an OS lock that dies with its holder): a second run on the same output
is refused at once with :class:`~tokformats.errors.FolderBusyError` naming the folder, rather than made to wait,
and a killed run's pool workers stop with it (:mod:`tokformats.tokenization.workers`).
Documents are assigned to splits by a hash of (seed, input, record position), so the assignment depends on
nothing else: not on batching, resuming or partitioning. With ``executor=`` the inputs are cut into
partitions (large files at line starts or row groups, :mod:`.partitions`) encoded in parallel (each into its own
spools) and joined in input order: the output equals a single-process run. Where the format's data file is the
bare id stream (Megatron's ``.bin``), a finished spool is joined by a kernel copy, checked by the pin its worker
took (:mod:`tokformats.fs.pins`) instead of being read back and hashed again in the parent.

Empty documents follow each format's owner: Megatron's ``preprocess_data.py`` keeps them as documents
without sequences and without an end-of-document id; llm.c, nanoGPT and the others still write the delimiter.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import queue
import re
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple, NoReturn

import numpy as np

from .. import api
from ..core.documents import add_delimiter, document_runs, offsets_from_lengths
from ..core.dtypes import check_tokens, dtype_for_vocab
from ..core.protocol import TokenWriter
from ..core.provenance import ROW_DTYPE, Provenance, RowSpool, read_rows, save_provenance
from ..core.registry import default_corpus_format
from ..core.vocab import END_OF_TEXT, vocabulary_size
from ..errors import ConfigError, FormatError, OutputExistsError, option
from ..fs.atomic import AtomicFiles, naming_output
from ..fs.owner import LOCK_NAME, owned_folder
from ..fs.pins import pin_file, pinned
from ..fs.untrusted import read_json_object
from .chat import ChatError, Turns, TurnsReader, schema_name
from .chat_encoding import ChatSpec, EndOfDocument
from .engines import (
    ENGINES,
    Engine,
    EngineMismatchError,
    TokenizersEngine,
    differing_text,
    encoded,
    limit_threads,
    select_engine,
)
from .executors import engine_threads
from .partitions import PARTITION_BYTES, iter_partitions
from .sources import Input, Record, SourceError, iter_records, read_by_line, resolve_inputs
from .templates import THOUGHT, TRAIN_ON, Layout, load_template
from .tokenizer import load_tokenizer
from .workers import parent_watch, submitter

__all__ = ["tokenize", "split_fractions", "output_paths"]

EOS_MODES = ("append", "prepend", "none")
#: The end-of-document tokens looked up, in order, when no ``eos_id`` is given (GPT's and tiktoken's, Llama 3's,
#: DeepSeek's).
END_OF_DOCUMENT = (END_OF_TEXT, "<|end_of_text|>", "<\uff5cend\u2581of\u2581sentence\uff5c>")
CHECKPOINT = "checkpoint.json"
PARTITION_WAIT = 60.0  # seconds a partition waits for a killed run's orphaned worker to stop writing it
_SPOOL_CHUNK = 1 << 24  # tokens per write_batch call when writing the outputs


# -- configuration --------------------------------------------------------------------------------------


def split_fractions(split: Any) -> dict[str, float] | None:
    """``{"train": 0.8, ...}``, ``"8:1:1"`` or ``"0.9,0.1"`` (train, val[, test]) or None; fractions normalised
    to sum to 1."""
    if split is None:
        return None
    example = option("split", repr("8:1:1"))
    if isinstance(split, str):
        try:
            parts = [float(p) for p in re.split(r"[:,]", split.strip())]
        except ValueError:
            raise ConfigError(f"split {split!r} is not ratios separated by ':' or ',', e.g. {example}.") from None
        if len(parts) > 3:
            raise ConfigError(
                f"split {split!r} has {len(parts)} ratios; give up to three (train, val, test): {example}."
            )
        split = dict(zip(["train", "val", "test"], parts))
    try:
        weights = {str(k): float(v) for k, v in dict(split).items()}
    except (TypeError, ValueError):
        raise ConfigError(f"split must map split names to ratios, e.g. {example}; found {split!r}.") from None
    total = sum(weights.values())
    if not weights or total <= 0 or any(v < 0 or v != v for v in weights.values()):
        raise ConfigError(f"split ratios must be non-negative and not all zero, found {weights}.")
    return {k: v / total for k, v in weights.items()}


def parse_split(split: Any) -> dict[str, float] | None:
    """Deprecated name of :func:`split_fractions` (tokformats 0.1); it goes away in the next release."""
    import warnings

    warnings.warn(
        "tokformats.tokenization.pipeline.parse_split is now split_fractions (the old name goes away in the next "
        "release).",
        DeprecationWarning,
        stacklevel=2,
    )
    return split_fractions(split)


@dataclass
class Plan:
    """Everything that decides the output; a resumed run must have the same plan."""

    inputs: list[str]
    format: str
    keys: list[str]
    eos: str
    eos_id: int | None
    split: dict[str, float] | None
    seed: int
    unit: str
    vocab_size: int
    tokenizer_hash: str
    on_error: str
    #: Chat data: the schema (or ``callable:NAME``), the template's name, train_on and thought; None for text.
    chat: str | None = None
    template: str | None = None
    train_on: str | None = None
    thought: str | None = None
    #: Record each document's source (input, record, byte offset) in a sidecar (:mod:`tokformats.core.provenance`).
    provenance: bool = True

    @property
    def splits(self) -> list[str]:
        return list(self.split) if self.split else [""]

    @property
    def streams(self) -> list[tuple[str, str]]:
        return [(key, split) for key in self.keys for split in self.splits]


def _stream_name(key: str, split: str) -> str:
    return "-".join(part for part in (key, split) if part) or "all"


def output_paths(output: Any, format: str, keys: list[str], splits: list[str]) -> dict[tuple[str, str], Path]:
    """Where each (key, split) stream is written: the format's :meth:`TokenWriter.output_path` (``OUTPUT`` plus
    ``_KEY`` when several text keys are tokenized and ``_SPLIT`` when splitting, unless the format names its files
    its own way)."""
    writer = api.corpus_writer(format)
    return {
        (key, split): writer.output_path(output, key, split or None, len(keys) > 1) for key in keys for split in splits
    }


# -- split assignment ---------------------------------------------------------------------------------


def _mix(values: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a well-mixed 64-bit hash of each value (NumPy uint64 arithmetic wraps)."""
    z = values + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def assign_splits(seed: int, inputs: np.ndarray, positions: np.ndarray, fractions: list[float]) -> np.ndarray:
    """The split index of each record, from a hash of (seed, input, position): reproducible in any batching."""
    with np.errstate(over="ignore"):
        key = _mix(
            np.uint64(seed & 0xFFFFFFFFFFFFFFFF)
            ^ _mix(inputs.astype(np.uint64) << np.uint64(40) ^ positions.astype(np.uint64))
        )
    uniform = (key >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    edges = np.cumsum(fractions)[:-1]
    return np.searchsorted(edges, uniform, side="right")


# -- spools and checkpoints ---------------------------------------------------------------------------


_HASH_PIECE = 1 << 22  # bytes read at a time when a spool is hashed


def _spool_hash(path: Path, size: int) -> Any:
    """A running SHA-256 of the first ``size`` bytes of ``path`` (to be continued as the spool grows), or None when
    the file holds fewer bytes."""
    with open(path, "rb") as handle:
        return _hashed(handle, size)


def _hashed(handle: Any, size: int) -> Any:
    """A SHA-256 of the first ``size`` bytes of the open file ``handle`` (read from its start), or None when it
    holds fewer bytes."""
    import hashlib

    digest = hashlib.sha256()
    handle.seek(0)
    # One buffer read into again and again: a new bytes object per piece costs its pages' first touch each time
    # (a fifth of the time of hashing a 125 MB spool).
    view = memoryview(bytearray(min(size, _HASH_PIECE)))
    left = size
    while left:
        count = handle.readinto(view[: min(left, _HASH_PIECE)])
        if not count:
            return None
        digest.update(view[:count])
        left -= count
    return digest


class Spool:
    """Append-only files: ids (in ``dtype``), document lengths (int64) and, for chat data, the loss mask (one byte
    per token), each with a running SHA-256 of everything written (recorded in checkpoints: a resume checks every
    byte up to the checkpoint, so writes the checkpoint does not know about, e.g. by a killed run's orphaned worker,
    are found, not published)."""

    def __init__(
        self,
        folder: Path,
        name: str,
        dtype: np.dtype,
        tokens: int = 0,
        documents: int = 0,
        hashes: dict[str, str] | None = None,
        *,
        masked: bool = False,
        vocab_size: int | None = None,
        pin: Any = None,
        **older: Any,
    ) -> None:
        #: Every id appended must be below it (checked as it is spooled: a spool published as it is, Megatron's
        #: ``.bin``, passes no writer's check).
        self.vocab_size = vocab_size
        del pin  # a done checkpoint's pin of the ids (see :meth:`pin`): taken again when this spool is done
        self.tokens_path = folder / f"{name}.tokens"
        self.lengths_path = folder / f"{name}.lengths"
        self.mask_path = folder / f"{name}.mask" if masked else None
        self.dtype = dtype
        self._hashes: dict[str, Any] = {}
        files = [(self.tokens_path, tokens * dtype.itemsize), (self.lengths_path, documents * 8)]
        if self.mask_path is not None:
            files.append((self.mask_path, tokens))
        for path, size in files:
            digest = self._verified(path, size, (hashes or {}).get(path.suffix), bool(older))
            with open(path, "ab") as handle:
                handle.truncate(size)  # drop whatever was written after the last checkpoint
            self._hashes[path.suffix] = digest
        if documents and _lengths_total(self.lengths_path, documents) != tokens:
            raise FormatError(
                f"{self.lengths_path}'s document lengths do not add up to the {tokens:,} tokens the checkpoint "
                f"records; the unfinished run cannot be resumed. Pass {option('overwrite')} to start over."
            )
        self._tokens = open(self.tokens_path, "ab")  # noqa: SIM115 - closed by close()
        self._lengths = open(self.lengths_path, "ab")  # noqa: SIM115 - closed by close()
        self._mask = open(self.mask_path, "ab") if self.mask_path is not None else None  # noqa: SIM115 - close()
        self.num_tokens, self.num_documents = tokens, documents
        #: Bytes of the ids file read back and found equal to the running hash (just now, on a resume).
        self._read_back = tokens * dtype.itemsize

    @staticmethod
    def _verified(path: Path, size: int, recorded: str | None, old_checkpoint: bool) -> Any:
        """The running hash of ``path``'s first ``size`` bytes, after checking them against the checkpoint's."""
        import hashlib

        if not size:
            return hashlib.sha256()
        found = path.stat().st_size if path.exists() else None
        digest = _spool_hash(path, size) if found is not None and found >= size else None
        if digest is not None and recorded is not None and digest.hexdigest() == recorded:
            return digest
        # Never extend a lost or damaged spool: that would publish zeros, or another run's writes, as documents.
        if found is None:
            state = "is missing"
        elif found < size:
            state = f"has {found:,} bytes"
        elif old_checkpoint or recorded is None:
            state = "has no full hash in the checkpoint (written by an older tokformats)"
        else:
            state = "differs from what the checkpoint recorded"
        raise FormatError(
            f"{path} {state}, but the checkpoint records {size:,} bytes of it; the unfinished run cannot "
            f"be resumed. Pass {option('overwrite')} to start over."
        )

    def append(self, flat: np.ndarray, lengths: np.ndarray, mask: np.ndarray | None = None) -> None:
        """Append documents (and their loss mask, which a chat spool requires)."""
        if (mask is None) != (self._mask is None):
            raise ValueError(f"{self.tokens_path}: a chat spool takes a mask with every batch, a text spool none")
        if self.vocab_size is not None and len(flat):
            check_tokens(flat, self.dtype, vocab_size=self.vocab_size, lengths=lengths,
                         first_document=self.num_documents, where=f"{self.tokens_path}: ")  # fmt: skip
        tokens = np.ascontiguousarray(flat, dtype=self.dtype).data
        counts = np.ascontiguousarray(lengths, dtype="<i8").data
        self._tokens.write(tokens)
        self._lengths.write(counts)
        self._hashes[".tokens"].update(tokens)
        self._hashes[".lengths"].update(counts)
        if self._mask is not None and mask is not None:
            values = np.ascontiguousarray(mask, dtype=np.uint8).data
            self._mask.write(values)
            self._hashes[".mask"].update(values)
        self.num_tokens += len(flat)
        self.num_documents += len(lengths)

    def _handles(self) -> list[Any]:
        return [h for h in (self._tokens, self._lengths, self._mask) if h is not None]

    def sync(self) -> None:
        """Flush and fsync every file of the spool."""
        self.flush()
        self.fsync()

    def flush(self) -> None:
        """Hand what is buffered to the kernel."""
        for handle in self._handles():
            handle.flush()

    def fsync(self) -> None:
        """fsync every file of the spool (what :meth:`flush` handed to the kernel): it changes nothing of the
        spool's state (only its descriptors are read), so another thread may do it while this one reads the spool
        back."""
        for handle in self._handles():
            os.fsync(handle.fileno())

    def hashes(self) -> dict[str, str]:
        """SHA-256 of each file up to the counts (recorded in checkpoints, checked on resume and on publishing)."""
        return {suffix: digest.hexdigest() for suffix, digest in self._hashes.items()}

    def pin(self) -> list[int] | None:
        """Pin the ids file, written and fsynced in full (:func:`~tokformats.fs.pins.pin_file`), after reading it
        back and finding it equal to the running hash of what was written (a write by anything else since the
        spool was opened raises here): recorded in the done checkpoint beside that hash, the pin lets the join
        copy the file by the kernel without reading it again, as long as nothing has written to it since (else
        the join reads and hashes it). The read back is the check the parent made before: in a parallel run it
        now happens in the workers, beside each other, instead of in the parent, one partition after another."""
        self.read_back()
        return pin_file(self.tokens_path)

    def read_back(self) -> None:
        """Read the ids file back (once per size reached) and raise when it is not what was written (its running
        hash); the check :meth:`pin` makes, which :meth:`_PartitionRun.save` runs beside the spools' fsync."""
        self._tokens.flush()
        size = self.num_tokens * self.dtype.itemsize
        if self._read_back != size:
            with open(self.tokens_path, "rb") as handle:
                digest = _hashed(handle, size)
                if (
                    digest is None
                    or digest.hexdigest() != self._hashes[".tokens"].hexdigest()
                    or os.fstat(handle.fileno()).st_size != size
                ):
                    _refuse_spool(self.tokens_path)
            self._read_back = size

    def close(self) -> None:
        for handle in self._handles():
            handle.close()


def _lengths_total(path: Path, documents: int) -> int:
    """The sum of the first ``documents`` lengths in a spool's ``.lengths`` file (-1 when one is negative)."""
    lengths = np.fromfile(path, dtype="<i8", count=documents)
    return -1 if len(lengths) != documents or (lengths < 0).any() else int(lengths.sum())


def copy_spool(
    writer: TokenWriter,
    folder: Path,
    name: str,
    dtype: np.dtype,
    spooled: tuple[dict[str, Any], np.ndarray] | None = None,
) -> None:
    """Feed a finished partition's spool to ``writer`` in pieces of about ``_SPOOL_CHUNK`` tokens, hashing what it
    feeds: a spool that differs from its checkpoint's hash raises (inside the writer's block, so nothing is
    published).

    Plain file reads, not a memory map: a map would keep every page it has read resident, so memory would
    grow with the corpus; this way it stays at one piece. ``spooled``: what :func:`_spooled_lengths` gave for it
    already.
    """
    import hashlib

    entry, lengths = spooled or _spooled_lengths(folder, name)
    recorded = entry["hashes"]
    offsets = offsets_from_lengths(lengths)
    tokens_path, mask_path = folder / f"{name}.tokens", folder / f"{name}.mask"
    tokens_hash, mask_hash = hashlib.sha256(), hashlib.sha256()
    with open(tokens_path, "rb") as handle, contextlib.ExitStack() as stack:
        masks = stack.enter_context(open(mask_path, "rb")) if ".mask" in recorded else None
        for first, stop in document_runs(offsets, _SPOOL_CHUNK):
            count = offsets.item(stop) - offsets.item(first)
            flat = np.fromfile(handle, dtype=dtype, count=count)
            mask = np.fromfile(masks, dtype=np.uint8, count=count) if masks is not None else None
            if len(flat) != count or (mask is not None and len(mask) != count):
                _refuse_spool(tokens_path if len(flat) != count else mask_path)
            tokens_hash.update(flat.data)
            if mask is not None:
                mask_hash.update(mask.data)
            writer.write_batch(flat, lengths[first:stop], mask)
    if tokens_hash.hexdigest() != recorded.get(".tokens"):
        _refuse_spool(tokens_path)
    if masks is not None and mask_hash.hexdigest() != recorded.get(".mask"):
        _refuse_spool(mask_path)


def _spooled_lengths(folder: Path, name: str) -> tuple[dict[str, Any], np.ndarray]:
    """A finished spool's checkpoint entry (its counts, ``hashes`` and ``pin``) and its document lengths, checked
    against it (their hash, count and total); a spool that differs raises."""
    import hashlib

    sizes = read_json_object(folder / CHECKPOINT)["spools"][name]
    recorded = sizes.get("hashes") or {}
    lengths = np.fromfile(folder / f"{name}.lengths", dtype="<i8", count=sizes["documents"])
    lengths_hash = hashlib.sha256(np.ascontiguousarray(lengths, dtype="<i8").data).hexdigest()
    if (
        len(lengths) != sizes["documents"]
        or lengths_hash != recorded.get(".lengths")
        or (lengths < 0).any()
        or int(lengths.sum()) != sizes["tokens"]
    ):
        _refuse_spool(folder / f"{name}.lengths")
    return {**sizes, "hashes": recorded}, lengths


def adopt_spool(writer: TokenWriter, folder: Path, name: str, dtype: np.dtype) -> bool:
    """Publish a finished spool's ids as ``writer``'s data file, without writing them again
    (:meth:`~tokformats.core.protocol.TokenWriter.adopt_data_file`: Megatron's ``.bin`` is the spool's bytes,
    hard-linked into the commit; its ``.idx`` is built from the spooled lengths), after checking the spool against
    its checkpoint (:func:`_checked_ids`). False when the writer cannot (another format, a chat spool's masks, no
    hard links): nothing was written, and :func:`copy_spool` feeds it instead."""
    if type(writer).adopt_data_file is TokenWriter.adopt_data_file:  # the format has no flat data file
        return False
    entry, lengths = _spooled_lengths(folder, name)
    if ".mask" in entry["hashes"]:
        return False
    tokens_path = folder / f"{name}.tokens"
    with open(tokens_path, "rb") as handle:
        _checked_ids(handle, entry, int(lengths.sum()) * dtype.itemsize)
        adopted = writer.adopt_data_file(tokens_path, dtype, lengths)
        # The link is made by name: it must be the file just checked, not one put in its place meanwhile.
        checked, linked = os.fstat(handle.fileno()), os.stat(tokens_path)
        if adopted and (checked.st_dev, checked.st_ino) != (linked.st_dev, linked.st_ino):
            _refuse_spool(tokens_path)
    return adopted


def join_spool(writer: TokenWriter, folder: Path, name: str, dtype: np.dtype) -> None:
    """Append a finished partition's spool to ``writer``: its ids by a kernel copy where the format's data file is
    the bare id stream (:meth:`~tokformats.core.protocol.TokenWriter.append_data_file`) and the spool's pin shows
    that nothing has written to it since its worker read it back and pinned it (checked before and after the copy, see
    :mod:`tokformats.fs.pins`); else (another format, a chat spool's masks, no pin or a moved one) fed by
    :func:`copy_spool`, which reads and hashes every byte it feeds."""
    spooled = None
    if type(writer).append_data_file is not TokenWriter.append_data_file:  # the format has a flat data file
        spooled = entry, lengths = _spooled_lengths(folder, name)
        tokens_path = folder / f"{name}.tokens"
        size = int(lengths.sum()) * dtype.itemsize
        with open(tokens_path, "rb") as handle:
            if ".mask" not in entry["hashes"] and _pinned(handle, entry, size) and (
                writer.append_data_file(handle, dtype, lengths)
            ):
                if not pinned(handle.fileno(), entry.get("pin")):  # written to while the kernel copied
                    _refuse_spool(tokens_path)
                return
    copy_spool(writer, folder, name, dtype, spooled)


def _pinned(handle: Any, entry: dict[str, Any], size: int) -> bool:
    """Whether a finished spool's open ids file is as its worker pinned it (checkpoint ``entry``) and ``size``
    bytes long."""
    return pinned(handle.fileno(), entry.get("pin")) and os.fstat(handle.fileno()).st_size == size


def _checked_ids(handle: Any, entry: dict[str, Any], size: int) -> None:
    """Check a finished spool's open ids file against its checkpoint ``entry``: its pin, or, without a pin or where
    it moved, every byte read and hashed again. Raises when the file differs."""
    if _pinned(handle, entry, size):
        return
    digest = _hashed(handle, size)
    if digest is None or digest.hexdigest() != entry["hashes"].get(".tokens") or (
        os.fstat(handle.fileno()).st_size != size
    ):
        _refuse_spool(Path(handle.name))


def _refuse_spool(path: Path) -> NoReturn:
    raise FormatError(
        f"{path} differs from what its checkpoint recorded (written to after the checkpoint, or damaged); nothing "
        f"was published. Pass {option('overwrite')} to start over."
    )


def _discard(work: Path) -> None:
    """Remove a finished run's work folder: renamed away in one step first, so that a kill during the removal
    never leaves a half-deleted folder that a resume could take for an unfinished run."""
    from ..fs.journal import dead_temporaries, temporary_name

    trash = temporary_name(work, "tmp")
    try:
        os.replace(work, trash)
    except OSError:
        trash = work
    for folder in [trash, *dead_temporaries(work)]:  # and what earlier runs killed while removing left
        shutil.rmtree(folder, ignore_errors=True)


def _write_json_atomically(path: Path, data: dict[str, Any]) -> None:
    """Replace ``path`` with ``data`` as one commit: the old checkpoint or the new one, never half of either (the
    file and its folder are fsynced)."""
    _write_bytes_atomically(path, json.dumps(data).encode("utf-8"))


def _write_bytes_atomically(path: Path, data: bytes) -> None:
    with AtomicFiles(overwrite=True) as files:
        files.create(path).write(data)


@dataclass
class Stats:
    """Counters of one partition (or of the whole run)."""

    records: int = 0
    documents: int = 0
    #: Characters of text encoded (the uncompressed input, whatever its compression).
    text: int = 0
    tokens: int = 0
    skipped: int = 0
    errors: list[str] = field(default_factory=list)

    @classmethod
    def total(cls, parts: list[Stats]) -> Stats:
        """The counters of the whole run from its partitions' (the first 100 errors)."""
        return cls(
            records=sum(s.records for s in parts),
            documents=sum(s.documents for s in parts),
            text=sum(s.text for s in parts),
            tokens=sum(s.tokens for s in parts),
            skipped=sum(s.skipped for s in parts),
            errors=[e for s in parts for e in s.errors][:100],
        )


# -- progress -------------------------------------------------------------------------------------------


class Progress:
    """Progress of a run on stderr: a tqdm bar when tqdm is installed (a widget in a notebook), else one line,
    refreshed at most twice a second: documents, tokens, the rate in characters of text encoded (uncompressed), and
    the share of the input bytes (compressed, as on disk) whose documents are encoded, with an ETA."""

    def __init__(self, enabled: bool, total_bytes: int | None, counters: list[Any], *, style: str = "auto") -> None:
        self.enabled, self.total, self.counters = enabled, total_bytes, counters
        self.started = self.last = time.perf_counter()
        self.done_before = 0
        #: Input bytes whose documents are encoded (set by the encoding loop; None: count what was read).
        self.encoded: int | None = None
        self._bar: Any = None
        if enabled and style != "line":
            try:
                from tqdm.auto import tqdm
            except ImportError:  # the plain line below
                pass
            else:
                self._bar = tqdm(total=total_bytes, unit="B", unit_scale=True, desc="tokenize", mininterval=0.5)

    def update(self, stats: Stats, *, final: bool = False) -> None:
        now = time.perf_counter()
        if not self.enabled or (not final and now - self.last < 0.5):
            return
        self.last = now
        read = self.done_before + (self.encoded if self.encoded is not None else sum(c.count for c in self.counters))
        elapsed = max(now - self.started, 1e-9)
        facts = f"{stats.documents:,} documents, {stats.tokens:,} tokens, {stats.text / elapsed / 1e6:.1f} M chars/s"
        if stats.skipped:
            facts += f", {stats.skipped:,} bad records skipped"
        if self._bar is not None:
            self._bar.n = min(read, self.total) if self.total else read
            self._bar.set_postfix_str(facts, refresh=False)
            self._bar.refresh()
            if final:
                self._bar.close()
            return
        line = f"tokenize: {facts}"
        if self.total:
            share = min(read / self.total, 1.0)
            rate = read / elapsed
            eta = (self.total - read) / rate if rate > 0 and not final else 0
            line += f", {share:.0%}, ETA {int(eta) // 60}:{int(eta) % 60:02d}"
        sys.stderr.write("\r" + line + ("\n" if final else ""))
        sys.stderr.flush()


#: Text (characters) per batch at most, whatever the batch size in documents: progress and checkpoints then come
#: about once a second even when documents are long (a novel by paragraph, whole files).
MAX_BATCH_TEXT = 1 << 20


# -- encoding one partition -----------------------------------------------------------------------------


def _batches(
    records: Iterator[Record],
    size: int,
    out: queue.Queue[Any],
    stop: threading.Event,
    counters: list[Any],
    prepare: Callable[[], _Preparing] | None = None,
) -> None:
    """The reader thread: groups records into batches of ``size`` documents, each with the input bytes read up to
    its end (so progress counts what was encoded, not what was read ahead) and, with ``prepare``, what a new
    :class:`_Preparing` makes of it (None without): it is given the batch every :data:`CHAT_CHUNK` records, as they
    are read, and at its end; passes errors on, in order."""
    try:
        batch: list[Record] = []
        text = 0
        preparing = prepare() if prepare else None
        for record in records:
            if stop.is_set():
                return
            batch.append(record)
            text += sum(map(len, record.texts)) if record.texts else 0
            if len(batch) >= size or text >= MAX_BATCH_TEXT:
                out.put((batch, sum(c.count for c in counters), preparing.batch(batch) if preparing else None))
                batch, text = [], 0
                preparing = prepare() if prepare else None
            elif preparing is not None and not len(batch) % CHAT_CHUNK:
                preparing.add(batch)
        if batch:
            out.put((batch, sum(c.count for c in counters), preparing.batch(batch) if preparing else None))
        out.put(None)
    except BaseException as exc:  # delivered to the main thread, which raises it
        out.put(exc)


#: Chat records read into turns at a time, as the reader thread reads them (:class:`_Preparing`): their parsed JSON
#: (an object and a list per record, an object per message: about 8 objects per record with the record's own) is
#: dropped at once, so that what a chunk allocates is freed before the garbage collector's next young collection
#: (every 700 allocations not freed) instead of living until the batch is finished. Held a batch long, those objects
#: set off 4-5x as many young collections and, through them, older ones, full ones included: about 0.05 s of the
#: 30 MB chat row's CPU (`benchmarks/README.md`), all of it holding the GIL.
CHAT_CHUNK = 32


#: Gated engines of this process, by (the selecting function, tokenizer hash, engine asked for, chat run): the gate,
#: the engines' timing and their loading are paid once per tokenizer per process (a run, or a pool's worker), not
#: once per run or partition. The function is part of the key so that a replaced one (a test's) is asked anew.
_GATED: dict[tuple[Any, str, str, bool], tuple[Engine, str]] = {}


def _gated_engine(tokenizer: Any, engine: str, tokenizer_hash: str | None, chat: bool) -> tuple[Engine, str]:
    """:func:`~.engines.select_engine` for ``tokenizer`` (whose ``to_str()`` has SHA-256 ``tokenizer_hash``; None:
    not cached), gating chat message text's way of encoding only for a ``chat`` run."""
    select = select_engine  # looked up at each call, not bound at import
    if tokenizer_hash is None or engine == "tokenizers":
        return select(tokenizer, engine, chat=chat)
    key = (select, tokenizer_hash, engine, chat)
    gated = _GATED.get(key)  # one lookup: another thread may clear the table between two
    if gated is None:
        if len(_GATED) >= 4:  # a process tokenizing with many tokenizers keeps a few engines, not all
            _GATED.clear()
        # The hash also keys the gate's results on disk, so that the next process pays no gate either.
        gated = _GATED[key] = select(tokenizer, engine, chat=chat, tokenizer_hash=tokenizer_hash)
    return gated


#: Text (characters) of documents drawn across the input that ``tokenize`` re-encodes with ``tokenizers`` by
#: default, beyond the first :attr:`Encoder.FIRST_SAMPLE_BYTES`: the verification's cost is then fixed, not a share
#: of the corpus (``verify_bytes=``).
VERIFY_BYTES = 1 << 20


def verification_rate(verify_fraction: float, verify_bytes: int | None, input_bytes: int | None) -> float:
    """The probability with which each document (after the first sample) is re-encoded with ``tokenizers``:
    ``verify_fraction``, lowered so that about ``verify_bytes`` of text are drawn from inputs of ``input_bytes``
    (their size on disk; a compressed input's text is larger, so its sample too). ``verify_bytes`` None: no budget;
    ``input_bytes`` None (an iterable): ``verify_fraction``, and the encoder stops drawing once the budget is
    spent."""
    if verify_bytes is None or not input_bytes:
        return verify_fraction
    return min(verify_fraction, verify_bytes / input_bytes)


class FirstSample(NamedTuple):
    """A run's first sample read ahead (:func:`_first_sample`): its ``texts`` and the reference's ids of them
    (a future)."""

    texts: list[str]
    reference: Future[tuple[np.ndarray, np.ndarray]]


class Encoder:
    """The run's engine, checked against ``tokenizers`` on a sample of the corpus: the first documents, up to
    :attr:`FIRST_SAMPLE_BYTES` of text, then each later document with probability ``verify_fraction``
    (reproducibly: the draw depends on the seed and the partition only), until ``verify_bytes`` of text were drawn
    (None: no limit). ``tokenize`` sets the probability from the input's size (:func:`verification_rate`), so that
    the draws spread over the whole input and the cost is the budget's, whatever the corpus size. Checking
    documents rather than whole batches keeps the cost at what is checked. In a partitioned run only the first
    partition checks the first documents (in the others a difference stops the run, as the gate had chosen): the
    sample's cost is paid once per run, not once per partition."""

    #: Text checked at the start of the run, before any random draw.
    FIRST_SAMPLE_BYTES = 1 << 20
    #: Sampled text (characters) whose check may be outstanding before the encoder waits for the oldest.
    PENDING_TEXT = 8 << 20

    def __init__(
        self,
        tokenizer: Any,
        engine: str,
        verify_fraction: float,
        seed: int,
        partition: int,
        chosen: tuple[Engine, str] | None = None,
        *,
        tokenizer_hash: str | None = None,
        chat: bool = True,
        verify_bytes: int | None = None,
        fall_back: bool = True,
        first_sample: FirstSample | None = None,
    ) -> None:
        #: The first sample as :func:`_first_sample` read it and started its reference encoding before this
        #: encoder was built (the engine's gate then runs beside it); used once, if the run's first sample is it.
        self._first = first_sample
        self.reference = TokenizersEngine(tokenizer, tokenizer_hash)  # shares its chat copy across runs
        self.engine, self.reason = chosen or _gated_engine(tokenizer, engine, tokenizer_hash, chat)
        if isinstance(self.engine, TokenizersEngine):
            self.engine = self.reference  # the reference is not checked against itself
        # Under auto, a difference in the run's first batch switches to tokenizers (nothing was written yet). Not in
        # a parallel run (``fall_back=False``): its other partitions encode with the engine at the same time, so
        # any difference stops the run, as it did when the parent gated and named the engine.
        self.explicit = engine != "auto" or not fall_back or partition != 0
        self.verify_fraction = verify_fraction
        self._draws = np.random.default_rng([seed, partition])
        self.batches = 0
        self._sampled_bytes = 0 if partition == 0 else self.FIRST_SAMPLE_BYTES
        #: Text drawn at random so far, and how much may be (None: no limit).
        self.drawn_bytes, self.verify_bytes = 0, verify_bytes
        #: Where the reference encodes the sampled texts while the engine encodes the batch (set for a run by
        #: :meth:`_PartitionRun.run`); None: checked in line.
        self.verifier: Executor | None = None
        #: Where the engine encodes a batch while the run finishes the one before (set for a run by
        #: :meth:`_PartitionRun.run`); None: encoded in line.
        self.encoding: Executor | None = None
        self._pending: collections.deque[_Check] = collections.deque()

    def encode(
        self, texts: list[str], dtype: np.dtype, where: Any, split_special: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """``texts`` as ``(ids in dtype, lengths)``; ``where(k)`` names text k's record for an error. With
        ``split_special`` (chat message text), special tokens spelled in a text are encoded as text. With a
        :attr:`verifier` (a run's), the reference re-encodes the sampled texts there while the engine encodes the
        batch, and the comparison waits (:meth:`settle`, before every checkpoint): the same documents are
        checked, and a difference raises before anything past the last checkpoint is committed. Only a comparison
        whose outcome may switch the engine (the first batch under ``auto``) is made at once. :meth:`submit` and
        :meth:`result` are its two halves."""
        return self.result(self.submit(texts, where, split_special), dtype)

    def submit(self, texts: list[str], where: Any, split_special: bool = False) -> _Encoding:
        """Start encoding a batch (in :attr:`encoding` when set, else here) and its sample's check; batches are
        submitted in order, and each one's :meth:`result` taken in the same order."""
        chosen, reference = np.zeros(0, np.intp), None
        job: Callable[[], tuple[np.ndarray, np.ndarray]] = partial(encoded, self.engine, texts, split_special)
        if self.engine is not self.reference and texts:
            chosen = self._sample(texts)
            if len(chosen):
                reference = self._reference_ids(texts, chosen, split_special)
        elif texts and (first := self._first_ahead(texts, split_special)) is not None:
            # The reference encodes the batch (no engine passed): the first sample read ahead is its head, whose
            # ids are taken rather than encoded again.
            job = partial(self._reference_batch, texts, np.arange(len(first.texts)), first.reference, split_special)
        if self.encoding is not None:
            ids = self.encoding.submit(job)
        else:
            ids = Future()
            ids.set_result(job())
        self.batches += 1
        return _Encoding(texts, where, split_special, self.engine, ids, chosen, reference, self.batches == 1)

    def result(self, encoding: _Encoding, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
        """The ids of a :meth:`submit` ted batch in ``dtype``, and its lengths; its check compared or deferred. A
        batch the engine encoded before the first batch's check replaced it by the reference is encoded again."""
        texts, split_special, reference = encoding.texts, encoding.split_special, encoding.reference
        if encoding.engine is self.engine:
            flat, lengths = encoding.ids.result()
        elif reference is None:  # the first batch fell back on the reference after this one was started
            flat, lengths = encoded(self.engine, texts, split_special)
        else:  # the same, with a sample the reference encoded already
            flat, lengths = self._reference_batch(texts, encoding.chosen, reference, split_special)
            reference = None  # the reference encoded it all: nothing to check
        if reference is not None:
            check = _Check.of(texts, encoding.chosen, encoding.where, reference, flat, lengths)
            if self.verifier is not None and (not encoding.first or self.explicit):  # raises: compare later
                self._defer(check)
            else:
                self._compare(check, encoding.first)
                if self.engine is self.reference:  # fell back on the first sample: the reference encodes it all
                    flat, lengths = self._reference_batch(texts, encoding.chosen, reference, split_special)
        if flat.dtype.itemsize > dtype.itemsize and len(flat) and flat.max() > np.iinfo(dtype).max:
            k = int(np.searchsorted(np.cumsum(lengths), int(np.argmax(flat > np.iinfo(dtype).max)), side="right"))
            raise EngineMismatchError(  # the cast would wrap it into another, valid-looking id
                f"{self.engine.name} gave id {int(flat.max()):,} for {encoding.where(k)}, beyond the vocabulary's "
                f"{dtype.name}; nothing wrong was written."
            )
        return flat.astype(dtype, copy=False), lengths

    def _reference_batch(
        self, texts: list[str], chosen: np.ndarray, sample: Future[tuple[np.ndarray, np.ndarray]], split_special: bool
    ) -> tuple[np.ndarray, np.ndarray]:
        """The reference's ids of the whole batch, taking the ids of its ``sample`` (of the texts ``chosen``) where
        those are the batch's first texts, as the first sample is, rather than encoding them again."""
        count = len(chosen)
        if not count or int(chosen[-1]) != count - 1:
            sample.cancel()
            return self.reference.encode(texts, split_special)
        head, head_lengths = sample.result()
        if count == len(texts):
            return head, head_lengths
        rest, rest_lengths = self.reference.encode(texts[count:], split_special)
        return np.concatenate([head, rest]), np.concatenate([head_lengths, rest_lengths])

    def _sample(self, texts: list[str]) -> np.ndarray:
        """Which documents of this batch to re-encode with tokenizers."""
        if self._sampled_bytes < self.FIRST_SAMPLE_BYTES:
            count, text = self.first_count(texts, self.FIRST_SAMPLE_BYTES - self._sampled_bytes)
            self._sampled_bytes += max(text, 1)
            return np.arange(count)
        chosen = np.flatnonzero(self._draws.random(len(texts)) < self.verify_fraction)
        if len(chosen) and self.verify_bytes is not None:
            sizes = np.cumsum([len(texts[k]) for k in chosen.tolist()])
            room = self.verify_bytes - self.drawn_bytes  # what fits the budget (the draw itself is unchanged)
            chosen = chosen[: int(np.searchsorted(sizes, room, side="right"))]
            self.drawn_bytes += int(sizes[len(chosen) - 1]) if len(chosen) else 0
        return chosen

    def _first_ahead(self, texts: list[str], split_special: bool) -> FirstSample | None:
        """The first sample read ahead (once: later calls get None) when ``texts`` begin with its texts and are
        encoded the same way (no ``split_special``); else None, its encoding cancelled."""
        first, self._first = self._first, None
        if first is None:
            return None
        if not split_special and texts[: len(first.texts)] == first.texts:
            return first
        first.reference.cancel()
        return None

    @staticmethod
    def first_count(texts: list[str], room: int) -> tuple[int, int]:
        """How many of ``texts``, from the first, the first sample takes when ``room`` characters of it are left
        (at least one), and their characters."""
        sizes = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
        count = min(len(texts), max(1, int(np.searchsorted(np.cumsum(sizes), room, side="right"))))
        return count, int(sizes[:count].sum())

    def _reference_ids(
        self, texts: list[str], chosen: np.ndarray, split_special: bool
    ) -> Future[tuple[np.ndarray, np.ndarray]]:
        """The reference's ids of the chosen texts: being encoded in the :attr:`verifier` (``tokenizers`` releases
        the GIL), or here when there is none; the prefetched first sample's when these are its texts."""
        picked = [texts[k] for k in chosen.tolist()]
        first = self._first_ahead(picked, split_special)
        if first is not None and len(first.texts) == len(picked):
            return first.reference
        if first is not None:
            first.reference.cancel()
        if self.verifier is not None:
            return self.verifier.submit(self.reference.encode, picked, split_special)
        done: Future[tuple[np.ndarray, np.ndarray]] = Future()
        done.set_result(self.reference.encode(picked, split_special))
        return done

    def _defer(self, check: _Check) -> None:
        """Keep ``check`` until its reference ids are in; compare the finished ones in order, waiting for the oldest
        while more than :attr:`PENDING_TEXT` of sampled text is outstanding (the default budget never is: the
        encoder does not wait for the reference before a checkpoint)."""
        self._pending.append(check)
        while self._pending and (
            self._pending[0].reference.done() or sum(c.text for c in self._pending) > self.PENDING_TEXT
        ):
            self._compare(self._pending.popleft(), False)

    def settle(self) -> None:
        """Compare every check still outstanding, in order: a difference raises
        :class:`~tokformats.engines.EngineMismatchError` here. Called before a checkpoint commits the spools and
        before the outputs are written, so that nothing a check has not passed is ever committed."""
        while self._pending:
            self._compare(self._pending.popleft(), False)

    def discard(self) -> None:
        """Drop the outstanding checks (the run is failing anyway; the spools past the checkpoint are cut on
        resume)."""
        for check in self._pending:
            check.reference.cancel()
        self._pending.clear()
        if self._first is not None:
            self._first.reference.cancel()
            self._first = None

    def _compare(self, check: _Check, first: bool) -> None:
        """Compare a batch's check; a difference in the ``first`` batch under ``auto`` switches to the reference,
        any other raises."""
        n = differing_text(*check.reference.result(), check.ids, check.lengths)
        if n is None:
            return
        message = f"{self.engine.name} gave other ids than tokenizers for {check.names[n]} ({check.texts[n][:60]!r})"
        if not first or self.explicit:
            raise EngineMismatchError(
                f"{message}; nothing wrong was written. Resume with {option('engine', repr('tokenizers'))}: "
                "the output is the same whichever engine runs."
            )
        self.engine, self.reason = self.reference, f"{message} on the first batch: tokenizers runs instead"


class _Encoding(NamedTuple):
    """A batch :meth:`Encoder.submit` started: its texts, how to name text k (``where``) and ``split_special``,
    the ``engine`` that encodes it and its future ``ids`` (flat ids, lengths), the texts ``chosen`` for the check
    and the reference's future ids of them (None: no check), and whether it is the run's ``first`` batch."""

    texts: list[str]
    where: Any
    split_special: bool
    engine: Engine
    ids: Future[tuple[np.ndarray, np.ndarray]]
    chosen: np.ndarray
    reference: Future[tuple[np.ndarray, np.ndarray]] | None
    first: bool


class _Check(NamedTuple):
    """A batch's sampled documents waiting for comparison, and only them (the batch itself is not kept): their
    texts and records' names (for the message), the reference's ids (a future) and the engine's ids."""

    texts: list[str]
    names: list[str]
    reference: Future[tuple[np.ndarray, np.ndarray]]
    ids: np.ndarray
    lengths: np.ndarray
    #: Characters of sampled text.
    text: int

    @classmethod
    def of(
        cls,
        texts: list[str],
        chosen: np.ndarray,
        where: Any,
        reference: Future[tuple[np.ndarray, np.ndarray]],
        flat: np.ndarray,
        lengths: np.ndarray,
    ) -> _Check:
        """The check of the texts ``chosen`` (ascending, distinct: :meth:`Encoder._sample`'s) of a batch the engine
        encoded as ``flat``/``lengths``, against the ``reference``'s ids of them."""
        picked = chosen.tolist()
        offsets = offsets_from_lengths(lengths)
        if picked and picked[-1] == len(picked) - 1:  # the batch's first texts (the first sample): one slice
            ids = flat[: offsets[len(picked)]].copy()  # a copy: a deferred check does not hold the batch
        else:
            ids = np.concatenate([flat[offsets[k] : offsets[k + 1]] for k in picked])
        sampled = [texts[k] for k in picked]
        names = [str(where(k)) for k in picked]
        return cls(sampled, names, reference, ids, lengths[chosen], sum(map(len, sampled)))


def _add_eos(
    plan: Plan, flat: np.ndarray, lengths: np.ndarray, delimit_empty: bool
) -> tuple[np.ndarray, np.ndarray]:
    if plan.eos == "none" or plan.eos_id is None:
        return flat, lengths
    # Some owners add no end-of-document id to an empty document (Megatron's preprocess_data).
    only = None if delimit_empty else lengths > 0
    return add_delimiter(flat, lengths, plan.eos_id, before=plan.eos == "prepend", only=only)


class _Place(NamedTuple):
    """Where a record is, worded when an error message needs it (most records never do)."""

    source: Input
    line: int

    def __str__(self) -> str:
        if self.source.path is None:
            return f"item {self.line}"
        return f"{self.source.name}, line {self.line}"


def _chat_eos(plan: Plan, delimit_empty: bool) -> EndOfDocument | None:
    """Where a chat run's end-of-document id goes: after (or before) each conversation, trained on where the
    conversation's last message is (so the model learns to stop) and never before the first; not added to an empty
    one where the format's owner adds none (Megatron)."""
    if plan.eos == "none" or plan.eos_id is None:
        return None
    return EndOfDocument(plan.eos_id, before=plan.eos == "prepend", empty=delimit_empty)


def _load_checkpoint(folder: Path, plan: Plan, resume: bool) -> dict[str, Any]:
    """The checkpoint of an unfinished run in ``folder`` (empty for a new one, whose folder is made): refused without
    ``resume``, or when it was written with other settings."""
    checkpoint = folder / CHECKPOINT
    if not checkpoint.exists():
        folder.mkdir(parents=True, exist_ok=True)
        return {}
    state = read_json_object(checkpoint)  # bounded, and a damaged one is a FormatError naming it
    if not resume:
        raise OutputExistsError(
            f"{folder} holds an unfinished run; pass {option('resume')} to continue it, or "
            f"{option('overwrite')} to start over."
        )
    if state.get("plan") != asdict(plan):
        before, now = state.get("plan") or {}, asdict(plan)
        changed = [k for k in now if before.get(k) != now[k]]
        detail = "; ".join(f"{k} was {before.get(k)!r:.80}, now {now[k]!r:.80}" for k in changed[:3])
        raise FormatError(
            f"{checkpoint} was written by a run with other settings ({detail}); it cannot be resumed with these. "
            f"Run with the same settings to resume, or pass {option('overwrite')} to start over."
        )
    return state


class _ChatBatch(NamedTuple):
    """A batch of chat records as :meth:`_PartitionRun.prepare_chat` made it: the ``good`` records that hold a
    conversation, their ``turns`` and the template's ``layout`` of them (None when there are none), and the
    errors of the records ``skipped`` (``on_error="skip"``)."""

    good: list[Record]
    turns: Turns
    layout: Layout | None
    skipped: list[str]


class _Started(NamedTuple):
    """A batch :meth:`_PartitionRun.start` started: the ``batch``, its ``good`` records, the errors of those
    ``skipped``, the ``chat`` batch (None in a text run), and one encoding per text key (a chat run's: one, None
    when its conversations hold no message text)."""

    batch: list[Record]
    good: list[Record]
    skipped: list[str]
    chat: _ChatBatch | None
    encodings: list[_Encoding | None]


class _PartitionRun:
    """Encoding one partition's inputs (global numbers ``first_input...``) into spools in ``folder``: the spools,
    the counters and the position reached, checkpointed every ``checkpoint_every`` seconds; resumable."""

    def __init__(
        self,
        plan: Plan,
        encoder: Encoder,
        inputs: list[Input],
        first_input: int,
        folder: Path,
        *,
        resume: bool,
        chat: ChatSpec | None = None,
    ) -> None:
        self.plan, self.encoder, self.inputs, self.first_input = plan, encoder, inputs, first_input
        self.chat = chat
        self.chat_encoder = chat.encoder(encoder.reference.tokenizer) if chat is not None else None
        self.checkpoint = folder / CHECKPOINT
        self.dtype = dtype_for_vocab(plan.vocab_size)
        state = _load_checkpoint(folder, plan, resume)
        counted = state.get("stats", {})
        self.stats = Stats(**{k: v for k, v in counted.items() if k in ("records", "documents", "tokens", "skipped")})
        self.stats.errors = list(state.get("errors", []))
        recorded = state.get("spools", {})
        self.spools = {
            stream: Spool(
                folder,
                _stream_name(*stream),
                self.dtype,
                **recorded.get(_stream_name(*stream), {}),
                masked=bool(chat),
                vocab_size=plan.vocab_size,
            )
            for stream in plan.streams
        }
        input_number, record = state.get("position", (first_input, 0))
        self.position = (int(input_number), int(record))
        self.done = bool(state.get("done"))
        # One provenance row per spooled document, beside each spool (empty when provenance is off).
        self.sources = {
            stream: RowSpool(folder / f"{_stream_name(*stream)}.provenance", self.spools[stream].num_documents)
            for stream in (plan.streams if plan.provenance else [])
        }
        self.delimit_empty = api.corpus_writer(plan.format).delimit_empty_documents
        self.fractions = list(plan.split.values()) if plan.split else [1.0]

    def save(self, done: bool = False) -> None:
        """Checkpoint: every outstanding check of the engine passed (a difference raises before anything is
        committed), every spool fsynced, then the counts and the position committed in one step."""
        self.encoder.settle()
        if done:  # each ids spool read back (for its pin) while another thread fsyncs: both wait on the kernel
            self._synced_and_read_back()
        else:
            for spool in self.spools.values():
                spool.sync()
        for rows in self.sources.values():
            rows.sync()
        stats = self.stats
        _write_json_atomically(
            self.checkpoint,
            {
                "plan": asdict(self.plan),
                "position": list(self.position),
                "spools": {_stream_name(*s): self._spooled(sp, pin=done) for s, sp in self.spools.items()},
                "stats": {
                    "records": stats.records,
                    "documents": stats.documents,
                    "tokens": stats.tokens,
                    "skipped": stats.skipped,
                },
                "errors": stats.errors[-100:],
                "done": done,
            },
        )

    def _synced_and_read_back(self) -> None:
        """Every spool fsynced, in a thread of its own, while each ids spool is read back here (hashing releases
        the GIL): the last checkpoint's two passes over the ids (0.08 and 0.1 s for 125 MB) overlap instead of
        following each other at the end of the run. Both are done (or one raised) when this returns."""
        spools = list(self.spools.values())
        for spool in spools:
            spool.flush()

        def fsync_all() -> None:
            for spool in spools:
                spool.fsync()

        with ThreadPoolExecutor(1, thread_name_prefix="tokformats-sync") as syncing:
            synced = syncing.submit(fsync_all)
            try:
                for spool in spools:
                    spool.read_back()
            except BaseException as refused:  # the fsync's own failure (an EIO, maybe the cause) is not lost
                if (failed := synced.exception()) is not None:
                    refused.add_note(f"The spools' fsync failed too: {failed!r}")
                raise
            synced.result()

    @staticmethod
    def _spooled(spool: Spool, *, pin: bool) -> dict[str, Any]:
        """A spool's checkpoint entry: its counts and hashes, and in the last checkpoint its pin."""
        entry: dict[str, Any] = {"tokens": spool.num_tokens, "documents": spool.num_documents, "hashes": spool.hashes()}
        if pin:
            entry["pin"] = spool.pin()
        return entry

    def close(self) -> None:
        """Close every spool."""
        for spool in self.spools.values():
            spool.close()
        for rows in self.sources.values():
            rows.close()

    def _spool_sources(self, key: str, good: list[Record], split_of: np.ndarray) -> None:
        """Append the good records' sources (global input number, record number, byte offset) to the provenance
        spools of their splits, in the order :meth:`_spool` appends their documents."""
        if not self.sources:
            return
        rows = np.empty(len(good), dtype=ROW_DTYPE)
        rows["input"] = [r.input + self.first_input for r in good]  # three comprehensions: faster than tuples
        rows["record"] = [r.index for r in good]
        rows["offset"] = [r.offset for r in good]
        for s, split in enumerate(self.plan.splits):
            chosen = rows if len(self.fractions) == 1 else rows[split_of == s]
            if len(chosen):
                self.sources[(key, split)].append(chosen)

    def _good_records(self, batch: list[Record], skipped: list[str]) -> list[Record]:
        """The batch's records that hold text; a bad one raises, or its error goes to ``skipped`` with
        ``on_error="skip"``."""
        good = []
        for record in batch:
            if record.texts is not None:
                good.append(record)
            elif record.error is not None:
                if self.plan.on_error != "skip":
                    raise SourceError(
                        f"{record.error} Pass {option('on_error', repr('skip'))} to count and skip bad records."
                    )
                skipped.append(record.error)
        return good

    def _spool(
        self, key: str, flat: np.ndarray, lengths: np.ndarray, split_of: np.ndarray, mask: np.ndarray | None = None
    ) -> None:
        """Append one text key's encoded documents (and their loss masks) to the spools of their splits."""
        if len(self.fractions) == 1:
            self.spools[(key, self.plan.splits[0])].append(flat, lengths, mask)
            return
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        for s, split in enumerate(self.plan.splits):
            chosen = np.flatnonzero(split_of == s)
            if chosen.size:
                spans = [slice(offsets[i], offsets[i + 1]) for i in chosen.tolist()]
                picked = None if mask is None else np.concatenate([mask[span] for span in spans])
                tokens = np.concatenate([flat[span] for span in spans])
                self.spools[(key, split)].append(tokens, lengths[chosen], picked)

    def _where(self, record: Record) -> _Place:
        """A record's place for messages: its file and line (an iterable's item), worded only when an error is."""
        return _Place(self.inputs[record.input], record.index)

    def prepare_chat(self, batch: list[Record]) -> _ChatBatch:
        """A batch of chat records read into turns and laid out by the template: the Python half of a chat batch,
        which :meth:`run` has its reader thread do while the engine encodes the batch before (the engine releases
        the GIL), a chunk of records at a time as they are read (:class:`_Preparing`; this is its whole-batch form,
        for a batch :meth:`start` is given unprepared). It changes nothing of the run: the skipped records' errors
        go with the batch, counted when the batch is taken, so that a checkpoint never counts a batch ahead of its
        position. The records' parsed JSON is dropped (read into the turns)."""
        return _Preparing(self).batch(batch)

    def _take_chat(self, prepared: _ChatBatch, encoding: _Encoding | None) -> None:
        """A batch's conversations, their message texts' encoding started (None: they have none), with their loss
        masks into the spools."""
        encoder, good, layout = self.chat_encoder, prepared.good, prepared.layout
        if encoder is None:
            raise ValueError("a text run has no chat encoder")
        if layout is None:
            raise ValueError("a chat batch without conversations has nothing to encode")

        def content(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
            if encoding is None or encoding.texts is not texts:
                raise ValueError("the batch's message texts are not the ones whose encoding was started")
            return self.encoder.result(encoding, self.dtype)

        eos = _chat_eos(self.plan, self.delimit_empty)
        flat, lengths, mask, _ = encoder.encode_layout(prepared.turns, layout, content, self.dtype, eos)
        split_of = self._split_of(good)
        self._spool(self.plan.keys[0], flat, lengths, split_of, mask)
        self._spool_sources(self.plan.keys[0], good, split_of)
        self.stats.documents += len(good)
        self.stats.tokens += len(flat)

    def _split_of(self, good: list[Record]) -> np.ndarray:
        if len(self.fractions) == 1:  # one split: no draw (the spooling ignores it)
            return np.zeros(len(good), dtype=np.intp)
        return assign_splits(
            self.plan.seed,
            np.array([r.input + self.first_input for r in good], dtype=np.int64),
            np.array([r.index for r in good], dtype=np.int64),
            self.fractions,
        )

    def start(self, batch: list[Record], prepared: _ChatBatch | None = None) -> _Started:
        """Start encoding one batch of records (a chat run's as :meth:`prepare_chat` made it, made here when not
        given): in a run, the engine encodes it in a thread of its own while the batch before is finished."""
        if self.chat is not None:
            prepared = prepared or self.prepare_chat(batch)
            texts = [] if prepared.layout is None else prepared.layout.texts
            started = self.encoder.submit(texts, _chat_message, split_special=True) if texts else None
            return _Started(batch, prepared.good, prepared.skipped, prepared, [started])
        skipped: list[str] = []
        good = self._good_records(batch, skipped)
        where = partial(_record_name, self.inputs, good)
        keys = range(len(self.plan.keys)) if good else range(0)
        encodings: list[_Encoding | None] = [
            self.encoder.submit([r.texts[k] for r in good if r.texts], where) for k in keys
        ]
        return _Started(batch, good, skipped, None, encodings)

    def finish(self, started: _Started) -> None:
        """Finish a :meth:`start` ed batch: its ids (checked) into the spools, the counts, and the position past
        it."""
        good = started.good
        self.stats.skipped += len(started.skipped)
        self.stats.errors += started.skipped
        self.stats.records += len(started.batch)
        if started.chat is not None and good:
            self._take_chat(started.chat, started.encodings[0])
        elif good:
            split_of = self._split_of(good)
            for k, (key, encoding) in enumerate(zip(self.plan.keys, started.encodings)):
                if encoding is None:
                    raise ValueError("a batch of text records was started without their texts")
                flat, lengths = self.encoder.result(encoding, self.dtype)
                flat, lengths = _add_eos(self.plan, flat, lengths, self.delimit_empty)
                self._spool(key, flat, lengths, split_of)
                self._spool_sources(key, good, split_of)
                if k == 0:
                    self.stats.documents += len(good)
                self.stats.text += sum(map(len, encoding.texts))  # the texts started: the good records' key k
                self.stats.tokens += len(flat)
        last = started.batch[-1]
        self.position = (last.input + self.first_input, last.index)

    def run(self, *, batch_size: int, progress: Progress | None, checkpoint_every: float) -> None:
        """Read the inputs from the position in a reader thread (a few batches ahead, never the corpus) and encode
        them batch by batch, checkpointing as it goes; the last checkpoint says ``done``."""
        counters: list[Any] = [] if progress is None else progress.counters
        local_start = (self.position[0] - self.first_input, self.position[1])
        keys = None if self.chat is not None else tuple(self.plan.keys)  # chat records are read whole
        records = iter_records(self.inputs, keys, self.plan.unit, start=local_start, counter=counters)
        batches: queue.Queue[Any] = queue.Queue(maxsize=4)
        stop = threading.Event()
        prepare = partial(_Preparing, self) if self.chat is not None else None
        reader = threading.Thread(
            target=_batches, args=(records, batch_size, batches, stop, counters, prepare), daemon=True
        )
        reader.start()
        # The reference encodes the sampled documents in a thread of its own, and the engine each batch in another
        # while this one finishes the batch before (its ids into the spools): the engines release the GIL, so on
        # two cores the check and this thread's Python overlap the encoding instead of following it.
        verifier = ThreadPoolExecutor(1, thread_name_prefix="tokformats-verify")
        encoding = ThreadPoolExecutor(1, thread_name_prefix="tokformats-encode")
        self.encoder.verifier, self.encoder.encoding = verifier, encoding
        with contextlib.ExitStack() as cleanup:  # each step runs even when one before it is interrupted
            cleanup.callback(_stop_reader, reader, batches, stop)
            cleanup.callback(verifier.shutdown, wait=True, cancel_futures=True)
            cleanup.callback(encoding.shutdown, wait=True, cancel_futures=True)
            cleanup.callback(self.encoder.discard)  # nothing is left after the last save; on an error, no one waits
            cleanup.callback(setattr, self.encoder, "encoding", None)
            cleanup.callback(setattr, self.encoder, "verifier", None)
            self._encode_batches(batches, progress, checkpoint_every)
            self.save(done=True)

    def _encode_batches(self, batches: queue.Queue[Any], progress: Progress | None, checkpoint_every: float) -> None:
        """Start each batch the reader passes, then finish the one before it. A batch's own error comes first, as
        in a serial run: when the reader passes an error, or starting the next batch raises, the batch started
        before it is finished (and raises if it fails) before that error is raised."""
        last_save = time.perf_counter()
        started: tuple[_Started, int] | None = None
        while True:
            item = batches.get()
            try:
                if isinstance(item, BaseException):
                    raise item
                following = None if item is None else (self.start(item[0], item[2]), item[1])
            except Exception:
                if started is not None:
                    self._finish_one(*started, progress, checkpoint_every, last_save)
                raise
            if started is not None:
                last_save = self._finish_one(*started, progress, checkpoint_every, last_save)
            if following is None:
                return
            started = following

    def _finish_one(
        self, started: _Started, read_through: int, progress: Progress | None, every: float, last_save: float
    ) -> float:
        """:meth:`finish` a batch, report the progress, and checkpoint when ``every`` seconds have passed since
        ``last_save``; the time of the last checkpoint."""
        self.finish(started)
        if progress is not None:
            progress.encoded = read_through
            progress.update(self.stats)
        if time.perf_counter() - last_save >= every:
            self.save()
            last_save = time.perf_counter()
        return last_save


class _Preparing:
    """A chat batch read into turns as the reader thread reads its records: :meth:`add` is given the batch so far and
    reads the records not read yet (their parsed JSON dropped once read: see :data:`CHAT_CHUNK`), as long as every
    chunk so far was in the common form (:attr:`TurnsReader.gathering`; else the rest waits for the batch's end, to
    be read in one call); :meth:`batch` reads the rest, joins the turns and lays them out
    (:meth:`_PartitionRun.prepare_chat`). A batch's bad records are reported as a batch read whole reports them,
    whatever the chunks: every record that is not JSON (or has no text) first, in order, then every record that is
    not a conversation, in order; without ``on_error="skip"`` the first of them raises."""

    def __init__(self, run: _PartitionRun) -> None:
        if run.chat is None or run.chat_encoder is None:
            raise ValueError("a text run has no conversations")
        self.run, self.encoder = run, run.chat_encoder
        self.read = 0
        self.good: list[Record] = []
        self.turns = TurnsReader(run.chat.schema)
        #: The errors of the records read that are not JSON (or hold no text), then of those that are not
        #: conversations: raised (the first) or skipped at the batch's end, when a later chunk can add none. Kept as
        #: text: an error object's traceback would hold the chunk's parsed JSON in a reference cycle.
        self.not_json: list[str] = []
        self.not_conversations: list[str] = []

    def add(self, batch: list[Record], *, last: bool = False) -> None:
        """Read the records of ``batch`` after those read already (unless the chunks stopped being gathered and
        this is not the ``last`` call)."""
        if not (last or self.turns.gathering):
            return
        records, self.read = batch[self.read :], len(batch)
        good = [r for r in records if r.texts is not None]
        self.not_json += [r.error for r in records if r.texts is None and r.error is not None]  # blank lines: none
        if good:
            values, where = [r.value for r in good], lambda k: self.run._where(good[k])
            kept = self.turns.add(values, where, lambda error: self.not_conversations.append(str(error)))
            self.good += good if len(kept) == len(good) else [good[k] for k in kept]
        for record in records:  # read into the turns: the objects of its parsed JSON can go now
            record.value = None

    def batch(self, batch: list[Record]) -> _ChatBatch:
        """The whole ``batch``, read and laid out; a record that is not a conversation raised, or skipped."""
        self.add(batch, last=True)  # the records after the last chunk read
        if self.run.plan.on_error != "skip" and (self.not_json or self.not_conversations):
            hint = f"Pass {option('on_error', repr('skip'))} to count and skip bad records."
            if self.not_json:
                raise SourceError(f"{self.not_json[0]} {hint}")
            raise ChatError(f"{self.not_conversations[0]} {hint}")
        turns = self.turns.turns()
        skipped = self.not_json + self.not_conversations
        return _ChatBatch(self.good, turns, self.encoder.layout(turns) if self.good else None, skipped)


def _stop_reader(reader: threading.Thread, batches: queue.Queue[Any], stop: threading.Event) -> None:
    """Stop the reader thread, unblocking it if it waits on a full queue."""
    stop.set()
    while reader.is_alive():
        try:
            batches.get_nowait()
        except queue.Empty:
            reader.join(0.05)


def _record_name(inputs: list[Input], good: list[Record], n: int) -> str:
    """How an error names text ``n`` of a batch of ``good`` records."""
    return f"{inputs[good[n].input].name}, record {good[n].index}"


def _chat_message(n: int) -> str:
    """How an error names a chat message text."""
    return "a chat message"


def _encode_partition(
    plan: Plan,
    encoder: Encoder,
    inputs: list[Input],
    first_input: int,
    folder: Path,
    *,
    batch_size: int,
    resume: bool,
    progress: Progress | None,
    checkpoint_every: float = 5.0,
    chat: ChatSpec | None = None,
) -> Stats:
    """Encode ``inputs`` (global numbers ``first_input...``) into spools in ``folder`` with ``encoder`` (chat records
    with ``chat``); resumable (a partition a checkpoint says is done is not read again)."""
    # A partition has one writer at a time. Waiting, not refusing: the only other owner there can be is an orphaned
    # worker of a killed run (the run's own work folder lock refuses live runs), and its watchdog ends it at once.
    with owned_folder(folder, wait=PARTITION_WAIT, what="worker encoding this partition"):
        run = _PartitionRun(plan, encoder, inputs, first_input, folder, resume=resume, chat=chat)
        try:
            if not run.done:
                run.run(batch_size=batch_size, progress=progress, checkpoint_every=checkpoint_every)
            else:  # a done partition resumed: its spools were just read back and checked against the checkpoint;
                run.save(done=True)  # pinned anew, so that the join need not read them again
        finally:
            run.close()
    return run.stats


# -- partitions ---------------------------------------------------------------------------------------


#: A worker process's tokenizers and gated engines, by (the selecting function, tokenizer hash, engine asked for,
#: chat run): built once for all the partitions (and runs) it encodes. The one cache of a worker's engines (the
#: in-process runs' ``_GATED`` is not also filled): a pool's process keeps at most two tokenizers.
_WORKER_ENGINES: dict[tuple[Any, str, str, bool], tuple[Any, tuple[Engine, str]]] = {}
#: Held while a worker builds: a thread pool's workers wait for the first one's engine instead of each building one.
_WORKER_BUILDING = threading.Lock()


def _new_building_lock() -> None:
    """In a forked child: a fresh lock (the parent's may have been held by a thread that the child does not have)."""
    global _WORKER_BUILDING
    _WORKER_BUILDING = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_building_lock)


def _worker_engine(
    tokenizer_path: str, tokenizer_hash: str, engine: str, chat: bool = True
) -> tuple[Any, tuple[Engine, str]]:
    """The tokenizer and the gated engine of a worker process, from the run's ``tokenizer.json`` in its work folder
    (checked against the plan's hash: the file is on a shared file system, and a stale or damaged copy must not
    encode a single document); a tokenizer the process has already built is not read again."""
    select = select_engine  # looked up at each call, not bound at import (a test replaces it)
    key = (select, tokenizer_hash, engine, chat)
    built = _WORKER_ENGINES.get(key)  # one lookup: a thread pool's other worker may clear the table between two
    if built is None:
        with _WORKER_BUILDING:
            built = _WORKER_ENGINES.get(key)  # built while this thread waited
            if built is None:
                if len(_WORKER_ENGINES) >= 2:
                    _WORKER_ENGINES.clear()
                tokenizer = _worker_tokenizer(tokenizer_path, tokenizer_hash)
                # The hash keys the gate's results on disk: a worker after the first process's gate pays none.
                built = _WORKER_ENGINES[key] = (tokenizer, select(tokenizer, engine, chat=chat,
                                                                  tokenizer_hash=tokenizer_hash))  # fmt: skip
    return built


def _worker_tokenizer(tokenizer_path: str, tokenizer_hash: str) -> Any:
    """The run's tokenizer from its ``tokenizer.json``, refused unless its SHA-256 is ``tokenizer_hash``."""
    import hashlib

    from tokenizers import Tokenizer

    data = Path(tokenizer_path).read_bytes()
    found = hashlib.sha256(data).hexdigest()
    if found != tokenizer_hash:
        raise FormatError(
            f"{tokenizer_path} has SHA-256 {found}, but the run's tokenizer has {tokenizer_hash}; rerun with "
            f"{option('overwrite')}."
        )
    return Tokenizer.from_str(data.decode("utf-8"))


def _partition_job(args: tuple[Any, ...]) -> dict[str, Any]:
    """Run in an executor worker: encode one partition; its counters, and the engine that encoded it and why.
    Module-level, so that it pickles by reference."""
    plan_dict, tokenizer_path, pieces, first_input, ordinal, folder, settings, engine = args[:8]
    origin, chat, threads = args[8:]
    batch_size, resume, checkpoint_every = settings
    plan = Plan(**plan_dict)
    name, fraction = engine
    limit_threads(threads, origin[1])  # before the engine's first batch starts its thread pool
    with parent_watch(origin):  # an orphan of a killed run stops at once instead of writing on into its spools
        tokenizer, chosen = _worker_engine(tokenizer_path, plan.tokenizer_hash, name, chat is not None)
        encoder = Encoder(tokenizer, name, fraction, seed=plan.seed, partition=ordinal, chosen=chosen,
                          tokenizer_hash=plan.tokenizer_hash, fall_back=False)  # fmt: skip
        stats = _encode_partition(
            plan,
            encoder,
            [Input(Path(path), start=start, stop=stop, first_record=first) for path, start, stop, first in pieces],
            first_input,
            Path(folder),
            batch_size=batch_size,
            resume=resume,
            progress=None,
            checkpoint_every=checkpoint_every,
            chat=chat,
        )
    return {"stats": asdict(stats), "engine": encoder.engine.name, "engine_reason": encoder.reason}


# -- the entry point ------------------------------------------------------------------------------------


def tokenize(
    inputs: Any,
    tokenizer: Any,
    output: Any,
    format: str | None = None,
    *,
    text_key: str | list[str] = "text",
    eos: str | None = None,
    eos_id: int | None = None,
    split: Any = None,
    seed: int = 0,
    unit: str = "line",
    batch_size: int = 1000,
    progress: bool | None = None,
    resume: bool = False,
    on_error: str = "raise",
    executor: Executor | None = None,
    partitions: int | None = None,
    overwrite: bool = False,
    checkpoint_every: float = 5.0,
    engine: str = "auto",
    verify_fraction: float = 0.01,
    verify_bytes: int | None = VERIFY_BYTES,
    chat: Any = None,
    template: str = "chatml",
    train_on: str = "assistant",
    thought: str = "train",
    provenance: bool = True,
    **writer_options: Any,
) -> dict[str, Any]:
    """Tokenize text (or conversations, with ``chat=``) into ``format`` files; returns a summary (documents, tokens,
    bytes, seconds, per output).

    Args:
        inputs: files, globs or folders (``.txt``, ``.json``, ``.jsonl``, ``.parquet``; ``.gz``/``.zst``), or an
            iterable of strings (a ``datasets.Dataset`` column works).
        tokenizer: a ``tokenizers.Tokenizer``, a ``tokenizer.json``, a folder holding one, a vocabulary name
            (``"cl100k_base"``, ``"o200k_base"``, ``"llama3"``, ``"deepseek_v3"``; offline) or a ``.tiktoken`` rank
            file.
        output: the output path prefix (see :func:`output_paths` for the names).
        format: any corpus format with a writer (``tokformats.formats`` lists them); by default the registry's
            default corpus format (Megatron's indexed dataset).
        text_key: JSON/Parquet key(s) holding the text; several keys give several outputs.
        eos: ``append`` the end-of-text id after each document, ``prepend`` it, or ``none``; by default the
            format's own convention (llm.c: ``prepend``, as its writers do; the others: ``append``).
        eos_id: the id to use; default: the tokenizer's ``<|endoftext|>`` (Llama 3: ``<|end_of_text|>``, DeepSeek: its
            end of sentence, id 1).
        split: ``{"train": 0.8, "val": 0.1, "test": 0.1}`` or ``"8:1:1"``: by document, reproducible from ``seed``.
        unit: for ``.txt``: a document per ``line``, per ``file`` or per blank-line ``paragraph``.
        batch_size: documents per ``encode_batch_fast`` call.
        progress: a progress line on stderr (default: when stderr is a terminal).
        resume: continue a run that was interrupted (its work folder ``OUTPUT.tokenize`` is kept until success).
        on_error: ``raise`` on a bad record (naming file and line), or ``skip`` and count it.
        executor: a ``concurrent.futures.Executor`` (a process pool, dask's ``client.get_executor()``, ...) to
            encode partitions of the inputs in parallel; the result equals a single-process run. Each worker
            process gates ``engine`` itself (the summary's ``engine`` is the first partition's). Its workers are
            started (one small job per core) as soon as the run owns its work folder, while the tokenizer loads.
            A standard-library process pool's workers each give their engine ``max(1, C // N)`` threads (N workers,
            C cores; :func:`~.executors.engine_threads`, :func:`~.engines.limit_threads`).
        partitions: how many partitions (default: one per input file, and one per 64 MiB where the inputs are
            larger). Large files are cut at line starts (JSON Lines, text per line) or row groups (Parquet); the
            output is byte-identical to a single-process run whatever the partitioning
            (:mod:`tokformats.tokenization.partitions`).
        overwrite: replace existing outputs.
        checkpoint_every: seconds between checkpoints (spools fsynced, position recorded): what a crash can lose.
        engine: ``auto`` (fastokens when installed and it passes the identity gate, else tokenizers),
            ``fastokens`` (the same gate; an error when it is missing or differs) or ``tokenizers``. See
            :mod:`tokformats.engines`; the output is the same whichever engine runs.
        verify_fraction: a faster engine's ids are checked against tokenizers' during the run: the first MiB of
            text (the first documents), then each later document with this probability at most (drawn from the
            seed, spread over the whole input); a difference stops the run with
            :class:`~tokformats.engines.EngineMismatchError`. 0: the first MiB only.
        verify_bytes: the text of the documents drawn after the first MiB, counted in characters (bytes for ASCII
            text; the first MiB is counted so too): the probability is lowered so that about this much (1 MiB by
            default) is drawn across the input (its size on disk: a compressed input's
            text, hence its sample, is larger by its compression ratio; an iterable's draws stop at it). None: every
            document with probability ``verify_fraction`` (the earlier behaviour).
        chat: read each record as a conversation: ``"messages"`` (OpenAI), ``"sharegpt"``, ``"alpaca"``, or a
            callable ``record -> messages`` (see :mod:`tokformats.tokenization.chat`); each conversation is one
            document, stored with its loss mask (the format must store masks). None: plain text.
        template: ``"chatml"`` (built in, the seed tokenizer's specials; see
            :mod:`tokformats.tokenization.templates`), ``"tokenizer"`` (the Jinja ``chat_template`` of the
            ``tokenizer_config.json`` beside the tokenizer; needs jinja2), a path to such a file or a ``.jinja``
            file, or Jinja text.
        train_on: which tokens the mask trains on: the ``"assistant"``'s turns, ``"all"``, or the ``"last"``
            assistant turn only.
        thought: ``"train"`` on assistants' thoughts or ``"mask"`` them.
        provenance: record each document's source (input file, line or row, byte offset) in a sidecar beside each
            output (``OUTPUT.provenance.npz``, see :mod:`tokformats.core.provenance`), read by ``r.provenance(i)``.
        **writer_options: passed to the format's writer (``shard_size``, ``tokens_per_shard``, ``dtype``, ...).
    """
    started = time.perf_counter()
    format = format or default_corpus_format()
    writer_class = api.corpus_writer(format)
    eos = _eos_mode(eos, writer_class, on_error, verify_fraction, engine)
    resolved = resolve_inputs(inputs)
    work = Path(f"{output}.tokenize")
    with _owned_work_folder(work), contextlib.ExitStack() as naming:  # one run at a time: a second one is refused
        _start_workers(executor, resolved, partitions)  # while the tokenizer is loaded here, not after
        loaded = load_tokenizer(tokenizer)
        naming.enter_context(_naming_output(output))  # the run's own files from here: not the tokenizer's
        plan, serialised = _make_plan(resolved, loaded, format, text_key, eos, eos_id, split, seed, unit, on_error)
        plan, spec = _chat_plan(plan, writer_class, chat, template, train_on, thought, tokenizer, loaded)
        plan.provenance = bool(provenance)
        targets = output_paths(output, format, plan.keys, plan.splits)
        _check_outputs(writer_class, targets, work, overwrite=overwrite, resume=resume)
        writer_options = _checked_writer_options(plan, writer_class, targets, writer_options, tokenizer)
        total_bytes = sum(i.size or 0 for i in resolved) or None
        show = _shows_progress(progress)
        rate = verification_rate(verify_fraction, _verify_budget(verify_bytes), total_bytes)
        encoder = None  # a parallel run's workers gate the engine themselves: the parent encodes nothing
        if executor is None:  # the first sample is read ahead, its check started, before the engine is gated
            encoder = Encoder(loaded, engine, rate, plan.seed, 0, tokenizer_hash=plan.tokenizer_hash,
                              chat=spec is not None, verify_bytes=None if total_bytes else verify_bytes,
                              first_sample=_first_sample(resolved, plan, loaded, engine, batch_size, resume, naming))
        if show:
            doing = f"with {encoder.engine.name}: {encoder.reason}" if encoder else "in the executor's workers"
            print(f"tokformats: encoding {doing}", file=sys.stderr)
        monitor = Progress(show, total_bytes, [])  # after the gate and the engines' timing: rates are encoding's
        all_stats: list[Stats] = []
        chosen: list[tuple[str, str]] = []  # each partition's engine and why, in order
        settings = (batch_size, resume, checkpoint_every)
        parts = _encoded_parts(plan, encoder or serialised, resolved, work, executor, partitions, settings,
                               (engine, rate), spec, monitor, (all_stats, chosen))  # fmt: skip
        outputs = _write_outputs(plan, writer_class, targets, parts, writer_options, replace=bool(resume or overwrite))
        engine_name, engine_reason = chosen[0]  # the first partition's: the one that checked the first documents
        total = Stats.total(all_stats)
        monitor.update(total, final=True)
        _discard(work)
        return {
            "documents": total.documents,
            "tokens": total.tokens,
            "bytes": total_bytes,
            "text_characters": total.text,
            "seconds": round(time.perf_counter() - started, 3),
            "skipped": total.skipped,
            "errors": total.errors,
            "engine": engine_name,
            "engine_reason": engine_reason,
            "outputs": outputs,
        }


# -- the steps of a run -------------------------------------------------------------------------------------


def _encoded_parts(
    plan: Plan,
    encoder: Any,
    resolved: list[Input],
    work: Path,
    executor: Executor | None,
    partitions: int | None,
    settings: tuple[int, bool, float],
    engine: tuple[str, float],
    chat: ChatSpec | None,
    monitor: Progress,
    reported: tuple[list[Stats], list[tuple[str, str]]],
) -> Iterable[Path]:
    """The partitions' folders, each once encoded (its counters and its engine with why appended to
    ``reported``): here, in one partition with ``encoder``; with an ``executor`` (``encoder`` is then the
    tokenizer's ``tokenizer.json`` text: the workers build it and gate the ``engine`` asked for), as the workers
    finish them in input order, so that each is joined into the outputs while later ones are still encoding (the
    join is then not a serial step after the last partition)."""
    if executor is not None:
        return _encode_in_parallel(plan, encoder, resolved, work, executor, partitions, settings, engine, chat,
                                   reported)  # fmt: skip
    batch_size, resume, checkpoint_every = settings
    part = work / "part-0000"
    reported[0].append(_encode_partition(plan, encoder, resolved, 0, part, batch_size=batch_size, resume=resume,
                                         progress=monitor, checkpoint_every=checkpoint_every, chat=chat))  # fmt: skip
    reported[1].append((encoder.engine.name, encoder.reason))
    return [part]


def _shows_progress(progress: bool | None) -> bool:
    """Whether a run draws its progress: as asked, else by default on a terminal and in a notebook (where tqdm
    draws a widget), not in logs."""
    return (sys.stderr.isatty() or "ipykernel" in sys.modules) if progress is None else progress


def _first_sample(
    resolved: list[Input],
    plan: Plan,
    loaded: Any,
    engine: str,
    batch_size: int,
    resume: bool,
    cleanup: contextlib.ExitStack,
) -> FirstSample | None:
    """The run's first sample (the first batch's first documents, up to :attr:`Encoder.FIRST_SAMPLE_BYTES` of
    text), read here ahead of the run's reader, with the reference's encoding of it started in a thread of its own
    (shut down by ``cleanup``). Why: the engine's load and gate, which follow, hold the GIL on one core for about
    0.2 s while ``tokenizers`` releases it, so the two overlap; read in the run, the sample is encoded beside the
    engine's first batches and the first batch waits for its check. A guess the encoder takes only if its first
    sample is these very texts. None where no sample is checked (``engine="tokenizers"``), for a chat run, several
    text keys, a ``resume`` (its first sample is where it resumes), or where reading ahead is not cheap or not safe
    (:func:`~.sources.read_by_line`: an iterable, a Parquet row group, a ``.json`` array; ``unit="file"``, whose
    first document is a whole file)."""
    if engine == "tokenizers" or plan.chat is not None or len(plan.keys) != 1 or resume or plan.unit == "file":
        return None
    if not all(map(read_by_line, resolved)):
        return None
    batch: list[Record] = []
    text = 0
    try:
        with contextlib.closing(iter_records(resolved, tuple(plan.keys), plan.unit)) as records:
            for record in records:  # the first batch, as _batches groups it
                batch.append(record)
                text += sum(map(len, record.texts)) if record.texts else 0
                if len(batch) >= batch_size or text >= MAX_BATCH_TEXT:
                    break
    except Exception:  # the run's reader reads the same input and raises its error where it always has
        return None
    texts = [r.texts[0] for r in batch if r.texts is not None]
    count, held = Encoder.first_count(texts, Encoder.FIRST_SAMPLE_BYTES) if texts else (0, 0)
    if not count or held > _FIRST_SAMPLE_READ_AHEAD:
        return None
    picked = texts[:count]
    pool = ThreadPoolExecutor(1, thread_name_prefix="tokformats-first-sample")
    cleanup.callback(pool.shutdown, wait=True, cancel_futures=True)
    sample = FirstSample(picked, pool.submit(TokenizersEngine(loaded).encode, picked))
    pool.shutdown(wait=False)  # its one thread ends with its one job
    return sample


#: The most text the first sample's read-ahead keeps (its documents up to :attr:`Encoder.FIRST_SAMPLE_BYTES`, at
#: least one): a huge first document is left to the run, rather than held twice.
_FIRST_SAMPLE_READ_AHEAD = 4 * MAX_BATCH_TEXT


def _verify_budget(verify_bytes: Any) -> int | None:
    """``verify_bytes`` checked: None or a non-negative whole number of bytes."""
    if verify_bytes is None:
        return None
    if isinstance(verify_bytes, bool) or not isinstance(verify_bytes, int) or verify_bytes < 0:
        raise ConfigError(f"verify_bytes must be a number of bytes (0 or more) or None, found {verify_bytes!r}.")
    return verify_bytes


def _chat_plan(
    plan: Plan,
    writer_class: type[TokenWriter],
    chat: Any,
    template: str,
    train_on: str,
    thought: str,
    tokenizer_source: Any,
    loaded: Any,
) -> tuple[Plan, ChatSpec | None]:
    """The plan of a chat run (its schema, template and masking recorded, so a resume must match) and what every
    partition needs to encode conversations; a text run's (``chat`` None) as it is, and None."""
    if chat is None:
        return plan, None
    if train_on not in TRAIN_ON:
        raise ConfigError(f"train_on must be one of {', '.join(TRAIN_ON)}; found {train_on!r}.")
    if thought not in THOUGHT:
        raise ConfigError(f"thought must be one of {', '.join(THOUGHT)}; found {thought!r}.")
    if len(plan.keys) > 1:
        raise ConfigError(
            f"chat data is read whole from each record; text_key names {plan.keys}, which chat= does not use. "
            "Leave text_key out."
        )
    if not writer_class.stores_loss_mask:
        from ..core.protocol import loss_mask_formats

        raise ConfigError(
            f"chat data is stored with its loss masks, and the {writer_class.format} format stores none; use one of "
            f"{loss_mask_formats()}."
        )
    chosen = load_template(template, tokenizer_source, loaded)
    from dataclasses import replace

    recorded = replace(plan, chat=schema_name(chat), template=chosen.name, train_on=train_on, thought=thought)
    return recorded, ChatSpec(chat, chosen, train_on, thought)


def _eos_mode(
    eos: str | None, writer_class: type[TokenWriter], on_error: str, verify_fraction: float, engine: str = "auto"
) -> str:
    """The run's end-of-document mode (by default the format's convention), after checking the plain options (the
    engine's name too, before anything starts: a parallel run's parent gates nothing)."""
    if engine not in ENGINES:
        raise ConfigError(f"engine must be one of {', '.join(ENGINES)}; found {engine!r}.")
    if eos is None:
        eos = "prepend" if writer_class.boundaries == "bos" else "append"
    if eos not in EOS_MODES:
        raise ValueError(f"eos must be one of {EOS_MODES}, not {eos!r}")
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', not {on_error!r}")
    if not 0 <= verify_fraction <= 1:
        raise ConfigError(f"verify_fraction must be between 0 and 1, found {verify_fraction}.")
    return eos


def _make_plan(
    resolved: list[Input],
    loaded: Any,
    format: str,
    text_key: str | list[str],
    eos: str,
    eos_id: int | None,
    split: Any,
    seed: int,
    unit: str,
    on_error: str,
) -> tuple[Plan, str]:
    """Everything that decides the output (what a checkpoint must match to be resumed), and the tokenizer's
    ``tokenizer.json`` text that its hash is of (a parallel run's workers read it; serialised once, 0.1 s for
    cl100k)."""
    import hashlib

    if eos != "none" and eos_id is None:
        found = next((i for i in map(loaded.token_to_id, END_OF_DOCUMENT) if i is not None), None)
        if found is None:
            raise FormatError(
                f"the tokenizer has no {END_OF_TEXT!r} token; pass {option('eos_id', 'ID')} or "
                f"{option('eos', repr('none'))}."
            )
        eos_id = int(found)
    stored_eos = eos_id if eos != "none" else None
    serialised = loaded.to_str()
    if stored_eos is not None and stored_eos < 0:
        raise ConfigError(f"the end-of-text id must not be negative, found {option('eos_id', str(stored_eos))}.")
    return Plan(
        inputs=[i.name for i in resolved],
        format=format,
        keys=[text_key] if isinstance(text_key, str) else list(text_key),
        eos=eos,
        eos_id=eos_id if eos != "none" else None,
        split=split_fractions(split),
        seed=int(seed),
        unit=unit,
        # Every id stored: the tokenizer's, and an end-of-text id given beyond them (cl100k's 100257 with a
        # smaller tokenizer), so that the spools and the writer's dtype hold it from the start.
        vocab_size=max(vocabulary_size(loaded), 0 if stored_eos is None else stored_eos + 1),
        tokenizer_hash=hashlib.sha256(serialised.encode("utf-8")).hexdigest(),
        on_error=on_error,
    ), serialised


@contextlib.contextmanager
def _owned_work_folder(work: Path) -> Iterator[None]:
    """Own the run's work folder for the block: a second run on the same output is refused at once (naming the
    folder) rather than made to wait, since its work would be the first's to redo; a folder left holding nothing
    but the lock (a run refused before any work, e.g. for its tokenizer or options) is removed, and so are the
    folders above it that were made for it and are still empty."""
    made = [folder for folder in (work, *work.parents) if not folder.exists()]  # the nearest first
    with owned_folder(work, what="tokenize run"):
        try:
            yield
        finally:
            if work.is_dir() and not _unfinished(work):
                with contextlib.suppress(OSError):
                    (work / LOCK_NAME).unlink()
                    work.rmdir()
                    for folder in made[1:]:  # stops at the first that holds anything (rmdir refuses it)
                        folder.rmdir()


@contextlib.contextmanager
def _naming_output(output: Any) -> Iterator[None]:
    """An ``OSError`` of the run's own files (a full disk while spooling or writing) names the output asked for,
    not a spool or temporary file inside the work folder (or nothing, as a failed ``write`` does)."""
    try:
        yield
    except OSError as error:
        if isinstance(error, FormatError) or error.errno is None:
            raise
        if error.filename is not None and ".tokenize" not in str(error.filename):
            raise
        raise naming_output(error, output)  # noqa: B904 - the original is kept as the cause


def _unfinished(work: Path) -> bool:
    """Whether the work folder holds anything of a run (more than its lock)."""
    return work.is_dir() and any(entry.name != LOCK_NAME for entry in work.iterdir())


def _check_outputs(
    writer_class: type[TokenWriter], targets: dict[tuple[str, str], Path], work: Path, *, overwrite: bool, resume: bool
) -> None:
    """Refuse outputs that exist (before any work is done), unless replacing or resuming; ``overwrite`` without
    ``resume`` starts a failed run's work folder over (keeping the lock this run holds)."""
    if overwrite and not resume and _unfinished(work):
        for entry in work.iterdir():
            if entry.name == LOCK_NAME:
                continue
            if entry.is_dir() and not entry.is_symlink():
                # a killed run's orphaned worker may still be writing there: wait for it to be gone first
                with owned_folder(entry, wait=PARTITION_WAIT, what="worker encoding this partition"):
                    shutil.rmtree(entry)
            else:
                entry.unlink()
    if overwrite or (resume and _unfinished(work)):
        return
    for target in targets.values():
        for path in writer_class.existing_outputs(target):
            raise OutputExistsError(
                f"{path} already exists; pass {option('overwrite')} to replace it (nothing was written)."
            )


def _encode_in_parallel(
    plan: Plan,
    serialised: str,
    resolved: list[Input],
    work: Path,
    executor: Executor,
    partitions: int | None,
    settings: tuple[int, bool, float],
    engine: tuple[str, float],
    chat: ChatSpec | None,
    reported: tuple[list[Stats], list[tuple[str, str]]],
) -> Iterator[Path]:
    """Encode partitions of the inputs in ``executor``'s workers, each into its own spools; yields each partition's
    folder in input order as soon as it is encoded (after appending what it reports to ``reported``), so that the
    caller joins it while later ones are still encoding: the output equals a single-process run. Each partition is
    submitted as soon as it is planned (the first before any line is counted, see
    :func:`~.partitions.iter_partitions`); an executor without ``submit`` (``ray.util.multiprocessing.Pool``) gets
    them all at once through ``map``. ``serialised``: the tokenizer's ``tokenizer.json`` text (the workers read
    it); ``engine``: the engine asked for and the verify fraction, gated there."""
    groups = iter_partitions(resolved, _partition_count(resolved, partitions), plan.unit)
    origin = submitter()
    # Workers read the tokenizer from the work folder (once per process), not from each job: a named vocabulary's
    # tokenizer.json is megabytes, and a run may have thousands of partitions.
    tokenizer_file = work / "tokenizer.json"
    work.mkdir(parents=True, exist_ok=True)
    _write_bytes_atomically(tokenizer_file, serialised.encode("utf-8"))
    shipped = asdict(plan)
    threads = engine_threads(executor)
    parts: list[Path] = []

    def jobs() -> Iterator[tuple[Any, ...]]:
        for ordinal, (first, group) in enumerate(groups):
            parts.append(work / f"part-{ordinal:04d}")
            pieces = [(str(i.path), i.start, i.stop, i.first_record) for i in group]
            yield (shipped, str(tokenizer_file), pieces, first, ordinal, str(parts[-1]), settings, engine, origin,
                   chat, threads)  # fmt: skip

    submit = getattr(executor, "submit", None)
    if submit is None:
        return _in_order(parts, iter(executor.map(_partition_job, list(jobs()))), reported)
    futures: list[Future[dict[str, Any]]] = []
    try:
        for job in jobs():
            futures.append(submit(_partition_job, job))
    except BaseException:
        for future in futures:
            future.cancel()
        raise
    return _in_order(parts, _results(futures), reported)


def _partition_count(resolved: list[Input], partitions: int | None) -> int:
    """How many partitions a parallel run cuts ``resolved`` into: ``partitions``, by default one per input file and
    one per :data:`~.partitions.PARTITION_BYTES` where the inputs are larger (checked: file inputs, at least 1)."""
    if any(i.path is None for i in resolved):
        raise FormatError("executor= needs file inputs: an in-memory iterable cannot be shipped to workers.")
    if partitions is not None and partitions < 1:
        raise ConfigError(f"partitions must be at least 1, found {partitions}.")
    total = sum(i.size or 0 for i in resolved)
    return partitions or max(len(resolved), -(-total // PARTITION_BYTES))


def _start_workers(executor: Executor | None, resolved: list[Input], partitions: int | None) -> None:
    """With an ``executor``, start its workers before the parent has the run's tokenizer (0.6-0.9 s for a named
    vocabulary): one :func:`_worker_ready` per core (at most one per partition), so that a process pool's workers
    are spawned and have imported what a partition needs by the time the first partition is submitted (a spawned
    pool starts a process per submission, so the first jobs would otherwise wait for that). Nothing depends on
    them: a worker that fails here fails the same way on its first partition. An executor without ``submit``
    (Ray's ``Pool``) gets none. Called once the run owns its work folder: a run refused there starts none (a
    fork-started pool's fork would otherwise race the other run's threads); a run refused later (its tokenizer,
    options or existing outputs) has started them, and they stay the executor's."""
    if executor is None:
        return
    jobs = min(_partition_count(resolved, partitions), os.cpu_count() or 1)  # checks the inputs and partitions
    submit = getattr(executor, "submit", None)
    if submit is None:
        return
    threads = engine_threads(executor)
    # each job's arguments differ (its ordinal): dask merges the submissions of a pure function with equal arguments
    for k in range(jobs):  # nobody waits for them: their errors are taken here (a dask client logs those never taken)
        submit(_worker_ready, threads, os.getpid(), k).add_done_callback(Future.exception)


def _worker_ready(threads: int | None = None, submitter: int | None = None, ordinal: int = 0) -> int:
    """Run in an executor worker at the start of a parallel run: by the time it runs, the worker process has
    started and imported this module (the job is pickled by reference), which is most of what it does before its
    first partition other than loading the tokenizer (the fast engines' imports take milliseconds). Sizes the
    engines' thread pools to ``threads`` (:func:`~.engines.limit_threads`; not in the ``submitter`` process
    itself). ``ordinal``: which warm-up job it is (unused: it keeps the jobs distinct). Its process id.
    """
    limit_threads(threads, submitter)
    return os.getpid()


def _results(futures: list[Future[dict[str, Any]]]) -> Iterator[dict[str, Any]]:
    """The futures' results in order (a failed job's exception raised); closed early, the futures not started are
    cancelled (as ``Executor.map``'s iterator does)."""
    try:
        for future in futures:
            yield future.result()
    finally:
        for future in futures:
            future.cancel()


def _in_order(
    parts: list[Path], results: Iterator[dict[str, Any]], reported: tuple[list[Stats], list[tuple[str, str]]]
) -> Iterator[Path]:
    """Each partition's folder once its result has arrived (in order), its counters and engine appended to
    ``reported``. Closed early (the join failed), it closes ``results``, which cancels the partitions not
    started."""
    try:
        for part, result in zip(parts, results):
            reported[0].append(Stats(**result["stats"]))
            reported[1].append((result["engine"], result["engine_reason"]))
            yield part
    finally:
        close = getattr(results, "close", None)
        if close is not None:
            close()


def _output_writer(
    plan: Plan,
    writer_class: type[TokenWriter],
    target: Path,
    split: str,
    writer_options: dict[str, Any],
    *,
    replace: bool,
) -> TokenWriter:
    """The writer of one output, told the delimiter its documents carry (formats that can record it do, so the
    output reads back without options)."""
    options = {
        "vocab_size": plan.vocab_size,
        **writer_class.tokenize_options,
        **writer_class.split_options(split or None),
        **writer_options,
    }
    writer = api.create_corpus(target, plan.format, overwrite=replace, **options)
    if plan.eos_id is not None:
        writer.declare_delimiter("bos" if plan.eos == "prepend" else "eos", plan.eos_id)
    else:
        writer.declare_delimiter("none", None)
    return writer


def _checked_writer_options(
    plan: Plan,
    writer_class: type[TokenWriter],
    targets: dict[tuple[str, str], Path],
    writer_options: dict[str, Any],
    tokenizer: Any,
) -> dict[str, Any]:
    """The writer options of the run (with the tokenizer's name where the format records it, as datatrove's
    ``DocumentTokenizer`` does), after creating (and discarding) the first output's writer with them, so that a
    dtype or option the format refuses fails now, not after the whole encode."""
    named = writer_class.tokenizer_name_option
    if named and named not in writer_options and isinstance(tokenizer, (str, os.PathLike)):
        writer_options = {**writer_options, named: os.fspath(tokenizer)}
    (_, split), target = next(iter(targets.items()))
    _output_writer(plan, writer_class, target, split, writer_options, replace=True).abort()
    return writer_options


def _write_outputs(
    plan: Plan,
    writer_class: type[TokenWriter],
    targets: dict[tuple[str, str], Path],
    parts: Iterable[Path],
    writer_options: dict[str, Any],
    *,
    replace: bool,
) -> dict[str, Any]:
    """Feed each stream's spools, partition by partition (as ``parts`` yields them: a parallel run's while later
    partitions are still encoding), to the format's writers, all open at once; each output appears atomically, in
    the order of ``targets``, once every partition is in. A failure before the outputs close discards every
    output's temporaries and stops the encoding (partitions not started are cancelled); one while they close keeps
    the outputs already closed, each whole."""
    dtype = dtype_for_vocab(plan.vocab_size)
    writers: dict[str, TokenWriter] = {}
    done: list[Path] = []
    try:
        for (key, split), target in targets.items():
            writers[_stream_name(key, split)] = _output_writer(plan, writer_class, target, split, writer_options,
                                                               replace=replace)  # fmt: skip
        # One partition (a run without an executor): its spools become the outputs' data files where the format
        # allows (every id written once); else, and with several partitions, they are copied into the writers.
        single = isinstance(parts, list) and len(parts) == 1
        for part in parts:
            for name, writer in writers.items():
                if not (single and adopt_spool(writer, part, name, dtype)):
                    join_spool(writer, part, name, dtype)
                if not single:  # on the disk while later partitions encode: the close syncs the last one only
                    writer.write_back()
            done.append(part)
        for writer in writers.values():
            writer.close()
    except BaseException:
        close = getattr(parts, "close", None)  # a parallel run's partitions: stop waiting for them
        if close is not None:
            close()
        for writer in writers.values():
            writer.abort()
        raise
    paths = {_stream_name(key, split): target for (key, split), target in targets.items()}
    return {name: _output_summary(plan, writer, paths[name], done, name) for name, writer in writers.items()}


def _output_summary(plan: Plan, writer: TokenWriter, target: Path, parts: list[Path], name: str) -> dict[str, Any]:
    """What the summary says of one written output (and its provenance sidecar, written here)."""
    summary: dict[str, Any] = {
        "path": str(target),
        "documents": writer.num_documents,
        "tokens": writer.num_tokens,
        "files": [str(p) for p in writer.written],
        "read_with": writer.read_with(),
    }
    if writer.loss_masked:
        summary["trained_tokens"] = writer.num_trained_tokens
    sources = _provenance(plan, parts, name, writer.num_documents) if plan.provenance else None
    if sources is not None:
        sidecar = save_provenance(sources, api.written_dataset_path(writer, plan.format))
        summary["provenance"] = str(sidecar)  # beside the dataset, not one of its files
    return summary


def _provenance(plan: Plan, parts: list[Path], name: str, documents: int) -> Provenance | None:
    """The sources of one stream's documents, from every partition's row spool in order; None when a spool is
    incomplete (a resumed run that began without provenance)."""
    pieces = []
    for part in parts:
        count = read_json_object(part / CHECKPOINT)["spools"][name]["documents"]
        rows = read_rows(part / f"{name}.provenance", count)
        if rows is None:
            return None
        pieces.append(rows)
    rows = np.concatenate(pieces) if pieces else np.zeros(0, dtype=ROW_DTYPE)
    if len(rows) != documents:
        return None
    units = []
    for k, source in enumerate(plan.inputs):
        suffix = source.lower().removesuffix(".gz").removesuffix(".zst")
        # A JSON array's records are items: its rows carry no byte offset.
        array = suffix.endswith(".json") and bool((rows["offset"][rows["input"] == k] < 0).any())
        units.append("row" if suffix.endswith(".parquet") else "item" if source == "<iterable>" or array else "line")
    return Provenance(list(plan.inputs), units, rows)
