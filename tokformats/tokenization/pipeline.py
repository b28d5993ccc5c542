"""``tokformats.tokenize``: text in, training-ready token files out, in any format tokformats writes.

The run has two phases. *Encoding*: a reader thread parses and decompresses the inputs into batches while the
main thread encodes them with ``Tokenizer.encode_batch_fast`` (which releases the GIL and uses every core) and
appends ids and document lengths to append-only spool files, one pair per output stream (text key x split), in
a work folder beside the output (``OUTPUT.tokenize/``). Every few seconds the spools are fsynced and a checkpoint
records how far each input was consumed and how long each spool is. *Writing*: each stream's spool is fed to the
format's writer, whose files appear atomically; then the work folder is removed.

A run killed at any point resumes with ``resume=True``: spools are cut back to the checkpoint and reading
restarts after the last checkpointed record, so the final files are byte-identical to an uninterrupted run.
Documents are assigned to splits by a hash of (seed, input, record position), so the assignment depends on
nothing else: not on batching, resuming or partitioning. With ``executor=`` the inputs are split into
partitions encoded in parallel (each into its own spools) and joined in input order: the output equals a
single-process run.

Empty documents follow each format's owner: Megatron's ``preprocess_data.py`` keeps them as documents
without sequences and without an end-of-document id; llm.c, nanoGPT and the others still write the delimiter.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Executor
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from .. import api
from ..core.documents import add_delimiter, document_runs, offsets_from_lengths
from ..core.dtypes import dtype_for_vocab
from ..core.protocol import TokenWriter
from ..core.provenance import ROW_DTYPE, Provenance, RowSpool, read_rows, save_provenance
from ..core.registry import default_corpus_format
from ..core.vocab import END_OF_TEXT
from ..errors import ConfigError, FormatError, OutputExistsError, option
from ..fs.atomic import AtomicFiles
from .engines import EngineMismatchError, TokenizersEngine, differing_text, select_engine
from .sources import Input, Record, SourceError, iter_records, resolve_inputs
from .tokenizer import load_tokenizer

__all__ = ["tokenize", "split_fractions", "output_paths"]

EOS_MODES = ("append", "prepend", "none")
CHECKPOINT = "checkpoint.json"
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


_TAIL = 4096  # bytes before a spool's checkpointed end whose hash the checkpoint records


def _tail_hash(path: Path, size: int) -> str:
    import hashlib

    with open(path, "rb") as handle:
        handle.seek(max(size - _TAIL, 0))
        return hashlib.sha256(handle.read(min(size, _TAIL))).hexdigest()[:32]


class Spool:
    """An append-only pair of files: ids (in ``dtype``) and document lengths (int64)."""

    def __init__(
        self,
        folder: Path,
        name: str,
        dtype: np.dtype,
        tokens: int = 0,
        documents: int = 0,
        tails: dict[str, str] | None = None,
    ) -> None:
        self.tokens_path = folder / f"{name}.tokens"
        self.lengths_path = folder / f"{name}.lengths"
        self.dtype = dtype
        for path, size in ((self.tokens_path, tokens * dtype.itemsize), (self.lengths_path, documents * 8)):
            found = path.stat().st_size if path.exists() else None
            if size and (found is None or found < size or (tails and _tail_hash(path, size) != tails.get(path.suffix))):
                # Never extend a lost or damaged spool with zeros: that would publish zeros as documents.
                state = "is missing" if found is None else f"has {found:,} bytes" if found < size else "differs"
                raise FormatError(
                    f"{path} {state}, but the checkpoint records {size:,} bytes of it; the unfinished run cannot "
                    f"be resumed. Pass {option('overwrite')} to start over."
                )
            with open(path, "ab") as handle:
                handle.truncate(size)  # drop whatever was written after the last checkpoint
        self._tokens = open(self.tokens_path, "ab")  # noqa: SIM115 - closed by close()
        self._lengths = open(self.lengths_path, "ab")  # noqa: SIM115 - closed by close()
        self.num_tokens, self.num_documents = tokens, documents

    def append(self, flat: np.ndarray, lengths: np.ndarray) -> None:
        self._tokens.write(np.ascontiguousarray(flat, dtype=self.dtype).data)
        self._lengths.write(np.ascontiguousarray(lengths, dtype="<i8").data)
        self.num_tokens += len(flat)
        self.num_documents += len(lengths)

    def sync(self) -> None:
        for handle in (self._tokens, self._lengths):
            handle.flush()
            os.fsync(handle.fileno())

    def tails(self) -> dict[str, str]:
        """Hashes of each file's last bytes up to the counts (recorded in checkpoints, checked on resume)."""
        return {
            ".tokens": _tail_hash(self.tokens_path, self.num_tokens * self.dtype.itemsize),
            ".lengths": _tail_hash(self.lengths_path, self.num_documents * 8),
        }

    def close(self) -> None:
        self._tokens.close()
        self._lengths.close()


