"""Multi-file commits that are all or nothing, across ``kill -9``.

Renaming several files is several steps; a process killed between them would leave a dataset half old, half new
(an old ``.idx`` over a new ``.bin``, two of five shards). So a commit of more than one file first writes a
*journal* beside the outputs, ``.tokformats-commit.json``: the renames to do and the stale files to remove,
written only once every temporary is complete and on disk. Then it renames, removes, and deletes the journal.
Whoever next writes to or opens that folder (:func:`recover`) finds an unfinished journal and completes it: rolling
forward is always right, because the new files were whole before the journal existed. Commits into a folder are
serialised (:func:`folder_lock`), so a folder holds at most one journal, and checking for it is one ``stat``.

Temporaries carry their writer's process id (``.NAME.<pid>.<id>.tmp``), so the next write to a destination can
remove those whose process is gone (a killed writer's leftovers) without touching a live writer's.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import glob
import json
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import FormatError

__all__ = [
    "JOURNAL",
    "folder_lock",
    "fsync_folder",
    "write_journal",
    "finish_journal",
    "recover",
    "temporary_name",
    "dead_temporaries",
    "recover_near",
    "remove_dead_temporaries",
]

JOURNAL = ".tokformats-commit.json"
_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.[0-9a-f]{12}\.(?:tmp|spool)$")


def fsync_folder(folder: Path) -> None:
    """Make a folder's entries (renames, removals) durable; a no-op where folders cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # some platforms cannot open folders; renames are still atomic there
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


_SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start writeback of the range's dirty pages, do not wait


@functools.cache
def _sync_file_range() -> Any:
    """libc's ``sync_file_range`` (Linux), or None where there is none."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        function = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    return function


def start_writeback(descriptor: int) -> None:
    """Ask the kernel to start writing the file's dirty pages to disk now, without waiting (Linux; elsewhere
    nothing): a long write that ends with ``fsync`` then overlaps its disk writes with producing the data, and the
    final ``fsync`` waits only for the tail."""
    function = _sync_file_range()
    if function is not None:
        function(descriptor, 0, 0, _SYNC_FILE_RANGE_WRITE)


@contextlib.contextmanager
def folder_lock(folder: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``folder`` itself (``flock`` on its descriptor: no lock file is left behind),
    so that two commits into one folder, or a commit and a recovery, never interleave their renames."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): commits are still journaled, only not serialised
        yield
        return
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def temporary_name(final: Path, kind: str = "tmp") -> Path:
    """A hidden name beside ``final`` for its temporary, tagged with this process's id."""
    return final.with_name(f".{final.name}.{os.getpid()}.{uuid.uuid4().hex[:12]}.{kind}")


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def dead_temporaries(final: Path) -> list[Path]:
    """Temporaries of ``final`` whose writing process no longer exists (left by a kill), and no journal needs."""
    folder = final.parent
    if not folder.is_dir():
        return []
    found = []
    for path in folder.glob(f".{glob.escape(final.name)}.*"):
        match = _TEMPORARY.match(path.name)
        dead = match is not None and match.group("name") == final.name and not _alive(int(match.group("pid")))
        if dead and not _named_by_a_journal(folder, path):
            found.append(path)
    return found


def remove_dead_temporaries(final: Path) -> None:
    """Delete the files among :func:`dead_temporaries` (folders are their owners' to remove)."""
    for path in dead_temporaries(final):
        if path.is_file():
            path.unlink(missing_ok=True)


def _named_by_a_journal(folder: Path, path: Path) -> bool:
    journal = folder / JOURNAL
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        return str(path) in {tmp for tmp, _ in json.loads(journal.read_text())["renames"]}
    return False


def write_journal(folder: Path, renames: list[tuple[Path, Path]], remove: list[Path]) -> Path:
    """Make the commit durable: the journal (written whole, then renamed into place) lists what to do."""
    journal = folder / JOURNAL
    remove_dead_temporaries(journal)  # the staging file of a journal whose writer was killed writing it
    staging = temporary_name(journal)
    text = json.dumps({"renames": [[str(t), str(f)] for t, f in renames], "remove": [str(p) for p in remove]})
    with open(staging, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(staging, journal)
    fsync_folder(folder)
    return journal


def _apply(renames: list[tuple[Path, Path]], remove: list[Path]) -> None:
    for tmp, final in renames:
        try:
            os.replace(tmp, final)
        except FileNotFoundError:
            if not final.exists():  # neither: not a completed rename by someone else, but a lost file
                raise
    finals = {final for _, final in renames}
    for stale in remove:
        if stale not in finals:
            stale.unlink(missing_ok=True)
    for folder in {final.parent for _, final in renames} | {p.parent for p in remove}:
        fsync_folder(folder)


def finish_journal(journal: Path, renames: list[tuple[Path, Path]], remove: list[Path]) -> None:
    """Carry out a journal just written, then delete it."""
    _apply(renames, remove)
    journal.unlink(missing_ok=True)
    fsync_folder(journal.parent)


def recover(folder: Path) -> list[Path]:
    """Complete every unfinished commit in ``folder`` (a killed writer's); returns the journals completed.

    Raises :class:`FormatError` naming the journal when it cannot be completed (a read-only file system, a lost
    temporary): the dataset there is then neither old nor new, and must not be read.
    """
    journal = folder / JOURNAL
    if not journal.exists():  # the common case: one stat
        return []
    with folder_lock(folder):
        return _recover_locked(journal)


def _recover_locked(journal: Path) -> list[Path]:
    done: list[Path] = []
    if journal.exists():
        try:
            entries = json.loads(journal.read_text(encoding="utf-8"))
            renames = [(Path(t), Path(f)) for t, f in entries["renames"]]
            remove = [Path(p) for p in entries["remove"]]
            finish_journal(journal, renames, remove)
        except FileNotFoundError as error:
            if not journal.exists():  # another process completed it meanwhile
                return done
            raise FormatError(
                f"{journal} records an interrupted commit that cannot be completed ({error}); the datasets it names "
                "may be incomplete: write them again."
            ) from None
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise FormatError(
                f"{journal} records an interrupted commit that cannot be completed ({error}); the datasets it names "
                "may be incomplete: fix the cause (a read-only folder?) or write them again."
            ) from None
        done.append(journal)
    return done


def recover_near(path: object) -> None:
    """Complete the commits a killed writer left beside (or inside) ``path`` (a file, prefix, folder, glob or
    list), so that what is opened there is read whole, old or new, never half of each. One ``stat`` per folder."""
    from .paths import folders_near, forget_listings

    try:
        folders = folders_near(path)
    except (FormatError, TypeError):  # nothing there (the reader says so), or not a path at all
        return
    completed = [journal for folder in folders for journal in recover(Path(folder))]
    if completed:  # the commit renamed files into place: a listing made before it is stale
        forget_listings()
