"""Paths as users give them: a file, a glob pattern, a list of paths, or a URL; and the first bytes of a file, read
without blocking on a FIFO.

Opening a glob of many shards expands it in several places (detection, the journal check, the reader); within
:func:`one_expansion` (which ``tokformats.open`` holds) a pattern is listed once and its matches are shared, as
strings: a ``Path`` costs microseconds to build, which 600,000 shards would pay again and again.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import glob
import itertools
import operator
import os
import re
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any, NoReturn

from ..errors import ConfigError, FormatError, NoFilesError

__all__ = [
    "URL_SCHEMES",
    "expand_paths",
    "expand_path_texts",
    "folders_near",
    "forget_listings",
    "is_pattern",
    "is_url",
    "names_checked",
    "one_expansion",
    "pattern_matches",
    "public_url",
    "read_head",
    "scrub_secrets",
]


def read_head(path: Path, size: int) -> bytes:
    """The first ``size`` bytes of ``path`` (fewer if it is shorter; empty if it cannot be read or is not a regular
    file: opening a FIFO would block): for detection."""
    from ..fs.untrusted import is_regular

    if not is_regular(path):
        return b""
    try:
        with open(path, "rb") as handle:
            return handle.read(size)
    except OSError:
        return b""


@contextlib.contextmanager
def names_checked(path: Any) -> Iterator[None]:
    """Within the block, a name too long for the file system (over 255 bytes in one part, on most) is a
    :class:`FormatError` naming ``path``, not a bare ``OSError``."""
    try:
        yield
    except OSError as error:
        if error.errno != errno.ENAMETOOLONG:
            raise
        longest = max(Path(os.fspath(error.filename or path)).parts, key=lambda part: len(os.fsencode(part)))
        raise FormatError(
            f"{error.filename or path}: the name {longest[:40]!r}... is {len(os.fsencode(longest)):,} bytes, longer "
            "than the file system allows (255 on most); choose a shorter name."
        ) from None


_GLOB_CHAR = re.compile(r"[*?\[]")
#: The URL schemes ``open`` fetches through :mod:`tokformats.remote`.
URL_SCHEMES = ("http", "https", "s3", "gs", "gcs", "hf")


def is_url(path: Any) -> bool:
    """Whether ``path`` is a URL tokformats fetches (``https://``, ``s3://``, ...) rather than a local path."""
    if not isinstance(path, str) or "://" not in path:
        return False
    return path.split("://", 1)[0].lower() in URL_SCHEMES


def public_url(url: str) -> str:
    """``url`` as messages, logs and cache folder names show it: without user info (``user:password@``), query
    string or fragment (a signed URL carries its secret in the query)."""
    import urllib.parse

    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        host = f"[{host}]" if ":" in host else host  # IPv6
        if parts.port:
            host = f"{host}:{parts.port}"
    except ValueError:  # an unparseable port or bracket: keep only what precedes any secret
        scheme, _, rest = url.partition("://")
        rest = rest.rsplit("@", 1)[-1].split("?", 1)[0].split("#", 1)[0]
        return f"{scheme}://{rest}"
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))


def scrub_secrets(text: str, url: str) -> str:
    """``text`` (a foreign error's message) with ``url``'s user info and query string taken out wherever they
    appear, whole or percent-decoded."""
    import urllib.parse

    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return text.replace(url, public_url(url))
    secrets = [url, parts.query, parts.netloc.rpartition("@")[0] if "@" in parts.netloc else ""]
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        shown = public_url(url) if secret == url else "<redacted>"
        text = text.replace(secret, shown).replace(urllib.parse.unquote(secret), shown)
    return text


def is_pattern(text: str) -> bool:
    """Whether ``text`` is a glob pattern rather than a path: it holds ``*``, ``?`` or ``[`` and nothing exists under
    that exact name (a file may be called ``a[1].bin``). The one rule every path argument follows. Within
    :func:`one_expansion`, a pattern already listed stays one (no ``stat`` of its name for each caller)."""
    if _GLOB_CHAR.search(text) is None:
        return False
    listings = _LISTINGS.get()
    return (listings is not None and text in listings) or not os.path.exists(text)


