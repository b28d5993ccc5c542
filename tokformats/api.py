"""The top-level verbs: :func:`open`, :func:`create` and :func:`convert`."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .core.boundaries import choose_delimiter, delimit, delimited_mask
from .core.documents import document_runs
from .core.format_module import ExportsTokenizer, Merges
from .core.progress import progress_bar
from .core.protocol import PathLike, Reader, TokenReader, TokenWriter, Writer, loss_mask_formats
from .core.provenance import Provenance, save_provenance
from .core.registry import descriptor, detect, formats
from .errors import ConfigError, DataWarning, DTypeError, FormatError, NoFilesError, UnknownFormatError, option
from .fs.filecopy import copy_progress
from .fs.journal import one_recovery, recover_near
from .fs.paths import is_url, names_checked, one_expansion

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

        def open_cached(target: Any, **cached: Any) -> Reader[Any]:
            """:func:`open` on the cached copy; its messages name the URL the user gave, not the cache path."""
            try:
                return open(target, **cached)
            except FormatError as error:
                raise _naming_url(error, target, path) from None

        remote: Reader[Any] = open_url(path, open_cached, format=format, **options)
        return remote
    # Names are checked where they become paths; a glob is listed once for detection, the journal check and the
    # reader; detection and the reader each complete a killed writer's commit first, once per folder.
    with names_checked(path), one_expansion(), one_recovery():
        if format is None:
            recover_near(path)
        name = format if format is not None else detect(path)
        reader_class = descriptor(name).reader
        if options:  # no option, nothing to refuse: no signature read (a tenth of a millisecond per open)
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
    accepted = sorted((taken or set()) - {"remote"})  # remote: set by open(URL) itself
    raise ConfigError(f"{path}: the {name} {role} {_takes(accepted, key)}, not {_spelled(key)}; {where}.")


def _takes(accepted: list[str], refused: str) -> str:
    """The options a reader or writer takes, each as the caller can type it. On the command line (the refused
    option came as a flag: a user types no other) an option with no flag of this subcommand is named as existing
    in Python only (``multimodal=`` is no flag)."""
    spelled = [_spelled(k) for k in accepted]
    if not _spelled(refused).startswith("--"):  # from Python: every option as a keyword
        return f"takes {', '.join(spelled)}" if spelled else "takes no options"
    flags = [s for s in spelled if s.startswith("--")]
    python_only = ", ".join(s for s in spelled if not s.startswith("--"))
    if not flags:
        return f"takes no command-line option ({python_only} in Python only)" if python_only else "takes no options"
    return f"takes {', '.join(flags)}" + (f" (and {python_only} in Python only)" if python_only else "")


def _spelled(name: str) -> str:
    """An option's name as the caller spells it (``--eos`` on the command line, ``eos=`` in Python, and ``eos=``
    for an option the command line has no flag for)."""
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
    with names_checked(path):
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
    drop_masks: bool = False,
    batch_tokens: int = 1 << 24,
    progress: bool = False,
    **writer_options: Any,
) -> dict[str, Any]:
    """Copy a corpus into another format, in batches of about ``batch_tokens``, losing no token and no boundary.

    A source that stores loss masks (:attr:`TokenReader.loss_masks`) gives them to the destination, delimiters
    inserted for it trained on; a destination format that stores none is refused unless ``drop_masks=True``.

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
    A conversion never changes a value the source's reader returns: Time-MoE sequences stored normalised keep
    their ``mean``/``std`` into a Time-MoE destination, and any other destination gets the de-normalised values
    (in the reader's float dtype; refused, naming the value, where the destination cannot store them).

    Returns:
        ``{"documents", "tokens", "dtype", "files", "delimiters_added", "delimiter_moved", "read_with"}``: what the
        destination reads back, its token dtype, and the reader options to open it with (``{"format": "raw",
        "dtype": "uint16", "eos": 50256}``, ...; empty when the files record everything); plus ``"provenance"``,
        the sidecar's path, when the source's documents had one.
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
        scales = _value_scales(reader)
        carry_scales = scales is not None and hasattr(writer_class, "write_scaled_batch")
        stored = reader.dtype if scales is None or carry_scales else np.result_type(reader.dtype, 1.0)
        writer = _destination_writer(reader, destination, format, delimiter, writer_options, stored)
        masks = _masks_to_copy(reader, writer_class, format, drop_masks)
        added = 0
        check = writer_class.boundaries != "index"
        # Formats that can record their convention (llm.c's header, a .pt manifest) do. A source of one document
        # declares nothing: a legacy llm.c stream keeps reading at the family's delimiter.
        if check and delimiter is not None:
            writer.declare_delimiter(delimiter.kind, delimiter.id)
        elif check and not keep_boundaries:
            writer.declare_delimiter("none", None)
        # What the destination reads back: the bare stream of a delimiter format is one document.
        documents = len(reader) if keep_boundaries or not check else min(len(reader), 1)
        bar = progress_bar(reader.num_tokens, f"convert -> {format}", enabled=progress)
        with writer:
            for first, stop in document_runs(reader.offsets, batch_tokens):
                if bar is not None:
                    bar.update(reader.offsets.item(stop) - reader.offsets.item(first))
                run = _CopiedRun(reader, first, stop, masks)
                if carry_scales and scales is not None:  # stored values and their scales: the same values read back
                    writer.write_scaled_batch(  # type: ignore[attr-defined]  # checked: carry_scales
                        run.flat, run.lengths, scales.means[first:stop], scales.stds[first:stop]
                    )
                    continue
                if scales is not None:  # a destination without scales gets the values the reader returns
                    run.flat = _denormalized_run(run.flat, run.lengths, scales, first, stop)
                added += run.delimit(delimiter, check)
                writer.write_batch(run.flat, run.lengths, run.mask)
            if bar is not None:
                bar.close()
            if (writer.num_documents, writer.num_tokens) != (len(reader), reader.num_tokens + added):
                raise FormatError(  # a bug, not bad input: refuse to commit rather than publish it
                    f"converting {reader.path} wrote {writer.num_documents:,} documents and {writer.num_tokens:,} "
                    f"tokens, expected {len(reader):,} and {reader.num_tokens + added:,}; nothing was written."
                )
        summary: dict[str, Any] = {
            "documents": documents,
            "tokens": reader.num_tokens + added,
            "dtype": writer.dtype.name,
            "files": writer.written,
            "delimiters_added": added,
            "delimiter_moved": bool(delimiter and delimiter.moves),
            "read_with": writer.read_with(),
            "loss_masks": masks is not None,
        }
        _carry_provenance(summary, reader, writer, format)
        return summary


def _carry_provenance(summary: dict[str, Any], reader: TokenReader, writer: TokenWriter, format: str) -> None:
    """Write the source's provenance beside the destination when it holds the same documents in the same order
    (``summary["provenance"]``: the sidecar's path)."""
    sources = _provenance_of(reader) if summary["documents"] == len(reader) else None
    if sources is not None:
        summary["provenance"] = save_provenance(sources, written_dataset_path(writer, format))


def _provenance_of(reader: TokenReader) -> Provenance | None:
    """``reader``'s provenance sidecar, or None; a sidecar that does not fit the documents as opened is left behind
    with a :class:`DataWarning` rather than failing the copy."""
    try:
        table: Provenance | None = reader.provenance_table()
    except FormatError as error:
        warnings.warn(f"the provenance sidecar is not carried over: {error}", DataWarning, stacklevel=3)
        return None
    return table


class _CopiedRun:
    """Documents ``first:stop`` of ``reader`` on their way to the destination: ids, lengths and loss mask."""

    def __init__(self, reader: TokenReader, first: int, stop: int, masks: Any) -> None:
        start, end = reader.offsets.item(first), reader.offsets.item(stop)
        self.first = first
        self.flat, self.lengths = reader.span(start, end), reader.lengths[first:stop]
        self.mask = None if masks is None else np.asarray(masks[start:end], dtype=np.uint8)

    def delimit(self, delimiter: Any, check: bool) -> int:
        """Put the destination's delimiter at each document's edge (the mask follows); the tokens added."""
        if delimiter is None:
            return 0
        if self.mask is not None:
            self.mask = delimited_mask(self.flat, self.lengths, self.mask, delimiter)
        self.flat, self.lengths, inserted = delimit(self.flat, self.lengths, delimiter, self.first, check=check)
        return int(inserted)


def _destination_writer(
    reader: TokenReader,
    destination: PathLike,
    format: str,
    delimiter: Any,
    writer_options: dict[str, Any],
    stored: np.dtype,
) -> TokenWriter:
    """The writer ``convert`` fills: the options given, else the format's conventional dtype, else the dtype of the
    values written (``stored``: the source's, or the float dtype of de-normalised values) when the destination
    stores its dtype, else the smallest dtype holding the largest id (and the delimiter)."""
    options = dict(writer_options)
    writer_class = corpus_writer(format)
    if "dtype" in options or "vocab_size" in options:
        return create_corpus(destination, format, **options)
    if writer_class.conventional_dtype or writer_class.stores_dtype:
        options["dtype"] = writer_class.conventional_dtype or stored
        try:
            return create_corpus(destination, format, **options)
        except DTypeError:
            del options["dtype"]
    top = reader.tokens.max() if reader.num_tokens else 0
    options["vocab_size"] = max(int(top), delimiter.id if delimiter else 0) + 1
    return create_corpus(destination, format, **options)


def _value_scales(reader: TokenReader) -> Any:
    """The reader's per-sequence scales (``means``/``stds``/``normalized`` columns) when it returns some sequences
    de-normalised (``stored * std + mean``: Time-MoE), else None: then every value is returned as stored."""
    scales = getattr(reader, "scales", None)
    normalized = getattr(scales, "normalized", None)
    if not getattr(reader, "denormalize", False) or normalized is None or not np.any(normalized):
        return None
    return scales


def _denormalized_run(flat: np.ndarray, lengths: np.ndarray, scales: Any, first: int, stop: int) -> np.ndarray:
    """Documents ``first..stop`` (stored values ``flat``) as the reader returns them: ``stored * std + mean``
    for the normalised ones, in the dtype and the rounding of the reader's own ``values * std + mean`` (a Python
    float scale is cast to the values' float dtype first), the others unchanged."""
    kind = np.result_type(flat.dtype, 1.0)
    normalized = np.repeat(scales.normalized[first:stop], lengths)
    stds = np.repeat(np.nan_to_num(scales.stds[first:stop], nan=1.0).astype(kind), lengths)
    means = np.repeat(np.nan_to_num(scales.means[first:stop], nan=0.0).astype(kind), lengths)
    values = np.asarray(flat).astype(kind)
    return np.where(normalized, values * stds + means, values)


def _masks_to_copy(reader: TokenReader, writer_class: type[TokenWriter], format: str, drop: bool) -> Any:
    """The source's loss masks when the destination takes them; None when there are none or ``drop`` is asked;
    :class:`FormatError` when the destination would lose them silently."""
    masks = reader.loss_masks
    if masks is None or drop:
        return None
    if not writer_class.stores_loss_mask:
        raise FormatError(
            f"{reader.path} stores loss masks, and the {format} format cannot: they would be lost. Convert to one of "
            f"{loss_mask_formats()}, or pass {option('drop_masks')} to copy the tokens without them."
        )
    return masks


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
    sources: Sequence[Any],
    destination: PathLike,
    *,
    overwrite: bool = False,
    progress: bool = False,
    **writer_options: Any,
) -> Reader[Any]:
    """Concatenate datasets of one format into one dataset of that format, in order, and open it.

    A format whose module defines ``merge`` (Megatron: byte-identical to its ``add_index`` chain, the ``.bin`` files
    copied by the operating system) does it its own way; any other corpus format is read and written again with
    the first dataset's dtype, keeping every document. ``progress``: a bar on stderr (tqdm's, once the merge has run
    a second) of the bytes copied (a format's own merge: the token and loss-mask bytes) or the documents written.
    """
    if not sources:
        raise NoFilesError("merge needs at least one dataset.")
    name = detect(sources[0])
    merging = descriptor(name).capability(Merges)
    if merging is not None:
        bar = progress_bar(_data_bytes(sources), f"merge -> {name}", enabled=True, unit="B") if progress else None
        with _counted_copies(bar):
            merged = merging.merge(sources, destination, overwrite=overwrite)
        return _merge_provenance(sources, merged)
    readers = [open(source) for source in sources]
    bar = None
    try:
        others = {r.format for r in readers} - {name}
        if others:
            raise FormatError(f"merge takes datasets of one format: {sources[0]} is {name}, others are {others}.")
        tokens = [r for r in readers if isinstance(r, TokenReader)]
        if len(tokens) != len(readers):
            raise UnknownFormatError(f"{name} datasets are not token corpora; only corpora merge.")
        options = {"dtype": tokens[0].dtype, **writer_options}
        masked = any(corpus.loss_masks is not None for corpus in tokens)
        bar = progress_bar(sum(map(len, tokens)), f"merge -> {name}", enabled=progress, unit="doc")
        with create_corpus(destination, name, overwrite=overwrite, **options) as writer:
            for corpus in tokens:
                masks = corpus.loss_masks
                if masked and masks is None:  # a dataset without masks is trained on everywhere: ones, not copied
                    masks = np.broadcast_to(np.uint8(1), (corpus.num_tokens,))
                _write_corpus(writer, corpus, masks, bar)
    finally:
        if bar is not None:
            bar.close()
        for reader in readers:
            reader.close()
    path = destination if Path(destination).exists() else writer.written[0]
    return _merge_provenance(sources, open(path))


