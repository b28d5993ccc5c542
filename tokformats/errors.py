"""The library's error types.

Every error tokformats raises on bad input derives from :class:`FormatError`, which is a
:class:`ValueError`, so ``except ValueError`` keeps working for callers that do not know us.
Messages are full sentences that name the file, the field, what was expected and what was found.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from contextvars import ContextVar

__all__ = [
    "FormatError",
    "UnknownFormatError",
    "HeaderError",
    "SizeMismatchError",
    "DTypeError",
    "TokenRangeError",
    "OutputExistsError",
    "FolderBusyError",
    "NoFilesError",
    "UnsafePickleError",
    "ConfigError",
    "DataWarning",
    "option",
    "command_line_flags",
]

#: Set by the command line while a subcommand runs: Python option name -> its flag.
_FLAGS: ContextVar[Mapping[str, str] | None] = ContextVar("tokformats_flags", default=None)


def option(name: str, value: str = "True") -> str:
    """An option as the caller spells it, for messages: ``overwrite=True`` or ``on_error='skip'`` from Python,
    ``--overwrite`` or ``--on-error skip`` from the command line. ``value`` is the Python spelling of the value
    (``"True"``, ``"'skip'"``, or a placeholder such as ``"ID"``). A flag recorded as ``"not --flag"`` sets the
    option False (``keep_boundaries=False`` is ``--drop-boundaries``)."""
    flags = _FLAGS.get()
    if flags is None or name not in flags:
        return f"{name}={value}"
    if flags[name].startswith("not "):  # a flag that sets the option False: --drop-boundaries for keep_boundaries
        return flags[name][len("not ") :] if value == "False" else f"no {flags[name][len('not ') :]}"
    if value == "True":
        return flags[name]
    return f"{flags[name]} {value.strip(chr(39))}"


@contextlib.contextmanager
def command_line_flags(flags: Mapping[str, str]) -> Iterator[None]:
    """Within the block, :func:`option` names options by these command-line flags."""
    token = _FLAGS.set(flags)
    try:
        yield
    finally:
        _FLAGS.reset(token)


class FormatError(ValueError):
    """Root of every tokformats error: the input or an option does not fit the format."""


class UnknownFormatError(FormatError):
    """No registered format recognises the path, or a format name is not registered."""


class HeaderError(FormatError):
    """A header or index field holds a value the format does not allow (magic, version, code, ...)."""


class SizeMismatchError(FormatError):
    """A file's size disagrees with what its header or index declares (truncated or trailing bytes)."""


class DTypeError(FormatError):
    """A dtype is missing, unknown, or not one the format can store."""


class TokenRangeError(FormatError):
    """A value does not fit the output dtype or exceeds the declared ``vocab_size``."""


class OutputExistsError(FormatError, FileExistsError):
    """The destination already holds a dataset and ``overwrite=True`` was not given."""


class FolderBusyError(FormatError):
    """A work folder is owned by another live run (process or thread); two runs writing it would mix their data."""


class NoFilesError(FormatError, FileNotFoundError):
    """A path, glob or list names no file that exists."""


class UnsafePickleError(FormatError):
    """A pickle asks for something outside the allow-list; nothing of it was executed."""


class ConfigError(FormatError):
    """Options that cannot work together or with the data: a split with no tokens asked for samples, a
    non-positive sequence length, a negative blend weight, a blend of different dtypes, a resume state taken
    from another index."""


class DataWarning(UserWarning):
    """The data opens, but looks wrong: ids implausible for the dtype given, a delimiter that never occurs."""
