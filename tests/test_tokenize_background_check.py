"""The engine's check against ``tokenizers`` runs in a thread of its own while the engine encodes: the same documents
are checked as when it ran in line, and a difference it finds still stops the run before anything is committed."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tokformats
from tokformats.errors import ConfigError
from tokformats.tokenization import engines, partition_run
from tokformats.tokenization.encoder import Encoder
from tokformats.tokenization.engines import Engine, EngineMismatchError, TokenizersEngine
from tokformats.tokenization.partition_run import _PartitionRun
from tokformats.tokenization.sample_text import sample_texts


def _numbered(count: int) -> list[str]:
    """Documents numbered (``doc N:``) so that a text tells its place; about 1.4 kB each."""
    base = sample_texts(600)
    return [f"doc {k}: " + " ".join(base[(k + j) % 600] for j in range(6)) for k in range(count)]


def _number(text: str) -> int:
    return int(text.split(":", 1)[0][4:])


class _Recording(TokenizersEngine):
    """The reference, recording each text it encodes and the thread it encodes it in."""

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        self.seen: list[tuple[str, str]] = []

    def encode(self, texts: list[str], split_special: bool = False) -> tuple[np.ndarray, np.ndarray]:
        self.seen.extend((t, threading.current_thread().name) for t in texts)
        return super().encode(texts, split_special)


class _Wrong(Engine):
    """tokenizers' ids, except one id changed in each document whose number is in ``wrong``."""

    name = "wrong-late"

    def __init__(self, tokenizer: Any, wrong: set[int]) -> None:
        self.reference = TokenizersEngine(tokenizer)
        self.wrong = wrong

    def encode(self, texts: list[str], split_special: bool = False) -> tuple[np.ndarray, np.ndarray]:
        flat, lengths = self.reference.encode(texts)
        flat, ends = flat.copy(), np.cumsum(lengths)
        for k, text in enumerate(texts):
            if text.startswith("doc ") and _number(text) in self.wrong and lengths[k]:
                flat[ends[k] - 1] += 1
        return flat, lengths


