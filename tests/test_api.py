"""The public face: the format table, detection, open/create errors, convert, ConcatenatedArray, CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tokformats
from tokformats import ConcatenatedArray, NoFilesError, UnknownFormatError
from tokformats.cli import main


def test_public_names() -> None:
    from collections.abc import Mapping, MutableMapping

    # a read-only mapping (the registry's table), not the package
    assert isinstance(tokformats.formats, Mapping) and not isinstance(tokformats.formats, MutableMapping)
    for name in ("raw", "llmc", "megatron"):
        assert name in tokformats.formats
        assert getattr(tokformats, name).Reader.format == name
    with pytest.raises(TypeError):
        tokformats.formats["x"] = tokformats.formats["raw"]  # type: ignore[index]
    assert issubclass(tokformats.FormatError, ValueError)
    assert issubclass(tokformats.OutputExistsError, FileExistsError)


def test_descriptors() -> None:
    raw = tokformats.formats["raw"]
    assert raw.detectable is False and raw.writer is tokformats.raw.Writer
    assert tokformats.formats["llmc"].reader is tokformats.llmc.Reader
    with pytest.raises(ValueError, match="already registered"):
        tokformats.register(raw)


def test_unknown_format_name(tmp_path: Path) -> None:
    with pytest.raises(UnknownFormatError, match=r"there is no format named 'nope'\. The formats are: .*llmc"):
        tokformats.open(tmp_path / "x", format="nope")
    with pytest.raises(UnknownFormatError, match="Did you mean 'megatron'"):
        tokformats.open(tmp_path / "x", format="megatrn")
    with pytest.raises(UnknownFormatError):
        tokformats.create(tmp_path / "x", "nope")


def test_detect_missing_path(tmp_path: Path) -> None:
    with pytest.raises(NoFilesError, match="does not exist"):
        tokformats.detect(tmp_path / "missing.bin")
    with pytest.raises(NoFilesError, match="matches no file"):
        tokformats.detect(str(tmp_path / "*.bin"))
    with pytest.raises(NoFilesError, match="empty list"):
        tokformats.detect([])


def test_convert_picks_a_dtype_the_destination_can_store(tmp_path: Path) -> None:
    legacy = tmp_path / "legacy.bin"  # llm.c before 2024-05-21: headerless int32
    np.array([50256, 1, 2, 50256, 3], dtype="<i4").tofile(legacy)
    summary = tokformats.convert(
        legacy, tmp_path / "new", "llmc", source_format="raw", source_options={"dtype": "int32"}
    )
    assert summary["tokens"] == 5
    with tokformats.open(summary["files"][0]) as shard:
        assert shard.dtype == np.dtype("uint16") and shard.tokens[:].tolist() == [50256, 1, 2, 50256, 3]
        assert [d.tolist() for d in shard] == [[50256, 1, 2], [50256, 3]]


def test_convert_refuses_non_corpus_destinations(tmp_path: Path) -> None:
    with pytest.raises(UnknownFormatError, match="does not store token corpora"):
        tokformats.convert(tmp_path / "x.bin", tmp_path / "v.bin", "llmc-vocab", source_format="raw")
    with pytest.raises(UnknownFormatError, match="does not store token corpora"):
        tokformats.convert(tmp_path / "x.bin", tmp_path / "s.json", "sequences", source_format="raw")


def test_concatenated_array_indexing() -> None:
    parts = [np.arange(0, 5), np.arange(5, 5), np.arange(5, 12), np.arange(12, 13)]
    joined = ConcatenatedArray(parts)
    whole = np.arange(13)
    assert len(joined) == 13 and joined.shape == (13,) and joined.nbytes == whole.nbytes
    for key in [
        slice(None),
        slice(2, 9),
        slice(4, 6),
        slice(None, None, 3),
        slice(11, 1, -2),
        slice(-3, None),
        slice(7, 7),
    ]:
        np.testing.assert_array_equal(joined[key], whole[key], err_msg=str(key))
    assert joined[7] == 7 and joined[-1] == 12
    np.testing.assert_array_equal(joined[np.array([12, 0, 6, -2])], whole[[12, 0, 6, -2]])
    np.testing.assert_array_equal(np.asarray(joined), whole)
    assert joined.sum() == whole.sum() and joined.min() == 0 and joined.max() == 12
    assert joined[6:8].base is not None, "a slice inside one part is a view"
    with pytest.raises(IndexError):
        joined[13]
    assert list(np.concatenate(list(joined.iter_chunks(4)))) == list(whole)


def test_cli_info_json_and_text(fixtures: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shards = sorted(str(p) for p in (fixtures / "llmc").glob("corpus_train_*.bin"))
    assert main(["info", *shards, "--bos", "0", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["format"] == "llmc" and info["documents"] == 400 and info["tokens"] == 25399
    assert info["min_id"] == 0 and info["max_id"] == 699 and info["dtype"] == "uint16"
    assert info["bytes_on_disk"] == sum(Path(s).stat().st_size for s in shards)
    assert info["metadata"]["magic"] == 20240520 and len(info["metadata"]["shards"]) == 2
    assert main(["info", shards[0]]) == 0
    text = capsys.readouterr().out
    assert "format" in text and "llmc" in text and "12,699" in text


def test_cli_errors_are_one_line_with_status_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.bin"
    np.arange(10, dtype="<u2").tofile(path)
    assert main(["info", str(path)]) == 2
    assert "pass --format raw and --dtype DTYPE" in capsys.readouterr().err
    assert main(["info", str(path), "--format", "raw", "--dtype", "uint16", "--eos", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["documents"] == 2


def test_cli_convert(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.bin"
    np.array([5, 0, 6, 7, 0], dtype="<u2").tofile(path)
    args = ["convert", str(path), str(tmp_path / "m"), "--format", "raw", "--dtype", "uint16", "--eos", "0"]
    assert main([*args, "--to", "megatron"]) == 0
    assert "2 documents, 5 tokens" in capsys.readouterr().out
    with tokformats.open(tmp_path / "m") as reader:
        assert [d.tolist() for d in reader] == [[5, 0], [6, 7, 0]]


def test_python_dash_m_quickstart_runs_every_writable_format() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tokformats", "quickstart"], capture_output=True, text=True, check=True
    )
    for name, descriptor in tokformats.formats.items():
        if descriptor.writable:
            assert f"\n{name} " in done.stdout
    assert "round-tripped exactly" in done.stdout


def test_quickstart_json_gives_numbers_as_numbers() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tokformats", "quickstart", "--json"], capture_output=True, text=True, check=True
    )
    rows = json.loads(done.stdout)
    corpora = [r for r in rows if r["dtype"] != "bytes" and r["check"] == "ok"]
    assert corpora and all(type(r["documents"]) is int and type(r["tokens"]) is int for r in corpora)
    held_none = [r for r in rows if r["dtype"] == "bytes" or r["check"].startswith("skipped")]
    assert all(r["documents"] is None for r in held_none)  # a vocabulary's file, a format skipped: no documents


def test_sample_texts_are_deterministic_and_multibyte() -> None:
    from tokformats.tokenization.sample_text import sample_texts

    first, again = sample_texts(50), sample_texts(50)
    assert first == again and len(first) == 50
    joined = "".join(first)
    assert any("\u4e00" <= c <= "\u9fff" for c in joined), "CJK characters"
    assert any(ord(c) > 0xFFFF for c in joined), "emoji outside the BMP"
    assert any(c in "éüöç" for c in joined.lower()), "accented Latin"


def test_write_all_streams_in_bounded_pieces(tmp_path: Path) -> None:
    rng = np.random.default_rng(9)
    lengths = rng.integers(0, 50, size=200)
    flat = rng.integers(1, 1000, size=int(lengths.sum()))
    calls: list[int] = []
    with tokformats.create(tmp_path / "m", "megatron", vocab_size=1000) as writer:
        original = writer.write_batch
        writer.write_batch = lambda ids, sizes: (calls.append(len(ids)), original(ids, sizes))  # type: ignore[method-assign]
        writer.write_all(flat, lengths, batch_tokens=300)
    assert len(calls) > 10 and max(calls) <= 300 + 49 and sum(calls) == len(flat)
    with tokformats.open(tmp_path / "m") as reader:
        assert reader.lengths.tolist() == lengths.tolist()
        np.testing.assert_array_equal(np.asarray(reader.tokens), flat)


def test_formats_register_through_the_entry_point_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plugin package declares ``[project.entry-points."tokformats.formats"]``; tokformats loads it lazily."""
    import importlib.metadata

    from tokformats.core import registry

    plugin = tokformats.FormatDescriptor("plugin-raw", "a plugin", (".plg",), "tokformats.formats.raw", False)

    class Entry:
        def __init__(self, name: str, value: str, loaded: object) -> None:
            self.name, self.value, self._loaded = name, value, loaded

        def load(self) -> object:
            if isinstance(self._loaded, Exception):
                raise self._loaded
            return self._loaded

    entries = [
        Entry("good", "plugin:descriptor", plugin),
        Entry("broken", "plugin:missing", ImportError("no module named plugin")),
        Entry("wrong", "plugin:thing", 42),
    ]
    monkeypatch.setattr(
        importlib.metadata, "entry_points", lambda group: entries if group == "tokformats.formats" else []
    )
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    try:
        with pytest.warns(UserWarning, match="failed to load"):
            assert registry.descriptor("plugin-raw") is plugin
        assert "plugin-raw" in tokformats.formats
    finally:
        registry._REGISTRY.pop("plugin-raw", None)


