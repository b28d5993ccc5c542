"""Blends of sample datasets, equal to megatron-core's ``BlendedDataset``."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..core.protocol import TokenReader, checked_position
from ..errors import ConfigError
from . import budgets, indices
from .explain import Explained
from .greedy import MAX_DATASETS
from .index_cache import IndexCache, cache_key
from .samples import GPTSamples
from .windows import RandomWindows

__all__ = ["Blend"]

_NAMES = ("dataset_index", "dataset_sample_index")
#: megatron-core's ``mid_level_dataset_surplus`` default.
SURPLUS = 0.005


def _describe(dataset: Any) -> str:
    return str(getattr(dataset, "fingerprint", f"{type(dataset).__name__}:{len(dataset)}"))


def _check_weights(weights: Sequence[float], datasets: int) -> None:
    """Refuse blend weights that are not one per dataset, each positive and finite (:class:`Blend` and
    :meth:`Blend.build` alike).

    Raises:
        ConfigError: naming the counts, or the first bad weight's position and value.
    """
    if len(weights) != datasets:
        raise ConfigError(f"give one weight per dataset: {datasets} datasets, {len(weights)} weights.")
    for k, w in enumerate(weights):
        if not w > 0 or math.isinf(w):  # `not w > 0` also catches NaN
            raise ConfigError(
                f"blend weight {k} is {w!r}; weights must be positive and finite (drop a dataset rather than "
                "weighting it 0: Megatron's greedy can still pick a zero-weight dataset)."
            )


def _check_size(size: int | None) -> None:
    """Refuse a negative blend size."""
    if size is not None and size < 0:
        raise ConfigError(f"size must be None or >= 0, not {size}.")


def _bare_ids_per_sample(dataset: Any) -> int | None:
    """The ids each sample of ``dataset`` holds when its samples are bare-id windows (GPTSamples without
    ``fields``, random windows, blends and budget draws of them), else None. Sample dicts are left out: their
    arrays are ``sequence_length`` long with or without the extra token."""
    if isinstance(dataset, Blend):  # a nested blend already refused datasets that differ
        return next((n for n in map(_bare_ids_per_sample, dataset.datasets) if n is not None), None)
    if isinstance(dataset, budgets.Repeated):
        return _bare_ids_per_sample(dataset.samples)
    if isinstance(dataset, GPTSamples) and dataset.sample_fields is None:
        return dataset.sequence_length + int(dataset.add_extra_token)
    if isinstance(dataset, RandomWindows):
        return dataset.sequence_length + 1
    return None


def _shared_traits(dataset: Any) -> dict[str, Any]:
    """What every dataset of a blend must share, as far as ``dataset`` declares it (None: not declared): one
    model reads them all, and a batch stacks samples of several of them."""
    return {
        "dtype": getattr(dataset, "dtype", None),
        "vocab_size": getattr(dataset, "vocab_size", None),
        "sequence_length": getattr(dataset, "sequence_length", None),
        "ids per sample": _bare_ids_per_sample(dataset),
    }


_WHY_SHARED = {
    "sequence_length": " (a batch stacks samples of several datasets)",
    "ids per sample": " (sequence_length + add_extra_token: a batch stacks samples of several datasets)",
}


class Blend(Sequence[Any], Explained):
    """Samples drawn from several datasets by weight: megatron-core's ``BlendedDataset``.

    ``b[i]`` is ``datasets[dataset_index[i]][dataset_sample_index[i]]``. With ``weights`` and ``size``, sample
    ``s`` comes from the dataset whose ``w * max(s, 1) - taken`` is largest (weights normalised; the first on
    ties); with neither, every sample of every dataset is served once, interleaved in proportion to their sizes
    (Megatron's exhaustive blend); with integer ``weights`` and no ``size``, exactly ``weights[k]`` samples of
    dataset ``k``; with only ``size``, the weights are the datasets' sizes and ``size`` is capped at their sum.

    Args:
        datasets: sample datasets (:class:`GPTSamples`, another :class:`Blend`, any sized sequence of samples).
        weights: positive weights, one per dataset.
        size: samples in the blend.
        cache_dir: keep the two index arrays there as ``.npy`` (built once across processes).

    Raises:
        ConfigError: not one weight per dataset, a weight <= 0 or not finite, datasets of different token dtypes,
            vocabularies or sequence lengths (or bare-id samples of different lengths), or a blend that needs
            more samples from a dataset than it has (build it with more ``num_samples``, or use
            :meth:`build`, which sizes them as Megatron's builder does).
    """

    def __init__(
        self,
        datasets: Sequence[Any],
        weights: Sequence[float] | None = None,
        size: int | None = None,
        *,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.datasets = list(datasets)
        #: The sources' names (set by :meth:`by_tokens`), else empty.
        self.names: list[str] = []
        #: What each token budget drew (set by :meth:`by_tokens`), by source name.
        self.budgets: dict[str, budgets.SourceBudget] = {}
        if not self.datasets:
            raise ConfigError("a blend needs at least one dataset.")
        if len(self.datasets) > MAX_DATASETS:
            raise ConfigError(
                f"a blend holds at most {MAX_DATASETS:,} datasets (int16 dataset_index), not {len(datasets):,}."
            )
        self._check_compatible()
        if weights is None:
            weights = [len(d) for d in self.datasets]
            if size is not None:
                size = min(size, sum(len(d) for d in self.datasets))
        _check_weights(weights, len(self.datasets))
        if size is None and any(float(w) != int(w) for w in weights):
            raise ConfigError(
                f"weights {list(weights)} are not whole numbers: without a size, each weight is a sample count."
            )
        _check_size(size)
        self.size = size
        if size is not None:
            w64 = np.array(weights, dtype=np.float64)
            self.weights: list[float] = (w64 / np.sum(w64)).tolist()
        else:
            self.weights = [int(w) for w in weights]
        self.description = {
            "class": "Blend",
            "version": 1,
            "datasets": [_describe(d) for d in self.datasets],
            "weights": self.weights,
            "size": size,
        }
        #: A digest of the datasets' fingerprints, the weights and the size.
        self.fingerprint = cache_key(self.description)
        self.cache_dir = None if cache_dir is None else os.fspath(cache_dir)
        if self.cache_dir is None:
            arrays = self._build()
        else:
            arrays = IndexCache(self.cache_dir).get_or_build(self.fingerprint, self.description, _NAMES, self._build)
        #: Which dataset each sample comes from (int16).
        self.dataset_index: np.ndarray = arrays["dataset_index"]
        #: Which sample of that dataset (int64).
        self.dataset_sample_index: np.ndarray = arrays["dataset_sample_index"]

    def _check_compatible(self) -> None:
        """Refuse datasets that differ in what :func:`_shared_traits` names (a dataset that does not declare a
        trait is not compared on it)."""
        declared: dict[str, tuple[Any, Any]] = {}  # trait -> (the first dataset declaring it, its value)
        for dataset in self.datasets:
            for trait, value in _shared_traits(dataset).items():
                if value is None:
                    continue
                first, mine = declared.setdefault(trait, (dataset, value))
                if value != mine:
                    raise ConfigError(
                        f"cannot blend {dataset!r} ({trait} {value}) with {first!r} ({trait} {mine}): a blend's "
                        f"datasets must share their {trait}{_WHY_SHARED.get(trait, '')}."
                    )

    def _build(self) -> dict[str, np.ndarray]:
        if self.size is not None:
            dataset_index, dataset_sample_index = indices.blending_indices(self.weights, self.size)
        else:
            dataset_index, dataset_sample_index = indices.exhaustive_blending_indices([int(w) for w in self.weights])
        counts = np.bincount(dataset_index, minlength=len(self.datasets))
        for k, taken in enumerate(counts.tolist()):
            if taken > len(self.datasets[k]):
                raise ConfigError(
                    f"the blend takes {int(taken):,} samples from dataset {k} ({self.datasets[k]!r}), which has only "
                    f"{len(self.datasets[k]):,}; give that dataset more num_samples (Blend.build sizes them)."
                )
        return {"dataset_index": dataset_index, "dataset_sample_index": dataset_sample_index}

    @classmethod
    def build(
        cls,
        readers: Sequence[TokenReader],
        weights: Sequence[float] | None,
        size: int | None,
        *,
        sequence_length: int,
        split_name: str = "train",
        surplus: float = SURPLUS,
        cache_dir: str | os.PathLike[str] | None = None,
        **options: Any,
    ) -> Blend:
        """A blend of readers sized as megatron-core's ``BlendedMegatronDatasetBuilder`` does it.

        With weights and a size, dataset ``k`` gets ``ceil(ceil(size * w_k) * (1 + surplus))`` samples and the
        blend ``sum(ceil(size * w_k))``; without weights, each dataset is one epoch and the blend is exhaustive
        (capped at ``size`` when given). ``options`` go to every :class:`GPTSamples` (seed, split, ...).
        """
        if weights is not None:
            if size is None:
                raise ConfigError("weights need a size: Megatron's builder blends by weight only to a target size.")
            _check_weights(weights, len(readers))  # before normalising: a bad weight would make every size wrong
            _check_size(size)
            w64 = np.array(weights, dtype=np.float64)
            normalized = (w64 / np.sum(w64)).tolist()
            targets = [math.ceil(size * w) for w in normalized]
            buffers = [math.ceil(math.ceil(size * w) * (1 + surplus)) for w in normalized]
            datasets = [
                GPTSamples(r, sequence_length, num_samples=n, split_name=split_name, cache_dir=cache_dir, **options)
                for r, n in zip(readers, buffers)
            ]
            return cls(datasets, normalized, sum(targets), cache_dir=cache_dir)
        datasets = [
            GPTSamples(r, sequence_length, split_name=split_name, cache_dir=cache_dir, **options) for r in readers
        ]
        return cls(datasets, None, size, cache_dir=cache_dir)

    # -- the samples ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.dataset_index)

    def __getitem__(self, index: Any) -> Any:
        """Sample ``index`` of the blend (a slice gives a list)."""
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        i = checked_position(index, len(self), "sample", "samples in the blend")
        dataset = self.datasets[int(self.dataset_index[i])]
        return dataset[int(self.dataset_sample_index[i])]

    def ids(self, index: int, dtype: Any = np.int64) -> np.ndarray:
        """Sample ``index`` as bare ids in ``dtype`` (the stored :attr:`dtype` or int64): its dataset's ``ids``."""
        i = checked_position(index, len(self), "sample", "samples in the blend")
        dataset = self.datasets[int(self.dataset_index[i])]
        if not callable(getattr(dataset, "ids", None)):
            raise ConfigError(
                f"ids() needs datasets that serve ids in a chosen dtype (GPTSamples); dataset "
                f"{int(self.dataset_index[i])} is a {type(dataset).__name__}."
            )
        ids: np.ndarray = dataset.ids(int(self.dataset_sample_index[i]), dtype)
        return ids

    def batch(self, samples: Sequence[int] | np.ndarray) -> Any:
        """Several samples stacked into one array (dict samples: a dict of stacked arrays)."""
        if not len(samples):
            raise ConfigError("batch() needs at least one sample index.")
        rows = [self[int(i)] for i in samples]
        if isinstance(rows[0], dict):
            return {key: np.stack([row[key] for row in rows]) for key in rows[0]}
        return np.stack(rows)

    @classmethod
    def by_tokens(
        cls,
        sources: Mapping[str, tuple[Any, float]],
        *,
        max_repetition: float = 4.0,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> Blend:
        """A blend that draws each source's token budget exactly: ``{name: (samples, tokens)}``.

        Each source gives its samples in order, passing over it again as needed, up to the first sample that
        reaches its budget (:mod:`tokformats.training.budgets`; a source's tokens are what its samples feed a
        model: ``sequence_length`` per :class:`GPTSamples` sample, the real tokens of a :class:`PackedSamples`
        row). The draws are interleaved in proportion to their sample counts by Megatron's exhaustive greedy, so
        every drawn sample is served exactly once. :meth:`report` gives tokens and epochs per source.

        Raises:
            ConfigError: a source would pass over its data more than ``max_repetition`` times, a budget is
                negative, or a source cannot count its tokens.
        """
        if not sources:
            raise ConfigError("Blend.by_tokens needs at least one source: {name: (samples, tokens)}.")
        draws = [
            budgets.draw(str(name), samples, float(tokens), max_repetition)
            for name, (samples, tokens) in sources.items()
        ]
        kept = [(d, samples) for d, (samples, _) in zip(draws, sources.values()) if d.samples]
        if not kept:
            raise ConfigError("every token budget is 0: there is nothing to blend.")
        blend = cls([budgets.Repeated(samples, d.samples) for d, samples in kept], cache_dir=cache_dir)
        blend.names = [d.name for d, _ in kept]
        blend.budgets = {d.name: d for d in draws}
        return blend

    def sample_tokens(self) -> np.ndarray:
        """The tokens each sample of the blend feeds a model (int64), from its datasets' ``sample_tokens()``."""
        out = np.zeros(len(self), dtype=np.int64)
        for k, dataset in enumerate(self.datasets):
            mine = self.dataset_index == k
            out[mine] = budgets.sample_tokens(dataset)[self.dataset_sample_index[mine]]
        return out

    def report(self) -> dict[str, dict[str, Any]]:
        """Per source (by name when the blend has names, else by position): samples and tokens drawn, and with
        token budgets the budget, the tokens of one pass and the passes made (``epochs``)."""
        counts = np.bincount(self.dataset_index, minlength=len(self.datasets)).tolist()
        names = self.names or [str(k) for k in range(len(self.datasets))]
        out: dict[str, dict[str, Any]] = {}
        for k, (name, dataset) in enumerate(zip(names, self.datasets)):
            entry: dict[str, Any] = {"samples": int(counts[k])}
            if name in self.budgets:
                entry.update(self.budgets[name].as_dict())
            elif getattr(dataset, "sample_tokens", None) is not None:
                mine = self.dataset_sample_index[self.dataset_index == k]
                entry["tokens"] = int(budgets.sample_tokens(dataset)[mine].sum())
            out[name] = entry
        for name, budget in self.budgets.items():  # sources whose budget was 0 draw nothing
            out.setdefault(name, budget.as_dict())
        return out

    @property
    def dtype(self) -> np.dtype | None:
        """The datasets' shared token dtype."""
        return getattr(self.datasets[0], "dtype", None)

    @property
    def sequence_length(self) -> int | None:
        """The datasets' shared sequence length, when they declare one."""
        return next((n for n in (getattr(d, "sequence_length", None) for d in self.datasets) if n is not None), None)

    @property
    def vocab_size(self) -> int | None:
        """The datasets' shared vocabulary size, when they declare one."""
        return next((v for v in (getattr(d, "vocab_size", None) for d in self.datasets) if v is not None), None)

    def __repr__(self) -> str:
        return f"<tokformats.training.Blend {len(self):,} samples from {len(self.datasets)} datasets>"
