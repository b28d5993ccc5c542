"""Issue 23, items 4-5: a damaged or missing file of a multi-file dataset is an error (or is reported by
``problems()``), never a smaller dataset or other documents read in silence; the pt folder reads what its manifest
names, so racing writers never publish a mix.

Each format's sweep runs in a child (``tests/damage_worker.py``) with a time cap per input: missing, empty, cut,
appended, FIFO, folder and dangling-link versions of every file of a small dataset, plus random bit flips (a few
hundred inputs per format in CI; at least 3,000 with ``--reliability-long`` or ``TOKFORMATS_RELIABILITY_LONG=1``).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tokformats
from tokformats import FormatError, NoFilesError, SizeMismatchError

ROOT = Path(__file__).resolve().parents[1]
CASES = ["dolma", "datatrove", "litdata", "megatron", "timemoe", "hf", "pt"]


@pytest.mark.parametrize("case", CASES)
def test_companion_damage_never_drops_documents_silently(tmp_path: Path, case: str, reliability_long: bool) -> None:
    pytest.importorskip("pyarrow") if case == "hf" else None
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    minimum = 3000 if reliability_long else 0
    done = subprocess.run(
        [sys.executable, "-m", "tests.damage_worker", case, str(tmp_path / "scratch"), "3", "0", str(minimum)],
        capture_output=True, text=True, timeout=3000, cwd=ROOT, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"companion damage {case}: {json.dumps({k: v for k, v in counts.items() if k != 'examples'})}")
    assert counts["inputs"] >= minimum
    failures = {k: counts[k] for k in ("dropped", "altered", "foreign", "hangs")}
    assert failures == {"dropped": 0, "altered": 0, "foreign": 0, "hangs": 0}, counts["examples"]
    assert counts["refused"] > 0 and counts["same"] + counts["refused"] + counts["reported"] > 0


def dolma_folder(tmp_path: Path) -> Path:
    with tokformats.create(tmp_path / "d", "dolma", vocab_size=1000, max_tokens=100) as writer:
        writer.write_batch(np.arange(1, 401) % 999 + 1, [10] * 40)
    return tmp_path / "d"


@pytest.mark.parametrize("damage", ["one-byte", "flip", "empty", "fifo", "folder"])
def test_a_damaged_dolma_csv_is_an_error_not_a_smaller_folder(tmp_path: Path, damage: str) -> None:
    folder = dolma_folder(tmp_path)
    assert len(tokformats.open(folder)) == 40
    rows = sorted(folder.glob("*.csv.gz"))[1]
    content = rows.read_bytes()
    if damage == "one-byte":
        rows.write_bytes(content[:1])
    elif damage == "flip":
        rows.write_bytes(content[:12] + bytes([content[12] ^ 0x10]) + content[13:])
    elif damage == "empty":
        rows.write_bytes(b"")
    else:
        rows.unlink()
        os.mkfifo(rows) if damage == "fifo" else rows.mkdir()
    with pytest.raises(FormatError, match=re.escape(rows.name)):
        tokformats.open(folder, format="dolma")[:]


def test_a_dolma_npy_missing_beside_its_rows_is_an_error(tmp_path: Path) -> None:
    folder = dolma_folder(tmp_path)
    sorted(folder.glob("*.npy"))[2].unlink()
    with pytest.raises(NoFilesError, match="does not exist"):
        tokformats.open(folder, format="dolma")


def test_dolma_rows_of_a_gzip_are_still_read(tmp_path: Path) -> None:
    folder = dolma_folder(tmp_path)
    with gzip.open(sorted(folder.glob("*.csv.gz"))[0], "rt") as handle:
        assert handle.readline().startswith("0,10,")
    assert [len(d) for d in tokformats.open(folder)] == [10] * 40


def datatrove_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "dt"
    folder.mkdir()
    for rank in range(2):
        with tokformats.create(folder / f"{rank:05d}_unshuffled.ds", "datatrove", vocab_size=1000) as writer:
            writer.write_batch(np.arange(1, 121) + rank, [10] * 12)
    return folder


@pytest.mark.parametrize("damage", ["missing", "fifo", "folder", "dangling-link"])
def test_a_damaged_datatrove_index_is_an_error(tmp_path: Path, damage: str) -> None:
    folder = datatrove_folder(tmp_path)
    assert len(tokformats.open(folder)) == 24
    index = folder / "00001_unshuffled.ds.index"
    index.unlink()
    if damage == "fifo":
        os.mkfifo(index)
    elif damage == "folder":
        index.mkdir()
    elif damage == "dangling-link":
        index.symlink_to(folder / "gone")
    for target in (folder, folder / "00001_unshuffled.ds"):
        with pytest.raises(FormatError, match=re.escape("00001_unshuffled.ds")):
            tokformats.open(target, format="datatrove")[:]


def test_a_lone_datatrove_file_without_index_is_still_one_document(tmp_path: Path) -> None:
    with tokformats.create(tmp_path / "x.ds", "datatrove", vocab_size=1000, save_index=False) as writer:
        writer.write_batch(np.arange(1, 31), [10] * 3)
    assert [len(d) for d in tokformats.open(tmp_path / "x.ds", format="datatrove")] == [30]  # save_index=False


def test_a_litdata_chunk_longer_than_its_chunk_bytes_is_refused(tmp_path: Path) -> None:
    with tokformats.create(tmp_path / "l", "litdata", vocab_size=1000, chunk_size=50) as writer:
        writer.write_batch(np.arange(1, 201) % 999 + 1, [10] * 20)
    chunk = sorted((tmp_path / "l").glob("chunk-*.bin"))[0]
    with open(chunk, "ab") as handle:
        handle.write(np.arange(9, dtype="<u2").tobytes())
    with pytest.raises(SizeMismatchError, match="chunk_bytes"):
        tokformats.open(tmp_path / "l")


def pt_folder(path: Path, start: int, shards: int) -> list[list[int]]:
    flat = np.arange(start, start + 10 * shards)
    with tokformats.create(path, "pt", tokens_per_shard=10, overwrite=True) as writer:
        writer.write_batch(flat, [10] * shards)
    return [list(range(start + 10 * k, start + 10 * k + 10)) for k in range(shards)]


def test_the_pt_folder_reads_what_its_manifest_names(tmp_path: Path) -> None:
    documents = pt_folder(tmp_path / "p", 1, 3)
    pt_folder(tmp_path / "other", 500, 5)
    (tmp_path / "other" / "shard_4.pt").rename(tmp_path / "p" / "shard_4.pt")  # a stray the manifest never named
    with tokformats.open(tmp_path / "p") as reader:
        assert [d.tolist() for d in reader] == documents
    (tmp_path / "p" / "shard_1.pt").unlink()
    with pytest.raises(NoFilesError, match=re.escape("shard_1.pt is named by")):
        tokformats.open(tmp_path / "p")


WRITER = """
import sys, numpy as np, tokformats
start, shards = int(sys.argv[2]), int(sys.argv[3])
for _ in range(int(sys.argv[4])):
    with tokformats.create(sys.argv[1], "pt", tokens_per_shard=10, overwrite=True) as writer:
        writer.write_batch(np.arange(start, start + 10 * shards), [10] * shards)
