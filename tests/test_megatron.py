"""Megatron indexed datasets: golden files, byte-identical writes and merges, malformed indexes, interop."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tokformats
from tokformats import DTypeError, FormatError, HeaderError, SizeMismatchError
from tokformats.core.reports import VerificationError
from tokformats.formats import megatron
from tokformats.testing import TokenFormatTests

NAMES = ["gpt2_uint16", "llama3_int32", "merged_uint16", "multimodal_int32", "part_b_uint16", "sentences_uint16"]


class TestMegatronConformance(TokenFormatTests):
    format = "megatron"
    dtypes = ("uint16", "int32", "uint8", "int64")


def expected(fixtures: Path, name: str) -> dict[str, Any]:
    return json.loads((fixtures / "megatron" / f"{name}.expected.json").read_text())


@pytest.mark.parametrize("name", NAMES)
def test_golden_files_read_exactly(fixtures: Path, name: str) -> None:
    facts = expected(fixtures, name)
    documents = facts["documents"]
    sequences = [s for d in documents for s in d]
    prefix = fixtures / "megatron" / name
    for path in (prefix, Path(f"{prefix}.bin"), Path(f"{prefix}.idx")):
        assert tokformats.detect(path) == "megatron"
    with tokformats.open(prefix) as reader:
        assert isinstance(reader, megatron.Reader)
        assert reader.dtype == np.dtype(facts["dtype"])
        assert len(reader) == len(documents)
        for k, document in enumerate(documents):
            assert reader[k].tolist() == [t for s in document for t in s]
        assert len(reader.sequences) == len(sequences)
        for j, sequence in enumerate(sequences):
            assert reader.sequences[j].tolist() == sequence
        assert reader.sequences.lengths.tolist() == [len(s) for s in sequences]
        modes = facts.get("sequence_modes")
        assert reader.multimodal == (modes is not None)
        if modes is not None:
            assert reader.sequence_modes is not None and reader.sequence_modes.tolist() == modes
        reader.verify()


def write_like_megatron(facts: dict[str, Any], prefix: Path) -> list[Path]:
    modes = facts.get("sequence_modes")
    with tokformats.create(prefix, "megatron", dtype=facts["dtype"], multimodal=modes is not None) as writer:
        assert isinstance(writer, megatron.Writer)
        position = 0
        for document in facts["documents"]:
            count = len(document)
            writer.write_document(document, None if modes is None else modes[position : position + count])
            position += count
    return writer.written


@pytest.mark.parametrize("name", NAMES)
def test_golden_files_rewrite_byte_for_byte(fixtures: Path, tmp_path: Path, name: str) -> None:
    written = write_like_megatron(expected(fixtures, name), tmp_path / name)
    assert [p.name for p in written] == [f"{name}.bin", f"{name}.idx"]
    for suffix in (".bin", ".idx"):
        assert (tmp_path / f"{name}{suffix}").read_bytes() == (fixtures / "megatron" / f"{name}{suffix}").read_bytes()


def test_add_item_end_document_matches_write_document(fixtures: Path, tmp_path: Path) -> None:
    facts = expected(fixtures, "sentences_uint16")
    with tokformats.create(tmp_path / "s", "megatron", vocab_size=50257) as writer:
        assert isinstance(writer, megatron.Writer)
        for document in facts["documents"]:
            for sequence in document:
                writer.add_item(sequence)
            writer.end_document()
    for suffix in (".bin", ".idx"):
        assert (tmp_path / f"s{suffix}").read_bytes() == (
            fixtures / "megatron" / f"sentences_uint16{suffix}"
        ).read_bytes()


def test_merge_is_byte_identical_to_add_index(fixtures: Path, tmp_path: Path) -> None:
    merged = megatron.merge(
        [fixtures / "megatron" / "gpt2_uint16", fixtures / "megatron" / "part_b_uint16"], tmp_path / "m"
    )
    assert len(merged) == 52
    merged.close()
    for suffix in (".bin", ".idx"):
        assert (tmp_path / f"m{suffix}").read_bytes() == (fixtures / "megatron" / f"merged_uint16{suffix}").read_bytes()


def test_merge_refuses_mixes(fixtures: Path, tmp_path: Path) -> None:
    with pytest.raises(DTypeError, match=r"\(int32\) with .*gpt2_uint16 \(uint16\)"):
        megatron.merge([fixtures / "megatron" / "gpt2_uint16", fixtures / "megatron" / "llama3_int32"], tmp_path / "x")
    with pytest.raises(FormatError, match="multimodal=True"):
        megatron.merge(
            [fixtures / "megatron" / "llama3_int32", fixtures / "megatron" / "multimodal_int32"], tmp_path / "x"
        )
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(tokformats.OutputExistsError):
        megatron.merge([fixtures / "megatron" / "gpt2_uint16"], fixtures / "megatron" / "part_b_uint16")


def test_merge_of_many_and_empty(tmp_path: Path) -> None:
    parts = []
    for k, docs in enumerate([[[1, 2], []], [], [[3], [4, 5, 6]]]):
        with tokformats.create(tmp_path / f"p{k}", "megatron", vocab_size=100) as writer:
            for doc in docs:
                writer.write(doc)
        parts.append(tmp_path / f"p{k}")
    with megatron.merge(parts, tmp_path / "all") as merged:
        assert [d.tolist() for d in merged] == [[1, 2], [], [3], [4, 5, 6]]
    with tokformats.create(tmp_path / "direct", "megatron", vocab_size=100) as writer:
        for doc in [[1, 2], [], [3], [4, 5, 6]]:
            writer.write(doc)
    assert (tmp_path / "all.idx").read_bytes() == (tmp_path / "direct.idx").read_bytes()


def test_dtype_rule_is_megatrons(tmp_path: Path) -> None:
    for vocab_size, dtype in ((50257, "uint16"), (65499, "uint16"), (65500, "int32"), (128256, "int32")):
        writer = tokformats.create(tmp_path / f"v{vocab_size}", "megatron", vocab_size=vocab_size)
        assert writer.dtype == np.dtype(dtype)
        writer.abort()
    with pytest.raises(DTypeError, match="uint32 was asked for"):
        tokformats.create(tmp_path / "u", "megatron", dtype="uint32")


def test_wraparound_is_refused(tmp_path: Path) -> None:
    with pytest.raises(tokformats.TokenRangeError, match="document 1 holds the value 70000"):
        with tokformats.create(tmp_path / "w", "megatron", dtype="uint16") as writer:
            writer.write([1])
            writer.write_document([[2, 3], [70000]])
    assert list(tmp_path.iterdir()) == []


def test_sequences_get_is_bounds_checked(fixtures: Path) -> None:
    with tokformats.open(fixtures / "megatron" / "sentences_uint16") as reader:
        assert isinstance(reader, megatron.Reader)
        whole = reader.sequences[3]
        assert reader.sequences.get(3, 1, 2).tolist() == whole[1:3].tolist()
        assert reader.sequences.get(-1).tolist() == reader.sequences[len(reader.sequences) - 1].tolist()
        with pytest.raises(IndexError, match="fall outside sequence 3"):
            reader.sequences.get(3, 1, len(whole))
        with pytest.raises(IndexError):
            reader.sequences[len(reader.sequences)]


def test_empty_dataset_opens(tmp_path: Path) -> None:
    with tokformats.create(tmp_path / "e", "megatron", vocab_size=10):
        pass
    assert (tmp_path / "e.bin").stat().st_size == 0
    with tokformats.open(tmp_path / "e") as reader:
        assert len(reader) == 0 and len(reader.sequences) == 0  # type: ignore[attr-defined]


def test_info_shows_megatron_facts(fixtures: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tokformats.cli import main

    assert main(["info", str(fixtures / "megatron" / "multimodal_int32"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["metadata"] == {"version": 1, "dtype_code": 4, "sequences": 24, "documents": 10, "multimodal": True}
    assert info["documents"] == 10 and info["dtype"] == "int32"


# -- malformed indexes ---------------------------------------------------------------------------


def build(tmp_path: Path, name: str = "good") -> tuple[Path, bytes]:
    with tokformats.create(tmp_path / name, "megatron", vocab_size=1000) as writer:
        assert isinstance(writer, megatron.Writer)
        writer.write_document([[1, 2, 3], [4]])
        writer.write([5, 6])
        writer.write([])
    return tmp_path / name, (tmp_path / f"{name}.idx").read_bytes()


@pytest.mark.parametrize("cut", range(0, 34))
def test_every_header_truncation_is_refused(tmp_path: Path, cut: int) -> None:
    prefix, index = build(tmp_path)
    Path(f"{prefix}.idx").write_bytes(index[:cut])
    with pytest.raises(FormatError):
        tokformats.open(prefix, format="megatron")


def patch(index: bytes, offset: int, fmt: str, value: int) -> bytes:
    return index[:offset] + struct.pack(fmt, value) + index[offset + struct.calcsize(fmt) :]


@pytest.mark.parametrize(
    ("offset", "fmt", "value", "error", "message"),
    [
        (0, "<B", ord("X"), HeaderError, "the magic is"),
        (9, "<Q", 2, HeaderError, "'version' is 2"),
        (17, "<B", 9, HeaderError, r"'dtype code' is 9 \(uint32, a fairseq-era code"),
        (17, "<B", 0, HeaderError, "'dtype code' is 0"),
        (18, "<Q", 5, SizeMismatchError, "N = 5 sequences"),
        (26, "<Q", 9, SizeMismatchError, "M = 9 document indices"),
        (18, "<Q", 2**62, SizeMismatchError, "should have"),
    ],
)
def test_lying_header_fields(tmp_path: Path, offset: int, fmt: str, value: int, error: type, message: str) -> None:
    prefix, index = build(tmp_path)
    Path(f"{prefix}.idx").write_bytes(patch(index, offset, fmt, value))
    with pytest.raises(error, match=message):
        tokformats.open(prefix, format="megatron")


def test_lying_arrays(tmp_path: Path) -> None:
    prefix, index = build(tmp_path)
    n, m = 4, 4  # sequences [1,2,3] [4] [5,6] [] ; documents 3 -> M = 4
    lengths_at, pointers_at, di_at = 34, 34 + 4 * n, 34 + 12 * n
    idx = Path(f"{prefix}.idx")

    idx.write_bytes(patch(index, pointers_at + 8 * (n - 1), "<q", 10_000))
    with tokformats.open(prefix) as reader:  # the far end is checked where it is used, not at open (no far page)
        with pytest.raises(SizeMismatchError, match=r"sequences end at byte 10,000"):
            reader[len(reader) - 1]
        with pytest.raises(SizeMismatchError, match=r"sequences end at byte 10,000"):
            reader.lengths  # noqa: B018
        assert "sequences end at byte 10,000" in reader.problems()[0].message
    idx.write_bytes(patch(index, pointers_at, "<q", 2))
    with pytest.raises(SizeMismatchError, match=r"sequence_pointers\[0\] is 2"):
        tokformats.open(prefix)  # the first pointer is on the page a first read touches: checked on open

    idx.write_bytes(patch(index, pointers_at + 8, "<q", 999))
    with tokformats.open(prefix) as reader:  # a middle pointer is only checked by verify()
        with pytest.raises(VerificationError, match=r"sequence_pointers\[1\]: is 999"):
            reader.verify()
        (problem,) = reader.problems()
        assert problem.file == str(idx) and problem.field == "sequence_pointers[1]"

    idx.write_bytes(patch(index, di_at + 8, "<q", 3))  # [0, 3, 3, 4] is fine; [0, 3, 2, ...] is not
    with tokformats.open(prefix) as reader:
        assert len(reader) == 3
    # The O(index) checks run where the whole index is used (lengths, problems) and accesses check what they touch.
    idx.write_bytes(patch(patch(index, di_at + 8, "<q", 3), di_at + 16, "<q", 1))
    with tokformats.open(prefix) as reader:
        with pytest.raises(HeaderError, match="document_indices decrease at entry 2"):
            reader.lengths  # noqa: B018
        with pytest.raises(HeaderError, match="must increase"):
            reader[1]
        assert "document_indices decrease" in reader.problems()[0].message

    idx.write_bytes(patch(index, di_at + 8 * (m - 1), "<q", 3))
    with tokformats.open(prefix) as reader:  # the last document index: where the documents are used whole
        with pytest.raises(HeaderError, match="must start at 0 and end at N = 4"):
            reader.lengths  # noqa: B018
        assert "must start at 0 and end at N = 4" in reader.problems()[0].message
    idx.write_bytes(patch(index, di_at, "<q", 1))
    with tokformats.open(prefix) as reader:  # megatron-core's first read touches no document index: nor does open
        with pytest.raises(HeaderError, match="must start at 0 and end at N = 4; found 1 and 4"):
            reader.lengths  # noqa: B018
        assert reader.sequences[0].tolist() == [1, 2, 3]

    idx.write_bytes(patch(index, lengths_at, "<i", 4))
    with tokformats.open(prefix) as reader:
        with pytest.raises(SizeMismatchError, match="add up to 7 uint16 tokens"):
            reader.lengths  # noqa: B018
        with pytest.raises(HeaderError, match=r"sequence_pointers\[1\]"):
            reader[0]

    idx.write_bytes(patch(patch(index, lengths_at, "<i", -1), lengths_at + 4, "<i", 5))
    with tokformats.open(prefix) as reader:
        with pytest.raises(HeaderError, match="negative"):
            reader.lengths  # noqa: B018


def test_pointers_are_checked_by_block_on_first_access(tmp_path: Path) -> None:
    """Reads check the pointers of the 4,096-sequence block they land in once, vectorised; a block with a lying
    pointer falls back to the per-access check, which names it; other blocks read on."""
    rng = np.random.default_rng(3)
    lengths = rng.integers(0, 9, 10_000)
    flat = rng.integers(0, 1000, int(lengths.sum()))
    with tokformats.create(tmp_path / "big", "megatron", vocab_size=1000) as writer:
        writer.write_batch(flat, lengths)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    with tokformats.open(tmp_path / "big") as reader:
        for k in [0, 1, 4095, 4096, 5000, 9999, -1, np.int64(7)]:
            position = int(k) % 10_000
            np.testing.assert_array_equal(reader[k], flat[offsets[position] : offsets[position + 1]])
        assert reader[0:3][2].tolist() == flat[offsets[2] : offsets[3]].tolist()
        with pytest.raises(IndexError, match="index 10000 is out of range"):
            reader[10_000]
    n = 10_000
    idx = Path(tmp_path / "big.idx")
    index = idx.read_bytes()
    pointers_at = 34 + 4 * n
    idx.write_bytes(patch(index, pointers_at + 8 * 5000, "<q", 2 * (int(offsets[5000]) + 1)))
    with tokformats.open(tmp_path / "big") as reader:
        np.testing.assert_array_equal(reader[100], flat[offsets[100] : offsets[101]])
        np.testing.assert_array_equal(reader[9000], flat[offsets[9000] : offsets[9001]])
        np.testing.assert_array_equal(reader[4500], flat[offsets[4500] : offsets[4501]])  # its neighbours are true
        with pytest.raises(HeaderError, match=r"sequence_pointers\[5000\] is"):
            reader[5000]
        with pytest.raises(HeaderError, match=r"sequence_pointers\[5000\] is"):
            reader[4999]


def test_fairseq_index_is_refused(tmp_path: Path) -> None:
    prefix, index = build(tmp_path)
    n = 4
    Path(f"{prefix}.idx").write_bytes(index[:18] + struct.pack("<Q", n) + index[34 : 34 + 12 * n])
    with pytest.raises(HeaderError, match="fairseq-era index"):
        tokformats.open(prefix)


def test_truncated_bin(tmp_path: Path) -> None:
    prefix, _ = build(tmp_path)
    data = Path(f"{prefix}.bin")
    whole = data.read_bytes()
    data.write_bytes(whole[:-1])
    with pytest.raises(SizeMismatchError, match="has 11 bytes, not a whole number of uint16 tokens"):
        tokformats.open(prefix)
    data.write_bytes(whole[:-2])  # a whole token short: found where the far end is first used, before any read
    expected = r"sequences end at byte 12 \(6 uint16 tokens\), but the file has 10 bytes"
    with tokformats.open(prefix) as reader:
        with pytest.raises(SizeMismatchError, match=expected):
            reader[len(reader) - 1]
        with pytest.raises(SizeMismatchError, match=expected):
            reader.lengths  # noqa: B018


def test_missing_bin(tmp_path: Path) -> None:
    prefix, _ = build(tmp_path)
    Path(f"{prefix}.bin").unlink()
    with pytest.raises(tokformats.NoFilesError, match="needs both"):
        tokformats.open(prefix, format="megatron")


@pytest.mark.parametrize("which", [".bin", ".idx"])
def test_a_file_that_is_no_regular_file_is_refused_without_blocking(tmp_path: Path, which: str) -> None:
    import os

    prefix, _ = build(tmp_path)
    odd = Path(f"{prefix}{which}")
    odd.unlink()
    os.mkfifo(odd)  # opened without O_NONBLOCK, a FIFO with no writer would hang the open
    with pytest.raises(tokformats.NoFilesError, match=f"{odd.name} is not a regular file; a Megatron"):
        tokformats.open(prefix, format="megatron")
    odd.unlink()
    odd.mkdir()
    with pytest.raises(tokformats.NoFilesError, match=f"{odd.name} is not a regular file; a Megatron"):
        tokformats.open(prefix, format="megatron")


def test_the_pins_come_from_the_descriptors_mapped_at_open(tmp_path: Path) -> None:
    import os

    prefix, _ = build(tmp_path)
    with tokformats.open(prefix, format="megatron") as reader:
        for path in (Path(f"{prefix}.idx"), Path(f"{prefix}.bin")):
            info = os.stat(path)
            assert reader._files._pins[path] == (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
        assert reader.tokens.filename == os.path.abspath(f"{prefix}.bin")
        assert reader.tokens.dtype == reader.dtype and len(reader.tokens) == reader.num_tokens


# -- interoperability with megatron-core ---------------------------------------------------------


@pytest.fixture(scope="module")
def indexed_dataset() -> Any:
    module = pytest.importorskip(
        "megatron.core.datasets.indexed_dataset", reason="megatron-core is not installed (pip install megatron-core)"
    )
    return module


def test_megatron_core_reads_what_we_write(indexed_dataset: Any, tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    documents = [
        [rng.integers(0, 50257, size=rng.integers(0, 50)).tolist() for _ in range(rng.integers(1, 4))]
        for _ in range(200)
    ]
    with tokformats.create(tmp_path / "ours", "megatron", vocab_size=50257) as writer:
        for document in documents:
            writer.write_document(document)
    dataset = indexed_dataset.IndexedDataset(str(tmp_path / "ours"))
    sequences = [s for d in documents for s in d]
    assert len(dataset) == len(sequences)
    for j, sequence in enumerate(sequences):
        assert dataset[j].tolist() == sequence
    assert dataset.document_indices.tolist() == np.cumsum([0] + [len(d) for d in documents]).tolist()


def test_we_read_what_megatron_core_writes(indexed_dataset: Any, tmp_path: Path) -> None:
    import torch

    rng = np.random.default_rng(8)
    builder = indexed_dataset.IndexedDatasetBuilder(str(tmp_path / "theirs.bin"), dtype=np.int32, multimodal=True)
    documents, modes = [], []
    for _ in range(100):
        document = [rng.integers(0, 128256, size=rng.integers(0, 30)) for _ in range(rng.integers(1, 4))]
        for sequence in document:
            mode = int(rng.integers(0, 3))
            builder.add_item(torch.from_numpy(sequence), mode)
            modes.append(mode)
        builder.end_document()
        documents.append(document)
    builder.finalize(str(tmp_path / "theirs.idx"))
    with tokformats.open(tmp_path / "theirs") as reader:
        assert isinstance(reader, megatron.Reader)
        assert len(reader) == 100 and reader.multimodal
        for k, document in enumerate(documents):
            assert reader[k].tolist() == np.concatenate(document).tolist()
        assert reader.sequence_modes is not None and reader.sequence_modes.tolist() == modes
    ours = write_like_megatron(
        {"dtype": "int32", "documents": [[s.tolist() for s in d] for d in documents], "sequence_modes": modes},
        tmp_path / "ours",
    )
    assert ours[0].read_bytes() == (tmp_path / "theirs.bin").read_bytes()
    assert ours[1].read_bytes() == (tmp_path / "theirs.idx").read_bytes()


def test_cli_merge(fixtures: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tokformats.cli import main

    sources = [str(fixtures / "megatron" / "gpt2_uint16"), str(fixtures / "megatron" / "part_b_uint16")]
    assert main(["merge", *sources, "-o", str(tmp_path / "ab")]) == 0
    assert "52 documents" in capsys.readouterr().out
    assert (tmp_path / "ab.idx").read_bytes() == (fixtures / "megatron" / "merged_uint16.idx").read_bytes()
    assert main(["merge", *sources, "-o", str(tmp_path / "ab")]) == 2
    assert "pass --overwrite to replace" in capsys.readouterr().err  # the CLI names its flag


def _index_advice(idx: Path) -> list[str]:
    """The kernel's flags of each mapping of ``idx`` in this process (``rr``: advised MADV_RANDOM)."""
    flags, current = [], None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if line.split()[-1:] == [str(idx)] and "-" in line.split()[0]:
            current = line
        elif line.startswith("VmFlags:") and current is not None:
            flags.append(line)
            current = None
    return flags


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads the kernel's flags from /proc")
def test_the_open_and_first_read_fault_single_index_pages_then_read_ahead_returns(tmp_path: Path) -> None:
    import gc

    prefix, _ = build(tmp_path)
    idx = Path(f"{prefix}.idx").resolve()
    for first_read in ("document", "sequence", "lengths"):
        reader = tokformats.open(prefix, format="megatron")
        assert [" rr" in flags for flags in _index_advice(idx)] == [True]  # MADV_RANDOM: no megabytes read around
        if first_read == "document":
            assert reader[0].tolist() == [1, 2, 3, 4]
        elif first_read == "sequence":
            assert reader.sequences[0].tolist() == [1, 2, 3]
        else:
            assert reader.sequence_lengths.tolist() == [3, 1, 2, 0]  # the index used whole: read ahead
        assert [" rr" in flags for flags in _index_advice(idx)] == [False]
        reader.close()
        gc.collect()
        assert _index_advice(idx) == []  # the advice holds no reference that keeps the map


