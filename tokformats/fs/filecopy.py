"""Copying file contents by the operating system, without passing the bytes through Python."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import BinaryIO

__all__ = ["append_file", "copy_progress"]

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
    to ``shutil.copyfileobj`` where neither exists.
    """
    destination.flush()
    report = _REPORT.get()
    size = source.stat().st_size
    with open(source, "rb") as handle:
        remaining = size
        out_fd, in_fd = destination.fileno(), handle.fileno()
        position = os.lseek(out_fd, 0, os.SEEK_END)
        try:
            while remaining:
                if hasattr(os, "copy_file_range"):
                    copied = os.copy_file_range(in_fd, out_fd, min(remaining, _STEP))
                else:
                    copied = os.sendfile(out_fd, in_fd, None, min(remaining, _STEP))
                if copied == 0:
                    break
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
            shutil.copyfileobj(handle, destination, 1 << 24)
            destination.flush()
            remaining = 0
            if report is not None:
                report(size)
    destination.seek(0, os.SEEK_END)
    if remaining:
        raise OSError(f"{source} shrank while it was being copied ({remaining:,} bytes missing)")
    return size