def test_merge_of_any_format_keeps_every_document(tmp_path: Path) -> None:
    from tokformats.testing import random_corpus

    parts = []
    for k in range(3):
        flat, lengths = random_corpus(np.random.default_rng(k), 20, low=0, high=900)
        with tokformats.create(tmp_path / f"part{k}", "litdata", vocab_size=1000, chunk_size=200) as writer:
            writer.write_batch(flat, lengths)
        parts.append((flat, lengths))
    with tokformats.api.merge([tmp_path / f"part{k}" for k in range(3)], tmp_path / "all") as merged:
        assert merged.format == "litdata" and merged.dtype == np.dtype("<u2")
        want = [d.tolist() for flat, lengths in parts for d in np.split(flat, np.cumsum(lengths)[:-1])]
        assert [d.tolist() for d in merged] == want
    with pytest.raises(tokformats.OutputExistsError):
        tokformats.api.merge([tmp_path / "part0"], tmp_path / "all")


def test_vocabulary_export_is_generic(tmp_path: Path, tokenizer_path: Path) -> None:
    assert tokformats.api.vocabulary_formats() == ["llmc-vocab"]
    path = tokformats.api.export_tokenizer(tokenizer_path, tmp_path / "v.bin", "llmc-vocab")
    with tokformats.open(path) as vocabulary:
        assert vocabulary.format == "llmc-vocab" and len(vocabulary) > 256
    with pytest.raises(tokformats.UnknownFormatError, match="stores no tokenizer vocabulary; the ones that do: llmc"):
        tokformats.api.export_tokenizer(tokenizer_path, tmp_path / "x", "megatron")


