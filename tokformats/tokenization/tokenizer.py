"""HF ``tokenizers`` glue: load a tokenizer, train a byte-level BPE, and recover each token's raw bytes.

``tokenizers`` is imported lazily, inside the functions that need it, so that reading token files
never pays for it.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import lru_cache
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import FormatError, NoFilesError

if TYPE_CHECKING:
    from tokenizers import Tokenizer

__all__ = [
    "SPECIAL_TOKENS",
    "END_OF_TEXT",
    "load_tokenizer",
    "vocabulary_size",
    "train_tokenizer",
    "token_bytes",
    "end_of_text_id",
    "padded_vocab_size",
    "bytes_to_unicode",
    "read_documents",
    "text_decoder",
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


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table used by byte-level BPE."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    characters = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            characters.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, characters)))


@lru_cache(maxsize=1)
def _unicode_to_bytes() -> dict[str, int]:
    return {character: byte for byte, character in bytes_to_unicode().items()}


def load_tokenizer(tokenizer: Any) -> Tokenizer:
    """A ``tokenizers.Tokenizer`` from itself, a ``tokenizer.json`` path, a folder holding one, a vocabulary name
    (``"cl100k_base"``, ``"o200k_base"``, ``"llama3"``) or a ``.tiktoken`` rank file (see
    :mod:`tokformats.tokenization.vocabularies`). An existing file or folder wins over a name."""
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
        raise NoFilesError(f"{path} does not exist; pass a tokenizers.Tokenizer, a tokenizer.json or its folder.")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception for bad JSON
        raise FormatError(f"{path} is not a tokenizers tokenizer.json ({exc}).") from None


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


def token_bytes(tokenizer: Tokenizer) -> list[bytes]:
    """Each token's raw bytes (what decoding that id alone yields), in id order.

    Byte-level BPE tokens are mapped back through GPT-2's byte/unicode table; SentencePiece-style
    pieces turn ``▁`` into a space and ``<0xNN>`` into byte NN; added and special tokens are their
    UTF-8 text. Other tokenizer models are refused.
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
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    table = _unicode_to_bytes()
    result: list[bytes] = []
    for token_id in range(size):
        if token_id in added:
            result.append(added[token_id].encode("utf-8"))
            continue
        piece = tokenizer.id_to_token(token_id)
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


def _names_a_file(item: Any) -> bool:
    """Whether an input is a file path (a ``Path``, or a string naming an existing file) rather than text."""
    if isinstance(item, os.PathLike):
        return True
    if not isinstance(item, str) or "\n" in item or len(item) > 4096:
        return False
    try:
        return Path(item).exists()
    except OSError:
        return False


def read_documents(paths: Iterable[Any], unit: str = "line", text_key: str = "text") -> Iterator[str]:
    """The non-empty documents of every input ``tokenize`` reads (``.txt`` per ``unit``, ``.json``/``.jsonl``/
    Parquet by ``text_key``, ``.gz``/``.zst``, globs, folders); a bad record raises, naming file and line."""
    from .sources import SourceError, iter_records, resolve_inputs

    for record in iter_records(resolve_inputs([Path(os.fspath(p)) for p in paths]), (text_key,), unit):
        if record.error is not None:
            raise SourceError(record.error)
        if record.texts and record.texts[0]:
            yield record.texts[0]


def train_tokenizer(
    inputs: Iterable[Any],
    vocab_size: int,
    *,
    min_frequency: int = 2,
    special_tokens: Sequence[str] = SPECIAL_TOKENS,
    unit: str = "line",
    sample_docs: int | None = None,
    progress: bool | None = None,
) -> Tokenizer:
    """Train a byte-level BPE tokenizer with ``tokenizers``: no unknown tokens, specials at ids 0..k-1.

    Args:
        inputs: files, globs or folders of any kind ``tokenize`` reads (``Path`` objects, or strings when every one
            names an existing file), documents per ``unit``; or an iterable of document strings.
        vocab_size: target size including the 256 byte tokens and the special tokens.
        min_frequency: pairs seen fewer times are not merged.
        special_tokens: reserved first, in this order (default: the 9 of :data:`SPECIAL_TOKENS`).
        unit: ``"line"``, ``"file"`` or ``"paragraph"``: what one document is in a ``.txt`` file.
        sample_docs: learn merges from the first N documents only (NeuroShard Genesis's mode).
        progress: show ``tokenizers``' progress bar (default: when stderr is a terminal).

    The result is deterministic for the same input and settings.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    items: Iterable[Any] = inputs if isinstance(inputs, Iterator) else list(inputs)
    is_paths = isinstance(items, list) and bool(items) and all(_names_a_file(i) for i in items)
    documents: Iterable[str] = read_documents(items, unit) if is_paths else iter(items)
    if sample_docs is not None:
        documents = islice(documents, sample_docs)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=sys.stderr.isatty() if progress is None else progress,
    )
    tokenizer.train_from_iterator(documents, trainer=trainer)
    return tokenizer


def text_decoder(*, tokenizer: Any = None, vocab: Any = None) -> Callable[[Any], str]:
    """A function turning a document's ids into text, with an llm.c vocabulary or a ``tokenizers`` tokenizer.

    Ids outside the vocabulary raise :class:`~tokformats.TokenRangeError` naming the id.
    """
    import numpy as np

    from ..errors import TokenRangeError

    if (tokenizer is None) == (vocab is None):
        raise ValueError("pass exactly one of tokenizer= (tokenizer.json) or vocab= (an llm.c vocabulary)")
    if vocab is not None:
        from ..formats.llmc_vocab import Vocab

        loaded_vocab = vocab if isinstance(vocab, Vocab) else Vocab(vocab)
        return loaded_vocab.decode
    loaded = load_tokenizer(tokenizer)
    size = vocabulary_size(loaded)

    def decode(ids: Any) -> str:
        array = np.asarray(ids)
        if array.size:
            bad = (array < 0) | (array >= size)
            if bad.any():
                value = int(array.ravel()[np.argmax(bad.ravel())])
                raise TokenRangeError(f"token id {value} is not in the tokenizer's vocabulary of {size:,} tokens.")
        return str(loaded.decode(array.tolist(), skip_special_tokens=False))

    return decode