def copy_spool(writer: TokenWriter, folder: Path, name: str, dtype: np.dtype) -> None:
    """Feed a finished partition's spool to ``writer`` in pieces of about ``_SPOOL_CHUNK`` tokens.

    Plain file reads, not a memory map: a map would keep every page it has read resident, so memory would
    grow with the corpus; this way it stays at one piece.
    """
    sizes = json.loads((folder / CHECKPOINT).read_text(encoding="utf-8"))["spools"][name]
    lengths = np.fromfile(folder / f"{name}.lengths", dtype="<i8", count=sizes["documents"])
    offsets = offsets_from_lengths(lengths)
    with open(folder / f"{name}.tokens", "rb") as handle:
        for first, stop in document_runs(offsets, _SPOOL_CHUNK):
            flat = np.fromfile(handle, dtype=dtype, count=offsets.item(stop) - offsets.item(first))
            writer.write_batch(flat, lengths[first:stop])


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
    with AtomicFiles(overwrite=True) as files:
        files.create(path).write(json.dumps(data).encode("utf-8"))


@dataclass
class Stats:
    """Counters of one partition (or of the whole run)."""

    records: int = 0
    documents: int = 0
    tokens: int = 0
    skipped: int = 0
    errors: list[str] = field(default_factory=list)


# -- progress -------------------------------------------------------------------------------------------


class Progress:
    """One line on stderr, refreshed twice a second: documents, tokens, MB/s, and ETA when sizes are known."""

    def __init__(self, enabled: bool, total_bytes: int | None, counters: list[Any]) -> None:
        self.enabled, self.total, self.counters = enabled, total_bytes, counters
        self.started = self.last = time.perf_counter()
        self.done_before = 0
        #: Input bytes whose documents are encoded (set by the encoding loop; None: count what was read).
        self.encoded: int | None = None

    def update(self, stats: Stats, *, final: bool = False) -> None:
        now = time.perf_counter()
        if not self.enabled or (not final and now - self.last < 0.5):
            return
        self.last = now
        read = self.done_before + (self.encoded if self.encoded is not None else sum(c.count for c in self.counters))
        elapsed = max(now - self.started, 1e-9)
        rate = read / elapsed
        line = f"tokenize: {stats.documents:,} documents, {stats.tokens:,} tokens, {rate / 1e6:.1f} MB/s"
        if self.total:
            share = min(read / self.total, 1.0)
            eta = (self.total - read) / rate if rate > 0 and not final else 0
            line += f", {share:.0%}, ETA {int(eta) // 60}:{int(eta) % 60:02d}"
        if stats.skipped:
            line += f", {stats.skipped:,} bad records skipped"
        sys.stderr.write("\r" + line + ("\n" if final else ""))
        sys.stderr.flush()


# -- encoding one partition -----------------------------------------------------------------------------


def _batches(
    records: Iterator[Record], size: int, out: queue.Queue[Any], stop: threading.Event, counters: list[Any]
) -> None:
    """The reader thread: groups records into batches of ``size`` documents, each with the input bytes read up to
    its end (so progress counts what was encoded, not what was read ahead); passes errors on."""
    try:
        batch: list[Record] = []
        for record in records:
            if stop.is_set():
                return
            batch.append(record)
            if len(batch) >= size:
                out.put((batch, sum(c.count for c in counters)))
                batch = []
        if batch:
            out.put((batch, sum(c.count for c in counters)))
        out.put(None)
    except BaseException as exc:  # delivered to the main thread, which raises it
        out.put(exc)


