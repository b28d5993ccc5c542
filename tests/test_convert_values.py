"""Issue 23, item 3: a conversion never changes a value the source's reader returns.

Every pairing of a source that stores values (floats; Time-MoE with and without ``mean``/``std``) with every corpus
format: the destination reads back exactly the source reader's values (bit for bit, in the source reader's dtype),
or the conversion is refused with a FormatError and nothing is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tokformats
from tokformats import FormatError
from tokformats.api import corpus_writer

#: Series with fractional values (only float destinations can hold them) and with whole ones (ids, too).
VALUES = {
    "fractional": [[1.0, 2.0, 3.0], [4.5, 5.0, 6.0, 7.0], [0.25, -0.0, 3.0, 1e-3], [], [8.0]],
    "whole": [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0], [0.0, 2.0, 3.0, 1.0], [], [8.0]],
}
#: Per-sequence (mean, std) for the Time-MoE source stored normalised: inexact and exact (dyadic) ones.
SCALES = {
    "fractional": [(10.0, 2.0), None, (-1.5, 0.1), (3.0, 4.0), (1e6, 1e-3)],
    "whole": [(10.0, 2.0), None, (-1.0, 0.5), (3.0, 4.0), (100.0, 0.25)],
}

SOURCES = ["timemoe-scaled", "timemoe", "megatron", "litdata", "raw", "pt"]


def _corpus_formats() -> list[str]:
    names = []
    for name in tokformats.formats:
        try:
            corpus_writer(name)
        except FormatError:
            continue
        names.append(name)
    return sorted(names)


def make_source(folder: Path, kind: str, values: str = "fractional") -> tuple[Path, dict[str, Any]]:
    """A source of kind ``kind`` holding ``VALUES[values]`` (stored normalised with its SCALES for
    ``timemoe-scaled``)."""
    path = folder / "source"
    series = VALUES[values]
    if kind == "timemoe-scaled":
        with tokformats.create(path, "timemoe") as writer:
            for sequence, scale in zip(series, SCALES[values]):
                if scale is None:
                    writer.write(sequence)
                else:
                    writer.write(sequence, mean=scale[0], std=scale[1])
        return path, {"format": "timemoe"}
    lengths = [len(s) for s in series]
    flat = np.array([v for s in series for v in s], dtype=np.float32)
    if kind in ("raw", "pt"):  # delimiter formats: one document, the whole stream
        lengths, flat = [len(flat)], flat
    with tokformats.create(path, kind, dtype="float32") as writer:
        writer.write_batch(flat, lengths)
    options: dict[str, Any] = {"format": kind}
    if kind == "raw":
        options["dtype"] = "float32"
    return path, options


def read_back(path: Path, fmt: str, summary: dict[str, Any]) -> list[np.ndarray]:
    options = dict(summary.get("read_with") or {})
    options.pop("format", None)  # named below
    if fmt == "raw":
        options["dtype"] = summary["dtype"]
    files = [Path(f) for f in summary["files"]]
    located: Any = {"datatrove": [f for f in files if f.suffix == ".ds"], "llmc": files}.get(fmt, path)
    with tokformats.open(located, format=fmt, **options) as reader:
        return [np.asarray(d).copy() for d in reader]


@pytest.mark.parametrize("values", list(VALUES))
@pytest.mark.parametrize("source_kind", SOURCES)
@pytest.mark.parametrize("destination", _corpus_formats())
def test_convert_never_changes_a_value(tmp_path: Path, source_kind: str, destination: str, values: str) -> None:
    source, options = make_source(tmp_path, source_kind, values)
    with tokformats.open(source, **options) as reader:
        expected = [np.asarray(d).copy() for d in reader]
    source_options = {k: v for k, v in options.items() if k != "format"}
    target = tmp_path / "target"
    boundaries = corpus_writer(destination).boundaries
    try:
        summary = tokformats.convert(
            source,
            target,
            destination,
            source_format=options["format"],
            source_options=source_options,
            keep_boundaries=boundaries == "index",
        )
    except FormatError:
        assert not list(tmp_path.glob("target*")), "a refused conversion wrote nothing"
        return
    got = read_back(target, destination, summary)
    if boundaries == "index":
        assert len(got) == len(expected)
        pairs = list(zip(got, expected))
    else:  # the bare stream: its documents read back merged
        pairs = [(np.concatenate(got) if got else np.array([]), np.concatenate(expected))]
    for found, wanted in pairs:
        assert found.astype(wanted.dtype).tobytes() == wanted.tobytes(), (found, wanted)
        assert np.array_equal(found.astype(np.float64), wanted.astype(np.float64))


def test_timemoe_to_timemoe_keeps_mean_and_std(tmp_path: Path) -> None:
    source, _ = make_source(tmp_path, "timemoe-scaled")
    tokformats.convert(source, tmp_path / "copy", "timemoe")
    with tokformats.open(source) as a, tokformats.open(tmp_path / "copy") as b:
        assert [s.get("mean") for s in b.scales] == [s.get("mean") for s in a.scales] == [10.0, None, -1.5, 3.0, 1e6]
        assert [s.get("std") for s in b.scales] == [2.0, None, 0.1, 4.0, 1e-3]
        assert [d.tolist() for d in b] == [d.tolist() for d in a]
        assert [b.stored(i).tobytes() for i in range(len(b))] == [a.stored(i).tobytes() for i in range(len(a))]


def test_scaled_values_into_a_float_format_are_de_normalised(tmp_path: Path) -> None:
    source, _ = make_source(tmp_path, "timemoe-scaled")
    summary = tokformats.convert(source, tmp_path / "m", "megatron")
    assert summary["dtype"] == "float32"
    with tokformats.open(tmp_path / "m") as reader:
        assert reader[0].tolist() == [1.0, 2.0, 3.0]
        assert reader[1].tolist() == [4.5, 5.0, 6.0, 7.0]
