"""Exact duplicate documents of a corpus, found on token ids (``TokenReader.duplicates``, ``tokformats stats
--duplicates``).

Most documents of a corpus are unique, and a unique document should cost as little as possible. Three steps, each
vectorised NumPy and memory-bounded; only the first touches every document, and it reads 9 ids of each, not all:

1. **Fingerprint** (O(documents)). Each document's length and its ids at 9 fixed relative positions (first, last,
   middle, quarters, eighths: position ``(length - 1) * k // 8`` for ``k = 0..8``) are gathered from the memory map
   by fancy indexing, :data:`FINGERPRINT_DOCUMENTS` documents at a time, and mixed into a 64-bit fingerprint.
   Identical documents have identical fingerprints, so a document whose fingerprint no other document shares is
   unique and is never read again; the others are the *candidates* (a fingerprint collision only adds one).
2. **Hash** (O(candidates' tokens)). Each candidate gets a 64-bit hash of all its ids: a polynomial over their
   positions inside it, ``fmix64(sum(id_p * B**p) + length * L) mod 2**64`` with an odd base ``B`` (so the order of
   ids counts) and MurmurHash3's finaliser. The candidates' ids are read as one stream, :data:`CHUNK_TOKENS` at a
   time (documents that follow each other in the file as one slice, scattered ones by fancy indexing); per chunk
   that is one multiply by a fixed table of powers and one segmented sum, then one factor per document that moves
   its partial sum to its own positions (see :func:`document_hashes`), so a document may span chunks.
3. **Compare**. Candidates are sorted by hash; every member of a run of equal hashes is compared id by id with
   the run's first member, streamed the same way (pairs of equal length only); members that differ (a hash
   collision) are regrouped by their exact ids. A reported group therefore only ever holds identical documents,
   and identical documents share fingerprint and hash, so none is missed.

Cost: a corpus of unique documents costs one fingerprint per document (about one pass over the memory map when
documents are short, far less when they are long); the worst case, a corpus whose documents all have copies (a
pipeline that wrote its output 32 times), reads every id twice (hash, then comparison). Memory: 8 bytes per
document for fingerprints plus a few arrays of a chunk of :data:`CHUNK_TOKENS` tokens or
:data:`FINGERPRINT_DOCUMENTS` documents, then ~40 bytes per candidate.

A polynomial hash mod 2**64 has known colliding inputs (Thue-Morse sequences of a few thousand ids collide for
every odd base); real documents are not built that way, and a collision only costs the exact comparison's time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .protocol import TokenReader

__all__ = [
    "CHUNK_TOKENS",
    "FINGERPRINT_DOCUMENTS",
    "document_fingerprints",
    "document_hashes",
    "duplicate_candidates",
    "duplicate_groups",
    "duplicate_summary",
]

#: Tokens hashed (and compared) per step: bounds the working memory.
CHUNK_TOKENS = 1 << 20
#: Documents fingerprinted per step (9 positions and ids each): bounds the working memory.
FINGERPRINT_DOCUMENTS = 1 << 14

# The hash's odd base (hex digits of pi) and its inverse mod 2**64; the fingerprint's weights (powers of the hex
# digits of e); the multiplier that mixes a document's length in.
_BASE = 0x243F6A8885A308D3
_INVERSE = pow(_BASE, -1, 1 << 64)
_SAMPLE_EIGHTHS = np.arange(9, dtype=np.int64)
_TABLE_BITS = 20  # a 1 MiB table of fingerprints' top bits
_LENGTH_MULTIPLIER = np.uint64(0xC2B2AE3D27D4EB4F)
_FMIX1, _FMIX2 = np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53)
_S33 = np.uint64(33)
# Slices are copied one by one when a chunk's pieces average at least this many ids; shorter ones are gathered
# by one fancy index (whose index array costs 8 bytes an id, but no Python per piece).
_SLICE_MIN_AVERAGE = 256


def _fmix64(values: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finaliser, in place (a bijection of uint64 that spreads every input bit)."""
    values ^= values >> _S33
    values *= _FMIX1
    values ^= values >> _S33
    values *= _FMIX2
    values ^= values >> _S33
    return values


def _powers(base: int, count: int) -> np.ndarray:
    """``base**0 .. base**(count-1)`` mod 2**64 (uint64 products wrap)."""
    values = np.full(count, base, dtype=np.uint64)
    values[:1] = 1
    return np.cumprod(values, dtype=np.uint64)


_SAMPLE_WEIGHTS = _powers(0xB7E151628AED2A6B, 10)[1:]


