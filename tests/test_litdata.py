"""litdata TokensLoader folders: litdata's own chunks read exactly, ours byte-identical chunk for chunk and read by
``StreamingDataset(item_loader=TokensLoader(...))``, refusals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tokformats
from tokformats import FormatError, SizeMismatchError
from tokformats.formats import litdata
from tokformats.testing import TokenFormatTests, random_corpus


class TestLitdataConformance(TokenFormatTests):
    format = "litdata"
    dtypes = ("uint16", "uint32", "int32", "int64")


def _expected(goldens: Path) -> dict[str, Any]:
    return json.loads((goldens / "litdata" / "expected.json").read_text())


def test_golden_folder_reads_exactly(goldens: Path) -> None:
    facts = _expected(goldens)
    folder = goldens / "litdata"
    assert tokformats.detect(folder) == "litdata"
    with tokformats.open(folder) as reader:
        assert isinstance(reader, litdata.Reader)
        assert reader.dtype == np.dtype(facts["dtype"])
        assert [d.tolist() for d in reader] == facts["documents"]
        assert len(reader.files) > 1 and reader.problems() == []


def test_chunks_are_byte_identical_to_litdata(goldens: Path, tmp_path: Path) -> None:
    facts = _expected(goldens)
    with tokformats.create(tmp_path / "d", "litdata", dtype="uint16", chunk_size=facts["chunk_size"]) as writer:
        for document in facts["documents"]:
            writer.write(document)
    theirs = json.loads((goldens / "litdata" / "index.json").read_text())
    ours = json.loads((tmp_path / "d" / "index.json").read_text())
    assert ours["chunks"] == theirs["chunks"]
    assert {k: v for k, v in ours["config"].items()} == theirs["config"]
    for chunk in theirs["chunks"]:
        name = chunk["filename"]
        assert (tmp_path / "d" / name).read_bytes() == (goldens / "litdata" / name).read_bytes(), name


def test_litdata_streams_ours(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    streaming = pytest.importorskip("litdata")
    from litdata.streaming.item_loader import TokensLoader

    flat, lengths = random_corpus(np.random.default_rng(8), 400, low=0, high=60_000)
    with tokformats.create(tmp_path / "d", "litdata", vocab_size=60_000, chunk_size=2_000) as writer:
        writer.write_batch(flat, lengths)
    block = 16
    dataset = streaming.StreamingDataset(str(tmp_path / "d"), item_loader=TokensLoader(block_size=block))
    with tokformats.open(tmp_path / "d") as reader:
        blocks = [np.asarray(s[: len(s) // block * block]).reshape(-1, block) for s in reader.shards]
        expected = np.concatenate(blocks)
    assert len(dataset) == len(expected)
    for k in range(len(dataset)):
        np.testing.assert_array_equal(np.asarray(dataset[k]), expected[k])


def test_truncated_chunk_and_wrong_loader_are_refused(tmp_path: Path) -> None:
    with tokformats.create(tmp_path / "d", "litdata", vocab_size=100, chunk_size=10) as writer:
        writer.write_batch(np.arange(30) % 100, [8, 8, 14])
    chunk = tmp_path / "d" / "chunk-0-1.bin"
    chunk.write_bytes(chunk.read_bytes()[:-2])
    with pytest.raises(SizeMismatchError, match=r"chunk-0-1\.bin.*truncated"):
        tokformats.open(tmp_path / "d")
    index = json.loads((tmp_path / "d" / "index.json").read_text())
    index["config"]["compression"] = "zstd"
    (tmp_path / "d" / "index.json").write_text(json.dumps(index))
    with pytest.raises(FormatError, match=r"config\.compression is 'zstd'"):
        litdata.Reader(tmp_path / "d")


def test_a_document_larger_than_a_chunk_gets_its_own(tmp_path: Path) -> None:
    with tokformats.create(tmp_path / "d", "litdata", vocab_size=100, chunk_size=10) as writer:
        writer.write_batch(np.arange(30) % 100, [3, 25, 2])
    index = json.loads((tmp_path / "d" / "index.json").read_text())
    assert [c["dim"] for c in index["chunks"]] == [3, 25, 2]


def test_tokenize_into_litdata(tmp_path: Path, tokenizer_path: Path) -> None:
    texts = ["hello world", "", "second document"]
    tokformats.tokenize(texts, tokenizer_path, tmp_path / "out", "litdata", progress=False)
    with tokformats.open(tmp_path / "out") as reader:
        assert reader.format == "litdata" and len(reader) == 3
