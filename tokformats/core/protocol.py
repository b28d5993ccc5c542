"""The common Reader/Writer protocol every format implements.

A :class:`Reader` is a read-only sequence of items (documents of token ids, or a vocabulary's
token bytes) that knows its path, format and metadata, closes, and pickles by path. A
:class:`TokenReader` adds the flat token stream (``tokens``), per-document ``lengths`` and
``num_tokens``; a subclass only says how to map its files and where documents start.

A :class:`Writer` is a context manager whose files appear atomically when the block ends without
an exception and not at all otherwise. A :class:`TokenWriter` validates and casts token ids once,
vectorised, and hands subclasses ready arrays through :meth:`TokenWriter._write_tokens`.
"""

from __future__ import annotations

import html
import operator
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from functools import cached_property
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, BinaryIO, ClassVar, Generic, TypeVar, overload

import numpy as np

from ..errors import ConfigError, FormatError, option
from ..fs.atomic import AtomicFiles, naming_output
from ..fs.journal import recover_near
from .arrays import LazyArray, TokenArray
from .documents import document_runs, offsets_from_lengths
from .dtypes import as_token_array, check_lengths, check_tokens
from .files import DatasetFiles, LazyFiles

if TYPE_CHECKING:
    import threading

    import numpy.typing as npt
    from typing_extensions import Self

__all__ = [
    "Reader",
    "TokenReader",
    "Writer",
    "TokenWriter",
    "PathLike",
    "checked_position",
    "checked_delimiters",
    "loss_mask_formats",
]

PathLike = str | os.PathLike[str]
Item = TypeVar("Item")


def checked_position(key: Any, count: int, what: str, unit: str, where: str = "") -> int:
    """``key`` as a position in ``0..count-1`` (negative counts from the end), or IndexError naming it:
    "``{what} {key} is out of range for {count} {unit}{where}``"."""
    index = operator.index(key)
    position = index + count if index < 0 else index
    if not 0 <= position < count:
        raise IndexError(f"{what} {index} is out of range for {count:,} {unit}{where}")
    return position


def checked_delimiters(path: Any, dtype: np.dtype, eos: Any, bos: Any) -> tuple[int | None, int | None]:
    """A reader's ``eos=`` and ``bos=`` as ids (None stays None), each one that can occur in a stream of ``dtype``:
    an int (not a bool) from 0 to the dtype's largest value. A delimiter that cannot occur would open the whole
    stream silently as one document, so it is refused.

    Raises:
        ConfigError: both are given, or one is not such an id (the message names the option and the range).
    """
    if eos is not None and bos is not None:
        raise ConfigError(
            f"{path}: pass {option('eos', 'ID')} (each document ends with it) or {option('bos', 'ID')} (each starts "
            f"with it), not both; found eos={eos!r}, bos={bos!r}."
        )
    return _delimiter(path, dtype, "eos", eos), _delimiter(path, dtype, "bos", bos)


def _delimiter(path: Any, dtype: np.dtype, name: str, value: Any) -> int | None:
    if value is None:
        return None
    high = np.iinfo(dtype).max if dtype.kind in "iu" else None
    is_id = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
    if is_id and value >= 0 and (high is None or value <= high):
        return int(value)
    span = f"an id from 0 to {high:,} ({dtype.name}'s range)" if high is not None else "a non-negative int id"
    found = value.item() if isinstance(value, np.generic) else value  # 70000, not np.int64(70000)
    raise ConfigError(
        f"{path}: {option(name, 'ID')} must be {span}, the only values a {dtype.name} stream holds; "
        f"found {found!r} ({type(value).__name__})."
    )


def _public_name(cls: type) -> str:
    """``tokformats.llmc.Reader`` rather than ``tokformats.formats.llmc.Reader``."""
    return f"{cls.__module__.replace('.formats.', '.')}.{cls.__qualname__}"


