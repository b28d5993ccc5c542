"""Chat templates: a conversation rendered as *segments*, each template text or message text, trained on or not.

A :class:`Segment` is encoded on its own, so that role boundaries are token boundaries: template text may hold
special tokens (``<|im_start|>``); message text never yields one (its ``<|im_end|>`` spelled out stays text).

The built-in ``chatml`` template, on the seed tokenizer's specials (ids 0-8), renders each message as::

    <|im_start|>ROLE\\nCONTENT<|im_end|>\\n

where ROLE is the role's special token (``<|system|>``, ``<|user|>``, ``<|assistant|>``) or, for ``tool``, the
text ``tool``; an assistant message with a thought has ``<|thought|>THOUGHT<|/thought|>\\n`` before its content.
Trained on (loss mask 1) with ``train_on="assistant"``: an assistant message's thought block (unless
``thought="mask"``), its content and its ``<|im_end|>``; never its header ``<|im_start|><|assistant|>\\n`` nor the
``\\n`` after ``<|im_end|>``. ``train_on="last"``: the same for the last assistant message only; ``"all"``: every
token (thought blocks still masked with ``thought="mask"``).

``JinjaTemplate`` renders the tokenizer's own Jinja ``chat_template`` (``tokenizer_config.json``) with a marker in
place of each message's text, so that the message texts are found exactly; the template text after a trained
assistant message, up to and including its first special token (``<|im_end|>``, ``<|eot_id|>``, ``</s>``), is
trained on too: that is the end of turn the model must learn to produce.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import numpy as np

from ..errors import ConfigError, FormatError
from .chat import ROLES, Message, Turns

__all__ = [
    "Segment",
    "Layout",
    "ChatTemplate",
    "ChatML",
    "JinjaTemplate",
    "TRAIN_ON",
    "THOUGHT",
    "trained_messages",
    "ends_trained",
    "load_template",
    "template_source",
]

TRAIN_ON = ("assistant", "all", "last")
THOUGHT = ("train", "mask")

#: The built-in template's role tokens (the seed tokenizer's ids 4-6); other roles are written as text.
ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
THOUGHT_START, THOUGHT_END = "<|thought|>", "<|/thought|>"


class Segment(NamedTuple):
    """A piece of a rendered conversation: ``text``, whether it is message text (``content``: encoded with special
    tokens spelled out as text) or template text (special tokens recognised), and whether it is ``trained`` on."""

    text: str
    content: bool
    trained: bool


def trained_messages(messages: Sequence[Message], train_on: str) -> list[bool]:
    """Which messages the loss sees: every one (``all``), the assistant's (``assistant``), or the last assistant
    message only (``last``)."""
    if train_on == "all":
        return [True] * len(messages)
    assistant = [m.role == "assistant" for m in messages]
    if train_on == "assistant":
        return assistant
    last = max((k for k, a in enumerate(assistant) if a), default=-1)
    return [k == last for k in range(len(messages))]


class Layout(NamedTuple):
    """A batch of conversations as segments, ready to be encoded: the message ``texts`` (encoded with specials as
    text; listed in the order their segments come, each used once), the distinct ``templates`` texts (specials
    recognised), each segment's ``sources`` (``k >= 0``: message text k; ``-1 - t``: template text t) and whether it
    is ``trained``, and ``bounds``: conversation c is segments ``bounds[c]:bounds[c + 1]``. ``ends_trained``: whether
    each conversation's last message is trained on (False for an empty one), when the template knows it at once."""

    texts: list[str]
    templates: list[str]
    sources: np.ndarray
    trained: np.ndarray
    bounds: np.ndarray
    ends_trained: np.ndarray | None = None


