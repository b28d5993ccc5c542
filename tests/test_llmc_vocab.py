"""llm.c vocabularies, tokenizer export and training, and decoding corpora to text."""

from __future__ import annotations

import json
import pickle
import re
import struct
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

import tokformats
from tokformats import FormatError, HeaderError, OutputExistsError, SizeMismatchError, TokenRangeError
from tokformats.cli import main
from tokformats.core.vocab import SPECIAL_TOKENS, padded_vocab_size
from tokformats.formats.llmc_vocab import Vocab
from tokformats.tokenization.tokenizer import text_decoder, train_tokenizer


@pytest.fixture(scope="module")
def fixture_vocab(fixtures: Path) -> Path:
    return fixtures / "llmc" / "bytelevel_bpe.vocab_v2.bin"


def test_golden_vocabulary_reads_exactly(fixtures: Path, fixture_vocab: Path) -> None:
    facts = json.loads((fixtures / "llmc" / "bytelevel_bpe.vocab_v2.expected.json").read_text())
    assert tokformats.detect(fixture_vocab) == "llmc-vocab"
    with tokformats.open(fixture_vocab) as vocab:
        assert isinstance(vocab, Vocab)
        assert len(vocab) == facts["vocab_size"] == 700
        assert vocab.eot_token == facts["eot_token"] == 0 and vocab.version == 2
        assert [vocab[i].hex() for i in range(len(vocab))] == facts["tokens_hex"]
        assert vocab[0] == b"<|endoftext|>" and vocab[-1] == bytes.fromhex(facts["tokens_hex"][-1])
        assert vocab.metadata == {"magic": 20240328, "version": 2, "vocab_size": 700, "eot_token": 0}


def test_export_is_byte_identical(fixtures: Path, fixture_vocab: Path, tmp_path: Path) -> None:
    for source in (fixtures / "llmc" / "bytelevel_bpe.tokenizer.json", fixtures / "llmc"):
        if source.is_dir():  # a folder holding tokenizer.json
            (tmp_path / "tok").mkdir(exist_ok=True)
            (tmp_path / "tok" / "tokenizer.json").write_bytes(
                (fixtures / "llmc" / "bytelevel_bpe.tokenizer.json").read_bytes()
            )
            source = tmp_path / "tok"
        vocab = tokformats.llmc.Vocab.from_tokenizer(source)
        out = vocab.save(tmp_path / "v.bin", overwrite=True)
        assert out.read_bytes() == fixture_vocab.read_bytes()


def test_decoding_the_golden_shards_gives_the_documents(fixtures: Path, fixture_vocab: Path) -> None:
    documents = json.loads((fixtures / "llmc" / "corpus.docs.json").read_text())
    tokenizer = Tokenizer.from_file(str(fixtures / "llmc" / "bytelevel_bpe.tokenizer.json"))
    with tokformats.open(str(fixtures / "llmc" / "corpus_train_*.bin"), bos=0) as corpus, Vocab(fixture_vocab) as vocab:
        by_vocab = text_decoder(vocab=vocab)
        by_tokenizer = text_decoder(tokenizer=tokenizer)
        for k, document in enumerate(documents):
            assert corpus[k][0] == vocab.eot_token
            assert by_vocab(corpus[k][1:]) == document
            assert by_tokenizer(corpus[k][1:]) == document
        assert vocab.decode_bytes(corpus[0][:1]) == b"<|endoftext|>"


def test_invalid_ids_are_named(fixture_vocab: Path, fixtures: Path) -> None:
    with Vocab(fixture_vocab) as vocab:
        with pytest.raises(TokenRangeError, match="token id 700 is not in this vocabulary of 700 tokens"):
            vocab.decode([5, 700])
        with pytest.raises(TokenRangeError, match="token id -1"):
            vocab.decode_bytes(np.array([-1]))
        assert vocab.decode([]) == ""
    decode = text_decoder(tokenizer=fixtures / "llmc" / "bytelevel_bpe.tokenizer.json")
    with pytest.raises(TokenRangeError, match="token id 9999 is not in the tokenizer's vocabulary of 700"):
        decode([1, 9999])


def test_partial_utf8_is_replaced_when_decoding() -> None:
    vocab = Vocab.from_tokens([b"<eot>", b"\xe4\xb8", b"\xad", b"a"], eot_token=0)
    assert vocab.decode_bytes([1, 2, 3]) == "中a".encode()
    assert vocab.decode([1, 3]) == "\ufffda"


