"""The table of formats: names, detection by content, and lazy access to reader/writer classes.

Each format module exposes ``Reader``, optionally ``Writer``, and a ``detect(probe) -> bool`` that
looks at bytes and layout only (a header, sibling files, a folder's contents) through a :class:`Probe` made once
per detection. Modules are imported
the first time a format is used, so ``import tokformats`` stays cheap. :data:`formats` is a read-only
view of the table.
"""

from __future__ import annotations

import builtins
import contextlib
import glob
import importlib
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

from ..errors import NoFilesError, UnknownFormatError
from ..fs.paths import expand_path_texts, read_head
from .format_module import Capability, Detectable, HintsWhenUndetected, Writable, capability
from .provenance import SUFFIX as PROVENANCE_SUFFIX

__all__ = [
    "FormatDescriptor",
    "formats",
    "register",
    "descriptor",
    "detect",
    "Probe",
    "load_plugins",
    "default_corpus_format",
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
        order: detection order (lower first): formats with magic numbers before layouts, raw last.
        default: the corpus format ``tokenize`` writes unless told (one format says so).
    """

    name: str
    description: str
    suffixes: tuple[str, ...]
    module: str
    detectable: bool = True
    writable: bool = True
    order: int = 50
    default: bool = False

    def load(self) -> ModuleType:
        """Import (the first time) and return the format's module."""
        return importlib.import_module(self.module)

    def capability(self, kind: type[Capability]) -> Capability | None:
        """The format's module as ``kind`` (a protocol of :mod:`tokformats.core.format_module`, such as ``Merges``)
        when it has every member of it, else None."""
        return capability(sys.modules.get(self.module) or self.load(), kind)

    @property
    def reader(self) -> type:
        """The format's Reader class."""
        module = sys.modules.get(self.module) or self.load()
        reader = getattr(module, "Reader", None)  # FormatModule's two members, looked up directly on every open
        if reader is None or not hasattr(module, "DESCRIPTOR"):
            raise UnknownFormatError(f"{self.module} (format {self.name!r}) has no Reader or no DESCRIPTOR.")
        found: type = reader
        return found

    @property
    def writer(self) -> type | None:
        """The format's Writer class, or None when the format is read-only."""
        writable = self.capability(Writable) if self.writable else None
        return writable.Writer if writable is not None else None

    def detect(self, path: Any) -> bool:
        """True if ``path`` (a path, or a :class:`Probe` shared with the other formats' detectors) is, by its bytes
        and layout, a dataset of this format."""
        detectable = self.capability(Detectable) if self.detectable else None
        return detectable is not None and detectable.detect(path if isinstance(path, Probe) else Probe(path))


_REGISTRY: dict[str, FormatDescriptor] = {}
_discovered = False


def _table() -> dict[str, FormatDescriptor]:
    """The registry, with the built-in formats in it: each module of ``tokformats/formats/`` that declares a
    ``DESCRIPTOR`` is one (found the first time the table is used, so ``import tokformats`` stays cheap)."""
    global _discovered
    if not _discovered:
        _discovered = True
        import pkgutil  # here: the table is built once, and ``import tokformats`` need not import it

        package = importlib.import_module("tokformats.formats")
        found = []
        for info in pkgutil.iter_modules(package.__path__):
            if info.name.startswith("_"):  # the formats' private helpers (the .pt codec, parts, shards)
                continue
            module = importlib.import_module(f"{package.__name__}.{info.name}")
            declared = getattr(module, "DESCRIPTOR", None)
            if isinstance(declared, FormatDescriptor):
                found.append(declared)
        builtin = {d.name: d for d in sorted(found, key=lambda d: (d.order, d.name))}
        # formats registered before (plugins, tests) come after the built-in ones
        plugins = {name: d for name, d in _REGISTRY.items() if name not in builtin}
        _REGISTRY.clear()
        _REGISTRY.update({**builtin, **plugins})
    return _REGISTRY


class _Formats(Mapping[str, FormatDescriptor]):
    """The read-only table of formats, in detection order (built-in ones found on first use)."""

    def __getitem__(self, name: str) -> FormatDescriptor:
        return _table()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(list(_table()))

    def __len__(self) -> int:
        return len(_table())

    def __repr__(self) -> str:
        return f"tokformats.formats({', '.join(_table())})"

    def __getattr__(self, name: str) -> Any:
        """A format module already imported, as ``tokformats.formats.NAME``: the table stands where the package
        was bound, so ``import tokformats.formats.pt as pt`` finds the module here."""
        module = sys.modules.get(f"tokformats.formats.{name}")
        if module is None or name.startswith("__"):
            raise AttributeError(name)
        return module


#: Read-only mapping of format name to :class:`FormatDescriptor`, in detection order.
formats: Mapping[str, FormatDescriptor] = _Formats()


def register(descriptor: FormatDescriptor) -> None:
    """Add a format to the table (plugins may call this); a name can be registered once."""
    if descriptor.name in _table():
        raise ValueError(f"a format named {descriptor.name!r} is already registered")
    _REGISTRY[descriptor.name] = descriptor


def default_corpus_format() -> str:
    """The corpus format ``tokenize`` writes when none is given (the one whose descriptor says ``default``)."""
    for descriptor in _table().values():
        if descriptor.default:
            return descriptor.name
    raise UnknownFormatError("no default corpus format is registered; name one with format=.")


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
        if not isinstance(plugin, FormatDescriptor) or plugin.name in _table():
            what = "is not a FormatDescriptor" if not isinstance(plugin, FormatDescriptor) else "reuses a format name"
            warnings.warn(f"tokformats: format plugin {entry.name!r} ({entry.value}) {what}; skipped.", stacklevel=2)
            continue
        register(plugin)
        added.append(plugin.name)
    return added


def _builtin(name: str) -> FormatDescriptor | None:
    """The built-in format ``name`` alone, importing just its module (``open(path, format=NAME)`` in a fresh process
    need not import every format)."""
    if _discovered or name in _REGISTRY:
        return _REGISTRY.get(name)
    try:
        module = importlib.import_module(f"tokformats.formats.{name.replace('-', '_')}")
    except ImportError:
        return None
    declared = getattr(module, "DESCRIPTOR", None)
    if isinstance(declared, FormatDescriptor) and declared.name == name:
        _REGISTRY[name] = declared
        return declared
    return None


def descriptor(name: str) -> FormatDescriptor:
    """The descriptor of format ``name``; :class:`UnknownFormatError` listing the names otherwise."""
    found = _builtin(name)
    if found is not None:
        return found
    if name not in _table():
        load_plugins()
    try:
        return _REGISTRY[name]
    except KeyError:
        import difflib

        known = ", ".join(sorted(_REGISTRY))
        close = difflib.get_close_matches(name, list(_REGISTRY), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise UnknownFormatError(f"there is no format named {name!r}.{hint} The formats are: {known}.") from None


class Probe:
    """What detection learns about a path, gathered once per ``open``/``detect`` and handed to every format's
    ``detect``: one ``stat``, the first bytes (one read, shared by every detector whatever prefix it needs), the
    folder's entries (one listing), and probes of sibling files (so two formats asking for ``PREFIX.idx`` read it
    once)."""

    #: Bytes read on the first :meth:`head` call; larger requests read again.
    HEAD_BYTES = 4096

    def __init__(self, path: Any, _siblings: dict[Path, Probe] | None = None) -> None:
        self.path = Path(os.fspath(path))
        try:
            self._stat: os.stat_result | None = os.stat(self.path)
        except (OSError, ValueError):
            self._stat = None
        self._head: bytes | None = None
        self._entries: list[str] | None = None
        self._siblings = _siblings if _siblings is not None else {self.path: self}

    @property
    def exists(self) -> bool:
        """Whether anything is at the path."""
        return self._stat is not None

    @property
    def is_dir(self) -> bool:
        """Whether the path is a folder."""
        import stat

        return self._stat is not None and stat.S_ISDIR(self._stat.st_mode)

    @property
    def is_file(self) -> bool:
        """Whether the path is a regular file (a FIFO or device is never read by detection)."""
        import stat

        return self._stat is not None and stat.S_ISREG(self._stat.st_mode)

    @property
    def size(self) -> int:
        """The file's size in bytes (0 when it is not a regular file)."""
        return self._stat.st_size if self._stat is not None and self.is_file else 0

    def head(self, size: int) -> bytes:
        """The first ``size`` bytes (fewer if the file is shorter; empty if it is not a readable regular file)."""
        if self._head is None or (len(self._head) < size and self.size > len(self._head)):
            self._head = read_head(self.path, max(self.HEAD_BYTES, size)) if self.is_file else b""
        return self._head[:size]

    @property
    def entries(self) -> list[str]:
        """A folder's entry names, sorted (empty for anything else)."""
        if self._entries is None:
            try:
                self._entries = sorted(os.listdir(self.path)) if self.is_dir else []
            except OSError:
                self._entries = []
        return self._entries

    def sibling(self, path: Any) -> Probe:
        """The probe of another path (a sibling or child file), made once per detection."""
        key = Path(os.fspath(path))
        if key not in self._siblings:
            self._siblings[key] = Probe(key, self._siblings)
        return self._siblings[key]

    def child(self, name: str) -> Probe:
        """The probe of ``name`` inside this folder."""
        return self.sibling(self.path / name)


def _builtin_match(probe: Probe) -> str | None:
    """The first built-in format, in detection order, whose clue (:mod:`.detectors`, no import) matches ``probe``
    and whose own ``detect`` then says yes; only those formats' modules are imported."""
    from .detectors import BUILTIN_DETECTORS

    for entry in BUILTIN_DETECTORS:
        if entry.clue(probe):
            found = _builtin(entry.name)
            if found is not None and found.detect(probe):
                return found.name
    return None


def _other_match(probe: Probe) -> str | None:
    """The first format registered besides the built-in ones (by ``register`` or a plugin's entry point) that
    detects ``probe``; plugins are read only now, when no built-in format matched."""
    from .detectors import BUILTIN_DETECTORS

    load_plugins()
    builtin = {entry.name for entry in BUILTIN_DETECTORS}
    others = sorted((d for d in _REGISTRY.values() if d.name not in builtin), key=lambda d: d.order)
    for candidate in others:
        if candidate.detect(probe):
            return candidate.name
    return None


def _suffixes_of(stem: Path, siblings: list[str]) -> set[str]:
    """The suffixes of the files among ``siblings`` named ``stem`` plus one suffix."""
    return {Path(s).suffix for s in siblings if Path(s).with_suffix("") == stem}


def _did_you_mean(path: Path) -> str:
    """Datasets beside ``path`` whose names start with its name (``data/owt`` -> ``data/owt_text_document``)."""
    try:
        siblings = sorted(glob.glob(glob.escape(os.fspath(path)) + "*"))
    except OSError:
        return ""
    names = []
    for sibling in siblings:
        name = Path(sibling)
        if name.name.endswith(PROVENANCE_SUFFIX):  # a dataset's sidecar, not a dataset
            continue
        stem = name.with_suffix("")
        if name.is_file() and name.suffix in (".bin", ".idx") and {".bin", ".idx"} <= _suffixes_of(stem, siblings):
            name = stem  # a Megatron prefix opens by its name; any other file by its own
        if name not in names and name != path:
            names.append(name)
    if not names:
        return ""
    shown = ", ".join(str(n) for n in names[:3]) + (" ..." if len(names) > 3 else "")
    return f" Did you mean {shown}?"


def _raise_unreadable(probe: Probe) -> None:
    """Raise the ``PermissionError`` (naming the file) of a file detection looked at but could not read: a
    ``chmod 000`` file is unreadable, not of an unknown format."""
    for looked in list(probe._siblings.values()):
        if looked.is_file:
            with builtins.open(looked.path, "rb"):  # raises PermissionError for an unreadable file
                pass


def detect(path: Any) -> str:
    """The name of the format of ``path`` (a file, a prefix, a folder, a glob or a list), by content.

    Raises:
        NoFilesError: nothing exists at ``path``.
        UnknownFormatError: no format recognises it; the message carries the hints formats give for a file they
            almost match (a format module's optional ``undetected_hint(probe)``: the raw stream's dtype table).
    """
    first = Path(expand_path_texts(path)[0])
    probe = Probe(first)
    if probe.exists and not probe.is_dir and not probe.is_file:
        from ..fs.untrusted import require_regular

        require_regular(first)  # a FIFO or device: refused before any format opens it
    found = _builtin_match(probe) or _other_match(probe)
    if found is not None:
        return found
    _raise_unreadable(probe)  # a file a format looked for but could not read (chmod 000) says so
    if not probe.exists:
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            os.stat(first)  # why it cannot be looked at, when that is not its absence (a name too long, EACCES)
        raise NoFilesError(f"{first} does not exist.{_did_you_mean(first)}")
    hints = []
    for entry in _table().values():
        hinting = entry.capability(HintsWhenUndetected)
        text = hinting.undetected_hint(probe) if hinting is not None else None
        if text:
            hints.append(text)
    raise UnknownFormatError(" ".join([f"{first} is not in a format tokformats recognises by its content.", *hints]))
