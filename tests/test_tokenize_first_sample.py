"""A run's start and end overlapped: the first sample is read ahead and encoded by the reference while the engine
is gated, and the last checkpoint reads the ids spool back while another thread fsyncs the spools. The documents
checked, the outputs and the read-back's refusal of a changed spool are as before."""

from __future__ import annotations

import json
import os
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tokformats
from tokformats.errors import FormatError
from tokformats.tokenization import engines
from tokformats.tokenization.encoder import WHOLE_INPUT_SAMPLED, Encoder, FirstSample
from tokformats.tokenization.engines import Engine, EngineMismatchError, TokenizersEngine
from tokformats.tokenization.sample_text import sample_texts
from tokformats.tokenization.spools import Spool


def _texts(count: int) -> list[str]:
    """Documents numbered (``doc N:``), about 1.2 kB each: the first MiB is about the first 860."""
    base = sample_texts(600)
    return [f"doc {k}: " + " ".join(base[(k + j) % 600] for j in range(6)) for k in range(count)]


def _corpus(tmp_path: Path, texts: list[str]) -> Path:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return corpus


class _Copy(Engine):
    """A fast engine that passes: tokenizers' ids, from the tokenizer itself (not through the reference)."""

    name = "copy"

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def encode(self, texts: list[str], split_special: bool = False) -> tuple[np.ndarray, np.ndarray]:
        ids = [e.ids for e in self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)]
        lengths = np.array([len(i) for i in ids], dtype=np.int64)
        return np.array([t for i in ids for t in i], dtype=np.uint32), lengths


def _recorded(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, str]]:
    """Each document (its number) the reference encodes, with the thread it is encoded in."""
    seen: list[tuple[int, str]] = []
    original = TokenizersEngine.encode

    def encode(self: TokenizersEngine, texts: list[str], split_special: bool = False) -> Any:
        name = threading.current_thread().name
        seen.extend((int(t.split(":", 1)[0][4:]), name) for t in texts if t.startswith("doc "))
        return original(self, texts, split_special)

    monkeypatch.setattr(TokenizersEngine, "encode", encode)
    return seen


