"""Time-MoE folders: golden sequences and windows, converter-identical writes, malformed folders, trees."""

from __future__ import annotations

import gzip
import io
import json
import pickle
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tokformats
from tokformats import DTypeError, FormatError, HeaderError, NoFilesError, SizeMismatchError, UnsafePickleError
from tokformats.formats import timemoe
from tokformats.testing import TokenFormatTests


class TestTimeMoEConformance(TokenFormatTests):
    format = "timemoe"
    dtypes = ("float32", "int32", "uint16", "float64")


class TestTimeMoEConformanceSmallShards(TestTimeMoEConformance):
    """Shards of 37 elements: sequences straddle shards everywhere."""

    huge_tokens = 20_000

    def write_options(self) -> dict[str, Any]:
        return {"max_shard_elements": 37}


@pytest.mark.parametrize("name", ["converted", "sharded"])
def test_golden_sequences(fixtures: Path, name: str) -> None:
    expected = np.load(fixtures / "timemoe" / f"{name}.expected_sequences.npz")
    assert tokformats.detect(fixtures / "timemoe" / name) == "timemoe"
    with tokformats.open(fixtures / "timemoe" / name) as reader:
        assert isinstance(reader, timemoe.Reader)
        assert len(reader) == len(expected.files)
        for i in range(len(reader)):
            got = reader[i]
            assert got.dtype == np.float32
            np.testing.assert_array_equal(got, expected[f"arr_{i}"], err_msg=f"sequence {i}")


@pytest.mark.parametrize("name", ["converted", "sharded"])
@pytest.mark.parametrize("normalization", ["zero", "max"])
@pytest.mark.parametrize(("context", "stride"), [(32, 8), (64, 64)])
def test_golden_windows_exactly(fixtures: Path, name: str, normalization: str, context: int, stride: int) -> None:
    """Exact equality, for both normalisations: the statistics are float32 reductions over the same whole
    sequence Time-MoE reduces, and the per-window arithmetic is elementwise, so no tolerance is needed."""
    expected = np.load(
        fixtures / "timemoe" / f"{name}.expected_windows.{normalization}.ctx{context}.stride{stride}.npz"
    )
    with tokformats.open(fixtures / "timemoe" / name) as reader:
        windows = timemoe.windows(reader, context_length=context, stride=stride, normalization=normalization)
        assert len(windows) == len(expected["input_ids"])
        for key in ("input_ids", "labels", "loss_masks"):
            got = np.stack([windows[k][key] for k in range(len(windows))])
            assert got.dtype == expected[key].dtype
            np.testing.assert_array_equal(got, expected[key], err_msg=key)
        # random access in any order gives the same windows
        for k in np.random.default_rng(0).permutation(len(windows))[:20]:
            np.testing.assert_array_equal(windows[int(k)]["labels"], expected["labels"][k])


def test_window_rule_on_small_cases(tmp_path: Path) -> None:
    with tokformats.create(tmp_path / "w", "timemoe") as writer:
        for length in (0, 1, 2, 5, 9, 10, 11, 30):
            writer.write(np.arange(length, dtype=np.float32))
    with tokformats.open(tmp_path / "w") as reader:
        w = timemoe.windows(reader, context_length=8, stride=4, normalization=None)
        # W = 8: L<2 skipped; L<=W one padded window; else 1 + (L - 9) // 4
        assert [int(c) for c in np.diff(np.concatenate([[0], w.ends]))] == [0, 0, 1, 1, 1, 1, 1, 6]
        first = w[0]  # the sequence of 2 values
        assert first["input_ids"].tolist() == [0, 1, 0, 0, 0, 0, 0, 0] and first["labels"].tolist()[:2] == [1, 0]
        assert first["loss_masks"].tolist() == [1, 0, 0, 0, 0, 0, 0, 0]
        last = w[-1]
        assert last["input_ids"].tolist() == list(range(20, 28)) and last["loss_masks"].all()
        with pytest.raises(IndexError):
            w[len(w)]


def test_normalisation_edge_cases(tmp_path: Path) -> None:
    with tokformats.create(tmp_path / "c", "timemoe") as writer:
        writer.write(np.full(10, 3.0))  # std 0: x - mean
        writer.write(np.zeros(10))  # max 0: unchanged
    with tokformats.open(tmp_path / "c") as reader:
        assert timemoe.windows(reader, 4, normalization="zero")[0]["input_ids"].tolist() == [0, 0, 0, 0]
        assert timemoe.windows(reader, 4, normalization="max")[2]["input_ids"].tolist() == [0, 0, 0, 0]
        assert timemoe.windows(reader, 4, normalization="max")[0]["input_ids"].tolist() == [1, 1, 1, 1]


