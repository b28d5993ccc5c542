"""Decoding with a tokenizer.json whose ids have holes: an id no token has raises, naming it and its position,
instead of vanishing from the text (``tokenizers`` decodes it to nothing)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tokformats
from tokformats.core.byte_level import bytes_to_unicode
from tokformats.core.vocab import assigned_ids, tokenizer_decoder, vocabulary_size
from tokformats.tokenization.tokenizer import text_decoder

tokenizers = pytest.importorskip("tokenizers")


def _tokenizer_with_holes(tmp_path: Path) -> Path:
    """A byte-level BPE whose tokens are the 256 bytes at 0-255, "ab" at 260 and a special spelled as itself at 300,
    as the named vocabularies hold theirs (256-259 and 261-299 are holes)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {char: byte for byte, char in bytes_to_unicode().items()}
    vocab.update({"ab": 260, "<|end|>": 300})
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[("a", "b")]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    return path


def test_a_hole_in_a_tokenizer_json_is_refused_naming_the_id_and_position(tmp_path: Path) -> None:
    path = _tokenizer_with_holes(tmp_path)
    tokenizer = tokenizers.Tokenizer.from_file(str(path))
    assert tokenizer.token_to_id("<|end|>") == 300 and tokenizer.token_to_id("ab") == 260
    flags = assigned_ids(tokenizer)
    assert len(flags) == vocabulary_size(tokenizer) == 301
    assert np.flatnonzero(~flags).tolist() == [256, 257, 258, 259, *range(261, 300)]
    decode = text_decoder(tokenizer=path)
    ab = tokenizer.encode("ab", add_special_tokens=False).ids
    assert ab == [260] and decode([*ab, 300]) == "ab<|end|>"
    with pytest.raises(tokformats.TokenRangeError) as caught:
        decode(np.array([260, 300, 258], dtype="<u2"))
    assert str(caught.value) == (
        "token id 258 has no token in the tokenizer (at position 2 of the 3 ids decoded): its vocabulary of 301 "
        "ids leaves 43 unassigned (256-259, 261-299); ids like it were not made with this tokenizer."
    )
    with pytest.raises(tokformats.TokenRangeError, match=r"^token id 301 is not in the tokenizer's vocabulary of 301"):
        decode([301])
    outside = r"^token id -1 is not in the tokenizer's vocabulary of 301 tokens \(at position 0 of the 2 ids decoded\)"
    with pytest.raises(tokformats.TokenRangeError, match=outside):
        decode([-1, 260])
    with pytest.raises(tokformats.TokenRangeError, match="token ids must be integers, found float64"):
        decode([1.5])
    assert decode([]) == ""


def test_a_tokenizer_without_holes_decodes_as_before() -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tokenizer = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(pre_tokenizers.ByteLevel.alphabet())},
                                     merges=[]))  # fmt: skip
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    ids = tokenizer.encode("héllo wörld", add_special_tokens=False).ids
    assert bool(assigned_ids(tokenizer).all()) and tokenizer_decoder(tokenizer)(ids) == "héllo wörld"


def test_head_names_the_document_and_the_masked_run_holding_a_hole(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tokformats.cli import main

    tokenizer = _tokenizer_with_holes(tmp_path)
    with tokformats.create(tmp_path / "out", format="megatron", vocab_size=301) as writer:
        writer.write(np.array([97, 260, 300]), loss_mask=np.array([0, 1, 1], np.uint8))
        writer.write(np.array([97, 260, 258, 300]), loss_mask=np.array([0, 1, 1, 1], np.uint8))
    read = [str(tmp_path / "out"), "-t", str(tokenizer)]
    assert main(["head", *read, "--mask"]) == 2
    shown = capsys.readouterr()
    assert "[[a]]ab<|end|>" in shown.out  # document 0, printed before the refusal
    assert (f"tokformats: error: {tmp_path / 'out'}, document 1: tokens 1:4: token id 258 has no token in the "
            "tokenizer (at position 1 of the 3 ids decoded)") in shown.err  # fmt: skip
    assert main(["head", *read]) == 2
    assert "document 1: token id 258 has no token in the tokenizer (at position 2 of the 4 ids decoded)" in (
        capsys.readouterr().err
    )