def test_public_names_list_every_format_module() -> None:
    names = dir(tokformats)
    for module in ("megatron", "llmc", "datatrove", "dolma", "hf", "litdata", "open", "tokenize"):
        assert module in names


def test_a_glob_is_listed_like_glob_and_once_per_open(tmp_path: Path) -> None:
    import glob

    from tokformats.fs.paths import expand_path_texts, folders_near, one_expansion

    for name in ["a_1.bin", "a_2.bin", ".a_3.bin", "b_1.bin", "a_[x].bin"]:
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "a_dir.bin").mkdir()
    for pattern in ["a_*.bin", ".a_*", "*", "a_[12].bin", "a_?.bin", "nothing*"]:
        text = str(tmp_path / pattern)
        assert (expand_path_texts(text) if glob.glob(text) else []) == sorted(glob.glob(text))
    assert folders_near(str(tmp_path / "a_*.bin")) == [str(tmp_path), str(tmp_path / "a_dir.bin")]
    with one_expansion():
        first = expand_path_texts(str(tmp_path / "a_*.bin"))
        (tmp_path / "a_9.bin").write_bytes(b"")
        assert expand_path_texts(str(tmp_path / "a_*.bin")) == first  # one listing for the whole open
    assert str(tmp_path / "a_9.bin") in expand_path_texts(str(tmp_path / "a_*.bin"))


def test_a_pattern_listed_in_an_open_stays_a_pattern_for_that_open(tmp_path: Path) -> None:
    # within one open a pattern's name is not stat'ed again by each caller: once listed it is a pattern for the
    # whole block (the same view as its one listing), and outside it the rule is the name's own again
    from tokformats.fs.paths import expand_path_texts, is_pattern, one_expansion

    (tmp_path / "a_1.bin").write_bytes(b"")
    pattern = str(tmp_path / "a_*.bin")
    with one_expansion():
        assert is_pattern(pattern) and expand_path_texts(pattern) == [str(tmp_path / "a_1.bin")]
        Path(pattern).write_bytes(b"")  # a file named like the pattern appears mid-open
        assert is_pattern(pattern) and expand_path_texts(pattern) == [str(tmp_path / "a_1.bin")]
        assert not is_pattern(str(tmp_path / "a_1.bin")) and is_pattern(str(tmp_path / "b_[x].bin"))
    assert not is_pattern(pattern) and expand_path_texts(pattern) == [pattern]