class ChatTemplate(ABC):
    """Renders a conversation as :class:`Segment` s."""

    #: How a run records the template (a resumed run must render the same way).
    name: str = ""

    @abstractmethod
    def segments(self, messages: Sequence[Message], train_on: str, thought: str) -> list[Segment]:
        """The conversation as segments, in order; their texts joined are the rendered conversation."""

    def layout(self, conversations: Sequence[Sequence[Message]], train_on: str, thought: str) -> Layout:
        """A batch's :class:`Layout`, from :meth:`segments` (a template may build it faster, the same)."""
        texts: list[str] = []
        templates: dict[str, int] = {}
        sources: list[int] = []
        trained: list[bool] = []
        bounds = [0]
        for messages in conversations:
            for segment in self.segments(messages, train_on, thought):
                if segment.content:
                    sources.append(len(texts))
                    texts.append(segment.text)
                else:
                    sources.append(-1 - templates.setdefault(segment.text, len(templates)))
                trained.append(segment.trained)
            bounds.append(len(sources))
        return Layout(
            texts,
            list(templates),
            np.array(sources, dtype=np.int64),
            np.array(trained, dtype=bool),
            np.array(bounds, dtype=np.int64),
        )

    def layout_turns(self, turns: Turns, train_on: str, thought: str) -> Layout:
        """:meth:`layout` of a batch read flat (:func:`~tokformats.tokenization.chat.turns_of`), with
        ``ends_trained``."""
        layout = self.layout(turns.conversations(), train_on, thought)
        if layout.ends_trained is None:
            layout = layout._replace(ends_trained=ends_trained(turns, train_on))
        return layout


def ends_trained(turns: Turns, train_on: str) -> np.ndarray:
    """Whether each conversation's last message is trained on (False for an empty one)."""
    assistant = np.fromiter((role == "assistant" for role in turns.roles), bool, len(turns.roles))
    return _trained_flags(assistant, turns.counts, train_on)[1]


class ChatML(ChatTemplate):
    """The built-in ChatML template on the seed tokenizer's specials (see the module docstring)."""

    name = "chatml"
    #: Each role's header (``<|im_start|>ROLE\n``), made once.
    _HEADERS: ClassVar[dict[str, str]] = {role: f"{IM_START}{token}\n" for role, token in ROLE_TOKENS.items()}

    def segments(self, messages: Sequence[Message], train_on: str, thought: str) -> list[Segment]:
        everything = train_on == "all"
        out: list[Segment] = []
        for message, trained in zip(messages, trained_messages(messages, train_on)):
            header = self._HEADERS.get(message.role) or f"{IM_START}{message.role}\n"
            out.append(Segment(header, False, everything))
            if message.thought is not None:
                thinks = trained and thought == "train"
                out += [
                    Segment(THOUGHT_START, False, thinks),
                    Segment(message.thought, True, thinks),
                    Segment(f"{THOUGHT_END}\n", False, thinks),
                ]
            out += [Segment(message.content, True, trained), Segment(IM_END, False, trained)]
            out.append(Segment("\n", False, everything))
        return out

    #: The template texts every batch uses, in :meth:`layout`'s numbering (other roles' headers follow).
    _FIXED = (*_HEADERS.values(), THOUGHT_START, f"{THOUGHT_END}\n", IM_END, "\n", f"{IM_START}tool\n")
    #: The roles whose header is one of :attr:`_FIXED`, by number (``assistant`` is 2).
    _ROLE_NUMBERS: ClassVar[dict[str, int]] = {"system": 0, "user": 1, "assistant": 2, "tool": 7}

    def layout(self, conversations: Sequence[Sequence[Message]], train_on: str, thought: str) -> Layout:
        """:meth:`segments` for a whole batch (see :meth:`layout_turns`)."""
        return self.layout_turns(Turns.of(conversations), train_on, thought)

    def layout_turns(self, turns: Turns, train_on: str, thought: str) -> Layout:
        """:meth:`segments` for a whole batch, built with NumPy from the flat messages (no Python work per message
        or segment): each message is the segments header, [``<|thought|>``, thought, ``<|/thought|>\n``],
        content, ``<|im_end|>``, ``\n``."""
        own = type(self)
        if own.layout is not ChatML.layout:  # a subclass laying batches out itself: its layout, not this one
            return ChatTemplate.layout_turns(self, turns, train_on, thought)
        if own.segments is not ChatML.segments:  # a subclass rendering otherwise: laid out from its segments
            layout = ChatTemplate.layout(self, turns.conversations(), train_on, thought)
            return layout._replace(ends_trained=ends_trained(turns, train_on))
        n = len(turns.roles)
        roles = dict(self._ROLE_NUMBERS)
        try:
            if turns.codes is not None:  # read with the batch: each role's index in ROLES
                header = _HEADER_OF_CODE[turns.codes]
            else:
                header = np.fromiter(map(roles.__getitem__, turns.roles), np.int64, n)
        except KeyError:  # another role: its header is text, numbered after the fixed ones
            known = len(self._FIXED) - len(self._ROLE_NUMBERS)
            header = np.fromiter((roles.setdefault(r, known + len(roles)) for r in turns.roles), np.int64, n)
        has_thought = np.zeros(n, dtype=bool)
        has_thought[turns.thought_at] = True
        counts = turns.counts
        flags, last_trained = _trained_flags(header == roles["assistant"], counts, train_on)
        # Message texts in segment order: each message's thought (if any), then its content.
        content_at = np.arange(n) + np.cumsum(has_thought)
        texts = _thoughts_before_contents(turns)
        start = content_at - has_thought
        everything = np.full(n, train_on == "all")
        thinks = flags & (thought == "train")
        # Columns: header, <|thought|>, thought, <|/thought|>\n, content, <|im_end|>, \n (the middle three if any).
        fixed = [np.full_like(header, -1 - t) for t in (3, 4, 5, 6)]  # <|thought|>, <|/thought|>\n, <|im_end|>, \n
        sources = np.stack([-1 - header, fixed[0], start, fixed[1], content_at, fixed[2], fixed[3]], axis=1)
        trains = np.stack([everything, thinks, thinks, thinks, flags, flags, everything], axis=1)
        valid = np.ones_like(trains)
        valid[:, 1:4] = has_thought[:, None]
        per_message = np.concatenate([[0], np.cumsum(4 + 3 * has_thought)])
        bounds = per_message[np.concatenate([[0], np.cumsum(counts)])].astype(np.int64)
        others = sorted(roles.items(), key=lambda item: item[1])[len(self._ROLE_NUMBERS) :]
        extra = [f"{IM_START}{role}\n" for role, _ in others]
        templates = [*self._FIXED, *extra]
        return Layout(texts, templates, sources[valid], trains[valid], bounds, last_trained)


