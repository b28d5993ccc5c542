"""megatron-core's blending greedy without its compiled helper: exact, in NumPy, within a few times its C++ loop.

``helpers.cpp``'s ``build_blending_indices`` gives sample ``s`` to the dataset whose error
``weights[j] * max(s, 1.0) - counts[j]`` (doubles) is largest, the first one on ties, then counts it. The loop is
sequential, but its whole state is the step and the counts, and the greedy forgets where it started: two runs
from different counts (same step, same total) make the same picks again after a few dozen steps. So
:func:`lockstep_greedy` cuts the steps into lanes and runs the greedy in all of them at once, one NumPy
operation per step advancing every lane:

1. lane ``k`` owns ``lane_steps`` steps from ``o_k`` and starts ``warmup`` steps earlier from guessed counts
   (each weight's share of the step, rounded to the right total; after a chunk whose lanes often failed, each
   dataset counted as picked whenever its error passed the level it was usually picked at);
2. every lane evaluates the C++ expression itself (the same double product and difference; the first maximum
   found with ``max`` and ``==``), so each lane is the exact greedy from its own start;
3. stitching proves the lanes right in order: lane 0 starts from the true counts, and a lane whose counts at
   ``o_k`` equal the previous lane's counts at its end starts from the true state, so from there its picks are
   the true greedy's. A lane that differs is checked again against the true counts (vectorised; a count that
   differs on a dataset that never comes close to winning changes no pick), and from its first wrong pick it
   is re-run by the scalar loop until the true counts meet the lane's own again.

A dataset picked less than about once in four lanes (:func:`_rare`) is the exception to "the greedy forgets": a
lane that starts one count off on it stays off until the true greedy picks it again, perhaps hundreds of lanes
later. Its picks are counted late in the guesses (after the highest error it was seen picked at), so such a lane
is one count short, after the true pick; the runs of such lanes are read off the lanes' own counts and run again
in a batch with the count corrected (:func:`_correct_rare`), before the stitching checks them like any other.

Nothing is approximated: a pick is kept only when it was computed from the true state, or verified against it.
The scalar loop (:func:`scalar_greedy`, about a microsecond a step) does the head of the blend, small blends,
non-finite weights and the rare lanes that fail their check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError

__all__ = ["MAX_DATASETS", "LockstepStats", "lockstep_greedy", "scalar_greedy"]

#: Below this many samples the scalar loop is faster than starting the lanes.
SCALAR_BELOW = 20_000
#: Elements of one (datasets x lanes) matrix: about 512 KB of doubles, so a step's temporaries stay in cache.
_MATRIX_ELEMENTS = 1 << 16
#: Steps of a chunk's end whose picks recalibrate the guesses (:func:`_pick_levels`).
_LEVEL_STEPS = 1 << 20
#: The most datasets a blend takes: its dataset index is int16, as megatron-core's (and Blend keeps one value spare).
MAX_DATASETS = 32_766


@dataclass
class LockstepStats:
    """What one :func:`lockstep_greedy` run did: how many lanes ran, how many failed their stitching check, and
    how many steps the scalar loop took."""

    lanes: int = 0
    shifted: int = 0  # lanes kept after the check against the true counts (a far-from-winning count differed)
    repaired: int = 0  # lanes re-run by the scalar loop from their first wrong pick
    scalar_steps: int = 0
    rerun: int = 0  # lanes run again, in a batch, with a rare dataset's count corrected (:func:`_correct_rare`)


def scalar_greedy(
    weights: np.ndarray,
    first: int,
    counts: list[int],
    steps: int,
    dataset_index: np.ndarray,
    dataset_sample_index: np.ndarray,
) -> list[int]:
    """``steps`` steps of the greedy from step ``first`` and ``counts``, written to the two arrays (indexed from 0
    for step ``first``); returns the counts after them. The C++ loop line by line: dataset 0's error first, a
    later dataset wins only when its error is strictly larger (see :func:`_scalar_pick`)."""
    w = [float(x) for x in weights]
    counts = list(counts)
    picks = [0] * steps
    taken = [0] * steps
    for s in range(steps):
        best = _scalar_pick(w, max(float(first + s), 1.0), counts)
        picks[s] = best
        taken[s] = counts[best]
        counts[best] += 1
    dataset_index[:steps] = picks
    dataset_sample_index[:steps] = taken
    return counts


def _scalar_pick(w: list[float], t: float, counts: list[int]) -> int:
    """The C++ loop's choice at step time ``t`` (``max(step, 1.0)``): dataset 0's error ``w[0] * t - counts[0]``
    first, a later dataset wins only when its error is strictly larger (so a NaN weight behaves as there too)."""
    best, best_error = 0, w[0] * t - float(counts[0])
    for j in range(1, len(w)):
        error = w[j] * t - float(counts[j])
        if error > best_error:
            best, best_error = j, error
    return best


def lockstep_greedy(
    weights: np.ndarray,
    size: int,
    dataset_index: np.ndarray,
    dataset_sample_index: np.ndarray,
    *,
    lane_steps: int = 1024,
    warmup: int = 128,
    lanes: int | None = None,
    scalar_below: int = SCALAR_BELOW,
) -> LockstepStats:
    """Fill ``dataset_index[:size]`` and ``dataset_sample_index[:size]`` as ``build_blending_indices`` does.

    ``lane_steps`` steps per lane, ``warmup`` steps of warm-up before them, ``lanes`` lanes at a time (default:
    as many as keep a (datasets x lanes) matrix near 512 KB); these change the speed, never the result.
    """
    w = np.ascontiguousarray(weights, dtype=np.float64)
    if len(w) > MAX_DATASETS:  # the lanes record picks as int16, as the dataset index is
        raise ConfigError(f"a blend takes at most {MAX_DATASETS:,} datasets (int16 indices); found {len(w):,}.")
    stats = LockstepStats()
    if size < max(scalar_below, warmup + 1) or len(w) == 0 or not np.isfinite(w).all():
        scalar_greedy(w, 0, [0] * len(w), size, dataset_index, dataset_sample_index)
        stats.scalar_steps = size
        return stats
    if lanes is None:
        lanes = max(64, _MATRIX_ELEMENTS // len(w))
    needed = -(-(size - warmup) // lane_steps)
    # A blend of several chunks starts with a small one: its picks calibrate the guesses of the rest when many of
    # its lanes failed (rare datasets); a blend of one chunk is not worth the extra pass.
    pilot = max(1, lanes // 16) if needed > lanes else lanes
    lanes = max(1, min(lanes, needed))
    # The head runs in the scalar loop, so every lane's warm-up starts at a step >= 0.
    counts = scalar_greedy(w, 0, [0] * len(w), warmup, dataset_index, dataset_sample_index)
    stats.scalar_steps = warmup
    state = np.array(counts, dtype=np.float64)
    low, levels = warmup, None
    rare = _rare(w, lane_steps + warmup)
    seen = np.full((2, len(rare)), np.nan)  # the lowest and highest error each was picked at
    # The lanes' picks and counts, reused by every chunk (fresh pages would cost more than filling them).
    records = np.empty((lane_steps, lanes), dtype=np.int16), np.empty((lane_steps, lanes), dtype=np.int64)
    while low < size:
        count = min(lanes if low > warmup else pilot, -(-(size - low) // lane_steps))
        high = min(size, low + count * lane_steps)
        failed = stats.repaired + stats.shifted
        starts = low - warmup + lane_steps * np.arange(count, dtype=np.int64)
        guess = _guess(w, starts, levels, (rare, _late_levels(seen)))
        state = _chunk(
            w, low, guess, warmup, state, high, records, (rare, seen), dataset_index, dataset_sample_index, stats
        )
        if stats.repaired + stats.shifted - failed > count // 100:
            levels = _pick_levels(w, low, dataset_index[low:high], dataset_sample_index[low:high], levels)
        low = high
    return stats


def _rare(w: np.ndarray, steps: int) -> np.ndarray:
    """The datasets whose counts a lane of ``steps`` steps (warm-up included) cannot correct: the lightest ones,
    as long as all of them together are picked less than once in four such lanes. (A lane's guess counts their
    picks late and the heaviest dataset takes up the difference, so together they must stay a small part of a
    lane; a blend of many equal small weights has no rare dataset.)"""
    order = np.argsort(w, kind="stable")
    order = order[w[order] > 0]
    together = np.cumsum(w[order]) * steps
    rare: np.ndarray = np.sort(order[together < 0.25])
    return rare


def _chunk(
    w: np.ndarray,
    low: int,
    guess: np.ndarray,
    warmup: int,
    state: np.ndarray,
    high: int,
    records: tuple[np.ndarray, np.ndarray],
    rare: tuple[np.ndarray, np.ndarray],
    dataset_index: np.ndarray,
    dataset_sample_index: np.ndarray,
    stats: LockstepStats,
) -> np.ndarray:
    """Steps ``[low, high)`` from the true counts ``state`` at ``low``, in one lane per column of ``guess`` (the
    counts each starts from, ``warmup`` steps before its own); returns the true counts at the lanes' end."""
    count = guess.shape[1]
    picks, taken = records[0][:, :count], records[1][:, :count]
    lane_steps = len(picks)
    owned = low + lane_steps * np.arange(count, dtype=np.int64)
    at_start, at_end = _run_lanes(w, owned - warmup, guess, warmup, picks, taken)
    lanes = (guess, picks, taken, at_start, at_end)
    if len(rare[0]):
        _correct_rare(w, rare[0], owned - warmup, warmup, state, lanes, stats)
    _stitch(w, owned, state, picks, taken, at_start, at_end, stats)
    if len(rare[0]):
        _record_rare(w, rare[0], owned, lanes, rare[1])
    if high - low == count * lane_steps:  # whole lanes: copy the transposed matrices straight into place
        np.copyto(dataset_index[low:high].reshape(count, lane_steps), picks.T)
        np.copyto(dataset_sample_index[low:high].reshape(count, lane_steps), taken.T)
    else:
        dataset_index[low:high] = picks.T.reshape(-1)[: high - low]
        dataset_sample_index[low:high] = taken.T.reshape(-1)[: high - low]
    end: np.ndarray = at_end[:, -1].copy()
    return end


