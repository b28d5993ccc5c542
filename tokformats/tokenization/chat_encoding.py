"""Conversations to token ids and loss masks, segment by segment (see :mod:`tokformats.tokenization.templates`).

A batch of conversations is rendered into segments; every message text of the batch is encoded in one engine call
with special tokens spelled out as text (so a user writing ``<|im_end|>`` gets the ids of that text), and every
template text is encoded once with special tokens recognised and cached (templates repeat the same few texts).
Message ids come back in output order, so they fill their token slots with one masked assignment, the few
template ids are gathered into the rest, and the mask is one ``np.repeat``: no Python work per token or segment.

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

from .chat import Message, Turns
from .templates import ChatTemplate, Segment, ends_trained

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
        return self.encode_turns(Turns.of(conversations), encode_content, dtype)

    def encode_turns(
        self, turns: Turns, encode_content: Callable[[list[str]], tuple[np.ndarray, np.ndarray]], dtype: np.dtype
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`encode` of a batch read flat (:func:`~tokformats.tokenization.chat.turns_of`)."""
        layout = self.template.layout_turns(turns, self.train_on, self.thought)
        texts, sources = layout.texts, layout.sources
        content_flat, content_lengths = encode_content(texts) if texts else (np.zeros(0, np.uint32), np.zeros(0))
        pieces = [self.template_ids(text) for text in layout.templates]
        template_lengths = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
        is_content = sources >= 0
        if not np.array_equal(sources[is_content], np.arange(len(texts))):
            raise ValueError(f"{self.template.name}: its layout must use each message text once, in order")
        # Message ids are already in output order: they fill the token slots of message segments with one masked
        # assignment; the few template ids are gathered into the others. No Python work per token or per segment.
        template_of = -1 - sources[~is_content]
        sizes = np.empty(len(sources), dtype=np.int64)
        sizes[is_content] = content_lengths
        sizes[~is_content] = template_sizes = template_lengths[template_of]
        content_tokens = np.repeat(is_content, sizes)
        flat = np.empty(len(content_tokens), dtype=dtype)
        flat[content_tokens] = content_flat
        template_ends = np.cumsum(template_sizes)
        piece_starts = np.cumsum(template_lengths) - template_lengths
        gather = np.arange(int(template_ends[-1]) if len(template_ends) else 0, dtype=np.int64)
        gather += np.repeat(piece_starts[template_of] - template_ends + template_sizes, template_sizes)
        pool = np.concatenate(pieces) if pieces else np.zeros(0, np.uint32)
        flat[~content_tokens] = pool[gather]
        mask = np.repeat(layout.trained.astype(np.uint8), sizes)
        cumulative = np.concatenate([[0], np.cumsum(sizes)])
        lengths = (cumulative[layout.bounds[1:]] - cumulative[layout.bounds[:-1]]).astype(np.int64)
        end_trained = layout.ends_trained
        if end_trained is None:  # a template's own layout_turns that does not say
            end_trained = ends_trained(turns, self.train_on)
        return flat, lengths, mask, end_trained


class ChatSpec:
    """What a chat run needs in every process: the schema (a name or a callable, pickled by reference), the
    template and the masking options; :meth:`encoder` makes the :class:`ChatEncoder` for a tokenizer."""

    def __init__(self, schema: Any, template: ChatTemplate, train_on: str, thought: str) -> None:
        self.schema, self.template, self.train_on, self.thought = schema, template, train_on, thought

    def encoder(self, tokenizer: Any) -> ChatEncoder:
        """The encoder of this run's conversations with ``tokenizer``."""
        return ChatEncoder(tokenizer, self.template, self.train_on, self.thought)