def test_version_1_rules(tmp_path: Path) -> None:
    tokens = [bytes([i % 256]) * (1 + i % 3) for i in range(50257)]
    Vocab.from_tokens(tokens, 50256, version=1).save(tmp_path / "v1.bin")
    with tokformats.open(tmp_path / "v1.bin") as vocab:
        assert vocab.version == 1 and vocab.eot_token == 50256 and len(vocab) == 50257
    header = (tmp_path / "v1.bin").read_bytes()[:16]
    assert struct.unpack("<4I", header) == (20240328, 1, 50257, 0)
    with pytest.raises(HeaderError, match="version 1 is GPT-2's vocabulary"):
        Vocab.from_tokens(tokens[:100], 0, version=1)
    with pytest.raises(HeaderError, match="version 1 is GPT-2's vocabulary"):
        with tokformats.create(tmp_path / "bad.bin", "llmc-vocab", version=1) as writer:
            writer.write(b"a")
    assert not (tmp_path / "bad.bin").exists()


def test_writer_refuses_unstorable_tokens(tmp_path: Path) -> None:
    with pytest.raises(TokenRangeError, match="token 1 has 0 bytes"):
        with tokformats.create(tmp_path / "v.bin", "llmc-vocab", eot_token=0) as writer:
            writer.write(b"a")
            writer.write(b"")
    with pytest.raises(TokenRangeError, match="token 0 has 256 bytes"):
        Vocab.from_tokens([b"x" * 256], 0)
    assert list(tmp_path.iterdir()) == []


def test_vocab_protocol(tmp_path: Path) -> None:
    tokens = [b"<eot>", b"a", b"bc", "é".encode(), b"\x00z"]
    with tokformats.create(tmp_path / "v.bin", "llmc-vocab", eot_token=0) as writer:
        for token in tokens:
            writer.write(token)
    with pytest.raises(OutputExistsError):
        tokformats.create(tmp_path / "v.bin", "llmc-vocab", eot_token=0)
    with tokformats.open(tmp_path / "v.bin") as vocab:
        assert list(vocab) == tokens and vocab[1:3] == tokens[1:3] and vocab[-1] == b"\x00z"
        clone = pickle.loads(pickle.dumps(vocab))
        assert list(clone) == tokens
        assert "tokens=5" in repr(vocab) and "<table>" in vocab._repr_html_()
    memory = Vocab.from_tokens(tokens, 0)
    assert list(pickle.loads(pickle.dumps(memory))) == tokens


def vocab_bytes(
    records: list[bytes], count: int | None = None, version: int = 2, eot: int = 0, magic: int = 20240328
) -> bytes:
    header = np.zeros(256, dtype="<u4")
    header[:4] = magic, version, len(records) if count is None else count, eot
    return header.tobytes() + b"".join(bytes([len(r)]) + r for r in records)


@pytest.mark.parametrize(
    ("content", "error", "message"),
    [
        (vocab_bytes([b"a", b"bc"])[:1000], SizeMismatchError, "1024-byte header"),
        (vocab_bytes([b"a", b"bc"], magic=20240520), HeaderError, "'magic' is 20240520"),
        (vocab_bytes([b"a", b"bc"], version=3), HeaderError, "'version' is 3"),
        (vocab_bytes([b"a", b"bc"], count=5), SizeMismatchError, "'N' says 5 tokens"),
        (vocab_bytes([b"a", b"bc"], count=3) + b"\x00\x00", HeaderError, "token 2 has a record length of 0"),
        (vocab_bytes([b"a", b"bcd"])[:-1], SizeMismatchError, "record of token 1 needs 3 bytes"),
        (vocab_bytes([b"a", b"bc"]) + b"x", SizeMismatchError, "1 bytes follow the last"),
        (vocab_bytes([b"a", b"bc"], eot=2), HeaderError, "end-of-text id 2 is not below"),
        (vocab_bytes([b"a", b"bc"], count=2**31), SizeMismatchError, "need at least"),
    ],
)
def test_malformed_vocabularies(tmp_path: Path, content: bytes, error: type, message: str) -> None:
    path = tmp_path / "v.bin"
    path.write_bytes(content)
    with pytest.raises(error, match=message):
        tokformats.open(path, format="llmc-vocab")


def test_sentencepiece_style_export() -> None:
    vocab = {"<unk>": 0, "<0x0A>": 1, "<0xE4>": 2, "\u2581hello": 3, "\u2581": 4, "h": 5, "ello": 6}
    model = models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True)
    tokenizer = Tokenizer(model)
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tokenizer.add_special_tokens(["</s>"])
    exported = Vocab.from_tokenizer(tokenizer, eot_token="</s>")
    assert exported.tokens == [b"<unk>", b"\n", b"\xe4", b" hello", b" ", b"h", b"ello", b"</s>"]
    assert exported.eot_token == 7


def test_other_models_are_refused() -> None:
    tokenizer = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    with pytest.raises(FormatError, match="cannot export a WordLevel tokenizer"):
        Vocab.from_tokenizer(tokenizer, eot_token=0)


