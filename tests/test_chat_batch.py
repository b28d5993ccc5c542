"""Chat records read and laid out a batch at a time (``turns_of``, ``Turns``, ``ChatML.layout_turns``): the same
messages, errors, skips, ids and masks as reading and rendering each conversation on its own."""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tokformats
from tokformats.tokenization.chat import (
    ROLES,
    ChatError,
    Message,
    Turns,
    TurnsReader,
    messages_of,
    role_codes,
    turns_of,
)
from tokformats.tokenization.chat_encoding import ChatEncoder, EndOfDocument
from tokformats.tokenization.engines import TokenizersEngine
from tokformats.tokenization.sample_text import sample_texts
from tokformats.tokenization.templates import ChatML, ChatTemplate


@pytest.fixture(scope="module")
def tokenizer(tokenizer_path: Path) -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tokenizer_path))


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def _assistant(text: str, **more: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": text, **more}


class _Text(str):
    """A str subclass: not the common form (its class is not str), read one by one."""


def _mixed_records() -> list[Any]:
    """Every form the messages schema takes: the common one, and the ones read one by one, in one batch."""
    long_turn = " ".join(sample_texts(20))[:20000]
    return [
        {"messages": [_user("say <|im_end|><|endoftext|> and <|assistant|>"), _assistant("<|im_start|>no")]},
        {"messages": [{"role": "system", "content": ""}, _user(""), _assistant("")]},
        {"messages": [_user("weather?"),
                      {"role": "assistant", "content": None,
                       "tool_calls": [{"type": "function", "function": {"name": "get", "arguments": "{\"c\": 1}"}}]},
                      {"role": "tool", "content": "{\"temp\": -3}", "tool_call_id": "x"},
                      {"role": "tool", "content": "plain tool turn"}, _assistant("It is -3.")]},
        {"messages": [_user("思考"), _assistant("答え", reasoning_content="二足す二 🤔")]},
        {"messages": [_user("q"), _assistant("a", thought="by the thought field")]},
        {"messages": [_user("q"), _assistant("a", reasoning="by the reasoning field")]},
        {"messages": [{"role": "user", "content": "q", "reasoning_content": "a user's: dropped"}, _assistant("a")]},
        {"messages": [_user("q"), _assistant("a", reasoning_content=None)]},
        {"messages": [_user("q"), _assistant([{"type": "text", "text": "in "}, {"type": "text", "text": "parts"}])]},
        {"messages": [_user("q"), {"role": "assistant", "content": "a", "name": "bot"}]},
        OrderedDict(messages=[_user("an ordered dict record"), _assistant("ok")]),
        {"messages": [OrderedDict(role="user", content="an ordered dict message"), _assistant("ok")]},
        {"messages": [{"role": _Text("user"), "content": _Text("subclassed strings")}, _assistant("ok")]},
        {"messages": [_user(long_turn), _assistant(long_turn[::-1], reasoning_content=long_turn[:500])]},
        {"messages": []},
        {"messages": [_assistant("only an answer")], "id": 7},
    ]  # fmt: skip


def test_a_batch_reads_the_same_messages_as_each_record_alone() -> None:
    records = _mixed_records()
    kept, turns = turns_of(records, "messages", lambda k: f"line {k + 1}")
    assert kept == list(range(len(records)))
    assert turns.conversations() == [messages_of(r, "messages", "w") for r in records]
    assert turns.counts.tolist() == [len(messages_of(r, "messages", "w")) for r in records]


def test_a_batch_of_only_common_records_is_read_without_one_by_one_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    """The common form never reaches messages_of (the point of reading a batch at a time)."""
    from tokformats.tokenization import chat

    def refuse(*args: Any) -> Any:
        raise AssertionError(f"read one by one: {args[0]!r:.60}")

    monkeypatch.setattr(chat, "messages_of", refuse)
    records = [{"messages": [_user(f"q{k}"), _assistant(f"a{k}", reasoning_content=f"t{k}")]} for k in range(5)]
    kept, turns = turns_of(records, "messages", str)
    assert kept == [0, 1, 2, 3, 4]
    assert turns.roles == ["user", "assistant"] * 5
    assert turns.contents == [x for k in range(5) for x in (f"q{k}", f"a{k}")]
    assert turns.thought_at.tolist() == [1, 3, 5, 7, 9] and turns.thoughts == [f"t{k}" for k in range(5)]


@pytest.mark.parametrize("schema", ["sharegpt", "alpaca", "callable"])
def test_the_other_schemas_read_a_batch_as_each_record_alone(schema: str) -> None:
    if schema == "sharegpt":
        records: list[Any] = [{"system": "s", "conversations": [{"from": "human", "value": "q"},
                                                                {"from": "gpt", "value": "a"}]},
                              {"conversations": [{"from": "observation", "value": "t"}]}]  # fmt: skip
        chat: Any = "sharegpt"
    elif schema == "alpaca":
        records = [{"instruction": "Sum.", "input": "1 2", "output": "3"}, {"instruction": "Hi", "output": "Hello"}]
        chat = "alpaca"
    else:
        records = [["q", "a"], ["x", "y"]]

        def chat(pair: list[str]) -> list[dict[str, str]]:
            return [_user(pair[0]), _assistant(pair[1])]

    kept, turns = turns_of(records, chat, str)
    assert kept == [0, 1]
    assert turns.conversations() == [messages_of(r, chat, "w") for r in records]


BAD = [
    ({"messages": [_user("x"), {"role": "bot", "content": "x"}]}, "'messages[1].role' is 'bot'"),
    ({"messages": [_user("x"), {"role": "user", "content": 3}]}, "'messages[1].content' should be a string"),
    ({"messages": [{"role": ["user"], "content": "x"}]}, "'messages[0].role' is ['user']"),
    ({"messages": [_user("x"), "not a message"]}, "'messages[1]' should be an object"),
    ({"messages": "hi"}, "'messages' should be a list"),
    ({"messages": (_user("a tuple"),)}, "'messages' should be a list"),
    ({"text": "x"}, "no field 'messages'"),
    (["a", "list"], "expected a JSON object"),
]


@pytest.mark.parametrize(("bad", "field"), BAD)
def test_a_bad_record_in_the_middle_of_a_batch_names_its_place_and_field(bad: Any, field: str) -> None:
    good = {"messages": [_user("q"), _assistant("a")]}
    records = [good, good, bad, good, bad]
    with pytest.raises(ChatError) as caught:
        turns_of(records, "messages", lambda k: f"chats.jsonl, line {k + 1}")
    assert str(caught.value).startswith("chats.jsonl, line 3: ") and field in str(caught.value)
    with pytest.raises(ChatError) as alone:
        messages_of(bad, "messages", "chats.jsonl, line 3")
    assert str(caught.value) == str(alone.value)
    skipped: list[str] = []
    kept, turns = turns_of(records, "messages", lambda k: f"line {k + 1}", lambda error: skipped.append(str(error)))
    assert kept == [0, 1, 3]
    assert [e.split(":")[0] for e in skipped] == ["line 3", "line 5"]
    assert turns.conversations() == [messages_of(good, "messages", "w")] * 3


def _same_turns(got: Turns, want: Turns) -> None:
    assert got.roles == want.roles and got.contents == want.contents and got.thoughts == want.thoughts
    for name in ("counts", "thought_at", "codes"):
        a, b = getattr(got, name), getattr(want, name)
        assert (a is None) == (b is None), name
        if a is not None:
            assert a.dtype == b.dtype and a.tolist() == b.tolist(), name


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 16, 100])
def test_a_batch_read_a_chunk_at_a_time_has_the_turns_read_at_once(chunk: int) -> None:
    """Chunks of common records only (gathered), of others, and mixed, in every order: the batch's turns."""
    common = [{"messages": [_user(f"q{k}"), _assistant(f"a{k}", reasoning_content=f"t{k}")]} for k in range(6)]
    common += [{"messages": []}, {"messages": [{"role": "tool", "content": "<|im_end|> spelled"}, _user("")]}]
    records = [*common, *_mixed_records(), *common[::-1]]
    reader = TurnsReader("messages")
    kept = []
    for first in range(0, len(records), chunk):
        kept += [first + k for k in reader.add(records[first : first + chunk], lambda k: f"line {k + 1}")]
    want_kept, want = turns_of(records, "messages", lambda k: f"line {k + 1}")
    assert kept == want_kept == list(range(len(records)))
    _same_turns(reader.turns(), want)
    assert reader.turns().conversations() == [messages_of(r, "messages", "w") for r in records]


