"""A folder of index arrays (``.npy``) keyed by everything they depend on, built once across processes.

Several ranks (or DataLoader workers) that start together ask for the same key: the first takes an exclusive
lock on ``KEY.lock`` and builds, the others block on the lock and then map what it wrote. Arrays are written
under temporary names and renamed into place (:class:`~tokformats.atomic.AtomicFiles`), the description last,
so a half-written entry is never taken for a whole one: an entry exists when its description does.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import FormatError
from ..fs.atomic import AtomicFiles

__all__ = ["IndexCache", "cache_key"]


def cache_key(description: dict[str, Any]) -> str:
    """A short hex digest of a JSON description (sorted keys: the order of options never matters)."""
    text = json.dumps(description, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``lock_path`` (a no-op where ``fcntl`` does not exist)."""
    try:
        import fcntl
    except ImportError:  # Windows: concurrent builders each build; the atomic renames keep entries whole
        yield
        return
    with open(lock_path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


class IndexCache:
    """Named arrays under ``folder``, one entry per key.

    Args:
        folder: the cache folder (made when first written).
    """

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder).expanduser()

    def _path(self, key: str, name: str) -> Path:
        return self.folder / f"{key}-{name}.npy"

    def _description_path(self, key: str) -> Path:
        return self.folder / f"{key}-description.json"

    def load(self, key: str, names: tuple[str, ...]) -> dict[str, np.ndarray] | None:
        """The entry's arrays, memory-mapped, or None when it does not exist."""
        if not self._description_path(key).is_file():
            return None
        arrays = {}
        for name in names:
            path = self._path(key, name)
            try:
                arrays[name] = np.load(path, mmap_mode="r", allow_pickle=False)
            except (OSError, ValueError) as error:
                raise FormatError(
                    f"{path}: the cached index array {name!r} cannot be read ({error}); delete the cache entry "
                    f"{key}-* in {self.folder} to rebuild it."
                ) from error
        return arrays

    def get_or_build(
        self,
        key: str,
        description: dict[str, Any],
        names: tuple[str, ...],
        build: Callable[[], dict[str, np.ndarray]],
    ) -> dict[str, np.ndarray]:
        """The entry ``key``: mapped when present, else built under the lock (once across processes), saved
        atomically, and mapped."""
        found = self.load(key, names)
        if found is not None:
            return found
        self.folder.mkdir(parents=True, exist_ok=True)
        with _exclusive(self.folder / f"{key}.lock"):
            found = self.load(key, names)  # another process built it while we waited
            if found is not None:
                return found
            arrays = build()
            files = AtomicFiles(overwrite=True)
            try:
                for name in names:
                    np.save(files.create(self._path(key, name)), arrays[name], allow_pickle=False)
                files.create(self._description_path(key)).write(
                    json.dumps(description, indent=2, sort_keys=True).encode("utf-8")
                )
                files.commit()
            except BaseException:
                files.abort()
                raise
        loaded = self.load(key, names)
        if loaded is None:  # written and committed just now: only a concurrent removal explains it
            raise FormatError(f"{self.folder}: the index files {key} just written cannot be read back.")
        return loaded
