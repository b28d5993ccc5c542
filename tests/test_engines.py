"""Encoding engines: the identity gate, the fallback, the explicit refusal, checking during the run, byte-identical
outputs whichever engine runs (every corpus format), and resuming after an engine switch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tokformats
from tokformats.api import corpus_writers
from tokformats.tokenization import engines
from tokformats.tokenization.encoder import Encoder
from tokformats.tokenization.engines import (
    Engine,
    EngineError,
    EngineMismatchError,
    TokenizersEngine,
    adversarial_texts,
    first_difference,
    select_engine,
)
from tokformats.tokenization.parallel import _WORKER_ENGINES
from tokformats.tokenization.sample_text import sample_texts


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _tokenizer(path: Path) -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path))


def _corpus(tmp_path: Path, count: int = 400) -> Path:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in sample_texts(count)))
    return corpus


class Lying(Engine):
    """tokenizers' ids, except for texts containing ``marker``: one id changed."""

    name = "lying"

    def __init__(self, tokenizer: Any, marker: str) -> None:
        self.reference = TokenizersEngine(tokenizer)
        self.marker = marker

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        flat, lengths = self.reference.encode(texts)
        flat = flat.copy()
        ends = np.cumsum(lengths)
        for k, text in enumerate(texts):
            if self.marker in text and lengths[k]:
                flat[ends[k] - 1] += 1
        return flat, lengths


def _lying(monkeypatch: pytest.MonkeyPatch, marker: str) -> None:
    def choose(tokenizer: Any, engine: str = "auto", **gate: Any) -> tuple[Engine, str]:
        if engine == "tokenizers":
            return TokenizersEngine(tokenizer), "asked for"
        return Lying(tokenizer, marker), "a test engine"

    monkeypatch.setattr(engines, "select_engine", choose)


def test_tokenizers_engine_is_the_reference(tokenizer_path: Path) -> None:
    tokenizer = _tokenizer(tokenizer_path)
    texts = adversarial_texts(tokenizer)
    flat, lengths = TokenizersEngine(tokenizer).encode(texts)
    assert flat.dtype == np.uint32 and lengths.sum() == len(flat)
    assert [tokenizer.encode(t, add_special_tokens=False).ids for t in texts] == [
        flat[e - n : e].tolist() for e, n in zip(np.cumsum(lengths), lengths)
    ]
    assert first_difference(TokenizersEngine(tokenizer), Lying(tokenizer, "family"), texts) == next(
        k for k, t in enumerate(texts) if "family" in t
    )


def test_auto_prefers_for_chat_text_the_engines_that_split_specials_themselves(
    monkeypatch: pytest.MonkeyPatch, tokenizer_path: Path
) -> None:
    """A chat run encodes message text with special tokens split as text, which splintr hands to tokenizers: auto
    puts it last there (nothing left to time), however fast it is on plain text."""
    pytest.importorskip("fastokens")
    pytest.importorskip("splintr")
    from tokformats.tokenization import engines

    timed: list[list[str]] = []

    def rates(built: list[Engine], texts: list[str]) -> dict[int, float]:
        timed.append([e.name for e in built])
        return {id(e): {"fastokens": 1.0, "splintr": 2.0}[e.name] for e in built}

    monkeypatch.setattr(engines, "_rates", rates)
    tokenizer = _tokenizer(tokenizer_path)
    assert select_engine(tokenizer, "auto", chat=False)[0].name == "splintr"
    assert select_engine(tokenizer, "auto", chat=True)[0].name == "fastokens"
    assert timed == [["fastokens", "splintr"]]  # one engine first for chat text: nothing to time
    assert not engines.SplintrEngine.splits_specials and engines.FastokensEngine.splits_specials


def test_a_chat_run_asks_auto_for_the_engine_of_chat_text(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                         tokenizer_path: Path) -> None:  # fmt: skip
    asked: list[dict[str, Any]] = []

    def choose(tokenizer: Any, engine: str = "auto", **gate: Any) -> tuple[Engine, str]:
        asked.append(gate)
        return TokenizersEngine(tokenizer), "a test choice"

    monkeypatch.setattr(engines, "select_engine", choose)
    chats = tmp_path / "chats.jsonl"
    turns = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]
    chats.write_text(json.dumps({"messages": turns}) + "\n")
    # Batches of 100: the text run's input is more than its first sample, so auto asks for an engine.
    tokformats.tokenize(_corpus(tmp_path), tokenizer_path, tmp_path / "text", "datatrove", batch_size=100,
                        progress=False)  # fmt: skip
    tokformats.tokenize(chats, tokenizer_path, tmp_path / "chat", "datatrove", chat="messages", progress=False)
    assert [gate["chat"] for gate in asked] == [False, True]


