"""The data layer of a training loop, over any token reader, in NumPy.

>>> from tokformats import training                                          # doctest: +SKIP
>>> s = training.GPTSamples(reader, sequence_length=2048, seed=1234, split="969,30,1", split_name="train")
>>> b = training.Blend([s_web, s_code], weights=[0.7, 0.3], size=1_000_000)
>>> sampler = training.BatchSampler(b, global_batch_size=512, micro_batch_size=4, rank=r, world_size=w)

- :class:`GPTSamples`: fixed-length samples equal to megatron-core's ``GPTDataset`` (indices and samples).
  With ``fields=``, dict samples (labels, loss mask, positions, attention mask or ``cu_seqlens``) equal to
  ``GPTDataset.__getitem__``.
- :class:`PackedSamples`: whole documents best-fit packed into rows by an index-only plan, as dicts with
  ``cu_seqlens`` and ``doc_lens``.
- :class:`Blend`: weighted or exhaustive blends equal to megatron-core's ``BlendedDataset``.
- :class:`BatchSampler`: Megatron's pretraining sampler, resumable, independent of world size and workers.
- :func:`windows`: nanoGPT-style random windows; :class:`ShardRotation`: a NeuroShard node's shards in turn.
- ``tokformats.torch``: map-style and iterable PyTorch datasets over any of these (imports torch lazily).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .blend import Blend
from .packed import PackedSamples
from .sampler import BatchSampler
from .samples import GPTSamples
from .windows import RandomWindows, windows

if TYPE_CHECKING:
    from .shard_rotation import ShardRotation

__all__ = ["GPTSamples", "PackedSamples", "Blend", "BatchSampler", "RandomWindows", "windows", "ShardRotation"]


def __getattr__(name: str) -> Any:
    if name == "ShardRotation":  # imports the pt format only when asked for
        from .shard_rotation import ShardRotation

        return ShardRotation
    raise AttributeError(f"module 'tokformats.training' has no attribute {name!r}")
