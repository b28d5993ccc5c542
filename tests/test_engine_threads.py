"""A process pool's workers size their engines' thread pools to their share of the cores: ``max(1, C // N)``
threads for N workers on C cores (``RAYON_NUM_THREADS``, read by splintr's and ``tokenizers``' rayon pools when
they start; ``FASTOKENS_BPE_THREADS``; ``TOKENIZERS_PARALLELISM=false`` at one thread), set in each worker before
its first batch, never over a value already set; other executors and a pool with a core per thread are left at
the default. The output is the same whatever the threads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import tokformats
from tokformats.tokenization import executors, pipeline
from tokformats.tokenization.engines import limit_threads, size_fastokens_pool, unset_environment
from tokformats.tokenization.executors import engine_threads, in_process_engine_threads
from tokformats.tokenization.sample_text import sample_texts

_VARIABLES = ("RAYON_NUM_THREADS", "FASTOKENS_BPE_THREADS", "TOKENIZERS_PARALLELISM")


def _unset(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset the variables for this test and restore their state after it, whatever the code under test sets
    (``delenv`` of an unset variable records nothing, so a value set later would outlive the test)."""
    for name in _VARIABLES:
        monkeypatch.setenv(name, "recorded")
        monkeypatch.delenv(name)


@pytest.mark.parametrize(
    ("cores", "workers", "threads"),
    [(2, 2, 1), (2, 1, None), (4, 2, 2), (8, 3, 2), (2, 4, 1), (1, 2, None), (1, 1, None), (16, 16, 1)],
)
def test_a_process_pool_gets_its_share_of_the_cores(
    monkeypatch: pytest.MonkeyPatch, cores: int, workers: int, threads: int | None
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    monkeypatch.setattr(executors, "_cgroup_quota", lambda: None)
    pool = ProcessPoolExecutor(workers)  # no job submitted: no process started
    try:
        assert engine_threads(pool) == threads
    finally:
        pool.shutdown()


def test_the_cores_without_an_affinity_call(monkeypatch: pytest.MonkeyPatch) -> None:
    # macOS and Windows have no sched_getaffinity: the cores are os.cpu_count()'s
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setattr(executors, "_cgroup_quota", lambda: None)
    with ProcessPoolExecutor(4) as pool:
        assert engine_threads(pool) == 2


@pytest.mark.parametrize(
    ("cpu_max", "v1", "quota"),
    [
        ("200000 100000\n", ("", ""), 2),  # cgroup v2: two cores
        ("150000 100000\n", ("", ""), 1),  # 1.5 cores: whole cores, as Rust's available_parallelism counts
        ("50000 100000\n", ("", ""), 1),  # half a core: at least one
        ("max 100000\n", ("", ""), None),  # no quota
        ("", ("400000\n", "100000\n"), 4),  # cgroup v1
        ("", ("-1\n", "100000\n"), None),  # v1, no quota
        ("", ("", ""), None),  # no cgroup file system
        ("12 0\n", ("", ""), None),  # a zero period: nonsense, no quota
        ("\x00\xff garbage", ("", ""), None),
    ],
)
def test_a_cgroup_cpu_quota_lowers_the_cores(
    monkeypatch: pytest.MonkeyPatch, cpu_max: str, v1: tuple[str, str], quota: int | None
) -> None:
    files = {executors._CPU_MAX: cpu_max, executors._CFS_QUOTA: v1[0], executors._CFS_PERIOD: v1[1]}
    monkeypatch.setattr(executors, "_small_text", files.__getitem__)
    assert executors._cgroup_quota() == quota
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(32)))  # a container on a 32-core node
    with ProcessPoolExecutor(2) as pool:
        expected = 32 // 2 if quota is None else (max(1, quota // 2) if max(1, quota // 2) < quota else None)
        assert engine_threads(pool) == expected


class _InlineExecutor(Executor):
    """Runs each job where it is submitted."""

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_result(fn(*args, **kwargs))
        return future


