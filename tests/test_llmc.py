"""llm.c token shards: golden files, byte-identical rewrites, header validation, rotation."""

from __future__ import annotations

import json
import pickle
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tokformats
from tokformats import DataWarning, FormatError, HeaderError, NoFilesError, SizeMismatchError
from tokformats.formats import llmc
from tokformats.testing import TokenFormatTests

BOS = 0


class TestLLMCConformance(TokenFormatTests):
    format = "llmc"
    dtypes = ("uint16", "uint32")
    low_id = 1

    def write_options(self) -> dict[str, Any]:
        return {"bos": BOS}

    def source(self, target: Path) -> Any:
        return f"{target}_[0-9]*.bin"

    def read_options(self, dtype: str) -> dict[str, Any]:
        return {"bos": BOS}

    def expected(self, document: np.ndarray) -> np.ndarray:
        return np.concatenate([[BOS], document])


class TestLLMCConformanceSmallShards(TestLLMCConformance):
    """The same suite with shards of 97 tokens: documents cross shard boundaries everywhere."""

    huge_tokens = 100_000  # about a thousand shards

    def write_options(self) -> dict[str, Any]:
        return {"bos": BOS, "shard_size": 97}


SHARDS = ["corpus_train_000000", "corpus_train_000001", "llama3_val_000000"]


@pytest.mark.parametrize("name", SHARDS)
def test_golden_shard_reads_exactly(fixtures: Path, name: str) -> None:
    expected = np.load(fixtures / "llmc" / f"{name}.expected.npy")
    assert tokformats.detect(fixtures / "llmc" / f"{name}.bin") == "llmc"
    with tokformats.open(fixtures / "llmc" / f"{name}.bin") as reader:
        assert reader.dtype == expected.dtype
        np.testing.assert_array_equal(np.asarray(reader.tokens), expected)
        assert isinstance(reader.tokens, np.memmap)


@pytest.mark.parametrize("name", SHARDS)
def test_golden_shard_rewrites_byte_for_byte(fixtures: Path, tmp_path: Path, name: str) -> None:
    expected = np.load(fixtures / "llmc" / f"{name}.expected.npy")
    with tokformats.create(tmp_path / "out", "llmc", dtype=expected.dtype) as writer:
        writer.write(expected)
    assert writer.written == [tmp_path / "out_000000.bin"]
    assert writer.written[0].read_bytes() == (fixtures / "llmc" / f"{name}.bin").read_bytes()


def test_golden_corpus_documents(fixtures: Path) -> None:
    documents = json.loads((fixtures / "llmc" / "corpus.docs.json").read_text())
    with tokformats.open(str(fixtures / "llmc" / "corpus_train_*.bin"), bos=0) as reader:
        assert reader.num_shards == 2
        assert len(reader) == len(documents) == 400
        assert all(reader[k][0] == 0 for k in range(len(reader)))
        # The second shard starts mid-document: document 203 straddles the boundary.
        first = np.load(fixtures / "llmc" / "corpus_train_000000.expected.npy")
        straddler = reader[203]
        assert reader.offsets[203] < len(first) < reader.offsets[204]
        assert straddler.base is None or not isinstance(straddler, np.memmap)
    with tokformats.open(fixtures / "llmc" / "corpus_train_000001.bin", bos=0) as second:
        assert second[0][0] != 0, "a shard opened alone starts with the tail of the previous document"


def test_default_delimiters_by_family(fixtures: Path) -> None:
    with tokformats.open(fixtures / "llmc" / "llama3_val_000000.bin") as reader:
        assert reader.bos == 128000 and reader.metadata["family"] == "llama3"
        assert len(reader) == 2 and reader[1][0] == 128000
    with tokformats.open(fixtures / "llmc" / "corpus_train_000000.bin", bos=None) as reader:
        assert len(reader) == 1 and reader.bos is None