class Encoder:
    """The run's engine, checked against ``tokenizers`` on a sample of the corpus (the first documents, up to
    :attr:`FIRST_SAMPLE_BYTES` of text) and then on a random ``verify_fraction`` of the documents (reproducibly: the
    draw depends on the seed and the partition only). Checking documents rather than whole batches keeps the cost
    at about ``verify_fraction`` of what ``tokenizers`` alone would take."""

    #: Text checked at the start of the run, before any random draw.
    FIRST_SAMPLE_BYTES = 1 << 20

    def __init__(self, tokenizer: Any, engine: str, verify_fraction: float, seed: int, partition: int) -> None:
        self.reference = TokenizersEngine(tokenizer)
        self.engine, self.reason = select_engine(tokenizer, engine)
        self.explicit = engine != "auto"
        self.verify_fraction = verify_fraction
        self._draws = np.random.default_rng([seed, partition])
        self.batches = 0
        self._sampled_bytes = 0

    def encode(self, texts: list[str], dtype: np.dtype, where: Any) -> tuple[np.ndarray, np.ndarray]:
        """``texts`` as ``(ids in dtype, lengths)``; ``where(k)`` names text k's record for an error."""
        flat, lengths = self.engine.encode(texts)
        if self.engine is not self.reference and texts:
            chosen = self._sample(texts)
            if len(chosen):
                self._check(texts, flat, lengths, chosen, where)
                if self.engine is self.reference:  # fell back on the first sample: the reference encodes it all
                    flat, lengths = self.reference.encode(texts)
        self.batches += 1
        return flat.astype(dtype, copy=False), lengths

    def _sample(self, texts: list[str]) -> np.ndarray:
        """Which documents of this batch to re-encode with tokenizers."""
        if self._sampled_bytes < self.FIRST_SAMPLE_BYTES:
            sizes = np.fromiter((len(t) for t in texts), dtype=np.int64, count=len(texts))
            room = self.FIRST_SAMPLE_BYTES - self._sampled_bytes
            count = min(len(texts), max(1, int(np.searchsorted(np.cumsum(sizes), room, side="right"))))
            self._sampled_bytes += max(int(sizes[:count].sum()), 1)
            return np.arange(count)
        return np.flatnonzero(self._draws.random(len(texts)) < self.verify_fraction)

    def _check(self, texts: list[str], flat: np.ndarray, lengths: np.ndarray, chosen: np.ndarray, where: Any) -> None:
        picked = chosen.tolist()
        offsets = offsets_from_lengths(lengths)
        got = np.concatenate([flat[offsets[k] : offsets[k + 1]] for k in picked])
        n = differing_text(*self.reference.encode([texts[k] for k in picked]), got, lengths[chosen])
        if n is None:
            return
        k = picked[n]
        message = f"{self.engine.name} gave other ids than tokenizers for {where(k)} ({texts[k][:60]!r})"
        if self.batches or self.explicit:
            raise EngineMismatchError(
                f"{message}; nothing wrong was written. Resume with {option('engine', repr('tokenizers'))}: "
                "the output is the same whichever engine runs."
            )
        self.engine, self.reason = self.reference, f"{message} on the first batch: tokenizers runs instead"


def _add_eos(
    plan: Plan, flat: np.ndarray, lengths: np.ndarray, delimit_empty: bool
) -> tuple[np.ndarray, np.ndarray]:
    if plan.eos == "none" or plan.eos_id is None:
        return flat, lengths
    # Some owners add no end-of-document id to an empty document (Megatron's preprocess_data).
    only = None if delimit_empty else lengths > 0
    return add_delimiter(flat, lengths, plan.eos_id, before=plan.eos == "prepend", only=only)


def _load_checkpoint(folder: Path, plan: Plan, resume: bool) -> dict[str, Any]:
    """The checkpoint of an unfinished run in ``folder`` (empty for a new one, whose folder is made): refused without
    ``resume``, or when it was written with other settings."""
    checkpoint = folder / CHECKPOINT
    if not checkpoint.exists():
        folder.mkdir(parents=True, exist_ok=True)
        return {}
    state: dict[str, Any] = json.loads(checkpoint.read_text(encoding="utf-8"))
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


