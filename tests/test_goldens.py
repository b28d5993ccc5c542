"""The committed golden files are the owners' outputs: the copy of ``shared/fixtures`` is byte-identical to it."""

from __future__ import annotations

import pytest

from tests.conftest import FIXTURES, GOLDENS


def test_committed_copy_of_the_shared_fixtures_is_identical() -> None:
    if not FIXTURES.is_dir():
        pytest.skip(
            "no reference folder shared/fixtures beside this clone to compare tests/data/shared with; the golden "
            "tests read the committed copy (written by the owners' tools, see tests/data/shared/README.md)"
        )
    reference = {p.relative_to(FIXTURES): p.read_bytes() for p in FIXTURES.rglob("*") if p.is_file()}
    copy = {p.relative_to(GOLDENS / "shared"): p.read_bytes() for p in (GOLDENS / "shared").rglob("*") if p.is_file()}
    assert sorted(copy) == sorted(reference), "tests/data/shared lists other files: run tests/make_goldens.py shared"
    different = [str(name) for name, data in reference.items() if copy[name] != data]
    assert not different, f"tests/data/shared differs from shared/fixtures: {different}"