def _thoughts_before_contents(turns: Turns) -> list[str]:
    """The message texts of a batch in segment order: each message's thought (if any), then its content (list
    slices between the thoughts: no Python work per message)."""
    contents, texts, first = turns.contents, [], 0
    for k, thought in zip(turns.thought_at.tolist(), turns.thoughts):
        texts += contents[first:k]
        texts.append(thought)
        first = k
    texts += contents[first:]
    return texts


#: :attr:`ChatML._ROLE_NUMBERS` by the role's index in ``ROLES`` (:attr:`Turns.codes`).
_HEADER_OF_CODE = np.array([ChatML._ROLE_NUMBERS[role] for role in ROLES], dtype=np.int64)


def _trained_flags(assistant: np.ndarray, counts: np.ndarray, train_on: str) -> tuple[np.ndarray, np.ndarray]:
    """:func:`trained_messages` for a batch of messages at once (``assistant``: whether each message is the
    assistant's; ``counts``: messages per conversation), and whether each conversation's last message is trained."""
    if train_on == "all":
        flags = np.ones(len(assistant), dtype=bool)
    elif train_on == "assistant":
        flags = assistant
    else:  # last: each conversation's last assistant message
        positions = np.flatnonzero(assistant)
        conversation = np.repeat(np.arange(len(counts)), counts)[positions]
        last = np.ones(len(positions), dtype=bool)
        last[:-1] = conversation[1:] != conversation[:-1]
        flags = np.zeros(len(assistant), dtype=bool)
        flags[positions[last]] = True
    ends_trained = np.zeros(len(counts), dtype=bool)
    spoken = counts > 0
    ends_trained[spoken] = flags[np.cumsum(counts)[spoken] - 1]
    return flags, ends_trained


