"""Where documents came from and what a sample holds (issue 27): tokenize's provenance sidecar, kept through convert
and merge, and ``explain`` of GPTSamples and blend samples down to documents, token ranges and source lines."""

from __future__ import annotations

import gzip
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

import tokformats
from tokformats import api
from tokformats.cli import main
from tokformats.core.provenance import sidecar_path
from tokformats.tokenization.sample_text import sample_texts
from tokformats.training import Blend, GPTSamples
from tokformats.training.explain import explain_sample, sample_sources


@pytest.fixture()
def inputs(tmp_path: Path) -> list[Path]:
    """A .jsonl with blank lines, a gzipped .jsonl and a .txt: distinct texts, so each names its source line."""
    texts = [f"{t} (number {k})".replace("\n", " ") for k, t in enumerate(sample_texts(90, seed=4))]
    lines = [json.dumps({"text": t}) for t in texts[:30]]
    lines[3:3] = ["", ""]
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with gzip.open(tmp_path / "b.jsonl.gz", "wt", encoding="utf-8") as handle:
        handle.write("".join(json.dumps({"text": t}) + "\n" for t in texts[30:60]))
    (tmp_path / "c.txt").write_text("\n".join(texts[60:]) + "\n", encoding="utf-8")
    return [tmp_path / "a.jsonl", tmp_path / "b.jsonl.gz", tmp_path / "c.txt"]


def _source_text(source: dict[str, object]) -> str:
    """The record's text, read at the recorded byte offset (decompressed) and checked against the line number."""
    path = Path(str(source["file"]))
    data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    offset = int(str(source["byte_offset"]))
    assert data[:offset].count(b"\n") + 1 == source["line"]
    line = data[offset:].split(b"\n", 1)[0].decode("utf-8")
    return str(json.loads(line)["text"]) if ".jsonl" in path.name else line


def _check_sources(reader: tokformats.TokenReader, tokenizer: Tokenizer, eos: bool = True) -> None:
    for k in range(len(reader)):
        source = reader.provenance(k)
        assert source is not None
        ids = tokenizer.encode(_source_text(source), add_special_tokens=False).ids
        assert np.asarray(reader[k])[: len(ids)].tolist() == ids
        assert len(reader[k]) == len(ids) + int(eos)


@pytest.mark.parametrize("format", ["megatron", "llmc", "timemoe", "datatrove"])
def test_tokenize_records_each_documents_file_line_and_byte_offset(
    tmp_path: Path, inputs: list[Path], tokenizer_path: Path, format: str
) -> None:
    summary = tokformats.tokenize(inputs, tokenizer_path, tmp_path / "out" / "c", format, progress=False)
    output = summary["outputs"]["text"]
    sidecar = Path(output["provenance"])
    assert sidecar.name.endswith(".provenance.npz") and sidecar.is_file()
    with tokformats.open(output["files"][0] if format in ("llmc", "datatrove") else output["path"]) as reader:
        assert len(reader) == 90
        tokenizer = Tokenizer.from_file(str(tokenizer_path))
        if format == "llmc":  # documents start with the delimiter there
            first = reader.provenance(0)
            assert first == {"file": str(inputs[0]), "line": 1, "byte_offset": 0}
        else:
            _check_sources(reader, tokenizer)
        assert reader.provenance(2) == {"file": str(inputs[0]), "line": 3, "byte_offset": _offset(inputs[0], 3)}
        assert reader.provenance(3)["line"] == 6  # two blank lines are no documents  # type: ignore[index]
        assert reader.provenance(-1)["file"] == str(inputs[2])  # type: ignore[index]
        assert sidecar_path(reader.path) == sidecar


def _offset(path: Path, line: int) -> int:
    return sum(len(x) for x in path.read_bytes().split(b"\n")[: line - 1]) + line - 1


def test_provenance_with_splits_and_executors_equals_a_single_process(
    tmp_path: Path, inputs: list[Path], tokenizer_path: Path
) -> None:
    single = tokformats.tokenize(
        inputs, tokenizer_path, tmp_path / "one" / "c", "megatron", split="8:2", progress=False
    )
    with ThreadPoolExecutor(2) as pool:
        parallel = tokformats.tokenize(
            inputs, tokenizer_path, tmp_path / "two" / "c", "megatron", split="8:2", executor=pool, progress=False
        )
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    seen = 0
    for name, output in single["outputs"].items():
        assert Path(output["provenance"]).read_bytes() == Path(parallel["outputs"][name]["provenance"]).read_bytes()
        with tokformats.open(output["path"]) as reader:
            _check_sources(reader, tokenizer)
            seen += len(reader)
    assert seen == 90


