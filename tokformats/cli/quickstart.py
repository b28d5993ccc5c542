"""``tokformats quickstart``: the whole job on built-in sample data, offline, in seconds.

It generates a deterministic multi-script text corpus (Latin, CJK, emoji), trains a byte-level BPE on it, exports
its vocabulary to every vocabulary format (llm.c's), tokenizes the corpus (``tokformats.tokenize``) into every
corpus format, opens each result again (by detection where the format allows), decodes every document and checks it
is the original text, and returns one row per format for the summary table.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import api
from ..core.protocol import TokenReader, TokenWriter
from ..core.registry import formats
from ..errors import NoFilesError, UnknownFormatError
from ..tokenization.sample_text import sample_texts
from ..tokenization.tokenizer import text_decoder, train_tokenizer
from .describe import describe

__all__ = ["run", "format_table", "FormatTrip"]

#: The end-of-text id of the trained tokenizer (its first special token).
EOT = 0


@dataclass
class FormatTrip:
    """How one corpus format is tokenized into and read back, derived from its writer's conventions."""

    format: str
    writer: type[TokenWriter]
    detectable: bool

    def read_options(self, dtype: str) -> dict[str, Any]:
        """What opening the output needs: the delimiter the format splits at, and, for formats that cannot be
        detected, the format name and dtype."""
        options: dict[str, Any] = {} if self.detectable else {"format": self.format, "dtype": dtype}
        if self.writer.boundaries == "eos":
            options["eos"] = EOT
        return options

    def strip(self, document: np.ndarray) -> np.ndarray:
        """The document's text ids, without the delimiter ``tokenize`` added (before it for "bos" formats)."""
        return document[1:] if self.writer.boundaries == "bos" else document[:-1]


def _trips() -> list[FormatTrip]:
    """Every writable corpus format in the registry (plugins included)."""
    return [FormatTrip(name, writer, formats[name].detectable) for name, writer in api.corpus_writers().items()]


def _open_output(output: dict[str, Any], options: dict[str, Any]) -> Any:
    """Open what tokenize wrote: by its path (a file, prefix or folder), else by its files (llm.c's shards)."""
    try:
        return api.open(output["path"], **options)
    except (NoFilesError, UnknownFormatError):
        return api.open(output["files"], **options)


def run(output: Path | None = None, *, documents: int = 2000, vocab_size: int = 1000) -> list[dict[str, Any]]:
    """Train, export, tokenize into every corpus format, read back and verify; one row per format.

    Raises:
        AssertionError: a document did not come back as its text (a bug: please report it).
    """
    from ..tokenization.pipeline import tokenize

    texts = sample_texts(documents)
    with tempfile.TemporaryDirectory(prefix="tokformats-quickstart-") as scratch:
        root = Path(output) if output is not None else Path(scratch)
        root.mkdir(parents=True, exist_ok=True)  # -o DIR, as its --help example, need not exist yet
        rows = []
        started = time.perf_counter()
        tokenizer = train_tokenizer(texts, vocab_size, progress=False)
        size = tokenizer.get_vocab_size(with_added_tokens=True)
        (root / "tokenizer.json").write_text(tokenizer.to_str(), encoding="utf-8")
        decode = text_decoder(tokenizer=tokenizer)
        for name in api.vocabulary_formats():  # documents are decoded with the exported vocabulary when it can
            suffix = formats[name].suffixes[0] if formats[name].suffixes else ""
            path = api.export_tokenizer(tokenizer, root / name / f"vocabulary{suffix}", name, overwrite=True)
            vocabulary = api.open(path)
            if len(vocabulary) != size:
                raise AssertionError(f"{name}: exported {size} tokens, read {len(vocabulary)}")
            if hasattr(vocabulary, "decode"):
                decode = vocabulary.decode
            rows.append(_row(name, [path], None, size, "bytes", time.perf_counter() - started))
            started = time.perf_counter()
        for trip in _trips():
            started = time.perf_counter()
            output = root / trip.format / "sample"
            try:
                summary = tokenize(texts, tokenizer, output, trip.format, progress=False, overwrite=True)
            except ImportError as missing:  # a format whose optional dependency is not installed (hf: pyarrow)
                rows.append({**_row(trip.format, [], None, 0, "", 0.0), "check": f"skipped: {missing}"})
                continue
            (written,) = summary["outputs"].values()
            dtype = "uint16" if size <= 1 << 16 else "uint32"
            with _open_output(written, trip.read_options(dtype)) as reader:
                if not isinstance(reader, TokenReader):
                    raise AssertionError(f"{trip.format}: {written} did not open as a token corpus")
                if len(reader) != documents:
                    raise AssertionError(f"{trip.format}: wrote {documents} documents, read {len(reader)}")
                for k, text in enumerate(texts):
                    if decode(trip.strip(reader[k])) != text:
                        raise AssertionError(f"{trip.format}: document {k} did not come back as its text")
                info = describe(reader, scan=False)
            files = [Path(f) for f in written["files"]]
            rows.append(
                _row(
                    trip.format,
                    files,
                    info["documents"],
                    info["tokens"],
                    info["dtype"],
                    time.perf_counter() - started,
                )
            )
        return rows


def _row(
    name: str, files: list[Path], documents: int | None, tokens: int, dtype: str, seconds: float
) -> dict[str, Any]:
    """One format's row: its files, what they hold (``documents`` None: a vocabulary's file holds none) and the
    round trip's time."""
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


def _cell(value: Any) -> str:
    """A table cell: whole numbers with thousands separators, None blank."""
    if value is None:
        return ""
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)


def format_table(rows: list[dict[str, Any]]) -> str:
    """Rows of dicts as an aligned plain-text table."""
    if not rows:
        return ""
    headers = list(rows[0])
    cells = [[_cell(r[h]) for h in headers] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
    body = ["  ".join(c.rjust(w) if c[:1].isdigit() else c.ljust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join([line, "  ".join("-" * w for w in widths), *body])
