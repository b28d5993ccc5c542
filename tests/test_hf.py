"""HF ``save_to_disk`` folders: ``datasets``' own output read zero-copy and exactly, ours opened by
``datasets.load_from_disk``, DatasetDict refusal, damaged offsets refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tokformats
from tokformats import FormatError
from tokformats.testing import TokenFormatTests, random_corpus

pytest.importorskip("pyarrow", reason="the hf format needs pyarrow (pip install 'tokformats[hf]')")

from tokformats.formats import hf


class TestHFConformance(TokenFormatTests):
    format = "hf"
    dtypes = ("int32", "int64", "uint16")


def _expected(goldens: Path) -> dict[str, Any]:
    return json.loads((goldens / "hf" / "expected.json").read_text())


def test_golden_folder_reads_exactly_and_zero_copy(goldens: Path) -> None:
    facts = _expected(goldens)
    folder = goldens / "hf" / "plain"
    assert tokformats.detect(folder) == "hf"
    with tokformats.open(folder) as reader:
        assert isinstance(reader, hf.Reader)
        assert reader.dtype == np.dtype(facts["dtype"])
        assert len(reader) == len(facts["documents"])
        assert [d.tolist() for d in reader] == facts["documents"]
        assert len(reader.files) == 2 and reader.metadata["record_batches"] == 4
        document = reader[1500]
        assert document.base is not None and not document.flags.owndata  # a view of the mapped file
        assert reader.problems() == []


def test_datasetdict_is_refused_naming_its_splits(goldens: Path) -> None:
    folder = goldens / "hf" / "dict"
    assert tokformats.detect(folder) == "hf"
    with pytest.raises(FormatError, match=r"DatasetDict; open one split's folder: .*train.*test"):
        tokformats.open(folder)
    with tokformats.open(folder / "train") as reader:
        assert reader.dtype == np.dtype(_expected(goldens)["dict_dtype"])
        assert [d.tolist() for d in reader] == _expected(goldens)["documents"][:50]


def test_other_column_and_missing_column(tmp_path: Path) -> None:
    with tokformats.create(tmp_path / "d", "hf", vocab_size=100, column="tokens") as writer:
        writer.write([1, 2])
    with pytest.raises(FormatError, match=r"no column 'input_ids'.*\['tokens'\].*column=NAME"):
        tokformats.open(tmp_path / "d")
    with tokformats.open(tmp_path / "d", column="tokens") as reader:
        assert reader[0].tolist() == [1, 2]


def _three_rows_with_offset(folder: Path, position: int, value: int) -> Path:
    """A folder of three rows (ids 0-9, lengths 3, 3, 4: offsets 0, 3, 6, 10) whose offset ``position`` is
    rewritten to ``value`` in the .arrow file; that file."""
    with tokformats.create(folder, "hf", vocab_size=100) as writer:
        writer.write_batch(np.arange(10), [3, 3, 4])
    arrow = next(folder.glob("*.arrow"))
    data = bytearray(arrow.read_bytes())
    at = data.find(np.array([0, 3, 6, 10], dtype="<i4").tobytes())
    assert at > 0
    data[at + 4 * position : at + 4 * position + 4] = np.array([value], dtype="<i4").tobytes()
    arrow.write_bytes(bytes(data))
    return arrow


def test_damaged_offsets_are_an_error(tmp_path: Path) -> None:
    folder = tmp_path / "d"
    _three_rows_with_offset(folder, 1, 7)  # 0, 7, 6, 10: backwards
    with tokformats.open(folder) as reader:  # offsets are checked where they are used, not at open
        assert reader.num_tokens == 10
        with pytest.raises(FormatError, match=r"input_ids offsets goes backwards at document 1 \(ends at 6 after 7\)"):
            reader[0]
        with pytest.raises(FormatError, match="backwards"):
            reader.lengths  # noqa: B018


def test_datasets_reads_ours(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    flat, lengths = random_corpus(np.random.default_rng(6), 2300, low=0, high=50_000)
    with tokformats.create(tmp_path / "d", "hf", vocab_size=50_257, max_shard_bytes=100_000) as writer:
        writer.write_batch(flat, lengths)
    assert len(list((tmp_path / "d").glob("data-*-of-*.arrow"))) > 1
    dataset = datasets.load_from_disk(str(tmp_path / "d"))
    assert len(dataset) == len(lengths)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    column = dataset["input_ids"]
    for k in range(len(lengths)):
        assert list(column[k]) == flat[offsets[k] : offsets[k + 1]].tolist()


def test_same_documents_same_folder(tmp_path: Path) -> None:
    flat, lengths = random_corpus(np.random.default_rng(7), 50, low=0, high=900)
    for name in ("a", "b"):
        with tokformats.create(tmp_path / name, "hf", vocab_size=1000) as writer:
            writer.write_batch(flat, lengths)
    for file in (tmp_path / "a").iterdir():
        assert file.read_bytes() == (tmp_path / "b" / file.name).read_bytes(), file.name


def test_tokenize_into_hf(tmp_path: Path, tokenizer_path: Path) -> None:
    texts = ["hello world", "", "second document"]
    summary = tokformats.tokenize(texts, tokenizer_path, tmp_path / "out", "hf", progress=False)
    with tokformats.open(tmp_path / "out") as reader:
        assert reader.format == "hf" and len(reader) == 3 and summary["documents"] == 3


def test_a_batch_offsets_are_read_and_checked_when_a_row_of_it_is_read(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.ipc  # the submodule open_stream is in

    folder = tmp_path / "d"
    lengths = np.arange(3_500) % 7 + 1
    with tokformats.create(folder, "hf", vocab_size=100) as writer:
        writer.write_batch(np.arange(int(lengths.sum())) % 100, lengths)
    arrow = next(folder.glob("*.arrow"))
    whole = pa.memory_map(str(arrow)).read_buffer()
    batches = list(pa.ipc.open_stream(whole))
    assert [len(b) for b in batches] == [1000, 1000, 1000, 500]
    at = batches[2].column("input_ids").buffers()[1].address - whole.address
    del batches, whole
    data = bytearray(arrow.read_bytes())
    data[at + 5 * 4 : at + 6 * 4] = np.array([10**8], dtype="<i4").tobytes()  # row 5 ends far past the batch's tokens
    arrow.write_bytes(bytes(data))
    starts = np.concatenate([[0], np.cumsum(lengths)])
    with tokformats.open(folder) as reader:
        assert len(reader) == 3_500  # counted from the batches' row counts: no offsets read
        assert reader[0].tolist() == list(range(1))
        assert reader[1_999].tolist() == (np.arange(starts[1_999], starts[2_000]) % 100).tolist()
        assert reader[3_000].tolist() == (np.arange(starts[3_000], starts[3_001]) % 100).tolist()
        message = rf"{arrow.name} \(record batch 2\): input_ids offsets goes backwards at document 5 \(ends at"
        with pytest.raises(FormatError, match=message):
            reader[2_000]
        with pytest.raises(FormatError, match=message):
            reader.offsets  # noqa: B018


def test_a_batch_spanning_past_its_values_is_refused_at_open(tmp_path: Path) -> None:
    folder = tmp_path / "d"
    _three_rows_with_offset(folder, 3, 10**9)  # the last offset: 1e9 tokens
    with pytest.raises(FormatError, match=r"data-00000-of-00001\.arrow: the Arrow stream is damaged .*larger than"):
        tokformats.open(folder)  # two offsets per batch, and the batch's structure, are checked at open


def test_a_batch_whose_offsets_start_past_zero_reads_as_arrow_does(tmp_path: Path) -> None:
    """Arrow lets a list column's offsets start past 0 (a sliced batch): its rows are the values from there."""
    import pyarrow as pa

    folder = tmp_path / "d"
    arrow = _three_rows_with_offset(folder, 0, 2)  # 2, 3, 6, 10: the first row is the value 2
    with pa.memory_map(str(arrow)) as source:
        expected = pa.ipc.open_stream(source).read_all().column("input_ids").to_pylist()
    assert expected == [[2], [3, 4, 5], [6, 7, 8, 9]]
    with tokformats.open(folder) as reader:
        assert [reader[k].tolist() for k in range(len(reader))] == expected
        assert reader.num_tokens == 8 and reader.tokens.tolist() == [2, 3, 4, 5, 6, 7, 8, 9]


