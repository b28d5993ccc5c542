"""A process pool's workers size their engines' thread pools to their share of the cores: ``max(1, C // N)``
threads for N workers on C cores (``RAYON_NUM_THREADS``, read by splintr's and ``tokenizers``' rayon pools when
they start; ``FASTOKENS_BPE_THREADS``; ``TOKENIZERS_PARALLELISM=false`` at one thread), set in each worker before
its first batch, never over a value already set; other executors and a pool with a core per thread are left at
the default. The output is the same whatever the threads."""

from __future__ import annotations

import json
import os
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import tokformats
from tokformats.tokenization.engines import limit_threads
from tokformats.tokenization.executors import engine_threads
from tokformats.tokenization.sample_text import sample_texts

_VARIABLES = ("RAYON_NUM_THREADS", "FASTOKENS_BPE_THREADS", "TOKENIZERS_PARALLELISM")


@pytest.mark.parametrize(
    ("cores", "workers", "threads"),
    [(2, 2, 1), (2, 1, None), (4, 2, 2), (8, 3, 2), (2, 4, 1), (1, 2, None), (1, 1, None), (16, 16, 1)],
)
def test_a_process_pool_gets_its_share_of_the_cores(
    monkeypatch: pytest.MonkeyPatch, cores: int, workers: int, threads: int | None
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    pool = ProcessPoolExecutor(workers)  # no job submitted: no process started
    try:
        assert engine_threads(pool) == threads
    finally:
        pool.shutdown()


def test_other_executors_keep_the_engines_default() -> None:
    with ThreadPoolExecutor(2) as pool:  # its workers share this process's engines
        assert engine_threads(pool) is None


def test_limit_threads_sets_only_what_is_not_set(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert limit_threads(None) == {}
    assert limit_threads(2) == {"RAYON_NUM_THREADS": "2", "FASTOKENS_BPE_THREADS": "2"}
    assert "TOKENIZERS_PARALLELISM" not in os.environ
    for name in _VARIABLES[:2]:
        monkeypatch.delenv(name)
    one = {"RAYON_NUM_THREADS": "1", "FASTOKENS_BPE_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    assert limit_threads(1) == one
    assert [os.environ[name] for name in _VARIABLES] == ["1", "1", "false"]
    monkeypatch.setenv("RAYON_NUM_THREADS", "3")  # the user's (or an earlier run's) value stays
    monkeypatch.delenv("TOKENIZERS_PARALLELISM")
    assert limit_threads(1) == {"TOKENIZERS_PARALLELISM": "false"}
    assert [os.environ[name] for name in _VARIABLES] == ["3", "1", "false"]


def _files(summary: dict[str, Any]) -> list[bytes]:
    return [Path(f).read_bytes() for output in summary["outputs"].values() for f in output["files"]]


def test_each_worker_of_a_pool_is_limited_and_the_output_is_unchanged(
    tmp_path: Path, tokenizer_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in _VARIABLES:  # the workers inherit this process's environment
        monkeypatch.delenv(name, raising=False)
    source = tmp_path / "a.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in sample_texts(1500)), encoding="utf-8")
    single = tokformats.tokenize(source, tokenizer_path, tmp_path / "one", "megatron", progress=False)
    with ProcessPoolExecutor(2) as pool:
        threads = engine_threads(pool)
        summary = tokformats.tokenize(source, tokenizer_path, tmp_path / "p", "megatron", progress=False,
                                      executor=pool, partitions=6)  # fmt: skip
        seen = {pool.submit(_threads_here).result() for _ in range(8)}
    assert _files(summary) == _files(single)
    cores = len(os.sched_getaffinity(0))
    assert threads == (max(1, cores // 2) if max(1, cores // 2) < cores else None)
    if threads is None:  # a one-core machine: the engines' default
        assert seen == {(None, None, None)}
    else:
        assert seen == {(str(threads), str(threads), "false" if threads == 1 else None)}
    assert all(name not in os.environ for name in _VARIABLES)  # the parent's own environment is untouched


def _threads_here() -> tuple[str | None, ...]:
    return tuple(os.environ.get(name) for name in _VARIABLES)