def _checked_numbers(tokenizer_path: Path, texts: list[str], verifier: ThreadPoolExecutor | None) -> list[int]:
    """The documents an encoder (seed 7) re-encodes with the reference over ``texts`` in batches of 100, with the
    reference in ``verifier`` or in line."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    encoder = Encoder(tokenizer, "fastokens", 0.05, seed=7, partition=0,
                               chosen=(_Wrong(tokenizer, set()), "a test engine"), verify_bytes=96 << 10)  # fmt: skip
    recording = _Recording(tokenizer)
    encoder.reference = recording
    encoder.verifier = verifier
    for start in range(0, len(texts), 100):
        batch = texts[start : start + 100]
        flat, lengths = encoder.encode(batch, np.dtype(np.uint16), lambda k: f"doc {k}")
        assert int(lengths.sum()) == len(flat) and len(lengths) == len(batch)
    encoder.settle()
    threads = {thread for _, thread in recording.seen}
    assert threads == ({threading.current_thread().name} if verifier is None else {"tokformats-verify_0"})
    return [_number(t) for t, _ in recording.seen]


def test_the_background_check_verifies_the_same_documents_as_the_check_in_line(tokenizer_path: Path) -> None:
    texts = _numbered(2000)
    in_line = _checked_numbers(tokenizer_path, texts, None)
    with ThreadPoolExecutor(1, thread_name_prefix="tokformats-verify") as verifier:
        background = _checked_numbers(tokenizer_path, texts, verifier)
    assert background == in_line
    first = [n for n in in_line if sum(map(len, texts[:n])) < Encoder.FIRST_SAMPLE_BYTES]
    assert first == list(range(len(first))) and len(first) > 500  # the first MiB, in order
    drawn = in_line[len(first) :]
    assert len(drawn) > 20 and max(drawn) > 1700  # then the draws, spread to the end of the input


def _corpus(tmp_path: Path, texts: list[str]) -> Path:
    corpus = tmp_path / "late.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return corpus


def _choose_wrong(monkeypatch: pytest.MonkeyPatch, wrong: set[int]) -> None:
    def choose(tokenizer: Any, engine: str = "auto", **gate: Any) -> tuple[Engine, str]:
        if engine == "tokenizers":
            return TokenizersEngine(tokenizer), "asked for"
        return _Wrong(tokenizer, wrong), "a test engine"

    monkeypatch.setattr(engines, "select_engine", choose)


@pytest.mark.parametrize("checkpoint_every", [0.0, 3600.0])
def test_a_difference_the_background_check_finds_raises_before_any_commit(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tokenizer_path: Path, checkpoint_every: float
) -> None:
    texts = _numbered(2000)
    corpus = _corpus(tmp_path, texts)
    late = 1900  # past the first MiB: compared in the background, after later batches were encoded
    _choose_wrong(monkeypatch, {late})
    checked_in: list[str] = []
    original = TokenizersEngine.encode

    def encode(self: TokenizersEngine, batch: list[str], split_special: bool = False) -> Any:
        if any(t.startswith(f"doc {late}:") for t in batch):
            checked_in.append(threading.current_thread().name)
        return original(self, batch, split_special)

    monkeypatch.setattr(TokenizersEngine, "encode", encode)
    # Every document drawn after the first MiB: the wrong one is checked, in the verifier's thread.
    named = rf"wrong-late gave other ids than tokenizers for .*late\.jsonl, record {late + 1} \('doc {late}: "
    with pytest.raises(EngineMismatchError, match=named + r".*nothing wrong was written.*engine='tokenizers'"):
        tokformats.tokenize(corpus, tokenizer_path, tmp_path / "out", "megatron", progress=False, batch_size=100,
                            verify_fraction=1.0, verify_bytes=None, checkpoint_every=checkpoint_every)  # fmt: skip
    # (the test engine's own ids come from tokenizers too, in the main thread)
    assert checked_in.count("tokformats-verify_0") == 1
    assert not list(tmp_path.glob("out*.bin")) and not list(tmp_path.glob("out*.idx"))
    checkpoint = tmp_path / "out.tokenize" / "part-0000" / "checkpoint.json"
    if checkpoint_every:  # no checkpoint before the end: the final one was refused
        assert not checkpoint.exists()
    else:  # one after every batch: the last committed ends before the wrong document's batch
        state = json.loads(checkpoint.read_text())
        assert not state["done"] and state["spools"]["text"]["documents"] <= late - late % 100
    # Resumed with the reference, the output is the reference's.
    monkeypatch.setattr(TokenizersEngine, "encode", original)
    summary = tokformats.tokenize(corpus, tokenizer_path, tmp_path / "out", "megatron", progress=False,
                                  batch_size=100, resume=True, engine="tokenizers")  # fmt: skip
    reference = tokformats.tokenize(corpus, tokenizer_path, tmp_path / "ref", "megatron", progress=False,
                                    engine="tokenizers")  # fmt: skip
    assert summary["documents"] == reference["documents"] == len(texts)
    for suffix in (".bin", ".idx"):
        ours, theirs = tmp_path / f"out_text_document{suffix}", tmp_path / f"ref_text_document{suffix}"
        assert ours.read_bytes() == theirs.read_bytes(), suffix


def _same_as_tokenizers(tmp_path: Path, corpus: Path, tokenizer_path: Path) -> None:
    """The run written to ``tmp_path / "out"`` equals a ``tokenizers`` run's Megatron files, byte for byte."""
    tokformats.tokenize(corpus, tokenizer_path, tmp_path / "ref", "megatron", progress=False, engine="tokenizers")
    for suffix in (".bin", ".idx"):
        ours, theirs = tmp_path / f"out_text_document{suffix}", tmp_path / f"ref_text_document{suffix}"
        assert ours.read_bytes() == theirs.read_bytes(), suffix


