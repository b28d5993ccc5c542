"""Megatron's pretraining sampler: contiguous global batches, a micro-batch slice per rank, resumable."""

from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import Any

import numpy as np

from ..errors import ConfigError

__all__ = ["BatchSampler"]


class BatchSampler:
    """Micro-batches of sample indices for one data-parallel rank, as Megatron's ``MegatronPretrainingSampler``.

    The global order is fixed by the dataset (and, with ``shuffle=True``, by ``seed`` and the epoch) and never
    by ``world_size`` or the number of DataLoader workers: positions ``[g * B, (g + 1) * B)`` form global batch
    ``g`` (``B = global_batch_size``); each step of it takes ``micro_batch_size * world_size`` consecutive
    positions, and rank ``r`` gets the slice ``[r * micro_batch_size, (r + 1) * micro_batch_size)`` of each.
    ``global_batch_size / (micro_batch_size * world_size)`` steps make one global batch (gradient accumulation).

    The whole state is a small JSON-able dict (:meth:`state_dict`): samples consumed by all ranks together,
    epoch, seed and a fingerprint of the dataset, which :meth:`load_state_dict` checks.

    Args:
        dataset: the dataset (its ``len`` and, when it has one, its ``fingerprint``) or just its length.
        global_batch_size: samples per optimizer step, over all ranks.
        micro_batch_size: samples per rank per forward pass.
        rank / world_size: this rank and the number of data-parallel ranks.
        drop_last: drop the last incomplete global batch (Megatron does); when False, it is served as far as it
            goes, so some ranks may get shorter or no micro-batches at the end.
        shuffle: permute positions each epoch (a seeded permutation of ``seed`` and the epoch); ``GPTSamples``
            and ``Blend`` are already shuffled, so the default keeps Megatron's order.
        seed: the seed of that permutation.
    """

    def __init__(
        self,
        dataset: Sized | int,
        global_batch_size: int,
        micro_batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        *,
        drop_last: bool = True,
        shuffle: bool = False,
        seed: int = 0,
    ) -> None:
        self.total = dataset if isinstance(dataset, (int, np.integer)) else len(dataset)
        self.fingerprint = str(getattr(dataset, "fingerprint", f"samples:{self.total}"))
        if micro_batch_size <= 0 or world_size <= 0 or global_batch_size <= 0:
            raise ConfigError(
                f"global_batch_size ({global_batch_size}), micro_batch_size ({micro_batch_size}) and world_size "
                f"({world_size}) must be positive."
            )
        if not 0 <= rank < world_size:
            raise ConfigError(f"rank {rank} is outside 0..{world_size - 1} for world_size {world_size}.")
        self.step = micro_batch_size * world_size
        if global_batch_size % self.step:
            raise ConfigError(
                f"global_batch_size {global_batch_size} is not a multiple of micro_batch_size * world_size "
                f"= {micro_batch_size} * {world_size}."
            )
        self.global_batch_size = int(global_batch_size)
        self.micro_batch_size = int(micro_batch_size)
        self.rank, self.world_size = int(rank), int(world_size)
        self.drop_last, self.shuffle, self.seed = drop_last, shuffle, int(seed)
        #: Samples consumed in this epoch by all ranks together (Megatron's ``consumed_samples``).
        self.consumed_samples = 0
        self.epoch = 0

    @property
    def end(self) -> int:
        """Positions served per epoch: the whole dataset, or its whole global batches with ``drop_last``."""
        if self.drop_last:
            return self.total - self.total % self.global_batch_size
        return self.total

    def order(self, epoch: int | None = None) -> np.ndarray | None:
        """The permutation of positions for ``epoch`` (None: positions are sample indices)."""
        if not self.shuffle:
            return None
        epoch = self.epoch if epoch is None else epoch
        return np.random.default_rng([self.seed, epoch]).permutation(self.total)

    def micro_batch(self, step: int, order: np.ndarray | None = None) -> list[int]:
        """This rank's sample indices at micro-batch ``step`` of the epoch (empty past the end)."""
        start = step * self.step + self.rank * self.micro_batch_size
        stop = min(start + self.micro_batch_size, self.end)
        if start >= stop:
            return []
        positions = np.arange(start, stop)
        return (positions if order is None else order[positions]).tolist()

    def __len__(self) -> int:
        """Micro-batches this rank still gets in the current epoch."""
        remaining = self.end - self.consumed_samples
        return max(0, -(-remaining // self.step))

    def __iter__(self) -> Iterator[list[int]]:
        """This rank's micro-batches from the resume point to the end of the epoch; then the next epoch begins."""
        order = self.order()
        while self.consumed_samples < self.end:
            batch = self.micro_batch(self.consumed_samples // self.step, order)
            self.consumed_samples += self.step  # every rank steps together, even one whose slice is short
            if batch:
                yield batch
        self.epoch += 1
        self.consumed_samples = 0

    # -- resume --------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The sampler's whole state: JSON-able, the same on every rank."""
        return {
            "consumed_samples": self.consumed_samples,
            "epoch": self.epoch,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "global_batch_size": self.global_batch_size,
            "fingerprint": self.fingerprint,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where :meth:`state_dict` was taken; refuses a state of another dataset or batch layout.

        ``world_size`` and ``micro_batch_size`` may change between runs as long as the consumed samples fall on
        a step boundary of the new layout: the global order does not depend on them.
        """
        for field in ("fingerprint", "global_batch_size", "seed", "shuffle"):
            if field in state and state[field] != getattr(self, field):
                raise ConfigError(
                    f"this resume state was taken with {field} {state[field]!r}, but the sampler has "
                    f"{getattr(self, field)!r}: it belongs to another dataset or run."
                )
        consumed = int(state["consumed_samples"])
        if consumed % self.step or not 0 <= consumed <= self.total:
            raise ConfigError(
                f"consumed_samples {consumed} is not a step boundary (a multiple of micro_batch_size * world_size "
                f"= {self.step}) within the {self.total:,} samples."
            )
        self.consumed_samples = consumed
        self.epoch = int(state.get("epoch", 0))