def _guess(
    w: np.ndarray, starts: np.ndarray, levels: np.ndarray | None, late: tuple[np.ndarray, np.ndarray] | None = None
) -> np.ndarray:
    """Plausible counts at each step of ``starts`` (datasets x lanes). Only a start: the warm-up and the stitching
    make the result exact whatever the guess is, but a good one spares repairs.

    Without ``levels``, each weight's share of the step rounded down, the steps still missing given to the
    largest remainders. With ``levels`` (the error at which each dataset is usually picked), a dataset has been
    picked once for every time its error ``w * s - count`` reached its level; the heaviest dataset (the warm-up
    corrects it fastest) takes up the difference to the step. That matters for rare datasets: their count is
    settled long before a lane starts, and the warm-up cannot correct it. A dataset of ``late`` (rare datasets
    and a level each, NaN for none) is counted as picked once for every time its error passed that level, later
    than its picks are expected (see :func:`_late_levels`); the heaviest dataset again takes up the difference.
    """
    counts = _shares(w, starts, levels)
    rare, level = late if late is not None else (np.empty(0, np.intp), np.empty(0))
    known = np.isfinite(level)
    if known.any():
        t = np.maximum(starts, 1).astype(np.float64)
        counts[rare[known]] = np.maximum(np.ceil(w[rare[known], None] * t[None, :] - level[known, None]), 0.0)
        counts[int(np.argmax(w))] += starts - counts.sum(axis=0)
    return counts


