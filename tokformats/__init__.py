"""tokformats: read, write and convert the on-disk formats of tokenized LLM training data.

>>> import tokformats
>>> r = tokformats.open("fineweb_train_000001.bin")        # doctest: +SKIP
>>> with tokformats.create("out/corpus", format="llmc", vocab_size=50257) as w:  # doctest: +SKIP
...     w.write([50256, 15496, 995])

``tokformats.formats`` is the read-only table of formats (name -> descriptor). The modules holding
each format's reader and writer live in the ``tokformats.formats`` *package*; their public faces
are the attributes ``tokformats.raw``, ``tokformats.llmc``, ... below.
"""

from __future__ import annotations

from .api import convert, create, open
from .arrays import ConcatenatedArray
from .errors import (
    DTypeError,
    FormatError,
    HeaderError,
    NoFilesError,
    OutputExistsError,
    SizeMismatchError,
    TokenRangeError,
    UnknownFormatError,
    UnsafePickleError,
)
from .formats import llmc, megatron, pt, raw
from .protocol import Reader, TokenReader, TokenWriter, Writer
from .registry import FormatDescriptor, detect, register
from .registry import formats as _format_table
from .tokenizer import train_tokenizer

# Importing any format module binds ``tokformats.formats`` to the *package* tokformats/formats/;
# the public name is the registry's read-only table, so it is bound here, after every import.
formats = _format_table

__version__ = "0.1.0"

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
    "NoFilesError",
    "UnsafePickleError",
    "raw",
    "llmc",
    "megatron",
    "pt",
    "train_tokenizer",
    "__version__",
]