def _as_uint64(values: np.ndarray) -> np.ndarray:
    """``values`` as uint64 carrying the same value (integers) or bit pattern (floats)."""
    if values.dtype.kind == "f":
        wide = values.astype(np.float64)
        wide[wide == 0] = 0.0  # -0.0 == 0.0 and NaN payloads differ: equal documents must hash equal
        wide[np.isnan(wide)] = np.nan
        return wide.view(np.uint64)
    return values.astype(np.int64).view(np.uint64)


def _id_values(ids: np.ndarray) -> np.ndarray:
    """Ids in a dtype whose product with uint64 stays uint64 and keeps every distinct id distinct: unsigned ids as
    they are, signed ids by their two's complement, floats by their bit pattern."""
    if ids.dtype.kind == "u":
        return ids
    return _as_uint64(ids)


def _plain(tokens: Any) -> Any:
    """A reader's token stream ready for fancy indexing: an ``np.memmap`` as a plain ndarray view (its own
    ``__getitem__`` runs Python code per call), anything else (a ``ConcatenatedArray``) as it is."""
    return tokens.view(np.ndarray) if isinstance(tokens, np.memmap) else tokens


def document_fingerprints(reader: TokenReader, batch: int | None = None) -> np.ndarray:
    """A 64-bit fingerprint of every document (uint64, one per document) from its length and its ids at 9 fixed
    relative positions (``(length - 1) * k // 8``, ``k = 0..8``): identical documents have identical
    fingerprints. Reads 9 ids per document, ``batch`` documents at a time (default :data:`FINGERPRINT_DOCUMENTS`)."""
    batch = batch or FINGERPRINT_DOCUMENTS
    offsets = np.asarray(reader.offsets, dtype=np.int64)
    count, total = len(offsets) - 1, int(offsets[-1])
    tokens = _plain(reader.tokens)
    fingerprints = np.empty(count, dtype=np.uint64)
    for first in range(0, count, batch):
        starts = offsets[first : first + batch + 1]
        lengths = starts[1:] - starts[:-1]
        mixed = lengths.view(np.uint64) * _LENGTH_MULTIPLIER
        if total:
            # one row of positions per document, so each document's ids are read together (they share pages)
            positions = np.maximum(lengths - 1, 0)[:, None] * _SAMPLE_EIGHTHS
            positions >>= 3
            positions += starts[:-1, None]
            empty = lengths == 0  # an empty document's positions may lie past the stream: it reads nothing
            positions[empty] = 0
            samples = np.take(tokens, positions) if isinstance(tokens, np.ndarray) else tokens[positions]
            columns = _id_values(np.ascontiguousarray(samples.T))
            columns[:, empty] = 0
            for column, weight in zip(columns, _SAMPLE_WEIGHTS):
                mixed += np.multiply(column, weight, dtype=np.uint64)
        fingerprints[first : first + len(lengths)] = _fmix64(mixed)
    return fingerprints