def _shares(w: np.ndarray, starts: np.ndarray, levels: np.ndarray | None) -> np.ndarray:
    """Each weight's share of every step of ``starts`` as counts (datasets x lanes) summing to the step: rounded
    by :func:`_guess`'s rule, with or without ``levels``."""
    n = len(w)
    positive = np.maximum(w, 0.0)
    total = float(positive.sum())
    share = positive / total if total > 0 and math.isfinite(total) else np.full(n, 1.0 / n)
    ideal = share[:, None] * starts[None, :].astype(np.float64)
    if levels is not None:
        counts: np.ndarray = np.maximum(np.ceil(ideal - levels[:, None]), 0.0)
        counts[int(np.argmax(share))] += starts - counts.sum(axis=0)
        return counts
    counts = np.floor(ideal)
    missing = starts - counts.sum(axis=0)
    order = np.argsort(counts - ideal, axis=0, kind="stable")  # the largest remainder first
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(n)[:, None], order.shape), axis=0)
    counts += rank < missing[None, :]
    return counts


def _pick_levels(
    w: np.ndarray, first: int, index: np.ndarray, sample: np.ndarray, previous: np.ndarray | None
) -> np.ndarray:
    """Each dataset's mean error when it was picked over the blend made so far (``index``/``sample`` from step
    ``first``): where :func:`_guess` expects its next picks. A dataset not picked keeps its previous level, or
    takes the lowest level seen (the rarer a dataset, the lower the error it wins at)."""
    n = len(w)
    tail = max(0, len(index) - _LEVEL_STEPS)  # the last steps are enough, and cost little next to the chunk
    first, index, sample = first + tail, index[tail:].astype(np.intp), sample[tail:]
    t = np.maximum(np.arange(first, first + len(index), dtype=np.float64), 1.0)
    errors = w[index] * t - sample
    picked = np.bincount(index, minlength=n)
    levels = np.bincount(index, weights=errors, minlength=n) / np.maximum(picked, 1)
    seen = picked > 0
    fallback = previous if previous is not None else np.full(n, float(levels[seen].min()) if seen.any() else 0.5)
    return np.where(seen, levels, fallback)


