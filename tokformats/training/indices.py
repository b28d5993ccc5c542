"""Megatron's sample and blending indices, in NumPy, equal in dtype and value to megatron-core 0.16.1.

Everything here is a pure function of the unit lengths and the options, so that the classes built on it
(:class:`~tokformats.training.GPTSamples`, :class:`~tokformats.training.Blend`) can cache its results and
tests can compare it directly with ``megatron.core.datasets``:

- ``split_matrix``/``split_range``: ``BlendedMegatronDatasetConfig``'s split string and the builder's ranges.
- ``document_index``/``shuffle_index``: ``gpt_dataset._build_document_index``/``_build_shuffle_index``
  (NumPy's legacy ``RandomState``, whose streams are frozen by NEP 19).
- ``sample_index``: ``helpers.cpp``'s ``build_sample_idx`` as one ``cumsum`` and one ``searchsorted``.
- ``blending_indices``: ``helpers.cpp``'s greedy (``build_blending_indices`` and the exhaustive variant),
  through megatron's compiled helpers when they import, else exact NumPy lanes (``greedy.py``).
"""

from __future__ import annotations

import functools
import itertools
import math
import re
import warnings
from collections.abc import Sequence

import numpy as np

from ..errors import ConfigError
from .greedy import MAX_DATASETS, lockstep_greedy, scalar_greedy

__all__ = [
    "SPLIT_NAMES",
    "split_matrix",
    "split_index",
    "split_range",
    "num_epochs",
    "separate_final_epoch",
    "document_index",
    "sample_index",
    "num_samples_of",
    "shuffle_index",
    "blending_indices",
    "exhaustive_blending_indices",
]

#: Megatron's ``Split`` enum, in order.
SPLIT_NAMES = ("train", "valid", "test")
_SPLIT_ALIASES = {"train": 0, "valid": 1, "validation": 1, "val": 1, "test": 2}
_INT32_MAX = np.iinfo(np.int32).max


def split_matrix(split: str | Sequence[float]) -> list[tuple[float, float] | None]:
    """The split matrix of a split string such as ``"969,30,1"`` (or a sequence of weights).

    As ``parse_and_normalize_split`` + ``convert_split_vector_to_split_matrix``: the numbers are found with
    ``[.0-9]+``, padded with zeros to three, normalised in float64, and turned into running-sum bookends;
    a split whose bookends do not increase is ``None`` (absent).
    """
    if isinstance(split, str):
        if "-" in split:  # Megatron's pattern would skip the sign and read "1,-1" as 1,1
            raise ConfigError(f"split {split!r} has a negative weight; every split weight must be >= 0.")
        weights = [float(x) for x in re.findall(r"[.0-9]+", split)]
    else:
        weights = [float(x) for x in split]
    if not weights or len(weights) > len(SPLIT_NAMES):
        raise ConfigError(
            f"split {split!r} must give one to three weights (train, valid, test), e.g. '969,30,1'; found {weights}."
        )
    if any(w < 0 or math.isnan(w) for w in weights):
        raise ConfigError(f"split {split!r} has a negative weight; every split weight must be >= 0.")
    weights += [0.0] * (len(SPLIT_NAMES) - len(weights))
    total = float(np.sum(np.array(weights, dtype=np.float64)))
    if total <= 0:
        raise ConfigError(f"split {split!r} has weights summing to 0; at least one must be positive.")
    normalized = (np.array(weights, dtype=np.float64) / total).tolist()
    bookends: list[float] = [0]
    for w in normalized:
        bookends.append(bookends[-1] + w)  # Python floats, as functools.reduce computes them there
    return [(lo, hi) if hi > lo else None for lo, hi in itertools.pairwise(bookends)]


def split_index(name: str) -> int:
    """0, 1 or 2 for ``"train"``, ``"valid"`` (or ``"validation"``, ``"val"``), ``"test"``."""
    try:
        return _SPLIT_ALIASES[name]
    except KeyError:
        raise ConfigError(f"split_name {name!r} is not one of 'train', 'valid', 'test'.") from None