def _damaged_after_flush(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each spool's ids changed by one bit once flushed, as by another writer after the last write, before the
    pin."""
    flush = Spool.flush

    def flush_then_damage(self: Spool) -> None:
        flush(self)
        with open(self.tokens_path, "r+b") as handle:
            handle.seek(2)
            byte = handle.read(1)
            handle.seek(2)
            handle.write(bytes([byte[0] ^ 1]))

    monkeypatch.setattr(Spool, "flush", flush_then_damage)


def test_the_first_sample_is_encoded_while_the_engine_is_selected_and_only_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tokenizer_path: Path
) -> None:
    texts = _texts(1200)
    corpus = _corpus(tmp_path, texts)
    reference = tokformats.tokenize(corpus, tokenizer_path, tmp_path / "ref", "megatron", engine="tokenizers",
                                    progress=False)  # fmt: skip
    seen = _recorded(monkeypatch)
    overlapped: list[bool] = []

    def choose(tokenizer: Any, engine: str = "auto", **gate: Any) -> tuple[Engine, str]:
        # Returns only once the reference has encoded the first sample in the read-ahead thread: the two overlap.
        for _ in range(1000):
            if any(name.startswith("tokformats-first-sample") for _, name in seen):
                overlapped.append(True)
                break
            threading.Event().wait(0.01)
        return _Copy(tokenizer), "a test engine"

    monkeypatch.setattr(engines, "select_engine", choose)
    summary = tokformats.tokenize(corpus, tokenizer_path, tmp_path / "run", "megatron", progress=False)
    assert overlapped == [True]
    assert summary["engine"] == "copy"
    first = [n for n, name in seen if name.startswith("tokformats-first-sample")]
    # The first sample: the documents within the first MiB of text.
    count = int(np.searchsorted(np.cumsum([len(t) for t in texts]), Encoder.FIRST_SAMPLE_BYTES, "right"))
    assert 700 < count < 1000
    assert first == list(range(count))
    numbers = [n for n, _ in seen]
    assert len(numbers) == len(set(numbers))  # no document encoded twice by the reference
    assert min(n for n, name in seen if name.startswith("tokformats-verify")) >= count  # only the draws after
    for suffix in (".bin", ".idx"):
        assert (tmp_path / f"run_text_document{suffix}").read_bytes() == (
            tmp_path / f"ref_text_document{suffix}"
        ).read_bytes()
    assert summary["tokens"] == reference["tokens"]


@pytest.mark.parametrize("source", ["iterable", "json-array", "txt-by-file"])
def test_inputs_whose_first_records_are_not_cheap_or_safe_to_reach_are_not_read_ahead(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tokenizer_path: Path, source: str
) -> None:
    """A generator can be read once, a ``.json`` may be one array, a ``.txt`` read by file has a whole file as its
    first document: the run reads them itself, its first sample is encoded in the verifier, the output as before."""
    texts = _texts(300)
    options: dict[str, Any] = {}
    if source == "iterable":
        inputs: Any = (t for t in texts)
    elif source == "json-array":
        inputs = tmp_path / "corpus.json"
        inputs.write_text(json.dumps([{"text": t} for t in texts]))
    else:
        inputs = tmp_path / "files"
        inputs.mkdir()
        for k, text in enumerate(texts):
            (inputs / f"{k:03d}.txt").write_text(text)
        options["unit"] = "file"
    listed = tokformats.tokenize(texts, tokenizer_path, tmp_path / "list", "megatron", progress=False)
    seen = _recorded(monkeypatch)
    monkeypatch.setattr(engines, "select_engine", lambda tokenizer, engine="auto", **gate: (_Copy(tokenizer), "test"))
    summary = tokformats.tokenize(inputs, tokenizer_path, tmp_path / "run", "megatron", progress=False, **options)
    assert summary["documents"] == listed["documents"] == 300
    assert (tmp_path / "run_text_document.bin").read_bytes() == (tmp_path / "list_text_document.bin").read_bytes()
    assert {name.split("_")[0] for _, name in seen} == {"tokformats-verify"}


def test_a_first_sample_read_ahead_that_is_not_the_runs_is_not_used(tokenizer_path: Path) -> None:
    """The read-ahead is a guess: other texts (a resumed or differently batched run) are encoded anew, and their
    wrong ids, were they used, would fail the check."""
    tokenizer = tokformats.tokenization.tokenizer.load_tokenizer(tokenizer_path)
    texts = _texts(20)
    guessed: Future[tuple[np.ndarray, np.ndarray]] = Future()
    guessed.set_result((np.zeros(3, np.uint32), np.array([3], np.int64)))  # ids no text of these has
    for ahead in ([texts[1]], [*texts[:5], "another"]):
        encoder = Encoder(tokenizer, "fastokens", 0.0, 0, 0, chosen=(_Copy(tokenizer), "a test"),
                                   first_sample=FirstSample(ahead, guessed))  # fmt: skip
        flat, _ = encoder.encode(texts, np.dtype(np.uint32), lambda k: f"doc {k}")
        assert flat.tolist() == TokenizersEngine(tokenizer).encode(texts)[0].tolist()
    # The same texts are taken: their (here wrong) ids are what the check compares.
    encoder = Encoder(tokenizer, "fastokens", 0.0, 0, 0, chosen=(_Copy(tokenizer), "a test"),
                               first_sample=FirstSample(texts, guessed))  # fmt: skip
    with pytest.raises(EngineMismatchError, match="copy gave other ids than tokenizers for doc 0"):
        encoder.encode(texts, np.dtype(np.uint32), lambda k: f"doc {k}")


def test_the_last_checkpoint_fsyncs_beside_the_read_back_which_still_refuses_a_changed_spool(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tokenizer_path: Path
) -> None:
    corpus = _corpus(tmp_path, _texts(400))
    synced_in: list[str] = []
    fsync = Spool.fsync

    def recording(self: Spool) -> None:
        synced_in.append(threading.current_thread().name)
        fsync(self)

    monkeypatch.setattr(Spool, "fsync", recording)
    tokformats.tokenize(corpus, tokenizer_path, tmp_path / "ok", "megatron", progress=False)
    assert synced_in and all(name.startswith("tokformats-sync") for name in synced_in)

    _damaged_after_flush(monkeypatch)
    with pytest.raises(FormatError, match=r"text\.tokens differs from what its checkpoint recorded"):
        tokformats.tokenize(corpus, tokenizer_path, tmp_path / "bad", "megatron", progress=False)
    assert not any(p.name.startswith("bad_text_document") for p in tmp_path.iterdir())
    assert not any(name.startswith("tokformats-sync") for name in (t.name for t in threading.enumerate()))
    assert os.path.isdir(tmp_path / "bad.tokenize")  # kept for a resume, as after any failed run


def test_a_read_back_refused_while_the_fsync_failed_too_says_both(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tokenizer_path: Path
) -> None:
    """The read-back's refusal is raised (nothing committed), with the fsync's own failure noted, not lost."""
    corpus = _corpus(tmp_path, _texts(400))
    def failing(self: Spool) -> None:
        raise OSError(5, "Input/output error")

    _damaged_after_flush(monkeypatch)
    monkeypatch.setattr(Spool, "fsync", failing)
    with pytest.raises(FormatError, match="differs from what its checkpoint recorded") as raised:
        tokformats.tokenize(corpus, tokenizer_path, tmp_path / "bad", "megatron", progress=False)
    assert any("fsync failed too" in note and "Input/output error" in note for note in raised.value.__notes__)
    assert not any(p.name.startswith("bad_text_document") for p in tmp_path.iterdir())


def test_a_first_batch_of_more_text_than_the_read_ahead_keeps_is_left_to_the_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tokenizer_path: Path
) -> None:
    """A huge first document is not held twice: no read-ahead, the first sample checked in the run, the same
    output."""
    texts = _texts(300)
    corpus = _corpus(tmp_path, texts)
    tokformats.tokenize(texts, tokenizer_path, tmp_path / "list", "megatron", progress=False)
    monkeypatch.setattr("tokformats.tokenization.pipeline._FIRST_SAMPLE_READ_AHEAD", len(texts[0]) - 1)
    seen = _recorded(monkeypatch)
    monkeypatch.setattr(engines, "select_engine", lambda tokenizer, engine="auto", **gate: (_Copy(tokenizer), "test"))
    tokformats.tokenize(corpus, tokenizer_path, tmp_path / "run", "megatron", progress=False)
    assert seen and {name.split("_")[0] for _, name in seen} == {"tokformats-verify"}
    assert (tmp_path / "run_text_document.bin").read_bytes() == (tmp_path / "list_text_document.bin").read_bytes()


def test_an_input_all_in_its_first_sample_runs_on_tokenizers_under_auto(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tokenizer_path: Path
) -> None:
    """Every id a faster engine would give such an input is re-encoded by the reference to check it, so ``auto``
    neither loads nor gates one: the reference encodes the input once, in the read-ahead, and the output is the
    same. Named explicitly, the engine still runs; one document past the first batch, auto asks for it."""
    texts = _texts(40)
    corpus = _corpus(tmp_path, texts)
    reference = tokformats.tokenize(corpus, tokenizer_path, tmp_path / "ref", "megatron", engine="tokenizers",
                                    progress=False)  # fmt: skip
    asked: list[str] = []

    def choose(tokenizer: Any, engine: str = "auto", **gate: Any) -> tuple[Engine, str]:
        asked.append(engine)
        return _Copy(tokenizer), "a test engine"

    monkeypatch.setattr(engines, "select_engine", choose)
    seen = _recorded(monkeypatch)
    summary = tokformats.tokenize(corpus, tokenizer_path, tmp_path / "auto", "megatron", progress=False)
    assert asked == []
    assert (summary["engine"], summary["engine_reason"]) == ("tokenizers", WHOLE_INPUT_SAMPLED)
    assert sorted(n for n, _ in seen) == list(range(40))  # each document encoded once, by the read-ahead
    assert {name.split("_")[0] for _, name in seen} == {"tokformats-first-sample"}
    for name in ("auto", "named", "past"):
        if name == "named":
            summary = tokformats.tokenize(corpus, tokenizer_path, tmp_path / name, "megatron", engine="fastokens",
                                          progress=False)  # fmt: skip
        elif name == "past":  # batches of 39 documents: the 40th is past the first
            summary = tokformats.tokenize(corpus, tokenizer_path, tmp_path / name, "megatron", batch_size=39,
                                          progress=False)  # fmt: skip
        assert summary["tokens"] == reference["tokens"]
        for suffix in (".bin", ".idx"):
            assert (tmp_path / f"{name}_text_document{suffix}").read_bytes() == (
                tmp_path / f"ref_text_document{suffix}"
            ).read_bytes()
    assert asked == ["fastokens", "auto"]
    assert summary["engine"] == "copy"
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    summary = tokformats.tokenize(empty, tokenizer_path, tmp_path / "empty", "megatron", progress=False)
    assert (summary["engine"], summary["engine_reason"], summary["documents"]) == ("tokenizers", WHOLE_INPUT_SAMPLED, 0)
    assert asked == ["fastokens", "auto"]  # no engine asked for an input with no text
