"""Copying file contents by the operating system, without passing the bytes through Python."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import BinaryIO

__all__ = ["append_file"]

_STEP = 1 << 30


def append_file(source: Path, destination: BinaryIO) -> int:
    """Append all of ``source`` to the open ``destination``; return the number of bytes copied.

    Uses ``copy_file_range`` (the kernel copies, and may share blocks) or ``sendfile``, falling back
    to ``shutil.copyfileobj`` where neither exists.
    """
    destination.flush()
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
        except OSError:
            # Some file systems refuse kernel copies: restart this file the portable way.
            os.lseek(out_fd, position, os.SEEK_SET)
            os.ftruncate(out_fd, position)
            handle.seek(0)
            remaining = size
            shutil.copyfileobj(handle, destination, 1 << 24)
            destination.flush()
            remaining = 0
    destination.seek(0, os.SEEK_END)
    if remaining:
        raise OSError(f"{source} shrank while it was being copied ({remaining:,} bytes missing)")
    return size
