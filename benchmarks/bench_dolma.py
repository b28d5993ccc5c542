"""dolma memmaps: opening a folder, its first document and its document count, and converting into dolma, against
the token copy.

Run: ``python benchmarks/bench_dolma.py [--documents 1000000] [--repeat 3] [--read-repeat N]`` (the reads are
alternated ``--read-repeat`` times, default ``--repeat``: millisecond steps on a loaded machine need more runs).
A Megatron dataset of ``--documents`` documents (~300 uint16 tokens each) is converted to dolma
(``tokformats.convert``: tokens, rows, gzip, fsync, atomic commit) and, alternately, copied as bare tokens
(``ndarray.tofile`` of the same stream + fsync: the token copy the conversion cannot beat). The converted folder
is then read in fresh processes, sides alternating, each step timed on its own: the open, the first document, and
the number of documents. Sides: tokformats told the dtype (as OLMo-core is), tokformats inferring it (which reads
the last row), OLMo-core (``NumpyFSLDataset`` + ``prepare()``, which reads no rows: it cuts fixed-length
instances; its documents counted with its own ``get_document_indices``, since its ``len()`` counts instances), and
the row parser of tokformats 0.1 (``csv.reader`` over every row, kept below as ``csv_rows``). Times are
min/median/max over the alternated runs.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
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


def csv_rows(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """tokformats 0.1's parse of a ``.csv.gz``: ``csv.reader`` over every row, each field kept as text."""
    starts, ends, rest = [], [], []
    with gzip.open(path, "rb") as handle:
        for row in csv.reader(io.StringIO(handle.read().decode("utf-8"))):
            if row:
                starts.append(int(row[0]))
                ends.append(int(row[1]))
                rest.append(row[2:])
    return np.array(starts, dtype=np.int64), np.array(ends, dtype=np.int64)


SIDES = ("tokformats", "tokformats, dtype inferred", "olmo-core", "csv rows (0.1)")


def child(side: str, folder: Path) -> None:
    """One side in a fresh process: the open, the first document and the count, each timed on its own."""
    warnings.filterwarnings("ignore")
    if side == "olmo-core":
        from olmo_core.data.numpy_dataset import NumpyFSLDataset
        from olmo_core.data.utils import get_document_indices
    else:
        import importlib

        import tokformats

        importlib.import_module("tokformats.formats.dolma")
    path = folder / "dolma" / "part-0-00000.npy"
    clock = [time.perf_counter()]
    if side.startswith("tokformats"):  # told the dtype, as OLMo-core is; or inferring it (the last row read)
        reader = tokformats.open(
            folder / "dolma", format="dolma", **({} if "inferred" in side else {"dtype": "uint16"})
        )
        clock.append(time.perf_counter())
        first = np.asarray(reader[0][:4]).tolist()
        clock.append(time.perf_counter())
        count = len(reader)  # documents: every row counted
    elif side == "csv rows (0.1)":
        _, ends = csv_rows(metadata_path(path))
        clock.append(time.perf_counter())
        first = np.fromfile(path, dtype=np.uint16, count=4).tolist()
        clock.append(time.perf_counter())
        count = len(ends)
    else:
        dataset = NumpyFSLDataset(
            str(path), sequence_length=2048, pad_token_id=0, eos_token_id=0, vocab_size=50257, dtype=np.uint16
        )
        dataset.prepare()
        clock.append(time.perf_counter())
        first = np.asarray(dataset[0]["input_ids"][:4]).tolist()
        clock.append(time.perf_counter())
        count = len(get_document_indices(str(path)))  # documents, as OLMo-core counts them (its len() is instances)
    clock.append(time.perf_counter())
    steps = dict(zip(("open", "first", "count"), np.diff(clock).tolist()))
    print(json.dumps({**steps, "first_ids": first, "documents": count}))


def metadata_path(path: Path) -> Path:
    return path.with_name(path.name[: -len(".npy")] + ".csv.gz")


def run(side: str, folder: Path) -> dict[str, object]:
    command = [sys.executable, str(HERE), "--child", side, "--folder", str(folder)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(folder / "pycache")
    out = subprocess.run(command, check=True, capture_output=True, text=True, env=env).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def spread(values: list[float], scale: float = 1.0) -> str:
    return "/".join(f"{v * scale:.3f}" for v in (min(values), statistics.median(values), max(values)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--read-repeat", type=int, default=None)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.folder)
        return
    import tokformats

    folder = scratch("dolma")
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 600, size=args.documents)
    flat = rng.integers(0, 50257, size=int(lengths.sum())).astype(np.uint16)
    with tokformats.create(folder / "source", "megatron", vocab_size=50257, overwrite=True) as writer:
        writer.write_batch(flat, lengths)
    copies: list[float] = []
    converts: list[float] = []
    for _ in range(args.repeat):
        started = time.perf_counter()
        with open(folder / "copy.bin", "wb") as handle:
            np.asarray(tokformats.open(folder / "source").tokens).tofile(handle)
            handle.flush()
            os.fsync(handle.fileno())
        copies.append(time.perf_counter() - started)
        started = time.perf_counter()
        tokformats.convert(folder / "source", folder / "dolma", "dolma", overwrite=True)
        converts.append(time.perf_counter() - started)
    runs: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
    for k in range(args.read_repeat or args.repeat):
        for side in SIDES if k % 2 == 0 else SIDES[::-1]:
            result = run(side, folder)
            if result["first_ids"] != run_first(folder) or result["documents"] != args.documents:
                raise SystemExit(f"{side} read {result['first_ids']} and {result['documents']} documents")
            runs[side].append({step: float(result[step]) for step in ("open", "first", "count")})  # type: ignore[arg-type]
    ratio = statistics.median(converts) / statistics.median(copies)
    rows = [
        {"measure": f"convert {args.documents:,} documents to dolma (s)", "tokformats": spread(converts),
         "peer": f"token copy (tofile + fsync) {spread(copies)}", "ratio": f"{ratio:.2f}x the copy (goal <= 1.5x)"},
    ]  # fmt: skip
    for step, label in (("open", "open"), ("first", "first document"), ("count", "count the documents")):
        mine = [r[step] for r in runs["tokformats"]]
        for side in SIDES[1:]:
            theirs = [r[step] for r in runs[side]]
            ratio_text = f"{statistics.median(theirs) / max(statistics.median(mine), 1e-9):.2f}"
            rows.append({"measure": f"{label}, {args.documents:,} documents (ms)", "tokformats": spread(mine, 1e3),
                         "peer": f"{side} {spread(theirs, 1e3)}", "ratio": ratio_text})  # fmt: skip
    mine = [r["open"] + r["first"] for r in runs["tokformats"]]
    for side in SIDES[1:]:
        theirs = [r["open"] + r["first"] for r in runs[side]]
        ratio_text = f"{statistics.median(theirs) / max(statistics.median(mine), 1e-9):.2f}"
        rows.append({"measure": f"open + first document, {args.documents:,} documents (ms)",
                     "tokformats": spread(mine, 1e3), "peer": f"{side} {spread(theirs, 1e3)}",
                     "ratio": ratio_text})  # fmt: skip
    runs_text = f"{args.repeat} alternated converts, {args.read_repeat or args.repeat} alternated reads"
    print(f"{machine()}; load: {os.getloadavg()[0]:.2f}; {runs_text}; min/median/max")
    print(table(rows))


def run_first(folder: Path) -> list[int]:
    return np.fromfile(folder / "dolma" / "part-0-00000.npy", dtype=np.uint16, count=4).tolist()


if __name__ == "__main__":
    main()
