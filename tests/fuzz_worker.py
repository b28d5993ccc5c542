"""Fuzz one reader in this process, under a memory cap and a time cap per input (run by test_fuzz_capped.py).

``python -m tests.fuzz_worker CASE COUNT SEED SCRATCH`` mutates the case's files COUNT times (truncation, byte
flips, lying header fields, duplicated blocks), opens and reads each mutant fully (every document, verify, stats)
and prints one JSON line: how many inputs read clean, how many raised FormatError, and every other outcome (another
exception type, a MemoryError past the cap, a time-out) as a failure. Memory: ``RLIMIT_AS`` is set to what the
process uses after its imports plus 256 MiB plus the largest file, so an allocation a file cannot justify fails.
"""

from __future__ import annotations

import json
import random
import resource
import shutil
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

import tokformats
from tokformats import FormatError

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures"
if not FIXTURES.is_dir():  # a clone alone: the committed copy of the shared golden files
    FIXTURES = Path(__file__).resolve().parent / "data" / "shared"
ALLOWANCE = 256 << 20
SECONDS_PER_INPUT = 10


def synthetic(scratch: Path, case: str) -> tuple[Path, list[Path], dict[str, Any]]:
    """A small dataset of the case's format written by tokformats: (what to open, files to mutate, open options)."""
    folder = scratch / f"synthetic-{case}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 40, size=30)
    flat = rng.integers(1, 1000, size=int(lengths.sum()))
    if case == "megatron":
        with tokformats.create(folder / "d", "megatron", vocab_size=1000) as w:
            w.write_batch(flat, lengths)
        return folder / "d", [folder / "d.idx", folder / "d.bin"], {}
    if case == "llmc":
        with tokformats.create(folder / "d", "llmc", vocab_size=1000, bos=0, shard_size=300) as w:
            w.write_batch(flat, lengths)
        return folder, sorted(folder.glob("*.bin")), {}
    if case == "pt-folder":
        with tokformats.create(folder / "d", "pt", tokens_per_shard=200, eos=0) as w:
            w.write_batch(flat, lengths)
        return folder / "d", sorted((folder / "d").iterdir()), {"eos": 0}
    if case == "timemoe":
        with tokformats.create(folder / "d", "timemoe", max_shard_elements=200) as w:
            for k in range(20):
                w.write(rng.normal(size=int(rng.integers(1, 40))), mean=1.5, std=2.0) if k % 2 else w.write(
                    rng.normal(size=5)
                )
        return folder / "d", sorted((folder / "d").iterdir()), {}
    if case in ("datatrove", "dolma", "litdata", "hf"):
        options = {"litdata": {"chunk_size": 200}, "dolma": {"max_tokens": 300}, "hf": {"max_shard_bytes": 800}}
        target = folder / ("d.ds" if case == "datatrove" else "d")
        with tokformats.create(target, case, vocab_size=1000, **options.get(case, {})) as w:
            w.write_batch(flat, lengths)
        files = sorted(p for p in folder.rglob("*") if p.is_file())
        return target, files, {}
    if case == "raw":
        flat.astype("<u2").tofile(folder / "d.bin")
        return folder / "d.bin", [folder / "d.bin"], {"format": "raw", "dtype": "uint16", "eos": 0}
    if case.startswith("sequences"):
        suffix = case.split("-", 1)[1]
        series = [rng.normal(size=int(rng.integers(1, 20))).round(3) for _ in range(8)]
        path = folder / f"s.{suffix}"
        if suffix == "json":
            path.write_text(json.dumps([s.tolist() for s in series]))
        elif suffix == "jsonl":
            path.write_text("".join(json.dumps({"sequence": s.tolist()}) + "\n" for s in series))
        elif suffix == "npy":
            np.save(path, np.stack([s[:1] for s in series]))
        elif suffix == "npz":
            np.savez_compressed(path, *series)
        elif suffix == "npy.gz":
            import gzip

            with gzip.open(path, "wb") as handle:
                np.save(handle, np.concatenate(series))
        return path, [path], {}
    raise ValueError(case)


GOLDEN = {
    "llmc": ("llmc/corpus_train_000000.bin", ["llmc/corpus_train_000000.bin"], {}),
    "llmc-vocab": ("llmc/bytelevel_bpe.vocab_v2.bin", ["llmc/bytelevel_bpe.vocab_v2.bin"], {}),
    "megatron": ("megatron/sentences_uint16", ["megatron/sentences_uint16.idx", "megatron/sentences_uint16.bin"], {}),
    "pt": ("torch/dict_tokens.pt", ["torch/dict_tokens.pt"], {}),
    "pt-legacy": ("torch/legacy_int64.pt", ["torch/legacy_int64.pt"], {}),
    "timemoe": ("timemoe/converted", ["timemoe/converted/meta.json", "timemoe/converted/data-1-of-1.bin"], {}),
}


#: Golden files of the newer formats, in tests/data/ (written by their owners' tools).
OWN_GOLDEN = {
    "datatrove": ("datatrove/00000_unshuffled.ds", ["00000_unshuffled.ds", "00000_unshuffled.ds.index"]),
    "dolma": ("dolma/part-0-00000.npy", ["part-0-00000.npy", "part-0-00000.csv.gz"]),
    "litdata": ("litdata", ["index.json", "chunk-0-0.bin", "chunk-0-1.bin"]),
    "hf": ("hf/plain", ["state.json", "dataset_info.json", "data-00000-of-00002.arrow", "data-00001-of-00002.arrow"]),
}