@contextlib.contextmanager
def _counted_copies(bar: Any) -> Iterator[None]:
    """Count the bytes a format's merge copies (:func:`~tokformats.fs.filecopy.append_file`) into ``bar`` (closed
    at the end), or nothing when it is None."""
    if bar is None:
        yield
        return
    try:
        with copy_progress(bar.update):
            yield
    finally:
        bar.close()


def _write_corpus(writer: TokenWriter, corpus: TokenReader, masks: Any, bar: Any) -> None:
    """Write every document of ``corpus`` (with ``masks``, its loss masks or None) in runs of about 16 M tokens,
    counting the documents into ``bar`` (or None)."""
    offsets, lengths = corpus.offsets, np.asarray(corpus.lengths)
    for first, stop in document_runs(offsets, 1 << 24):
        start, end = offsets.item(first), offsets.item(stop)
        window = None if masks is None else masks[start:end]
        writer.write_all(corpus.tokens[start:end], lengths[first:stop], loss_masks=window)
        if bar is not None:
            bar.update(stop - first)


def _data_bytes(sources: Sequence[Any]) -> int:
    """The token and loss-mask bytes of ``sources`` (what a merge by file copy copies)."""
    total = 0
    for source in sources:
        with open(source) as reader:
            if isinstance(reader, TokenReader):
                total += reader.num_tokens * (reader.dtype.itemsize + int(reader.loss_masks is not None))
    return total


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