class _Listing:
    """A pattern's sorted matches; which of them are folders and the one folder holding them all, when the listing
    said so (else None)."""

    def __init__(self, matches: list[str], folders: set[str] | None, parent: str | None = None) -> None:
        self.matches, self.folders, self.parent = matches, folders, parent


#: The listings made within :func:`one_expansion` (None outside it).
_LISTINGS: ContextVar[dict[str, _Listing] | None] = ContextVar("tokformats_listings", default=None)


@contextlib.contextmanager
def one_expansion() -> Iterator[None]:
    """Within the block, each glob pattern is listed once: every caller of :func:`expand_paths` sees that listing
    (``open`` detects, checks for a journal and reads one set of files, not three listings that may differ)."""
    token = _LISTINGS.set({} if _LISTINGS.get() is None else _LISTINGS.get())
    try:
        yield
    finally:
        _LISTINGS.reset(token)


def forget_listings() -> None:
    """Drop the listings :func:`one_expansion` keeps: the files changed (a killed writer's commit was completed)."""
    listings = _LISTINGS.get()
    if listings is not None:
        listings.clear()


def _matching_names(pattern: str, names: list[str]) -> list[str]:
    """The ``names`` that match ``pattern`` (``fnmatch``'s rule; glob's: a wildcard never matches a leading dot unless
    the pattern starts with one). The common shard pattern, one ``*`` between a fixed start and end
    (``corpus_train_*.bin``), is a prefix and a suffix test, each a C loop over the names: no regular expression
    compiled on a process's first open, no bytecode run per entry."""
    if pattern.count("*") == 1 and "?" not in pattern and "[" not in pattern:
        start, end = pattern.split("*")
        found = list(itertools.compress(names, map(str.startswith, names, itertools.repeat(start))))  # C loops
        found = list(itertools.compress(found, map(str.endswith, found, itertools.repeat(end))))
        least = len(start) + len(end)  # a name shorter than this has its start and end overlap: no match
        # which needs a start ending with what the end starts with (``ab*ba``, not ``corpus_*.bin``): only then a pass
        overlapping = any(start.endswith(end[:k]) for k in range(1, min(len(start), len(end)) + 1))
        if overlapping and min(map(len, found), default=least) < least:
            found = [n for n in found if len(n) >= least]
    else:
        match = re.compile(fnmatch.translate(pattern)).match
        found = [n for n in names if match(n)]
    if pattern.startswith(".") or not pattern.startswith(("*", "?", "[")):
        return found  # a literal first character (a dot or not) already decides whether hidden names match
    return [n for n in found if not n.startswith(".")]


_ENTRY_NAME = operator.attrgetter("name")
#: Where ``scandir`` takes a folder's descriptor (POSIX), its entries carry no joined path (``entry.path`` is the
#: name): 1,000 entries list ~20% faster than by the folder's name.
_SCAN_BY_DESCRIPTOR = os.scandir in os.supports_fd


