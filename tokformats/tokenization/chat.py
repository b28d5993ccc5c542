"""Conversations from records: the chat schemas ``tokenize(chat=...)`` reads, as lists of :class:`Message`.

Schemas:

- ``"messages"`` (OpenAI): ``{"messages": [{"role": "system"|"user"|"assistant"|"tool", "content": ...}, ...]}``.
  ``content`` is a string, a list of ``{"type": "text", "text": ...}`` parts (joined; ``refusal``, ``input_text`` and
  ``output_text`` parts too, a part of another type is refused), or null (an assistant turn that only calls tools). An
  assistant's ``reasoning_content`` (or ``thought``, ``reasoning``) is its thought; its ``tool_calls`` are appended to
  its content, one JSON object ``{"name": ..., "arguments": ...}`` per line.
- ``"sharegpt"``: ``{"conversations": [{"from": "human"|"gpt"|"system"|"tool"|..., "value": ...}, ...]}``
  (``system_prompt``/``system`` at the top level becomes a first system turn).
- ``"alpaca"``: ``{"instruction", "input" (optional), "output", "system" (optional)}``: a user turn holding the
  instruction (and the input after a blank line), then the assistant's output.
- a callable: ``record -> messages`` (a list of ``{"role", "content"}`` dicts, checked like ``"messages"``).

A record that does not fit raises :class:`ChatError` naming where (file and line) and the field
(``messages[2].role``), what was expected and what was found.

:func:`turns_of` reads a whole batch of records into :class:`Turns` (every message of the batch in flat lists): a
chunk of ``messages`` records all in the schema's common form (each message an object of a role and a text, and an
assistant's ``reasoning_content``; stated once, in ``_gathered``) is checked and read one field at a time, so it
costs a few list passes rather than Python work per message; any other chunk is read by :func:`messages_of`, one
record at a time, exactly as alone (so its error, or its skipping, is the same). :class:`TurnsReader` reads a batch
the same way a chunk at a time as its caller reads the records, so that the caller can drop each chunk's parsed JSON
as soon as it is read. A message in the common form is read by :func:`messages_of` as the same :class:`Message`:
the common form is only what may be read by field, never what a message means.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import chain, compress, repeat
from operator import is_not
from typing import Any, NamedTuple

import numpy as np

from .sources import SourceError

__all__ = [
    "Message",
    "Turns",
    "TurnsReader",
    "ChatError",
    "SCHEMAS",
    "ROLES",
    "messages_of",
    "turns_of",
    "role_codes",
    "schema_name",
]

#: The roles a message may have.
ROLES = ("system", "user", "assistant", "tool")
_ASSISTANT = "assistant"
#: The built-in schemas (``tokenize(chat=...)`` also takes a callable).
SCHEMAS = ("messages", "sharegpt", "alpaca")

#: ShareGPT's ``from`` values (as the datasets in the wild spell them) and the role each is.
_SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "model": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "function_call": "assistant",
    "tool": "tool",
    "function": "tool",
    "function_response": "tool",
    "observation": "tool",
    "ipython": "tool",
}
_THOUGHT_FIELDS = ("reasoning_content", "thought", "reasoning")


class ChatError(SourceError):
    """A record is not a conversation of the chosen schema; names the file, line and field."""


class Message(NamedTuple):
    """One turn: its role, its text, and (assistant turns) the thought before the answer."""

    role: str
    content: str
    thought: str | None = None


def schema_name(chat: str | Callable[[Any], Any]) -> str:
    """How a run records its schema (a resumed run must read records the same way): the name, or the callable's
    ``module.qualname``."""
    if callable(chat):
        return f"callable:{getattr(chat, '__module__', '?')}.{getattr(chat, '__qualname__', repr(chat))}"
    if chat not in SCHEMAS:
        from ..errors import ConfigError

        raise ConfigError(f"chat must be one of {', '.join(SCHEMAS)} or a callable returning messages; found {chat!r}.")
    return chat


def messages_of(record: Any, chat: str | Callable[[Any], Any], where: Any) -> list[Message]:
    """The conversation in ``record`` by schema ``chat``; :class:`ChatError` naming ``where`` (its ``str``: the file
    and line) and the field."""
    if callable(chat):
        try:
            produced = chat(record)
        except Exception as error:  # the user's function: its failure is this record's error
            raise ChatError(f"{where}: the chat callable raised {type(error).__name__}: {error}") from None
        return _openai_messages(produced, where, "messages")
    if not isinstance(record, dict):
        raise ChatError(f"{where}: expected a JSON object holding a conversation, found {type(record).__name__}.")
    if chat == "messages":
        return _openai_messages(_field(record, "messages", where), where, "messages")
    if chat == "sharegpt":
        return _sharegpt_messages(record, where)
    return _alpaca_messages(record, where)


def _field(record: dict[str, Any], name: str, where: Any) -> Any:
    if name not in record:
        raise ChatError(f"{where}: the record has no field {name!r} (fields: {sorted(record)[:8]}).")
    return record[name]


#: The content parts that hold text, by type, and the field holding it: OpenAI's chat parts (``text``, an assistant's
#: ``refusal``) and its Responses API's (``input_text``, ``output_text``); a part of another type (an image, audio,
#: a file) has no text to tokenize.
TEXT_PARTS = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal"}


def _text(value: Any, where: Any, field: str, *, empty: bool = False) -> str:
    """A message's text: a string, or a list of text parts joined; null only where ``empty`` allows it. A part that
    is not text raises: dropped, it would leave the turn without what the conversation says there."""
    if isinstance(value, str):
        return value
    if value is None and empty:
        return ""
    if isinstance(value, list) and all(isinstance(p, dict) for p in value):
        for k, part in enumerate(value):
            if part.get("type", "text") not in TEXT_PARTS:
                raise ChatError(
                    f"{where}: field {f'{field}[{k}].type'!r} is {part.get('type')!r}; only text parts are tokenized "
                    f"({', '.join(TEXT_PARTS)})."
                )
        texts = [p.get(TEXT_PARTS[p.get("type", "text")]) for p in value]
        if all(isinstance(t, str) for t in texts):
            return "".join(t for t in texts if isinstance(t, str))
    raise ChatError(
        f"{where}: field {field!r} should be a string (or a list of text parts), found {type(value).__name__}."
    )


def _tool_calls(calls: Any, where: Any, field: str) -> str:
    """An assistant's tool calls as text: one JSON object per line, each ``{"name", "arguments"}``."""
    if not isinstance(calls, list):
        raise ChatError(f"{where}: field {field!r} should be a list of tool calls, found {type(calls).__name__}.")
    lines = []
    for k, call in enumerate(calls):
        function = call.get("function", call) if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ChatError(f"{where}: field '{field}[{k}]' should hold a function name, found {call!r:.80}.")
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):  # OpenAI sends arguments as a JSON string: kept as the model wrote it
            with contextlib.suppress(ValueError):
                arguments = json.loads(arguments)
        try:  # a record from an iterable may hold any Python object
            lines.append(json.dumps({"name": function["name"], "arguments": arguments}, ensure_ascii=False))
        except (TypeError, ValueError) as error:
            raise ChatError(f"{where}: field '{field}[{k}]' should hold JSON arguments, found {error}.") from None
    return "\n".join(lines)


