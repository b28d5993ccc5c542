"""The committed golden files are the owners' outputs: the copy of ``shared/fixtures`` is byte-identical to it."""

from __future__ import annotations

from pathlib import Path

import pytest


def test_committed_copy_of_the_shared_fixtures_is_identical(reference_fixtures: Path | None, goldens: Path) -> None:
    if reference_fixtures is None:
        pytest.skip(
            "no reference folder shared/fixtures beside this clone to compare tests/data/shared with; the golden "
            "tests read the committed copy (written by the owners' tools, see tests/data/shared/README.md)"
        )
    files = [p for p in reference_fixtures.rglob("*") if p.is_file()]
    reference = {p.relative_to(reference_fixtures): p.read_bytes() for p in files}
    copy = {p.relative_to(goldens / "shared"): p.read_bytes() for p in (goldens / "shared").rglob("*") if p.is_file()}
    assert sorted(copy) == sorted(reference), "tests/data/shared lists other files: run tests/make_goldens.py shared"
    different = [str(name) for name, data in reference.items() if copy[name] != data]
    assert not different, f"tests/data/shared differs from shared/fixtures: {different}"
