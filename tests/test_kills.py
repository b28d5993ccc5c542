"""kill -9 at chosen moments (after every rename of a commit) and at random ones, for every writer: the dataset a
reader then opens is the old one or the new one, whole, never a mix; a rerun gives what an uninterrupted run gives
and leaves no temporary behind (issue 15, item 2)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tokformats

#: Each writer: create options, and how to open what it wrote (relative to the target).
WRITERS: dict[str, tuple[dict[str, Any], dict[str, Any], str]] = {
    "megatron": ({"vocab_size": 50000}, {}, "{target}"),
    "llmc": ({"vocab_size": 50000, "shard_size": 40, "bos": 0}, {}, "{target}_[0-9]*.bin"),
    "pt": ({"tokens_per_shard": 40, "eos": 0}, {"eos": 0}, "{target}"),
    "timemoe": ({"dtype": "float32", "max_shard_elements": 40}, {}, "{target}"),
    "raw": ({"dtype": "uint16", "eos": 0}, {"format": "raw", "dtype": "uint16", "eos": 0}, "{target}"),
}

#: Makes the child SIGKILL itself on its ``kill_after``-th rename (``os.replace``), before doing it.
KILL_ON_RENAME = """
real, count = os.replace, [0]
def replace(a, b):
    if count[0] == kill_after:
        os.kill(os.getpid(), signal.SIGKILL)
    count[0] += 1
    return real(a, b)
os.replace = replace
"""

CHILD = (
    """
import json, os, signal, sys
import numpy as np
import tokformats
fmt, target, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
kill_after, start = int(sys.argv[4]), int(sys.argv[5])
"""
    + KILL_ON_RENAME
    + """
lengths = [7, 11, 5, 13, 9, 6, 10, 8, 12, 4] * 3
flat = (np.arange(sum(lengths)) + start) % 40000 + 1
with tokformats.create(target, fmt, overwrite=True, **options) as writer:
    writer.write_batch(flat, lengths)
print("finished")
"""
)


#: Writes the same documents one at a time, slowly, saying when the writer exists: a kill at a random moment after
#: "writing" lands while it writes or commits.
SLOW_CHILD = """
import json, sys, time
import numpy as np
import tokformats
fmt, target, options, start = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
lengths = [7, 11, 5, 13, 9, 6, 10, 8, 12, 4] * 3
flat = (np.arange(sum(lengths)) + start) % 40000 + 1
offsets = np.concatenate([[0], np.cumsum(lengths)])
with tokformats.create(target, fmt, overwrite=True, **options) as writer:
    print("writing", flush=True)
    for k in range(len(lengths)):
        writer.write(flat[offsets[k] : offsets[k + 1]])
        time.sleep(0.02)
