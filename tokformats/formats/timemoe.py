"""Time-MoE / Time-300B binary sequence folders: ``meta.json`` + ``data-K-of-N.bin``.

Layout::

    my_dataset/
      meta.json            {"num_sequences": 2, "dtype": "float32",
                            "files": {"data-1-of-1.bin": 7},
                            "scales": [{"offset": 0, "length": 3},
                                       {"offset": 3, "length": 4, "mean": 1.5, "std": 0.5}]}
      data-1-of-N.bin ...  headerless arrays in ``dtype``, little-endian

``files`` counts **elements** per shard; shards are ordered numerically by the integer after the first
dash (``data-2-of-12`` before ``data-10-of-12``). ``offset`` is absolute in the concatenation of the
shards, so a sequence may span several. With both ``mean`` and ``std`` the stored values are normalised and
the reader returns ``x * std + mean`` (float32). Other keys of a scale (``id``) are kept as metadata.

Time-MoE's own reader (``BinaryDataset``) checks none of this; tokformats refuses a shard shorter than its
count, a sequence past the end of the data, ``num_sequences != len(scales)``, a shard name without an
integer index and a ``null`` mean or std. A tree of such folders opens as one corpus in sorted folder order
(Time-MoE walks it in ``os.walk`` order, which is not sorted and differs between machines).

:func:`windows` produces Time-MoE's training windows (``TimeMoEWindowDataset``) with the normalisation
computed once per sequence instead of once per window.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.arrays import ConcatenatedArray, GrowableArray, TokenArray
from ..core.documents import offsets_from_lengths
from ..core.dtypes import as_token_array, parse_dtype, resolve_dtype
from ..core.protocol import PathLike, TokenReader, TokenWriter, checked_position
from ..core.registry import FormatDescriptor, Probe
from ..errors import ConfigError, DTypeError, FormatError, HeaderError, NoFilesError, SizeMismatchError
from ..fs.names import safe_relative_name
from ..fs.untrusted import read_json_object
from ._shards import StreamShards

if TYPE_CHECKING:
    import numpy.typing as npt

    from ..core.files import LazyFiles

__all__ = [
    "Reader",
    "Writer",
    "Scales",
    "Windows",
    "windows",
    "from_file",
    "SequenceFile",
    "detect",
    "META",
    "MAX_SHARD_ELEMENTS",
]

#: This format's entry in :data:`tokformats.formats` (the registry finds it here).
DESCRIPTOR = FormatDescriptor(
    "timemoe", "Time-MoE / Time-300B folder: meta.json + data-K-of-N.bin", (), __name__, order=50
)

META = "meta.json"
#: Real Time-300B folders cut shards at 2**30 elements (4 GiB of float32).
MAX_SHARD_ELEMENTS = 1 << 30
_SHARD_NAME = re.compile(r"^data-(\d+)-of-(\d+)\.bin$")


def detect(probe: Probe) -> bool:
    """A folder holding ``meta.json`` and a ``.bin``, or a tree with such folders in it."""
    if not probe.is_dir:
        return False
    if META in probe.entries and any(name.endswith(".bin") for name in probe.entries):
        return True
    return bool(_dataset_folders(probe.path, limit=1))


def _is_dataset(folder: Path) -> bool:
    return (folder / META).is_file() and any(p.suffix == ".bin" and p.is_file() for p in folder.iterdir())


def _dataset_folders(root: Path, limit: int | None = None) -> list[Path]:
    """Folders under ``root`` (itself included) that are datasets, in sorted path order."""
    found: list[Path] = []
    for folder, subfolders, _ in os.walk(root):
        subfolders.sort()
        if _is_dataset(Path(folder)):
            found.append(Path(folder))
            if limit is not None and len(found) >= limit:
                break
    return sorted(found)


class Scales:
    """The per-sequence metadata of ``meta.json`` as columns (memory O(sequences) in NumPy, not dicts).

    ``offsets``, ``lengths`` (int64), ``means``, ``stds`` (float64, NaN where absent); ``scales[i]`` gives
    entry ``i`` as a dict like the one in ``meta.json`` (offsets global across a tree of folders).
    """

    def __init__(
        self,
        offsets: np.ndarray,
        lengths: np.ndarray,
        means: np.ndarray,
        stds: np.ndarray,
        extras: dict[str, list[Any]],
    ) -> None:
        self.offsets, self.lengths, self.means, self.stds, self.extras = offsets, lengths, means, stds, extras
        #: Whether each sequence is stored normalised (has both mean and std).
        self.normalized = ~(np.isnan(means) | np.isnan(stds))

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, index: int) -> dict[str, Any]:
        entry: dict[str, Any] = {"offset": int(self.offsets[index]), "length": int(self.lengths[index])}
        if not np.isnan(self.means[index]):
            entry["mean"] = float(self.means[index])
        if not np.isnan(self.stds[index]):
            entry["std"] = float(self.stds[index])
        for key, values in self.extras.items():
            if values[index] is not _MISSING:
                entry[key] = values[index]
        return entry

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (self[i] for i in range(len(self)))


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING: Any = _Missing()


def _read_meta(folder: Path) -> dict[str, Any]:
    path = folder / META
    try:
        meta = read_json_object(path, HeaderError)
    except FileNotFoundError:
        raise NoFilesError(f"{path} does not exist.") from None
    for key, kind in (("num_sequences", int), ("dtype", str), ("files", dict), ("scales", list)):
        if not isinstance(meta.get(key), kind):
            raise HeaderError(f"{path}: key {key!r} must be a {kind.__name__}, found {meta.get(key)!r:.80}.")
    return meta


def _remote_dataset_folders(remote: LazyFiles, root: Path) -> list[Path]:
    """The dataset folders of a tree opened by URL: those whose ``meta.json`` (fetched at open) has ``.bin`` files
    beside it in the listing."""
    names = remote.names(root)
    folders = {(remote.folder / n).parent for n in names if Path(n).name == META}
    return sorted(f for f in folders if (f / META).is_file() and any(p.parent == f for p in remote.paths(".bin", f)))


def _shards(
    folder: Path, meta: dict[str, Any], dtype: np.dtype, remote: LazyFiles | None = None
) -> list[tuple[Path, int]]:
    """``(path, elements)`` of each shard in numeric order, checked against the files on disk (for a dataset opened
    by URL, against its listing; the download is checked against the size ``meta.json`` gives)."""
    entries = []
    for name, count in meta["files"].items():
        parts = name.split("-")
        try:
            index = int(parts[1])
        except (IndexError, ValueError):
            raise HeaderError(
                f"{folder / META}: shard name {name!r} has no integer index after the first dash "
                "(expected data-K-of-N.bin)."
            ) from None
        if not isinstance(count, int) or count < 0:
            raise HeaderError(f"{folder / META}: files[{name!r}] must be a non-negative element count, not {count!r}.")
        path = folder / safe_relative_name(name, where=f"{folder / META}: files", folder=folder)
        if remote is not None:
            if not remote.has(path):
                raise NoFilesError(f"{path} is listed in {META} but {remote.url} has no such file.")
            remote.expect(path, count * dtype.itemsize)
            entries.append((index, name, path, count))
            continue
        if not path.is_file():
            raise NoFilesError(f"{path} is listed in {META} but does not exist.")
        size = path.stat().st_size
        if size != count * dtype.itemsize:
            detail = "shorter" if size < count * dtype.itemsize else "longer"
            raise SizeMismatchError(
                f"{path}: {META} says {count:,} {dtype.name} elements ({count * dtype.itemsize:,} bytes), "
                f"but the file has {size:,} bytes ({detail})."
            )
        entries.append((index, name, path, count))
    entries.sort(key=lambda e: (e[0], e[1]))
    return [(path, count) for _, _, path, count in entries]


def _scale_columns(folder: Path, meta: dict[str, Any], base: int, total: int) -> Scales:
    scales = meta["scales"]
    where = folder / META
    if meta["num_sequences"] != len(scales):
        raise HeaderError(
            f"{where}: num_sequences is {meta['num_sequences']:,} but scales has {len(scales):,} entries."
        )
    count = len(scales)
    try:
        offsets, lengths, means, stds, extras = _columns_fast(scales)
    except (KeyError, TypeError, ValueError, OverflowError, AttributeError):
        offsets, lengths, means, stds, extras = _columns_checked(where, scales)
    if count:
        # lengths > total - offsets, not offsets + lengths > total: the sum overflows int64 for lying offsets.
        bad = (offsets < 0) | (lengths < 0) | (offsets > total) | (lengths > total - offsets)
        if bad.any():
            i = int(np.argmax(bad))
            raise SizeMismatchError(
                f"{where}: scales[{i}] (offset {int(offsets[i]):,}, length {int(lengths[i]):,}) runs outside the "
                f"{total:,} elements of the data files."
            )
    return Scales(offsets + base, lengths, means, stds, extras)


_KNOWN_KEYS = frozenset(("offset", "length", "mean", "std"))


def _columns_fast(scales: list[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, list[Any]]]:
    """Scale columns by C-level loops (a million scales in well under a second); raises on any odd entry,
    and the caller then runs :func:`_columns_checked` for a precise message."""
    integers = []
    for key in ("offset", "length"):
        values = [entry[key] for entry in scales]
        if not all(type(v) is int for v in values):  # 1.5 or true would be cast silently by NumPy
            raise TypeError(key)
        integers.append(np.array(values, dtype=np.int64))
    offsets, lengths = integers
    columns = []
    for key in ("mean", "std"):
        values = [entry.get(key, np.nan) for entry in scales]
        if not all(type(v) in (float, int) for v in values):  # None (null) or a string: the checked path says which
            raise TypeError(key)
        columns.append(np.array(values, dtype=np.float64))
    names = set().union(*map(dict.keys, scales)) - _KNOWN_KEYS if scales else set()
    extras = {key: [entry.get(key, _MISSING) for entry in scales] for key in sorted(names)}
    return offsets, lengths, columns[0], columns[1], extras


def _columns_checked(
    where: Path, scales: list[Any]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, list[Any]]]:
    """Scale columns entry by entry, naming the first entry that is not what Time-MoE writes."""
    count = len(scales)
    offsets = np.empty(count, dtype=np.int64)
    lengths = np.empty(count, dtype=np.int64)
    means = np.full(count, np.nan)
    stds = np.full(count, np.nan)
    extras: dict[str, list[Any]] = {}
    for i, entry in enumerate(scales):
        if not isinstance(entry, dict):
            raise HeaderError(f"{where}: scales[{i}] must be an object, found {entry!r:.80}.")
        try:
            if not all(isinstance(entry[k], int) and not isinstance(entry[k], bool) for k in ("offset", "length")):
                raise TypeError
            offsets[i] = entry["offset"]
            lengths[i] = entry["length"]
        except (KeyError, TypeError, ValueError, OverflowError):
            raise HeaderError(
                f"{where}: scales[{i}] needs integer 'offset' and 'length', found {entry!r:.120}."
            ) from None
        for key, column in (("mean", means), ("std", stds)):
            if key in entry:
                value = entry[key]
                if not isinstance(value, (int, float)) or isinstance(value, bool):
                    raise HeaderError(f"{where}: scales[{i}][{key!r}] is {value!r}; it must be a number.")
                column[i] = value
        for key in entry.keys() - _KNOWN_KEYS:
            extras.setdefault(key, [_MISSING] * count)[i] = entry[key]
    return offsets, lengths, means, stds, extras


def denormalized(values: np.ndarray, std: float, mean: float) -> np.ndarray:
    """Time-MoE's ``sequence * std + mean`` with Python floats, so NumPy's promotion decides as it does there:
    float16/32/64 data stays in its own dtype (the floats are rounded to it), integer data becomes float64."""
    return values * std + mean


def remote_lazy(folder: Path, names: list[str]) -> bool:
    """Whether a folder opened by URL can fetch its shards on first use: ``meta.json`` gives every shard's size and
    every sequence's place."""
    return any(Path(n).name == META for n in names) and any(n.endswith(".bin") for n in names)


