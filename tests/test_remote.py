"""Datasets by URL, offline on this machine: an HTTP server on 127.0.0.1 with injected faults, and moto's S3.

Every download goes through the cache: complete and verified files only, resumed after a cut or a kill, one download
per file across processes, eviction of what no reader holds, offline mode, publishing in a safe order.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tokformats
from tokformats.remote import Cache, ChecksumError, NotFoundError, RemoteError, publish
from tokformats.testing import random_corpus

from .http_server import FileServer

pytestmark = pytest.mark.usefixtures("quick_retries")  # retries back off a few milliseconds here




def _genesis(folder: Path, shards: int = 6, per_shard: int = 5000) -> np.ndarray:
    flat = np.random.default_rng(3).integers(1, 60_000, shards * per_shard)
    lengths = np.array([len(flat)])
    with tokformats.create(folder, "pt", tokens_per_shard=per_shard, final_shard=False) as writer:
        writer.write_batch(flat, lengths)
    return flat


def _tokens(reader: Any) -> np.ndarray:
    return np.asarray(reader.tokens)


def test_publish_then_open_a_genesis_folder(tmp_path: Path, server: FileServer) -> None:
    flat = _genesis(tmp_path / "shards")
    summary = publish(tmp_path / "shards", f"{server.url}/genesis/")
    assert summary["uploaded"][-3:] == ["SHA256SUMS", "checkpoints.json", "manifest.json"]  # the index last
    assert server.puts[-1] == "/genesis/manifest.json"
    again = publish(tmp_path / "shards", f"{server.url}/genesis/")
    assert again["uploaded"] == [] and len(again["skipped"]) == len(summary["uploaded"])
    with tokformats.open(f"{server.url}/genesis/", cache_dir=tmp_path / "cache") as reader:
        assert reader.format == "pt" and reader.num_shards == 6
        np.testing.assert_array_equal(_tokens(reader), flat)
    gets = dict(server.gets)
    with tokformats.open(f"{server.url}/genesis/", cache_dir=tmp_path / "cache") as reader:  # from the cache
        np.testing.assert_array_equal(_tokens(reader), flat)
    assert {k: v for k, v in server.gets.items() if k.endswith(".pt")} == {
        k: v for k, v in gets.items() if k.endswith(".pt")
    }


def test_dry_run_uploads_nothing(tmp_path: Path, server: FileServer) -> None:
    _genesis(tmp_path / "shards", shards=2)
    summary = publish(tmp_path / "shards", f"{server.url}/g/", dry_run=True)
    assert summary["dry_run"] and "manifest.json" in summary["uploaded"] and server.puts == []


def test_megatron_prefix_llmc_file_and_datatrove_file_by_url(tmp_path: Path, server: FileServer) -> None:
    flat, lengths = random_corpus(np.random.default_rng(4), 50, low=1, high=900)
    root = Path(server.root)
    with tokformats.create(root / "mega" / "corpus", "megatron", vocab_size=1000) as writer:
        writer.write_batch(flat, lengths)
    with tokformats.create(root / "llmc" / "c", "llmc", vocab_size=1000, bos=0) as writer:
        writer.write_batch(flat, lengths)
    with tokformats.create(root / "dt" / "c.ds", "datatrove", vocab_size=1000) as writer:
        writer.write_batch(flat, lengths)
    cache = tmp_path / "cache"
    with tokformats.open(f"{server.url}/mega/corpus", cache_dir=cache) as reader:
        assert reader.format == "megatron" and reader.lengths.tolist() == lengths.tolist()
    with tokformats.open(f"{server.url}/llmc/c_000000.bin", cache_dir=cache) as reader:
        assert reader.format == "llmc" and reader.num_tokens == len(flat) + len(lengths)
    with tokformats.open(f"{server.url}/dt/c.ds", cache_dir=cache) as reader:
        assert reader.format == "datatrove" and reader.lengths.tolist() == lengths.tolist()
        assert reader.loss is None  # the .ds.loss companion was only a guess: the store has none
        assert "/dt/c.ds" not in server.gets  # the .ds arrives on first read
        np.testing.assert_array_equal(reader[1], flat[lengths[0] : lengths[0] + lengths[1]])
    with pytest.raises(NotFoundError, match="does not exist"):
        tokformats.open(f"{server.url}/mega/nothing", cache_dir=cache)


def test_cut_connection_resumes_with_range(tmp_path: Path, server: FileServer) -> None:
    flat = _genesis(tmp_path / "shards", shards=2, per_shard=200_000)
    publish(tmp_path / "shards", f"{server.url}/g/")
    server.fault("/g/shard_0.pt", "cut", 300_000)
    server.fault("/g/shard_1.pt", "cut", 1000)
    with tokformats.open(f"{server.url}/g/", cache_dir=tmp_path / "cache") as reader:
        np.testing.assert_array_equal(_tokens(reader), flat)
    assert ("/g/shard_0.pt", "bytes=300000-") in server.ranges
    assert server.gets["/g/shard_0.pt"] == 2


def test_range_ignored_restarts_and_a_changed_file_restarts(tmp_path: Path, server: FileServer) -> None:
    flat = _genesis(tmp_path / "shards", shards=1, per_shard=100_000)
    publish(tmp_path / "shards", f"{server.url}/g/")
    server.fault("/g/shard_0.pt", "cut", 5000)
    server.fault("/g/shard_0.pt", "ignore-range")  # the resumed request gets the whole file (200)
    with tokformats.open(f"{server.url}/g/", cache_dir=tmp_path / "cache") as reader:
        np.testing.assert_array_equal(_tokens(reader), flat)
    assert server.gets["/g/shard_0.pt"] == 2  # the whole object answering the resume is kept, not asked again
    assert ("/g/shard_0.pt", "bytes=5000-") in server.ranges

    # A file that changes between attempts: the resume's If-Range no longer matches, the whole new file comes back.
    served = Path(server.root) / "loose" / "file.bin"
    served.parent.mkdir()
    served.write_bytes(bytes(range(256)) * 400)
    for _ in range(6):  # every attempt of the first fetch is cut: it fails and leaves a partial download
        server.fault("/loose/file.bin", "cut", 4000)
    with pytest.raises(RemoteError, match=r"file\.bin"):
        tokformats.remote.fetch(f"{server.url}/loose/file.bin", cache_dir=tmp_path / "loose")
    assert list((tmp_path / "loose").rglob("file.bin.partial"))
    changed = bytes(reversed(range(256))) * 400
    served.write_bytes(changed)
    os.utime(served, ns=(1, 1))  # another version (the server's ETag follows size and time)
    server.faults.clear()
    dataset = tokformats.remote.fetch(f"{server.url}/loose/file.bin", cache_dir=tmp_path / "loose")
    assert Path(dataset.target).read_bytes() == changed


def test_corrupted_byte_is_never_used(tmp_path: Path, server: FileServer) -> None:
    flat = _genesis(tmp_path / "shards", shards=2)
    publish(tmp_path / "shards", f"{server.url}/g/")
    for _ in range(8):  # every retry gets a corrupted body
        server.fault("/g/shard_1.pt", "corrupt")
    with pytest.raises(ChecksumError, match=r"shard_1\.pt: its SHA-256 is .* the published one is"):
        _tokens(tokformats.open(f"{server.url}/g/", cache_dir=tmp_path / "cache"))  # shards arrive on first use
    cached = [p for p in (tmp_path / "cache").rglob("shard_1.pt*") if ".tokformats-locks" not in p.parts]
    assert cached == [], "a download that fails verification is deleted"
    server.faults.clear()
    with tokformats.open(f"{server.url}/g/", cache_dir=tmp_path / "cache") as reader:
        np.testing.assert_array_equal(_tokens(reader), flat)


def test_a_republished_file_that_disagrees_with_the_manifest_is_refused(tmp_path: Path, server: FileServer) -> None:
    _genesis(tmp_path / "shards", shards=2)
    publish(tmp_path / "shards", f"{server.url}/g/")
    shard = Path(server.root) / "g" / "shard_1.pt"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    (Path(server.root) / "g" / "SHA256SUMS").unlink()
    with pytest.raises(ChecksumError, match="the published one is"):
        _tokens(tokformats.open(f"{server.url}/g/", cache_dir=tmp_path / "cache"))


def test_errors_name_the_url_and_the_manifest(tmp_path: Path, server: FileServer) -> None:
    _genesis(tmp_path / "shards", shards=2)
    publish(tmp_path / "shards", f"{server.url}/g/")
    (Path(server.root) / "g" / "shard_1.pt").unlink()
    with pytest.raises(NotFoundError, match=r"shard_1\.pt does not exist \(HTTP 404\)\. It is listed by manifest"):
        _tokens(tokformats.open(f"{server.url}/g/", cache_dir=tmp_path / "cache"))
    with pytest.raises(NotFoundError, match=r"shard_1\.pt does not exist \(HTTP 404\)\. It is listed by manifest"):
        tokformats.remote.fetch(f"{server.url}/g/", cache_dir=tmp_path / "eager")  # fetch() is eager
    server.fault("/g/shard_0.pt", "status", 500)
    server.fault("/g/shard_0.pt", "status", 503)
    server.fault("/g/shard_0.pt", "slow", 0.3)
    dataset = tokformats.remote.fetch(f"{server.url}/g/shard_0.pt", cache_dir=tmp_path / "c2")
    assert dataset.files == ["shard_0.pt"]
    for _ in range(10):
        server.fault("/g/manifest.json", "status", 500)
    with pytest.raises(RemoteError, match=r"manifest\.json .*HTTP 500"):
        tokformats.remote.fetch(f"{server.url}/g/manifest.json", cache_dir=tmp_path / "c3")


def test_offline_uses_only_the_cache(tmp_path: Path, server: FileServer, monkeypatch: pytest.MonkeyPatch) -> None:
    flat = _genesis(tmp_path / "shards", shards=2)
    publish(tmp_path / "shards", f"{server.url}/g/")
    url = f"{server.url}/g/"
    with tokformats.open(url, cache_dir=tmp_path / "cache") as reader:
        _tokens(reader)  # the shards arrive on first use
    server.stop()
    monkeypatch.setenv("TOKFORMATS_OFFLINE", "1")
    with tokformats.open(url, cache_dir=tmp_path / "cache") as reader:
        np.testing.assert_array_equal(_tokens(reader), flat)
    with pytest.raises(RemoteError, match="offline mode is on"):
        tokformats.open(f"{server.url}/other/x.bin", cache_dir=tmp_path / "cache")


def test_eviction_spares_files_an_open_reader_holds(tmp_path: Path, server: FileServer) -> None:
    _genesis(tmp_path / "a", shards=2, per_shard=50_000)
    _genesis(tmp_path / "b", shards=2, per_shard=50_000)
    publish(tmp_path / "a", f"{server.url}/a/")
    publish(tmp_path / "b", f"{server.url}/b/")
    cache = tmp_path / "cache"
    limit = 600_000  # room for one dataset (each shard is ~400 KB)
    first = tokformats.open(f"{server.url}/a/", cache_dir=cache, max_cache_bytes=limit)
    _tokens(first)
    with tokformats.open(f"{server.url}/b/", cache_dir=cache, max_cache_bytes=limit) as second:
        np.testing.assert_array_equal(_tokens(second), _tokens(first))
        assert len(list(cache.rglob("shard_*.pt"))) == 4  # over the limit, but every file is held
    first.close()
    Cache(f"{server.url}/a", cache_dir=cache, max_cache_bytes=limit).evict()
    assert sum(p.stat().st_size for p in cache.rglob("*") if p.is_file() and ".tokformats" not in str(p)) <= limit


def _open_in_child(url: str, cache: str, ready: Any) -> None:
    ready.wait(10)
    with tokformats.open(url, cache_dir=cache) as reader:
        np.asarray(reader.tokens)


def test_four_processes_download_each_file_once(tmp_path: Path, server: FileServer) -> None:
    _genesis(tmp_path / "shards", shards=3, per_shard=100_000)
    publish(tmp_path / "shards", f"{server.url}/g/")
    for name in ("shard_0.pt", "shard_1.pt", "shard_2.pt"):
        server.fault(f"/g/{name}", "slow", 0.3)  # long enough for the others to find the download under way
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    children = [
        context.Process(target=_open_in_child, args=(f"{server.url}/g/", str(tmp_path / "cache"), ready))
        for _ in range(4)
    ]
    for child in children:
        child.start()
    ready.set()
    for child in children:
        child.join(60)
        assert child.exitcode == 0
    assert {k: v for k, v in server.gets.items() if k.endswith(".pt")} == {
        "/g/shard_0.pt": 1,
        "/g/shard_1.pt": 1,
        "/g/shard_2.pt": 1,
    }


def _download_forever(url: str, cache: str) -> None:
    tokformats.remote.fetch(url, cache_dir=cache)


def test_killed_download_resumes_and_verifies(tmp_path: Path, server: FileServer) -> None:
    flat = _genesis(tmp_path / "shards", shards=1, per_shard=400_000)
    publish(tmp_path / "shards", f"{server.url}/g/")
    server.fault("/g/shard_0.pt", "throttle", 0.05)
    context = multiprocessing.get_context("spawn")
    child = context.Process(target=_download_forever, args=(f"{server.url}/g/", str(tmp_path / "cache")))
    child.start()
    deadline = time.monotonic() + 30
    partial: list[Path] = []
    while time.monotonic() < deadline:
        partial = [p for p in (tmp_path / "cache").rglob("shard_0.pt.partial") if p.stat().st_size > 200_000]
        if partial:
            break
        time.sleep(0.02)
    assert partial, "the download never started"
    os.kill(child.pid, signal.SIGKILL)
    child.join(10)
    kept = partial[0].stat().st_size
    with tokformats.open(f"{server.url}/g/", cache_dir=tmp_path / "cache") as reader:
        np.testing.assert_array_equal(_tokens(reader), flat)
    assert any(path == "/g/shard_0.pt" and int(r.split("=")[1].rstrip("-")) >= kept - (1 << 16)
               for path, r in server.ranges)  # fmt: skip


def test_neuroshard_cache_files_are_verified_before_use(tmp_path: Path, server: FileServer) -> None:
    flat = _genesis(tmp_path / "shards", shards=3)
    publish(tmp_path / "shards", f"{server.url}/genesis/")
    node_cache = tmp_path / "data_cache"  # ~/.neuroshard/data_cache
    node_cache.mkdir()
    (node_cache / "genesis_shard_0.pt").write_bytes((tmp_path / "shards" / "shard_0.pt").read_bytes())
    broken = bytearray((tmp_path / "shards" / "shard_1.pt").read_bytes())
    (node_cache / "genesis_shard_1.pt").write_bytes(bytes(broken[: len(broken) // 2]))  # an interrupted download
    with tokformats.open(f"{server.url}/genesis/", cache_dir=node_cache) as reader:
        np.testing.assert_array_equal(_tokens(reader), flat)
    assert server.gets.get("/genesis/shard_0.pt", 0) == 0  # adopted: it verified
    assert server.gets["/genesis/shard_1.pt"] == 1  # truncated: downloaded again


def test_open_fetches_a_shard_on_first_use_and_prefetches_ahead(tmp_path: Path, server: FileServer) -> None:
    flat = _genesis(tmp_path / "shards", shards=6, per_shard=3000)
    publish(tmp_path / "shards", f"{server.url}/genesis/")
    with tokformats.open(f"{server.url}/genesis/", cache_dir=tmp_path / "cache") as reader:
        assert reader.num_tokens == len(flat) and len(reader) == 6  # from the manifest: no shard downloaded
        assert not [k for k in server.gets if k.endswith(".pt")]
        np.testing.assert_array_equal(reader[0], flat[:3000])
        np.testing.assert_array_equal(reader[3], flat[9000:12000])
        assert sorted(k for k in server.gets if k.endswith(".pt")) == ["/genesis/shard_0.pt", "/genesis/shard_3.pt"]
        thread = reader.prefetch(2)
        assert thread is not None
        thread.join(30)
        assert "/genesis/shard_4.pt" in server.gets and "/genesis/shard_5.pt" in server.gets
        np.testing.assert_array_equal(_tokens(reader), flat)
    assert all(v == 1 for k, v in server.gets.items() if k.endswith(".pt"))


def _sharded(fmt: str, folder: Path, mean_length: int = 30) -> list[np.ndarray]:
    """A corpus of ``fmt`` in three or more data files, and its documents."""
    _, lengths = random_corpus(np.random.default_rng(11), 300, low=1, high=50_000, mean_length=mean_length)
    lengths[[0, -1]] += 5  # the first and last documents have tokens (reading them fetches their file)
    if fmt == "litdata":
        lengths[lengths == 0] = 1  # litdata's own writer mishandles empty documents (see the litdata tests)
    flat = np.random.default_rng(12).integers(1, 50_000, int(lengths.sum()))
    documents = np.split(flat, np.cumsum(lengths)[:-1])
    if fmt == "datatrove":  # one file per rank, as datatrove's tokenizer writes them
        for rank, part in enumerate(np.array_split(np.arange(len(documents)), 3)):
            with tokformats.create(folder / f"{rank:05d}_unshuffled.ds", fmt, vocab_size=50_001) as writer:
                for k in part:
                    writer.write(documents[k])
        return documents
    options = {
        "dolma": {"max_tokens": len(flat) // 4},
        "litdata": {"chunk_size": len(flat) // 4},
        "timemoe": {"max_shard_elements": len(flat) // 4},
    }[fmt]
    with tokformats.create(folder, fmt, vocab_size=50_001, **options) as writer:
        writer.write_batch(flat, lengths)
    return documents


_DATA_SUFFIX = {"datatrove": ".ds", "dolma": ".npy", "litdata": ".bin", "timemoe": ".bin"}


@pytest.mark.parametrize("fmt", sorted(_DATA_SUFFIX))
def test_a_killed_fetch_of_each_sharded_format_resumes(tmp_path: Path, server: FileServer, fmt: str) -> None:
    """The kill suite over every format's remote hooks: a fetch killed in the middle of a data file (the files its
    index or companions name) resumes that file by range, and the dataset reads whole."""
    documents = _sharded(fmt, tmp_path / "local", mean_length=3000)
    publish(tmp_path / "local", f"{server.url}/k/")
    victim = sorted(p.name for p in (tmp_path / "local").iterdir() if p.name.endswith(_DATA_SUFFIX[fmt]))[0]
    server.fault(f"/k/{victim}", "throttle", 0.05)
    child = multiprocessing.get_context("spawn").Process(
        target=_download_forever, args=(f"{server.url}/k/", str(tmp_path / "cache"))
    )
    child.start()
    deadline = time.monotonic() + 30
    partial: list[Path] = []
    while time.monotonic() < deadline and not partial:
        partial = [p for p in (tmp_path / "cache").rglob(f"{victim}.partial") if p.stat().st_size >= 1 << 16]
        time.sleep(0.02)
    assert partial, "the download never started"
    os.kill(child.pid, signal.SIGKILL)
    child.join(10)
    with tokformats.open(f"{server.url}/k/", cache_dir=tmp_path / "cache") as reader:
        assert len(reader) == len(documents)
        for k in (0, len(documents) // 2, len(documents) - 1):
            np.testing.assert_array_equal(reader[k], documents[k])
        reader.verify()
    assert any(path == f"/k/{victim}" for path, _ in server.ranges)  # resumed, not downloaded again


@pytest.mark.parametrize("fmt", sorted(_DATA_SUFFIX))
def test_sharded_formats_fetch_a_data_file_on_first_use(tmp_path: Path, server: FileServer, fmt: str) -> None:
    documents = _sharded(fmt, tmp_path / "local")
    local = tokformats.open(tmp_path / "local")
    data_files = [p.relative_to(tmp_path / "local").as_posix() for p in local.files
                  if p.name.endswith(_DATA_SUFFIX[fmt])]  # fmt: skip
    assert len(data_files) >= 3 and len(local.tokens.parts) == len(data_files)
    publish(tmp_path / "local", f"{server.url}/d/")

    def files_of(document: int) -> set[str]:
        """The data files document ``document``'s tokens lie in (a Time-MoE sequence may span two)."""
        start, stop = local.offsets[document], local.offsets[document + 1]
        first, last = np.searchsorted(local.tokens.starts, [start, stop - 1], side="right") - 1
        return set(data_files[first : last + 1])

    def data_gets() -> set[str]:
        return {k[len("/d/") :] for k in server.gets if k.endswith(_DATA_SUFFIX[fmt])}

    with tokformats.open(f"{server.url}/d/", cache_dir=tmp_path / "cache") as reader:
        assert reader.format == fmt and len(reader) == len(documents)  # from the index files alone
        assert reader.num_tokens == sum(len(d) for d in documents) and data_gets() == set()
        np.testing.assert_array_equal(reader[-1], documents[-1])
        assert data_gets() == files_of(len(documents) - 1)  # the last file(s) only
        np.testing.assert_array_equal(reader[0], documents[0])
        assert data_gets() == files_of(0) | files_of(len(documents) - 1)
        thread = reader.prefetch(1)  # the file after the one read last
        assert thread is not None
        thread.join(30)
        assert data_gets() == {data_files[0], data_files[1]} | files_of(len(documents) - 1)
        for got, want in zip(reader, documents):
            np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(reader.lengths, [len(d) for d in documents])
    assert all(v == 1 for k, v in server.gets.items() if k.endswith(_DATA_SUFFIX[fmt]))
    with tokformats.open(f"{server.url}/d/", cache_dir=tmp_path / "cache", offline=True) as again:
        np.testing.assert_array_equal(np.asarray(again.tokens), np.concatenate(documents))  # the cache alone