def test_unknown_engine_is_refused(tokenizer_path: Path) -> None:
    with pytest.raises(tokformats.ConfigError, match="engine must be one of auto, tokenizers, fastokens, splintr"):
        select_engine(_tokenizer(tokenizer_path), "fast")


def test_an_unknown_engine_is_refused_before_a_parallel_run_starts(tmp_path: Path, tokenizer_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool, pytest.raises(tokformats.ConfigError, match="found engine='fatsokens'"):
        tokformats.tokenize(_corpus(tmp_path), tokenizer_path, tmp_path / "o", "raw", engine="fatsokens",
                            executor=pool, progress=False)  # fmt: skip
    assert not (tmp_path / "o.tokenize").exists()


def test_fastokens_missing(monkeypatch: pytest.MonkeyPatch, tokenizer_path: Path) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "fastokens", None)  # import fastokens raises ImportError
    monkeypatch.setitem(sys.modules, "splintr", None)
    engine, reason = select_engine(_tokenizer(tokenizer_path), "auto")
    assert engine.name == "tokenizers" and "pip install 'tokformats[fast]'" in reason
    for name in ("fastokens", "splintr"):
        with pytest.raises(EngineError, match=rf"'{name}' is not installed: pip install 'tokformats\[fast\]'"):
            select_engine(_tokenizer(tokenizer_path), name)


def test_gate_passes_byte_level_bpe_and_own_tokenizers(tokenizer_path: Path, fixtures: Path) -> None:
    pytest.importorskip("fastokens")
    pytest.importorskip("splintr")
    for path in (tokenizer_path, fixtures / "llmc" / "bytelevel_bpe.tokenizer.json"):
        engine, reason = select_engine(_tokenizer(path), "auto", chat=False)
        # Both pass; auto measured both on the calibration text and names the rates (for plain text: for chat text
        # splintr comes last, untimed).
        assert engine.name in ("fastokens", "splintr") and f"{engine.name} passed the identity gate" in reason
        assert "measured on the calibration text: fastokens" in reason and " MB/s, splintr " in reason
        for name in ("fastokens", "splintr"):
            assert select_engine(_tokenizer(path), name)[0].name == name


def test_auto_times_first_and_gates_the_fastest_only(monkeypatch: pytest.MonkeyPatch, tokenizer_path: Path) -> None:
    pytest.importorskip("fastokens")
    pytest.importorskip("splintr")
    from tokformats.tokenization import engines

    gated: list[tuple[str, tuple[bool, ...]]] = []
    failing = {"splintr"}

    def gate(candidate: Engine, want: Any, modes: tuple[bool, ...]) -> str | None:
        gated.append((candidate.name, modes))
        return f"{candidate.name} differs (a test)" if candidate.name in failing else None

    monkeypatch.setattr(engines, "_gate", gate)
    monkeypatch.setattr(engines, "_rates", lambda built, texts: {id(e): 2.0 if e.name == "splintr" else 1.0
                                                                  for e in built})  # fmt: skip
    engine, reason = select_engine(_tokenizer(tokenizer_path), "auto", chat=False)
    # The fastest (splintr) is gated first, fails, and the next is gated; a text run gates the text way only.
    assert engine.name == "fastokens" and gated == [("splintr", (False,)), ("fastokens", (False,))]
    assert "measured on the calibration text: fastokens 1 MB/s, splintr 2 MB/s" in reason
    assert "splintr differs (a test)" in reason
    gated.clear()
    failing.clear()
    engine, reason = select_engine(_tokenizer(tokenizer_path), "auto", chat=False)
    assert engine.name == "splintr" and gated == [("splintr", (False,))]  # the slower one is never gated
    gated.clear()
    engine, reason = select_engine(_tokenizer(tokenizer_path), "auto")  # chat text too: splintr hands it on
    assert engine.name == "fastokens" and gated == [("fastokens", (False, True))]


