"""What each built-in format looks like from outside, known without importing its module.

Detecting one file used to import every format module (and read every plugin's entry point) before asking each its
``detect``. This table says, per built-in format, what its files must show before its own ``detect`` is worth
asking: magic bytes at the start, a name ending, an index file beside it, folder entries. Each clue is a cheap
*necessary* condition (never false where the format's ``detect`` would say yes), so detection imports only the
formats whose clue matches, in the same order as before, and gives the same answer. The constants are copies of the
format modules' own; a test checks that they agree.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .registry import Probe

__all__ = ["Detector", "BUILTIN_DETECTORS"]

# Copies of the format modules' constants (tests/test_api.py checks each against its module).
LLMC_VOCAB_MAGIC = struct.pack("<I", 20240328)  # llmc_vocab.MAGIC
LLMC_SHARD_MAGICS = (struct.pack("<i", 20240520), struct.pack("<i", 20240801))  # llmc.FAMILIES
MEGATRON_MAGIC = b"MMIDIDX\x00\x00"  # megatron.MAGIC
TORCH_MAGICS = (b"PK\x03\x04", b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19")  # _torchfile
PT_MANIFEST = "manifest.json"  # pt.MANIFEST
LITDATA_INDEX = "index.json"  # litdata.INDEX
HF_NAMES = ("state.json", "dataset_dict.json")  # hf.STATE, hf.DICT
DATATROVE_ENDINGS = (".ds", ".index", ".loss", ".metadata")  # datatrove: .ds, INDEX, LOSS, METADATA
SEQUENCE_ENDINGS = (".json", ".jsonl", ".npy", ".npz", ".npy.gz")  # sequences.SUFFIXES


class Detector:
    """A built-in format as detection first sees it: its name, module, detection order, and its clue.

    A plain class with slots, not a named tuple: ``collections.namedtuple`` compiles a ``__new__`` with ``eval``
    (~0.05-0.1 ms in a fresh process), paid by every first detection, for a table that is only ever read by field.
    """

    __slots__ = ("clue", "module", "name", "order")

    def __init__(self, name: str, module: str, order: int, clue: Callable[[Probe], bool]) -> None:
        self.name, self.module, self.order, self.clue = name, module, order, clue

    def __repr__(self) -> str:
        return f"Detector({self.name!r}, {self.module!r}, {self.order})"


def _llmc_vocab(probe: Probe) -> bool:
    return probe.is_file and probe.head(4) == LLMC_VOCAB_MAGIC


def _llmc(probe: Probe) -> bool:
    if probe.is_dir:
        return any(name.endswith(".bin") for name in probe.entries)
    return probe.is_file and probe.head(4) in LLMC_SHARD_MAGICS


def _megatron(probe: Probe) -> bool:
    text = str(probe.path)
    indexes = [text + ".idx"] + [text[:-4] + ".idx" for suffix in (".bin", ".idx") if text.endswith(suffix)]
    return any(probe.sibling(index).head(len(MEGATRON_MAGIC)) == MEGATRON_MAGIC for index in indexes)


def _pt(probe: Probe) -> bool:
    if probe.is_dir:
        return PT_MANIFEST in probe.entries or any(name.endswith(".pt") for name in probe.entries)
    return probe.is_file and probe.head(16).startswith(TORCH_MAGICS)


def _folder(probe: Probe) -> bool:
    return probe.is_dir


def _datatrove(probe: Probe) -> bool:
    return probe.is_dir or probe.path.name.endswith(DATATROVE_ENDINGS)


def _litdata(probe: Probe) -> bool:
    return probe.is_dir and LITDATA_INDEX in probe.entries


def _hf(probe: Probe) -> bool:
    return probe.is_dir and any(name in probe.entries for name in HF_NAMES)


def _dolma(probe: Probe) -> bool:
    return probe.is_dir or probe.path.name.endswith(".npy")


def _sequences(probe: Probe) -> bool:
    return probe.is_file and probe.path.name.lower().endswith(SEQUENCE_ENDINGS)


_FORMATS = "tokformats.formats."
#: Every detectable built-in format, in detection order (``raw`` is never detected: it has no clue to show).
BUILTIN_DETECTORS: tuple[Detector, ...] = (
    Detector("llmc-vocab", _FORMATS + "llmc_vocab", 10, _llmc_vocab),
    Detector("llmc", _FORMATS + "llmc", 20, _llmc),
    Detector("megatron", _FORMATS + "megatron", 30, _megatron),
    Detector("pt", _FORMATS + "pt", 40, _pt),
    Detector("timemoe", _FORMATS + "timemoe", 50, _folder),
    Detector("datatrove", _FORMATS + "datatrove", 60, _datatrove),
    Detector("litdata", _FORMATS + "litdata", 70, _litdata),
    Detector("hf", _FORMATS + "hf", 80, _hf),
    Detector("dolma", _FORMATS + "dolma", 90, _dolma),
    Detector("sequences", _FORMATS + "sequences", 100, _sequences),
)
