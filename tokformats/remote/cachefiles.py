"""The cache's own files, handled without trusting what is found there: a shared cache root may hold links and files
planted by someone else, so nothing in it is followed, and every name a store gives is checked before it becomes a
path (:func:`dataset_name`).

Beside each cached file the cache keeps a small record of what it was when it arrived (``.tokformats-meta/NAME.json``:
size, ETag, SHA-256): a warm cache compares it with what the dataset's records and the store say now, so a republished
dataset is seen, and a file that changed under the cache is fetched again.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from pathlib import Path
from typing import Any

from ..fs.names import UnsafeNameError, safe_relative_name
from .backends import RemoteError

__all__ = ["LOCKS", "META", "PARTIAL", "UnsafeCacheError", "dataset_name", "regular_file", "own_folder",
           "open_no_follow", "write_no_follow", "read_record", "meta_path", "write_meta", "read_meta"]  # fmt: skip

LOCKS = ".tokformats-locks"
META = ".tokformats-meta"
PARTIAL = ".partial"
#: The largest record the cache reads back (a few fields).
_RECORD_BYTES = 64 << 10


class UnsafeCacheError(RemoteError):
    """A folder of the cache is a symbolic link (planted in a shared cache root): it is never followed."""

    transient = False


def own_folder(folder: Path) -> Path:
    """``folder``, made when missing; :class:`UnsafeCacheError` when a link (or a file) is there instead."""
    folder.mkdir(parents=True, exist_ok=True)
    if not stat.S_ISDIR(os.lstat(folder).st_mode):
        raise UnsafeCacheError(
            f"{folder} is a link or a file, not a folder; tokformats never follows it. Remove it (rm {folder}) and "
            "open the dataset again."
        )
    return folder


def dataset_name(name: object, *, where: str, folder: Path | None = None) -> str:
    """``name`` (from a store's index, listing or ``SHA256SUMS``) when it may be a file of a cached dataset:
    :func:`~tokformats.fs.names.safe_relative_name`, and no hidden component (``.tokformats-commit.json``, the
    cache's own ``.tokformats-locks``: a store never sends tokformats' internal files) and not one of the cache's
    partial-download names."""
    checked = safe_relative_name(name, where=where, folder=folder)
    problem = None
    if any(part.startswith(".") for part in checked.split("/")):
        problem = "hidden files (a leading '.') are tokformats' own (its commit journal, its locks) or a tool's"
    elif checked.endswith((PARTIAL, PARTIAL + ".json")):
        problem = f"names ending in {PARTIAL} are the cache's partial downloads"
    if problem is not None:
        raise UnsafeNameError(f"{where}: the file name {checked!r} is refused: {problem}, never a dataset's.")
    return checked


def regular_file(path: Path) -> os.stat_result | None:
    """``path``'s status when it is a regular file itself (not a link to one), else None."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return info if stat.S_ISREG(info.st_mode) else None


def clear_non_file(path: Path) -> None:
    """Remove whatever is at ``path`` unless it is a regular file: a planted link (the link, never its target)."""
    with contextlib.suppress(OSError):
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode) and not stat.S_ISDIR(info.st_mode):
            os.unlink(path)


def open_no_follow(path: Path, flags: int, mode: int = 0o644) -> int:
    """``os.open`` that never follows a link at ``path`` (a planted one raises ``OSError`` ELOOP)."""
    return os.open(path, flags | getattr(os, "O_NOFOLLOW", 0), mode)


def write_no_follow(path: Path, text: str) -> None:
    """Write ``text`` as the new file ``path`` (whatever was there, a planted link included, is removed first)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    descriptor = open_no_follow(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(text)


def read_record(path: Path) -> dict[str, Any]:
    """The small JSON object in the cache's own file ``path``, or empty when it is missing, a link, too large or
    not a JSON object."""
    info = regular_file(path)
    if info is None or info.st_size > _RECORD_BYTES:
        return {}
    try:
        descriptor = open_no_follow(path, os.O_RDONLY)
        with os.fdopen(descriptor, "rb") as handle:
            data = json.loads(handle.read(_RECORD_BYTES).decode("utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def meta_path(folder: Path, name: str) -> Path:
    """Where the record of cached file ``name`` is kept."""
    return folder / META / (name.replace("/", "%2F") + ".json")


def write_meta(folder: Path, name: str, *, size: int, etag: str | None, sha256: str) -> None:
    """Record what file ``name`` was when it arrived."""
    path = meta_path(folder, name)
    own_folder(path.parent)
    write_no_follow(path, json.dumps({"size": size, "etag": etag, "sha256": sha256}))


def read_meta(folder: Path, name: str) -> dict[str, Any]:
    """The record :func:`write_meta` kept for ``name`` (empty when there is none, or its folder is a link)."""
    if os.path.islink(folder / META):
        return {}
    return read_record(meta_path(folder, name))