def test_a_megatron_prefix_by_url_fetches_the_bin_on_first_read(tmp_path: Path, server: FileServer) -> None:
    from tokformats import training

    flat, lengths = random_corpus(np.random.default_rng(5), 200, low=0, high=50_000)
    with tokformats.create(tmp_path / "m" / "owt_text_document", "megatron", vocab_size=50_001) as writer:
        writer.write_batch(flat, lengths)
    local = tokformats.open(tmp_path / "m" / "owt_text_document")
    publish(tmp_path / "m", f"{server.url}/m/")
    with tokformats.open(f"{server.url}/m/owt_text_document", cache_dir=tmp_path / "cache") as reader:
        assert reader.format == "megatron" and len(reader) == len(local)
        np.testing.assert_array_equal(reader.lengths, local.lengths)
        samples = training.GPTSamples(reader, 32, cache_dir=tmp_path / "index")  # from the .idx alone
        assert "/m/owt_text_document.bin" not in server.gets
        expected = training.GPTSamples(local, 32, cache_dir=tmp_path / "index-local")
        np.testing.assert_array_equal(samples[3], expected[3])
        assert server.gets["/m/owt_text_document.bin"] == 1
        np.testing.assert_array_equal(np.asarray(reader.tokens), np.asarray(local.tokens))


