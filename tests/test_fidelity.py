"""Regressions of issue 11 ("nothing lost, nothing surprising"): each test failed on the code before the fix.

(Item 1, .pt tails: test_pt.py::test_a_finished_job_leaves_every_token_in_a_shard; item 3, llm.c delimiters:
test_llmc.py::test_default_delimiter_of_another_tokenizer_is_the_first_token; item 6, pickling defaults:
conformance.py::test_pickle_of_a_reader_opened_with_defaults, run for every format.)
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

import tokformats
from tokformats import ConfigError, DataWarning, FormatError


def megatron_source(tmp_path: Path, documents: list[list[int]], name: str = "src") -> Path:
    with tokformats.create(tmp_path / name, "megatron", vocab_size=50257) as writer:
        for document in documents:
            writer.write(document)
    return tmp_path / name


# -- item 2: boundaries survive conversion into delimiter formats -------------------------------------------


def test_convert_into_llmc_keeps_documents_or_refuses(tmp_path: Path) -> None:
    source = megatron_source(tmp_path, [[5, 6], [], [7, 8, 9]])
    with pytest.raises(ConfigError, match=r"bos=ID \(CLI --to-bos ID\)|bos=ID"):
        tokformats.convert(source, tmp_path / "merged", "llmc")
    assert not list(tmp_path.glob("merged*")), "a refusal writes nothing"
    summary = tokformats.convert(source, tmp_path / "kept", "llmc", bos=50256)
    assert summary["documents"] == 3 and summary["tokens"] == 8 and summary["delimiters_added"] == 3
    with tokformats.open(tmp_path / "kept_000000.bin") as reader:  # default options
        assert [d.tolist() for d in reader] == [[50256, 5, 6], [50256], [50256, 7, 8, 9]]


def test_convert_uses_the_sources_own_delimiter(tmp_path: Path) -> None:
    # Documents as preprocess_data.py writes them (each ends with EOD, an empty one has none).
    source = megatron_source(tmp_path, [[5, 6, 50256], [], [7, 50256]])
    summary = tokformats.convert(source, tmp_path / "flat.bin", "raw")
    assert summary["read_with"] == {"format": "raw", "dtype": "uint16", "eos": 50256} and summary["documents"] == 3
    assert summary["delimiters_added"] == 1  # only the empty document lacked it
    with tokformats.open(tmp_path / "flat.bin", format="raw", dtype="uint16", eos=50256) as reader:
        assert [d.tolist() for d in reader] == [[5, 6, 50256], [50256], [7, 50256]]


def test_a_delimiter_inside_a_document_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    source = megatron_source(tmp_path, [[5, 0, 6], [7]])
    with pytest.raises(FormatError, match="document 0 contains the delimiter 0 inside"):
        tokformats.convert(source, tmp_path / "x.bin", "raw", eos=0)
    assert not (tmp_path / "x.bin").exists()
    with pytest.raises(ConfigError, match="not bos="):
        tokformats.convert(source, tmp_path / "x.bin", "raw", bos=3)


def test_the_bare_stream_is_an_explicit_choice(tmp_path: Path) -> None:
    source = megatron_source(tmp_path, [[5, 6], [7, 8, 9]])
    summary = tokformats.convert(source, tmp_path / "bare.bin", "raw", keep_boundaries=False)
    assert summary["documents"] == 1 and summary["tokens"] == 5
    assert summary["read_with"] == {"format": "raw", "dtype": "uint16"}  # the dtype is the smallest that fits
    assert np.fromfile(tmp_path / "bare.bin", dtype="<u2").tolist() == [5, 6, 7, 8, 9]


def test_convert_into_index_formats_needs_nothing(tmp_path: Path) -> None:
    source = megatron_source(tmp_path, [[5, 6], [], [7]])
    summary = tokformats.convert(source, tmp_path / "again", "megatron")
    assert summary["documents"] == 3 and summary["delimiters_added"] == 0
    with tokformats.open(tmp_path / "again") as reader:
        assert [d.tolist() for d in reader] == [[5, 6], [], [7]]


# -- item 3: tokenize into llm.c follows llm.c's convention ---------------------------------------------------


def test_tokenize_into_llmc_prepends_and_reads_back_every_document(tmp_path: Path, tokenizer_path: Path) -> None:
    texts = ["first document", "", "third one here"]
    summary = tokformats.tokenize(texts, tokenizer_path, tmp_path / "t", "llmc", progress=False)
    (output,) = summary["outputs"].values()
    with tokformats.open(output["files"]) as reader:  # default options
        assert len(reader) == 3 == output["documents"]
        assert all(d[0] == reader.bos for d in reader)


def test_info_warns_when_the_delimiter_never_occurs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tokformats.cli import main

    with tokformats.create(tmp_path / "one", "llmc", vocab_size=50257) as writer:
        writer.write_batch(np.arange(1, 101), [100])  # no delimiter anywhere: one document
    from tokformats.cli.describe import describe

    with pytest.warns(DataWarning, match="delimiter is unknown"), tokformats.open(tmp_path / "one_000000.bin") as r:
        info = describe(r)
    assert info["documents"] == 1 and any("pass bos=1" in w and "eos=100" in w for w in info["warnings"])
    assert main(["info", str(tmp_path / "one_000000.bin")]) == 0
    err = capsys.readouterr().err
    assert err.count("delimiter is unknown") == 1 and "pass --bos 1" in err and "--eos 100" in err


# -- item 5: Time-MoE's arithmetic for every stored dtype -------------------------------------------------------


def time_moe_sequence(folder: Path, index: int) -> np.ndarray:
    """What Time-MoE's BinaryDataset returns: the stored values, then ``sequence * std + mean`` (Python floats)."""
    meta = json.loads((folder / "meta.json").read_text())
    files = sorted(meta["files"].items(), key=lambda item: int(item[0].split("-")[1]))
    stream = np.concatenate([np.fromfile(folder / name, dtype=meta["dtype"]) for name, _ in files])
    scale = meta["scales"][index]
    sequence = stream[scale["offset"] : scale["offset"] + scale["length"]]
    if "mean" in scale and "std" in scale:
        return sequence * scale["std"] + scale["mean"]
    return sequence


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "int32"])
def test_timemoe_values_follow_time_moes_arithmetic(tmp_path: Path, dtype: str) -> None:
    rng = np.random.default_rng(0)
    with tokformats.create(tmp_path / "t", "timemoe", dtype=dtype) as writer:
        for k in range(300):
            stored = rng.normal(0, 3, size=int(rng.integers(2, 60)))
            if dtype == "int32":
                stored = np.round(stored)
            scale = {"mean": float(rng.normal(50, 20)), "std": float(rng.uniform(0.1, 9))} if k % 2 == 0 else {}
            writer.write(stored.astype(dtype), normalized=True, **scale)
    meta = json.loads((tmp_path / "t" / "meta.json").read_text())
    assert sum("mean" in s for s in meta["scales"]) == 150
    with tokformats.open(tmp_path / "t") as reader:
        for k in range(len(reader)):
            expected = time_moe_sequence(tmp_path / "t", k)
            got = reader[k]
            assert got.dtype == expected.dtype, (k, got.dtype, expected.dtype)
            np.testing.assert_array_equal(got, expected)


