"""What the formats say about their files, for datasets by URL: each format module's optional remote hooks
(:class:`tokformats.core.format_module.RemoteHooks`), asked of every registered format."""

from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import Any

from ..core.registry import formats

__all__ = ["adopted", "companions", "index_file", "index_readers", "published_last"]


def _hooks(name: str) -> list[Any]:
    """Every registered format module defining hook ``name`` (modules are imported on first use)."""
    found = []
    for descriptor in formats.values():
        module = descriptor.load()
        if hasattr(module, name):
            found.append(getattr(module, name))
    return found


def index_readers() -> list[tuple[tuple[str, ...], Any]]:
    """``(index file names, remote_files)`` of every format that lists its data files in an index."""
    found = []
    for descriptor in formats.values():
        module = descriptor.load()
        if hasattr(module, "REMOTE_INDEX") and hasattr(module, "remote_files"):
            found.append((tuple(module.REMOTE_INDEX), module.remote_files))
    return found


def adopted(root: Path, name: str) -> Path | None:
    """A file already under the cache root that a format says may be ``name`` (NeuroShard's own cache names)."""
    for hook in _hooks("remote_adopt"):
        found = hook(root, name)
        if found is not None:
            return Path(found)
    return None


def companions(name: str) -> list[tuple[str, bool]]:
    seen: dict[str, bool] = {}
    for hook in _hooks("remote_companions"):
        for other, required in hook(name):
            seen[other] = seen.get(other, False) or required
    return list(seen.items())


def published_last(name: str) -> bool:
    """Whether file ``name`` is an index a format's readers key on (uploaded last, fetched first)."""
    return any(fnmatch.fnmatch(Path(name).name, p) for patterns in _hooks("PUBLISHED_LAST") for p in patterns)


def index_file(name: str) -> bool:
    """Whether file ``name`` is an index (one a format's readers key on, or lists its data files in)."""
    base = Path(name).name
    return published_last(name) or any(base in names for names, _ in index_readers())
