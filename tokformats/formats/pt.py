"""PyTorch ``.pt`` token shards, and NeuroShard-style folders of them, read and written without torch.

A ``.pt`` file is what ``torch.save(torch.tensor(ids))`` writes: a zip archive (``PREFIX/data.pkl``,
``PREFIX/data/0``, ``PREFIX/version``, ...; records 64-byte aligned and uncompressed) or, before torch 1.6,
the legacy pickle stream. :mod:`tokformats.torchfile` parses both with an allow-list unpickler that
never runs pickled code, and memory-maps the tensor's storage.

A shard folder (NeuroShard Genesis layout)::

    shards/
      manifest.json      {"total_shards", "total_tokens", "total_size_bytes", "tokenizer_version",
                          "sources": {name: {"shards", "tokens", "documents_processed", "last_shard_id"}},
                          "created_at", "updated_at"}
      checkpoints.json   {source: {"documents_processed", "last_shard_id", "leftover_tokens", "timestamp"}}
      tokenizer.json     optional: the tokenizer that produced the ids
      shard_0.pt, shard_1.pt, ...   1-D int64 tensors of exactly ``tokens_per_shard`` tokens

Loss masks (optional) are bool tensors beside the tokens, one per token: ``NAME.loss_mask.pt`` beside ``NAME.pt``,
and in a folder ``shard_N.loss_mask.pt`` beside each ``shard_N.pt`` (cut at the same places; not listed in the
manifest, whose shard list stays Genesis's). A masked source's checkpoint also records ``"leftover_loss_mask"``
(0/1, parallel to ``leftover_tokens``), so that a resumed run continues the masks exactly as it continues the
tokens; each mask shard is committed with its shard.

The packer concatenates documents and cuts fixed-size shards; the tail that does not fill a shard is
kept as ``leftover_tokens`` so that a resumed run continues exactly where the last one stopped.
Nodes pick their shards with :func:`assigned_shards`. Timestamps are ISO-8601 UTC with a ``Z``.
tokformats adds ``"document_delimiter": {"eos": ID}`` to the manifest when the documents it packed end with
an id, so that the reader splits them back by default (without it, each shard reads as one document).
"""

from __future__ import annotations

import functools
import json
import re
from datetime import datetime, timezone
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.arrays import ConcatenatedArray, LazyArray, TokenArray, map_file
from ..core.documents import add_delimiter, split_offsets
from ..core.dtypes import check_id, check_tokens, resolve_dtype
from ..core.protocol import PathLike, TokenReader, TokenWriter, checked_delimiters
from ..core.registry import FormatDescriptor, Probe
from ..errors import DTypeError, FormatError, NoFilesError, OutputExistsError, option
from ..fs.atomic import AtomicFiles
from ..fs.untrusted import numbers, read_json_object, require_regular
from . import _torchfile as torchfile
from ._shards import StreamShards

if TYPE_CHECKING:
    import numpy.typing as npt

    from ..core.files import LazyFiles

__all__ = [
    "Reader",
    "FileReader",
    "FolderReader",
    "Writer",
    "FileWriter",
    "FolderWriter",
    "save",
    "load",
    "assigned_shards",
    "read_manifest",
    "shard_files",
    "detect",
    "TOKENS_PER_SHARD",
    "SHARD_PATTERN",
]

#: This format's entry in :data:`tokformats.formats` (the registry finds it here).
DESCRIPTOR = FormatDescriptor(
    "pt", "PyTorch .pt token shards, or a folder of shard_N.pt + manifest.json", (".pt",), __name__, order=40
)

TOKENS_PER_SHARD = 2_500_000
SHARD_PATTERN = re.compile(r"^shard_(\d+)\.pt$")
#: Replaces ``.pt`` in a token file's name to name its loss-mask file.
LOSS_MASK_SUFFIX = ".loss_mask.pt"


def loss_mask_path(path: Path) -> Path:
    """``NAME.loss_mask.pt`` beside ``NAME.pt``: its loss mask, a bool tensor as long as the tokens."""
    return path.with_name(path.name[: -len(".pt")] + LOSS_MASK_SUFFIX)


def _mask_tensor(path: Path, count: int) -> np.ndarray:
    """The loss-mask tensor in ``path`` as uint8, checked to hold ``count`` 0/1 values."""
    array, _, _ = _tensor_of(path, torchfile.load(path), None)
    flat = _flat(path, array)
    if flat.dtype not in (np.dtype("?"), np.dtype("u1")) or len(flat) != count:
        raise FormatError(
            f"{path}: a loss mask is a bool tensor of one value per token ({count:,}); found {flat.dtype.name} with "
            f"{len(flat):,} values."
        )
    return flat.view(np.uint8)
MANIFEST = "manifest.json"
#: The Genesis manifest version whose fields the writer records (``shards`` with a SHA-256 per file).
MANIFEST_VERSION = 3
CHECKPOINTS = "checkpoints.json"
#: The key of a masked source's checkpoint holding its leftover tokens' loss mask (0/1, parallel to the tokens).
LEFTOVER_MASK = "leftover_loss_mask"
#: The manifest key where tokformats records how documents are delimited (``{"eos": 0}``): Genesis readers ignore
#: it, and the folder reads back by document without ``eos=``.
DELIMITER_KEY = "document_delimiter"
TOKENIZER = "tokenizer.json"
#: dtypes the writers store (torch has tensor types for each).
WRITABLE = ("int64", "int32", "uint16", "uint32", "int16", "uint8", "uint64", "float32", "float64")

