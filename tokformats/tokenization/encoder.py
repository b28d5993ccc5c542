"""A tokenize run's engine, checked against ``tokenizers`` on a sample of the corpus (:class:`Encoder`): the first
documents, then documents drawn across the input, compared while the engine goes on and settled before every
checkpoint, so that no id a check has not passed is ever committed."""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from functools import partial
from typing import Any, NamedTuple

import numpy as np

from ..core.documents import offsets_from_lengths
from ..errors import option
from . import engines  # select_engine is looked up there at each call (a test replaces it)
from .engines import Engine, EngineMismatchError, TokenizersEngine, differing_text, encoded

__all__ = ["VERIFY_BYTES", "WHOLE_INPUT_SAMPLED", "Encoder", "FirstSample", "SubmittedBatch", "verification_rate"]


#: Gated engines of this process, by (the selecting function, tokenizer hash, engine asked for, chat run): the gate,
#: the engines' timing and their loading are paid once per tokenizer per process (a run, or a pool's worker), not
#: once per run or partition. The function is part of the key so that a replaced one (a test's) is asked anew.
_GATED: dict[tuple[Any, str, str, bool], tuple[Engine, str]] = {}


def _gated_engine(tokenizer: Any, engine: str, tokenizer_hash: str | None, chat: bool) -> tuple[Engine, str]:
    """:func:`~.engines.select_engine` for ``tokenizer`` (whose ``to_str()`` has SHA-256 ``tokenizer_hash``; None:
    not cached), gating chat message text's way of encoding only for a ``chat`` run."""
    select = engines.select_engine  # looked up at each call, not bound at import
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


#: Why ``auto`` runs ``tokenizers`` on an input that is all in its first sample.
WHOLE_INPUT_SAMPLED = (
    "the whole input is within the first sample, which tokenizers encodes anyway to check a faster engine: none "
    "was loaded"
)


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
    """A run's first sample read ahead (:func:`~.pipeline._first_sample`): its ``texts``, the reference's ids of them
    (a future), and whether they are the ``whole_input`` (every document of the run)."""

    texts: list[str]
    reference: Future[tuple[np.ndarray, np.ndarray]]
    whole_input: bool = False

    @classmethod
    def started(
        cls, texts: list[str], tokenizer: Any, cleanup: contextlib.ExitStack, whole_input: bool = False
    ) -> FirstSample:
        """``texts`` with the reference's encoding of them (``tokenizer``'s) started in a thread of its own, shut
        down by ``cleanup``."""
        pool = ThreadPoolExecutor(1, thread_name_prefix="tokformats-first-sample")
        cleanup.callback(pool.shutdown, wait=True, cancel_futures=True)
        sample = cls(texts, pool.submit(TokenizersEngine(tokenizer).encode, texts), whole_input)
        pool.shutdown(wait=False)  # its one thread ends with its one job
        return sample


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
        #: The first sample as :func:`~.pipeline._first_sample` read it and started its reference encoding before this
        #: encoder was built (the engine's gate then runs beside it); used once, if the run's first sample is it.
        self._first = first_sample
        self.reference = TokenizersEngine(tokenizer, tokenizer_hash)  # shares its chat copy across runs
        if chosen is None and engine == "auto" and first_sample is not None and first_sample.whole_input:
            # Every id a faster engine would give is re-encoded by the reference to check it: loading and gating
            # that engine (fastokens: 0.16-0.18 s for a 32,000-token BPE) would only add to the reference's work.
            chosen = self.reference, WHOLE_INPUT_SAMPLED
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
        #: :meth:`~.partition_run._PartitionRun.run`); None: checked in line.
        self.verifier: Executor | None = None
        #: Where the engine encodes a batch while the run finishes the one before (set for a run by
        #: :meth:`~.partition_run._PartitionRun.run`); None: encoded in line.
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

    def submit(self, texts: list[str], where: Any, split_special: bool = False) -> SubmittedBatch:
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
        return SubmittedBatch(texts, where, split_special, self.engine, ids, chosen, reference, self.batches == 1)

    def result(self, encoding: SubmittedBatch, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
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


class SubmittedBatch(NamedTuple):
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
