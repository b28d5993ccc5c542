"""A parallel run's start: once the run owns its work folder, the executor's workers are started (one warm-up job
per core, at most one per partition) before the parent loads the tokenizer, so that a spawned pool's processes
start and import while it does; nothing else changes (the partitions' jobs, their order, the output). Each output
is written back to the disk after each partition's join, so that its close syncs the last partition only."""

from __future__ import annotations

import json
import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import tokformats
from tokformats.errors import ConfigError
from tokformats.tokenization import pipeline
from tokformats.tokenization.parallel import _worker_ready
from tokformats.tokenization.sample_text import sample_texts


class _Recording(ThreadPoolExecutor):
    """A thread pool that records what is submitted, in one list with the parent's tokenizer loads."""

    def __init__(self, events: list[str]) -> None:
        super().__init__(2)
        self.events = events
        self.warm_ups: list[tuple[Any, ...]] = []

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.events.append(fn.__name__)
        if fn is _worker_ready:
            self.warm_ups.append(args)
        return super().submit(fn, *args, **kwargs)


def _source(path: Path, documents: int) -> Path:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in sample_texts(documents)), encoding="utf-8")
    return path


def _files(summary: dict[str, Any]) -> list[bytes]:
    return [Path(f).read_bytes() for output in summary["outputs"].values() for f in output["files"]]


def test_the_workers_are_started_before_the_tokenizer_is_loaded_and_the_output_is_unchanged(
    tmp_path: Path, tokenizer_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    load = pipeline.load_tokenizer

    def recorded(tokenizer: Any) -> Any:
        events.append("load_tokenizer")
        return load(tokenizer)

    monkeypatch.setattr("tokformats.tokenization.pipeline.load_tokenizer", recorded)
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    source = _source(tmp_path / "a.jsonl", 1200)
    single = tokformats.tokenize(source, tokenizer_path, tmp_path / "one", "megatron", progress=False)
    events.clear()
    with _Recording(events) as pool:
        summary = tokformats.tokenize(source, tokenizer_path, tmp_path / "p", "megatron", progress=False,
                                      executor=pool, partitions=5)  # fmt: skip
    # one warm-up per core (3 here), all before the tokenizer is loaded, then the 5 partitions in order
    assert events == ["_worker_ready"] * 3 + ["load_tokenizer"] + ["_partition_job"] * 5
    # distinct arguments: dask's submit merges equal calls of a pure function into one task (one worker warmed)
    assert len(set(pool.warm_ups)) == 3
    assert _files(summary) == _files(single)
    events.clear()
    with _Recording(events) as pool:  # no more warm-ups than partitions
        tokformats.tokenize(source, tokenizer_path, tmp_path / "q", "megatron", progress=False, executor=pool,
                            partitions=2)  # fmt: skip
    assert events == ["_worker_ready"] * 2 + ["load_tokenizer"] + ["_partition_job"] * 2


def test_nothing_is_submitted_for_a_run_refused_before_it_starts(tmp_path: Path, tokenizer_path: Path) -> None:
    events: list[str] = []
    source = _source(tmp_path / "a.jsonl", 10)
    with _Recording(events) as pool, pytest.raises(ConfigError, match="partitions must be at least 1"):
        tokformats.tokenize(source, tokenizer_path, tmp_path / "p", "megatron", progress=False, executor=pool,
                            partitions=0)  # fmt: skip
    assert events == []
    from tokformats.errors import FolderBusyError
    from tokformats.fs.owner import owned_folder

    with owned_folder(tmp_path / "p.tokenize", what="tokenize run"), _Recording(events) as pool:
        with pytest.raises(FolderBusyError, match=r"p\.tokenize"):  # another run owns the output: no worker started
            tokformats.tokenize(source, tokenizer_path, tmp_path / "p", "megatron", progress=False, executor=pool)
    assert events == []


def test_write_back_puts_the_written_bytes_in_the_file_and_leaves_it_open(tmp_path: Path) -> None:
    from tokformats.fs.atomic import AtomicFiles

    files = AtomicFiles()
    handle = files.create(tmp_path / "out.bin")
    handle.write(b"abc" * 100)
    temporary = Path(handle.name)
    assert temporary.stat().st_size == 0  # still in the handle's buffer
    files.write_back()
    assert temporary.read_bytes() == b"abc" * 100 and not handle.closed
    handle.write(b"d")
    assert files.commit() == [tmp_path / "out.bin"]
    assert (tmp_path / "out.bin").read_bytes() == b"abc" * 100 + b"d" and not temporary.exists()


def test_a_parallel_runs_outputs_are_written_back_after_each_partition_and_a_single_runs_not(
    tmp_path: Path, tokenizer_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tokformats.core.protocol import Writer

    synced: dict[str, list[int]] = {}  # the documents each output held at each of its write-backs
    write_back = Writer.write_back

    def counted(self: Any) -> None:
        synced.setdefault(str(self.path), []).append(self.num_documents)
        write_back(self)

    monkeypatch.setattr(Writer, "write_back", counted)
    source = _source(tmp_path / "a.jsonl", 1000)
    single = tokformats.tokenize(source, tokenizer_path, tmp_path / "one", "megatron", progress=False,
                                 split="9:1")  # fmt: skip
    assert synced == {}
    with ThreadPoolExecutor(2) as pool:
        summary = tokformats.tokenize(source, tokenizer_path, tmp_path / "p", "megatron", progress=False,
                                      split="9:1", executor=pool, partitions=4)  # fmt: skip
    assert sorted(synced) == sorted(o["path"] for o in summary["outputs"].values())  # both outputs
    assert [len(counts) for counts in synced.values()] == [4, 4]  # after each of the four partitions
    for output in summary["outputs"].values():  # the last write-back holds every document
        counts = synced[output["path"]]
        assert counts == sorted(counts) and counts[-1] == output["documents"]
    assert _files(summary) == _files(single)
    writer = tokformats.create(tmp_path / "w", "megatron", vocab_size=100)
    writer.close()
    with pytest.raises(ValueError, match="already committed"):
        writer.write_back()


def test_a_run_refused_for_its_tokenizer_leaves_no_folder_it_made(tmp_path: Path, tokenizer_path: Path) -> None:
    """The tokenizer is loaded once the run owns its work folder (so that the workers start meanwhile): a run that
    fails there removes the work folder and the folders made for it, as a run refused before any work did."""
    from tokformats.errors import NoFilesError

    source = _source(tmp_path / "in.jsonl", 10)
    with pytest.raises(NoFilesError):
        tokformats.tokenize(source, tmp_path / "missing.json", tmp_path / "new" / "deeper" / "out", "megatron",
                            progress=False)  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]
    (tmp_path / "kept").mkdir()
    with pytest.raises(NoFilesError):
        tokformats.tokenize(source, tmp_path / "missing.json", tmp_path / "kept" / "out", "megatron", progress=False)
    assert (tmp_path / "kept").is_dir() and not any((tmp_path / "kept").iterdir())
