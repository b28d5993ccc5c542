"""The class of ``tokformats.formats.llmc.Family``, in a module of its own: opening llm.c shards does not build it.

``llmc`` reads headers with a plain class of the same fields (``llmc._Flavour``) and builds this named tuple, and its
two values ``GPT2`` and ``LLAMA3``, when they are first asked for (``llmc.Family``, ``llmc.FAMILIES``, ``read_header``,
``Reader.family``, a writer): building a named-tuple class compiles its ``__new__`` with ``eval``, ~0.1-0.2 ms of a
fresh process's first open. No ``from __future__ import annotations`` here: ``typing`` would compile each field's
annotation string.
"""

from typing import NamedTuple

import numpy as np

__all__ = ["Family"]


class Family(NamedTuple):
    """A model family's shard flavour: its magic, version, token dtype and document delimiter."""

    name: str
    magic: int
    version: int
    dtype: np.dtype
    delimiter: int
