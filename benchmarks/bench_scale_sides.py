"""1 vs 2 workers, two checkouts side by side: each run a fresh process (pool start, the workers' imports and the
tokenizer build included), wall and CPU seconds of the whole process tree (``getrusage`` of the process and of its
waited-for children, the pool's workers), the sides alternated and their order flipped every round. The clock
starts after the run's process has imported ``tokformats``, and that CPU (the interpreter's start and the import)
is left out of its CPU seconds too, so that both cover the same interval (before the ``pin`` branch the CPU seconds
included it).

Run: ``python benchmarks/bench_scale_sides.py INPUT.jsonl --before /work/main [--after .] [--rounds 3]
[--workers 0,1,2] [--cpus-per-worker 0,1]`` (cl100k_base -> megatron; ``0`` workers: no executor; without
``--after``, one checkout alone). Every output is checked byte-identical to the first run's. Prints one line per
run, then min/median/max per side, worker count and CPU placement, and the 2-over-1 ratios. "Of the bound": the
run's CPU seconds over N x its wall seconds (N: the CPUs the run may use), i.e. how close the run comes to keeping
every CPU it was given busy; on a shared machine other processes' CPU lowers it too (the load average is printed
beside it).

``--cpus-per-worker C`` (comma-separated; ``0``, the default, is no confinement): each run's whole process tree
(the ``tokenize`` process, its pool's workers and every thread of them) is confined to the first ``max(1, W) x C``
of the CPUs this benchmark may run on (``os.sched_setaffinity`` in the child before it imports anything; spawned
workers and threads inherit it), so that a pool of 1 gets one CPU and a pool of 2 two, as each worker of a
multi-node run gets its machine. The benchmark stops if the machine has too few CPUs. Each run prints the CPU set
it was given and the CPU affinities found in every thread of the tokenize process and of each pool worker (read
from ``/proc`` before the pool shuts down, outside the clock), with each worker's CPU seconds.
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
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import compile_checkout, installed_env  # the standard library only: nothing before the confinement

#: One run's figures, as its child printed them (with the load, the CPUs it was given and its fraction of them).
Run = dict[str, Any]


def child(source: str, output: str, workers: int, cpus: str) -> None:
    """One run in this fresh process, confined to ``cpus`` ("0,1"; empty: not confined) before anything is imported;
    prints a JSON line: wall, parent and workers' CPU, the outputs' hash, the affinities seen in the process tree."""
    if cpus:
        os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
    import tokformats

    before = time.process_time()  # the interpreter's start and imports: before the clock, so out of the CPU too
    machine_before = machine_cpu()
    started = time.perf_counter()
    if workers:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            summary = tokformats.tokenize(source, "cl100k_base", output, "megatron", progress=False, overwrite=True,
                                          executor=pool)  # fmt: skip
            tree, aside_wall, aside_cpu = looked_at(list(pool._processes))  # its live workers: no public accessor
    else:
        summary = tokformats.tokenize(source, "cl100k_base", output, "megatron", progress=False, overwrite=True)
        tree, aside_wall, aside_cpu = looked_at([])
    wall = time.perf_counter() - started - aside_wall
    machine_after = machine_cpu()
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    parent = me.ru_utime + me.ru_stime - before - aside_cpu
    busy, steal = (after - first for after, first in zip(machine_after, machine_before))
    others = busy - aside_cpu - parent - (kids.ru_utime + kids.ru_stime)
    digest = hashlib.sha256()
    for result in summary["outputs"].values():
        for name in result["files"]:
            with open(name, "rb") as handle:
                while piece := handle.read(1 << 24):
                    digest.update(piece)
    print(json.dumps({"wall": wall, "parent": parent, "workers": kids.ru_utime + kids.ru_stime,
                      "hash": digest.hexdigest()[:16], "others": others, "steal": steal, **tree}))  # fmt: skip


def machine_cpu() -> tuple[float, float]:
    """CPU seconds every process on the machine has used since boot (``/proc/stat``: user, nice, system, irq and
    softirq of all CPUs), and the seconds the hypervisor has taken from this machine's CPUs (steal). Over a run,
    the first less the run's own CPU is what other processes took: the measure of a shared machine's noise that
    the load average, which counts the run's own threads too, is not."""
    with open("/proc/stat") as stat:
        fields = [int(f) for f in stat.readline().split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    return (fields[0] + fields[1] + fields[2] + fields[5] + fields[6]) / tick, fields[7] / tick


def looked_at(workers: list[int]) -> tuple[dict[str, Any], float, float]:
    """:func:`tree_affinity` of this process and ``workers``, with the wall and CPU seconds the look took (taken
    out of the run's figures)."""
    wall, cpu = time.perf_counter(), time.process_time()
    tree = tree_affinity(workers)
    return tree, time.perf_counter() - wall, time.process_time() - cpu


def tree_affinity(workers: list[int]) -> dict[str, Any]:
    """The CPU affinities of every thread of this process and of each worker process (``Cpus_allowed_list`` in
    ``/proc/PID/task/TID/status``; a thread that ended before the look is not seen), and each worker's CPU seconds
    so far (``/proc/PID/stat``)."""
    tick = os.sysconf("SC_CLK_TCK")
    affinities, seconds = [], []
    for pid in workers:
        affinities.append(sorted(_thread_cpus(pid)))
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        seconds.append((int(fields[11]) + int(fields[12])) / tick)  # utime and stime, in clock ticks
    return {"parent_cpus": sorted(_thread_cpus(os.getpid())), "worker_cpus": affinities, "worker_cpu_s": seconds}


def _thread_cpus(pid: int) -> set[str]:
    allowed: set[str] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            lines = (task / "status").read_text().splitlines()
        except OSError:  # the thread ended meanwhile
            continue
        allowed.update(line.split(":", 1)[1].strip() for line in lines if line.startswith("Cpus_allowed_list:"))
    return allowed


def spread(values: list[float]) -> str:
    return f"{min(values):.2f}/{statistics.median(values):.2f}/{max(values):.2f}"


def cpu_sets(counts: list[int], per_worker: list[int]) -> dict[tuple[int, int], list[int]]:
    """The CPUs each (workers, CPUs per worker) run is confined to: the first ``max(1, workers) x per`` of those
    this process may run on, all of them when ``per`` is 0. Stops the benchmark if there are too few."""
    mine = sorted(os.sched_getaffinity(0))
    sets = {}
    for workers in counts:
        for per in per_worker:
            wanted = max(1, workers) * per
            if wanted > len(mine):
                raise SystemExit(f"--cpus-per-worker {per} with {workers} workers needs {wanted} CPUs; this process "
                                 f"may run on {len(mine)} ({','.join(map(str, mine))})")  # fmt: skip
            sets[(workers, per)] = mine[:wanted] if per else mine
    return sets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("input")
    parser.add_argument("--before", required=True, help="checkout of the first side (its PYTHONPATH)")
    parser.add_argument("--after", help="checkout of the second side (none: the first side alone)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", default="1,2", help="comma-separated; 0 is no executor")
    parser.add_argument("--cpus-per-worker", default="0",
                        help="comma-separated; each run confined to max(1, workers) x this many CPUs; 0: not "
                             "confined (every CPU this process may use)")  # fmt: skip
    args = parser.parse_args()
    sides = {"before": str(Path(args.before).resolve())}
    if args.after:
        sides["after"] = str(Path(args.after).resolve())
    counts = [int(w) for w in args.workers.split(",")]
    for checkout in sides.values():
        compile_checkout(Path(checkout))
    per_worker = [int(c) for c in args.cpus_per_worker.split(",")]
    placements = cpu_sets(counts, per_worker)
    folder = Path(tempfile.mkdtemp(prefix="tokformats-sides-", dir=os.environ.get("TOKFORMATS_BENCH_DIR")))
    results: dict[tuple[str, int, int], list[Run]] = {}
    hashes: set[str] = set()
    try:
        for round_ in range(args.rounds):
            flip = round_ % 2 == 1
            for workers in counts:
                for per in list(reversed(per_worker)) if flip else per_worker:
                    for side in list(reversed(sides)) if flip else list(sides):
                        run = one_run(args.input, sides[side], folder / side, workers, per, placements)
                        hashes.add(run["hash"])
                        results.setdefault((side, workers, per), []).append(run)
                        print(f"round {round_} {side:6s} workers={workers} {placement(per)} "
                              f"cpus={','.join(map(str, run['cpus']))} wall={run['wall']:.2f} "
                              f"cpu={run['parent'] + run['workers']:.2f} (parent {run['parent']:.2f}; workers "
                              f"{', '.join(f'{c:.2f}' for c in run['worker_cpu_s'])}) "
                              f"of-bound={run['bound']:.2f} load={run['load']:.2f} others={run['others']:.2f} "
                              f"steal={run['steal']:.2f} "
                              f"affinity parent {run['parent_cpus']} workers {run['worker_cpus']}",
                              flush=True)  # fmt: skip
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"\noutputs byte-identical across every run: {len(hashes) == 1}")
    report(results, sides, per_worker)


