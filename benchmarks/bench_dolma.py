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

Files other tools wrote: the same rows recompressed as one gzip member at gzip's default level 9, as dolma's
``MemmapWriter`` and OLMo-core's ``write_document_indices`` write them (tokformats' writer puts the last row in a
marked member of its own, which the open reads instead of decompressing every row): the one file, and the same
documents in ``--files`` files (``max_tokens``), each read by tokformats told the dtype and by OLMo-core
(``NumpyFSLDataset`` over every file). The floor of the one file (``floor: rows inflated``) only inflates its rows
and counts their lines, parsing nothing: the least an open that checks the dtype against the last row can cost,
since that row is at the end of one deflate stream. ``--before CHECKOUT`` adds the one-member sides run with that
checkout's tokformats (``PYTHONPATH``), alternated with the others.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import warnings
import zlib
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import installed_env, machine, scratch, table

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
#: The sides reading files another tool wrote (one gzip member of rows): (side, folder under the scratch folder).
ONE_MEMBER = (
    ("tokformats, one member", "one-member"),
    ("floor: rows inflated, one member", "one-member"),
    ("olmo-core, files", "one-member-files"),
    ("tokformats, one member, files", "one-member-files"),
)
#: Ratios reported: (peer side, tokformats side).
PAIRS = (
    ("olmo-core", "tokformats"),
    ("tokformats, dtype inferred", "tokformats"),
    ("csv rows (0.1)", "tokformats"),
    ("olmo-core", "tokformats, one member"),
    ("olmo-core", "floor: rows inflated, one member"),
    ("floor: rows inflated, one member", "tokformats, one member"),
    ("olmo-core, files", "tokformats, one member, files"),
    ("before: tokformats, one member", "tokformats, one member"),
    ("before: tokformats, one member, files", "tokformats, one member, files"),
)


def child(side: str, folder: Path) -> None:
    """One side in a fresh process: the open, the first document and the count, each timed on its own."""
    warnings.filterwarnings("ignore")
    side = side.removeprefix("before: ")  # the same side, another checkout's tokformats (PYTHONPATH)
    data = folder / "dolma"
    for name, under in ONE_MEMBER:
        if side == name:
            data = folder / under
    if side.startswith("olmo-core"):
        from olmo_core.data.numpy_dataset import NumpyFSLDataset
        from olmo_core.data.utils import get_document_indices
    else:
        import importlib

        import tokformats

        importlib.import_module("tokformats.formats.dolma")
    path = data / "part-0-00000.npy"
    clock = [time.perf_counter()]
    if side.startswith("tokformats"):  # told the dtype, as OLMo-core is; or inferring it (the last row read)
        reader = tokformats.open(data, format="dolma", **({} if "inferred" in side else {"dtype": "uint16"}))
        clock.append(time.perf_counter())
        first = np.asarray(reader[0][:4]).tolist()
        clock.append(time.perf_counter())
        count = len(reader)  # documents: every row counted
    elif side.startswith("floor"):  # the least a check of the dtype against the last row costs: inflating the rows
        inflate, rows = zlib.decompressobj(16 + zlib.MAX_WBITS), 0
        with open(metadata_path(path), "rb") as packed:
            while piece := packed.read(1 << 20):
                rows += inflate.decompress(piece).count(b"\n")
        clock.append(time.perf_counter())
        first = np.fromfile(path, dtype=np.uint16, count=4).tolist()
        clock.append(time.perf_counter())
        count = rows
    elif side == "csv rows (0.1)":
        _, ends = csv_rows(metadata_path(path))
        clock.append(time.perf_counter())
        first = np.fromfile(path, dtype=np.uint16, count=4).tolist()
        clock.append(time.perf_counter())
        count = len(ends)
    else:
        paths = [str(p) for p in sorted(data.glob("*.npy"))]
        dataset = NumpyFSLDataset(
            *paths, sequence_length=2048, pad_token_id=0, eos_token_id=0, vocab_size=50257, dtype=np.uint16
        )
        dataset.prepare()
        clock.append(time.perf_counter())
        first = np.asarray(dataset[0]["input_ids"][:4]).tolist()
        clock.append(time.perf_counter())
        # documents, as OLMo-core counts them (its len() is instances)
        count = sum(len(get_document_indices(p)) for p in paths)
    clock.append(time.perf_counter())
    steps = dict(zip(("open", "first", "count"), np.diff(clock).tolist()))
    print(json.dumps({**steps, "first_ids": first, "documents": count}))