def _reopen(cls: type[Reader[Any]], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Reader[Any]:
    return cls(*args, **kwargs)


class Reader(ABC, Generic[Item]):
    """A read-only sequence of items stored in one format.

    Subclasses call ``super().__init__(*args, **kwargs)`` with their own constructor arguments so
    that pickling re-opens the same files with the same options (memory maps are never pickled).
    """

    #: Registry name of the format.
    format: ClassVar[str]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._init_args = args
        self._init_kwargs = kwargs
        if args:  # the path: a commit a killed writer left there is completed before anything is read
            recover_near(args[0])
        #: What looks wrong about the data though it opens (``tokformats info`` prints these).
        self.warnings: list[str] = []

    # -- pickling: by path, re-opened on load --------------------------------------------
    def __reduce__(self) -> tuple[Any, ...]:
        return (_reopen, (type(self), self._init_args, self._init_kwargs))

    # -- the sequence ----------------------------------------------------------------------
    @abstractmethod
    def __len__(self) -> int:
        """Number of items (documents, sequences or vocabulary entries)."""

    @abstractmethod
    def _item(self, index: int) -> Item:
        """Item ``index``, already normalised to ``0 <= index < len(self)``."""

    def _items(self, start: int, stop: int, step: int) -> list[Item]:
        return [self._item(i) for i in range(start, stop, step)]

    @overload
    def __getitem__(self, key: int | np.integer[Any]) -> Item: ...
    @overload
    def __getitem__(self, key: slice) -> list[Item]: ...
    def __getitem__(self, key: int | np.integer[Any] | slice) -> Item | list[Item]:
        """One item by (possibly negative) index, or a list of items by slice."""
        n = len(self)
        if isinstance(key, slice):
            return self._items(*key.indices(n))
        try:
            index = operator.index(key)
        except TypeError:
            raise TypeError(
                f"{type(self).__name__} indices must be integers or slices, not {type(key).__name__}"
            ) from None
        if index < 0:  # inline, not checked_position(): this is every document read's path
            index += n
        if not 0 <= index < n:
            raise IndexError(f"index {operator.index(key)} is out of range for {n} items in {self.path}")
        return self._item(index)

    def __iter__(self) -> Iterator[Item]:
        for i in range(len(self)):
            yield self._item(i)

    # -- facts -------------------------------------------------------------------------------
    @property
    @abstractmethod
    def path(self) -> Path:
        """The path the reader was opened on (a folder, a prefix, or the first file)."""

    @property
    def files(self) -> list[Path]:
        """Every file the reader maps."""
        return [self.path]

    @property
    def metadata(self) -> dict[str, Any]:
        """Format-specific facts (header fields, delimiter, manifest, ...), JSON-serialisable."""
        return {}

    # -- lifetime ------------------------------------------------------------------------------
    def close(self) -> None:
        """Drop the reader's lazily created maps of its data (the OS unmaps a file once no array still views
        it), and release what it holds (a remote cache's lease). Using the reader afterwards maps them again."""
        for name in self._cached_maps():
            self.__dict__.pop(name, None)
        for resource in self.__dict__.pop("_held", []):
            resource.release()

    def hold(self, resource: Any) -> None:
        """Keep ``resource`` (anything with ``release()``) until :meth:`close`: the remote cache's lease on the
        files this reader maps. Holding the same object twice holds it once."""
        held = self.__dict__.setdefault("_held", [])
        if not any(resource is other for other in held):
            held.append(resource)

    def _cached_maps(self) -> Sequence[str]:
        """Names of ``cached_property`` attributes holding memory maps, dropped by :meth:`close`."""
        return ()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- display ----------------------------------------------------------------------------
    def _summary(self) -> dict[str, Any]:
        return {"format": self.format, "path": str(self.path), "items": len(self)}

    def __repr__(self) -> str:
        fields = " ".join(
            f"{k}={v:,}" if isinstance(v, int) else f"{k}={v!r}" if k == "path" else f"{k}={v}"
            for k, v in self._summary().items()
        )
        return f"<{_public_name(type(self))} {fields}>"

    def _preview(self) -> str | None:
        return None

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><th style='text-align:left'>{html.escape(k)}</th><td style='text-align:left'>"
            f"{html.escape(f'{v:,}' if isinstance(v, int) else str(v))}</td></tr>"
            for k, v in self._summary().items()
        )
        preview = self._preview()
        if preview is not None:
            rows += (
                "<tr><th style='text-align:left'>first item</th>"
                f"<td style='text-align:left'><code>{html.escape(preview)}</code></td></tr>"
            )
        return f"<table><caption>{html.escape(_public_name(type(self)))}</caption>{rows}</table>"


