"""The training data layer without any peer: samples over every format against a transcription of Megatron's
walk, refusals, the index cache and its lock, the sampler's exactly-once and resume properties, windows, shard
rotation and Time-MoE transforms. (Equality with megatron-core itself: test_training_megatron.py.)"""

from __future__ import annotations

import json
import multiprocessing
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tokformats
from tokformats import training
from tokformats.errors import ConfigError, NoFilesError
from tokformats.testing import random_corpus
from tokformats.training import indices


def reference_samples(
    lengths: np.ndarray, stream: np.ndarray, offsets: np.ndarray, s: training.GPTSamples
) -> list[np.ndarray]:
    """Megatron's sample walk (helpers.cpp ``build_sample_idx`` then ``_query_document_sample_shuffle_indices``)
    transcribed loop for loop, over the samples' own document index."""
    seq, extra = s.sequence_length, int(s.add_extra_token)
    doc = s.document_index
    total = s.epochs * s.tokens_per_epoch
    count = (total - extra) // seq if s.drop_last_partial else int(np.ceil(np.float32(total - extra) / seq))
    rows = [(0, 0)]
    k, off = 0, 0
    while len(rows) <= count:
        remaining = seq + extra
        while remaining != 0:
            length = int(lengths[doc[k]]) - off
            remaining -= length
            if remaining <= 0:
                off += remaining + length - extra
                remaining = 0
            else:
                if k == len(doc) - 1:
                    off = int(lengths[doc[k]]) - extra
                    break
                k, off = k + 1, 0
        rows.append((k, off))
    samples = []
    for j in range(count):
        (b, bo), (e, eo) = rows[j], rows[j + 1]
        parts = []
        for p in range(b, e + 1):
            start = offsets[doc[p]] + (bo if p == b else 0)
            stop = offsets[doc[p]] + eo + extra if p == e else offsets[doc[p] + 1]
            parts.append(stream[start:stop])
        sample = np.concatenate(parts).astype(np.int64)
        samples.append(np.concatenate([sample, np.full(seq + extra - len(sample), s.pad_id, np.int64)]))
    return [samples[int(i)] for i in s.shuffle_index]


def write(tmp_path: Path, fmt: str, flat: np.ndarray, lengths: np.ndarray) -> Any:
    options: dict[str, Any] = {"vocab_size": 1000}
    if fmt == "llmc":
        options["bos"] = 0
    elif fmt == "raw":
        options = {"dtype": "uint16", "eos": 0}
    elif fmt == "pt":
        options = {"tokens_per_shard": 500, "final_shard": True, "eos": 0}
    elif fmt == "timemoe":
        options = {}
    path = tmp_path / f"data-{fmt}"
    with tokformats.create(path, format=fmt, **options) as writer:
        writer.write_batch(flat, lengths)
    open_options = {"raw": {"format": "raw", "dtype": "uint16", "eos": 0}, "pt": {"eos": 0}}.get(fmt, {})
    target = {"raw": writer.written[0], "llmc": writer.written}.get(fmt, path)
    return tokformats.open(target, **open_options)


@pytest.mark.parametrize("fmt", ["megatron", "llmc", "raw", "pt", "timemoe"])
@pytest.mark.parametrize("options", [{}, {"add_extra_token": False}, {"num_samples": 700, "split": "6,3,1"}])
def test_samples_over_every_format_follow_megatrons_walk(tmp_path: Path, fmt: str, options: dict[str, Any]) -> None:
    rng = np.random.default_rng(hash(fmt) % 1000)
    flat, lengths = random_corpus(rng, 200, low=1, high=999, mean_length=30)
    reader = write(tmp_path, fmt, flat, lengths)
    unit_lengths, unit_offsets = reader.sample_units()
    samples = training.GPTSamples(reader, 16, seed=4, **options)
    stream = np.asarray(reader.tokens[:])
    expected = reference_samples(unit_lengths, stream, unit_offsets, samples)
    assert len(samples) == len(expected) > 0
    for i in range(len(samples)):
        np.testing.assert_array_equal(samples[i], expected[i])
    assert samples.batch([0, 1]).shape == (2, 16 + samples.add_extra_token)
    # batch() gathers every part of a batch at once: equal to the walk on random picks (repeats and negative
    # positions included), in int64 and in the stored dtype where it is an integer one
    picks = np.random.default_rng(5).integers(-len(samples), len(samples), size=(20, 8))
    for pick in picks:
        wanted = np.stack([expected[i] for i in pick])
        np.testing.assert_array_equal(samples.batch(pick), wanted)
        if samples.dtype.kind not in "iu":  # float series (timemoe): int64 samples only
            continue
        stored = samples.batch(pick.tolist(), samples.dtype)
        assert stored.dtype == samples.dtype
        np.testing.assert_array_equal(stored, wanted)


