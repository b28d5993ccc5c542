"""The ``messages`` schema read every way the library reads it agrees on what a conversation is: one record at a time
(``messages_of``), a batch (``turns_of``), a batch a chunk at a time as the pipeline's reader thread reads it
(``TurnsReader``), and a callable returning the same messages. Random batches mix the common form (gathered a field
at a time) with every other form (tool calls, text parts, thought fields, other keys, subclassed dicts and strings)
and bad records; the same messages, the same errors in the same order, the same arrays."""

from __future__ import annotations

import random
from collections import OrderedDict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokformats.tokenization import chat
from tokformats.tokenization.chat import ChatError, Message, Turns, TurnsReader, messages_of, turns_of

_WORDS = ["", " ", "hi", "Paris", "<|im_end|>", "<|endoftext|>", "二足す二 🤔", "a\nb", '{"k": 1}', "  edged  "]


class _Text(str):
    """A str subclass: read one by one, never gathered."""


class _Shouting(dict[str, Any]):
    """A dict subclass whose ``get`` and ``[]`` shout its text: read one by one (by those), never gathered."""

    def get(self, key: str, default: Any = None) -> Any:
        value = super().get(key, default)
        return value.upper() if key == "content" and isinstance(value, str) else value

    def __getitem__(self, key: str) -> Any:
        return self.get(key)


def _text(rng: random.Random) -> str:
    return "".join(rng.choice(_WORDS) for _ in range(rng.randint(0, 3)))


def _common_message(rng: random.Random) -> dict[str, Any]:
    role = rng.choice(["system", "user", "assistant", "tool"])
    message: dict[str, Any] = {"role": role, "content": _text(rng)}
    if role == "assistant" and rng.random() < 0.4:
        message["reasoning_content"] = _text(rng)
    return message


def _other_message(rng: random.Random) -> Any:
    """A message in a form other than the common one: good (read one by one) or bad (an error)."""
    return rng.choice(_other_forms(rng, rng.choice(["system", "user", "assistant", "tool"])))


def _other_forms(rng: random.Random, role: str) -> list[Any]:
    """Every form of message other than the common one, with ``role`` where a form has any."""
    call = {"type": "function", "function": {"name": "get", "arguments": rng.choice(['{"c": 1}', "not json", {}])}}
    forms: list[Any] = [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "assistant", "content": _text(rng), "tool_calls": [call, {"name": "direct", "arguments": [1]}]},
        {"role": "assistant", "content": "", "tool_calls": []},
        {"role": "assistant", "content": "x", "tool_calls": "not a list"},
        {"role": "assistant", "content": None, "tool_calls": [{"function": {"arguments": "{}"}}]},
        {"role": "assistant", "content": None, "tool_calls": [{"name": "f", "arguments": {1, 2}}]},
        {"role": "tool", "content": _text(rng), "tool_call_id": "x"},
        {"role": role, "content": [{"type": "text", "text": _text(rng)}, {"type": "text", "text": "parts"}]},
        {"role": role, "content": [{"type": "image", "url": "u"}, {"text": "untyped"}]},
        {"role": role, "content": [{"type": "text", "text": 3}]},
        {"role": role, "content": ["not a part"]},
        {"role": role, "content": _text(rng), "reasoning_content": _text(rng)},
        {"role": role, "content": _text(rng), "reasoning_content": None},
        {"role": role, "content": _text(rng), "thought": _text(rng)},
        {"role": role, "content": _text(rng), "reasoning": [{"type": "text", "text": "in parts"}]},
        {"role": role, "content": _text(rng), "reasoning_content": 7},
        {"role": role, "content": _text(rng), "name": "bot"},
        {"role": role, "content": _text(rng), "name": "bot", "tool_call_id": "x"},
        {"role": role, "content": _text(rng), "reasoning_content": "why", "thought": "how"},
        {"role": role, "content": _text(rng), "thought": "how", "name": "bot"},
        {"role": "assistant", "content": "x", "tool_calls": [call], "reasoning_content": "why"},
        _Shouting(role=role, content="shouted"),
        {"role": role},
        {"role": role, "content": None},
        {"role": role, "content": 3},
        {"role": "bot", "content": "x"},
        {"role": ["user"], "content": "x"},
        {"content": "no role"},
        {"role": _Text(role), "content": "a subclassed role"},
        {"role": role, "content": _Text("subclassed content")},
        OrderedDict(role=role, content="an ordered dict"),
        Message(role, "a Message as it is", None),
        "not a message",
        None,
        ["user", "x"],
    ]
    return forms


