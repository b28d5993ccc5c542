"""What tokenize and train_tokenizer read: a path is never tokenized as text, bad inputs are named, a UTF-8 BOM is
not text, a paragraph keeps its bytes."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer

import tokformats
from tokformats import ConfigError, NoFilesError
from tokformats.cli import main
from tokformats.tokenization.partitions import splittable
from tokformats.tokenization.sources import Input, SourceError, iter_records, resolve_inputs

BOM = b"\xef\xbb\xbf"


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


# 3. an unknown unit is a configuration error


def test_an_unknown_unit_is_a_config_error_naming_the_choices(tmp_path: Path, tokenizer_path: Path) -> None:
    (tmp_path / "a.txt").write_text("alpha\n", encoding="utf-8")
    expected = r"^unit must be one of line, file, paragraph; found unit='sentence'\.$"
    with pytest.raises(ConfigError, match=expected):
        tokformats.tokenize(tmp_path / "a.txt", tokenizer_path, tmp_path / "o", "raw", unit="sentence", progress=False)
    with pytest.raises(ConfigError, match=expected):
        tokformats.train_tokenizer(tmp_path / "a.txt", 300, unit="sentence", progress=False)


# 4. JSON errors say where; a BOM opening a file is not text


def test_invalid_json_names_file_line_and_column(tmp_path: Path) -> None:
    source = tmp_path / "bad.jsonl"
    source.write_text('{"text": "fine"}\n{"text": "unterminated}\n{"text": 1,}\n', encoding="utf-8")
    errors = [r.error for r in iter_records(resolve_inputs(source))]
    assert errors[1] == f"{source}, line 2: invalid JSON (Invalid control character at column 24)."
    expected = "Expecting property name enclosed in double quotes at column 12"
    assert errors[2] == f"{source}, line 3: invalid JSON ({expected})."


@pytest.mark.parametrize("compress", [False, True])
def test_a_bom_opening_a_json_lines_file_is_skipped_and_offsets_stay_byte_offsets(
    tmp_path: Path, compress: bool
) -> None:
    data = BOM + b'{"text": "first"}\n{"text": "second"}\n'
    source = tmp_path / ("bom.jsonl.gz" if compress else "bom.jsonl")
    source.write_bytes(gzip.compress(data) if compress else data)
    records = list(iter_records(resolve_inputs(source)))
    assert [(r.index, r.texts, r.offset, r.error) for r in records] == [
        (1, ("first",), 3, None),
        (2, ("second",), data.index(b'{"text": "second"}'), None),
    ]


def test_a_bom_opening_a_text_or_json_array_file_is_skipped(tmp_path: Path) -> None:
    text = tmp_path / "bom.txt"
    text.write_bytes(BOM + b"alpha\r\nbeta\n\ngamma\n")
    assert [(r.texts, r.offset) for r in iter_records(resolve_inputs(text))] == [
        (("alpha",), 3),
        (("beta",), 10),
        (None, 15),
        (("gamma",), 16),
    ]
    assert [(r.texts, r.offset) for r in iter_records(resolve_inputs(text), unit="paragraph")] == [
        (("alpha\r\nbeta",), 3),
        (("gamma",), 16),
    ]
    assert [(r.texts, r.offset) for r in iter_records(resolve_inputs(text), unit="file")] == [
        (("alpha\r\nbeta\n\ngamma\n",), 3)
    ]
    array = tmp_path / "bom.json"
    array.write_bytes(BOM + b'[{"text": "one"}, {"text": "two"}]')
    assert _texts(array) == [("one",), ("two",)]
    assert splittable(Input(array), "line") is None  # a parallel run never cuts it as lines either
    only = tmp_path / "only.jsonl"
    only.write_bytes(BOM)  # a BOM alone is an empty file
    assert _texts(only) == []


def test_a_bom_is_not_tokenized_and_provenance_points_past_it(tmp_path: Path, tokenizer_path: Path) -> None:
    source = tmp_path / "bom.jsonl"
    data = BOM + b'{"text": "first"}\n{"text": "second"}\n'
    source.write_bytes(data)
    summary = tokformats.tokenize(source, tokenizer_path, tmp_path / "o", "raw", progress=False, dtype="uint16")
    assert summary["documents"] == 2 and summary["skipped"] == 0
    assert _decoded(summary, tokenizer_path) == ["first", "second"]
    with tokformats.open(summary["outputs"]["text"]["path"], format="raw", dtype="uint16", eos=0) as reader:
        first, second = reader.provenance(0), reader.provenance(1)
    assert first == {"file": str(source), "line": 1, "byte_offset": 3}
    assert second is not None and json.loads(data[second["byte_offset"] :].split(b"\n")[0]) == {"text": "second"}


def test_a_bom_midway_is_still_refused(tmp_path: Path) -> None:
    source = tmp_path / "mid.jsonl"
    source.write_bytes(b'{"text": "first"}\n' + BOM + b'{"text": "second"}\n')
    with pytest.raises(SourceError, match=r"mid\.jsonl, line 2: invalid JSON \(Unexpected UTF-8 BOM"):
        for record in iter_records(resolve_inputs(source)):
            if record.error:
                raise SourceError(record.error)


# 5. a paragraph is the file's text between blank lines


def test_a_paragraph_keeps_its_line_endings_as_unit_file_does(tmp_path: Path) -> None:
    crlf = tmp_path / "crlf.txt"
    crlf.write_bytes(b"alpha\r\nbeta\r\n\r\ngamma\r\n")
    assert _texts(crlf, "paragraph") == [("alpha\r\nbeta",), ("gamma",)]
    assert _texts(crlf, "file") == [("alpha\r\nbeta\r\n\r\ngamma\r\n",)]
    lf = tmp_path / "lf.txt"
    lf.write_bytes(b"alpha\nbeta  \n  \ngamma\ndelta")
    assert _texts(lf, "paragraph") == [("alpha\nbeta  ",), ("gamma\ndelta",)]


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
        "tokformats: error: output takes a path prefix, not a folder: found --output l/; name the files inside it, "
        "e.g. --output l/corpus (a prefix beside it writes beside the folder)."
    )
    with pytest.raises(ConfigError, match=r"found output='l/'; name the files inside it, e\.g\. output='l/corpus'"):
        tokformats.tokenize(Path("a.txt"), tokenizer_path, "l/", "raw", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "l"] and not any(Path("l").iterdir())