def test_llmc_shards_by_url_read_headers_by_range_and_fetch_the_shards_tokens_touch(
    tmp_path: Path, server: FileServer
) -> None:
    corpus, lengths = random_corpus(np.random.default_rng(9), 120, low=1, high=900)
    with tokformats.create(tmp_path / "llmc" / "c", "llmc", vocab_size=1000, bos=0, split="train",
                           shard_size=800) as writer:  # fmt: skip
        writer.write_batch(corpus, lengths)
    local = tokformats.open(str(tmp_path / "llmc" / "c_train_*.bin"))
    assert local.num_shards >= 3
    publish(tmp_path / "llmc", f"{server.url}/llmc/")
    for url in (f"{server.url}/llmc/", f"{server.url}/llmc/c_train_*.bin"):
        server.gets.clear()
        cache = tmp_path / ("cache" + str(len(url)))
        with tokformats.open(url, cache_dir=cache, bos=0) as reader:
            assert reader.format == "llmc" and reader.num_tokens == local.num_tokens  # from the headers alone
            assert not list(cache.rglob("*.bin"))
            assert all(ranged == "bytes=0-1023" for _, ranged in server.ranges[-local.num_shards :])
            np.testing.assert_array_equal(np.asarray(reader.tokens[-5:]), np.asarray(local.tokens[-5:]))
            assert [p.name for p in cache.rglob("*.bin")] == [local.files[-1].name]  # the last shard only
            assert len(reader) == len(local)  # documents: found by scanning every shard
            np.testing.assert_array_equal(reader[7], local[7])