def test_a_run_whose_checks_pass_is_identical_to_the_reference_and_leaves_no_verifier(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tokenizer_path: Path
) -> None:
    texts = _numbered(1500)
    corpus = _corpus(tmp_path, texts)
    _choose_wrong(monkeypatch, set())
    summary = tokformats.tokenize(corpus, tokenizer_path, tmp_path / "out", "megatron", progress=False,
                                  batch_size=100, verify_fraction=1.0, verify_bytes=None)  # fmt: skip
    assert summary["engine"] == "wrong-late" and summary["documents"] == len(texts)
    _same_as_tokenizers(tmp_path, corpus, tokenizer_path)
    assert not [t.name for t in threading.enumerate() if t.name.startswith("tokformats-verify")]


def _explicit_encoder(tokenizer_path: Path, wrong: set[int]) -> Encoder:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    return Encoder(tokenizer, "fastokens", 1.0, seed=0, partition=0,
                            chosen=(_Wrong(tokenizer, wrong), "a test engine"), verify_bytes=None)  # fmt: skip


def test_outstanding_checks_are_bounded_by_their_text_and_all_compared_by_settle(
    monkeypatch: pytest.MonkeyPatch, tokenizer_path: Path
) -> None:
    texts = _numbered(400)
    batches = [texts[k : k + 100] for k in range(0, 400, 100)]
    with ThreadPoolExecutor(1, thread_name_prefix="tokformats-verify") as verifier:
        # No outstanding text allowed: the encoder waits for each batch's check, so the wrong batch raises at once.
        monkeypatch.setattr(Encoder, "PENDING_TEXT", 0)
        encoder = _explicit_encoder(tokenizer_path, {250})
        encoder.verifier = verifier
        for batch in batches[:2]:
            encoder.encode(batch, np.dtype(np.uint16), lambda k: f"doc {k}")
        with pytest.raises(EngineMismatchError, match=r"for doc 50 \('doc 250: "):
            encoder.encode(batches[2], np.dtype(np.uint16), lambda k: f"doc {k}")
        # The default bound: the wrong batch's check may still be outstanding after later batches; settle() finds it.
        monkeypatch.undo()
        encoder = _explicit_encoder(tokenizer_path, {250})
        encoder.verifier = verifier
        try:
            for batch in batches:
                encoder.encode(batch, np.dtype(np.uint16), lambda k: f"doc {k}")
        except EngineMismatchError as error:  # compared at a later batch, once its reference ids were in
            assert "('doc 250: " in str(error)
        else:
            with pytest.raises(EngineMismatchError, match=r"for doc 50 \('doc 250: "):
                encoder.settle()


def test_an_engine_the_gate_refuses_is_raised_before_any_work_is_left(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tokenizer_path: Path
) -> None:
    """The engine is selected before the run's work folder is filled: a refusal leaves no output and no work
    folder, and a run with another engine then starts afresh (also from an empty input)."""
    corpus = tmp_path / "numbered.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in _numbered(50)))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")

    def refusing(tokenizer: Any, engine: str = "auto", **gate: Any) -> tuple[Engine, str]:
        raise ConfigError("engine 'fastokens' refuses this tokenizer: a test")

    for source, name in ((corpus, "out-refused"), (empty, "out-empty")):
        with monkeypatch.context() as patched:
            patched.setattr(engines, "select_engine", refusing)
            with pytest.raises(ConfigError, match="refuses this tokenizer: a test"):
                tokformats.tokenize(source, tokenizer_path, tmp_path / name, "megatron", engine="fastokens",
                                    progress=False)  # fmt: skip
        assert sorted(p.name for p in tmp_path.glob(f"{name}*")) == []
        summary = tokformats.tokenize(source, tokenizer_path, tmp_path / name, "megatron", engine="tokenizers",
                                      progress=False)  # fmt: skip
        assert summary["documents"] == (50 if source == corpus else 0)


class _FirstWrong(Engine):
    """tokenizers' ids (from the tokenizer itself, not through the reference engine), one changed in document 0."""

    name = "first-wrong"

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def encode(self, texts: list[str], split_special: bool = False) -> tuple[np.ndarray, np.ndarray]:
        ids = [e.ids for e in self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)]
        lengths = np.array([len(i) for i in ids], dtype=np.int64)
        flat = np.array([t for i in ids for t in i], dtype=np.uint32)
        if texts and texts[0].startswith("doc 0:"):
            flat[0] += 1
        return flat, lengths