def test_integer_values_are_normalised_in_float32(tmp_path: Path) -> None:
    with tokformats.create(tmp_path / "i", "timemoe", dtype="int32") as writer:
        writer.write([1, 2, 3, 4])
    with tokformats.open(tmp_path / "i") as reader:
        window = timemoe.windows(reader, 3, normalization="zero")[0]["input_ids"]
    values = np.array([1, 2, 3, 4], dtype=np.float32)
    np.testing.assert_array_equal(window, ((values - values.mean()) / values.std())[:3])
    assert not np.array_equal(window, np.trunc(window)), "not truncated to integers as Time-MoE's scaler does"


def test_writer_reproduces_the_authors_converter(fixtures: Path, tmp_path: Path) -> None:
    source = fixtures / "timemoe" / "converted"
    with tokformats.open(source, denormalize=False) as reader, tokformats.create(tmp_path / "out", "timemoe") as writer:
        assert isinstance(reader, timemoe.Reader) and isinstance(writer, timemoe.Writer)
        for i in range(len(reader)):
            scale = reader.scales[i]
            writer.write(reader[i], mean=scale.get("mean"), std=scale.get("std"), id=scale.get("id"), normalized=True)
    for name in ("meta.json", "data-1-of-1.bin"):
        assert (tmp_path / "out" / name).read_bytes() == (source / name).read_bytes(), name


def test_writer_normalises_and_the_reader_denormalises(tmp_path: Path) -> None:
    series = np.linspace(-5, 20, 50)
    with tokformats.create(tmp_path / "n", "timemoe") as writer:
        writer.write(series, mean=7.5, std=2.5, id="a")
        writer.write(series)
    with tokformats.open(tmp_path / "n", denormalize=False) as stored:
        np.testing.assert_allclose(stored[0], (series - 7.5) / 2.5, rtol=1e-6)
        assert stored.scales[0] == {"offset": 0, "length": 50, "mean": 7.5, "std": 2.5, "id": "a"}
        assert stored.scales[1] == {"offset": 50, "length": 50}
    with tokformats.open(tmp_path / "n") as reader:
        np.testing.assert_allclose(reader[0], series, rtol=1e-5, atol=1e-5)
    with pytest.raises(FormatError, match="both mean= and std="):
        with tokformats.create(tmp_path / "x", "timemoe") as writer:
            writer.write(series, mean=1.0)


def test_sharding_names_and_numeric_order(tmp_path: Path) -> None:
    with tokformats.create(tmp_path / "s", "timemoe", max_shard_elements=10) as writer:
        writer.write_batch(np.arange(115, dtype=np.float32), [50, 65])
    meta = json.loads((tmp_path / "s" / "meta.json").read_text())
    assert list(meta["files"]) == [f"data-{k:02d}-of-12.bin" for k in range(1, 13)]
    assert list(meta["files"].values()) == [10] * 11 + [5]
    assert (tmp_path / "s" / "meta.json").read_text().count("\n") == 0, "one compact line"
    with tokformats.open(tmp_path / "s") as reader:
        assert reader[1].tolist() == list(range(50, 115))
    # Renamed the unpadded way (data-10-of-12 sorts before data-2-of-12 as text): still numeric order.
    folder = tmp_path / "s"
    renamed = {}
    for name, count in meta["files"].items():
        new = name.replace("-0", "-") if name.startswith("data-0") else name
        (folder / name).rename(folder / new)
        renamed[new] = count
    meta["files"] = dict(sorted(renamed.items()))
    (folder / "meta.json").write_text(json.dumps(meta))
    with tokformats.open(folder) as reader:
        assert reader.tokens[:].tolist() == list(range(115))


def test_time_moe_style_reader_reads_our_output(tmp_path: Path) -> None:
    """Read our folder the way Time-MoE's BinaryDataset does: files by name, then scales and mean/std."""
    rng = np.random.default_rng(3)
    series = [rng.normal(size=int(n)).astype(np.float32) for n in rng.integers(0, 40, size=25)]
    with tokformats.create(tmp_path / "t", "timemoe", max_shard_elements=64) as writer:
        for i, s in enumerate(series):
            writer.write(s, mean=1.0, std=2.0) if i % 3 == 0 else writer.write(s)
    meta = json.loads((tmp_path / "t" / "meta.json").read_text())
    stream = np.concatenate([np.fromfile(tmp_path / "t" / n, dtype=meta["dtype"]) for n in sorted(meta["files"])])
    for i, scale in enumerate(meta["scales"]):
        values = stream[scale["offset"] : scale["offset"] + scale["length"]]
        if "mean" in scale and "std" in scale:
            values = values * scale["std"] + scale["mean"]
        np.testing.assert_allclose(values, series[i], rtol=1e-5, atol=1e-5)


