"""What a blend refuses before building anything: a weight count that is not one per dataset, weights that are not
positive and finite (``Blend`` and ``Blend.build`` alike), datasets whose samples differ in length; and ``tokformats
explain --sample`` beyond the run's samples."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tokformats
from tokformats import training
from tokformats.cli import main
from tokformats.errors import ConfigError
from tokformats.testing import random_corpus


@pytest.fixture()
def readers(tmp_path: Path) -> list[tokformats.TokenReader]:
    """The same small corpus as Megatron and as llm.c."""
    flat, lengths = random_corpus(np.random.default_rng(0), 100, low=1, high=900)
    with tokformats.create(tmp_path / "m", "megatron", vocab_size=1000) as writer:
        writer.write_batch(flat, lengths)
    with tokformats.create(tmp_path / "l", "llmc", vocab_size=1000, bos=0) as shards:
        shards.write_batch(flat, lengths)
    return [tokformats.open(tmp_path / "m"), tokformats.open(shards.written)]


@pytest.mark.parametrize("weights", [[1.0], [1.0, 2.0, 3.0]])
def test_build_takes_one_weight_per_reader(readers: list[tokformats.TokenReader], weights: list[float]) -> None:
    expected = f"give one weight per dataset: 2 datasets, {len(weights)} weights"
    with pytest.raises(ConfigError, match=expected):
        training.Blend.build(readers, weights=weights, size=100, sequence_length=64, seed=1)
    samples = [training.GPTSamples(r, 64, seed=1) for r in readers]
    with pytest.raises(ConfigError, match=expected):  # the constructor says the same
        training.Blend(samples, weights, 100)


@pytest.mark.parametrize(
    ("weights", "shown"),
    [
        ([1, -1], "1 is -1"),
        ([float("nan"), 1], "0 is nan"),
        ([2, -1], "1 is -1"),
        ([1, math.inf], "1 is inf"),
        ([0.0, 1.0], "0 is 0.0"),
    ],
)
def test_build_refuses_weights_that_are_not_positive_and_finite(
    readers: list[tokformats.TokenReader], weights: list[float], shown: str
) -> None:
    expected = f"blend weight {shown}; weights must be positive and finite"
    with pytest.raises(ConfigError, match=expected):
        training.Blend.build(readers, weights=weights, size=100, sequence_length=64, seed=1)
    samples = [training.GPTSamples(r, 64, seed=1) for r in readers]
    with pytest.raises(ConfigError, match=expected):
        training.Blend(samples, weights, 100)


def test_build_refuses_a_negative_size(readers: list[tokformats.TokenReader]) -> None:
    with pytest.raises(ConfigError, match="size must be None or >= 0, not -5"):
        training.Blend.build(readers, weights=[1, 1], size=-5, sequence_length=64, seed=1)


def test_build_with_good_weights_still_blends_every_reader(readers: list[tokformats.TokenReader]) -> None:
    blend = training.Blend.build(readers, weights=[3, 1], size=100, sequence_length=64, seed=1)
    assert len(blend.datasets) == 2 and blend.weights == [0.75, 0.25]
    assert np.bincount(blend.dataset_index).tolist() == [75, 25]


def test_a_blend_refuses_samples_of_different_lengths(readers: list[tokformats.TokenReader]) -> None:
    m, llmc = readers
    long, short = training.GPTSamples(m, 64, seed=1), training.GPTSamples(llmc, 32, seed=1)
    with pytest.raises(ConfigError) as refused:
        training.Blend([long, short], [1, 1], 50)
    message = str(refused.value)
    assert "sequence_length 32" in message and "sequence_length 64" in message
    assert str(m.path) in message and str(llmc.path) in message
    with pytest.raises(ConfigError, match="sequence_length 32"):  # one level down, through a nested blend
        training.Blend([training.Blend([long, long], [1, 1], 10), short], [1, 1], 20)
    with pytest.raises(ConfigError, match="sequence_length 32"):  # through token budgets' draws
        training.Blend.by_tokens({"long": (long, 640.0), "short": (short, 320.0)})
    with pytest.raises(ConfigError, match="sequence_length 32"):
        training.Blend([long, training.windows(llmc, 32, seed=1)], [1, 1], 20)


def test_a_blend_refuses_bare_ids_with_and_without_the_extra_token(readers: list[tokformats.TokenReader]) -> None:
    m, llmc = readers
    with_extra, without = training.GPTSamples(m, 64, seed=1), training.GPTSamples(llmc, 64, add_extra_token=False)
    assert (len(with_extra[0]), len(without[0])) == (65, 64)
    with pytest.raises(ConfigError, match=r"\(ids per sample 64\) with .* \(ids per sample 65\)"):
        training.Blend([with_extra, without], [1, 1], 20)
    with pytest.raises(ConfigError, match="ids per sample 65"):  # nanoGPT's windows hold L + 1 ids
        training.Blend([without, training.windows(m, 64, seed=1)], [1, 1], 20)
    assert len(training.Blend([with_extra, training.windows(m, 64, seed=1)], [1, 1], 20)) == 20


def test_dict_samples_of_one_length_still_blend(readers: list[tokformats.TokenReader]) -> None:
    """Sample dicts of other kinds (packed rows, Megatron's fields) and either extra-token setting share their
    shapes at one sequence length: blending them stays allowed, as the README's token budgets do."""
    m, llmc = readers
    packed = training.PackedSamples(m, 16, seed=1, add_extra_token=False)
    dicts = training.GPTSamples(llmc, 16, seed=1, fields=("tokens", "labels", "loss_mask"))
    blend = training.Blend.by_tokens({"packed": (packed, 500.0), "dicts": (dicts, 500.0)})
    rows: list[Any] = [blend[i] for i in range(len(blend))]
    assert {row["tokens"].shape for row in rows} == {(16,)} and set(blend.dataset_index.tolist()) == {0, 1}
    assert blend.sequence_length == 16


def test_cli_explain_a_sample_beyond_the_run(
    readers: list[tokformats.TokenReader], capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(readers[0].path)
    count = len(training.GPTSamples(readers[0], 64, seed=1234))
    args = ["explain", path, "--sequence-length", "64", "--seed", "1234"]
    for sample in (123456, count, -count - 1):
        assert main([*args, "--sample", str(sample)]) == 2
        assert capsys.readouterr().err.splitlines() == [
            f"tokformats: error: --sample {sample} is out of range: the run has {count} samples (0-{count - 1}; "
            "negative counts from the end); pass the training run's --num-samples (default: one epoch)."
        ]
    assert main([*args, "--sample", str(-count), "--json"]) == 0  # the first sample, counted from the end
    assert main([*args, "--sample", str(count - 1), "--json"]) == 0
    capsys.readouterr()
    blend = ["explain", path, str(readers[1].path), "--sequence-length", "64", "--weights", "1", "1", "--size", "30"]
    assert main([*blend, "--sample", "30"]) == 2
    assert capsys.readouterr().err == (
        "tokformats: error: --sample 30 is out of range: the run has 30 samples (0-29; negative counts from the "
        "end); pass the training run's --num-samples and --size.\n"
    )


def test_cli_explain_a_blend_with_too_few_weights(
    readers: list[tokformats.TokenReader], capsys: pytest.CaptureFixture[str]
) -> None:
    paths = [str(readers[0].path), str(readers[1].path)]
    assert main(["explain", *paths, "--sample", "0", "--sequence-length", "64", "--weights", "1"]) == 2
    assert "give one weight per dataset: 2 datasets, 1 weights" in capsys.readouterr().err
