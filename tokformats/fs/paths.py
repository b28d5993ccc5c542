"""Paths as users give them: a file, a glob pattern, a list of paths, or a URL; and the first bytes of a file, read
without blocking on a FIFO."""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Any

from ..errors import NoFilesError

__all__ = ["URL_SCHEMES", "expand_paths", "is_pattern", "is_url", "pattern_matches", "public_url", "read_head",
           "scrub_secrets"]  # fmt: skip


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


_GLOB_CHARS = set("*?[")
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
    that exact name (a file may be called ``a[1].bin``). The one rule every path argument follows."""
    return bool(_GLOB_CHARS & set(text)) and not os.path.exists(text)


def pattern_matches(text: str, *, recursive: bool = False) -> list[Path]:
    """The paths glob pattern ``text`` matches, sorted (``recursive``: ``**`` spans folders)."""
    return [Path(m) for m in sorted(glob.glob(text, recursive=recursive))]


def expand_paths(path: Any) -> list[Path]:
    """A path, a glob pattern or a list of paths as a list of paths (globs sorted).

    A glob that matches nothing, or an empty list, raises :class:`NoFilesError`.
    """
    if isinstance(path, (str, os.PathLike)):
        text = os.fspath(path)
        if is_pattern(text):
            matches = pattern_matches(text)
            if not matches:
                raise NoFilesError(f"the pattern {text!r} matches no file.")
            return matches
        return [Path(text)]
    paths = [Path(os.fspath(p)) for p in path]
    if not paths:
        raise NoFilesError("an empty list of paths was given; name at least one file.")
    return paths
