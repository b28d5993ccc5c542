"""The top-level verbs: :func:`open`, :func:`create` and :func:`convert`."""

from __future__ import annotations

from typing import Any

from .errors import DTypeError, UnknownFormatError
from .protocol import PathLike, Reader, TokenReader, TokenWriter, Writer
from .registry import descriptor, detect, formats

__all__ = ["open", "create", "convert"]


def open(path: Any, format: str | None = None, **options: Any) -> Reader[Any]:
    """Open a dataset for reading; the format is detected from content unless ``format=`` is given.

    Args:
        path: a file, a prefix (Megatron), a folder (Time-MoE, ``.pt`` shards), a glob or a list of files.
        format: a name from :data:`tokformats.formats`; required for headerless raw streams.
        **options: passed to the format's reader (``dtype=``, ``eos=``, ``bos=``, ...).

    Returns:
        The format's reader. Use it as a context manager, or call ``close()``.
    """
    name = format if format is not None else detect(path)
    reader: Reader[Any] = descriptor(name).reader(path, **options)
    return reader


def create(path: PathLike, format: str, **options: Any) -> Writer[Any]:
    """Create a writer; its files appear atomically when its ``with`` block ends without an exception.

    Args:
        path: where to write (a file, a prefix or a folder, as the format names datasets).
        format: a writable format name from :data:`tokformats.formats`.
        **options: passed to the format's writer (``vocab_size=``, ``dtype=``, ``overwrite=``, ...).
    """
    entry = descriptor(format)
    writer_class = entry.writer
    if writer_class is None:
        writable = ", ".join(n for n, d in formats.items() if d.writable)
        raise UnknownFormatError(f"format {format!r} cannot be written; writable formats: {writable}.")
    writer: Writer[Any] = writer_class(path, **options)
    return writer


def convert(
    source: Any,
    destination: PathLike,
    format: str,
    *,
    source_format: str | None = None,
    source_options: dict[str, Any] | None = None,
    batch_tokens: int = 1 << 24,
    **writer_options: Any,
) -> dict[str, Any]:
    """Copy a corpus into another format, document by document, in batches of about ``batch_tokens``.

    The token stream is preserved exactly: documents keep whatever delimiters they include. When
    neither ``dtype=`` nor ``vocab_size=`` is given, the source dtype is kept if the destination can
    store it, else the smallest dtype holding the largest id is chosen. Values are copied as stored:
    Time-MoE sequences stored normalised stay normalised, and their mean/std are not carried over.

    Returns:
        ``{"documents", "tokens", "files"}`` of what was written.
    """
    writer_class = descriptor(format).writer
    if writer_class is None or not issubclass(writer_class, TokenWriter):
        raise UnknownFormatError(f"format {format!r} does not store token corpora; convert into a corpus format.")
    reader = open(source, format=source_format, **(source_options or {}))
    if not isinstance(reader, TokenReader):
        raise UnknownFormatError(f"{source} is not a token corpus ({reader.format}); only corpora can be converted.")
    with reader:
        options = dict(writer_options)
        if "dtype" not in options and "vocab_size" not in options:
            options["dtype"] = reader.dtype
            try:
                writer = create(destination, format, **options)
            except DTypeError:
                del options["dtype"]
                top = reader.tokens.max() if reader.num_tokens else 0
                options["vocab_size"] = int(top) + 1
                writer = create(destination, format, **options)
        else:
            writer = create(destination, format, **options)
        assert isinstance(writer, TokenWriter)
        with writer:
            writer.write_all(reader.tokens, reader.lengths, batch_tokens=batch_tokens)
        return {"documents": len(reader), "tokens": reader.num_tokens, "files": writer.written}
