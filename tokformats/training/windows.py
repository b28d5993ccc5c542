"""nanoGPT-style random windows over a token stream, reproducible and random-access."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..core.protocol import TokenReader
from ..errors import ConfigError

__all__ = ["RandomWindows", "windows"]


class RandomWindows(Sequence[np.ndarray]):
    """Windows of ``sequence_length + 1`` consecutive ids starting at random positions of the whole stream.

    nanoGPT's ``get_batch``: a start ``i`` drawn uniformly from ``[0, num_tokens - sequence_length)``, inputs
    ``x = w[:-1]`` and targets ``y = w[1:]``, windows crossing document boundaries. The starts come from
    ``numpy.random.default_rng(seed)``, so window ``k`` is the same on every run, rank and worker.

    Args:
        reader: any token reader.
        sequence_length: inputs per window (each window holds one more id).
        seed: seed of the starts.
        num_samples: windows in one pass (default: ``num_tokens // sequence_length``, one epoch's worth).
    """

    def __init__(self, reader: TokenReader, sequence_length: int, seed: int = 0, num_samples: int | None = None):
        if sequence_length <= 0:
            raise ConfigError(f"sequence_length must be positive, not {sequence_length}.")
        self.reader, self.sequence_length, self.seed = reader, int(sequence_length), int(seed)
        room = reader.num_tokens - self.sequence_length
        if room <= 0:
            raise ConfigError(
                f"{reader.path} holds {reader.num_tokens:,} tokens: too few for a window of {sequence_length} + 1."
            )
        count = reader.num_tokens // self.sequence_length if num_samples is None else int(num_samples)
        #: Where each window starts in the stream (int64).
        self.starts = np.random.default_rng(self.seed).integers(0, room, size=count, dtype=np.int64)
        self.fingerprint = f"windows:{reader.format}:{reader.num_tokens}:{self.sequence_length}:{self.seed}:{count}"
        self.dtype = reader.dtype
        self.vocab_size = reader.metadata.get("vocab_size")

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, index: Any) -> Any:
        """Window ``index``: ``sequence_length + 1`` ids as int64."""
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        start = int(self.starts[index])
        return self.reader.span(start, start + self.sequence_length + 1).astype(np.int64)

    def batch(self, samples: Sequence[int] | np.ndarray) -> np.ndarray:
        """Several windows as one ``(len(samples), sequence_length + 1)`` int64 array."""
        return np.stack([self[int(i)] for i in samples])


def windows(reader: TokenReader, sequence_length: int, seed: int = 0, num_samples: int | None = None) -> RandomWindows:
    """nanoGPT-style random windows over ``reader`` (see :class:`RandomWindows`)."""
    return RandomWindows(reader, sequence_length, seed, num_samples)
