"""The blending greedy without megatron-core's compiled helper (``training/greedy.py``): bit for bit the scalar
reference loop always, and megatron-core 0.16.1's ``helpers_cpp.build_blending_indices`` when it is installed,
on seeded random weight sets (2 to 64 datasets, skewed, tiny, tied, not summing to 1) and sizes."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

from tokformats.training import greedy, indices

#: Lane settings small enough that blends of a few thousand samples run many chunks, lanes and stitches.
TIGHT = {"scalar_below": 0, "lane_steps": 16, "warmup": 8, "lanes": 7}


def megatron_normalize(weights: np.ndarray) -> np.ndarray:
    """megatron.core.datasets.utils.normalize, which BlendedDataset applies before the C++ loop."""
    w = np.array(weights, dtype=np.float64)
    return np.array((w / np.sum(w)).tolist())


def random_weights(rng: np.random.Generator) -> np.ndarray:
    """One weight set of a random kind: uniform, heavy-tailed, with tiny weights, tied, or raw (not normalised)."""
    n = int(rng.choice([2, 3, 5, 10, 17, 64]))
    kind = int(rng.integers(0, 5))
    if kind == 0:
        raw = rng.uniform(0.5, 2.0, n)
    elif kind == 1:
        raw = rng.lognormal(0.0, 3.0, n)
    elif kind == 2:
        raw = rng.uniform(0.5, 2.0, n)
        raw[rng.integers(0, n, size=max(1, n // 3))] = 10.0 ** rng.uniform(-9, -4)
    elif kind == 3:
        raw = rng.integers(1, 4, n).astype(np.float64)  # equal weights: exact ties every few steps
    else:
        return rng.uniform(0.1, 3.0, n)  # not normalised at all: the C++ takes them as they are
    return megatron_normalize(raw)


def reference(weights: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    index, sample = np.zeros(size, np.int16), np.zeros(size, np.int64)
    indices._greedy(weights, size, None, index, sample)
    return index, sample


def lockstep(weights: np.ndarray, size: int, **options: Any) -> tuple[np.ndarray, np.ndarray, greedy.LockstepStats]:
    index, sample = np.zeros(size, np.int16), np.zeros(size, np.int64)
    stats = greedy.lockstep_greedy(weights, size, index, sample, **options)
    return index, sample, stats


@pytest.fixture(scope="module")
def helpers_cpp() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pytest.importorskip("megatron.core.datasets.helpers_cpp", reason="megatron-core is not installed")


def megatron(helpers_cpp: Any, weights: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    index, sample = np.zeros(size, np.int16), np.zeros(size, np.int64)
    helpers_cpp.build_blending_indices(index, sample, weights, len(weights), size, False)
    return index, sample


@pytest.mark.parametrize("seed", range(12))
def test_lanes_equal_the_scalar_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(6):
        weights = random_weights(rng)
        size = int(rng.choice([0, 1, 2, 3, 17, int(rng.integers(20, 3000))]))
        expected = reference(weights, size)
        for options in (TIGHT, {**TIGHT, "warmup": 0}, {"scalar_below": 0, "lane_steps": 64, "warmup": 32}):
            index, sample, _ = lockstep(weights, size, **options)
            np.testing.assert_array_equal(index, expected[0], err_msg=f"{weights.tolist()}, {size}, {options}")
            np.testing.assert_array_equal(sample, expected[1], err_msg=f"{weights.tolist()}, {size}, {options}")


def test_repairs_run_and_stay_exact() -> None:
    """Without warm-up every lane starts from a guess, so the stitching repairs (and shifts) lanes; the result is
    still the reference's, and the statistics add up."""
    rng = np.random.default_rng(5)
    weights = megatron_normalize(rng.lognormal(0.0, 3.0, 10))
    size = 6000
    index, sample, stats = lockstep(weights, size, scalar_below=0, lane_steps=32, warmup=0, lanes=16)
    expected = reference(weights, size)
    np.testing.assert_array_equal(index, expected[0])
    np.testing.assert_array_equal(sample, expected[1])
    assert stats.lanes == -(-size // 32)
    assert stats.repaired > 0
    assert 0 < stats.scalar_steps < size


def test_counts_match_samples_per_dataset() -> None:
    weights = megatron_normalize(np.array([5.0, 1.0, 1e-6, 3.0]))
    index, sample, _ = lockstep(weights, 50_000, scalar_below=0, lane_steps=100, warmup=40)
    for j in range(len(weights)):
        mine = sample[index == j]
        np.testing.assert_array_equal(mine, np.arange(len(mine)))  # each dataset's samples in order, none skipped
    counts = np.bincount(index, minlength=4)
    np.testing.assert_array_equal(counts, np.bincount(reference(weights, 50_000)[0], minlength=4))
    np.testing.assert_array_equal(counts, [27_777, 5_556, 1, 16_666])  # 50,000 x (5, 1, 0, 3) / 9, rounded


def test_non_finite_weights_take_the_scalar_loop() -> None:
    for weights in ([0.5, float("nan"), 0.5], [float("nan"), 0.2, 0.8], [0.2, float("inf"), 0.3]):
        w = np.array(weights)
        index, sample, stats = lockstep(w, 500, scalar_below=0, lane_steps=16, warmup=8)
        assert stats.scalar_steps == 500
        assert stats.lanes == 0
        assert index.dtype == np.int16
        assert sample.dtype == np.int64
    index, _, _ = lockstep(np.array([float("nan"), 0.2, 0.8]), 10)
    np.testing.assert_array_equal(index, np.zeros(10))  # the C++'s rule: a NaN first error is never beaten


@pytest.mark.parametrize("seed", range(8))
def test_lanes_equal_helpers_cpp(helpers_cpp: Any, seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    for _ in range(5):
        weights = random_weights(rng)
        size = int(rng.choice([0, 1, 2, int(rng.integers(3, 5000)), int(rng.integers(20_000, 200_000))]))
        expected = megatron(helpers_cpp, weights, size)
        for options in ({}, TIGHT, {"scalar_below": 0, "lane_steps": 128, "warmup": 16, "lanes": 50}):
            index, sample, _ = lockstep(weights, size, **options)
            np.testing.assert_array_equal(index, expected[0], err_msg=f"{weights.tolist()}, {size}, {options}")
            np.testing.assert_array_equal(sample, expected[1], err_msg=f"{weights.tolist()}, {size}, {options}")


def test_large_blend_equals_helpers_cpp(helpers_cpp: Any) -> None:
    """Several chunks at the default settings, on the benchmark's kind of weights and on heavy-tailed ones."""
    for raw in (np.random.default_rng(3).uniform(0.5, 2.0, 10), np.random.default_rng(2).lognormal(0.0, 3.0, 10)):
        weights = megatron_normalize(raw)
        size = 1_500_000
        expected = megatron(helpers_cpp, weights, size)
        index, sample, stats = lockstep(weights, size, lanes=1000)
        assert stats.lanes == -(-(size - 128) // 1024)  # the default warm-up and lane length
        np.testing.assert_array_equal(index, expected[0])
        np.testing.assert_array_equal(sample, expected[1])


def test_non_finite_weights_equal_helpers_cpp(helpers_cpp: Any) -> None:
    for weights in ([0.5, float("nan"), 0.5], [float("nan"), 0.2, 0.8], [0.2, float("inf"), 0.3], [-0.5, 1.5]):
        w = np.array(weights)
        expected = megatron(helpers_cpp, w, 300)
        index, sample, _ = lockstep(w, 300, scalar_below=0, lane_steps=16, warmup=8)
        np.testing.assert_array_equal(index, expected[0])
        np.testing.assert_array_equal(sample, expected[1])


def test_blending_indices_without_megatron(helpers_cpp: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    weights = megatron_normalize(np.random.default_rng(9).uniform(0.5, 2.0, 6))
    expected = indices.blending_indices(weights.tolist(), 120_000)  # through helpers_cpp
    monkeypatch.setattr(indices, "_megatron_helpers", lambda: None)
    got = indices.blending_indices(weights.tolist(), 120_000)
    assert got[0].dtype == np.int16
    assert got[1].dtype == np.int64
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_array_equal(got[1], expected[1])


def test_guesses_are_counts_of_the_step() -> None:
    """Both kinds of guess are whole counts that add up to the step (the greedy's invariant), and the calibrated
    one counts a dataset as picked once its error passed its level."""
    weights = megatron_normalize(np.array([7.0, 2.0, 1.0, 1e-5]))
    starts = np.array([0, 1, 5, 999, 123_457])
    for levels in (None, np.array([0.9, 0.4, 0.3, 0.1])):
        guess = greedy._guess(weights, starts, levels)
        assert guess.shape == (4, 5)
        np.testing.assert_array_equal(guess.sum(axis=0), starts)
        np.testing.assert_array_equal(guess, np.round(guess))
    guess = greedy._guess(weights, starts, np.array([0.9, 0.4, 0.3, 0.1]))
    # dataset 3 at step 123,457: error 1e-5 / (10 + 1e-5) * 123,457 = 0.1235 > 0.1 -> picked once
    np.testing.assert_array_equal(guess[3], [0, 0, 0, 0, 1])
    np.testing.assert_array_equal(guess[1], np.maximum(np.ceil(weights[1] * starts - 0.4), 0))


def test_pick_levels_are_mean_errors_at_picks() -> None:
    weights = megatron_normalize(np.array([3.0, 2.0, 1.0, 1e-9, 1e-9]))
    size = 5000
    index, sample = reference(weights, size)
    levels = greedy._pick_levels(weights, 0, index, sample, None)
    errors: list[list[float]] = [[] for _ in weights]
    for s in range(size):
        j = int(index[s])
        errors[j].append(float(weights[j]) * max(float(s), 1.0) - float(sample[s]))
    picked = [k for k in range(len(weights)) if errors[k]]
    expected = {k: float(np.mean(errors[k])) for k in picked}
    assert {0, 1, 2} <= set(picked)
    assert len(picked) < len(weights)  # a 1e-9 dataset is never picked in 5,000 steps (the first tie is)
    for k in range(len(weights)):
        if k in expected:
            assert levels[k] == pytest.approx(expected[k], rel=1e-12)
        else:
            assert levels[k] == min(expected.values())  # never picked: the lowest level seen
    previous = np.full(len(weights), 0.05)
    again = greedy._pick_levels(weights, 0, index, sample, previous)
    assert [again[k] for k in range(len(weights)) if k not in expected] == [0.05]  # or the level it had


def test_calibrated_chunks_stay_exact() -> None:
    """Skewed weights make the small first chunk fail often enough to recalibrate the guesses of the others."""
    weights = megatron_normalize(np.random.default_rng(2).lognormal(0.0, 3.0, 10))
    size = 60_000
    index, sample, stats = lockstep(weights, size, scalar_below=0, lane_steps=64, warmup=16, lanes=160)
    expected = reference(weights, size)
    np.testing.assert_array_equal(index, expected[0])
    np.testing.assert_array_equal(sample, expected[1])
    assert stats.repaired + stats.shifted > 0  # failing lanes in the first chunk (10 lanes) start the calibration


def test_lanes_take_any_layout_of_guesses() -> None:
    """A guess that is not C-ordered (a fancy-indexed selection of lanes is not) runs the same lanes, and the
    guess itself is left as it was."""
    weights = megatron_normalize(np.array([4.0, 2.0, 1.0]))
    starts = np.arange(0, 4000, 500, dtype=np.int64)
    guess = greedy._guess(weights, starts, None)
    results = []
    for given in (guess.copy(), np.asfortranarray(guess)):
        before = given.copy()
        picks, taken = np.empty((64, len(starts)), np.int16), np.empty((64, len(starts)), np.int64)
        at_start, at_end = greedy._run_lanes(weights, starts, given, 16, picks, taken)
        np.testing.assert_array_equal(given, before)
        np.testing.assert_array_equal(at_end - at_start, np.stack([np.bincount(p, minlength=3) for p in picks.T], 1))
        results.append((picks, taken, at_start, at_end))
    for first, second in zip(*results):
        np.testing.assert_array_equal(first, second)


def test_a_blend_of_more_datasets_than_int16_indices_hold_is_refused() -> None:
    from tokformats.errors import ConfigError

    weights = np.full(greedy.MAX_DATASETS + 1, 1.0 / (greedy.MAX_DATASETS + 1))
    with pytest.raises(ConfigError, match=r"at most 32,766 datasets \(int16 indices\); found 32,767"):
        indices.blending_indices(weights, 10)
    with pytest.raises(ConfigError, match="at most 32,766 datasets"):
        greedy.lockstep_greedy(weights, 10, np.zeros(10, np.int16), np.zeros(10, np.int64))


def tiny_weight_sets() -> list[np.ndarray]:
    """Weight sets with datasets far below a pick per lane (1e-7 to 1e-3 of the blend), beside ordinary ones: few
    or many datasets, equal tiny weights (ties between them), equal large weights, raw and normalised."""
    rng = np.random.default_rng(28)
    return [
        megatron_normalize(np.array([5.0, 3.0, 1.0, 0.5, 0.2, 1e-3, 1e-4, 1e-5, 1e-6, 1e-7])),
        megatron_normalize(np.concatenate([rng.uniform(0.5, 2.0, 20), 10.0 ** rng.uniform(-7, -3, 12)])),
        megatron_normalize(np.array([1.0, 1.0, 1.0, 1e-6, 1e-6, 2.0, 2.0, 1e-4, 1e-4])),  # ties everywhere
        megatron_normalize(np.concatenate([rng.lognormal(0.0, 3.0, 40), [1e-7, 3e-7, 1e-6]])),
        megatron_normalize(np.random.default_rng(2).lognormal(0.0, 3.0, 10)),  # bench_blend.py's lognormal set
        np.array([0.6, 0.4, 2e-6, 5e-7]),  # not normalised: sums past 1
    ]


@pytest.mark.parametrize("which", range(6))
def test_tiny_weights_equal_the_scalar_reference(which: int) -> None:
    """Small blends at lane settings that make many chunks, lanes and corrections, against the scalar loop."""
    weights = tiny_weight_sets()[which]
    for size in (0, 1, 2, 3, 500, 7_000, 40_000):
        expected = reference(weights, size)
        for options in (TIGHT, {"scalar_below": 0, "lane_steps": 64, "warmup": 16, "lanes": 40}):
            index, sample, _ = lockstep(weights, size, **options)
            np.testing.assert_array_equal(index, expected[0], err_msg=f"{weights.tolist()}, {size}, {options}")
            np.testing.assert_array_equal(sample, expected[1], err_msg=f"{weights.tolist()}, {size}, {options}")


@pytest.mark.parametrize("which", range(6))
def test_tiny_weights_equal_helpers_cpp(helpers_cpp: Any, which: int) -> None:
    """Blends up to 1.5 M samples at the default settings (several chunks, the correction rounds on) and at
    small lanes, bit for bit megatron-core's."""
    weights = tiny_weight_sets()[which]
    for size in (0, 1, 2, 19_999, 20_000, 300_000, 1_500_000):
        expected = megatron(helpers_cpp, weights, size)
        for options in ({}, {"lane_steps": 256, "warmup": 64, "lanes": 300}):
            if size > 300_000 and options:
                continue  # small lanes on the largest blend add time, not cases
            index, sample, _ = lockstep(weights, size, **options)
            np.testing.assert_array_equal(index, expected[0], err_msg=f"{weights.tolist()}, {size}, {options}")
            np.testing.assert_array_equal(sample, expected[1], err_msg=f"{weights.tolist()}, {size}, {options}")


def test_rare_datasets_are_corrected_in_batches_not_repaired(helpers_cpp: Any) -> None:
    """The benchmark's lognormal set (one dataset at 2.5e-6): the lanes that counted its pick too late run again
    in a batch, and almost nothing is left to the scalar loop."""
    weights = tiny_weight_sets()[4]
    size = 1_500_000
    expected = megatron(helpers_cpp, weights, size)
    index, sample, stats = lockstep(weights, size)
    np.testing.assert_array_equal(index, expected[0])
    np.testing.assert_array_equal(sample, expected[1])
    assert stats.rerun > 0
    assert stats.scalar_steps < size // 1000  # main's lanes left 1.8% of the steps to the scalar loop


def test_rare_datasets_are_the_lightest_few() -> None:
    steps = 1024 + 128
    np.testing.assert_array_equal(greedy._rare(np.array([0.5, 0.3, 1e-6, 0.2 - 1e-6, 1e-7]), steps), [2, 4])
    assert len(greedy._rare(np.full(1000, 1e-3), steps)) == 0  # each is picked about once a lane: none is rare
    # 10,000 equal weights: only as many as stay under a quarter of a pick per lane together (two of them)
    np.testing.assert_array_equal(greedy._rare(np.full(10_000, 1e-4), steps), [0, 1])
    np.testing.assert_array_equal(greedy._rare(np.array([0.0, -1e-3, 1e-5, 1.0]), steps), [2])  # only positive
    # the lightest first, while all of them together stay under a quarter of a pick per lane
    weights = np.array([0.9, 1e-4, 2e-5, 1e-4, 1e-6])
    np.testing.assert_array_equal(greedy._rare(weights, steps), [1, 2, 4])  # 1e-6 + 2e-5 + 1e-4 + 1e-4 is too much


def test_corrections_follow_a_run_of_late_counts() -> None:
    """One rare dataset (row 1 of the counts): lane 0 picks it; lanes 1-3 started from the old count and did not
    (one late run, corrected by +1), lane 4's guess counts the pick; lane 5 picks it itself, lane 6 starts late
    again but lane 6 picks it in its own steps, so lane 7 is corrected only by its own difference."""
    state = np.array([100.0, 3.0])
    start = np.array([[100, 3], [200, 3], [300, 3], [400, 3], [500, 4], [600, 4], [700, 4], [800, 5]], float).T
    end = np.array([[199, 4], [300, 3], [400, 3], [500, 3], [600, 4], [699, 5], [799, 5], [900, 5]], float).T
    corrections = greedy._corrections(np.array([1]), state, start, end)
    np.testing.assert_array_equal(corrections, [[0, 1, 1, 1, 0, 0, 1, 0]])


def test_late_levels_come_after_every_pick_seen() -> None:
    seen = np.array([[0.1, np.nan, 0.3], [0.2, np.nan, 0.3]])
    late = greedy._late_levels(seen)
    np.testing.assert_allclose(late, [0.2 + 0.025, 0.33, 0.3 + 0.03])  # the unseen one: the latest of the others
    assert np.isnan(greedy._late_levels(np.full((2, 2), np.nan))).all()