def _openai_messages(value: Any, where: Any, field: str) -> list[Message]:
    """The messages of ``field``, each in any form the ``messages`` schema allows (tool calls, text parts, a thought
    field), checked. One loop, no call per message, and a field's name spelled only in an error: this reads every
    message that is not gathered (see :func:`_gathered`)."""
    if not isinstance(value, list):
        raise ChatError(f"{where}: field {field!r} should be a list of messages, found {type(value).__name__}.")
    messages: list[Message] = []
    append, new = messages.append, tuple.__new__
    for k, item in enumerate(value):
        if not isinstance(item, dict):
            if not isinstance(item, Message):
                at = f"{field}[{k}]"
                raise ChatError(f"{where}: field {at!r} should be an object with role and content, found {item!r:.80}.")
            append(item)
            continue
        get = item.get
        role = get("role")
        if role not in ROLES:
            raise ChatError(f"{where}: field '{field}[{k}].role' is {role!r}; expected one of {', '.join(ROLES)}.")
        calls = get("tool_calls") if role == _ASSISTANT else None
        content = get("content")
        if not isinstance(content, str):  # what _text returns as it is
            content = _text(content, where, f"{field}[{k}].content", empty=role == _ASSISTANT and bool(calls))
        if calls:
            called = _tool_calls(calls, where, f"{field}[{k}].tool_calls")
            content = f"{content}\n{called}" if content else called
        thought = None
        for name in _THOUGHT_FIELDS:  # the first one present
            if get(name) is not None:
                thought = item[name]
                break
        if thought is not None and not isinstance(thought, str):
            thought = _text(thought, where, f"{field}[{k}].thought")
        append(new(Message, (role, content, thought if role == _ASSISTANT else None)))  # Message(...), quicker
    return messages


