"""Exact duplicate documents of a corpus, found on token ids (``TokenReader.duplicates``, ``tokformats stats
--duplicates``).

Two passes, both vectorised NumPy and memory-bounded:

1. **Hash.** The token stream is read in chunks of :data:`CHUNK_TOKENS` tokens (any chunk boundary: a document may
   span several chunks). Each document gets two polynomial hashes of its ids over their positions inside it,
   ``sum(id_p * B**p) mod 2**64`` with two odd bases (so the order of ids counts), each finalised with the
   document's length by MurmurHash3's 64-bit finaliser: 128 bits per document. Per chunk and hash that is one
   multiply by a fixed table of powers and one segmented sum, then one factor per document that moves its partial
   sum to its own positions (see :func:`document_hashes`).
2. **Compare.** Documents are sorted by (length, hash, hash); a run of equal keys is a *candidate* group. Every
   member's tokens are compared with the run's first member's, in batches of at most :data:`CHUNK_TOKENS` tokens;
   members that differ (a hash collision: about ``D**2 / 2**129`` expected pairs for ``D`` documents) are regrouped
   by their exact bytes. A reported group therefore only ever holds identical documents.

Memory: a few 64-bit arrays of a chunk (~32 MiB at the default: small chunks stay in the CPU cache), plus 3 x 8
bytes per document.

A polynomial hash mod 2**64 has known colliding inputs (Thue-Morse sequences of a few thousand ids collide for
every odd base); real documents are not built that way, and a collision only costs the exact comparison's time.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .protocol import TokenReader

__all__ = ["CHUNK_TOKENS", "document_hashes", "duplicate_groups", "duplicate_summary"]

#: Tokens hashed (and compared) per step: bounds the working memory.
CHUNK_TOKENS = 1 << 20

# The odd bases of the two polynomial hashes (hex digits of pi and e) and their inverses mod 2**64.
_BASES = (0x243F6A8885A308D3, 0xB7E151628AED2A6B)
_INVERSES = tuple(pow(base, -1, 1 << 64) for base in _BASES)
_LENGTH_MULTIPLIER = np.uint64(0xC2B2AE3D27D4EB4F)
_FMIX1, _FMIX2 = np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53)
_S33 = np.uint64(33)


def _fmix64(values: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finaliser, in place (a bijection of uint64 that spreads every input bit)."""
    values ^= values >> _S33
    values *= _FMIX1
    values ^= values >> _S33
    values *= _FMIX2
    values ^= values >> _S33
    return values


