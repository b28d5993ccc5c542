"""dolma / OLMo memmaps: dolma's own ``MemmapWriter`` output read exactly (dtype inferred), ours read by OLMo-core's
``iter_document_indices`` and ``NumpyFSLDataset``, dolma's file roll-over rule, refusals."""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tokformats
from tokformats import DTypeError, FormatError, SizeMismatchError
from tokformats.formats import dolma
from tokformats.testing import TokenFormatTests, random_corpus


class TestDolmaConformance(TokenFormatTests):
    format = "dolma"
    dtypes = ("uint16", "uint32", "uint8")


def _expected(goldens: Path) -> dict[str, Any]:
    return json.loads((goldens / "dolma" / "expected.json").read_text())


def test_golden_files_read_exactly(goldens: Path) -> None:
    for name, facts in _expected(goldens).items():
        path = goldens / "dolma" / f"{name}.npy"
        assert tokformats.detect(path) == "dolma"
        with tokformats.open(path) as reader:
            assert isinstance(reader, dolma.Reader)
            assert reader.dtype == np.dtype(facts["dtype"])  # inferred: neither file records it
            assert [d.tolist() for d in reader] == facts["documents"]
            assert reader.document_metadata(1) == {"id": "doc-1", "src": f"s3://bucket/{name}.json.gz", "loc": "1"}


def test_golden_folder_mixing_dtypes_is_refused_and_a_glob_reads_one_dtype(goldens: Path) -> None:
    facts = _expected(goldens)
    with pytest.raises(FormatError, match="mix token dtypes"):
        tokformats.open(goldens / "dolma")
    with tokformats.open(str(goldens / "dolma" / "part-0-*.npy")) as reader:
        assert [d.tolist() for d in reader] == facts["part-0-00000"]["documents"] + facts["part-0-00001"]["documents"]


