"""GPTSamples and Blend against megatron-core 0.16.1 itself: indices (dtype and value), samples, blends.

Every test here builds the real ``GPTDataset``/``BlendedDataset`` through ``BlendedMegatronDatasetBuilder`` over
the same files, on random corpora and configurations; they skip when megatron-core is not installed.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tokformats
from tokformats import training
from tokformats.testing import random_corpus
from tokformats.training import indices

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture(scope="module")
def megatron() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pytest.importorskip("megatron.core.datasets.helpers_cpp", reason="megatron-core is not installed")
        from megatron.core.datasets import blended_dataset, gpt_dataset, helpers
        from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    logging.getLogger("megatron").setLevel(logging.ERROR)

    class Namespace:
        pass

    ns = Namespace()
    ns.gpt, ns.helpers, ns.blended, ns.Builder = gpt_dataset, helpers, blended_dataset, BlendedMegatronDatasetBuilder
    return ns


class _Tokenizer:
    """What GPTDatasetConfig asks of a tokenizer (no pad: Megatron pads with -1)."""

    eod = 0
    vocab_size = None
    unique_identifiers = {"class": "test-tokenizer"}  # noqa: RUF012


def megatron_datasets(
    megatron: Any,
    prefixes: list[Path],
    sizes: list[int | None],
    *,
    seed: int,
    sequence_length: int,
    split: str,
    weights: list[float] | None = None,
    add_extra_token: bool = True,
    drop_last_valid: bool = True,
) -> list[Any]:
    config = megatron.gpt.GPTDatasetConfig(
        random_seed=seed,
        sequence_length=sequence_length,
        blend=([str(p) for p in prefixes], weights),
        split=split,
        tokenizer=_Tokenizer(),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        path_to_cache=None,
        mmap_bin_files=True,
        add_extra_token_to_sequence=add_extra_token,
        drop_last_partial_validation_sequence=drop_last_valid,
    )
    return megatron.Builder(megatron.gpt.GPTDataset, sizes, lambda: True, config).build()


def write_corpus(path: Path, rng: np.random.Generator, documents: int, *, sentences: bool = False) -> Path:
    flat, lengths = random_corpus(rng, documents, low=1, high=50000, mean_length=int(rng.integers(5, 120)))
    with tokformats.create(path, format="megatron", vocab_size=50257) as w:
        if sentences:  # several sequences per document, as --split-sentences writes
            offsets = np.concatenate([[0], np.cumsum(lengths)])
            for k in range(documents):
                doc = flat[offsets[k] : offsets[k + 1]]
                cuts = np.sort(rng.integers(0, len(doc) + 1, size=int(rng.integers(0, 3))))
                w.write_document(np.split(doc, cuts))
        else:
            w.write_batch(flat, lengths)
    return path


def assert_same_samples(ours: training.GPTSamples, theirs: Any, checks: int = 300) -> None:
    for name in ("document_index", "sample_index", "shuffle_index"):
        mine, megatrons = getattr(ours, name), getattr(theirs, name)
        assert mine.dtype == megatrons.dtype, name
        np.testing.assert_array_equal(mine, megatrons, err_msg=name)
    assert len(ours) == len(theirs)
    picks = np.unique(np.linspace(0, len(ours) - 1, num=min(checks, len(ours)), dtype=np.int64))
    for i in picks.tolist():
        text, _ = theirs._query_document_sample_shuffle_indices(i)
        np.testing.assert_array_equal(ours[i], text, err_msg=f"sample {i}")
        assert ours[i].dtype == np.int64


SPLITS = ["1", "969,30,1", "90,8,2", "50,50", "0,1,0", "7,2,1", "1,0,1", "80 10 10", "0.6,0.2,0.2"]


@pytest.mark.parametrize("trial", range(12))
def test_gpt_samples_equal_megatron_core(megatron: Any, tmp_path: Path, trial: int) -> None:
    rng = np.random.default_rng(1000 + trial)
    prefix = write_corpus(tmp_path / "corpus", rng, int(rng.integers(30, 400)), sentences=trial % 3 == 0)
    split = SPLITS[trial % len(SPLITS)]
    sequence_length = int(rng.choice([7, 32, 64, 257]))
    add_extra = trial % 4 != 1
    drop_last_valid = trial % 2 == 0
    matrix = indices.split_matrix(split)
    reader = tokformats.open(prefix)
    tokens = [
        int(reader.sequence_lengths[slice(*indices.split_range(split, n, len(reader.sequence_lengths)))].sum())
        if matrix[k]
        else 0
        for k, n in enumerate(indices.SPLIT_NAMES)
    ]
    # Sample counts: one epoch (None), many epochs, a final epoch below and above the 80% threshold.
    sizes: list[int | None] = []
    for k in range(3):
        if not matrix[k] or tokens[k] <= sequence_length + 1:
            sizes.append(None)
            continue
        per_epoch = max(1, tokens[k] // sequence_length)
        sizes.append([None, per_epoch * 3 + per_epoch // 10, per_epoch * 2 + (per_epoch * 9) // 10, 5][(trial + k) % 4])
    theirs = megatron_datasets(
        megatron,
        [prefix],
        sizes,
        seed=trial,
        sequence_length=sequence_length,
        split=split,
        add_extra_token=add_extra,
        drop_last_valid=drop_last_valid,
    )
    compared = 0
    for k, name in enumerate(indices.SPLIT_NAMES):
        if theirs[k] is None or (matrix[k] and tokens[k] <= sequence_length + 1):
            continue
        ours = training.GPTSamples(
            reader,
            sequence_length,
            seed=trial,
            num_samples=sizes[k],
            split=split,
            split_name=name,
            add_extra_token=add_extra,
            drop_last_partial=drop_last_valid if name == "valid" else True,
        )
        assert_same_samples(ours, theirs[k])
        compared += 1
    assert compared >= 1


def test_separate_final_epoch_and_cache_equal_megatron(megatron: Any, tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    prefix = write_corpus(tmp_path / "c", rng, 300)
    reader = tokformats.open(prefix)
    per_epoch = int(reader.sequence_lengths.sum()) // 64
    for num_samples in (per_epoch * 2 + per_epoch // 2, per_epoch * 2 + per_epoch - 2):  # separate, not separate
        ours = training.GPTSamples(reader, 64, seed=3, num_samples=num_samples, cache_dir=tmp_path / "cache")
        theirs = megatron_datasets(megatron, [prefix], [num_samples, None, None], seed=3, sequence_length=64, split="1")
        assert_same_samples(ours, theirs[0])
        again = training.GPTSamples(reader, 64, seed=3, num_samples=num_samples, cache_dir=tmp_path / "cache")
        assert isinstance(again.shuffle_index, np.memmap)  # mapped from the cache, not rebuilt
        assert_same_samples(again, theirs[0], checks=50)


@pytest.mark.parametrize("trial", range(4))
def test_blend_equals_megatron_blended_dataset(megatron: Any, tmp_path: Path, trial: int) -> None:
    rng = np.random.default_rng(50 + trial)
    count = int(rng.integers(2, 5))
    prefixes = [write_corpus(tmp_path / f"part{k}", rng, int(rng.integers(100, 300))) for k in range(count)]
    weights = rng.uniform(0.1, 3.0, size=count).round(3).tolist()
    size = int(rng.integers(50, 400))
    theirs = megatron_datasets(
        megatron, prefixes, [size, 0, 0], seed=trial, sequence_length=32, split="1", weights=weights
    )[0]
    ours = training.Blend.build([tokformats.open(p) for p in prefixes], weights, size, sequence_length=32, seed=trial)
    assert ours.dataset_index.dtype == theirs.dataset_index.dtype == np.int16
    np.testing.assert_array_equal(ours.dataset_index, theirs.dataset_index)
    np.testing.assert_array_equal(ours.dataset_sample_index, theirs.dataset_sample_index)
    assert len(ours) == len(theirs)
    for i in range(0, len(ours), 7):
        sample = theirs[i]  # tokens = x[:-1], labels = x[1:]
        np.testing.assert_array_equal(ours[i], [*sample["tokens"].tolist(), sample["labels"][-1].item()])
    for k, dataset in enumerate(ours.datasets):
        assert_same_samples(dataset, theirs.datasets[k], checks=20)


def test_exhaustive_blend_equals_megatron(megatron: Any, tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    prefixes = [write_corpus(tmp_path / f"part{k}", rng, int(rng.integers(50, 200))) for k in range(3)]
    theirs = megatron_datasets(megatron, prefixes, [None, None, None], seed=5, sequence_length=16, split="1")[0]
    ours = training.Blend.build([tokformats.open(p) for p in prefixes], None, None, sequence_length=16, seed=5)
    np.testing.assert_array_equal(ours.dataset_index, theirs.dataset_index)
    np.testing.assert_array_equal(ours.dataset_sample_index, theirs.dataset_sample_index)
    assert len(ours) == sum(len(d) for d in ours.datasets)


def test_numpy_blending_fallback_equals_helpers(megatron: Any) -> None:
    rng = np.random.default_rng(11)
    for _ in range(20):
        count = int(rng.integers(1, 6))
        weights = rng.uniform(0.01, 1.0, size=count)
        weights = (weights / weights.sum()).tolist()
        size = int(rng.integers(0, 3000))
        expected = indices.blending_indices(weights, size)  # through helpers_cpp
        got_index, got_sample = np.zeros(size, np.int16), np.zeros(size, np.int64)
        indices._greedy(np.array(weights), size, None, got_index, got_sample)
        np.testing.assert_array_equal(got_index, expected[0])
        np.testing.assert_array_equal(got_sample, expected[1])
        sizes = rng.integers(0, 300, size=count)
        expected = indices.exhaustive_blending_indices(sizes.tolist())
        total = int(sizes.sum())
        got_index, got_sample = np.zeros(total, np.int16), np.zeros(total, np.int64)
        indices._greedy(sizes / max(total, 1), total, sizes, got_index, got_sample)
        np.testing.assert_array_equal(got_index, expected[0])
        np.testing.assert_array_equal(got_sample, expected[1])


def _random_walk(rng: np.random.Generator, documents: int) -> tuple[np.ndarray, int, int, bool, int, int] | None:
    """Unit sizes and sample options for one random sample-index case: ``(sizes, sequence_length, extra, drop,
    epochs, tokens)``, or None when the epochs hold no sample."""
    n = int(rng.integers(1, documents))
    sizes = rng.integers(0, int(rng.choice([3, 20, 200])), n).astype(np.int32)
    sequence_length, extra = int(rng.integers(2, 50)), int(rng.integers(0, 2))
    drop, epochs = bool(rng.integers(0, 2)), int(rng.integers(1, 4))
    tokens = int(sizes.sum())
    return None if epochs * tokens - extra < 1 else (sizes, sequence_length, extra, drop, epochs, tokens)


def _helpers_sample_index(megatron: Any, sizes: np.ndarray, doc: np.ndarray, *walk: Any) -> np.ndarray | None:
    """megatron-core's ``build_sample_idx`` (``walk``: sequence length, epochs, tokens, drop, extra), or None where
    its own check fails: a kept partial sample ending in an empty last document (its offset is -1); we build the
    same row and read it as zero tokens."""
    try:
        return megatron.helpers.build_sample_idx(sizes, doc, *walk)
    except AssertionError:
        return None


def test_sample_index_equals_helpers_on_random_lengths(megatron: Any) -> None:
    rng = np.random.default_rng(0)
    compared = 0
    for trial in range(1500):
        case = _random_walk(rng, 60)
        if case is None:
            continue
        sizes, sequence_length, extra, drop, epochs, tokens = case
        n = len(sizes)
        separate = bool(rng.integers(0, 2)) and epochs > 1
        units = np.arange(n, dtype=np.int32)
        theirs_doc = megatron.gpt._build_document_index(units, epochs, np.random.RandomState(trial), separate)
        ours_doc = indices.document_index(units, epochs, np.random.RandomState(trial), separate)
        np.testing.assert_array_equal(ours_doc, theirs_doc)
        assert ours_doc.dtype == theirs_doc.dtype
        theirs = _helpers_sample_index(megatron, sizes, theirs_doc, sequence_length, epochs, tokens, drop, extra)
        if theirs is None:
            continue
        ours = indices.sample_index(sizes, ours_doc, sequence_length, epochs, tokens, drop, extra)
        assert ours.dtype == theirs.dtype
        np.testing.assert_array_equal(ours, theirs)
        compared += 1
    assert compared > 1000


def test_sample_index_in_small_chunks_equals_helpers(megatron: Any) -> None:
    """The walk over the document index in chunks (boundaries anywhere, empty documents at them) is the same."""
    rng = np.random.default_rng(5)
    for trial in range(400):
        case = _random_walk(rng, 80)
        if case is None:
            continue
        sizes, sequence_length, extra, drop, epochs, tokens = case
        doc = indices.document_index(np.arange(len(sizes), dtype=np.int32), epochs, np.random.RandomState(trial), False)
        theirs = _helpers_sample_index(megatron, sizes, doc, sequence_length, epochs, tokens, drop, extra)
        if theirs is None:
            continue
        chunk = int(rng.integers(1, 12))
        ours = indices.sample_index(sizes, doc, sequence_length, epochs, tokens, drop, extra, chunk=chunk)
        np.testing.assert_array_equal(ours, theirs, err_msg=f"trial {trial}, chunk {chunk}")


def test_sample_index_of_lengths_in_any_dtype_and_of_a_split_equals_helpers(megatron: Any) -> None:
    """Lengths stored as uint16, int32 or int64, walked whole or as a split (a document index over a few units:
    the lengths are then read where they are, not copied), give megatron-core's rows and dtype."""
    rng = np.random.default_rng(9)
    compared = 0
    for trial in range(300):
        case = _random_walk(rng, 120)
        if case is None:
            continue
        sizes, sequence_length, extra, drop, epochs, _ = case
        begin = int(rng.integers(0, len(sizes)))
        end = begin + max(1, (len(sizes) - begin) // int(rng.integers(1, 5)))
        units = np.arange(begin, end, dtype=np.int32)
        tokens = int(sizes[begin:end].sum())
        if epochs * tokens - extra < 1:
            continue
        doc = indices.document_index(units, epochs, np.random.RandomState(trial), False)
        theirs = _helpers_sample_index(megatron, sizes, doc, sequence_length, epochs, tokens, drop, extra)
        if theirs is None:
            continue
        for dtype in (np.uint16, np.int32, np.int64):
            ours = indices.sample_index(sizes.astype(dtype), doc, sequence_length, epochs, tokens, drop, extra)
            assert ours.dtype == theirs.dtype, (trial, dtype)
            np.testing.assert_array_equal(ours, theirs, err_msg=f"trial {trial}, {np.dtype(dtype).name}")
        compared += 1
    assert compared > 100


def test_document_index_in_place_shuffles_the_same_order() -> None:
    """``in_place=True`` shuffles the caller's int32 units themselves for one epoch, in the order a copy gets; other
    cases still copy."""
    units = np.arange(5, 105, dtype=np.int32)
    copied = indices.document_index(units, 1, np.random.RandomState(3), False)
    np.testing.assert_array_equal(units, np.arange(5, 105))  # left alone without in_place
    own = np.arange(5, 105, dtype=np.int32)
    shuffled = indices.document_index(own, 1, np.random.RandomState(3), False, in_place=True)
    assert shuffled is own and shuffled.dtype == np.int32
    np.testing.assert_array_equal(shuffled, copied)
    two = np.arange(10, dtype=np.int32)
    both = indices.document_index(two, 2, np.random.RandomState(4), True, in_place=True)
    np.testing.assert_array_equal(two, np.arange(10))
    np.testing.assert_array_equal(both, indices.document_index(np.arange(10), 2, np.random.RandomState(4), True))
