"""Foundation figures: reading a raw stream, splitting at EOS, writing in batches.

Run: ``python benchmarks/bench_foundation.py [--gigabytes 1] [--only write] [--repeat 5]``. Each row is measured in
the same run as its peer (plain NumPy), warm page cache for both, best of three; ratios > 1 mean tokformats is
faster. The write row alternates the sides ``--repeat`` times and gives min/median/max of both and of the ratio of
each pair (load on a shared machine hits a pair alike).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import os

from common import alternated, best_of, machine, scratch, spread, table

import tokformats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gigabytes", type=float, default=1.0)
    parser.add_argument("--only", choices=["write"], help="only the write_batch row")
    parser.add_argument("--repeat", type=int, default=5, help="alternated pairs of the write row")
    args = parser.parse_args()
    folder = scratch("foundation")
    tokens = int(args.gigabytes * 1e9) // 2
    rng = np.random.default_rng(0)
    # Documents of ~500 tokens ending in EOS 50256, the nanoGPT layout.
    stream = rng.integers(0, 50256, size=tokens, dtype=np.uint16)
    stream[rng.integers(0, tokens, size=tokens // 500)] = 50256
    path = folder / "train.bin"
    stream.tofile(path)
    gb = stream.nbytes / 1e9
    rows: list[dict[str, str]] = []

    if args.only is None:
        rows += read_rows(path, tokens, gb)
    rows.append(write_row(folder, stream, tokens, gb, args.repeat))
    print(f"machine: {machine()}, load {os.getloadavg()[0]:.1f}\n")
    print(table(rows))
    for leftover in (path, folder / "ours.bin", folder / "numpy.bin"):
        leftover.unlink(missing_ok=True)


def read_rows(path: Path, tokens: int, gb: float) -> list[dict[str, str]]:
    """Rows 1 and 2: a sum over the tokens and the EOS-split lengths, best of three against NumPy."""
    rows = []

    # 1. sum over r.tokens vs np.memmap().sum()
    def ours_sum() -> int:
        with tokformats.open(path, format="raw", dtype="uint16") as r:
            return int(r.tokens.sum())

    def numpy_sum() -> int:
        return int(np.memmap(path, dtype=np.uint16, mode="r").sum())

    numpy_sum()  # warm the page cache for both
    t_np, s_np = best_of(numpy_sum)
    t_ours, s_ours = best_of(ours_sum)
    assert s_np == s_ours
    rows.append(
        {
            "operation": f"sum of {gb:.1f} GB uint16",
            "tokformats": f"{t_ours:.3f} s",
            "peer": f"np.memmap().sum() {t_np:.3f} s",
            "ratio (peer time / ours)": f"{t_np / t_ours:.2f}",
            "goal": ">= 0.9",
        }
    )

    # 2. lengths of an EOS-split corpus (a fresh reader each time: nothing cached)
    def ours_lengths() -> int:
        with tokformats.open(path, format="raw", dtype="uint16", eos=50256) as r:
            return len(r.lengths)

    def numpy_lengths() -> int:
        mm = np.memmap(path, dtype=np.uint16, mode="r")
        return len(np.diff(np.flatnonzero(mm == 50256)))

    t_np, _ = best_of(numpy_lengths)
    t_ours, documents = best_of(ours_lengths)
    rows.append(
        {
            "operation": f"lengths of {documents:,} EOS-split documents",
            "tokformats": f"{t_ours:.3f} s ({tokens / t_ours / 1e9:.2f} Gtok/s, {gb / t_ours:.2f} GB/s)",
            "peer": f"np.flatnonzero(mm == eos) {t_np:.3f} s",
            "ratio (peer time / ours)": f"{t_np / t_ours:.2f}",
            "goal": ">= 1 GB/s",
        }
    )

    return rows


def write_row(folder: Path, stream: np.ndarray, tokens: int, gb: float, repeat: int) -> dict[str, str]:
    """Row 3: ``write_batch`` of the whole stream vs ``ndarray.tofile`` + fsync, alternated."""
    lengths = np.diff(np.concatenate([[0], np.flatnonzero(stream == 50256) + 1, [tokens]]))
    lengths = lengths[lengths > 0] if lengths[-1] == 0 else lengths
    out_ours, out_np = folder / "ours.bin", folder / "numpy.bin"

    def ours_write() -> None:
        with tokformats.create(out_ours, "raw", vocab_size=50257) as w:
            w.write_batch(stream, lengths)

    def numpy_write() -> None:
        with open(out_np, "wb") as handle:
            stream.tofile(handle)
            handle.flush()
            os.fsync(handle.fileno())

    def fresh() -> None:  # users write new files: do not time freeing the previous run's blocks
        out_ours.unlink(missing_ok=True)
        out_np.unlink(missing_ok=True)
        os.sync()

    t_np, t_ours = alternated(numpy_write, ours_write, repeat, setup=fresh)
    numpy_write()  # the last fresh() removed it; the outputs must be identical
    assert out_ours.read_bytes() == out_np.read_bytes()
    return {
        "operation": f"write_batch {gb:.1f} GB (with fsync), {repeat} alternated pairs, min/median/max",
        "tokformats": f"{spread(t_ours)} s",
        "peer": f"ndarray.tofile + fsync {spread(t_np)} s",
        "ratio (peer time / ours)": spread([n / o for n, o in zip(t_np, t_ours)], "{:.2f}"),
        "goal": ">= 0.8",
    }


if __name__ == "__main__":
    main()
