"""What a token id means, for any tokenizer the formats store or name: loading a ``tokenizers`` tokenizer, each
token's raw bytes (byte-level BPE and SentencePiece-style vocabularies), the end-of-text id, the specials tokformats
reserves, and decoding ids to text with range checks. Format-neutral: llm.c's vocabulary format, the ``.pt`` folders
and the tokenization pipeline all build on it."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import FormatError, NoFilesError, TokenRangeError
from .byte_level import bytes_to_unicode, unicode_to_bytes

if TYPE_CHECKING:
    from tokenizers import Tokenizer

__all__ = [
    "END_OF_TEXT",
    "SPECIAL_TOKENS",
    "load_tokenizer",
    "end_of_text_id",
    "token_bytes",
    "bytes_to_unicode",
    "padded_vocab_size",
    "assigned_ids",
    "check_decodable",
    "tokenizer_decoder",
    "vocabulary_size",
]

END_OF_TEXT = "<|endoftext|>"
#: Special tokens reserved at ids 0-8 by default (the llm.c tutorial's and NeuroShard Genesis's order).
SPECIAL_TOKENS: tuple[str, ...] = (
    END_OF_TEXT,
    "<|padding|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|thought|>",
    "<|/thought|>",
)


def padded_vocab_size(vocab_size: int, multiple: int = 64) -> int:
    """The embedding size training code pads to: the next multiple of 64 (20,009 -> 20,032)."""
    return (vocab_size + multiple - 1) // multiple * multiple


def load_tokenizer(tokenizer: Any) -> Tokenizer:
    """A ``tokenizers.Tokenizer`` from itself, a ``tokenizer.json`` path, a folder holding one, a vocabulary name
    (``"cl100k_base"``, ``"o200k_base"``, ``"llama3"``, ``"deepseek_v3"``) or a ``.tiktoken`` rank file (see
    :mod:`tokformats.core.vocabularies`). An existing file or folder wins over a name."""
    from tokenizers import Tokenizer

    from .vocabularies import is_vocabulary_name, load_vocabulary

    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    path = Path(os.fspath(tokenizer))
    if is_vocabulary_name(tokenizer) and not path.is_dir() and not (path.is_file() and path.suffix == ".json"):
        return load_vocabulary(tokenizer)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise NoFilesError(f"{path} does not exist; {_what_a_tokenizer_is(tokenizer)}")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception for bad JSON
        raise FormatError(f"{path} is not a tokenizers tokenizer.json ({exc}).") from None


def _what_a_tokenizer_is(given: Any) -> str:
    """The hint of a tokenizer that is not there: the vocabulary it misspells in another case, or what may be given
    (the names of the vocabularies available offline among them)."""
    from .vocabularies import ALIASES, VOCABULARIES

    lower = str(given).lower()
    if lower in VOCABULARIES or lower in ALIASES:
        return f"the vocabulary's name is {lower} (names are lower case)."
    return (
        f"give a tokenizer.json, a folder holding one, a .tiktoken rank file or the name of a vocabulary available "
        f"offline ({', '.join(VOCABULARIES)}); from Python, a tokenizers.Tokenizer too."
    )


def vocabulary_size(tokenizer: Tokenizer) -> int:
    """The number of ids the tokenizer can produce or decode: its largest id plus one (a vocabulary with unassigned
    ids, such as cl100k_base's 100256, counts them, as tiktoken's ``n_vocab`` does)."""
    ids = tokenizer.get_vocab(with_added_tokens=True).values()
    return max(ids, default=-1) + 1


def end_of_text_id(tokenizer: Tokenizer, eot_token: int | str | None = None) -> int:
    """The end-of-text id: ``eot_token`` (an id or a token string), else the tokenizer's ``<|endoftext|>``."""
    if isinstance(eot_token, int):
        return eot_token
    name = eot_token or END_OF_TEXT
    found = tokenizer.token_to_id(name)
    if found is None:
        raise FormatError(f"the tokenizer has no {name!r} token; pass the end-of-text id explicitly (eot_token=ID).")
    return int(found)


def _component_types(node: Any) -> set[str]:
    """Every ``type`` named in a tokenizer.json component, looking inside Sequences."""
    if not isinstance(node, dict):
        return set()
    found = {node["type"]} if "type" in node else set()
    for key in ("pretokenizers", "decoders", "normalizers", "processors"):
        for child in node.get(key) or []:
            found |= _component_types(child)
    return found


def _byte_fallback(piece: str) -> int | None:
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        try:
            return int(piece[3:5], 16)
        except ValueError:
            return None
    return None


