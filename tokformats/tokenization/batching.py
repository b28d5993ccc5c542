"""The reader thread of a tokenize run: records grouped into batches (by documents and by text), each with the input
bytes read up to its end, and a chat batch read into turns as its records arrive."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from .sources import Record

__all__ = ["CHAT_CHUNK", "MAX_BATCH_TEXT", "BatchPreparing", "batch_is_full", "read_batches", "stop_reader"]


class BatchPreparing(Protocol):
    """What the reader thread does with a batch as it reads it (a chat run's conversations, read into turns)."""

    def add(self, batch: list[Record]) -> None:
        """Take the batch so far (every :data:`CHAT_CHUNK` records)."""

    def batch(self, batch: list[Record]) -> Any:
        """The whole batch, prepared: what the reader passes on beside it."""


#: Text (characters) per batch at most, whatever the batch size in documents: progress and checkpoints then come
#: about once a second even when documents are long (a novel by paragraph, whole files).
MAX_BATCH_TEXT = 1 << 20


#: Chat records read into turns at a time, as the reader thread reads them (:class:`BatchPreparing`; a chat run's is
#: :class:`~.partition_run._Preparing`): their parsed JSON (an object and a list per record, an object per message:
#: about 8 objects per record with the record's own) is dropped at once, so that what a chunk allocates is freed before
#: the garbage collector's next young collection (every 700 allocations not freed) instead of living until the batch is
#: finished. Held a batch long, those objects set off 4-5x as many young collections and, through them, older ones, full
#: ones included: about 0.05 s of the 30 MB chat row's CPU (`benchmarks/README.md`), all of it holding the GIL.
CHAT_CHUNK = 32


def batch_is_full(documents: int, text: int, size: int) -> bool:
    """Whether a batch of ``documents`` records holding ``text`` characters is full: ``size`` documents, or
    :data:`MAX_BATCH_TEXT` of text (the one rule of a batch's end, for the reader and the first sample's read-ahead)."""
    return documents >= size or text >= MAX_BATCH_TEXT


def read_batches(
    records: Iterator[Record],
    size: int,
    out: queue.Queue[Any],
    stop: threading.Event,
    counters: list[Any],
    prepare: Callable[[], BatchPreparing] | None = None,
) -> None:
    """The reader thread: groups records into batches of ``size`` documents, each with the input bytes read up to
    its end (so progress counts what was encoded, not what was read ahead) and, with ``prepare``, what a new
    :class:`BatchPreparing` makes of it (None without): it is given the batch every :data:`CHAT_CHUNK` records, as
    they are read, and at its end; passes errors on, in order."""
    try:
        batch: list[Record] = []
        text = 0
        preparing = prepare() if prepare else None
        for record in records:
            if stop.is_set():
                return
            batch.append(record)
            text += sum(map(len, record.texts)) if record.texts else 0
            if batch_is_full(len(batch), text, size):
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


def stop_reader(reader: threading.Thread, batches: queue.Queue[Any], stop: threading.Event) -> None:
    """Stop the reader thread, unblocking it if it waits on a full queue."""
    stop.set()
    while reader.is_alive():
        try:
            batches.get_nowait()
        except queue.Empty:
            reader.join(0.05)