def test_gate_runs_once_per_tokenizer_per_process(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tokenizer_path: Path
) -> None:
    calls: list[tuple[str, dict[str, Any]]] = []

    def choose(tokenizer: Any, engine: str = "auto", **gate: Any) -> tuple[Engine, str]:
        calls.append((engine, gate))
        return Lying(tokenizer, "\x00never"), "a test engine"

    monkeypatch.setattr(engines, "select_engine", choose)
    corpus = _corpus(tmp_path, 50)
    for name in ("first", "second"):  # batches of 20: the input is more than its first sample
        summary = tokformats.tokenize(corpus, tokenizer_path, tmp_path / name, "raw", batch_size=20, progress=False)
        assert summary["engine"] == "lying" and summary["engine_reason"] == "a test engine"
    import hashlib

    digest = hashlib.sha256(_tokenizer(tokenizer_path).to_str().encode("utf-8")).hexdigest()
    # The second run reused the first one's gated engine.
    assert calls == [("auto", {"chat": False, "tokenizer_hash": digest})]
    assert (tmp_path / "first.bin").read_bytes() == (tmp_path / "second.bin").read_bytes()


def test_refused_component_falls_back_or_raises(tokenizer_path: Path) -> None:
    pytest.importorskip("fastokens")
    from tokenizers import normalizers

    tokenizer = _tokenizer(tokenizer_path)
    tokenizer.normalizer = normalizers.NFKC()
    engine, reason = select_engine(tokenizer, "auto")
    # splintr implements NFKC and passes the gate; without it, tokenizers runs.
    assert engine.name == ("splintr" if _installed("splintr") else "tokenizers")
    assert "fastokens refuses this tokenizer" in reason or engine.name == "splintr"
    with pytest.raises(EngineError, match="NFKC"):
        select_engine(tokenizer, "fastokens")


def test_first_batch_difference_falls_back_under_auto(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tokenizer_path: Path
) -> None:
    corpus = _corpus(tmp_path)
    reference = tokformats.tokenize(corpus, tokenizer_path, tmp_path / "ref", "raw", engine="tokenizers",
                                    progress=False)  # fmt: skip
    marker = sample_texts(400)[3][:12]
    _lying(monkeypatch, marker)
    # Batches of 100: the input is more than the first sample (the first batch), so auto runs the engine.
    summary = tokformats.tokenize(corpus, tokenizer_path, tmp_path / "auto", "raw", batch_size=100, progress=False)
    assert summary["engine"] == "tokenizers"
    assert "on the first batch: tokenizers runs instead" in summary["engine_reason"]
    assert (tmp_path / "auto.bin").read_bytes() == (tmp_path / "ref.bin").read_bytes()
    assert reference["tokens"] == summary["tokens"]
    with pytest.raises(EngineMismatchError, match=r"corpus\.jsonl, record 4 "):
        tokformats.tokenize(corpus, tokenizer_path, tmp_path / "explicit", "raw", engine="fastokens", progress=False)


def test_difference_during_the_run_stops_it_and_resume_after_switching_engines_is_identical(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tokenizer_path: Path
) -> None:
    corpus = _corpus(tmp_path, 3000)
    reference = tokformats.tokenize(corpus, tokenizer_path, tmp_path / "ref", "megatron", engine="tokenizers",
                                    progress=False, batch_size=100)  # fmt: skip
    texts = sample_texts(3000)
    late = next(k for k in range(2500, 3000) if texts[k] and all(texts[k][:15] not in t for t in texts[:2500]))
    _lying(monkeypatch, texts[late][:15])
    with pytest.raises(EngineMismatchError, match=rf"record {late + 1} .*engine='tokenizers'"):
        tokformats.tokenize(corpus, tokenizer_path, tmp_path / "run", "megatron", progress=False, batch_size=100,
                            verify_fraction=1.0, checkpoint_every=0.0)  # fmt: skip
    assert not list(tmp_path.glob("run*.bin")) and (tmp_path / "run.tokenize").is_dir()
    summary = tokformats.tokenize(corpus, tokenizer_path, tmp_path / "run", "megatron", progress=False,
                                  batch_size=100, resume=True, engine="tokenizers")  # fmt: skip
    assert summary["documents"] == 3000
    ours = [Path(f) for output in summary["outputs"].values() for f in output["files"]]
    theirs = [Path(f) for output in reference["outputs"].values() for f in output["files"]]
    assert len(ours) == len(theirs) == 2
    for a, b in zip(ours, theirs):
        assert a.read_bytes() == b.read_bytes(), a.name


def test_verify_fraction_must_be_a_fraction(tmp_path: Path, tokenizer_path: Path) -> None:
    with pytest.raises(tokformats.ConfigError, match="verify_fraction must be between 0 and 1"):
        tokformats.tokenize(["a"], tokenizer_path, tmp_path / "x", "raw", verify_fraction=2.0, progress=False)


# Files that record when they were written (not what): compared without their time fields.
_TIMESTAMPED = {"manifest.json", "checkpoints.json", "index.json"}


