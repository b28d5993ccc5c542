"""Blend.by_tokens: each source's token budget drawn exactly (over dict samples and packed rows), reported, repetition
capped; every drawn sample served once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tokformats
from tokformats import training
from tokformats.errors import ConfigError


def reader_of(tmp_path: Path, name: str, documents: int, seed: int) -> tokformats.TokenReader:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 60, size=documents)
    with tokformats.create(tmp_path / name, format="megatron", vocab_size=1000) as writer:
        writer.write_batch(rng.integers(1, 999, size=int(lengths.sum())), lengths)
    return tokformats.open(tmp_path / name)


@pytest.fixture()
def sources(tmp_path: Path) -> dict[str, Any]:
    web = training.GPTSamples(reader_of(tmp_path, "web", 300, 1), 16, seed=1, fields=("tokens", "labels", "loss_mask"))
    code = training.PackedSamples(reader_of(tmp_path, "code", 200, 2), 16, seed=2)
    books = training.PackedSamples(reader_of(tmp_path, "books", 100, 3), 16, seed=3)
    return {"web": web, "code": code, "books": books}


def check_exact(blend: training.Blend, asked: dict[str, float]) -> None:
    report = blend.report()
    served = blend.sample_tokens()
    for k, name in enumerate(blend.names):
        entry = report[name]
        dataset = blend.datasets[k]
        per_sample = dataset.sample_tokens()
        taken = np.sort(blend.dataset_sample_index[blend.dataset_index == k])
        np.testing.assert_array_equal(taken, np.arange(entry["samples"]))  # every drawn sample once
        assert int(served[blend.dataset_index == k].sum()) == entry["tokens"]
        assert entry["tokens"] >= asked[name] > entry["tokens"] - int(per_sample[-1])  # exceeded by < one sample
        assert entry["epochs"] == pytest.approx(entry["tokens"] / entry["epoch_tokens"])


def test_budgets_of_dict_and_packed_samples_are_drawn_exactly(sources: dict[str, Any]) -> None:
    epoch = {name: int(s.sample_tokens().sum()) for name, s in sources.items()}
    asked = {"web": epoch["web"] * 2.5, "code": epoch["code"] * 0.4 + 3, "books": float(epoch["books"] * 3 + 17)}
    blend = training.Blend.by_tokens({name: (sources[name], asked[name]) for name in sources}, max_repetition=4.0)
    check_exact(blend, asked)
    report = blend.report()
    assert report["web"]["epochs"] == pytest.approx(2.5, abs=0.01)
    assert report["books"]["epochs"] == pytest.approx(3.0, abs=0.01)
    assert set(report) == {"web", "code", "books"}
    # Passing over a source again serves its samples again, in the same order.
    web = blend.datasets[0]
    n = len(sources["web"])
    np.testing.assert_array_equal(web[n + 5]["tokens"], sources["web"][5]["tokens"])
    sample = blend[0]
    assert isinstance(sample, dict) and "tokens" in sample


def test_interleaving_follows_the_sample_counts(sources: dict[str, Any]) -> None:
    blend = training.Blend.by_tokens({"web": (sources["web"], 4000), "code": (sources["code"], 4000)})
    counts = [blend.report()[name]["samples"] for name in ("web", "code")]
    first_half = np.bincount(blend.dataset_index[: len(blend) // 2], minlength=2)
    np.testing.assert_allclose(first_half / first_half.sum(), np.array(counts) / sum(counts), atol=0.02)
    sampler = training.BatchSampler(blend, 8, 4, drop_last=False)
    assert sum(len(b) for b in sampler) == len(blend)


def test_refusals_and_zero_budgets(sources: dict[str, Any]) -> None:
    epoch = int(sources["code"].sample_tokens().sum())
    with pytest.raises(ConfigError, match=r"repeated 5\.\d+ times.*max_repetition=5\.\d+"):
        training.Blend.by_tokens({"code": (sources["code"], epoch * 5 + 100)}, max_repetition=4.0)
    assert len(training.Blend.by_tokens({"code": (sources["code"], epoch * 5 + 100)}, max_repetition=6.0)) > 0
    with pytest.raises(ConfigError, match="finite number >= 0"):
        training.Blend.by_tokens({"code": (sources["code"], -1.0)})
    with pytest.raises(ConfigError, match="sample_tokens"):
        training.Blend.by_tokens({"list": ([np.arange(3)], 10.0)})
    with pytest.raises(ConfigError, match="nothing to blend"):
        training.Blend.by_tokens({"code": (sources["code"], 0.0)})
    blend = training.Blend.by_tokens({"code": (sources["code"], 0.0), "web": (sources["web"], 100.0)})
    assert blend.report()["code"]["samples"] == 0 and blend.names == ["web"]
    assert blend.report()["web"]["tokens"] == 112  # 7 samples of 16: the first that reaches 100


def test_blend_batches_stack_dicts(sources: dict[str, Any]) -> None:
    blend = training.Blend.by_tokens({"code": (sources["code"], 500.0), "books": (sources["books"], 500.0)})
    batch = blend.batch([0, 1, 2])
    assert batch["cu_seqlens"].shape == (3, 17) and batch["doc_lens"].dtype == np.int32
