"""A dataset at a URL: which files it is (a folder's listing, ``SHA256SUMS`` or index; a file and its companions; a
glob's matches), fetching them into the verified cache, and opening the copy, eagerly or with data files that arrive
on first use."""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.files import LazyFiles
from ..core.format_module import PublishedLast, RemoteLazy
from ..core.protocol import TokenReader
from ..core.provenance import SUFFIX as PROVENANCE_SUFFIX
from ..core.provenance import sidecar_in
from ..core.registry import FormatDescriptor, formats
from ..errors import FormatError, HeaderError
from ..fs.paths import public_url
from .backends import Backend, DeniedError, NotFoundError, RemoteError
from .byte_progress import ByteProgress
from .cache import SUMS, Cache, IndexFormatError, Lease
from .hooks import adopted, companions, index_readers, published_last
from .lazy import RemoteFiles

__all__ = ["Dataset", "Entry", "Opener", "SUMS", "fetch", "open_url"]

#: How a local copy is opened: :func:`tokformats.open` (path, format=..., reader options) -> a reader.
Opener = Callable[..., Any]

#: Data files downloaded at once.
PARALLEL_DOWNLOADS = 2
#: The most files one index may list (a manifest claiming 10**12 shards is refused, not allocated).
MAX_INDEX_ENTRIES = 1_000_000
_CACHE_OPTIONS = ("cache_dir", "max_cache_bytes", "offline", "backend", "connect_timeout", "stall_timeout", "retries",
                  "max_index_bytes", "revalidate")  # fmt: skip
_SHA256 = frozenset("0123456789abcdefABCDEF")


@dataclass
class Entry:
    """One file of a remote dataset, with what its records say it is."""

    name: str
    size: int | None = None
    sha256: str | None = None
    required: bool = True
    #: The index or sidecar that names the file (for errors).
    listed_by: str | None = None


def _entry(cache: Cache, item: object, listed_by: str, number: int) -> Entry:
    """An :class:`Entry` from a format's ``remote_files`` row, every value type- and range-checked: a bad one raises
    :class:`IndexFormatError` naming the URL, the index and the entry."""
    where = f"{cache.url}/{listed_by}, entry {number}"
    if not isinstance(item, dict):
        raise IndexFormatError(f"{where} is a {type(item).__name__}, not a file record.")
    name = cache.check_name(item.get("name"), where)
    size, sha256, required = item.get("size"), item.get("sha256"), item.get("required", True)
    if size is not None and (type(size) is not int or not 0 <= size < 1 << 62):
        raise IndexFormatError(f"{where} ({name}): the size is {size!r:.60}, not a byte count.")
    if sha256 is not None and (not isinstance(sha256, str) or len(sha256) != 64 or not set(sha256) <= _SHA256):
        raise IndexFormatError(f"{where} ({name}): the SHA-256 is {sha256!r:.80}, not 64 hex digits.")
    if not isinstance(required, bool):
        raise IndexFormatError(f"{where} ({name}): 'required' is {required!r:.40}, not true or false.")
    return Entry(name, size, sha256.lower() if sha256 else None, required, listed_by)


def _index_entries(cache: Cache, index: str, reader: Any) -> list[Entry]:
    """The files index ``index`` (fetched) lists, through its format's ``remote_files``: checked row by row; any
    foreign error of the format's hook on a malformed index becomes :class:`IndexFormatError` naming it."""
    try:
        rows = reader(cache.folder)
    except FormatError as error:
        raise IndexFormatError(f"{cache.url}/{index}: {error}") from None
    except (TypeError, ValueError, KeyError, AttributeError, OverflowError, RecursionError) as error:
        raise IndexFormatError(
            f"{cache.url}/{index} is not a valid index ({type(error).__name__}: {str(error)[:200]})."
        ) from None
    if not isinstance(rows, list) or len(rows) > MAX_INDEX_ENTRIES:
        raise IndexFormatError(f"{cache.url}/{index} lists more than {MAX_INDEX_ENTRIES:,} files.")
    return [_entry(cache, item, index, number) for number, item in enumerate(rows)]


