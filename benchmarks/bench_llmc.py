"""Opening many llm.c shards: tokformats against llm.c's own C loader (``llmc/dataloader.h``), same shards.

Run: ``python benchmarks/bench_llmc.py --llmc DIR [--shards 10 1000 10000] [--repeat 5]`` where ``DIR`` is a
checkout of karpathy/llm.c: its ``llmc/dataloader.h`` is compiled unchanged with a ten-line driver that calls
``dataloader_init(pattern, B, T, 0, 1, 0)`` and ``dataloader_next_batch`` and prints the time between. The other side
runs ``tokformats.open(pattern)`` and takes the first ``batches(B, T)`` batch (which is llm.c's first batch, checked
equal). Each run is a fresh process, sides alternate, and the clock covers the open and the first batch only (the
C side's glob, every header read and the first shard load; the Python side's detection, expansion, headers and
first map), after ``import tokformats``; the process's wall time (interpreter start and imports included) is
reported beside it, and so is the fastest of ``WARM_OPENS`` more opens in the same child (the format's modules
imported: what remains is the open itself). "Of which garbage collection" is the time the cyclic collector ran
inside the clock (``gc.callbacks``): a fresh process's first open runs the generation-1 collection that the
imports before it (NumPy's and ``import tokformats``) left due, whatever allocates first pays it. Ratios are
llm.c's time over tokformats' time: > 1 means tokformats is faster.

``--floor`` adds two sides, alternated with the others: the least any Python open of the glob can cost with
tokformats' checks, written out in this script with no library imported (one ``scandir`` of the folder, its types
kept for the journal check; the match, sorted; one ``stat`` per shard, the pin; the first header read and checked
against its size; every size checked; the first shard mapped; the first batch); and tokformats' child with the
modules a glob's first open imports (``IMPORTED_FIRST``) imported before its clock. The tokformats child's time
less the second is the import of those modules; the second less the floor, what tokformats' open does beyond the
floor; the floor against llm.c's loader, Python's cost of the same calls.

A last run opens the largest glob under ``ulimit -n 256`` and reads every token, to show that descriptors stay
bounded (the C loader holds one file at a time too).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import installed_env, machine, scratch, table

HERE = Path(__file__).resolve()
BATCH, SEQUENCE = 4, 64
SHARD_TOKENS = 1_000
#: Opens repeated in the tokformats child after the timed one, modules imported.
WARM_OPENS = 5
#: The modules a fresh process's first open of an llm.c glob imports after ``import tokformats`` (``--floor``
#: imports them before the clock in one more side: what is left is the open without its import).
IMPORTED_FIRST = ("tokformats.core.detectors", "tokformats.formats.llmc")

DRIVER = r"""
#include <time.h>
#include "llmc/dataloader.h"
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char** argv) {
    DataLoader loader;
    int B = atoi(argv[2]), T = atoi(argv[3]);
    double start = now();
    dataloader_init(&loader, argv[1], B, T, 0, 1, 0);
    dataloader_next_batch(&loader);
    double seconds = now() - start;
    long sum = 0;
    for (int i = 0; i < B * T; i++) sum += loader.inputs[i];
    printf("{\"seconds\": %.9f, \"first_batch_sum\": %ld, \"tokens\": %zu}\n", seconds, sum, loader.num_tokens);
    dataloader_free(&loader);
    return 0;
}
"""


def build_driver(llmc: Path, folder: Path) -> Path:
    """Compile llm.c's ``dataloader.h`` with the driver above; return the executable."""
    source = folder / "driver.c"
    source.write_text(DRIVER)
    binary = folder / "llmc_open"
    subprocess.run(["gcc", "-O2", "-I", str(llmc), "-o", str(binary), str(source), "-lm"], check=True)
    return binary


def make_shards(folder: Path, count: int) -> str:
    """``count`` GPT-2 shards of ``SHARD_TOKENS`` tokens (written once, reused); returns their glob."""
    import tokformats

    pattern = folder / f"n{count}" / "corpus_train_*.bin"
    if len(list(pattern.parent.glob("corpus_train_*.bin"))) != count:
        pattern.parent.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(count)
        tokens = rng.integers(0, 50256, count * SHARD_TOKENS - 1).astype(np.uint16)
        flat = np.concatenate([[50256], tokens]).astype(np.uint16)
        with tokformats.create(
            pattern.parent / "corpus", "llmc", vocab_size=50257, split="train", shard_size=SHARD_TOKENS, overwrite=True
        ) as writer:
            writer.write_batch(flat, [len(flat)])
    return str(pattern)


