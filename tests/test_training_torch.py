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


def test_dict_samples_pass_through_default_collate(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    lengths = rng.integers(0, 40, size=120)
    with tokformats.create(tmp_path / "d", format="megatron", vocab_size=1000) as writer:
        writer.write_batch(rng.integers(0, 999, size=int(lengths.sum())), lengths)
    reader = tokformats.open(tmp_path / "d")
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
