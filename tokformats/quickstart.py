"""``tokformats quickstart``: a self-check on built-in sample data, offline, in seconds.

It generates a deterministic corpus, writes it to every format tokformats can write, opens each
result by detection (or with the options a headerless format needs), checks every document comes
back exactly, and returns one row per format for the summary table.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import api
from .inspect import describe
from .protocol import TokenReader, TokenWriter

__all__ = ["sample_corpus", "run", "format_table", "FormatTrip"]

#: The delimiter id the sample corpus reserves (never used inside a document).
DELIMITER = 0


def sample_corpus(documents: int = 2000, vocab_size: int = 50257, seed: int = 1234) -> tuple[np.ndarray, np.ndarray]:
    """A deterministic corpus: Zipf-distributed ids in ``1 .. vocab_size - 1`` and varied lengths.

    It includes empty documents and the largest id, so that edge cases are exercised.
    Returns ``(flat_ids, lengths)``.
    """
    rng = np.random.default_rng(seed)
    lengths = rng.geometric(1 / 300, size=documents).astype(np.int64)
    lengths[::97] = 0
    ids = rng.zipf(1.2, size=int(lengths.sum())) % (vocab_size - 1) + 1
    ids[::1009] = vocab_size - 1
    return ids.astype(np.int64), lengths


@dataclass
class FormatTrip:
    """How one format is written and read back in the quickstart round trip."""

    format: str
    suffix: str = ""
    write: dict[str, Any] = field(default_factory=dict)
    read: dict[str, Any] = field(default_factory=dict)
    #: Maps an input document to what the reader returns for it (a delimiter may be added).
    expect: Callable[[np.ndarray], np.ndarray] = lambda doc: doc


def _trips(vocab_size: int) -> list[FormatTrip]:
    delimiter = np.array([DELIMITER])
    return [
        FormatTrip(
            "raw",
            ".bin",
            {"eos": DELIMITER},
            {"format": "raw", "dtype": "uint16", "eos": DELIMITER},
            lambda doc: np.concatenate([doc, delimiter]),
        ),
        FormatTrip(
            "llmc",
            "",
            {"bos": DELIMITER},
            {"bos": DELIMITER},
            lambda doc: np.concatenate([delimiter, doc]),
        ),
        FormatTrip("megatron"),
    ]


def run(output: Path | None = None, *, documents: int = 2000) -> list[dict[str, Any]]:
    """Write the sample corpus to every writable format, read it back, verify; one row per format.

    Raises:
        AssertionError: a document did not come back exactly (a bug: please report it).
    """
    vocab_size = 50257
    flat, lengths = sample_corpus(documents, vocab_size)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    with tempfile.TemporaryDirectory(prefix="tokformats-quickstart-") as scratch:
        root = Path(output) if output is not None else Path(scratch)
        rows = []
        for trip in _trips(vocab_size):
            target = root / trip.format / f"sample{trip.suffix}"
            started = time.perf_counter()
            with api.create(target, trip.format, vocab_size=vocab_size, overwrite=True, **trip.write) as writer:
                assert isinstance(writer, TokenWriter)
                writer.write_batch(flat, lengths)
            written = time.perf_counter() - started
            opened = writer.written[0] if trip.format != "raw" else target
            read_options = dict(trip.read)
            with api.open(opened, **read_options) as reader:
                assert isinstance(reader, TokenReader)
                if len(reader) != documents:
                    raise AssertionError(f"{trip.format}: wrote {documents} documents, read {len(reader)}")
                for k in range(documents):
                    expected = trip.expect(flat[offsets[k] : offsets[k + 1]])
                    if not np.array_equal(reader[k], expected):
                        raise AssertionError(f"{trip.format}: document {k} did not round-trip")
                info = describe(reader, scan=False)
            rows.append(
                {
                    "format": trip.format,
                    "files": len(writer.written),
                    "documents": info["documents"],
                    "tokens": info["tokens"],
                    "dtype": info["dtype"],
                    "bytes": info["bytes_on_disk"],
                    "write_ms": round(written * 1000, 1),
                    "check": "ok",
                }
            )
        return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    """Rows of dicts as an aligned plain-text table."""
    if not rows:
        return ""
    headers = list(rows[0])
    cells = [[f"{r[h]:,}" if isinstance(r[h], int) else str(r[h]) for h in headers] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
    body = ["  ".join(c.rjust(w) if c[:1].isdigit() else c.ljust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join([line, "  ".join("-" * w for w in widths), *body])