def child(pattern: str, imported: bool = False) -> None:
    """The tokformats side, in its own process: open the glob and take the first batch; then the same again
    ``WARM_OPENS`` times with the format's modules imported (the fastest is reported: the floor of an open).
    ``imported``: the modules the first open imports (``IMPORTED_FIRST``) are imported before the clock."""
    import gc
    import importlib

    import tokformats

    if imported:
        for name in IMPORTED_FIRST:
            importlib.import_module(name)

    collecting: list[float] = []  # the cyclic collector's passes inside the clock (start, stop, start, stop, ...)

    def note(phase: str, info: dict[str, int]) -> None:
        collecting.append(time.perf_counter())

    gc.callbacks.append(note)
    started = time.perf_counter()
    reader = tokformats.open(pattern)
    inputs, _ = next(reader.batches(BATCH, SEQUENCE))  # type: ignore[attr-defined]
    seconds = time.perf_counter() - started
    gc.callbacks.remove(note)
    collected = sum(collecting[1::2]) - sum(collecting[0::2])
    warm = []
    for _ in range(WARM_OPENS):
        again = time.perf_counter()
        next(tokformats.open(pattern).batches(BATCH, SEQUENCE))  # type: ignore[attr-defined]
        warm.append(time.perf_counter() - again)
    summary = {"seconds": seconds, "first_batch_sum": int(inputs.sum()), "tokens": reader.num_tokens, "gc": collected}
    print(json.dumps({**summary, "warm_seconds": min(warm)}))


def floor_child(pattern: str) -> None:
    """The Python floor (``--floor``), in its own process, with the modules the tokformats child has imported before
    its clock (NumPy, this script's): the same checks as a glob's open, no library, nothing general. A one-``*``
    pattern in its last part, GPT-2 shards (the ones :func:`make_shards` writes). Left out: detection (the format
    is known) and the journal check (one ``stat`` of the folder's journal name), a few microseconds each."""
    import itertools
    import mmap
    import operator
    import stat
    import struct

    started = time.perf_counter()
    folder, name = os.path.split(pattern)
    start, end = name.split("*")
    descriptor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with os.scandir(descriptor) as listing:
            entries = list(listing)
    finally:
        os.close(descriptor)
    # C loops throughout (map, compress), as tokformats' listing: no bytecode run per entry or per shard
    every = list(map(operator.attrgetter("name"), entries))
    folders = set(itertools.compress(every, map(os.DirEntry.is_dir, entries)))  # what a journal check needs
    names = list(itertools.compress(every, map(str.startswith, every, itertools.repeat(start))))
    names = list(itertools.compress(names, map(str.endswith, names, itertools.repeat(end))))
    names.sort()
    if folders.intersection(names):
        raise SystemExit(f"{pattern} matches a folder")
    paths = list(map(os.path.join(folder, "").__add__, names))
    pin = operator.attrgetter("st_dev", "st_ino", "st_size", "st_mtime_ns")
    pins = list(itertools.chain.from_iterable(map(pin, map(os.stat, paths))))
    sizes = pins[2::4]
    if min(sizes) < 1024 or any(map((2).__rmod__, sizes)):
        raise SystemExit(f"{pattern}: a size no GPT-2 shard has")
    counts = (np.array(sizes, dtype=np.int64) - 1024) // 2
    shard = os.open(paths[0], os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(shard).st_mode):
            raise SystemExit(f"{paths[0]} is not a regular file")
        magic, version, ntok = struct.unpack_from("<3i", os.pread(shard, 1024, 0))
        if (magic, version) != (20240520, 1) or 1024 + 2 * ntok != sizes[0]:
            raise SystemExit(f"{paths[0]}: not a GPT-2 shard of its size")
        mapped = mmap.mmap(shard, sizes[0], access=mmap.ACCESS_READ)
    finally:
        os.close(shard)
    window = np.frombuffer(mapped, dtype="<u2", count=ntok, offset=1024)[: BATCH * SEQUENCE + 1].astype(np.int32)
    inputs = window[:-1].reshape(BATCH, SEQUENCE)
    seconds = time.perf_counter() - started
    print(json.dumps({"seconds": seconds, "first_batch_sum": int(inputs.sum()), "tokens": int(counts.sum())}))


def read_all_limited(pattern: str) -> None:
    """Under ``RLIMIT_NOFILE`` 256: open the glob and read every token, shard by shard and as documents."""
    import resource

    resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    import tokformats

    started = time.perf_counter()
    reader = tokformats.open(pattern)
    total = sum(int(np.asarray(shard, dtype=np.int64).sum()) for shard in reader.shards)  # type: ignore[attr-defined]
    documents = len(reader)
    seconds = time.perf_counter() - started
    descriptors = len(os.listdir("/proc/self/fd"))
    print(json.dumps({"seconds": seconds, "sum": total, "documents": documents, "open_fds": descriptors}))