def test_provenance_off_and_datasets_without_it(tmp_path: Path, inputs: list[Path], tokenizer_path: Path) -> None:
    summary = tokformats.tokenize(inputs, tokenizer_path, tmp_path / "c", "megatron", provenance=False, progress=False)
    assert "provenance" not in summary["outputs"]["text"]
    assert not (tmp_path / "c_text_document.provenance.npz").exists()
    with tokformats.open(tmp_path / "c_text_document") as reader:
        assert reader.provenance(0) is None and reader.provenance_table() is None
        with pytest.raises(IndexError, match="document 90 is out of range"):
            reader.provenance(90)


def test_a_broken_or_foreign_sidecar_is_refused(tmp_path: Path, inputs: list[Path], tokenizer_path: Path) -> None:
    tokformats.tokenize(inputs, tokenizer_path, tmp_path / "c", "megatron", progress=False)
    sidecar = tmp_path / "c_text_document.provenance.npz"
    other = tmp_path / "d"
    tokformats.tokenize(inputs[:1], tokenizer_path, other, "megatron", progress=False)
    (tmp_path / "d_text_document.provenance.npz").replace(sidecar)  # 30 rows for 90 documents
    with tokformats.open(tmp_path / "c_text_document") as reader:
        with pytest.raises(tokformats.FormatError, match="records the sources of 30 documents, but the dataset"):
            reader.provenance(0)
    sidecar.write_bytes(b"PK\x03\x04 not really a zip")
    with tokformats.open(tmp_path / "c_text_document") as reader:
        with pytest.raises(tokformats.FormatError, match="not a provenance sidecar"):
            reader.provenance(0)


def test_convert_and_merge_keep_provenance(tmp_path: Path, inputs: list[Path], tokenizer_path: Path) -> None:
    tokformats.tokenize(inputs[:2], tokenizer_path, tmp_path / "a", "megatron", progress=False)
    tokformats.tokenize(inputs[2:], tokenizer_path, tmp_path / "b", "megatron", progress=False, provenance=False)
    tokformats.tokenize(inputs[2:], tokenizer_path, tmp_path / "c", "megatron", progress=False)
    a, b, c = (tmp_path / f"{x}_text_document" for x in "abc")
    with tokformats.open(a) as reader:
        expected = [reader.provenance(k) for k in range(len(reader))]
    summary = tokformats.convert(a, tmp_path / "shards", "timemoe")
    assert summary["provenance"] == tmp_path / "shards.provenance.npz"
    with tokformats.open(tmp_path / "shards") as converted:
        assert [converted.provenance(k) for k in range(len(converted))] == expected
    with api.merge([a, b, c], tmp_path / "abc") as merged:  # Megatron's own merge
        got = [merged.provenance(k) for k in range(len(merged))]
    assert got[:60] == expected and got[60:90] == [None] * 30
    assert [g["line"] for g in got[90:]] == list(range(1, 31)) and got[90]["file"] == str(inputs[2])  # type: ignore[index]
    tokformats.convert(a, tmp_path / "ta", "timemoe")
    tokformats.convert(c, tmp_path / "tc", "timemoe")
    with api.merge([tmp_path / "ta", tmp_path / "tc"], tmp_path / "tac") as merged:  # read and written again
        assert [merged.provenance(k) for k in range(len(merged))] == expected + got[90:]


def _blend(tmp_path: Path, inputs: list[Path], tokenizer_path: Path) -> tuple[Blend, list[tokformats.TokenReader]]:
    tokformats.tokenize(inputs[:2], tokenizer_path, tmp_path / "web", "megatron", progress=False)
    tokformats.tokenize(inputs[2:], tokenizer_path, tmp_path / "code", "timemoe", progress=False)
    readers = [tokformats.open(tmp_path / "web_text_document"), tokformats.open(tmp_path / "code")]
    samples = [GPTSamples(r, 16, seed=7, num_samples=200) for r in readers]
    return Blend(samples, [0.7, 0.3], 150), readers