def placement(per: int) -> str:
    return f"{per} CPU per worker" if per else "not confined"


def one_run(source: str, checkout: str, output: Path, workers: int, per: int,
            placements: dict[tuple[int, int], list[int]]) -> Run:  # fmt: skip
    """One fresh child on ``checkout``, confined when ``per``; its result with the load at its start, the CPUs it
    was given and its fraction of their bound. Stops the benchmark if a thread ran outside its CPUs."""
    cpus = placements[(workers, per)]
    load = os.getloadavg()[0]
    command = [sys.executable, __file__, "--child", source, str(output), str(workers),
               ",".join(map(str, cpus)) if per else ""]  # fmt: skip
    done = subprocess.run(command, env=installed_env(Path(checkout)), capture_output=True, text=True,
                          check=False)  # fmt: skip
    if done.returncode:
        raise SystemExit(done.stderr)
    run: Run = json.loads(done.stdout.strip().splitlines()[-1])
    expected = _cpu_list(cpus)
    seen = {*run["parent_cpus"], *(c for w in run["worker_cpus"] for c in w)}
    if seen != {expected}:
        raise SystemExit(f"a run given CPUs {expected} had threads allowed on {sorted(seen)}")
    run.update(load=load, cpus=cpus, bound=(run["parent"] + run["workers"]) / (len(cpus) * run["wall"]))
    return run