def _sharegpt_messages(record: dict[str, Any], where: Any) -> list[Message]:
    turns = _field(record, "conversations", where)
    if not isinstance(turns, list):
        raise ChatError(f"{where}: field 'conversations' should be a list of turns, found {type(turns).__name__}.")
    messages = []
    system = record.get("system_prompt", record.get("system"))
    if system is not None:
        messages.append(Message("system", _text(system, where, "system")))
    for k, turn in enumerate(turns):
        at = f"conversations[{k}]"
        if not isinstance(turn, dict):
            raise ChatError(f"{where}: field {at!r} should be an object with from and value, found {turn!r:.80}.")
        speaker = turn.get("from")
        role = _SHAREGPT_ROLES.get(speaker) if isinstance(speaker, str) else None
        if role is None:
            known = ", ".join(sorted(_SHAREGPT_ROLES))
            raise ChatError(f"{where}: field '{at}.from' is {speaker!r}; expected one of {known}.")
        messages.append(Message(role, _text(turn.get("value"), where, f"{at}.value")))
    return messages


def _alpaca_messages(record: dict[str, Any], where: Any) -> list[Message]:
    instruction = _text(_field(record, "instruction", where), where, "instruction")
    extra = _text(record.get("input"), where, "input", empty=True)
    output = _text(_field(record, "output", where), where, "output")
    messages = []
    if record.get("system") is not None:
        messages.append(Message("system", _text(record["system"], where, "system")))
    messages.append(Message("user", f"{instruction}\n\n{extra}" if extra else instruction))
    messages.append(Message("assistant", output))
    return messages


class Turns(NamedTuple):
    """A batch of conversations, flat: every message's ``roles`` and ``contents``, conversation after conversation;
    the ``counts`` of messages in each conversation; and the messages that have a thought (``thought_at``: their
    indices into the flat lists, ascending) with their ``thoughts``. ``codes``: each role's index in :data:`ROLES`
    (int8), or None when a role is not one of them."""

    roles: list[str]
    contents: list[str]
    counts: np.ndarray
    thought_at: np.ndarray
    thoughts: list[str]
    codes: np.ndarray | None = None

    @classmethod
    def of(cls, conversations: Iterable[Sequence[Message]]) -> Turns:
        """The conversations (lists of :class:`Message`), flat. Each is read as it comes and not held: from an
        iterator, a conversation's :class:`Message` s can be freed before the next is made (many objects held at
        once would set off the garbage collector)."""
        counts: list[int] = []
        roles: list[str] = []
        contents: list[str] = []
        thoughts: list[str | None] = []
        for messages in conversations:
            counts.append(len(messages))
            if messages:
                spoken, said, thought = zip(*messages)
                roles += spoken
                contents += said
                thoughts += thought
        has = np.fromiter(map(is_not, thoughts, repeat(None)), bool, len(thoughts))
        kept = [thought for thought in thoughts if thought is not None] if has.any() else []
        return cls(roles, contents, np.array(counts, dtype=np.int64), np.flatnonzero(has), kept, role_codes(roles))

    @classmethod
    def joined(cls, parts: Sequence[Turns]) -> Turns:
        """The conversations of ``parts``, one after another."""
        starts = np.cumsum([0, *(len(part.roles) for part in parts)])
        codes = [part.codes for part in parts]
        return cls(
            list(chain.from_iterable(part.roles for part in parts)),
            list(chain.from_iterable(part.contents for part in parts)),
            np.concatenate([np.zeros(0, np.int64), *(part.counts for part in parts)]),
            np.concatenate([np.zeros(0, np.int64), *(part.thought_at + s for part, s in zip(parts, starts))]),
            list(chain.from_iterable(part.thoughts for part in parts)),
            None if any(c is None for c in codes) else np.concatenate([np.zeros(0, np.int8), *codes]),
        )

    def part(self, first: int, stop: int) -> Turns:
        """Conversations ``first`` to ``stop`` (exclusive)."""
        offsets = np.concatenate([[0], np.cumsum(self.counts)])
        start, end = int(offsets[first]), int(offsets[stop])
        a, b = np.searchsorted(self.thought_at, [start, end]).tolist()
        return Turns(
            self.roles[start:end],
            self.contents[start:end],
            self.counts[first:stop],
            self.thought_at[a:b] - start,
            self.thoughts[a:b],
            None if self.codes is None else self.codes[start:end],
        )

    def conversations(self) -> list[list[Message]]:
        """The conversations as lists of :class:`Message`."""
        thoughts: list[str | None] = [None] * len(self.roles)
        for k, thought in zip(self.thought_at.tolist(), self.thoughts):
            thoughts[k] = thought
        messages = list(map(Message, self.roles, self.contents, thoughts))
        ends = np.cumsum(self.counts).tolist()
        return [messages[end - count : end] for end, count in zip(ends, self.counts.tolist())]