def test_a_chunk_of_common_records_is_gathered_and_any_other_read_by_turns_of(monkeypatch: pytest.MonkeyPatch) -> None:
    from tokformats.tokenization import chat

    calls: list[int] = []

    def counting(values: Any, *args: Any) -> Any:
        calls.append(len(values))
        return turns_of(values, *args)

    monkeypatch.setattr(chat, "turns_of", counting)
    common = [{"messages": [_user("q"), _assistant("a", reasoning_content="t")]}] * 3
    for other in ([_user("q"), _assistant("a", reasoning_content=None)], [_user("q"), {"role": "bot", "content": "x"}],
                  [{"role": "user", "content": "q", "reasoning_content": "a user's"}], [_user(_Text("q"))],
                  [_assistant("a", name="bot")], [_user("q"), "not a message"]):  # fmt: skip
        calls.clear()
        reader = TurnsReader("messages")
        reader.add(common, str)
        kept = reader.add([*common, {"messages": other}], str, lambda error: None)  # a bad one skipped
        assert calls == [4], other  # the common chunk gathered, the other read as turns_of reads it
        assert reader.turns().conversations()[:-1] == [messages_of(common[0], "messages", "w")] * (2 + len(kept))
    sharegpt = TurnsReader("sharegpt")
    sharegpt.add([{"conversations": [{"from": "human", "value": "q"}]}], str)
    assert calls == [4, 1] and sharegpt.turns().roles == ["user"]
    assert TurnsReader("messages").turns().conversations() == []


