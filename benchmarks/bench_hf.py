"""HF ``save_to_disk`` folders: opening one (and reading its first document) in tokformats against
``datasets.load_from_disk``, same folder.

Run: ``python benchmarks/bench_hf.py [--documents 1000000] [--repeat 5] [--before DIR]``. The folder is written by
tokformats' ``hf`` writer (``input_ids`` lists of uint16 ids, ~300 per row). Each run is a fresh process (imports
before the clock), sides alternate; the open and the first row's ids are timed apart (and together), and the CPU
time of open + first row (``time.process_time``, which a loaded machine disturbs less than the wall clock). Times
are min/median/max; the ratio is ``load_from_disk``'s median over tokformats'. ``--before DIR`` adds a third side:
tokformats imported from the checkout ``DIR`` (an earlier commit), alternated with the others.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import installed_env, machine, scratch, table

HERE = Path(__file__).resolve()
SIDES = ("tokformats", "datasets")
BEFORE = "before"


def child(side: str, folder: Path) -> None:
    warnings.filterwarnings("ignore")
    if side == "datasets":
        import datasets
    else:
        import importlib

        import tokformats

        importlib.import_module("tokformats.formats.hf")
        importlib.import_module("pyarrow")
    started, cpu = time.perf_counter(), time.process_time()
    if side == "datasets":
        dataset = datasets.load_from_disk(str(folder))
        opened = time.perf_counter()
        first = list(dataset[0]["input_ids"][:4])
    else:
        reader = tokformats.open(folder, format="hf")
        opened = time.perf_counter()
        first = reader[0][:4].tolist()
    done, cpu = time.perf_counter(), time.process_time() - cpu
    print(json.dumps({"open": opened - started, "first": done - opened, "cpu": cpu, "first_ids": first}))


def run(side: str, folder: Path, before: Path | None = None) -> dict[str, object]:
    env = installed_env(before if side == BEFORE else None)
    if side == BEFORE and before is not None:  # the earlier checkout's tokformats, same child code
        side = "tokformats"
    command = [sys.executable, str(HERE), "--child", side, "--folder", str(folder)]
    out = subprocess.run(command, check=True, capture_output=True, text=True, env=env).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--before", type=Path, help="a checkout of an earlier tokformats, run as a third side")
    parser.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.folder)
        return
    import tokformats

    folder = scratch("hf") / f"rows{args.documents}"
    if not folder.exists():
        rng = np.random.default_rng(0)
        lengths = rng.integers(1, 600, size=args.documents)
        with tokformats.create(folder, "hf", vocab_size=50257) as writer:
            writer.write_batch(rng.integers(0, 50257, size=int(lengths.sum())).astype(np.uint16), lengths)
    sides = SIDES + ((BEFORE,) if args.before else ())
    for side in sides:
        run(side, folder, args.before)  # bytecode and page cache
    times: dict[str, dict[str, list[float]]] = {
        side: {"open": [], "first": [], "both": [], "cpu": []} for side in sides
    }
    firsts = set()
    for k in range(args.repeat):
        for side in sides if k % 2 == 0 else sides[::-1]:
            result = run(side, folder, args.before)
            steps = {key: float(result[key]) for key in ("open", "first", "cpu")}  # type: ignore[arg-type]
            steps["both"] = steps["open"] + steps["first"]
            for step, seconds in steps.items():
                times[side][step].append(seconds)
            firsts.add(json.dumps(result["first_ids"]))
    if len(firsts) != 1:
        raise SystemExit(f"the sides read different first rows: {firsts}")
    rows = []
    labels = (("open", "open"), ("first", "first row"), ("both", "open + first row"), ("cpu", "CPU, open + first row"))
    for step, label in labels:
        row = {"measure": f"{label}, {args.documents:,} rows (ms)"}
        for side in sides:
            spent = times[side][step]
            row[side] = "/".join(f"{v * 1e3:.1f}" for v in (min(spent), statistics.median(spent), max(spent)))
        ratio = statistics.median(times["datasets"][step]) / statistics.median(times["tokformats"][step])
        row["ratio"] = f"{ratio:.2f}"
        if args.before:
            earlier = statistics.median(times["datasets"][step]) / statistics.median(times[BEFORE][step])
            row["ratio before"] = f"{earlier:.2f}"
        rows.append(row)
    print(f"{machine()}; load: {os.getloadavg()[0]:.2f}; {args.repeat} alternated runs; min/median/max")
    print(table(rows))


if __name__ == "__main__":
    main()
