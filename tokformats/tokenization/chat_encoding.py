"""Conversations to token ids and loss masks, segment by segment (see :mod:`tokformats.tokenization.templates`).

A batch of conversations is rendered into segments; every message text of the batch is encoded in one engine call
with special tokens spelled out as text (so a user writing ``<|im_end|>`` gets the ids of that text), and every
template text is encoded once with special tokens recognised and cached (templates repeat the same few texts).
The pieces are joined with one ``np.concatenate`` per batch and the mask with one ``np.repeat``: no Python work
per token.

Where the ids may differ from the tokenizer's encoding of the whole rendered string: only where that encoding
would cross a segment boundary, i.e. where its pre-tokenizer or a merge joins the end of one segment to the start
of the next (a message text starting with whitespace after a template ``\\n``, or text on both sides of a boundary
merging), and where message text spells a special token (the whole-string encoding makes it the special id,
which is exactly what must not happen). At the built-in template's boundaries (special tokens, and ``\\n`` before
text that starts with a letter, digit or punctuation) the ids are equal.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .chat import Message
from .templates import ChatTemplate, Segment, trained_messages

__all__ = ["ChatEncoder", "render"]


def render(segments: Sequence[Segment]) -> str:
    """The rendered conversation: the segments' texts joined."""
    return "".join(segment.text for segment in segments)


class ChatEncoder:
    """Encodes conversations with ``template`` into ``(ids, lengths, loss mask, end trained)``.

    Args:
        tokenizer: a ``tokenizers.Tokenizer`` (template texts are encoded with it, special tokens recognised).
        template: the chat template.
        train_on: ``assistant``, ``all`` or ``last``.
        thought: ``train`` or ``mask`` (assistants' thoughts).
    """

    def __init__(self, tokenizer: Any, template: ChatTemplate, train_on: str, thought: str) -> None:
        self.tokenizer = tokenizer
        self.template = template
        self.train_on = train_on
        self.thought = thought
        self._template_ids: dict[str, np.ndarray] = {}

    def template_ids(self, text: str) -> np.ndarray:
        """The ids of template text ``text`` (special tokens recognised), cached."""
        ids = self._template_ids.get(text)
        if ids is None:
            encoded = self.tokenizer.encode(text, add_special_tokens=False).ids
            ids = np.asarray(encoded, dtype=np.uint32)
            if len(self._template_ids) < 65536:  # a template rendering dates or ids could grow it without bound
                self._template_ids[text] = ids
        return ids

    def segments(self, messages: Sequence[Message]) -> list[Segment]:
        """One conversation's segments."""
        return self.template.segments(messages, self.train_on, self.thought)

    def encode(
        self,
        conversations: Sequence[Sequence[Message]],
        encode_content: Callable[[list[str]], tuple[np.ndarray, np.ndarray]],
        dtype: np.dtype,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(ids in dtype, lengths, mask uint8, end_trained bool)``: the conversations back to back, their token
        counts, each token's loss mask, and whether an end-of-document id after each would be trained on (its last
        message is). ``encode_content(texts)`` encodes message texts (``(flat ids, lengths)``, specials as text)."""
        texts, templates, sources, trained, bounds = self.template.layout(conversations, self.train_on, self.thought)
        nothing = (np.zeros(0, np.uint32), np.zeros(0, np.int64))
        content_flat, content_lengths = encode_content(texts) if texts else nothing
        pieces = [self.template_ids(text) for text in templates]
        template_lengths = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
        # One pool (message ids, then template ids) and one gather: no Python work per token or per piece of ids.
        pool = np.concatenate([content_flat.astype(np.uint32, copy=False), *pieces])
        lengths_of = np.concatenate([content_lengths, template_lengths])
        starts_of = np.concatenate([[0], np.cumsum(lengths_of)[:-1]]).astype(np.int64)
        chosen = sources.copy()
        chosen[chosen < 0] = len(texts) - 1 - chosen[chosen < 0]  # -1 - t -> len(texts) + t
        sizes, starts = lengths_of[chosen], starts_of[chosen]
        ends = np.cumsum(sizes)
        gather = np.arange(int(ends[-1]) if len(ends) else 0, dtype=np.int64) + np.repeat(starts - ends + sizes, sizes)
        flat = pool[gather].astype(dtype, copy=False)
        mask = np.repeat(trained.astype(np.uint8), sizes)
        cumulative = np.concatenate([[0], ends])
        positions = bounds
        lengths = (cumulative[positions[1:]] - cumulative[positions[:-1]]).astype(np.int64)
        end_trained = np.array([bool(m) and trained_messages(m, self.train_on)[-1] for m in conversations], dtype=bool)
        return flat, lengths, mask, end_trained


class ChatSpec:
    """What a chat run needs in every process: the schema (a name or a callable, pickled by reference), the
    template and the masking options; :meth:`encoder` makes the :class:`ChatEncoder` for a tokenizer."""

    def __init__(self, schema: Any, template: ChatTemplate, train_on: str, thought: str) -> None:
        self.schema, self.template, self.train_on, self.thought = schema, template, train_on, thought

    def encoder(self, tokenizer: Any) -> ChatEncoder:
        """The encoder of this run's conversations with ``tokenizer``."""
        return ChatEncoder(tokenizer, self.template, self.train_on, self.thought)