@dataclass
class Dataset:
    """A remote dataset fetched into the cache: the local path to open, its files, the cache, and the lease that
    keeps the files out of eviction (taken file by file as they arrive; released when dropped)."""

    target: Path | list[Path]
    files: list[str]
    cache: Cache
    lease: Lease
    #: Every file of the dataset, fetched or not (a folder fetched with ``names`` has more files than it fetched).
    entries: list[Entry]


def _split_query(url: str) -> tuple[str, str | None]:
    """``(URL without its query string, the query)``: a signed URL's ``?X-Amz-Signature=...`` is part of the URL
    (sent with the request), never a glob character."""
    base, mark, query = url.partition("?")
    return base, (query if mark else None)


def _split_pattern(url: str) -> tuple[str, str] | None:
    """``(base URL, pattern)`` for a URL (without its query string) whose path holds a glob, else None."""
    scheme, rest = url.split("://", 1)
    if not set("*?[") & set(rest):
        return None
    parts = rest.split("/")
    first = next(k for k, part in enumerate(parts) if set("*?[") & set(part))
    return f"{scheme}://{'/'.join(parts[:first])}", "/".join(parts[first:])


def _folder_entries(cache: Cache, sums: dict[str, str]) -> list[Entry]:
    """The files of a folder URL: its ``SHA256SUMS`` (written last by ``publish``: a listing never adds files it
    does not name, so a republished dataset is one version), else the store's listing, else a format's index."""
    if sums:
        return [Entry(n, sha256=s, listed_by=SUMS) for n, s in sums.items()]
    listing = None if cache.offline else cache.backend.listing(cache.listing_url)
    if listing:
        where = f"the listing of {cache.url}/"
        visible = [n for n in listing if n != SUMS and not any(p.startswith(".") for p in str(n).split("/"))]
        return [Entry(cache.check_name(n, where)) for n in visible]
    absent: list[NotFoundError] = []
    for index_names, reader in index_readers():
        for index in index_names:
            try:
                cache.fetch(index)
            except NotFoundError as error:
                absent.append(error)
                continue
            return [Entry(index), *_index_entries(cache, index, reader)]
    raise _unlistable(cache, absent)


def _unlistable(cache: Cache, absent: list[NotFoundError]) -> RemoteError:
    """Why the folder at ``cache.url`` names no file: what the store answered for the files that would have named
    them (HTTP 404 for each: the URL is most likely wrong), or that they are not in the cache offline."""
    tried = ", ".join([*([] if cache.path(SUMS).is_file() else [SUMS]), *(n for ns, _ in index_readers() for n in ns)])
    hint = f"publish a dataset there with tokformats publish (which writes {SUMS}), or open one of its files by URL"
    if cache.offline:
        return RemoteError(
            f"{cache.url}/ cannot be listed offline: none of {tried} is in the cache ({cache.folder}); open it once "
            f"online first, or {hint}."
        )
    statuses = sorted({e.status for e in absent if e.status is not None})  # 404 over HTTP; none from a bucket
    answer = f"each answered HTTP {', '.join(map(str, statuses))}" if statuses else "none of them exists"
    return NotFoundError(
        f"{cache.url}/ names no dataset: the store lists no file there, and it holds none of the "
        f"files that name a dataset's contents ({tried}: {answer}). Check the URL; or {hint}."
    )


def _entries_with_records(cache: Cache, entries: list[Entry]) -> list[Entry]:
    """Add the sizes and checksums the dataset's own index records (fetched first) to ``entries``."""
    records: dict[str, Entry] = {}
    names = {e.name for e in entries}
    for index_names, reader in index_readers():
        for index in index_names:
            if index in names:
                cache.fetch(index)
                records.update({e.name: e for e in _index_entries(cache, index, reader)})
    merged = []
    for entry in entries:
        record = records.get(entry.name)
        size = entry.size if entry.size is not None else (record.size if record else None)
        sha256 = (record.sha256 if record and record.sha256 else None) or entry.sha256
        listed_by = record.listed_by if record else entry.listed_by
        merged.append(Entry(entry.name, size, sha256, entry.required, listed_by))
    return merged