def _hand_written_folder(folder: Path, batches: list[Any]) -> Path:
    """A ``save_to_disk`` folder whose one ``.arrow`` file holds ``batches`` (record batches of ``input_ids``)."""
    import pyarrow as pa
    import pyarrow.ipc  # the submodule new_stream is in

    folder.mkdir()
    arrow = folder / "data-00000-of-00001.arrow"
    with pa.OSFile(str(arrow), "wb") as sink, pa.ipc.new_stream(sink, batches[0].schema) as stream:
        for batch in batches:
            stream.write_batch(batch)
    feature = {"input_ids": {"feature": {"dtype": "int32", "_type": "Value"}, "_type": "Sequence"}}
    (folder / "dataset_info.json").write_text(json.dumps({"features": feature}))
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": arrow.name}]}))
    return arrow


def test_batches_of_empty_rows_and_no_rows_read_between_others(tmp_path: Path) -> None:
    """A record batch whose rows are all empty (Arrow stores its values buffer empty, at address 0) and one with no
    rows at all read as such between full batches."""
    import pyarrow as pa

    rows = [[[1, 2], [3]], [[], [], []], [], [[4, 5, 6]]]
    batches = [pa.record_batch([pa.array(r, type=pa.list_(pa.int32()))], names=["input_ids"]) for r in rows]
    _hand_written_folder(tmp_path / "d", batches)
    with tokformats.open(tmp_path / "d") as reader:
        assert len(reader) == 6 and reader.num_tokens == 6 and reader.metadata["record_batches"] == 4
        assert [reader[k].tolist() for k in range(6)] == [[1, 2], [3], [], [], [], [4, 5, 6]]
        assert reader.lengths.tolist() == [2, 1, 0, 0, 0, 3]