def test_a_bad_record_in_a_later_chunk_names_its_place_or_is_skipped() -> None:
    good = {"messages": [_user("q"), _assistant("a")]}
    bad = {"messages": [_user("x"), {"role": "user", "content": 3}]}
    reader = TurnsReader("messages")
    assert reader.add([good, good], lambda k: f"line {k + 1}") == [0, 1]
    with pytest.raises(ChatError, match=r"^line 4: field 'messages\[1\].content'"):
        reader.add([good, bad, good], lambda k: f"line {k + 3}")
    skipped: list[str] = []
    reader = TurnsReader("messages")
    reader.add([good, good], str)
    assert reader.add([good, bad, good], lambda k: f"line {k + 3}", lambda e: skipped.append(str(e))) == [0, 2]
    assert [e.split(":")[0] for e in skipped] == ["line 4"]
    assert reader.turns().conversations() == [messages_of(good, "messages", "w")] * 4


def test_turns_cut_and_join_back() -> None:
    conversations = [messages_of(r, "messages", "w") for r in _mixed_records()]
    turns = Turns.of(conversations)
    for cut in (0, 1, 3, 7, len(conversations)):
        joined = Turns.joined([turns.part(0, cut), turns.part(cut, len(conversations))])
        assert joined.conversations() == conversations
        assert joined.thought_at.tolist() == turns.thought_at.tolist() and joined.thoughts == turns.thoughts
    assert Turns.joined([]).conversations() == [] and Turns.of([[], []]).conversations() == [[], []]


