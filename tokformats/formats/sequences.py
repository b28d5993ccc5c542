"""Single-file sequence datasets, as Time-MoE's ``GeneralDataset`` reads them (read-only format ``sequences``).

``.json`` (a list), ``.jsonl`` (one item per line), ``.npy``, ``.npz``, ``.npy.gz``; each item is a list of numbers
or a dict with a ``sequence`` key, and a 2-D array's rows are sequences. ``.pkl``/``.pickle`` (and object
arrays in ``.npy``/``.npz``) load through pickle, which runs code: they are refused unless
``allow_pickle=True``. ``.yaml`` is read with PyYAML's ``safe_load`` when it is installed.
Convert one into a Time-MoE folder with ``tokformats convert series.jsonl out/ds --to timemoe``.
"""

from __future__ import annotations

import gzip
import json
import zipfile
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.documents import offsets_from_lengths
from ..core.dtypes import parse_dtype
from ..core.protocol import PathLike, TokenReader
from ..core.registry import FormatDescriptor, Probe
from ..errors import FormatError, NoFilesError, UnsafePickleError
from ..fs.untrusted import MAX_DEFLATE_RATIO, max_json_bytes, numbers, read_json, read_npy, require_regular

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = ["Reader", "SequenceFile", "from_file", "detect", "SUFFIXES"]

#: This format's entry in :data:`tokformats.formats` (the registry finds it here).
DESCRIPTOR = FormatDescriptor(
    "sequences",
    "single-file sequence dataset (.json, .jsonl, .npy, .npz, .npy.gz)",
    (".json", ".jsonl", ".npy", ".npz", ".gz"),
    __name__,
    writable=False,
    order=100,
)

SUFFIXES = (".json", ".jsonl", ".npy", ".npz", ".npy.gz")
_NPY_MAGIC = b"\x93NUMPY"


def detect(probe: Probe) -> bool:
    """A file with a sequence-file suffix whose first bytes fit it (JSON, .npy magic, zip, gzip)."""
    name = probe.path.name.lower()
    if not probe.is_file or not name.endswith(SUFFIXES):
        return False
    head = probe.head(8)
    if name.endswith((".json", ".jsonl")):
        return head.lstrip()[:1] in (b"[", b"{")
    if name.endswith(".npy"):
        return head.startswith(_NPY_MAGIC)
    if name.endswith(".npz"):
        return head.startswith(b"PK\x03\x04")
    return head.startswith(b"\x1f\x8b")


class SequenceFile(TokenReader):
    """Sequences from one ``.json``, ``.jsonl``, ``.npy``, ``.npz``, ``.npy.gz`` (or opt-in ``.pkl``, ``.yaml``) file,
    loaded into memory (these files are small by nature; the folder format is for large data).

    Each item is a list of numbers or a dict with a ``sequence`` key; a 2-D array's rows are sequences.
    """

    format = "sequences"

    def __init__(self, path: PathLike, *, allow_pickle: bool = False, dtype: npt.DTypeLike | None = None) -> None:
        super().__init__(path, allow_pickle=allow_pickle, dtype=dtype)
        self._path = Path(path)
        if not self._path.is_file():
            raise NoFilesError(f"{self._path} does not exist.")
        try:
            items = _load_items(self._path, allow_pickle)
            arrays = [_sequence(self._path, i, item) for i, item in enumerate(items)]
        except FormatError:
            raise
        except (UnicodeDecodeError, EOFError, RecursionError, zlib.error, gzip.BadGzipFile, TypeError) as exc:
            # What damaged bytes make the decoders raise: the file's fault, so the library's error.
            raise FormatError(f"{self._path}: the file is damaged ({type(exc).__name__}: {exc}).") from None
        target = (
            parse_dtype(dtype)
            if dtype is not None
            else (np.result_type(*[a.dtype for a in arrays]) if arrays else np.dtype("float32"))
        )
        target = parse_dtype(np.float32 if target.kind == "b" else target)
        self._lengths = np.array([len(a) for a in arrays], dtype=np.int64)
        self._values = np.concatenate([a.astype(target) for a in arrays]) if arrays else np.zeros(0, target)
        self._values.flags.writeable = False

    @property
    def path(self) -> Path:
        return self._path

    @property
    def tokens(self) -> np.ndarray:
        return self._values

    def _offsets(self) -> np.ndarray:
        return offsets_from_lengths(self._lengths)


def _sequence(path: Path, index: int, item: Any) -> np.ndarray:
    if isinstance(item, dict):
        if "sequence" not in item:
            raise FormatError(f"{path}: item {index} is a dict without a 'sequence' key (keys: {sorted(item)[:8]}).")
        item = item["sequence"]
    if isinstance(item, np.ndarray):
        array = item
    else:  # parsed JSON or YAML: numbers only, checked before NumPy sees them (a string would widen the array)
        array = numbers(item, f"{path}: item {index}")
    if array.ndim == 0 or array.dtype.kind not in "iufb":
        raise FormatError(f"{path}: item {index} must be a list of numbers, found {type(item).__name__} {array.dtype}.")
    return array.reshape(-1) if array.ndim > 1 else array


