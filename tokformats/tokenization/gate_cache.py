"""The engine identity gate's results on disk, per tokenizer: a second process pays no gate.

``engine="auto"`` times the installed fast engines on a calibration text and gates them against ``tokenizers`` on
the adversarial texts (:mod:`.engines`); that costs a few tenths of a second and two engine loads per process.
After a full selection, :func:`save` keeps what it found in one JSON file per (tokenizer SHA-256, engine asked
for, ways of encoding gated), under ``TOKFORMATS_GATE_CACHE`` (a folder; ``off`` or ``0``: nothing read or
written) or else ``gates/`` in the remote cache's folder (``$TOKFORMATS_CACHE``, ``~/.cache/tokformats``): the
engine chosen and why, the adversarial texts, and ``tokenizers``' ids of them. A later process loads only that
engine and gates it against the stored ids: its own ids on the adversarial texts are still compared; only the
timing, the other engines' loading and the reference encoding are skipped.

An entry is untrusted input. It is used only when its format version, tokenizer hash, engine request, ways of
encoding and the installed builds of ``tokenizers``, fastokens and splintr (module file, size, modification time)
all match, its checksum holds and its ids are well formed (one length per text, adding up, ids in uint32);
anything else is ignored and rewritten after a full selection. Even an entry forged to match a wrong
engine cannot put a wrong id in an output: every run re-encodes its first MiB of text with ``tokenizers`` itself
(``auto`` then falls back to ``tokenizers``, a named engine stops with ``EngineMismatchError``). Files are
written atomically (:class:`~tokformats.fs.atomic.AtomicFiles`); a cache that cannot be written is skipped.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import FormatError
from ..fs.atomic import AtomicFiles
from ..fs.untrusted import read_json_object

__all__ = ["GATE_CACHE_ENV", "GateEntry", "gate_cache_folder", "entry_path", "load", "save"]

#: The environment variable naming the cache folder (``off``/``0``: no cache on disk).
GATE_CACHE_ENV = "TOKFORMATS_GATE_CACHE"
_VERSION = 1
_OFF = ("0", "off", "false", "no")
#: The packages whose installed build an entry is valid for.
_BUILDS = ("tokenizers", "fastokens", "splintr")


@dataclass
class GateEntry:
    """What a full selection found: the engine (``tokenizers`` when none passed), why, the adversarial texts and
    ``tokenizers``' ids of them for each way of encoding gated (``False``: text, ``True``: chat message text)."""

    engine: str
    reason: str
    texts: list[str]
    reference: dict[bool, tuple[np.ndarray, np.ndarray]]


def gate_cache_folder() -> Path | None:
    """Where entries are kept: ``$TOKFORMATS_GATE_CACHE``, else ``gates/`` in the remote cache's folder; None when
    the variable says ``off``."""
    value = os.environ.get(GATE_CACHE_ENV, "").strip()
    if value.lower() in _OFF:
        return None
    if value:
        return Path(value).expanduser()
    # remote.cache.default_cache_dir()'s folder, spelled here: importing it pulls in the remote stack (0.1 s), a
    # cost every tokenize run would pay (test_gate_cache checks that the two agree).
    return Path(os.environ.get("TOKFORMATS_CACHE") or "~/.cache/tokformats").expanduser() / "gates"


def _builds() -> dict[str, list[Any] | None]:
    """Each engine package's installed build: its module file, size and modification time (None: not installed);
    found without importing the package."""
    import importlib.util

    builds: dict[str, list[Any] | None] = {}
    for name in _BUILDS:
        try:
            spec = importlib.util.find_spec(name)
            origin = spec.origin if spec is not None else None
            found = os.stat(origin) if origin else None
        except (ImportError, ValueError, OSError):
            found, origin = None, None
        builds[name] = None if found is None else [origin, found.st_size, found.st_mtime_ns]
    return builds


def _key(tokenizer_hash: str, engine: str, modes: tuple[bool, ...]) -> dict[str, Any]:
    return {"tokenizer": tokenizer_hash, "engine": engine, "modes": list(modes), "builds": _builds()}