class JinjaTemplate(ChatTemplate):
    """A Jinja ``chat_template`` (as ``transformers`` renders it: sandboxed, ``trim_blocks``, ``lstrip_blocks``).

    Args:
        source: the template's Jinja text.
        specials: the tokenizer's special tokens (the end of a trained turn runs to the first of them).
        bos_token / eos_token: what the template calls ``bos_token`` and ``eos_token``.
    """

    def __init__(
        self, source: str, specials: Sequence[str], bos_token: str = "", eos_token: str = ""
    ) -> None:
        try:
            from jinja2.exceptions import TemplateError
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError:
            raise ConfigError("template='tokenizer' needs jinja2: pip install 'tokformats[chat]'.") from None

        def raise_exception(message: str) -> None:
            raise TemplateError(message)

        environment = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[_generation_extension()]
        )
        environment.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)
        environment.globals["raise_exception"] = raise_exception
        try:
            self._template = environment.from_string(source)
        except TemplateError as error:
            raise ConfigError(f"the chat template does not parse as Jinja: {error}") from None
        import hashlib

        self.name = "jinja:" + hashlib.sha256(source.encode("utf-8")).hexdigest()[:16]
        self.source = source
        self._bos, self._eos = bos_token, eos_token
        ordered = sorted({s for s in specials if s}, key=len, reverse=True)
        self._special = re.compile("|".join(re.escape(s) for s in ordered)) if ordered else None
        self._nonce = secrets.token_hex(4)  # markers no template text can contain by accident

    def __reduce__(self) -> tuple[Any, ...]:
        specials = self._special.pattern if self._special is not None else ""
        return (_jinja_from_pattern, (self.source, specials, self._bos, self._eos))

    def _render(self, messages: Sequence[Message]) -> tuple[str, dict[str, tuple[int, str]]]:
        """The conversation rendered with a marker in place of each message's text and thought."""
        from jinja2.exceptions import TemplateError

        marks: dict[str, tuple[int, str]] = {}
        payload = []
        for k, message in enumerate(messages):
            content = f"\ue000{self._nonce}:{2 * k}\ue001"
            marks[content] = (k, "content")
            item: dict[str, Any] = {"role": message.role, "content": content}
            if message.thought is not None:
                item["reasoning_content"] = f"\ue000{self._nonce}:{2 * k + 1}\ue001"
                marks[item["reasoning_content"]] = (k, "thought")
            payload.append(item)
        try:
            rendered = self._template.render(
                messages=payload, bos_token=self._bos, eos_token=self._eos, add_generation_prompt=False
            )
        except TemplateError as error:
            raise FormatError(f"the chat template refuses the conversation: {error}") from None
        return rendered, marks

    def segments(self, messages: Sequence[Message], train_on: str, thought: str) -> list[Segment]:
        rendered, marks = self._render(messages)
        trained = trained_messages(messages, train_on)
        everything = train_on == "all"
        pieces = re.split(f"(\ue000{self._nonce}:\\d+\ue001)", rendered)
        out: list[Segment] = []
        closes_turn = False  # the template text after a trained message's text: its end of turn is trained
        seen: set[str] = set()
        for n, piece in enumerate(pieces):
            if n % 2 == 0:
                out += self._template_text(piece, closes_turn, everything)
                continue
            if piece in seen:
                raise FormatError("the chat template renders a message's text twice; its spans are ambiguous.")
            seen.add(piece)
            k, kind = marks[piece]
            message = messages[k]
            if kind == "thought":
                out.append(Segment(message.thought or "", True, trained[k] and thought == "train"))
                closes_turn = False
            else:
                out.append(Segment(message.content, True, trained[k]))
                closes_turn = trained[k]
        return out

    def _template_text(self, text: str, closes_turn: bool, everything: bool) -> list[Segment]:
        """Template text; after a trained message's text, its part up to and including the first special token is
        trained too."""
        if not text:
            return []
        found = self._special.search(text) if closes_turn and self._special is not None else None
        if found is None:
            return [Segment(text, False, everything)]
        end = found.end()
        return [Segment(text[:end], False, True), *([Segment(text[end:], False, everything)] if text[end:] else [])]