class TokenReader(Reader[np.ndarray]):
    """A corpus: a flat token stream plus document boundaries.

    Subclasses implement :attr:`tokens` (usually a ``cached_property`` memory map) and
    :meth:`_offsets` (``D + 1`` int64 token offsets). Documents are zero-copy views whenever they
    lie inside one file.
    """

    @property
    @abstractmethod
    def tokens(self) -> TokenArray:
        """The whole token stream: an ``np.memmap`` for one file, a ``ConcatenatedArray`` for several."""

    @abstractmethod
    def _offsets(self) -> np.ndarray:
        """``D + 1`` int64 offsets of documents in :attr:`tokens`; called once, then cached."""

    @cached_property
    def offsets(self) -> np.ndarray:
        """``D + 1`` int64 token offsets: document ``k`` is ``tokens[offsets[k]:offsets[k + 1]]``."""
        offsets = self._offsets()
        offsets.flags.writeable = False
        return offsets

    @cached_property
    def lengths(self) -> np.ndarray:
        """Number of tokens of each document (int64)."""
        lengths = np.diff(self.offsets)
        lengths.flags.writeable = False
        return lengths

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @cached_property
    def _view(self) -> TokenArray:
        """:attr:`tokens` as a plain ndarray view: slicing an ``np.memmap`` runs Python code per slice."""
        tokens = self.tokens
        return tokens.view(np.ndarray) if isinstance(tokens, np.memmap) else tokens

    def _item(self, index: int) -> np.ndarray:
        offsets = self.offsets
        return self._view[offsets.item(index) : offsets.item(index + 1)]

    # -- the reader's files: pinned at open, mapped read-only, fetched on first use when opened by URL ---------
    #: The dataset's files when it was opened by URL and its data files are fetched on first use (readers that
    #: support it take a ``remote=`` option and set this), else None.
    _remote: LazyFiles | None = None
    #: Where a dataset opened by URL keeps its provenance sidecar: the file the dataset itself lists, in its cache
    #: folder (set by :mod:`tokformats.remote`; never a file beside the cache folder). None: beside :attr:`path`.
    _provenance_sidecar: Path | None = None

    @property
    def _files(self) -> DatasetFiles:
        """How this reader reaches its files (:class:`tokformats.core.files.DatasetFiles`), made on first use."""
        files: DatasetFiles | None = self.__dict__.get("_dataset_files")
        if files is None:
            files = self.__dict__["_dataset_files"] = DatasetFiles(self._remote, self.hold, self.format)
        files.remote = self._remote
        return files

    def _pin(self, *paths: Path) -> None:
        """Pin ``paths``: the files this open validated (see :meth:`DatasetFiles.pin`)."""
        self._files.pin(*paths)

    def _pinned_size(self, path: Path) -> int:
        """The size in bytes pinned ``path`` had when :meth:`_pin` looked at it (its one ``stat`` at open)."""
        return self._files.pinned_size(path)

    def _check_pin(self, path: Path) -> None:
        """Raise if pinned ``path`` is no longer the file that was opened."""
        self._files.check_pin(path)

    def _map(
        self, path: Path, dtype: np.dtype, offset: int = 0, count: int | None = None, *, pin: bool = False
    ) -> np.ndarray:
        """A read-only map of a pinned file that is still the file that was opened (``pin``: pinned as mapped)."""
        return self._files.map(path, dtype, offset, count, pin=pin)

    def _fetched(self, path: Path) -> Path:
        """``path``, brought into the cache first when the dataset was opened by URL."""
        return self._files.fetched(path)

    def _head(self, path: Path, size: int) -> bytes:
        """The first ``size`` bytes of ``path`` (by range when it has not arrived from the store)."""
        return self._files.head(path, size)

    def _map_lazily(self, path: Path, dtype: np.dtype, offset: int, count: int) -> np.ndarray | LazyArray:
        """A map of ``path``, or a :class:`LazyArray` that fetches it on first read when opened by URL."""
        return self._files.map_lazily(path, dtype, offset, count)

    def _lazy_array(self, path: Path, count: int, dtype: npt.DTypeLike, load: Callable[[], np.ndarray]) -> LazyArray:
        """A :class:`LazyArray` over data file ``path``, unloaded when the reader stops holding it."""
        return self._files.lazy_array(path, count, dtype, load)

    def _data_files(self) -> list[Path]:
        """The reader's data files in reading order (what :meth:`prefetch` walks)."""
        return self.files

    def prefetch(self, count: int) -> threading.Thread | None:
        """For a dataset opened by URL, download the ``count`` data files after the one read last in a background
        thread (returned, started), for sequential reading; None for a local dataset."""
        return self._files.prefetch(self._data_files(), count)

    # -- the per-token side stream: which tokens are trained on ------------------------------------
    @property
    def loss_masks(self) -> TokenArray | None:
        """The stored loss mask of every token: a flat uint8 array parallel to :attr:`tokens` (1: the token is
        trained on, 0: it is not), sliced by the same :attr:`offsets`; None when the dataset stores no mask (every
        token is trained on). Formats that store masks (datatrove's ``.ds.loss``, ...) override it."""
        return None

    def loss_mask(self, index: int) -> np.ndarray:
        """Document ``index``'s loss mask: uint8, as long as ``self[index]``, 1 where the token is trained on
        (all ones when the dataset stores no mask)."""
        position = checked_position(index, len(self), "document", "documents", f" in {self.path}")
        start, stop = self.offsets.item(position), self.offsets.item(position + 1)
        masks = self.loss_masks
        if masks is None:
            return np.ones(stop - start, dtype=np.uint8)
        return np.asarray(masks[start:stop], dtype=np.uint8)

    def span(self, start: int, stop: int) -> np.ndarray:
        """Tokens ``start:stop`` of the whole stream as a plain ndarray (a view whenever they lie in one file)."""
        return self._view[start:stop]

    def joined_spans(self, starts: Sequence[int], stops: Sequence[int]) -> np.ndarray:
        """Tokens ``starts[j]:stops[j]`` of the whole stream for every ``j`` (at least one), joined in order into
        one new writable array of the stored dtype: ``np.concatenate([self.span(a, b) for ...])``, cheaper."""
        view = self._view
        if isinstance(view, np.ndarray) and view.ndim == 1 and view.flags.c_contiguous:
            # One file: a memoryview slice per span and one bytes join cost a fraction of an ndarray view per
            # span and concatenate's per-array set-up (a training sample is cut from a few spans of a few hundred
            # tokens); slices out of range clip as ndarray slices do
            whole = memoryview(view)  # type: ignore[arg-type]  # an ndarray exports its buffer
            return np.frombuffer(bytearray().join([whole[a:b] for a, b in zip(starts, stops)]), view.dtype)
        return np.concatenate(list(map(self.span, starts, stops)))

    # -- checking and looking -----------------------------------------------------------------
    def _problems(self) -> list[Any]:
        """The format's own checks beyond what opening does (Megatron's pointers, manifest checksums, ...), as
        :class:`tokformats.checks.Problem` rows. Formats override it; the base has none."""
        return []

    def problems(self, vocab_size: int | None = None, *, progress: bool = False) -> list[Any]:
        """Every problem found by reading the whole dataset once: the format's own checks (index consistency,
        recorded sizes and checksums), ids below ``vocab_size`` (negative ids and non-finite values always),
        and delimiters where the format splits at one. Empty when the dataset is sound. ``progress``: a tqdm bar
        once the scan has run for a second."""
        from .reports import problems

        return problems(self, vocab_size, progress=progress)

    def verify(self, vocab_size: int | None = None) -> None:
        """:meth:`problems`, raising :class:`tokformats.checks.VerificationError` (listing them all) if any."""
        from .reports import VerificationError

        found = self.problems(vocab_size)
        if found:
            raise VerificationError(found)

    def stats(self, top: int = 20, decode: Callable[[list[int]], str] | None = None) -> dict[str, Any]:
        """Documents, tokens, length percentiles and histogram, most frequent ids (their text with ``decode``, e.g.
        ``tokenizer.decode``), files (``tokformats stats``): a dict that shows as tables in a notebook."""
        from .reports import stats

        return stats(self, top=top, decode=decode)

    def plot(self, ax: Any = None, path: Any = None) -> Any:
        """The document-length histogram with matplotlib (``tokformats stats --plot``); returns the axes."""
        from .reports import plot_lengths

        return plot_lengths(self, ax=ax, path=path)

    def duplicates(self) -> list[np.ndarray]:
        """Groups of identical documents (the same ids in the same order): each a sorted int64 array of the indices
        of >= 2 documents, groups ordered by their first index; empty when every document is unique. A
        fingerprint of each document (its length and 9 ids) rules out the unique ones; only documents sharing one
        are hashed (64 bits, vectorised over their ids) and then compared id by id within hash groups, so a group
        never holds two different documents and no copy is missed (see :mod:`tokformats.core.duplicates`)."""
        from .duplicates import duplicate_groups

        return duplicate_groups(self)

    def provenance(self, index: int) -> dict[str, Any] | None:
        """Where document ``index`` came from, when ``tokenize`` recorded it (the sidecar
        :mod:`tokformats.core.provenance` describes): ``{"file", "line"`` (or ``"row"``, ``"item"``) ``,
        "byte_offset"}``; None when the dataset has no sidecar or the document's source is not known."""
        position = checked_position(index, len(self), "document", "documents", f" in {self.path}")
        table = self.provenance_table()
        return None if table is None else table.entry(position)

    def provenance_table(self) -> Any:
        """Every document's source (a :class:`tokformats.core.provenance.Provenance`), loaded once; None when the
        dataset has no provenance sidecar."""
        if "_provenance" not in self.__dict__:
            from .provenance import load_provenance, sidecar_in

            sidecar = self._provenance_sidecar
            if sidecar is None and self._remote is not None:  # a lazy reader reopened from a pickle (a worker)
                sidecar = sidecar_in(self.path, self._remote.folder)
            if sidecar is not None and self._remote is not None and not sidecar.is_file() and self._remote.has(sidecar):
                self._fetched(sidecar)  # by URL, on first use: verified like the data files
            self.__dict__["_provenance"] = load_provenance(self.path, len(self), sidecar=sidecar)
        return self.__dict__["_provenance"]

    def decode(self, index: int, tokenizer: Any) -> str:
        """Document ``index`` as text, with a ``tokenizers.Tokenizer`` (or a tokenizer.json path or folder), or
        anything with ``decode(ids) -> str`` (an llm.c :class:`~tokformats.formats.llmc_vocab.Vocab`, ...)."""
        from tokenizers import Tokenizer

        from .vocab import load_tokenizer, tokenizer_decoder

        if not isinstance(tokenizer, (Tokenizer, str, os.PathLike)) and callable(getattr(tokenizer, "decode", None)):
            return str(tokenizer.decode(self[index]))
        return tokenizer_decoder(load_tokenizer(tokenizer))(self[index])

    def sample_units(self) -> tuple[np.ndarray, np.ndarray]:
        """``(lengths, offsets)`` of the units fixed-length training samples are cut from (see
        :class:`tokformats.training.GPTSamples`): documents, unless the format's owner samples another unit."""
        return self.lengths, self.offsets

    @property
    def num_tokens(self) -> int:
        """Total number of tokens (or values) in the stream."""
        return len(self.tokens)

    @property
    def dtype(self) -> np.dtype:
        """The on-disk dtype of the tokens (explicit byte order)."""
        return self.tokens.dtype

    def _cached_maps(self) -> Sequence[str]:
        return ("tokens", "_view")

    def _summary(self) -> dict[str, Any]:
        try:
            tokens: int | str = self.num_tokens
        except FormatError as error:  # a count the index contradicts (a truncated .bin) is not stated; why is
            tokens = f"unknown ({error})"
        return {
            "format": self.format,
            "path": str(self.path),
            "documents": len(self),
            "tokens": tokens,
            "dtype": self.dtype.name,
        }

    def _preview(self) -> str | None:
        if len(self) == 0:
            return None
        try:
            document = self._item(0)
        except FormatError:  # damage a first read finds (the summary's token count says what it is)
            return None
        more = " ..." if len(document) > 32 else ""
        return f"{np.asarray(document[:32]).tolist()}{more}"


