"""Publishing a dataset folder to a store so that readers never see it half published, nor two versions mixed."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from ..core.provenance import FOLDER_SIDECAR, sidecar_path
from ..fs.names import UnsafeNameError
from ..fs.paths import public_url
from .backends import Backend, Limits, NotFoundError, OversizeError, RemoteError, RemoteStat, backend_for
from .byte_progress import ByteProgress
from .cache import file_sha256
from .cachefiles import dataset_name
from .hooks import published_last
from .sums import SUMS, IndexFormatError, parse_sums_line

__all__ = ["publish", "StaleFilesError"]


class StaleFilesError(RemoteError):
    """The store holds files of an earlier version that the new one does not, and ``prune=True`` was not given."""

    transient = False


def publish(
    folder: str | os.PathLike[str],
    url: str,
    *,
    dry_run: bool = False,
    backend: Backend | None = None,
    prune: bool = False,
    progress: bool = False,
) -> dict[str, Any]:
    """Upload a dataset folder to ``url`` (a folder URL): data files first, then ``SHA256SUMS``, then the index files
    readers key on, so that no reader ever sees an index pointing at missing files. Files whose published SHA-256
    already matches are skipped; hidden files (a commit journal, locks) are never uploaded. ``dry_run`` only says
    what would be uploaded. Loss masks and other companions are files of the folder like the others; the provenance
    sidecar ``tokenize`` writes beside a folder dataset (``FOLDER.provenance.npz``) is uploaded into it as
    ``dataset.provenance.npz`` (the URL names the folder alone), where readers by URL find it. ``progress``: bars
    of the bytes checksummed and uploaded on stderr (tqdm's, once a step has run a second).

    Republishing over an earlier version: files the store holds (its ``SHA256SUMS``, and its listing where it can
    list) that the new version does not are deleted after the upload with ``prune=True`` (``--prune``); without it,
    :class:`StaleFilesError` is raised before anything is uploaded. Readers go by ``SHA256SUMS`` either way.

    Returns:
        ``{"uploaded": [...], "skipped": [...], "removed": [...], "bytes": N, "dry_run": bool}``.
    """
    root = Path(folder)
    if not root.is_dir():
        raise NotFoundError(f"{root} is not a folder to publish.")
    base = url.rstrip("/")
    store = backend or backend_for(base)
    local = _local_files(root)
    files = sorted(local)
    sums = _checksums(local, progress)
    published = _published_sums(store, f"{base}/{SUMS}")
    stale = _stale_files(store, base, published, set(files))
    if stale and not prune:
        shown = ", ".join(stale[:5]) + (", ..." if len(stale) > 5 else "")
        raise StaleFilesError(
            f"{public_url(base)}/ holds {len(stale)} file(s) the new version does not ({shown}); nothing was uploaded. "
            "Publish with prune=True (tokformats publish --prune FOLDER URL) to delete them after the upload, or "
            "publish to a new URL."
        )
    uploaded: list[str] = []
    sent = 0
    order = [n for n in files if not published_last(n)] + [SUMS] + [n for n in files if published_last(n)]
    with tempfile.TemporaryDirectory(prefix="tokformats-publish-") as scratch:
        local[SUMS] = Path(scratch) / SUMS
        local[SUMS].write_text("".join(f"{sums[n]}  {n}\n" for n in files), encoding="utf-8")
        same = {n: published == sums if n == SUMS else published.get(n) == sums[n] for n in order}
        changed = [n for n in order if not same[n]]
        skipped = [n for n in order if same[n]]
        meter = ByteProgress.shown({n: local[n].stat().st_size for n in changed}, f"publish {public_url(base)}",
                                   enabled=progress and not dry_run)  # fmt: skip
        try:
            for name in changed:
                size = local[name].stat().st_size
                if not dry_run:
                    store.upload(str(local[name]), f"{base}/{name}")
                meter.done(name, size)
                uploaded.append(name)
                sent += size
        finally:
            meter.close()
    if not dry_run:
        for name in stale:  # after the new index: a reader of the new version never needs them
            store.delete(f"{base}/{name}")
    return {"uploaded": uploaded, "skipped": skipped, "removed": stale, "bytes": sent, "dry_run": dry_run}


def _local_files(root: Path) -> dict[str, Path]:
    """The files of dataset folder ``root`` to publish, by their name in the store: every regular file below it but
    hidden ones (a commit journal, locks) and a stale ``SHA256SUMS``, plus the provenance sidecar beside the folder
    (as :data:`~tokformats.core.provenance.FOLDER_SIDECAR`, unless the folder holds one)."""
    files = {
        p.relative_to(root).as_posix(): p
        for p in root.rglob("*")
        if p.is_file() and not p.is_symlink() and p.name != SUMS
        and not any(part.startswith(".") for part in p.relative_to(root).parts)
    }  # fmt: skip
    beside = sidecar_path(root)
    if beside.is_file() and not beside.is_symlink() and FOLDER_SIDECAR not in files:
        files[FOLDER_SIDECAR] = beside
    return dict(sorted(files.items()))


def _checksums(files: dict[str, Path], progress: bool) -> dict[str, str]:
    """The SHA-256 of each file, with a bar of the bytes read when ``progress``."""
    meter = ByteProgress.shown({n: p.stat().st_size for n, p in files.items()}, "checksums", enabled=progress)
    sums = {}
    try:
        for name, path in files.items():
            sums[name] = file_sha256(path)
            meter.done(name, path.stat().st_size)
    finally:
        meter.close()
    return sums


def _stale_files(store: Backend, base: str, published: dict[str, str], files: set[str]) -> list[str]:
    """Files of an earlier version at ``base`` (named by its ``SHA256SUMS`` or the store's listing; hidden files
    are not the dataset's) that the new version does not hold."""
    listing = store.listing(base) or []
    where = f"the listing of {public_url(base)}/"
    held = set(published)
    for name in listing:
        if name != SUMS and not any(part.startswith(".") for part in str(name).split("/")):
            held.add(dataset_name(name, where=where))
    return sorted(held - files)


def _published_sums(store: Backend, url: str) -> dict[str, str]:
    """The ``SHA256SUMS`` already published at ``url`` (no larger than the index cap), or empty."""
    cap = getattr(store, "limits", None) or Limits.of()

    def bounded(stat: RemoteStat, whole: bool) -> None:
        if stat.size > cap.max_index_bytes:
            raise OversizeError(f"{public_url(url)} is {stat.size:,} bytes, more than max_index_bytes allows.")

    sums: dict[str, str] = {}
    with tempfile.TemporaryFile() as handle:
        try:
            store.download(url, handle, 0, None, bounded)
        except NotFoundError:
            return {}
        handle.seek(0)
        for number, raw in enumerate(iter(lambda: handle.readline(1 << 13), b""), 1):
            where = f"{public_url(url)}, line {number}"
            line = parse_sums_line(raw, where)
            if line is not None:
                try:
                    sums[dataset_name(line[1], where=where)] = line[0]
                except UnsafeNameError as error:
                    raise IndexFormatError(str(error)) from None
    return sums