def test_a_lying_document_index_still_raises_on_the_first_read(tmp_path: Path) -> None:
    prefix, index = build(tmp_path)
    di_at = 34 + 12 * 4
    idx = Path(f"{prefix}.idx")
    idx.write_bytes(patch(index, di_at + 8, "<q", 9))  # document 0 would end at sequence 9 of 4
    with tokformats.open(prefix, format="megatron") as reader:
        with pytest.raises(HeaderError, match=r"document_indices\[0\.\.1\] are 0 and 9"):
            reader[0]
        assert reader.sequences[0].tolist() == [1, 2, 3]  # sequences do not use the document index
    idx.write_bytes(patch(index, 34 + 4 * 4 + 8, "<q", 2))  # sequence 1's pointer lies
    with tokformats.open(prefix, format="megatron") as reader:
        with pytest.raises(HeaderError, match=r"sequence_pointers\[1\] is 2"):
            reader[0]


def _ids_file(path: Path, ids: np.ndarray) -> Path:
    path.write_bytes(ids.tobytes())
    return path


def test_append_data_file_gives_what_write_batch_gives(tmp_path: Path) -> None:
    """Documents appended from a file of ids (a kernel copy) between written ones: the same files as writing them
    all; a file of ids of another width is declined (False, nothing written)."""
    rng = np.random.default_rng(5)
    lengths = [rng.integers(0, 30, size=n) for n in (4, 7, 3)]
    pieces = [rng.integers(0, 60_000, size=int(k.sum())).astype(np.uint16) for k in lengths]
    with tokformats.create(tmp_path / "all", format="megatron", dtype=np.uint16) as writer:
        for ids, sizes in zip(pieces, lengths):
            writer.write_batch(ids, sizes)
    with tokformats.create(tmp_path / "appended", format="megatron", dtype=np.uint16) as writer:
        writer.write_batch(pieces[0], lengths[0])
        with open(_ids_file(tmp_path / "1.ids", pieces[1]), "rb") as source:
            assert writer.append_data_file(source, np.dtype(np.uint16), lengths[1])
        with open(_ids_file(tmp_path / "wide.ids", pieces[2].astype(np.uint32)), "rb") as source:
            assert not writer.append_data_file(source, np.dtype(np.uint32), lengths[2])
        writer.write_batch(pieces[2], lengths[2])
    for suffix in (".bin", ".idx"):
        assert (tmp_path / f"appended{suffix}").read_bytes() == (tmp_path / f"all{suffix}").read_bytes()


