"""The library's error types.

Every error tokformats raises on bad input derives from :class:`FormatError`, which is a
:class:`ValueError`, so ``except ValueError`` keeps working for callers that do not know us.
Messages are full sentences that name the file, the field, what was expected and what was found.
"""

from __future__ import annotations

__all__ = [
    "FormatError",
    "UnknownFormatError",
    "HeaderError",
    "SizeMismatchError",
    "DTypeError",
    "TokenRangeError",
    "OutputExistsError",
    "NoFilesError",
    "UnsafePickleError",
    "ConfigError",
    "DataWarning",
]


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