def entry_path(tokenizer_hash: str, engine: str, modes: tuple[bool, ...]) -> Path | None:
    """The entry's file for a tokenizer (its SHA-256), the engine asked for and the ways of encoding gated; None
    when the cache is off."""
    folder = gate_cache_folder()
    if folder is None:
        return None
    if len(tokenizer_hash) != 64 or any(c not in "0123456789abcdef" for c in tokenizer_hash):
        raise ValueError(f"a tokenizer hash is 64 hex digits, found {tokenizer_hash!r}")
    ways = "-".join("chat" if mode else "text" for mode in modes)
    return folder / f"{tokenizer_hash}-{engine}-{ways}.json"


def _checksum(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, ensure_ascii=True).encode("ascii")).hexdigest()


def load(path: Path, tokenizer_hash: str, engine: str, modes: tuple[bool, ...]) -> GateEntry | None:
    """The entry at ``path`` when it exists and is valid for this tokenizer, request, ways of encoding and the
    installed builds; else None (a damaged or stale entry is ignored)."""
    try:
        data = read_json_object(path)
    except (OSError, FormatError):
        return None
    body = {k: v for k, v in data.items() if k != "checksum"}
    if data.get("checksum") != _checksum(body) or body.get("version") != _VERSION:
        return None
    if body.get("key") != _key(tokenizer_hash, engine, modes):
        return None
    return _entry(body, modes)


def _entry(body: dict[str, Any], modes: tuple[bool, ...]) -> GateEntry | None:
    """The entry of a checked body, when its fields are well formed."""
    texts, chosen, reason = body.get("texts"), body.get("engine"), body.get("reason")
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        return None
    if chosen not in ("tokenizers", "fastokens", "splintr") or not isinstance(reason, str):
        return None
    stored = body.get("reference")
    if not isinstance(stored, dict):
        return None
    reference = {}
    for mode in modes if chosen != "tokenizers" else ():
        ids = _ids(stored.get("chat" if mode else "text"), len(texts))
        if ids is None:
            return None
        reference[mode] = ids
    return GateEntry(chosen, reason, texts, reference)


def _ids(value: Any, count: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Stored ``{"ids": [...], "lengths": [...]}`` as arrays, when well formed: ``count`` lengths, none negative,
    adding up to the ids, each id in uint32 (whether they are ``tokenizers``' ids is not knowable here: the gate
    compares them with the engine's, and the run's first MiB with ``tokenizers`` itself)."""
    if not isinstance(value, dict):
        return None
    ids, lengths = value.get("ids"), value.get("lengths")
    if not isinstance(ids, list) or not isinstance(lengths, list) or len(lengths) != count:
        return None
    if not all(type(i) is int for i in ids) or not all(type(n) is int for n in lengths):
        return None
    flat, sizes = np.array(ids, dtype=np.int64), np.array(lengths, dtype=np.int64)
    if (sizes < 0).any() or int(sizes.sum()) != len(flat) or (len(flat) and (flat.min() < 0 or flat.max() >= 1 << 32)):
        return None
    return flat.astype(np.uint32), sizes


def save(path: Path, tokenizer_hash: str, engine: str, modes: tuple[bool, ...], entry: GateEntry) -> None:
    """Keep ``entry`` at ``path`` (written whole, then renamed into place); a cache that cannot be written (a
    read-only home) is left alone: it only saves time."""
    body: dict[str, Any] = {
        "version": _VERSION,
        "key": _key(tokenizer_hash, engine, modes),
        "engine": entry.engine,
        "reason": entry.reason,
        "texts": entry.texts,
        "reference": {
            ("chat" if mode else "text"): {"ids": ids.tolist(), "lengths": lengths.tolist()}
            for mode, (ids, lengths) in entry.reference.items()
        },
    }
    data = json.dumps({**body, "checksum": _checksum(body)}, ensure_ascii=True).encode("ascii")
    try:
        with AtomicFiles(overwrite=True) as files:
            files.create(path).write(data)
    except OSError:
        return