def test_detection_reads_a_head_of_regular_files_only(tmp_path: Path) -> None:
    import os

    from tokformats.fs.paths import read_head

    (tmp_path / "short").write_bytes(b"abc")
    (tmp_path / "long").write_bytes(bytes(range(256)) * 40)
    os.mkfifo(tmp_path / "fifo")  # never opened: it would block
    (tmp_path / "folder").mkdir()
    assert read_head(tmp_path / "short", 4096) == b"abc"
    assert read_head(tmp_path / "long", 300) == (bytes(range(256)) * 2)[:300]
    assert [read_head(tmp_path / n, 8) for n in ("fifo", "folder", "missing")] == [b"", b"", b""]


@pytest.mark.parametrize("by_descriptor", [True, False])
def test_a_listing_knows_its_folders_through_links(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, by_descriptor: bool
) -> None:
    # the listing's folder flags come from the directory entries (read through the folder's descriptor, or by its
    # name where scandir takes no descriptor): a link to a folder is a folder, a broken link and a file are not, and
    # a relative pattern lists the current folder
    from tokformats.fs import paths
    from tokformats.fs.paths import folders_near

    monkeypatch.setattr(paths, "_SCAN_BY_DESCRIPTOR", by_descriptor)

    (tmp_path / "target").mkdir()
    (tmp_path / "a_1.bin").write_bytes(b"")
    (tmp_path / "a_dir.bin").mkdir()
    (tmp_path / "a_link.bin").symlink_to(tmp_path / "target")
    (tmp_path / "a_broken.bin").symlink_to(tmp_path / "nowhere")
    expected = [str(tmp_path), str(tmp_path / "a_dir.bin"), str(tmp_path / "a_link.bin")]
    assert folders_near(str(tmp_path / "a_*.bin")) == expected
    monkeypatch.chdir(tmp_path)
    assert folders_near("a_*.bin") == [".", "a_dir.bin", "a_link.bin"]


def test_one_star_patterns_match_like_fnmatch_with_overlapping_ends() -> None:
    # the one-`*` shortcut (a prefix and a suffix test) against fnmatch and glob's hidden-name rule, on names where the
    # pattern's start and end overlap ("aba" is no match of "ab*ba"), hidden names, and names equal to either end
    import fnmatch
    import random

    from tokformats.fs.paths import _matching_names

    rng = random.Random(28)
    patterns = ["a*b", "*b", "a*", "*", ".*", "ab*ba", "aba*aba", "x_*.b", "*.", "a.*", ".a*a", "a*a", "ab*bab"]
    patterns += ["b_*_b", "x_*.x"]
    for _ in range(500):
        names = sorted({"".join(rng.choice("ab._x") for _ in range(rng.randint(1, 7))) for _ in range(40)})
        for pattern in patterns:
            hidden_ok = pattern.startswith(".") or not pattern.startswith(("*", "?", "["))
            expected = [n for n in names if fnmatch.fnmatchcase(n, pattern) and (hidden_ok or not n.startswith("."))]
            assert _matching_names(pattern, names) == expected, (pattern, names)
    assert _matching_names("ab*ba", ["aba", "abba", "ab_ba", "abxba"]) == ["abba", "ab_ba", "abxba"]


def test_one_star_globs_match_what_glob_finds(tmp_path: Path) -> None:
    # the whole listing (scandir, the one-`*` shortcut, the folder joined) against glob.glob on a real folder
    import glob
    import random

    from tokformats.fs.paths import expand_paths

    rng = random.Random(29)
    names = {"".join(rng.choice("ab._x") for _ in range(rng.randint(1, 7))) for _ in range(300)} - {".", ".."}
    names |= {"aba", "abaaba", "ababa", "abba"}  # the overlapping ends of "aba*aba" and "ab*ba"
    for name in names:
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "ab_dir.b").mkdir()
    for pattern in ["a*b", "*b", "a*", "*", ".*", "ab*ba", "aba*aba", "x_*.b", "*.", "a.*", ".a*a", "ab*.b", "zz*"]:
        found = sorted(glob.glob(str(tmp_path / pattern)))
        if found:
            assert [str(p) for p in expand_paths(str(tmp_path / pattern))] == found, pattern
        else:
            with pytest.raises(NoFilesError):
                expand_paths(str(tmp_path / pattern))
    overlapping = [str(p) for p in expand_paths(str(tmp_path / "aba*aba"))]
    assert str(tmp_path / "abaaba") in overlapping and str(tmp_path / "ababa") not in overlapping