def _cpu_list(cpus: list[int]) -> str:
    """``cpus`` as the kernel writes ``Cpus_allowed_list``: ranges of consecutive CPUs joined by commas."""
    ranges, start = [], None
    for k, cpu in enumerate(cpus):
        start = cpu if start is None else start
        if k + 1 == len(cpus) or cpus[k + 1] != cpu + 1:
            ranges.append(f"{start}" if start == cpu else f"{start}-{cpu}")
            start = None
    return ",".join(ranges)


def report(results: dict[tuple[str, int, int], list[Run]], sides: dict[str, str], per_worker: list[int]) -> None:
    """The table of min/median/max per side, workers and placement, then the 2-over-1 ratios of the medians."""
    print("| side, workers, CPUs | wall s | CPU s (all) | parent CPU s | cores busy | of the CPUs' bound | load at "
          "start | other processes' CPU s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for (side, workers, per), runs in results.items():
        cpu = [r["parent"] + r["workers"] for r in runs]
        busy = [c / r["wall"] for c, r in zip(cpu, runs)]
        walls, parents, bounds, loads, others = ([r[key] for r in runs] for key in ("wall", "parent", "bound", "load",
                                                                                     "others"))  # fmt: skip
        print(f"| {side}, {workers or 'no executor'}, {len(runs[0]['cpus'])} ({placement(per)}) | {spread(walls)} | "
              f"{spread(cpu)} | {spread(parents)} | {spread(busy)} | {spread(bounds)} | {spread(loads)} | "
              f"{spread(others)} |")  # fmt: skip
    for side in sides:
        for per in per_worker:
            if (side, 1, per) in results and (side, 2, per) in results:
                one = statistics.median(r["wall"] for r in results[(side, 1, per)])
                two = statistics.median(r["wall"] for r in results[(side, 2, per)])
                print(f"{side}, {placement(per)}: 2 workers over 1 (medians) {one / two:.2f}x")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
    else:
        main()