def test_timemoe_windows_of_float64_follow_time_moe(tmp_path: Path) -> None:
    from tokformats import timemoe

    rng = np.random.default_rng(1)
    with tokformats.create(tmp_path / "t", "timemoe", dtype="float64") as writer:
        for _ in range(20):
            writer.write(rng.normal(0, 1, size=int(rng.integers(10, 80))), mean=3.3, std=2.7, normalized=True)
    windows = timemoe.windows(tokformats.open(tmp_path / "t"), context_length=16, normalization="zero")
    for k in range(len(windows)):
        sequence, start = windows.locate(k)
        whole = time_moe_sequence(tmp_path / "t", sequence)
        normed = ((whole - whole.mean()) / whole.std()).astype(whole.dtype)  # Time-MoE's zero_scaler
        window = np.array(normed[start : start + 17], dtype=np.float32)
        np.testing.assert_array_equal(windows[k]["input_ids"][: len(window) - 1], window[:-1])


# -- item 7: a dtype that only divides the file size -----------------------------------------------------------


def test_a_wrong_dtype_that_divides_the_size_warns(tmp_path: Path) -> None:
    ids = np.random.default_rng(0).integers(0, 50257, size=10_000).astype("<u2")
    ids.tofile(tmp_path / "u16.bin")
    with pytest.warns(DataWarning, match="probably uint16"):
        reader = tokformats.open(tmp_path / "u16.bin", format="raw", dtype="uint32")
    assert reader.warnings and "uint16" in reader.warnings[0]
    ids.astype("<u4").tofile(tmp_path / "u32.bin")
    with pytest.warns(DataWarning, match="probably uint32"):
        tokformats.open(tmp_path / "u32.bin", format="raw", dtype="uint16")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tokformats.open(tmp_path / "u16.bin", format="raw", dtype="uint16").num_tokens == 10_000
        assert tokformats.open(tmp_path / "u32.bin", format="raw", dtype="uint32").num_tokens == 10_000
