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


# -- item 4: no allocation beyond what the file can hold; nothing blocks -------------------------------------------


def pt_with_pickle(path: Path, pickle_bytes: bytes) -> Path:
    import zipfile

    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", pickle_bytes)
        archive.writestr("archive/version", "3\n")
    return path


def test_a_huge_memo_index_is_refused_before_unpickling(tmp_path: Path) -> None:
    import struct

    evil = b"\x80\x02K\x01r" + struct.pack("<I", 2**28) + b"."  # LONG_BINPUT 2**28: CPython sizes its memo by it
    path = pt_with_pickle(tmp_path / "memo.pt", evil)
    assert path.stat().st_size < 400
    with pytest.raises(FormatError, match="memo entry 268435456"):
        tokformats.open(path)


def test_build_on_an_allowed_global_is_refused(tmp_path: Path) -> None:
    from tokformats import UnsafePickleError
    from tokformats.formats import _torchfile as torchfile

    defaults = torchfile._rebuild_v2.__defaults__
    evil = b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n}X\x0c\x00\x00\x00__defaults__(K\x07tsb."
    with pytest.raises(UnsafePickleError, match="BUILD"):
        tokformats.open(pt_with_pickle(tmp_path / "build.pt", evil))
    assert torchfile._rebuild_v2.__defaults__ == defaults


def test_an_overlapping_view_claiming_2_40_elements_is_refused(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch", reason="torch writes the expanded tensor")
    torch.save(torch.zeros(1, dtype=torch.int64).expand(2**40), tmp_path / "wide.pt")
    with pytest.raises(SizeMismatchError, match="overlapping views"):
        tokformats.open(tmp_path / "wide.pt")


def test_a_lying_record_size_is_refused_before_reading(tmp_path: Path) -> None:
    from tokformats import pt

    pt.save(np.arange(100), tmp_path / "x.pt")
    data = bytearray((tmp_path / "x.pt").read_bytes())
    central = data.rfind(b"PK\x01\x02")  # the last central directory entry; its uncompressed size field
    data[central + 24 : central + 28] = (2**31).to_bytes(4, "little")
    (tmp_path / "x.pt").write_bytes(bytes(data))
    with pytest.raises(FormatError):
        tokformats.open(tmp_path / "x.pt")


def test_npy_headers_cannot_ask_for_more_than_the_file_holds(tmp_path: Path) -> None:
    import gzip

    header = np.lib.format
    with open(tmp_path / "big.npy", "wb") as handle:
        header.write_array_header_1_0(handle, {"descr": "<f4", "fortran_order": False, "shape": (100000, 100000)})
        handle.write(b"\x00" * 64)
    with pytest.raises(SizeMismatchError, match="more than the file can hold"):
        tokformats.open(tmp_path / "big.npy")
    with gzip.open(tmp_path / "bomb.npy.gz", "wb") as handle:  # declares 4 GB; compressed, a few KB
        header.write_array_header_1_0(handle, {"descr": "<f8", "fortran_order": False, "shape": (2**29,)})
        handle.write(b"\x00" * 4096)
    with pytest.raises(SizeMismatchError):
        tokformats.open(tmp_path / "bomb.npy.gz")
    np.save(tmp_path / "ok.npy", np.arange(12.0).reshape(3, 4))
    assert len(tokformats.open(tmp_path / "ok.npy")) == 3


def test_fifos_and_devices_are_refused_without_blocking(tmp_path: Path) -> None:
    import os

    os.mkfifo(tmp_path / "pipe")
    code = (
        "import tokformats\n"
        f"for path, fmt in (({str(tmp_path / 'pipe')!r}, None), ('/dev/zero', 'llmc-vocab'), ('/dev/zero', 'raw')):\n"
        "    try:\n"
        "        tokformats.open(path, format=fmt, **({'dtype': 'uint16'} if fmt == 'raw' else {}))\n"
        "    except tokformats.FormatError as e:\n"
        "        print('refused')\n"
    )
    done = run_isolated(code)
    assert done.stdout.split() == ["refused"] * 3, done.stderr[-2000:]


# -- item 9: environmental errors keep their type and name the output ----------------------------------------------


@pytest.fixture()
def small_disk(tmp_path: Path):  # type: ignore[no-untyped-def]
    import os

    folder = tmp_path / "small"
    folder.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode(errors='replace').strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], capture_output=True)