"""


def test_racing_pt_folder_writers_never_publish_a_mix(tmp_path: Path, reliability_long: bool) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    rounds = 50 if reliability_long else 4
    first, second = (
        [list(range(1 + 10 * k, 11 + 10 * k)) for k in range(5)],
        [list(range(500 + 10 * k, 510 + 10 * k)) for k in range(3)],
    )
    seen = set()
    for round_ in range(rounds):
        folder = tmp_path / f"r{round_}"
        writers = [
            subprocess.Popen([sys.executable, "-c", WRITER, str(folder), str(start), str(shards), "3"], env=env)
            for start, shards in ((1, 5), (500, 3))
        ]
        assert [w.wait(120) for w in writers] == [0, 0]
        with tokformats.open(folder) as reader:
            documents = [d.tolist() for d in reader]
            assert documents in (first, second), round_
            assert reader.problems() == []
        seen.add(len(documents))
    print(f"racing pt writers: {rounds} rounds, 0 mixed")


@pytest.mark.parametrize(
    "flip, message",
    [(("data-00001-of-00002", "data-00000-of-00002"), "more than once"), (("-of-00002", "-of-00003"), "should name")],
)
def test_an_hf_state_whose_file_list_was_damaged_is_refused(
    tmp_path: Path, flip: tuple[str, str], message: str
) -> None:
    pytest.importorskip("pyarrow")
    with tokformats.create(tmp_path / "h", "hf", vocab_size=1000, max_shard_bytes=800) as writer:
        writer.write_batch(np.arange(1, 401) % 999 + 1, [10] * 40)
    state = tmp_path / "h" / "state.json"
    assert '"data-00001-of-00002.arrow"' in state.read_text()
    state.write_text(state.read_text().replace(*flip))  # one bit of one digit: a file read twice, another never
    with pytest.raises(FormatError, match=message):
        tokformats.open(tmp_path / "h")
