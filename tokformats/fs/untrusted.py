"""Reading files without trusting them: regular files only, and no allocation larger than the file can hold.

A FIFO blocks an ``open`` forever and ``/dev/zero`` never ends; a header can declare any shape; a compressed stream
can expand a thousandfold. Every reader that reads (rather than maps) data goes through these helpers.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..errors import FormatError, NoFilesError, SizeMismatchError

__all__ = [
    "require_regular",
    "is_regular",
    "read_file",
    "read_exactly",
    "read_json",
    "read_json_object",
    "numbers",
    "MAX_JSON_BYTES",
    "max_json_bytes",
    "MAX_DEFLATE_RATIO",
    "read_npy",
]

class Readable(Protocol):
    """Anything with ``read(n)`` and ``readline()``: a file, a gzip stream, a zip entry."""

    def read(self, size: int = ..., /) -> bytes: ...

    def readline(self, size: int = ..., /) -> bytes: ...


#: The largest JSON file tokformats parses (index files, manifests, sequence lists): 1 GiB; parsing allocates
#: several times the file's size in Python objects, so the cap bounds memory.
MAX_JSON_BYTES = 1 << 30
#: DEFLATE (gzip, zip) cannot expand data more than about 1,032 times: a header promising more is a lie or a bomb.
MAX_DEFLATE_RATIO = 1032
_BLOCK = 1 << 20


def is_regular(path: Path) -> bool:
    """Whether ``path`` is a regular file (following links); False for folders, FIFOs, devices, sockets."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def require_regular(path: Path) -> int:
    """The size of regular file ``path``; :class:`FormatError` for a FIFO, device or socket (which would block or
    never end), ``FileNotFoundError`` when it does not exist."""
    info = os.stat(path)
    require_regular_mode(path, info.st_mode)
    return info.st_size


def require_regular_mode(path: Path | str, mode: int) -> None:
    """:class:`FormatError` unless ``mode`` (``path``'s, from a ``stat`` or the ``fstat`` of a descriptor opened
    on it) is a regular file's: the error says what it is instead."""
    if not stat.S_ISREG(mode):
        kind = (
            "a FIFO"
            if stat.S_ISFIFO(mode)
            else "a device"
            if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "a socket"
            if stat.S_ISSOCK(mode)
            else "a folder"
            if stat.S_ISDIR(mode)
            else "not a regular file"
        )
        raise FormatError(f"{path} is {kind}; tokformats reads datasets from regular files.")


def existing_regular(path: Path | str, why: str = "") -> int:
    """:func:`require_regular`, a missing file (or a broken link) raising :class:`NoFilesError` ("PATH does not
    exist" and ``why``)."""
    try:
        return require_regular(Path(path))
    except FileNotFoundError:
        raise NoFilesError(f"{path} does not exist{why}.") from None


def read_file(path: Path) -> bytes:
    """All bytes of regular file ``path`` (at most its size at the time of the call)."""
    size = require_regular(path)
    with open(path, "rb") as handle:
        return handle.read(size)


def max_json_bytes() -> int:
    """The largest JSON file read whole: :data:`MAX_JSON_BYTES`, or ``TOKFORMATS_MAX_JSON_BYTES`` when set."""
    setting = os.environ.get("TOKFORMATS_MAX_JSON_BYTES", "")
    return int(setting) if setting.isdigit() else MAX_JSON_BYTES