def random_records(seed: int, size: int | None = None) -> list[Any]:
    """A batch of ``messages`` records from ``seed``: mostly the common form, some holding another form of message,
    some not conversations at all."""
    rng = random.Random(seed)
    records: list[Any] = []
    odd = rng.choice([0.0, 0.01, 0.05, 0.3])  # how often a record is not in the common form
    for _ in range(size if size is not None else rng.randint(0, 120)):
        messages: list[Any] = [_common_message(rng) for _ in range(rng.randint(0, 6))]
        if rng.random() < odd:
            kind = rng.random()
            if kind < 0.7:
                messages.insert(rng.randint(0, len(messages)), _other_message(rng))
            elif kind < 0.8:
                records.append(rng.choice([{"text": "no messages"}, {"messages": "hi"}, {"messages": None}]))
                continue
            elif kind < 0.9:
                records.append(rng.choice([["a", "list"], "a string", 3, {"messages": tuple(messages)}]))
                continue
            else:
                records.append(OrderedDict(messages=messages))
                continue
        records.append({"messages": messages, "id": 1} if rng.random() < 0.1 else {"messages": messages})
    return records


@pytest.mark.parametrize("role", ["system", "user", "assistant", "tool"])
def test_each_other_form_of_message_reads_alike_among_common_records(role: str) -> None:
    """Every form of message but the common one, in one record among common ones: the batch's reading (the chunk
    gathered or read one by one) is that record's alone, its error included."""
    rng = random.Random(role)
    for form in _other_forms(rng, role):
        common = [{"messages": [_common_message(rng) for _ in range(3)]} for _ in range(40)]
        records = [*common[:33], {"messages": [_common_message(rng), form]}, *common[33:]]
        read = read_every_way(records, [10, 30, 5])
        alone = read["alone"]
        errors = [a for a in alone if isinstance(a, str)]
        fit = [k for k, a in enumerate(alone) if not isinstance(a, str)]
        want = _turns(Turns.of([alone[k] for k in fit]))
        assert read["batch"] == read["chunks"] == (fit, want, errors), form
        assert read["batch raised"] == (errors[0] if errors else want), form


def _turns(turns: Turns) -> tuple[Any, ...]:
    """Everything a :class:`Turns` holds, comparable (arrays as dtype and list)."""
    arrays = [(a.dtype.str, a.tolist()) for a in (turns.counts, turns.thought_at)]
    codes = None if turns.codes is None else (turns.codes.dtype.str, turns.codes.tolist())
    return (turns.roles, turns.contents, *arrays, turns.thoughts, codes, [type(r) for r in turns.roles])


def _where(k: int) -> str:
    return f"chats.jsonl, line {k + 1}"


def read_every_way(records: list[Any], chunks: list[int]) -> dict[str, Any]:
    """``records`` read by every reader of the ``messages`` schema (a batch, a batch in ``chunks`` as the pipeline's
    reader thread reads one, one record at a time, a callable), with bad records skipped and raised: what each
    read, comparable."""
    out: dict[str, Any] = {}
    alone: list[Any] = []
    for k, record in enumerate(records):
        try:
            alone.append(messages_of(record, "messages", _where(k)))
        except ChatError as error:
            alone.append(str(error))
    out["alone"] = alone
    skipped: list[ChatError] = []
    kept, turns = turns_of(records, "messages", _where, skipped.append)
    out["batch"] = (kept, _turns(turns), [str(e) for e in skipped])
    try:
        out["batch raised"] = _turns(turns_of(records, "messages", _where)[1])
    except ChatError as error:
        out["batch raised"] = str(error)
    reader, errors, kept, first = TurnsReader("messages"), list[ChatError](), list[int](), 0
    sizes = iter(chunks)
    while first < len(records):  # chunks while they are gathered, then the rest at once (as pipeline._Preparing)
        size = next(sizes, 32) if reader.gathering else len(records)
        chunk = records[first : first + size]
        kept += [first + k for k in reader.add(chunk, lambda k, at=first: _where(at + k), errors.append)]
        first += len(chunk)
    out["chunks"] = (kept, _turns(reader.turns()), [str(e) for e in errors])
    skipped = []
    kept, turns = turns_of(records, _as_they_are, _where, skipped.append)
    out["callable"] = (kept, _turns(turns), [str(e) for e in skipped])
    return out


