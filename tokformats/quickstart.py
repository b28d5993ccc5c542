"""``tokformats quickstart``: the whole job on built-in sample data, offline, in seconds.

It generates a deterministic multi-script text corpus (Latin, CJK, emoji), trains a byte-level BPE on
it, exports llm.c's vocabulary, tokenizes the corpus (``tokformats.tokenize``) into every corpus format, opens
each result again (by detection where the format allows), decodes every document and checks it is the
original text, and returns one row per format for the summary table.
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
from .formats.llmc_vocab import Vocab
from .inspect import describe
from .protocol import TokenReader
from .samples import sample_texts
from .tokenizer import train_tokenizer

__all__ = ["run", "format_table", "FormatTrip"]

#: The end-of-text id of the trained tokenizer (its first special token).
EOT = 0


@dataclass
class FormatTrip:
    """How one corpus format is tokenized into and read back in the quickstart."""

    format: str
    #: ``tokenize``'s eos mode: the owners' convention (llm.c puts the delimiter first).
    eos: str = "append"
    write: dict[str, Any] = field(default_factory=dict)
    read: dict[str, Any] = field(default_factory=dict)
    #: What to open, given the path ``tokenize`` reports for the output.
    source: Callable[[str], Any] = lambda path: path

    def strip(self, document: np.ndarray) -> np.ndarray:
        """The document's text ids, without the delimiter ``tokenize`` added."""
        return document[1:] if self.eos == "prepend" else document[:-1]


def _trips() -> list[FormatTrip]:
    return [
        FormatTrip("raw", read={"format": "raw", "dtype": "uint16", "eos": EOT}),
        FormatTrip("llmc", "prepend", read={"bos": EOT}, source=lambda path: f"{path}_[0-9]*.bin"),
        FormatTrip("megatron"),
        FormatTrip("pt", write={"tokens_per_shard": 50_000}, read={"eos": EOT}),
        FormatTrip("timemoe"),
    ]


def run(output: Path | None = None, *, documents: int = 2000, vocab_size: int = 1000) -> list[dict[str, Any]]:
    """Train, export, tokenize into every corpus format, read back and verify; one row per format.

    Raises:
        AssertionError: a document did not come back as its text (a bug: please report it).
    """
    from .pipeline import tokenize

    texts = sample_texts(documents)
    with tempfile.TemporaryDirectory(prefix="tokformats-quickstart-") as scratch:
        root = Path(output) if output is not None else Path(scratch)
        rows = []
        started = time.perf_counter()
        tokenizer = train_tokenizer(texts, vocab_size, progress=False)
        size = tokenizer.get_vocab_size(with_added_tokens=True)
        vocab_path = Vocab.from_tokenizer(tokenizer).save(root / "llmc-vocab" / "tokenizer.bin", overwrite=True)
        (root / "tokenizer.json").write_text(tokenizer.to_str(), encoding="utf-8")
        with api.open(vocab_path) as vocab:
            assert isinstance(vocab, Vocab) and len(vocab) == size
            rows.append(_row("llmc-vocab", [vocab_path], "", size, "bytes", time.perf_counter() - started))
        for trip in _trips():
            started = time.perf_counter()
            summary = tokenize(
                texts,
                tokenizer,
                root / trip.format / "sample",
                trip.format,
                eos=trip.eos,
                progress=False,
                overwrite=True,
                **trip.write,
            )
            (written,) = summary["outputs"].values()
            with api.open(trip.source(written["path"]), **trip.read) as reader:
                assert isinstance(reader, TokenReader)
                if len(reader) != documents:
                    raise AssertionError(f"{trip.format}: wrote {documents} documents, read {len(reader)}")
                for k, text in enumerate(texts):
                    if vocab.decode(trip.strip(reader[k])) != text:
                        raise AssertionError(f"{trip.format}: document {k} did not come back as its text")
                info = describe(reader, scan=False)
            files = [Path(f) for f in written["files"]]
            rows.append(
                _row(
                    trip.format,
                    files,
                    f"{info['documents']:,}",
                    info["tokens"],
                    info["dtype"],
                    time.perf_counter() - started,
                )
            )
        return rows


def _row(name: str, files: list[Path], documents: str, tokens: int, dtype: str, seconds: float) -> dict[str, Any]:
    return {
        "format": name,
        "files": len(files),
        "documents": documents,
        "tokens": tokens,
        "dtype": dtype,
        "bytes": sum(f.stat().st_size for f in files),
        "ms": round(seconds * 1000, 1),
        "check": "ok",
    }


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