@pytest.mark.parametrize("selected", ["tokenizers", "first-wrong"])
def test_the_first_sample_is_encoded_once_when_tokenizers_encodes_the_batch(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tokenizer_path: Path, selected: str
) -> None:
    texts = _numbered(1000)  # about 1.4 MB: the first batch (1 MiB) is the first sample and the document after it
    corpus = tmp_path / "numbered.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    reference = tokformats.tokenize(corpus, tokenizer_path, tmp_path / "ref", "megatron", engine="tokenizers",
                                    progress=False)  # fmt: skip
    encoded: list[int] = []
    original = TokenizersEngine.encode

    def encode(self: TokenizersEngine, batch: list[str], split_special: bool = False) -> Any:
        encoded.extend(_number(t) for t in batch)
        return original(self, batch, split_special)

    def choose(tokenizer: Any, engine: str = "auto", **gate: Any) -> tuple[Engine, str]:
        if selected == "tokenizers":  # the selection found no engine that passes: tokenizers encodes the run
            return TokenizersEngine(tokenizer), "no fast engine (a test)"
        return _FirstWrong(tokenizer), "a test engine"  # differs in the first sample: auto falls back

    monkeypatch.setattr(engines, "select_engine", choose)
    monkeypatch.setattr(TokenizersEngine, "encode", encode)
    summary = tokformats.tokenize(corpus, tokenizer_path, tmp_path / "run", "megatron", progress=False)
    assert summary["engine"] == "tokenizers"
    assert sorted(encoded) == list(range(1000))  # each document once: the sample's ids were taken, not redone
    for suffix in (".bin", ".idx"):
        got, want = (Path(s["outputs"]["text"]["path"] + suffix) for s in (summary, reference))
        assert got.read_bytes() == want.read_bytes()


def test_the_engine_encodes_each_batch_while_the_one_before_is_finished(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tokenizer_path: Path
) -> None:
    """A run starts batches k + 1 and k + 2 (the engine encodes them in its own thread, one after the other) before
    it finishes batch k (its ids into the spools), so the engine has the next batch queued whenever it is done: the
    output is the reference's, and no encoding thread outlives the run."""
    texts = _numbered(450)
    corpus = _corpus(tmp_path, texts)
    _choose_wrong(monkeypatch, set())
    events: list[str] = []
    threads: set[str] = set()
    start, finish, encode = _PartitionRun.start, _PartitionRun.finish, _Wrong.encode

    def started(self: Any, batch: Any, prepared: Any = None) -> Any:
        events.append(f"start {batch[0].index // 100}")
        return start(self, batch, prepared)

    def finished(self: Any, batch: Any) -> None:
        events.append(f"finish {batch.batch[0].index // 100}")
        finish(self, batch)

    def encoded(self: Any, batch: list[str], split_special: bool = False) -> Any:
        threads.add(threading.current_thread().name)
        return encode(self, batch, split_special)

    monkeypatch.setattr(_PartitionRun, "start", started)
    monkeypatch.setattr(_PartitionRun, "finish", finished)
    monkeypatch.setattr(_Wrong, "encode", encoded)
    summary = tokformats.tokenize(corpus, tokenizer_path, tmp_path / "out", "megatron", progress=False, batch_size=100)
    assert partition_run.ENCODE_AHEAD == 2
    assert events == ["start 0", "start 1", "start 2", "finish 0", "start 3", "finish 1", "start 4", "finish 2",
                      "finish 3", "finish 4"]  # fmt: skip
    assert threads == {"tokformats-encode_0"}
    assert summary["engine"] == "wrong-late" and summary["documents"] == len(texts)
    _same_as_tokenizers(tmp_path, corpus, tokenizer_path)
    assert not [t.name for t in threading.enumerate() if t.name.startswith("tokformats-encode")]


