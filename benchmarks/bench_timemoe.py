"""Time-MoE windows: tokformats against a faithful re-implementation of Time-MoE's per-window loop.

Run: ``python benchmarks/bench_timemoe.py [--gigabytes 1]``. A Time-300B-like folder (float32, sequences of
1k-100k points, 2**28-element shards) is written once; both sides then produce every window of one epoch
(context 4096, stride 4096, ``zero`` normalisation) in the same shuffled order, in the same process, and the
outputs are compared. Time-MoE's loop, as its ``BinaryDataset`` + ``TimeMoEWindowDataset`` do it: for each window,
open the shard file(s), read the whole sequence with ``readinto``, de-normalise, normalise all of it, slice W + 1
values, pad. A second part opens a folder with 1,000,000 scales in a fresh process (time and peak RSS).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, scratch, table

import tokformats
from tokformats.formats import timemoe


class TimeMoELoop:
    """What Time-MoE does per window (re-implemented from the spec: read whole sequence, normalise, slice)."""

    def __init__(self, folder: Path, context: int, stride: int) -> None:
        meta = json.loads((folder / "meta.json").read_text())
        self.dtype = np.dtype(meta["dtype"])
        self.scales = meta["scales"]
        self.files = []
        start = 0
        for name, count in sorted(meta["files"].items(), key=lambda item: int(item[0].split("-")[1])):
            self.files.append((folder / name, start, count))
            start += count
        self.window = context
        self.stride = stride
        self.index = []
        for i, scale in enumerate(self.scales):
            length = scale["length"]
            if length < 2:
                continue
            for k in range(1 + max(0, (length - self.window - 1) // self.stride)):
                self.index.append((i, k * self.stride))

    def sequence(self, i: int) -> np.ndarray:
        scale = self.scales[i]
        offset, length = scale["offset"], scale["length"]
        out = []
        end = offset + length
        for path, start, count in self.files:
            if start <= offset < start + count:
                take = min(end, start + count) - offset
                piece = np.empty(take, dtype=self.dtype)
                with open(path, "rb", buffering=0) as handle:
                    handle.seek((offset - start) * self.dtype.itemsize)
                    handle.readinto(piece)
                out.append(piece)
                offset += take
                if offset == end:
                    break
        values = out[0] if len(out) == 1 else np.concatenate(out)
        if "mean" in scale and "std" in scale:
            values = values * scale["std"] + scale["mean"]
        return values

    def __getitem__(self, k: int) -> dict[str, np.ndarray]:
        i, start = self.index[k]
        values = np.asarray(self.sequence(i), dtype=np.float32)
        mean, std = values.mean(), values.std()
        values = (values - mean) / std if std != 0 else values - mean
        window = values[start : start + self.window + 1]
        mask = np.ones(self.window, dtype=np.int32)
        pad = self.window + 1 - len(window)
        if pad > 0:
            mask[len(window) - 1 :] = 0
            window = np.pad(window, (0, pad))
        return {"input_ids": window[:-1], "labels": window[1:], "loss_masks": mask}


def build(folder: Path, gigabytes: float) -> None:
    rng = np.random.default_rng(0)
    budget = int(gigabytes * 1e9) // 4
    with tokformats.create(folder, "timemoe", max_shard_elements=1 << 28, overwrite=True) as writer:
        written = 0
        while written < budget:
            length = int(rng.integers(1_000, 100_000))
            series = np.cumsum(rng.normal(size=length)).astype(np.float32)
            if rng.random() < 0.25:
                writer.write(series, mean=float(series.mean()), std=float(series.std()) or 1.0)
            else:
                writer.write(series)
            written += length


OPEN_CHILD = r"""
import sys, time
import tokformats
started = time.perf_counter()
reader = tokformats.open(sys.argv[1])
n = len(reader)
opened = time.perf_counter() - started
with open("/proc/self/status") as status:
    rss = next(int(l.split()[1]) / 1024 for l in status if l.startswith("VmHWM:"))
print(n, opened, rss)
"""


def open_million(folder: Path) -> tuple[float, float]:
    count = 1_000_000
    lengths = np.full(count, 8)
    with tokformats.create(folder, "timemoe", overwrite=True) as writer:
        writer.write_batch(np.zeros(count * 8, dtype=np.float32), lengths)
    out = subprocess.run([sys.executable, "-c", OPEN_CHILD, str(folder)], check=True, capture_output=True, text=True)
    n, seconds, rss = out.stdout.split()
    assert int(n) == count
    return float(seconds), float(rss)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gigabytes", type=float, default=1.0)
    args = parser.parse_args()
    folder = scratch("timemoe") / "ds"
    build(folder, args.gigabytes)
    context = stride = 4096
    ours = timemoe.windows(tokformats.open(folder), context_length=context, stride=stride, normalization="zero")
    theirs = TimeMoELoop(folder, context, stride)
    assert len(ours) == len(theirs.index)
    order = np.random.default_rng(1).permutation(len(ours)).tolist()
    started = time.perf_counter()
    for k in order:
        ours[k]
    t_ours = time.perf_counter() - started
    started = time.perf_counter()
    for k in order:
        theirs[k]
    t_theirs = time.perf_counter() - started
    for k in order[:200]:  # the same windows, bit for bit
        a, b = ours[k], theirs[k]
        assert all(np.array_equal(a[key], b[key]) for key in a)
    seconds, rss = open_million(scratch("timemoe") / "million")
    reader = tokformats.open(folder)
    rows = [
        {
            "measure": f"one epoch, {len(ours):,} windows, shuffled, context 4096, zero norm "
            f"({reader.num_tokens * 4 / 1e9:.1f} GB, {len(reader):,} sequences)",
            "tokformats": f"{len(ours) / t_ours:,.0f} windows/s ({t_ours:.2f} s)",
            "Time-MoE loop": f"{len(ours) / t_theirs:,.0f} windows/s ({t_theirs:.2f} s)",
            "ratio": f"{t_theirs / t_ours:.1f}x",
            "goal": ">= 10x",
        },
        {
            "measure": "open a folder with 1,000,000 scales (fresh process)",
            "tokformats": f"{seconds:.2f} s, {rss:.0f} MB peak RSS",
            "Time-MoE loop": "",
            "ratio": "",
            "goal": "time and RSS",
        },
    ]
    print(f"machine: {machine()}\n")
    print(table(rows))
    import shutil

    shutil.rmtree(scratch("timemoe"))


if __name__ == "__main__":
    main()