@pytest.mark.parametrize("fmt", ["megatron", "llmc", "raw", "pt", "timemoe"])
def test_a_full_disk_names_the_output_and_keeps_the_old_dataset(small_disk: Path, fmt: str) -> None:
    target = small_disk / "c"
    options = {"raw": {"dtype": "uint16"}, "timemoe": {"dtype": "float32"}}.get(fmt, {"vocab_size": 50000})
    with tokformats.create(target, fmt, **options) as writer:
        writer.write_batch(np.arange(100) % 50000, [100])
    before = {p.name: p.read_bytes() for p in sorted(small_disk.rglob("*")) if p.is_file()}
    with pytest.raises(OSError, match="No space left") as caught:
        with tokformats.create(target, fmt, overwrite=True, **options) as writer:
            writer.write_batch(np.arange(400_000) % 50000, [400_000])
    assert caught.value.errno == 28 and str(caught.value.filename).startswith(str(target))
    after = {p.name: p.read_bytes() for p in sorted(small_disk.rglob("*")) if p.is_file()}
    assert after == before, "the previous dataset is untouched and no temporary is left"


# -- item 5: what open validated is what is read -------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["megatron", "llmc", "raw", "timemoe"])
def test_files_replaced_after_open_are_never_mixed_in(tmp_path: Path, fmt: str) -> None:
    import os

    options = {"raw": {"dtype": "uint16"}, "timemoe": {"dtype": "float32"}}.get(fmt, {"vocab_size": 50000})
    read = {"raw": {"format": "raw", "dtype": "uint16", "eos": 0}}.get(fmt, {})

    def write(folder: Path, lengths: list[int], start: int) -> Path:
        with tokformats.create(folder / "d", fmt, **options) as writer:
            writer.write_batch(np.arange(start, start + sum(lengths)) % 40000 + 1, lengths)
        return folder

    old, new = write(tmp_path / "old", [6, 6, 6], 1), write(tmp_path / "new", [2, 3], 500)
    target = next(iter(sorted(p for p in old.iterdir())))
    reader = tokformats.open(target if fmt in ("raw", "llmc") else old / "d", **read)
    documents = [d.tolist() for d in reader]
    for source in sorted(new.rglob("*")):  # replace every file, as a rewrite with a new inode would
        if source.is_file():
            destination = old / source.relative_to(new)
            os.replace(source, destination)
    assert [d.tolist() for d in reader] == documents  # the maps made at open still hold the old data
    reader.close()
    with pytest.raises(FormatError, match="changed on disk since"):
        [d.tolist() for d in reader]


# -- item 3: a resume never rewrites finished output from a damaged work folder -------------------------------------


def unfinished_run(tmp_path: Path, tokenizer_path: Path) -> Path:
    """A run that failed on its last record after checkpointing every batch: its work folder stays."""
    texts = tmp_path / "in.jsonl"
    texts.write_text("".join(json.dumps({"text": f"document {k} " * 30}) + "\n" for k in range(200)) + "{bad\n")
    with pytest.raises(FormatError):
        tokformats.tokenize(texts, tokenizer_path, tmp_path / "o", progress=False, batch_size=10, checkpoint_every=0)
    texts.write_text("".join(json.dumps({"text": f"document {k} " * 30}) + "\n" for k in range(200)))
    return texts


@pytest.mark.parametrize("damage", ["delete", "truncate", "zero"])
def test_resume_refuses_a_damaged_spool(tmp_path: Path, damage: str, tokenizer_path: Path) -> None:
    texts = unfinished_run(tmp_path, tokenizer_path)
    spool = next((tmp_path / "o.tokenize").rglob("*.tokens"))
    if damage == "delete":
        spool.unlink()
    elif damage == "truncate":
        spool.write_bytes(spool.read_bytes()[:100])
    else:
        spool.write_bytes(b"\x00" * spool.stat().st_size)
    with pytest.raises(FormatError, match="cannot be resumed"):
        tokformats.tokenize(texts, tokenizer_path, tmp_path / "o", progress=False, resume=True)
    assert not list(tmp_path.glob("o_*_document.*")), "nothing was published"
    summary = tokformats.tokenize(texts, tokenizer_path, tmp_path / "o", progress=False, overwrite=True)
    assert summary["documents"] == 200


def test_finished_output_is_never_rewritten_by_a_resume(tmp_path: Path, tokenizer_path: Path) -> None:
    texts = unfinished_run(tmp_path, tokenizer_path)
    tokformats.tokenize(texts, tokenizer_path, tmp_path / "o", progress=False, resume=True)
    published = {p.name: p.read_bytes() for p in tmp_path.glob("o_*")}
    assert published and not (tmp_path / "o.tokenize").exists()
    # A work folder reappearing half-deleted (the old cleanup's failure) holds a "done" checkpoint, no spools.
    part = tmp_path / "o.tokenize" / "part-0000"
    part.mkdir(parents=True)
    checkpoint = {"done": True, "spools": {"text": {"tokens": 99, "documents": 3}}}
    (part / "checkpoint.json").write_text(json.dumps(checkpoint))
    with pytest.raises(FormatError):
        tokformats.tokenize(texts, tokenizer_path, tmp_path / "o", progress=False, resume=True)
    assert {p.name: p.read_bytes() for p in tmp_path.glob("o_*")} == published