def test_writer_rolls_over_before_max_tokens_as_dolma_does(tmp_path: Path) -> None:
    with tokformats.create(tmp_path / "d", "dolma", vocab_size=100, max_tokens=10) as writer:
        writer.write_batch(np.arange(19) % 100, [4, 5, 1, 9])  # 4 + 5 + 1 = 10 reaches max_tokens: new file
    files = sorted((tmp_path / "d").glob("*.npy"))
    assert [f.name for f in files] == ["part-0-00000.npy", "part-0-00001.npy", "part-0-00002.npy"]
    assert [f.stat().st_size // 2 for f in files] == [9, 1, 9]
    rows = gzip.decompress((tmp_path / "d" / "part-0-00001.csv.gz").read_bytes()).decode()
    assert rows == "0,1,2,,2\r\n"  # start,end,id,src,loc with csv's line ending, as dolma's csv.writer writes


def test_rows_must_tile_the_file(tmp_path: Path) -> None:
    with tokformats.create(tmp_path / "d", "dolma", vocab_size=100) as writer:
        writer.write_batch(np.arange(6), [2, 4])
    csv = tmp_path / "d" / "part-0-00000.csv.gz"
    csv.write_bytes(gzip.compress(b"0,2,a,s,0\r\n3,6,b,s,1\r\n"))
    with tokformats.open(tmp_path / "d" / "part-0-00000.npy") as reader:
        assert reader[0].tolist() == [0, 1]  # row 1 is sound; row 2 is checked where it is used
        with pytest.raises(FormatError, match=r"row 2 starts at token 3, not where the previous document ends \(2\)"):
            reader[1]
        with pytest.raises(FormatError, match=r"row 2 starts at token 3"):
            reader.offsets  # noqa: B018
    csv.write_bytes(gzip.compress(b"0,2,a,s,0\r\n2,5,b,s,1\r\n"))
    with pytest.raises(SizeMismatchError, match="ends at token 5"):
        tokformats.open(tmp_path / "d" / "part-0-00000.npy")


def test_without_metadata_dtype_and_eos_are_needed(tmp_path: Path) -> None:
    with tokformats.create(tmp_path / "d", "dolma", vocab_size=100, eos=0) as writer:
        writer.write_batch(np.array([5, 6, 7]), [2, 1])
    (tmp_path / "d" / "part-0-00000.csv.gz").unlink()
    path = tmp_path / "d" / "part-0-00000.npy"
    with pytest.raises(DTypeError, match="pass dtype='uint16'"):
        dolma.Reader(path)
    with dolma.Reader(path, dtype="uint16", eos=0) as reader:
        assert [d.tolist() for d in reader] == [[5, 6, 0], [7, 0]]


def test_numpy_npy_is_not_dolma(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.arange(5))
    (tmp_path / "a.csv.gz").write_bytes(gzip.compress(b"0,5,x,y,0\n"))
    assert not tokformats.formats["dolma"].detect(tmp_path / "a.npy")
    assert tokformats.detect(tmp_path / "a.npy") == "sequences"


def test_olmo_core_reads_ours(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    numpy_dataset = pytest.importorskip("olmo_core.data.numpy_dataset")
    from olmo_core.data.utils import get_document_indices

    flat, lengths = random_corpus(np.random.default_rng(9), 300, low=0, high=50_000)
    with tokformats.create(tmp_path / "d", "dolma", vocab_size=50_280, max_tokens=3_000, eos=50_279) as writer:
        writer.write_batch(flat, lengths)
    with tokformats.open(tmp_path / "d") as reader:
        paths = [str(p) for p in reader.files]
        assert len(paths) > 1
        for path in paths:
            with tokformats.open(path) as one:
                assert get_document_indices(path) == list(zip(one.offsets[:-1].tolist(), one.offsets[1:].tolist()))
        dataset = numpy_dataset.NumpyFSLDataset(
            *paths, sequence_length=64, pad_token_id=0, eos_token_id=50_279, vocab_size=50_280, dtype=np.uint16
        )
        dataset.work_dir = tmp_path / "work"
        dataset.prepare()
        # OLMo-core cuts each file into size // 64 instances, never crossing files.
        instances = np.concatenate([np.asarray(s[: len(s) // 64 * 64]).reshape(-1, 64) for s in reader.shards])
        assert len(dataset) == len(instances)
        for k in range(len(dataset)):
            np.testing.assert_array_equal(dataset[k]["input_ids"].numpy(), instances[k])


def test_dolma_writer_output_equals_ours(goldens: Path, tmp_path: Path) -> None:
    """Same documents, same fields: the .npy bytes and the decompressed rows equal what dolma wrote."""
    facts = _expected(goldens)["part-0-00000"]
    source = "s3://bucket/part-0-00000.json.gz"
    with tokformats.create(tmp_path / "d", "dolma", dtype=facts["dtype"], max_tokens=10_000) as writer:
        for k, document in enumerate(facts["documents"]):
            writer.write(document, id=f"doc-{k}", src=source, loc=k)
    golden = goldens / "dolma" / "part-0-00000"
    assert (tmp_path / "d" / "part-0-00000.npy").read_bytes() == golden.with_suffix(".npy").read_bytes()
    ours = gzip.decompress((tmp_path / "d" / "part-0-00000.csv.gz").read_bytes())
    assert ours == gzip.decompress(Path(f"{golden}.csv.gz").read_bytes())


def test_tokenize_into_dolma(tmp_path: Path, tokenizer_path: Path) -> None:
    texts = ["hello world", "", "second document"]
    tokformats.tokenize(texts, tokenizer_path, tmp_path / "out", "dolma", progress=False)
    with tokformats.open(tmp_path / "out") as reader:
        assert reader.format == "dolma" and len(reader) == 3


@pytest.mark.parametrize(
    "text",
    [
        "0,3,a,src,0\r\n3,7,b,src,1\r\n",
        "0,3,a,src,0\n3,7,b,src,1",  # no final newline, bare \n
        '0,3,"a,b",src,0\r\n\r\n3,7,"x""y",src,1\r\n',  # quoted commas and quotes, an empty row
        '0,3,"line\nbreak",src,0\r\n3,7,b,src,1\r\n',  # a quoted newline: rows are not lines
        "0,3\r\n3,7\r\n",  # two fields only
        "00,003,a,s,0\r\n3,12345678901234567,a,s,0\r\n",  # leading zeros, 17 digits
        '"0","3",a,s,0\r\n3,7,b,s,1\r\n',  # quoted numbers: the csv parser reads them
        " 0,3,a,s,0\r\n",  # a space int() accepts
        "",
    ],
)
def test_start_end_columns_parse_like_the_csv_reader(tmp_path: Path, text: str) -> None:
    import gzip

    from tokformats.formats import dolma

    path = tmp_path / "x.csv.gz"
    path.write_bytes(gzip.compress(text.encode()))
    starts, ends, _ = dolma.read_metadata(path)
    fast_starts, fast_ends = dolma.read_start_end(path)
    assert fast_starts.tolist() == starts.tolist() and fast_ends.tolist() == ends.tolist()
    assert fast_starts.dtype == fast_ends.dtype == np.int64


@pytest.mark.parametrize(
    ("text", "message"),
    [("0,3,a\r\nx,7,b\r\n", "start,end columns must be integers"), ("0,3,a\r\n5\r\n", "row 2 has 1 field")],
)
def test_bad_start_end_columns_are_refused(tmp_path: Path, text: str, message: str) -> None:
    import gzip

    from tokformats.formats import dolma

    path = tmp_path / "x.csv.gz"
    path.write_bytes(gzip.compress(text.encode()))
    with pytest.raises(tokformats.FormatError, match=message):
        dolma.read_start_end(path)


@pytest.mark.parametrize("source", ["", "a,b", 'q"x', "line\nbreak", "plain.jsonl"])
def test_batch_rows_are_what_csv_writes(tmp_path: Path, source: str) -> None:
    import csv
    import io

    with tokformats.create(tmp_path / "o", "dolma", vocab_size=1000, source=source) as writer:
        writer.write_batch(np.arange(10), [3, 0, 7])
        writer.write([1, 2], id="x,y", loc=9)
    text = gzip.decompress((tmp_path / "o" / "part-0-00000.csv.gz").read_bytes()).decode()
    expected = io.StringIO()
    rows = [(0, 3, 0, source, 0), (3, 3, 1, source, 1), (3, 10, 2, source, 2), (10, 12, "x,y", source, 9)]
    csv.writer(expected).writerows(rows)
    assert text == expected.getvalue()
    with tokformats.open(tmp_path / "o") as reader:
        assert reader.lengths.tolist() == [3, 0, 7, 2]
        assert reader.document_metadata(3) == {"id": "x,y", "src": source, "loc": "9"}


def _many_rows(tmp_path: Path, documents: int = 50_000) -> tuple[Path, np.ndarray]:
    """A dolma file of ``documents`` short documents (rows well past the first read of the ``.csv.gz``)."""
    lengths = np.random.default_rng(3).integers(1, 9, size=documents)
    with tokformats.create(tmp_path / "d", "dolma", vocab_size=1000) as writer:
        writer.write_batch(np.arange(int(lengths.sum())) % 1000, lengths)
    return tmp_path / "d" / "part-0-00000.npy", lengths


def _rewrite_rows(npy: Path, edit: Any) -> None:
    path = dolma.metadata_path(npy)
    lines = gzip.decompress(path.read_bytes()).decode().splitlines(keepends=True)
    edit(lines)
    path.write_bytes(gzip.compress("".join(lines).encode()))


def test_the_first_document_reads_only_the_first_rows(tmp_path: Path) -> None:
    npy, lengths = _many_rows(tmp_path)
    ends = np.cumsum(lengths)

    def break_row_40000(lines: list[str]) -> None:  # starts one token late: the rows no longer tile the file
        fields = lines[39_999].split(",")
        lines[39_999] = ",".join([str(int(fields[0]) + 1), *fields[1:]])

    _rewrite_rows(npy, break_row_40000)
    with tokformats.open(npy, dtype="uint16") as reader:
        assert reader[0].tolist() == list(range(int(lengths[0])))
        assert len(reader[39_998]) == lengths[39_998]
        assert len(reader) == 50_000  # counted, not parsed: the broken row is found where it is used
        message = (
            rf"part-0-00000.csv.gz: row 40000 starts at token {int(ends[39_998]) + 1:,}, not where the previous "
            rf"document ends \({int(ends[39_998]):,}\)"
        )
        with pytest.raises(FormatError, match=message):
            reader[39_999]
        with pytest.raises(FormatError, match=message):  # the same error again, never a shorter table
            reader.offsets  # noqa: B018


def test_a_row_past_the_file_is_refused_where_it_is_read(tmp_path: Path) -> None:
    npy, lengths = _many_rows(tmp_path)
    tokens = int(lengths.sum())

    def end_past_the_file(lines: list[str]) -> None:
        fields = lines[30_000].split(",")
        lines[30_000] = ",".join([fields[0], str(tokens + 5), *fields[2:]])

    _rewrite_rows(npy, end_past_the_file)
    with tokformats.open(npy, dtype="uint16") as reader:
        assert len(reader[10]) == lengths[10]
        with pytest.raises(FormatError, match=rf"row 30001: end is token {tokens + 5:,}, past the {tokens:,} tokens"):
            reader[30_000]


def test_a_truncated_gzip_is_refused_at_open(tmp_path: Path) -> None:
    npy, _ = _many_rows(tmp_path)
    rows = dolma.metadata_path(npy)
    rows.write_bytes(rows.read_bytes()[: rows.stat().st_size // 2])
    for dtype in (None, "uint16"):  # the last row, which the dtype is checked against, is gone
        with pytest.raises(FormatError, match=r"part-0-00000\.csv\.gz: the gzip stream is truncated"):
            tokformats.open(npy, dtype=dtype)


def test_a_given_dtype_that_disagrees_with_the_rows_is_refused_at_open(tmp_path: Path) -> None:
    """The rows' last end and the file's size say uint16: a given uint32 would read every document wrong."""
    npy, _ = _many_rows(tmp_path, 100)
    message = r"dtype uint32 was given, but part-0-00000\.csv\.gz and the file size say uint16"
    with pytest.raises(DTypeError, match=message):
        tokformats.open(npy, dtype="uint32")


def test_rows_changed_after_open_are_refused(tmp_path: Path) -> None:
    npy, _ = _many_rows(tmp_path, 100)
    with tokformats.open(npy, dtype="uint16") as reader:
        _rewrite_rows(npy, lambda lines: lines.append("\r\n"))
        with pytest.raises(FormatError, match=r"part-0-00000\.csv\.gz changed since it was opened"):
            reader[0]


@pytest.mark.parametrize(
    "text", ["0,3,a,s,0\r\n\r\n3,7,b,s,1\r\n", "\n0,3\n\n\r\n3,7", "", "\r\n", '0,3,"a\nb",s,0\r\n3,7,b,s,1\r\n']
)
def test_rows_counted_without_parsing_are_the_parsed_rows(tmp_path: Path, text: str) -> None:
    from tokformats.formats._dolma_rows import RowStream, scan_rows

    path = tmp_path / "x.csv.gz"
    path.write_bytes(gzip.compress(text.encode()))
    tokens = 7 if "3,7" in text else 0
    counted = RowStream(path, tokens).total()
    ends = dolma.read_start_end(path)[1]
    assert counted == len(RowStream(path, tokens).columns()[1]) == len(ends)
    scan = scan_rows(path)  # the open's one pass: the same count (None where a quote leaves it to the parse)
    assert scan.rows in (None, counted) and (scan.rows is not None or '"' in text)
    assert scan.last_end in (None, int(ends[-1]) if len(ends) else 0)
    assert RowStream(path, tokens, scan).total() == counted


def test_vectorised_rows_are_what_csv_writes_across_batches_and_shards(tmp_path: Path) -> None:
    import csv
    import io

    rng = np.random.default_rng(11)
    batches = [rng.integers(0, 2_000, size=n) for n in (1, 700, 2, 1_300)]
    with tokformats.create(tmp_path / "o", "dolma", vocab_size=1000, max_tokens=900_000, source="s") as writer:
        for lengths in batches:
            writer.write_batch(np.zeros(int(lengths.sum()), dtype=np.uint16), lengths)
    lengths = np.concatenate(batches)
    texts = []
    for path in sorted((tmp_path / "o").glob("*.csv.gz")):
        texts.append(gzip.decompress(path.read_bytes()).decode())
    number, expected = 0, []
    for text in texts:
        expected_rows = io.StringIO()
        count = len(text.splitlines())
        ends = np.cumsum(lengths[number : number + count])
        starts = np.concatenate([[0], ends[:-1]])
        csv.writer(expected_rows).writerows((a, b, number + k, "s", number + k) for k, (a, b) in
                                            enumerate(zip(starts.tolist(), ends.tolist())))  # fmt: skip
        expected.append(expected_rows.getvalue())
        number += count
    assert number == len(lengths) and len(texts) > 1  # several shards, rows numbered across them
    assert texts == expected


@pytest.mark.parametrize("level", [1, 6, 9])
def test_rows_compressed_as_they_come_are_gzipfile_bytes(tmp_path: Path, level: int) -> None:
    import io

    from tokformats.formats._dolma_rows import GzipRows

    pieces = [b"0,3,0,,0\r\n", b"3,9,1,,1\r\n" * 1000, b""]
    out = io.BytesIO()
    rows = GzipRows(out, level)
    for piece in pieces:
        rows.write(piece)
    rows.close()
    reference = io.BytesIO()
    with gzip.GzipFile(fileobj=reference, mode="wb", mtime=0, filename="", compresslevel=level) as packed:
        packed.write(b"".join(pieces))
    assert out.getvalue() == reference.getvalue()


@pytest.mark.parametrize("source", ["", "nul\0byte", "a,b"])
def test_formatted_rows_equal_the_csv_writer(source: str) -> None:
    import csv
    import io

    from tokformats.formats._dolma_rows import format_rows

    ends = np.cumsum(np.random.default_rng(4).integers(0, 10**6, size=5_000)) + 10**9
    starts = np.concatenate([[10**9], ends[:-1]])
    quoted = io.StringIO()
    csv.writer(quoted).writerow([source])
    field = quoted.getvalue()[:-2] if source else ""
    expected = io.StringIO()
    csv.writer(expected).writerows((a, b, 7 + k, source, 7 + k) for k, (a, b) in enumerate(zip(starts, ends)))
    assert format_rows(starts, ends, 7, field.encode()) == expected.getvalue().encode()
    assert format_rows(ends, ends + 1, 0, b"") == b"".join(b"%d,%d,%d,,%d\r\n" % (e, e + 1, k, k) for k, e in
                                                         enumerate(ends.tolist()))  # fmt: skip


def test_rows_compressed_in_the_background_are_in_order_and_a_failure_is_raised(tmp_path: Path) -> None:
    import io

    from tokformats.formats._dolma_rows import GzipRows

    out = io.BytesIO()
    rows = GzipRows(out, 1)
    for k in range(5):
        rows.write(lambda k=k: b"%d\r\n" % k * 1000, background=k % 2 == 0)
    rows.close()
    assert gzip.decompress(out.getvalue()) == b"".join(b"%d\r\n" % k * 1000 for k in range(5))

    def broken() -> bytes:
        raise FormatError("the rows could not be made")

    rows = GzipRows(io.BytesIO(), 1)
    rows.write(broken, background=True)
    with pytest.raises(FormatError, match="the rows could not be made"):
        rows.write(b"0,1\r\n", background=True)
    with pytest.raises(FormatError, match="the rows could not be made"):  # caught above: close still refuses
        rows.close()


def test_an_aborted_writer_leaves_nothing_with_rows_in_flight(tmp_path: Path) -> None:
    lengths = np.full(10_000, 3)
    with pytest.raises(KeyError, match="stop"):
        with tokformats.create(tmp_path / "d", "dolma", vocab_size=100) as writer:
            writer.write_batch(np.zeros(int(lengths.sum()), dtype=np.uint16), lengths)  # rows compressed on a thread
            raise KeyError("stop")
    assert not list((tmp_path / "d").glob("*.npy")) and not list((tmp_path / "d").glob("*.csv.gz"))


def test_the_open_counts_the_rows_it_streams_for_the_last_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Opening streams each .csv.gz once (its last end checks the dtype) when its last row is not in a marked member
    of its own (a file another tool wrote: one member); the same pass counts the rows, so len() decompresses nothing
    again."""
    from tokformats.formats import _dolma_rows

    npy, lengths = _many_rows(tmp_path, 1000)
    _rewrite_rows(npy, lambda lines: None)  # one gzip member, as dolma's and OLMo-core's writers write
    with tokformats.open(npy, dtype="uint16") as reader:

        def again(*args: object) -> None:
            raise AssertionError("the rows were decompressed a second time to count them")

        monkeypatch.setattr(_dolma_rows, "scan_rows", again)
        assert len(reader) == len(lengths) == 1000
        assert reader[999].tolist() == [t % 1000 for t in range(int(lengths[:999].sum()), int(lengths.sum()))]


def _members(path: Path) -> list[bytes]:
    """The decompressed text of each gzip member of ``path``."""
    packed, texts = path.read_bytes(), []
    while packed:
        inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
        texts.append(inflate.decompress(packed))
        assert inflate.eof
        packed = inflate.unused_data
    return texts


def test_written_rows_end_with_the_last_row_in_a_marked_member_every_reader_reads(tmp_path: Path) -> None:
    from olmo_core.data.utils import get_document_indices

    from tokformats.formats._dolma_rows import scan_rows, tail_scan

    npy, lengths = _many_rows(tmp_path, 5000)
    rows = dolma.metadata_path(npy)
    members = _members(rows)
    ends = np.cumsum(lengths).tolist()
    assert len(members) == 2 and members[1] == f"{ends[-2]},{ends[-1]},4999,,4999\r\n".encode()
    assert members[1] not in members[0] and members[0].count(b"\n") == 4999
    assert gzip.decompress(rows.read_bytes()) == b"".join(members)  # gzip reads the members as one text
    with gzip.open(rows, "rt") as handle:
        assert len(handle.read().splitlines()) == 5000
    indices = get_document_indices(str(npy))  # OLMo-core's own reader (gzip.open + csv)
    assert [end for _, end in indices] == ends
    scan = tail_scan(rows)
    assert scan is not None and scan.last_end == ends[-1] and scan.rows is None
    assert scan_rows(rows).last_end == ends[-1] and scan_rows(rows).rows == 5000


def test_an_open_of_written_rows_decompresses_nothing_and_still_checks_the_dtype(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tokformats.formats import _dolma_rows

    npy, lengths = _many_rows(tmp_path, 2000)
    inflated = _dolma_rows._inflated

    def refused(*args: Any) -> Any:
        raise AssertionError("the open decompressed the rows")

    monkeypatch.setattr(_dolma_rows, "_inflated", refused)
    reader = tokformats.open(npy, dtype="uint16")
    with pytest.raises(DTypeError, match=r"dtype uint32 was given, but part-0-00000\.csv\.gz"):
        tokformats.open(npy, dtype="uint32")
    with pytest.raises(DTypeError, match="dtype uint8 was given"):
        tokformats.open(npy, dtype="uint8")
    monkeypatch.setattr(_dolma_rows, "_inflated", inflated)
    assert len(reader) == 2000  # counted where it is asked for
    assert reader[1999].tolist() == [t % 1000 for t in range(int(lengths[:1999].sum()), int(lengths.sum()))]


def _marked_tail(rows: Path) -> int:
    """Where the marked last member of ``rows`` starts."""
    from tokformats.formats._dolma_rows import _TAIL_HEAD, _TAIL_MARK

    packed = rows.read_bytes()
    return packed.rfind(_TAIL_MARK) - len(_TAIL_HEAD) - 1


@pytest.mark.parametrize("damage", ["crc", "size", "deflate", "trailing byte"])
def test_a_damaged_last_member_falls_back_to_the_streamed_pass_which_raises(tmp_path: Path, damage: str) -> None:
    from tokformats.formats._dolma_rows import tail_scan

    npy, _ = _many_rows(tmp_path, 2000)
    rows = dolma.metadata_path(npy)
    packed = bytearray(rows.read_bytes())
    position = {"crc": len(packed) - 8, "size": len(packed) - 4, "deflate": _marked_tail(rows) + 30}.get(damage)
    if position is None:
        packed += b"\0"
    else:
        packed[position] ^= 0x55
    rows.write_bytes(bytes(packed))
    assert tail_scan(rows) is None
    with pytest.raises(FormatError, match=r"part-0-00000\.csv\.gz"):
        tokformats.open(npy, dtype="uint16")


def test_a_lying_last_member_is_checked_and_a_broken_stream_before_it_raises_where_read(tmp_path: Path) -> None:
    npy, lengths = _many_rows(tmp_path, 2000)
    rows = dolma.metadata_path(npy)
    packed = rows.read_bytes()
    tail = _marked_tail(rows)
    total = int(lengths.sum())
    lying = gzip.compress(f"{total - 1},{total * 2},1999,,1999\r\n".encode(), mtime=0)
    from tokformats.formats._dolma_rows import _TAIL_HEAD, _TAIL_MARK

    marked = _TAIL_HEAD + lying[8:9] + _TAIL_MARK + lying[10:]  # the marker put in gzip's own header
    rows.write_bytes(packed[:tail] + marked)
    with pytest.raises(
        DTypeError, match=r"dtype uint16 was given, but part-0-00000\.csv\.gz and the file size say uint8"
    ):
        tokformats.open(npy, dtype="uint16")
    # the first member cut short: the marked member still reads (the open passes), the rows raise where they are used
    rows.write_bytes(packed[: tail // 2] + packed[tail:])
    reader = tokformats.open(npy, dtype="uint16")
    with pytest.raises(FormatError, match=r"part-0-00000\.csv\.gz"):
        len(reader)
    with pytest.raises(FormatError, match=r"part-0-00000\.csv\.gz"):
        reader[1999]


def test_a_member_appended_by_another_tool_is_read_by_the_streamed_pass(tmp_path: Path) -> None:
    from tokformats.formats._dolma_rows import tail_scan

    npy, lengths = _many_rows(tmp_path, 100)
    rows = dolma.metadata_path(npy)
    total = int(lengths.sum())
    rows.write_bytes(rows.read_bytes() + gzip.compress(f"{total},{total + 3},100,,100\r\n".encode()))
    npy.write_bytes(npy.read_bytes() + np.array([7, 8, 9], dtype=np.uint16).tobytes())
    assert tail_scan(rows) is None  # the last member is not marked: its row is found by the streamed pass
    with tokformats.open(npy, dtype="uint16") as reader:
        assert len(reader) == 101 and reader[100].tolist() == [7, 8, 9]
    with pytest.raises(DTypeError, match="dtype uint32 was given"):
        tokformats.open(npy, dtype="uint32")


def _one_member_folder(tmp_path: Path, files: int = 3, documents: int = 3000) -> tuple[Path, np.ndarray]:
    """A folder of ``files`` dolma files whose rows are one gzip member each (as dolma's and OLMo-core's writers
    write them: no marked last member), and the documents' lengths."""
    lengths = np.random.default_rng(5).integers(1, 9, size=documents)
    total = int(lengths.sum())
    with tokformats.create(tmp_path / "d", "dolma", vocab_size=1000, max_tokens=total // files + 8) as writer:
        writer.write_batch(np.arange(total) % 1000, lengths)
    for npy in sorted((tmp_path / "d").glob("*.npy")):
        _rewrite_rows(npy, lambda lines: None)
    assert len(list((tmp_path / "d").glob("*.npy"))) == files
    return tmp_path / "d", lengths


def _streamed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the rows files :func:`scan_rows` streams from now on, in order."""
    from tokformats.formats import _dolma_rows

    names: list[str] = []
    scan = _dolma_rows.scan_rows

    def recorded(path: Path, *args: Any) -> Any:
        names.append(path.name)
        return scan(path, *args)

    monkeypatch.setattr(_dolma_rows, "scan_rows", recorded)
    return names


def test_golden_single_member_files_told_the_dtype_are_streamed_where_first_used(
    goldens: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """dolma's own files (one gzip member each): the open reads no row; a file's rows are streamed once, for its
    last row's end (the dtype check) and its count, when it is first used."""
    facts = _expected(goldens)
    streamed = _streamed(monkeypatch)
    with tokformats.open(str(goldens / "dolma" / "part-0-*.npy"), dtype="uint16") as reader:
        assert streamed == []
        assert reader[0].tolist() == facts["part-0-00000"]["documents"][0]
        assert streamed == ["part-0-00000.csv.gz"]
        documents = facts["part-0-00000"]["documents"] + facts["part-0-00001"]["documents"]
        assert reader[len(documents) - 1].tolist() == documents[-1]
        assert len(reader) == len(documents)
        assert streamed == ["part-0-00000.csv.gz", "part-0-00001.csv.gz"]  # counted by the same pass
        assert [d.tolist() for d in reader] == documents


def test_a_wrong_dtype_told_for_one_member_files_is_refused_before_a_token_is_read(goldens: Path) -> None:
    """The open of several files told the dtype defers each file's last-row check; every way to a token of the
    file makes it first. (OLMo-core reads the file as the dtype it is told: other tokens, no error.)"""
    pattern = str(goldens / "dolma" / "part-0-*.npy")
    message = r"part-0-00000\.npy: dtype uint8 was given, but part-0-00000\.csv\.gz and the file size say uint16"
    for read in (lambda r: r[0], lambda r: np.asarray(r.tokens[:3]), lambda r: r.shards[0][:3].tolist(), len):
        reader = tokformats.open(pattern, dtype="uint8")
        with pytest.raises(DTypeError, match=message):
            read(reader)
        with pytest.raises(DTypeError, match=message):  # and again: never served after the first refusal
            reader[0]
    reader = tokformats.open(pattern, dtype="uint8")
    with pytest.raises(DTypeError, match=message):
        reader.offsets  # noqa: B018
    # the glob's second file, read first: its own check
    reader = tokformats.open(pattern, dtype="uint8")
    with pytest.raises(DTypeError, match=r"part-0-00001\.npy: dtype uint8 was given"):
        reader.shards[1][:1].tolist()
    # what the open still checks: a size that is no whole number of the given dtype's tokens
    with pytest.raises(SizeMismatchError, match=r"part-0-00001\.npy: 1,070 bytes is not a whole number of uint32"):
        tokformats.open(pattern, dtype="uint32")


def test_one_member_rows_later_files_and_len_read_lazily(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder, lengths = _one_member_folder(tmp_path)
    ends = np.cumsum(lengths)
    streamed = _streamed(monkeypatch)
    with tokformats.open(folder, dtype="uint16") as reader:
        assert streamed == []
        assert reader[0].tolist() == list(range(int(lengths[0])))
        last = len(lengths) - 1
        assert reader[last].tolist() == [t % 1000 for t in range(int(ends[-2]), int(ends[-1]))]
        # the middle file's rows were parsed to their end on the way to the last document: its check reads them
        assert streamed == ["part-0-00000.csv.gz", "part-0-00002.csv.gz"]
        assert len(reader) == len(lengths)
        assert streamed == ["part-0-00000.csv.gz", "part-0-00002.csv.gz"]  # counted by the passes made
        np.testing.assert_array_equal(reader.lengths, lengths)
        assert reader.problems() == []
    del streamed[:]
    with tokformats.open(folder, dtype="uint16") as reader:
        assert len(reader) == len(lengths)  # each file streamed once: its count and its check
        assert len(reader[len(lengths) - 1]) == lengths[-1]  # found by bisection, from the counts
        assert reader[1].tolist() == list(range(int(ends[0]), int(ends[1])))
    assert streamed == ["part-0-00000.csv.gz", "part-0-00001.csv.gz", "part-0-00002.csv.gz"]


@pytest.mark.parametrize("damage", ["truncated", "appended byte", "flipped byte"])
def test_one_member_rows_damaged_at_the_end_raise_where_reached(tmp_path: Path, damage: str) -> None:
    """A damaged end of a later file's rows, which the open no longer reads: the library's error naming the file
    where its rows, tokens or count are used, never a zlib or csv error, never a shorter dataset."""
    folder, lengths = _one_member_folder(tmp_path)
    rows = folder / "part-0-00002.csv.gz"
    packed = bytearray(rows.read_bytes())
    if damage == "truncated":
        del packed[-40:]
    elif damage == "appended byte":
        packed += b"\x01"
    else:
        packed[-12] ^= 0x40  # inside the last deflate block (or its CRC)
    rows.write_bytes(bytes(packed))
    reader = tokformats.open(folder, dtype="uint16")
    assert reader[0].tolist() == list(range(int(lengths[0])))  # the first file is whole
    for use in (len, lambda r: r[len(lengths) - 1], lambda r: r.offsets, lambda r: r.shards[2][:1]):
        with pytest.raises(FormatError, match=r"part-0-00002\.csv\.gz"):
            use(reader)
    found = tokformats.open(folder, dtype="uint16").problems()
    assert len(found) == 1 and "part-0-00002.csv.gz" in found[0].message


def test_the_streamed_count_skips_blank_lines_as_the_parser_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blank lines (``\\n``, ``\\r\\n``) between rows, at the start and across the counter's steps: the streamed count
    (what ``len()`` serves) equals the rows the parser reads."""
    from tokformats.formats import _dolma_rows

    monkeypatch.setattr(_dolma_rows, "_LINES_STEP", 5)  # steps end inside lines and between \r and \n
    npy = tmp_path / "a.npy"
    np.arange(9, dtype=np.uint16).tofile(npy)
    text = b"\r\n0,2,a,,0\r\n\r\n\n2,5,b,,1\n\n5,5,c,,2\r\n5,9,d,,3\r\n\n"
    dolma.metadata_path(npy).write_bytes(gzip.compress(text))
    scan = _dolma_rows.scan_rows(dolma.metadata_path(npy))
    assert (scan.last_end, scan.rows) == (9, 4)
    with tokformats.open(npy, dtype="uint16") as reader:
        assert len(reader) == 4
        assert [d.tolist() for d in reader] == [[0, 1], [2, 3, 4], [], [5, 6, 7, 8]]