def _segment_by_segment(tokenizer: Any, conversation: list[Message], train_on: str, thought: str) -> Any:
    """The per-message route: every segment of one conversation encoded on its own (message text with specials as
    text, template text with specials recognised); its ids and mask."""
    engine = TokenizersEngine(tokenizer)
    ids: list[int] = []
    mask: list[int] = []
    for segment in ChatML().segments(conversation, train_on, thought):
        if segment.content:
            piece = engine.encode([segment.text], True)[0].tolist()
        else:
            piece = tokenizer.encode(segment.text, add_special_tokens=False).ids
        ids += piece
        mask += [int(segment.trained)] * len(piece)
    return ids, mask


@pytest.mark.parametrize("train_on", ["assistant", "all", "last"])
@pytest.mark.parametrize("thought", ["train", "mask"])
def test_a_batch_has_the_ids_and_masks_of_each_conversation_encoded_alone(
    tokenizer: Any, train_on: str, thought: str
) -> None:
    records = _mixed_records()
    records.append({"messages": [{"role": "tool", "content": "t"}, _assistant("a", reasoning_content="why")]})
    kept, turns = turns_of(records, "messages", str)
    assert kept == list(range(len(records)))
    engine = TokenizersEngine(tokenizer)
    encoder = ChatEncoder(tokenizer, ChatML(), train_on, thought)
    ids, lengths, mask, ends = encoder.encode_turns(turns, lambda t: engine.encode(t, True), np.dtype("<u4"))
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    for k, record in enumerate(records):
        conversation = messages_of(record, "messages", "w")
        want_ids, want_mask = _segment_by_segment(tokenizer, conversation, train_on, thought)
        assert ids[offsets[k] : offsets[k + 1]].tolist() == want_ids
        assert mask[offsets[k] : offsets[k + 1]].tolist() == want_mask
        last_trained = bool(conversation) and (train_on == "all" or conversation[-1].role == "assistant")
        assert bool(ends[k]) == last_trained


@pytest.mark.parametrize("before", [False, True])
@pytest.mark.parametrize("empty", [True, False])
@pytest.mark.parametrize("train_on", ["assistant", "last"])
def test_the_end_of_document_id_placed_with_the_batch_is_the_one_inserted_after_it(
    tokenizer: Any, before: bool, empty: bool, train_on: str
) -> None:
    """``encode_turns(eos=...)`` places the end id in its one pass: the same ids, lengths and mask as inserting it
    into the encoded batch, trained after a conversation whose last message is, never before one; an empty
    conversation gets it only with ``empty`` (Megatron adds none)."""
    records = [{"messages": []}, *_mixed_records(), {"messages": []}, {"messages": [_user("q")]}, {"messages": []}]
    _, turns = turns_of(records, "messages", str)
    engine = TokenizersEngine(tokenizer)
    encoder = ChatEncoder(tokenizer, ChatML(), train_on, "train")
    encode = lambda t: engine.encode(t, True)  # noqa: E731
    ids, lengths, mask, ends = encoder.encode_turns(turns, encode, np.dtype("<u4"))
    got_ids, got_lengths, got_mask, got_ends = encoder.encode_turns(
        turns, encode, np.dtype("<u4"), EndOfDocument(0, before=before, empty=empty)
    )
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    want_ids: list[int] = []
    want_mask: list[int] = []
    for k in range(len(records)):
        body, trained = ids[offsets[k] : offsets[k + 1]].tolist(), mask[offsets[k] : offsets[k + 1]].tolist()
        if not empty and not body:
            continue
        end = [0 if before else int(ends[k])]
        want_ids += [0, *body] if before else [*body, 0]
        want_mask += [0, *trained] if before else [*trained, *end]
    assert got_ids.tolist() == want_ids and got_mask.tolist() == want_mask
    assert got_lengths.tolist() == [n + int(empty or n > 0) for n in lengths.tolist()]
    assert got_ends.tolist() == ends.tolist() and got_mask.dtype == np.uint8 and got_ids.dtype == np.dtype("<u4")
    assert 0 in lengths.tolist() and got_mask.sum() > mask.sum() - (1 if before else 0)