def test_detector_table_agrees_with_the_format_modules() -> None:
    import struct

    from tokformats.core import detectors
    from tokformats.formats import _torchfile, datatrove, hf, litdata, llmc, llmc_vocab, megatron, pt, sequences

    table = {entry.name: entry for entry in detectors.BUILTIN_DETECTORS}
    detectable = {
        name: d for name, d in tokformats.formats.items() if d.detectable and d.module.startswith("tokformats")
    }
    assert set(table) == set(detectable)
    for name, descriptor in detectable.items():
        assert (table[name].module, table[name].order) == (descriptor.module, descriptor.order), name
    assert list(table) == sorted(table, key=lambda n: table[n].order)
    assert struct.pack("<I", llmc_vocab.MAGIC) == detectors.LLMC_VOCAB_MAGIC
    assert tuple(struct.pack("<i", m) for m in llmc.FAMILIES) == detectors.LLMC_SHARD_MAGICS
    assert detectors.MEGATRON_MAGIC == megatron.MAGIC
    assert detectors.TORCH_MAGICS == (_torchfile.ZIP_MAGIC, _torchfile.LEGACY_MAGIC)
    assert (detectors.PT_MANIFEST, detectors.LITDATA_INDEX) == (pt.MANIFEST, litdata.INDEX)
    assert detectors.HF_NAMES == (hf.STATE, hf.DICT)
    assert detectors.DATATROVE_ENDINGS == (".ds", datatrove.INDEX, datatrove.LOSS, datatrove.METADATA)
    assert detectors.SEQUENCE_ENDINGS == sequences.SUFFIXES


def test_capabilities_are_found_as_a_runtime_protocol_check_finds_them() -> None:
    import importlib
    import pkgutil
    import types

    from tokformats.core import format_module

    kinds = [format_module.FormatModule, *format_module.CAPABILITIES]
    import tokformats.formats as package

    modules = [importlib.import_module(f"{package.__name__}.{m.name}") for m in pkgutil.iter_modules(package.__path__)]
    stand_in = types.ModuleType("stand_in")
    stand_in.detect = None  # a method member that is None does not count
    stand_in.REMOTE_INDEX = ("index.json",)  # a data member without its method: not RemoteIndex
    stand_in.Writer = object
    found = {(m.__name__, k.__name__): format_module.capability(m, k) is m for m in [*modules, stand_in] for k in kinds}
    assert found == {(m.__name__, k.__name__): isinstance(m, k) for m in [*modules, stand_in] for k in kinds}
    assert found[("tokformats.formats.megatron", "Merges")] and not found[("stand_in", "Detectable")]
    assert found[("stand_in", "Writable")] and not found[("stand_in", "RemoteIndex")]


DETECT_IN_A_FRESH_PROCESS = """
import sys
import tokformats
from tokformats.core import registry
reader = tokformats.open(sys.argv[1])
loaded = sorted(name.rsplit(".", 1)[1] for name in sys.modules if name.startswith("tokformats.formats.")
                and not name.rsplit(".", 1)[1].startswith("_"))
print(reader.format, ",".join(loaded), registry._plugins_loaded)
"""


def test_detection_imports_only_the_format_it_picks(tmp_path: Path) -> None:
    with tokformats.create(tmp_path / "m", "megatron", vocab_size=100) as writer:
        writer.write([1, 2, 3])
    with tokformats.create(tmp_path / "c", "llmc", vocab_size=100, shard_size=2) as writer:
        writer.write([1, 2, 3])
    env = {**__import__("os").environ, "PYTHONPATH": str(Path(tokformats.__file__).parents[1])}
    cases = [(tmp_path / "m", "megatron megatron False"), (tmp_path / "c_*.bin", "llmc llmc False")]
    for path, expected in cases:
        run = subprocess.run(
            [sys.executable, "-c", DETECT_IN_A_FRESH_PROCESS, str(path)], capture_output=True, text=True, env=env
        )
        assert run.returncode == 0, run.stderr
        assert run.stdout.split() == expected.split()