def test_explain_names_the_documents_ranges_and_source_lines_of_blend_samples(
    tmp_path: Path, inputs: list[Path], tokenizer_path: Path
) -> None:
    blend, readers = _blend(tmp_path, inputs, tokenizer_path)
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    for i in np.random.default_rng(3).choice(len(blend), 40, replace=False).tolist():
        ranges = explain_sample(blend, i)
        assert ranges and all(len(piece) == 4 for piece in ranges)
        dataset = int(blend.dataset_index[i])
        assert {piece[0] for piece in ranges} == {dataset}
        pieces = [np.asarray(readers[d][doc][start:stop]) for d, doc, start, stop in ranges]
        assert np.concatenate(pieces).tolist() == blend[i].tolist()
        inner = explain_sample(blend.datasets[dataset], int(blend.dataset_sample_index[i]))
        assert [piece[1:] for piece in ranges] == inner
        for row in sample_sources(blend, i):
            ids = tokenizer.encode(_source_text(row["source"]), add_special_tokens=False).ids
            document = [*ids, tokenizer.token_to_id("<|endoftext|>")]  # the line's ids, then the appended eos
            got = readers[dataset][row["document"]][row["start"] : row["stop"]].tolist()
            assert got == document[row["start"] : row["stop"]]
    with pytest.raises(IndexError, match="sample 150 is out of range"):
        explain_sample(blend, 150)
    for reader in readers:
        reader.close()


def test_explain_splits_ranges_at_document_ends_and_skips_empty_documents(tmp_path: Path) -> None:
    with tokformats.create(tmp_path / "c", "megatron", vocab_size=100) as writer:
        writer.write_batch(np.arange(1, 13), [3, 0, 4, 5])
    with tokformats.open(tmp_path / "c") as reader:
        samples = GPTSamples(reader, 4, seed=1)
        for i in range(len(samples)):
            ranges = explain_sample(samples, i)
            assert all(0 <= start < stop <= reader.lengths[doc] for doc, start, stop in ranges)
            assert np.concatenate([reader[d][s:e] for d, s, e in ranges]).tolist() == samples[i].tolist()
    with pytest.raises(TypeError, match="GPTSamples, PackedSamples or a Blend"):
        explain_sample([np.arange(3)], 0)