def test_roles_read_with_the_batch_carry_their_codes_through_cuts_and_joins() -> None:
    records = [r for r in _mixed_records()[:10] if type(r) is dict]  # common ones and ones read one by one (str roles)
    _, turns = turns_of(records, "messages", str)
    assert turns.codes is not None and [ROLES[c] for c in turns.codes.tolist()] == turns.roles
    _, mixed = turns_of(_mixed_records(), "messages", str)  # a role that claims to be a str: no codes
    assert mixed.codes is None and mixed.conversations() == [messages_of(r, "messages", "w") for r in _mixed_records()]
    cut = Turns.joined([turns.part(0, 3), turns.part(3, len(records))])
    assert cut.codes is not None and cut.codes.tolist() == turns.codes.tolist()
    assert role_codes(["user", "narrator"]) is None and role_codes([_Text("user")]) is None
    other = Turns.of([[Message("narrator", "once")], [Message("user", "q")]])
    assert other.codes is None and Turns.joined([other, turns]).codes is None
    fast = ChatML().layout_turns(turns, "assistant", "train")
    slow = ChatML().layout_turns(turns._replace(codes=None), "assistant", "train")
    assert fast.sources.tolist() == slow.sources.tolist() and fast.templates == slow.templates


@pytest.mark.parametrize("train_on", ["assistant", "all", "last"])
def test_the_generic_batch_layout_of_turns_says_which_ends_are_trained(train_on: str) -> None:
    """A template without its own batch layout (the Jinja one) gets ``ends_trained`` from the turns."""
    conversations = [
        [Message("user", "q"), Message("assistant", "a")],
        [Message("user", "q")],
        [],
        [Message("assistant", "a"), Message("tool", "t")],
    ]

    class Generic(ChatML):
        layout_turns = ChatTemplate.layout_turns  # the default: from the segments
        layout = ChatTemplate.layout

    layout = Generic().layout_turns(Turns.of(conversations), train_on, "train")
    fast = ChatML().layout_turns(Turns.of(conversations), train_on, "train")
    expected = {"assistant": [True, False, False, False], "last": [True, False, False, False],
                "all": [True, True, False, True]}[train_on]  # fmt: skip
    assert layout.ends_trained is not None and layout.ends_trained.tolist() == expected
    assert fast.ends_trained is not None and fast.ends_trained.tolist() == expected


def test_a_file_with_bad_records_in_a_batch_names_their_lines_or_skips_them(
    tmp_path: Path, tokenizer_path: Path, tokenizer: Any
) -> None:
    good = [{"messages": [_user(f"q{k}"), _assistant(f"a{k}")]} for k in range(40)]
    bad = {20: {"messages": [_user("x"), {"role": "user", "content": 3}]}, 33: {"messages": "hi"}}
    records = [bad.get(k, r) for k, r in enumerate(good)]
    source = tmp_path / "chats.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    with pytest.raises(ChatError, match=r"chats.jsonl, line 21: field 'messages\[1\].content' should be a string"):
        tokformats.tokenize([source], tokenizer_path, tmp_path / "out", "datatrove", chat="messages", progress=False)
    summary = tokformats.tokenize([source], tokenizer_path, tmp_path / "out", "datatrove", chat="messages",
                                  on_error="skip", progress=False, overwrite=True)  # fmt: skip
    assert summary["documents"] == 38 and summary["skipped"] == 2
    assert ["line 21" in summary["errors"][0], "line 34" in summary["errors"][1]] == [True, True]
    kept = [r for k, r in enumerate(records) if k not in bad]
    engine = TokenizersEngine(tokenizer)
    encoder = ChatEncoder(tokenizer, ChatML(), "assistant", "train")
    conversations = [messages_of(r, "messages", "w") for r in kept]
    ids, lengths, mask, ends = encoder.encode(conversations, lambda t: engine.encode(t, True), np.dtype("<u4"))
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    with tokformats.open(tmp_path / "out.ds") as reader:
        assert len(reader) == 38
        for k in range(38):
            assert reader[k].tolist() == [*ids[offsets[k] : offsets[k + 1]].tolist(), 0]  # <|endoftext|> appended
            assert reader.loss_mask(k).tolist() == [*mask[offsets[k] : offsets[k + 1]].tolist(), int(ends[k])]