#: Each role's index in :data:`ROLES`.
_ROLE_CODES = {role: code for code, role in enumerate(ROLES)}


def role_codes(roles: Sequence[Any]) -> np.ndarray | None:
    """Each role's index in :data:`ROLES` (int8), or None when one is not a ``str`` of :data:`ROLES`."""
    if set(map(type, roles)) - {str}:
        return None
    codes = np.fromiter(map(_ROLE_CODES.get, roles, repeat(-1)), np.int8, len(roles))
    return None if len(codes) and codes.min() < 0 else codes


#: How many ``messages`` records :func:`turns_of` gathers at a time: a chunk with a record in another form is read
#: one by one, so it should be small; the gathering costs per record about as much at 32 as for a whole batch.
_GATHER = 32


def turns_of(
    values: Sequence[Any],
    chat: str | Callable[[Any], Any],
    where: Callable[[int], Any],
    skip: Callable[[ChatError], None] | None = None,
) -> tuple[list[int], Turns]:
    """The conversations in a batch of records by schema ``chat``, flat, and which records hold them (indices into
    ``values``, ascending). A record that does not fit raises :class:`ChatError` naming ``where(k)`` and the field,
    as :func:`messages_of` does; with ``skip``, its error goes to ``skip`` (which may raise) and the record is left
    out. ``messages`` records are read a chunk at a time: a chunk all in the common form (:func:`_gathered`) is
    gathered a field at a time (the same messages), and a run of other chunks read a record at a time."""
    if callable(chat) or chat != "messages":
        return _read_each(values, chat, where, skip)
    parts: list[Turns | _Gathered] = []
    kept: list[int] = []

    def read(start: int, stop: int) -> None:  # a run of chunks not gathered, in one call: Turns.of's costs once
        if start < stop:
            held, turns = _read_each(values[start:stop], chat, lambda k: where(start + k), skip)
            parts.append(turns)
            kept.extend(start + k for k in held)

    unread = 0  # where the run of chunks not gathered so far begins
    for first in range(0, len(values), _GATHER):
        gathered = _gathered(values[first : first + _GATHER])
        if gathered is not None:
            read(unread, first)
            parts.append(gathered)
            unread = min(first + _GATHER, len(values))
            kept.extend(range(first, unread))
    read(unread, len(values))
    return kept, _joined(parts)


def _read_each(
    values: Sequence[Any],
    chat: str | Callable[[Any], Any],
    where: Callable[[int], Any],
    skip: Callable[[ChatError], None] | None,
) -> tuple[list[int], Turns]:
    """:func:`turns_of` by :func:`messages_of`, a record at a time."""
    kept: list[int] = []

    def read() -> Iterator[list[Message]]:  # a generator: each record's messages freed once flat
        for k, value in enumerate(values):
            messages = _read_one(value, chat, where(k), skip)
            if messages is not None:
                kept.append(k)
                yield messages

    turns = Turns.of(read())  # fills kept as it reads
    return kept, turns


def _joined(parts: Sequence[Turns | _Gathered]) -> Turns:
    """The conversations of ``parts``, one after another: each run of gathered chunks made :class:`Turns` at once."""
    joined: list[Turns] = []
    run: list[_Gathered] = []
    for part in [*parts, None]:
        if isinstance(part, _Gathered):
            run.append(part)
            continue
        if run:
            joined.append(_gathered_turns(run))
            run = []
        if part is not None:
            joined.append(part)
    return joined[0] if len(joined) == 1 else Turns.joined(joined)


class TurnsReader:
    """A batch of records read into :class:`Turns` a chunk at a time, by schema ``chat``: :meth:`add` reads a chunk
    (as :func:`turns_of` does, the same turns), so that the caller can drop the chunk's parsed JSON at once;
    :meth:`turns` joins the chunks read. A chunk of ``messages`` records all in the common form (see
    :func:`_gathered`) is only gathered into lists here, with no NumPy call, its arrays made once for the batch: a
    chunk of a few dozen records then costs a few list passes, not a batch's fixed costs."""

    def __init__(self, chat: str | Callable[[Any], Any]) -> None:
        self.chat = chat
        self._parts: list[Turns | _Gathered] = []
        #: Whether every chunk read so far was gathered (and a later one may be): False for another schema, and
        #: from a chunk with a record in another form on. A caller then reads the rest of the batch in one chunk:
        #: :func:`turns_of` pays NumPy's fixed costs per call, too much for a few dozen records.
        self.gathering = not callable(chat) and chat == "messages"

    def add(
        self, values: Sequence[Any], where: Callable[[int], Any], skip: Callable[[ChatError], None] | None = None
    ) -> list[int]:
        """Read the records ``values`` (after those read before) as :func:`turns_of` reads them: which of them hold
        a conversation (indices into ``values``, ascending); a record that does not fit raises, or goes to
        ``skip``."""
        gathered = _gathered(values) if self.gathering else None
        self.gathering = gathered is not None
        if gathered is not None:
            self._parts.append(gathered)
            return list(range(len(values)))
        kept, turns = turns_of(values, self.chat, where, skip)
        self._parts.append(turns)
        return kept

    def turns(self) -> Turns:
        """The conversations of every chunk read, one after another."""
        return _joined(self._parts)


