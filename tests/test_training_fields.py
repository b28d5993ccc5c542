"""Dict samples (``GPTSamples(fields=...)``): equal to megatron-core 0.16.1's ``GPTDataset.__getitem__`` for every flag
combination, stored loss masks shifted onto the labels, other formats' document boundaries, refusals.
(megatron-core 0.19.2's ``inter_document_masking``: test_training_mcore019.py.)"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

import tokformats
from tokformats import training
from tokformats.errors import ConfigError
from tokformats.training.sample_fields import cu_seqlens_of

from . import megatron_fields

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture(scope="module")
def megatron() -> None:
    pytest.importorskip("megatron.core.datasets.helpers_cpp", reason="megatron-core is not installed")


@pytest.mark.parametrize("trial", range(6))
def test_dict_samples_equal_megatron_core_for_every_flag_combination(
    megatron: None, tmp_path: Path, trial: int
) -> None:
    masking = megatron_fields.has_inter_document_masking()
    compared = megatron_fields.run_trial(tmp_path, trial, masking)
    assert compared >= 3 * len(megatron_fields.flag_combinations(masking))  # the padding sample, the last, more


def _corpus(tmp_path: Path, fmt: str = "megatron") -> tokformats.TokenReader:
    ids = np.array([5, 6, 0, 7, 8, 9, 0, 4, 0, 11, 12, 13, 14, 15, 0, 16, 17], dtype=np.int64)
    lengths = [3, 4, 0, 2, 6, 2]
    options: dict[str, object] = {"vocab_size": 100}
    if fmt == "raw":
        options = {"dtype": "uint16", "eos": 0}
    elif fmt == "llmc":
        options["bos"] = 0
    path = tmp_path / ("c.ds" if fmt == "datatrove" else f"c-{fmt}")
    with tokformats.create(path, format=fmt, **options) as writer:
        writer.write_batch(ids, lengths)
    if fmt == "raw":
        return tokformats.open(writer.written[0], format="raw", dtype="uint16", eos=0)
    return tokformats.open(writer.written if fmt == "llmc" else path)


def test_fields_by_hand_on_a_small_corpus(tmp_path: Path) -> None:
    reader = _corpus(tmp_path)
    s = training.GPTSamples(
        reader,
        8,
        seed=0,
        fields=("tokens", "labels", "loss_mask", "position_ids", "cu_seqlens"),
        eod_id=0,
        eod_mask_loss=True,
        pad_id=-1,
    )
    assert len(s) == 2
    for j in range(2):
        assert list(s.sample(j)) == ["tokens", "labels", "loss_mask", "position_ids", "cu_seqlens", "max_seqlen"]
    text = s.unshuffled(0)
    np.testing.assert_array_equal(s.sample(0)["tokens"], text[:-1])
    np.testing.assert_array_equal(s.sample(0)["labels"], text[1:])
    np.testing.assert_array_equal(s.sample(0)["loss_mask"], (text[:-1] != 0).astype(np.float32))
    parts = [b - a for a, b in s._spans(0)]
    cu = np.cumsum([0, *parts])
    cu[-1] -= 1  # the extra token is not an input
    expected_cu = np.full(9, 8, dtype=np.int32)
    kept = cu if cu[-1] != cu[-2] else cu[:-1]
    expected_cu[: len(kept)] = kept
    np.testing.assert_array_equal(s.sample(0)["cu_seqlens"], expected_cu)
    assert s.sample(0)["max_seqlen"] == np.diff(kept).max() and s.sample(0)["max_seqlen"].dtype == np.int32
    starts = np.zeros(8, dtype=bool)
    starts[kept[:-1]] = True
    positions = [0]
    for k in range(1, 8):
        positions.append(0 if starts[k] else positions[-1] + 1)
    np.testing.assert_array_equal(s.sample(0)["position_ids"], positions)
    assert s.sample(0)["tokens"].dtype == np.int64 and s.sample(0)["loss_mask"].dtype == np.float32


def test_reset_attention_mask_blocks_and_padding_sample(tmp_path: Path) -> None:
    reader = _corpus(tmp_path)
    s = training.GPTSamples(
        reader, 8, seed=3, fields="megatron", eod_id=0, reset_attention_mask=True, reset_position_ids=True
    )
    sample = s[0]
    assert list(sample) == ["tokens", "labels", "attention_mask", "loss_mask", "position_ids"]
    tokens, mask = sample["tokens"], sample["attention_mask"]
    assert mask.shape == (1, 8, 8) and mask.dtype == np.bool_
    segment = np.concatenate([[0], np.cumsum(tokens == 0)[:-1]])
    for q, k in itertools.product(range(8), range(8)):
        assert mask[0, q, k] == (not (k <= q and segment[k] == segment[q])), (q, k)
    np.testing.assert_array_equal(sample["position_ids"], [int(np.sum(segment[:p] == segment[p])) for p in range(8)])
    padding = s[None]
    np.testing.assert_array_equal(padding["tokens"], sample["tokens"])
    assert not padding["loss_mask"].any()
    assert sample["loss_mask"].all()
    batch = s.batch([0, 1])
    assert batch["attention_mask"].shape == (2, 1, 8, 8)


def test_bare_ids_unchanged_and_fingerprints(tmp_path: Path) -> None:
    reader = _corpus(tmp_path)
    bare = training.GPTSamples(reader, 5, seed=1, cache_dir=tmp_path / "cache")
    fielded = training.GPTSamples(reader, 5, seed=1, cache_dir=tmp_path / "cache", fields=("tokens", "labels"))
    assert fielded.index_key == bare.index_key == bare.fingerprint != fielded.fingerprint
    assert len(list((tmp_path / "cache").glob("*-description.json"))) == 1  # one index entry for both
    for i in range(len(bare)):
        np.testing.assert_array_equal(fielded[i]["tokens"], bare[i][:-1])
        np.testing.assert_array_equal(fielded[i]["labels"], bare[i][1:])
    other = training.GPTSamples(
        reader, 5, seed=1, fields=("tokens", "labels", "loss_mask"), eod_id=0, eod_mask_loss=True
    )
    assert other.fingerprint != fielded.fingerprint


def test_refusals(tmp_path: Path) -> None:
    reader = _corpus(tmp_path)
    with pytest.raises(ConfigError, match="eod_id=ID"):
        training.GPTSamples(reader, 5, fields="megatron", eod_mask_loss=True)
    with pytest.raises(ConfigError, match="pass fields="):
        training.GPTSamples(reader, 5, eod_id=0, reset_position_ids=True)
    with pytest.raises(ConfigError, match="distinct names"):
        training.GPTSamples(reader, 5, fields=("tokens", "inputs"))
    with pytest.raises(ConfigError, match="inter_document_masking=False"):
        training.GPTSamples(reader, 5, fields=("tokens", "cu_seqlens"), inter_document_masking=False)
    with pytest.raises(ConfigError, match="padding sample"):
        training.GPTSamples(reader, 5)[None]


def test_cu_seqlens_rules() -> None:
    # The extra token comes off the last part; an emptied last part goes; padding folds into the last part.
    np.testing.assert_array_equal(cu_seqlens_of([3, 0, 5], 7, True)[0], [0, 3, 3, 7, 7, 7, 7, 7])
    np.testing.assert_array_equal(cu_seqlens_of([7, 1], 7, True)[0], [0, 7, 7, 7, 7, 7, 7, 7])
    np.testing.assert_array_equal(cu_seqlens_of([2, 2], 7, False)[0], [0, 2, 7, 7, 7, 7, 7, 7])
    assert int(cu_seqlens_of([2, 2], 7, False)[1]) == 5
    # More parts than L + 1 entries hold (megatron-core fails): the empty ones are left out.
    np.testing.assert_array_equal(cu_seqlens_of([1, 0, 0, 0, 1, 0, 1], 3, False)[0], [0, 1, 2, 3])


@pytest.mark.parametrize("extra", [True, False])
def test_stored_loss_masks_are_shifted_onto_the_labels(tmp_path: Path, extra: bool) -> None:
    rng = np.random.default_rng(4)
    lengths = rng.integers(0, 30, size=60)
    ids = rng.integers(1, 90, size=int(lengths.sum()))
    with tokformats.create(tmp_path / "a.ds", "datatrove", vocab_size=100) as writer:
        writer.write_batch(ids, lengths)
    stored = (rng.random(len(ids)) < 0.7).astype(np.uint8)
    (tmp_path / "a.ds.loss").write_bytes(stored.tobytes())
    reader = tokformats.open(tmp_path / "a.ds")
    assert reader.loss_masks is not None
    s = training.GPTSamples(
        reader, 16, seed=2, add_extra_token=extra, fields="megatron", eod_id=0, eod_mask_loss=True, pad_id=-1
    )
    plain = training.GPTSamples(reader, 16, seed=2, add_extra_token=extra)
    checked = 0
    for i in range(len(s)):
        j = int(s.shuffle_index[i])
        text_mask = np.concatenate([stored[a:b] for a, b in s._spans(j)])
        text = plain[i]
        sample = s[i]
        for p in range(16):
            label_token_mask = text_mask[p + 1] if p + 1 < len(text_mask) else 0
            label_is_pad = (not extra) and p == 15
            expected = float(label_token_mask and text[p] != 0 and not label_is_pad)
            assert sample["loss_mask"][p] == expected, (i, p)
            checked += 1
    assert checked == 16 * len(s) > 0
    masked_by_store = sum(int((s[i]["loss_mask"] == 0).sum()) for i in range(len(s)))
    assert masked_by_store > 0.2 * checked  # the stored zeros did mask labels


@pytest.mark.parametrize("fmt", ["llmc", "raw", "datatrove"])
def test_other_formats_take_their_document_boundaries(tmp_path: Path, fmt: str) -> None:
    reader = _corpus(tmp_path, fmt)
    s = training.GPTSamples(reader, 6, seed=5, fields=("tokens", "cu_seqlens", "position_ids"))
    offsets = reader.sample_units()[1]
    for j in range(len(s)):
        spans = s._spans(j)
        for start, stop in spans:  # every part lies within one document
            unit = int(np.searchsorted(offsets, start, side="right")) - 1
            assert offsets[unit] <= start <= stop <= offsets[unit + 1]
        cu = s.sample(j)["cu_seqlens"]
        assert cu[0] == 0 and cu[-1] == 6 and (np.diff(cu) >= 0).all()