class _PartitionRun:
    """Encoding one partition's inputs (global numbers ``first_input...``) into spools in ``folder``: the spools,
    the counters and the position reached, checkpointed every ``checkpoint_every`` seconds; resumable."""

    def __init__(
        self, plan: Plan, encoder: Encoder, inputs: list[Input], first_input: int, folder: Path, *, resume: bool
    ) -> None:
        self.plan, self.encoder, self.inputs, self.first_input = plan, encoder, inputs, first_input
        self.checkpoint = folder / CHECKPOINT
        self.dtype = dtype_for_vocab(plan.vocab_size)
        state = _load_checkpoint(folder, plan, resume)
        counted = state.get("stats", {})
        self.stats = Stats(**{k: v for k, v in counted.items() if k in ("records", "documents", "tokens", "skipped")})
        self.stats.errors = list(state.get("errors", []))
        recorded = state.get("spools", {})
        self.spools = {
            stream: Spool(folder, _stream_name(*stream), self.dtype, **recorded.get(_stream_name(*stream), {}))
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
        """Checkpoint: every spool fsynced, then the counts and the position committed in one step."""
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
                "spools": {
                    _stream_name(*s): {"tokens": sp.num_tokens, "documents": sp.num_documents, "tails": sp.tails()}
                    for s, sp in self.spools.items()
                },
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

    def _good_records(self, batch: list[Record]) -> list[Record]:
        """The batch's records that hold text; bad ones raise, or are counted and skipped with ``on_error="skip"``."""
        good = []
        for record in batch:
            if record.texts is not None:
                good.append(record)
            elif record.error is not None:
                if self.plan.on_error != "skip":
                    raise SourceError(
                        f"{record.error} Pass {option('on_error', repr('skip'))} to count and skip bad records."
                    )
                self.stats.skipped += 1
                self.stats.errors.append(record.error)
        return good

    def _spool(self, key: str, flat: np.ndarray, lengths: np.ndarray, split_of: np.ndarray) -> None:
        """Append one text key's encoded documents to the spools of their splits."""
        if len(self.fractions) == 1:
            self.spools[(key, self.plan.splits[0])].append(flat, lengths)
            return
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        for s, split in enumerate(self.plan.splits):
            chosen = np.flatnonzero(split_of == s)
            if chosen.size:
                pieces = [flat[offsets[i] : offsets[i + 1]] for i in chosen.tolist()]
                self.spools[(key, split)].append(np.concatenate(pieces), lengths[chosen])

    def take(self, batch: list[Record]) -> None:
        """Encode one batch of records into the spools and move the position past it."""
        good = self._good_records(batch)
        self.stats.records += len(batch)
        if good:
            split_of = assign_splits(
                self.plan.seed,
                np.array([r.input + self.first_input for r in good], dtype=np.int64),
                np.array([r.index for r in good], dtype=np.int64),
                self.fractions,
            )
            for k, key in enumerate(self.plan.keys):
                flat, lengths = self.encoder.encode(
                    [r.texts[k] for r in good if r.texts],
                    self.dtype,
                    lambda n, good=good: f"{self.inputs[good[n].input].name}, record {good[n].index}",
                )
                flat, lengths = _add_eos(self.plan, flat, lengths, self.delimit_empty)
                self._spool(key, flat, lengths, split_of)
                self._spool_sources(key, good, split_of)
                if k == 0:
                    self.stats.documents += len(good)
                self.stats.tokens += len(flat)
        last = batch[-1]
        self.position = (last.input + self.first_input, last.index)

    def run(self, *, batch_size: int, progress: Progress | None, checkpoint_every: float) -> None:
        """Read the inputs from the position in a reader thread (a few batches ahead, never the corpus) and encode
        them batch by batch, checkpointing as it goes; the last checkpoint says ``done``."""
        counters: list[Any] = [] if progress is None else progress.counters
        local_start = (self.position[0] - self.first_input, self.position[1])
        records = iter_records(self.inputs, tuple(self.plan.keys), self.plan.unit, start=local_start, counter=counters)
        batches: queue.Queue[Any] = queue.Queue(maxsize=4)
        stop = threading.Event()
        reader = threading.Thread(target=_batches, args=(records, batch_size, batches, stop, counters), daemon=True)
        reader.start()
        last_save = time.perf_counter()
        try:
            while (item := batches.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                batch, read_through = item
                self.take(batch)
                if progress is not None:
                    progress.encoded = read_through
                    progress.update(self.stats)
                if time.perf_counter() - last_save >= checkpoint_every:
                    self.save()
                    last_save = time.perf_counter()
            self.save(done=True)
        finally:
            stop.set()
            while reader.is_alive():  # unblock a reader waiting on a full queue
                try:
                    batches.get_nowait()
                except queue.Empty:
                    reader.join(0.05)


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
) -> Stats:
    """Encode ``inputs`` (global numbers ``first_input...``) into spools in ``folder`` with ``encoder``;
    resumable (a partition a checkpoint says is done is not read again)."""
    run = _PartitionRun(plan, encoder, inputs, first_input, folder, resume=resume)
    try:
        if not run.done:
            run.run(batch_size=batch_size, progress=progress, checkpoint_every=checkpoint_every)
    finally:
        run.close()
    return run.stats


# -- partitions ---------------------------------------------------------------------------------------


def _partition(inputs: list[Input], parts: int) -> list[tuple[int, list[Input]]]:
    """Contiguous groups of inputs of roughly equal size: ``(first input number, inputs)``."""
    sizes = np.array([i.size or 1 for i in inputs], dtype=np.float64)
    bounds = np.searchsorted(np.cumsum(sizes), np.linspace(0, sizes.sum(), parts + 1)[1:-1], side="left") + 1
    cuts = sorted({0, *[int(b) for b in bounds if 0 < b < len(inputs)], len(inputs)})
    return [(a, inputs[a:b]) for a, b in pairwise(cuts)]


def _partition_job(args: tuple[Any, ...]) -> dict[str, Any]:
    """Run in an executor worker: encode one partition. Module-level, so that it pickles by reference."""
    plan_dict, tokenizer_json, paths, first_input, folder, batch_size, resume, checkpoint_every, engine = args
    from tokenizers import Tokenizer

    plan = Plan(**plan_dict)
    name, fraction = engine
    encoder = Encoder(Tokenizer.from_str(tokenizer_json), name, fraction, seed=plan.seed, partition=first_input)
    stats = _encode_partition(
        plan,
        encoder,
        [Input(Path(p)) for p in paths],
        first_input,
        Path(folder),
        batch_size=batch_size,
        resume=resume,
        progress=None,
        checkpoint_every=checkpoint_every,
    )
    return asdict(stats)


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
    provenance: bool = True,
    **writer_options: Any,
) -> dict[str, Any]:
    """Tokenize text into ``format`` files; returns a summary (documents, tokens, bytes, seconds, per output).

    Args:
        inputs: files, globs or folders (``.txt``, ``.json``, ``.jsonl``, ``.parquet``; ``.gz``/``.zst``), or an
            iterable of strings (a ``datasets.Dataset`` column works).
        tokenizer: a ``tokenizers.Tokenizer``, a ``tokenizer.json``, or a folder holding one.
        output: the output path prefix (see :func:`output_paths` for the names).
        format: any corpus format with a writer (``tokformats.formats`` lists them); by default the registry's
            default corpus format (Megatron's indexed dataset).
        text_key: JSON/Parquet key(s) holding the text; several keys give several outputs.
        eos: ``append`` the end-of-text id after each document, ``prepend`` it, or ``none``; by default the
            format's own convention (llm.c: ``prepend``, as its writers do; the others: ``append``).
        eos_id: the id to use; default: the tokenizer's ``<|endoftext|>``.
        split: ``{"train": 0.8, "val": 0.1, "test": 0.1}`` or ``"8:1:1"``: by document, reproducible from ``seed``.
        unit: for ``.txt``: a document per ``line``, per ``file`` or per blank-line ``paragraph``.
        batch_size: documents per ``encode_batch_fast`` call.
        progress: a progress line on stderr (default: when stderr is a terminal).
        resume: continue a run that was interrupted (its work folder ``OUTPUT.tokenize`` is kept until success).
        on_error: ``raise`` on a bad record (naming file and line), or ``skip`` and count it.
        executor: a ``concurrent.futures.Executor`` (a process pool, dask's ``client.get_executor()``, ...) to
            encode partitions of the inputs in parallel; the result equals a single-process run.
        partitions: how many partitions (default: one per input file, at most 64).
        overwrite: replace existing outputs.
        checkpoint_every: seconds between checkpoints (spools fsynced, position recorded): what a crash can lose.
        engine: ``auto`` (fastokens when installed and it passes the identity gate, else tokenizers),
            ``fastokens`` (the same gate; an error when it is missing or differs) or ``tokenizers``. See
            :mod:`tokformats.engines`; the output is the same whichever engine runs.
        verify_fraction: the fraction of batches (beyond the first, always checked) that a faster engine's ids are
            checked against tokenizers' during the run; a difference stops the run with
            :class:`~tokformats.engines.EngineMismatchError`.
        provenance: record each document's source (input file, line or row, byte offset) in a sidecar beside each
            output (``OUTPUT.provenance.npz``, see :mod:`tokformats.core.provenance`), read by ``r.provenance(i)``.
        **writer_options: passed to the format's writer (``shard_size``, ``tokens_per_shard``, ``dtype``, ...).
    """
    started = time.perf_counter()
    format = format or default_corpus_format()
    writer_class = api.corpus_writer(format)
    eos = _eos_mode(eos, writer_class, on_error, verify_fraction)
    resolved = resolve_inputs(inputs)
    loaded = load_tokenizer(tokenizer)
    plan = _make_plan(resolved, loaded, format, text_key, eos, eos_id, split, seed, unit, on_error)
    plan.provenance = bool(provenance)
    targets = output_paths(output, format, plan.keys, plan.splits)
    work = Path(f"{output}.tokenize")
    _check_outputs(writer_class, targets, work, overwrite=overwrite, resume=resume)
    total_bytes = sum(i.size or 0 for i in resolved) or None
    show = sys.stderr.isatty() if progress is None else progress
    monitor = Progress(show, total_bytes, [])
    encoder = Encoder(loaded, engine, verify_fraction, seed=plan.seed, partition=0)
    if show:
        print(f"tokformats: encoding with {encoder.engine.name}: {encoder.reason}", file=sys.stderr)
    settings = (batch_size, resume, checkpoint_every)
    if executor is None:
        parts = [work / "part-0000"]
        all_stats = [_encode_partition(plan, encoder, resolved, 0, parts[0], batch_size=batch_size, resume=resume,
                                       progress=monitor, checkpoint_every=checkpoint_every)]  # fmt: skip
    else:
        chosen_engine = (encoder.engine.name if engine == "auto" else engine, verify_fraction)
        parts, all_stats = _encode_in_parallel(plan, loaded, resolved, work, executor, partitions, settings,
                                               chosen_engine)  # fmt: skip
    total = Stats(
        records=sum(s.records for s in all_stats),
        documents=sum(s.documents for s in all_stats),
        tokens=sum(s.tokens for s in all_stats),
        skipped=sum(s.skipped for s in all_stats),
        errors=[e for s in all_stats for e in s.errors][:100],
    )
    monitor.update(total, final=True)
    outputs = _write_outputs(plan, writer_class, targets, parts, writer_options, replace=bool(resume or overwrite))
    _discard(work)
    return {
        "documents": total.documents,
        "tokens": total.tokens,
        "bytes": total_bytes,
        "seconds": round(time.perf_counter() - started, 3),
        "skipped": total.skipped,
        "errors": total.errors,
        "engine": encoder.engine.name,
        "engine_reason": encoder.reason,
        "outputs": outputs,
    }


