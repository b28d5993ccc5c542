"""Progress of ``fetch``, ``publish`` and ``merge`` (issue 22, item 14): bars count the bytes fetched, checksummed and
uploaded, and the bytes (Megatron's merge by copy) or documents a merge writes; totals and updates agree, and
``--json`` keeps stdout clean."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tokformats
import tokformats.api
import tokformats.core.progress
import tokformats.remote.byte_progress
from tokformats.cli import main
from tokformats.fs.filecopy import append_file, copy_progress
from tokformats.remote import fetch, publish
from tokformats.testing import random_corpus

from .http_server import FileServer

pytestmark = pytest.mark.usefixtures("quick_retries")  # retries back off a few milliseconds here


class FakeBar:
    """What a test sees of a progress bar: its description, total, every update, and whether it was closed."""

    def __init__(self, total: int, description: str, unit: str) -> None:
        self.total, self.description, self.unit = total, description, unit
        self.n = 0
        self.updates: list[int] = []
        self.closed = False

    def update(self, count: int) -> None:
        self.n += count
        self.updates.append(count)

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def bars(monkeypatch: pytest.MonkeyPatch) -> list[FakeBar]:
    """Every bar made (enabled) by the remote layer and by merge, in order."""
    made: list[FakeBar] = []

    def fake(total: int, description: str, *, enabled: bool, unit: str = "tok") -> FakeBar | None:
        if not enabled:
            return None
        made.append(FakeBar(total, description, unit))
        return made[-1]

    monkeypatch.setattr(tokformats.remote.byte_progress, "progress_bar", fake)
    monkeypatch.setattr(tokformats.api, "progress_bar", fake)
    return made




def _shards(folder: Path, shards: int = 4, per_shard: int = 60_000) -> None:
    flat = np.random.default_rng(1).integers(1, 60_000, shards * per_shard)
    with tokformats.create(folder, "pt", tokens_per_shard=per_shard, final_shard=False) as writer:
        writer.write_batch(flat, [len(flat)])


def _sizes(folder: Path) -> dict[str, int]:
    return {p.relative_to(folder).as_posix(): p.stat().st_size for p in folder.rglob("*") if p.is_file()}


def test_fetch_counts_every_byte_of_the_dataset(tmp_path: Path, server: FileServer, bars: list[FakeBar]) -> None:
    _shards(tmp_path / "shards")
    publish(tmp_path / "shards", f"{server.url}/g/")
    assert bars == []  # progress is off unless asked for
    server.fault("/g/shard_1.pt", "cut", 100_000)  # a resumed download counts its bytes once
    server.fault("/g/shard_2.pt", "cut", 400_000)  # then the whole file again: the bar goes back and counts it
    server.fault("/g/shard_2.pt", "ignore-range")
    dataset = fetch(f"{server.url}/g/", cache_dir=tmp_path / "cache", progress=True)
    expected = sum(_sizes(tmp_path / "shards").values())
    assert sorted(dataset.files) == sorted(_sizes(tmp_path / "shards"))
    (bar,) = bars
    assert bar.unit == "B" and bar.description.startswith("fetch http://127.0.0.1:") and bar.closed
    assert bar.total == bar.n == expected  # SHA256SUMS gives no sizes: each came with its answer
    assert ("/g/shard_1.pt", "bytes=100000-") in server.ranges and ("/g/shard_2.pt", "bytes=400000-") in server.ranges
    assert -400_000 <= min(bar.updates) < 0  # shard_2's restart from its first byte took back what it had counted
    assert len(bar.updates) < expected / tokformats.remote.byte_progress.STEP + 20  # not one update per block
    again = fetch(f"{server.url}/g/", cache_dir=tmp_path / "cache", progress=True)  # all cached: counted as done
    assert bars[1].total == bars[1].n == expected and again.files == dataset.files


def test_publish_counts_checksummed_and_uploaded_bytes(
    tmp_path: Path, server: FileServer, bars: list[FakeBar]
) -> None:
    _shards(tmp_path / "shards", shards=3)
    summary = publish(tmp_path / "shards", f"{server.url}/g/", progress=True)
    checksums, uploads = bars
    assert checksums.description == "checksums" and checksums.total == checksums.n
    assert checksums.total == sum(_sizes(tmp_path / "shards").values())
    assert uploads.total == uploads.n == summary["bytes"] > checksums.total  # SHA256SUMS is uploaded too
    assert len(uploads.updates) == len(summary["uploaded"]) and uploads.closed
    publish(tmp_path / "shards", f"{server.url}/g/", progress=True)  # unchanged: nothing to upload
    assert bars[3].total == bars[3].n == 0
    publish(tmp_path / "shards", f"{server.url}/h/", progress=True, dry_run=True)  # no upload bar without uploads
    assert len(bars) == 5


def _megatron(path: Path, seed: int, masked: bool) -> None:
    flat, lengths = random_corpus(np.random.default_rng(seed), 300, low=1, high=999)
    mask = np.random.default_rng(seed).integers(0, 2, len(flat)).astype(np.uint8) if masked else None
    with tokformats.create(path, "megatron", vocab_size=1000) as writer:
        writer.write_batch(flat, lengths, mask)


def test_megatron_merge_counts_the_bytes_it_copies(tmp_path: Path, bars: list[FakeBar]) -> None:
    for k in range(3):
        _megatron(tmp_path / f"p{k}", k, masked=True)
    sources = [tmp_path / f"p{k}" for k in range(3)]
    with tokformats.api.merge(sources, tmp_path / "quiet") as _:
        pass
    assert bars == []
    with tokformats.api.merge(sources, tmp_path / "shown", progress=True) as merged:
        assert merged.loss_masks is not None
    (bar,) = bars
    copied = sum((tmp_path / f"{name}.bin").stat().st_size for name in ("shown", "shown_loss_mask"))
    assert bar.unit == "B" and bar.total == bar.n == copied and bar.closed
    for suffix in (".bin", ".idx", "_loss_mask.bin", "_loss_mask.idx"):
        assert (tmp_path / f"shown{suffix}").read_bytes() == (tmp_path / f"quiet{suffix}").read_bytes()


def test_a_merge_by_rewriting_counts_documents(tmp_path: Path, bars: list[FakeBar]) -> None:
    counts = []
    for k in range(2):
        flat, lengths = random_corpus(np.random.default_rng(k), 40 + k, low=1, high=999)
        with tokformats.create(tmp_path / f"p{k}.ds", "datatrove", vocab_size=1000) as writer:
            writer.write_batch(flat, lengths)
        counts.append(len(lengths))
    with tokformats.api.merge([tmp_path / "p0.ds", tmp_path / "p1.ds"], tmp_path / "m.ds", progress=True) as merged:
        assert len(merged) == sum(counts)
    (bar,) = bars
    assert bar.unit == "doc" and bar.total == bar.n == sum(counts) and bar.closed


def test_a_copy_counts_its_bytes_on_the_portable_path_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = tmp_path / "source"
    source.write_bytes(bytes(range(256)) * 1000)
    reports: list[int] = []

    def refused(*args: Any) -> int:
        raise OSError("no kernel copy here")

    monkeypatch.setattr(os, "copy_file_range", refused, raising=False)
    monkeypatch.setattr(os, "sendfile", refused, raising=False)
    with open(tmp_path / "out", "wb") as out, copy_progress(reports.append):
        append_file(source, out)
    assert sum(reports) == 256_000 and (tmp_path / "out").read_bytes() == source.read_bytes()
    with open(tmp_path / "out2", "wb") as out:
        append_file(source, out)  # outside the block: reports nothing
    assert sum(reports) == 256_000


def test_cli_json_keeps_stdout_clean_and_progress_shows_on_stderr(
    tmp_path: Path, server: FileServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("tqdm")
    monkeypatch.setattr(tokformats.core.progress, "DELAY", 0.0)  # a bar at once (a real run waits a second)
    _shards(tmp_path / "shards", shards=2)
    assert main(["publish", str(tmp_path / "shards"), f"{server.url}/g/", "--json", "--progress"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["uploaded"][-1] == "manifest.json"
    assert "publish http://127.0.0.1" in captured.err and "checksums" in captured.err
    cache = str(tmp_path / "cache")
    assert main(["fetch", f"{server.url}/g/", "--cache-dir", cache, "--json", "--progress"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["bytes"] > 0 and "fetch http://127.0.0.1" in captured.err
    assert main(["fetch", f"{server.url}/g/", "--cache-dir", cache, "--json"]) == 0  # --json: no bar
    captured = capsys.readouterr()
    assert json.loads(captured.out)["files"] and captured.err == ""
    for k in range(2):
        _megatron(tmp_path / f"p{k}", k, masked=False)
    args = ["merge", str(tmp_path / "p0"), str(tmp_path / "p1"), "-o", str(tmp_path / "m")]
    assert main([*args, "--json", "--progress"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["documents"] == 600 and "merge -> megatron" in captured.err


def test_cli_off_a_terminal_prints_no_bar(tmp_path: Path, server: FileServer) -> None:
    _shards(tmp_path / "shards", shards=2)
    env = {**os.environ, "PYTHONPATH": str(Path(tokformats.__file__).parents[1])}
    for command in (
        ["publish", str(tmp_path / "shards"), f"{server.url}/g/"],
        ["fetch", f"{server.url}/g/", "--cache-dir", str(tmp_path / "cache"), "--json"],
    ):
        done = subprocess.run(
            [sys.executable, "-m", "tokformats", *command], capture_output=True, text=True, env=env, timeout=120
        )
        assert done.returncode == 0 and done.stderr == ""
    assert json.loads(done.stdout)["bytes"] == sum(_sizes(tmp_path / "shards").values())
