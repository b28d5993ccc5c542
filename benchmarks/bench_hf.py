"""HF ``save_to_disk`` folders: opening one (and reading its first document) in tokformats against
``datasets.load_from_disk``, same folder.

Run: ``python benchmarks/bench_hf.py [--documents 1000000] [--repeat 5]``. The folder is written by tokformats'
``hf`` writer (``input_ids`` lists of uint16 ids, ~300 per row). Each run is a fresh process (imports before the
clock), sides alternate; the open and the first row's ids are timed apart (and together). Times are
min/median/max; the ratio is ``load_from_disk``'s median over tokformats'.
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
from common import machine, scratch, table

HERE = Path(__file__).resolve()
SIDES = ("tokformats", "datasets")


def child(side: str, folder: Path) -> None:
    warnings.filterwarnings("ignore")
    if side == "datasets":
        import datasets
    else:
        import importlib

        import tokformats

        importlib.import_module("tokformats.formats.hf")
        importlib.import_module("pyarrow")
    started = time.perf_counter()
    if side == "datasets":
        dataset = datasets.load_from_disk(str(folder))
        opened = time.perf_counter()
        first = list(dataset[0]["input_ids"][:4])
    else:
        reader = tokformats.open(folder, format="hf")
        opened = time.perf_counter()
        first = reader[0][:4].tolist()
    done = time.perf_counter()
    print(json.dumps({"open": opened - started, "first": done - opened, "first_ids": first}))


def run(side: str, folder: Path) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(scratch("hf") / "pycache")
    command = [sys.executable, str(HERE), "--child", side, "--folder", str(folder)]
    out = subprocess.run(command, check=True, capture_output=True, text=True, env=env).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
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
    for side in SIDES:
        run(side, folder)  # bytecode and page cache
    times: dict[str, dict[str, list[float]]] = {side: {"open": [], "first": [], "both": []} for side in SIDES}
    firsts = set()
    for k in range(args.repeat):
        for side in SIDES if k % 2 == 0 else SIDES[::-1]:
            result = run(side, folder)
            steps = {"open": float(result["open"]), "first": float(result["first"])}  # type: ignore[arg-type]
            steps["both"] = steps["open"] + steps["first"]
            for step, seconds in steps.items():
                times[side][step].append(seconds)
            firsts.add(json.dumps(result["first_ids"]))
    if len(firsts) != 1:
        raise SystemExit(f"the sides read different first rows: {firsts}")
    rows = []
    for step, label in (("open", "open"), ("first", "first row"), ("both", "open + first row")):
        row = {"measure": f"{label}, {args.documents:,} rows (ms)"}
        for side in SIDES:
            spent = times[side][step]
            row[side] = "/".join(f"{v * 1e3:.1f}" for v in (min(spent), statistics.median(spent), max(spent)))
        ratio = statistics.median(times["datasets"][step]) / statistics.median(times["tokformats"][step])
        row["ratio"] = f"{ratio:.2f}"
        rows.append(row)
    print(f"{machine()}; load: {os.getloadavg()[0]:.2f}; {args.repeat} alternated runs; min/median/max")
    print(table(rows))


if __name__ == "__main__":
    main()
