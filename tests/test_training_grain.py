"""tokformats.grain: readers, dict samples, packed rows and blends as Grain sources, with grain.MapDataset, checkpointed
iterator state (also through multiprocessing prefetch), and MaxText's field names. Skips without grain."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tokformats
from tokformats import training

grain = pytest.importorskip("grain", reason="grain is not installed (pip install 'tokformats[grain]')")
tfg = pytest.importorskip("tokformats.grain")


@pytest.fixture(scope="module")
def reader(tmp_path_factory: pytest.TempPathFactory) -> tokformats.TokenReader:
    folder = tmp_path_factory.mktemp("grain")
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 50, size=200)
    with tokformats.create(folder / "c", format="megatron", vocab_size=1000) as writer:
        writer.write_batch(rng.integers(1, 999, size=int(lengths.sum())), lengths)
    return tokformats.open(folder / "c")


def equal(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return list(a) == list(b) and all(np.array_equal(a[k], b[k]) for k in a)
    return bool(np.array_equal(a, b))


def test_sources_serve_what_the_samples_serve(reader: tokformats.TokenReader) -> None:
    packed = training.PackedSamples(reader, 16, seed=1)
    dicts = training.GPTSamples(reader, 16, seed=1, fields="megatron", eod_id=0, create_attention_mask=False)
    blend = training.Blend.by_tokens({"a": (packed, 2000.0), "b": (dicts, 2000.0)})
    for samples in (reader, packed, dicts, blend, training.GPTSamples(reader, 16)):
        ds = grain.MapDataset.source(tfg.source(samples))
        assert len(ds) == len(samples)
        for i in (0, len(samples) // 2, len(samples) - 1):
            assert equal(ds[i], samples[i])
        assert all(equal(x, samples[i]) for x, i in zip(tfg.source(samples).__getitems__([3, 1]), [3, 1]))


def test_maxtext_fields_of_packed_rows(reader: tokformats.TokenReader) -> None:
    packed = training.PackedSamples(reader, 16, seed=2)
    ds = tfg.map_dataset(packed, maxtext=True)
    for i in range(len(packed)):
        row, fields = packed[i], ds[i]
        assert set(fields) == {
            "inputs",
            "targets",
            "inputs_segmentation",
            "targets_segmentation",
            "inputs_position",
            "targets_position",
        }
        assert all(v.dtype == np.int32 and v.shape == (16,) for v in fields.values())
        np.testing.assert_array_equal(fields["inputs"], row["tokens"])
        np.testing.assert_array_equal(fields["targets"], row["labels"])
        lengths = row["doc_lens"][row["doc_lens"] > 0]
        expected = np.concatenate([np.full(n, k + 1) for k, n in enumerate(lengths)] + [np.zeros(17)])[:16]
        np.testing.assert_array_equal(fields["inputs_segmentation"], expected)
        np.testing.assert_array_equal(fields["targets_segmentation"], np.where(row["loss_mask"] > 0, expected, 0))
        np.testing.assert_array_equal(fields["inputs_position"], np.where(expected > 0, row["position_ids"], 0))


def test_maxtext_fields_of_bare_ids_and_cu_seqlens(reader: tokformats.TokenReader) -> None:
    bare = training.GPTSamples(reader, 8, seed=3)
    fields = tfg.maxtext_fields(bare[0])
    np.testing.assert_array_equal(fields["inputs"], bare[0][:-1])
    np.testing.assert_array_equal(fields["targets"], bare[0][1:])
    assert (fields["inputs_segmentation"] == 1).all() and (fields["inputs_position"] == np.arange(8)).all()
    masked = training.GPTSamples(
        reader, 8, seed=3, fields=("tokens", "labels", "loss_mask", "position_ids", "cu_seqlens")
    )
    sample = masked[0]
    fields = tfg.maxtext_fields(sample)
    cu = sample["cu_seqlens"]
    segments = fields["inputs_segmentation"]
    assert segments[0] == 1 and (np.diff(segments) >= 0).all()
    np.testing.assert_array_equal(np.flatnonzero(np.diff(segments)) + 1, np.unique(cu[(cu > 0) & (cu < 8)]))
    np.testing.assert_array_equal(fields["inputs_position"], sample["position_ids"])


@pytest.mark.parametrize("workers", [0, 2])
def test_checkpointed_state_restores_the_same_batches(reader: tokformats.TokenReader, workers: int) -> None:
    packed = training.PackedSamples(reader, 16, seed=4)

    def pipeline() -> Any:
        ds = grain.MapDataset.source(tfg.source(packed, maxtext=True)).shuffle(seed=5).batch(4, drop_remainder=True)
        iterable = ds.to_iter_dataset()
        if workers:
            iterable = iterable.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))
        return iter(iterable)

    full = list(pipeline())
    assert len(full) == len(packed) // 4
    it = pipeline()
    head = [next(it) for _ in range(3)]
    state = it.get_state()
    resumed = pipeline()
    resumed.set_state(state)
    rest = list(resumed)
    assert len(head) + len(rest) == len(full)
    for got, want in zip(head + rest, full):
        assert equal(got, want)