print("finished", flush=True)
"""


def documents(target: Path, fmt: str) -> list[list[float]] | None:
    _, read, pattern = WRITERS[fmt]
    path = pattern.format(target=target)
    try:
        with tokformats.open(path, **read) as reader:
            return [np.asarray(d).tolist() for d in reader]
    except (tokformats.NoFilesError, tokformats.UnknownFormatError):
        return None


def write(target: Path, fmt: str, start: int, kill_after: int = -1) -> subprocess.CompletedProcess[str]:
    create = WRITERS[fmt][0]
    args = [sys.executable, "-c", CHILD, fmt, str(target), json.dumps(create), str(kill_after), str(start)]
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob(".*") if p.is_file())


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_kill_after_every_rename_leaves_old_or_new_whole(tmp_path: Path, fmt: str) -> None:
    reference = tmp_path / "reference"
    reference.mkdir()
    assert write(reference / "d", fmt, start=1).returncode == 0
    assert write(reference / "d", fmt, start=500).returncode == 0
    new = documents(reference / "d", fmt)
    old_folder = tmp_path / "old"
    old_folder.mkdir()
    assert write(old_folder / "d", fmt, start=1).returncode == 0
    old = documents(old_folder / "d", fmt)
    assert old != new and old is not None and new is not None
    outcomes = set()
    for kill_after in range(0, 12):
        folder = tmp_path / f"k{kill_after}"
        folder.mkdir()
        assert write(folder / "d", fmt, start=1).returncode == 0
        done = write(folder / "d", fmt, start=500, kill_after=kill_after)
        seen = documents(folder / "d", fmt)  # opening completes an interrupted commit
        assert seen in (old, new), (kill_after, done.returncode)
        outcomes.add("old" if seen == old else "new")
        if done.returncode == 0:  # fewer renames than kill_after: the write finished
            assert seen == new
            break
        assert done.returncode == -signal.SIGKILL
        rerun = write(folder / "d", fmt, start=500)
        assert rerun.returncode == 0, rerun.stderr[-2000:]
        assert documents(folder / "d", fmt) == new
        assert leftovers(folder) == [], leftovers(folder)
        ours = sorted(p for p in folder.rglob("*") if p.is_file())
        uninterrupted = sorted(p for p in reference.rglob("*") if p.is_file())
        assert [p.name for p in ours] == [p.name for p in uninterrupted]
        for a, b in zip(ours, uninterrupted):
            # Byte for byte, but for the .pt manifests' timestamps.
            if fmt != "pt" or a.name.startswith("shard_"):
                assert a.read_bytes() == b.read_bytes(), a
    assert outcomes == {"old", "new"}  # both sides of the commit point were hit


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_kill_at_random_moments(tmp_path: Path, fmt: str, reliability_long: bool) -> None:
    rng = random.Random(fmt)
    folder = tmp_path / "d"
    folder.mkdir()
    assert write(folder / "d", fmt, start=1).returncode == 0
    old = documents(folder / "d", fmt)
    rounds = 100 if reliability_long else 4
    mid_write = 0
    for _ in range(rounds):
        process = subprocess.Popen(
            [sys.executable, "-c", SLOW_CHILD, fmt, str(folder / "d"), json.dumps(WRITERS[fmt][0]), "500"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "writing"  # the writer exists: the kill lands in its run
        time.sleep(rng.uniform(0.0, 0.5))  # the documents take about 0.6 s to write, then the commit
        process.send_signal(signal.SIGKILL)
        out, _ = process.communicate(timeout=60)
        mid_write += "finished" not in out
        seen = documents(folder / "d", fmt)
        assert seen == old or seen == documents_of_new(tmp_path, fmt)
        old = seen
    assert mid_write >= rounds // 2, f"only {mid_write} of {rounds} kills landed before the writer finished"


_NEW: dict[str, Any] = {}


def documents_of_new(tmp_path: Path, fmt: str) -> Any:
    if fmt not in _NEW:
        folder = tmp_path / "new-reference"
        folder.mkdir(exist_ok=True)
        assert write(folder / "d", fmt, start=500).returncode == 0
        _NEW[fmt] = documents(folder / "d", fmt)
    return _NEW[fmt]


def test_an_unfinishable_journal_is_refused(tmp_path: Path) -> None:
    with tokformats.create(tmp_path / "d", "megatron", vocab_size=100) as writer:
        writer.write([1, 2, 3])
    journal = tmp_path / ".tokformats-commit.json"
    journal.write_text(json.dumps({"renames": [[str(tmp_path / ".gone.tmp"), str(tmp_path / "x.bin")]], "remove": []}))
    with pytest.raises(tokformats.FormatError, match="interrupted commit"):
        tokformats.open(tmp_path / "d")
    os.unlink(journal)
    assert len(tokformats.open(tmp_path / "d")) == 1


@pytest.mark.parametrize("fmt", ["megatron", "llmc", "pt", "timemoe"])
def test_two_concurrent_writers_leave_one_whole_dataset(tmp_path: Path, fmt: str, reliability_long: bool) -> None:
    first, second = documents_of(tmp_path, fmt, 1), documents_of(tmp_path, fmt, 500)
    for round_ in range(20 if reliability_long else 3):
        folder = tmp_path / f"race{round_}"
        folder.mkdir()
        args = [json.dumps(WRITERS[fmt][0]), "-1"]
        racers = [
            subprocess.Popen([sys.executable, "-c", CHILD, fmt, str(folder / "d"), *args, str(start)])
            for start in (1, 500)
        ]
        for racer in racers:
            assert racer.wait(timeout=120) == 0
        assert documents(folder / "d", fmt) in (first, second)
        assert leftovers(folder) == []


def documents_of(tmp_path: Path, fmt: str, start: int) -> Any:
    folder = tmp_path / f"alone{start}"
    folder.mkdir(exist_ok=True)
    assert write(folder / "d", fmt, start=start).returncode == 0
    return documents(folder / "d", fmt)


OPERATION = (
    """