def _scan(folder: str) -> tuple[list[str], list[str]]:
    """The names of ``folder``'s entries, and those of its entries that are folders (links to folders included), by one
    ``scandir``: the entries' types come with the listing, no ``stat`` per entry. C loops, and no tuple per entry (the
    cyclic collector tracks tuples, not names or entries)."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NONBLOCK", 0)  # a FIFO never blocks it
    descriptor = os.open(folder, flags) if _SCAN_BY_DESCRIPTOR else None
    try:
        with os.scandir(folder if descriptor is None else descriptor) as listing:
            entries = list(listing)
            names = list(map(_ENTRY_NAME, entries))
            # while the descriptor is open: an entry of unknown type or a link is looked up relative to it
            return names, list(itertools.compress(names, map(os.DirEntry.is_dir, entries)))
    finally:
        if descriptor is not None:
            os.close(descriptor)


def _list_pattern(text: str) -> _Listing:
    """Glob ``text`` (not recursive). A pattern whose wildcards are all in its last part (``data/x_*.bin``) is one
    ``scandir`` of the folder, whose entries also say which matches are folders (no ``stat`` per match)."""
    folder, name = os.path.split(text)
    if glob.has_magic(folder) or not name:
        return _Listing(sorted(glob.glob(text)), None)
    try:
        every, subfolders = _scan(folder or os.curdir)
    except OSError:  # no such folder, or not one: glob matches nothing there
        return _Listing([], set(), folder or os.curdir)
    names = _matching_names(name, every)
    names.sort()  # the names, not the paths: the folder's prefix is not compared again and again
    prefix = os.path.join(folder, "")
    folders = {prefix + entry for entry in set(names).intersection(subfolders)} if subfolders else set()
    return _Listing(list(map(prefix.__add__, names)), folders, folder or os.curdir)  # a C loop: 600,000 names


def _listing(text: str) -> _Listing:
    listings = _LISTINGS.get()
    if listings is None:
        return _list_pattern(text)
    found = listings.get(text)
    if found is None:
        found = listings[text] = _list_pattern(text)
    return found


def pattern_matches(text: str, *, recursive: bool = False) -> list[Path]:
    """The paths glob pattern ``text`` matches, sorted (``recursive``: ``**`` spans folders)."""
    if recursive:
        return [Path(m) for m in sorted(glob.glob(text, recursive=True))]
    return [Path(m) for m in _listing(text).matches]


def expand_path_texts(path: Any) -> list[str]:
    """:func:`expand_paths` as strings (no ``Path`` built per match: a glob of 600,000 shards); :class:`ConfigError`
    for anything that is not a path or a list of paths (None, a number, bytes)."""
    if isinstance(path, (str, os.PathLike)):
        text = os.fspath(path)
        if is_pattern(text):
            matches = _listing(text).matches
            if not matches:
                raise NoFilesError(f"the pattern {text!r} matches no file.")
            return list(matches)
        return [text]
    if isinstance(path, (bytes, bytearray)) or not isinstance(path, Iterable):
        raise ConfigError(_not_a_path(path))
    texts = [os.fspath(p) if isinstance(p, (str, os.PathLike)) else _refuse_in_list(p) for p in path]
    if not texts:
        raise NoFilesError("an empty list of paths was given; name at least one file.")
    return texts


def _not_a_path(found: Any, where: str = "") -> str:
    return (
        "a dataset is named by a path (a str or os.PathLike: a file, a Megatron prefix, a folder, a glob pattern or "
        f"a URL) or by a list of paths; found {found!r} ({type(found).__name__}){where}."
    )


def _refuse_in_list(item: Any) -> NoReturn:
    raise ConfigError(_not_a_path(item, " in the list"))


def expand_paths(path: Any) -> list[Path]:
    """A path, a glob pattern or a list of paths as a list of paths (globs sorted).

    A glob that matches nothing, or an empty list, raises :class:`NoFilesError`.
    """
    return [Path(text) for text in expand_path_texts(path)]


def folders_near(path: Any) -> list[str]:
    """The folders holding what ``path`` expands to, and the folders among it, sorted (a glob's listing says so
    without a ``stat`` per match). :class:`NoFilesError` when it expands to nothing."""
    if isinstance(path, (str, os.PathLike)):
        text = os.fspath(path)
        if not is_pattern(text):  # one path: its folder, and itself when it is one
            return sorted({os.path.dirname(text) or os.curdir, *([text] if os.path.isdir(text) else [])})
        listing = _listing(text)
        if listing.folders is not None and listing.parent is not None and listing.matches:
            return sorted({listing.parent, *listing.folders})
    texts = expand_path_texts(path)
    return sorted({os.path.dirname(t) or os.curdir for t in texts} | {t for t in texts if os.path.isdir(t)})
