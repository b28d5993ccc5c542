"""What tokenize and train_tokenizer read: a path is never tokenized as text, bad inputs are named."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer

import tokformats
from tokformats import NoFilesError
from tokformats.cli import main
from tokformats.tokenization.sources import iter_records, resolve_inputs


def _texts(source: Path | list[str], unit: str = "line") -> list[tuple[str, ...] | None]:
    return [record.texts for record in iter_records(resolve_inputs(source), ("text",), unit)]


def _decoded(summary: dict[str, Any], tokenizer_path: Path) -> list[str]:
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    with tokformats.open(summary["outputs"]["text"]["path"], format="raw", dtype="uint16", eos=0) as reader:
        return [tokenizer.decode(np.asarray(d)[:-1].tolist()) for d in reader]


# 1. a path given as one string, or on the command line, is a path


def test_a_single_string_is_a_path_never_text(
    tmp_path: Path, tokenizer_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(NoFilesError, match=r"^README does not exist \(one string is a path or glob; in-memory texts"):
        tokformats.tokenize("README", tokenizer_path, tmp_path / "a", "raw", progress=False)
    with pytest.raises(NoFilesError, match=r"^hello world does not exist"):
        tokformats.tokenize("hello world", tokenizer_path, tmp_path / "a", "raw", progress=False)
    with pytest.raises(NoFilesError, match="an empty path names no file"):  # Path("") would be the current folder
        tokformats.tokenize("", tokenizer_path, tmp_path / "a", "raw", progress=False)
    Path("README").write_text("one\ntwo\n", encoding="utf-8")  # an existing file without a text suffix is read
    summary = tokformats.tokenize("README", tokenizer_path, tmp_path / "b", "raw", progress=False, dtype="uint16")
    assert summary["documents"] == 2
    assert _decoded(summary, tokenizer_path) == ["one", "two"]


def test_a_list_of_strings_keeps_its_documented_meaning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert _texts(["corpus", "hello world"]) == [("corpus",), ("hello world",)]  # none exists: texts
    Path("a.txt").write_text("alpha\n", encoding="utf-8")
    assert _texts(["a.txt"]) == [("alpha",)]  # every one exists: paths
    with pytest.raises(NoFilesError, match=r"^typo\.txt does not exist"):  # a mix is refused, naming the missing one
        resolve_inputs(["a.txt", "typo.txt"])
    with pytest.raises(NoFilesError, match=r"^data/missing\.jsonl does not exist"):  # none exists, all look like paths
        resolve_inputs(["data/missing.jsonl"])


def test_the_command_line_reads_a_missing_input_as_a_missing_file(
    tmp_path: Path, tokenizer_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    status = main(["tokenize", "corpus", "-t", str(tokenizer_path), "-o", "o3/x", "--format", "raw"])
    err = capsys.readouterr().err
    assert status == 2 and err.startswith("tokformats: error: corpus does not exist")
    assert not Path("o3").exists()
    Path("a.txt").write_text("alpha\n", encoding="utf-8")  # an empty argument is not the current folder
    status = main(["tokenize", "", "-t", str(tokenizer_path), "-o", "o3/x", "--format", "raw"])
    assert status == 2 and capsys.readouterr().err == "tokformats: error: an empty path names no file.\n"
    assert not Path("o3").exists()


# 2. train_tokenizer reads its inputs by the same rule


def test_train_tokenizer_refuses_missing_paths_and_reads_one_string_as_a_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    texts = [f"document {k} says hello to the tokenizer number {k * 7}" for k in range(200)]
    with gzip.open("corpus.jsonl.gz", "wt", encoding="utf-8") as handle:
        handle.write("".join(json.dumps({"text": t}) + "\n" for t in texts))
    with pytest.raises(NoFilesError, match=r"^typo\.jsonl\.gz does not exist"):
        tokformats.train_tokenizer(["corpus.jsonl.gz", "typo.jsonl.gz"], 2000, progress=False)
    with pytest.raises(NoFilesError, match=r"^corpus\.txt does not exist"):
        tokformats.train_tokenizer(["corpus.txt"], 2000, progress=False)
    with pytest.raises(NoFilesError, match=r"^corpus\.txt does not exist"):
        tokformats.train_tokenizer("corpus.txt", 2000, progress=False)
    expected = tokformats.train_tokenizer(texts, 2000, progress=False).to_str()
    assert tokformats.train_tokenizer("corpus.jsonl.gz", 2000, progress=False).to_str() == expected
    assert tokformats.train_tokenizer("*.jsonl.gz", 2000, progress=False).to_str() == expected  # a glob too
    assert tokformats.train_tokenizer(["corpus.jsonl.gz"], 2000, progress=False).to_str() == expected
    assert tokformats.train_tokenizer(iter(texts), 2000, progress=False).to_str() == expected


# 6. -o names a path prefix, not a folder


def test_an_output_ending_in_a_slash_is_refused(
    tmp_path: Path, tokenizer_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("a.txt").write_text("alpha\n", encoding="utf-8")
    Path("l").mkdir()
    status = main(["tokenize", "a.txt", "-t", str(tokenizer_path), "-o", "l/", "--format", "raw"])
    err = capsys.readouterr().err
    assert status == 2
    assert err.strip() == (
        "tokformats: error: --output takes a path prefix, not a folder: found 'l/'; "
        "name the files inside it, e.g. --output l/corpus."
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "l"] and not any(Path("l").iterdir())
