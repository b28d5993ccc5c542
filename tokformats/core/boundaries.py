"""Keeping document boundaries across formats: which delimiter a conversion inserts, and the proof that the
destination's reader will find exactly the source's documents.

Formats that store boundaries (an index) need nothing. Formats whose reader splits a flat stream at a delimiter
(``TokenWriter.boundaries`` ``"eos"``: after each document; ``"bos"``: before it) need every document to carry that
delimiter exactly once, at its end (or start), and nowhere inside: then splitting gives back the same documents.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError, FormatError, option
from .arrays import TokenArray, iter_chunks
from .documents import add_delimiter, offsets_from_lengths

__all__ = ["Delimiter", "choose_delimiter", "delimit", "delimited_mask"]


@dataclass(frozen=True)
class Delimiter:
    """The id that marks documents, and where: ``"eos"`` ends each document, ``"bos"`` starts it."""

    kind: str
    id: int
    #: The source's documents carry the id at the other edge (Megatron's EOD after each document, going to llm.c
    #: where it precedes each): it is moved, not added.
    moves: bool = False

    @property
    def option(self) -> dict[str, int]:
        """The reader (and writer) option naming it: ``{"eos": id}`` or ``{"bos": id}``."""
        return {self.kind: self.id}


def _consistent(tokens: TokenArray, offsets: np.ndarray, kind: str) -> int | None:
    """The one id every non-empty document ends (``eos``) or starts (``bos``) with, if there is one."""
    lengths = np.diff(offsets)
    nonempty = np.flatnonzero(lengths > 0)
    if not len(nonempty):
        return None
    places = offsets[nonempty + 1] - 1 if kind == "eos" else offsets[nonempty]
    edge = np.asarray(tokens[places])
    return int(edge[0]) if (edge == edge[0]).all() else None


def _once_per_document(tokens: TokenArray, offsets: np.ndarray, value: int) -> bool:
    """Whether ``value`` occurs no more often in the stream than there are non-empty documents (it is then only at
    their edges, where :func:`_consistent` found it)."""
    count = sum(int(np.count_nonzero(np.asarray(chunk) == value)) for chunk in iter_chunks(tokens))
    return count <= int(np.count_nonzero(np.diff(offsets) > 0))


def _moves(tokens: TokenArray, offsets: np.ndarray, kind: str, value: int) -> bool:
    """Whether the documents carry ``value`` at the edge opposite ``kind`` (and not already at ``kind``'s)."""
    other = "bos" if kind == "eos" else "eos"
    return _consistent(tokens, offsets, other) == value and _consistent(tokens, offsets, kind) != value


def choose_delimiter(
    destination_kind: str,
    tokens: TokenArray,
    offsets: np.ndarray,
    *,
    eos: int | None,
    bos: int | None,
    format: str,
    source: object,
    alternatives: str,
) -> Delimiter | None:
    """The delimiter a conversion into a format with ``destination_kind`` boundaries inserts.

    An explicit ``eos``/``bos`` wins (it must be the kind the destination's reader splits at); otherwise the source's
    own convention when its documents already follow the destination's (all end, or all start, with one id), or
    follow the opposite one, whose id then moves to the other edge (Megatron's EOD after each document becomes
    llm.c's delimiter before it, and back; an explicit id the documents carry at the other edge moves too). A
    source of at most one document needs none. Anything else is refused, saying which option keeps the boundaries.
    """
    documents = len(offsets) - 1
    given = {"eos": eos, "bos": bos}
    if destination_kind == "index":
        chosen = [Delimiter(k, int(v)) for k, v in given.items() if v is not None]
        return chosen[0] if chosen else None
    wrong = "bos" if destination_kind == "eos" else "eos"
    if given[wrong] is not None:
        raise ConfigError(
            f"{format} readers find documents by an id {'after' if destination_kind == 'eos' else 'before'} each "
            f"one: pass {option(destination_kind, 'ID')}, not {option(wrong, 'ID')}."
        )
    explicit = given[destination_kind]
    if explicit is not None:
        moves = documents > 0 and _moves(tokens, offsets, destination_kind, int(explicit))
        return Delimiter(destination_kind, int(explicit), moves)
    if documents <= 1:
        return None
    # The source's own convention, or the opposite one (an end-of-document id becomes a start-of-document one,
    # or back): the first whose id occurs once per document, so that it splits them back.
    for kind, moves in ((destination_kind, False), (wrong, True)):
        found = _consistent(tokens, offsets, kind)
        if found is not None and _once_per_document(tokens, offsets, found):
            return Delimiter(destination_kind, found, moves)
    where = "at the end of" if destination_kind == "eos" else "at the start of"
    raise ConfigError(
        f"{source} has {documents:,} documents, and a {format} file marks them only by an id {where} each one, which "
        f"these documents do not share; converting as they are would merge them. Pass {option(destination_kind, 'ID')} "
        "to insert an id that occurs in no document (e.g. the tokenizer's end-of-text id), convert to a format "
        f"that stores boundaries ({alternatives}), or pass {option('keep_boundaries', 'False')} to copy the bare "
        "stream."
    )


def delimit(
    flat: np.ndarray, lengths: np.ndarray, delimiter: Delimiter, first_document: int, *, check: bool
) -> tuple[np.ndarray, np.ndarray, int]:
    """Add the delimiter to the documents that lack it (first moving it from the other edge when
    ``delimiter.moves``); returns the new ids, lengths and how many tokens were added (net of those moved).

    With ``check``, also proves the documents will split back unchanged: the delimiter occurs exactly once per
    document (so never inside one); else :class:`FormatError` names the first document that would split.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    given = len(flat)
    if delimiter.moves:
        flat, lengths = _strip_edge(flat, lengths, delimiter.id, at_end=delimiter.kind == "bos")
    starts = offsets_from_lengths(lengths)[:-1]
    nonempty = lengths > 0
    edge_places = (starts + lengths - 1) if delimiter.kind == "eos" else starts
    has = np.zeros(len(lengths), dtype=bool)
    has[nonempty] = flat[edge_places[nonempty]] == delimiter.id
    new_flat, new_lengths = add_delimiter(flat, lengths, delimiter.id, before=delimiter.kind == "bos", only=~has)
    if check:
        hits = new_flat == delimiter.id
        if int(np.count_nonzero(hits)) != len(new_lengths):
            per_document = np.add.reduceat(hits, offsets_from_lengths(new_lengths)[:-1])
            per_document[new_lengths == 0] = 0
            bad = int(np.flatnonzero(per_document != 1)[0])
            raise FormatError(
                f"document {first_document + bad} contains the delimiter {delimiter.id} inside it; read back, it "
                f"would split into several documents. Pass {option(delimiter.kind, 'ID')} with an id that occurs in "
                "no document, or convert to a format that stores boundaries."
            )
    return new_flat, new_lengths, len(new_flat) - given


def _strip_edge(flat: np.ndarray, lengths: np.ndarray, value: int, *, at_end: bool) -> tuple[np.ndarray, np.ndarray]:
    """Remove ``value`` from the end (or start) of each document that has it there, in one vectorised pass."""
    starts = offsets_from_lengths(lengths)[:-1]
    nonempty = lengths > 0
    places = (starts + lengths - 1) if at_end else starts
    has = np.zeros(len(lengths), dtype=bool)
    has[nonempty] = flat[places[nonempty]] == value
    return np.delete(flat, places[has]), lengths - has


def delimited_mask(flat: np.ndarray, lengths: np.ndarray, mask: np.ndarray, delimiter: Delimiter) -> np.ndarray:
    """``mask`` (parallel to ``flat``) changed as :func:`delimit` changes the ids: a moved delimiter's mask value
    leaves with it, and the delimiter put at the documents' edge is trained on (1), so the mask stays parallel."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if delimiter.moves:
        starts = offsets_from_lengths(lengths)[:-1]
        nonempty = lengths > 0
        places = (starts + lengths - 1) if delimiter.kind == "bos" else starts
        stripped = np.zeros(len(lengths), dtype=bool)
        stripped[nonempty] = flat[places[nonempty]] == delimiter.id
        flat, mask = np.delete(flat, places[stripped]), np.delete(mask, places[stripped])
        lengths = lengths - stripped
    starts = offsets_from_lengths(lengths)[:-1]
    nonempty = lengths > 0
    edge_places = (starts + lengths - 1) if delimiter.kind == "eos" else starts
    has = np.zeros(len(lengths), dtype=bool)
    has[nonempty] = flat[edge_places[nonempty]] == delimiter.id
    new_mask, _ = add_delimiter(mask, lengths, 1, before=delimiter.kind == "bos", only=~has)
    return new_mask
