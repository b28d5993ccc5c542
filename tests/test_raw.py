"""Raw headerless token streams: conformance, dtype refusal, splitting, sizes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tokformats
from tokformats import DTypeError, NoFilesError, SizeMismatchError, UnknownFormatError
from tokformats.testing import TokenFormatTests

EOS = 0


class TestRawConformance(TokenFormatTests):
    format = "raw"
    dtypes = ("uint16", "uint32", "int32")
    low_id = 1
    suffix = ".bin"

    def write_options(self) -> dict[str, Any]:
        return {"eos": EOS}

    def read_options(self, dtype: str) -> dict[str, Any]:
        return {"format": "raw", "dtype": dtype, "eos": EOS}

    def required_read_options(self, dtype: str) -> dict[str, Any]:
        return {"format": "raw", "dtype": dtype}

    def expected(self, document: np.ndarray) -> np.ndarray:
        return np.append(document, EOS)


def test_dtype_is_required_and_the_message_shows_each_candidate(tmp_path: Path) -> None:
    path = tmp_path / "train.bin"
    np.array([50256, 15496, 995, 50256], dtype="<u2").tofile(path)
    with pytest.raises(DTypeError) as caught:
        tokformats.open(path, format="raw")
    message = str(caught.value)
    assert "dtype is required" in message and str(path) in message
    assert "uint16: 4 tokens, starting [50256, 15496, 995, 50256]" in message
    assert "uint32: 2 tokens" in message and "int32: 2 tokens" in message
    assert "probably uint16" in message


def test_headerless_file_is_not_detected(tmp_path: Path) -> None:
    path = tmp_path / "train.bin"
    np.arange(1, 10, dtype="<u4").tofile(path)
    with pytest.raises(UnknownFormatError, match="pass format='raw' and dtype=") as caught:
        tokformats.detect(path)
    assert "probably uint32" in str(caught.value)


def test_size_must_be_a_multiple_of_the_itemsize(tmp_path: Path) -> None:
    path = tmp_path / "odd.bin"
    path.write_bytes(b"\x01\x00\x02\x00\x03")
    with pytest.raises(SizeMismatchError, match=r"5 bytes\) is not a multiple of the uint32 itemsize \(4\)"):
        tokformats.open(path, format="raw", dtype="uint32")
    with pytest.raises(DTypeError, match="uint32: impossible"):
        tokformats.open(path, format="raw")


def test_eos_and_bos_splitting(tmp_path: Path) -> None:
    path = tmp_path / "s.bin"
    np.array([5, 6, 0, 7, 0, 0, 8], dtype="<u2").tofile(path)
    with tokformats.open(path, format="raw", dtype="uint16", eos=0) as r:
        assert [d.tolist() for d in r] == [[5, 6, 0], [7, 0], [0], [8]]
        assert r.lengths.tolist() == [3, 2, 1, 1]
        assert r.metadata == {"eos": 0, "bos": None, "bytes": 14}
    with tokformats.open(path, format="raw", dtype="uint16", bos=0) as r:
        assert [d.tolist() for d in r] == [[5, 6], [0, 7], [0], [0, 8]]
    with tokformats.open(path, format="raw", dtype="uint16") as r:
        assert [d.tolist() for d in r] == [[5, 6, 0, 7, 0, 0, 8]]
        assert r.tokens[2:5].tolist() == [0, 7, 0]
        assert isinstance(r.tokens, np.memmap)


def test_splitting_scans_in_chunks(tmp_path: Path) -> None:
    from tokformats.core.documents import split_offsets

    tokens = np.array([1, 0, 2, 3, 0, 4, 0, 0, 5], dtype=np.uint16)
    for chunk in (1, 2, 3, 100):
        assert split_offsets(tokens, eos=0, chunk=chunk).tolist() == [0, 2, 5, 7, 8, 9]
        assert split_offsets(tokens, bos=0, chunk=chunk).tolist() == [0, 1, 4, 6, 7, 9]


def test_empty_file_opens(tmp_path: Path) -> None:
    path = tmp_path / "empty.bin"
    path.write_bytes(b"")
    with tokformats.open(path, format="raw", dtype="uint16", eos=0) as r:
        assert len(r) == 0 and r.num_tokens == 0 and r.tokens.shape == (0,)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(NoFilesError):
        tokformats.open(tmp_path / "nope.bin", format="raw", dtype="uint16")
    with pytest.raises(FileNotFoundError):
        tokformats.open(tmp_path / "nope.bin")


def test_writer_picks_dtype_from_vocab_size(tmp_path: Path) -> None:
    for vocab_size, dtype in ((50257, "uint16"), (65536, "uint16"), (65537, "uint32"), (128256, "uint32")):
        with tokformats.create(tmp_path / f"{vocab_size}.bin", "raw", vocab_size=vocab_size) as w:
            w.write([vocab_size - 1])
        assert w.dtype == np.dtype(dtype)
        assert np.fromfile(tmp_path / f"{vocab_size}.bin", dtype=dtype).tolist() == [vocab_size - 1]
    with pytest.raises(DTypeError, match="pass vocab_size="):
        tokformats.create(tmp_path / "x.bin", "raw")
    with pytest.raises(DTypeError, match="holds ids up to 65,535, but vocab_size is 100,000"):
        tokformats.create(tmp_path / "x.bin", "raw", dtype="uint16", vocab_size=100_000)


def test_little_endian_on_disk(tmp_path: Path) -> None:
    path = tmp_path / "le.bin"
    with tokformats.create(path, "raw", dtype=">u2") as w:
        w.write(np.array([1, 258], dtype=">u2"))
    assert path.read_bytes() == b"\x01\x00\x02\x01"
