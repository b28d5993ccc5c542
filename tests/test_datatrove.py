"""datatrove ``.ds`` files: the owner's golden output read exactly, ours byte-identical to its writer and read by
``DatatroveFolderDataset``, dtype inference and refusals."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tokformats
from tokformats import DTypeError, FormatError, NoFilesError, SizeMismatchError
from tokformats.formats import datatrove
from tokformats.testing import TokenFormatTests, random_corpus


class TestDatatroveConformance(TokenFormatTests):
    format = "datatrove"
    dtypes = ("uint16", "uint32")
    suffix = ".ds"


def _expected(goldens: Path) -> dict[str, Any]:
    return json.loads((goldens / "datatrove" / "expected.json").read_text())


def test_golden_folder_reads_exactly(goldens: Path) -> None:
    facts = _expected(goldens)
    folder = goldens / "datatrove"
    assert tokformats.detect(folder) == "datatrove"
    for name in facts["files"]:
        for path in (folder / name, folder / f"{name}.index", folder / f"{name}.metadata"):
            assert tokformats.detect(path) == "datatrove"
    with tokformats.open(folder) as reader:
        assert isinstance(reader, datatrove.Reader)
        assert reader.dtype == np.dtype(facts["dtype"])
        assert [d.tolist() for d in reader] == facts["documents"]
        assert [p.name for p in reader.files] == facts["files"]
        assert reader.problems() == []


def test_writer_is_byte_identical_to_datatrove(goldens: Path, tmp_path: Path) -> None:
    """What DocumentTokenizer (no shuffling) wrote for rank 0, tokformats writes from the same documents."""
    facts = _expected(goldens)
    half = len(facts["documents"]) // 2
    target = tmp_path / datatrove.output_filename(None, 0)
    with tokformats.create(target, "datatrove", vocab_size=700, tokenizer_name="tokenizer.json") as writer:
        for document in facts["documents"][:half]:
            writer.write(document)
    for suffix in ("", ".index", ".metadata"):
        golden = goldens / "datatrove" / f"00000_unshuffled.ds{suffix}"
        assert Path(f"{target}{suffix}").read_bytes() == golden.read_bytes(), suffix


def test_metric_matches_humanize() -> None:
    humanize = pytest.importorskip("humanize")
    rng = np.random.default_rng(0)
    values = [0, 1, 9, 10, 99, 999, 1000, 9994, 9995, 99_950, 999_499, 999_500, 10**12, *rng.integers(0, 10**15, 2000)]
    for value in values:
        assert datatrove.metric(int(value)) == humanize.metric(int(value), unit="T"), value


def test_dtype_comes_from_the_index_without_metadata(tmp_path: Path) -> None:
    flat, lengths = random_corpus(np.random.default_rng(1), 20, low=0, high=900)
    with tokformats.create(tmp_path / "a.ds", "datatrove", dtype="uint32") as writer:
        writer.write_batch(flat, lengths)
    (tmp_path / "a.ds.metadata").unlink()
    with tokformats.open(tmp_path / "a.ds") as reader:
        assert reader.dtype == np.dtype("<u4") and reader.lengths.tolist() == lengths.tolist()
    with pytest.raises(DTypeError, match="token size of 4 bytes"):
        tokformats.open(tmp_path / "a.ds", dtype="uint16")


def test_without_index_the_file_is_one_document_and_needs_a_dtype(tmp_path: Path) -> None:
    with tokformats.create(tmp_path / "a.ds", "datatrove", vocab_size=100, save_index=False) as writer:
        writer.write([1, 2, 3])
        writer.write([4])
    (tmp_path / "a.ds.metadata").unlink()
    with pytest.raises(DTypeError, match="pass dtype='uint16'"):
        datatrove.Reader(tmp_path / "a.ds")
    with datatrove.Reader(tmp_path / "a.ds", dtype="uint16") as reader:
        assert [d.tolist() for d in reader] == [[1, 2, 3, 4]]


def test_an_index_deleted_after_open_is_an_error_not_one_document(tmp_path: Path) -> None:
    with tokformats.create(tmp_path / "a.ds", "datatrove", vocab_size=100) as writer:
        for document in ([1, 2], [3, 4, 5]):
            writer.write(document)
    reader = tokformats.open(tmp_path / "a.ds")
    (tmp_path / "a.ds.index").unlink()
    with pytest.raises(NoFilesError, match=r"a\.ds\.index was there when the reader opened"):
        len(reader)


def test_lying_index_is_an_error_naming_the_file(tmp_path: Path) -> None:
    with tokformats.create(tmp_path / "a.ds", "datatrove", vocab_size=100) as writer:
        for document in ([1, 2], [3, 4, 5], [6]):
            writer.write(document)
    index = tmp_path / "a.ds.index"
    index.write_bytes(np.array([2, 1, 6], dtype="<u8").tobytes())
    with tokformats.open(tmp_path / "a.ds") as reader, pytest.raises(FormatError, match=r"a\.ds\.index.*backwards"):
        reader[1]
    index.write_bytes(np.array([2, 5, 6], dtype="<u8").tobytes()[:-3])
    with pytest.raises(SizeMismatchError, match="not a whole number of uint64"):
        datatrove.Reader(tmp_path / "a.ds", dtype="uint16")


def test_loss_masks_are_read(tmp_path: Path) -> None:
    with tokformats.create(tmp_path / "a.ds", "datatrove", vocab_size=100) as writer:
        writer.write([1, 2, 3])
        writer.write([4, 5])
    (tmp_path / "a.ds.loss").write_bytes(bytes([0, 1, 1, 1, 0]))
    with tokformats.open(tmp_path / "a.ds") as reader:
        assert reader.loss_mask(0).tolist() == [0, 1, 1] and reader.loss_mask(0).dtype == np.uint8
        assert reader.loss_mask(-1).tolist() == [1, 0]
        assert reader.metadata["loss"] is True


def test_datatrove_reads_ours(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    dataset_module = pytest.importorskip("datatrove.utils.dataset")
    flat, lengths = random_corpus(np.random.default_rng(5), 300, low=0, high=60_000)
    folder = tmp_path / "folder"
    for rank, part in enumerate(np.array_split(np.arange(300), 2)):
        sizes = lengths[part]
        start = int(lengths[: part[0]].sum())
        with tokformats.create(folder / datatrove.output_filename(None, rank), "datatrove", vocab_size=65_000) as w:
            w.write_batch(flat[start : start + int(sizes.sum())], sizes)
    seq_len = 63
    theirs = dataset_module.DatatroveFolderDataset(str(folder), seq_len=seq_len, token_size=2, return_positions=True)
    with tokformats.open(folder) as reader:
        windows = []
        for shard in reader.shards:  # datatrove cuts seq_len + 1 windows per file, never across files
            usable = len(shard) // (seq_len + 1) * (seq_len + 1)
            windows.extend(np.asarray(shard[:usable]).reshape(-1, seq_len + 1))
        assert len(theirs) == len(windows)
        for k in range(len(theirs)):
            np.testing.assert_array_equal(theirs[k]["input_ids"].numpy(), windows[k])


def test_tokenize_into_datatrove(tmp_path: Path, tokenizer_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    texts = ["hello world", "", "second document here", "x" * 100]
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    summary = tokformats.tokenize(corpus, tokenizer_path, tmp_path / "out", "datatrove", progress=False)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    with tokformats.open(tmp_path / "out.ds") as reader:
        assert reader.format == "datatrove" and len(reader) == len(texts)
        for document, text in zip(reader, texts):
            assert document.tolist()[: len(tokenizer.encode(text).ids)] == tokenizer.encode(text).ids
    assert summary["documents"] == len(texts)


def test_folder_of_two_ranks_reads_in_path_order(goldens: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(goldens / "datatrove", copy)
    (copy / "nested").mkdir()
    for name in ("00001_unshuffled.ds", "00001_unshuffled.ds.index", "00001_unshuffled.ds.metadata"):
        (copy / name).rename(copy / "nested" / name)
    with tokformats.open(copy) as reader:
        assert [p.relative_to(copy).as_posix() for p in reader.files] == [
            "00000_unshuffled.ds",
            "nested/00001_unshuffled.ds",
        ]
