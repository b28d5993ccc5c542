"""The first ``open`` in a fresh process: tokformats (format detected, or named) against megatron-core's
``IndexedDataset``, same Megatron dataset, warm and cold page cache.

Run: ``python benchmarks/bench_open.py [--documents 1000000] [--repeat 7]``. Each run is a fresh process; sides
alternate. The clock starts after the imports (``import tokformats``; megatron-core's ``IndexedDataset``, which
imports torch) and covers the open and the first document (``r[0]`` / ``IndexedDataset(prefix)[0]``). The
"detected" route includes detection (``tokformats.open(prefix)``: the detector table, and importing the one format
module it picks: the "first open after import" row); the others import the Megatron module before the clock, as
megatron-core's is. megatron-core's ``[0]`` is sequence 0 and tokformats' ``[0]`` document 0, which reads one
more page (the document index); the ``sequences[0]`` route reads megatron-core's unit. "Cold" asks the kernel to
drop both files' pages first (``posix_fadvise(DONTNEED)``), so the pages each side touches come from the disk.
Children run with bytecode caching on (a private ``PYTHONPYCACHEPREFIX``), as an installed package would.
Differences are tokformats' time minus megatron-core's. ``--baseline DIR`` adds the detected route run against
another tokformats checkout (``DIR`` on ``PYTHONPATH``) as one more side of the same alternation.
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
from common import drop_from_cache, installed_env, machine, scratch, table

HERE = Path(__file__).resolve()
SIDES = ("tokformats detected", "tokformats format=megatron", "tokformats sequences[0]", "megatron-core")
#: The detected route against another checkout (``--baseline``), timed in the same alternation.
BASELINE = "tokformats detected, baseline"


def child(side: str, prefix: str, cold: bool) -> None:
    """One side in its own process: import, then time the open and the first document."""
    warnings.filterwarnings("ignore")
    if side == "megatron-core":
        from megatron.core.datasets.indexed_dataset import IndexedDataset
    else:
        import tokformats

        if side != "tokformats detected":  # as megatron-core's module is: imported before the clock
            import importlib

            importlib.import_module("tokformats.formats.megatron")
    if cold:
        for suffix in (".bin", ".idx"):
            drop_from_cache(Path(prefix + suffix))
    started = time.perf_counter()
    # the dataset is kept: megatron-core unmaps its files when the object goes, under the array it returned
    if side == "megatron-core":
        dataset = IndexedDataset(prefix)
    elif side == "tokformats detected":
        dataset = tokformats.open(prefix)
    else:
        dataset = tokformats.open(prefix, format="megatron")
    # megatron-core's [0] is sequence 0, tokformats' [0] document 0 (one more page: the document index)
    first = dataset.sequences[0] if side == "tokformats sequences[0]" else dataset[0]
    seconds = time.perf_counter() - started
    print(json.dumps({"seconds": seconds, "first": np.asarray(first).tolist()[:8]}))


def run(side: str, prefix: str, cold: bool, baseline: Path | None = None) -> dict[str, object]:
    """One child; the ``BASELINE`` side is the detected route run against the ``--baseline`` checkout."""
    child_side, source = (SIDES[0], baseline) if side == BASELINE else (side, None)
    command = [sys.executable, str(HERE), "--child", child_side, "--prefix", prefix] + (["--cold"] if cold else [])
    out = subprocess.run(command, check=True, capture_output=True, text=True, env=installed_env(source)).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def prepare(folder: Path, documents: int) -> str:
    import tokformats

    prefix = folder / f"corpus{documents}"
    if not Path(f"{prefix}.idx").exists():
        rng = np.random.default_rng(0)
        lengths = rng.integers(1, 600, size=documents)
        flat = rng.integers(0, 50257, size=int(lengths.sum())).astype(np.uint16)
        with tokformats.create(prefix, "megatron", vocab_size=50257, overwrite=True) as writer:
            writer.write_batch(flat, lengths)
    return str(prefix)


def spread(values: list[float]) -> str:
    return "/".join(f"{v * 1e3:.2f}" for v in (min(values), statistics.median(values), max(values)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument(
        "--baseline",
        type=Path,
        help="another tokformats checkout (`git worktree add /tmp/base main`): its detected route, alternated",
    )
    parser.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--prefix", help=argparse.SUPPRESS)
    parser.add_argument("--cold", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.prefix, args.cold)
        return
    prefix = prepare(scratch("open"), args.documents)
    sides = SIDES + ((BASELINE,) if args.baseline else ())
    for side in sides:  # fills the bytecode cache and the page cache
        run(side, prefix, False, args.baseline)
    rows = []
    for cold in (False, True):
        times: dict[str, list[float]] = {side: [] for side in sides}
        firsts = set()
        for k in range(args.repeat):
            order = sides if k % 2 == 0 else sides[::-1]
            for side in order:
                result = run(side, prefix, cold, args.baseline)
                times[side].append(float(result["seconds"]))  # type: ignore[arg-type]
                firsts.add(json.dumps(result["first"]))
        if len(firsts) != 1:
            raise SystemExit(f"the sides read different first documents: {firsts}")
        theirs = times["megatron-core"]
        for side in [*SIDES[:3], *sides[len(SIDES) :]]:
            ours = times[side]
            rows.append(
                {
                    "cache": "cold" if cold else "warm",
                    "route": side,
                    "open + first document (ms)": spread(ours),
                    "megatron-core (ms)": spread(theirs),
                    "difference, medians (ms)": f"{(statistics.median(ours) - statistics.median(theirs)) * 1e3:+.2f}",
                    "ratio, medians": f"{statistics.median(theirs) / statistics.median(ours):.2f}",
                }
            )
    print(f"{machine()}; load: {os.getloadavg()[0]:.2f}; {args.documents:,} documents; {args.repeat} alternated runs")
    print(table(rows))


if __name__ == "__main__":
    main()
