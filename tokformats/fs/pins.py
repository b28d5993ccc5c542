"""A finished file's pin: what lets a later reader of that file know, from one ``fstat``, that nothing has written
to it since its writer pinned it (``tokenize``'s spools: right after reading every byte back and finding it equal
to the hash of what was written).

``tokenize``'s spools are hashed as they are written (a running SHA-256 of every byte appended, recorded in the
checkpoint). A finished spool is read back once and compared with that hash, by the worker that wrote it, which
then pins it; the parent that joins the spools, one after another while the workers compete for the same cores,
then needs no second pass over every token (about 1 CPU-second per GB) when nothing touched the file since:

- :func:`pin_file`, by the writer after its last write, ``fsync`` and the read back: the file's modification time is set
  one nanosecond back from the one the kernel gave its last write, and the pin is
  ``[device, inode, size, mtime, ctime]`` as ``stat`` then reports them (no pin where the file system rounds the
  time set); a write between the read back and the pin (microseconds, while the run holds the folder's lock) is
  the one a pin cannot tell apart;
- :func:`pinned`, by the reader, on the descriptor it copies from, before and after the copy: equal, or not.

Why a write after the pin is seen: ``write``, ``truncate`` and ``mmap`` stores (at their first fault on a page
cleaned by ``fsync``) set the modification time to the current clock, which is never the pinned value: that is one
nanosecond *before* the time the kernel stamped the writer's own last write, and the clock has moved on since (a
clock with coarse ticks gives a write in the same tick that tick's time, not the pinned one; only a wall clock set
back to that very nanosecond could). Replacing the file changes the inode, appending the size, setting the time
(``utime``) the change time. What a pin cannot see: corruption on the medium, a write to the raw block device, and
a process that deliberately writes and then sets the time back within one clock tick; the pins guard against
accidents (a killed run's orphaned worker, a tool writing in place), not against such a process. A reader that
finds the pin changed, or none, reads the file and compares the writer's hash as before: a pin is never needed for
correctness, only for speed.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["pin_file", "pinned"]


def _pin_of(info: os.stat_result) -> list[int]:
    return [info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns]


def pin_file(path: Path) -> list[int] | None:
    """Pin the finished file ``path`` (its writer has written and fsynced every byte): its modification time is set
    one nanosecond back, and ``[device, inode, size, mtime, ctime]`` returned, to be recorded with the file's hash.
    None where the time cannot be set to the nanosecond (the reader then hashes the file)."""
    try:
        info = os.stat(path)
        mark = info.st_mtime_ns - 1
        os.utime(path, ns=(info.st_atime_ns, mark))
        pinned_info = os.stat(path)
    except OSError:
        return None
    # A file system that rounds the time set (FAT's 2 s, ext3's 1 s) could stamp a later write with that same
    # rounded time: no pin there.
    if pinned_info.st_mtime_ns != mark or pinned_info.st_size != info.st_size:
        return None
    return _pin_of(pinned_info)


def pinned(fd: int, pin: object) -> bool:
    """Whether the open file ``fd`` is still the file that ``pin`` (from :func:`pin_file`, read back from a
    checkpoint: anything) was taken of, untouched since."""
    if not isinstance(pin, list) or len(pin) != 5 or not all(type(v) is int for v in pin):
        return False
    return _pin_of(os.fstat(fd)) == pin
