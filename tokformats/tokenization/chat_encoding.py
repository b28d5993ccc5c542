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
from typing import Any, NamedTuple

import numpy as np

from ..core.documents import offsets_from_lengths
from .chat import Message, Turns
from .templates import ChatTemplate, Layout, Segment, ends_trained

__all__ = ["ChatEncoder", "EndOfDocument", "render"]


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
        self,
        turns: Turns,
        encode_content: Callable[[list[str]], tuple[np.ndarray, np.ndarray]],
        dtype: np.dtype,
        eos: EndOfDocument | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`encode` of a batch read flat (:func:`~tokformats.tokenization.chat.turns_of`); with ``eos``, each
        conversation's end-of-document id is placed in the same pass (see :class:`EndOfDocument`)."""
        return self.encode_layout(turns, self.layout(turns), encode_content, dtype, eos)

    def layout(self, turns: Turns) -> Layout:
        """The template's :class:`~tokformats.tokenization.templates.Layout` of a batch read flat: the Python half
        of :meth:`encode_turns`, which a run does in its reader thread while the engine encodes the batch before."""
        return self.template.layout_turns(turns, self.train_on, self.thought)

    def encode_layout(
        self,
        turns: Turns,
        layout: Layout,
        encode_content: Callable[[list[str]], tuple[np.ndarray, np.ndarray]],
        dtype: np.dtype,
        eos: EndOfDocument | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`encode_turns` of ``turns`` already laid out (:meth:`layout`)."""
        texts, sources = layout.texts, layout.sources
        content_flat, content_lengths = encode_content(texts) if texts else (np.zeros(0, dtype), np.zeros(0, np.int64))
        is_content = sources >= 0
        if not np.array_equal(sources[is_content], np.arange(len(texts))):
            raise ValueError(f"{self.template.name}: its layout must use each message text once, in order")
        end_trained = layout.ends_trained
        if end_trained is None:  # a template's own layout_turns that does not say
            end_trained = ends_trained(turns, self.train_on)
        pieces = [self.template_ids(text) for text in layout.templates]
        if eos is not None:  # the end id: one more template text
            pieces.append(np.array([eos.id], dtype=np.uint32))
        template_lengths = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
        sizes = np.empty(len(sources), dtype=np.int64)
        sizes[is_content] = content_lengths
        sizes[~is_content] = template_lengths[-1 - sources[~is_content]]
        cumulative = offsets_from_lengths(sizes)
        lengths = cumulative[layout.bounds[1:]] - cumulative[layout.bounds[:-1]]
        trained = layout.trained
        if eos is not None:  # the end id as one more segment of each conversation that gets one
            gets = np.ones(len(lengths), dtype=bool) if eos.empty else lengths > 0
            at = layout.bounds[:-1][gets] if eos.before else layout.bounds[1:][gets]
            sources = np.insert(sources, at, -len(pieces))
            sizes = np.insert(sizes, at, 1)
            trained = np.insert(trained, at, False if eos.before else end_trained[gets])
            lengths = lengths + gets
            cumulative = offsets_from_lengths(sizes)
        flat = _assemble(sources, sizes, cumulative, content_flat, pieces, template_lengths, dtype)
        return flat, lengths, np.repeat(trained.astype(np.uint8), sizes), end_trained


def _assemble(
    sources: np.ndarray,
    sizes: np.ndarray,
    cumulative: np.ndarray,
    content_flat: np.ndarray,
    pieces: list[np.ndarray],
    template_lengths: np.ndarray,
    dtype: np.dtype,
) -> np.ndarray:
    """The ids of segments ``sources`` (message text k >= 0, template text ``-1 - t``) of ``sizes`` tokens, which
    start at ``cumulative``: the message ids (already in output order) fill every slot not a template's with one
    masked assignment; the template ids (a few tokens per message) are gathered into theirs."""
    template = np.flatnonzero(sources < 0)
    template_sizes = sizes[template]
    template_ends = np.cumsum(template_sizes)
    # Each template token's slot in the output, and its place in the template texts' ids laid end to end.
    slots = np.arange(int(template_ends[-1]) if len(template) else 0, dtype=np.int64)
    slots += np.repeat(cumulative[template] - template_ends + template_sizes, template_sizes)
    piece_starts = offsets_from_lengths(template_lengths)[-1 - sources[template]]
    taken = slots + np.repeat(piece_starts - cumulative[template], template_sizes)
    pool = np.concatenate([np.zeros(0, np.uint32), *pieces])
    flat = np.empty(int(cumulative[-1]), dtype=dtype)
    content = np.ones(len(flat), dtype=bool)
    content[slots] = False
    flat[content] = content_flat
    flat[slots] = pool[taken]
    return flat


class EndOfDocument(NamedTuple):
    """The end-of-document id :meth:`ChatEncoder.encode_turns` places: ``id``, before each conversation
    (``before``) or after it, and whether an empty conversation gets one too (``empty``; Megatron adds none). After
    a conversation, it is trained on where the conversation's last message is (so the model learns to stop);
    before, never."""

    id: int
    before: bool = False
    empty: bool = True


class ChatSpec:
    """What a chat run needs in every process: the schema (a name or a callable, pickled by reference), the
    template and the masking options; :meth:`encoder` makes the :class:`ChatEncoder` for a tokenizer."""

    def __init__(self, schema: Any, template: ChatTemplate, train_on: str, thought: str) -> None:
        self.schema, self.template, self.train_on, self.thought = schema, template, train_on, thought

    def encoder(self, tokenizer: Any) -> ChatEncoder:
        """The encoder of this run's conversations with ``tokenizer``."""
        return ChatEncoder(tokenizer, self.template, self.train_on, self.thought)