def test_a_raw_stream_named_like_llmc_shards_is_detected_after_fetching(tmp_path: Path, server: FileServer) -> None:
    served = Path(server.root) / "raw"
    served.mkdir()
    np.arange(5000, dtype="<u2").tofile(served / "tokens_000001.bin")  # no llm.c header
    with pytest.raises(tokformats.UnknownFormatError):  # what a local file gives, not an llm.c header error
        tokformats.open(f"{server.url}/raw/tokens_000001.bin", cache_dir=tmp_path / "cache")
    url = f"{server.url}/raw/tokens_000001.bin"
    with tokformats.open(url, cache_dir=tmp_path / "cache", format="raw", dtype="uint16") as reader:
        assert reader.num_tokens == 5000


def test_a_lazy_reader_streams_through_a_dataset_larger_than_the_cache(tmp_path: Path, server: FileServer) -> None:
    documents = _sharded("dolma", tmp_path / "local")
    publish(tmp_path / "local", f"{server.url}/d/")
    sizes = sorted(p.stat().st_size for p in (tmp_path / "local").glob("*.npy"))
    limit = 2 * sizes[-1] + 1024  # room for the two newest files a reader always holds
    assert sum(sizes) > limit  # the dataset does not fit
    cache = tmp_path / "cache"

    def cached_data() -> int:
        return sum(p.stat().st_size for p in cache.rglob("*.npy"))

    with tokformats.open(f"{server.url}/d/", cache_dir=cache, max_cache_bytes=limit, dtype="uint16") as reader:
        most = 0
        for k, want in enumerate(documents):
            np.testing.assert_array_equal(reader[k], want)
            most = max(most, cached_data())
        assert most <= limit  # never more than the cache may hold, though the reader read every file
        gets = sum(n for k, n in server.gets.items() if k.endswith(".npy"))
        np.testing.assert_array_equal(reader[0], documents[0])  # released and evicted: fetched again
        assert sum(n for k, n in server.gets.items() if k.endswith(".npy")) == gets + 1


