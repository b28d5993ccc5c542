"""Regressions of issue 15 (reliability): crashes, silent misreads and silent value changes found by a fault sweep.

Each test reproduces a reported case and asserts the library error (or the right data) instead.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tokformats
from tokformats import DTypeError, FormatError, HeaderError, SizeMismatchError, TokenRangeError

# -- item 1: bytes are never mapped as Python objects -----------------------------------------------------------


def run_isolated(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a child: a segfault there fails this test instead of killing the test run."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("dtype", ["object", "O", "U8", "S4", "V8", "datetime64[s]", "c16", "(2,)i4", "i4,i4"])
def test_non_numeric_dtypes_are_refused_never_mapped(tmp_path: Path, dtype: str) -> None:
    folder = tmp_path / "tm"
    folder.mkdir()
    np.arange(16, dtype="<f4").tofile(folder / "data-1-of-1.bin")
    meta = {"num_sequences": 1, "dtype": dtype, "files": {"data-1-of-1.bin": 2}, "scales": [{"offset": 0, "length": 2}]}
    (folder / "meta.json").write_text(json.dumps(meta))
    code = (
        "import tokformats\n"
        f"try:\n    print(tokformats.open({str(folder)!r})[0])\n"
        "except tokformats.FormatError as e:\n    print('refused')\n"
        f"try:\n    print(tokformats.open({str(folder / 'data-1-of-1.bin')!r}, format='raw', dtype={dtype!r})[0])\n"
        "except tokformats.FormatError as e:\n    print('refused')\n"
    )
    done = run_isolated(code)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["refused", "refused"]


@pytest.mark.parametrize("spelling", ["float32)", "np.float32", "__import__('os')", "", "f4f4", 17])
def test_odd_dtype_spellings_are_a_dtype_error(tmp_path: Path, spelling: object) -> None:
    folder = tmp_path / "tm"
    folder.mkdir()
    np.arange(4, dtype="<f4").tofile(folder / "data-1-of-1.bin")
    meta = {"num_sequences": 0, "dtype": spelling, "files": {"data-1-of-1.bin": 4}, "scales": []}
    (folder / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(FormatError):
        tokformats.open(folder)


# -- item 6: Megatron access checks the pointers it touches -------------------------------------------------------


def test_a_lying_middle_pointer_never_serves_another_documents_tokens(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 30, size=40)
    flat = rng.integers(0, 60000, size=int(lengths.sum()))
    with tokformats.create(tmp_path / "c", "megatron", vocab_size=65000) as writer:
        writer.write_batch(flat, lengths)
    originals = [d.tolist() for d in tokformats.open(tmp_path / "c")]
    index = (tmp_path / "c.idx").read_bytes()
    pointers_at = 34 + 4 * 40
    checked = 0
    for k in range(1, 39):  # first and last pointers are checked on open; the middle ones on access
        for lie in (2, -2 * int(lengths[k - 1]), 10_000):
            corrupt = bytearray(index)
            value = int.from_bytes(index[pointers_at + 8 * k : pointers_at + 8 * k + 8], "little", signed=True) + lie
            corrupt[pointers_at + 8 * k : pointers_at + 8 * k + 8] = value.to_bytes(8, "little", signed=True)
            (tmp_path / "c.idx").write_bytes(bytes(corrupt))
            with tokformats.open(tmp_path / "c") as reader:
                for d in range(len(reader)):
                    try:
                        got = reader[d].tolist()
                    except HeaderError:
                        continue
                    assert got == originals[d], (k, lie, d)
                with pytest.raises(HeaderError, match=f"sequence_pointers\\[{k}\\]"):
                    reader[k]
                with pytest.raises(HeaderError):
                    reader.sequences.get(k)
                checked += 1
    assert checked == 38 * 3


# -- item 7: ids and values are never changed silently -------------------------------------------------------------


@pytest.mark.parametrize(
    ("fmt", "options", "values", "message"),
    [
        ("megatron", {"dtype": "int32", "vocab_size": 128256}, [-1, 5], "below vocab_size"),
        ("pt", {"vocab_size": 1000}, [-1], "below vocab_size"),
        ("pt", {"dtype": "int64"}, np.array([2.0**63]), "in int64"),
        ("pt", {"dtype": "uint64"}, np.array([2.0**64]), "in uint64"),
        ("timemoe", {"dtype": "float32"}, np.array([1.0, np.nan]), "finite"),
        ("timemoe", {"dtype": "float32"}, np.array([np.inf]), "finite"),
        ("timemoe", {"dtype": "float32"}, np.array([16777217]), "exact in float32"),
        ("timemoe", {"dtype": "float32", "vocab_size": 10}, np.array([20.0]), "below vocab_size"),
        ("raw", {"dtype": "uint16"}, np.array([True, False]), "integers or floats"),
    ],
)
def test_values_that_would_change_are_refused(
    tmp_path: Path, fmt: str, options: dict[str, object], values: object, message: str
) -> None:
    target = tmp_path / ("x.pt" if fmt == "pt" else "x")
    with pytest.raises(TokenRangeError, match=message):
        with tokformats.create(target, fmt, **options) as writer:
            writer.write(values)
    assert not target.exists() and not list(tmp_path.iterdir())


def test_largest_exact_values_still_pass(tmp_path: Path) -> None:
    with tokformats.create(tmp_path / "x.pt", "pt", dtype="int64") as writer:
        writer.write(np.array([2.0**62, -(2.0**63)]))
    assert tokformats.open(tmp_path / "x.pt")[0].tolist() == [2**62, -(2**63)]
    with tokformats.create(tmp_path / "f", "timemoe", dtype="float32") as writer:
        writer.write(np.array([16777216, 3]))
    assert tokformats.open(tmp_path / "f")[0].tolist() == [16777216.0, 3.0]


# -- item 8: Time-MoE offsets that overflow -----------------------------------------------------------------------


@pytest.mark.parametrize("offset", [2**63 - 1, 2**63 - 3, 2**62])
def test_timemoe_offsets_past_the_data_are_refused(tmp_path: Path, offset: int) -> None:
    folder = tmp_path / "tm"
    folder.mkdir()
    np.arange(10, dtype="<f4").tofile(folder / "data-1-of-1.bin")
    scales = [{"offset": offset, "length": 5}]
    meta = {"num_sequences": 1, "dtype": "float32", "files": {"data-1-of-1.bin": 10}, "scales": scales}
    (folder / "meta.json").write_text(json.dumps(meta))
    with pytest.raises((SizeMismatchError, HeaderError, DTypeError)):
        tokformats.open(folder)
