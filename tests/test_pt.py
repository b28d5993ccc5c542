"""PyTorch .pt files and shard folders: golden files, safety, malformed archives, torch interop, packing."""

from __future__ import annotations

import io
import json
import os
import pickle
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tokformats
from tokformats import FormatError, NoFilesError, OutputExistsError, SizeMismatchError, UnsafePickleError
from tokformats.core.documents import add_delimiter
from tokformats.formats import _torchfile as torchfile
from tokformats.formats import pt
from tokformats.testing import TokenFormatTests

FILES = [
    "tokens_int64",
    "tokens_int32",
    "tokens_uint16",
    "series_float32",
    "view_offset_int64",
    "empty_int64",
    "legacy_int64",
    "dict_tokens",
]


class TestPtFileConformance(TokenFormatTests):
    format = "pt"
    dtypes = ("int64", "int32", "uint16", "uint32")
    low_id = 1
    suffix = ".pt"
    name_independent_bytes = False  # the archive's records are named after the file's stem, as torch names them

    def write_options(self) -> dict[str, Any]:
        return {"eos": 0}

    def read_options(self, dtype: str) -> dict[str, Any]:
        return {"eos": 0}

    def expected(self, document: np.ndarray) -> np.ndarray:
        return np.append(document, 0)


class TestPtFolderConformance(TestPtFileConformance):
    suffix = ""
    name_independent_bytes = True
    huge_tokens = 200_000

    def write_options(self) -> dict[str, Any]:
        return {"eos": 0, **self.convert_options()}

    def convert_options(self) -> dict[str, Any]:
        return {"tokens_per_shard": 1000, "final_shard": True}


@pytest.mark.parametrize("name", FILES)
def test_golden_files_read_exactly(fixtures: Path, name: str) -> None:
    path = fixtures / "torch" / f"{name}.pt"
    expected = np.load(fixtures / "torch" / f"{name}.expected.npy")
    assert tokformats.detect(path) == "pt"
    with tokformats.open(path) as reader:
        assert isinstance(reader, pt.FileReader)
        assert reader.dtype == expected.dtype
        np.testing.assert_array_equal(np.asarray(reader.tokens), expected)
        if len(expected):
            assert isinstance(reader.tokens, np.memmap) or isinstance(reader.tokens.base, np.memmap)
    assert np.array_equal(
        np.asarray(torchfile.load(path)["tokens"] if name == "dict_tokens" else torchfile.load(path)), expected
    )


def test_dict_values_and_key(fixtures: Path) -> None:
    with tokformats.open(fixtures / "torch" / "dict_tokens.pt", key="tokens") as reader:
        assert reader.metadata["key"] == "tokens" and reader.metadata["values"] == {"shard_id": 3}
    with pytest.raises(FormatError, match="no tensor under 'ids'"):
        tokformats.open(fixtures / "torch" / "dict_tokens.pt", key="ids")


def test_view_maps_the_whole_storage_without_copying(fixtures: Path) -> None:
    path = fixtures / "torch" / "view_offset_int64.pt"
    with tokformats.open(path) as reader:
        tokens = reader.tokens
        assert len(tokens) == 4444 and isinstance(tokens, np.memmap)
        assert torchfile._zip_records(path)[1]["view_offset_int64/data/0"].size == 80000  # the whole storage
        assert not tokens.flags.owndata and not tokens.flags.writeable


def test_golden_shard_folder(fixtures: Path) -> None:
    folder = fixtures / "torch" / "neuroshard"
    assert tokformats.detect(folder) == "pt"
    with tokformats.open(folder) as reader:
        assert isinstance(reader, pt.FolderReader)
        assert reader.num_shards == 3 and len(reader) == 3
        for k in range(3):
            np.testing.assert_array_equal(reader[k], np.load(folder / f"shard_{k}.expected.npy"))
        assert reader.metadata["manifest"]["total_tokens"] == 9500 == reader.num_tokens
        assert reader.metadata["checkpoints"]["fineweb-edu"]["leftover_tokens"] == [11, 12, 13]
        assert (
            reader.tokens[3998:4002].tolist()
            == np.concatenate(
                [np.load(folder / "shard_0.expected.npy")[-2:], np.load(folder / "shard_1.expected.npy")[:2]]
            ).tolist()
        )


