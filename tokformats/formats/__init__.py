"""One module per on-disk format, each holding that format's ``Reader``, ``Writer``, ``detect`` and everything else
that is true of that format only (output names, boundaries convention, the files that go with a URL, ...); its
private helpers are the ``_name`` modules (the ``.pt`` codec, multi-file parts, shard roll-over).

The package is also the read-only table of formats, in detection order: ``tokformats.formats["megatron"]`` is a
:class:`~tokformats.core.registry.FormatDescriptor`, ``list(tokformats.formats)`` the names, and
``tokformats.formats.megatron`` the module (``import tokformats.formats.megatron`` works as for any package).

A module that declares a ``DESCRIPTOR`` is a built-in format (the contract: :mod:`tokformats.core.format_module`):
the registry finds it here the first time the table is used. Adding a format is its module and its tests (outside
tokformats: a module and a ``tokformats.formats`` entry point).
"""

from __future__ import annotations

import sys
import types
from collections.abc import ItemsView, Iterator, KeysView, Mapping, ValuesView
from typing import Any

from ..core.registry import FormatDescriptor
from ..core.registry import formats as _table


class _FormatsPackage(types.ModuleType):
    """This package, which is also the read-only mapping of format name -> descriptor."""

    def __getitem__(self, name: str) -> FormatDescriptor:
        return _table[name]

    def __iter__(self) -> Iterator[str]:
        return iter(_table)

    def __len__(self) -> int:
        return len(_table)

    def __contains__(self, name: object) -> bool:
        return name in _table

    def keys(self) -> KeysView[str]:
        """The format names, in detection order."""
        return _table.keys()

    def values(self) -> ValuesView[FormatDescriptor]:
        """The descriptors, in detection order."""
        return _table.values()

    def items(self) -> ItemsView[str, FormatDescriptor]:
        """``(name, descriptor)`` pairs, in detection order."""
        return _table.items()

    def get(self, name: str, default: Any = None) -> Any:
        """The descriptor of ``name``, or ``default``."""
        return _table.get(name, default)

    def __repr__(self) -> str:
        return repr(_table)


Mapping.register(_FormatsPackage)
sys.modules[__name__].__class__ = _FormatsPackage