def test_null_token_ids_are_refused_naming_the_column(tmp_path: Path) -> None:
    import pyarrow as pa

    column = pa.array([[1, 2], [3, None]], type=pa.list_(pa.int32()))
    _hand_written_folder(tmp_path / "d", [pa.record_batch([column], names=["input_ids"])])
    with pytest.raises(FormatError, match=r"data-00000-of-00001\.arrow: column 'input_ids' has null token ids"):
        tokformats.open(tmp_path / "d")


def test_a_later_batch_with_a_negative_first_offset_is_refused_at_open(tmp_path: Path) -> None:
    """Every record batch's structure is validated at open (Arrow's check, per batch), the later ones too."""
    import pyarrow as pa

    rows = [[[1, 2], [3]], [[4], [5, 6]]]
    batches = [pa.record_batch([pa.array(r, type=pa.list_(pa.int32()))], names=["input_ids"]) for r in rows]
    arrow = _hand_written_folder(tmp_path / "d", batches)
    data = bytearray(arrow.read_bytes())
    second = data.rfind(np.array([0, 1, 3], dtype="<i4").tobytes())  # batch 1's offsets: 0, 1, 3
    data[second : second + 4] = np.array([-(10**6)], dtype="<i4").tobytes()
    arrow.write_bytes(bytes(data))
    with pytest.raises(FormatError, match=r"\.arrow: the Arrow stream is damaged .*chunk 1: Invalid: Negative offsets"):
        tokformats.open(tmp_path / "d")
