"""Document boundaries: offsets from lengths, and vectorised splitting at delimiter tokens.

A corpus's documents are described everywhere by one int64 array of ``D + 1`` token offsets:
document ``k`` is ``tokens[offsets[k]:offsets[k + 1]]``.
"""

from __future__ import annotations

import numpy as np

from .arrays import CHUNK_ELEMENTS, TokenArray, iter_chunks

__all__ = ["offsets_from_lengths", "split_offsets", "document_runs", "add_delimiter"]


def offsets_from_lengths(lengths: np.ndarray) -> np.ndarray:
    """``[0, l0, l0 + l1, ...]`` as int64 (summed in int64, so no overflow past 2**31 tokens)."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, dtype=np.int64, out=offsets[1:])
    return offsets


def _positions(tokens: TokenArray, value: int, chunk: int) -> np.ndarray:
    """Indices of every ``value`` in ``tokens``, scanned chunk by chunk so temporaries stay small."""
    found = []
    start = 0
    for piece in iter_chunks(tokens, chunk):
        hits = np.flatnonzero(piece == value)
        if hits.size:
            found.append(hits + start)
        start += len(piece)
    return np.concatenate(found).astype(np.int64) if found else np.zeros(0, dtype=np.int64)


def split_offsets(
    tokens: TokenArray,
    *,
    eos: int | None = None,
    bos: int | None = None,
    chunk: int = CHUNK_ELEMENTS,
) -> np.ndarray:
    """Document offsets of a token stream split at a delimiter.

    With ``eos`` every document ends with (and includes) that token; tokens after the last one form
    a final, unterminated document. With ``bos`` every document starts with that token; tokens before
    the first one form a leading document (a shard that starts mid-document). With neither, the
    stream is one document (none if it is empty).
    """
    n = len(tokens)
    if eos is not None and bos is not None:
        raise ValueError("pass eos= or bos=, not both")
    if eos is not None:
        cuts = _positions(tokens, eos, chunk) + 1
        tail = [n] if n and (cuts.size == 0 or cuts[-1] != n) else []
        return np.concatenate([[0], cuts, tail]).astype(np.int64)
    if bos is None:
        return np.array([0, n] if n else [0], dtype=np.int64)
    cuts = _positions(tokens, bos, chunk)
    head = [0] if cuts.size == 0 or cuts[0] != 0 else []
    if n == 0:
        return np.zeros(1, dtype=np.int64)
    return np.concatenate([head, cuts, [n]]).astype(np.int64)


def document_runs(offsets: np.ndarray, budget: int) -> list[tuple[int, int]]:
    """Consecutive runs ``(first, stop)`` of documents of about ``budget`` tokens each (at least one document
    per run), so that a large corpus can be copied in bounded pieces."""
    runs = []
    start, last = 0, len(offsets) - 1
    while start < last:
        stop = int(np.searchsorted(offsets, offsets[start] + budget, side="right")) - 1
        stop = min(max(stop, start + 1), last)
        runs.append((start, stop))
        start = stop
    return runs


def add_delimiter(
    flat: np.ndarray, lengths: np.ndarray, value: int, *, before: bool = False, only: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Insert ``value`` after (or ``before``) each document in one vectorised pass; return the new ids and lengths.

    ``only`` (a boolean per document) limits the insertion to some documents.
    """
    starts = np.zeros(len(lengths), dtype=np.int64)
    if len(lengths) > 1:
        np.cumsum(lengths[:-1], dtype=np.int64, out=starts[1:])
    places = starts if before else starts + lengths
    gets = np.ones(len(lengths), dtype=bool) if only is None else only
    return np.insert(flat, places[gets], value), lengths + gets
