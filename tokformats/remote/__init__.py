"""Datasets by URL: ``tokformats.open("https://...")`` fetches into a verified local cache and opens the copy;
``tokformats.publish(folder, url)`` uploads a dataset so that readers never see it half published.

Which files a URL means is the formats' knowledge, asked through optional hooks of each format module:

- ``remote_companions(name) -> [(name, required), ...]``: files that go with a file or prefix (Megatron's ``.idx``
  and ``.bin``, datatrove's ``.ds.index``, each format's loss masks); a file's provenance sidecar is added here;
- ``REMOTE_INDEX`` and ``remote_files(folder) -> [{"name", "size", "sha256"}, ...]``: a folder's index file(s) and
  the data files (with sizes and checksums) they list (a NeuroShard ``manifest.json``, litdata's ``index.json``);
- ``PUBLISHED_LAST``: file name patterns uploaded after every other file (the index readers key on);
- ``remote_lazy(folder, names) -> bool``: whether the format's reader, given the index files (in ``folder``) and
  the dataset's file names, can open with ``remote=`` (:class:`~tokformats.remote.lazy.RemoteFiles`) and fetch each
  data file on first use.

A folder URL on a store that lists (S3, GCS, the Hub) is its listing; over HTTP it is its ``SHA256SUMS`` (which
``publish`` writes) or a format's index. Index files are fetched first, then the data files, each verified against
the size and SHA-256 its index records, else ``SHA256SUMS``, else the store's own checksum. A file URL (or a glob)
asks for an optional companion only when the folder's ``SHA256SUMS`` (the store's listing) names it, if it has one.
"""

from __future__ import annotations

from .backends import Limits, NotFoundError, OversizeError, RemoteError, StallError, is_url
from .cache import Cache, ChecksumError, IndexFormatError, UnsafeCacheError, default_cache_dir
from .datasets import Dataset, fetch, open_url
from .publish import StaleFilesError, publish

__all__ = ["open_url", "fetch", "publish", "is_url", "Cache", "Limits", "RemoteError", "NotFoundError", "ChecksumError",
           "OversizeError", "StallError", "IndexFormatError", "UnsafeCacheError", "StaleFilesError",
           "default_cache_dir", "Dataset"]  # fmt: skip
