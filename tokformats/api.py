"""The top-level verbs: :func:`open`, :func:`create` and :func:`convert`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .core.boundaries import choose_delimiter, delimit
from .core.documents import document_runs
from .core.progress import progress_bar
from .core.protocol import PathLike, Reader, TokenReader, TokenWriter, Writer
from .core.registry import descriptor, detect, formats
from .errors import ConfigError, DTypeError, FormatError, NoFilesError, UnknownFormatError, option
from .fs.journal import recover_near
from .fs.paths import is_url

__all__ = [
    "open",
    "create",
    "create_corpus",
    "convert",
    "merge",
    "export_tokenizer",
    "vocabulary_formats",
    "corpus_writers",
]


def open(path: Any, format: str | None = None, **options: Any) -> Reader[Any]:
    """Open a dataset for reading; the format is detected from content unless ``format=`` is given.

    Args:
        path: a file, a prefix (Megatron), a folder (Time-MoE, ``.pt`` shards), a glob or a list of files; or a URL
            (``https://``, ``s3://``, ``gs://``, ``hf://``: fetched into a verified local cache first, see
            :mod:`tokformats.remote`; ``cache_dir=``, ``max_cache_bytes=`` and ``offline=`` configure the cache).
        format: a name from :data:`tokformats.formats`; required for headerless raw streams.
        **options: passed to the format's reader (``dtype=``, ``eos=``, ``bos=``, ...).

    Returns:
        The format's reader. Use it as a context manager, or call ``close()``.
    """
    if is_url(path):
        from .remote import open_url

        def open_cached(target: Any, **cached: Any) -> Reader[Any]:
            """:func:`open` on the cached copy; its messages name the URL the user gave, not the cache path."""
            try:
                return open(target, **cached)
            except FormatError as error:
                raise _naming_url(error, target, path) from None

        remote: Reader[Any] = open_url(path, open_cached, format=format, **options)
        return remote
    if format is None:
        recover_near(path)  # detection reads the files: a killed writer's commit is completed first
    name = format if format is not None else detect(path)
    reader_class = descriptor(name).reader
    _check_options(path, name, "reader", options)
    reader: Reader[Any] = reader_class(path, **options)
    return reader


def _parameters(cls: type[Any] | None) -> set[str] | None:
    """The keyword options ``cls`` takes (for a class that dispatches to subclasses, such as ``.pt``'s file and
    folder readers, those of any of them); None when it takes any."""
    import inspect

    if cls is None:
        return set()
    parameters = inspect.signature(cls).parameters.values()
    subclasses: list[type[Any]] = cls.__subclasses__()
    if any(p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL) for p in parameters) and not subclasses:
        return None
    found = {p.name for p in parameters if p.name not in ("path", "args", "kwargs")}
    for subclass in subclasses:
        taken = _parameters(subclass)
        if taken is None:
            return None
        found |= taken
    return found


def _check_options(path: Any, name: str, role: str, options: dict[str, Any]) -> None:
    """Refuse, in one line, an option the format's ``role`` (``reader``/``writer``) does not take, naming the
    formats that take it."""
    taken = _parameters(getattr(descriptor(name), role))
    unknown = sorted(set(options) - taken) if taken is not None else []
    if not unknown:
        return
    key = unknown[0]
    others = sorted(n for n, d in formats.items() if key in (_parameters(getattr(d, role)) or set()))
    where = f"it applies to {', '.join(others)}" if others else "no format takes it"
    accepted = [_spelled(k) for k in sorted((taken or set()) - {"remote"})]  # remote: set by open(URL) itself
    takes = f"takes {', '.join(accepted)}" if accepted else "takes no options"
    raise ConfigError(f"{path}: the {name} {role} {takes}, not {_spelled(key)}; {where}.")


def _spelled(name: str) -> str:
    """An option's name as the caller spells it (``--eos`` on the command line, ``eos=`` in Python)."""
    return option(name, "X").split(" ")[0].replace("=X", "=")


def _naming_url(error: FormatError, target: Any, url: str) -> FormatError:
    """``error`` with the cached copy's path in its message replaced by the URL it came from."""
    text = str(error).replace(str(target), url.rstrip("/") if not str(target).endswith("/") else url)
    try:
        renamed = type(error)(text)
    except TypeError:  # an error type built from other arguments keeps its own message
        return error
    return renamed


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
    _check_options(path, format, "writer", options)
    writer: Writer[Any] = writer_class(path, **options)
    return writer


def create_corpus(path: PathLike, format: str, **options: Any) -> TokenWriter:
    """:func:`create` for a corpus format: the writer of token documents (:class:`UnknownFormatError` for a format
    that stores something else, such as a vocabulary)."""
    writer_class = corpus_writer(format)
    _check_options(path, format, "writer", options)
    return writer_class(path, **options)