def test_a_lazy_reader_pickles_and_feeds_megatron_samples(tmp_path: Path, server: FileServer) -> None:
    import pickle

    from tokformats import training

    documents = _sharded("datatrove", tmp_path / "local")
    local = training.GPTSamples(tokformats.open(tmp_path / "local"), 64, cache_dir=tmp_path / "index-local")
    publish(tmp_path / "local", f"{server.url}/d/")
    with tokformats.open(f"{server.url}/d/", cache_dir=tmp_path / "cache") as reader:
        copy = pickle.loads(pickle.dumps(reader))  # a DataLoader worker's reader: the same files, fetched lazily
        assert len(copy) == len(documents)
        samples = training.GPTSamples(copy, 64, cache_dir=tmp_path / "index")  # its index from .ds.index alone
        assert not [k for k in server.gets if k.endswith(".ds")]
        for k in (0, len(samples) - 1):
            np.testing.assert_array_equal(samples[k], local[k])
        copy.close()


def test_a_lazy_reader_used_again_after_close_and_eviction(tmp_path: Path, server: FileServer) -> None:
    documents = _sharded("datatrove", tmp_path / "local")
    publish(tmp_path / "local", f"{server.url}/d/")
    reader = tokformats.open(f"{server.url}/d/", cache_dir=tmp_path / "cache")
    np.testing.assert_array_equal(reader[0], documents[0])
    reader.close()  # nothing held now: eviction may take every file, index files included
    Cache(f"{server.url}/d", cache_dir=tmp_path / "cache", max_cache_bytes=1).evict()
    assert not [p for p in (tmp_path / "cache").rglob("*.ds*") if ".tokformats-locks" not in p.parts]
    np.testing.assert_array_equal(reader[-1], documents[-1])  # the index files and that file come back
    reader.close()

    flat, lengths = random_corpus(np.random.default_rng(5), 50, low=0, high=900)
    with tokformats.create(tmp_path / "m" / "corpus", "megatron", vocab_size=1000) as writer:
        writer.write_batch(flat, lengths)
    publish(tmp_path / "m", f"{server.url}/m/")
    reader = tokformats.open(f"{server.url}/m/corpus", cache_dir=tmp_path / "cache")
    reader.close()  # its .idx map is dropped; eviction takes the .idx
    Cache(f"{server.url}/m", cache_dir=tmp_path / "cache", max_cache_bytes=1).evict()
    assert reader.lengths.tolist() == lengths.tolist()  # the .idx is mapped again: fetched (and verified) first
    reader.close()


