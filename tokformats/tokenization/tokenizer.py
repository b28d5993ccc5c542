"""Tokenizers for the pipeline: train a byte-level BPE with tokformats' reserved specials, read the documents a
training run learns from, and decode ids with a tokenizer or an llm.c vocabulary. (What a token id means, format-
neutrally, is :mod:`tokformats.core.vocab`.)

``tokenizers`` is imported lazily, inside the functions that need it, so that reading token files never pays for it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.vocab import SPECIAL_TOKENS, load_tokenizer, tokenizer_decoder
from ..errors import ConfigError

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from .sources import Record

__all__ = ["load_tokenizer", "train_tokenizer", "read_documents", "text_decoder"]


def read_documents(paths: Any, unit: str = "line", text_key: str = "text") -> Iterator[str]:
    """The non-empty documents of every input ``tokenize`` reads (``.txt`` per ``unit``, ``.json``/``.jsonl``/
    Parquet by ``text_key``, ``.gz``/``.zst``, globs, folders): ``paths`` is one path or several, every one a path
    (a ``str`` too). A missing path raises at once; a bad record when it is read, naming file and line."""
    from .sources import iter_records, resolve_inputs

    named = [paths] if isinstance(paths, (str, os.PathLike)) else paths
    return _documents(iter_records(resolve_inputs([Path(os.fspath(p)) for p in named]), (text_key,), unit))


def _documents(records: Iterator[Record]) -> Iterator[str]:
    """The non-empty texts of ``records`` (one key each); a bad record raises its error."""
    from .sources import SourceError

    for record in records:
        if record.error is not None:
            raise SourceError(record.error)
        if record.texts and record.texts[0]:
            yield record.texts[0]


def train_tokenizer(
    inputs: Iterable[Any] | os.PathLike[str],
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
        inputs: what ``tokenize`` reads, by its rule: one path, glob or folder (a ``str`` too), a list of them
            (``Path`` objects, or strings when every one names an existing file or matching glob; a missing one
            is refused, naming it), documents per ``unit``; or an iterable of document strings.
        vocab_size: target size including the 256 byte tokens and the special tokens.
        min_frequency: pairs seen fewer times are not merged.
        special_tokens: reserved first, in this order (default: the 9 of :data:`SPECIAL_TOKENS`: ``<|endoftext|>``
            0, ``<|padding|>`` 1, and the chat tokens the built-in ``chatml`` template of ``tokenize(chat=...)``
            renders with: ``<|im_start|>`` 2, ``<|im_end|>`` 3, ``<|system|>`` 4, ``<|user|>`` 5,
            ``<|assistant|>`` 6, ``<|thought|>`` 7, ``<|/thought|>`` 8).
        unit: ``"line"``, ``"file"`` or ``"paragraph"``: what one document is in a ``.txt`` file.
        sample_docs: learn merges from the first N documents only (NeuroShard Genesis's mode).
        progress: show ``tokenizers``' progress bar (default: when stderr is a terminal).

    The result is deterministic for the same input and settings.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from .sources import iter_records, resolve_inputs

    # tokenize's rule for what is a path and what is text: a missing path raises here, before any training
    documents: Iterator[str] = _documents(iter_records(resolve_inputs(inputs), ("text",), unit))
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

    Ids outside the vocabulary, and ids inside its range that a tokenizer assigns no token (cl100k's 100256), raise
    :class:`~tokformats.TokenRangeError` naming the id; an llm.c vocabulary shows its own placeholder for those.
    """
    if (tokenizer is None) == (vocab is None):
        raise ConfigError("pass exactly one of tokenizer= (a tokenizer.json, or a vocabulary's name) or vocab= (an "
                          "llm.c vocabulary).")  # fmt: skip
    if vocab is not None:
        from ..formats.llmc_vocab import Vocab

        loaded_vocab = vocab if isinstance(vocab, Vocab) else Vocab(vocab)
        return loaded_vocab.decode
    return tokenizer_decoder(load_tokenizer(tokenizer))