def test_other_executors_keep_the_engines_default() -> None:
    with ThreadPoolExecutor(2) as pool:  # its workers share this process's engines
        assert engine_threads(pool) is None
    assert engine_threads(_InlineExecutor()) is None


def test_nothing_is_set_in_the_submitting_process(monkeypatch: pytest.MonkeyPatch) -> None:
    # a process pool (or a subclass) that runs a job in the caller's own process leaves the caller's environment
    _unset(monkeypatch)
    assert limit_threads(1, os.getpid()) == {}
    assert all(name not in os.environ for name in _VARIABLES)


def test_limit_threads_sets_only_what_is_not_set(monkeypatch: pytest.MonkeyPatch) -> None:
    _unset(monkeypatch)
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
    _unset(monkeypatch)  # the workers inherit this process's environment
    source = tmp_path / "a.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in sample_texts(1500)), encoding="utf-8")
    single = tokformats.tokenize(source, tokenizer_path, tmp_path / "one", "megatron", progress=False)
    with ProcessPoolExecutor(2) as pool:
        threads = engine_threads(pool)
        summary = tokformats.tokenize(source, tokenizer_path, tmp_path / "p", "megatron", progress=False,
                                      executor=pool, partitions=6)  # fmt: skip
        # four jobs that outlast their submission: each of the two workers takes at least one
        seen = dict(future.result() for future in [pool.submit(_threads_here) for _ in range(4)])
    assert _files(summary) == _files(single)
    cores = executors._cores()
    assert threads == (max(1, cores // 2) if max(1, cores // 2) < cores else None)
    assert len(seen) == 2 and os.getpid() not in seen
    if threads is None:  # a one-core machine: the engines' default
        assert set(seen.values()) == {(None, None, None)}
    else:
        assert set(seen.values()) == {(str(threads), str(threads), "false" if threads == 1 else None)}
    assert all(name not in os.environ for name in _VARIABLES)  # the parent's own environment is untouched


def _threads_here() -> tuple[int, tuple[str | None, ...]]:
    time.sleep(0.5)
    return os.getpid(), tuple(os.environ.get(name) for name in _VARIABLES)


@pytest.mark.parametrize(("cores", "threads"), [(1, 1), (2, 1), (4, 3), (8, 7), (32, 31), (33, None), (176, None)])
def test_a_run_in_this_process_leaves_a_core_to_its_reader_and_main_thread(
    monkeypatch: pytest.MonkeyPatch, cores: int, threads: int | None
) -> None:
    # never more than fastokens' own default (one per core, at most 32): above 32 cores its default stands
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    monkeypatch.setattr(executors, "_cgroup_quota", lambda: None)
    assert in_process_engine_threads() == threads
    monkeypatch.setattr(sys, "platform", "darwin")  # its default counts performance cores only: left to it
    assert in_process_engine_threads() is None


def test_fastokens_threads_are_sized_only_before_it_is_loaded_and_never_over_the_users(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _unset(monkeypatch)
    monkeypatch.delitem(sys.modules, "fastokens", raising=False)  # not loaded: its pool cannot exist yet
    assert size_fastokens_pool(3) == {"FASTOKENS_BPE_THREADS": "3"}
    assert os.environ["FASTOKENS_BPE_THREADS"] == "3"
    unset_environment({"FASTOKENS_BPE_THREADS": "3"})
    assert "FASTOKENS_BPE_THREADS" not in os.environ
    assert size_fastokens_pool(0) == {"FASTOKENS_BPE_THREADS": "1"}  # at least the calling thread
    monkeypatch.setenv("FASTOKENS_BPE_THREADS", "5")  # the user's value counts, and is not removed
    assert size_fastokens_pool(3) == {}
    unset_environment({"FASTOKENS_BPE_THREADS": "3"})
    assert os.environ["FASTOKENS_BPE_THREADS"] == "5"
    monkeypatch.delenv("FASTOKENS_BPE_THREADS")
    monkeypatch.setitem(sys.modules, "fastokens", object())  # loaded: its pool may exist, it is left as it is
    assert size_fastokens_pool(3) == {}
    assert "FASTOKENS_BPE_THREADS" not in os.environ
    monkeypatch.delitem(sys.modules, "fastokens")
    assert size_fastokens_pool(None) == {}  # its own default asked for: nothing set
    assert "FASTOKENS_BPE_THREADS" not in os.environ


@pytest.mark.parametrize("engine", ["tokenizers", "auto"])
def test_a_run_sets_fastokens_threads_only_for_an_engine_that_may_be_fastokens_and_always_unsets_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tokenizer_path: Path, engine: str
) -> None:
    _unset(monkeypatch)
    monkeypatch.delitem(sys.modules, "fastokens", raising=False)  # as in a process that has not loaded it
    monkeypatch.setattr(pipeline, "in_process_engine_threads", lambda: 3)
    source = tmp_path / "a.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in sample_texts(50)), encoding="utf-8")
    seen: list[str | None] = []

    def failing(*args: Any, **kwargs: Any) -> Any:
        seen.append(os.environ.get("FASTOKENS_BPE_THREADS"))
        raise RuntimeError("the run fails after the variable was set")

    monkeypatch.setattr(pipeline, "_first_sample", failing)
    with pytest.raises(RuntimeError, match="the run fails"):
        tokformats.tokenize(source, tokenizer_path, tmp_path / engine, "megatron", engine=engine, progress=False)
    assert seen == [None if engine == "tokenizers" else "3"]
    assert "FASTOKENS_BPE_THREADS" not in os.environ  # removed on the way out of a failed run too


_SIZED_RUN = r"""
import json, os, sys
import tokformats
from tokformats.tokenization import engines, executors
seen = []
build = engines.FastokensEngine.__init__
def built(self, *args):
    seen.append(os.environ.get("FASTOKENS_BPE_THREADS"))
    build(self, *args)
engines.FastokensEngine.__init__ = built
summary = tokformats.tokenize(sys.argv[1], sys.argv[2], sys.argv[3], "megatron", engine="fastokens", progress=False)
workers = [t for t in os.listdir("/proc/self/task") if open(f"/proc/self/task/{t}/comm").read().startswith("fastokens")]
print(json.dumps({"seen": seen, "after": os.environ.get("FASTOKENS_BPE_THREADS"), "workers": len(workers),
                  "engine": summary["engine"], "threads": executors.in_process_engine_threads()}))
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts the process's threads in /proc")
def test_a_fresh_process_runs_fastokens_on_the_cores_but_one_and_unsets_the_variable(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    pytest.importorskip("fastokens")
    source = tmp_path / "a.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in sample_texts(1500)), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in _VARIABLES}
    env["PYTHONPATH"] = str(Path(tokformats.__file__).resolve().parents[1])
    env["TOKFORMATS_GATE_CACHE"] = "off"
    out = subprocess.run([sys.executable, "-c", _SIZED_RUN, str(source), str(tokenizer_path), str(tmp_path / "f")],
                         env=env, capture_output=True, text=True, check=True, cwd=tmp_path, timeout=300)  # fmt: skip
    found = json.loads(out.stdout)
    threads = found["threads"]
    assert found["engine"] == "fastokens" and found["seen"] and set(found["seen"]) == {str(threads)}
    assert found["workers"] == threads - 1  # its pool's threads beside the calling one: none on two cores
    assert found["after"] is None  # unset once the run's threads are done
    reference = tokformats.tokenize(source, tokenizer_path, tmp_path / "r", "megatron", engine="tokenizers",
                                    progress=False)  # fmt: skip
    for suffix in (".bin", ".idx"):
        theirs = Path(reference["outputs"]["text"]["path"] + suffix)
        assert Path(f"{tmp_path / 'f'}_text_document{suffix}").read_bytes() == theirs.read_bytes()