save = torchfile.save
load = torchfile.load


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes, read in 1 MiB pieces."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def utc_now() -> str:
    """Now as ISO-8601 UTC with a ``Z`` suffix, to the second."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def assigned_shards(node_id: str, num_shards: int, count: int = 10) -> list[int]:
    """The shards node ``node_id`` takes, as NeuroShard Genesis assigns them.

    ``h = int(sha256(node_id).hexdigest(), 16)``; the primary shard is ``h % num_shards`` and the next ones
    follow round-robin: ``[(h + i) % num_shards for i in range(count)]``. ``count`` is capped at
    ``num_shards`` so that no shard is listed twice.
    """
    if num_shards <= 0:
        raise ValueError(f"num_shards must be positive, not {num_shards}")
    import hashlib  # here, not at import time: hashlib's OpenSSL binding costs milliseconds to load

    digest = int(hashlib.sha256(node_id.encode("utf-8")).hexdigest(), 16)
    return [(digest + i) % num_shards for i in range(min(count, num_shards))]


def shard_files(folder: Path) -> list[tuple[int, Path]]:
    """``(index, path)`` of every ``shard_N.pt`` in ``folder``, in numeric order."""
    found = []
    for path in folder.iterdir():
        match = SHARD_PATTERN.match(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)


def _named_shards(folder: Path, manifest: dict[str, Any] | None) -> list[tuple[int, Path]]:
    """The shards a folder's dataset consists of: those its manifest names (``shards``, else ``total_shards``), each
    required, in numeric order; only a folder without a manifest is listed. Files the manifest does not name (a
    racing or killed writer's) are not read, and a named one that is missing or unreadable is an error, never a
    smaller dataset."""
    if manifest is None:
        return shard_files(folder)
    total = manifest.get("total_shards")
    if manifest.get("shards") is None and total is None:
        return shard_files(folder)  # a manifest that names no shards at all (not one tokformats or Genesis writes)
    if total is not None and (not isinstance(total, int) or isinstance(total, bool) or total < 0):
        raise FormatError(f"{folder / MANIFEST}: total_shards is {total!r}; it must be a whole number.")
    held = sum(1 for _ in folder.iterdir())
    if total is not None and total > held:  # checked before naming them: a lying count allocates nothing
        raise NoFilesError(f"{folder / MANIFEST} names {total:,} shards, but the folder holds {held:,} files.")
    # shard_0 ... shard_{total_shards - 1}, and any the v3 list names (a resumed older folder lists only new ones)
    names = {f"shard_{k}.pt" for k in range(total or 0)}
    names.update(entry["name"] for entry in _listed_files({"shards": manifest.get("shards")}))
    shards = set()
    for name in names:
        match = SHARD_PATTERN.match(name)
        if match is None:
            continue
        path = folder / name
        try:
            require_regular(path)
        except FileNotFoundError:
            raise NoFilesError(f"{path} is named by {folder / MANIFEST} but does not exist.") from None
        shards.add((int(match.group(1)), path))
    return sorted(shards)


def detect(probe: Probe) -> bool:
    """A ``torch.save`` file, or a folder holding ``shard_N.pt`` files (or a shard manifest)."""
    if probe.is_dir:
        return MANIFEST in probe.entries or any(SHARD_PATTERN.match(name) for name in probe.entries)
    return probe.is_file and torchfile.is_torch_file(probe.path, probe.head(30 + 256))


def read_manifest(folder: PathLike) -> dict[str, Any] | None:
    """A shard folder's ``manifest.json`` as a dict, or None when it has none."""
    return _json_object(Path(folder) / MANIFEST)


def _json_object(file: Path) -> dict[str, Any] | None:
    """The JSON object in ``file`` (a manifest or checkpoints), or None when the file does not exist."""
    if not file.exists():
        return None
    return read_json_object(file)


def _tensor_of(path: Path, payload: Any, key: str | None) -> tuple[np.ndarray, str | None, dict[str, Any]]:
    """The token array in a loaded payload (a tensor, or a dict holding one), its key, and the other values."""
    if isinstance(payload, np.ndarray):
        if key is not None:
            raise FormatError(f"{path} holds a single tensor, not a dict: drop key={key!r}.")
        return payload, None, {}
    if isinstance(payload, dict):
        arrays = [k for k, v in payload.items() if isinstance(v, np.ndarray)]
        if key is None:
            if len(arrays) != 1:
                raise FormatError(
                    f"{path} holds a dict with {len(arrays)} tensors ({arrays}); pass key= to choose one."
                )
            key = arrays[0]
        if key not in payload or not isinstance(payload[key], np.ndarray):
            raise FormatError(f"{path}: the dict has no tensor under {key!r}; its tensors are {arrays}.")
        others = {str(k): v for k, v in payload.items() if not isinstance(v, np.ndarray) and _is_plain(v)}
        return payload[key], key, others
    raise FormatError(f"{path} holds a {type(payload).__name__}, not a tensor or a dict of tensors.")


def _is_plain(value: Any) -> bool:
    return (
        value is None
        or isinstance(value, (bool, int, float, str))
        or (isinstance(value, (list, tuple)) and all(_is_plain(v) for v in value))
    )


def _flat(path: Path, array: np.ndarray) -> np.ndarray:
    if array.ndim == 1:
        return array
    flat = array.reshape(-1)  # a view when contiguous, else one copy
    return flat


#: The most shards a manifest's ``total_shards`` may claim (a claim of 10**12 is refused, not allocated).
MAX_LISTED_SHARDS = 1_000_000
#: The index a folder URL is read from (Genesis publishes it), and uploaded last by ``publish``.
REMOTE_INDEX = (MANIFEST,)
PUBLISHED_LAST = (MANIFEST, CHECKPOINTS)


def remote_files(folder: Path) -> list[dict[str, Any]]:
    """The shards a Genesis manifest lists, with the size and SHA-256 it records (v3), or ``total_shards`` of them
    (older manifests), plus the optional checkpoints and tokenizer."""
    return _listed_files(read_manifest(folder) or {})


def _listed_files(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """:func:`remote_files` of a manifest already read."""
    entries = manifest.get("shards")
    files: list[dict[str, Any]] = []
    if isinstance(entries, list) and entries:
        for entry in entries:
            if isinstance(entry, dict) and isinstance(entry.get("shard_id"), int):
                size, digest = entry.get("size_bytes"), entry.get("hash")
                files.append({
                    "name": f"shard_{entry['shard_id']}.pt",
                    "size": size if isinstance(size, int) else None,
                    "sha256": digest if isinstance(digest, str) else None,
                    "size_tokens": entry.get("size_tokens"),
                })  # fmt: skip
    else:
        total = manifest.get("total_shards") or 0
        if type(total) is not int or not 0 <= total <= MAX_LISTED_SHARDS:
            raise FormatError(
                f"{MANIFEST}: total_shards is {total!r:.40}; a manifest without a 'shards' list may claim 0 to "
                f"{MAX_LISTED_SHARDS:,} shards."
            )
        files = [{"name": f"shard_{k}.pt"} for k in range(total)]
    return [*files, {"name": CHECKPOINTS, "required": False}, {"name": TOKENIZER, "required": False}]


def remote_lazy(folder: Path, names: list[str]) -> bool:
    """Whether a shard folder opened by URL can fetch its shards on first use: its manifest lists every shard with
    its token count (Genesis v3)."""
    if MANIFEST not in names:
        return False
    manifest = read_manifest(folder) or {}
    entries = manifest.get("shards")
    return (
        isinstance(entries, list)
        and bool(entries)
        and all(isinstance(e, dict) and isinstance(e.get("size_tokens"), int) for e in entries)
    )


def remote_companions(name: str) -> list[tuple[str, bool]]:
    """A ``.pt`` file's loss mask ``NAME.loss_mask.pt`` (when the store has one)."""
    if not name.endswith(".pt") or name.endswith(LOSS_MASK_SUFFIX):
        return []
    return [(name[: -len(".pt")] + LOSS_MASK_SUFFIX, False)]


def remote_adopt(root: Path, name: str) -> Path | None:
    """NeuroShard's own cache name for shard ``name`` (``genesis_shard_N.pt`` in ``~/.neuroshard/data_cache``): used
    only when it verifies against the manifest."""
    match = SHARD_PATTERN.match(name)
    return root / f"genesis_shard_{match.group(1)}.pt" if match else None


class Reader(TokenReader):
    """A ``.pt`` file (:class:`FileReader`) or a folder of ``shard_N.pt`` (:class:`FolderReader`).

    ``Reader(path, ...)`` returns the one that fits ``path``.
    """

    format = "pt"

    def __new__(cls, path: PathLike, *args: Any, **kwargs: Any) -> Reader:
        if cls is Reader:
            cls = FolderReader if Path(path).is_dir() else FileReader
        return super().__new__(cls)


class FileReader(Reader):
    """One ``torch.save`` file holding a tensor, or a dict holding one.

    Args:
        path: the ``.pt`` file.
        key: which dict entry holds the tokens (needed only when the dict holds several tensors).
        eos / bos: split documents at this id (after / before it); by default the tensor is one document.
    """

    def __init__(self, path: PathLike, *, key: str | None = None, eos: int | None = None, bos: int | None = None):
        super().__init__(path, key=key, eos=eos, bos=bos)
        self._path = Path(path)
        self._key = key
        self._pin(self._path)
        self._array  # noqa: B018 - load now: what was validated is what is read
        self.eos, self.bos = checked_delimiters(self._path, self._array.dtype, eos, bos)

    @cached_property
    def _array(self) -> np.ndarray:
        """The tensor's elements, mapped (again after :meth:`close`, if the file is unchanged)."""
        self._check_pin(self._path)
        array, self.key, self._extra = _tensor_of(self._path, torchfile.load(self._path), self._key)
        self.shape = tuple(array.shape)
        return _flat(self._path, array)

    def _cached_maps(self) -> tuple[str, ...]:
        return ("_array", "_view", "_loss_masks")

    @property
    def path(self) -> Path:
        return self._path

    @property
    def tokens(self) -> np.ndarray:
        """The tensor's elements, memory-mapped (zero-copy for contiguous tensors)."""
        return self._array

    def _offsets(self) -> np.ndarray:
        return split_offsets(self._array, eos=self.eos, bos=self.bos)

    @cached_property
    def _loss_masks(self) -> np.ndarray | None:
        path = loss_mask_path(self._path)
        if not path.is_file():
            return None
        self._pin(path)
        return _mask_tensor(path, len(self._array))

    @property
    def loss_masks(self) -> np.ndarray | None:
        """The ``NAME.loss_mask.pt`` values (see :attr:`tokformats.TokenReader.loss_masks`)."""
        return self._loss_masks

    @property
    def metadata(self) -> dict[str, Any]:
        return {"key": self.key, "shape": list(self.shape), "values": self._extra, "eos": self.eos, "bos": self.bos}

    def _problems(self) -> list[Any]:
        """Records whose CRC-32 is wrong (torch.load checks none when it maps tensors; neither does opening)."""
        return _crc_problems(self._path)


def _crc_problems(path: Path) -> list[Any]:
    """A :class:`~tokformats.core.reports.Problem` per record of ``.pt`` file ``path`` whose CRC-32 is wrong."""
    from ..core.reports import Problem

    with open(path, "rb") as handle:
        if handle.read(len(torchfile.ZIP_MAGIC)) != torchfile.ZIP_MAGIC:
            return []  # a legacy (non-zip) file has no CRCs
    return [Problem(str(path), name, "its CRC-32 differs from the archive's (the bytes were changed)")
            for name in torchfile.crc_mismatches(path)]  # fmt: skip


class FolderReader(Reader):
    """A folder of ``shard_N.pt`` files (numeric order) with its ``manifest.json`` and ``checkpoints.json``.

    Args:
        path: the folder.
        eos / bos: split documents at this id; by default the id the manifest's ``document_delimiter`` records,
            else each shard is one document.
        remote: set by ``tokformats.open("https://.../genesis/")``: the folder then holds the manifest, and each
            shard it lists is downloaded (and verified against the manifest's SHA-256) the first time a token of it
            is read; :meth:`prefetch` downloads ahead.
    """

    def __init__(
        self,
        path: PathLike,
        *,
        eos: int | None = None,
        bos: int | None = None,
        remote: LazyFiles | None = None,
    ):
        super().__init__(path, eos=eos, bos=bos, remote=remote)
        self._path = Path(path)
        if not self._path.is_dir():
            raise NoFilesError(f"{self._path} is not a folder.")
        self._remote = remote
        self.manifest = _json_object(self._path / MANIFEST)
        self._listed: dict[str, dict[str, Any]] = {}
        if remote is not None:  # the manifest says which shards there are and how many tokens each holds
            self._listed = {e["name"]: e for e in _listed_files(self.manifest or {}) if SHARD_PATTERN.match(e["name"])}
            self._shards = sorted((int(n[len("shard_") : -len(".pt")]), self._path / n) for n in self._listed)
        else:
            self._shards = _named_shards(self._path, self.manifest)
            if not self._shards and self.manifest is None:
                raise NoFilesError(f"{self._path} holds no shard_N.pt files and no {MANIFEST}.")
            self._pin(*(shard for _, shard in self._shards))
        self._arrays  # noqa: B018 - load now: what was validated is what is read
        self.eos, self.bos = checked_delimiters(self._path, self._arrays[0].dtype, eos, bos)
        recorded = (self.manifest or {}).get(DELIMITER_KEY)
        if eos is None and bos is None and isinstance(recorded, dict):
            self.eos, self.bos = _recorded_id(recorded, "eos"), _recorded_id(recorded, "bos")
        self.checkpoints = _json_object(self._path / CHECKPOINTS)

    @cached_property
    def _arrays(self) -> list[Any]:
        """Each shard's tokens, mapped (again after :meth:`close`, if the shards are unchanged); for a remote folder,
        :class:`LazyArray` s that download their shard on first use."""
        arrays: list[Any] = [np.zeros(0, dtype="<i8")] if not self._shards else []  # a manifest alone: empty
        for _, shard in self._shards:
            if self._remote is not None:
                size = int(self._listed[shard.name]["size_tokens"])  # remote_lazy() checked every shard has one
                arrays.append(self._lazy_array(shard, size, "<i8", functools.partial(self._load, shard, fetch=True)))
                continue
            arrays.append(self._load(shard))
        dtypes = {a.dtype for a in arrays}
        if len(dtypes) > 1:
            raise DTypeError(f"{self._path}: the shards mix dtypes {sorted(d.name for d in dtypes)}.")
        return arrays

    def _load(self, shard: Path, fetch: bool = False) -> np.ndarray:
        self._check_pin(self._fetched(shard) if fetch else shard)
        array, _, _ = _tensor_of(shard, torchfile.load(shard), None)
        return _flat(shard, array)

    def _cached_maps(self) -> tuple[str, ...]:
        return ("_arrays", "tokens", "_view", "_loss_masks")

    @cached_property
    def _loss_masks(self) -> TokenArray | None:
        paths = [loss_mask_path(shard) for _, shard in self._shards]
        remote = self._remote  # by URL: the masks the dataset lists (SHA256SUMS, a listing), fetched here
        present = [p.is_file() or (remote is not None and remote.has(p)) for p in paths]
        if not any(present):
            return None
        if not all(present):
            raise FormatError(f"{paths[present.index(False)]} is missing, while other shards have their loss masks.")
        masks = [_mask_tensor(self._fetched(p), len(a)) for p, a in zip(paths, self._arrays)]
        return masks[0] if len(masks) == 1 else ConcatenatedArray(masks)

    @property
    def loss_masks(self) -> TokenArray | None:
        """Each shard's ``shard_N.loss_mask.pt`` values, in shard order (see
        :attr:`tokformats.TokenReader.loss_masks`)."""
        return self._loss_masks

    @property
    def path(self) -> Path:
        return self._path

    @property
    def files(self) -> list[Path]:
        return [p for _, p in self._shards]

    @property
    def num_shards(self) -> int:
        """Number of shard files."""
        return len(self._shards)

    @property
    def shard_ids(self) -> list[int]:
        """The N of each ``shard_N.pt``, in order (a node may hold a subset)."""
        return [i for i, _ in self._shards]

    @cached_property
    def tokens(self) -> TokenArray:
        """Every shard's tokens, in numeric shard order."""
        return self._arrays[0] if len(self._arrays) == 1 else ConcatenatedArray(self._arrays)

    def _offsets(self) -> np.ndarray:
        if self.eos is None and self.bos is None:
            if not self._shards:
                return np.zeros(1, dtype=np.int64)
            lengths = np.array([len(a) for a in self._arrays], dtype=np.int64)
            return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        return split_offsets(self.tokens, eos=self.eos, bos=self.bos)

    def _problems(self) -> list[Any]:
        """The manifest against the files: counts, each listed shard's size and SHA-256 (Genesis v3)."""
        from ..core.reports import Problem

        for array in self._arrays:  # a folder opened by URL: every shard is checked, so every shard is fetched
            if isinstance(array, LazyArray):
                array.data  # noqa: B018
        found = []
        where = str(self._path / MANIFEST)
        manifest = self.manifest or {}
        shards, tokens = manifest.get("total_shards"), manifest.get("total_tokens")
        if shards is not None and shards != len(self._shards):
            found.append(Problem(where, "total_shards", f"is {shards}, the folder has {len(self._shards)}"))
        if tokens is not None and tokens != self.num_tokens:
            found.append(Problem(where, "total_tokens", f"is {tokens!r}, the shards hold {self.num_tokens:,}"))
        files = dict(self._shards)
        entries = manifest.get("shards", [])
        if not isinstance(entries, list):
            return [*found, Problem(where, "shards", f"must be a list, found {type(entries).__name__}")]
        for entry in entries:
            if not isinstance(entry, dict) or not isinstance(entry.get("shard_id"), int):
                continue
            shard = files.get(entry["shard_id"])
            if shard is None:
                found.append(Problem(where, f"shards[{entry['shard_id']}]", "names a shard file that is missing"))
                continue
            size = shard.stat().st_size
            if "size_bytes" in entry and size != entry["size_bytes"]:
                message = f"is {size:,}, the manifest says {entry['size_bytes']!r}"
                found.append(Problem(str(shard), "size_bytes", message))
            elif "hash" in entry and file_sha256(shard) != entry["hash"]:
                found.append(Problem(str(shard), "hash", "its SHA-256 differs from the manifest's"))
        for _, shard in self._shards:
            found += _crc_problems(shard)
        return found

    @property
    def metadata(self) -> dict[str, Any]:
        return {
            "manifest": self.manifest,
            "checkpoints": self.checkpoints,
            "shard_ids": self.shard_ids,
            "eos": self.eos,
            "bos": self.bos,
        }


def _recorded_id(recorded: dict[str, Any], kind: str) -> int | None:
    """The ``eos``/``bos`` id a manifest's ``document_delimiter`` records (an int), or None."""
    value = recorded.get(kind)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _pt_dtype(dtype: npt.DTypeLike | None, vocab_size: int | None) -> np.dtype:
    """int64 (what ``nn.Embedding`` takes, and what Genesis shards hold) unless ``dtype`` says otherwise."""
    return resolve_dtype(dtype, vocab_size, format="pt", allowed=WRITABLE, default="int64", rule=lambda _: np.int64)


class Writer(TokenWriter):
    """Writes one ``.pt`` file (a path ending in ``.pt``: :class:`FileWriter`) or a shard folder
    (:class:`FolderWriter`). Both store int64 unless ``dtype=`` says otherwise."""

    format = "pt"
    boundaries = "eos"  # Genesis and nanoGPT-style .pt streams end documents with EOS
    conventional_dtype = "int64"  # Genesis shards are int64, the dtype nn.Embedding takes
    stores_loss_mask = True

    @classmethod
    def existing_outputs(cls, path: PathLike) -> list[Path]:
        folder = Path(path)
        if not folder.is_dir():
            return super().existing_outputs(path)
        shards = [p for _, p in shard_files(folder)]
        masks = [loss_mask_path(p) for p in shards if loss_mask_path(p).exists()]
        return shards + masks + [folder / n for n in (MANIFEST,) if (folder / n).exists()]

    def __new__(cls, path: PathLike, *args: Any, **kwargs: Any) -> Writer:
        if cls is Writer:
            cls = FileWriter if str(path).endswith(".pt") else FolderWriter
        return super().__new__(cls)


class FileWriter(Writer):
    """Writes every document into one 1-D tensor file that ``torch.load`` reads (byte-identical layout to
    ``torch.save`` apart from the random serialization id).

    Args:
        path: the ``.pt`` file.
        dtype: int64 (default), int32, uint16, uint32, ...
        vocab_size: ids must be below it.
        eos: appended after every document when given.
        overwrite: replace an existing file.
    """

    def __init__(
        self,
        path: PathLike,
        *,
        dtype: npt.DTypeLike | None = None,
        vocab_size: int | None = None,
        eos: int | None = None,
        overwrite: bool = False,
    ) -> None:
        chosen = _pt_dtype(dtype, vocab_size)
        super().__init__(path, dtype=chosen, vocab_size=vocab_size, overwrite=overwrite)
        self._files.check_destination(self.path)
        self.eos = check_id(eos, chosen, vocab_size, "eos")
        # The tensor's length goes into data.pkl, which precedes the data: spool tokens, write at the end.
        self._spool_path = self._files.scratch(self.path)
        self._spool = open(self._spool_path, "wb")  # noqa: SIM115 - closed in _finish or abort
        self._mask_spool: Any = None  # the masks, spooled the same way, once a write carries one

    def _write_tokens(self, flat: np.ndarray, lengths: np.ndarray) -> None:
        if self.eos is not None:
            flat, _ = add_delimiter(flat, lengths, self.eos)
        self._spool.write(np.ascontiguousarray(flat).data)

    def _write_masked(self, flat: np.ndarray, lengths: np.ndarray, mask: np.ndarray) -> None:
        if self._mask_spool is None:
            self._files.check_destination(loss_mask_path(self.path))
            self._mask_path = self._files.scratch(loss_mask_path(self.path))
            self._mask_spool = open(self._mask_path, "wb")  # noqa: SIM115 - closed in _finish or abort
        self._write_tokens(flat, lengths)
        if self.eos is not None:  # the writer's own end-of-document id is trained on
            mask, _ = add_delimiter(mask, lengths, 1)
        self._mask_spool.write(np.ascontiguousarray(mask, dtype=np.uint8).data)

    def _finish(self) -> None:
        self._spool.close()
        tokens = map_file(self._spool_path, self.dtype)
        stem = self.path.stem
        prefix = stem if stem.isascii() and stem else "archive"
        if self._mask_spool is not None:  # before the tokens: the token file is renamed last
            self._mask_spool.close()
            masks = map_file(self._mask_path, np.dtype("u1")).view(np.bool_)
            mask_file = loss_mask_path(self.path)
            torchfile.write_tensor(self._files.create(mask_file), masks, prefix=mask_file.stem.replace(".", "_"))
            del masks
        torchfile.write_tensor(self._files.create(self.path), tokens, prefix=prefix)
        del tokens

    def abort(self) -> None:
        self._spool.close()
        if self._mask_spool is not None:
            self._mask_spool.close()
        super().abort()


class FolderWriter(Writer):
    """Packs documents into fixed-size ``shard_N.pt`` files with ``manifest.json`` and ``checkpoints.json``.

    Args:
        path: the folder.
        tokens_per_shard: tokens in every shard (default 2,500,000, as NeuroShard Genesis).
        dtype: int64 (default) or another torch dtype.
        vocab_size: ids must be below it.
        eos: appended after every document when given.
        source: the name this run is recorded under in the manifest and checkpoints.
        tokenizer: a ``tokenizer.json`` path or ``tokenizers.Tokenizer`` to copy into the folder.
        tokenizer_version: recorded in the manifest.
        final_shard: write the unfilled tail as a last, shorter shard (the default: a finished job leaves every
            token in a shard). ``False`` keeps the tail as ``leftover_tokens`` for a later ``resume=True`` run,
            the way an unfinished Genesis stream continues.
        resume: continue a folder this writer (or Genesis) left: its leftover tokens come first and shard
            numbers continue, so the shards equal those of one uninterrupted run.
        overwrite: replace an existing folder's shards, manifest and checkpoints.

    Files appear when the writer closes without an exception (each shard, then the checkpoints and the
    manifest last); an exception leaves the folder as it was.
    """

    def _resume_point(
        self, source: str, dtype: np.dtype, has_shards: bool
    ) -> tuple[np.ndarray, int, np.ndarray | None]:
        """What ``checkpoints.json`` records for ``source``: the tokens left over after its last full shard, how
        many documents it had processed (none and 0 for a new source), and the leftover tokens' loss mask (None
        when the source was written without masks)."""
        state = self._checkpoints.get(source)
        if state is None and has_shards:
            raise FormatError(f"{self.path / CHECKPOINTS} has no entry for source {source!r}; cannot resume it.")
        if not isinstance(state, (dict, type(None))):
            raise FormatError(f"{self.path / CHECKPOINTS}: the entry of {source!r} must be an object.")
        if state is None:
            return np.zeros(0, dtype=dtype), 0, None
        where = f"{self.path / CHECKPOINTS}: {source}.leftover_tokens"
        values = numbers(state.get("leftover_tokens", []), where, "a list of token ids")
        if values.size and values.dtype.kind not in "iu":
            raise FormatError(f"{where} must be a list of token ids, found {values.dtype.name} values.")
        processed = state.get("documents_processed", 0)
        if type(processed) is not int:
            raise FormatError(f"{self.path / CHECKPOINTS}: {source}.documents_processed is {processed!r:.40}.")
        mask = self._leftover_mask(state, source, len(values))
        return check_tokens(values.astype(np.int64), dtype), processed, mask

    def _leftover_mask(self, state: dict[str, Any], source: str, tokens: int) -> np.ndarray | None:
        """The checkpoint's ``leftover_loss_mask`` of ``source`` as uint8 0/1 (one per leftover token), or None."""
        if LEFTOVER_MASK not in state:
            return None
        where = f"{self.path / CHECKPOINTS}: {source}.{LEFTOVER_MASK}"
        mask = numbers(state[LEFTOVER_MASK], where, "a list of 0 and 1")
        if mask.ndim != 1 or len(mask) != tokens:
            raise FormatError(f"{where} holds {mask.size} values; expected one per leftover token ({tokens}).")
        if mask.size and (mask.dtype.kind not in "iub" or mask.min() < 0 or mask.max() > 1):
            raise FormatError(f"{where} must hold 0 and 1 only, found {mask[(mask != 0) & (mask != 1)][:1].tolist()}.")
        return mask.astype(np.uint8)

    def __init__(
        self,
        path: PathLike,
        *,
        tokens_per_shard: int = TOKENS_PER_SHARD,
        dtype: npt.DTypeLike | None = None,
        vocab_size: int | None = None,
        eos: int | None = None,
        source: str = "default",
        tokenizer: Any = None,
        tokenizer_version: str | None = None,
        final_shard: bool = True,
        resume: bool = False,
        overwrite: bool = False,
    ) -> None:
        chosen = _pt_dtype(dtype, vocab_size)
        super().__init__(path, dtype=chosen, vocab_size=vocab_size, overwrite=overwrite)
        if tokens_per_shard <= 0:
            raise ValueError(f"tokens_per_shard must be positive, not {tokens_per_shard}")
        self.tokens_per_shard = tokens_per_shard
        self.eos = check_id(eos, chosen, vocab_size, "eos")
        self.source = source
        self.tokenizer = tokenizer
        self.tokenizer_version = tokenizer_version
        self.final_shard = final_shard
        self._manifest: dict[str, Any] = {}
        self._checkpoints: dict[str, Any] = {}
        existing = shard_files(self.path) if self.path.is_dir() else []
        leftover = np.zeros(0, dtype=chosen)
        leftover_mask: np.ndarray | None = None
        self._documents_before = 0
        if resume:
            self._manifest = _json_object(self.path / MANIFEST) or {}
            self._checkpoints = _json_object(self.path / CHECKPOINTS) or {}
            leftover, self._documents_before, leftover_mask = self._resume_point(source, chosen, bool(existing))
            if leftover_mask is None and existing and not len(leftover) and self._all_masked(existing):
                leftover_mask = np.zeros(0, dtype=np.uint8)  # masked shards, checkpointed before leftover masks were
            # Replace (not keep) the files we rewrite.
            self._files = AtomicFiles(overwrite=True)
        elif existing or (self.path / MANIFEST).exists():
            if not overwrite:
                raise OutputExistsError(
                    f"{self.path} already holds shards; pass {option('resume')} to continue it "
                    f"or {option('overwrite')} to replace it."
                )
            folder = self.path
            self._files.remove_on_commit(
                lambda: [q for _, p in shard_files(folder) for q in (p, loss_mask_path(p))]
                + [folder / n for n in (MANIFEST, CHECKPOINTS, TOKENIZER)]
            )
            existing = []
            self._manifest, self._checkpoints = {}, {}
        self._next_index = (existing[-1][0] + 1) if existing else 0
        self._buffer = np.empty(tokens_per_shard, dtype=chosen)
        self._shards = StreamShards(tokens_per_shard, self._start_shard, self._end_shard, self._fill)
        #: The loss masks, cut into shards at the same places as the tokens (made by the first masked write, or
        #: at once when resuming a masked source).
        self._mask_shards: StreamShards | None = None
        self._mask_buffer = np.empty(0, dtype=np.uint8)
        self._mask_index = self._next_index
        #: Why this writer may not start masks (a resumed folder whose shards or leftover have none), or None.
        self._unmaskable = self._unmasked_part(existing, leftover) if resume and leftover_mask is None else None
        self._new_shards: list[Path] = []
        #: Genesis v3 manifest entries of the shards written here (kept ones come from the old manifest).
        self._shard_entries: list[dict[str, Any]] = []
        self._new_tokens = 0
        self._new_bytes = 0
        self._append(leftover)
        if leftover_mask is not None:  # a masked source stays masked: a later write without a mask trains on all
            self.loss_masked = True
            self._start_masks().write(leftover_mask)

    @staticmethod
    def _all_masked(shards: list[tuple[int, Path]]) -> bool:
        """Whether every shard has its ``shard_N.loss_mask.pt``."""
        return all(loss_mask_path(path).is_file() for _, path in shards)

    def _unmasked_part(self, existing: list[tuple[int, Path]], leftover: np.ndarray) -> str | None:
        """What of a resumed folder has no loss mask (its leftover tokens, a shard), or None when nothing does."""
        if len(leftover):
            return f"the {len(leftover)} leftover tokens of {self.source!r} in {CHECKPOINTS} have no {LEFTOVER_MASK}"
        bare = next((p for _, p in existing if not loss_mask_path(p).is_file()), None)
        return None if bare is None else f"{bare.name} has no {loss_mask_path(bare).name}"

    def _append(self, tokens: np.ndarray) -> None:
        self._shards.write(tokens)

    # A shard is gathered in a buffer and written whole: a tensor's header needs its size.
    def _start_shard(self, index: int) -> np.ndarray:
        return self._buffer

    def _fill(self, buffer: np.ndarray, piece: np.ndarray) -> None:
        buffer[self._shards.filled : self._shards.filled + len(piece)] = piece

    def _end_shard(self, buffer: np.ndarray, tokens: int) -> None:
        self._emit(buffer[:tokens])

    def _emit(self, tokens: np.ndarray) -> None:
        index = self._next_index
        final = self.path / f"shard_{index}.pt"
        handle = self._files.create(final)
        torchfile.write_tensor(handle, tokens, prefix=f"shard_{index}")
        size = handle.tell()
        self._new_bytes += size
        self._files.finish(handle)
        self._shard_entries.append(
            {
                "shard_id": index,
                "source": self.source,
                "hash": file_sha256(Path(handle.name)),
                "size_tokens": len(tokens),
                "size_bytes": size,
                "created_at": utc_now(),
            }
        )
        self._new_shards.append(final)
        self._new_tokens += len(tokens)
        self._next_index += 1

    def _write_tokens(self, flat: np.ndarray, lengths: np.ndarray) -> None:
        if self.eos is not None:
            flat, _ = add_delimiter(flat, lengths, self.eos)
        self._append(flat)

    def read_with(self) -> dict[str, Any]:
        """Nothing: the manifest records the delimiter (:meth:`_recorded_delimiter`)."""
        return {}

    def _recorded_delimiter(self) -> dict[str, int]:
        """What the manifest records under ``document_delimiter``, so that the folder reads back by document:
        the ``eos`` this writer appends, else the delimiter declared (:meth:`declare_delimiter`)."""
        if self.eos is not None:
            return {"eos": int(self.eos)}
        if self.declared is not None and self.declared[1] is not None:
            return {self.declared[0]: self.declared[1]}
        return {}

    def _start_masks(self) -> StreamShards:
        """The mask stream, cut at the same places as the tokens (it starts where they start: at the leftover)."""
        self._mask_buffer = buffer = np.empty(self.tokens_per_shard, dtype=np.uint8)
        shards = StreamShards(self.tokens_per_shard, lambda _: buffer, self._emit_mask, self._fill_mask)
        self._mask_shards = shards
        return shards

    def _fill_mask(self, buffer: np.ndarray, piece: np.ndarray) -> None:
        filled = self._mask_shards.filled if self._mask_shards is not None else 0
        buffer[filled : filled + len(piece)] = piece

    def _write_masked(self, flat: np.ndarray, lengths: np.ndarray, mask: np.ndarray) -> None:
        masks = self._mask_shards
        if masks is None:
            if self._unmaskable is not None:
                raise FormatError(
                    f"{self.path}: loss masks cannot start in a resumed folder whose earlier tokens have none "
                    f"({self._unmaskable}); write the whole source with masks from its first shard, or without."
                )
            masks = self._start_masks()
        self._write_tokens(flat, lengths)
        if self.eos is not None:  # the writer's own end-of-document id is trained on
            mask, _ = add_delimiter(mask, lengths, 1)
        masks.write(mask)

    def _emit_mask(self, buffer: np.ndarray, tokens: int) -> None:
        """Write one shard's masks as ``shard_N.loss_mask.pt`` (a bool tensor)."""
        index = self._mask_index
        handle = self._files.create(loss_mask_path(self.path / f"shard_{index}.pt"))
        torchfile.write_tensor(handle, buffer[:tokens].view(np.bool_), prefix=f"shard_{index}_loss_mask")
        self._files.finish(handle)
        self._mask_index += 1

    def _write_json(self, name: str, data: dict[str, Any]) -> None:
        handle = self._files.create(self.path / name)
        handle.write((json.dumps(data, indent=2) + "\n").encode("utf-8"))

    def _finish(self) -> None:
        # The tail that does not fill a shard is a shard of its own (final_shard) or kept in checkpoints.json for a
        # resumed run (the Genesis packer's way); a full last shard is always written.
        whole = self._shards.filled == self.tokens_per_shard
        self._shards.finish(empty_shard=False, last=self.final_shard or whole)
        leftover = self._buffer[: self._shards.filled] if self._shards.current is not None else self._buffer[:0]
        now = utc_now()
        last_shard = self._next_index - 1
        documents = self._documents_before + self.num_documents
        self._checkpoints[self.source] = {
            "documents_processed": documents,
            "last_shard_id": last_shard,
            "leftover_tokens": leftover.tolist(),
            "timestamp": now,
        }
        masks = self._mask_shards
        if masks is not None:  # cut where the tokens were: the same tail is kept, beside its tokens
            masks.finish(empty_shard=False, last=self.final_shard or whole)
            tail = self._mask_buffer[: masks.filled] if masks.current is not None else self._mask_buffer[:0]
            self._checkpoints[self.source][LEFTOVER_MASK] = tail.tolist()
        manifest = self._manifest
        previous = manifest.get("sources", {}).get(self.source, {})
        manifest["sources"] = {
            **manifest.get("sources", {}),
            self.source: {
                "shards": int(previous.get("shards", 0)) + len(self._new_shards),
                "tokens": int(previous.get("tokens", 0)) + self._new_tokens,
                "documents_processed": documents,
                "last_shard_id": last_shard,
            },
        }
        kept = [s for s in manifest.get("shards", []) if isinstance(s, dict)]
        self._manifest = {
            "version": MANIFEST_VERSION,
            "tokens_per_shard": self.tokens_per_shard,
            "shard_size_mb": round(self.tokens_per_shard * self.dtype.itemsize / 1e6, 3),
            "total_shards": int(manifest.get("total_shards", 0)) + len(self._new_shards),
            "total_tokens": int(manifest.get("total_tokens", 0)) + self._new_tokens,
            "total_size_bytes": int(manifest.get("total_size_bytes", 0)) + self._new_bytes,
            "tokenizer_version": self.tokenizer_version or manifest.get("tokenizer_version"),
            "sources": manifest["sources"],
            "created_at": manifest.get("created_at", now),
            "updated_at": now,
            "shards": kept + self._shard_entries,
        }
        if self.tokenizer is not None:
            from ..core.vocab import load_tokenizer

            handle = self._files.create(self.path / TOKENIZER)
            handle.write(load_tokenizer(self.tokenizer).to_str().encode("utf-8"))
        recorded = self._recorded_delimiter()
        if recorded:
            self._manifest[DELIMITER_KEY] = recorded
        self._write_json(CHECKPOINTS, self._checkpoints)
        self._write_json(MANIFEST, self._manifest)  # last: a manifest means the folder is complete