import os, signal, sys
from pathlib import Path
import tokformats
operation, target, source, kill_after = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
"""
    + KILL_ON_RENAME
    + """
if operation == "convert":
    tokformats.convert(source / "m", target, "llmc", bos=0, shard_size=40, overwrite=True)
elif operation == "merge":
    tokformats.megatron.merge([source / "m", source / "m"], target, overwrite=True)
else:
    tokformats.tokenize(source / "texts.txt", source / "tokenizer.json", target, "megatron", overwrite=True,
                        progress=False)
"""
)

OPENED = {"convert": "{target}_[0-9]*.bin", "merge": "{target}", "tokenize": "{target}_text_document"}


@pytest.mark.parametrize("operation", ["convert", "merge", "tokenize"])
def test_kills_during_convert_merge_and_tokenize(tmp_path: Path, operation: str) -> None:
    from tokformats.tokenization.tokenizer import train_tokenizer

    source = tmp_path / "source"
    source.mkdir()
    texts = [f"document {k} " * (k % 7 + 1) for k in range(200)]
    (source / "texts.txt").write_text("\n".join(texts))
    train_tokenizer(texts, 300, progress=False).save(str(source / "tokenizer.json"))
    with tokformats.create(source / "m", "megatron", vocab_size=300) as writer:
        writer.write_batch(np.arange(1, 301) % 250 + 1, [30] * 10)

    def run(target: Path, kill_after: int) -> int:
        args = [sys.executable, "-c", OPERATION, operation, str(target), str(source), str(kill_after)]
        return subprocess.run(args, capture_output=True, timeout=120).returncode

    def seen(target: Path) -> Any:
        try:
            with tokformats.open(OPENED[operation].format(target=target)) as reader:
                return [np.asarray(d).tolist() for d in reader]
        except (tokformats.NoFilesError, tokformats.UnknownFormatError):
            return None

    reference = tmp_path / "reference"
    reference.mkdir()
    assert run(reference / "out", -1) == 0
    new = seen(reference / "out")
    for kill_after in range(0, 12):
        folder = tmp_path / f"k{kill_after}"
        folder.mkdir()
        status = run(folder / "out", kill_after)
        assert seen(folder / "out") in (None, new), kill_after  # absent (killed before) or whole
        if status == 0:
            break
        assert status == -signal.SIGKILL
        assert run(folder / "out", -1) == 0  # the rerun recovers without help
        assert seen(folder / "out") == new
        assert leftovers(folder) == [], leftovers(folder)


def test_a_reader_built_directly_completes_an_interrupted_commit(tmp_path: Path) -> None:
    """Not only tokformats.open: every reader (a DataLoader worker unpickling one, say) finishes the commit first."""
    from tokformats import megatron

    for name, start in (("old", 1), ("new", 500)):
        (tmp_path / name).mkdir()
        with tokformats.create(tmp_path / name / "d", "megatron", vocab_size=1000) as writer:
            writer.write_batch(np.arange(start, start + 20) % 900 + 1, [10, 10])
    expected = [d.tolist() for d in tokformats.open(tmp_path / "new" / "d")]
    renames = []  # a killed writer's temporaries, complete, beside the outputs (a journal names nothing elsewhere)
    for suffix in (".bin", ".idx"):
        temporary = f".d{suffix}.999999.0123456789ab.tmp"
        os.replace(tmp_path / "new" / f"d{suffix}", tmp_path / "old" / temporary)
        renames.append([temporary, f"d{suffix}"])
    (tmp_path / "old" / ".tokformats-commit.json").write_text(json.dumps({"renames": renames, "remove": []}))
    with megatron.Reader(tmp_path / "old" / "d") as reader:
        assert [d.tolist() for d in reader] == expected
    assert not (tmp_path / "old" / ".tokformats-commit.json").exists()