def sources(scratch: Path, case: str) -> list[tuple[Path, list[Path], dict[str, Any]]]:
    """The case's pristine inputs: its golden files (when shared/ is there) and a synthetic dataset."""
    found = []
    if case in OWN_GOLDEN:
        target, names = OWN_GOLDEN[case]
        source = Path(__file__).resolve().parent / "data" / target
        copy = scratch / f"golden-{case}"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(source if source.is_dir() else source.parent, copy)
        opened = copy if source.is_dir() else copy / source.name
        found.append((opened, [copy / n for n in names], {}))
    if case in GOLDEN and FIXTURES.is_dir():
        target, files, options = GOLDEN[case]
        copy = scratch / f"golden-{case}"
        shutil.rmtree(copy, ignore_errors=True)
        for name in files:
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(FIXTURES / name, copy / name)
        found.append((copy / target, [copy / n for n in files], options))
    folder = scratch / f"synthetic-{case}"
    folder.mkdir(parents=True, exist_ok=True)
    if case not in ("llmc-vocab", "pt", "pt-legacy"):
        found.append(synthetic(scratch, case))
    elif case == "pt":
        from tokformats import pt

        pt.save(np.arange(50), folder / "x.pt", overwrite=True)
        found.append((folder / "x.pt", [folder / "x.pt"], {}))
    elif case == "llmc-vocab":
        from tokformats.formats.llmc_vocab import Vocab

        tokens = [bytes([b]) for b in range(256)] + ["é".encode(), b"the", "😀".encode(), b"<|endoftext|>"]
        path = Vocab.from_tokens(tokens, eot_token=259).save(folder / "v.bin", overwrite=True)
        found.append((path, [path], {}))
    else:  # the legacy (pre-1.6) layout needs torch to write it
        try:
            import torch
        except ImportError:
            return found
        torch.save(torch.arange(50), folder / "x.pt", _use_new_zipfile_serialization=False)
        found.append((folder / "x.pt", [folder / "x.pt"], {}))
    return found


def mutate(data: bytes, rng: random.Random) -> bytes:
    content = bytearray(data)
    kind = rng.choice(["truncate", "flip", "field", "duplicate", "flip"])
    if kind == "truncate" or not content:
        return bytes(content[: rng.randint(0, max(len(content) - 1, 0))])
    if kind == "flip":
        for _ in range(rng.randint(1, 4)):
            content[rng.randrange(len(content))] = rng.randrange(256)
    elif kind == "field":  # a lying count or offset: 4 or 8 bytes of a large, negative or boundary value
        width = rng.choice([4, 8])
        value = rng.choice([0, 1, -1, 2**31 - 1, 2**31, 2**32 - 1, 2**40, 2**62, 2**63 - 1, -(2**63)])
        at = rng.randrange(max(len(content) - width, 1))
        content[at : at + width] = (value % (1 << (8 * width))).to_bytes(width, "little")
    else:
        start = rng.randrange(len(content))
        block = content[start : start + rng.randint(1, 64)]
        at = rng.randrange(len(content))
        content[at:at] = block
    return bytes(content)


def read_fully(target: Path, options: dict[str, Any], case: str) -> None:
    fmt = "sequences" if case.startswith("sequences") else {"pt-legacy": "pt", "pt-folder": "pt"}.get(case, case)
    with tokformats.open(target, **{"format": fmt, **options}) as reader:
        for item in reader:
            np.asarray(item).sum() if not isinstance(item, bytes) else len(item)
        if isinstance(reader, tokformats.TokenReader):
            reader.lengths.sum()
            reader.problems()
            reader.stats(top=3)


class TimedOut(Exception):
    pass


def _alarm(*_: Any) -> None:
    raise TimedOut


def main() -> None:
    case, count, seed, scratch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
    scratch.mkdir(parents=True, exist_ok=True)
    pristine = sources(scratch, case)
    if not pristine:
        print(json.dumps({"case": case, "skipped": "no input: no golden files (shared/) and no torch to write one"}))
        return
    largest = max(p.stat().st_size for _, files, _ in pristine for p in files)
    with open("/proc/self/status") as status:
        used = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
    cap = used + ALLOWANCE + 2 * largest
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    signal.signal(signal.SIGALRM, _alarm)
    rng = random.Random(seed)
    result: dict[str, Any] = {"case": case, "inputs": 0, "clean": 0, "format_errors": 0, "failures": []}
    started = time.perf_counter()
    originals = {p: p.read_bytes() for _, files, _ in pristine for p in files}
    for _ in range(count):
        target, files, options = rng.choice(pristine)
        for p in files:
            p.write_bytes(originals[p])
        victim = rng.choice(files)
        victim.write_bytes(mutate(originals[victim], rng))
        result["inputs"] += 1
        signal.alarm(SECONDS_PER_INPUT)
        try:
            read_fully(target, options, case)
            result["clean"] += 1
        except FormatError:
            result["format_errors"] += 1
        except TimedOut:
            result["failures"].append({"file": str(victim), "error": f"took over {SECONDS_PER_INPUT} s"})
        except BaseException as exc:
            tail = traceback.format_exc().strip().splitlines()[-3:]
            result["failures"].append({"file": str(victim), "error": f"{type(exc).__name__}: {exc}"[:300], "at": tail})
            if len(result["failures"]) >= 5:
                break
        finally:
            signal.alarm(0)
    result["seconds"] = round(time.perf_counter() - started, 2)
    result["memory_cap_mb"] = cap >> 20
    print(json.dumps(result))


if __name__ == "__main__":
    main()