def _load_items(path: Path, allow_pickle: bool) -> list[Any]:
    name = path.name.lower()
    if name.endswith((".json", ".jsonl")) and require_regular(path) > max_json_bytes():
        raise FormatError(
            f"{path} is {path.stat().st_size:,} bytes, more than the {max_json_bytes():,} bytes tokformats parses as "
            "JSON (set TOKFORMATS_MAX_JSON_BYTES to allow more)."
        )
    if name.endswith(".jsonl"):
        items = []
        with open(path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if line.strip():
                    try:
                        items.append(json.loads(line))
                    except json.JSONDecodeError as exc:
                        raise FormatError(f"{path}, line {number}: invalid JSON ({exc}).") from None
        return items
    if name.endswith(".json"):
        data = read_json(path)
        if not isinstance(data, list):
            raise FormatError(f"{path} must hold a JSON list of sequences, found {type(data).__name__}.")
        return data
    if name.endswith(".npy.gz"):
        size = require_regular(path)
        with gzip.open(path, "rb") as handle:
            budget = size * MAX_DEFLATE_RATIO
            return _array_items(path, read_npy(handle, str(path), budget=budget, allow_pickle=allow_pickle))
    if name.endswith(".npy"):
        size = require_regular(path)
        with open(path, "rb") as handle:
            return _array_items(path, read_npy(handle, str(path), budget=size, allow_pickle=allow_pickle))
    if name.endswith(".npz"):
        arrays = _npz_arrays(path, allow_pickle)
        if len(arrays) == 1 and arrays[0].ndim == 2:
            return list(arrays[0])
        return arrays
    if name.endswith((".pkl", ".pickle")):
        if not allow_pickle:
            raise UnsafePickleError(
                f"{path} is a pickle, and loading a pickle runs whatever code it names; pass allow_pickle=True "
                "only for files you trust."
            )
        import pickle

        objects = []
        with open(path, "rb") as handle:
            while True:
                try:
                    objects.append(pickle.load(handle))
                except EOFError:
                    break
        data = objects[0] if len(objects) == 1 else objects
        return _array_items(path, data) if isinstance(data, np.ndarray) else list(data)
    if name.endswith((".yaml", ".yml")):
        try:
            import yaml
        except ImportError:
            raise FormatError(f"{path}: reading YAML needs PyYAML (pip install pyyaml).") from None
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        if not isinstance(data, list):
            raise FormatError(f"{path} must hold a YAML list of sequences.")
        return data
    raise FormatError(f"{path}: unknown sequence file type; use .json, .jsonl, .npy, .npz, .npy.gz.")


def _npz_arrays(path: Path, allow_pickle: bool) -> list[np.ndarray]:
    """Every array of an ``.npz``, each header checked against what its zip entry can hold before reading."""
    require_regular(path)
    arrays = []
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if not info.filename.endswith(".npy"):
                    continue
                if info.compress_type == zipfile.ZIP_STORED:
                    budget = info.compress_size
                else:
                    budget = min(info.file_size, info.compress_size * MAX_DEFLATE_RATIO)
                with archive.open(info) as handle:
                    where = f"{path}[{info.filename}]"
                    arrays.append(read_npy(handle, where, budget=budget, allow_pickle=allow_pickle))
    except (
        zipfile.BadZipFile,
        zipfile.LargeZipFile,
        EOFError,
        OSError,
        zlib.error,
        NotImplementedError,  # an unsupported compression method
        RuntimeError,  # "File ... is encrypted": a flipped flag bit
    ) as exc:
        raise FormatError(f"{path}: not a readable .npz archive ({type(exc).__name__}: {exc}).") from None
    return arrays


def _array_items(path: Path, array: np.ndarray) -> list[Any]:
    if array.dtype == object:
        return list(array)
    if array.ndim == 1:
        return [array]
    if array.ndim == 2:
        return list(array)
    raise FormatError(f"{path}: a {array.ndim}-D array; expected one sequence (1-D) or one per row (2-D).")


def from_file(path: PathLike, *, allow_pickle: bool = False, dtype: npt.DTypeLike | None = None) -> SequenceFile:
    """Open a single-file sequence dataset (``.json``, ``.jsonl``, ``.npy``, ``.npz``, ``.npy.gz``).

    ``.pkl``/``.pickle`` files (and object arrays in ``.npy``) are refused unless ``allow_pickle=True``:
    unpickling runs code. ``.yaml`` is read when PyYAML is installed.
    """
    return SequenceFile(path, allow_pickle=allow_pickle, dtype=dtype)


Reader = SequenceFile  # the registry looks for ``Reader``
