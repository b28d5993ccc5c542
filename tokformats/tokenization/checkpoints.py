"""A partition's checkpoint (``checkpoint.json`` beside its spools, :data:`~.spools.CHECKPOINT`): read back and held to
the run's plan on resume (:func:`load_checkpoint`), and written in one atomic step once the spools are durable
(:func:`write_checkpoint`; the last one after each ids spool was read back and pinned: :func:`synced_and_read_back`).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..errors import FormatError, OutputExistsError, option
from ..fs.atomic import replace_file
from ..fs.untrusted import read_json_object
from .plan import Plan
from .progress import Stats
from .spools import CHECKPOINT, Spool

__all__ = ["load_checkpoint", "synced_and_read_back", "write_checkpoint"]

#: The run's last errors a checkpoint keeps (``on_error="skip"``): enough to say what went wrong, bounded.
_ERRORS_KEPT = 100


def load_checkpoint(folder: Path, plan: Plan, resume: bool) -> dict[str, Any]:
    """The checkpoint of an unfinished run in ``folder`` (empty for a new one, whose folder is made): refused without
    ``resume``, or when it was written with other settings."""
    checkpoint = folder / CHECKPOINT
    if not checkpoint.exists():
        folder.mkdir(parents=True, exist_ok=True)
        return {}
    state = read_json_object(checkpoint)  # bounded, and a damaged one is a FormatError naming it
    if not resume:
        raise OutputExistsError(
            f"{folder} holds an unfinished run; pass {option('resume')} to continue it, or "
            f"{option('overwrite')} to start over."
        )
    if state.get("plan") != asdict(plan):
        before, now = state.get("plan") or {}, asdict(plan)
        changed = [k for k in now if before.get(k) != now[k]]
        detail = "; ".join(f"{k} was {before.get(k)!r:.80}, now {now[k]!r:.80}" for k in changed[:3])
        raise FormatError(
            f"{checkpoint} was written by a run with other settings ({detail}); it cannot be resumed with these. "
            f"Run with the same settings to resume, or pass {option('overwrite')} to start over."
        )
    return state


def write_checkpoint(
    path: Path, plan: Plan, position: tuple[int, int], spools: dict[str, Spool], stats: Stats, *, done: bool
) -> None:
    """Commit the run's state to ``path``: its ``plan``, the ``position`` reached, each spool's counts and hashes
    (by name; ``done``: with its pin, the ids spool read back first by :func:`synced_and_read_back`) and the
    counters. One commit: the old checkpoint or the new one, never half of either (the file and its folder
    fsynced). The spools must be durable already: a checkpoint never records what a crash could lose."""
    checkpoint = {
        "plan": asdict(plan),
        "position": list(position),
        "spools": {name: _entry(spool, pin=done) for name, spool in spools.items()},
        "stats": {
            "records": stats.records,
            "documents": stats.documents,
            "tokens": stats.tokens,
            "skipped": stats.skipped,
        },
        "errors": stats.errors[-_ERRORS_KEPT:],
        "done": done,
    }
    replace_file(path, json.dumps(checkpoint).encode("utf-8"))


def _entry(spool: Spool, *, pin: bool) -> dict[str, Any]:
    """A spool's checkpoint entry: its counts and hashes, and in the last checkpoint its pin."""
    entry: dict[str, Any] = {"tokens": spool.num_tokens, "documents": spool.num_documents, "hashes": spool.hashes()}
    if pin:
        entry["pin"] = spool.pin()
    return entry


def synced_and_read_back(spools: list[Spool]) -> None:
    """Every spool fsynced, in a thread of its own, while each ids spool is read back here (hashing releases the
    GIL): the last checkpoint's two passes over the ids (0.08 and 0.1 s for 125 MB) overlap instead of following
    each other at the end of the run. Both are done (or one raised) when this returns."""
    for spool in spools:
        spool.flush()

    def fsync_all() -> None:
        for spool in spools:
            spool.fsync()

    with ThreadPoolExecutor(1, thread_name_prefix="tokformats-sync") as syncing:
        synced = syncing.submit(fsync_all)
        try:
            for spool in spools:
                spool.read_back()
        except BaseException as refused:  # the fsync's own failure (an EIO, maybe the cause) is not lost
            if (failed := synced.exception()) is not None:
                refused.add_note(f"The spools' fsync failed too: {failed!r}")
            raise
        synced.result()
