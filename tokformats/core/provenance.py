"""Where each document came from: the provenance sidecar ``tokenize`` writes beside a dataset (``r.provenance(i)``).

The sidecar is one file next to the dataset, named after the path its reader reports plus :data:`SUFFIX`
(``data/owt_text_document.provenance.npz`` beside a Megatron prefix, ``out/shards.provenance.npz`` beside a folder),
so every format carries it without changing the format's own files. It is a NumPy ``.npz`` (a zip of ``.npy``
arrays, no pickle) holding:

* ``files``: the input names (unicode), and ``units``: what a record is in each (``line``, ``row`` or ``item``);
* ``rows``: one row per document, in document order, of :data:`ROW_DTYPE`: ``input`` (index into ``files``;
  :data:`UNKNOWN` for a document without a recorded source, such as one merged in from a dataset without a
  sidecar), ``record`` (1-based line, row or item number) and ``offset`` (the byte offset of the record's first
  byte in the decompressed input, -1 where bytes have no meaning: Parquet rows, JSON arrays, in-memory texts).

A folder dataset's sidecar sits beside the folder; ``publish`` uploads it into the folder as
:data:`FOLDER_SIDECAR` (a folder URL names that folder alone), where a reader opened by URL, or a fetched copy
opened by path, finds it.

20 bytes per document (60 MB for 3 M documents). The sidecar is read as untrusted input: no pickle, sizes checked
before allocating, one row per document of the dataset or an error naming the file.
"""

from __future__ import annotations

import io
import os
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import FormatError
from ..fs.atomic import AtomicFiles
from ..fs.untrusted import read_npy

__all__ = [
    "SUFFIX",
    "FOLDER_SIDECAR",
    "ROW_DTYPE",
    "UNKNOWN",
    "Provenance",
    "RowSpool",
    "sidecar_path",
    "sidecar_in",
    "load_provenance",
    "save_provenance",
    "read_rows",
]

#: What the sidecar's name adds to the dataset's path.
SUFFIX = ".provenance.npz"
#: A folder dataset's sidecar inside the folder, as ``publish`` uploads it (the folder's URL names the folder alone).
FOLDER_SIDECAR = "dataset" + SUFFIX
#: One document's source.
ROW_DTYPE = np.dtype([("input", "<u4"), ("record", "<u8"), ("offset", "<i8")])
#: ``input`` of a document whose source is not known.
UNKNOWN = 0xFFFFFFFF
#: What a record is called, by the input's kind.
UNITS = ("line", "row", "item")


def sidecar_path(dataset_path: str | Path) -> Path:
    """Where the provenance sidecar of the dataset whose reader reports ``dataset_path`` lives."""
    return Path(str(dataset_path).rstrip("/") + SUFFIX)


def sidecar_in(dataset_path: str | Path, folder: str | Path) -> Path:
    """The provenance sidecar of a dataset whose files are ``folder`` (a dataset opened by URL: its cache folder):
    the file beside ``dataset_path`` when that is in the folder, else the folder's :data:`FOLDER_SIDECAR` (what
    ``publish`` uploads of a folder dataset). Never a file beside the folder, which the dataset does not hold."""
    beside = sidecar_path(dataset_path)
    return beside if beside.is_relative_to(folder) else Path(folder) / FOLDER_SIDECAR


@dataclass
class Provenance:
    """The sources of a dataset's documents: ``files[rows["input"][i]]``, ``rows["record"][i]``, ...

    Attributes:
        files: input names.
        units: per input, what a record is (``line``, ``row`` or ``item``).
        rows: one :data:`ROW_DTYPE` row per document.
    """

    files: list[str]
    units: list[str]
    rows: np.ndarray

    def __len__(self) -> int:
        return len(self.rows)

    def entry(self, index: int) -> dict[str, Any] | None:
        """Document ``index``'s source: ``{"file", "line"|"row"|"item", "byte_offset"}`` (``byte_offset`` None when
        bytes have no meaning there), or None when the document's source is not recorded."""
        row = self.rows[index]
        source = int(row["input"])
        if source == UNKNOWN:
            return None
        offset = int(row["offset"])
        return {
            "file": self.files[source],
            self.units[source]: int(row["record"]),
            "byte_offset": offset if offset >= 0 else None,
        }

    @classmethod
    def unknown(cls, count: int) -> Provenance:
        """``count`` documents whose sources are not known."""
        rows = np.zeros(count, dtype=ROW_DTYPE)
        rows["input"] = UNKNOWN
        return cls([], [], rows)

    @classmethod
    def concatenate(cls, parts: Sequence[Provenance]) -> Provenance:
        """The provenance of datasets laid end to end (``merge``): input lists joined, rows renumbered."""
        files: list[str] = []
        units: list[str] = []
        rows = []
        for part in parts:
            shifted = part.rows.copy()
            known = shifted["input"] != UNKNOWN
            shifted["input"][known] += len(files)
            files += part.files
            units += part.units
            rows.append(shifted)
        return cls(files, units, np.concatenate(rows) if rows else np.zeros(0, dtype=ROW_DTYPE))


