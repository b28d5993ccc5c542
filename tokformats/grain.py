"""Grain data sources over tokformats' readers and training samples (``pip install 'tokformats[grain]'``).

>>> import grain                                                                          # doctest: +SKIP
>>> from tokformats import grain as tfg
>>> ds = grain.MapDataset.source(tfg.source(packed)).map(tfg.maxtext_fields).batch(8)
>>> it = iter(ds.to_iter_dataset()); batch = next(it); state = it.get_state()          # resumable

:func:`source` wraps a reader (its documents), :class:`~tokformats.training.GPTSamples` (ids or dicts),
:class:`~tokformats.training.PackedSamples` or a :class:`~tokformats.training.Blend` as a
``grain.RandomAccessDataSource`` (``__len__``, ``__getitem__``, ``__getitems__``), picklable into Grain's worker
processes (readers re-open by path). :func:`maxtext_fields` renames a sample to MaxText's fields.

torchtitan's Grain loader takes the same source: ``grain.MapDataset.source(tfg.source(samples))`` then its own
``.batch(...)``/``.to_iter_dataset()``; with ``fields=`` samples the batch is a dict of arrays.

This module imports Grain only when :func:`map_dataset` is called; the sources themselves need no Grain.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["Source", "source", "maxtext_fields", "map_dataset"]


class Source:
    """A ``grain.RandomAccessDataSource`` of any tokformats sample sequence or reader.

    Args:
        samples: a reader (items are documents), ``GPTSamples``, ``PackedSamples``, a ``Blend``, or any sized
            sequence of samples.
        transform: applied to every item (e.g. :func:`maxtext_fields`); None serves items as they are.
    """

    def __init__(self, samples: Sequence[Any], transform: Any = None) -> None:
        self.samples = samples
        self.transform = transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: Any) -> Any:
        """Item ``index`` (any ``SupportsIndex``)."""
        item = self.samples[int(index)]
        return item if self.transform is None else self.transform(item)

    def __getitems__(self, indices: Sequence[Any]) -> list[Any]:
        """Several items, in order (Grain's batched read)."""
        return [self[i] for i in indices]

    def __repr__(self) -> str:
        return f"tokformats.grain.Source({self.samples!r})"


def source(samples: Sequence[Any], *, maxtext: bool = False) -> Source:
    """``samples`` as a Grain random-access source; ``maxtext=True`` serves MaxText's field names
    (:func:`maxtext_fields`)."""
    return Source(samples, maxtext_fields if maxtext else None)


def _segments(sample: dict[str, np.ndarray], length: int) -> np.ndarray:
    """Segment ids 1, 2, ... of the tokens (0 on padding): from ``doc_lens``, else ``cu_seqlens``, else the
    restarts of ``position_ids``, else one segment."""
    if "doc_lens" in sample:  # packed rows: the documents, then padding
        lengths = np.asarray(sample["doc_lens"], dtype=np.int64)
        lengths = lengths[lengths > 0]
        ids = np.repeat(np.arange(1, len(lengths) + 1, dtype=np.int32), lengths)[:length]
        return np.concatenate([ids, np.zeros(length - len(ids), dtype=np.int32)])
    if "cu_seqlens" in sample:
        cu = np.asarray(sample["cu_seqlens"], dtype=np.int64)
        starts = np.zeros(length, dtype=np.int32)
        starts[cu[cu < length]] = 1
        return np.cumsum(starts, dtype=np.int32)
    if "position_ids" in sample:
        return np.cumsum(np.asarray(sample["position_ids"]) == 0, dtype=np.int32)
    return np.ones(length, dtype=np.int32)


def maxtext_fields(sample: Any) -> dict[str, np.ndarray]:
    """A sample with MaxText's Grain field names (int32): ``inputs``/``targets`` (the tokens and the next tokens),
    ``inputs_segmentation`` (1, 2, ... per document, 0 on padding), ``targets_segmentation`` (the same, 0 where
    the loss mask is 0: MaxText counts a target when it is non-zero), ``inputs_position``/``targets_position``
    (positions within the document, 0 on padding).

    Bare ids of ``L + 1`` become ``inputs = x[:-1]``, ``targets = x[1:]``, one segment.
    """
    if not isinstance(sample, dict):
        ids = np.asarray(sample)
        sample = {"tokens": ids[:-1], "labels": ids[1:]}
    tokens = np.asarray(sample["tokens"])
    length = len(tokens)
    segments = _segments(sample, length)
    if "position_ids" in sample:
        positions = np.asarray(sample["position_ids"], dtype=np.int32)
    else:
        positions = np.arange(length, dtype=np.int32)
    positions = np.where(segments > 0, positions, 0).astype(np.int32)
    loss = np.asarray(sample.get("loss_mask", np.ones(length, dtype=np.float32)))
    return {
        "inputs": tokens.astype(np.int32),
        "targets": np.asarray(sample["labels"]).astype(np.int32),
        "inputs_segmentation": segments,
        "targets_segmentation": np.where(loss != 0, segments, 0).astype(np.int32),
        "inputs_position": positions,
        "targets_position": positions.copy(),
    }


def map_dataset(samples: Sequence[Any], *, maxtext: bool = False) -> Any:
    """``grain.MapDataset.source(source(samples, maxtext=maxtext))`` (imports Grain)."""
    try:
        import grain
    except ImportError as error:  # pragma: no cover - exercised only without grain
        raise ImportError(
            "tokformats.grain.map_dataset needs Grain: pip install 'tokformats[grain]' (or pip install grain)."
        ) from error
    return grain.MapDataset.source(source(samples, maxtext=maxtext))