def test_another_tokenizers_delimiter_is_not_guessed(fixtures: Path) -> None:
    """Issue 22, item 1: llm.c's own shards written with another tokenizer (EOT 0) record no delimiter; the reader
    reads one stream and warns with the options to pass, rather than guessing the first token."""
    documents = json.loads((fixtures / "llmc" / "corpus.docs.json").read_text())
    with pytest.warns(DataWarning, match=r"pass bos=0; .* pass eos=317"):
        reader = tokformats.open(fixtures / "llmc" / "corpus_train_*.bin")
    with reader:
        assert (reader.bos, reader.eos, reader.bos_rule, len(reader)) == (None, None, "unknown", 1)
        assert [p.field for p in reader.problems()] == ["delimiter"]
    with tokformats.open(fixtures / "llmc" / "corpus_train_*.bin", bos=0) as reader:
        assert len(reader) == len(documents) == 400
        copy = pickle.loads(pickle.dumps(reader))
        assert copy.bos == 0 and len(copy) == 400
    # A GPT-2 shard opened from the middle of a corpus still finds 50256 near its start.
    with tempfile.TemporaryDirectory() as scratch:
        with tokformats.create(Path(scratch) / "x", format="llmc", vocab_size=50257) as writer:
            writer.write_batch([7, 8, 50256, 9, 50256, 4], [6])
        with tokformats.open(Path(scratch) / "x_000000.bin") as reader:
            assert (reader.bos, reader.bos_rule, len(reader)) == (50256, "family", 3)


def test_glob_sorted_and_list(fixtures: Path) -> None:
    paths = [fixtures / "llmc" / "corpus_train_000001.bin", fixtures / "llmc" / "corpus_train_000000.bin"]
    with tokformats.open(paths, bos=0) as reader:
        assert reader.files == sorted(paths)
        whole = np.concatenate([np.load(str(p).replace(".bin", ".expected.npy")) for p in sorted(paths)])
        np.testing.assert_array_equal(np.asarray(reader.tokens), whole)
        np.testing.assert_array_equal(reader.tokens[12690:12710], whole[12690:12710])


def test_glob_matching_nothing(tmp_path: Path) -> None:
    with pytest.raises(NoFilesError, match="matches no file"):
        tokformats.open(str(tmp_path / "x_[0-9]*.bin"))


def shard_bytes(tokens: list[int], magic: int = 20240520, version: int = 1, ntok: int | None = None) -> bytes:
    header = np.zeros(256, dtype="<i4")
    header[:3] = magic, version, len(tokens) if ntok is None else ntok
    return header.tobytes() + np.array(tokens, dtype="<u2" if magic == 20240520 else "<u4").tobytes()


@pytest.mark.parametrize(
    ("content", "error", "message"),
    [
        (shard_bytes([1, 2], magic=20240328), HeaderError, r"'magic' is 20240328 \(an llm.c tokenizer vocabulary"),
        (shard_bytes([1, 2], magic=12345), HeaderError, "'magic' is 12345; an llm.c token shard has"),
        (shard_bytes([1, 2], version=7), HeaderError, "'version' is 7; with magic 20240520 llm.c expects 1"),
        (shard_bytes([1, 2], ntok=3), SizeMismatchError, r"should have 1,030 bytes, but it has 1,028 \(the file is"),
        (shard_bytes([1, 2]) + b"\0", SizeMismatchError, "trailing bytes"),
        (shard_bytes([1, 2], ntok=-1), HeaderError, "'ntok' is negative"),
    ],
)
def test_malformed_shards(tmp_path: Path, content: bytes, error: type, message: str) -> None:
    path = tmp_path / "bad.bin"
    path.write_bytes(content)
    with pytest.raises(error, match=message):
        tokformats.open(path, format="llmc")


@pytest.mark.parametrize("cut", [0, 4, 8, 11, 12, 512, 1023])
def test_truncated_header(tmp_path: Path, cut: int) -> None:
    path = tmp_path / "cut.bin"
    path.write_bytes(shard_bytes([1, 2, 3])[:cut])
    with pytest.raises(SizeMismatchError, match="1024-byte header"):
        tokformats.open(path, format="llmc")


