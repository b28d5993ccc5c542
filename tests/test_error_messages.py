"""Messages a user meets on bad input (review of error messages): library error types, full sentences that name
the file and the option, hints that run as printed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tokformats
from tokformats import ConfigError, NoFilesError, OutputExistsError
from tokformats.cli import main
from tokformats.formats import megatron


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = main(args)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def megatron_dataset(prefix: Path, start: int = 0) -> Path:
    """Three small documents of uint16 ids from ``start``."""
    with tokformats.create(prefix, "megatron", dtype="uint16") as writer:
        for k in range(3):
            writer.write(np.arange(start, start + 10 + k, dtype=np.uint16))
    return prefix


@pytest.fixture()
def two(tmp_path: Path) -> tuple[Path, Path]:
    return megatron_dataset(tmp_path / "m" / "a"), megatron_dataset(tmp_path / "m" / "b", 300)


# 1. An output that exists: the library's sentence, not a tuple rebuilt from (errno, strerror, filename).


def test_merge_onto_an_existing_output_says_so_in_a_sentence(
    two: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = two
    output = a.parent / "ab"
    megatron.merge([a, b], output)
    with pytest.raises(OutputExistsError) as caught:
        megatron.merge([a, b], output)
    assert str(caught.value) == f"{output}.idx already exists; pass overwrite=True to replace it (nothing was written)."
    status, _, err = run(["merge", str(a), str(b), "-o", str(output)], capsys)
    assert status == 2
    assert err == f"tokformats: error: {output}.idx already exists; pass --overwrite to replace it (nothing was written).\n"


def test_naming_output_leaves_library_errors_as_they_are(tmp_path: Path) -> None:
    from tokformats.fs.atomic import naming_output

    for error in (OutputExistsError("x.idx already exists."), NoFilesError("no file matches x*.bin.")):
        assert naming_output(error, tmp_path / "out") is error
    disk_full = OSError(28, "No space left on device", str(tmp_path / "out.idx.tmp"))
    renamed = naming_output(disk_full, tmp_path / "out")
    assert type(renamed) is OSError and renamed.filename == str(tmp_path / "out") and renamed.errno == 28
