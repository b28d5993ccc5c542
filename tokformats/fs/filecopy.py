"""Copying file contents by the operating system, without passing the bytes through Python."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import BinaryIO

__all__ = ["append_file", "append_open_file", "copy_progress"]

_STEP = 1 << 30
#: Told the bytes each copy step moved, inside :func:`copy_progress` (a merge's progress bar); else None.
_REPORT: ContextVar[Callable[[int], None] | None] = ContextVar("tokformats_copy_progress", default=None)


@contextlib.contextmanager
def copy_progress(report: Callable[[int], None]) -> Iterator[None]:
    """Call ``report(n)`` with the bytes every :func:`append_file` in this block (of this thread or task) copies,
    after each kernel copy step (at most 1 GiB), so that a format's merge by copy shows progress without passing
    a callback through its code."""
    token = _REPORT.set(report)
    try:
        yield
    finally:
        _REPORT.reset(token)


def append_file(source: Path, destination: BinaryIO) -> int:
    """Append all of ``source`` to the open ``destination``; return the number of bytes copied.

    Uses ``copy_file_range`` (the kernel copies, and may share blocks) or ``sendfile``, falling back
    to plain reads and writes where neither works.
    """
    with open(source, "rb") as handle:
        return append_open_file(handle, destination, source.stat().st_size, name=str(source))


def append_open_file(handle: BinaryIO, destination: BinaryIO, size: int, *, name: str = "the source") -> int:
    """Append the first ``size`` bytes of the open file ``handle`` (read from its start, whatever its position) to
    the open ``destination``, as :func:`append_file` does (the kernel copies); return ``size``. Raises ``OSError``
    when the source holds fewer bytes. The caller keeps ``handle``: what it checked of that open file (its
    ``fstat``) is what is copied, even if the name is replaced meanwhile."""
    destination.flush()
    report = _REPORT.get()
    remaining = size
    out_fd, in_fd = destination.fileno(), handle.fileno()
    position = os.lseek(out_fd, 0, os.SEEK_END)
    read_from = 0
    try:
        while remaining:
            if hasattr(os, "copy_file_range"):
                copied = os.copy_file_range(in_fd, out_fd, min(remaining, _STEP), read_from)
            else:
                copied = os.sendfile(out_fd, in_fd, read_from, min(remaining, _STEP))
            if copied == 0:
                break
            read_from += copied
            remaining -= copied
            if report is not None:
                report(copied)
    except OSError:
        # Some file systems refuse kernel copies: restart this file the portable way.
        os.lseek(out_fd, position, os.SEEK_SET)
        os.ftruncate(out_fd, position)
        if report is not None and remaining != size:
            report(remaining - size)  # what the kernel copied of this file is taken back
        handle.seek(0)
        remaining = size
        while remaining:
            piece = handle.read(min(remaining, 1 << 24))
            if not piece:
                break
            destination.write(piece)
            remaining -= len(piece)
        destination.flush()
        if report is not None:
            report(size - remaining)
    destination.seek(0, os.SEEK_END)
    if remaining:
        raise OSError(f"{name} shrank while it was being copied ({remaining:,} bytes missing)")
    return size