def corpus_writers() -> dict[str, type[TokenWriter]]:
    """Every registered format that writes token corpora, and its writer class (imports their modules)."""
    found = {}
    for name, entry in formats.items():
        writer = entry.writer
        if writer is not None and issubclass(writer, TokenWriter):
            found[name] = writer
    return found


def corpus_writer(format: str) -> type[TokenWriter]:
    """The writer class of corpus format ``format``; :class:`UnknownFormatError` for others (a vocabulary)."""
    writer_class = descriptor(format).writer
    if writer_class is None or not issubclass(writer_class, TokenWriter):
        names = ", ".join(corpus_writers())
        raise UnknownFormatError(f"format {format!r} does not store token corpora; use one of {names}.")
    return writer_class


def _index_formats() -> str:
    """Names of the corpus formats that store document boundaries (for messages)."""
    return ", ".join(name for name, writer in corpus_writers().items() if writer.boundaries == "index")


def convert(
    source: Any,
    destination: PathLike,
    format: str,
    *,
    source_format: str | None = None,
    source_options: dict[str, Any] | None = None,
    eos: int | None = None,
    bos: int | None = None,
    keep_boundaries: bool = True,
    batch_tokens: int = 1 << 24,
    progress: bool = False,
    **writer_options: Any,
) -> dict[str, Any]:
    """Copy a corpus into another format, in batches of about ``batch_tokens``, losing no token and no boundary.

    Every token is copied as stored. Document boundaries are kept: a destination that stores them gets them; a
    destination whose reader splits the stream at a delimiter (llm.c before each document, raw and ``.pt`` after
    it) gets the delimiter inserted into each document that lacks it: ``eos=``/``bos=`` names it, or the source's
    documents already all end (start) with one id, which is then used. Anything else is refused with the option
    that keeps the boundaries; ``keep_boundaries=False`` copies the bare stream instead (its documents then read
    back merged, which the summary says). Before committing, the documents are proven to split back unchanged
    (the delimiter occurs once per document) and the counts written are checked against the source's.

    ``progress``: a tqdm bar (when tqdm is installed) once the copy has run for a second.

    When neither ``dtype=`` nor ``vocab_size=`` is given, the format's conventional dtype is used (``.pt``:
    int64), else the source's dtype if the destination stores it, else the smallest dtype holding the largest id
    (a raw stream's reader is then told it through ``read_with``). A source whose documents end with an id
    becomes a destination whose documents start with it (llm.c) by moving it, and back.
    Values are copied as stored: Time-MoE sequences stored normalised stay normalised.

    Returns:
        ``{"documents", "tokens", "dtype", "files", "delimiters_added", "delimiter_moved", "read_with"}``: what the
        destination reads back, its token dtype, and the reader options to open it with (``{"format": "raw",
        "dtype": "uint16", "eos": 50256}``, ...; empty when the files record everything).
    """
    writer_class = corpus_writer(format)
    reader = open(source, format=source_format, **(source_options or {}))
    if not isinstance(reader, TokenReader):
        raise UnknownFormatError(f"{source} is not a token corpus ({reader.format}); only corpora can be converted.")
    with reader:
        delimiter = None if not keep_boundaries else choose_delimiter(
            writer_class.boundaries,
            reader.tokens,
            reader.offsets,
            eos=eos,
            bos=bos,
            format=format,
            source=reader.path,
            alternatives=_index_formats(),
        )
        writer = _destination_writer(reader, destination, format, delimiter, writer_options)
        check = writer_class.boundaries != "index"
        # Formats that can record their convention (llm.c's header, a .pt manifest) do. A source of one document
        # declares nothing: a legacy llm.c stream keeps reading at the family's delimiter.
        if check and delimiter is not None:
            writer.declare_delimiter(delimiter.kind, delimiter.id)
        elif check and not keep_boundaries:
            writer.declare_delimiter("none", None)
        # What the destination reads back: the bare stream of a delimiter format is one document.
        documents = len(reader) if keep_boundaries or not check else min(len(reader), 1)
        with writer:
            added = _copy_documents(reader, writer, delimiter, batch_tokens=batch_tokens, progress=progress)
            if (writer.num_documents, writer.num_tokens) != (len(reader), reader.num_tokens + added):
                raise FormatError(  # a bug, not bad input: refuse to commit rather than publish it
                    f"converting {reader.path} wrote {writer.num_documents:,} documents and {writer.num_tokens:,} "
                    f"tokens, expected {len(reader):,} and {reader.num_tokens + added:,}; nothing was written."
                )
        return {
            "documents": documents,
            "tokens": reader.num_tokens + added,
            "dtype": writer.dtype.name,
            "files": writer.written,
            "delimiters_added": added,
            "delimiter_moved": bool(delimiter and delimiter.moves),
            "read_with": writer.read_with(),
        }


