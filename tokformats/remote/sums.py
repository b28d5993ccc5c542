"""``SHA256SUMS``, the checksum sidecar ``publish`` writes (GNU ``sha256sum`` lines: ``digest  name``), read from a
store without trusting it: line by line, each line bounded, UTF-8, and of the one form allowed."""

from __future__ import annotations

import re

from .backends import RemoteError

__all__ = ["SUMS", "MAX_SUMS_LINE", "IndexFormatError", "parse_sums_line"]

#: The sidecar's file name.
SUMS = "SHA256SUMS"
#: The longest ``SHA256SUMS`` line read (a digest, two spaces, a name of at most 4096 bytes, a line end).
MAX_SUMS_LINE = 64 + 3 + 4096 + 2


class IndexFormatError(RemoteError):
    """An index file of a remote dataset (``SHA256SUMS``) holds something other than what its format allows."""

    transient = False


def parse_sums_line(raw: bytes, where: str) -> tuple[str, str] | None:
    """``(digest, name)`` of one ``SHA256SUMS`` line (GNU ``digest  name`` or ``digest *name``), None for a blank
    line."""
    if len(raw) > MAX_SUMS_LINE:
        raise IndexFormatError(f"{where} is longer than {MAX_SUMS_LINE:,} bytes: not a 'sha256  name' line.")
    try:
        line = raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError:
        raise IndexFormatError(f"{where} is not UTF-8 text: not a 'sha256  name' line.") from None
    if not line.strip():
        return None
    match = re.fullmatch(r"([0-9a-fA-F]{64}) [ *](.+)", line)
    if match is None:
        raise IndexFormatError(f"{where} is {line[:100]!r}, not a 'sha256  name' line.")
    return match.group(1).lower(), match.group(2)
