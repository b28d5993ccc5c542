"""100,000 random Megatron document reads: tokformats against megatron-core's ``IndexedDataset``, in one process.

Run: ``python benchmarks/bench_reads.py [--documents 1000000] [--rounds 7]``. One dataset of one-sequence documents
(so that megatron-core's ``[i]``, a sequence, is tokformats' ``[i]``, a document); both readers are opened once and
warmed with the same reads, then the same 100,000 random indices are read by each, alternating which goes first,
``--rounds`` times. tokformats checks every pointer it serves (by block, once, then per read); megatron-core checks
none. Times are min/median/max over the rounds; the ratio is megatron-core's median over tokformats'.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, scratch, table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    import tokformats

    prefix = scratch("reads") / f"corpus{args.documents}"
    if not Path(f"{prefix}.idx").exists():
        rng = np.random.default_rng(0)
        lengths = rng.integers(1, 600, size=args.documents)
        with tokformats.create(prefix, "megatron", vocab_size=50257) as writer:
            writer.write_batch(rng.integers(0, 50257, size=int(lengths.sum())).astype(np.uint16), lengths)
    theirs, ours = IndexedDataset(str(prefix)), tokformats.open(prefix, format="megatron")
    indices = np.random.default_rng(1).integers(0, args.documents, 100_000).tolist()
    for reader in (theirs, ours):
        for i in indices:
            reader[i]
    assert all(np.array_equal(theirs[i], ours[i]) for i in indices[:1000])
    times: dict[str, list[float]] = {"megatron-core": [], "tokformats": []}
    for k in range(args.rounds):
        sides = [("megatron-core", theirs), ("tokformats", ours)]
        for name, reader in sides if k % 2 == 0 else sides[::-1]:
            started = time.perf_counter()
            for i in indices:
                reader[i]
            times[name].append(time.perf_counter() - started)
    ratio = statistics.median(times["megatron-core"]) / statistics.median(times["tokformats"])
    print(f"{machine()}; load: {os.getloadavg()[0]:.2f}; {args.rounds} alternated rounds; min/median/max (ms)")
    row = {"measure": f"100,000 random document reads, {args.documents:,} documents"}
    for name, spent in times.items():
        row[name] = "/".join(f"{v * 1e3:.0f}" for v in (min(spent), statistics.median(spent), max(spent)))
    row["ratio"] = f"{ratio:.2f}"
    print(table([row]))


if __name__ == "__main__":
    main()
