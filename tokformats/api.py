"""The top-level verbs: :func:`open`, :func:`create` and :func:`convert`."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .core.boundaries import choose_delimiter, delimit
from .core.documents import document_runs
from .core.format_module import ExportsTokenizer, Merges
from .core.protocol import PathLike, Reader, TokenReader, TokenWriter, Writer
from .core.provenance import Provenance, save_provenance
from .core.registry import descriptor, detect, formats
from .errors import DataWarning, DTypeError, FormatError, NoFilesError, UnknownFormatError
from .fs.journal import one_recovery, recover_near
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
    "written_dataset_path",
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

        remote: Reader[Any] = open_url(path, open, format=format, **options)
        return remote
    with one_recovery():  # detection and the reader each complete a killed writer's commit first: once per folder
        if format is None:
            recover_near(path)
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


def create_corpus(path: PathLike, format: str, **options: Any) -> TokenWriter:
    """:func:`create` for a corpus format: the writer of token documents (:class:`UnknownFormatError` for a format
    that stores something else, such as a vocabulary)."""
    return corpus_writer(format)(path, **options)


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


def written_dataset_path(writer: TokenWriter, format: str) -> Path:
    """The path a reader of the dataset ``writer`` committed reports (``reader.path``: where its sidecars go), found
    by opening it the way a user would: by the writer's path or its first file, with the dtype when the format's
    files do not record it."""
    reader_class = descriptor(format).reader
    for candidate in (writer.path, *writer.written):
        for options in ({}, {"dtype": writer.dtype}):
            try:
                with reader_class(candidate, **options) as reader:
                    return Path(reader.path)
            except (FormatError, TypeError, OSError):
                continue
    return Path(writer.path)


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

    When neither ``dtype=`` nor ``vocab_size=`` is given, the format's conventional dtype is used (``.pt``:
    int64), else the source's dtype if the destination stores it, else the smallest dtype holding the largest id.
    Values are copied as stored: Time-MoE sequences stored normalised stay normalised.

    Returns:
        ``{"documents", "tokens", "dtype", "files", "delimiters_added", "read_with"}``: what the destination reads
        back, its token dtype, and the reader options to open it with (``{"eos": 50256}``, ...; empty when none
        are needed); plus ``"provenance"``, the sidecar's path, when the source's documents had one.
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
        options = dict(writer_options)
        if "dtype" not in options and "vocab_size" not in options:
            options["dtype"] = writer_class.conventional_dtype or reader.dtype
            try:
                writer = create_corpus(destination, format, **options)
            except DTypeError:
                del options["dtype"]
                top = reader.tokens.max() if reader.num_tokens else 0
                options["vocab_size"] = max(int(top), delimiter.id if delimiter else 0) + 1
                writer = create_corpus(destination, format, **options)
        else:
            writer = create_corpus(destination, format, **options)
        added = 0
        check = writer_class.boundaries != "index"
        # What the destination reads back: the bare stream of a delimiter format is one document.
        documents = len(reader) if keep_boundaries or not check else min(len(reader), 1)
        with writer:
            for first, stop in document_runs(reader.offsets, batch_tokens):
                flat = reader.span(reader.offsets.item(first), reader.offsets.item(stop))
                lengths = reader.lengths[first:stop]
                if delimiter is not None:
                    flat, lengths, inserted = delimit(flat, lengths, delimiter, first, check=check)
                    added += inserted
                writer.write_batch(flat, lengths)
            if (writer.num_documents, writer.num_tokens) != (len(reader), reader.num_tokens + added):
                raise FormatError(  # a bug, not bad input: refuse to commit rather than publish it
                    f"converting {reader.path} wrote {writer.num_documents:,} documents and {writer.num_tokens:,} "
                    f"tokens, expected {len(reader):,} and {reader.num_tokens + added:,}; nothing was written."
                )
        read_with = delimiter.option if delimiter is not None and check else {}
        sources = _provenance_of(reader) if documents == len(reader) else None
        summary: dict[str, Any] = {
            "documents": documents,
            "tokens": reader.num_tokens + added,
            "dtype": writer.dtype.name,
            "files": writer.written,
            "delimiters_added": added,
            "read_with": read_with,
        }
        if sources is not None:  # the same documents in the same order: the same sources
            summary["provenance"] = save_provenance(sources, written_dataset_path(writer, format))
        return summary


def _provenance_of(reader: TokenReader) -> Provenance | None:
    """``reader``'s provenance sidecar, or None; a sidecar that does not fit the documents as opened is left behind
    with a :class:`DataWarning` rather than failing the copy."""
    try:
        table: Provenance | None = reader.provenance_table()
    except FormatError as error:
        warnings.warn(f"the provenance sidecar is not carried over: {error}", DataWarning, stacklevel=3)
        return None
    return table


def vocabulary_formats() -> list[str]:
    """The formats a tokenizer's vocabulary can be exported to (their module defines ``export_tokenizer``)."""
    return [name for name, entry in formats.items() if entry.capability(ExportsTokenizer) is not None]


def export_tokenizer(tokenizer: Any, path: PathLike, format: str, *, overwrite: bool = False) -> Path:
    """Write ``tokenizer``'s vocabulary (a ``tokenizers.Tokenizer`` or a tokenizer.json) in vocabulary ``format``."""
    from .core.vocab import load_tokenizer

    exporter = descriptor(format).capability(ExportsTokenizer)
    if exporter is None:
        names = ", ".join(vocabulary_formats()) or "none"
        raise UnknownFormatError(f"format {format!r} stores no tokenizer vocabulary; the ones that do: {names}.")
    return exporter.export_tokenizer(load_tokenizer(tokenizer), path, overwrite=overwrite)


def merge(
    sources: Sequence[Any], destination: PathLike, *, overwrite: bool = False, **writer_options: Any
) -> Reader[Any]:
    """Concatenate datasets of one format into one dataset of that format, in order, and open it.

    A format whose module defines ``merge`` (Megatron: byte-identical to its ``add_index`` chain, the ``.bin`` files
    copied by the operating system) does it its own way; any other corpus format is read and written again with
    the first dataset's dtype, keeping every document.
    """
    if not sources:
        raise NoFilesError("merge needs at least one dataset.")
    name = detect(sources[0])
    merging = descriptor(name).capability(Merges)
    if merging is not None:
        return _merge_provenance(sources, merging.merge(sources, destination, overwrite=overwrite))
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
    return _merge_provenance(sources, open(path))


def _merge_provenance(sources: Sequence[Any], merged: Reader[Any]) -> Reader[Any]:
    """Give ``merged`` the sources' provenance sidecars end to end (documents of a source without one: unknown)."""
    if not isinstance(merged, TokenReader):
        return merged
    tables = []
    for source in sources:
        with open(source) as reader:
            if not isinstance(reader, TokenReader):
                return merged
            table = _provenance_of(reader)
            tables.append(table if table is not None else Provenance.unknown(len(reader)))
    if any(t.files for t in tables) and sum(map(len, tables)) == len(merged):
        save_provenance(Provenance.concatenate(tables), merged.path)
    return merged
