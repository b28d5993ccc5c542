"""Which documents a training sample holds (``s.explain(i)``, ``tokformats explain``): after a loss spike at step
``s``, the documents, token ranges and, when ``tokenize`` recorded them, the source lines the batch read.

:func:`explain_sample` walks the same index rows :meth:`GPTSamples.unshuffled` reads, so it names exactly the tokens
the sample holds; a range is cut where the reader's documents end (Megatron samples *sequences*, which may differ
from documents). A :class:`Blend` prefixes each range with the index of the dataset the sample came from.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.protocol import TokenReader, checked_position
from ..errors import ConfigError
from .sampler import BatchSampler

__all__ = ["Explained", "explain_sample", "sample_sources", "step_samples"]


class Explained:
    """What a kind of samples gains by being explained: :meth:`explain` (GPTSamples, PackedSamples, Blend)."""

    def explain(self, index: int) -> list[tuple[int, ...]]:
        """The token ranges of the reader's documents that sample ``index`` holds, in order: ``[(document_index,
        start, stop), ...]`` (a :class:`Blend` adds the source's position first); see :func:`explain_sample`."""
        return explain_sample(self, index)


def _document_ranges(reader: TokenReader, start: int, stop: int) -> list[tuple[int, int, int]]:
    """Stream tokens ``start:stop`` as ``(document, start, stop)`` ranges within the reader's documents."""
    offsets = reader.offsets
    ranges = []
    document = int(np.searchsorted(offsets, start, side="right")) - 1
    while start < stop:
        # skip empty documents: a range belongs to the document whose tokens it holds
        while offsets.item(document + 1) <= start:
            document += 1
        end = min(stop, offsets.item(document + 1))
        base = offsets.item(document)
        ranges.append((document, start - base, end - base))
        start = end
    return ranges


def _explain_gpt(samples: Any, index: int) -> list[tuple[int, int, int]]:
    position = checked_position(index, len(samples), "sample", "samples")
    j = int(samples.shuffle_index[position])
    extra = int(samples.add_extra_token)
    rows, units, offsets = samples.sample_index, samples.document_index, samples._offsets
    first, first_offset = int(rows[j, 0]), int(rows[j, 1])
    last, last_offset = int(rows[j + 1, 0]), int(rows[j + 1, 1])
    ranges: list[tuple[int, int, int]] = []
    for walk in range(first, last + 1):  # the loop of GPTSamples.unshuffled, recording instead of copying
        unit = int(units[walk])
        start = int(offsets[unit]) + (first_offset if walk == first else 0)
        stop = int(offsets[unit]) + last_offset + extra if walk == last else int(offsets[unit + 1])
        ranges += _document_ranges(samples.reader, start, max(start, stop))
    return ranges


def explain_sample(samples: Any, index: int) -> list[tuple[int, ...]]:
    """The token ranges of the reader's documents that sample ``index`` holds, in order.

    Args:
        samples: a :class:`GPTSamples` or :class:`PackedSamples` (ranges ``(document_index, start, stop)``; a packed
            row's pieces in row order), or a :class:`Blend` of them
            (``(dataset, document_index, start, stop)``, ``dataset`` the blend's position of the source; nested
            blends add one position per level).
        index: the sample, as ``samples[index]`` takes it (negative counts from the end).

    Returns:
        ``start:stop`` are positions inside the document: ``reader[document_index][start:stop]`` are the ids, and
        the ranges' ids laid end to end are the sample (without the padding of a kept partial last sample).
    """
    # By what each kind holds (this module is what their explain() methods call, so it cannot import them).
    if hasattr(samples, "dataset_index") and hasattr(samples, "datasets"):  # a Blend
        position = checked_position(index, len(samples), "sample", "samples")
        dataset = int(samples.dataset_index[position])
        inner = explain_sample(samples.datasets[dataset], int(samples.dataset_sample_index[position]))
        return [(dataset, *piece) for piece in inner]
    if hasattr(samples, "sample_index") and hasattr(samples, "document_index"):  # GPTSamples
        return list(_explain_gpt(samples, index))
    if hasattr(samples, "piece_starts") and hasattr(samples, "pieces"):  # PackedSamples
        return list(_explain_packed(samples, index))
    raise TypeError(f"explain_sample takes GPTSamples, PackedSamples or a Blend of them, not {type(samples).__name__}.")


def _explain_packed(samples: Any, index: int) -> list[tuple[int, int, int]]:
    """A packed row's pieces (whole documents, or fragments of long ones) as document ranges, in row order."""
    position = checked_position(index, len(samples), "row", "rows")
    starts, lengths = samples.pieces(int(samples.shuffle_index[position]))
    ranges: list[tuple[int, int, int]] = []
    for start, length in zip(starts.tolist(), lengths.tolist()):
        ranges += _document_ranges(samples.reader, start, start + length)
    return ranges


def _reader_of(samples: Any, path: tuple[int, ...]) -> TokenReader:
    """The reader behind the blend positions ``path`` (empty for a GPTSamples)."""
    for dataset in path:
        samples = samples.datasets[dataset]
    reader: TokenReader = samples.reader
    return reader


def sample_sources(samples: Any, index: int) -> list[dict[str, Any]]:
    """:func:`explain_sample` as rows for people and scripts: ``{"dataset"`` (blends only) ``, "path", "document",
    "start", "stop", "source"}``, ``source`` being ``reader.provenance(document)`` (file, line or row, byte offset)
    or None when ``tokenize`` recorded none."""
    rows = []
    for piece in explain_sample(samples, index):
        *blend_path, document, start, stop = piece
        reader = _reader_of(samples, tuple(blend_path))
        row: dict[str, Any] = {}
        if blend_path:  # the source's position in the blend (a list through nested blends)
            row["dataset"] = blend_path[0] if len(blend_path) == 1 else list(blend_path)
        row.update(path=str(reader.path), document=document, start=start, stop=stop)
        row["source"] = reader.provenance(document)
        rows.append(row)
    return rows


def step_samples(sampler: BatchSampler, step: int, epoch: int | None = None) -> list[int]:
    """The sample indices of optimizer step ``step`` (0-based, all ranks together: global batch ``step``) of
    ``sampler``'s ``epoch`` (default: its current one), in the order the ranks' micro-batches take them. After a
    resume, the step a state dict continues at is ``state["consumed_samples"] // global_batch_size``."""
    size = sampler.global_batch_size
    start, stop = step * size, min((step + 1) * size, sampler.end)
    if step < 0 or start >= stop:
        raise ConfigError(f"step {step} is outside the {sampler.end // size:,} global batches of an epoch.")
    positions = np.arange(start, stop)
    order = sampler.order(epoch)
    return (positions if order is None else order[positions]).tolist()
