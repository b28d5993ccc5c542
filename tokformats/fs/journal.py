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

A journal is found in folders people download, so it is not trusted either: it names files relative to its own
folder, and recovery carries it out only when every rename moves one of tokformats' temporaries (the pattern above)
onto a plain name inside the folder, and every removal names a dataset file inside the folder (a data or index
suffix, :data:`REMOVABLE_SUFFIXES`; never the journal, a hidden file, a link, or anything outside). A journal naming
anything else is refused with :class:`UnsafeJournalError` before anything is touched. The remote cache never
downloads one and ``publish`` never uploads one (both skip hidden files).
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
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from ..errors import FormatError
from .names import UnsafeNameError, safe_relative_name

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
    "one_recovery",
    "remove_dead_temporaries",
    "UnsafeJournalError",
]


class UnsafeJournalError(FormatError):
    """A commit journal names a file outside its folder, or a file tokformats did not make: nothing was done."""


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
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError, FormatError):
        renames, _ = read_journal(journal)
        return path in {tmp for tmp, _ in renames}
    return False


def _relative(folder: Path, path: Path) -> str:
    """``path`` as the journal in ``folder`` records it: relative to the folder (POSIX separators)."""
    return Path(os.path.relpath(path, folder)).as_posix()


def write_journal(folder: Path, renames: list[tuple[Path, Path]], remove: list[Path]) -> Path:
    """Make the commit durable: the journal (written whole, then renamed into place) lists what to do, by names
    relative to ``folder``."""
    journal = folder / JOURNAL
    remove_dead_temporaries(journal)  # the staging file of a journal whose writer was killed writing it
    staging = temporary_name(journal)
    text = json.dumps({
        "version": 2,
        "renames": [[_relative(folder, t), _relative(folder, f)] for t, f in renames],
        "remove": [_relative(folder, p) for p in remove],
    })  # fmt: skip
    try:
        with open(staging, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(staging, journal)
    except BaseException:  # a full disk (or an interrupt) while staging: no half journal is left behind
        staging.unlink(missing_ok=True)
        raise
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


def recover(folder: Path | str) -> list[Path]:
    """Complete every unfinished commit in ``folder`` (a killed writer's); returns the journals completed.

    Raises :class:`FormatError` naming the journal when it cannot be completed (a read-only file system, a lost
    temporary): the dataset there is then neither old nor new, and must not be read.
    """
    if not os.path.exists(os.path.join(folder, JOURNAL)):  # the common case: one stat, no Path built
        return []
    with folder_lock(Path(folder)):
        return _recover_locked(Path(folder) / JOURNAL)


#: What a stale output a commit removes may be called: the data and index files of the formats whose writers remove
#: an earlier dataset's files (shards, chunks, ``meta.json``, ...). A journal removing anything else is refused.
REMOVABLE_SUFFIXES = (".bin", ".idx", ".pt", ".json", ".npy", ".gz", ".arrow", ".ds", ".index", ".loss", ".metadata")

#: The largest journal read back (a commit of many shards names each twice).
MAX_JOURNAL_BYTES = 64 << 20


def _journal_path(folder: Path, recorded: object, where: str, *, temporary: bool) -> Path:
    """The path a journal entry names, when it is one recovery may touch: inside ``folder`` (a name relative to it;
    an absolute path inside it, as older versions wrote), a plain name, no link on the way; a rename's source must be
    one of tokformats' temporaries, and nothing else may be hidden."""
    name = recorded
    if isinstance(recorded, str) and recorded.startswith("/"):
        inside = os.path.relpath(recorded, folder)
        name = Path(inside).as_posix() if not inside.startswith("..") else recorded
    try:
        checked = safe_relative_name(name, where=where, folder=folder)
    except UnsafeNameError as error:
        raise UnsafeJournalError(str(error)) from None
    base = checked.rsplit("/", 1)[-1]
    if temporary and not _TEMPORARY.match(base):
        raise UnsafeJournalError(f"{where}: {checked!r} is not one of tokformats' temporaries (.NAME.PID.ID.tmp).")
    if not temporary and (base.startswith(".") or base == JOURNAL):
        raise UnsafeJournalError(f"{where}: {checked!r} is a hidden file, never a dataset's output.")
    return folder / checked


def read_journal(journal: Path) -> tuple[list[tuple[Path, Path]], list[Path]]:
    """The renames and removals journal ``journal`` records, every name checked (:func:`_journal_path`);
    :class:`UnsafeJournalError` when one is not allowed, :class:`FormatError` when it is not a journal."""
    from .untrusted import require_regular

    folder = journal.parent
    if os.path.islink(journal) or require_regular(journal) > MAX_JOURNAL_BYTES:
        raise UnsafeJournalError(f"{journal} is a link or larger than {MAX_JOURNAL_BYTES:,} bytes: not a journal.")
    entries = json.loads(journal.read_bytes().decode("utf-8"))
    if not isinstance(entries, dict) or not isinstance(entries.get("renames"), list) or not isinstance(
        entries.get("remove"), list
    ):  # fmt: skip
        raise FormatError(f"{journal} is not a commit journal (it needs 'renames' and 'remove' lists).")
    renames = []
    for k, pair in enumerate(entries["renames"]):
        if not isinstance(pair, list) or len(pair) != 2:
            raise FormatError(f"{journal}: renames[{k}] is {pair!r:.80}, not a [temporary, final] pair.")
        tmp = _journal_path(folder, pair[0], f"{journal}: renames[{k}]", temporary=True)
        final = _journal_path(folder, pair[1], f"{journal}: renames[{k}]", temporary=False)
        if tmp.parent != final.parent:
            raise UnsafeJournalError(f"{journal}: renames[{k}] moves {pair[0]!r} into another folder ({pair[1]!r}).")
        renames.append((tmp, final))
    remove = [
        _journal_path(folder, p, f"{journal}: remove[{k}]", temporary=False) for k, p in enumerate(entries["remove"])
    ]
    for k, path in enumerate(remove):
        if not path.name.endswith(REMOVABLE_SUFFIXES):
            raise UnsafeJournalError(
                f"{journal}: remove[{k}] is {path.name!r}, not a dataset file tokformats writes "
                f"({', '.join(REMOVABLE_SUFFIXES)})."
            )
    return renames, remove


def _recover_locked(journal: Path) -> list[Path]:
    done: list[Path] = []
    if journal.exists():
        try:
            renames, remove = read_journal(journal)
            finish_journal(journal, renames, remove)
        except UnsafeJournalError as error:
            raise UnsafeJournalError(
                f"{journal} records an interrupted commit that is refused, and nothing was changed: {error} A journal "
                f"names only files tokformats wrote in its own folder; if this folder came from elsewhere, delete it: "
                f"rm '{journal}'"
            ) from None
        except FileNotFoundError as error:
            if not journal.exists():  # another process completed it meanwhile
                return done
            raise FormatError(
                f"{journal} records an interrupted commit that cannot be completed ({error}); the datasets it names "
                "may be incomplete: write them again."
            ) from None
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as error:
            raise FormatError(
                f"{journal} records an interrupted commit that cannot be completed ({error}); the datasets it names "
                "may be incomplete: fix the cause (a read-only folder?) or write them again."
            ) from None
        done.append(journal)
    return done


#: The folders recovered in the current :func:`one_recovery` block (None outside one).
_RECOVERED: ContextVar[set[str] | None] = ContextVar("tokformats_recovered", default=None)


@contextmanager
def one_recovery() -> Iterator[None]:
    """Within the block, :func:`recover_near` completes each folder's commits once: ``tokformats.open`` detects the
    format (reading the files) and then constructs the reader, and both first recover what they read."""
    token = _RECOVERED.set(set())
    try:
        yield
    finally:
        _RECOVERED.reset(token)


def recover_near(path: object) -> None:
    """Complete the commits a killed writer left beside (or inside) ``path`` (a file, prefix, folder, glob or
    list), so that what is opened there is read whole, old or new, never half of each. One ``stat`` per folder."""
    from .paths import folders_near, forget_listings

    try:
        folders = folders_near(path)
    except (FormatError, TypeError):  # nothing there (the reader says so), or not a path at all
        return
    done = _RECOVERED.get()
    for folder in folders:
        if done is not None:
            if folder in done:
                continue
            done.add(folder)
        if recover(folder):
            forget_listings()  # the commit renamed files in: what was listed before is not what is there now
