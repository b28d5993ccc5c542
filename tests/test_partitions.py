"""Past one machine: large inputs cut at line starts and row groups, output byte-identical to a single-process run
whatever the partitioning (no 64-partition cap); Ray (local cluster) and dask as executors."""

from __future__ import annotations

import gzip
import json
import random
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import tokformats
from tokformats.tokenization.partitions import describe, partition_inputs
from tokformats.tokenization.sample_text import sample_texts
from tokformats.tokenization.sources import SourceError, iter_records, resolve_inputs


def _outputs(summary: dict[str, Any]) -> dict[str, bytes]:
    """Every output file's bytes, by file name."""
    return {Path(f).name: Path(f).read_bytes() for o in summary["outputs"].values() for f in o["files"]}


def _big_jsonl(path: Path, count: int = 6000) -> Path:
    rng = random.Random(7)
    texts = sample_texts(count)
    lines = []
    for k, text in enumerate(texts):
        lines.append(json.dumps({"text": text * rng.randint(1, 3)}))
        if k % 997 == 0:
            lines.append("")  # blank lines keep their numbers
    path.write_text("\n".join(lines), encoding="utf-8")  # no newline after the last record
    return path


def _run(inputs: Any, tokenizer: Path, out: Path, executor: Executor | None = None, **options: Any) -> dict[str, Any]:
    return tokformats.tokenize(inputs, tokenizer, out, "megatron", split="8:1:1", seed=3, progress=False,
                               executor=executor, **options)  # fmt: skip


def test_pieces_hold_exactly_the_files_records_at_their_positions(tmp_path: Path) -> None:
    source = _big_jsonl(tmp_path / "big.jsonl", 1500)
    text = tmp_path / "lines.txt"
    text.write_text("".join(f"line {k}\n" if k % 11 else "\n" for k in range(700)), encoding="utf-8")
    inputs = resolve_inputs([source, text])
    whole = [(r.input, r.index, r.texts) for r in iter_records(inputs)]
    for parts in (1, 2, 3, 5, 17, 64, 65, 300):
        partitions = partition_inputs(inputs, parts)
        assert len(partitions) <= parts and (parts < 3 or len(partitions) > 1)
        joined = []
        for first, group in partitions:
            joined += [(r.input + first, r.index, r.texts) for r in iter_records(group)]
        assert joined == whole, parts
    assert len(partition_inputs(inputs, 300)) > 64
    assert "big.jsonl[0:" in describe(partition_inputs(inputs, 4))[0]


def test_one_large_file_split_many_ways_is_byte_identical(tmp_path: Path, tokenizer_path: Path) -> None:
    source = _big_jsonl(tmp_path / "big.jsonl")
    single = _outputs(_run(source, tokenizer_path, tmp_path / "one"))
    assert len(single) == 6  # train/val/test x .bin/.idx
    with ThreadPoolExecutor(2) as pool:
        for parts in (2, 3, 7, 64, 129):
            summary = _run(source, tokenizer_path, tmp_path / f"p{parts}", pool, partitions=parts)
            assert {name.replace(f"p{parts}", "one"): data for name, data in _outputs(summary).items()} == single


def test_more_than_64_partitions_in_processes_is_byte_identical(tmp_path: Path, tokenizer_path: Path) -> None:
    source = _big_jsonl(tmp_path / "big.jsonl", 3000)
    single = _outputs(_run(source, tokenizer_path, tmp_path / "one"))
    with ProcessPoolExecutor(2) as pool:
        summary = _run(source, tokenizer_path, tmp_path / "many", pool, partitions=80)
    assert {name.replace("many", "one"): data for name, data in _outputs(summary).items()} == single