# -- crafted pickles: none runs code or changes the process ----------------------------------------------------------


def _g(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


CRAFTED = {
    "os.system via REDUCE": b"\x80\x02" + _g("os", "system") + b"X\x04\x00\x00\x00true\x85R.",
    "builtins.eval via STACK_GLOBAL": b"\x80\x04\x8c\x08builtins\x8c\x04eval\x93\x8c\x011\x85R.",
    "subprocess via INST": b"(X\x04\x00\x00\x00trueisubprocess\ncall\n.",
    "OBJ of os.system": b"\x80\x02(" + _g("os", "system") + b"X\x04\x00\x00\x00trueo.",
    "NEWOBJ of a torch global outside the allow-list": b"\x80\x02" + _g("torch", "load") + b")\x81.",
    "BUILD on OrderedDict": b"\x80\x02" + _g("collections", "OrderedDict") + b")R}X\x01\x00\x00\x00ak\x01sb.",
    "BUILD on a storage stand-in": b"\x80\x02" + _g("torch", "LongStorage") + b"}X\x05\x00\x00\x00dtypeK\x01sb.",
    "EXT1 registry code": b"\x80\x02\x82\x01.",
    "memo index far ahead": b"\x80\x02K\x01q\xff.",
    "memo read never stored": b"\x80\x02h\x05.",
    "huge BINBYTES8 length": b"\x80\x04\x8e" + (2**60).to_bytes(8, "little") + b".",
    "huge SHORT_BINUNICODE then garbage": b"\x80\x04\x8c\xff" + b"a" * 10,
    "deep nesting": b"\x80\x02" + b"]" * 100_000 + b".",
    "deep tuple nesting": b"\x80\x02K\x01" + b"\x85" * 100_000 + b".",
    "persistent id of a wrong shape": b"\x80\x02X\x03\x00\x00\x00bad\x85Q.",
    "persistent id with a non-storage type": b"\x80\x02(X\x07\x00\x00\x00storageK\x01X\x010K\x00K\x01tQ.",
    "rebuild with a non-storage": b"\x80\x02" + _g("torch._utils", "_rebuild_tensor_v2") + b"(K\x00K\x00)(tR.",
    "rebuild_v3 with a non-dtype": b"\x80\x02" + _g("torch._utils", "_rebuild_tensor_v3") + b"(NK\x00)(K\x00NK\x05tR.",
    "truncated": b"\x80\x02" + _g("collections", "OrderedDict"),
    "not a pickle": b"\x00\x01\x02\x03",
    "empty": b"",
}


@pytest.mark.parametrize("name", sorted(CRAFTED))
def test_crafted_pickles_never_run_code(tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from tokformats.formats import _torchfile as torchfile

    ran: list[str] = []
    monkeypatch.setattr(os, "system", lambda *a: ran.append("os.system") or 0)
    monkeypatch.setattr(subprocess, "call", lambda *a, **k: ran.append("subprocess.call") or 0)
    before = (torchfile._rebuild_v2.__defaults__, dict(torchfile._ALLOWED))
    with pytest.raises(FormatError):
        tokformats.open(pt_with_pickle(tmp_path / "x.pt", CRAFTED[name]), format="pt")
    assert ran == []
    assert (torchfile._rebuild_v2.__defaults__, dict(torchfile._ALLOWED)) == before


@pytest.mark.parametrize(("source", "target"), [(np.uint32, np.int32), (np.int32, np.uint32), (np.int16, np.uint16)])
def test_ids_between_integers_of_one_width_keep_their_values_and_out_of_range_ones_are_refused(
    source: type, target: type
) -> None:
    from tokformats.core.dtypes import check_tokens

    top = min(np.iinfo(source).max, np.iinfo(target).max)
    ids = np.array([0, 1, 7, top - 1, top], dtype=source)
    cast = check_tokens(ids, np.dtype(target))
    assert cast.dtype == np.dtype(target) and cast.tolist() == ids.tolist()
    outside = np.array([np.iinfo(source).max if np.iinfo(source).max > top else np.iinfo(source).min], dtype=source)
    with pytest.raises(TokenRangeError, match="document 0 holds the value"):
        check_tokens(np.concatenate([ids, outside]), np.dtype(target), lengths=np.array([6]))