def _chunk_segments(offsets: np.ndarray, start: int, stop: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For tokens ``start:stop`` of the stream: the documents with tokens there, where each one's tokens begin in
    the chunk, and where each document begins in the stream (before the chunk for the first, possibly)."""
    first = int(np.searchsorted(offsets, start, side="right")) - 1
    last = int(np.searchsorted(offsets, stop - 1, side="right")) - 1
    doc_starts = offsets[first : last + 1]
    lo = np.maximum(doc_starts, start)
    present = np.minimum(offsets[first + 1 : last + 2], stop) > lo  # empty documents own no token
    return np.flatnonzero(present) + first, lo[present] - start, doc_starts[present]


def _powers(base: int, count: int) -> np.ndarray:
    """``base**0 .. base**(count-1)`` mod 2**64 (uint64 products wrap)."""
    values = np.full(count, base, dtype=np.uint64)
    values[:1] = 1
    return np.cumprod(values, dtype=np.uint64)


def _power(base: int, exponents: np.ndarray) -> np.ndarray:
    """``base**e`` mod 2**64 for every non-negative ``e`` (square and multiply, vectorised over ``exponents``)."""
    result = np.ones(len(exponents), dtype=np.uint64)
    remaining = exponents.astype(np.uint64)
    square = base % (1 << 64)
    while remaining.any():
        odd = (remaining & np.uint64(1)).astype(bool)
        result[odd] *= np.uint64(square)
        remaining >>= np.uint64(1)
        square = square * square % (1 << 64)  # Python ints: NumPy scalars warn on the wrap
    return result


def _id_values(ids: np.ndarray) -> np.ndarray:
    """Ids in a dtype whose product with uint64 stays uint64 and keeps every distinct id distinct: unsigned ids as
    they are, signed ids by their two's complement, floats by their bit pattern."""
    if ids.dtype.kind == "u":
        return ids
    return _as_uint64(ids)


def document_hashes(reader: TokenReader, chunk_tokens: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Two independent 64-bit hashes of every document's ids (uint64 arrays, one value per document); equal
    documents hash equal, and the order of ids counts. The stream is read ``chunk_tokens`` at a time (default
    :data:`CHUNK_TOKENS`).

    Hash ``k`` of a document is ``fmix64(sum(id_p * B_k**p) + length * L)``, a polynomial in the ids over their
    positions ``p`` inside the document, mod 2**64, with odd bases ``B_k``. Per chunk it costs one multiply by a
    fixed table of powers ``B**j`` (``j`` the position in the chunk) and one segmented sum per hash: a document's
    partial sum is then moved to its own positions by one factor ``B**(chunk start - document start)`` (an
    inverse power for a document starting inside the chunk), so documents may span any chunk boundary.
    """
    chunk_tokens = chunk_tokens or CHUNK_TOKENS
    offsets = np.asarray(reader.offsets, dtype=np.int64)
    count = len(offsets) - 1
    total = int(offsets[-1]) if count else 0
    size = min(chunk_tokens, max(total, 1))
    tables = [(_powers(base, size), base, inverse) for base, inverse in zip(_BASES, _INVERSES)]
    sums = [np.zeros(count, dtype=np.uint64), np.zeros(count, dtype=np.uint64)]
    tokens = reader.tokens
    for start in range(0, total, size):
        stop = min(start + size, total)
        documents, segment_starts, document_starts = _chunk_segments(offsets, start, stop)
        ids = _id_values(np.asarray(tokens[start:stop]))
        before = document_starts < start  # only the first document can begin before the chunk
        for sums_k, (powers, base, inverse) in zip(sums, tables):
            partial = np.add.reduceat(np.multiply(ids, powers[: stop - start], dtype=np.uint64), segment_starts)
            factor = _power(inverse, segment_starts.astype(np.uint64))
            if before[:1].any():
                factor[0] = _power(base, np.array([start - int(document_starts[0])]))[0]
            partial *= factor
            sums_k[documents] += partial
    lengths = np.diff(offsets).view(np.uint64)
    return tuple(_fmix64(s + lengths * _LENGTH_MULTIPLIER) for s in sums)  # type: ignore[return-value]


def _as_uint64(values: np.ndarray) -> np.ndarray:
    """``values`` as uint64 carrying the same value (integers) or bit pattern (floats)."""
    if values.dtype.kind == "f":
        wide = values.astype(np.float64)
        wide[wide == 0] = 0.0  # -0.0 == 0.0 and NaN payloads differ: equal documents must hash equal
        wide[np.isnan(wide)] = np.nan
        return wide.view(np.uint64)
    return values.astype(np.int64).view(np.uint64)


def _candidate_runs(keys: tuple[np.ndarray, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Documents sorted by ``keys`` (last key first) and the ``(start, stop)`` bounds of runs of >= 2 equal keys."""
    order = np.lexsort(keys)
    if len(order) < 2:
        return order, np.zeros((0, 2), dtype=np.int64)
    same = np.ones(len(order) - 1, dtype=bool)
    for key in keys:
        sorted_key = key[order]
        same &= sorted_key[1:] == sorted_key[:-1]
    # a run starts where `same` goes 0 -> 1 and stops where it goes 1 -> 0
    edges = np.diff(np.concatenate([[0], same.view(np.int8), [0]]))
    starts = np.flatnonzero(edges == 1)
    stops = np.flatnonzero(edges == -1) + 1
    return order, np.stack([starts, stops], axis=1)


def _gather(tokens: Any, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The tokens of ranges ``starts[k] : starts[k] + lengths[k]``, concatenated."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    shift = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
    return np.asarray(tokens[np.arange(total, dtype=np.int64) + shift])


def _equal_to_first(reader: TokenReader, members: np.ndarray, firsts: np.ndarray) -> np.ndarray:
    """For each pair (``members[k]``, ``firsts[k]``) of documents of equal length: whether their ids are equal.
    Short documents are compared many per batch, long ones piece by piece: at most ~:data:`CHUNK_TOKENS` at once."""
    offsets, lengths = reader.offsets, reader.lengths
    equal = np.ones(len(members), dtype=bool)
    sizes = lengths[members]
    piece = max(CHUNK_TOKENS // 2, 1)
    short = np.flatnonzero((sizes > 0) & (sizes <= piece))
    for batch in _split_by(short, np.cumsum(sizes[short]) // piece):
        size = sizes[batch]
        same = _same(
            _gather(reader.tokens, offsets[members[batch]], size), _gather(reader.tokens, offsets[firsts[batch]], size)
        )
        equal[batch] = np.logical_and.reduceat(same, np.cumsum(size) - size)
    for k in np.flatnonzero(sizes > piece).tolist():
        a, b, size = int(offsets[members[k]]), int(offsets[firsts[k]]), int(sizes[k])
        equal[k] = all(
            _same(reader.span(a + i, a + min(i + piece, size)), reader.span(b + i, b + min(i + piece, size))).all()
            for i in range(0, size, piece)
        )
    return equal


def _same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Element-wise equality, where NaN equals NaN (float corpora: two copies of a document are equal)."""
    same = a == b if a.dtype.kind != "f" else (a == b) | (np.isnan(a) & np.isnan(b))
    return np.asarray(same, dtype=bool)


def _split_by(items: np.ndarray, labels: np.ndarray) -> Iterator[np.ndarray]:
    """Consecutive pieces of ``items`` sharing a (non-decreasing) label."""
    if not len(items):
        return
    cuts = np.flatnonzero(np.diff(labels)) + 1
    yield from np.split(items, cuts)


def duplicate_groups(reader: TokenReader, hashes: tuple[np.ndarray, np.ndarray] | None = None) -> list[np.ndarray]:
    """Groups of identical documents: each a sorted int64 array of >= 2 document indices; groups ordered by their
    first index. ``hashes`` (from :func:`document_hashes`) are computed when not given."""
    h1, h2 = hashes if hashes is not None else document_hashes(reader)
    lengths = np.asarray(reader.lengths, dtype=np.int64)
    order, runs = _candidate_runs((h2, h1, lengths))
    if not len(runs):
        return []
    sizes = runs[:, 1] - runs[:, 0]
    run_of = np.repeat(np.arange(len(runs)), sizes)
    candidates = order[_ranges(runs)]
    equal = _equal_to_first(reader, candidates, order[runs[run_of, 0]])
    kept, kept_runs = candidates[equal], run_of[equal]
    arranged = np.lexsort((kept, kept_runs))  # by run, then by document index: each group comes out sorted
    kept, kept_runs = kept[arranged], kept_runs[arranged]
    groups = list(np.split(kept, np.flatnonzero(np.diff(kept_runs)) + 1)) if len(kept) else []
    groups += _regroup_exactly(reader, candidates[~equal], run_of[~equal])
    groups = [g.astype(np.int64, copy=False) for g in groups if len(g) >= 2]
    groups.sort(key=lambda g: int(g[0]))
    return groups


def _ranges(runs: np.ndarray) -> np.ndarray:
    """``concatenate([arange(a, b) for a, b in runs])``, vectorised."""
    sizes = runs[:, 1] - runs[:, 0]
    shift = np.repeat(runs[:, 0] - (np.cumsum(sizes) - sizes), sizes)
    return np.asarray(np.arange(int(sizes.sum()), dtype=np.int64) + shift)


def _regroup_exactly(reader: TokenReader, documents: np.ndarray, runs: np.ndarray) -> list[np.ndarray]:
    """Documents whose hash matched a group they are not equal to (collisions, rare), grouped by exact content."""
    found: dict[tuple[int, bytes], list[int]] = {}
    for document, run in zip(documents.tolist(), runs.tolist()):
        found.setdefault((run, np.asarray(reader[document]).tobytes()), []).append(document)
    return [np.array(sorted(g), dtype=np.int64) for g in found.values() if len(g) >= 2]


def duplicate_summary(reader: TokenReader, groups: list[np.ndarray], top: int = 10) -> dict[str, Any]:
    """What ``tokformats stats --duplicates`` reports: how many documents and tokens are copies beyond the first
    of their group (counts and rates), the number of groups, a histogram of group sizes, and the ``top`` most
    repeated documents. JSON-serialisable."""
    lengths = reader.lengths
    documents, tokens = len(reader), reader.num_tokens
    copies = sum(len(g) - 1 for g in groups)
    copy_tokens = sum(int(lengths[g[0]]) * (len(g) - 1) for g in groups)
    sizes = np.array([len(g) for g in groups], dtype=np.int64)
    histogram = [{"size": int(s), "groups": int(c)} for s, c in enumerate(np.bincount(sizes)) if c]
    ranked = sorted(groups, key=lambda g: (-len(g), int(g[0])))[:top]
    return {
        "documents": documents,
        "tokens": tokens,
        "groups": len(groups),
        "duplicate_documents": copies,
        "duplicate_tokens": copy_tokens,
        "duplicate_rate": copies / documents if documents else 0.0,
        "duplicate_token_share": copy_tokens / tokens if tokens else 0.0,
        "group_sizes": histogram,
        "top": [
            {"size": len(g), "length": int(lengths[g[0]]), "documents": g[:10].tolist()} for g in ranked
        ],
    }