def _generation_extension() -> Any:
    """A Jinja extension that renders ``{% generation %}...{% endgeneration %}`` (TRL's markers of the assistant's
    output in a chat template) as its body: the spans are found segment by segment here, not from the markers."""
    from jinja2 import nodes
    from jinja2.ext import Extension

    class Generation(Extension):
        tags = {"generation"}  # noqa: RUF012 - Jinja's extension interface

        def parse(self, parser: Any) -> Any:
            line = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(line)

        def _body(self, caller: Any) -> str:
            return str(caller())

    return Generation


def _jinja_from_pattern(source: str, pattern: str, bos: str, eos: str) -> JinjaTemplate:
    """Rebuild a pickled :class:`JinjaTemplate` (in a worker process)."""
    template = JinjaTemplate(source, [], bos, eos)
    template._special = re.compile(pattern) if pattern else None
    return template


def template_source(template: str, tokenizer: Any) -> tuple[str, str, str] | None:
    """The Jinja text and its ``bos_token``/``eos_token`` for ``template`` (``"tokenizer"``: from the
    ``tokenizer_config.json`` beside the tokenizer; a path to a ``tokenizer_config.json`` or ``.jinja`` file; or
    Jinja text itself); None for the built-in ``chatml``."""
    if template == "chatml":
        return None
    if template == "tokenizer":
        if not isinstance(tokenizer, (str, os.PathLike)):
            raise ConfigError(
                "template='tokenizer' reads the chat_template of the tokenizer_config.json beside the tokenizer; "
                "give tokenizer= as a path, or pass template='PATH/tokenizer_config.json'."
            )
        folder = Path(tokenizer) if Path(tokenizer).is_dir() else Path(tokenizer).parent
        return _config_template(folder / "tokenizer_config.json")
    if "{%" in template or "{{" in template:
        return template, "", ""
    path = Path(template)
    if path.is_file() and path.name.endswith(".json"):
        return _config_template(path)
    if path.is_file():
        return path.read_text(encoding="utf-8"), "", ""
    raise ConfigError(
        f"template {template!r} is neither 'chatml', 'tokenizer', a tokenizer_config.json or .jinja file, nor Jinja "
        "text."
    )


def _config_template(path: Path) -> tuple[str, str, str]:
    """The ``chat_template`` (the ``default`` one of a list) and special tokens of a ``tokenizer_config.json``."""
    if not path.is_file():
        raise ConfigError(f"{path} does not exist: no chat_template to use; pass template='chatml' for the built-in.")
    from ..fs.untrusted import read_json_object

    config = read_json_object(path)
    source = config.get("chat_template")
    if isinstance(source, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source = named.get("default")
    if not isinstance(source, str):
        raise ConfigError(f"{path}: field 'chat_template' should be Jinja text, found {type(source).__name__}.")

    def token(name: str) -> str:
        value = config.get(name) or ""
        return str(value.get("content", "")) if isinstance(value, dict) else str(value)

    return source, token("bos_token"), token("eos_token")


def load_template(template: str, tokenizer_source: Any, tokenizer: Any) -> ChatTemplate:
    """The template ``tokenize(template=...)`` names, for ``tokenizer`` (a ``tokenizers.Tokenizer``; its special
    tokens end trained turns of a Jinja template). The built-in ``chatml`` needs the seed's specials."""
    source = template_source(template, tokenizer_source)
    if source is None:
        missing = [t for t in (IM_START, IM_END, *ROLE_TOKENS.values()) if tokenizer.token_to_id(t) is None]
        if missing:
            raise ConfigError(
                f"the built-in chatml template needs the tokens {', '.join(missing)} in the tokenizer (tokformats "
                "train-tokenizer reserves them at ids 0-8); pass template='tokenizer' to use the tokenizer's own."
            )
        return ChatML()
    specials = [t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special]
    return JinjaTemplate(source[0], specials, source[1], source[2])