def token_bytes(tokenizer: Tokenizer, unassigned: Callable[[int], bytes] | None = None) -> list[bytes]:
    """Each token's raw bytes (what decoding that id alone yields), in id order, up to the largest id.

    Byte-level BPE tokens are mapped back through GPT-2's byte/unicode table; SentencePiece-style
    pieces turn ``▁`` into a space and ``<0xNN>`` into byte NN; added and special tokens are their
    UTF-8 text. Other tokenizer models are refused. An id no token has (cl100k_base's 100256) is
    refused, or given ``unassigned(id)`` when that is passed.
    """
    config = json.loads(tokenizer.to_str())
    model = config.get("model") or {}
    components = _component_types(config.get("pre_tokenizer")) | _component_types(config.get("decoder"))
    added = {int(i): token.content for i, token in tokenizer.get_added_tokens_decoder().items()}
    if "ByteLevel" in components:
        style = "byte-level"
    elif "Metaspace" in components or model.get("byte_fallback") or "ByteFallback" in components:
        style = "sentencepiece"
    else:
        raise FormatError(
            f"cannot export a {model.get('type', 'unknown')} tokenizer without a ByteLevel or SentencePiece-style "
            "(Metaspace / byte fallback) decoder: its tokens have no defined raw bytes."
        )
    size = vocabulary_size(tokenizer)
    table = unicode_to_bytes()
    result: list[bytes] = []
    for token_id in range(size):
        if token_id in added:
            result.append(added[token_id].encode("utf-8"))
            continue
        piece = tokenizer.id_to_token(token_id)
        if piece is None and unassigned is not None:
            result.append(unassigned(token_id))
            continue
        if piece is None:
            raise FormatError(f"the tokenizer has no token with id {token_id} (its ids must run from 0 to {size - 1}).")
        if style == "byte-level":
            try:
                result.append(bytes(table[c] for c in piece))
            except KeyError as exc:
                raise FormatError(
                    f"token {token_id} ({piece!r}) has the character {exc.args[0]!r}, outside the byte-level alphabet."
                ) from None
        else:
            fallback = _byte_fallback(piece)
            result.append(bytes([fallback]) if fallback is not None else piece.replace("\u2581", " ").encode("utf-8"))
    return result


def assigned_ids(tokenizer: Tokenizer) -> np.ndarray:
    """One flag per id from 0 to the largest (:func:`vocabulary_size` of them): whether the tokenizer has a token,
    ordinary or added, with that id. The others are holes, such as cl100k_base's 100256 and 100261-100275."""
    ids = np.fromiter(tokenizer.get_vocab(with_added_tokens=True).values(), dtype=np.int64)
    flags = np.zeros(int(ids.max(initial=-1)) + 1, dtype=bool)
    flags[ids] = True
    return flags


def _id_runs(ids: np.ndarray, limit: int = 4) -> str:
    """Sorted ids as runs, the first ``limit`` of them: ``100256, 100261-100275``."""
    breaks = np.flatnonzero(np.diff(ids) != 1) + 1
    runs = [(int(run[0]), int(run[-1])) for run in np.split(ids, breaks)]
    shown = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs[:limit])
    return shown + (f" and {len(runs) - limit:,} more runs" if len(runs) > limit else "")


def _where(position: int, count: int) -> str:
    return f" (at position {position:,} of the {count:,} ids decoded)" if count > 1 else ""


def check_decodable(ids: np.ndarray, assigned: np.ndarray) -> None:
    """Raise :class:`~tokformats.TokenRangeError` naming the first id (and its position) that no token has: outside
    the vocabulary, or inside its range but unassigned (``tokenizers`` would decode such an id to nothing)."""
    ids = ids.ravel()
    if ids.dtype.kind not in "iu":
        raise TokenRangeError(f"token ids must be integers, found {ids.dtype}.")
    size = len(assigned)
    outside = (ids < 0) | (ids >= size)
    if outside.any():
        position = int(np.argmax(outside))
        raise TokenRangeError(
            f"token id {int(ids[position])} is not in the tokenizer's vocabulary of {size:,} tokens"
            f"{_where(position, len(ids))}."
        )
    holes = ~assigned[ids]
    if holes.any():
        position = int(np.argmax(holes))
        unassigned = np.flatnonzero(~assigned)
        raise TokenRangeError(
            f"token id {int(ids[position])} has no token in the tokenizer{_where(position, len(ids))}: its vocabulary "
            f"of {size:,} ids leaves {len(unassigned):,} unassigned ({_id_runs(unassigned)}); ids like it were not "
            "made with this tokenizer."
        )


def tokenizer_decoder(tokenizer: Tokenizer) -> Callable[[Any], str]:
    """A function turning ids into text with ``tokenizer`` (specials kept); an id outside its vocabulary, or inside
    its range but assigned to no token (cl100k_base's 100256), raises :class:`~tokformats.TokenRangeError` naming
    the id and its position in the ids decoded, instead of vanishing from the text."""
    assigned = assigned_ids(tokenizer)

    def decode(ids: Any) -> str:
        array = np.asarray(ids)
        if array.size:
            check_decodable(array, assigned)
        return str(tokenizer.decode(array.tolist(), skip_special_tokens=False))

    return decode