def test_the_copy_for_chat_message_text_is_made_once_per_tokenizer(tokenizer: Any) -> None:
    """Runs on the same tokenizer (the same to_str hash) share the copy that reads spelled specials as text; the
    caller's tokenizer keeps its own setting; another hash gets its own copy."""
    import hashlib

    digest = hashlib.sha256(tokenizer.to_str().encode("utf-8")).hexdigest()
    first, second = TokenizersEngine(tokenizer, digest), TokenizersEngine(tokenizer, digest)
    spelled = ["say <|im_end|> here"]
    assert first.encode(spelled, True)[0].tolist() == second.encode(spelled, True)[0].tolist()
    assert first._splitting is second._splitting and first._splitting is not tokenizer
    assert first._splitting.encode_special_tokens and not tokenizer.encode_special_tokens
    assert 3 not in first.encode(spelled, True)[0].tolist() and 3 in first.encode(spelled)[0].tolist()
    other = TokenizersEngine(tokenizer, "0" * 64)
    other.encode(spelled, True)
    assert other._splitting is not first._splitting
    alone = TokenizersEngine(tokenizer)
    alone.encode(spelled, True)
    assert alone._splitting is not first._splitting


def test_a_chatml_subclass_that_renders_or_lays_out_otherwise_is_used_as_written() -> None:
    from tokformats.tokenization.templates import ChatML, ChatTemplate, Layout, Segment

    conversations = [[Message("user", "q"), Message("assistant", "a")], [Message("user", "only")]]
    turns = Turns.of(conversations)

    class Prefixed(ChatML):  # its own segments: a preamble before every conversation
        def segments(self, messages: Any, train_on: str, thought: str) -> list[Segment]:
            return [Segment("PREAMBLE\n", False, False), *super().segments(messages, train_on, thought)]

    prefixed = Prefixed().layout_turns(turns, "assistant", "train")
    generic = ChatTemplate.layout(Prefixed(), conversations, "assistant", "train")
    assert "PREAMBLE\n" in prefixed.templates and prefixed.texts == generic.texts
    np.testing.assert_array_equal(prefixed.sources, generic.sources)
    np.testing.assert_array_equal(prefixed.trained, generic.trained)
    assert prefixed.ends_trained is not None and prefixed.ends_trained.tolist() == [True, False]

    plain = ChatML().layout_turns(turns, "assistant", "train")

    class OwnLayout(ChatML):  # its own batch layout: used, not bypassed
        def layout(self, conversations: Any, train_on: str, thought: str) -> Layout:
            return plain._replace(texts=[t.upper() for t in plain.texts])

    assert OwnLayout().layout_turns(turns, "assistant", "train").texts == ["Q", "A", "ONLY"]


def test_skips_read_ahead_are_counted_with_their_batch_across_a_resume(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tokenizer_path: Path
) -> None:
    """The reader thread reads and lays out chat batches ahead of the encoding, bad records included: their skips
    are counted when their batch is finished, so a run stopped after a checkpoint and resumed counts each once and
    writes what an uninterrupted run writes."""
    from tokformats.tokenization.partition_run import _PartitionRun

    records: list[Any] = [{"messages": [_user(f"q{k}"), _assistant(f"a{k} " * 20)]} for k in range(200)]
    for k in range(7, 200, 10):
        records[k] = {"messages": "not a list"}
    source = tmp_path / "chats.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    options: dict[str, Any] = {"chat": "messages", "on_error": "skip", "batch_size": 20, "progress": False}
    whole = tokformats.tokenize(source, tokenizer_path, tmp_path / "whole", "datatrove", **options)
    finish, finished = _PartitionRun.finish, []

    def stopping(self: Any, started: Any) -> None:
        if len(finished) == 4:
            raise KeyboardInterrupt  # after four batches and their checkpoints, with more read ahead
        finish(self, started)
        finished.append(started)

    monkeypatch.setattr(_PartitionRun, "finish", stopping)
    with pytest.raises(KeyboardInterrupt):
        tokformats.tokenize(source, tokenizer_path, tmp_path / "run", "datatrove", checkpoint_every=0, **options)
    monkeypatch.undo()
    resumed = tokformats.tokenize(source, tokenizer_path, tmp_path / "run", "datatrove", resume=True, **options)
    assert whole["skipped"] == resumed["skipped"] == 20 and resumed["documents"] == whole["documents"] == 180
    assert resumed["errors"] == whole["errors"]
    for suffix in ("", ".loss", ".index"):
        got, want = (Path(s["outputs"]["text"]["path"] + suffix) for s in (resumed, whole))
        assert got.read_bytes() == want.read_bytes(), suffix


