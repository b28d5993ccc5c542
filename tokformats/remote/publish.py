"""Publishing a dataset folder to a store so that readers never see it half published."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from .backends import Backend, NotFoundError, backend_for
from .cache import file_sha256
from .datasets import SUMS
from .hooks import published_last

__all__ = ["publish"]


def publish(
    folder: str | os.PathLike[str], url: str, *, dry_run: bool = False, backend: Backend | None = None
) -> dict[str, Any]:
    """Upload a dataset folder to ``url`` (a folder URL): data files first, then ``SHA256SUMS``, then the index files
    readers key on, so that no reader ever sees an index pointing at missing files. Files whose published SHA-256
    already matches are skipped. ``dry_run`` only says what would be uploaded.

    Returns:
        ``{"uploaded": [...], "skipped": [...], "bytes": N, "dry_run": bool}``.
    """
    root = Path(folder)
    if not root.is_dir():
        raise NotFoundError(f"{root} is not a folder to publish.")
    base = url.rstrip("/")
    store = backend or backend_for(base)
    files = sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts) and p.name != SUMS
    )
    sums = {name: file_sha256(root / name) for name in files}
    published = _published_sums(store, f"{base}/{SUMS}")
    uploaded, skipped, sent = [], [], 0
    order = [n for n in files if not published_last(n)] + [SUMS] + [n for n in files if published_last(n)]
    with tempfile.TemporaryDirectory(prefix="tokformats-publish-") as scratch:
        listing = Path(scratch) / SUMS
        listing.write_text("".join(f"{sums[n]}  {n}\n" for n in files), encoding="utf-8")
        for name in order:
            path = listing if name == SUMS else root / name
            if name != SUMS and published.get(name) == sums[name]:
                skipped.append(name)
                continue
            if name == SUMS and published == sums:
                skipped.append(name)
                continue
            if not dry_run:
                store.upload(str(path), f"{base}/{name}")
            uploaded.append(name)
            sent += path.stat().st_size
    return {"uploaded": uploaded, "skipped": skipped, "bytes": sent, "dry_run": dry_run}


def _published_sums(store: Backend, url: str) -> dict[str, str]:
    """The ``SHA256SUMS`` already published at ``url``, or empty."""
    with tempfile.TemporaryFile() as handle:
        try:
            store.download(url, handle, 0, None)
        except NotFoundError:
            return {}
        handle.seek(0)
        text = handle.read().decode("utf-8", "replace")
    sums = {}
    for line in text.splitlines():
        digest, _, name = line.partition("  ")
        if len(digest) == 64 and name:
            sums[name] = digest.lower()
    return sums
