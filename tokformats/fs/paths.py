"""Paths as users give them: a file, a glob pattern, a list of paths, or a URL; and the first bytes of a file, read
without blocking on a FIFO."""

from __future__ import annotations

import contextlib
import errno
import glob
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import FormatError, NoFilesError

__all__ = ["URL_SCHEMES", "expand_paths", "is_pattern", "is_url", "pattern_matches", "read_head", "names_checked"]


def read_head(path: Path, size: int) -> bytes:
    """The first ``size`` bytes of ``path`` (fewer if it is shorter; empty if it cannot be read or is not a regular
    file: opening a FIFO would block): for detection."""
    from ..fs.untrusted import is_regular

    if not is_regular(path):
        return b""
    try:
        with open(path, "rb") as handle:
            return handle.read(size)
    except OSError:
        return b""


@contextlib.contextmanager
def names_checked(path: Any) -> Iterator[None]:
    """Within the block, a name too long for the file system (over 255 bytes in one part, on most) is a
    :class:`FormatError` naming ``path``, not a bare ``OSError``."""
    try:
        yield
    except OSError as error:
        if error.errno != errno.ENAMETOOLONG:
            raise
        longest = max(Path(os.fspath(error.filename or path)).parts, key=lambda part: len(os.fsencode(part)))
        raise FormatError(
            f"{error.filename or path}: the name {longest[:40]!r}... is {len(os.fsencode(longest)):,} bytes, longer "
            "than the file system allows (255 on most); choose a shorter name."
        ) from None


_GLOB_CHARS = set("*?[")
#: The URL schemes ``open`` fetches through :mod:`tokformats.remote`.
URL_SCHEMES = ("http", "https", "s3", "gs", "gcs", "hf")


def is_url(path: Any) -> bool:
    """Whether ``path`` is a URL tokformats fetches (``https://``, ``s3://``, ...) rather than a local path."""
    if not isinstance(path, str) or "://" not in path:
        return False
    return path.split("://", 1)[0].lower() in URL_SCHEMES


def is_pattern(text: str) -> bool:
    """Whether ``text`` is a glob pattern rather than a path: it holds ``*``, ``?`` or ``[`` and nothing exists under
    that exact name (a file may be called ``a[1].bin``). The one rule every path argument follows."""
    return bool(_GLOB_CHARS & set(text)) and not os.path.exists(text)


def pattern_matches(text: str, *, recursive: bool = False) -> list[Path]:
    """The paths glob pattern ``text`` matches, sorted (``recursive``: ``**`` spans folders)."""
    return [Path(m) for m in sorted(glob.glob(text, recursive=recursive))]


def expand_paths(path: Any) -> list[Path]:
    """A path, a glob pattern or a list of paths as a list of paths (globs sorted).

    A glob that matches nothing, or an empty list, raises :class:`NoFilesError`.
    """
    if isinstance(path, (str, os.PathLike)):
        text = os.fspath(path)
        if is_pattern(text):
            matches = pattern_matches(text)
            if not matches:
                raise NoFilesError(f"the pattern {text!r} matches no file.")
            return matches
        return [Path(text)]
    paths = [Path(os.fspath(p)) for p in path]
    if not paths:
        raise NoFilesError("an empty list of paths was given; name at least one file.")
    return paths