class Writer(ABC, Generic[Item]):
    """Writes one dataset; a context manager that commits on success and leaves nothing on failure.

    Subclasses create their outputs with ``self._files.create(final_path)`` and implement
    :meth:`_finish` (patch headers, write indexes) and :meth:`write`.
    """

    format: ClassVar[str]

    def __init__(self, path: PathLike, *, overwrite: bool = False) -> None:
        self.path = Path(path)
        self.overwrite = overwrite
        self._files = AtomicFiles(overwrite=overwrite)
        self._state = "open"  # open -> committed | aborted
        #: The final paths of every file, once committed.
        self.written: list[Path] = []

    @property
    def closed(self) -> bool:
        """True once the writer has committed or aborted."""
        return self._state != "open"

    def _check_open(self) -> None:
        """Refuse a write once the writer has committed or aborted (a close after an abort too): its files are final."""
        if self._state != "open":
            done = "its files are written" if self._state == "committed" else "nothing of it was written"
            raise FormatError(
                f"{self.path}: this {self.format} writer is already {self._state} ({done}); nothing more can be "
                "written with it: create a new writer to write more."
            )

    @abstractmethod
    def write(self, item: Item) -> None:
        """Append one item (a document, a vocabulary entry, ...)."""

    @abstractmethod
    def _finish(self) -> None:
        """Write whatever goes last (headers, indexes) into the temporaries before they are committed."""

    def close(self) -> list[Path]:
        """Finish and commit: every output appears under its final name. Returns those paths."""
        if self._state == "committed":
            return []
        self._check_open()
        try:
            with self._files:  # commits when _finish returns, removes every temporary when anything raises
                self._finish()
        except OSError as error:
            self.abort()  # the files are gone already; a writer's own resources (a spool) are released here
            raise naming_output(error, self.path) from None
        except BaseException:
            self.abort()
            raise
        self._state = "committed"
        self.written = self._files.committed
        return self.written

    def write_back(self) -> None:
        """Write what has been written so far to the disk now (the open temporaries flushed and ``fdatasync``-ed),
        so that :meth:`close` has only the rest to sync; the writer stays open and nothing is published."""
        self._check_open()
        self._files.write_back()

    def abort(self) -> None:
        """Discard everything written; nothing appears under a final name."""
        if self._state == "open":
            self._files.abort()
            self._state = "aborted"

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def __repr__(self) -> str:
        return f"<{_public_name(type(self))} path={str(self.path)!r} {self._state}>"


