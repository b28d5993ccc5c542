"""PackedSamples and its best-fit-decreasing plan: equal to OLMo-core's InstancePacker, every token of every document
once per epoch (or reported truncated), no row crossing a document without a boundary, rows within the length,
cache, shuffle, resume, torch adapters, stored loss masks."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tokformats
from tokformats import training
from tokformats.errors import ConfigError, FormatError
from tokformats.training.packing import best_fit_decreasing


def write(tmp_path: Path, fmt: str, lengths: np.ndarray, seed: int = 0) -> tokformats.TokenReader:
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, 900, size=int(lengths.sum()))
    options: dict[str, Any] = {"vocab_size": 1000}
    if fmt == "llmc":
        options["bos"] = 0
    path = tmp_path / ("c.ds" if fmt == "datatrove" else f"c-{fmt}")
    with tokformats.create(path, format=fmt, **options) as writer:
        writer.write_batch(ids, lengths)
    return tokformats.open(writer.written if fmt == "llmc" else path)


def random_lengths(rng: np.random.Generator, count: int, top: int) -> np.ndarray:
    lengths = np.minimum(top, rng.lognormal(np.log(max(2, top // 6)), 1.0, size=count).astype(np.int64))
    lengths[rng.random(count) < 0.05] = 0  # empty documents
    return lengths


@pytest.mark.parametrize("trial", range(30))
def test_bfd_equals_olmo_core_instance_packer(trial: int) -> None:
    utils = pytest.importorskip("olmo_core.data.utils", reason="ai2-olmo-core is not installed")
    rng = np.random.default_rng(trial)
    capacity = int(rng.choice([2, 8, 32, 128, 512]))
    lengths = rng.integers(1, capacity + 1, size=int(rng.integers(0, 600)))
    if trial % 2:
        lengths = np.minimum(capacity, rng.geometric(0.05, size=len(lengths)))
    items, offsets = best_fit_decreasing(lengths, capacity)
    ours = [lengths[items[offsets[r] : offsets[r + 1]]].tolist() for r in range(len(offsets) - 1)]
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.uint64)
    bounds = np.stack([starts, starts + lengths.astype(np.uint64)], axis=1).reshape(-1, 2)
    bins, by_length, _ = utils.InstancePacker(capacity).pack_documents(bounds)
    theirs = [[int(by_length[d, 1] - by_length[d, 0]) for d in b] for b in bins]
    assert ours == theirs  # the same rows, and in each the same lengths in the same order
    assert sorted(items.tolist()) == list(range(len(lengths)))


def test_bfd_refuses_items_it_cannot_place() -> None:
    with pytest.raises(ConfigError, match=r"1\.\.8"):
        best_fit_decreasing(np.array([3, 9]), 8)
    with pytest.raises(ConfigError, match="empty"):
        best_fit_decreasing(np.array([0, 2]), 8)


def covered(p: training.PackedSamples) -> dict[int, int]:
    """How many times each stream position is in a row."""
    counts: dict[int, int] = {}
    for row in range(len(p)):
        starts, lengths = p.pieces(row)
        assert int(lengths.sum()) <= p.capacity
        for start, length in zip(starts.tolist(), lengths.tolist()):
            for position in range(start, start + length):
                counts[position] = counts.get(position, 0) + 1
    return counts


@pytest.mark.parametrize("fmt", ["megatron", "datatrove", "llmc"])
@pytest.mark.parametrize("long_documents", ["fragment", "truncate"])
@pytest.mark.parametrize("extra", [True, False])
def test_every_token_once_rows_within_length_boundaries_in_cu_seqlens(
    tmp_path: Path, fmt: str, long_documents: str, extra: bool
) -> None:
    rng = np.random.default_rng(hash((fmt, long_documents, extra)) % 1000)
    lengths = random_lengths(rng, 150, 40)
    reader = write(tmp_path, fmt, lengths)
    p = training.PackedSamples(reader, 16, seed=3, long_documents=long_documents, add_extra_token=extra, pad_id=-5)
    capacity = 16 + extra
    counts = covered(p)
    offsets = reader.offsets
    expected: set[int] = set()
    for d, n in enumerate(reader.lengths.tolist()):
        keep = n if long_documents == "fragment" else min(n, capacity)
        expected.update(range(int(offsets[d]), int(offsets[d]) + keep))
    assert set(counts) == expected and set(counts.values()) == {1}
    report = p.report()
    truncated = int(np.maximum(reader.lengths - capacity, 0).sum()) if long_documents == "truncate" else 0
    assert report["truncated_tokens"] == truncated
    assert report["tokens"] + truncated == int(reader.lengths.sum())
    assert report["empty_documents"] == int((reader.lengths == 0).sum())
    assert report["padding_tokens"] == report["rows"] * capacity - report["tokens"]
    stream = np.asarray(reader.tokens[:], dtype=np.int64)
    for i in range(len(p)):
        check_row(p, i, stream)


def check_row(p: training.PackedSamples, i: int, stream: np.ndarray) -> None:
    """The six fields of sample ``i`` against its pieces, by hand."""
    sample = p[i]
    size, extra = p.sequence_length, int(p.add_extra_token)
    starts, lengths = p.pieces(int(p.shuffle_index[i]))
    text = np.concatenate([stream[s : s + n] for s, n in zip(starts.tolist(), lengths.tolist())])
    used = len(text)
    text = np.concatenate([text, np.full(size + extra - used, p.pad_id)])
    np.testing.assert_array_equal(sample["tokens"], text[:size])
    np.testing.assert_array_equal(sample["labels"], np.append(text[1:], p.pad_id)[:size])
    document_starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    for j in range(size):
        same_document = j + 1 < used and (j + 1) not in document_starts
        assert sample["loss_mask"][j] == float(same_document), (i, j)
    cu = sample["cu_seqlens"]
    boundaries = [int(s) for s in document_starts if s < size] + ([used] if used < size else [])
    np.testing.assert_array_equal(cu[: len(boundaries)], boundaries)
    assert (cu[len(boundaries) :] == size).all() and cu.dtype == np.int32 and len(cu) == size + 1
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        np.testing.assert_array_equal(sample["position_ids"][a:b], np.arange(b - a))
    np.testing.assert_array_equal(sample["doc_lens"][: len(lengths)], lengths)
    assert not sample["doc_lens"][len(lengths) :].any()
    assert sample["tokens"].dtype == sample["labels"].dtype == sample["position_ids"].dtype == np.int64
    assert sample["loss_mask"].dtype == np.float32


def test_shuffle_is_reproducible_and_the_plan_index_only(tmp_path: Path) -> None:
    lengths = random_lengths(np.random.default_rng(1), 400, 60)
    reader = write(tmp_path, "megatron", lengths)
    a = training.PackedSamples(reader, 32, seed=1)
    b = training.PackedSamples(reader, 32, seed=1)
    c = training.PackedSamples(reader, 32, seed=2)
    np.testing.assert_array_equal(a.shuffle_index, b.shuffle_index)
    assert not np.array_equal(a.shuffle_index, c.shuffle_index)
    np.testing.assert_array_equal(a.piece_starts, c.piece_starts)  # the seed orders rows, not their contents
    for i in range(0, len(a), 17):
        np.testing.assert_array_equal(a[i]["tokens"], b[i]["tokens"])
    assert {name: getattr(a, name).dtype for name in ("piece_starts", "piece_lengths", "row_offsets")} == {
        "piece_starts": np.int64,
        "piece_lengths": np.int32,
        "row_offsets": np.int64,
    }


def test_windows_pack_each_group_of_documents_apart(tmp_path: Path) -> None:
    lengths = random_lengths(np.random.default_rng(2), 300, 50)
    reader = write(tmp_path, "megatron", lengths)
    p = training.PackedSamples(reader, 24, window=50)
    offsets = reader.offsets
    for row in range(len(p)):
        starts, _ = p.pieces(row)
        documents = np.searchsorted(offsets, starts, side="right") - 1
        assert len(set((documents // 50).tolist())) == 1  # one window per row
    assert len(covered(p)) == int(lengths.sum())
    assert p.fingerprint != training.PackedSamples(reader, 24).fingerprint


def test_cache_key_covers_every_option_and_the_data(tmp_path: Path) -> None:
    lengths = random_lengths(np.random.default_rng(3), 200, 50)
    reader = write(tmp_path, "megatron", lengths)
    cache = tmp_path / "cache"
    base = training.PackedSamples(reader, 16, cache_dir=cache)
    again = training.PackedSamples(reader, 16, cache_dir=cache)
    assert isinstance(again.piece_starts, np.memmap)
    np.testing.assert_array_equal(again.shuffle_index, base.shuffle_index)
    keys = {base.index_key}
    for change in ({"seed": 1}, {"long_documents": "truncate"}, {"add_extra_token": False}, {"window": 10}):
        keys.add(training.PackedSamples(reader, 16, cache_dir=cache, **change).index_key)  # type: ignore[arg-type]
    keys.add(training.PackedSamples(reader, 17, cache_dir=cache).index_key)
    (tmp_path / "o").mkdir()
    other = write(tmp_path / "o", "megatron", np.roll(lengths, 1))  # the same lengths in another order
    keys.add(training.PackedSamples(other, 16, cache_dir=cache).index_key)
    assert len(keys) == 7
    assert base.fingerprint != training.PackedSamples(reader, 16, pad_id=7).fingerprint
    np.save(cache / f"{base.index_key}-piece_lengths.npy", np.full(len(base.piece_lengths), 99, dtype=np.int32))
    with pytest.raises(FormatError, match="delete it to rebuild"):
        training.PackedSamples(reader, 16, cache_dir=cache)


def test_refusals(tmp_path: Path) -> None:
    reader = write(tmp_path, "megatron", np.array([3, 4, 5]))
    with pytest.raises(ConfigError, match="long_documents"):
        training.PackedSamples(reader, 4, long_documents="drop")
    with pytest.raises(ConfigError, match="policy"):
        training.PackedSamples(reader, 4, policy="ffd")
    with pytest.raises(ConfigError, match="sequence_length"):
        training.PackedSamples(reader, 0)
    with pytest.raises(ConfigError, match="window"):
        training.PackedSamples(reader, 4, window=0)


def test_resume_with_batch_sampler_and_pickling(tmp_path: Path) -> None:
    reader = write(tmp_path, "megatron", random_lengths(np.random.default_rng(4), 300, 40))
    p = training.PackedSamples(reader, 16, cache_dir=tmp_path / "cache")
    full = [[p[i]["tokens"].tolist() for i in batch] for batch in training.BatchSampler(p, 8, 4)]
    first = training.BatchSampler(p, 8, 4)
    consumed = []
    for k, batch in enumerate(first):
        consumed.append([p[i]["tokens"].tolist() for i in batch])
        if k == 4:
            break
    state = json.loads(json.dumps(first.state_dict()))
    restored = pickle.loads(pickle.dumps(p))
    assert "shuffle_index" not in p.__getstate__()  # workers map the plan from the cache
    resumed = training.BatchSampler(restored, 8, 4)
    resumed.load_state_dict(state)
    rest = [[restored[i]["tokens"].tolist() for i in batch] for batch in resumed]
    assert consumed + rest == full


def test_torch_default_collate_stacks_packed_rows(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch", reason="torch is not installed")
    tft = pytest.importorskip("tokformats.torch")
    reader = write(tmp_path, "megatron", random_lengths(np.random.default_rng(5), 200, 40))
    p = training.PackedSamples(reader, 16)
    loader = torch.utils.data.DataLoader(tft.Dataset(p), batch_size=4, num_workers=2)
    batches = list(loader)
    assert sum(len(b["tokens"]) for b in batches) == len(p)
    assert batches[0]["cu_seqlens"].shape == (4, 17) and batches[0]["cu_seqlens"].dtype == torch.int32
    np.testing.assert_array_equal(batches[1]["doc_lens"][2].numpy(), p[6]["doc_lens"])


def test_stored_loss_masks_mask_the_labels(tmp_path: Path) -> None:
    rng = np.random.default_rng(6)
    lengths = random_lengths(rng, 80, 30)
    reader = write(tmp_path, "datatrove", lengths)
    stored = (rng.random(int(lengths.sum())) < 0.6).astype(np.uint8)
    (tmp_path / "c.ds.loss").write_bytes(stored.tobytes())
    reader = tokformats.open(tmp_path / "c.ds")
    p = training.PackedSamples(reader, 12)
    (tmp_path / "x").mkdir()
    plain = training.PackedSamples(write(tmp_path / "x", "megatron", lengths), 12)  # the same rows, no stored mask
    for i in range(len(p)):
        starts, counts = p.pieces(int(p.shuffle_index[i]))
        row_mask = np.concatenate([stored[s : s + n] for s, n in zip(starts.tolist(), counts.tolist())])
        row_mask = np.concatenate([row_mask, np.zeros(13 - len(row_mask), np.uint8)])
        np.testing.assert_array_equal(p[i]["loss_mask"], plain[i]["loss_mask"] * row_mask[1:13])


def test_bos_aligned_rows_by_hand() -> None:
    from tokformats.training.packing import bos_aligned_rows

    lengths = np.array([5, 3, 9, 2, 0, 4])
    documents, pieces, rows = bos_aligned_rows(lengths, 8, 3, np.arange(6))
    # Buffer {5, 3, 9}: row 1 takes 5 (the longest <= 8), refills 2, takes 3 (the longest <= 3): full. The buffer
    # refills 4 (the empty document is skipped): {9, 2, 4}; row 2 takes 4, then 2, then nothing fits the room of 2:
    # the shortest, 9, is cropped to 2.
    assert documents.tolist() == [0, 1, 5, 3, 2]
    assert pieces.tolist() == [5, 3, 4, 2, 2]
    assert rows.tolist() == [0, 2, 5]


@pytest.mark.parametrize("buffer", [1, 7, 1000])
def test_bos_policy_rows_start_at_documents_and_are_full(tmp_path: Path, buffer: int) -> None:
    rng = np.random.default_rng(buffer)
    lengths = random_lengths(rng, 300, 60)
    reader = write(tmp_path, "megatron", lengths)
    p = training.PackedSamples(reader, 24, seed=7, policy="bos", buffer=buffer)
    offsets = reader.offsets
    seen: set[int] = set()
    for row in range(len(p)):
        starts, pieces = p.pieces(row)
        documents = np.searchsorted(offsets, starts, side="right") - 1
        np.testing.assert_array_equal(starts, offsets[documents])  # every piece starts at its document's start
        assert (pieces <= reader.lengths[documents]).all()  # a prefix: whole or cropped
        assert not seen & set(documents.tolist())  # no document twice
        seen.update(documents.tolist())
        if row < len(p) - 1:
            assert int(pieces.sum()) == 25  # no padding but in the last row
    assert seen == set(np.flatnonzero(reader.lengths > 0).tolist())  # every non-empty document is used
    report = p.report()
    assert report["truncated_tokens"] == int(lengths.sum()) - int(p.piece_lengths.sum()) > 0
    assert report["long_documents_handling"] == "crop"
    stream = np.asarray(reader.tokens[:], dtype=np.int64)
    for i in range(0, len(p), 5):
        check_row(p, i, stream)
    with pytest.raises(ConfigError, match="window"):
        training.PackedSamples(reader, 24, policy="bos", window=10)