def timed(command: list[str], source: Path | None = None) -> tuple[dict[str, float], float]:
    started = time.perf_counter()
    out = subprocess.run(command, check=True, capture_output=True, text=True, env=installed_env(source)).stdout
    wall = time.perf_counter() - started
    return json.loads(out.strip().splitlines()[-1]), wall


def spread(values: list[float], scale: float = 1e3) -> str:
    """``min/median/max`` of ``values`` (seconds) in milliseconds."""
    return "/".join(f"{v * scale:.1f}" for v in (min(values), statistics.median(values), max(values)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llmc", type=Path, required=True, help="a checkout of karpathy/llm.c")
    parser.add_argument("--shards", type=int, nargs="+", default=[10, 1_000, 10_000])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--baseline",
        type=Path,
        help="another tokformats checkout (`git worktree add /tmp/base main`), timed as a third side, alternated",
    )
    parser.add_argument(
        "--floor", action="store_true", help="time the least a Python open with the same checks costs, as a side"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--imported", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--floor-child", help=argparse.SUPPRESS)
    parser.add_argument("--limited", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.imported)
        return
    if args.limited:
        read_all_limited(args.limited)
        return
    if args.floor_child:
        floor_child(args.floor_child)
        return
    folder = scratch("llmc")
    driver = build_driver(args.llmc, folder)
    rows = []
    for count in args.shards:
        pattern = make_shards(folder, count)
        child_command = [sys.executable, str(HERE), "--llmc", str(args.llmc), "--child", pattern]
        floor_command = [sys.executable, str(HERE), "--llmc", str(args.llmc), "--floor-child", pattern]
        timed(child_command)  # fills the bytecode cache
        if args.baseline:
            timed(child_command, args.baseline)
        baseline: list[float] = []
        floor: list[float] = []
        imported: list[float] = []
        theirs: list[float] = []
        ours: list[float] = []
        warm: list[float] = []
        collected: list[float] = []
        walls: dict[str, list[float]] = {"c": [], "py": []}
        for _ in range(args.repeat):
            c, c_wall = timed([str(driver), pattern, str(BATCH), str(SEQUENCE)])
            py, py_wall = timed(child_command)
            if args.baseline:
                baseline.append(timed(child_command, args.baseline)[0]["seconds"])
            if args.floor:
                least, _ = timed(floor_command)
                if (least["first_batch_sum"], least["tokens"]) != (c["first_batch_sum"], c["tokens"]):
                    raise SystemExit(f"the floor disagrees: llm.c {c}, floor {least}")
                floor.append(least["seconds"])
                imported.append(timed([*child_command, "--imported"])[0]["seconds"])
            if (c["first_batch_sum"], c["tokens"]) != (py["first_batch_sum"], py["tokens"]):
                raise SystemExit(f"the sides disagree: llm.c {c}, tokformats {py}")
            theirs.append(c["seconds"])
            ours.append(py["seconds"])
            warm.append(py["warm_seconds"])
            collected.append(py["gc"])
            walls["c"].append(c_wall)
            walls["py"].append(py_wall)
        ratios = sorted(t / o for t, o in zip(theirs, ours))
        row = {"shards": f"{count:,}", "llm.c open + first batch (ms)": spread(theirs)}
        if baseline:
            row["tokformats baseline (ms)"] = spread(baseline)
        if floor:
            row["Python floor, no library (ms)"] = spread(floor)
            row["tokformats, imports before the clock (ms)"] = spread(imported)
        rows.append(
            {
                **row,
                "tokformats (ms)": spread(ours),
                "of which garbage collection (ms)": spread(collected),
                "tokformats, modules imported (ms)": spread(warm),
                "ratio": "/".join(f"{r:.2f}" for r in (ratios[0], statistics.median(ratios), ratios[-1])),
                "process wall llm.c / tokformats (ms, medians)": (
                    f"{statistics.median(walls['c']) * 1e3:.0f} / {statistics.median(walls['py']) * 1e3:.0f}"
                ),
            }
        )
    print(f"{machine()}; load: {os.getloadavg()[0]:.2f}; {args.repeat} alternated runs; min/median/max")
    print(table(rows))
    pattern = make_shards(folder, max(args.shards))
    command = [sys.executable, str(HERE), "--llmc", str(args.llmc), "--limited", pattern]
    run = subprocess.run(command, capture_output=True, text=True, env=installed_env())
    if run.returncode:
        print(f"ulimit -n 256, {max(args.shards):,} shards: failed: {run.stderr.strip().splitlines()[-1]}")
        return
    limited = json.loads(run.stdout.strip().splitlines()[-1])
    print(
        f"ulimit -n 256, {max(args.shards):,} shards: every token read (sum {limited['sum']:,}), "
        f"{limited['documents']:,} documents, {limited['open_fds']} descriptors open at the end, "
        f"{limited['seconds']:.2f} s"
    )


if __name__ == "__main__":
    main()