@pytest.mark.parametrize("chunk", [2, 7, 10_000])
def test_a_run_reading_chat_records_in_chunks_writes_what_it_writes_read_whole(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tokenizer_path: Path, chunk: int
) -> None:
    """Chunks that cut batches anywhere (``CHAT_CHUNK`` 2 and 7 against batches of 20), bad records skipped in
    them, blank lines: the files, counts and errors of a run that reads each batch whole, and the records' parsed
    JSON is dropped once read."""
    from tokformats.tokenization.partition_run import _Preparing

    records: list[Any] = [r for r in _mixed_records() if type(r) is not OrderedDict and "subclassed" not in str(r)]
    records = [records[k % len(records)] for k in range(90)]
    for k in range(5, 90, 13):
        records[k] = {"messages": [_user("x"), {"role": "robot", "content": "x"}]}
    lines = [json.dumps(r, ensure_ascii=False) for r in records]
    lines[40:40] = ["", "{not json"]
    source = tmp_path / "chats.jsonl"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    options: dict[str, Any] = {"chat": "messages", "on_error": "skip", "batch_size": 20, "progress": False}
    monkeypatch.setattr("tokformats.tokenization.batching.CHAT_CHUNK", 10_000)
    whole = tokformats.tokenize(source, tokenizer_path, tmp_path / "whole", "datatrove", **options)
    monkeypatch.setattr("tokformats.tokenization.batching.CHAT_CHUNK", chunk)
    dropped: list[bool] = []
    add = _Preparing.add

    def checking(self: Any, batch: list[Any], *, last: bool = False) -> None:
        add(self, batch, last=last)
        if last or self.turns.gathering:  # every record read so far: its JSON dropped, the batch's end or not
            dropped.append((last, all(r.value is None for r in batch[: self.read])))

    monkeypatch.setattr(_Preparing, "add", checking)
    chunked = tokformats.tokenize(source, tokenizer_path, tmp_path / "chunked", "datatrove", **options)
    assert all(done for _, done in dropped)
    assert sum(last for last, _ in dropped) == 5  # 92 records: 4 batches of 20 and one of 12
    assert chunk != 2 or len(dropped) > 5  # chunks read (and dropped) before their batch's end
    assert chunked["documents"] == whole["documents"] == 83 and chunked["skipped"] == whole["skipped"] == 8
    assert chunked["errors"] == whole["errors"]
    for suffix in ("", ".loss", ".index"):
        got, want = (Path(s["outputs"]["text"]["path"] + suffix) for s in (chunked, whole))
        assert got.read_bytes() == want.read_bytes(), suffix


