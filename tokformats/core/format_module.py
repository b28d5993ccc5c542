"""The contract a format module keeps: what ``tokformats`` looks up in the module a :class:`FormatDescriptor` names.

A format is one module (``tokformats/formats/NAME.py``, or a plugin's module registered through the entry-point group
``tokformats.formats``). It must define :class:`FormatModule`'s three members; each optional capability is one more
protocol below, and ``tokformats`` uses a capability only when the module has all of its members::

    DESCRIPTOR = FormatDescriptor("myformat", "one line", (".my",), __name__)
    class Reader(TokenReader): ...             # required
    def detect(probe: Probe) -> bool: ...      # Detectable (required unless DESCRIPTOR says detectable=False)
    class Writer(TokenWriter): ...             # Writable
    def undetected_hint(probe) -> str | None   # HintsWhenUndetected: a sentence for "no format recognises this"
    def merge(sources, destination, *, overwrite) -> Reader         # Merges: its own way of concatenating
    def export_tokenizer(tokenizer, path, *, overwrite) -> Path     # ExportsTokenizer: a vocabulary format
    def remote_companions(name) -> [(name, required), ...]          # RemoteCompanions: files that go with a file
    REMOTE_INDEX = ("index.json",); def remote_files(folder) -> [{"name", "size", "sha256"}, ...]   # RemoteIndex
    def remote_lazy(folder, names) -> bool     # RemoteLazy: the reader can open by URL with ``remote=LazyFiles``
    def remote_adopt(root, name) -> Path | None                     # RemoteAdopt: a cached copy under another name
    PUBLISHED_LAST = ("*.idx",)                # PublishedLast: index files uploaded after the data they name

:func:`tokformats.core.conformance.conformance_problems` says what a module lacks or gets wrong; the conformance
suite (:class:`tokformats.testing.TokenFormatTests`) runs it for every format, plugins included.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:
    from .protocol import Reader, Writer
    from .registry import FormatDescriptor, Probe

__all__ = [
    "FormatModule",
    "Detectable",
    "Writable",
    "HintsWhenUndetected",
    "Merges",
    "ExportsTokenizer",
    "RemoteCompanions",
    "RemoteIndex",
    "RemoteLazy",
    "RemoteAdopt",
    "PublishedLast",
    "capability",
    "CAPABILITIES",
]


@runtime_checkable
class FormatModule(Protocol):
    """What every format module defines."""

    #: The format's entry in the table (name, description, suffixes, this module's name, detection order).
    DESCRIPTOR: FormatDescriptor
    #: The reader class (a :class:`~tokformats.TokenReader` for corpora).
    Reader: type[Reader[Any]]


@runtime_checkable
class Detectable(Protocol):
    """A format recognised by its content: every format whose descriptor says ``detectable`` (a headerless raw
    stream is not)."""

    def detect(self, probe: Probe) -> bool:
        """Whether the probed path is a dataset of this format, by its bytes and layout only."""


@runtime_checkable
class Writable(Protocol):
    """A format tokformats can write."""

    Writer: type[Writer[Any]]


@runtime_checkable
class HintsWhenUndetected(Protocol):
    """A format that can say why a file that nearly matches it was not recognised."""

    def undetected_hint(self, probe: Probe) -> str | None:
        """A sentence for the "not a format tokformats recognises" message (e.g. a raw stream's dtype table)."""


@runtime_checkable
class Merges(Protocol):
    """A format with its own way of concatenating datasets (Megatron: its ``add_index``, byte for byte)."""

    def merge(self, sources: Sequence[Any], destination: Any, *, overwrite: bool = False) -> Reader[Any]:
        """Concatenate ``sources`` into ``destination`` in order, and open it."""


@runtime_checkable
class ExportsTokenizer(Protocol):
    """A vocabulary format: writes a ``tokenizers.Tokenizer``'s vocabulary."""

    def export_tokenizer(self, tokenizer: Any, path: Any, *, overwrite: bool = False) -> Path:
        """Write ``tokenizer``'s vocabulary at ``path``; returns the path written."""


@runtime_checkable
class RemoteCompanions(Protocol):
    """Files that go with a file or prefix opened by URL (Megatron's ``.idx`` and ``.bin``)."""

    def remote_companions(self, name: str) -> list[tuple[str, bool]]:
        """``[(name, required), ...]`` for the file (or prefix) ``name``."""


@runtime_checkable
class RemoteIndex(Protocol):
    """A folder whose index file lists its data files with sizes and checksums (litdata's ``index.json``)."""

    #: The index files' names, relative to the folder.
    REMOTE_INDEX: Sequence[str]

    def remote_files(self, folder: Path) -> list[dict[str, Any]]:
        """The data files the index in ``folder`` lists: ``{"name", "size", "sha256"}`` (sizes/checksums optional)."""


@runtime_checkable
class RemoteLazy(Protocol):
    """A format whose reader can open a dataset by URL with its index files only, fetching data on first use."""

    def remote_lazy(self, folder: Path, names: list[str]) -> bool:
        """Whether the index files in ``folder`` (and the dataset's file ``names``) are enough to open lazily."""


@runtime_checkable
class RemoteAdopt(Protocol):
    """A format whose own tools cache files under other names (NeuroShard's cache) that tokformats may reuse."""

    def remote_adopt(self, root: Path, name: str) -> Path | None:
        """A file under the cache ``root`` that may be ``name`` (used only if it verifies), else None."""


@runtime_checkable
class PublishedLast(Protocol):
    """A format whose readers key on index files: uploaded after every other file, fetched first."""

    #: File name patterns (``fnmatch``) of those index files.
    PUBLISHED_LAST: Sequence[str]


Capability = TypeVar("Capability")

#: The optional capabilities, for :func:`conformance_problems`.
CAPABILITIES: tuple[type, ...] = (
    Detectable,
    Writable,
    HintsWhenUndetected,
    Merges,
    ExportsTokenizer,
    RemoteCompanions,
    RemoteIndex,
    RemoteLazy,
    RemoteAdopt,
    PublishedLast,
)


#: Each protocol's members, with whether each is a method (found once per protocol).
_MEMBERS: dict[type, tuple[tuple[str, bool], ...]] = {}
_MISSING = object()


def _members(kind: type) -> tuple[tuple[str, bool], ...]:
    found = _MEMBERS.get(kind)
    if found is None:
        names = {*vars(kind).get("__annotations__", {}), *(n for n in vars(kind) if not n.startswith("_"))}
        found = _MEMBERS[kind] = tuple((name, callable(getattr(kind, name, None))) for name in sorted(names))
    return found


def capability(module: ModuleType, kind: type[Capability]) -> Capability | None:
    """``module`` as a ``kind`` (one of the protocols above) when it has every member of it, else None.

    The members are looked up directly, by the rule of a runtime-checkable protocol's ``isinstance`` (every member
    present, a method not None), which ``typing`` would find again on every call (the cost of a first detection's
    ``detect`` lookup, over and over)."""
    for name, method in _members(kind):
        value = getattr(module, name, _MISSING)
        if value is _MISSING or (method and value is None):
            return None
    found: Capability = module  # type: ignore[assignment]
    return found
