"""The engine gate's outcome on disk: a second selection for the same tokenizer neither times nor loads the other
engines, and still gates the engine it reads against tokenizers here; a damaged or stale entry is ignored and
rewritten, a forged one only names which engine is gated; ``TOKFORMATS_GATE_CACHE=off`` keeps nothing on disk."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tokformats
from tokformats.tokenization import engines, gate_cache
from tokformats.tokenization.encoder import _GATED
from tokformats.tokenization.engines import Engine, TokenizersEngine, select_engine
from tokformats.tokenization.sample_text import sample_texts

pytest.importorskip("fastokens")


def _tokenizer(path: Path) -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path))


def _digest(tokenizer: Any) -> str:
    return hashlib.sha256(tokenizer.to_str().encode("utf-8")).hexdigest()


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    folder = tmp_path / "gates"
    monkeypatch.setenv(gate_cache.GATE_CACHE_ENV, str(folder))
    return folder


def _spy(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Count the timing of engines and the reference's encodings of the adversarial texts."""
    counts = {"timed": 0, "reference": 0}
    rates, encode = engines._rates, TokenizersEngine.encode

    def timed(*args: Any, **kwargs: Any) -> Any:
        counts["timed"] += 1
        return rates(*args, **kwargs)

    def reference(self: TokenizersEngine, texts: list[str], split_special: bool = False) -> Any:
        counts["reference"] += 1
        return encode(self, texts, split_special)

    monkeypatch.setattr(engines, "_rates", timed)
    monkeypatch.setattr(TokenizersEngine, "encode", reference)
    return counts


def test_a_second_selection_reads_the_gate_from_disk(
    monkeypatch: pytest.MonkeyPatch, cache: Path, tokenizer_path: Path
) -> None:
    tokenizer = _tokenizer(tokenizer_path)
    counts = _spy(monkeypatch)
    first, why = select_engine(tokenizer, "auto", chat=False, tokenizer_hash=_digest(tokenizer))
    entries = list(cache.iterdir())
    assert [p.name for p in entries] == [f"{_digest(tokenizer)}-auto-text.json"]
    assert counts["reference"] == 1 and "cached" not in why
    timed = counts["timed"]
    counts.update(timed=0, reference=0)
    second, reason = select_engine(_tokenizer(tokenizer_path), "auto", chat=False, tokenizer_hash=_digest(tokenizer))
    # Not timed again; gated again, here, against tokenizers' ids of the adversarial texts (one way of encoding).
    assert second.name == first.name and counts == {"timed": 0, "reference": 1}
    assert reason.startswith(why) and str(entries[0]) in reason
    assert timed <= 1  # the first selection timed the engines (when more than one was installed)
    texts = engines.adversarial_texts(tokenizer)  # the candidate was still gated: its own ids on the texts
    assert engines.first_difference(TokenizersEngine(tokenizer), second, texts) is None


