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

Where each part lives: the plan and the option checks in :mod:`.plan`; the work folder in :mod:`.work_folder`; the
reader thread in :mod:`.batching`; the checked engine in :mod:`.encoder`; one partition's encoding in
:mod:`.partition_run`, its spools in :mod:`.spools`; the executor's workers in :mod:`.parallel`; the writing phase
in :mod:`.outputs`; counters and progress in :mod:`.progress`. This module is the run's sequence of steps.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterable
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

from .. import api
from ..core.registry import default_corpus_format
from .batching import MAX_BATCH_TEXT, batch_is_full
from .chat_encoding import ChatSpec
from .encoder import VERIFY_BYTES, Encoder, FirstSample, verification_rate
from .engines import size_fastokens_pool, unset_environment
from .executors import in_process_engine_threads
from .outputs import checked_writer_options, write_outputs
from .parallel import encode_in_parallel, start_workers
from .partition_run import encode_partition
from .plan import Plan, chat_plan, check_options, eos_mode, make_plan, output_paths, split_fractions, verify_budget
from .progress import Progress, Stats
from .sources import Input, Record, iter_records, read_by_line, resolve_inputs
from .tokenizer import load_tokenizer
from .work_folder import check_outputs, errors_naming_output, owned_work_folder, remove_work_folder

__all__ = ["tokenize", "split_fractions", "output_paths", "verification_rate"]


#: Names this module held before it was split into the run's parts, and the module that holds each now: imported
#: from here they still work, with a DeprecationWarning, until the next release.
_MOVED = {
    "EOS_MODES": "plan",
    "END_OF_DOCUMENT": "plan",
    "assign_splits": "plan",
    "CHECKPOINT": "spools",
    "Spool": "spools",
    "adopt_spool": "spools",
    "copy_spool": "spools",
    "join_spool": "spools",
    "PARTITION_WAIT": "work_folder",
    "CHAT_CHUNK": "batching",
}


def __getattr__(name: str) -> Any:
    """A name moved out of this module (:data:`_MOVED`), from its new module, with a DeprecationWarning."""
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib
    import warnings

    home = f"{__package__}.{_MOVED[name]}"
    warnings.warn(
        f"{__name__}.{name} is now {home}.{name} (the old name goes away in the next release).",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(home), name)


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
        inputs: files, globs or folders (``.txt``, ``.json``, ``.jsonl``, ``.parquet``; ``.gz``/``.zst``; one
            string is always a path or glob), or an iterable of strings to tokenize (a list, or a
            ``datasets.Dataset`` column).
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
            C cores; :func:`~.executors.engine_threads`, :func:`~.engines.limit_threads`). None: encoded here, by
            fastokens on ``max(1, C - 1)`` threads (up to 32 cores; not on macOS) where it is not loaded yet and
            ``FASTOKENS_BPE_THREADS`` is not set (a core left to the reader and this thread; the pool keeps that
            size for the process: :func:`~.engines.size_fastokens_pool`).
        partitions: how many partitions (default: one per input file, and one per 64 MiB where the inputs are
            larger). Large files are cut at line starts (JSON Lines, text per line) or row groups (Parquet); the
            output is byte-identical to a single-process run whatever the partitioning
            (:mod:`tokformats.tokenization.partitions`).
        overwrite: replace existing outputs.
        checkpoint_every: seconds between checkpoints (spools fsynced, position recorded): what a crash can lose.
        engine: ``auto`` (fastokens when installed and it passes the identity gate, else tokenizers; tokenizers for
            a file read by line, one text key, no chat, that ends within its first batch and first MiB: tokenizers
            encodes all of it anyway as the check),
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
    check_options(output=output, engine=engine, on_error=on_error, verify_fraction=verify_fraction, unit=unit,
                  seed=seed)  # fmt: skip
    eos = eos_mode(eos, writer_class)
    resolved = resolve_inputs(inputs)
    work = Path(f"{output}.tokenize")
    with owned_work_folder(work), contextlib.ExitStack() as naming:  # one run at a time: a second one is refused
        start_workers(executor, resolved, partitions)  # while the tokenizer is loaded here, not after
        loaded = load_tokenizer(tokenizer)
        naming.enter_context(errors_naming_output(output))  # the run's own files from here: not the tokenizer's
        plan, serialised = make_plan(resolved, loaded, format, text_key, eos, eos_id, split, seed, unit, on_error)
        plan, spec = chat_plan(plan, writer_class, chat, template, train_on, thought, tokenizer, loaded)
        plan.provenance = bool(provenance)
        targets = output_paths(output, format, plan.keys, plan.splits)
        check_outputs(writer_class, targets, work, overwrite=overwrite, resume=resume)
        writer_options = checked_writer_options(plan, writer_class, targets, writer_options, tokenizer)
        total_bytes = sum(i.size or 0 for i in resolved) or None
        show = _shows_progress(progress)
        rate = verification_rate(verify_fraction, verify_budget(verify_bytes), total_bytes)
        encoder = None  # a parallel run's workers gate the engine themselves: the parent encodes nothing
        if executor is None:  # the first sample is read ahead, its check started, before the engine is gated
            # fastokens' threads sized before any thread of the run starts; the variable unset once all have ended
            threads = in_process_engine_threads() if engine != "tokenizers" else None
            naming.callback(unset_environment, size_fastokens_pool(threads))
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
        outputs = write_outputs(plan, writer_class, targets, parts, writer_options, replace=bool(resume or overwrite))
        total = Stats.total(all_stats)
        monitor.update(total, final=True)
        remove_work_folder(work)
        # The engine is the first partition's: the one that checked the first documents.
        return _summary(total, total_bytes, time.perf_counter() - started, chosen[0], outputs)