# -- the steps of a run -------------------------------------------------------------------------------------


def _eos_mode(eos: str | None, writer_class: type[TokenWriter], on_error: str, verify_fraction: float) -> str:
    """The run's end-of-document mode (by default the format's convention), after checking the plain options."""
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
) -> Plan:
    """Everything that decides the output (what a checkpoint must match to be resumed)."""
    import hashlib

    if eos != "none" and eos_id is None:
        found = loaded.token_to_id(END_OF_TEXT)
        if found is None:
            raise FormatError(
                f"the tokenizer has no {END_OF_TEXT!r} token; pass {option('eos_id', 'ID')} or "
                f"{option('eos', repr('none'))}."
            )
        eos_id = int(found)
    return Plan(
        inputs=[i.name for i in resolved],
        format=format,
        keys=[text_key] if isinstance(text_key, str) else list(text_key),
        eos=eos,
        eos_id=eos_id if eos != "none" else None,
        split=split_fractions(split),
        seed=int(seed),
        unit=unit,
        vocab_size=loaded.get_vocab_size(with_added_tokens=True),
        tokenizer_hash=hashlib.sha256(loaded.to_str().encode("utf-8")).hexdigest(),
        on_error=on_error,
    )


def _check_outputs(
    writer_class: type[TokenWriter], targets: dict[tuple[str, str], Path], work: Path, *, overwrite: bool, resume: bool
) -> None:
    """Refuse outputs that exist (before any work is done), unless replacing or resuming; ``overwrite`` without
    ``resume`` starts a failed run's work folder over."""
    if overwrite and not resume and work.exists():
        shutil.rmtree(work)
    if overwrite or (resume and work.exists()):
        return
    for target in targets.values():
        for path in writer_class.existing_outputs(target):
            raise OutputExistsError(
                f"{path} already exists; pass {option('overwrite')} to replace it (nothing was written)."
            )