def _late_levels(seen: np.ndarray) -> np.ndarray:
    """Where :func:`_guess` counts a rare dataset's next pick: after the highest error it was picked at so far,
    with a margin (a quarter of the spread of its errors at its picks, at least a tenth of the level). Late on
    purpose: a lane that counts a pick too late is corrected by :func:`_correct_rare`, one that counts it too
    early is not. A dataset not picked yet takes the latest level of those that were, NaN if none was (``seen`` =
    lowest and highest error, rows)."""
    lowest, highest = seen
    late: np.ndarray = highest + np.maximum(0.25 * (highest - lowest), 0.1 * np.abs(highest))
    known = np.isfinite(late)
    if known.any():  # one not picked yet is lighter than most that were: it wins at lower errors than theirs
        late[~known] = late[known].max()
    return late


def _record_rare(
    w: np.ndarray,
    rare: np.ndarray,
    owned: np.ndarray,
    lanes: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    seen: np.ndarray,
) -> None:
    """Widen ``seen`` (lowest and highest error at a pick, rows; a column per rare dataset) by the rare datasets'
    picks in the (stitched, true) lanes from steps ``owned``: only the lanes whose counts show such a pick are
    read."""
    _, picks, taken, at_start, at_end = lanes
    columns = np.flatnonzero((at_end[rare] != at_start[rare]).any(axis=0))
    position = np.full(len(w), -1, dtype=np.intp)  # each dataset's column in ``seen``; -1 if not rare
    position[rare] = np.arange(len(rare))
    chosen = picks[:, columns]
    rows, lane = np.nonzero(position[chosen] >= 0)
    dataset = chosen[rows, lane].astype(np.intp)
    t = np.maximum((owned[columns[lane]] + rows).astype(np.float64), 1.0)
    errors = w[dataset] * t - taken[rows, columns[lane]]
    np.fmin.at(seen[0], position[dataset], errors)
    np.fmax.at(seen[1], position[dataset], errors)


