"""Conversations from records: the chat schemas ``tokenize(chat=...)`` reads, as lists of :class:`Message`.

Schemas:

- ``"messages"`` (OpenAI): ``{"messages": [{"role": "system"|"user"|"assistant"|"tool", "content": ...}, ...]}``.
  ``content`` is a string, a list of ``{"type": "text", "text": ...}`` parts (joined), or null (an assistant turn
  that only calls tools). An assistant's ``reasoning_content`` (or ``thought``, ``reasoning``) is its thought;
  its ``tool_calls`` are appended to its content, one JSON object ``{"name": ..., "arguments": ...}`` per line.
- ``"sharegpt"``: ``{"conversations": [{"from": "human"|"gpt"|"system"|"tool"|..., "value": ...}, ...]}``
  (``system_prompt``/``system`` at the top level becomes a first system turn).
- ``"alpaca"``: ``{"instruction", "input" (optional), "output", "system" (optional)}``: a user turn holding the
  instruction (and the input after a blank line), then the assistant's output.
- a callable: ``record -> messages`` (a list of ``{"role", "content"}`` dicts, checked like ``"messages"``).

A record that does not fit raises :class:`ChatError` naming where (file and line) and the field
(``messages[2].role``), what was expected and what was found.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import Any, NamedTuple

from .sources import SourceError

__all__ = ["Message", "ChatError", "SCHEMAS", "ROLES", "messages_of", "schema_name"]

#: The roles a message may have.
ROLES = ("system", "user", "assistant", "tool")
_ROLE_SET = frozenset(ROLES)
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


def _text(value: Any, where: Any, field: str, *, empty: bool = False) -> str:
    """A message's text: a string, or a list of text parts joined; null only where ``empty`` allows it."""
    if isinstance(value, str):
        return value
    if value is None and empty:
        return ""
    if isinstance(value, list) and all(isinstance(p, dict) for p in value):
        texts = [p.get("text") for p in value if p.get("type", "text") == "text"]
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
        lines.append(json.dumps({"name": function["name"], "arguments": arguments}, ensure_ascii=False))
    return "\n".join(lines)


def _openai_messages(value: Any, where: Any, field: str) -> list[Message]:
    if not isinstance(value, list):
        raise ChatError(f"{where}: field {field!r} should be a list of messages, found {type(value).__name__}.")
    messages: list[Message] = []
    append, new = messages.append, tuple.__new__
    for item in value:  # the common cases inline (a role and a text; an assistant's text and thought), read once
        if item.__class__ is dict:
            get = item.get
            role, content = get("role"), get("content")
            if content.__class__ is str and role.__class__ is str and role in _ROLE_SET:
                size = len(item)
                if size == 2:
                    append(new(Message, (role, content, None)))
                    continue
                thought = get("reasoning_content")
                if size == 3 and thought.__class__ is str and role == "assistant":
                    append(new(Message, (role, content, thought)))
                    continue
        append(_message(item, where, f"{field}[{len(messages)}]"))  # every item makes one message: k = len
    return messages


def _message(item: Any, where: Any, at: str) -> Message:
    """One message in any form the ``messages`` schema allows (tool calls, text parts, a thought field), checked."""
    if isinstance(item, Message):
        return item
    if not isinstance(item, dict):
        raise ChatError(f"{where}: field {at!r} should be an object with role and content, found {item!r:.80}.")
    role = item.get("role")
    if role not in ROLES:
        raise ChatError(f"{where}: field '{at}.role' is {role!r}; expected one of {', '.join(ROLES)}.")
    calls = item.get("tool_calls") if role == "assistant" else None
    content = _text(item.get("content"), where, f"{at}.content", empty=role == "assistant" and bool(calls))
    if calls:
        called = _tool_calls(calls, where, f"{at}.tool_calls")
        content = f"{content}\n{called}" if content else called
    thought = next((item[f] for f in _THOUGHT_FIELDS if item.get(f) is not None), None)
    if thought is not None:
        thought = _text(thought, where, f"{at}.thought")
    return Message(role, content, thought if role == "assistant" else None)


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