def test_cli_explain_prints_ranges_and_sources(
    tmp_path: Path, inputs: list[Path], tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tokformats.tokenize(inputs, tokenizer_path, tmp_path / "c", "megatron", progress=False)
    path = str(tmp_path / "c_text_document")
    with tokformats.open(path) as reader:
        expected = sample_sources(GPTSamples(reader, 32, seed=5), 7)
    args = ["explain", path, "--sample", "7", "--sequence-length", "32", "--seed", "5"]
    assert main([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ranges"] == [dict(row, sample=7) for row in expected] and report["sample"] == 7
    assert main([*args, "-t", str(tokenizer_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    first = expected[0]
    assert out[0] == f"sample 7 of {report['samples']:,} holds 33 tokens of:"
    assert out[1] == (
        f"  {path} document {first['document']:,} tokens {first['start']:,}:{first['stop']:,}  <- "
        f"{first['source']['file']} line {first['source']['line']:,}"
    )


def test_explain_a_step_of_the_batch_sampler(
    tmp_path: Path, inputs: list[Path], tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tokformats.training import BatchSampler
    from tokformats.training.explain import step_samples

    tokformats.tokenize(inputs, tokenizer_path, tmp_path / "c", "megatron", progress=False)
    path = str(tmp_path / "c_text_document")
    with tokformats.open(path) as reader:
        samples = GPTSamples(reader, 32, seed=5)
        sampler = BatchSampler(samples, 8, 2, rank=0, world_size=2)
        served = [i for batch in sampler for i in batch]  # rank 0 of 2: the first half of every micro-step
        assert step_samples(sampler, 1) == list(range(8, 16))
        assert served[4:8] == [8, 9, 12, 13] and set(served[4:8]) <= set(step_samples(sampler, 1))
        shuffled = BatchSampler(samples, 8, 8, shuffle=True, seed=3)
        assert step_samples(shuffled, 0) == next(iter(shuffled))
        with pytest.raises(tokformats.ConfigError, match="step 99 is outside"):
            step_samples(sampler, 99)
        expected = [dict(row, sample=i) for i in range(8, 16) for row in sample_sources(samples, i)]
    args = ["explain", path, "--step", "1", "--global-batch-size", "8", "--sequence-length", "32", "--seed", "5"]
    assert main([*args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ranges"] == expected
    assert main([*args[:3], *args[5:]]) == 2  # --step without --global-batch-size
    assert "--step needs --global-batch-size" in capsys.readouterr().err


def test_cli_tokenize_records_provenance_unless_told_not_to(
    tmp_path: Path, inputs: list[Path], tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common = ["tokenize", str(inputs[0]), "-t", str(tokenizer_path), "--format", "megatron", "--json", "-q"]
    assert main([*common, "-o", str(tmp_path / "on")]) == 0
    assert json.loads(capsys.readouterr().out)["outputs"]["text"]["provenance"] == str(
        tmp_path / "on_text_document.provenance.npz"
    )
    assert main([*common, "-o", str(tmp_path / "off"), "--no-provenance"]) == 0
    assert "provenance" not in json.loads(capsys.readouterr().out)["outputs"]["text"]
    with tokformats.open(tmp_path / "on_text_document") as reader:
        assert reader.provenance(0) == {"file": str(inputs[0]), "line": 1, "byte_offset": 0}


def test_explain_is_a_method_of_samples_packed_rows_and_blends(tmp_path: Path) -> None:
    """``s.explain(i)`` on every kind of samples names ranges whose ids, end to end, are the sample's."""
    from tokformats import training
    from tokformats.testing import random_corpus

    flat, lengths = random_corpus(np.random.default_rng(3), 120, low=1, high=900)
    with tokformats.create(tmp_path / "m", "megatron", vocab_size=1000) as writer:
        writer.write_batch(flat, lengths)
    with tokformats.open(tmp_path / "m") as reader:
        samples = training.GPTSamples(reader, 16, seed=1)
        packed = training.PackedSamples(reader, 16, seed=1)
        blend = training.Blend([samples, training.GPTSamples(reader, 16, seed=2)], [0.5, 0.5], size=20)
        for index in (0, 3, -1):
            ids = np.concatenate([reader[d][a:b] for d, a, b in samples.explain(index)])
            np.testing.assert_array_equal(ids, samples[index][: len(ids)])
            row = packed[index]
            pieces = packed.explain(index)
            ids = np.concatenate([reader[d][a:b] for d, a, b in pieces])
            assert sum(row["doc_lens"][row["doc_lens"] > 0]) == len(ids)  # the row's documents, and nothing else
            shown = min(len(ids), len(row["tokens"]))  # a row of L + 1 tokens gives L as inputs
            np.testing.assert_array_equal(ids[:shown], row["tokens"][:shown])
            source, *rest = blend.explain(index)[0]
            assert source in (0, 1) and len(rest) == 3


def test_chat_tokenize_records_each_conversations_line(tmp_path: Path, tokenizer_path: Path) -> None:
    """A chat run records provenance as a text run does: a skipped record and a blank line are no documents."""
    chats = tmp_path / "chats.jsonl"
    turns = [[{"role": "user", "content": f"Question {k}?"}, {"role": "assistant", "content": f"Answer {k}."}]
             for k in range(4)]  # fmt: skip
    lines = [json.dumps({"messages": turns[0]}), "", json.dumps({"messages": "not a list"})]
    lines += [json.dumps({"messages": t}) for t in turns[1:]]
    chats.write_text("\n".join(lines) + "\n", encoding="utf-8")
    summary = tokformats.tokenize(chats, tokenizer_path, tmp_path / "sft", "megatron", chat="messages",
                                  on_error="skip", progress=False)  # fmt: skip
    assert summary["skipped"] == 1
    with tokformats.open(summary["outputs"]["text"]["path"]) as reader:
        assert len(reader) == 4
        found = [reader.provenance(k) for k in range(4)]
    assert [s["line"] for s in found if s] == [1, 4, 5, 6]
    assert all(s and s["file"] == str(chats) and s["byte_offset"] == _offset(chats, s["line"]) for s in found)