class _Gathered(NamedTuple):
    """A chunk of ``messages`` records in the common form, gathered: each record's message ``counts``, every
    message's ``roles``, their ``codes`` (each role's index in :data:`ROLES`, one byte each) and ``contents``, and
    the messages with a thought (``thought_at``, ascending, in the chunk) with their ``thoughts``."""

    counts: list[int]
    roles: list[str]
    codes: bytes
    contents: list[str]
    thought_at: list[int]
    thoughts: list[str]


_TWO_OR_THREE = frozenset((2, 3))


def _gathered(values: Sequence[Any]) -> _Gathered | None:
    """A chunk of ``messages`` records gathered, when every record is in the common form; else None (the chunk is
    read a record at a time, by :func:`messages_of`). The one statement of that form, which :func:`turns_of` and
    :class:`TurnsReader` both gather: a ``dict`` whose ``messages`` is a ``list`` of ``dict`` s, each of a ``role``
    of :data:`ROLES` and a ``str`` ``content`` and nothing else, or an assistant's with a ``str``
    ``reasoning_content`` too (its thought); :func:`messages_of` reads each such message as the same
    :class:`Message`. ``type()``, not ``isinstance``: what only claims to be a dict, list or str is read one by one.
    Only list passes and set tests, no NumPy: a chunk is small."""
    lists: list[Any] = [v.get("messages") if type(v) is dict else None for v in values]
    if set(map(type, lists)) - {list}:
        return None
    items: list[Any] = list(chain.from_iterable(lists))
    if set(map(type, items)) - {dict}:
        return None
    sizes = set(map(len, items))
    roles: list[Any] = list(map(dict.get, items, repeat("role")))
    contents: list[Any] = list(map(dict.get, items, repeat("content")))
    if sizes - _TWO_OR_THREE or set(map(type, roles)) - {str} or set(map(type, contents)) - {str}:
        return None
    try:
        codes = bytes(map(_ROLE_CODES.__getitem__, roles))
    except KeyError:  # another role
        return None
    thought_at: list[int] = []
    thoughts: list[Any] = []
    if 3 in sizes:
        thought_at = list(compress(range(len(items)), map((3).__eq__, map(len, items))))
        thoughts = list(map(dict.get, map(items.__getitem__, thought_at), repeat("reasoning_content")))
        if set(map(type, thoughts)) - {str} or set(map(roles.__getitem__, thought_at)) - {_ASSISTANT}:
            return None
    return _Gathered(list(map(len, lists)), roles, codes, contents, thought_at, thoughts)


def _gathered_turns(chunks: Sequence[_Gathered]) -> Turns:
    """The :class:`Turns` of gathered chunks, one after another."""
    starts = np.cumsum([0, *(len(chunk.roles) for chunk in chunks)]).tolist()
    thought_at = list(chain.from_iterable(map(_shifted, (chunk.thought_at for chunk in chunks), starts)))
    return Turns(
        list(chain.from_iterable(chunk.roles for chunk in chunks)),
        list(chain.from_iterable(chunk.contents for chunk in chunks)),
        np.fromiter(chain.from_iterable(chunk.counts for chunk in chunks), np.int64),
        np.array(thought_at, dtype=np.int64),
        list(chain.from_iterable(chunk.thoughts for chunk in chunks)),
        np.frombuffer(b"".join(chunk.codes for chunk in chunks), dtype=np.int8).copy(),
    )


def _shifted(positions: list[int], start: int) -> Iterable[int]:
    """``positions`` each plus ``start``."""
    return map(start.__add__, positions) if start else positions


def _read_one(
    value: Any, chat: str | Callable[[Any], Any], where: Any, skip: Callable[[ChatError], None] | None
) -> list[Message] | None:
    """:func:`messages_of`, or None when the record does not fit and ``skip`` took its error."""
    try:
        return messages_of(value, chat, where)
    except ChatError as error:
        if skip is None:
            raise
        skip(error)
        return None