@pytest.mark.parametrize("fmt", ["megatron", "llmc", "pt"])
def test_joined_spans_equal_the_spans_concatenated(tmp_path: Path, fmt: str) -> None:
    """joined_spans (one memoryview join over a one-file stream, concatenate over shards) equals concatenating
    span() of each: empty spans, spans across shard ends, and slices past the end clipped as ndarray slices clip;
    the result is a new writable array, and the reader closes after it (no buffer left exported)."""
    rng = np.random.default_rng(21)
    flat, lengths = random_corpus(rng, 120, low=1, high=999, mean_length=30)
    reader = write(tmp_path, fmt, flat, lengths)
    total = reader.num_tokens
    for _ in range(30):
        starts = rng.integers(0, total, size=int(rng.integers(1, 12))).tolist()
        stops = [min(total, start + int(length)) for start, length in zip(starts, rng.integers(0, 90, len(starts)))]
        joined = reader.joined_spans(starts, stops)
        wanted = np.concatenate([reader.span(a, b) for a, b in zip(starts, stops)])
        assert joined.dtype == reader.dtype and joined.flags.writeable
        np.testing.assert_array_equal(joined, wanted)
    np.testing.assert_array_equal(reader.joined_spans([total - 3, 5], [total + 40, 5]), reader.span(total - 3, total))
    reader.close()