def _correct_rare(
    w: np.ndarray,
    rare: np.ndarray,
    starts: np.ndarray,
    warmup: int,
    state: np.ndarray,
    lanes: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    stats: LockstepStats,
) -> None:
    """Run again, in one batch, the lanes whose guess counted a rare dataset's pick too late.

    A rare dataset's count is not corrected by the warm-up, so after the true greedy picks it, every lane that
    started from the old count misses that pick until the guesses count it (a run of lanes, each consistent with
    the one before). :func:`_corrections` finds those runs from the lanes' counts alone, and the lanes are run
    again from their guess with the count corrected (``lanes`` = guess, picks, taken, counts at the start, at
    the end; updated in place). A correction that proves wrong costs a repair in :func:`_stitch`, nothing more:
    the stitching still checks every lane. Up to three rounds, however many lanes they take: a lane run again
    costs far less than a lane repaired in the scalar loop."""
    guess, picks, taken, at_start, at_end = lanes
    heaviest = int(np.argmax(w))
    for _ in range(3):
        corrections = _corrections(rare, state, at_start, at_end)
        redo = np.flatnonzero(corrections.any(axis=0))
        if len(redo) == 0:
            return
        start = guess[:, redo]
        start[rare] += corrections[:, redo]
        start[heaviest] -= corrections[:, redo].sum(axis=0)
        if (start < 0).any():
            return
        more_picks = np.empty((len(picks), len(redo)), dtype=picks.dtype)
        more_taken = np.empty((len(picks), len(redo)), dtype=taken.dtype)
        first, last = _run_lanes(w, starts[redo], start, warmup, more_picks, more_taken)
        guess[:, redo] = start
        picks[:, redo], taken[:, redo] = more_picks, more_taken
        at_start[:, redo], at_end[:, redo] = first, last
        stats.rerun += len(redo)


def _corrections(rare: np.ndarray, state: np.ndarray, at_start: np.ndarray, at_end: np.ndarray) -> np.ndarray:
    """How far each lane's count of each rare dataset (rows) is from the true one, as far as the lanes' own counts
    tell: a lane that starts with a different count than its predecessor ends with starts a run, and the
    difference carries over to the following lanes until one of them picks that dataset itself (from there its
    own count is the greedy's) or the guesses make up for it (the next difference)."""
    steps = np.empty((len(rare), at_start.shape[1]))
    steps[:, 0] = state[rare] - at_start[rare, 0]
    np.subtract(at_end[rare, :-1], at_start[rare, 1:], out=steps[:, 1:])
    total = np.cumsum(steps, axis=1)
    # A lane that picked the dataset restarts the sum: from the lane after it, only new differences count.
    restart = np.zeros(steps.shape, dtype=np.intp)
    restart[:, 1:] = np.where(at_end[rare, :-1] != at_start[rare, :-1], np.arange(1, steps.shape[1]), 0)
    since = np.maximum.accumulate(restart, axis=1)
    before = np.take_along_axis(total, np.maximum(since - 1, 0), axis=1)
    corrections: np.ndarray = total - np.where(since > 0, before, 0.0)
    return corrections


