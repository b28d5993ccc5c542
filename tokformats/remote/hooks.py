"""What the formats say about their files, for datasets by URL: each format module's optional remote hooks
(:class:`tokformats.core.format_module.RemoteHooks`), asked of every registered format."""

from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import Any

from ..core.format_module import (
    Capability,
    PublishedLast,
    RemoteAdopt,
    RemoteCompanions,
    RemoteIndex,
)
from ..core.registry import formats

__all__ = ["adopted", "companions", "index_file", "index_readers", "published_last"]


def _modules(kind: type[Capability]) -> list[Capability]:
    """Every registered format with capability ``kind`` (modules are imported on first use)."""
    found = []
    for descriptor in formats.values():
        module = descriptor.capability(kind)
        if module is not None:
            found.append(module)
    return found


def index_readers() -> list[tuple[tuple[str, ...], Any]]:
    """``(index file names, remote_files)`` of every format that lists its data files in an index."""
    return [(tuple(module.REMOTE_INDEX), module.remote_files) for module in _modules(RemoteIndex)]


def adopted(root: Path, name: str) -> Path | None:
    """A file already under the cache root that a format says may be ``name`` (NeuroShard's own cache names)."""
    for module in _modules(RemoteAdopt):
        found = module.remote_adopt(root, name)
        if found is not None:
            return Path(found)
    return None


def companions(name: str) -> list[tuple[str, bool]]:
    """The files that go with file (or prefix) ``name``, as every format says: ``[(name, required), ...]``."""
    seen: dict[str, bool] = {}
    for module in _modules(RemoteCompanions):
        for other, required in module.remote_companions(name):
            seen[other] = seen.get(other, False) or required
    return list(seen.items())


def published_last(name: str) -> bool:
    """Whether file ``name`` is an index a format's readers key on (uploaded last, fetched first)."""
    patterns = [p for module in _modules(PublishedLast) for p in module.PUBLISHED_LAST]
    return any(fnmatch.fnmatch(Path(name).name, p) for p in patterns)


def index_file(name: str) -> bool:
    """Whether file ``name`` is an index (one a format's readers key on, or lists its data files in)."""
    base = Path(name).name
    return published_last(name) or any(base in names for names, _ in index_readers())
