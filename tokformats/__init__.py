"""tokformats: read, write and convert the on-disk formats of tokenized LLM training data.

>>> import tokformats
>>> r = tokformats.open("fineweb_train_000001.bin")        # doctest: +SKIP
>>> with tokformats.create("out/corpus", format="llmc", vocab_size=50257) as w:  # doctest: +SKIP
...     w.write([50256, 15496, 995])

``tokformats.formats`` is the package of format modules and also the read-only table of formats (name ->
descriptor): ``tokformats.formats["megatron"]``, ``tokformats.formats.megatron``. Each format module is also the
attribute ``tokformats.NAME`` (``tokformats.megatron``, ...), imported on first use; ``dir(tokformats)`` lists them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import _moved, formats  # formats: the package of format modules, also the table of formats
from .api import convert, create, open
from .core.arrays import ConcatenatedArray
from .core.protocol import Reader, TokenReader, TokenWriter, Writer
from .core.registry import FormatDescriptor, detect, register
from .core.registry import formats as _format_table
from .errors import (
    ConfigError,
    DataWarning,
    DTypeError,
    FolderBusyError,
    FormatError,
    HeaderError,
    NoFilesError,
    OutputExistsError,
    SizeMismatchError,
    TokenRangeError,
    UnknownFormatError,
    UnsafePickleError,
)

__version__ = "0.1.0"

_moved.install()  # the module paths of 0.1, for one release

if TYPE_CHECKING:
    from .quality.contamination import contamination
    from .remote import publish
    from .tokenization.pipeline import tokenize
    from .tokenization.tokenizer import train_tokenizer


def __getattr__(name: str) -> Any:
    if name == "train_tokenizer":  # imports the tokenizer glue only when asked for
        from .tokenization.tokenizer import train_tokenizer

        return train_tokenizer
    if name == "tokenize":
        from .tokenization.pipeline import tokenize

        return tokenize
    if name == "contamination":  # the eval side needs a tokenizer: imported only when asked for
        from .quality.contamination import contamination

        return contamination
    if name == "publish":
        from .remote import publish

        return publish
    # Format modules are exposed as ``tokformats.NAME`` and imported on first use, so that ``import tokformats``
    # stays cheap (a script that only opens ``.pt`` shards never imports the Megatron code).
    entry = _format_table.get(name)
    if entry is not None and entry.module.startswith(f"{__name__}.formats."):
        module = entry.load()
        globals()[name] = module
        return module
    raise AttributeError(f"module 'tokformats' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public names, with every built-in format module (``tokformats.NAME``)."""
    modules = [n for n, d in _format_table.items() if d.module.startswith(f"{__name__}.formats.") and n.isidentifier()]
    return sorted({*__all__, *modules})


__all__ = [
    "open",
    "create",
    "convert",
    "detect",
    "formats",
    "register",
    "FormatDescriptor",
    "Reader",
    "TokenReader",
    "Writer",
    "TokenWriter",
    "ConcatenatedArray",
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
    "train_tokenizer",
    "tokenize",
    "publish",
    "contamination",
    "__version__",
]
