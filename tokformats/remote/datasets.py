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
from ..core.registry import FormatDescriptor, formats
from ..errors import HeaderError
from .backends import Backend, NotFoundError, RemoteError
from .cache import Cache, Lease
from .hooks import adopted, companions, index_readers, published_last
from .lazy import RemoteFiles

__all__ = ["Dataset", "Entry", "Opener", "SUMS", "fetch", "open_url"]

#: How a local copy is opened: :func:`tokformats.open` (path, format=..., reader options) -> a reader.
Opener = Callable[..., Any]

SUMS = "SHA256SUMS"
#: Data files downloaded at once.
PARALLEL_DOWNLOADS = 2
_CACHE_OPTIONS = ("cache_dir", "max_cache_bytes", "offline", "backend")


@dataclass
class Entry:
    """One file of a remote dataset, with what its records say it is."""

    name: str
    size: int | None = None
    sha256: str | None = None
    required: bool = True
    #: The index or sidecar that names the file (for errors).
    listed_by: str | None = None


def _entry(item: dict[str, Any], listed_by: str) -> Entry:
    """An :class:`Entry` from a format's ``remote_files`` row (fields the cache does not use are left out)."""
    known = {k: item[k] for k in ("name", "size", "sha256", "required") if k in item}
    return Entry(**known, listed_by=listed_by)


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


def _split_pattern(url: str) -> tuple[str, str] | None:
    """``(base URL, pattern)`` for a URL whose path holds a glob, else None."""
    scheme, rest = url.split("://", 1)
    if not set("*?[") & set(rest):
        return None
    parts = rest.split("/")
    first = next(k for k, part in enumerate(parts) if set("*?[") & set(part))
    return f"{scheme}://{'/'.join(parts[:first])}", "/".join(parts[first:])


def _folder_entries(cache: Cache, sums: dict[str, str]) -> list[Entry]:
    """The files of a folder URL: the store's listing, else ``SHA256SUMS``, else a format's index."""
    listing = None if cache.offline else cache.backend.listing(cache.url)
    if listing:
        return [Entry(n, sha256=sums.get(n)) for n in listing if n != SUMS and not n.startswith(".")]
    if sums:
        return [Entry(n, sha256=s, listed_by=SUMS) for n, s in sums.items()]
    for index_names, reader in index_readers():
        for index in index_names:
            try:
                cache.fetch(index)
            except NotFoundError:
                continue
            return [Entry(index)] + [_entry(item, index) for item in reader(cache.folder)]
    raise RemoteError(
        f"{cache.url}/ cannot be listed: publish it with tokformats publish (which writes {SUMS}), or open one of "
        "its files, or an index the formats know."
    )


def _entries_with_records(cache: Cache, entries: list[Entry]) -> list[Entry]:
    """Add the sizes and checksums the dataset's own index records (fetched first) to ``entries``."""
    records: dict[str, Entry] = {}
    names = {e.name for e in entries}
    for index_names, reader in index_readers():
        for index in index_names:
            if index in names:
                cache.fetch(index)
                records.update({item["name"]: _entry(item, index) for item in reader(cache.folder)})
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
    the matches of a glob). A folder's index files are fetched to read their records."""
    pattern = _split_pattern(url)
    if pattern is not None:
        base, glob_pattern = pattern
        cache = Cache(base, **cache_options)
        sums = cache.sums()
        listing = (None if cache.offline else cache.backend.listing(base)) or list(sums)
        chosen = sorted(n for n in listing if fnmatch.fnmatch(n, glob_pattern))
        if not chosen:
            raise NotFoundError(f"the pattern {url!r} matches no file.")
        entries = [Entry(n, sha256=sums.get(n)) for n in chosen]
        for name in chosen:
            entries += [Entry(c, required=r) for c, r in companions(name) if c not in chosen]
        return _Plan(url, cache, entries, [cache.path(n) for n in chosen])
    if url.endswith("/"):
        cache = Cache(url, **cache_options)
        return _Plan(url, cache, _entries_with_records(cache, _folder_entries(cache, cache.sums())), cache.folder)
    base, name = url.rsplit("/", 1)
    cache = Cache(base, **cache_options)
    sums = cache.sums()
    entries = [Entry(name, sha256=sums.get(name), required=False)]
    entries += [Entry(c, sha256=sums.get(c), required=r) for c, r in companions(name)]
    return _Plan(url, cache, entries, cache.path(name))


def fetch(
    url: str,
    *,
    names: list[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    max_cache_bytes: float | None = None,
    offline: bool | None = None,
    backend: Backend | None = None,
    adopt: dict[str, Path] | None = None,
) -> Dataset:
    """Fetch the dataset at ``url`` (a folder ``.../``, a file, a Megatron prefix, or a glob on a store that lists)
    into the cache, index files first, each file verified; ``names`` limits the fetch to those files (plus the
    index files; ``[]``: the index files alone, which may be none). ``adopt`` maps file names to files already on
    disk that are used when they verify."""
    plan = _plan(url, cache_dir=cache_dir, max_cache_bytes=max_cache_bytes, offline=offline, backend=backend)
    return _bring(plan, names, adopt)


def _bring(plan: _Plan, names: list[str] | None = None, adopt: dict[str, Path] | None = None) -> Dataset:
    """Fetch the files of ``plan`` (those in ``names`` and the index files, when given) into its cache."""
    cache = plan.cache
    entries = plan.entries
    if names is not None:
        wanted = set(names)
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
    missing: list[NotFoundError] = []
    bringing = {cache.path(e.name) for e in entries}  # never evicted by this fetch's own downloads

    def get(entry: Entry) -> None:
        candidate = (adopt or {}).get(entry.name) or adopted(cache.root, entry.name)
        try:
            cache.fetch_held(entry.name, lease, size=entry.size, sha256=entry.sha256, adopt=candidate,
                             keep=bringing, listed_by=entry.listed_by)  # fmt: skip
        except NotFoundError as error:
            if entry.required:
                raise
            missing.append(error)
            return
        done[entry.name] = True

    for entry in first:
        get(entry)
    with ThreadPoolExecutor(max_workers=PARALLEL_DOWNLOADS) as pool:
        futures = [pool.submit(get, entry) for entry in rest]
        try:
            for future in futures:
                future.result()
        except BaseException:  # the first failure is raised: files not started are not downloaded
            for future in futures:
                future.cancel()
            raise
    fetched = list(dict.fromkeys(e.name for e in entries if e.name in done))
    if not fetched and names != []:
        raise missing[0] if missing else NotFoundError(f"{plan.url} does not exist.")
    return Dataset(plan.target, fetched, cache, lease, plan.entries)


def open_url(url: str, opener: Opener, **options: Any) -> Any:
    """Open the dataset at ``url`` (see :func:`fetch`) with ``opener`` (:func:`tokformats.open`, which calls this for
    a URL): the same reader as for a local path, over cached files.

    ``cache_dir``, ``max_cache_bytes``, ``offline`` and ``backend`` configure the cache; every other option goes to
    the reader (``format=``, ``dtype=``, ...). The reader holds its files against eviction until it is closed.
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
    return reader


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
        cache = {**cache_options, "cache_dir": str(index.cache.root)}  # no backend here: it pickles with the reader
        remote: LazyFiles = RemoteFiles(index.cache.url, index.cache.folder, records, cache, index=index.files)
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
        return reader
    index.lease.release()
    return None
