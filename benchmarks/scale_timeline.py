"""Where a parallel ``tokenize`` spends its time before the first byte is encoded: each phase of the parent and of
every worker stamped with its wall offset and the process's CPU seconds (stderr), then wall and CPU of the process
tree (``getrusage``), its fraction of the cores' bound (CPU / cores x wall), and the cores busy in each quarter
second (the process tree's CPU from ``/proc``: where a core is left idle).

Run: ``python benchmarks/scale_timeline.py INPUT.jsonl OUTPUT WORKERS [PARTITIONS]`` (cl100k_base, megatron, a
spawned process pool). The stamps wrap private functions of ``tokformats.tokenization`` where the checked-out
version calls them, so that two versions can be compared side by side; spawned workers import this script
as their main module, so they are stamped too.
"""

from __future__ import annotations

import importlib
import itertools
import multiprocessing
import os
import resource
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import tokformats
from tokformats.tokenization import pipeline

SAMPLE = 0.25  # seconds between two samples of the process tree's CPU
T0 = float(os.environ.setdefault("TIMELINE_T0", repr(time.time())))  # the parent's start, inherited by workers


def stamp(what: str) -> None:
    print(f"[{os.getpid()} {time.time() - T0:7.2f}s cpu={time.process_time():6.2f}] {what}", file=sys.stderr,
          flush=True)  # fmt: skip


def stamped(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        stamp(f"> {name}")
        try:
            return function(*args, **kwargs)
        finally:
            stamp(f"< {name}")

    return wrapper


#: The stamped phases, each where the code calls it (``module.attribute`` under tokformats.tokenization): the first
#: place this checkout has (the pipeline was one module before it was split into several).
PHASES = {
    "load_tokenizer": ("pipeline.load_tokenizer",),
    "make_plan": ("pipeline.make_plan", "pipeline._make_plan"),
    "worker_engine": ("parallel._worker_engine", "pipeline._worker_engine"),
    "build_worker_engine": ("pipeline._build_worker_engine",),  # before 8e047be
    "encode_in_parallel": ("pipeline.encode_in_parallel", "pipeline._encode_in_parallel"),
    "encode_partition": ("parallel.encode_partition", "pipeline._encode_partition"),
    "write_outputs": ("pipeline.write_outputs", "pipeline._write_outputs"),
    "copy_spool": ("spools.copy_spool", "pipeline.copy_spool"),
    "join_spool": ("outputs.join_spool", "pipeline.join_spool"),
    "output_summary": ("outputs._output_summary", "pipeline._output_summary"),
    "remove_work_folder": ("pipeline.remove_work_folder", "pipeline._discard"),
    "start_workers": ("pipeline.start_workers", "pipeline._start_workers"),
}
for phase, places in PHASES.items():
    for place in places:
        module, name = place.split(".")
        try:
            owner = importlib.import_module(f"tokformats.tokenization.{module}")
        except ModuleNotFoundError:  # an older checkout
            continue
        if hasattr(owner, name):
            setattr(owner, name, stamped(phase, getattr(owner, name)))
            break
_submit = pipeline.Encoder.submit  # a run starts each batch with submit (encode is submit + result)
_first = [True]


def first_encode(self: Any, *args: Any, **kwargs: Any) -> Any:
    if _first[0]:
        _first[0] = False
        stamp("first encode")
    return _submit(self, *args, **kwargs)


pipeline.Encoder.submit = first_encode  # type: ignore[method-assign]
def timed_sync(sync: Any) -> Any:
    """``sync`` (``os.fsync``, ``os.fdatasync``) stamped when it takes 10 ms or more: the outputs' durability, at
    the end of the run (fsync) and after each partition's join (fdatasync)."""

    def timed(fd: int) -> None:
        started = time.time()
        sync(fd)
        if time.time() - started >= 0.01:
            stamp(f"{sync.__name__} {time.time() - started:.2f}s")

    return timed


os.fsync = timed_sync(os.fsync)
if hasattr(os, "fdatasync"):
    os.fdatasync = timed_sync(os.fdatasync)

if __name__ == "__main__":
    source, output, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
    partitions = int(sys.argv[4]) if len(sys.argv) > 4 else None
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_scale import cores, tree_cpu

    samples: list[tuple[float, float]] = []  # (wall offset, CPU seconds of the process tree)
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.wait(SAMPLE):
            samples.append((time.time() - T0, tree_cpu()))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.perf_counter()
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        summary = tokformats.tokenize(source, "cl100k_base", output, "megatron", progress=False, overwrite=True,
                                      executor=pool, partitions=partitions)  # fmt: skip
    wall = time.perf_counter() - started
    sampling.set()
    sampler.join()
    # Cores busy per interval: where the run leaves a core idle (the sampler's own reads of /proc included).
    busy = [f"{b[0]:.2f}:{(b[1] - a[1]) / (b[0] - a[0]):.1f}" for a, b in itertools.pairwise(samples)]
    print(f"cores busy per {SAMPLE:.2f} s (interval end: cores):", " ".join(busy), file=sys.stderr)
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    parent, children = me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime
    print(f"wall={wall:.2f} parent_cpu={parent:.2f} workers_cpu={children:.2f} "
          f"cores_busy={(parent + children) / wall:.2f} of_bound={(parent + children) / (cores() * wall):.2f} "
          f"engine={summary['engine']}")  # fmt: skip