def test_mixed_inputs_text_lines_compressed_and_parquet_row_groups(tmp_path: Path, tokenizer_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    texts = sample_texts(2400)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("\n".join(texts[:800]), encoding="utf-8")
    with gzip.open(tmp_path / "in" / "b.jsonl.gz", "wt", encoding="utf-8") as handle:  # cannot be cut
        handle.writelines(json.dumps({"text": t}) + "\n" for t in texts[800:1200])
    pq.write_table(pa.table({"text": texts[1200:]}), tmp_path / "in" / "c.parquet", row_group_size=100)
    single = _outputs(_run(tmp_path / "in", tokenizer_path, tmp_path / "one"))
    resolved = resolve_inputs(tmp_path / "in")
    pieces = [i for _, group in partition_inputs(resolved, 9) for i in group if i.is_piece]
    assert {i.path.suffix for i in pieces if i.path} == {".txt", ".parquet"}
    with ThreadPoolExecutor(2) as pool:
        for parts in (2, 5, 9, 40):
            summary = _run(tmp_path / "in", tokenizer_path, tmp_path / f"p{parts}", pool, partitions=parts)
            assert {name.replace(f"p{parts}", "one"): data for name, data in _outputs(summary).items()} == single


def test_a_bad_record_in_a_later_piece_names_its_line_in_the_file(tmp_path: Path, tokenizer_path: Path) -> None:
    source = tmp_path / "bad.jsonl"
    lines = [json.dumps({"text": t}) for t in sample_texts(3000)]
    lines[2500] = "{not json"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with ThreadPoolExecutor(2) as pool, pytest.raises(SourceError, match=r"bad\.jsonl, line 2501: invalid JSON"):
        _run(source, tokenizer_path, tmp_path / "o", pool, partitions=6)
    with ThreadPoolExecutor(2) as pool:
        skipped = _run(source, tokenizer_path, tmp_path / "s", pool, partitions=6, on_error="skip", overwrite=True)
    assert skipped["skipped"] == 1 and "line 2501" in skipped["errors"][0]
    assert skipped["documents"] == 2999


def test_partitions_must_be_positive(tmp_path: Path, tokenizer_path: Path) -> None:
    source = _big_jsonl(tmp_path / "big.jsonl", 50)
    with ThreadPoolExecutor(1) as pool, pytest.raises(tokformats.ConfigError, match="at least 1, found 0"):
        _run(source, tokenizer_path, tmp_path / "o", pool, partitions=0)


@pytest.fixture(scope="module")
def ray_cluster() -> Any:
    ray = pytest.importorskip("ray", reason="Ray is optional: pip install 'tokformats[ray]'")
    ray.init(address="local", include_dashboard=False, num_cpus=2, _node_ip_address="127.0.0.1",
             log_to_driver=False)  # fmt: skip
    yield ray
    ray.shutdown()


def test_ray_pool_and_ray_executor_are_byte_identical(ray_cluster: Any, tmp_path: Path, tokenizer_path: Path) -> None:
    from ray.util.multiprocessing import Pool

    from tokformats.tokenization.executors import RayExecutor

    source = _big_jsonl(tmp_path / "big.jsonl", 3000)
    single = _outputs(_run(source, tokenizer_path, tmp_path / "one"))
    with Pool(2) as pool:
        pooled = _run(source, tokenizer_path, tmp_path / "pool", pool, partitions=5)  # type: ignore[arg-type]
    assert {name.replace("pool", "one"): data for name, data in _outputs(pooled).items()} == single
    with RayExecutor() as executor:
        tasks = _run(source, tokenizer_path, tmp_path / "tasks", executor, partitions=70)
    assert {name.replace("tasks", "one"): data for name, data in _outputs(tasks).items()} == single
    assert tasks["documents"] == pooled["documents"] == 3000


FORKED = r"""
import multiprocessing, sys
from concurrent.futures import ProcessPoolExecutor
import tokformats
source, tokenizer, out = sys.argv[1:4]
one = tokformats.tokenize(source, tokenizer, out + "-one", "raw", dtype="uint32", engine="splintr", progress=False)
with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork")) as pool:
    two = tokformats.tokenize(source, tokenizer, out + "-two", "raw", dtype="uint32", engine="splintr",
                              progress=False, executor=pool, partitions=4)
print(one["engine"], two["engine"])
"""


def test_splintr_in_workers_forked_after_the_parent_used_it(tmp_path: Path, tokenizer_path: Path) -> None:
    """rayon's threads do not survive a fork: the forked workers encode text by text instead of hanging."""
    import subprocess
    import sys

    pytest.importorskip("splintr")
    source = _big_jsonl(tmp_path / "big.jsonl", 4000)
    done = subprocess.run([sys.executable, "-c", FORKED, str(source), str(tokenizer_path), str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["splintr", "splintr"]
    assert (tmp_path / "o-one.bin").read_bytes() == (tmp_path / "o-two.bin").read_bytes()


def test_command_line_workers_and_partitions(tmp_path: Path, tokenizer_path: Path) -> None:
    from tokformats.cli import main

    source = _big_jsonl(tmp_path / "big.jsonl", 1500)
    single = _run(source, tokenizer_path, tmp_path / "one")
    command = ["tokenize", str(source), "-t", str(tokenizer_path), "-o", str(tmp_path / "cli"), "-f", "megatron",
               "--split", "8:1:1", "--seed", "3", "--workers", "2", "--partitions", "5", "--no-progress"]  # fmt: skip
    assert main(command) == 0
    for name, output in single["outputs"].items():
        for suffix in (".bin", ".idx"):
            mine = Path(output["path"].replace("one", "cli") + suffix)
            assert mine.read_bytes() == Path(output["path"] + suffix).read_bytes(), name


def test_a_worker_refuses_a_tokenizer_file_that_is_not_the_runs(tmp_path: Path, tokenizer_path: Path) -> None:
    import hashlib

    from tokformats.tokenization.parallel import _worker_engine

    text = tokenizer_path.read_text(encoding="utf-8")
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    copy = tmp_path / "tokenizer.json"
    copy.write_text(text.replace('"<|endoftext|>"', '"<|endoftexT|>"', 1), encoding="utf-8")  # a damaged copy
    with pytest.raises(tokformats.FormatError, match=rf"tokenizer\.json has SHA-256 [0-9a-f]{{64}}, but the run's "
                       rf"tokenizer has {digest}"):  # fmt: skip
        _worker_engine(str(copy), digest, "tokenizers")
    copy.write_text(text, encoding="utf-8")
    tokenizer, (engine, reason) = _worker_engine(str(copy), digest, "tokenizers")
    assert engine.name == "tokenizers" and reason == "asked for"
    assert _worker_engine(str(tmp_path / "gone.json"), digest, "tokenizers")[0] is tokenizer  # built once


def test_a_join_that_fails_cancels_the_partitions_not_started(
    tmp_path: Path, tokenizer_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The outputs join partition 0 while the others encode: when that join fails, the run stops waiting, the
    partitions not yet started never run, and no output appears."""
    from tokformats.tokenization import parallel

    started: list[int] = []
    job = parallel._partition_job

    def counted(args: tuple[Any, ...]) -> dict[str, Any]:
        started.append(args[4])  # the partition's ordinal
        return job(args)

    def failing(*args: Any, **kwargs: Any) -> None:
        raise OSError("the disk is full (a test)")

    monkeypatch.setattr("tokformats.tokenization.parallel._partition_job", counted)
    monkeypatch.setattr("tokformats.tokenization.outputs.join_spool", failing)
    with ThreadPoolExecutor(1) as pool, pytest.raises(OSError, match="the disk is full"):
        _run(_big_jsonl(tmp_path / "big.jsonl"), tokenizer_path, tmp_path / "o", pool, partitions=16)
    assert started[0] == 0 and len(started) <= 3  # the first, and at most the ones running when it failed
    assert not list(tmp_path.glob("o*.bin")) and not list(tmp_path.glob("o*.idx"))
