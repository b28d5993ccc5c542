"""Corrupted files: whatever the damage, opening and reading either works or raises the library's error.

Hypothesis truncates the golden files and overwrites random bytes; every outcome must be a clean read or a
:class:`tokformats.FormatError` (never a bare struct.error, IndexError, numpy error, crash or hang).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tokformats
from tokformats import FormatError

from .fuzz_worker import GOLDEN as CASES


def touch_everything(reader: Any) -> None:
    for item in reader:
        np.asarray(item).sum() if not isinstance(item, bytes) else len(item)
    if isinstance(reader, tokformats.TokenReader):
        reader.lengths.sum()


@pytest.mark.parametrize("case", sorted(CASES))
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_corruption_gives_the_library_error(
    tmp_path_factory: pytest.TempPathFactory, fixtures: Path, case: str, data: Any
) -> None:
    target, files, options = CASES[case]
    root = tmp_path_factory.mktemp("fuzz")
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(fixtures / name, root / name)
    victim = root / data.draw(st.sampled_from(files), label="file")
    content = bytearray(victim.read_bytes())
    if data.draw(st.booleans(), label="truncate"):
        content = content[: data.draw(st.integers(0, max(len(content) - 1, 0)), label="length")]
    for _ in range(data.draw(st.integers(0, 4), label="flips")):
        if content:
            position = data.draw(st.integers(0, len(content) - 1), label="position")
            content[position] = data.draw(st.integers(0, 255), label="byte")
    victim.write_bytes(bytes(content))
    try:
        with tokformats.open(root / target, format=case.split("-legacy")[0], **options) as reader:
            touch_everything(reader)
            if isinstance(reader, tokformats.megatron.Reader):
                reader.verify()
    except FormatError:
        pass