def loss_mask_formats() -> str:
    """Names of the registered corpus formats whose writers store loss masks (for messages)."""
    from .registry import formats

    names = []
    for name, entry in formats.items():
        try:
            writer = entry.writer
        except Exception:  # a broken plugin must not hide the others in an error message
            continue
        if writer is not None and getattr(writer, "stores_loss_mask", False):
            names.append(name)
    return ", ".join(names) or "none"


class TokenWriter(Writer[Any]):
    """A writer of token documents: validation and casting shared by every format.

    Args:
        path: where to write (the format decides whether that is a file, a prefix or a folder).
        dtype: on-disk dtype; chosen from ``vocab_size`` by the format's rule when omitted.
        vocab_size: ids must be below it; also picks the dtype.
        overwrite: replace an existing dataset.

    The class attributes and class methods below are the format's conventions, which ``convert`` and ``tokenize``
    follow without naming any format.
    """

    #: How the format's reader finds documents: ``"index"`` (boundaries are stored), ``"eos"`` (a delimiter ends
    #: each document: the writer's and reader's ``eos=`` option) or ``"bos"`` (a delimiter starts each document:
    #: their ``bos=`` option).
    boundaries: ClassVar[str] = "index"
    #: The dtype the format's users expect whatever the source's (``.pt``: int64, what ``nn.Embedding`` takes);
    #: None: ``convert`` keeps the source's dtype when the format stores it.
    conventional_dtype: ClassVar[str | None] = None
    #: Whether the files record their dtype; ``convert`` otherwise picks the smallest dtype holding every id.
    stores_dtype: ClassVar[bool] = True
    #: Whether ``tokenize`` ends (or starts) an empty document with the delimiter too; Megatron's
    #: ``preprocess_data.py`` leaves an empty document empty.
    delimit_empty_documents: ClassVar[bool] = True
    #: Writer options ``tokenize`` uses unless the caller gives others.
    tokenize_options: ClassVar[dict[str, Any]] = {}
    #: The writer option that records the tokenizer's name or path (datatrove's ``.ds.metadata``), which
    #: ``tokenize`` fills with the tokenizer it was given; None when the format records none.
    tokenizer_name_option: ClassVar[str | None] = None
    #: Whether the format stores a per-token loss mask beside the tokens (``write(doc, loss_mask=...)``); a writer
    #: of a format that does not refuses a mask rather than dropping it.
    stores_loss_mask: ClassVar[bool] = False

    @classmethod
    def output_path(cls, output: PathLike, key: str, split: str | None, several_keys: bool) -> Path:
        """Where ``tokenize`` writes the documents of text ``key`` in ``split`` (None when not splitting):
        ``OUTPUT`` plus ``_KEY`` when several keys are tokenized, plus ``_SPLIT`` when splitting."""
        parts = ([key] if several_keys else []) + ([split] if split else [])
        return Path(os.fspath(output) + "".join(f"_{part}" for part in parts))

    @classmethod
    def split_options(cls, split: str | None) -> dict[str, Any]:
        """Writer options that put ``split`` into the file names, for formats that name splits themselves."""
        return {}

    @classmethod
    def existing_outputs(cls, path: PathLike) -> list[Path]:
        """The files of a dataset at ``path`` that already exist (a writer refuses them without overwrite)."""
        return [Path(path)] if Path(path).exists() else []

    def __init__(self, path: PathLike, *, dtype: np.dtype, vocab_size: int | None, overwrite: bool = False) -> None:
        super().__init__(path, overwrite=overwrite)
        self.dtype = dtype
        self.vocab_size = vocab_size
        #: Documents and tokens written so far.
        self.num_documents = 0
        self.num_tokens = 0
        #: Whether this dataset stores loss masks: None until the first write, which decides (a write without a
        #: mask after that stores all ones; a mask after unmasked writes is refused).
        self.loss_masked: bool | None = None
        #: Tokens written with a loss mask of 1 (trained on).
        self.num_trained_tokens = 0
        #: How the documents given to this writer are delimited, when declared (:meth:`declare_delimiter`).
        self.declared: tuple[str, int | None] | None = None

    def declare_delimiter(self, kind: str, value: int | None) -> None:
        """Say that the documents this writer will be given already carry a delimiter: ``kind`` ``"eos"`` (each
        ends with ``value``), ``"bos"`` (each starts with it) or ``"none"`` (no boundaries are kept: the stream is
        one document). Formats that can record their convention (llm.c's header, a ``.pt`` folder's manifest) write
        it down, so that their readers split the stream back without being told; call it before writing."""
        if kind not in ("eos", "bos", "none") or (kind != "none" and value is None):
            raise ValueError(f"declare 'eos' or 'bos' with an id, or 'none'; got {kind!r}, {value!r}")
        if self.num_documents:
            raise ValueError(f"{self.path}: declare the delimiter before writing documents.")
        self.declared = (kind, None if value is None or kind == "none" else int(value))

    def read_with(self) -> dict[str, Any]:
        """The reader options that give back the documents written (``{"eos": 0}``), empty when the files record
        all it takes: ``tokenize`` and ``convert`` report it, and their hints pass it. Formats whose files record
        neither their dtype nor their delimiter override it."""
        own = getattr(self, "eos", None)  # the id a writer appends itself (raw, .pt)
        if self.boundaries == "index":
            return {}
        if own is not None:
            return {"eos": int(own)}
        if self.declared is None or self.declared[1] is None:
            return {}
        return {self.declared[0]: self.declared[1]}

    def _validated(self, flat: np.ndarray, lengths: np.ndarray | None) -> np.ndarray:
        return check_tokens(
            flat,
            self.dtype,
            vocab_size=self.vocab_size,
            lengths=lengths,
            first_document=self.num_documents,
            where=f"{self.path}: ",
        )

    def write(self, item: npt.ArrayLike, loss_mask: npt.ArrayLike | None = None) -> None:
        """Append one document (a sequence of ids), with its loss mask (one 0/1 per token, 1: trained on) when the
        format stores masks (:attr:`stores_loss_mask`)."""
        self._check_open()
        flat = self._validated(as_token_array(item, what=f"{self.path}: document {self.num_documents:,}"), None)
        self._write_checked(flat, np.array([len(flat)], dtype=np.int64), loss_mask)

    def write_batch(
        self, flat_ids: npt.ArrayLike, lengths: npt.ArrayLike, loss_mask: npt.ArrayLike | None = None
    ) -> None:
        """Append many documents at once: ``flat_ids`` is their concatenation, ``lengths`` their sizes, and
        ``loss_mask`` (optional) a flat 0/1 array parallel to ``flat_ids``.

        This is the fast path: one validation and one cast for the whole batch, no per-document Python work.
        """
        self._check_open()
        flat = as_token_array(flat_ids, what=f"{self.path}: flat_ids")
        sizes = check_lengths(lengths, len(flat), where=f"{self.path}: ")
        flat = self._validated(flat, sizes)
        self._write_checked(flat, sizes, loss_mask)

    def _write_checked(self, flat: np.ndarray, sizes: np.ndarray, loss_mask: npt.ArrayLike | None) -> None:
        """Write validated documents and their mask (checked here), keeping the counts."""
        mask = self._checked_mask(loss_mask, flat, sizes)
        try:
            if mask is None:
                self._write_tokens(flat, sizes)
            else:
                self._write_masked(flat, sizes, mask)
        except OSError as error:  # a full disk names the output, not the hidden temporary
            raise naming_output(error, self.path) from None
        self.num_documents += len(sizes)
        self.num_tokens += len(flat)
        self.num_trained_tokens += len(flat) if mask is None else int(np.count_nonzero(mask))

    def _checked_mask(self, loss_mask: npt.ArrayLike | None, flat: np.ndarray, sizes: np.ndarray) -> np.ndarray | None:
        """The batch's mask as uint8 0/1 (all ones when this dataset stores masks and none was given), or None."""
        if self.loss_masked is None:
            self.loss_masked = loss_mask is not None
            if self.loss_masked and not self.stores_loss_mask:
                raise FormatError(
                    f"{self.path}: the {self.format} format stores no loss mask, and a mask was given; formats that "
                    f"store one: {loss_mask_formats()}. Write without loss_mask= to keep the tokens only."
                )
        if loss_mask is None:
            return np.ones(len(flat), dtype=np.uint8) if self.loss_masked else None
        if not self.loss_masked:
            raise FormatError(
                f"{self.path}: a loss mask was given after {self.num_documents:,} documents written without one; "
                "give loss_mask= from the first write on (the first write decides whether the dataset stores masks)."
            )
        mask = np.asarray(loss_mask)
        if mask.ndim != 1 or len(mask) != len(flat):
            raise FormatError(
                f"{self.path}: the loss mask of documents {self.num_documents:,}.. has shape {mask.shape}; expected "
                f"one value per token ({len(flat):,})."
            )
        if mask.dtype != np.bool_ and (
            mask.dtype.kind not in "iu" or (len(mask) and (mask.min() < 0 or mask.max() > 1))
        ):
            self._refuse_mask_values(mask, sizes)
        return mask.astype(np.uint8, copy=False)

    def _refuse_mask_values(self, mask: np.ndarray, sizes: np.ndarray) -> None:
        """Raise naming the first document whose mask holds something other than 0 and 1."""
        document, bad = self.num_documents, mask
        if mask.dtype.kind in "iu":
            outside = (mask < 0) | (mask > 1)
            bad = mask[outside]
            position = int(np.flatnonzero(outside)[0])
            document += int(np.searchsorted(np.cumsum(sizes), position, side="right"))
        raise FormatError(
            f"{self.path}: a loss mask holds 0 (not trained on) or 1 (trained on); document {document:,} has "
            f"{bad.ravel()[:1].tolist()} ({mask.dtype.name})."
        )

    def write_all(
        self,
        tokens: TokenArray,
        lengths: npt.ArrayLike,
        *,
        loss_masks: TokenArray | None = None,
        batch_tokens: int = 1 << 24,
    ) -> None:
        """Write the documents of a large (possibly memory-mapped) stream, about ``batch_tokens`` at a time,
        so that memory stays bounded however large the stream is; ``loss_masks`` is the parallel mask stream."""
        sizes = check_lengths(lengths, len(tokens), where=f"{self.path}: ")
        offsets = offsets_from_lengths(sizes)
        for first, stop in document_runs(offsets, batch_tokens):
            start, end = offsets.item(first), offsets.item(stop)
            if loss_masks is None:
                self.write_batch(tokens[start:end], sizes[first:stop])
            else:
                self.write_batch(tokens[start:end], sizes[first:stop], loss_masks[start:end])

    def adopt_data_file(self, path: PathLike, dtype: np.dtype, lengths: np.ndarray) -> bool:
        """Take the finished file at ``path`` as this dataset's data file instead of writing its bytes again:
        ``path`` holds the ids of documents of ``lengths`` back to back in ``dtype``, every id already checked
        below :attr:`vocab_size`. The file stays where it is (it is hard-linked into the commit), so an abort or a
        kill before the commit leaves it whole. Returns whether the writer did: False (nothing written) from
        formats whose data file is not the bare id stream, from a writer already written to or that would store
        another dtype, and where the file system cannot link; the caller then writes the documents with
        :meth:`write_batch`. ``tokenize`` publishes a single-partition run's spool this way."""
        return False

    def append_data_file(self, source: BinaryIO, dtype: np.dtype, lengths: np.ndarray) -> bool:
        """Append the ids of the open file ``source`` to this dataset's data file by a kernel copy, without
        reading them into Python: ``source`` holds the ids of documents of ``lengths`` back to back in ``dtype``,
        every id already checked below :attr:`vocab_size`, and nothing else (its size must be theirs). Returns
        whether the writer did: False (nothing written) from formats whose data file is not the bare id stream,
        from a writer that stores masks, modes or another dtype, or whose data file was adopted; the caller then
        writes the documents with :meth:`write_batch`. ``tokenize`` joins a parallel run's partitions this way."""
        return False

    def _write_masked(self, flat: np.ndarray, lengths: np.ndarray, mask: np.ndarray) -> None:
        """Write documents and their loss mask (uint8 0/1, parallel to ``flat``); formats that store masks
        (:attr:`stores_loss_mask`) override it and put the mask in the same atomic commit as the tokens."""
        raise FormatError(f"{self.path}: the {self.format} format stores no loss mask.")

    @abstractmethod
    def _write_tokens(self, flat: np.ndarray, lengths: np.ndarray) -> None:
        """Write documents whose ids are already checked and cast to :attr:`dtype`."""
