"""Corrupted files: whatever the damage, opening and reading either works or raises the library's error.

Hypothesis truncates the golden files and overwrites random bytes; every outcome must be a clean read or a
:class:`tokformats.FormatError` (never a bare struct.error, IndexError, numpy error, crash or hang).
"""

from __future__ import annotations

import contextlib
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


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
_FIELDS = ["filename", "name", "chunk_bytes", "shards", "shard_id", "size_bytes", "hash", "total_shards", "files",
           "dtype", "_data_files", "chunks", "config", "size_tokens"]  # fmt: skip


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_remote_index_hooks_give_the_library_error(tmp_path_factory: pytest.TempPathFactory, data: Any) -> None:
    """Every format's remote hooks, over any JSON an index file may hold (and any name a URL may end in): a list of
    checked entries, or a FormatError, never a foreign exception or a name leading out of the folder."""
    import json

    from tokformats.remote.cache import Cache
    from tokformats.remote.datasets import _index_entries
    from tokformats.remote.hooks import companions, index_readers

    readers = [(index, reader) for names, reader in index_readers() for index in names]
    index, reader = data.draw(st.sampled_from(readers), label="index")
    rows = st.lists(st.dictionaries(st.sampled_from(_FIELDS), _JSON), max_size=4)
    fields = st.dictionaries(st.sampled_from(_FIELDS), _JSON | rows)
    document = data.draw(fields | _JSON, label="document")
    cache = Cache("https://host/d", cache_dir=tmp_path_factory.mktemp("hooks"), offline=True)
    cache.folder.mkdir(parents=True)
    (cache.folder / index).write_text(json.dumps(document), encoding="utf-8")
    try:
        entries = _index_entries(cache, index, reader)
    except FormatError:
        entries = []
    for entry in entries:
        assert (cache.folder / entry.name).resolve().is_relative_to(cache.folder.resolve())
    name = data.draw(st.text(max_size=20), label="name")
    for other, required in companions(name):
        assert isinstance(other, str) and isinstance(required, bool)
        with contextlib.suppress(FormatError):  # a name that cannot be a file is refused; any other stays inside
            assert cache.path(other).resolve().is_relative_to(cache.folder.resolve())
