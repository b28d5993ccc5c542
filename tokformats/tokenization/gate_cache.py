"""The engine identity gate's outcome on disk, per tokenizer: a second process neither times nor loads the other
engines.

``engine="auto"`` times the installed fast engines on a calibration text, loading each, then gates them against
``tokenizers`` on the adversarial texts (:mod:`.engines`); that costs a few tenths of a second per process. After a
full selection, :func:`save` keeps which engine it chose, and why, in one JSON file per (tokenizer SHA-256, engine
asked for, ways of encoding gated), under ``TOKFORMATS_GATE_CACHE`` (a folder; ``off`` or ``0``: nothing read or
written) or else ``gates/`` in the remote cache's folder (``$TOKFORMATS_CACHE``, ``~/.cache/tokformats``). A later
process loads only that engine and gates it again, here, against ``tokenizers``' own ids of today's adversarial
texts: only the timing and the other engines' loading are skipped.

An entry is untrusted input, and it decides nothing about ids: it only names which installed engine to gate first.
It is used when its format version, tokenizer hash, engine request, ways of encoding, the SHA-256 of the
adversarial texts this tokformats gates on, and the installed builds of ``tokenizers``, fastokens and splintr
(module file, size, modification time) all match and its checksum holds; anything else is ignored and rewritten
after a full selection. An engine it names that fails the gate is selected anew. Files are written atomically
(:func:`~tokformats.fs.atomic.replace_file`); a cache that cannot be written is skipped.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import FormatError
from ..fs.atomic import replace_file
from ..fs.untrusted import read_json_object

__all__ = ["GATE_CACHE_ENV", "GateEntry", "gate_cache_folder", "entry_path", "load", "save"]

#: The environment variable naming the cache folder (``off``/``0``: no cache on disk).
GATE_CACHE_ENV = "TOKFORMATS_GATE_CACHE"
_VERSION = 2
_OFF = ("0", "off", "false", "no")
#: The packages whose installed build an entry is valid for.
_BUILDS = ("tokenizers", "fastokens", "splintr")


@dataclass
class GateEntry:
    """What a full selection found: the engine (``tokenizers`` when none passed) and why."""

    engine: str
    reason: str


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


def _key(tokenizer_hash: str, engine: str, modes: tuple[bool, ...], texts_hash: str) -> dict[str, Any]:
    return {"tokenizer": tokenizer_hash, "engine": engine, "modes": list(modes), "texts": texts_hash,
            "builds": _builds()}  # fmt: skip


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


def load(path: Path, tokenizer_hash: str, engine: str, modes: tuple[bool, ...], texts_hash: str) -> GateEntry | None:
    """The entry at ``path`` when it exists and is valid for this tokenizer, request, ways of encoding, adversarial
    texts (their SHA-256) and the installed builds; else None (a damaged or stale entry is ignored)."""
    try:
        data = read_json_object(path)
    except (OSError, FormatError):
        return None
    body = {k: v for k, v in data.items() if k != "checksum"}
    if data.get("checksum") != _checksum(body) or body.get("version") != _VERSION:
        return None
    if body.get("key") != _key(tokenizer_hash, engine, modes, texts_hash):
        return None
    chosen, reason = body.get("engine"), body.get("reason")
    if chosen not in ("tokenizers", "fastokens", "splintr") or not isinstance(reason, str):
        return None
    return GateEntry(chosen, reason)


def save(
    path: Path, tokenizer_hash: str, engine: str, modes: tuple[bool, ...], texts_hash: str, entry: GateEntry
) -> None:
    """Keep ``entry`` at ``path`` (written whole, then renamed into place); a cache that cannot be written (a
    read-only home) is left alone: it only saves time."""
    body: dict[str, Any] = {
        "version": _VERSION,
        "key": _key(tokenizer_hash, engine, modes, texts_hash),
        "engine": entry.engine,
        "reason": entry.reason,
    }
    data = json.dumps({**body, "checksum": _checksum(body)}, ensure_ascii=True).encode("ascii")
    try:
        replace_file(path, data)
    except OSError:
        return