def read_json(path: Path, error: type[FormatError] = FormatError) -> Any:
    """The JSON value in regular file ``path``, parsed only when the file is at most :func:`max_json_bytes` (what
    a parse allocates grows with the file, so the file's size bounds it); anything else, or bytes that are not
    UTF-8 JSON, raises ``error`` naming the file (and the cap, when it is the size)."""
    size = require_regular(path)
    limit = max_json_bytes()
    if size > limit:
        raise error(
            f"{path} is {size:,} bytes, more than the {limit:,} bytes tokformats parses as JSON "
            "(set TOKFORMATS_MAX_JSON_BYTES to allow more)."
        )
    try:
        return json.loads(read_file(path).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise error(f"{path} is not valid JSON ({type(exc).__name__}: {str(exc)[:200]}).") from None


_NUMBER_TYPES = (int, float, np.integer, np.floating, np.bool_)  # bool is an int


def numbers(values: Any, where: str, what: str = "a list of numbers") -> np.ndarray:
    """A list parsed from JSON (or a nested list of rows) as a NumPy array, after checking that every element is a
    number: NumPy given a string among numbers would make an array of strings as wide as the longest one (a 1 MB
    file asking for gigabytes). Raises :class:`FormatError` naming ``where`` and the first element that is not."""
    if not isinstance(values, (list, tuple)):
        raise FormatError(f"{where} must be {what}, found {type(values).__name__}.")
    rows = values if values and all(isinstance(v, (list, tuple)) for v in values) else [values]
    for row in rows:
        for k, value in enumerate(row):
            if not isinstance(value, _NUMBER_TYPES):
                shown = f"{value!r:.60}" if isinstance(value, (str, bytes)) else type(value).__name__
                raise FormatError(f"{where} must be {what}; element {k} is {shown}.")
    if len(rows) > 1 and len({len(row) for row in rows}) > 1:
        raise FormatError(f"{where} must be {what}; its rows have different lengths.")
    try:
        array = np.asarray(values)
    except (ValueError, OverflowError) as exc:
        raise FormatError(f"{where} must be {what} ({exc}).") from None
    if array.dtype.kind not in "iufb":  # an integer past 64 bits makes an array of Python objects
        raise FormatError(f"{where} must be {what} that fit 64 bits.")
    return array


def read_json_object(path: Path, error: type[FormatError] = FormatError) -> dict[str, Any]:
    """The JSON object in regular file ``path`` (a manifest, ``meta.json``, a checkpoint), read under the size cap
    of :func:`read_json`: anything else, or bytes that are not UTF-8 JSON, raises ``error`` (a
    :class:`FormatError`) naming the file."""
    data = read_json(path, error)
    if not isinstance(data, dict):
        raise error(f"{path} must hold a JSON object, found {type(data).__name__}.")
    return data


def read_exactly(handle: Readable, count: int, where: str) -> bytes:
    """``count`` bytes from a (possibly decompressing) stream, read in bounded blocks; a stream that ends early
    raises :class:`SizeMismatchError`."""
    pieces = []
    left = count
    while left:
        block = handle.read(min(left, _BLOCK))
        if not block:
            raise SizeMismatchError(f"{where}: the data ends {left:,} bytes before the {count:,} its header declares.")
        pieces.append(block)
        left -= len(block)
    return b"".join(pieces)


def read_npy(handle: Readable, where: str, *, budget: int, allow_pickle: bool = False) -> np.ndarray:
    """An array from a ``.npy`` stream, checking its header before allocating: the declared bytes must fit
    ``budget`` (what the file can hold). Object arrays load through pickle and need ``allow_pickle``."""
    from numpy.lib import format as npy

    from ..errors import UnsafePickleError

    try:
        version = npy.read_magic(handle)
        if version == (1, 0):
            shape, fortran, dtype = npy.read_array_header_1_0(handle)
        elif version == (2, 0):
            shape, fortran, dtype = npy.read_array_header_2_0(handle)
        else:
            raise ValueError(f"format version {version} is not supported")
    except Exception as exc:  # NumPy parses the header with Python's tokenizer: any of its errors can come out
        raise FormatError(f"{where}: not a readable .npy header ({type(exc).__name__}: {exc}).") from None
    if dtype.hasobject:
        if not allow_pickle:
            raise UnsafePickleError(
                f"{where} holds an object array, which loads through pickle; pass allow_pickle=True only for files "
                "you trust."
            )
        import pickle

        return np.asarray(pickle.load(handle))
    count = int(np.prod(shape, dtype=object))  # Python ints: a lying shape must not overflow
    declared = count * dtype.itemsize
    if declared > budget:
        raise SizeMismatchError(
            f"{where}: the header declares shape {shape} of {dtype} ({declared:,} bytes), more than the file can "
            f"hold ({budget:,} bytes)."
        )
    data = read_exactly(handle, declared, where)
    array = np.frombuffer(data, dtype=dtype, count=count)
    return array.reshape(shape, order="F" if fortran else "C")
