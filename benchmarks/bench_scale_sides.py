"""1 vs 2 workers, two checkouts side by side: each run a fresh process (pool start, imports and tokenizer build
included), wall and CPU seconds of the whole process tree (``getrusage`` of the process and of its waited-for
children, the pool's workers), the sides alternated and their order flipped every round.

Run: ``python benchmarks/bench_scale_sides.py INPUT.jsonl --before /work/main --after . [--rounds 3]
[--workers 0,1,2]`` (cl100k_base -> megatron; ``0``: no executor). Every output is checked byte-identical to the
first run's. Prints one line per run, then min/median/max per side and worker count, and the 2-over-1 ratios. "Of the
N-core bound": the run's CPU seconds over N x its wall seconds (N: the cores this process may run on), i.e. how
close the run comes to keeping every core busy; on a shared machine other processes' CPU lowers it too (the load
average is printed beside it).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path


def child(source: str, output: str, workers: int) -> None:
    """One run in this fresh process; prints a JSON line: wall, parent and workers' CPU, the outputs' hash."""
    import tokformats

    started = time.perf_counter()
    if workers:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            summary = tokformats.tokenize(source, "cl100k_base", output, "megatron", progress=False, overwrite=True,
                                          executor=pool)  # fmt: skip
    else:
        summary = tokformats.tokenize(source, "cl100k_base", output, "megatron", progress=False, overwrite=True)
    wall = time.perf_counter() - started
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    digest = hashlib.sha256()
    for result in summary["outputs"].values():
        for name in result["files"]:
            with open(name, "rb") as handle:
                while piece := handle.read(1 << 24):
                    digest.update(piece)
    print(json.dumps({"wall": wall, "parent": me.ru_utime + me.ru_stime, "workers": kids.ru_utime + kids.ru_stime,
                      "hash": digest.hexdigest()[:16]}))  # fmt: skip


def spread(values: list[float]) -> str:
    return f"{min(values):.2f}/{statistics.median(values):.2f}/{max(values):.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("input")
    parser.add_argument("--before", required=True, help="checkout of the first side (its PYTHONPATH)")
    parser.add_argument("--after", required=True, help="checkout of the second side")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", default="1,2", help="comma-separated; 0 is no executor")
    args = parser.parse_args()
    sides = {"before": str(Path(args.before).resolve()), "after": str(Path(args.after).resolve())}
    counts = [int(w) for w in args.workers.split(",")]
    folder = Path(tempfile.mkdtemp(prefix="tokformats-sides-", dir=os.environ.get("TOKFORMATS_BENCH_DIR")))
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    hashes: set[str] = set()
    try:
        for round_ in range(args.rounds):
            order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
            for workers in counts:
                for side in order:
                    env = {**os.environ, "PYTHONPATH": sides[side]}
                    load = os.getloadavg()[0]
                    command = [sys.executable, __file__, "--child", args.input, str(folder / side), str(workers)]
                    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
                    run = json.loads(done.stdout.strip().splitlines()[-1])
                    run["load"] = load
                    hashes.add(run["hash"])
                    results.setdefault((side, workers), []).append(run)
                    print(f"round {round_} {side:6s} workers={workers} wall={run['wall']:.2f} "
                          f"cpu={run['parent'] + run['workers']:.2f} (parent {run['parent']:.2f}) "
                          f"load={load:.2f}", flush=True)  # fmt: skip
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"\noutputs byte-identical across every run: {len(hashes) == 1}")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    print(f"| side, workers | wall s | CPU s (all) | parent CPU s | cores busy | of the {cores}-core bound | load at "
          "start |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for (side, workers), runs in results.items():
        cpu = [r["parent"] + r["workers"] for r in runs]
        busy = [c / r["wall"] for c, r in zip(cpu, runs)]
        print(f"| {side}, {workers or 'no executor'} | {spread([r['wall'] for r in runs])} | {spread(cpu)} | "
              f"{spread([r['parent'] for r in runs])} | {spread(busy)} | {spread([b / cores for b in busy])} | "
              f"{spread([r['load'] for r in runs])} |")  # fmt: skip
    for side in sides:
        if (side, 1) in results and (side, 2) in results:
            one = statistics.median(r["wall"] for r in results[(side, 1)])
            two = statistics.median(r["wall"] for r in results[(side, 2)])
            print(f"{side}: 2 workers over 1 (medians) {one / two:.2f}x")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        main()
