"""Whole documents of any reader packed into fixed-length rows by an index-only plan (no token copied).

>>> p = training.PackedSamples(reader, 4096, seed=0, long_documents="fragment", cache_dir="idx")  # doctest: +SKIP
>>> p[0].keys()   # tokens, labels, loss_mask, position_ids, cu_seqlens, doc_lens                  # doctest: +SKIP
>>> p.report()    # documents, fragments, truncated tokens, rows, padding waste                    # doctest: +SKIP

The plan is four arrays: the stream offset and length of every piece (a document, or a fragment of one longer
than a row) in row order, each row's first piece, and the shuffled row order. A new ``sequence_length`` or
``seed`` is a new plan of a few bytes per document; the tokens stay where the reader has them.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..core.protocol import TokenReader, checked_position
from ..errors import ConfigError, FormatError
from .explain import Explained
from .index_cache import IndexCache, cache_key
from .packing import best_fit_decreasing, bos_aligned_rows
from .sample_fields import segment_positions
from .samples import data_fingerprint

__all__ = ["PackedSamples", "LONG_DOCUMENTS", "POLICIES"]

_PLAN_VERSION = 1
_NAMES = ("piece_starts", "piece_lengths", "row_offsets", "shuffle_index")
#: What happens to a document longer than a row.
LONG_DOCUMENTS = ("fragment", "truncate")
#: How documents are packed: best-fit decreasing (arXiv 2404.10830, OLMo-core's ``InstancePacker``), or
#: nanochat's BOS-aligned best-fit cropping.
POLICIES = ("bfd", "bos")
FIELDS = ("tokens", "labels", "loss_mask", "position_ids", "cu_seqlens", "doc_lens")


def plan_pieces(
    lengths: np.ndarray, offsets: np.ndarray, capacity: int, long_documents: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(piece starts, piece lengths, piece document)`` of the non-empty documents: whole when they fit in
    ``capacity``; else cut into ``capacity``-long fragments (``"fragment"``) or cut to their first ``capacity``
    tokens (``"truncate"``)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    starts = np.asarray(offsets[:-1], dtype=np.int64)
    if long_documents == "fragment":
        counts = -(-lengths // capacity)
    else:
        counts = (lengths > 0).astype(np.int64)
    document = np.repeat(np.arange(len(lengths), dtype=np.int64), counts)
    first = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(counts, out=first[1:])
    k = np.arange(len(document), dtype=np.int64) - first[document]  # fragment number within its document
    piece_starts = starts[document] + k * capacity
    piece_lengths = np.minimum(capacity, lengths[document] - k * capacity)
    return piece_starts, piece_lengths, document


def bos_plan(lengths: np.ndarray, offsets: np.ndarray, capacity: int, buffer: int, seed: int) -> dict[str, np.ndarray]:
    """The plan of nanochat-style rows: documents in a seeded order through a best-fit buffer, each row starting
    at a document start and filled exactly (cropping); rows are served in the order they were built."""
    order = np.arange(len(lengths), dtype=np.int64)
    np.random.RandomState(seed).shuffle(order)
    documents, pieces, rows = bos_aligned_rows(lengths, capacity, buffer, order)
    return {
        "piece_starts": np.asarray(offsets, dtype=np.int64)[documents],
        "piece_lengths": pieces.astype(np.int32),
        "row_offsets": rows,
        "shuffle_index": np.arange(len(rows) - 1, dtype=np.int64),
    }


def pack_plan(
    lengths: np.ndarray, offsets: np.ndarray, capacity: int, long_documents: str, window: int | None, seed: int
) -> dict[str, np.ndarray]:
    """The best-fit-decreasing plan arrays (see the module docstring); documents are packed ``window`` at a time
    when given."""
    piece_starts, piece_lengths, document = plan_pieces(lengths, offsets, capacity, long_documents)
    if window is None or not len(document):
        groups = [(0, len(document))]
    else:  # pack the pieces of documents [w * window, (w + 1) * window) together, as OLMo's source groups
        bounds = np.searchsorted(document, np.arange(0, int(document[-1]) + window + 1, window))
        groups = [(int(a), int(b)) for a, b in itertools.pairwise(bounds) if b > a]
    items, row_offsets = [], [np.zeros(1, dtype=np.int64)]
    for begin, end in groups:
        order, offsets_here = best_fit_decreasing(piece_lengths[begin:end], capacity)
        items.append(order + begin)
        row_offsets.append(offsets_here[1:] + row_offsets[-1][-1])
    order = np.concatenate(items) if items else np.zeros(0, dtype=np.int64)
    rows = np.concatenate(row_offsets)
    shuffle = np.arange(len(rows) - 1, dtype=np.int64)
    np.random.RandomState(seed).shuffle(shuffle)  # the legacy stream: frozen across NumPy versions (NEP 19)
    return {
        "piece_starts": piece_starts[order],
        "piece_lengths": piece_lengths[order].astype(np.int32),
        "row_offsets": rows,
        "shuffle_index": shuffle,
    }


class PackedSamples(Sequence[dict[str, np.ndarray]], Explained):
    """Rows of whole documents, best-fit-decreasing packed, served as dicts of NumPy arrays.

    Every non-empty document (or fragment) sits in exactly one row, none crosses into another row, and each row
    holds at most ``sequence_length + add_extra_token`` tokens; the rest is ``pad_id``. ``p[i]`` is row
    ``shuffle_index[i]``:

    - ``tokens``/``labels`` int64 ``(L,)``: the row's first ``L`` tokens and the ``L`` after the first (with
      ``add_extra_token``, the default, a row holds ``L + 1`` tokens, as Megatron's samples do); without it, a row
      holds ``L`` and the last label is ``pad_id``.
    - ``loss_mask`` float32: 1 where the label is the next token of the same document (never a document's first
      token, never padding), times the reader's stored loss mask of the label token when it has one.
    - ``position_ids`` int64: restarting at each document (and at the padding).
    - ``cu_seqlens`` int32 ``(L + 1,)``: the starts of the documents within the tokens (and of the padding), then
      ``L``, padded with ``L`` so that ``default_collate`` stacks them.
    - ``doc_lens`` int32 ``(L + 1,)``: the lengths of the documents (or fragments) in the row, in order, before
      padding, padded with 0.

    Args:
        reader: any token reader; its documents are packed (a Megatron dataset's documents, not sequences).
        sequence_length: ``L``, the tokens a model sees per row.
        seed: the seed of the row order (NumPy's legacy ``RandomState``).
        policy: ``"bfd"``: best-fit decreasing with an O(N log N) plan (:mod:`tokformats.training.packing`);
            ``"bos"``: nanochat's BOS-aligned rows: documents in a seeded order pass through a buffer of
            ``buffer`` documents, each row starts at a document start and takes the longest buffered document
            that fits, else the shortest cropped to the room left, so rows hold no padding (the cropped tail of a
            document is dropped; :meth:`report` counts it as truncated).
        long_documents: with ``"bfd"``, a document longer than a row is cut into row-long ``"fragment"``s (no
            token lost) or ``"truncate"``d to its first row (:meth:`report` counts the tokens dropped).
        pad_id: the id padding rows (masked in the loss).
        add_extra_token: rows of ``L + 1`` tokens, so that tokens and labels are both ``L`` long.
        window: pack ``window`` documents at a time (OLMo's per-source-window grouping); None packs all together.
        buffer: documents the ``"bos"`` policy chooses from (nanochat: 1,000).
        cache_dir: keep the plan there as ``.npy`` (built once across processes, memory-mapped after), under a key
            covering every option and the document lengths.
        vocab_size: the vocabulary the ids come from; blends refuse to mix different ones.
    """

    def __init__(
        self,
        reader: TokenReader,
        sequence_length: int,
        *,
        seed: int = 0,
        policy: str = "bfd",
        long_documents: str = "fragment",
        pad_id: int = 0,
        add_extra_token: bool = True,
        window: int | None = None,
        buffer: int = 1000,
        cache_dir: str | os.PathLike[str] | None = None,
        vocab_size: int | None = None,
    ) -> None:
        if not isinstance(sequence_length, (int, np.integer)) or sequence_length <= 0:
            raise ConfigError(f"sequence_length must be a positive integer, not {sequence_length!r}.")
        if policy not in POLICIES:
            raise ConfigError(f"policy must be one of {POLICIES}, not {policy!r}.")
        if long_documents not in LONG_DOCUMENTS:
            raise ConfigError(f"long_documents must be one of {LONG_DOCUMENTS}, not {long_documents!r}.")
        if window is not None and (window <= 0 or policy != "bfd"):
            raise ConfigError(f"window must be None or a positive number of documents with policy='bfd', not {window}.")
        if buffer <= 0:
            raise ConfigError(f"buffer must be a positive number of documents, not {buffer}.")
        self.reader = reader
        self.sequence_length = int(sequence_length)
        self.add_extra_token = bool(add_extra_token)
        #: Tokens a row holds: ``sequence_length + add_extra_token``.
        self.capacity = self.sequence_length + int(self.add_extra_token)
        self.seed, self.policy, self.long_documents = int(seed), policy, long_documents
        self.pad_id, self.window, self.buffer = int(pad_id), window, int(buffer)
        self.cache_dir = None if cache_dir is None else os.fspath(cache_dir)
        self.vocab_size = vocab_size if vocab_size is not None else reader.metadata.get("vocab_size")
        self.description = {
            "class": "PackedSamples",
            "version": _PLAN_VERSION,
            "data": data_fingerprint(reader, reader.lengths),
            "sequence_length": self.sequence_length,
            "add_extra_token": self.add_extra_token,
            "seed": self.seed,
            "policy": policy,
            "long_documents": long_documents,
            "window": window,
            "buffer": self.buffer if policy == "bos" else None,
        }
        self.index_key = cache_key(self.description)
        #: A digest of every option, the pad id and the document lengths: equal fingerprints, equal samples.
        self.fingerprint = cache_key({"plan": self.index_key, "pad_id": self.pad_id})
        self._load_plan()

    def _build(self) -> dict[str, np.ndarray]:
        if self.policy == "bos":
            return bos_plan(self.reader.lengths, self.reader.offsets, self.capacity, self.buffer, self.seed)
        return pack_plan(
            self.reader.lengths, self.reader.offsets, self.capacity, self.long_documents, self.window, self.seed
        )

    def _load_plan(self) -> None:
        if self.cache_dir is None:
            arrays = self._build()
        else:
            arrays = IndexCache(self.cache_dir).get_or_build(self.index_key, self.description, _NAMES, self._build)
            self._check(arrays)
        #: Stream offset of each piece (document or fragment), row after row (int64).
        self.piece_starts: np.ndarray = arrays["piece_starts"]
        #: Length of each piece (int32).
        self.piece_lengths: np.ndarray = arrays["piece_lengths"]
        #: ``rows + 1`` offsets into the pieces (int64).
        self.row_offsets: np.ndarray = arrays["row_offsets"]
        #: The order rows are served in: ``self[i]`` is row ``shuffle_index[i]``.
        self.shuffle_index: np.ndarray = arrays["shuffle_index"]

    def _check(self, arrays: dict[str, np.ndarray]) -> None:
        """A cached plan is trusted only as far as O(pieces) checks go: shapes, ranges, row sizes."""
        starts, lengths, rows, shuffle = (arrays[name] for name in _NAMES)
        problems = []
        if starts.shape != lengths.shape or starts.ndim != 1:
            problems.append(f"piece arrays of shapes {starts.shape} and {lengths.shape}")
        elif len(lengths) and (
            lengths.min() < 1 or (starts.min() < 0 or (starts + lengths).max() > len(self.reader.tokens))
        ):
            problems.append("pieces outside the token stream")
        if rows.ndim != 1 or not len(rows) or rows[0] != 0 or rows[-1] != len(lengths) or (np.diff(rows) < 0).any():
            problems.append("row offsets that do not cover the pieces")
        elif len(lengths) and np.add.reduceat(lengths.astype(np.int64), rows[:-1]).max() > self.capacity:
            problems.append(f"a row longer than {self.capacity} tokens")
        if (
            shuffle.ndim != 1
            or len(shuffle) != len(rows) - 1
            or (len(shuffle) and not 0 <= shuffle.min() <= shuffle.max() < len(shuffle))
        ):
            problems.append("a row order that is not a permutation of the rows")
        if problems:
            raise FormatError(
                f"{self.cache_dir}: the cached packing plan {self.index_key}-* does not fit the data ("
                + "; ".join(problems)
                + "); delete it to rebuild."
            )

    # -- the samples ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.shuffle_index)

    def __getitem__(self, index: Any) -> Any:
        """Row ``index`` (after shuffling) as a dict of arrays (a slice gives a list)."""
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return self.row(int(self.shuffle_index[checked_position(index, len(self), "row", "rows")]))

    def pieces(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        """``(stream starts, lengths)`` of the pieces of ``row`` (before shuffling), in order."""
        a, b = int(self.row_offsets[row]), int(self.row_offsets[row + 1])
        return self.piece_starts[a:b], self.piece_lengths[a:b]

    def row(self, row: int) -> dict[str, np.ndarray]:
        """Row ``row`` (before shuffling) as a dict of the six fields."""
        starts, lengths = self.pieces(row)
        text = np.full(self.capacity, self.pad_id, dtype=np.int64)
        masks = self.reader.loss_masks
        stored = None if masks is None else np.zeros(self.capacity, dtype=np.uint8)
        filled = 0
        for start, length in zip(starts.tolist(), lengths.tolist()):
            text[filled : filled + length] = self.reader.span(start, start + length)
            if stored is not None and masks is not None:
                stored[filled : filled + length] = masks[start : start + length]
            filled += length
        return row_fields(text, lengths, self.sequence_length, self.add_extra_token, self.pad_id, stored)

    def batch(self, samples: Sequence[int] | np.ndarray) -> dict[str, np.ndarray]:
        """Several rows stacked: a dict of ``(len(samples), ...)`` arrays."""
        rows = [self[int(i)] for i in samples]
        if not rows:
            raise ConfigError("batch() needs at least one sample index.")
        return {key: np.stack([r[key] for r in rows]) for key in rows[0]}

    def sample_tokens(self) -> np.ndarray:
        """The real (non-padding) tokens of every sample in serving order (int64): what a token budget counts."""
        per_row = np.zeros(len(self.row_offsets) - 1, dtype=np.int64)
        if len(self.piece_lengths):
            nonempty = np.diff(self.row_offsets) > 0
            per_row[nonempty] = np.add.reduceat(self.piece_lengths.astype(np.int64), self.row_offsets[:-1][nonempty])
        served: np.ndarray = per_row[self.shuffle_index]
        return served

    def report(self) -> dict[str, Any]:
        """What the plan did with the data: documents (empty ones have no row), fragments, truncated tokens,
        rows, tokens packed, padding, and the padding waste in percent of the rows' room."""
        lengths = np.asarray(self.reader.lengths, dtype=np.int64)
        long = lengths > self.capacity
        packed = int(self.piece_lengths.sum(dtype=np.int64))
        rows = len(self)
        room = rows * self.capacity
        return {
            "documents": len(lengths),
            "empty_documents": int((lengths == 0).sum()),
            "long_documents": int(long.sum()),
            "long_documents_handling": self.long_documents if self.policy == "bfd" else "crop",
            "pieces": len(self.piece_lengths),
            "truncated_tokens": int(lengths.sum()) - packed,
            "rows": rows,
            "row_tokens": self.capacity,
            "tokens": packed,
            "padding_tokens": room - packed,
            "waste_percent": 100.0 * (room - packed) / room if room else 0.0,
        }

    @property
    def dtype(self) -> np.dtype:
        """The on-disk dtype of the reader's tokens (samples are int64)."""
        return self.reader.dtype

    def __repr__(self) -> str:
        return (
            f"<tokformats.training.PackedSamples {len(self):,} rows of {self.sequence_length}"
            f"{' + 1' if self.add_extra_token else ''} tokens from {self.reader.path}>"
        )

    # -- pickling: the reader by path; the plan from the cache when there is one --------------------
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        if self.cache_dir is not None:
            for name in _NAMES:
                state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if "shuffle_index" not in state:
            self._load_plan()


def row_fields(
    text: np.ndarray,
    lengths: np.ndarray,
    sequence_length: int,
    add_extra_token: bool,
    pad_id: int,
    stored: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """The six fields of a packed row: ``text`` (the row's ``capacity`` ids, padded), the pieces' ``lengths``
    in order, and ``stored``, the row's stored per-token loss mask (0 on padding) or None."""
    size = sequence_length
    used = int(np.sum(lengths, dtype=np.int64))
    starts = np.zeros(len(lengths), dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    tokens = text[:size].copy()
    labels = np.full(size, pad_id, dtype=np.int64)
    labels[: len(text) - 1] = text[1 : size + 1]
    # Label j (the token at j + 1) is trained on when it is a real token of the same document as token j.
    follows = np.zeros(size + 1, dtype=bool)
    follows[1 : min(used, size + 1)] = True
    follows[starts[(starts > 0) & (starts <= size)]] = False
    loss_mask = follows[1:].astype(np.float32)
    if stored is not None:
        loss_mask *= stored[1 : size + 1] if len(stored) > size else np.append(stored[1:], 0)
    segment_starts = starts[starts < size]
    if used < size:
        segment_starts = np.append(segment_starts, used)  # the padding is a segment of its own
    marks = np.zeros(size, dtype=bool)
    marks[segment_starts] = True
    cu_seqlens = np.full(size + 1, size, dtype=np.int32)
    cu_seqlens[: len(segment_starts)] = segment_starts
    doc_lens = np.zeros(size + 1, dtype=np.int32)
    doc_lens[: len(lengths)] = lengths
    return {
        "tokens": tokens,
        "labels": labels,
        "loss_mask": loss_mask,
        "position_ids": segment_positions(marks),
        "cu_seqlens": cu_seqlens,
        "doc_lens": doc_lens,
    }