def test_rotation_and_naming(tmp_path: Path) -> None:
    with tokformats.create(tmp_path / "fw", "llmc", vocab_size=50257, shard_size=10, split="val") as w:
        w.write_batch(np.arange(1, 26), np.array([12, 13]))
    assert [p.name for p in w.written] == ["fw_val_000000.bin", "fw_val_000001.bin", "fw_val_000002.bin"]
    assert [llmc.read_header(p)[1] for p in w.written] == [10, 10, 5]
    with tokformats.open(str(tmp_path / "fw_val_*.bin"), bos=None) as r:
        assert r.tokens[:].tolist() == list(range(1, 26))


def test_shards_never_reach_two_gib(tmp_path: Path) -> None:
    w = tokformats.create(tmp_path / "big", "llmc", dtype="uint32", shard_size=10**10)
    assert isinstance(w, llmc.Writer)
    assert 1024 + w.shard_size * 4 < 2**31
    w.abort()
    assert list(tmp_path.iterdir()) == []


def test_overwrite_removes_stale_shards(tmp_path: Path) -> None:
    with tokformats.create(tmp_path / "c", "llmc", vocab_size=100, shard_size=2) as w:
        w.write([1, 2, 3, 4, 5])
    assert len(w.written) == 3
    with tokformats.create(tmp_path / "c", "llmc", vocab_size=100, shard_size=2, overwrite=True) as w:
        w.write([7])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c_000000.bin"]


def test_family_from_vocab_size_and_dtype(tmp_path: Path) -> None:
    with tokformats.create(tmp_path / "l3", "llmc", vocab_size=128256) as w:
        w.write([128000, 70000])
    family, ntok = llmc.read_header(w.written[0])
    assert (family.name, family.magic, family.version, ntok) == ("llama3", 20240801, 7, 2)
    with pytest.raises(tokformats.DTypeError, match="llmc stores tokens as uint16, uint32; int32 was asked for"):
        tokformats.create(tmp_path / "x", "llmc", dtype="int32")


def test_batches_follow_the_c_loader(tmp_path: Path) -> None:
    with tokformats.create(tmp_path / "b", "llmc", vocab_size=1000, shard_size=50) as w:
        w.write(np.arange(100) % 1000)
    with tokformats.open(str(tmp_path / "b_[0-9]*.bin")) as r:
        batches = list(r.batches(2, 4, rank=1, world_size=2))
        # each 50-token shard gives (50 - 1) // (2 * 8) = 3 windows per process
        assert len(batches) == 6
        inputs, targets = batches[0]
        assert inputs.dtype == np.int32 and inputs.shape == (2, 4)
        assert inputs.ravel().tolist() == list(range(8, 16))
        assert targets.ravel().tolist() == list(range(9, 17))
        assert batches[3][0].ravel().tolist() == list(range(58, 66))


def _shards(folder: Path, count: int, tokens: int = 10, *, seed: int = 0) -> tuple[np.ndarray, str]:
    """``count`` shards of ``tokens`` uint16 tokens each (documents start with BOS = 0); the stream and the glob."""
    rng = np.random.default_rng(seed)
    stream = rng.integers(1, 60000, count * tokens).astype(np.uint16)
    stream[rng.random(len(stream)) < 0.1] = 0
    stream[0] = 0
    for k in range(count):
        (folder / f"c_train_{k:06d}.bin").write_bytes(shard_bytes(stream[k * tokens : (k + 1) * tokens].tolist()))
    return stream, str(folder / "c_train_*.bin")


