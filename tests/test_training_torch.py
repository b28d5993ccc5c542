"""The PyTorch adapters: DataLoader workers, ranks x workers exactly once, resume with torchdata's
StatefulDataLoader and without it. Skips without torch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tokformats
from tokformats import training

torch = pytest.importorskip("torch", reason="torch is not installed")
tft = pytest.importorskip("tokformats.torch")


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory) -> training.GPTSamples:
    folder = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 200, size=300)
    with tokformats.create(folder / "c", format="megatron", vocab_size=50257) as writer:
        writer.write_batch(rng.integers(1, 50000, size=int(lengths.sum())), lengths)
    return training.GPTSamples(tokformats.open(folder / "c"), 32, seed=1)


def rows(batches: list[Any]) -> list[tuple[int, ...]]:
    return [tuple(row) for batch in batches for row in batch.tolist()]


def test_map_style_dataset_in_two_workers(samples: training.GPTSamples) -> None:
    loader = torch.utils.data.DataLoader(tft.Dataset(samples), batch_size=8, num_workers=2, shuffle=False)
    got = rows(list(loader))
    assert got == [tuple(samples[i].tolist()) for i in range(len(samples))]
    assert next(iter(loader)).dtype == torch.int64


@pytest.mark.parametrize("workers", [0, 2, 3])
def test_ranks_times_workers_serve_every_sample_once(samples: training.GPTSamples, workers: int) -> None:
    world, seen = 2, []
    for rank in range(world):
        stream = tft.IterableDataset(samples, 8, 2, rank, world, drop_last=False)
        loader = torch.utils.data.DataLoader(stream, batch_size=None, num_workers=workers)
        ours = rows(list(loader))
        sampler = training.BatchSampler(samples, 8, 2, rank, world, drop_last=False)
        assert ours == [tuple(samples[i].tolist()) for batch in sampler for i in batch]
        seen.extend(ours)
    assert sorted(seen) == sorted(tuple(samples[i].tolist()) for i in range(len(samples)))


def test_resume_without_torchdata(samples: training.GPTSamples) -> None:
    stream = tft.IterableDataset(samples, 8, 4, rank=0, world_size=1)
    full = rows(list(torch.utils.data.DataLoader(stream, batch_size=None, num_workers=2)))
    stream = tft.IterableDataset(samples, 8, 4, rank=0, world_size=1)
    loader = torch.utils.data.DataLoader(stream, batch_size=None, num_workers=2)
    first = []
    for batch in loader:
        first.append(batch)
        if len(first) == 5:
            break
    state = stream.state_after(5)
    resumed = tft.IterableDataset(samples, 8, 4, rank=0, world_size=1)
    resumed.load_state_dict(state)
    rest = rows(list(torch.utils.data.DataLoader(resumed, batch_size=None, num_workers=2)))
    assert rows(first) + rest == full


def test_resume_with_stateful_dataloader(samples: training.GPTSamples) -> None:
    stateful = pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata is not installed")
    make = lambda: tft.IterableDataset(samples, 8, 2, rank=1, world_size=2)  # noqa: E731
    full = rows(list(stateful.StatefulDataLoader(make(), batch_size=None, num_workers=2)))
    loader = stateful.StatefulDataLoader(make(), batch_size=None, num_workers=2)
    first = []
    for batch in loader:
        first.append(batch)
        if len(first) == 7:
            state = loader.state_dict()
            break
    loader = stateful.StatefulDataLoader(make(), batch_size=None, num_workers=2)
    loader.load_state_dict(state)
    assert rows(first) + rows(list(loader)) == full


def test_time_series_windows_through_the_adapters(tmp_path: Path) -> None:
    from tokformats import timemoe

    with tokformats.create(tmp_path / "t", "timemoe") as writer:
        for k in range(5):
            writer.write(np.sin(np.arange(50 + k, dtype=np.float32)))
    windows = timemoe.windows(tokformats.open(tmp_path / "t"), context_length=16, transform=lambda v: v * 2)
    loader = torch.utils.data.DataLoader(tft.Dataset(windows), batch_size=4, num_workers=2)
    batch = next(iter(loader))
    assert set(batch) == {"input_ids", "labels", "loss_masks"} and batch["input_ids"].shape == (4, 16)
    np.testing.assert_array_equal(batch["input_ids"][1].numpy(), windows[1]["input_ids"])
    stream = tft.IterableDataset(windows, 4, 2)
    first = next(iter(stream))
    assert first["labels"].shape == (2, 16)


def _documents(prefix: Path) -> Any:
    """A Megatron dataset of 120 documents of 0-39 random ids below 1,000 (seeded), opened."""
    rng = np.random.default_rng(3)
    lengths = rng.integers(0, 40, size=120)
    with tokformats.create(prefix, format="megatron", vocab_size=1000) as writer:
        writer.write_batch(rng.integers(0, 999, size=int(lengths.sum())), lengths)
    return tokformats.open(prefix)


def test_dict_samples_pass_through_default_collate(tmp_path: Path) -> None:
    reader = _documents(tmp_path / "d")
    masked = training.GPTSamples(reader, 16, seed=2, fields="megatron", eod_id=0, inter_document_masking=True)
    causal = training.GPTSamples(reader, 16, seed=2, fields="megatron", eod_id=0, reset_attention_mask=True)
    packed = training.PackedSamples(reader, 16, seed=2)
    for samples in (masked, causal, packed):
        loader = torch.utils.data.DataLoader(tft.Dataset(samples), batch_size=4, num_workers=2)
        batches = list(loader)
        assert sum(len(b["tokens"]) for b in batches) == len(samples)
        expected = samples.batch([4, 5, 6, 7])
        for key, value in expected.items():
            assert batches[1][key].shape == value.shape, key
            assert batches[1][key].numpy().dtype == value.dtype, key
            np.testing.assert_array_equal(batches[1][key].numpy(), value)
    assert tft.to_tensor(masked[0])["max_seqlen"].shape == ()
    stream = tft.IterableDataset(packed, 8, 4)
    first = next(iter(torch.utils.data.DataLoader(stream, batch_size=None)))
    np.testing.assert_array_equal(first["doc_lens"].numpy(), packed.batch([0, 1, 2, 3])["doc_lens"])


def test_stored_dtype_loader_yields_the_int64_values(samples: training.GPTSamples, tmp_path: Path) -> None:
    """dtype="stored" ships uint16 (4-byte) batches holding the same ids as the int64 default, which the consumer
    widens; the map-style and the iterable adapter alike."""
    assert samples.dtype == np.uint16
    wide = list(torch.utils.data.DataLoader(tft.Dataset(samples), batch_size=8, num_workers=2))
    narrow = list(torch.utils.data.DataLoader(tft.Dataset(samples, dtype="stored"), batch_size=8, num_workers=2))
    assert [b.dtype for b in wide] == [torch.int64] * len(wide)
    assert [b.dtype for b in narrow] == [torch.uint16] * len(narrow)
    assert [b.long().tolist() for b in narrow] == [b.tolist() for b in wide]
    assert samples.ids(3, np.uint16).dtype == np.uint16
    np.testing.assert_array_equal(samples.ids(3, np.uint16), samples[3])
    np.testing.assert_array_equal(samples.ids(3), samples[3])
    picks = [0, -1, 5, 5, len(samples) - 2]  # batch() gathers the parts of all of them at once
    assert samples.batch(picks, np.uint16).dtype == np.uint16 and samples.batch(picks).dtype == np.int64
    np.testing.assert_array_equal(samples.batch(picks, np.uint16), np.stack([samples[i] for i in picks]))
    np.testing.assert_array_equal(samples.batch(np.array(picks)), np.stack([samples[i] for i in picks]))
    stream = tft.IterableDataset(samples, 8, 4, dtype="stored")
    first = next(iter(torch.utils.data.DataLoader(stream, batch_size=None, num_workers=2)))
    assert first.dtype == torch.uint16
    sampler = training.BatchSampler(samples, 8, 4)
    np.testing.assert_array_equal(first.long().numpy(), samples.batch(sampler.micro_batch(0, sampler.order())))
    # 4-byte storage (a vocabulary above 65,536: Megatron stores int32) ships 4-byte ids
    rng = np.random.default_rng(7)
    lengths = rng.integers(1, 60, size=80)
    with tokformats.create(tmp_path / "big", format="megatron", vocab_size=200_000) as writer:
        writer.write_batch(rng.integers(0, 200_000, size=int(lengths.sum())), lengths)
    big = training.GPTSamples(tokformats.open(tmp_path / "big"), 16, seed=3)
    blend = training.Blend([big, big], [1.0, 1.0], 20)
    for dataset in (big, blend):
        batch = next(iter(torch.utils.data.DataLoader(tft.Dataset(dataset, dtype="stored"), batch_size=4)))
        assert big.dtype == np.int32 and batch.dtype == torch.int32
        np.testing.assert_array_equal(batch.long().numpy(), np.stack([dataset[i] for i in range(4)]))


def test_stored_dtype_is_refused_where_it_cannot_hold(samples: training.GPTSamples, tmp_path: Path) -> None:
    with pytest.raises(tokformats.ConfigError, match="dtype must be None"):
        tft.Dataset(samples, dtype="uint8")
    rng = np.random.default_rng(4)
    lengths = rng.integers(0, 40, size=60)
    with tokformats.create(tmp_path / "d", format="megatron", vocab_size=1000) as writer:
        writer.write_batch(rng.integers(0, 999, size=int(lengths.sum())), lengths)
    reader = tokformats.open(tmp_path / "d")
    with pytest.raises(tokformats.ConfigError, match="bare-id samples"):
        tft.Dataset(training.PackedSamples(reader, 16, seed=2), dtype="stored")
    dicts = training.GPTSamples(reader, 16, seed=2, fields="megatron", eod_id=0)
    with pytest.raises(tokformats.ConfigError, match="fields="):
        dicts.ids(0, np.uint16)
    padded = training.GPTSamples(reader, 16, seed=2, split_name="train", drop_last_partial=False)
    with pytest.raises(tokformats.ConfigError, match="pad_id -1 does not fit uint16"):
        padded.ids(0, np.uint16)
    with pytest.raises(tokformats.ConfigError, match="integer dtype"):
        padded.ids(0, np.float32)
    for narrow in (np.int8, np.uint8):  # uint16 ids would wrap silently
        message = rf"holds the stored ids, such as uint16 or int64; not {narrow.__name__}"
        with pytest.raises(tokformats.ConfigError, match=message):
            padded.batch([0, 1], narrow)
    kept = training.GPTSamples(reader, 16, seed=2, drop_last_partial=False, pad_id=0)
    last = int(np.flatnonzero(kept.shuffle_index == len(kept) - 1)[0])
    np.testing.assert_array_equal(kept.ids(last, np.uint16), kept[last])
    # a padded sample in a batch: the per-sample path pads it
    np.testing.assert_array_equal(kept.batch([last, 0], np.uint16), np.stack([kept[last], kept[0]]))
    assert kept[last][-1] == 0


def same_batches(ours: list[Any], theirs: list[Any]) -> None:
    """Batches equal in type, dtype, shape and value: tensors, or dicts of them."""
    assert len(ours) == len(theirs) > 0
    for mine, other in zip(ours, theirs):
        assert type(mine) is type(other)
        pairs = [(mine[key], other[key]) for key in other] if isinstance(other, dict) else [(mine, other)]
        assert not isinstance(other, dict) or list(mine) == list(other)
        for a, b in pairs:
            assert type(a) is torch.Tensor and a.dtype == b.dtype and a.shape == b.shape
            assert torch.equal(a, b)


@pytest.mark.parametrize("workers", [0, 2])
def test_collate_by_value_gives_default_collates_batches(
    samples: training.GPTSamples, tmp_path: Path, workers: int
) -> None:
    """collate_fn=tft.collate_by_value: the batches default_collate gives (bare ids as int64 or stored, dict samples,
    a stream's whole batches with batch_size=None), in the main process and from workers."""
    reader = _documents(tmp_path / "d")
    dicts = training.GPTSamples(reader, 16, seed=2, fields="megatron", eod_id=0, inter_document_masking=True)
    for dataset in (tft.Dataset(samples), tft.Dataset(samples, dtype="stored"), tft.Dataset(dicts)):
        ours = torch.utils.data.DataLoader(dataset, 8, num_workers=workers, collate_fn=tft.collate_by_value)
        theirs = torch.utils.data.DataLoader(dataset, 8, num_workers=workers)
        same_batches(list(ours), list(theirs))
    for data in (samples, dicts):
        stream = tft.IterableDataset(data, 8, 4)
        ours = torch.utils.data.DataLoader(stream, None, num_workers=workers, collate_fn=tft.collate_by_value)
        same_batches(list(ours), list(torch.utils.data.DataLoader(stream, None, num_workers=workers)))


def test_collate_by_value_pickles_small_batches_by_value(monkeypatch: pytest.MonkeyPatch) -> None:
    """In a worker, a batch up to BY_VALUE_BYTES pickles (as the worker's result queue pickles it) into its bytes
    and loads as tensors of their own memory; a larger batch, or one NumPy cannot hold (bfloat16), stays a tensor
    for torch's shared memory; outside a worker the tensors come back as they are; no samples is refused."""
    from multiprocessing.reduction import ForkingPickler

    rows = [torch.arange(k, k + 2049, dtype=torch.int32).to(torch.uint16) for k in range(8)]
    assert type(tft.collate_by_value(rows)) is torch.Tensor  # the main process
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: object())
    sent = tft.collate_by_value(rows)
    assert type(sent) is not torch.Tensor
    pickled = bytes(ForkingPickler.dumps(sent))
    assert len(pickled) > 8 * 2049 * 2
    arrived = ForkingPickler.loads(pickled)
    assert type(arrived) is torch.Tensor and arrived.dtype == torch.uint16 and torch.equal(arrived, torch.stack(rows))
    sample = {"tokens": torch.arange(5), "max_seqlen": torch.tensor(3, dtype=torch.int32)}
    arrived = ForkingPickler.loads(bytes(ForkingPickler.dumps(tft.collate_by_value([sample, sample]))))
    assert arrived["tokens"].shape == (2, 5) and arrived["max_seqlen"].tolist() == [3, 3]
    assert arrived["max_seqlen"].dtype == torch.int32
    large = [torch.zeros(tft.BY_VALUE_BYTES // 8 + 1, dtype=torch.int64)]
    assert type(tft.collate_by_value(large)) is torch.Tensor
    assert type(tft.collate_by_value([torch.zeros(4, dtype=torch.bfloat16)])) is torch.Tensor
    with pytest.raises(tokformats.ConfigError, match="at least one sample"):
        tft.collate_by_value([])


def test_collate_by_value_leaves_other_samples_to_default_collate() -> None:
    """Samples with numbers or strings (not what tokformats serves) are collated as default_collate does: a Python
    float stays float64, strings a list."""
    samples = [
        {"tokens": np.arange(3), "weight": 0.5, "source": "a"},
        {"tokens": np.arange(3), "weight": 1.5, "source": "b"},
    ]
    ours, theirs = tft.collate_by_value(samples), torch.utils.data.default_collate(samples)
    assert ours["weight"].dtype == theirs["weight"].dtype == torch.float64
    assert ours["source"] == theirs["source"] == ["a", "b"] and torch.equal(ours["tokens"], theirs["tokens"])
    whole = {"tokens": np.arange(4), "name": "x"}
    assert tft.collate_by_value(whole)["name"] == "x"
    assert torch.equal(tft.collate_by_value(whole)["tokens"], torch.arange(4))