def split_range(split: str | Sequence[float], name: str, count: int) -> tuple[int, int]:
    """``(begin, end)`` of split ``name`` over ``count`` units, as the builder rounds them (Python's round)."""
    matrix = split_matrix(split)
    bounds = matrix[split_index(name)]
    if bounds is None:
        raise ConfigError(f"split {split!r} gives the {name!r} split no share of the data; it has no samples.")
    return round(bounds[0] * float(count)), round(bounds[1] * float(count))


def num_epochs(tokens_per_epoch: int, num_samples: int | None, sequence_length: int, extra: int) -> int:
    """Epochs needed for ``num_samples`` samples (one when ``num_samples`` is None): ``GPTDataset._get_num_epochs``."""
    if num_samples is None:
        return 1
    requested = num_samples * sequence_length + extra
    if tokens_per_epoch <= 0:
        if requested > 0:
            # megatron-core loops forever here.
            raise ConfigError(
                f"the split has no tokens, so {num_samples:,} samples of {sequence_length} tokens cannot be drawn "
                "from it; choose another split or ask for num_samples=None."
            )
        return 1
    return max(1, -(-requested // tokens_per_epoch))


def separate_final_epoch(
    epochs: int, tokens_per_epoch: int, num_samples: int | None, sequence_length: int, extra: int
) -> tuple[bool, int]:
    """Whether the last epoch is shuffled on its own (it supplies < 80% of an epoch's samples), and the number of
    samples before it."""
    if epochs == 1 or num_samples is None:
        return False, 0
    before = ((epochs - 1) * tokens_per_epoch - extra) // sequence_length
    per_epoch = (tokens_per_epoch - extra) // sequence_length
    return (num_samples - before) < int(0.80 * per_epoch), before


def document_index(
    units: np.ndarray,
    epochs: int,
    random_state: np.random.RandomState,
    separate_final: bool,
    *,
    in_place: bool = False,
) -> np.ndarray:
    """The split's units repeated ``epochs`` times and shuffled (int32): ``_build_document_index``.

    ``in_place``: for one epoch of int32 units, shuffle ``units`` itself instead of a copy (a caller that made the
    array for this, as :class:`~tokformats.training.GPTSamples` does, saves the copy: 400 MB at 100 M units).
    """
    if epochs == 1 and in_place and units.dtype == np.int32 and units.flags.writeable:
        random_state.shuffle(units)
        return units
    if not separate_final or epochs == 1:
        index = np.tile(np.asarray(units, dtype=np.int32), epochs)
        random_state.shuffle(index)
        return index
    first = document_index(units, epochs - 1, random_state, False)
    last = document_index(units, 1, random_state, False)
    return np.concatenate((first, last))


def num_samples_of(tokens: int, sequence_length: int, extra: int, drop_last_partial: bool) -> int:
    """Samples in ``tokens`` tokens: ``build_sample_idx``'s count (the kept partial one rounded in float32)."""
    if tokens <= 0:
        return 0
    if drop_last_partial:
        return (tokens - extra) // sequence_length
    return int(np.ceil(np.float32(tokens - extra) / np.float32(sequence_length)))


def sample_index(
    sizes: np.ndarray,
    doc_index: np.ndarray,
    sequence_length: int,
    epochs: int,
    tokens_per_epoch: int,
    drop_last_partial: bool = True,
    extra: int = 1,
    *,
    chunk: int = 1 << 16,
) -> np.ndarray:
    """``(samples + 1, 2)`` rows ``(position in doc_index, offset)`` where each sample starts: ``build_sample_idx``.

    Sample ``i`` starts at token ``i * sequence_length`` of the documents laid out in ``doc_index`` order, so its
    row is the position whose cumulative end first reaches ``i * sequence_length + extra`` (a sample takes
    ``extra`` tokens past its end), and a kept partial last sample points at the last document's end. The walk
    takes ``chunk`` positions at a time into buffers that stay in the CPU cache and are reused: fresh pages and
    cache misses cost more than the arithmetic, so a small build pays no more than megatron-core's C++ loop.
    """
    n = num_samples_of(epochs * tokens_per_epoch, sequence_length, extra, drop_last_partial)
    top = max(len(doc_index), int(sizes.max()) if len(sizes) else 0)
    rows = np.zeros((n + 1, 2), dtype=np.int32 if top <= _INT32_MAX else np.int64)
    if n == 0 or len(doc_index) == 0:
        return rows
    # Cumulative ends fit int32 below 2**31 tokens: half the memory traffic of int64.
    wide = np.dtype(np.int32 if epochs * tokens_per_epoch + sequence_length <= _INT32_MAX else np.int64)
    # The lengths are read where they are, in their own dtype: a memory map's pages are faulted around the first
    # touch, so a whole copy (GPTDataset makes one before its C++ walk) or a whole conversion costs more than it
    # saves; a chunk is converted in a cache-sized buffer when the ends need a wider dtype.
    size = min(chunk, len(doc_index))
    taken = None if sizes.dtype == wide else np.empty(size, dtype=sizes.dtype)
    # bounds[0] is the end of the positions before the chunk, bounds[1 + p] the end of position p: bounds[p] is
    # where position p starts.
    bounds = np.empty(size + 1, dtype=wide)
    reached = np.empty(size, dtype=wide)
    before = 0  # tokens of the positions already walked
    done = 0  # rows 1..done are filled
    for low in range(0, len(doc_index), chunk):
        part = doc_index[low : low + chunk]
        edges = bounds[: len(part) + 1]
        edges[0] = before
        if taken is None:
            np.take(sizes, part, out=edges[1:])
        else:
            edges[1:] = np.take(sizes, part, out=taken[: len(part)])
        np.cumsum(edges, out=edges)
        ends = edges[1:]
        # reached[p]: the samples after ``done`` whose first token past their end (i * seq + extra) lies at or
        # before position p's end; sample done + k + 1 starts at the first position that reaches more than k.
        counts = reached[: len(part)]
        np.subtract(ends, extra + done * sequence_length, out=counts)
        np.floor_divide(counts, sequence_length, out=counts)
        np.clip(counts, 0, n - done, out=counts)
        new = int(counts[-1])
        if new:
            position = np.cumsum(np.bincount(counts, minlength=new + 1)[:new])
            starts = np.arange(done + 1, done + new + 1, dtype=np.int64)
            starts *= sequence_length
            rows[done + 1 : done + new + 1, 0] = position + low
            rows[done + 1 : done + new + 1, 1] = starts - edges[position]
            done += new
        before = int(ends[-1])
    if done < n:  # a kept partial last sample points at the last document's end
        rows[done + 1 :, 0] = len(doc_index) - 1
        rows[done + 1 :, 1] = int(sizes[doc_index[-1]]) - extra
    return rows


def shuffle_index(first: int, total: int, random_state: np.random.RandomState) -> np.ndarray:
    """``[0, first)`` and ``[first, total)`` each shuffled: ``_build_shuffle_index`` (uint32 below 2**32 - 2)."""
    dtype = np.uint32 if total < np.iinfo(np.uint32).max - 1 else np.int64
    head = np.arange(0, first, dtype=dtype)
    random_state.shuffle(head)
    if first == total:
        return head
    tail = np.arange(first, total, dtype=dtype)
    random_state.shuffle(tail)
    return np.concatenate((head, tail))


@functools.cache
def _megatron_helpers() -> object | None:
    """megatron-core's compiled helpers, when they import (importing megatron.core warns about optional
    accelerators it lacks; those warnings are not ours to show)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            from megatron.core.datasets import helpers_cpp
        except Exception:  # not installed, or built for another Python/torch: use the Python greedy
            return None
    module: object = helpers_cpp
    return module


def blending_indices(weights: Sequence[float], size: int) -> tuple[np.ndarray, np.ndarray]:
    """``(dataset_index int16, dataset_sample_index int64)`` of ``size`` samples drawn greedily by weight.

    For sample ``s`` the dataset with the largest ``w * max(s, 1) - count`` wins (the first on ties): helpers.cpp's
    ``build_blending_indices``. ``weights`` must already be normalised (as ``BlendedDataset`` does). Without
    megatron-core, :func:`~tokformats.training.greedy.lockstep_greedy` gives the same arrays bit for bit.
    """
    w = np.ascontiguousarray(weights, dtype=np.float64)
    if len(w) > MAX_DATASETS:
        raise ConfigError(f"a blend takes at most {MAX_DATASETS:,} datasets (int16 indices); found {len(w):,}.")
    dataset_index = np.zeros(size, dtype=np.int16)
    dataset_sample_index = np.zeros(size, dtype=np.int64)
    helpers = _megatron_helpers()
    if helpers is not None:
        # Megatron's own loop when it is installed: it is the reference, and 2-4x faster than the lanes.
        helpers.build_blending_indices(  # type: ignore[attr-defined]
            dataset_index, dataset_sample_index, w, len(w), size, False
        )
        return dataset_index, dataset_sample_index
    lockstep_greedy(w, size, dataset_index, dataset_sample_index)
    return dataset_index, dataset_sample_index


def exhaustive_blending_indices(sizes: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Every sample of every dataset once, interleaved by the same greedy with weights ``size / total``; a
    dataset drops out when exhausted (helpers.cpp's ``build_exhaustive_blending_indices``)."""
    counts = np.ascontiguousarray(sizes, dtype=np.int64)
    total = int(counts.sum())
    dataset_index = np.zeros(total, dtype=np.int16)
    dataset_sample_index = np.zeros(total, dtype=np.int64)
    helpers = _megatron_helpers()
    if helpers is not None:
        helpers.build_exhaustive_blending_indices(  # type: ignore[attr-defined]
            dataset_index, dataset_sample_index, counts, len(counts)
        )
        return dataset_index, dataset_sample_index
    w = counts / float(total) if total else counts.astype(np.float64)
    _greedy(w, total, counts, dataset_index, dataset_sample_index)
    return dataset_index, dataset_sample_index


def _greedy(
    weights: np.ndarray,
    size: int,
    limits: np.ndarray | None,
    dataset_index: np.ndarray,
    dataset_sample_index: np.ndarray,
) -> None:
    """The greedy without megatron's compiled helpers, one step at a time in Python (about a microsecond per
    sample): the exhaustive blend's loop (datasets drop out when spent at their ``limits``); without ``limits``,
    :func:`~tokformats.training.greedy.scalar_greedy`, the reference the tests hold the lanes to."""
    if limits is None:
        scalar_greedy(weights, 0, [0] * len(weights), size, dataset_index, dataset_sample_index)
        return
    live = [i for i in range(len(weights)) if limits[i] > 0]
    w = [float(x) for x in weights]
    counts = [0] * len(w)
    chosen = []
    for s in range(size):
        t = max(float(s), 1.0)
        best, best_error = -1, -math.inf
        for i in live:
            error = w[i] * t - float(counts[i])
            if error > best_error:
                best, best_error = i, error
        chosen.append(best)
        counts[best] += 1
        if counts[best] == limits[best]:
            live.remove(best)
    picks = np.array(chosen, dtype=np.int16)
    dataset_index[:] = picks
    for i in range(len(w)):
        mine = picks == i
        dataset_sample_index[mine] = np.arange(int(mine.sum()), dtype=np.int64)