def test_a_fifo_or_a_folder_among_a_globs_shards_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a FIFO past the first shard (size 0: no shard) is refused without waiting for a writer; a folder named like a
    # shard is refused when its header would be read, as a FormatError naming it (not an IsADirectoryError)
    import os
    import socket
    import subprocess
    import sys

    _, pattern = _shards(tmp_path, 5)
    fifo = tmp_path / "c_train_000003.bin"
    fifo.unlink()
    os.mkfifo(fifo)
    script = f"import tokformats; tokformats.open({pattern!r}, bos=0)"
    env = {**os.environ, "PYTHONPATH": str(Path(tokformats.__file__).parents[1])}  # this checkout's code
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)
    assert run.returncode == 1 and f"FormatError: {fifo} is a FIFO" in run.stderr, run.stderr
    fifo.unlink()
    monkeypatch.chdir(tmp_path)  # a socket's path is short (108 bytes at most): bound by its name
    with socket.socket(socket.AF_UNIX) as server:  # a socket cannot even be opened: still a FormatError naming it
        server.bind(fifo.name)
        with pytest.raises(FormatError, match=f"{fifo} is a socket"):
            tokformats.open(pattern, bos=0)
    fifo.unlink()
    folder = tmp_path / "c_train_000002.bin"
    folder.unlink()
    folder.mkdir()
    (tmp_path / "c_train_000003.bin").write_bytes(shard_bytes([0, 1, 2]))
    with pytest.raises(FormatError, match=f"{folder} is a folder"):
        with tokformats.open(pattern, bos=0) as reader:
            np.asarray(reader.tokens)