def metadata_path(path: Path) -> Path:
    return path.with_name(path.name[: -len(".npy")] + ".csv.gz")


def run(side: str, folder: Path, before: Path | None = None) -> dict[str, object]:
    command = [sys.executable, str(HERE), "--child", side, "--folder", str(folder)]
    env = installed_env(before if side.startswith("before: ") else None)
    out = subprocess.run(command, check=True, capture_output=True, text=True, env=env).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def spread(values: list[float], scale: float = 1.0) -> str:
    return "/".join(f"{v * scale:.3f}" for v in (min(values), statistics.median(values), max(values)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--read-repeat", type=int, default=None)
    parser.add_argument("--files", type=int, default=10, help="files of the one-member folder read as several")
    parser.add_argument("--before", type=Path, help="a checkout whose tokformats reads the one-member sides too")
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
    one_member_folders(folder, args.files)
    sides = [*SIDES, *(name for name, _ in ONE_MEMBER)]
    if args.before is not None:
        sides += [f"before: {name}" for name, _ in ONE_MEMBER if name.startswith("tokformats")]
    runs: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    for k in range(args.read_repeat or args.repeat):
        for side in sides if k % 2 == 0 else sides[::-1]:
            result = run(side, folder, args.before)
            if result["first_ids"] != run_first(folder) or result["documents"] != args.documents:
                raise SystemExit(f"{side} read {result['first_ids']} and {result['documents']} documents")
            runs[side].append({step: float(result[step]) for step in ("open", "first", "count")})  # type: ignore[arg-type]
    ratio = statistics.median(converts) / statistics.median(copies)
    rows = [
        {"measure": f"convert {args.documents:,} documents to dolma (s)", "side": "tokformats",
         "time": spread(converts), "peer": f"token copy (tofile + fsync) {spread(copies)}",
         "ratio": f"{ratio:.2f}x the copy (goal <= 1.5x)"},
    ]  # fmt: skip
    for side, timings in runs.items():
        for step in ("open", "first", "count", "open + first"):
            values = [sum(r[s] for s in step.split(" + ")) for r in timings]
            rows.append({"measure": f"{step}, {args.documents:,} documents (ms)", "side": side,
                         "time": spread(values, 1e3), "peer": "", "ratio": ""})  # fmt: skip
    for peer, mine in PAIRS:
        if peer in runs and mine in runs:
            for step in ("open + first", "count", "open + first + count"):
                theirs = statistics.median(sum(r[s] for s in step.split(" + ")) for r in runs[peer])
                ours = statistics.median(sum(r[s] for s in step.split(" + ")) for r in runs[mine])
                ratio_text = f"{theirs / max(ours, 1e-9):.2f}"
                rows.append({"measure": f"{step}: ratio (medians, ms)", "side": mine, "time": f"{ours * 1e3:.2f}",
                             "peer": f"{peer} {theirs * 1e3:.2f}", "ratio": ratio_text})  # fmt: skip
    runs_text = f"{args.repeat} alternated converts, {args.read_repeat or args.repeat} alternated reads"
    print(f"{machine()}; load: {os.getloadavg()[0]:.2f}; {runs_text}; min/median/max")
    print(table(rows))


def one_member_folders(folder: Path, files: int) -> None:
    """The converted rows as other tools write them: one gzip member at gzip's default level 9 (dolma's
    ``MemmapWriter``, OLMo-core's ``write_document_indices``): ``one-member`` (the one file) and
    ``one-member-files`` (the documents in ``files`` files)."""
    import tokformats

    tokens = int(tokformats.open(folder / "dolma", dtype="uint16").num_tokens)
    tokformats.convert(folder / "source", folder / "one-member-files", "dolma", overwrite=True,
                       max_tokens=tokens // files + 1200)  # fmt: skip
    shutil.rmtree(folder / "one-member", ignore_errors=True)
    (folder / "one-member").mkdir()
    os.link(folder / "dolma" / "part-0-00000.npy", folder / "one-member" / "part-0-00000.npy")
    shutil.copy(folder / "dolma" / "part-0-00000.csv.gz", folder / "one-member" / "part-0-00000.csv.gz")
    for rows in [*(folder / "one-member").glob("*.csv.gz"), *(folder / "one-member-files").glob("*.csv.gz")]:
        rows.write_bytes(gzip.compress(gzip.decompress(rows.read_bytes()), compresslevel=9))


def run_first(folder: Path) -> list[int]:
    return np.fromfile(folder / "dolma" / "part-0-00000.npy", dtype=np.uint16, count=4).tolist()


if __name__ == "__main__":
    main()