def _without_times(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _without_times(v) for k, v in data.items() if k not in ("created_at", "updated_at", "timestamp")}
    if isinstance(data, list):
        return [_without_times(v) for v in data]
    return data


@pytest.mark.parametrize("format", sorted(corpus_writers()))
def test_outputs_are_byte_identical_whichever_engine_runs(format: str, tmp_path: Path, tokenizer_path: Path) -> None:
    pytest.importorskip("fastokens")
    if format == "hf":
        pytest.importorskip("pyarrow")
    texts = [*sample_texts(300), *adversarial_texts(_tokenizer(tokenizer_path))]
    outputs = {}
    engines = ["tokenizers", "fastokens"] + (["splintr"] if _installed("splintr") else [])
    for engine in engines:
        folder = tmp_path / engine
        summary = tokformats.tokenize(texts, tokenizer_path, folder / "out", format, engine=engine, progress=False)
        assert summary["engine"] == engine
        outputs[engine] = {p.relative_to(folder): p for p in folder.rglob("*") if p.is_file()}
    for engine in engines[1:]:
        assert sorted(outputs["tokenizers"]) == sorted(outputs[engine])
        for name, path in outputs["tokenizers"].items():
            other = outputs[engine][name]
            if path.name in _TIMESTAMPED:
                assert _without_times(json.loads(path.read_text())) == _without_times(json.loads(other.read_text()))
            else:
                assert path.read_bytes() == other.read_bytes(), (engine, name)