def _chat_file(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("chunk", [2, 7, 32, 10_000])
def test_a_batchs_bad_records_are_reported_alike_wherever_its_chunks_fall(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tokenizer_path: Path, chunk: int
) -> None:
    """A record that is not a conversation (line 5) before one that is not JSON (line 40), in one batch: reported
    as a batch read whole reports them (every JSON error first, then the others; the first of them raised), not
    in an order that depends on where the reader's chunks cut the batch."""
    from tokformats.tokenization.sources import SourceError

    lines = [json.dumps({"messages": [_user(f"q{k}"), _assistant("a")]}) for k in range(60)]
    lines[4] = json.dumps({"messages": [_user("x"), {"role": "robot", "content": "x"}]})
    lines[39] = "{not json"
    source = _chat_file(tmp_path / "chats.jsonl", lines)
    monkeypatch.setattr("tokformats.tokenization.batching.CHAT_CHUNK", chunk)
    options: dict[str, Any] = {"chat": "messages", "batch_size": 100, "progress": False}
    with pytest.raises(SourceError, match=r"chats\.jsonl, line 40: invalid JSON") as raised:
        tokformats.tokenize(source, tokenizer_path, tmp_path / "raised", "datatrove", **options)
    assert not isinstance(raised.value, ChatError)
    summary = tokformats.tokenize(source, tokenizer_path, tmp_path / "skipped", "datatrove", on_error="skip", **options)
    assert summary["documents"] == 58 and summary["skipped"] == 2
    assert [("line 40:" in e, "line 5:" in e) for e in summary["errors"]] == [(True, False), (False, True)]


def test_a_batch_is_read_whole_from_its_first_chunk_in_another_form_on(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tokenizer_path: Path
) -> None:
    """A tool call in each batch's first chunk: that chunk is read by ``turns_of`` and the rest of the batch in one
    more call at its end, not one call per chunk (each pays NumPy's fixed costs); the files are those of a run
    reading each batch whole."""
    from tokformats.tokenization import chat

    tool = {"messages": [_user("weather?"),
                         {"role": "assistant", "content": None,
                          "tool_calls": [{"type": "function", "function": {"name": "get", "arguments": "{}"}}]},
                         {"role": "tool", "content": "-3"}, _assistant("It is cold.")]}  # fmt: skip
    lines = [json.dumps(tool if k % 20 == 3 else {"messages": [_user(f"q{k}"), _assistant("a")]}) for k in range(100)]
    source = _chat_file(tmp_path / "chats.jsonl", lines)
    options: dict[str, Any] = {"chat": "messages", "batch_size": 20, "progress": False}
    monkeypatch.setattr("tokformats.tokenization.batching.CHAT_CHUNK", 10_000)
    whole = tokformats.tokenize(source, tokenizer_path, tmp_path / "whole", "datatrove", **options)
    calls: list[int] = []
    read = chat.turns_of

    def counting(values: Any, *args: Any) -> Any:
        calls.append(len(values))
        return read(values, *args)

    monkeypatch.setattr(chat, "turns_of", counting)
    monkeypatch.setattr("tokformats.tokenization.batching.CHAT_CHUNK", 4)
    chunked = tokformats.tokenize(source, tokenizer_path, tmp_path / "chunked", "datatrove", **options)
    assert calls == [4, 16] * 5
    assert chunked["documents"] == whole["documents"] == 100
    for suffix in ("", ".loss", ".index"):
        got, want = (Path(s["outputs"]["text"]["path"] + suffix) for s in (chunked, whole))
        assert got.read_bytes() == want.read_bytes(), suffix


def test_an_input_that_fails_later_in_a_batch_is_reported_before_the_batchs_bad_records(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tokenizer_path: Path
) -> None:
    """The reader's own failure (a ``.json`` that is not an array) after a bad record of the same batch: reported
    first, as when the batch is read whole, whatever the chunks."""
    from tokformats.tokenization.sources import SourceError

    good = json.dumps({"messages": [_user("q"), _assistant("a")]})
    first = _chat_file(tmp_path / "a.jsonl", ["{not json", *[good] * 10])
    broken = tmp_path / "b.json"
    broken.write_text('[{"messages": ')
    for chunk in (2, 10_000):
        monkeypatch.setattr("tokformats.tokenization.batching.CHAT_CHUNK", chunk)
        with pytest.raises(SourceError, match=r"b\.json") as raised:
            tokformats.tokenize([first, broken], tokenizer_path, tmp_path / f"out{chunk}", "datatrove",
                                chat="messages", batch_size=100, progress=False)  # fmt: skip
        assert "a.jsonl" not in str(raised.value)