def test_the_batches_started_before_the_first_one_fell_back_are_encoded_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tokenizer_path: Path
) -> None:
    """Under ``auto``, the engine differs in every document: the run falls back on tokenizers at the first batch's
    check, after the engine was given the two batches behind it (:data:`ENCODE_AHEAD`); those are encoded again by
    tokenizers, every later batch by tokenizers alone, and the output is a tokenizers run's."""
    texts = _numbered(450)
    corpus = _corpus(tmp_path, texts)
    _choose_wrong(monkeypatch, set(range(450)))
    by_engine: list[int] = []
    encode = _Wrong.encode

    def encoded(self: Any, batch: list[str], split_special: bool = False) -> Any:
        by_engine.extend(_number(t) for t in batch)
        return encode(self, batch, split_special)

    monkeypatch.setattr(_Wrong, "encode", encoded)
    summary = tokformats.tokenize(corpus, tokenizer_path, tmp_path / "out", "megatron", progress=False, batch_size=100)
    assert summary["engine"] == "tokenizers" and summary["documents"] == len(texts)
    assert sorted(by_engine) == list(range(300))  # batches 0, 1 and 2: started before batch 0 was finished
    _same_as_tokenizers(tmp_path, corpus, tokenizer_path)


def test_a_chat_batch_started_before_the_first_one_fell_back_is_encoded_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tokenizer_path: Path
) -> None:
    """Under ``auto``, the engine differs in every message of a chat run: the run falls back on tokenizers at the
    first batch, and the batch the engine had encoded meanwhile is encoded again by it (ids and masks as a
    tokenizers run's)."""
    texts = _numbered(300)
    corpus = tmp_path / "chats.jsonl"
    chats = [[{"role": "user", "content": texts[k]}, {"role": "assistant", "content": texts[k + 1]}]
             for k in range(0, 300, 2)]  # fmt: skip
    corpus.write_text("".join(json.dumps({"messages": m}) + "\n" for m in chats))
    _choose_wrong(monkeypatch, set(range(300)))
    summary = tokformats.tokenize(corpus, tokenizer_path, tmp_path / "run", "datatrove", chat="messages",
                                  batch_size=20, progress=False)  # fmt: skip
    reference = tokformats.tokenize(corpus, tokenizer_path, tmp_path / "ref", "datatrove", chat="messages",
                                    engine="tokenizers", progress=False)  # fmt: skip
    assert summary["engine"] == "tokenizers" and summary["documents"] == len(chats)
    for suffix in ("", ".loss", ".index"):
        got, want = (Path(s["outputs"]["text"]["path"] + suffix) for s in (summary, reference))
        assert got.read_bytes() == want.read_bytes(), suffix


class _Crashing(_Wrong):
    """tokenizers' ids, but it fails on the batch holding document 150."""

    name = "crashing"

    def encode(self, texts: list[str], split_special: bool = False) -> tuple[np.ndarray, np.ndarray]:
        if any(t.startswith("doc 150:") for t in texts):
            raise RuntimeError("the engine crashed on doc 150")
        return self.reference.encode(texts, split_special)


@pytest.mark.parametrize("chat", [None, "messages"])
def test_a_batch_fails_before_a_bad_record_the_reader_found_after_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tokenizer_path: Path, chat: str | None
) -> None:
    """The engine fails on batch 1 while batch 2 (read ahead, started or read into turns before batch 1 is finished)
    holds a bad record: the engine's error is raised, as in a run that takes one batch at a time."""
    texts = _numbered(300)
    lines = [json.dumps({"messages": [{"role": "user", "content": t}]} if chat else {"text": t}) for t in texts]
    lines[250] = "{not json"
    corpus = tmp_path / "in.jsonl"
    corpus.write_text("".join(line + "\n" for line in lines))
    monkeypatch.setattr(engines, "select_engine", lambda tokenizer, engine="auto", **gate: (
        _Crashing(tokenizer, set()), "a test engine"))  # fmt: skip
    with pytest.raises(RuntimeError, match="crashed on doc 150"):
        tokformats.tokenize(corpus, tokenizer_path, tmp_path / "out", "datatrove", chat=chat, batch_size=100,
                            progress=False)  # fmt: skip
    assert not [t.name for t in threading.enumerate() if t.name.startswith("tokformats-") or "_batches" in t.name]