def test_malicious_pickle_raises_without_running(
    fixtures: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Any] = []
    monkeypatch.setattr(os, "system", lambda *a: calls.append(a) or 0)
    with pytest.raises(UnsafePickleError, match=r"posix\.system"):
        tokformats.open(fixtures / "torch" / "malicious.pt")
    with pytest.raises(UnsafePickleError):
        pt.load(fixtures / "torch" / "malicious.pt")
    assert calls == []
    out, err = capfd.readouterr()
    assert "this-pickle-ran-code" not in out + err


def test_writer_matches_torch_save_byte_for_byte(fixtures: Path, tmp_path: Path) -> None:
    for name in ("tokens_int64", "tokens_int32", "tokens_uint16", "series_float32", "empty_int64"):
        original = fixtures / "torch" / f"{name}.pt"
        record_id = zipfile.ZipFile(original).read(f"{name}/.data/serialization_id").decode()
        out = io.BytesIO()
        torchfile.write_tensor(
            out, np.load(fixtures / "torch" / f"{name}.expected.npy"), prefix=name, record_id=record_id
        )
        assert out.getvalue() == original.read_bytes(), name


def test_written_files_are_valid_zips_with_aligned_records(tmp_path: Path) -> None:
    path = pt.save(np.arange(1000, dtype=np.int64), tmp_path / "shard_7.pt")
    with zipfile.ZipFile(path) as archive:
        assert archive.testzip() is None  # every CRC is right
        assert archive.namelist()[0] == "shard_7/data.pkl"
    offsets = torchfile._zip_records(path)[1]
    assert all(record.offset % 64 == 0 for record in offsets.values())
    np.testing.assert_array_equal(pt.load(path), np.arange(1000))