def _encode_in_parallel(
    plan: Plan,
    loaded: Any,
    resolved: list[Input],
    work: Path,
    executor: Executor,
    partitions: int | None,
    settings: tuple[int, bool, float],
    engine: tuple[str, float],
) -> tuple[list[Path], list[Stats]]:
    """Encode partitions of the inputs in ``executor``'s workers, each into its own spools (joined in input order
    later, so the output equals a single-process run). ``engine``: the one the gate chose here, gated again there."""
    if any(i.path is None for i in resolved):
        raise FormatError("executor= needs file inputs: an in-memory iterable cannot be shipped to workers.")
    groups = _partition(resolved, min(partitions or len(resolved), 64, len(resolved)))
    parts = [work / f"part-{n:04d}" for n in range(len(groups))]
    batch_size, resume, checkpoint_every = settings
    tokenizer_json = loaded.to_str()
    jobs = [
        (asdict(plan), tokenizer_json, [str(i.path) for i in group], first, str(part), batch_size, resume,
         checkpoint_every, engine)
        for (first, group), part in zip(groups, parts)
    ]  # fmt: skip
    return parts, [Stats(**result) for result in executor.map(_partition_job, jobs)]


def _write_outputs(
    plan: Plan,
    writer_class: type[TokenWriter],
    targets: dict[tuple[str, str], Path],
    parts: list[Path],
    writer_options: dict[str, Any],
    *,
    replace: bool,
) -> dict[str, Any]:
    """Feed each stream's spools, partition by partition, to the format's writer; each output appears atomically."""
    outputs = {}
    dtype = dtype_for_vocab(plan.vocab_size)
    for (key, split), target in targets.items():
        name = _stream_name(key, split)
        options = {
            "vocab_size": plan.vocab_size,
            **writer_class.tokenize_options,
            **writer_class.split_options(split or None),
            **writer_options,
        }
        writer = api.create_corpus(target, plan.format, overwrite=replace, **options)
        with writer:
            for part in parts:
                copy_spool(writer, part, name, dtype)
        outputs[name] = {
            "path": str(target),
            "documents": writer.num_documents,
            "tokens": writer.num_tokens,
            "files": [str(p) for p in writer.written],
        }
        sources = _provenance(plan, parts, name, writer.num_documents) if plan.provenance else None
        if sources is not None:
            sidecar = save_provenance(sources, api.written_dataset_path(writer, plan.format))
            outputs[name]["provenance"] = str(sidecar)  # beside the dataset, not one of its files
    return outputs


def _provenance(plan: Plan, parts: list[Path], name: str, documents: int) -> Provenance | None:
    """The sources of one stream's documents, from every partition's row spool in order; None when a spool is
    incomplete (a resumed run that began without provenance)."""
    pieces = []
    for part in parts:
        count = json.loads((part / CHECKPOINT).read_text(encoding="utf-8"))["spools"][name]["documents"]
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
