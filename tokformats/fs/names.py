"""Names read from files and stores, checked before they become paths.

An index (``SHA256SUMS``, a manifest, ``state.json``, ``index.json``, ``meta.json``), a store's listing or a
journal names files; those names come from whoever made the dataset, so none is trusted. :func:`safe_relative_name`
is the one place that decides whether such a name may become a path under a dataset's folder: a relative POSIX
path of plain components, without ``..``, ``.``, empty parts, a leading ``/``, a backslash, NUL or other control
characters, each component at most :data:`MAX_COMPONENT_BYTES` bytes and the whole at most :data:`MAX_NAME_BYTES`,
which stays inside the folder after resolution and crosses no symbolic link.
"""

from __future__ import annotations

import os
import stat
import unicodedata
from pathlib import Path

from ..errors import FormatError

__all__ = [
    "MAX_COMPONENT_BYTES",
    "MAX_NAME_BYTES",
    "UnsafeNameError",
    "safe_relative_name",
    "inside_folder",
]

#: The longest file name component most file systems store (ext4, XFS, APFS: 255 bytes).
MAX_COMPONENT_BYTES = 255
#: The longest name (all components) accepted from an index.
MAX_NAME_BYTES = 4096


class UnsafeNameError(FormatError):
    """A name read from an index, a listing or a journal cannot be a file of the dataset (absolute, ``..``, control
    characters, too long, or leading outside the dataset's folder)."""


def _problem(name: object) -> str | None:
    """What makes ``name`` unacceptable as a relative file name, or None."""
    if not isinstance(name, str):
        return f"a name must be a string, found {type(name).__name__} {name!r:.80}"
    if not name:
        return "the name is empty"
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError:
        return "the name is not valid UTF-8"
    if len(encoded) > MAX_NAME_BYTES:
        return f"the name is {len(encoded):,} bytes long, more than the {MAX_NAME_BYTES:,} allowed"
    bad = next((c for c in name if unicodedata.category(c) == "Cc"), None)
    if bad is not None:
        return f"the name holds the control character {bad!r}"
    if "\\" in name:
        return "the name holds a backslash"
    if name.startswith("/"):
        return "the name is an absolute path"
    for part in name.split("/"):
        if part in ("", ".", ".."):
            return f"the name has a {part!r} component" if part else "the name has an empty component"
        if len(part.encode("utf-8")) > MAX_COMPONENT_BYTES:
            return f"a component of the name is longer than {MAX_COMPONENT_BYTES} bytes"
    return None


def _shown(name: object) -> str:
    """``name`` for a message: quoted, with control characters escaped, and cut short."""
    text = repr(name)
    return text if len(text) <= 120 else text[:117] + "..."


def safe_relative_name(name: object, *, where: str, folder: Path | None = None) -> str:
    """``name`` when it is acceptable as a file of the dataset, else :class:`UnsafeNameError`.

    Args:
        name: the value read (anything: it is type-checked too).
        where: what named it, for the message: the URL (without credentials) or file of the index and the entry
            (``"https://host/d/SHA256SUMS, line 3"``).
        folder: the dataset's folder: when given, ``folder / name`` must stay inside it after resolution and no
            existing component of it may be a symbolic link.
    """
    problem = _problem(name)
    if problem is None and folder is not None:
        problem = _leaves(folder, str(name))
    if problem is not None:
        raise UnsafeNameError(
            f"{where}: the file name {_shown(name)} is refused ({problem}); a dataset's index may only name files "
            "inside the dataset's folder by relative paths of plain components."
        )
    return str(name)


def _leaves(folder: Path, name: str) -> str | None:
    """Why ``folder / name`` would lead outside ``folder`` (a symbolic link on the way), or None."""
    path = Path(folder)
    for part in name.split("/"):
        path = path / part
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            return None  # nothing further exists: it will be made inside the folder
        except OSError as error:
            return f"{path} cannot be examined ({error.strerror})"
        if stat.S_ISLNK(info.st_mode):
            return f"{path} is a symbolic link"
    return None


def inside_folder(folder: Path, path: Path) -> bool:
    """Whether ``path`` (after resolving every link) lies inside ``folder`` (resolved too)."""
    base = os.path.realpath(folder)
    return os.path.commonpath([base, os.path.realpath(path)]) == base