def test_command_line_names_the_engine(
    tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tokformats.cli import main

    corpus = _corpus(tmp_path, 50)
    code = main(["tokenize", str(corpus), "-t", str(tokenizer_path), "-o", str(tmp_path / "o"), "-f", "raw",
                 "--engine", "tokenizers", "--verify-fraction", "0.5", "-q", "--json"])  # fmt: skip
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["engine"] == "tokenizers" and summary["engine_reason"] == "asked for"


class _Counting(TokenizersEngine):
    """The reference, recording every text it is asked to encode."""

    seen: list[str] = []  # noqa: RUF012 - reset by each test

    def encode(self, texts: list[str], split_special: bool = False) -> tuple[np.ndarray, np.ndarray]:
        type(self).seen.extend(texts)
        return super().encode(texts, split_special)


def _late_corpus(tmp_path: Path) -> tuple[Path, list[str]]:
    """About 3 MiB of documents, numbered (``doc N:``) so that a re-encoded text tells its place."""
    base = sample_texts(600)
    texts = [f"doc {k}: " + " ".join(base[(k + j) % 600] for j in range(6)) for k in range(2400)]
    corpus = tmp_path / "late.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return corpus, texts


def _checked(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make the run's engine tokenizers' ids under another name (so that the encoder checks it) and record the
    texts the check re-encodes."""
    _lying(monkeypatch, "\x00never")
    _Counting.seen = []
    monkeypatch.setattr("tokformats.tokenization.encoder.TokenizersEngine", _Counting)
    return _Counting.seen


def test_the_check_after_the_first_mib_is_sized_by_verify_bytes_and_spread_over_the_input(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tokenizer_path: Path
) -> None:
    corpus, texts = _late_corpus(tmp_path)
    size = corpus.stat().st_size
    assert size > 3 * Encoder.FIRST_SAMPLE_BYTES
    seen = _checked(monkeypatch)
    # Each document with probability 1 at most: lowered to about 128 KiB of the ~3.4 MB.
    tokformats.tokenize(corpus, tokenizer_path, tmp_path / "budget", "raw", progress=False, batch_size=100,
                        verify_fraction=1.0, verify_bytes=128 << 10)  # fmt: skip
    numbers = [int(t.split(":", 1)[0][4:]) for t in seen]
    first = [n for n in numbers if sum(len(t) for t in texts[:n]) < Encoder.FIRST_SAMPLE_BYTES]
    drawn = [n for n in numbers if n not in first]
    assert first == list(range(len(first))) and len(first) > 100  # the first MiB, in order
    drawn_text = sum(len(texts[n]) for n in drawn)
    assert 32 << 10 < drawn_text < 384 << 10, drawn_text  # about verify_bytes, not 1% of the corpus
    assert max(drawn) > 0.85 * len(texts) and min(drawn) < 0.6 * len(texts), drawn  # across the input
    seen.clear()
    tokformats.tokenize(corpus, tokenizer_path, tmp_path / "all", "raw", progress=False, batch_size=100,
                        verify_fraction=1.0, verify_bytes=None)  # fmt: skip
    # None: no budget; every document is checked but some of the two batches where the first MiB ends.
    missing = set(range(len(texts))) - {int(t.split(":", 1)[0][4:]) for t in seen}
    assert missing and min(missing) > max(first) and max(missing) < max(first) + 200


def test_an_iterables_draws_stop_at_verify_bytes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tokenizer_path: Path
) -> None:
    _, texts = _late_corpus(tmp_path)
    seen = _checked(monkeypatch)
    tokformats.tokenize(iter(texts), tokenizer_path, tmp_path / "it", "raw", progress=False, batch_size=100,
                        verify_fraction=1.0, verify_bytes=64 << 10)  # fmt: skip
    numbers = [int(t.split(":", 1)[0][4:]) for t in seen]
    drawn = [n for n in numbers if n >= 1000]  # past the batches where the first MiB (856 documents) ends
    # Every document was drawn (verify_fraction 1) until the budget was spent, and none after.
    assert drawn == list(range(1000, max(drawn) + 1)) and max(drawn) < 1400
    assert 32 << 10 < sum(len(texts[n]) for n in drawn) <= 64 << 10


def test_a_wrong_engine_late_in_the_input_is_still_caught_by_the_budgeted_draw(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tokenizer_path: Path
) -> None:
    corpus, texts = _late_corpus(tmp_path)
    # Wrong on every document of the last third only: the first MiB passes, the draws across the input do not.
    late = set(range(1600, len(texts)))

    class LateLying(Engine):
        name = "late-lying"

        def __init__(self, tokenizer: Any) -> None:
            self.reference = TokenizersEngine(tokenizer)

        def encode(self, batch: list[str], split_special: bool = False) -> tuple[np.ndarray, np.ndarray]:
            flat, lengths = self.reference.encode(batch)
            flat, ends = flat.copy(), np.cumsum(lengths)
            for k, text in enumerate(batch):
                if int(text.split(":", 1)[0][4:]) in late:
                    flat[ends[k] - 1] += 1
            return flat, lengths

    monkeypatch.setattr(engines, "select_engine", lambda tokenizer, engine="auto", **gate: (LateLying(tokenizer),
                                                                                              "a test engine"))
    with pytest.raises(EngineMismatchError, match=r"late-lying gave other ids than tokenizers for .*late\.jsonl"):
        tokformats.tokenize(corpus, tokenizer_path, tmp_path / "wrong", "raw", progress=False, batch_size=100,
                            verify_fraction=1.0, verify_bytes=64 << 10)  # fmt: skip
    assert not (tmp_path / "wrong.bin").exists()


def test_verify_bytes_must_be_a_size(tmp_path: Path, tokenizer_path: Path) -> None:
    for bad in (-1, 1.5, "1M", True):
        with pytest.raises(tokformats.ConfigError, match="verify_bytes must be a number of bytes"):
            tokformats.tokenize(["a"], tokenizer_path, tmp_path / "x", "raw", verify_bytes=bad, progress=False)


@pytest.mark.parametrize("where", ["first", "later"])
def test_a_difference_in_any_partitions_first_batch_stops_a_parallel_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tokenizer_path: Path, where: str
) -> None:
    # Workers gate `auto` themselves. A difference in a partition's first batch must stop a parallel run: the first
    # partition switching to tokenizers alone would leave the others encoding with the engine (wrong ids written),
    # and a later partition's first batch is mid-run. Each partition is one batch here.
    from concurrent.futures import ThreadPoolExecutor

    corpus = _corpus(tmp_path, 3000)
    texts = sample_texts(3000)
    if where == "first":
        lie = next(k for k in range(3000) if texts[k][:15] and sum(texts[k][:15] in t for t in texts) == 1)
    else:
        lie = next(k for k in range(2500, 3000) if texts[k] and all(texts[k][:15] not in t for t in texts[:2500]))
    _lying(monkeypatch, texts[lie][:15])
    _WORKER_ENGINES.clear()
    with ThreadPoolExecutor(2) as pool, pytest.raises(EngineMismatchError, match=rf"record {lie + 1} "):
        tokformats.tokenize(corpus, tokenizer_path, tmp_path / "run", "megatron", progress=False, batch_size=1000,
                            verify_fraction=0.0 if where == "first" else 1.0, verify_bytes=None, executor=pool,
                            partitions=8)  # fmt: skip
    _WORKER_ENGINES.clear()
    assert not list(tmp_path.glob("run*.bin"))