def test_a_failed_append_leaves_the_writer_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy that fails (a full disk), a source that shrinks while it is copied, a sequence too long for
    Megatron: the library's error (a full disk names the output), and nothing of the file in the .bin or the
    index, so that the dataset later closed is exactly what was written."""
    ids = np.arange(20, dtype=np.uint16)
    source_path = _ids_file(tmp_path / "part.ids", ids)

    def full_disk(source: Any, destination: Any, size: int, *, name: str) -> int:
        destination.write(b"\x00" * 6)  # part of it reached the file
        destination.flush()
        raise OSError(28, "No space left on device")

    def shrank(source: Any, destination: Any, size: int, *, name: str) -> int:
        destination.write(b"\x00" * 4)
        raise OSError(f"{name} shrank while it was being copied (36 bytes missing)")

    with tokformats.create(tmp_path / "d", format="megatron", dtype=np.uint16) as writer:
        writer.write_batch(np.array([1, 2, 3], np.uint16), [3])
        for copy, error, match in ((full_disk, OSError, "No space left"), (shrank, FormatError, "part.ids shrank")):
            with monkeypatch.context() as patched, open(source_path, "rb") as source:
                patched.setattr(megatron, "append_open_file", copy)
                with pytest.raises(error, match=match) as raised:
                    writer.append_data_file(source, np.dtype(np.uint16), np.array([5, 15]))
            assert not isinstance(raised.value, FormatError) or copy is shrank
            assert writer.num_documents == 1 and writer.num_tokens == 3
        huge = tmp_path / "huge.ids"
        with open(huge, "wb") as handle:
            handle.truncate((2**31 + 1) * 2)  # sparse: never copied
        with open(huge, "rb") as source:
            with pytest.raises(FormatError, match="does not fit Megatron's int32"):
                writer.append_data_file(source, np.dtype(np.uint16), np.array([2**31 + 1]))
        writer.write_batch(np.array([7, 8], np.uint16), [2])
    reader = tokformats.open(tmp_path / "d")
    assert [list(reader[i]) for i in range(len(reader))] == [[1, 2, 3], [7, 8]]
    assert reader.problems() == []
