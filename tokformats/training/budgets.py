"""Token budgets: how many samples of each source a blend draws so that each source gives its budget exactly.

A source's samples are counted in the tokens a model consumes (``sample_tokens()``: ``sequence_length`` each for
:class:`~tokformats.training.GPTSamples`, the real tokens of each row for
:class:`~tokformats.training.PackedSamples`). A budget draws the source's samples in order, passing over it again
as many times as needed, up to the first sample that reaches the budget: the tokens drawn exceed it by less than
one sample, and no ratio is rounded to a whole number of instances first (the error OLMo-core had).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ConfigError

__all__ = ["Repeated", "SourceBudget", "draw", "sample_tokens"]


def sample_tokens(samples: Any) -> np.ndarray:
    """The tokens each sample of ``samples`` gives a model, in serving order (int64)."""
    counter = getattr(samples, "sample_tokens", None)
    if counter is None:
        raise ConfigError(
            f"{samples!r} does not say how many tokens its samples hold (no sample_tokens()); token budgets take "
            "GPTSamples, PackedSamples or blends of them."
        )
    counts = np.asarray(counter(), dtype=np.int64)
    if counts.shape != (len(samples),):
        raise ConfigError(f"{samples!r}: sample_tokens() gave {counts.shape[0]:,} counts for {len(samples):,} samples.")
    return counts


class Repeated(Sequence[Any]):
    """The first ``count`` samples of ``samples`` passed over again and again: sample ``k`` is
    ``samples[k % len(samples)]``."""

    def __init__(self, samples: Any, count: int) -> None:
        if count > 0 and len(samples) == 0:
            raise ConfigError(f"{samples!r} has no samples to draw {count:,} from.")
        self.samples, self.size = samples, int(count)
        self.fingerprint = f"repeated:{getattr(samples, 'fingerprint', len(samples))}:{self.size}"
        self.dtype = getattr(samples, "dtype", None)
        self.vocab_size = getattr(samples, "vocab_size", None)
        self.sequence_length = getattr(samples, "sequence_length", None)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: Any) -> Any:
        """Sample ``index`` (wrapping around the source)."""
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        k = int(index)
        if not -self.size <= k < self.size:
            raise IndexError(f"sample {k} is outside the {self.size:,} drawn")
        return self.samples[k % self.size % len(self.samples)]

    def sample_tokens(self) -> np.ndarray:
        """Tokens of each drawn sample (int64)."""
        per_pass = sample_tokens(self.samples)
        return np.resize(per_pass, self.size) if self.size else per_pass[:0]

    def __repr__(self) -> str:
        return f"<{self.size:,} samples drawn from {self.samples!r}>"


@dataclass(frozen=True)
class SourceBudget:
    """What a token budget draws from one source."""

    name: str
    #: The tokens asked for.
    budget: float
    #: Samples drawn (in the source's order, wrapping around).
    samples: int
    #: Tokens those samples hold: the budget, exceeded by less than the last sample.
    tokens: int
    #: Tokens in one pass over the source.
    epoch_tokens: int

    @property
    def epochs(self) -> float:
        """Passes over the source the draw makes (``tokens / epoch_tokens``)."""
        return self.tokens / self.epoch_tokens if self.epoch_tokens else 0.0

    def as_dict(self) -> dict[str, Any]:
        """The budget as a JSON-able dict."""
        return {
            "budget": self.budget,
            "samples": self.samples,
            "tokens": self.tokens,
            "epoch_tokens": self.epoch_tokens,
            "epochs": self.epochs,
        }


def draw(name: str, samples: Any, budget: float, max_repetition: float) -> SourceBudget:
    """The samples ``budget`` tokens take from ``samples``; refuses a budget that needs more than
    ``max_repetition`` passes over the source."""
    if not budget >= 0 or math.isinf(budget):
        raise ConfigError(f"the token budget of source {name!r} is {budget!r}; it must be a finite number >= 0.")
    counts = sample_tokens(samples)
    cumulative = np.cumsum(counts)
    epoch = int(cumulative[-1]) if len(cumulative) else 0
    want = math.ceil(budget)
    if want and epoch == 0:
        raise ConfigError(
            f"source {name!r} ({samples!r}) holds no tokens, so its budget of {budget:,.0f} cannot be met."
        )
    if epoch and want / epoch > max_repetition:
        raise ConfigError(
            f"source {name!r} would be repeated {want / epoch:.2f} times ({budget:,.0f} tokens of a source holding "
            f"{epoch:,} per pass), more than max_repetition={max_repetition}; lower its budget, add data, or pass "
            f"max_repetition={math.ceil(want / epoch * 100) / 100}."
        )
    if not want:
        return SourceBudget(name, budget, 0, 0, epoch)
    passes, rest = divmod(want, epoch)
    if rest == 0:
        count, tokens = passes * len(counts), want
    else:
        within = int(np.searchsorted(cumulative, rest, side="left"))  # the first sample that reaches the rest
        count = passes * len(counts) + within + 1
        tokens = passes * epoch + int(cumulative[within])
    return SourceBudget(name, budget, count, tokens, epoch)