def test_convert_from_a_url(tmp_path: Path, server: FileServer) -> None:
    documents = _sharded("litdata", tmp_path / "local")
    publish(tmp_path / "local", f"{server.url}/d/")
    tokformats.convert(f"{server.url}/d/", tmp_path / "out" / "corpus", "megatron",
                       source_options={"cache_dir": tmp_path / "cache"})  # fmt: skip
    converted = tokformats.open(tmp_path / "out" / "corpus")
    assert len(converted) == len(documents)
    for got, want in zip(converted, documents):
        np.testing.assert_array_equal(got, want)


def test_litdata_lengths_by_url_read_chunk_headers_only(tmp_path: Path, server: FileServer) -> None:
    documents = _sharded("litdata", tmp_path / "local")
    publish(tmp_path / "local", f"{server.url}/d/")
    (Path(server.root) / "d" / "SHA256SUMS").unlink()  # index.json alone: chunk sizes, no checksums
    with tokformats.open(f"{server.url}/d/", cache_dir=tmp_path / "cache") as reader:
        np.testing.assert_array_equal(reader.lengths, [len(d) for d in documents])
        chunks = [p.name for p in reader.files]
        assert sorted(path for path, _ in server.ranges) == sorted(f"/d/{c}" for c in chunks)
        assert all(ranged.startswith("bytes=0-") for _, ranged in server.ranges)  # each chunk's header, once
        assert sum(n for k, n in server.gets.items() if k.endswith(".bin")) == len(chunks)
        assert not list((tmp_path / "cache").rglob("chunk-*.bin"))  # no chunk downloaded
        np.testing.assert_array_equal(reader[len(documents) // 2], documents[len(documents) // 2])
        assert len(list((tmp_path / "cache").rglob("chunk-*.bin"))) == 1  # that chunk arrived; its header agreed
        chunk = Path(server.root) / "d" / chunks[-1]
        data = bytearray(chunk.read_bytes())
        data[4:8] = (int.from_bytes(data[4:8], "little") + 1).to_bytes(4, "little")  # same size, another header
        chunk.write_bytes(bytes(data))
        with pytest.raises(tokformats.FormatError, match="header differs from the one read by range"):
            reader[-1]


def test_rotation_over_a_url_downloads_only_the_assigned_shards(tmp_path: Path, server: FileServer) -> None:
    from tokformats import training

    _genesis(tmp_path / "shards", shards=6, per_shard=2000)
    publish(tmp_path / "shards", f"{server.url}/genesis/")
    rotation = training.ShardRotation(
        f"{server.url}/genesis/", "node-7", 2, 16, count=2, remote={"cache_dir": tmp_path / "cache"}
    )
    batch = next(rotation)
    assert batch.shape == (2, 17)
    downloaded = sorted(k for k in server.gets if k.endswith(".pt"))
    assert downloaded == sorted(f"/genesis/shard_{s}.pt" for s in rotation.shards) and len(downloaded) == 2


def test_command_line_publish_and_info(tmp_path: Path, server: FileServer, capsys: pytest.CaptureFixture[str]) -> None:
    from tokformats.cli import main

    _genesis(tmp_path / "shards", shards=2)
    assert main(["publish", str(tmp_path / "shards"), f"{server.url}/g/", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["uploaded"][-1] == "manifest.json"
    os.environ["TOKFORMATS_CACHE"] = str(tmp_path / "cache")
    try:
        assert main(["info", f"{server.url}/g/", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["format"] == "pt"
        documents = _sharded("datatrove", tmp_path / "dt")  # a lazy folder: the commands read through the cache
        publish(tmp_path / "dt", f"{server.url}/dt/")
        assert main(["head", f"{server.url}/dt/", "-n", "1"]) == 0
        assert f"({len(documents[0])} tokens)" in capsys.readouterr().out
        assert main(["stats", f"{server.url}/dt/", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["documents"] == len(documents)
        assert main(["verify", f"{server.url}/dt/"]) == 0
        assert "ok" in capsys.readouterr().out
    finally:
        del os.environ["TOKFORMATS_CACHE"]
    # fetch: the whole dataset into a cache now (a node before training), then offline it is all there
    assert main(["fetch", f"{server.url}/dt/", "--cache-dir", str(tmp_path / "warm"), "--json"]) == 0
    fetched = json.loads(capsys.readouterr().out)
    assert {"00000_unshuffled.ds", "00002_unshuffled.ds.index"} <= set(fetched["files"]) and fetched["bytes"] > 0
    assert main(["fetch", f"{server.url}/dt/", "--cache-dir", str(tmp_path / "warm"), "--offline"]) == 0
    assert "verified in" in capsys.readouterr().out


# -- S3 through fsspec, against moto's server on 127.0.0.1 -------------------------------------------------


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    pytest.importorskip("s3fs")
    moto_server = pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    running = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    running.start()
    host, port = running.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ENDPOINT_URL_S3": endpoint,
    }.items():
        monkeypatch.setenv(key, value)
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="tokformats-test")
    import fsspec

    pytest.importorskip("s3fs").S3FileSystem.clear_instance_cache()  # a cached client keeps an earlier test's endpoint
    fsspec.filesystem("s3").invalidate_cache()
    yield endpoint
    running.stop()


def test_s3_publish_open_and_glob(tmp_path: Path, s3: str) -> None:
    flat = _genesis(tmp_path / "shards", shards=3)
    summary = publish(tmp_path / "shards", "s3://tokformats-test/genesis/")
    assert summary["uploaded"][-1] == "manifest.json"
    with tokformats.open("s3://tokformats-test/genesis/", cache_dir=tmp_path / "cache") as reader:
        np.testing.assert_array_equal(_tokens(reader), flat)
    corpus, lengths = random_corpus(np.random.default_rng(8), 60, low=1, high=900)
    with tokformats.create(tmp_path / "llmc" / "c", "llmc", vocab_size=1000, bos=0, split="train",
                           shard_size=300) as writer:  # fmt: skip
        writer.write_batch(corpus, lengths)
    publish(tmp_path / "llmc", "s3://tokformats-test/llmc/")
    with tokformats.open("s3://tokformats-test/llmc/c_train_*.bin", cache_dir=tmp_path / "cache") as reader:
        assert reader.format == "llmc" and reader.num_shards > 1
        assert reader.num_tokens == len(corpus) + len(lengths)
    # A sharded folder over S3 is lazy too: the listing names the chunks, index.json sizes them, headers by range.
    documents = _sharded("litdata", tmp_path / "litdata")
    publish(tmp_path / "litdata", "s3://tokformats-test/litdata/")
    with tokformats.open("s3://tokformats-test/litdata/", cache_dir=tmp_path / "cache") as reader:
        assert reader.format == "litdata"
        np.testing.assert_array_equal(reader.lengths, [len(d) for d in documents])
        np.testing.assert_array_equal(reader[-1], documents[-1])
        assert [p.name for p in (tmp_path / "cache").rglob("chunk-*.bin")] == [reader.files[-1].name]


def test_gs_and_hf_urls_go_through_fsspec() -> None:
    pytest.importorskip("fsspec")
    from tokformats.remote.backends import FsspecBackend, backend_for

    try:
        import gcsfs  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match=r"gs:// URLs need gcsfs: pip install gcsfs"):
            backend_for("gs://bucket/data/")
    else:
        assert isinstance(backend_for("gs://bucket/data/"), FsspecBackend)
    pytest.importorskip("huggingface_hub")
    backend = backend_for("hf://datasets/org/corpus/")
    assert isinstance(backend, FsspecBackend) and type(backend.fs).__name__ == "HfFileSystem"


def test_a_megatron_prefix_by_url_brings_its_loss_masks(tmp_path: Path, server: FileServer) -> None:
    flat, lengths = random_corpus(np.random.default_rng(6), 50, low=0, high=1000)
    mask = np.random.default_rng(7).integers(0, 2, len(flat)).astype(np.uint8)
    with tokformats.create(tmp_path / "m" / "sft_text_document", "megatron", vocab_size=1000) as writer:
        writer.write_batch(flat, lengths, mask)
    with tokformats.create(tmp_path / "p" / "plain_text_document", "megatron", vocab_size=1000) as writer:
        writer.write_batch(flat, lengths)
    publish(tmp_path / "m", f"{server.url}/m/")
    publish(tmp_path / "p", f"{server.url}/p/")
    with tokformats.open(f"{server.url}/m/sft_text_document", cache_dir=tmp_path / "cache") as reader:
        assert np.asarray(reader.loss_masks).tolist() == mask.tolist()
        assert reader.loss_mask(1).tolist() == mask[lengths[0] : lengths[0] + lengths[1]].tolist()
    with tokformats.open(f"{server.url}/p/plain_text_document", cache_dir=tmp_path / "cache") as reader:
        assert reader.loss_masks is None
