"""Facts about a dataset for people and scripts: what ``tokformats info`` prints."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.arrays import iter_chunks
from ..core.protocol import Reader, TokenReader
from ..errors import option

__all__ = ["describe"]


def _extremes(reader: TokenReader) -> tuple[Any, Any]:
    """Smallest and largest value, scanned chunk by chunk (vectorised, memory bounded)."""
    if reader.num_tokens == 0:
        return None, None
    lows, highs = [], []
    for chunk in iter_chunks(reader.tokens):
        if len(chunk):
            lows.append(chunk.min())
            highs.append(chunk.max())
    low, high = min(lows), max(highs)
    return (low.item(), high.item())


def describe(reader: Reader[Any], *, scan: bool = True, url: str | None = None) -> dict[str, Any]:
    """A JSON-serialisable summary: format, files, sizes, counts, dtype, id range and header fields.

    Args:
        reader: an open reader.
        scan: compute the smallest and largest id (reads every token once).
        url: the URL the dataset was opened by: the summary names it and its files' URLs, and gives their sizes
            as the store lists them (``bytes``) beside what the cache holds (``bytes_cached``), not the cache paths.
    """
    files = reader.files
    on_disk = int(sum(f.stat().st_size for f in files if f.exists()))
    remote = getattr(reader, "_remote", None)
    info: dict[str, Any] = {"format": reader.format, "path": str(reader.path), "files": [str(f) for f in files]}
    if url is not None:
        info["path"] = url
        if remote is not None:
            info["files"] = [f"{remote.url}/{remote.name_of(f)}" for f in files]
            info["bytes"] = int(sum(remote.size(f) for f in files))
        info["bytes_cached"] = on_disk
    else:
        info["bytes_on_disk"] = on_disk
    warnings = list(reader.warnings)
    if isinstance(reader, TokenReader):
        info["documents"] = len(reader)
        info["tokens"] = reader.num_tokens
        info["dtype"] = reader.dtype.name
        if reader._remote is None:  # by URL, asking would download the masks: info stays a look at the index
            info["loss_masks"] = reader.loss_masks is not None  # SFT data: which tokens are trained on is stored
        if scan:
            info["min_id"], info["max_id"] = _extremes(reader)
        warnings += _undelimited(reader)
        delimiter = next((getattr(reader, k) for k in ("eos", "bos") if getattr(reader, k, None) is not None), None)
        if delimiter is not None and len(reader) <= 1 and reader.num_tokens > 1:
            warnings.append(
                f"the delimiter {delimiter} never occurs inside the stream, so it reads as one document; if its "
                "documents are marked by another id, pass it (--eos / --bos)."
            )
        if len(reader):
            lengths = reader.lengths
            info["document_length"] = {
                "min": int(lengths.min()),
                "mean": round(float(lengths.mean()), 2),
                "max": int(lengths.max()),
            }
    else:
        info["items"] = len(reader)
    info["metadata"] = _jsonable(reader.metadata)
    info["warnings"] = warnings
    return info


def _undelimited(reader: TokenReader) -> list[str]:
    """A stream of several files that takes ``eos=``/``bos=`` but was opened without either reads one document per
    file (a ``.pt`` folder written before its manifest recorded the delimiter): say so, with the option to pass."""
    if not (hasattr(reader, "eos") and hasattr(reader, "bos")) or reader.eos is not None or reader.bos is not None:
        return []
    files = len(reader.files)
    if files < 2 or len(reader) != files or reader.num_tokens == 0:
        return []
    last = int(reader.tokens[reader.num_tokens - 1])
    return [
        f"no document delimiter is recorded, so each of the {files} files reads as one document; if documents end "
        f"with an id (the stream ends with {last}), pass {option('eos', str(last))}."
    ]


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value