def save_provenance(provenance: Provenance, dataset_path: str | Path, *, overwrite: bool = True) -> Path:
    """Write ``provenance`` as the sidecar of the dataset whose reader reports ``dataset_path``, atomically."""
    path = sidecar_path(dataset_path)
    arrays = {
        "files": np.array(provenance.files, dtype=str).reshape(-1),
        "units": np.array(provenance.units, dtype=str).reshape(-1),
        "rows": np.ascontiguousarray(provenance.rows, dtype=ROW_DTYPE),
    }
    buffer = io.BytesIO()
    # What np.savez writes, with a fixed timestamp: the same sources give the same bytes (a resumed run's sidecar
    # equals an uninterrupted run's).
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for name, array in arrays.items():
            member = io.BytesIO()
            np.lib.format.write_array(member, array, allow_pickle=False)
            archive.writestr(zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0)), member.getvalue())
    with AtomicFiles(overwrite=overwrite) as files:
        files.create(path).write(buffer.getvalue())
    return path


def _member(archive: zipfile.ZipFile, name: str, where: str) -> np.ndarray:
    try:
        info = archive.getinfo(f"{name}.npy")
    except KeyError:
        raise FormatError(f"{where}: the provenance sidecar has no {name!r} array.") from None
    with archive.open(info) as handle:
        return read_npy(handle, f"{where} ({name})", budget=info.file_size)


def load_provenance(
    dataset_path: str | Path, documents: int, *, sidecar: str | Path | None = None
) -> Provenance | None:
    """The sidecar of the dataset whose reader reports ``dataset_path`` (``documents`` documents), or None when there
    is none: ``sidecar`` when given, else the file beside ``dataset_path``, else (a folder) its
    :data:`FOLDER_SIDECAR`. A sidecar that is not one, or whose rows do not match the dataset, raises
    :class:`FormatError`."""
    path = Path(sidecar) if sidecar is not None else sidecar_path(dataset_path)
    if sidecar is None and not path.is_file() and Path(dataset_path).is_dir():
        path = Path(dataset_path) / FOLDER_SIDECAR
    if not path.is_file():
        return None
    where = str(path)
    try:
        with zipfile.ZipFile(path) as archive:
            files, units, rows = (_member(archive, name, where) for name in ("files", "units", "rows"))
    except zipfile.BadZipFile:
        raise FormatError(f"{where}: not a provenance sidecar (not a zip of .npy arrays).") from None
    if rows.dtype != ROW_DTYPE or files.dtype.kind != "U" or units.dtype.kind != "U" or len(files) != len(units):
        raise FormatError(
            f"{where}: expected rows of {ROW_DTYPE.descr} and one unit per file, found rows of {rows.dtype.descr}, "
            f"{len(files)} files and {len(units)} units."
        )
    if len(rows) != documents:
        raise FormatError(
            f"{where}: records the sources of {len(rows):,} documents, but the dataset as opened holds "
            f"{documents:,}: open it with the document boundaries tokenize wrote (eos=/bos=, as its summary's "
            "read_with says), or the sidecar belongs to another version of the dataset (remove it)."
        )
    known = rows["input"][rows["input"] != UNKNOWN]
    if (len(known) and int(known.max()) >= len(files)) or any(u not in UNITS for u in units.tolist()):
        raise FormatError(f"{where}: a row names an input beyond its {len(files)} files, or a unit is unknown.")
    return Provenance(files.tolist(), units.tolist(), rows)


class RowSpool:
    """An append-only file of :data:`ROW_DTYPE` rows beside a tokenize run's spools (one row per document spooled),
    cut back to ``documents`` rows when a run resumes from a checkpoint. A file shorter than that (a run started
    without provenance) makes the spool :attr:`complete` False: its rows no longer line up, so no sidecar is made."""

    def __init__(self, path: Path, documents: int) -> None:
        self.path = path
        size = documents * ROW_DTYPE.itemsize
        found = path.stat().st_size if path.exists() else 0
        #: Whether the file holds one row per document spooled so far.
        self.complete = found >= size
        with open(path, "ab") as handle:
            handle.truncate(min(found, size))
        self._handle = open(path, "ab")  # noqa: SIM115 - closed by close()

    def append(self, rows: np.ndarray) -> None:
        """Add rows (in document order)."""
        if self.complete:
            self._handle.write(np.ascontiguousarray(rows, dtype=ROW_DTYPE).data)

    def sync(self) -> None:
        """Flush to disk (before a checkpoint records the document count)."""
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def close(self) -> None:
        """Close the file."""
        self._handle.close()


def read_rows(path: Path, documents: int) -> np.ndarray | None:
    """The first ``documents`` rows of a :class:`RowSpool` file, or None when it holds fewer."""
    if not path.is_file() or path.stat().st_size < documents * ROW_DTYPE.itemsize:
        return None
    return np.fromfile(path, dtype=ROW_DTYPE, count=documents)
