"""Benchmark contamination by n-gram overlap on token ids (``tokformats.contamination``, ``tokformats
contamination``).

An eval item contaminates a corpus document when the two share an n-gram: ``ngram`` consecutive ids (13 by default,
as the GPT-3 and Llama reports use) inside one eval item and inside one document. Windows that cross a document's
(or an eval item's) boundary are not n-grams.

How, with memory bounded by the eval set and a chunk, not by the corpus:

1. Every eval n-gram gets a 64-bit polynomial rolling hash ``sum(x[p+k] * B**(n-1-k)) mod 2**64`` (``x`` the id
   the id's 64-bit pattern, ``B`` an odd base), computed for all windows at once from one cumulative sum of
   ``x[j] * B**-j`` (``B`` is invertible mod 2**64) and the powers of ``B``. Equal n-grams are merged by exact
   comparison, so each distinct n-gram is held once with the eval items that contain it.
2. The corpus is streamed :data:`CHUNK_TOKENS` tokens at a time (plus ``n - 1`` of overlap) and hashed the same way.
   A bit table indexed by a hash's top bits (about 16 bits per eval n-gram) drops almost every window with two
   array operations; survivors are looked up in the sorted eval hashes.
3. **Verification:** every window whose hash equals an eval n-gram's is compared id by id with that n-gram, and
   windows crossing a document boundary are dropped. Only exact matches are reported: no false positive.

False positives of the hash stage (before verification): for ``E`` distinct eval n-grams and ``W`` corpus windows,
about ``W * E / 2**64`` windows match a hash without matching the n-gram (10k items of ~500 tokens against 1 G
tokens: ~3e-4 windows per run), and each one is caught by step 3. The bit table's own false-positive rate,
``1 - exp(-E / table_bits)`` (~6% at 16 bits per n-gram), only costs a binary search per surviving window.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..core.protocol import TokenReader
from ..errors import ConfigError

__all__ = ["contamination", "read_eval_file", "contamination_report", "NgramIndex", "CHUNK_TOKENS"]

#: Corpus tokens hashed per step.
CHUNK_TOKENS = 1 << 20

_BASE = 0x9E3779B97F4A7C15  # odd: invertible mod 2**64
_BASE_INVERSE = pow(_BASE, -1, 1 << 64)


def _unsigned(ids: np.ndarray) -> np.ndarray:
    """Ids whose product with uint64 stays uint64, distinct ids distinct: unsigned as they are, signed by their two's
    complement, floats by their bit pattern."""
    if ids.dtype.kind == "u":
        return ids
    if ids.dtype.kind == "f":
        return ids.astype(np.float64).view(np.uint64)
    return ids.astype(np.int64).view(np.uint64)


def _unique_pairs(first: np.ndarray, second: np.ndarray, second_count: int) -> np.ndarray:
    """The distinct ``(first[k], second[k])`` rows (non-negative ints), sorted: one 1-D ``np.unique`` on a combined
    key when it fits 63 bits (many times faster than ``np.unique(axis=0)``)."""
    if not len(first):
        return np.zeros((0, 2), dtype=np.int64)
    width = max(int(second_count), 1)
    if (int(first.max()) + 1) * width < 1 << 62:
        keys = np.sort(first.astype(np.int64) * width + second.astype(np.int64))
        keys = keys[np.concatenate([[True], keys[1:] != keys[:-1]])]  # np.unique hashes int64 slowly (NumPy 2.3)
        return np.stack([keys // width, keys % width], axis=1)
    return np.unique(np.stack([first, second], axis=1).astype(np.int64), axis=0)


def _powers(base: int, count: int) -> np.ndarray:
    """``base**0 .. base**(count-1)`` mod 2**64 as uint64."""
    values = np.full(count, base, dtype=np.uint64)
    values[0] = 1
    return np.cumprod(values, dtype=np.uint64)  # uint64 products wrap: arithmetic mod 2**64


class _RollingHash:
    """Hashes of every ``n``-window of a block of ids, with power tables sized for blocks up to ``size``."""

    def __init__(self, n: int, size: int) -> None:
        self.n = n
        self.forward = _powers(_BASE, size + 1)
        self.inverse = _powers(_BASE_INVERSE, size + 1)

    def ensure(self, size: int) -> None:
        """Grow the power tables to blocks of ``size`` ids."""
        if size + 1 > len(self.forward):
            self.forward = _powers(_BASE, size + 1)
            self.inverse = _powers(_BASE_INVERSE, size + 1)

    def windows(self, ids: np.ndarray) -> np.ndarray:
        """Hash of ``ids[p : p + n]`` for every ``p`` in ``0 .. len(ids) - n`` (uint64; empty when shorter)."""
        count, n = len(ids), self.n
        if count < n:
            return np.zeros(0, dtype=np.uint64)
        self.ensure(count)
        mapped = np.multiply(_unsigned(np.asarray(ids)), self.inverse[:count], dtype=np.uint64)
        prefix = np.zeros(count + 1, dtype=np.uint64)
        np.cumsum(mapped, out=prefix[1:])
        sums = prefix[n:] - prefix[:-n]
        sums *= self.forward[n - 1 : count]  # B**(p + n - 1) undoes B**-p and weights the window's last id by 1
        return sums


class NgramIndex:
    """The distinct n-grams of an eval set, each with the eval items containing it: sorted hashes, where each
    n-gram's ids are in the eval stream, and a bit table that rejects most non-matching hashes cheaply.

    Args:
        items: the eval items' ids, one int array per item.
        ngram: the n-gram length.
    """

    def __init__(self, items: Sequence[np.ndarray], ngram: int) -> None:
        self.ngram = ngram
        lengths = np.array([len(item) for item in items], dtype=np.int64)
        self.stream = np.concatenate([np.asarray(i, dtype=np.int64) for i in items]) if len(items) else np.zeros(0)
        self.stream = self.stream.astype(np.int64)
        self.roller = _RollingHash(ngram, max(len(self.stream), 1))
        hashes = self.roller.windows(self.stream)
        starts = np.arange(len(hashes), dtype=np.int64)
        item_starts = np.concatenate([[0], np.cumsum(lengths)])
        owner = np.searchsorted(item_starts, starts, side="right") - 1
        inside = starts + ngram <= item_starts[owner + 1]  # windows crossing into the next item are no n-grams
        hashes, starts, owner = hashes[inside], starts[inside], owner[inside]
        order = np.lexsort((owner, hashes))
        hashes, starts, owner = hashes[order], starts[order], owner[order]
        # Distinct n-grams: runs of one hash whose ids equal the run's first; a colliding n-gram opens its own entry.
        new_hash = np.concatenate([[True], hashes[1:] != hashes[:-1]]) if len(hashes) else np.zeros(0, dtype=bool)
        run_first = np.maximum.accumulate(np.where(new_hash, np.arange(len(hashes)), 0))
        differs = ~self._same_ngrams(starts, starts[run_first])
        opens = new_hash | differs
        numbered = np.cumsum(opens) - 1
        entry = np.where(differs, numbered, numbered[run_first])  # equal to the run's first: the first's entry
        #: One row per distinct n-gram: its hash (sorted) and where its ids start in :attr:`stream`.
        self.hashes, self.starts = hashes[opens], starts[opens]
        # A colliding n-gram equal to an earlier colliding one stays its own entry: both match the same windows, and
        # the (item, document) pairs are made unique at the end.
        pairs = _unique_pairs(entry, owner, len(items))
        #: Eval items of entry ``e``: ``entry_items[entry_bounds[e] : entry_bounds[e + 1]]``.
        self.entry_items = pairs[:, 1].astype(np.int64)
        self.entry_bounds = np.searchsorted(pairs[:, 0], np.arange(len(self.hashes) + 1)).astype(np.int64)
        self._filter_shift, self.table = self._bit_table(self.hashes)

    @staticmethod
    def _bit_table(hashes: np.ndarray) -> tuple[np.uint64, np.ndarray]:
        """A table of 2**k flags (about 16 per distinct n-gram, 2**16 .. 2**30), set at each hash's top k bits."""
        bits = int(min(max(16, (max(len(hashes), 1) * 16 - 1).bit_length()), 30))
        shift = np.uint64(64 - bits)
        table = np.zeros(1 << bits, dtype=bool)
        table[hashes >> shift] = True
        return shift, table

    def _same_ngrams(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Whether the eval n-grams starting at ``a[k]`` and ``b[k]`` hold the same ids."""
        window = np.arange(self.ngram, dtype=np.int64)
        same = np.ones(len(a), dtype=bool)
        step = max(CHUNK_TOKENS // self.ngram, 1)  # rows per batch: memory stays ~CHUNK_TOKENS ids
        for lo in range(0, len(a), step):
            rows_a, rows_b = a[lo : lo + step, None] + window, b[lo : lo + step, None] + window
            same[lo : lo + step] = (self.stream[rows_a] == self.stream[rows_b]).all(axis=1)
        return same

    def __len__(self) -> int:
        """Number of distinct n-grams."""
        return len(self.hashes)

    def matches(self, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(window, entry)`` pairs: window ``hashes[window]`` has distinct n-gram ``entry``'s hash."""
        candidates = np.flatnonzero(self.table[hashes >> self._filter_shift])
        # Sorted queries walk the sorted hashes in order: a binary search per query misses the cache every step.
        candidates = candidates[np.argsort(hashes[candidates], kind="stable")]
        wanted = hashes[candidates]
        left = np.searchsorted(self.hashes, wanted, side="left")
        right = np.searchsorted(self.hashes, wanted, side="right")
        found = right > left
        candidates, left, count = candidates[found], left[found], (right - left)[found]
        windows = np.repeat(candidates, count)  # a hash held by several distinct (colliding) n-grams: each pair
        entries = np.repeat(left - (np.cumsum(count) - count), count) + np.arange(int(count.sum()))
        return windows, entries


def _scan_corpus(corpus: TokenReader, index: NgramIndex, chunk_tokens: int) -> np.ndarray:
    """Unique ``(entry, document)`` pairs: document holds distinct eval n-gram ``entry`` (verified id by id)."""
    n, offsets, total = index.ngram, np.asarray(corpus.offsets, dtype=np.int64), corpus.num_tokens
    roller = _RollingHash(n, chunk_tokens + n)
    window = np.arange(n, dtype=np.int64)
    found = []
    for start in range(0, max(total - n + 1, 0), chunk_tokens):
        block = np.asarray(corpus.span(start, min(start + chunk_tokens + n - 1, total)))
        positions, entries = index.matches(roller.windows(block))
        if not len(positions):
            continue
        exact = (block[positions[:, None] + window] == index.stream[index.starts[entries][:, None] + window]).all(1)
        positions, entries = positions[exact] + start, entries[exact]
        documents = np.searchsorted(offsets, positions, side="right") - 1
        inside = positions + n <= offsets[documents + 1]  # an n-gram lies in one document
        if inside.any():
            found.append(_unique_pairs(entries[inside], documents[inside], len(offsets) - 1))
    if not found:
        return np.zeros((0, 2), dtype=np.int64)
    merged = np.concatenate(found)
    return _unique_pairs(merged[:, 0], merged[:, 1], len(offsets) - 1)


def _eval_items(eval_set: Any, tokenizer: Any) -> list[np.ndarray]:
    """The eval items as id arrays: from a corpus reader, from texts (with ``tokenizer``), or from id sequences."""
    if isinstance(eval_set, TokenReader):
        return [np.asarray(eval_set[i]) for i in range(len(eval_set))]
    if isinstance(eval_set, str):
        raise ConfigError(
            "contamination takes the eval set as a list of texts, a list of id arrays or an opened corpus, not one "
            "string; for a file run: tokformats contamination CORPUS --eval FILE.jsonl --tokenizer tokenizer.json"
        )
    items = list(eval_set)
    if not items or not all(isinstance(item, str) for item in items):
        return [np.asarray(item, dtype=np.int64).ravel() for item in items]
    if tokenizer is None:
        raise ConfigError("the eval set is text: pass tokenizer= (a tokenizer.json path or a tokenizers.Tokenizer).")
    from ..core.vocab import load_tokenizer

    encoded = load_tokenizer(tokenizer).encode_batch(items, add_special_tokens=False)
    return [np.asarray(e.ids, dtype=np.int64) for e in encoded]


def contamination(
    corpus: Any,
    eval_set: Iterable[Any] | TokenReader,
    *,
    tokenizer: Any = None,
    ngram: int = 13,
    chunk_tokens: int = CHUNK_TOKENS,
) -> list[np.ndarray]:
    """Which corpus documents share an ``ngram``-token n-gram with each eval item.

    Args:
        corpus: an opened corpus (a :class:`~tokformats.TokenReader`) or anything :func:`tokformats.open` takes.
        eval_set: the eval items: texts (tokenized with ``tokenizer``, without special tokens), id sequences, or an
            opened corpus whose documents are the items.
        tokenizer: a tokenizer.json path, its folder or a ``tokenizers.Tokenizer``; needed for texts.
        ngram: the n-gram length in tokens (13, as GPT-3 and Llama report). An item shorter than that holds no
            n-gram: its entry is empty (lower ``ngram`` to check short items).
        chunk_tokens: corpus tokens hashed per step (memory: ~6 x 8 bytes per token of a step, ~48 MiB).

    Returns:
        One int64 array per eval item, in order: the sorted indices of the corpus documents sharing at least one
        n-gram with it (exact: every match is verified id by id).
    """
    if ngram < 1:
        raise ConfigError(f"ngram must be at least 1, found {ngram}.")
    items = _eval_items(eval_set, tokenizer)
    index = NgramIndex(items, ngram)
    if isinstance(corpus, TokenReader):
        pairs = _scan_corpus(corpus, index, chunk_tokens)
        corpus_documents = len(corpus)
    else:
        from ..api import open as open_dataset

        with open_dataset(corpus) as reader:
            if not isinstance(reader, TokenReader):
                raise ConfigError(f"{corpus} is a {reader.format} file, not a corpus of documents.")
            pairs = _scan_corpus(reader, index, chunk_tokens)
            corpus_documents = len(reader)
    # (entry, document) -> (item, document): each distinct n-gram stands for every eval item containing it
    bounds = index.entry_bounds
    per_entry = bounds[pairs[:, 0] + 1] - bounds[pairs[:, 0]]
    first = np.repeat(bounds[pairs[:, 0]] - (np.cumsum(per_entry) - per_entry), per_entry)
    item_of = index.entry_items[first + np.arange(int(per_entry.sum()))]
    hits = _unique_pairs(item_of, np.repeat(pairs[:, 1], per_entry), corpus_documents)
    cuts = np.searchsorted(hits[:, 0], np.arange(len(items) + 1))
    return [hits[cuts[k] : cuts[k + 1], 1].astype(np.int64) for k in range(len(items))]


def read_eval_file(path: str | os.PathLike[str], text_keys: Sequence[str] = ("text",)) -> tuple[list[str], list[int]]:
    """The eval items of a text file ``tokenize`` reads (``.jsonl``/``.json``/Parquet by ``text_keys``, joined by a
    newline when several; ``.txt`` one item per line) and each item's line (row) number; blank lines are no item.
    A bad record raises :class:`tokformats.tokenization.sources.SourceError` naming file and line."""
    from ..tokenization.sources import SourceError, iter_records, resolve_inputs

    texts, lines = [], []
    for record in iter_records(resolve_inputs([Path(os.fspath(path))]), tuple(text_keys), "line"):
        if record.error is not None:
            raise SourceError(record.error)
        if record.texts is not None:
            texts.append("\n".join(record.texts))
            lines.append(record.index)
    return texts, lines


def contamination_report(
    found: list[np.ndarray], lines: Sequence[int] | None, *, ngram: int, corpus: str, eval_name: str
) -> dict[str, Any]:
    """What ``tokformats contamination --json`` prints: counts, and one row per contaminated eval item (its index,
    its line when read from a file, the number and the indices of the corpus documents it shares an n-gram
    with). JSON-serialisable."""
    rows = [
        {
            "item": k,
            **({"line": int(lines[k])} if lines is not None else {}),
            "documents": len(documents),
            "document_indices": documents.tolist(),
        }
        for k, documents in enumerate(found)
        if len(documents)
    ]
    return {
        "corpus": corpus,
        "eval": eval_name,
        "ngram": ngram,
        "items": len(found),
        "contaminated_items": len(rows),
        "contaminated_rate": len(rows) / len(found) if found else 0.0,
        "matches": rows,
    }
