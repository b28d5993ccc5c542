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
from .arrays import TokenArray
from .documents import add_delimiter, offsets_from_lengths

__all__ = ["Delimiter", "choose_delimiter", "delimit", "delimited_mask"]


@dataclass(frozen=True)
class Delimiter:
    """The id that marks documents, and where: ``"eos"`` ends each document, ``"bos"`` starts it."""

    kind: str
    id: int

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
    own convention when its documents already follow the destination's (all end, or all start, with one id). A
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
    if given[destination_kind] is not None:
        return Delimiter(destination_kind, int(given[destination_kind]))  # type: ignore[arg-type]
    if documents <= 1:
        return None
    found = _consistent(tokens, offsets, destination_kind)
    if found is not None:
        return Delimiter(destination_kind, found)
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
    """Add the delimiter to the documents that lack it; returns the new ids, lengths and how many were added.

    With ``check``, also proves the documents will split back unchanged: the delimiter occurs exactly once per
    document (so never inside one); else :class:`FormatError` names the first document that would split.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
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
                f"would split into several documents. Choose a {delimiter.kind} id that occurs in no document, or "
                "convert to a format that stores boundaries."
            )
    return new_flat, new_lengths, int(np.count_nonzero(~has))


def delimited_mask(flat: np.ndarray, lengths: np.ndarray, mask: np.ndarray, delimiter: Delimiter) -> np.ndarray:
    """``mask`` (parallel to ``flat``) with a 1 (trained on) where :func:`delimit` inserts the delimiter, so that the
    mask stays parallel to the delimited ids."""
    lengths = np.asarray(lengths, dtype=np.int64)
    starts = offsets_from_lengths(lengths)[:-1]
    nonempty = lengths > 0
    edge_places = (starts + lengths - 1) if delimiter.kind == "eos" else starts
    has = np.zeros(len(lengths), dtype=bool)
    has[nonempty] = flat[edge_places[nonempty]] == delimiter.id
    new_mask, _ = add_delimiter(mask, lengths, 1, before=delimiter.kind == "bos", only=~has)
    return new_mask