def _copy_documents(
    reader: TokenReader, writer: TokenWriter, delimiter: Any, *, batch_tokens: int, progress: bool
) -> int:
    """Copy every document in runs of about ``batch_tokens``, adding (or moving) the delimiter where the
    destination splits at one; returns how many tokens were added."""
    added = 0
    check = writer.boundaries != "index"
    bar = progress_bar(reader.num_tokens, f"convert -> {writer.format}", enabled=progress)
    for first, stop in document_runs(reader.offsets, batch_tokens):
        flat = reader.span(reader.offsets.item(first), reader.offsets.item(stop))
        lengths = reader.lengths[first:stop]
        if bar is not None:
            bar.update(len(flat))
        if delimiter is not None:
            flat, lengths, inserted = delimit(flat, lengths, delimiter, first, check=check)
            added += inserted
        writer.write_batch(flat, lengths)
    if bar is not None:
        bar.close()
    return added


def _destination_writer(
    reader: TokenReader, destination: PathLike, format: str, delimiter: Any, writer_options: dict[str, Any]
) -> TokenWriter:
    """The writer ``convert`` fills: the options given, else the format's conventional dtype, else the source's
    when the destination stores its dtype, else the smallest dtype holding the largest id (and the delimiter)."""
    options = dict(writer_options)
    writer_class = corpus_writer(format)
    if "dtype" in options or "vocab_size" in options:
        return create_corpus(destination, format, **options)
    if writer_class.conventional_dtype or writer_class.stores_dtype:
        options["dtype"] = writer_class.conventional_dtype or reader.dtype
        try:
            return create_corpus(destination, format, **options)
        except DTypeError:
            del options["dtype"]
    top = reader.tokens.max() if reader.num_tokens else 0
    options["vocab_size"] = max(int(top), delimiter.id if delimiter else 0) + 1
    return create_corpus(destination, format, **options)


def vocabulary_formats() -> list[str]:
    """The formats a tokenizer's vocabulary can be exported to (their module defines ``export_tokenizer``)."""
    return [name for name, entry in formats.items() if hasattr(entry.load(), "export_tokenizer")]


def export_tokenizer(tokenizer: Any, path: PathLike, format: str, *, overwrite: bool = False) -> Path:
    """Write ``tokenizer``'s vocabulary (a ``tokenizers.Tokenizer`` or a tokenizer.json) in vocabulary ``format``."""
    from .tokenization.tokenizer import load_tokenizer

    module = descriptor(format).load()
    exporter = getattr(module, "export_tokenizer", None)
    if exporter is None:
        names = ", ".join(vocabulary_formats()) or "none"
        raise UnknownFormatError(f"format {format!r} stores no tokenizer vocabulary; the ones that do: {names}.")
    written: Path = exporter(load_tokenizer(tokenizer), path, overwrite=overwrite)
    return written


def merge(sources: Sequence[Any], destination: PathLike, *, overwrite: bool = False, **writer_options: Any) -> Reader:
    """Concatenate datasets of one format into one dataset of that format, in order, and open it.

    A format whose module defines ``merge`` (Megatron: byte-identical to its ``add_index`` chain, the ``.bin`` files
    copied by the operating system) does it its own way; any other corpus format is read and written again with
    the first dataset's dtype, keeping every document.
    """
    if not sources:
        raise NoFilesError("merge needs at least one dataset.")
    name = detect(sources[0])
    module = descriptor(name).load()
    if hasattr(module, "merge"):
        merged: Reader = module.merge(sources, destination, overwrite=overwrite)
        return merged
    readers = [open(source) for source in sources]
    try:
        others = {r.format for r in readers} - {name}
        if others:
            raise FormatError(f"merge takes datasets of one format: {sources[0]} is {name}, others are {others}.")
        tokens = [r for r in readers if isinstance(r, TokenReader)]
        if len(tokens) != len(readers):
            raise UnknownFormatError(f"{name} datasets are not token corpora; only corpora merge.")
        options = {"dtype": tokens[0].dtype, **writer_options}
        with create_corpus(destination, name, overwrite=overwrite, **options) as writer:
            for corpus in tokens:
                writer.write_all(corpus.tokens, corpus.lengths)
    finally:
        for reader in readers:
            reader.close()
    path = destination if Path(destination).exists() else writer.written[0]
    return open(path)
