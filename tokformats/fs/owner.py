"""One owner at a time for a work folder: an OS lock that dies with the process holding it.

A work folder (``OUTPUT.tokenize/``, one partition's ``part-NNNN/``) is written by one run at a time; a second run
that wrote into it too would interleave its spools with the first's and publish both (duplicated and lost
documents). The owner holds ``flock`` on ``.owner.lock`` inside the folder: the kernel releases it when the owner
exits, however it exits (``kill -9`` included), so a dead owner never blocks a resume and there is nothing stale
to clean up by hand.

``flock`` belongs to the open file, and a forked child shares its parent's open files: a process-pool worker
forked while the lock is held would keep the folder locked after its parent died. So a child closes its copies of
every lock this module holds right after ``fork`` (:func:`os.register_at_fork`); the parent keeps its own.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from ..errors import FolderBusyError

__all__ = ["LOCK_NAME", "owned_folder", "folder_owner"]

#: The lock file inside an owned folder (hidden; never part of a dataset).
LOCK_NAME = ".owner.lock"
_POLL = 0.05  # seconds between attempts while waiting for an owner to go

_held: set[int] = set()  # descriptors of the locks this process holds
_held_guard = threading.Lock()


def _close_inherited_locks() -> None:
    """In a forked child: drop its copies of the parent's locks (the parent still holds them)."""
    for fd in list(_held):
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_inherited_locks)


def folder_owner(folder: Path) -> int | None:
    """The process id the owner wrote into ``folder``'s lock file (for messages), or None."""
    with contextlib.suppress(OSError, ValueError):
        return int((folder / LOCK_NAME).read_text(encoding="ascii").strip() or "x")
    return None


def _try_lock(folder: Path) -> int | None:
    """A descriptor holding the lock of ``folder``, or None when another owner holds it."""
    import fcntl

    path = folder / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    try:  # the previous owner may have removed or renamed the folder between our open and our lock
        same = os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        same = False
    if not same:
        os.close(fd)
        raise InterruptedError(str(path))
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode("ascii"))
    return fd


@contextlib.contextmanager
def owned_folder(folder: Path, *, wait: float = 0.0, what: str = "run") -> Iterator[Path]:
    """Own ``folder`` (made when missing) for the block: refused at once (``wait=0``), or after waiting up to
    ``wait`` seconds, with :class:`FolderBusyError` naming the folder and the owner's process id when another
    process or thread owns it. Where there is no ``flock`` (Windows) the block runs unlocked."""
    try:
        import fcntl  # noqa: F401 - only to learn whether flock exists
    except ImportError:
        folder.mkdir(parents=True, exist_ok=True)
        yield folder
        return
    deadline = time.monotonic() + wait
    while True:
        folder.mkdir(parents=True, exist_ok=True)
        try:
            fd = _try_lock(folder)
        except (InterruptedError, FileNotFoundError):  # the folder went away under us: take the new one
            continue
        if fd is not None:
            break
        if time.monotonic() >= deadline:
            owner = folder_owner(folder)
            by = f"process {owner}" if owner else "another process"
            raise FolderBusyError(
                f"{folder} is in use by another {what} ({by}{', this process' if owner == os.getpid() else ''}); "
                f"two runs writing one work folder would mix their data. Wait for that run to end (or stop it), "
                f"then run again."
            )
        time.sleep(_POLL)
    with _held_guard:
        _held.add(fd)
    try:
        yield folder
    finally:
        with _held_guard:
            _held.discard(fd)
        os.close(fd)  # releases the lock