@dataclass
class _Plan:
    """What a URL means: its cache, every file of the dataset (with what its records say), and the local path a
    reader opens."""

    url: str
    cache: Cache
    entries: list[Entry]
    target: Path | list[Path]


def _plan(url: str, **cache_options: Any) -> _Plan:
    """The files of the dataset at ``url`` (a folder's listing, ``SHA256SUMS`` or index; a file and its companions;
    the matches of a glob). A folder's index files are fetched to read their records. A query string (a signed URL,
    a token) goes with every request of the dataset."""
    url, query = _split_query(url)
    pattern = _split_pattern(url)
    if pattern is not None:
        base, glob_pattern = pattern
        cache = Cache(base, query=query, **cache_options)
        sums = cache.sums()
        listing = (None if cache.offline else cache.backend.listing(cache.listing_url)) or list(sums)
        where = f"the listing of {cache.url}/"
        chosen = sorted(cache.check_name(n, where) for n in listing if fnmatch.fnmatch(n, glob_pattern))
        if not chosen:
            raise NotFoundError(f"the pattern {public_url(base)}/{glob_pattern} matches no file.")
        entries = [Entry(n, sha256=sums.get(n)) for n in chosen]
        listed = set(listing)  # a glob's store lists: an optional companion it does not list is absent
        for name in chosen:
            others = [*companions(name), *((c, False) for c in _sidecars(name))]
            entries += [Entry(c, sha256=sums.get(c), required=r) for c, r in others
                        if c not in chosen and (r or c in listed)]  # fmt: skip
        return _Plan(url, cache, entries, [cache.path(n) for n in chosen])
    if url.endswith("/"):
        cache = Cache(url, query=query, **cache_options)
        return _Plan(url, cache, _entries_with_records(cache, _folder_entries(cache, cache.sums())), cache.folder)
    base, name = url.rsplit("/", 1)
    cache = Cache(base, query=query, query_for=name if query else None, **cache_options)
    name = cache.check_name(name, f"the URL {public_url(url)}")
    sums = cache.sums()
    entries = [Entry(name, sha256=sums.get(name), required=False)]
    others = [*companions(name), *((c, False) for c in _sidecars(name))]
    # A published folder's SHA256SUMS names every file it holds: an optional companion it does not name is absent
    # (not asked of the store); without one, each is asked once.
    entries += [Entry(c, sha256=sums.get(c), required=r) for c, r in others if r or not sums or c in sums]
    return _Plan(url, cache, entries, cache.path(name))


def _sidecars(name: str) -> list[str]:
    """The provenance sidecars file or prefix ``name`` may have: beside the path its reader reports (the file itself,
    or the Megatron prefix of a ``.bin``/``.idx``)."""
    found = [name + PROVENANCE_SUFFIX]
    if name.endswith((".bin", ".idx")):
        found.append(name[: -len(".bin")] + PROVENANCE_SUFFIX)
    return found


