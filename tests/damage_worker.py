"""Damage one file of a multi-file dataset at a time and read the dataset (run by test_companion_damage.py).

``python -m tests.damage_worker CASE SCRATCH FLIPS SEED [MIN_INPUTS]`` writes a small dataset of the case's format
(several data files and their companions), then for every file of it, one damage at a time: missing, empty, cut to
1 byte, cut in half, cut by 1 byte, 64 bytes appended, a FIFO, a folder, a dangling link, and FLIPS random single-bit
flips (more when needed to reach MIN_INPUTS inputs). Each damaged dataset is opened (as a folder, and through one of
its files where the format allows) and read fully with a time cap. It prints one JSON line of counts: ``refused``
(a FormatError), ``reported`` (read, and ``problems()`` names the damage), ``same`` (read back exactly), and the
failures: ``dropped`` (fewer or more documents than written, silently), ``altered`` (the same number, other
contents, silently), ``foreign`` (another exception type) and ``hangs``. A bit flip that only changes token values
(``flipped_values``) or moves a boundary inside an index with no checksum (``flipped_boundaries``) is counted
apart: no reader can see it without a checksum the format does not have.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

import numpy as np

import tokformats
from tokformats import FormatError

SECONDS_PER_INPUT = 5
STRUCTURAL = ["missing", "empty", "one-byte", "half", "minus-one", "appended", "fifo", "folder", "dangling-link"]


def build(folder: Path, case: str) -> tuple[list[tuple[Path, dict[str, Any]]], list[Path], list[Path]]:
    """A dataset of ``case``: (what to open with which options, its files to damage, its token-data files)."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 30, size=40)
    flat = rng.integers(1, 1000, size=int(lengths.sum()))
    half = len(lengths) // 2
    cut = int(lengths[:half].sum())
    root = folder / "d"
    if case == "datatrove":  # a folder of two outputs, as datatrove's ranks write them
        root.mkdir()
        for rank, (f, ls) in enumerate([(flat[:cut], lengths[:half]), (flat[cut:], lengths[half:])]):
            with tokformats.create(root / f"{rank:05d}_unshuffled.ds", "datatrove", vocab_size=1000) as writer:
                writer.write_batch(f, ls)
        opened = [(root, {"format": "datatrove"}), (root / "00000_unshuffled.ds", {"format": "datatrove"})]
        data = sorted(root.glob("*.ds"))
    elif case == "megatron":
        with tokformats.create(root, "megatron", vocab_size=1000) as writer:
            writer.write_batch(flat, lengths)
        opened, data = [(root, {"format": "megatron"})], [folder / "d.bin"]
    else:
        options = {"dolma": {"max_tokens": 200}, "litdata": {"chunk_size": 200}, "hf": {"max_shard_bytes": 800},
                   "timemoe": {"max_shard_elements": 200}, "pt": {"tokens_per_shard": 200, "eos": 0}}[case]  # fmt: skip
        with tokformats.create(root, case, vocab_size=1000, **options) as writer:
            writer.write_batch(flat, lengths)
        read_options = {"eos": 0} if case == "pt" else {}
        opened = [(root, {"format": case, **read_options})]
        data = sorted(p for p in root.iterdir() if p.suffix in (".npy", ".bin", ".arrow", ".pt"))
        if case == "dolma":
            opened.append((sorted(root.glob("*.npy")), {"format": "dolma"}))
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    return opened, files, data


def damage(path: Path, kind: str, rng: random.Random) -> None:
    """Apply one damage to ``path`` in place."""
    content = path.read_bytes()
    if kind == "flip":
        if not content:
            return
        data = bytearray(content)
        at = rng.randrange(len(data))
        data[at] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(data))
        return
    if kind in ("one-byte", "half", "minus-one", "empty", "appended"):
        keep = {"one-byte": 1, "half": len(content) // 2, "minus-one": max(len(content) - 1, 0), "empty": 0}
        path.write_bytes(content + bytes(64) if kind == "appended" else content[: keep[kind]])
        return
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "dangling-link":
        path.symlink_to(path.with_name(path.name + ".gone"))


class Reported(list):  # type: ignore[type-arg]
    """Documents read from a dataset whose ``problems()`` named what is wrong (a detection, not a silent read)."""


def read_all(target: Any, options: dict[str, Any]) -> list[list[int]]:
    with tokformats.open(target, **options) as reader:
        documents = [np.asarray(d).tolist() for d in reader]
        return Reported(documents) if reader.problems() else documents


class TimedOut(Exception):
    pass


def _alarm(*_: Any) -> None:
    raise TimedOut


def run_case(case: str, scratch: Path, flips: int, seed: int, min_inputs: int = 0) -> dict[str, Any]:
    rng = random.Random(seed)
    pristine = scratch / "pristine"
    shutil.rmtree(scratch, ignore_errors=True)
    pristine.mkdir(parents=True)
    opened, files, data_files = build(pristine, case)
    flips = max(flips, -(-min_inputs // (len(files) * len(opened))) - len(STRUCTURAL))
    expected = {i: read_all(target, options) for i, (target, options) in enumerate(opened)}
    counts: dict[str, Any] = {"inputs": 0, "refused": 0, "reported": 0, "same": 0, "flipped_values": 0,
                              "flipped_boundaries": 0, "dropped": 0, "altered": 0, "foreign": 0, "hangs": 0,
                              "examples": []}  # fmt: skip
    signal.signal(signal.SIGALRM, _alarm)
    work = scratch / "work"
    for file in files:
        for kind in STRUCTURAL + ["flip"] * flips:
            shutil.rmtree(work, ignore_errors=True)
            shutil.copytree(pristine, work, symlinks=True)
            damaged = work / file.relative_to(pristine)
            damage(damaged, kind, rng)
            in_data = file in data_files
            for i, (target, options) in enumerate(opened):
                moved = [work / Path(t).relative_to(pristine) for t in target] if isinstance(target, list) else (
                    work / Path(target).relative_to(pristine))  # fmt: skip
                counts["inputs"] += 1
                outcome = _read_with_cap(moved, options)
                label = _classify(outcome, expected[i], kind, in_data)
                counts[label] += 1
                if label in ("dropped", "altered", "foreign", "hangs") and len(counts["examples"]) < 10:
                    counts["examples"].append([file.name, kind, str(outcome)[:300]])
    return counts


def _read_with_cap(target: Any, options: dict[str, Any]) -> Any:
    signal.alarm(SECONDS_PER_INPUT)
    try:
        return read_all(target, options)
    except TimedOut:
        return TimedOut()
    except FormatError as error:
        return error
    except Exception as error:  # classified as a foreign exception
        return error
    finally:
        signal.alarm(0)


def _classify(outcome: Any, expected: list[list[int]], kind: str, in_data: bool) -> str:
    if isinstance(outcome, TimedOut):
        return "hangs"
    if isinstance(outcome, FormatError):
        return "refused"
    if isinstance(outcome, Exception):
        return "foreign"
    if list(outcome) == expected:
        return "same"
    if isinstance(outcome, Reported):
        return "reported"
    if kind == "flip" and in_data:
        return "flipped_values"
    if kind == "flip" and len(outcome) == len(expected):
        return "flipped_boundaries"
    return "dropped" if len(outcome) != len(expected) else "altered"


def main() -> None:
    case, scratch, flips, seed = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    min_inputs = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    print(json.dumps(run_case(case, scratch, flips, seed, min_inputs)))


if __name__ == "__main__":
    main()
