"""The table of formats: names, detection by content, and lazy access to reader/writer classes.

Each format module exposes ``Reader``, optionally ``Writer``, and a ``detect(path) -> bool`` that
looks at bytes and layout only (a header, sibling files, a folder's contents). Modules are imported
the first time a format is used, so ``import tokformats`` stays cheap. :data:`formats` is a read-only
view of the table.
"""

from __future__ import annotations

import glob
import importlib
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import Any, NamedTuple

from .errors import NoFilesError, UnknownFormatError

__all__ = [
    "FormatDescriptor",
    "formats",
    "register",
    "descriptor",
    "detect",
    "expand_paths",
    "read_head",
    "load_plugins",
    "ENTRY_POINT_GROUP",
]

#: Third-party formats register through this entry-point group: ``name = "package.module:descriptor"``, where
#: the object is a :class:`FormatDescriptor` or a callable returning one.
ENTRY_POINT_GROUP = "tokformats.formats"


class FormatDescriptor(NamedTuple):
    """One registered format.

    Attributes:
        name: the name used by ``open(format=...)``, ``create`` and the CLI.
        description: one line for listings.
        suffixes: file name endings the format uses (informative; detection reads content).
        module: the module holding ``Reader``, ``Writer`` and ``detect``.
        detectable: whether :func:`detect` can recognise it by content (headerless raw cannot).
        writable: whether it has a writer.
    """

    name: str
    description: str
    suffixes: tuple[str, ...]
    module: str
    detectable: bool = True
    writable: bool = True

    def load(self) -> ModuleType:
        """Import (the first time) and return the format's module."""
        return importlib.import_module(self.module)

    @property
    def reader(self) -> type:
        """The format's Reader class."""
        return self.load().Reader

    @property
    def writer(self) -> type | None:
        """The format's Writer class, or None when the format is read-only."""
        return getattr(self.load(), "Writer", None) if self.writable else None

    def detect(self, path: Path) -> bool:
        """True if ``path`` is, by its bytes and layout, a dataset of this format."""
        if not self.detectable:
            return False
        probe: Callable[[Path], bool] = self.load().detect
        return probe(path)


_REGISTRY: dict[str, FormatDescriptor] = {}

#: Read-only mapping of format name to :class:`FormatDescriptor`, in detection order.
formats: Mapping[str, FormatDescriptor] = MappingProxyType(_REGISTRY)


def register(descriptor: FormatDescriptor) -> None:
    """Add a format to the table (plugins may call this); a name can be registered once."""
    if descriptor.name in _REGISTRY:
        raise ValueError(f"a format named {descriptor.name!r} is already registered")
    _REGISTRY[descriptor.name] = descriptor


_plugins_loaded = False


def load_plugins() -> list[str]:
    """Register the formats of installed plugins (entry-point group ``tokformats.formats``), once; returns the
    names added. Runs by itself on the first detection or on a format name the table does not know, so that
    ``import tokformats`` does not scan installed packages. A plugin that fails to load is skipped with a warning."""
    global _plugins_loaded
    if _plugins_loaded:
        return []
    _plugins_loaded = True
    import warnings
    from importlib.metadata import entry_points

    added = []
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        try:
            found = entry.load()
            plugin = found if isinstance(found, FormatDescriptor) else found()
        except Exception as error:  # a broken plugin must not break tokformats
            message = f"tokformats: format plugin {entry.name!r} ({entry.value}) failed to load: {error}"
            warnings.warn(message, stacklevel=2)
            continue
        if not isinstance(plugin, FormatDescriptor) or plugin.name in _REGISTRY:
            what = "is not a FormatDescriptor" if not isinstance(plugin, FormatDescriptor) else "reuses a format name"
            warnings.warn(f"tokformats: format plugin {entry.name!r} ({entry.value}) {what}; skipped.", stacklevel=2)
            continue
        register(plugin)
        added.append(plugin.name)
    return added


def descriptor(name: str) -> FormatDescriptor:
    """The descriptor of format ``name``; :class:`UnknownFormatError` listing the names otherwise."""
    if name not in _REGISTRY:
        load_plugins()
    try:
        return _REGISTRY[name]
    except KeyError:
        import difflib

        known = ", ".join(sorted(_REGISTRY))
        close = difflib.get_close_matches(name, list(_REGISTRY), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise UnknownFormatError(f"there is no format named {name!r}.{hint} The formats are: {known}.") from None


def read_head(path: Path, size: int) -> bytes:
    """The first ``size`` bytes of ``path`` (fewer if it is shorter; empty if it cannot be read or is not a regular
    file: opening a FIFO would block): for detection."""
    from .limits import is_regular

    if not is_regular(path):
        return b""
    try:
        with open(path, "rb") as handle:
            return handle.read(size)
    except OSError:
        return b""


_GLOB_CHARS = set("*?[")


def expand_paths(path: Any) -> list[Path]:
    """A path, a glob pattern or a list of paths as a list of paths (globs sorted).

    A glob that matches nothing, or an empty list, raises :class:`NoFilesError`.
    """
    if isinstance(path, (str, os.PathLike)):
        text = os.fspath(path)
        if _GLOB_CHARS & set(text) and not os.path.exists(text):
            matches = sorted(glob.glob(text))
            if not matches:
                raise NoFilesError(f"the pattern {text!r} matches no file.")
            return [Path(m) for m in matches]
        return [Path(text)]
    paths = [Path(os.fspath(p)) for p in path]
    if not paths:
        raise NoFilesError("an empty list of paths was given; name at least one file.")
    return paths


def _candidates(path: Path) -> Iterator[FormatDescriptor]:
    """Detectable formats, those whose suffixes match ``path`` first (fewer format modules imported)."""
    detectable = [d for d in _REGISTRY.values() if d.detectable]
    matching = [d for d in detectable if path.suffix and path.suffix in d.suffixes]
    return iter(matching + [d for d in detectable if d not in matching])


def _did_you_mean(path: Path) -> str:
    """Datasets beside ``path`` whose names start with its name (``data/owt`` -> ``data/owt_text_document``)."""
    try:
        siblings = sorted(glob.glob(glob.escape(os.fspath(path)) + "*"))
    except OSError:
        return ""
    names = []
    for sibling in siblings:
        name = Path(sibling).with_suffix("") if Path(sibling).is_file() else Path(sibling)
        if name not in names and name != path:
            names.append(name)
    if not names:
        return ""
    shown = ", ".join(str(n) for n in names[:3]) + (" ..." if len(names) > 3 else "")
    return f" Did you mean {shown}?"


def detect(path: Any) -> str:
    """The name of the format of ``path`` (a file, a prefix, a folder, a glob or a list), by content.

    Raises:
        NoFilesError: nothing exists at ``path``.
        UnknownFormatError: no format recognises it; headerless streams need ``format="raw"``.
    """
    load_plugins()
    paths = expand_paths(path)
    first = paths[0]
    if first.exists() and not first.is_dir():
        from .limits import require_regular

        require_regular(first)  # a FIFO or device: refused before any format opens it
    for candidate in _candidates(first):
        if candidate.detect(first):
            return candidate.name
    if not first.exists():
        raise NoFilesError(f"{first} does not exist.{_did_you_mean(first)}")
    from .formats.raw import describe_headerless

    raise UnknownFormatError(
        f"{first} is not in a format tokformats recognises by its content. " + describe_headerless(first)
    )
