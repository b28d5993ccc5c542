"""Encoding one partition of a tokenize run's inputs into spools (:func:`encode_partition`): a reader thread reads
batches ahead, the engine encodes each in a thread of its own with the next ones queued while an earlier one is
spooled, and a checkpoint every few seconds makes the partition resumable, byte for byte."""

from __future__ import annotations

import collections
import contextlib
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from .. import api
from ..core.documents import add_delimiter
from ..core.dtypes import dtype_for_vocab
from ..core.provenance import ROW_DTYPE, RowSpool
from ..errors import option
from ..fs.owner import owned_folder
from .batching import read_batches, stop_reader
from .chat import ChatError, Turns, TurnsReader
from .chat_encoding import ChatSpec, EndOfDocument
from .checkpoints import load_checkpoint, synced_and_read_back, write_checkpoint
from .encoder import Encoder, SubmittedBatch
from .plan import Plan, assign_splits, stream_name
from .progress import Progress, Stats
from .sources import Input, Record, SourceError, iter_records
from .spools import CHECKPOINT, Spool
from .templates import Layout
from .work_folder import PARTITION_WAIT

__all__ = ["ENCODE_AHEAD", "encode_partition"]

#: Batches started (given to the engine's thread) beyond the one being finished: the engine encodes the next while
#: the one after waits in its queue, so that it has work whenever it is done, however long this thread takes to
#: spool a batch and to take the next from the reader (with one, the engine waited between batches for 15-25% of
#: the encode phase: `benchmarks/README.md`, `tok6`).
ENCODE_AHEAD = 2


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
    encodings: list[SubmittedBatch | None]


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
        state = load_checkpoint(folder, plan, resume)
        counted = state.get("stats", {})
        self.stats = Stats(**{k: v for k, v in counted.items() if k in ("records", "documents", "tokens", "skipped")})
        self.stats.errors = list(state.get("errors", []))
        recorded = state.get("spools", {})
        self.spools = {
            stream: Spool(
                folder,
                stream_name(*stream),
                self.dtype,
                **recorded.get(stream_name(*stream), {}),
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
            stream: RowSpool(folder / f"{stream_name(*stream)}.provenance", self.spools[stream].num_documents)
            for stream in (plan.streams if plan.provenance else [])
        }
        self.delimit_empty = api.corpus_writer(plan.format).delimit_empty_documents
        self.fractions = list(plan.split.values()) if plan.split else [1.0]

    def save(self, done: bool = False) -> None:
        """Checkpoint: every outstanding check of the engine passed (a difference raises before anything is
        committed), every spool fsynced (the last checkpoint: each ids spool read back and pinned too), then the
        counts and the position committed in one step (:mod:`.checkpoints`)."""
        self.encoder.settle()
        if done:
            synced_and_read_back(list(self.spools.values()))
        else:
            for spool in self.spools.values():
                spool.sync()
        for rows in self.sources.values():
            rows.sync()
        spools = {stream_name(*stream): spool for stream, spool in self.spools.items()}
        write_checkpoint(self.checkpoint, self.plan, self.position, spools, self.stats, done=done)

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

    def _take_chat(self, prepared: _ChatBatch, encoding: SubmittedBatch | None) -> None:
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
        encodings: list[SubmittedBatch | None] = [
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
            target=read_batches, args=(records, batch_size, batches, stop, counters, prepare), daemon=True
        )
        reader.start()
        # The reference encodes the sampled documents in a thread of its own, and the engine each batch in another
        # while this one finishes an earlier one (its ids into the spools): the engines release the GIL, so on
        # two cores the check and this thread's Python overlap the encoding instead of following it.
        verifier = ThreadPoolExecutor(1, thread_name_prefix="tokformats-verify")
        encoding = ThreadPoolExecutor(1, thread_name_prefix="tokformats-encode")
        self.encoder.verifier, self.encoder.encoding = verifier, encoding
        with contextlib.ExitStack() as cleanup:  # each step runs even when one before it is interrupted
            cleanup.callback(stop_reader, reader, batches, stop)
            cleanup.callback(verifier.shutdown, wait=True, cancel_futures=True)
            cleanup.callback(encoding.shutdown, wait=True, cancel_futures=True)
            cleanup.callback(self.encoder.discard)  # nothing is left after the last save; on an error, no one waits
            cleanup.callback(setattr, self.encoder, "encoding", None)
            cleanup.callback(setattr, self.encoder, "verifier", None)
            self._encode_batches(batches, progress, checkpoint_every)
            self.save(done=True)

    def _encode_batches(self, batches: queue.Queue[Any], progress: Progress | None, checkpoint_every: float) -> None:
        """Start each batch the reader passes, then finish the oldest started while more than :data:`ENCODE_AHEAD`
        are: the engine has the next batches queued while this thread spools one, so it never waits for this thread
        (a 1 MiB batch takes the engine a few milliseconds, about what spooling the one before takes here). A
        batch's own error comes first, as in a serial run: when the reader passes an error, or starting the next
        batch raises, the batches started before it are finished in order (and raise if one fails) before that error
        is raised."""
        last_save = time.perf_counter()
        started: collections.deque[tuple[_Started, int]] = collections.deque()
        while True:
            item = batches.get()
            try:
                if isinstance(item, BaseException):
                    raise item
                if item is not None:
                    started.append((self.start(item[0], item[2]), item[1]))
            except Exception:
                while started:
                    last_save = self._finish_one(*started.popleft(), progress, checkpoint_every, last_save)
                raise
            while started and (item is None or len(started) > ENCODE_AHEAD):
                last_save = self._finish_one(*started.popleft(), progress, checkpoint_every, last_save)
            if item is None:
                return

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
    reads the records not read yet (their parsed JSON dropped once read: see :data:`~.batching.CHAT_CHUNK`), as long
    as every chunk so far was in the common form (:attr:`TurnsReader.gathering`; else the rest waits for the batch's
    end, to be read in one call); :meth:`batch` reads the rest, joins the turns and lays them out
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


def _record_name(inputs: list[Input], good: list[Record], n: int) -> str:
    """How an error names text ``n`` of a batch of ``good`` records."""
    return f"{inputs[good[n].input].name}, record {good[n].index}"


def _chat_message(n: int) -> str:
    """How an error names a chat message text."""
    return "a chat message"


def encode_partition(
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