def test_missing_end_of_text_must_be_given(fixtures: Path) -> None:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel()
    with pytest.raises(FormatError, match=re.escape("no '<|endoftext|>' token; pass the end-of-text id")):
        Vocab.from_tokenizer(tokenizer)


# -- training ------------------------------------------------------------------------------------


def multiscript_corpus(documents: int = 400, seed: int = 0) -> list[str]:
    """Latin words, CJK characters and emoji mixed in every document, deterministically."""
    rng = np.random.default_rng(seed)
    latin = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "naïve", "café", "über"]
    cjk = list("的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年")
    emoji = ["😀", "🚀", "🌍", "👍🏽", "🎉"]
    texts = []
    for _ in range(documents):
        words = []
        for _ in range(rng.integers(5, 40)):
            kind = rng.random()
            if kind < 0.6:
                words.append(str(rng.choice(latin)))
            elif kind < 0.9:
                words.append("".join(rng.choice(cjk, size=rng.integers(1, 4))))
            else:
                words.append(str(rng.choice(emoji)))
        texts.append(" ".join(words))
    return texts


def test_training_special_ids_round_trip_and_determinism(tmp_path: Path) -> None:
    corpus = multiscript_corpus()
    first = train_tokenizer(corpus, 400, min_frequency=2, progress=False)
    second = train_tokenizer(iter(corpus), 400, min_frequency=2, progress=False)
    assert first.to_str() == second.to_str(), "the same input must give the same tokenizer"
    for token_id, token in enumerate(SPECIAL_TOKENS):
        assert first.token_to_id(token) == token_id
    assert first.get_vocab_size() <= 400
    for text in corpus[:50]:
        ids = first.encode(text, add_special_tokens=False).ids
        assert first.decode(ids, skip_special_tokens=False) == text
    # byte-level: nothing is unknown, even unseen scripts
    unseen = "Ελληνικά и кириллица ✨"
    assert first.decode(first.encode(unseen).ids) == unseen
    vocab = Vocab.from_tokenizer(first)
    ids = first.encode(corpus[0]).ids
    assert vocab.decode(ids) == corpus[0] and vocab.eot_token == 0


def test_training_from_files_by_line_and_by_file_and_sample(tmp_path: Path) -> None:
    corpus = multiscript_corpus(60)
    by_line = tmp_path / "corpus.txt"
    by_line.write_text("\n".join(corpus) + "\n", encoding="utf-8")
    files = []
    for k, text in enumerate(corpus):
        files.append(tmp_path / f"doc{k}.txt")
        files[-1].write_text(text, encoding="utf-8")
    a = train_tokenizer([by_line], 300, progress=False)
    b = train_tokenizer(files, 300, unit="file", progress=False)
    c = train_tokenizer(corpus, 300, progress=False)
    assert a.to_str() == b.to_str() == c.to_str()
    sampled = train_tokenizer([str(by_line)], 300, sample_docs=5, progress=False)
    assert sampled.to_str() == train_tokenizer(corpus[:5], 300, progress=False).to_str()
    custom = train_tokenizer(corpus, 300, special_tokens=["<s>", "</s>"], progress=False)
    assert custom.token_to_id("<s>") == 0 and custom.token_to_id("<|endoftext|>") is None


def test_padded_vocab_size() -> None:
    assert padded_vocab_size(20009) == 20032 and padded_vocab_size(50257) == 50304 and padded_vocab_size(64) == 64


def test_cli_train_tokenizer_and_head(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corpus = multiscript_corpus(80)
    text = tmp_path / "corpus.txt"
    text.write_text("\n".join(corpus), encoding="utf-8")
    out = tmp_path / "tok" / "tokenizer.json"
    args = [
        "train-tokenizer",
        str(text),
        "--vocab-size",
        "350",
        "-o",
        str(out),
        "--export",
        f"llmc-vocab={tmp_path / 'v.bin'}",
        "-q",
    ]
    assert main(args) == 0
    printed = capsys.readouterr().out
    size = Tokenizer.from_file(str(out)).get_vocab_size()
    assert f"vocabulary size {size:,} (padded to a multiple of 64: {padded_vocab_size(size):,})" in printed
    assert main(args) == 2 and "--overwrite" in capsys.readouterr().err
    tokenizer = Tokenizer.from_file(str(out))
    with tokformats.create(tmp_path / "c", "megatron", vocab_size=size) as writer:
        for document in corpus[:3]:
            writer.write(tokenizer.encode(document).ids)
    for decoder in (["--tokenizer", str(out)], ["--vocab", str(tmp_path / "v.bin")]):
        assert main(["head", str(tmp_path / "c"), "-n", "2", *decoder]) == 0
        shown = capsys.readouterr().out
        assert corpus[0] in shown and corpus[1] in shown and corpus[2] not in shown