class _Lanes:
    """The greedy's state in many lanes at once (datasets x lanes counts), and the buffers one step reuses."""

    def __init__(self, w: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> None:
        n, lanes = counts.shape
        code_type = np.uint8 if n < 256 else np.uint16
        self.n = n
        self.column = w[:, None]
        self.counts = np.array(counts, dtype=np.float64, order="C")  # its own copy, so that ``flat`` is a view
        self.flat = self.counts.reshape(-1)
        self.first = starts.astype(np.float64)
        # Row j scores n - j where it ties the maximum: the largest score is the first maximum, as the C++ keeps.
        self.score = (n - np.arange(n)).astype(code_type)[:, None]
        self.offsets = np.arange(lanes, dtype=np.intp)
        self.t = np.empty(lanes)
        self.errors = np.empty((n, lanes))
        self.best = np.empty(lanes)
        self.tied = np.empty((n, lanes), dtype=bool)
        self.scored = np.empty((n, lanes), dtype=code_type)
        self.top = np.empty(lanes, dtype=code_type)
        self.pick = np.empty(lanes, dtype=np.intp)
        self.where = np.empty(lanes, dtype=np.intp)
        self.taken = np.empty(lanes)
        self.after = np.empty(lanes)

    def step(self, i: int) -> None:
        """Pick step ``first + i`` in every lane: ``pick`` and ``taken`` (the count before it); not yet counted."""
        np.add(self.first, float(i), out=self.t)
        np.maximum(self.t, 1.0, out=self.t)
        np.multiply(self.column, self.t, out=self.errors)  # weights[j] * max(s, 1.0)
        np.subtract(self.errors, self.counts, out=self.errors)  # - current_samples[j], as the C++ rounds it
        np.max(self.errors, axis=0, out=self.best)
        np.equal(self.errors, self.best, out=self.tied)
        np.multiply(self.tied, self.score, out=self.scored)
        np.max(self.scored, axis=0, out=self.top)
        np.subtract(self.n, self.top, out=self.pick, casting="unsafe")
        np.multiply(self.pick, len(self.offsets), out=self.where)
        self.where += self.offsets
        np.take(self.flat, self.where, out=self.taken)

    def count(self) -> None:
        """Count the picks of the last :meth:`step`."""
        np.add(self.taken, 1.0, out=self.after)
        self.flat[self.where] = self.after


def _run_lanes(
    w: np.ndarray, starts: np.ndarray, guess: np.ndarray, warmup: int, picks: np.ndarray, taken: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Run every lane ``warmup + len(picks)`` steps from ``guess`` at ``starts``; the picks and counts before
    them of the last ``len(picks)`` steps go to ``picks`` and ``taken`` (steps x lanes). Returns the counts at
    the start and end of those steps."""
    lanes = _Lanes(w, starts, guess)
    for i in range(warmup):
        lanes.step(i)
        lanes.count()
    at_start = lanes.counts.copy()
    for i in range(len(picks)):
        lanes.step(warmup + i)
        picks[i] = lanes.pick
        taken[i] = lanes.taken
        lanes.count()
    return at_start, lanes.counts


def _stitch(
    w: np.ndarray,
    owned: np.ndarray,
    state: np.ndarray,
    picks: np.ndarray,
    taken: np.ndarray,
    at_start: np.ndarray,
    at_end: np.ndarray,
    stats: LockstepStats,
) -> None:
    """Make every lane the true greedy, in order: a lane that starts from its predecessor's (true) end counts is
    right as it is; the others are checked against the true counts and repaired. ``at_end`` ends true."""
    count = picks.shape[1]
    good = np.empty(count, dtype=bool)
    good[0] = np.array_equal(at_start[:, 0], state)
    good[1:] = (at_start[:, 1:] == at_end[:, :-1]).all(axis=0)
    stats.lanes += count
    wrong = np.flatnonzero(~good)
    k = int(wrong[0]) if len(wrong) else count
    while k < count:
        start = state if k == 0 else at_end[:, k - 1]
        _repair(w, int(owned[k]), start, picks[:, k], taken[:, k], at_start[:, k], at_end[:, k], stats)
        if k + 1 < count:  # its end may have moved: does the next lane still start from it?
            good[k + 1] = np.array_equal(at_start[:, k + 1], at_end[:, k])
        wrong = np.flatnonzero(~good[k + 1 :])
        k = k + 1 + int(wrong[0]) if len(wrong) else count


def _repair(
    w: np.ndarray,
    first: int,
    start: np.ndarray,
    picks: np.ndarray,
    taken: np.ndarray,
    guessed: np.ndarray,
    end: np.ndarray,
    stats: LockstepStats,
) -> None:
    """Make one lane (``picks``/``taken`` from step ``first``, run from counts ``guessed``) the greedy from the
    true counts ``start``, in place, ``end`` included. The picks that the true counts confirm are kept (their
    counts shifted); from the first wrong one the scalar loop runs until the true counts meet the lane's again
    (from there the lane is the greedy itself), then the rest is checked the same way."""
    position, truth = 0, start.copy()
    lane = guessed.copy()  # the lane's own counts at ``position``
    while position < len(picks):
        right = _confirmed(w, first + position, truth, picks[position:])
        mine = picks[position : position + right]
        taken[position : position + right] += (truth - lane)[mine].astype(np.int64)
        counted = np.bincount(mine, minlength=len(w))
        truth += counted
        lane += counted
        position += right
        if position == len(picks):
            break
        stats.repaired += 1
        steps = _resync(w, first + position, truth, lane, picks[position:], taken[position:])
        stats.scalar_steps += steps
        position += steps
    if np.array_equal(truth, lane):
        return
    stats.shifted += 1
    end += truth - lane


def _resync(
    w: np.ndarray, first: int, truth: np.ndarray, lane: np.ndarray, picks: np.ndarray, taken: np.ndarray
) -> int:
    """The scalar greedy from the true counts ``truth`` at step ``first`` over the lane's ``picks``/``taken``
    (overwritten), until its counts equal the lane's (``lane``, advanced by the lane's own picks) or the lane
    ends; both count vectors are updated in place. Returns the steps taken."""
    weights = [float(x) for x in w]
    n = len(weights)
    counts = [int(c) for c in truth]
    differ = [int(c) for c in truth - lane]  # true counts minus the lane's
    unequal = sum(1 for d in differ if d)
    theirs = picks.tolist()
    mine: list[int] = []
    before: list[int] = []
    for step, their in enumerate(theirs):
        best = _scalar_pick(weights, max(float(first + step), 1.0), counts)
        mine.append(best)
        before.append(counts[best])
        counts[best] += 1
        if best != their:
            unequal -= (differ[best] != 0) + (differ[their] != 0)
            differ[best] += 1
            differ[their] -= 1
            unequal += (differ[best] != 0) + (differ[their] != 0)
            if not unequal:
                break
        elif not unequal:
            break
    steps = len(mine)
    lane += np.bincount(picks[:steps], minlength=n)
    picks[:steps] = mine
    taken[:steps] = before
    truth[:] = counts
    return steps


def _confirmed(w: np.ndarray, first: int, start: np.ndarray, picks: np.ndarray) -> int:
    """How many of ``picks`` (from step ``first``) the greedy makes from counts ``start``: each step's errors
    recomputed from the counts the earlier picks give, with the C++ expression and its first-maximum rule."""
    steps = len(picks)
    chosen = picks.astype(np.intp)
    hits = np.zeros((steps, len(w)))
    hits[np.arange(1, steps), chosen[:-1]] = 1.0  # row i counts the picks before step first + i
    counts = np.cumsum(hits, axis=0)
    counts += start
    t = np.maximum(np.arange(first, first + steps, dtype=np.float64), 1.0)
    errors = w[None, :] * t[:, None]
    errors -= counts
    greedy = np.argmax(errors == errors.max(axis=1)[:, None], axis=1)
    differ = np.flatnonzero(greedy != chosen)
    return int(differ[0]) if len(differ) else steps
