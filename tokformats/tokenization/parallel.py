"""A tokenize run in an executor's workers: the inputs cut into partitions (:mod:`.partitions`), each encoded by a
worker into its own spools (:func:`.partition_run.encode_partition`), yielded in input order as they finish so that
the parent joins them while later ones encode. Each worker reads the run's tokenizer from the work folder (checked
against the plan's hash) and gates its engine once per process."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from concurrent.futures import Executor, Future
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..errors import ConfigError, FormatError, option
from ..fs.atomic import replace_file
from . import engines  # select_engine is looked up there at each call (a test replaces it)
from .chat_encoding import ChatSpec
from .encoder import Encoder
from .engines import Engine, limit_threads
from .executors import engine_threads
from .partition_run import encode_partition
from .partitions import PARTITION_BYTES, iter_partitions
from .plan import Plan
from .progress import Stats
from .sources import Input
from .workers import parent_watch, submitter

__all__ = ["encode_in_parallel", "start_workers"]


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
    select = engines.select_engine  # looked up at each call, not bound at import (a test replaces it)
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
        stats = encode_partition(
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


def encode_in_parallel(
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
    replace_file(tokenizer_file, serialised.encode("utf-8"))
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


def start_workers(executor: Executor | None, resolved: list[Input], partitions: int | None) -> None:
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