def test_tree_of_folders_opens_in_sorted_order(fixtures: Path, tmp_path: Path) -> None:
    root = tmp_path / "time300b"
    shutil.copytree(fixtures / "timemoe" / "sharded", root / "b_energy")
    shutil.copytree(fixtures / "timemoe" / "converted", root / "a_web" / "inner")
    assert tokformats.detect(root) == "timemoe"
    with tokformats.open(root) as reader:
        assert [f.name for f in reader.folders] == ["inner", "b_energy"]
        assert len(reader) == 9 + 30
        converted = np.load(fixtures / "timemoe" / "converted.expected_sequences.npz")
        sharded = np.load(fixtures / "timemoe" / "sharded.expected_sequences.npz")
        np.testing.assert_array_equal(reader[3], converted["arr_3"])
        np.testing.assert_array_equal(reader[9 + 13], sharded["arr_13"])
        assert reader.scales[9]["offset"] == 1968


def folder(tmp_path: Path, meta: dict[str, Any], shards: dict[str, int], dtype: str = "float32") -> Path:
    path = tmp_path / "bad"
    path.mkdir(exist_ok=True)
    for name, count in shards.items():
        np.arange(count, dtype=dtype).tofile(path / name)
    (path / "meta.json").write_text(json.dumps(meta))
    return path


GOOD = {
    "num_sequences": 2,
    "dtype": "float32",
    "files": {"data-1-of-1.bin": 7},
    "scales": [{"offset": 0, "length": 3}, {"offset": 3, "length": 4, "mean": 1.5, "std": 0.5}],
}


@pytest.mark.parametrize(
    ("change", "shards", "error", "message"),
    [
        ({}, {"data-1-of-1.bin": 6}, SizeMismatchError, r"says 7 float32 elements .* \(shorter\)"),
        ({}, {"data-1-of-1.bin": 8}, SizeMismatchError, r"\(longer\)"),
        (
            {"scales": [{"offset": 0, "length": 3}, {"offset": 3, "length": 5}]},
            None,
            SizeMismatchError,
            r"scales\[1\] \(offset 3, length 5\) runs outside the 7 elements",
        ),
        ({"num_sequences": 3}, None, HeaderError, "num_sequences is 3 but scales has 2"),
        ({"files": {"data-x-of-1.bin": 7}}, {"data-x-of-1.bin": 7}, HeaderError, "no integer index"),
        (
            {"scales": [{"offset": 0, "length": 3, "mean": None, "std": 1}, {"offset": 3, "length": 4}]},
            None,
            HeaderError,
            r"scales\[0\]\['mean'\] is None",
        ),
        ({"dtype": "float128x"}, None, HeaderError, "float128x"),
        (
            {"files": {"data-1-of-2.bin": 7, "data-2-of-2.bin": 1}},
            {"data-1-of-2.bin": 7},
            NoFilesError,
            "listed in meta.json but does not exist",
        ),
        ({"scales": [{"offset": 0}, {"offset": 3, "length": 4}]}, None, HeaderError, "needs integer 'offset'"),
        ({"scales": "x"}, None, HeaderError, "'scales' must be a list"),
        (
            {"scales": [{"offset": 0.5, "length": 3}, {"offset": 3, "length": 4}]},
            None,
            HeaderError,
            r"scales\[0\] needs integer 'offset'",
        ),
        (
            {"scales": [{"offset": 0, "length": 3}, {"offset": 3, "length": True}]},
            None,
            HeaderError,
            r"scales\[1\] needs integer",
        ),
        (
            {"scales": [{"offset": 0, "length": 3, "mean": "1", "std": 1}, {"offset": 3, "length": 4}]},
            None,
            HeaderError,
            r"scales\[0\]\['mean'\] is '1'",
        ),
    ],
)
def test_malformed_folders(
    tmp_path: Path, change: dict[str, Any], shards: dict[str, int] | None, error: type, message: str
) -> None:
    path = folder(tmp_path, {**GOOD, **change}, shards or {"data-1-of-1.bin": 7})
    with pytest.raises(error, match=message):
        tokformats.open(path, format="timemoe")