def _entry(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _texts_hash(tokenizer: Any) -> str:
    texts = engines.adversarial_texts(tokenizer)
    return hashlib.sha256("\x00".join(texts).encode("utf-8", "surrogatepass")).hexdigest()


def _resealed(data: dict[str, Any]) -> str:
    body = {k: v for k, v in data.items() if k != "checksum"}
    return json.dumps({**body, "checksum": gate_cache._checksum(body)})


@pytest.mark.parametrize(
    "damage", ["garbage", "truncated", "checksum", "other tokenizer", "other build", "other texts", "other engine"]
)
def test_a_damaged_or_stale_entry_is_ignored_and_rewritten(
    monkeypatch: pytest.MonkeyPatch, cache: Path, tokenizer_path: Path, damage: str
) -> None:
    tokenizer = _tokenizer(tokenizer_path)
    digest = _digest(tokenizer)
    select_engine(tokenizer, "auto", chat=False, tokenizer_hash=digest)
    path = next(cache.iterdir())
    good = path.read_text()
    data = _entry(path)
    if damage == "garbage":
        path.write_bytes(b"\x00\xff not json")
    elif damage == "truncated":
        path.write_text(good[: len(good) // 2])
    elif damage == "checksum":
        data["reason"] = "changed without resealing"
        path.write_text(json.dumps(data))
    elif damage == "other tokenizer":
        data["key"]["tokenizer"] = "0" * 64
        path.write_text(_resealed(data))
    elif damage == "other build":
        data["key"]["builds"]["fastokens"] = ["/elsewhere/fastokens/__init__.py", 1, 1]
        path.write_text(_resealed(data))
    elif damage == "other texts":  # made for the adversarial texts of another tokformats
        data["key"]["texts"] = "0" * 64
        path.write_text(_resealed(data))
    else:
        data["engine"] = "an engine of the entry's choosing"
        path.write_text(_resealed(data))
    assert gate_cache.load(path, digest, "auto", (False,), _texts_hash(tokenizer)) is None
    counts = _spy(monkeypatch)
    engine, reason = select_engine(tokenizer, "auto", chat=False, tokenizer_hash=digest)
    assert counts["reference"] == 1 and "cached" not in reason  # selected anew
    rewritten, before = _entry(path), json.loads(good)
    assert rewritten["engine"] == engine.name  # the engine selected anew, timed anew: on a loaded machine not always
    for entry in (rewritten, before):  # the first one (fastokens against splintr); the reason names the rates measured
        del entry["reason"], entry["checksum"], entry["engine"]
    assert rewritten == before  # rewritten whole
    assert gate_cache.load(path, digest, "auto", (False,), _texts_hash(tokenizer)) is not None
    assert engines.first_difference(TokenizersEngine(tokenizer), engine, engines.adversarial_texts(tokenizer)) is None


class _Forged(Engine):
    """An engine that differs from tokenizers on texts holding ``marker``."""

    name = "fastokens"

    def __init__(self, tokenizer: Any, marker: str) -> None:
        self.reference, self.marker = TokenizersEngine(tokenizer), marker

    def encode(self, texts: list[str], split_special: bool = False) -> tuple[np.ndarray, np.ndarray]:
        flat, lengths = self.reference.encode(texts, split_special)
        flat, ends = flat.copy(), np.cumsum(lengths)
        for k, text in enumerate(texts):
            if self.marker in text and lengths[k]:
                flat[ends[k] - 1] += 1
        return flat, lengths


def test_a_forged_entry_only_names_the_engine_that_is_gated_here(
    monkeypatch: pytest.MonkeyPatch, cache: Path, tmp_path: Path, tokenizer_path: Path
) -> None:
    tokenizer = _tokenizer(tokenizer_path)
    digest, texts_hash = _digest(tokenizer), _texts_hash(tokenizer)
    path = gate_cache.entry_path(digest, "auto", (False,))
    assert path is not None
    # An entry saying fastokens passed, for an engine that differs on an adversarial text: gated here, it fails,
    # and the selection is made anew (every fast engine "built" as the wrong one: tokenizers runs).
    marker = engines.adversarial_texts(tokenizer)[3][:8]
    gate_cache.save(path, digest, "auto", (False,), texts_hash, gate_cache.GateEntry("fastokens", "forged"))
    monkeypatch.setattr(engines, "_built", lambda json_text, name, reference: (_Forged(tokenizer, marker), ""))
    engine, reason = select_engine(tokenizer, "auto", chat=False, tokenizer_hash=digest)
    assert isinstance(engine, TokenizersEngine) and "forged" not in reason
    assert gate_cache.load(path, digest, "auto", (False,), texts_hash) == gate_cache.GateEntry("tokenizers", reason)
    # An engine that differs only outside the adversarial texts passes the gate, cached or not; the run's first
    # MiB, re-encoded with tokenizers itself, is what catches it: tokenizers writes everything.
    corpus_texts = sample_texts(400)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in corpus_texts))
    reference = tokformats.tokenize(corpus, tokenizer_path, tmp_path / "ref", "megatron", engine="tokenizers",
                                    progress=False)  # fmt: skip
    wrong = corpus_texts[5][:12]
    gate_cache.save(path, digest, "auto", (False,), texts_hash, gate_cache.GateEntry("fastokens", "forged"))
    monkeypatch.setattr(engines, "_built", lambda json_text, name, reference: (_Forged(tokenizer, wrong), ""))
    engine, reason = select_engine(tokenizer, "auto", chat=False, tokenizer_hash=digest)
    assert reason.startswith("forged") and "gated again" in reason
    _GATED.clear()
    # Batches of 100: the input is more than its first sample, so auto loads the (cached) engine.
    summary = tokformats.tokenize(corpus, tokenizer_path, tmp_path / "run", "megatron", batch_size=100,
                                  progress=False)  # fmt: skip
    assert summary["engine"] == "tokenizers"
    assert "on the first batch: tokenizers runs instead" in summary["engine_reason"]
    for a, b in zip(summary["outputs"]["text"]["files"], reference["outputs"]["text"]["files"]):
        assert Path(a).read_bytes() == Path(b).read_bytes()
    _GATED.clear()


def test_off_keeps_nothing_on_disk(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tokenizer_path: Path) -> None:
    monkeypatch.setenv(gate_cache.GATE_CACHE_ENV, "off")
    monkeypatch.setenv("TOKFORMATS_CACHE", str(tmp_path / "cache"))
    tokenizer = _tokenizer(tokenizer_path)
    assert gate_cache.entry_path(_digest(tokenizer), "auto", (False,)) is None
    select_engine(tokenizer, "auto", chat=False, tokenizer_hash=_digest(tokenizer))
    assert not (tmp_path / "cache").exists()
    monkeypatch.delenv(gate_cache.GATE_CACHE_ENV)
    from tokformats.remote.cache import default_cache_dir

    assert gate_cache.gate_cache_folder() == default_cache_dir() / "gates" == tmp_path / "cache" / "gates"
    monkeypatch.delenv("TOKFORMATS_CACHE")
    assert gate_cache.gate_cache_folder() == default_cache_dir() / "gates"  # the remote cache's folder