def _summary(
    total: Stats, total_bytes: int | None, seconds: float, engine: tuple[str, str], outputs: dict[str, Any]
) -> dict[str, Any]:
    """What ``tokenize`` returns: the run's counts, its time, its engine and why, and each output's summary."""
    return {
        "documents": total.documents,
        "tokens": total.tokens,
        "bytes": total_bytes,
        "text_characters": total.text,
        "seconds": round(seconds, 3),
        "skipped": total.skipped,
        "errors": total.errors,
        "engine": engine[0],
        "engine_reason": engine[1],
        "outputs": outputs,
    }


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
        return encode_in_parallel(plan, encoder, resolved, work, executor, partitions, settings, engine, chat,
                                   reported)  # fmt: skip
    batch_size, resume, checkpoint_every = settings
    part = work / "part-0000"
    reported[0].append(encode_partition(plan, encoder, resolved, 0, part, batch_size=batch_size, resume=resume,
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
    first document is a whole file). Its ``whole_input`` says that the input ended within the sample (``auto`` then
    runs on the reference alone)."""
    if engine == "tokenizers" or plan.chat is not None or len(plan.keys) != 1 or resume or plan.unit == "file":
        return None
    if not all(map(read_by_line, resolved)):
        return None
    batch: list[Record] = []
    text, ended = 0, True
    try:
        with contextlib.closing(iter_records(resolved, tuple(plan.keys), plan.unit)) as records:
            for record in records:  # the first batch, as read_batches groups it
                batch.append(record)
                text += sum(map(len, record.texts)) if record.texts else 0
                if batch_is_full(len(batch), text, batch_size):
                    ended = False  # (a full batch that is the whole input is taken for more: nothing lost)
                    break
    except Exception:  # the run's reader reads the same input and raises its error where it always has
        return None
    texts = [r.texts[0] for r in batch if r.texts is not None]
    if not texts:  # an input with no text at all is its whole first sample, an empty one
        return FirstSample.started([], loaded, cleanup, whole_input=True) if ended else None
    count, held = Encoder.first_count(texts, Encoder.FIRST_SAMPLE_BYTES)
    if held > _FIRST_SAMPLE_READ_AHEAD:
        return None
    return FirstSample.started(texts[:count], loaded, cleanup, whole_input=ended and count == len(texts))


#: The most text the first sample's read-ahead keeps (its documents up to :attr:`Encoder.FIRST_SAMPLE_BYTES`, at
#: least one): a huge first document is left to the run, rather than held twice.
_FIRST_SAMPLE_READ_AHEAD = 4 * MAX_BATCH_TEXT
