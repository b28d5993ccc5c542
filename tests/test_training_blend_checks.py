"""What a blend refuses before building anything: a weight count that is not one per dataset, weights that are not
positive and finite (``Blend`` and ``Blend.build`` alike), datasets whose samples differ in length; and ``tokformats
explain --sample`` beyond the run's samples."""

from __future__ import annotations

import math
from pathlib import Path

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


def test_cli_explain_a_blend_with_too_few_weights(
    readers: list[tokformats.TokenReader], capsys: pytest.CaptureFixture[str]
) -> None:
    paths = [str(readers[0].path), str(readers[1].path)]
    assert main(["explain", *paths, "--sample", "0", "--sequence-length", "64", "--weights", "1"]) == 2
    assert "give one weight per dataset: 2 datasets, 1 weights" in capsys.readouterr().err