def _runs(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions of ``key`` sorted by it (stable: equal keys keep their order) and the ``(start, stop)`` bounds,
    in that order, of runs of >= 2 equal keys."""
    order = np.argsort(key, kind="stable")
    if len(order) < 2:
        return order, np.zeros((0, 2), dtype=np.int64)
    sorted_key = key[order]
    same = sorted_key[1:] == sorted_key[:-1]
    # a run starts where `same` goes 0 -> 1 and stops where it goes 1 -> 0
    edges = np.diff(np.concatenate([[0], same.view(np.int8), [0]]))
    starts = np.flatnonzero(edges == 1)
    stops = np.flatnonzero(edges == -1) + 1
    return order, np.stack([starts, stops], axis=1)


def _ranges(runs: np.ndarray) -> np.ndarray:
    """``concatenate([arange(a, b) for a, b in runs])``, vectorised."""
    sizes = runs[:, 1] - runs[:, 0]
    shift = np.repeat(runs[:, 0] - (np.cumsum(sizes) - sizes), sizes)
    return np.asarray(np.arange(int(sizes.sum()), dtype=np.int64) + shift)


def duplicate_candidates(reader: TokenReader) -> np.ndarray:
    """The documents whose fingerprint (:func:`document_fingerprints`) another document shares, as a sorted int64
    array: every document that has a copy is among them."""
    fingerprints = document_fingerprints(reader)
    ordered = np.sort(fingerprints)  # values only: several times faster than an argsort
    shared = np.unique(ordered[1:][ordered[1:] == ordered[:-1]])  # the values >= 2 documents hold
    if not len(shared):
        return np.zeros(0, dtype=np.int64)
    # A table of the shared values' top bits rules out nearly every other document with one lookup; the few left
    # are looked up exactly (a binary search for every document would cost more than the fingerprints).
    shift = np.uint64(64 - _TABLE_BITS)
    table = np.zeros(1 << _TABLE_BITS, dtype=bool)
    table[shared >> shift] = True
    maybe = np.flatnonzero(table[fingerprints >> shift])
    found = np.minimum(np.searchsorted(shared, fingerprints[maybe]), len(shared) - 1)
    candidates: np.ndarray = maybe[shared[found] == fingerprints[maybe]]
    return candidates.astype(np.int64, copy=False)


def _gather(tokens: Any, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The tokens of ranges ``starts[k] : starts[k] + lengths[k]``, concatenated, by one fancy index."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=tokens.dtype)
    shift = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
    return np.asarray(tokens[np.arange(total, dtype=np.int64) + shift])


class _Concatenation:
    """Some documents of a reader, in a given order, read as one stream (their ids concatenated) a range at a time.
    Documents that follow each other in the reader's stream form one *piece*, read as one slice."""

    def __init__(self, reader: TokenReader, documents: np.ndarray) -> None:
        offsets = np.asarray(reader.offsets, dtype=np.int64)
        starts = offsets[documents]
        lengths = offsets[documents + 1] - starts
        #: ``D + 1`` offsets of the documents in this stream
        self.offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        follows = starts[1:] == starts[:-1] + lengths[:-1]
        first = np.flatnonzero(np.concatenate([[True], ~follows]))
        self._pieces = np.append(self.offsets[first], self.offsets[-1])  # where each piece begins here, then the end
        self._sources = starts[first]  # where each piece begins in the reader's stream
        self._reader = reader
        self._tokens = _plain(reader.tokens)

    def read(self, start: int, stop: int) -> np.ndarray:
        """Ids ``start:stop`` (``start < stop``) of this stream."""
        first = int(np.searchsorted(self._pieces, start, side="right")) - 1
        last = int(np.searchsorted(self._pieces, stop - 1, side="right")) - 1
        begins = self._pieces[first : last + 1]
        lo = np.maximum(begins, start)
        sizes = np.minimum(self._pieces[first + 1 : last + 2], stop) - lo
        sources = self._sources[first : last + 1] + (lo - begins)
        if len(sources) == 1:
            return self._reader.span(int(sources[0]), int(sources[0] + sizes[0]))
        if len(sources) * _SLICE_MIN_AVERAGE > stop - start:
            return _gather(self._tokens, sources, sizes)
        ends = (sources + sizes).tolist()
        if isinstance(self._tokens, np.ndarray):  # slicing it directly: no method call per piece
            return np.concatenate([self._tokens[a:b] for a, b in zip(sources.tolist(), ends)])
        return np.concatenate([self._reader.span(a, b) for a, b in zip(sources.tolist(), ends)])


def _chunk_segments(offsets: np.ndarray, start: int, stop: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For ids ``start:stop`` of a stream of documents at ``offsets``: the documents with ids there, where each
    one's ids begin in the chunk, and where each one begins in the stream (before the chunk for the first,
    possibly)."""
    first = int(np.searchsorted(offsets, start, side="right")) - 1
    last = int(np.searchsorted(offsets, stop - 1, side="right")) - 1
    doc_starts = offsets[first : last + 1]
    lo = np.maximum(doc_starts, start)
    present = np.minimum(offsets[first + 1 : last + 2], stop) > lo  # empty documents own no id
    return np.flatnonzero(present) + first, lo[present] - start, doc_starts[present]


def document_hashes(
    reader: TokenReader, documents: np.ndarray | None = None, *, chunk_tokens: int | None = None
) -> np.ndarray:
    """A 64-bit hash of all the ids of each of ``documents`` (default: every document), as a uint64 array in their
    order; equal documents hash equal, and the order of ids counts. Their ids are read ``chunk_tokens`` at a time
    (default :data:`CHUNK_TOKENS`).

    The hash of a document is ``fmix64(sum(id_p * B**p) + length * L)``, a polynomial in the ids over their
    positions ``p`` inside the document, mod 2**64, with an odd base ``B``. Per chunk it costs one multiply by a
    fixed table of powers ``B**j`` (``j`` the position in the chunk) and one segmented sum: a document's partial
    sum is then moved to its own positions by one factor, ``B**-s`` from a second table for a document starting at
    ``s`` in the chunk, ``B**(chunk start - document start)`` for the one that began before it.
    """
    if documents is None:
        documents = np.arange(len(reader.offsets) - 1, dtype=np.int64)
    documents = np.asarray(documents, dtype=np.int64)
    sums = np.zeros(len(documents), dtype=np.uint64)
    if not len(documents):
        return sums
    stream = _Concatenation(reader, documents)
    offsets = stream.offsets
    total = int(offsets[-1])
    size = min(chunk_tokens or CHUNK_TOKENS, max(total, 1))
    powers, inverse_powers = _powers(_BASE, size), _powers(_INVERSE, size)
    for start in range(0, total, size):
        stop = min(start + size, total)
        in_chunk, segment_starts, document_starts = _chunk_segments(offsets, start, stop)
        ids = _id_values(stream.read(start, stop))
        partial = np.add.reduceat(np.multiply(ids, powers[: stop - start], dtype=np.uint64), segment_starts)
        factor = inverse_powers[segment_starts]
        if document_starts[0] < start:  # only the first document can begin before the chunk
            factor[0] = pow(_BASE, start - int(document_starts[0]), 1 << 64)
        partial *= factor
        sums[in_chunk] += partial
    return _fmix64(sums + np.diff(offsets).view(np.uint64) * _LENGTH_MULTIPLIER)


def _same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Element-wise equality, where NaN equals NaN (float corpora: two copies of a document are equal)."""
    same = a == b if a.dtype.kind != "f" else (a == b) | (np.isnan(a) & np.isnan(b))
    return np.asarray(same, dtype=bool)


def _same_ids(reader: TokenReader, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """For each pair (``left[k]``, ``right[k]``) of documents of equal length: whether their ids are equal. Both
    lists are streamed side by side, :data:`CHUNK_TOKENS` ids at a time (their offsets are the same)."""
    same = np.ones(len(left), dtype=bool)
    if not len(left):
        return same
    ours, theirs = _Concatenation(reader, left), _Concatenation(reader, right)
    offsets = ours.offsets
    total = int(offsets[-1])
    size = max(CHUNK_TOKENS, 1)
    for start in range(0, total, size):
        stop = min(start + size, total)
        in_chunk, segment_starts, _ = _chunk_segments(offsets, start, stop)
        equal = _same(ours.read(start, stop), theirs.read(start, stop))
        same[in_chunk] &= np.logical_and.reduceat(equal, segment_starts)
    return same


def _equal_documents(reader: TokenReader, members: np.ndarray, firsts: np.ndarray) -> np.ndarray:
    """For each pair (``members[k]``, ``firsts[k]``): whether the two documents are identical (same length, same
    ids). Pairs are read in the given order: members in increasing order read copies that follow each other (and
    their firsts, when those follow each other too) as slices."""
    lengths = np.asarray(reader.lengths)
    equal = np.asarray(members == firsts, dtype=bool)
    todo = np.flatnonzero(~equal & (lengths[members] == lengths[firsts]))
    equal[todo] = _same_ids(reader, members[todo], firsts[todo])
    return equal


def _regroup_exactly(reader: TokenReader, documents: np.ndarray, runs: np.ndarray) -> list[np.ndarray]:
    """Documents whose hash matched a group they are not equal to (collisions, rare), grouped by exact content."""
    found: dict[tuple[int, bytes], list[int]] = {}
    for document, run in zip(documents.tolist(), runs.tolist()):
        key = _id_values(np.asarray(reader[document])).tobytes()  # floats as compared: -0.0 == 0.0, NaN == NaN
        found.setdefault((run, key), []).append(document)
    return [np.array(sorted(g), dtype=np.int64) for g in found.values() if len(g) >= 2]


def duplicate_groups(reader: TokenReader) -> list[np.ndarray]:
    """Groups of identical documents: each a sorted int64 array of >= 2 document indices; groups ordered by their
    first index. Only documents whose fingerprint another shares (:func:`duplicate_candidates`) are hashed
    (:func:`document_hashes`); candidates with equal hashes are then compared id by id."""
    candidates = duplicate_candidates(reader)
    order, runs = _runs(document_hashes(reader, candidates))
    if not len(runs):
        return []
    sizes = runs[:, 1] - runs[:, 0]
    run_of = np.repeat(np.arange(len(runs)), sizes)
    # positions in `candidates`, run by run; candidates are sorted and the sort by hash is stable, so each run
    # lists its documents in increasing order
    in_runs = order[_ranges(runs)]
    # each candidate's run's first document, by position: the pairs are then compared in document order
    first = np.full(len(candidates), -1, dtype=np.int64)
    first[in_runs] = candidates[order[runs[run_of, 0]]]
    paired = np.flatnonzero(first >= 0)
    equal = np.zeros(len(candidates), dtype=bool)
    equal[paired] = _equal_documents(reader, candidates[paired], first[paired])
    equal = equal[in_runs]
    members = candidates[in_runs]
    kept, kept_runs = members[equal], run_of[equal]
    groups = list(np.split(kept, np.flatnonzero(np.diff(kept_runs)) + 1)) if len(kept) else []
    groups += _regroup_exactly(reader, members[~equal], run_of[~equal])
    groups = [g for g in groups if len(g) >= 2]
    groups.sort(key=lambda g: int(g[0]))
    return groups


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