#: The index a folder URL is read from, and uploaded last by ``publish``.
REMOTE_INDEX = (META,)
PUBLISHED_LAST = (META,)


def remote_files(folder: Path) -> list[dict[str, Any]]:
    """The shards ``meta.json`` lists, with their sizes (elements times the dtype's size)."""
    meta = read_json_object(folder / META)
    try:
        itemsize = np.dtype(str(meta.get("dtype"))).itemsize
    except TypeError:
        itemsize = 0
    files = meta.get("files")
    listed: dict[str, Any] = files if isinstance(files, dict) else {}
    for name, count in listed.items():
        if type(count) is not int or count < 0:
            raise HeaderError(f"{folder / META}: files[{name!r:.80}] must be a non-negative element count, not "
                              f"{count!r:.40}.")  # fmt: skip
    return [{"name": name, "size": count * itemsize if itemsize else None} for name, count in listed.items()]


class Reader(TokenReader):
    """A Time-MoE sequence folder (or a tree of them), memory-mapped.

    Args:
        path: a folder holding ``meta.json``, or a folder whose subfolders hold such datasets.
        denormalize: return ``x * std + mean`` for sequences stored normalised (default), else stored values.
        remote: set by ``tokformats.open(URL)``: the dataset's files, each shard fetched on first use.

    ``r[i]`` is sequence ``i``: a view when it lies in one shard and needs no de-normalisation, otherwise
    one copy.
    """

    format = "timemoe"

    def __init__(self, path: PathLike, *, denormalize: bool = True, remote: LazyFiles | None = None) -> None:
        super().__init__(path, denormalize=denormalize, remote=remote)
        self._path = Path(path)
        self._remote = remote
        if not self._path.is_dir():
            raise NoFilesError(f"{self._path} is not a folder.")
        self.folders = _dataset_folders(self._path) if remote is None else _remote_dataset_folders(remote, self._path)
        if not self.folders:
            raise NoFilesError(f"{self._path} holds no {META} with .bin files beside it.")
        self.denormalize = denormalize
        shards: list[tuple[Path, int]] = []
        columns: list[Scales] = []
        dtypes: list[np.dtype] = []
        base = 0
        for folder in self.folders:
            meta = _read_meta(folder)
            try:
                folder_dtype = parse_dtype(meta["dtype"], what=f"{folder / META}: dtype")
            except DTypeError as exc:
                raise HeaderError(str(exc)) from None
            if dtypes and folder_dtype != dtypes[0]:
                raise DTypeError(
                    f"{folder}: dtype {folder_dtype.name} differs from {self.folders[0]}'s {dtypes[0].name}."
                )
            dtypes.append(folder_dtype)
            folder_shards = _shards(folder, meta, folder_dtype, remote)
            total = sum(count for _, count in folder_shards)
            columns.append(_scale_columns(folder, meta, base, total))
            shards.extend(folder_shards)
            base += total
        self._dtype = dtypes[0]  # self.folders is not empty
        self._shard_list = shards
        self.scales = _concatenate_scales(columns)
        self._total = base
        if remote is None:  # a dataset opened by URL pins each shard as it arrives
            self._pin(*(p for p, _ in shards))
        self.tokens  # noqa: B018 - map now: what was validated is what is read

    @property
    def path(self) -> Path:
        return self._path

    @property
    def files(self) -> list[Path]:
        return [folder / META for folder in self.folders] + [p for p, _ in self._shard_list]

    @cached_property
    def tokens(self) -> TokenArray:
        """Every shard's stored values, in numeric shard order (folders in sorted order)."""
        parts: list[Any] = [self._map_lazily(p, self._dtype, 0, n) for p, n in self._shard_list]
        parts = parts or [np.zeros(0, self._dtype)]
        return parts[0] if len(parts) == 1 else ConcatenatedArray(parts)

    def _data_files(self) -> list[Path]:
        return [p for p, _ in self._shard_list]

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def num_tokens(self) -> int:
        return self._total

    def __len__(self) -> int:
        return len(self.scales)

    @cached_property
    def lengths(self) -> np.ndarray:
        lengths = self.scales.lengths.copy()
        lengths.flags.writeable = False
        return lengths

    def _offsets(self) -> np.ndarray:
        offsets = offsets_from_lengths(self.scales.lengths)
        # An empty sequence may sit anywhere (the writer puts a trailing one on the last value, where Time-MoE
        # finds it): only the others must tile the data.
        stored = self.scales.lengths > 0
        if not np.array_equal(offsets[:-1][stored], self.scales.offsets[stored]):
            raise FormatError(
                f"{self._path}: the sequences do not tile the data contiguously, so they have no flat document "
                "offsets; use r[i] or r.scales."
            )
        return offsets

    def stored(self, index: int) -> np.ndarray:
        """Sequence ``index`` as stored (normalised if it has mean/std)."""
        start = int(self.scales.offsets[index])
        return self._view[start : start + int(self.scales.lengths[index])]

    def _item(self, index: int) -> np.ndarray:
        values = self.stored(index)
        if self.denormalize and self.scales.normalized[index]:
            return denormalized(values, self.scales.stds.item(index), self.scales.means.item(index))
        return values

    @property
    def metadata(self) -> dict[str, Any]:
        return {
            "folders": [str(f) for f in self.folders],
            "shards": [{"path": str(p), "elements": n} for p, n in self._shard_list],
            "sequences": len(self.scales),
            "normalized_sequences": int(self.scales.normalized.sum()),
            "denormalize": self.denormalize,
        }