def _as_they_are(record: Any) -> Any:
    """A chat callable: the record's messages as they are."""
    return record["messages"]


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), chunks=st.lists(st.integers(1, 40), max_size=8))
def test_every_reader_of_the_messages_schema_reads_the_same_conversations(seed: int, chunks: list[int]) -> None:
    records = random_records(seed)
    read = read_every_way(records, chunks)
    alone = read["alone"]
    fit = [k for k, a in enumerate(alone) if not isinstance(a, str)]
    conversations = [alone[k] for k in fit]
    want = _turns(Turns.of(conversations))
    errors = [a for a in alone if isinstance(a, str)]
    assert read["batch"] == (fit, want, errors)
    assert read["chunks"] == (fit, want, errors)
    assert read["batch raised"] == (errors[0] if errors else want)
    kept, turns, failed = read["callable"]  # a record with no list of messages fails in the callable: named otherwise
    assert (kept, turns, len(failed)) == (fit, want, len(errors))


_EVERY_ERROR = (
    "should be a list of messages",
    "no field 'messages'",
    "expected a JSON object",
    ".role' is",
    ".content' should be a string",
    "tool_calls' should be a list",
    "should hold a function name",
    "should hold JSON arguments",
    "should be an object with role and content",
    ".thought' should",
)


def test_the_random_batches_hold_every_form_and_both_readings() -> None:
    """The generator is not degenerate: over the seeds the property test draws from, batches are gathered whole,
    read partly one by one, and hold errors of each kind."""
    records = [r for seed in range(200) for r in random_records(seed, 40)]
    alone = []
    for record in records:
        try:
            alone.append(messages_of(record, "messages", "w"))
        except ChatError as error:
            alone.append(str(error))
    errors = " ".join(a for a in alone if isinstance(a, str))
    for field in _EVERY_ERROR:
        assert field in errors, field
    thoughts = {m.thought for a in alone if not isinstance(a, str) for m in a} - {None}
    assert "in parts" in thoughts and any(isinstance(a, list) and a and a[0].role == "tool" for a in alone)
    gathered = sum(chat._gathered(records[k : k + 32]) is not None for k in range(0, len(records), 32))
    assert 0 < gathered < len(records) // 32


def test_a_batch_of_common_records_is_gathered_never_read_one_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Common records (a seed's with no other form) reach neither messages_of nor the one-by-one reader, in a batch
    or a chunk at a time; a batch with one other record reads only that record's chunk one by one."""
    records = [r for r in random_records(7, 300) if type(r) is dict and chat._gathered([r]) is not None]
    want = turns_of(records, "messages", str)
    read: list[Any] = []
    monkeypatch.setattr(chat, "messages_of", lambda record, *args: read.append(record) or [])
    assert len(records) > 100 and _turns(turns_of(records, "messages", str)[1]) == _turns(want[1]) and not read
    reader = TurnsReader("messages")
    for first in range(0, len(records), 32):
        reader.add(records[first : first + 32], str)
    assert reader.gathering and _turns(reader.turns()) == _turns(want[1]) and not read
    other = {"messages": [{"role": "tool", "content": "t", "tool_call_id": "x"}]}
    turns_of([*records[:70], other, *records[70:]], "messages", str)
    assert read == [*records[64:70], other, *records[70:95]]  # records 64-95 are one chunk of 32