def fetch(
    url: str,
    *,
    names: list[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    max_cache_bytes: float | None = None,
    offline: bool | None = None,
    backend: Backend | None = None,
    adopt: dict[str, Path] | None = None,
    progress: bool = False,
    **limits: Any,
) -> Dataset:
    """Fetch the dataset at ``url`` (a folder ``.../``, a file, a Megatron prefix, or a glob on a store that lists)
    into the cache, index files first, each file verified; ``names`` limits the fetch to those files (plus their
    companions the dataset lists, such as loss masks, and the index files; ``[]``: the index files alone, which may
    be none). ``adopt`` maps file names to files already on disk that are used when they verify. ``progress``: a
    bar of the bytes fetched on stderr (tqdm's, once the fetch has run a second; the total grows when a file no
    record sizes is answered). ``limits``: ``connect_timeout``, ``stall_timeout``, ``retries``,
    ``max_index_bytes``, ``revalidate`` (see :class:`~tokformats.remote.Cache`)."""
    unknown = set(limits) - set(_CACHE_OPTIONS)
    if unknown:
        raise TypeError(f"fetch() got unexpected options {sorted(unknown)}; it takes {list(_CACHE_OPTIONS)}.")
    plan = _plan(url, cache_dir=cache_dir, max_cache_bytes=max_cache_bytes, offline=offline, backend=backend,
                 **limits)  # fmt: skip
    return _bring(plan, names, adopt, progress=progress)


def _bring(
    plan: _Plan, names: list[str] | None = None, adopt: dict[str, Path] | None = None, *, progress: bool = False
) -> Dataset:
    """Fetch the files of ``plan`` (those in ``names``, their companions and the index files, when given) into its
    cache."""
    cache = plan.cache
    entries = plan.entries
    if names is not None:
        wanted = set(names) | {c for n in names for c, _ in companions(n)}  # a shard's loss mask comes with it
        entries = [e for e in entries if e.name in wanted or published_last(e.name)]
    # Index files first (a reader keys on them, and their records check the data files), then the data files, a few
    # at a time: each download hashes in its own thread, so two run at the speed of one on a fast link.
    unique: dict[str, Entry] = {}
    for entry in entries:  # each file once; its first mention (with the index's records) wins
        unique.setdefault(entry.name, entry)
    entries = list(unique.values())
    first = [e for e in entries if published_last(e.name)]
    rest = [e for e in entries if not published_last(e.name)]
    lease = Lease()
    done: dict[str, bool] = {}
    missing: dict[str, RemoteError] = {}  # optional files the store (or the offline cache) does not have
    bringing = {cache.path(e.name) for e in entries}  # never evicted by this fetch's own downloads
    meter = ByteProgress.shown({e.name: e.size for e in entries}, f"fetch {plan.cache.url}", enabled=progress)

    def get(entry: Entry) -> None:
        candidate = (adopt or {}).get(entry.name) or adopted(cache.root, entry.name)
        try:
            path = cache.fetch_held(entry.name, lease, size=entry.size, sha256=entry.sha256, adopt=candidate,
                                    keep=bringing, listed_by=entry.listed_by)  # fmt: skip
        except (NotFoundError, DeniedError) as error:
            absent = isinstance(error, NotFoundError) or cache.query_for is not None  # a presigned file's neighbours
            if entry.required or not absent:
                raise
            missing[entry.name] = error
            return
        meter.done(entry.name, path.stat().st_size)  # downloaded, or found in the cache
        done[entry.name] = True

    cache.progress = meter
    try:
        _get_all(get, first, rest)
    finally:
        cache.progress = None
        meter.close()
    if plan.target == cache.folder:  # a folder is read as a whole: only the files the dataset names now are in it
        cache.forget_others({SUMS, *(e.name for e in plan.entries)})
    fetched = list(dict.fromkeys(e.name for e in entries if e.name in done))
    if not fetched and names != []:
        raise _first_missing(plan, missing)
    return Dataset(plan.target, fetched, cache, lease, plan.entries)


def _first_missing(plan: _Plan, missing: dict[str, RemoteError]) -> RemoteError:
    """Why nothing of ``plan`` could be fetched: what the store (or the offline cache) said of the file the URL names
    (an llm.c ``.bin`` offline is "not in the cache", not its Megatron ``.idx`` that was never there)."""
    targets = set(plan.target) if isinstance(plan.target, list) else {plan.target}
    named = [error for name, error in missing.items() if plan.cache.path(name) in targets]
    first = next(iter(named or missing.values()), None)
    return first if first is not None else NotFoundError(f"{public_url(plan.url)} does not exist.")


def _get_all(get: Callable[[Entry], None], first: list[Entry], rest: list[Entry]) -> None:
    """``get`` the ``first`` entries in order, then the ``rest`` a few at a time; the first failure is raised (files
    not started then are not downloaded)."""
    for entry in first:
        get(entry)
    with ThreadPoolExecutor(max_workers=PARALLEL_DOWNLOADS) as pool:
        futures = [pool.submit(get, entry) for entry in rest]
        try:
            for future in futures:
                future.result()
        except BaseException:
            for future in futures:
                future.cancel()
            raise


def _keep_provenance_inside(reader: Any, folder: Path) -> Any:
    """Make ``reader`` (opened over a dataset's cache ``folder``) read its provenance sidecar from the dataset's own
    files (:func:`~tokformats.core.provenance.sidecar_in`: beside its path when that is in the folder, else the
    folder's ``dataset.provenance.npz``), never from beside the cache folder, which the dataset did not list."""
    if isinstance(reader, TokenReader):
        reader._provenance_sidecar = sidecar_in(reader.path, folder)
    return reader


def open_url(url: str, opener: Opener, **options: Any) -> Any:
    """Open the dataset at ``url`` (see :func:`fetch`) with ``opener`` (:func:`tokformats.open`, which calls this for
    a URL): the same reader as for a local path, over cached files.

    ``cache_dir``, ``max_cache_bytes``, ``offline``, ``backend``, ``connect_timeout``, ``stall_timeout``, ``retries``,
    ``max_index_bytes`` and ``revalidate`` configure the cache (:class:`~tokformats.remote.Cache`); every other
    option goes to the reader (``format=``, ``dtype=``, ...). The reader holds its files against eviction until it
    is closed.
    """
    cache_options = {k: options.pop(k) for k in _CACHE_OPTIONS if k in options}
    plan = _plan(url, **cache_options)  # once: a dataset no format opens lazily is fetched from the same listing
    if "backend" not in cache_options:
        lazy = _open_lazily(plan, opener, cache_options, options)
        if lazy is not None:
            return lazy
    dataset = _bring(plan)
    reader = opener(dataset.target, **options)
    reader.hold(dataset.lease)  # released by close() (or when the reader is collected)
    return _keep_provenance_inside(reader, plan.cache.folder)


def _open_lazily(plan: _Plan, opener: Opener, cache_options: dict[str, Any], options: dict[str, Any]) -> Any:
    """A dataset (a folder, a file or prefix, a glob) whose format can fetch its data files on first use opens with
    its index files only (its module's ``remote_lazy(folder, names)`` says whether the index files, fetched here, or
    headers read by range tell how large every data file is and where its documents are); else None."""
    index = _bring(plan, names=[])
    names = [e.name for e in index.entries]

    def keyed(descriptor: FormatDescriptor) -> bool:
        """Whether an index file fetched here is one this format publishes last (so it is asked first)."""
        publishing = descriptor.capability(PublishedLast)
        patterns = publishing.PUBLISHED_LAST if publishing is not None else ()
        return any(fnmatch.fnmatch(Path(n).name, p) for n in index.files for p in patterns)

    for descriptor in sorted(formats.values(), key=lambda d: not keyed(d)):  # stable: registry order within
        lazy = descriptor.capability(RemoteLazy)
        if lazy is None or options.get("format") not in (None, descriptor.name):
            continue
        if not lazy.remote_lazy(index.cache.folder, names):
            continue
        records = {
            e.name: {"size": e.size, "sha256": e.sha256, "listed_by": e.listed_by,
                     "maybe": not e.required and e.name not in index.files}
            for e in index.entries
        }  # fmt: skip
        cache = {**cache_options, "cache_dir": str(index.cache.root),
                 "query_for": index.cache.query_for}  # no backend here: it pickles with the reader  # fmt: skip
        remote: LazyFiles = RemoteFiles(index.cache.source, index.cache.folder, records, cache, index=index.files)
        index.lease.release()  # the reader's RemoteFiles holds the index files now
        try:
            reader = opener(index.target, **{**options, "format": descriptor.name}, remote=remote)
        except HeaderError:
            if options.get("format") is not None:
                raise
            # The names fitted, the header did not (a raw stream named like llm.c shards): the files are fetched and
            # detected by content instead, as for any dataset no format can open lazily.
            remote.release()
            return None
        reader.hold(remote)
        return _keep_provenance_inside(reader, index.cache.folder)
    index.lease.release()
    return None