def test_zip64_layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Lower the zip64 threshold so that the >4 GiB layout is exercised on a small file."""
    monkeypatch.setattr(torchfile, "ZIP64_LIMIT", 1000)
    data = np.arange(600, dtype=np.int64)  # 4,800 bytes: past the lowered limit, at an offset past it too
    path = pt.save(data, tmp_path / "big.pt")
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo("big/data/0")
        assert info.file_size == 4800 and archive.testzip() is None
        assert np.frombuffer(archive.read("big/data/0"), dtype="<i8").tolist() == data.tolist()
        assert archive.read("big/version") == b"3\n"
    raw = path.read_bytes()
    assert b"\xff\xff\xff\xff" in raw  # sizes moved into zip64 extra fields
    np.testing.assert_array_equal(pt.load(path), data)


# -- malformed archives ---------------------------------------------------------------------------


def archive(path: Path, records: dict[str, bytes], compress: set[str] = frozenset()) -> Path:  # type: ignore[assignment]
    with zipfile.ZipFile(path, "w") as z:
        for name, data in records.items():
            z.writestr(name, data, compress_type=zipfile.ZIP_DEFLATED if name in compress else zipfile.ZIP_STORED)
    return path


def good_records(numel: int = 4, key: str = "0", record_key: str = "0") -> dict[str, bytes]:
    return {
        "t/data.pkl": torchfile.tensor_pickle(np.dtype("int64"), numel, key),
        f"t/data/{record_key}": np.arange(4, dtype="<i8").tobytes(),
        "t/version": b"3\n",
    }


@pytest.mark.parametrize(
    ("records", "compress", "error", "message"),
    [
        (good_records(), set(), None, None),
        (good_records(numel=5), set(), SizeMismatchError, "declares 5 elements"),
        (good_records(key="1"), set(), FormatError, "refers to storage '1'"),
        ({k: v for k, v in good_records().items() if k != "t/data.pkl"}, set(), FormatError, "no t/data.pkl"),
        ({k: v for k, v in good_records().items() if k != "t/version"}, set(), FormatError, "no t/version"),
        ({**good_records(), "t/constants.pkl": b""}, set(), FormatError, "TorchScript"),
        (good_records(), {"t/data/0"}, FormatError, "compressed"),
        ({**good_records(), "t/data.pkl": pickle.dumps([1, 2, 3], protocol=2)}, set(), FormatError, "holds a list"),
        ({**good_records(), "t/data.pkl": b"\x80\x02cos\nsystem\nq\x00."}, set(), UnsafePickleError, "os.system"),
        (
            {**good_records(), "t/data.pkl": b"\x80\x02ctorch\nBFloat16Storage\n."},
            set(),
            tokformats.DTypeError,
            "bfloat16",
        ),
        (
            {**good_records(), "t/data.pkl": torchfile.tensor_pickle(np.dtype("int64"), 4)[:-10]},
            set(),
            FormatError,
            "cannot be read",
        ),
        ({**good_records(), "t/byteorder": b"middle"}, set(), FormatError, "byteorder record says 'middle'"),
    ],
)
def test_malformed_archives(
    tmp_path: Path, records: dict[str, bytes], compress: set[str], error: Any, message: str | None
) -> None:
    path = archive(tmp_path / "t.pt", records, compress)
    if error is None:
        assert pt.load(path).tolist() == [0, 1, 2, 3]
        return
    with pytest.raises(error, match=message):
        tokformats.open(path, format="pt")


def test_truncated_and_corrupt_zip(tmp_path: Path) -> None:
    good = pt.save(np.arange(100, dtype=np.int64), tmp_path / "g.pt").read_bytes()
    for cut in (10, len(good) // 2, len(good) - 10):
        (tmp_path / "cut.pt").write_bytes(good[:cut])
        with pytest.raises(FormatError):
            tokformats.open(tmp_path / "cut.pt", format="pt")
    bad = bytearray(good)
    header = torchfile._zip_records(tmp_path / "g.pt")[1]["g/data/0"].offset - 64  # inside the padding before data
    index = bytes(bad).rfind(b"PK\x03\x04", 0, header + 64)
    bad[index : index + 4] = b"XXXX"
    (tmp_path / "bad.pt").write_bytes(bytes(bad))
    with pytest.raises(FormatError, match="local header of g/data/0"):
        tokformats.open(tmp_path / "bad.pt", format="pt")


def test_big_endian_storage(tmp_path: Path) -> None:
    records = good_records()
    records["t/data/0"] = np.arange(4, dtype=">i8").tobytes()
    records["t/byteorder"] = b"big"
    assert pt.load(archive(tmp_path / "be.pt", records)).tolist() == [0, 1, 2, 3]


# -- torch interop ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def torch() -> Any:
    return pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0)")


@pytest.mark.parametrize("dtype", ["int64", "int32", "uint16", "uint32", "float32"])
def test_torch_loads_what_we_write(torch: Any, tmp_path: Path, dtype: str) -> None:
    values = np.arange(0, 3000, 7).astype(dtype)
    path = pt.save(values, tmp_path / "x.pt")
    for options in ({"weights_only": True}, {"mmap": True, "weights_only": True}):
        tensor = torch.load(path, **options)
        assert str(tensor.dtype) == f"torch.{dtype}"
        assert tensor.numpy().tolist() == values.tolist()
    with tokformats.create(tmp_path / "w.pt", "pt", dtype=dtype) as writer:
        writer.write_batch(values, [len(values)])
    assert torch.load(tmp_path / "w.pt", mmap=True).numpy().tolist() == values.tolist()


def test_we_read_what_torch_saves(torch: Any, tmp_path: Path) -> None:
    base = torch.arange(10_000, dtype=torch.int64) * 3
    torch.save(base[100:900], tmp_path / "view.pt")
    torch.save({"tokens": base[:50].to(torch.int32), "epoch": 2}, tmp_path / "dict.pt")
    torch.save(base[:6].to(torch.uint32), tmp_path / "u32.pt")
    torch.save(base.reshape(100, 100)[:, 3], tmp_path / "strided.pt")
    assert tokformats.open(tmp_path / "view.pt").tokens[:].tolist() == base[100:900].tolist()
    with tokformats.open(tmp_path / "dict.pt") as reader:
        assert reader.tokens.dtype == np.int32 and reader.metadata["values"] == {"epoch": 2}
    assert pt.load(tmp_path / "u32.pt").tolist() == base[:6].tolist()
    assert pt.load(tmp_path / "strided.pt").tolist() == base.reshape(100, 100)[:, 3].tolist()


def test_empty_and_empty_tensor_interop(torch: Any, tmp_path: Path) -> None:
    pt.save(np.zeros(0, dtype=np.int64), tmp_path / "e.pt")
    assert torch.load(tmp_path / "e.pt").numel() == 0


# -- shard folders ----------------------------------------------------------------------------------


def test_packing_leftover_manifest_and_tokenizer(fixtures: Path, tmp_path: Path) -> None:
    folder = tmp_path / "shards"
    tokenizer = fixtures / "llmc" / "bytelevel_bpe.tokenizer.json"
    with tokformats.create(
        folder,
        "pt",
        tokens_per_shard=10,
        source="web",
        tokenizer=tokenizer,
        tokenizer_version="bpe_v1",
        final_shard=False,  # an unfinished stream: the tail waits in leftover_tokens
    ) as writer:
        writer.write_batch(np.arange(1, 26), [12, 13])
    assert sorted(p.name for p in folder.iterdir()) == [
        "checkpoints.json",
        "manifest.json",
        "shard_0.pt",
        "shard_1.pt",
        "tokenizer.json",
    ]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["total_shards"] == 2 and manifest["total_tokens"] == 20
    assert manifest["total_size_bytes"] == sum((folder / f"shard_{i}.pt").stat().st_size for i in range(2))
    assert manifest["tokenizer_version"] == "bpe_v1"
    assert manifest["sources"] == {"web": {"shards": 2, "tokens": 20, "documents_processed": 2, "last_shard_id": 1}}
    assert manifest["created_at"].endswith("Z") and len(manifest["created_at"]) == 20
    checkpoints = json.loads((folder / "checkpoints.json").read_text())
    assert checkpoints["web"]["leftover_tokens"] == [21, 22, 23, 24, 25]
    assert checkpoints["web"]["last_shard_id"] == 1 and checkpoints["web"]["documents_processed"] == 2
    assert json.loads((folder / "tokenizer.json").read_text())["model"]["type"] == "BPE"
    with tokformats.open(folder) as reader:
        assert reader.tokens[:].tolist() == list(range(1, 21))


def test_a_finished_job_leaves_every_token_in_a_shard(tmp_path: Path) -> None:
    """Regression (issue 11, item 1): fewer tokens than one shard wrote no shard; the tail sat in leftover_tokens."""
    with tokformats.create(tmp_path / "small", "pt", tokens_per_shard=1000) as writer:
        writer.write_batch(np.arange(1, 26), [12, 13])
    manifest = json.loads((tmp_path / "small" / "manifest.json").read_text())
    assert manifest["total_tokens"] == 25 and manifest["total_shards"] == 1
    assert json.loads((tmp_path / "small" / "checkpoints.json").read_text())["default"]["leftover_tokens"] == []
    with tokformats.open(tmp_path / "small") as reader:
        assert reader.tokens[:].tolist() == list(range(1, 26)) and reader.dtype == np.dtype("<i8")
    source = tmp_path / "src"
    with tokformats.create(source, "megatron", vocab_size=50257) as writer:
        writer.write_batch(np.arange(1, 26), [12, 13])
    summary = tokformats.convert(source, tmp_path / "converted", "pt", eos=0)
    with tokformats.open(tmp_path / "converted", eos=0) as reader:
        assert reader.num_tokens == summary["tokens"] == 27 and len(reader) == summary["documents"] == 2
        assert reader.dtype == np.dtype("<i8")  # Genesis's dtype, not the source's uint16 (item 4)


def test_resume_equals_one_uninterrupted_run(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 40, size=60)
    flat = rng.integers(0, 50000, size=int(lengths.sum()))
    with tokformats.create(tmp_path / "once", "pt", tokens_per_shard=97, final_shard=False) as writer:
        writer.write_batch(flat, lengths)
    cut = int(lengths[:25].sum())
    with tokformats.create(tmp_path / "twice", "pt", tokens_per_shard=97, final_shard=False) as writer:
        writer.write_batch(flat[:cut], lengths[:25])
    with pytest.raises(OutputExistsError, match="resume=True"):
        tokformats.create(tmp_path / "twice", "pt", tokens_per_shard=97)
    with tokformats.create(tmp_path / "twice", "pt", tokens_per_shard=97, resume=True, final_shard=False) as writer:
        writer.write_batch(flat[cut:], lengths[25:])
    once = pt.shard_files(tmp_path / "once")
    twice = pt.shard_files(tmp_path / "twice")
    assert [i for i, _ in once] == [i for i, _ in twice] and len(once) == len(flat) // 97
    for (_, a), (_, b) in zip(once, twice):
        np.testing.assert_array_equal(pt.load(a), pt.load(b))
    first = json.loads((tmp_path / "once" / "checkpoints.json").read_text())["default"]
    second = json.loads((tmp_path / "twice" / "checkpoints.json").read_text())["default"]
    assert first["leftover_tokens"] == second["leftover_tokens"] and second["documents_processed"] == 60
    manifest = json.loads((tmp_path / "twice" / "manifest.json").read_text())
    assert manifest["total_shards"] == len(once) and manifest["sources"]["default"]["documents_processed"] == 60


def _masked_documents(seed: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Documents (ids 1..99), their lengths (some empty) and a loss mask with runs of 0 and 1."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 40, size=60)
    flat = rng.integers(1, 100, size=int(lengths.sum()))
    mask = (np.arange(len(flat)) // 7 % 3 == 0).astype(np.uint8)
    return flat, lengths, mask


def _folder_files(folder: Path) -> dict[str, Any]:
    """Every shard's and mask shard's bytes, and the checkpoints without their timestamps."""
    files: dict[str, Any] = {p.name: p.read_bytes() for p in sorted(folder.glob("shard_*.pt"))}
    checkpoints = json.loads((folder / "checkpoints.json").read_text())
    files["checkpoints"] = {s: {k: v for k, v in e.items() if k != "timestamp"} for s, e in checkpoints.items()}
    return files


@pytest.mark.parametrize("final_shard", [False, True])
def test_a_masked_folder_resumes_to_the_same_shards_and_masks(tmp_path: Path, final_shard: bool) -> None:
    flat, lengths, mask = _masked_documents()
    options = {"tokens_per_shard": 97, "eos": 0}
    with tokformats.create(tmp_path / "once", "pt", final_shard=final_shard, **options) as writer:
        writer.write_batch(flat, lengths, mask)
    cut = int(lengths[:25].sum())
    with tokformats.create(tmp_path / "twice", "pt", final_shard=False, **options) as writer:
        writer.write_batch(flat[:cut], lengths[:25], mask[:cut])
    first = json.loads((tmp_path / "twice" / "checkpoints.json").read_text())["default"]
    assert len(first["leftover_loss_mask"]) == len(first["leftover_tokens"]) > 0  # the cut falls inside a shard
    with tokformats.create(tmp_path / "twice", "pt", resume=True, final_shard=final_shard, **options) as writer:
        writer.write_batch(flat[cut:], lengths[25:], mask[cut:])
    once, twice = _folder_files(tmp_path / "once"), _folder_files(tmp_path / "twice")
    assert once == twice
    assert sum(name.endswith(".loss_mask.pt") for name in once) == len(pt.shard_files(tmp_path / "once"))
    with tokformats.open(tmp_path / "twice") as reader:
        stored = np.asarray(reader.loss_masks[:]).astype(np.uint8)
        tokens = np.asarray(reader.tokens[:])
    expected, _ = add_delimiter(mask, lengths, 1)  # the writer's EOS after each document is trained on
    kept = len(tokens)  # without a final shard, the tail is in checkpoints.json, not a shard
    assert kept == (len(expected) if final_shard else len(expected) // 97 * 97)
    np.testing.assert_array_equal(stored, expected[:kept])
    tail = twice["checkpoints"]["default"]["leftover_loss_mask"]
    assert tail == expected[kept:].tolist()


def test_a_masked_folder_resumed_without_masks_trains_on_the_new_tokens(tmp_path: Path) -> None:
    with tokformats.create(tmp_path / "s", "pt", tokens_per_shard=4, final_shard=False) as writer:
        writer.write([1, 2, 3, 4, 5, 6], loss_mask=[0, 0, 1, 1, 0, 1])
    with tokformats.create(tmp_path / "s", "pt", tokens_per_shard=4, resume=True) as writer:
        writer.write([7, 8, 9])
        assert writer.loss_masked
    with tokformats.open(tmp_path / "s") as reader:
        assert np.asarray(reader.tokens[:]).tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9]
        assert np.asarray(reader.loss_masks[:]).astype(int).tolist() == [0, 0, 1, 1, 0, 1, 1, 1, 1]


def test_a_folder_whose_shards_all_have_masks_stays_masked_without_a_recorded_leftover_mask(tmp_path: Path) -> None:
    """A checkpoint written before leftover masks were recorded (no key, no leftover): the masked shards decide."""
    with tokformats.create(tmp_path / "s", "pt", tokens_per_shard=4) as writer:
        writer.write([1, 2, 3, 4], loss_mask=[0, 1, 0, 1])
    checkpoints = json.loads((tmp_path / "s" / "checkpoints.json").read_text())
    assert checkpoints["default"].pop("leftover_loss_mask") == []
    (tmp_path / "s" / "checkpoints.json").write_text(json.dumps(checkpoints))
    with tokformats.create(tmp_path / "s", "pt", tokens_per_shard=4, resume=True) as writer:
        writer.write([5, 6])
    with tokformats.open(tmp_path / "s") as reader:
        assert np.asarray(reader.loss_masks[:]).astype(int).tolist() == [0, 1, 0, 1, 1, 1]


@pytest.mark.parametrize("leftover", [True, False])
def test_masks_cannot_start_in_a_resumed_folder_written_without(tmp_path: Path, leftover: bool) -> None:
    with tokformats.create(tmp_path / "s", "pt", tokens_per_shard=4, final_shard=False) as writer:
        writer.write([1, 2, 3, 4, 5] if leftover else [1, 2, 3, 4])
    before = {p.name: p.read_bytes() for p in (tmp_path / "s").iterdir()}
    why = "leftover tokens of 'default' in checkpoints.json" if leftover else "shard_0.pt has no shard_0.loss_mask.pt"
    with pytest.raises(FormatError, match=f"loss masks cannot start in a resumed folder.*{why}"):
        with tokformats.create(tmp_path / "s", "pt", tokens_per_shard=4, resume=True) as writer:
            writer.write([6, 7], loss_mask=[1, 0])
    assert {p.name: p.read_bytes() for p in (tmp_path / "s").iterdir()} == before


@pytest.mark.parametrize("bad", [[1, 0], [0, 2, 1], [0, 0.5, 1], "011"])
def test_a_bad_leftover_mask_is_refused_naming_the_checkpoint(tmp_path: Path, bad: Any) -> None:
    with tokformats.create(tmp_path / "s", "pt", tokens_per_shard=4, final_shard=False) as writer:
        writer.write([1, 2, 3, 4, 5, 6, 7], loss_mask=[1] * 7)
    checkpoints = json.loads((tmp_path / "s" / "checkpoints.json").read_text())
    checkpoints["default"]["leftover_loss_mask"] = bad
    (tmp_path / "s" / "checkpoints.json").write_text(json.dumps(checkpoints))
    with pytest.raises(FormatError, match=r"checkpoints\.json: default\.leftover_loss_mask") as raised:
        tokformats.create(tmp_path / "s", "pt", tokens_per_shard=4, resume=True)
    assert "found []" not in str(raised.value)  # a value outside 0 and 1 is named


_STOP_AT: list[int] = []


def _stopping_chat(record: dict[str, Any]) -> list[dict[str, str]]:
    """A chat callable that stops the run (as Ctrl-C would) at the record numbered in ``_STOP_AT``."""
    if _STOP_AT and record["n"] == _STOP_AT[0]:
        raise KeyboardInterrupt
    return [{"role": "user", "content": record["q"]}, {"role": "assistant", "content": record["a"]}]


@pytest.mark.parametrize("final_shard", [False, True])
def test_an_interrupted_chat_run_into_a_folder_resumes_to_identical_shards_and_masks(
    tmp_path: Path, tokenizer_path: Path, final_shard: bool
) -> None:
    from tokformats.tokenization.sample_text import sample_texts

    texts = [t for t in sample_texts(400, seed=5) if t.strip()]
    source = tmp_path / "chats.jsonl"
    source.write_text("".join(json.dumps({"n": k, "q": texts[k], "a": texts[k + 1]}) + "\n" for k in range(300)))
    common: dict[str, Any] = {"chat": _stopping_chat, "batch_size": 10, "checkpoint_every": 0, "progress": False,
                              "tokens_per_shard": 1000, "final_shard": final_shard}  # fmt: skip
    reference = tokformats.tokenize([source], tokenizer_path, tmp_path / "ref", "pt", **common)
    _STOP_AT.append(205)
    try:
        with pytest.raises(KeyboardInterrupt):
            tokformats.tokenize([source], tokenizer_path, tmp_path / "run", "pt", **common)
    finally:
        _STOP_AT.clear()
    assert not (tmp_path / "run").exists()  # nothing is written before the run ends
    resumed = tokformats.tokenize([source], tokenizer_path, tmp_path / "run", "pt", resume=True, **common)
    assert resumed["documents"] == reference["documents"] == 300
    assert resumed["outputs"]["text"]["trained_tokens"] == reference["outputs"]["text"]["trained_tokens"]
    once, twice = _folder_files(tmp_path / "ref"), _folder_files(tmp_path / "run")
    assert once == twice and sum(name.endswith(".loss_mask.pt") for name in once) >= 2
    assert ("leftover_loss_mask" in once["checkpoints"]["default"]) and len(
        once["checkpoints"]["default"]["leftover_loss_mask"]
    ) == len(once["checkpoints"]["default"]["leftover_tokens"])


def test_resume_of_the_golden_folder_continues_after_its_leftover(fixtures: Path, tmp_path: Path) -> None:
    import shutil

    folder = tmp_path / "ns"
    shutil.copytree(fixtures / "torch" / "neuroshard", folder)
    with tokformats.create(
        folder, "pt", tokens_per_shard=5, source="fineweb-edu", resume=True, final_shard=False
    ) as writer:
        writer.write([14, 15, 16, 17])
    with tokformats.open(folder) as reader:
        assert reader.shard_ids == [0, 1, 2, 3]
        assert reader[3].tolist() == [11, 12, 13, 14, 15]
    checkpoints = json.loads((folder / "checkpoints.json").read_text())
    assert checkpoints["fineweb-edu"]["leftover_tokens"] == [16, 17]
    assert checkpoints["fineweb-edu"]["documents_processed"] == 38


def test_aborted_folder_writer_leaves_the_folder_as_it_was(tmp_path: Path) -> None:
    with tokformats.create(tmp_path / "s", "pt", tokens_per_shard=4, final_shard=False) as writer:
        writer.write([1, 2, 3, 4, 5])
    before = {p.name: p.read_bytes() for p in (tmp_path / "s").iterdir()}
    with pytest.raises(RuntimeError):
        with tokformats.create(tmp_path / "s", "pt", tokens_per_shard=4, resume=True) as writer:
            writer.write(list(range(100)))
            raise RuntimeError
    assert {p.name: p.read_bytes() for p in (tmp_path / "s").iterdir()} == before


def test_assigned_shards() -> None:
    import hashlib

    h = int(hashlib.sha256(b"node-42").hexdigest(), 16)
    assert pt.assigned_shards("node-42", 1000) == [(h + i) % 1000 for i in range(10)]
    assert pt.assigned_shards("node-42", 1000, count=3) == [(h + i) % 1000 for i in range(3)]
    assert sorted(pt.assigned_shards("x", 4)) == [0, 1, 2, 3]
    assert pt.assigned_shards("a", 7) == pt.assigned_shards("a", 7)


def test_missing_folder_contents(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(NoFilesError, match=r"no shard_N\.pt"):
        tokformats.open(tmp_path / "empty", format="pt")


def test_save_never_overwrites_silently(tmp_path: Path) -> None:
    pt.save(np.arange(5), tmp_path / "x.pt")
    with pytest.raises(OutputExistsError, match="overwrite"):
        pt.save(np.arange(9), tmp_path / "x.pt")
    assert pt.load(tmp_path / "x.pt").tolist() == [0, 1, 2, 3, 4]
    pt.save(np.arange(9), tmp_path / "x.pt", overwrite=True)
    assert len(pt.load(tmp_path / "x.pt")) == 9
