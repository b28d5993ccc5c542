"""Megatron indexed datasets: tokformats against megatron-core 0.16.1 (CPU), same data, same run.

Run: ``python benchmarks/bench_megatron.py [--documents 1000000]``. Each measurement runs in a fresh
process so that peak RSS (``ru_maxrss``) belongs to that operation alone. Ratios are megatron-core's
time over tokformats' time: > 1 means tokformats is faster.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, peak_rss_mb, scratch, table

HERE = Path(__file__).resolve()


def load_corpus(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    return np.load(folder / "flat.npy", mmap_mode="r"), np.load(folder / "lengths.npy")


def task(name: str, folder: Path) -> dict[str, Any]:
    warnings.filterwarnings("ignore")
    import tokformats

    if name.startswith("megatron"):
        import torch
        from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder
    started = time.perf_counter()
    result: dict[str, Any] = {}
    if name == "ours-write":
        flat, lengths = load_corpus(folder)
        started = time.perf_counter()
        with tokformats.create(folder / "ours", "megatron", vocab_size=50257, overwrite=True) as writer:
            step = 100_000
            offsets = np.concatenate([[0], np.cumsum(lengths)])
            for a in range(0, len(lengths), step):
                b = min(a + step, len(lengths))
                writer.write_batch(flat[offsets[a] : offsets[b]], lengths[a:b])
    elif name == "megatron-write":
        flat, lengths = load_corpus(folder)
        started = time.perf_counter()
        builder = IndexedDatasetBuilder(str(folder / "theirs.bin"), dtype=np.uint16)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        for k in range(len(lengths)):
            document = torch.from_numpy(np.asarray(flat[offsets[k] : offsets[k + 1]], dtype=np.int64))
            builder.add_document(document, [int(lengths[k])])
        builder.finalize(str(folder / "theirs.idx"))
    elif name in ("ours-open", "megatron-open"):
        # Both sides' modules are imported before the clock starts (megatron-core's at the top of this task;
        # tokformats loads a format's module on first use).
        import tokformats.formats.megatron

        started = time.perf_counter()
        if name == "ours-open":
            reader: Any = tokformats.open(folder / "ours", format="megatron")
            first = reader[0]
        else:
            reader = IndexedDataset(str(folder / "ours"))
            first = reader[0]
        result["first"] = int(first[0])
    elif name in ("ours-read", "megatron-read"):
        indices = np.random.default_rng(0).integers(0, int(np.load(folder / "lengths.npy").size), size=100_000)
        if name == "ours-read":
            reader = tokformats.open(folder / "ours", format="megatron")
        else:
            reader = IndexedDataset(str(folder / "ours"))
        reader[0]
        started = time.perf_counter()
        total = 0
        for i in indices.tolist():
            total += len(reader[i])
        result["tokens"] = total
    elif name == "ours-merge":
        started = time.perf_counter()
        tokformats.megatron.merge([folder / "half0", folder / "half1"], folder / "merged-ours", overwrite=True)
    elif name == "megatron-merge":
        started = time.perf_counter()
        builder = IndexedDatasetBuilder(str(folder / "merged-theirs.bin"), dtype=np.uint16)
        for half in ("half0", "half1"):
            builder.add_index(str(folder / half))
        builder.finalize(str(folder / "merged-theirs.idx"))
    result["seconds"] = time.perf_counter() - started
    result["peak_rss_mb"] = peak_rss_mb()
    return result


def duration(seconds: float) -> str:
    """Seconds, or milliseconds below a tenth of a second (an open takes well under one)."""
    return f"{seconds:.3f} s" if seconds >= 0.1 else f"{seconds * 1e3:.3f} ms"


def run(name: str, folder: Path) -> dict[str, Any]:
    output = subprocess.run(
        [sys.executable, str(HERE), "--task", name, "--folder", str(folder)], check=True, capture_output=True, text=True
    ).stdout
    return dict(json.loads(output.strip().splitlines()[-1]))


def prepare(folder: Path, documents: int) -> None:
    import tokformats

    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 600, size=documents).astype(np.int64)  # mean ~300
    flat = rng.integers(0, 50257, size=int(lengths.sum()), dtype=np.uint16)
    np.save(folder / "flat.npy", flat)
    np.save(folder / "lengths.npy", lengths)
    half = documents // 2
    cut = int(lengths[:half].sum())
    for name, (a, b, lo, hi) in {"half0": (0, half, 0, cut), "half1": (half, documents, cut, len(flat))}.items():
        with tokformats.create(folder / name, "megatron", vocab_size=50257, overwrite=True) as writer:
            writer.write_batch(flat[lo:hi], lengths[a:b])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--documents", type=int, default=1_000_000)
    parser.add_argument("--task")
    parser.add_argument("--folder")
    args = parser.parse_args()
    if args.task:
        print(json.dumps(task(args.task, Path(args.folder))))
        return
    folder = scratch("megatron")
    prepare(folder, args.documents)
    rows = []
    for operation, goal in (("write", ">= 5x"), ("open", ">= 1x"), ("read", ">= 1x"), ("merge", ">= 1x")):
        theirs = run(f"megatron-{operation}", folder)
        ours = run(f"ours-{operation}", folder)
        rows.append(
            {
                "operation": {
                    "write": f"write {args.documents:,} documents",
                    "open": "open + first document",
                    "read": "100,000 random document reads",
                    "merge": "merge two halves",
                }[operation],
                "tokformats": f"{duration(ours['seconds'])}, {ours['peak_rss_mb']:.0f} MB peak RSS",
                "megatron-core": f"{duration(theirs['seconds'])}, {theirs['peak_rss_mb']:.0f} MB peak RSS",
                "ratio": f"{theirs['seconds'] / ours['seconds']:.2f}x",
                "goal": goal,
            }
        )
        if operation == "write":
            for suffix in (".bin", ".idx"):
                same = (folder / f"ours{suffix}").read_bytes() == (folder / f"theirs{suffix}").read_bytes()
                assert same, f"{suffix} differs from megatron-core's"
        if operation == "merge":
            assert (folder / "merged-ours.idx").read_bytes() == (folder / "merged-theirs.idx").read_bytes()
    print(f"machine: {machine()}; corpus: {args.documents:,} documents, ~300 uint16 tokens each\n")
    print(table(rows))
    for leftover in folder.iterdir():
        leftover.unlink()


if __name__ == "__main__":
    main()