def test_invalid_meta_json(tmp_path: Path) -> None:
    path = folder(tmp_path, GOOD, {"data-1-of-1.bin": 7})
    (path / "meta.json").write_text("{not json")
    with pytest.raises(HeaderError, match="not valid JSON"):
        tokformats.open(path, format="timemoe")


def test_mixed_dtypes_in_a_tree(tmp_path: Path) -> None:
    for name, dtype in (("a", "float32"), ("b", "int32")):
        with tokformats.create(tmp_path / "tree" / name, "timemoe", dtype=dtype) as writer:
            writer.write([1, 2, 3])
    with pytest.raises(DTypeError, match="differs"):
        tokformats.open(tmp_path / "tree")


# -- single-file sources ---------------------------------------------------------------------------


def write_sources(tmp_path: Path) -> tuple[list[list[float]], dict[str, Path]]:
    series = [[1.0, 2.0, 3.0], [4.5, 5.5], [], [7.0] * 5]
    paths = {}
    paths["json"] = tmp_path / "s.json"
    paths["json"].write_text(json.dumps([{"sequence": s} if i % 2 else s for i, s in enumerate(series)]))
    paths["jsonl"] = tmp_path / "s.jsonl"
    paths["jsonl"].write_text("\n".join(json.dumps({"sequence": s, "id": i}) for i, s in enumerate(series)) + "\n")
    objects = np.empty(len(series), dtype=object)
    objects[:] = [np.array(s) for s in series]
    paths["npz"] = tmp_path / "s.npz"
    np.savez(paths["npz"], *[np.array(s) for s in series])
    buffer = io.BytesIO()
    np.save(buffer, np.arange(12, dtype=np.float32).reshape(3, 4))
    paths["npy.gz"] = tmp_path / "rows.npy.gz"
    paths["npy.gz"].write_bytes(gzip.compress(buffer.getvalue()))
    paths["pkl"] = tmp_path / "s.pkl"
    paths["pkl"].write_bytes(pickle.dumps(series))
    paths["objects"] = tmp_path / "objects.npy"
    np.save(paths["objects"], objects, allow_pickle=True)
    return series, paths


def test_single_file_sources(tmp_path: Path) -> None:
    series, paths = write_sources(tmp_path)
    for kind in ("json", "jsonl", "npz"):
        assert tokformats.detect(paths[kind]) == "sequences"
        with timemoe.from_file(paths[kind]) as reader:
            assert [d.tolist() for d in reader] == series, kind
    with tokformats.open(paths["npy.gz"]) as rows:
        assert [d.tolist() for d in rows] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    for kind in ("pkl", "objects"):
        with pytest.raises(UnsafePickleError, match="allow_pickle=True"):
            timemoe.from_file(paths[kind])
        with timemoe.from_file(paths[kind], allow_pickle=True) as reader:
            assert [d.tolist() for d in reader] == series
    bad = tmp_path / "bad.jsonl"
    bad.write_text('[1, 2]\n{"x": 1}\n')
    with pytest.raises(FormatError, match="item 1 is a dict without a 'sequence' key"):
        timemoe.from_file(bad)
    bad.write_text("[1, 2]\nnot json\n")
    with pytest.raises(FormatError, match="line 2: invalid JSON"):
        timemoe.from_file(bad)


def test_convert_a_single_file_into_a_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tokformats.cli import main

    series, paths = write_sources(tmp_path)
    assert main(["convert", str(paths["jsonl"]), str(tmp_path / "ds"), "--to", "timemoe", "--to-dtype", "float32"]) == 0
    assert "4 documents, 10 tokens" in capsys.readouterr().out
    with tokformats.open(tmp_path / "ds") as reader:
        assert [d.tolist() for d in reader] == series


@pytest.mark.parametrize("count", [1, 2, 7, 8, 9, 127, 128, 129, 4097, 70_001])
def test_mean_std_are_numpys_bits(count: int) -> None:
    rng = np.random.default_rng(count)
    for _ in range(10):
        values = (rng.normal(size=count) * rng.uniform(0.1, 1e3) + rng.uniform(-1e3, 1e3)).astype(np.float32)
        mean, std = timemoe._mean_std(values)
        assert mean == values.mean() and std == values.std()


def test_yaml_source_when_pyyaml_is_installed(tmp_path: Path) -> None:
    yaml = pytest.importorskip("yaml", reason="PyYAML is optional")
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump([[1.0, 2.0], {"sequence": [3.0]}]))
    with timemoe.from_file(path) as reader:
        assert [d.tolist() for d in reader] == [[1.0, 2.0], [3.0]]