def _concatenate_scales(columns: list[Scales]) -> Scales:
    if len(columns) == 1:
        return columns[0]
    counts = [len(c) for c in columns]
    keys = {k for c in columns for k in c.extras}
    extras = {k: [v for c, n in zip(columns, counts) for v in c.extras.get(k, [_MISSING] * n)] for k in keys}
    return Scales(
        np.concatenate([c.offsets for c in columns]),
        np.concatenate([c.lengths for c in columns]),
        np.concatenate([c.means for c in columns]),
        np.concatenate([c.stds for c in columns]),
        extras,
    )


class Windows:
    """Time-MoE's training windows over a sequence reader (``TimeMoEWindowDataset``), with random access.

    Sequences shorter than 2 values are skipped. Window starts are ``0, S, 2S, ...`` while
    ``start <= L - W - 1`` (``W = context_length + prediction_length``, ``S = stride``, default ``W``); each
    window takes ``W + 1`` values as float32: ``input_ids = w[:-1]``, ``labels = w[1:]``. Only the first window of a
    sequence with ``L <= W`` is short: right-padded with zeros, ``loss_masks`` ``L - 1`` ones then zeros.

    ``normalization`` (``"zero"``: ``(x - mean) / std`` with population std, or ``x - mean`` when std is 0;
    ``"max"``: ``x / max(|x|)``, unchanged when that is 0; ``None``) uses statistics of the whole sequence,
    computed once per sequence in float32 and cached, so a window reads only its own ``W + 1`` values.

    ``transform`` (a callable taking a sequence's values and returning as many) replaces ``normalization``, as a
    callable ``normalization_method`` does in Time-MoE's ``TimeMoEDataset``: it is applied to the whole sequence
    before windowing (the last transformed sequence is kept, so consecutive windows transform it once).
    """

    def __init__(
        self,
        reader: TokenReader,
        context_length: int,
        prediction_length: int = 0,
        stride: int | None = None,
        normalization: str | None = "zero",
        transform: Callable[[np.ndarray], npt.ArrayLike] | None = None,
    ) -> None:
        if transform is not None:
            if not callable(transform):
                raise ConfigError(f"transform must be a callable, not {type(transform).__name__}.")
            normalization = None
        if context_length <= 0 or prediction_length < 0:
            raise ValueError(
                f"need context_length > 0 and prediction_length >= 0, got {context_length}, {prediction_length}"
            )
        if normalization not in ("zero", "max", None):
            raise ValueError(f"normalization must be 'zero', 'max' or None, not {normalization!r}")
        self.reader = reader
        self.window = context_length + prediction_length
        if stride is not None and (isinstance(stride, bool) or int(stride) != stride or stride <= 0):
            raise ConfigError(
                f"stride must be a positive number of values, found {stride!r}; pass stride=None for the window "
                f"length ({self.window}), which is what Time-MoE makes of 0."
            )
        self.stride = int(stride) if stride is not None else self.window
        self.normalization = normalization
        self.transform = transform
        self._transformed: tuple[int, np.ndarray] | None = None
        lengths = np.asarray(reader.lengths, dtype=np.int64)
        counts = np.where(lengths < 2, 0, 1 + np.maximum(0, (lengths - self.window - 1) // self.stride))
        #: ``ends[i]`` is the number of windows of sequences ``0..i``.
        self.ends = np.cumsum(counts)
        self._count = int(self.ends[-1]) if len(self.ends) else 0
        # Per-sequence statistics, filled on first use: (shift, scale) with normalised = (x - shift) / scale.
        self._known = bytearray(len(lengths))
        # Time-MoE normalises a sequence in the dtype BinaryDataset returns (float64 data in float64, ...) and
        # casts the window to float32 afterwards; integer data it would truncate back to integers, so it is
        # normalised in float32 here instead.
        stored = np.dtype(reader.dtype).newbyteorder("=")
        self._work = stored if stored.kind == "f" else np.dtype(np.float32)
        self._shift = np.zeros(len(lengths), dtype=self._work)
        self._scale = np.ones(len(lengths), dtype=self._work)
        self._mask = np.ones(self.window, dtype=np.int32)
        # For a folder reader, windows read only their own W + 1 stored values (no whole-sequence read).
        self._folder = reader if isinstance(reader, Reader) else None

    def __len__(self) -> int:
        return self._count

    def locate(self, index: int) -> tuple[int, int]:
        """``(sequence, start)`` of window ``index``."""
        sequence = self.ends.searchsorted(index, side="right").item()
        before = self.ends.item(sequence - 1) if sequence else 0
        return sequence, (index - before) * self.stride

    def _statistics(self, sequence: int) -> tuple[np.float32, np.float32]:
        """(shift, scale) such that the normalised sequence is ``(x - shift) / scale``; computed once.

        A zero std (or max) is stored as a scale of 1: dividing by 1 leaves float32 values exactly as they are,
        which is Time-MoE's "x - mean" (or "unchanged") case. The reductions are NumPy's float32 ones over the
        whole sequence, as Time-MoE computes them, so the results are the same bits.
        """
        if not self._known[sequence]:
            values = np.asarray(self.reader[sequence], dtype=self._work)
            if self.normalization == "zero":
                mean, std = _mean_std(values)
                self._shift[sequence], self._scale[sequence] = mean, (std if std != 0 else 1)
            elif len(values):
                top = np.abs(values).max()
                self._scale[sequence] = top if top != 0 else 1
            self._known[sequence] = 1
        return self._shift[sequence], self._scale[sequence]

    def _values(self, sequence: int, start: int, stop: int) -> np.ndarray:
        """A fresh copy of the sequence's values ``start:stop`` in the working dtype (de-normalised like the
        reader's, with the same arithmetic)."""
        folder = self._folder
        if folder is None:
            return np.array(self.reader[sequence][start:stop], dtype=self._work)
        scales = folder.scales
        first = scales.offsets.item(sequence)
        stop = min(stop, scales.lengths.item(sequence))
        stored = folder._view[first + start : first + stop]
        if folder.denormalize and scales.normalized[sequence]:
            stored = denormalized(stored, scales.stds.item(sequence), scales.means.item(sequence))
        return np.array(stored, dtype=self._work)

    def _transformed_values(self, sequence: int, start: int, stop: int) -> np.ndarray:
        """Values ``start:stop`` of ``transform(sequence)``, as float32 (Time-MoE casts the window)."""
        if self._transformed is None or self._transformed[0] != sequence:
            transform = self.transform
            if transform is None:
                raise ValueError("these windows have no transform")
            whole = np.array(self.reader[sequence])  # a writable copy, as Time-MoE hands its callable
            result = np.asarray(transform(whole))
            if result.shape != whole.shape:
                raise ConfigError(
                    f"transform returned shape {result.shape} for sequence {sequence} of shape {whole.shape}; "
                    "it must return one value per value."
                )
            self._transformed = (sequence, result)
        return np.array(self._transformed[1][start:stop], dtype=np.float32)

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        index = checked_position(index, self._count, "window", "windows")
        sequence, start = self.locate(index)
        if self.transform is not None:
            values = self._transformed_values(sequence, start, start + self.window + 1)
        else:
            values = self._values(sequence, start, start + self.window + 1)
        if self.normalization is not None:
            # Elementwise (in place on our own copy), so normalising W + 1 values gives the same bits as
            # normalising the whole sequence first.
            if not self._known[sequence]:
                self._statistics(sequence)
            values -= self._shift[sequence]
            values /= self._scale[sequence]
        values = values.astype(np.float32, copy=False)  # Time-MoE's window cast
        mask = self._mask.copy()
        short = self.window + 1 - len(values)
        if short > 0:
            mask[len(values) - 1 :] = 0
            values = np.concatenate([values, np.zeros(short, dtype=np.float32)])
        return {"input_ids": values[:-1], "labels": values[1:], "loss_masks": mask}

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        for i in range(len(self)):
            yield self[i]


def _mean_std(values: np.ndarray) -> tuple[Any, Any]:
    """``values.mean()`` and ``values.std()``, bit for bit as NumPy computes them. For float32 (pairwise float32
    sums; the variance as the mean of squared deviations) with one pass fewer: NumPy's ``std`` sums the values
    again to get the mean it subtracts. Other dtypes go through NumPy itself."""
    count = len(values)
    if values.dtype != np.float32:
        if count == 0:
            return values.dtype.type(np.nan), values.dtype.type(np.nan)
        return values.mean(), values.std()
    if count == 0:
        return np.float32(np.nan), np.float32(np.nan)
    mean = np.float32(np.add.reduce(values, dtype=np.float32) / count)
    deviations = values - mean
    np.multiply(deviations, deviations, out=deviations)
    variance = np.float32(np.add.reduce(deviations, dtype=np.float32) / count)
    return mean, np.sqrt(variance)


def windows(
    reader: TokenReader,
    context_length: int,
    prediction_length: int = 0,
    stride: int | None = None,
    normalization: str | None = "zero",
    transform: Callable[[np.ndarray], npt.ArrayLike] | None = None,
) -> Windows:
    """Time-MoE's training windows over ``reader`` (see :class:`Windows`); usable through ``tokformats.torch``."""
    return Windows(reader, context_length, prediction_length, stride, normalization, transform)


class Writer(TokenWriter):
    """Writes a Time-MoE folder: ``data-K-of-N.bin`` shards and a one-line ``meta.json``.

    Args:
        path: the folder.
        dtype: any numeric dtype (default float32, as every Time-300B folder; with ``vocab_size`` and no
            ``dtype``, the smallest unsigned dtype that holds the ids).
        vocab_size: for integer dtypes, values must be below it.
        max_shard_elements: shard size in elements (default 2**30, as real Time-300B folders).
        overwrite: replace an existing dataset (its shards and meta.json).

    ``write(series, mean=, std=, id=)``: ``series`` holds the original values; with ``mean`` and ``std`` it is
    stored as ``(series - mean) / std`` and the reader returns ``stored * std + mean``. Pass
    ``normalized=True`` when ``series`` is already normalised. ``write_batch`` adds many sequences without scales.
    Shard names need N, known only at commit, so shards are written as temporaries and named at the end;
    K is zero-padded to the width of N so that text order and numeric order agree.
    """

    format = "timemoe"

    def __init__(
        self,
        path: PathLike,
        *,
        dtype: npt.DTypeLike | None = None,
        vocab_size: int | None = None,
        max_shard_elements: int = MAX_SHARD_ELEMENTS,
        overwrite: bool = False,
    ) -> None:
        # float32 for series (every Time-300B folder); token ids (a vocab_size given) get the smallest that fits
        chosen = resolve_dtype(dtype, vocab_size, format=self.format, default="float32")
        super().__init__(path, dtype=chosen, vocab_size=vocab_size, overwrite=overwrite)
        if max_shard_elements <= 0:
            raise ValueError(f"max_shard_elements must be positive, not {max_shard_elements}")
        self.max_shard_elements = max_shard_elements
        meta = self.path / META
        self._files.check_destination(meta)
        if overwrite and self.path.is_dir():
            folder = self.path
            self._files.remove_on_commit(lambda: [p for p in folder.iterdir() if _SHARD_NAME.match(p.name)] + [meta])
        # The scales as columns (not a dict per sequence): offset, length, mean and std (NaN: none), and the
        # few ids by sequence number.
        self._offsets = GrowableArray(np.int64)
        self._lengths = GrowableArray(np.int64)
        self._means = GrowableArray(np.float64)
        self._stds = GrowableArray(np.float64)
        self._ids: dict[int, Any] = {}
        self._offset = 0
        self._shard_sizes: list[int] = []
        # Provisional shard names; the real ones (data-K-of-N.bin) are given at commit, when N is known.
        self._shards = StreamShards(max_shard_elements, self._start_shard, self._end_shard)

    def write(
        self,
        series: npt.ArrayLike,
        loss_mask: npt.ArrayLike | None = None,
        *,
        mean: float | None = None,
        std: float | None = None,
        id: Any = None,
        normalized: bool = False,
    ) -> None:
        """Append one sequence, optionally with ``mean``/``std`` (both or neither) and an ``id`` (Time-MoE stores no
        loss mask: a ``loss_mask`` is refused)."""
        self._check_open()
        values = as_token_array(series, what="a series")
        self._checked_mask(loss_mask, values, np.array([len(values)], dtype=np.int64))
        if (mean is None) != (std is None):
            raise FormatError(f"{self.path}: pass both mean= and std=, or neither (sequence {self.num_documents}).")
        if mean is not None and std is not None:
            self._check_scale(mean, std)
        if mean is not None and std is not None and not normalized:
            values = (np.asarray(values, dtype=np.float64) - mean) / std
        flat = self._validated(values, None)
        if id is not None:
            self._ids[len(self._offsets)] = id
        self._offsets.append(self._offset)
        self._lengths.append(len(flat))
        self._means.append(np.nan if mean is None else float(mean))
        self._stds.append(np.nan if std is None else float(std))
        self._store(flat)
        self.num_documents += 1
        self.num_tokens += len(flat)

    def _check_scale(self, mean: float, std: float) -> None:
        """A scale the reader can undo: finite, and a std that is not 0 (the stored values would be ``x / 0``)."""
        if not (np.isfinite(mean) and np.isfinite(std)) or std == 0:
            raise FormatError(
                f"{self.path}: sequence {self.num_documents} has mean={mean!r}, std={std!r}; a stored sequence is "
                "(x - mean) / std, so both must be finite and std non-zero (for a constant series pass std=1.0)."
            )

    def write_scaled_batch(
        self, flat: npt.ArrayLike, lengths: npt.ArrayLike, means: npt.ArrayLike, stds: npt.ArrayLike
    ) -> None:
        """Append sequences stored as they are (already normalised) with their ``means`` and ``stds`` (NaN: a
        sequence without scales; both or neither): what ``convert`` uses to carry a Time-MoE folder's scales."""
        self._check_open()
        means, stds = np.asarray(means, dtype=np.float64), np.asarray(stds, dtype=np.float64)
        count = len(np.asarray(lengths))
        if means.shape != (count,) or stds.shape != (count,) or (np.isnan(means) != np.isnan(stds)).any():
            raise FormatError(
                f"{self.path}: write_scaled_batch needs one mean and one std per sequence (both NaN or neither), "
                f"found {means.shape[0] if means.ndim else 0} means and {stds.shape[0] if stds.ndim else 0} stds "
                f"for {count} sequences."
            )
        first = len(self._means)
        self.write_batch(flat, lengths)
        self._means.view()[first:] = means
        self._stds.view()[first:] = stds

    def _write_tokens(self, flat: np.ndarray, lengths: np.ndarray) -> None:
        starts = self._offset + offsets_from_lengths(lengths)[:-1]
        self._offsets.extend(starts)
        self._lengths.extend(lengths)
        self._means.extend(np.full(len(lengths), np.nan))
        self._stds.extend(np.full(len(lengths), np.nan))
        self._store(flat)

    def _store(self, flat: np.ndarray) -> None:
        self._shards.write(flat)
        self._offset += len(flat)

    def _start_shard(self, index: int) -> Any:
        return self._files.create(self.path / f"data-{index + 1}-of-0.bin")

    def _end_shard(self, handle: Any, elements: int) -> None:
        self._shard_sizes.append(elements)
        self._files.finish(handle)

    def _finish(self) -> None:
        # An empty dataset still has one (empty) shard: Time-MoE recognises a folder by its .bin files.
        self._shards.finish()
        total = len(self._shard_sizes)
        width = len(str(total))
        files = {}
        for k, size in enumerate(self._shard_sizes, start=1):
            # K is zero-padded to N's width (data-01-of-12): readers that sort names as text (some Time-MoE
            # versions) and readers that sort by the number then agree on the order.
            name = f"data-{k:0{width}d}-of-{total}.bin"
            self._files.retarget(self.path / f"data-{k}-of-0.bin", self.path / name)
            files[name] = size
        handle = self._files.create(self.path / META)  # last: meta.json means the folder is complete
        for piece in self._meta_json(files):
            handle.write(piece.encode("utf-8"))

    def _meta_json(self, files: dict[str, int]) -> Iterator[str]:
        """``json.dumps(meta)`` in pieces, one sequence's scale at a time (the author's converter writes the same
        bytes), so that no list of a million dicts is ever built."""
        head = json.dumps({"num_sequences": len(self._offsets), "dtype": self.dtype.name, "files": files})
        yield head[:-1] + ', "scales": ['
        offsets, lengths = self._offsets.view().tolist(), self._lengths.view().tolist()
        # Time-MoE's BinaryDataset finds a sequence by the file its offset falls in: an empty sequence at the very
        # end (offset == every value) falls in none and fails ("need at least one array to concatenate"). It is
        # placed on the last value instead, which Time-MoE reads as empty as well (nothing else changes).
        end = self._offset
        offsets = [o if length or o < end or not end else end - 1 for o, length in zip(offsets, lengths)]
        means, stds = self._means.view(), self._stds.view()
        for k in range(len(offsets)):
            entry: dict[str, Any] = {"offset": offsets[k]}
            if not np.isnan(means[k]):
                entry["mean"], entry["std"] = float(means[k]), float(stds[k])
            entry["length"] = lengths[k]
            if k in self._ids:
                entry["id"] = self._ids[k]
            yield (", " if k else "") + json.dumps(entry)
        yield "]}"


# Single-file sequence datasets (Time-MoE's GeneralDataset) are their own read-only format; the function
# lives here too because Time-MoE users look for it here: ``tokformats.timemoe.from_file``.
from .sequences import SequenceFile, from_file  # noqa: E402