def test_glob_maps_shards_only_as_they_are_read(tmp_path: Path) -> None:
    stream, pattern = _shards(tmp_path, 50)
    with tokformats.open(pattern, bos=0, open_maps=4) as reader:
        shards = reader.shards
        assert reader.num_tokens == len(stream) and reader.num_shards == 50
        assert not any(shard.loaded for shard in shards)  # the delimiter is given: nothing read yet
        np.testing.assert_array_equal(reader.tokens[215:237], stream[215:237])
        assert [k for k in range(50) if shards[k].loaded] == [21, 22, 23]
        np.testing.assert_array_equal(np.asarray(reader.tokens), stream)
        assert len(shards.open_maps) == 4 and sum(shard.loaded for shard in shards) == 4
        expected = np.split(stream, np.flatnonzero(stream == 0)[1:])
        assert len(reader) == len(expected)
        for k in [0, 1, len(expected) // 2, len(expected) - 1]:
            np.testing.assert_array_equal(reader[k], expected[k])
        assert pickle.loads(pickle.dumps(reader)).open_maps == 4


def test_a_later_shard_is_checked_before_any_of_its_tokens_is_read(tmp_path: Path) -> None:
    stream, pattern = _shards(tmp_path, 10)
    (tmp_path / "c_train_000007.bin").write_bytes(shard_bytes(stream[70:80].tolist(), magic=12345))
    (tmp_path / "c_train_000008.bin").write_bytes(shard_bytes(list(range(5)), magic=20240801, version=7))
    with tokformats.open(pattern, bos=0) as reader:
        np.testing.assert_array_equal(reader.tokens[:70], stream[:70])
        with pytest.raises(HeaderError, match=r"c_train_000007.bin: header field 'magic' is 12345"):
            reader.tokens[75]
        with pytest.raises(HeaderError, match=r"the shards mix model families \['gpt2', 'llama3'\]"):
            reader.shards[8][0]
        with pytest.raises(HeaderError, match=r"c_train_000007\.bin"):
            len(reader)  # finding documents reads every shard


def test_a_glob_refuses_an_impossible_size_at_open(tmp_path: Path) -> None:
    stream, pattern = _shards(tmp_path, 5)
    (tmp_path / "c_train_000003.bin").write_bytes(shard_bytes(stream[30:40].tolist()) + b"\0")
    with pytest.raises(SizeMismatchError, match=r"c_train_000003.bin: .* \(trailing bytes\)"):
        tokformats.open(pattern, bos=0)
    (tmp_path / "c_train_000003.bin").write_bytes(b"\0" * 100)
    with pytest.raises(SizeMismatchError, match=r"c_train_000003\.bin: an llm\.c shard starts with a 1024-byte header"):
        tokformats.open(pattern, bos=0)


def test_token_counts_are_the_same_below_and_above_the_python_check() -> None:
    # small globs are checked by a Python loop, large ones with NumPy: the same counts and the same first bad shard
    limit = llmc._PYTHON_SIZE_CHECK
    for itemsize in (2, 4):
        good = [llmc.HEADER_BYTES + itemsize * k for k in range(limit + 10)]
        for bad_at, bad_size in [(None, 0), (3, llmc.HEADER_BYTES - 1), (limit + 5, llmc.HEADER_BYTES + 1), (0, 0)]:
            sizes = list(good)
            if bad_at is not None:
                sizes[bad_at] = bad_size
            for part in (sizes[: limit - 1], sizes):
                counts, first_bad = llmc._token_counts(part, itemsize)
                expected_bad = bad_at if bad_at is not None and bad_at < len(part) else None
                assert first_bad == expected_bad, (itemsize, bad_at, len(part))
                if first_bad is None:
                    assert counts.dtype == np.int64 and counts.tolist() == list(range(len(part)))
    # a body of 2 bytes is one uint16 token but half a uint32 one; bodies of one size and mixed sizes past the limit
    sizes = [llmc.HEADER_BYTES + 4 * k for k in range(limit + 10)]
    sizes[limit + 7] = llmc.HEADER_BYTES + 2
    assert llmc._token_counts(sizes, 4)[1] == limit + 7 and llmc._token_counts(sizes, 2)[1] is None
    assert llmc._token_counts(sizes, 2)[0][limit + 7] == 1 and llmc._token_counts(sizes, 2)[0][9] == 18
    assert llmc._token_counts([llmc.HEADER_BYTES + 6] * (limit + 1), 2)[0].tolist() == [3] * (limit + 1)


def test_family_is_a_named_tuple() -> None:
    # public: it compares by value, unpacks, matches positionally and pickles
    gpt2 = llmc.GPT2
    assert isinstance(gpt2, tuple) and gpt2 == ("gpt2", 20240520, 1, np.dtype("<u2"), 50256)
    name, magic, version, dtype, delimiter = gpt2
    assert (name, magic, version, dtype, delimiter) == (gpt2.name, gpt2.magic, gpt2.version, gpt2.dtype, gpt2.delimiter)
    assert llmc.Family._fields == ("name", "magic", "version", "dtype", "delimiter")
    assert gpt2._asdict() == dict(zip(llmc.Family._fields, gpt2)) and gpt2._asdict()["delimiter"] == 50256
    assert gpt2._replace(delimiter=0) == ("gpt2", 20240520, 1, np.dtype("<u2"), 0) and gpt2.delimiter == 50256
    assert llmc.Family._make(list(gpt2)) == gpt2 and hash(llmc.Family._make(gpt2)) == hash(gpt2)
    assert repr(gpt2) == "Family(name='gpt2', magic=20240520, version=1, dtype=dtype('uint16'), delimiter=50256)"
    assert pickle.loads(pickle.dumps(llmc.LLAMA3)) == llmc.LLAMA3
    assert type(pickle.loads(pickle.dumps(llmc.LLAMA3))) is llmc.Family
    with pytest.raises(ValueError, match="size"):
        gpt2._replace(size=2)
    with pytest.raises(AttributeError):
        gpt2.extra = 1  # type: ignore[attr-defined]
    match llmc.LLAMA3:
        case llmc.Family(name, _, _, dtype, _):
            assert (name, dtype) == ("llama3", np.dtype("<u4"))
        case _:
            pytest.fail("Family does not match positionally")


def test_families_are_the_same_named_tuples_everywhere(tmp_path: Path) -> None:
    # one Family value per family: what FAMILIES holds is what an open, read_header and a writer give
    from tokformats.formats.llmc import FAMILIES, GPT2, LLAMA3, Family

    assert FAMILIES is llmc.FAMILIES and FAMILIES == {20240520: GPT2, 20240801: LLAMA3}
    assert type(GPT2) is Family and GPT2 is llmc.GPT2 and LLAMA3.dtype == np.dtype("<u4")
    _, pattern = _shards(tmp_path, 3)
    with tokformats.open(pattern, bos=0) as reader:
        assert reader.family is GPT2 and reader.metadata["family"] == "gpt2"  # type: ignore[attr-defined]
    assert llmc.read_header(Path(sorted(tmp_path.glob("c_train_*.bin"))[0]))[0] is GPT2
    with tokformats.create(tmp_path / "l", "llmc", vocab_size=200_000) as writer:
        assert writer.family is LLAMA3  # type: ignore[attr-defined]
        writer.write([1, 2])
    assert {"Family", "GPT2", "LLAMA3", "FAMILIES"} <= set(dir(llmc))
    with pytest.raises(AttributeError, match="has no attribute 'GPT3'"):
        llmc.GPT3  # type: ignore[attr-defined]  # noqa: B018


def test_a_glob_pins_each_shard_from_its_one_stat(tmp_path: Path) -> None:
    # the pins are kept flat (four ints a shard); each is what os.stat said of that shard at open
    import os

    from tokformats.formats._parts import PartTable

    _, pattern = _shards(tmp_path, 5)
    with tokformats.open(pattern, bos=0) as reader:
        table = reader._parts
        assert isinstance(table, PartTable) and len(table.pins) == 4 * len(table)
        for k, path in enumerate(table.paths):
            info = os.stat(path)
            assert table.pin(k) == (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
        assert table.pin(-1) == table.pin(len(table) - 1) and table.pin(np.int64(2)) == table.pin(2)
        for outside in (len(table), -len(table) - 1):
            with pytest.raises(IndexError):
                table.pin(outside)
    with pytest.raises(ValueError, match=r"2 paths, 2 counts and 1\.5 pins do not match"):
        PartTable(["a", "b"], 1024, np.zeros(2, dtype=np.int64), np.dtype("<u2"), [0] * 6)


def test_a_shard_replaced_after_open_is_refused(tmp_path: Path) -> None:
    stream, pattern = _shards(tmp_path, 5)
    with tokformats.open(pattern, bos=0) as reader:
        replacement = tmp_path / "new.bin"
        replacement.write_bytes(shard_bytes(list(range(1, 11))))
        replacement.replace(tmp_path / "c_train_000004.bin")
        np.testing.assert_array_equal(reader.tokens[:40], stream[:40])
        with pytest.raises(tokformats.FormatError, match=r"c_train_000004\.bin changed on disk since"):
            reader.tokens[45]


READ_UNDER_A_SMALL_FD_LIMIT = """
import resource, sys
import numpy as np
resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
import tokformats
stream = np.load(sys.argv[2])
reader = tokformats.open(sys.argv[1], bos=0)
starts = np.flatnonzero(stream == 0)
assert len(reader) == len(starts), (len(reader), len(starts))
for k, start in enumerate(starts.tolist()):
    stop = int(starts[k + 1]) if k + 1 < len(starts) else len(stream)
    assert np.array_equal(reader[k], stream[start:stop]), k
assert np.array_equal(np.asarray(reader.tokens), stream)
assert sum(int(np.asarray(s, dtype=np.int64).sum()) for s in reader.shards) == int(stream.astype(np.int64).sum())
assert len(reader.shards.open_maps) <= 64
print("read", len(reader), "documents of", reader.num_shards, "shards")
"""


def test_two_thousand_shards_read_under_ulimit_256(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    stream, pattern = _shards(tmp_path, 2000, tokens=7, seed=1)
    np.save(tmp_path.parent / "stream.npy", stream)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(tokformats.__file__).parents[1]), *sys.path])}
    run = subprocess.run(
        [sys.executable, "-c", READ_UNDER_A_SMALL_FD_LIMIT, pattern, str(tmp_path.parent / "stream.npy")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split()[-3:] == ["of", "2000", "shards"]


def test_each_shard_header_is_read_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stream, pattern = _shards(tmp_path, 10)
    read: list[str] = []
    pread_head = llmc._pread_head

    def counted(path: Any) -> bytes:
        read.append(Path(path).name)
        return pread_head(path)

    monkeypatch.setattr(llmc, "_pread_head", counted)
    with tokformats.open(pattern, bos=0) as reader:  # the first shard's header is read at open (it decides the family)
        assert read == ["c_train_000000.bin"] and reader.family.name == "gpt2"
        np.testing.assert_array_equal(np.asarray(reader.tokens), stream)
    assert sorted(read) == [f"c_train_{k:06d}.bin" for k in range(10)]


def test_the_first_shard_replaced_after_open_is_refused_at_its_first_read(tmp_path: Path) -> None:
    _, pattern = _shards(tmp_path, 3)
    with tokformats.open(pattern, bos=0) as reader:  # its header was checked at open, under its pin
        replacement = tmp_path / "new.bin"
        replacement.write_bytes(shard_bytes(list(range(1, 11))))
        replacement.replace(tmp_path / "c_train_000000.bin")
        with pytest.raises(tokformats.FormatError, match=r"c_train_000000\.bin changed on disk since"):
            reader.tokens[0]


def test_a_missing_shard_of_a_list_is_named(tmp_path: Path) -> None:
    _shards(tmp_path, 3)
    listed = [tmp_path / "c_train_000000.bin", tmp_path / "gone.bin", tmp_path / "c_train_000002.bin"]
    with pytest.raises(NoFilesError, match=r"gone\.bin does not exist"):
        llmc.Reader(listed, bos=0)


OPEN_A_GLOB_AND_LIST_MODULES = """
import sys
import tokformats
reader = tokformats.open(sys.argv[1], bos=0)
inputs, _ = next(reader.batches(2, 4))
print(sorted(m for m in sys.modules if m.startswith("tokformats.formats.") or m == "resource"))
print(tokformats.llmc.Vocab.__module__, int(inputs.sum()))
"""


def test_opening_a_glob_imports_only_what_reading_needs(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    stream, pattern = _shards(tmp_path, 10)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(tokformats.__file__).parents[1]), *sys.path])}
    run = subprocess.run([sys.executable, "-c", OPEN_A_GLOB_AND_LIST_MODULES, pattern], capture_output=True, text=True,
                         env=env, timeout=120)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    modules, vocab = run.stdout.splitlines()
    # Not the writer's shard roll-over, the vocabulary format, nor `resource` for a glob below the least map bound.
    assert modules == "['tokformats.formats._parts', 'tokformats.formats.llmc']"
    assert vocab == f"tokformats.formats.llmc_vocab {int(stream[:8].astype(np.int64).sum())}"


@pytest.mark.parametrize(("soft", "bound"), [(-1, 1024), (40, 16), (256, 64), (1024, 256), (20_000, 1024)])
def test_the_default_map_bound_is_a_quarter_of_the_descriptor_limit(
    monkeypatch: pytest.MonkeyPatch, soft: int, bound: int
) -> None:
    import os

    from tokformats.core.arrays import default_open_maps

    monkeypatch.setattr(os, "sysconf", lambda name: soft if name == "SC_OPEN_MAX" else 0)
    assert default_open_maps() == bound


def test_the_default_map_bound_reads_this_process_limit() -> None:
    import os
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    from tokformats.core.arrays import default_open_maps

    expected = 1024 if soft == resource.RLIM_INFINITY else max(16, min(1024, soft // 4))
    assert default_open_maps() == expected and os.sysconf("SC_OPEN_MAX") in (soft, -1)
