"""Old module paths of tokformats 0.1 (before the package was layered), kept working for one release.

``import tokformats.registry`` (or ``from tokformats.pipeline import ...``) imports the module's new home
(``tokformats.core.registry``) and binds it under the old name too, with a :class:`DeprecationWarning` naming the new
path. The table below is the whole of it; it goes away in the next release.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

__all__ = ["MOVED", "install"]

#: Old module name -> new module name.
MOVED: dict[str, str] = {
    "tokformats.protocol": "tokformats.core.protocol",
    "tokformats.registry": "tokformats.core.registry",
    "tokformats.arrays": "tokformats.core.arrays",
    "tokformats.dtypes": "tokformats.core.dtypes",
    "tokformats.documents": "tokformats.core.documents",
    "tokformats.boundaries": "tokformats.core.boundaries",
    "tokformats.checks": "tokformats.core.reports",
    "tokformats.atomic": "tokformats.fs.atomic",
    "tokformats.journal": "tokformats.fs.journal",
    "tokformats.limits": "tokformats.fs.untrusted",
    "tokformats.oscopy": "tokformats.fs.filecopy",
    "tokformats.parts": "tokformats.formats._parts",
    "tokformats.shards": "tokformats.formats._shards",
    "tokformats.torchfile": "tokformats.formats._torchfile",
    "tokformats.pipeline": "tokformats.tokenization.pipeline",
    "tokformats.sources": "tokformats.tokenization.sources",
    "tokformats.engines": "tokformats.tokenization.engines",
    "tokformats.tokenizer": "tokformats.tokenization.tokenizer",
    "tokformats.samples": "tokformats.tokenization.sample_text",
    "tokformats.quickstart": "tokformats.cli.quickstart",
    "tokformats.inspect": "tokformats.cli.describe",
    "tokformats.training.cache": "tokformats.training.index_cache",
    "tokformats.training.shards": "tokformats.training.shard_rotation",
}


class _AliasLoader(importlib.abc.Loader):
    """Loads an old name as the module at its new path (the same module object)."""

    def __init__(self, new: str) -> None:
        self.new = new
        self._spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{spec.name} moved to {self.new}; import it from there (the old path goes away in the next release).",
            DeprecationWarning,
            stacklevel=2,
        )
        module = importlib.import_module(self.new)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run (the module was imported under its new name); only its own spec is put back, which the
        import system replaced with the old name's (relative imports inside the module read it)."""
        module.__spec__ = self._spec


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Finds the old names of :data:`MOVED` (and nothing else)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(new))


def install() -> None:
    """Make the old names importable (once per process)."""
    if not any(isinstance(finder, _AliasFinder) for finder in sys.meta_path):
        sys.meta_path.append(_AliasFinder())