def test_batches_read_in_order_come_from_span_blocks_and_equal_the_samples(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Consecutive positions read in order (what a DataLoader over GPTSamples asks for) are cut from parts found
    once per block of SPAN_BLOCK samples: equal to the samples one by one for every batch size, across blocks (a
    batch straddling two takes the general path), in int64 and the stored dtype; batches far apart find no block; a
    block holding a kept partial sample is served, padded, by the per-sample path; positions past the end raise."""
    from tokformats.training import samples as samples_module

    monkeypatch.setattr(samples_module, "SPAN_BLOCK", 16)
    rng = np.random.default_rng(11)
    lengths = rng.integers(1, 40, size=300)
    with tokformats.create(tmp_path / "m", format="megatron", vocab_size=1000) as writer:
        writer.write_batch(rng.integers(0, 1000, size=int(lengths.sum())), lengths)
    reader = tokformats.open(tmp_path / "m")
    samples = training.GPTSamples(reader, 16, seed=3)
    expected = np.stack([samples[i] for i in range(len(samples))])
    assert len(samples) > 100
    for size in (1, 3, 8, 16):
        for start in range(0, len(samples) - size + 1, size):
            wanted = expected[start : start + size]
            np.testing.assert_array_equal(samples.batch(list(range(start, start + size))), wanted)
            stored = samples.batch(np.arange(start, start + size), np.uint16)
            assert stored.dtype == np.uint16
            np.testing.assert_array_equal(stored, wanted)
    _, blocks = samples.__dict__["_span_blocks"]
    assert 1 <= len(blocks) <= 2  # a reader in order keeps its block and the one before
    assert "_span_blocks" not in pickle.loads(pickle.dumps(samples)).__dict__
    sparse = training.GPTSamples(reader, 16, seed=3)  # batches 8 x 8 positions apart or more: no block is found
    for start in (0, 65, 130):
        np.testing.assert_array_equal(sparse.batch(list(range(start, start + 8))), expected[start : start + 8])
    assert sparse.__dict__["_span_blocks"] == (130, ())
    with pytest.raises(IndexError, match="out of range"):
        samples.batch([len(samples) - 1, len(samples)])
    kept = training.GPTSamples(reader, 16, seed=3, drop_last_partial=False, pad_id=0)
    last = int(np.flatnonzero(kept.shuffle_index == len(kept) - 1)[0])  # the partial sample's position
    assert samples_module.span_block(kept, last // 16) is None
    for start in range(last // 16 * 16, min(last // 16 * 16 + 16, len(kept)), 4):  # in order: the block is asked for
        batch = list(range(start, min(start + 4, len(kept))))
        np.testing.assert_array_equal(kept.batch(batch, np.uint16), np.stack([kept[i] for i in batch]))
    assert kept.__dict__["_span_blocks"][1] == ((last // 16, None),)
    assert kept.batch([last])[0, -1] == 0 and len(kept[last]) == 16 + 1


def test_kept_partial_sample_is_padded(tmp_path: Path) -> None:
    with tokformats.create(tmp_path / "c", format="megatron", vocab_size=100) as writer:
        writer.write_batch(np.arange(1, 24), [10, 13])  # 23 tokens
    reader = tokformats.open(tmp_path / "c")
    kept = training.GPTSamples(reader, 10, drop_last_partial=False, pad_id=-7)
    dropped = training.GPTSamples(reader, 10)
    assert (len(kept), len(dropped)) == (3, 2)
    last = [kept.unshuffled(j) for j in range(3)][2]
    np.testing.assert_array_equal(last[:3], np.sort(np.concatenate([np.arange(1, 11), np.arange(11, 24)]))[20:23])
    assert (last[3:] == -7).all()


def test_refusals(tmp_path: Path) -> None:
    with tokformats.create(tmp_path / "c", format="megatron", vocab_size=100) as writer:
        writer.write_batch(np.arange(1, 101) % 90 + 1, [50, 0, 50])
    reader = tokformats.open(tmp_path / "c")
    with pytest.raises(ConfigError, match="sequence_length must be a positive"):
        training.GPTSamples(reader, 0)
    with pytest.raises(ConfigError, match="no share"):
        training.GPTSamples(reader, 8, split="1,0,0", split_name="test")
    with pytest.raises(ConfigError, match="has no tokens"):  # megatron-core loops forever here
        training.GPTSamples(reader, 8, split="1,1,1", split_name="valid", num_samples=5)
    assert len(training.GPTSamples(reader, 8, split="1,1,1", split_name="valid")) == 0
    with pytest.raises(ConfigError, match="negative"):
        indices.split_matrix("1,-1")
    with pytest.raises(ConfigError, match="split_name"):
        training.GPTSamples(reader, 8, split_name="dev")
    samples = training.GPTSamples(reader, 8)
    with pytest.raises(ConfigError, match="positive and finite"):
        training.Blend([samples, samples], weights=[1.0, -0.5], size=10)
    with tokformats.create(tmp_path / "wide", format="megatron", dtype="int32") as writer:
        writer.write_batch(np.arange(1, 101), [100])
    wide = training.GPTSamples(tokformats.open(tmp_path / "wide"), 8)
    with pytest.raises(ConfigError, match="dtype"):
        training.Blend([samples, wide], weights=[1, 1], size=5)
    other = training.GPTSamples(reader, 8, vocab_size=32000)
    with pytest.raises(ConfigError, match="vocab_size"):
        training.Blend([training.GPTSamples(reader, 8, vocab_size=50257), other], weights=[1, 1], size=5)
    with pytest.raises(ConfigError, match=r"takes [\d,]+ samples from dataset 0"):
        training.Blend([samples, samples], weights=[0.9, 0.1], size=len(samples) * 5)


def test_cache_key_covers_every_option_and_the_data(tmp_path: Path) -> None:
    with tokformats.create(tmp_path / "c", format="megatron", vocab_size=100) as writer:
        writer.write_batch(np.arange(1, 301) % 90 + 1, [100, 100, 100])
    reader = tokformats.open(tmp_path / "c")
    base = training.GPTSamples(reader, 8, cache_dir=tmp_path / "cache")
    prints = {base.fingerprint}
    for change in (
        {"add_extra_token": False},  # megatron-core's key forgets this flag ...
        {"drop_last_partial": False},  # ... and this one
        {"seed": 1},
        {"num_samples": 100},
        {"split": "2,1", "split_name": "train"},
    ):
        prints.add(training.GPTSamples(reader, 8, cache_dir=tmp_path / "cache", **change).fingerprint)
    assert len(prints) == 6
    with tokformats.create(tmp_path / "d", format="megatron", vocab_size=100) as writer:
        writer.write_batch(np.arange(1, 301) % 90 + 1, [100, 150, 50])  # same tokens, other lengths
    assert training.GPTSamples(tokformats.open(tmp_path / "d"), 8).fingerprint not in prints
    description = json.loads(next((tmp_path / "cache").glob(f"{base.fingerprint}-description.json")).read_text())
    assert description["add_extra_token"] is True and description["split_name"] == "train"
    assert not list((tmp_path / "cache").glob("*.tmp*")) and not list((tmp_path / "cache").glob(".*"))


def test_a_damaged_cache_entry_is_refused(tmp_path: Path) -> None:
    with tokformats.create(tmp_path / "c", format="megatron", vocab_size=100) as writer:
        writer.write_batch(np.arange(1, 301) % 90 + 1, [100, 100, 100])
    reader = tokformats.open(tmp_path / "c")
    base = training.GPTSamples(reader, 8, cache_dir=tmp_path / "cache")
    np.save(tmp_path / "cache" / f"{base.fingerprint}-shuffle_index.npy", np.arange(5, dtype=np.uint32) + 10**6)
    with pytest.raises(tokformats.FormatError, match="delete them to rebuild"):
        training.GPTSamples(reader, 8, cache_dir=tmp_path / "cache")


def _build_in_child(prefix: str, cache: str, log: str) -> None:
    original = training.GPTSamples._build

    def logged(self: training.GPTSamples) -> dict[str, np.ndarray]:
        with open(log, "a") as handle:
            handle.write("built\n")
        return original(self)

    training.GPTSamples._build = logged  # type: ignore[method-assign]
    training.GPTSamples(tokformats.open(prefix), 8, num_samples=50_000, cache_dir=cache)


def test_processes_starting_together_build_the_cache_once(tmp_path: Path) -> None:
    with tokformats.create(tmp_path / "c", format="megatron", vocab_size=100) as writer:
        writer.write_batch(np.arange(1, 3001) % 90 + 1, [1000, 1000, 1000])
    context = multiprocessing.get_context("spawn")
    log = tmp_path / "builds.log"
    workers = [
        context.Process(target=_build_in_child, args=(str(tmp_path / "c"), str(tmp_path / "cache"), str(log)))
        for _ in range(4)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
        assert worker.exitcode == 0
    assert log.read_text() == "built\n"
    reader = tokformats.open(tmp_path / "c")
    fresh = training.GPTSamples(reader, 8, num_samples=50_000)
    cached = training.GPTSamples(reader, 8, num_samples=50_000, cache_dir=tmp_path / "cache")
    np.testing.assert_array_equal(fresh.shuffle_index, cached.shuffle_index)


def test_samples_pickle_and_reopen(tmp_path: Path) -> None:
    with tokformats.create(tmp_path / "c", format="llmc", vocab_size=1000, bos=0) as writer:
        writer.write_batch(np.arange(1, 501) % 900 + 1, [100] * 5)
    for cache in (None, tmp_path / "cache"):
        samples = training.GPTSamples(tokformats.open(tmp_path / "c_000000.bin"), 16, cache_dir=cache)
        copy = pickle.loads(pickle.dumps(samples))
        assert copy.fingerprint == samples.fingerprint
        np.testing.assert_array_equal(copy[3], samples[3])


# -- the sampler --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("drop_last", [True, False])
def test_every_sample_once_over_ranks_and_the_same_global_order(drop_last: bool) -> None:
    total, gbs = 1003, 24
    orders = {}
    for world, mbs in ((1, 4), (2, 3), (3, 2), (6, 4)):
        if gbs % (world * mbs):
            continue
        per_rank = [list(training.BatchSampler(total, gbs, mbs, r, world, drop_last=drop_last)) for r in range(world)]
        seen = [i for batches in per_rank for batch in batches for i in batch]
        assert len(seen) == len(set(seen))
        expected = (total // gbs) * gbs if drop_last else total
        assert sorted(seen) == list(range(expected))
        # Rebuild the global order: step by step, rank by rank.
        order = []
        for step in range(max(len(b) for b in per_rank)):
            for batches in per_rank:
                order.extend(batches[step] if step < len(batches) else [])
        orders[(world, mbs)] = order
    assert len({tuple(o) for o in orders.values()}) == 1


def test_sampler_resume_continues_exactly() -> None:
    full = list(training.BatchSampler(500, 32, 4, rank=1, world_size=2, shuffle=True, seed=9))
    first = training.BatchSampler(500, 32, 4, rank=1, world_size=2, shuffle=True, seed=9)
    taken = []
    for batch in first:
        taken.append(batch)
        if len(taken) == 13:
            break
    state = json.loads(json.dumps(first.state_dict()))
    resumed = training.BatchSampler(500, 32, 4, rank=1, world_size=2, shuffle=True, seed=9)
    resumed.load_state_dict(state)
    assert taken + list(resumed) == full
    assert resumed.epoch == 1 and resumed.consumed_samples == 0
    with pytest.raises(ConfigError, match="fingerprint"):
        training.BatchSampler(501, 32, 4).load_state_dict(state)
    with pytest.raises(ConfigError, match="multiple of micro_batch_size"):
        training.BatchSampler(500, 30, 4, world_size=2)
    with pytest.raises(ConfigError, match="rank 2"):
        training.BatchSampler(500, 32, 4, rank=2, world_size=2)


# -- windows, shard rotation, time series -------------------------------------------------------------------


def test_random_windows_are_reproducible_and_in_range(tmp_path: Path) -> None:
    stream = np.arange(10_000, dtype=np.uint16)
    stream.tofile(tmp_path / "train.bin")
    reader = tokformats.open(tmp_path / "train.bin", format="raw", dtype="uint16")
    a, b = training.windows(reader, 64, seed=3), training.windows(reader, 64, seed=3)
    assert len(a) == 10_000 // 64
    np.testing.assert_array_equal(a.starts, b.starts)
    assert (a.starts >= 0).all() and (a.starts < 10_000 - 64).all()
    window = a[5]
    assert window.dtype == np.int64 and len(window) == 65
    np.testing.assert_array_equal(window, np.arange(a.starts[5], a.starts[5] + 65))
    assert not np.array_equal(training.windows(reader, 64, seed=4).starts, a.starts)
    with pytest.raises(ConfigError, match="too few"):
        training.windows(reader, 10_000)


def test_shard_rotation_follows_assignment_rotates_and_resumes(tmp_path: Path) -> None:
    from tokformats import pt

    folder = tmp_path / "shards"
    with tokformats.create(folder, "pt", tokens_per_shard=100) as writer:
        writer.write_batch(np.arange(1200) % 1000, [1200])
    shards = pt.assigned_shards("node-a", 12, 3)
    rotation = training.ShardRotation(folder, "node-a", batch_size=2, sequence_length=20, count=3)
    assert rotation.shards == shards
    seen = []
    for _ in range(5):
        batch = next(rotation)
        assert batch.shape == (2, 21)
        seen.append((rotation.current_shard, int(batch[0, 0])))
        assert batch[1, 0] == batch[0, 20]  # rows overlap by the extra token
    # 100 tokens per shard: two batches of 2 x 20 + 1 fit, then the next assigned shard.
    assert [s for s, _ in seen] == [shards[0], shards[0], shards[1], shards[1], shards[2]]
    assert seen[0][1] == shards[0] * 100 % 1000 and seen[2][1] == shards[1] * 100 % 1000
    state = json.loads(json.dumps(rotation.state_dict()))
    rest = [next(rotation) for _ in range(4)]
    again = training.ShardRotation(folder, "node-a", batch_size=2, sequence_length=20, count=3)
    again.load_state_dict(state)
    for expected in rest:
        np.testing.assert_array_equal(next(again), expected)
    turn = again.shards.index(again.current_shard)
    assert again.rotate() == again.shards[(turn + 1) % 3] and again.position == 0
    with pytest.raises(ConfigError, match="node"):
        training.ShardRotation(folder, "node-b", 2, 20, count=3).load_state_dict(state)
    (folder / f"shard_{shards[1]}.pt").unlink()
    with pytest.raises(NoFilesError, match=f"shard_{shards[1]}.pt"):
        training.ShardRotation(folder, "node-a", 2, 20, count=3)


def test_rotate_moves_to_the_next_shard_at_once(tmp_path: Path) -> None:
    folder = tmp_path / "shards"
    with tokformats.create(folder, "pt", tokens_per_shard=100) as writer:
        writer.write_batch(np.arange(500), [500])
    rotation = training.ShardRotation(folder, "n", batch_size=1, sequence_length=10, count=5)
    first = rotation.current_shard
    next(rotation)
    assert rotation.rotate() == rotation.shards[1] != first
    assert next(rotation)[0, 0] == rotation.shards[1] * 100


def test_timemoe_windows_take_a_transform(tmp_path: Path) -> None:
    from tokformats import timemoe

    with tokformats.create(tmp_path / "t", "timemoe") as writer:
        writer.write(np.arange(40, dtype=np.float32))
        writer.write(np.arange(100, 130, dtype=np.float32))
    reader = tokformats.open(tmp_path / "t")
    calls = []

    def scale(values: np.ndarray) -> np.ndarray:
        calls.append(len(values))
        return values / values.max()

    windows = timemoe.windows(reader, context_length=8, transform=scale)
    expected = [np.arange(40) / 39, np.arange(100, 130) / 129]
    for k in range(len(windows)):
        sequence, start = windows.locate(k)
        window = windows[k]
        np.testing.assert_array_equal(window["input_ids"], expected[sequence][start : start + 8].astype(np.float32))
        np.testing.assert_array_equal(window["labels"], expected[sequence][start + 1 : start + 9].astype(np.float32))
    assert calls == [40, 30]  # once per sequence while windows walk it in order
    with pytest.raises(ConfigError, match="one value per value"):
        timemoe.windows(reader, context_length=8, transform=lambda v: v[:3])[0]
