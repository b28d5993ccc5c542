"""Exact blend without megatron-core: ``blending_indices`` in a process where megatron-core cannot be imported
(the NumPy lanes of ``tokformats/training/greedy.py``) vs megatron-core 0.16.1's compiled
``helpers_cpp.build_blending_indices`` on the same normalised weights.

Run: ``python benchmarks/bench_blend.py [--datasets 10] [--size 10000000] [--repeat 3] [--weights uniform]
[--baseline /path/to/another/checkout]``.

Every timed call runs in a fresh process; the sides alternate (C++, ours, C++, ours, ...), and each round's
ratio is ours / C++ (< 1: ours faster), in wall-clock and in CPU seconds of the process (less sensitive to a
loaded machine's scheduling). Both sides allocate their two arrays inside the timing, as
``BlendedDataset`` and ``blending_indices`` do. The digests of the arrays must agree (bit-for-bit equality).
The load average is printed before and after: the machine is shared, so quote the ratios. ``--baseline`` adds a
third side to every round: "ours" again with another checkout's ``tokformats`` (say ``main``), so that a change to
the greedy is measured against the code before it in the same alternation (C++, ours, baseline, ...).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, table

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent


def make_weights(kind: str, datasets: int) -> list[float]:
    """The weights as ``BlendedDataset`` hands them to the C++ (megatron's ``normalize``)."""
    rng = np.random.default_rng(3 if kind == "uniform" else 2)
    raw = rng.uniform(0.5, 2.0, size=datasets) if kind == "uniform" else rng.lognormal(0.0, 3.0, size=datasets)
    w = np.array(raw, dtype=np.float64)
    normalized: list[float] = (w / np.sum(w)).tolist()
    return normalized


def digest(*arrays: np.ndarray) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(a.dtype.str.encode())
        h.update(np.ascontiguousarray(a).data)
    return h.hexdigest()[:16]


def child(side: str, kind: str, datasets: int, size: int) -> dict[str, Any]:
    """One timed blend in this fresh process."""
    weights = make_weights(kind, datasets)
    if side == "cpp":
        from megatron.core.datasets import helpers_cpp

        started, cpu = time.perf_counter(), time.process_time()
        index = np.zeros(size, dtype=np.int16)
        sample = np.zeros(size, dtype=np.int64)
        helpers_cpp.build_blending_indices(index, sample, weights, len(weights), size, False)
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
        return {"seconds": seconds, "cpu": cpu, "digest": digest(index, sample)}
    sys.modules["megatron"] = None  # type: ignore[assignment]  # as if megatron-core were not installed
    from tokformats.training import greedy, indices

    if indices._megatron_helpers() is not None:
        raise SystemExit("megatron-core is still importable in the 'ours' process")
    started, cpu = time.perf_counter(), time.process_time()
    index, sample = indices.blending_indices(weights, size)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    # The same run again, untimed, for its statistics (how many lanes failed their check, scalar steps).
    stats = greedy.lockstep_greedy(np.array(weights), size, np.zeros(size, np.int16), np.zeros(size, np.int64))
    return {"seconds": seconds, "cpu": cpu, "digest": digest(index, sample), "stats": stats.__dict__}


def run_child(side: str, args: argparse.Namespace) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(args.baseline if side == "baseline" else ROOT)}
    kind = "ours" if side == "baseline" else side
    command = [sys.executable, str(HERE), "--child", kind, args.weights, str(args.datasets), str(args.size)]
    out = subprocess.run(command, check=True, capture_output=True, text=True, env=env).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def spread(values: list[float], fmt: str = "{:.3f}") -> str:
    return "/".join(fmt.format(v) for v in (min(values), statistics.median(values), max(values)))


def row(args: argparse.Namespace, side: str, times: dict[str, list[float]], stats: Any) -> dict[str, str]:
    """One side's line of the table: its times, its ratio to the C++ per round, its lanes' statistics."""
    ratios = [o / c for o, c in zip(times[side], times["cpp"])]
    cpu_ratios = [o / c for o, c in zip(times[f"{side} cpu"], times["cpp cpu"])]
    where = "" if side == "ours" else f" ({args.baseline})"
    return {
        "measure": f"exact blend, {args.datasets} sources x {args.size:,} samples, {args.weights} weights (s){where}",
        "megatron-core C++": spread(times["cpp"]),
        "tokformats without megatron-core": spread(times[side]),
        "ours / C++ per round": spread(ratios, "{:.2f}"),
        "CPU s, C++; ours; ratio": (
            f"{spread(times['cpp cpu'])}; {spread(times[f'{side} cpu'])}; {spread(cpu_ratios, '{:.2f}')}"
        ),
        "lanes failing their check: repaired + shifted / all": (
            f"{stats['repaired']} + {stats['shifted']} / {stats['lanes']}"
        ),
        "lanes run again": f"{stats.get('rerun', 0):,}",
        "scalar steps": f"{stats['scalar_steps']:,} ({stats['scalar_steps'] / max(args.size, 1):.4%})",
    }


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(child(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", type=int, default=10)
    parser.add_argument("--size", type=int, default=10_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--weights", choices=["uniform", "lognormal"], default="uniform")
    parser.add_argument("--baseline", type=Path, help="another checkout whose tokformats runs as a third side")
    args = parser.parse_args()
    load_before = os.getloadavg()
    sides = ("cpp", "ours", "baseline") if args.baseline else ("cpp", "ours")
    times: dict[str, list[float]] = {key: [] for side in sides for key in (side, f"{side} cpu")}
    digests, stats, baseline_stats = set(), None, None
    for _ in range(args.repeat):
        for side in sides:
            result = run_child(side, args)
            times[side].append(result["seconds"])
            times[f"{side} cpu"].append(result["cpu"])
            digests.add(result["digest"])
            if side == "ours":
                stats = result["stats"]
            elif side == "baseline":
                baseline_stats = result["stats"]
    load_after = os.getloadavg()
    if len(digests) != 1:
        raise SystemExit(f"the two sides disagree: digests {sorted(digests)}")
    rows = [row(args, "ours", times, stats)]
    if baseline_stats is not None:
        rows.append(row(args, "baseline", times, baseline_stats))
    print(f"machine: {machine()}; load average before {load_before[0]:.2f}, after {load_after[0]:.2f}")
    print(f"arrays equal on both sides (digest {digests.pop()}); {args.repeat} alternated rounds, fresh processes")
    print(table(rows))


if __name__ == "__main__":
    main()
