"""``Reader.verify``/``Reader.problems`` and ``Reader.stats``: what ``tokformats verify`` and ``stats`` report.

Opening a dataset checks what is O(1) or O(index); these functions read every token once (vectorised, chunk by
chunk, memory bounded) and report every problem they find rather than stopping at the first.
"""

from __future__ import annotations

from collections.abc import Callable
from html import escape
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ..errors import FormatError
from .arrays import ConcatenatedArray, iter_chunks
from .progress import progress_bar

if TYPE_CHECKING:
    from .protocol import TokenReader

__all__ = ["Problem", "VerificationError", "StatsReport", "problems", "stats", "plot_lengths"]

#: Problems listed per check before the rest are only counted.
_LIMIT = 20


class Problem(NamedTuple):
    """One thing wrong with a dataset: where (file, document) and what (field, message)."""

    file: str
    field: str
    message: str
    document: int | None = None

    def __str__(self) -> str:
        where = f" document {self.document:,}" if self.document is not None else ""
        return f"{self.file}:{where} {self.field}: {self.message}"


class VerificationError(FormatError):
    """``verify()`` found problems; :attr:`problems` lists them all."""

    def __init__(self, found: list[Problem]) -> None:
        self.problems = found
        more = f" (and {len(found) - 1:,} more)" if len(found) > 1 else ""
        super().__init__(f"{found[0]}{more}")


def _document_of(reader: TokenReader, position: int) -> int:
    return int(np.searchsorted(reader.offsets, position, side="right")) - 1


def _token_at(reader: TokenReader, position: int) -> tuple[int, str]:
    """The document holding stream position ``position`` and the token named as writers name it, by its place in
    that document, with the stream position beside it: ``its token 2 (token 20 of the stream)``."""
    document = _document_of(reader, position)
    within = position - int(reader.offsets[document])
    return document, f"its token {within:,} (token {position:,} of the stream)"


def problems(reader: TokenReader, vocab_size: int | None = None, *, progress: bool = False) -> list[Problem]:
    """Every problem found in ``reader``: the format's own checks, then ids, values and delimiters."""
    found: list[Problem] = list(reader._problems())
    path = str(reader.path)
    try:
        offsets = reader.offsets
    except FormatError as error:  # an index too broken to walk: the format's own checks said why
        return found or [Problem(path, "offsets", str(error))]
    if len(offsets) and (offsets[0] != 0 or offsets[-1] != reader.num_tokens or (np.diff(offsets) < 0).any()):
        found.append(Problem(path, "offsets", "document boundaries do not tile the token stream"))
        return found
    bar = progress_bar(reader.num_tokens, f"verify {reader.path.name}", enabled=progress)
    found += _value_problems(reader, vocab_size, bar)
    if bar is not None:
        bar.close()
    found += _delimiter_problems(reader)
    found += _mask_problems(reader)
    return found


def _mask_problems(reader: TokenReader) -> list[Problem]:
    """The stored loss masks against the tokens: one value per token, each 0 or 1."""
    path = str(reader.path)
    try:
        masks = reader.loss_masks
    except FormatError as error:  # a mask file of the wrong size, missing beside some parts, ...
        return [Problem(path, "loss_masks", str(error))]
    if masks is None:
        return []
    if len(masks) != reader.num_tokens:
        return [Problem(path, "loss_masks", f"{len(masks):,} mask values for {reader.num_tokens:,} tokens")]
    position = 0
    for chunk in iter_chunks(masks):
        values = np.asarray(chunk)
        bad = np.flatnonzero(values > 1)
        if len(bad):
            document, token = _token_at(reader, position + int(bad[0]))
            message = f"{token} has mask value {int(values[bad[0]])}; a loss mask holds 0 or 1"
            return [Problem(path, "loss_masks", message, document)]
        position += len(values)
    return []


def _value_problems(reader: TokenReader, vocab_size: int | None, bar: Any = None) -> list[Problem]:
    path, dtype = str(reader.path), reader.dtype
    found: list[Problem] = []
    position = 0
    for chunk in iter_chunks(reader.tokens):
        values = np.asarray(chunk)
        if bar is not None:
            bar.update(len(values))
        if dtype.kind == "f":
            bad = np.flatnonzero(~np.isfinite(values))
            what = "is not finite"
        else:
            bad = np.flatnonzero(values < 0) if dtype.kind == "i" else np.zeros(0, dtype=np.int64)
            what = "is negative"
            if vocab_size is not None:
                bad = np.flatnonzero((values < 0) | (values >= vocab_size))
                what = f"is not below vocab_size {vocab_size:,}"
        for k in bad[: _LIMIT - len(found)].tolist():
            document, token = _token_at(reader, position + k)
            value = values[k].item()  # 351, not np.uint16(351)
            field = "ids" if dtype.kind != "f" else "values"
            found.append(Problem(path, field, f"{token} holds {value}, which {what}", document))
        if len(bad) and len(found) >= _LIMIT:
            found.append(Problem(path, "ids", "more values are out of range; only the first are listed"))
            break
        position += len(values)
    return found


def _delimiter_problems(reader: TokenReader) -> list[Problem]:
    """A stream split at a delimiter should end (``eos``) or start (``bos``) with it: else its last (first)
    document is a fragment, the sign of a truncated file or a shard opened without its predecessor."""
    path, count = str(reader.path), len(reader)
    if not count or reader.num_tokens == 0:
        return []
    eos, bos = getattr(reader, "eos", None), getattr(reader, "bos", None)
    if eos is not None and reader[count - 1][-1] != eos:
        return [Problem(path, "eos", f"the stream does not end with {eos}: the last document is cut", count - 1)]
    if bos is not None and reader[0][0] != bos:
        return [Problem(path, "bos", f"the stream does not start with {bos}: the first document is a fragment", 0)]
    return []


_PERCENTILES = (0, 1, 5, 25, 50, 75, 95, 99, 100)


class StatsReport(dict[str, Any]):
    """What :func:`stats` returns: the JSON-serialisable dict, shown as a short text summary (``repr``) and as
    tables in a notebook (``_repr_html_``) instead of a 60-line dict."""

    def __repr__(self) -> str:
        return "\n".join(self._lines())

    def _lines(self) -> list[str]:
        lines = [f"{self['format']} {self['path']}: {self['documents']:,} documents, {self['tokens']:,} tokens, "
                 f"{self['dtype']}"]  # fmt: skip
        if "length" in self:
            lines.append("document length: " + ", ".join(f"{k} {v:,}" for k, v in self["length"].items()))
            top = max(row["documents"] for row in self["histogram"])
            for row in self["histogram"]:
                bar = "#" * max(1, round(30 * row["documents"] / top))
                lines.append(f"  {row['from']:>10,} - {row['to']:<10,} {row['documents']:>10,}  {bar}")
        if self.get("top_ids"):
            lines.append("most frequent ids: " + ", ".join(_id_text(row) for row in self["top_ids"][:10]))
        return lines

    def _repr_html_(self) -> str:
        rows = [f"<b>{escape(self['format'])}</b> {escape(self['path'])}: {self['documents']:,} documents, "
                f"{self['tokens']:,} tokens, {escape(self['dtype'])}"]  # fmt: skip
        if "length" in self:
            cells = "".join(f"<th>{escape(k)}</th>" for k in self["length"])
            values = "".join(f"<td>{v:,}</td>" for v in self["length"].values())
            rows.append(f"<table><tr><th>length</th>{cells}</tr><tr><td></td>{values}</tr></table>")
            top = max(row["documents"] for row in self["histogram"])
            bars = "".join(
                f"<tr><td>{row['from']:,} - {row['to']:,}</td><td>{row['documents']:,}</td><td><div style='background:"
                f"#4c78a8;height:10px;width:{max(1, round(200 * row['documents'] / top))}px'></div></td></tr>"
                for row in self["histogram"]
            )
            rows.append(f"<table><tr><th>tokens per document</th><th>documents</th><th></th></tr>{bars}</table>")
        if self.get("top_ids"):
            cells = "".join(
                f"<tr><td>{row['id']}</td><td>{row['count']:,}</td><td>{escape(repr(row.get('text', '')))}</td></tr>"
                for row in self["top_ids"]
            )
            rows.append(f"<table><tr><th>id</th><th>count</th><th>text</th></tr>{cells}</table>")
        return "<div>" + "".join(f"<p>{r}</p>" if not r.startswith("<table") else r for r in rows) + "</div>"


def _id_text(row: dict[str, Any]) -> str:
    return f"{row['id']} {row['text']!r} ({row['count']:,})" if "text" in row else f"{row['id']} ({row['count']:,})"


def stats(reader: TokenReader, *, top: int = 20, decode: Callable[[list[int]], str] | None = None) -> StatsReport:
    """Documents, tokens, length percentiles and a log2 length histogram, the most frequent ids (with their text
    when ``decode`` is given, e.g. a ``tokenizers.Tokenizer``'s ``decode``), and one row per file;
    JSON-serialisable."""
    lengths = np.asarray(reader.lengths)
    result = StatsReport(
        format=reader.format,
        path=str(reader.path),
        documents=len(reader),
        tokens=reader.num_tokens,
        dtype=reader.dtype.name,
    )
    if len(lengths):
        values = np.percentile(lengths, _PERCENTILES, method="lower")
        result["length"] = {
            "mean": round(float(lengths.mean()), 2),
            **{f"p{p}": int(v) for p, v in zip(_PERCENTILES, values)},
        }
        edges = [0, *(1 << k for k in range(int(max(lengths.max(), 1)).bit_length() + 1))]
        counts, _ = np.histogram(lengths, bins=edges)
        result["histogram"] = [
            {"from": int(lo), "to": int(hi) - 1, "documents": int(c)}
            for lo, hi, c in zip(edges[:-1], edges[1:], counts)
            if c
        ]
    masks = reader.loss_masks
    if masks is not None:  # SFT data: how much of it the loss sees
        trained = sum(int(np.count_nonzero(np.asarray(chunk))) for chunk in iter_chunks(masks))
        result["trained_tokens"] = trained
        result["trained_fraction"] = round(trained / reader.num_tokens, 4) if reader.num_tokens else 0.0
    if reader.dtype.kind in "iu" and reader.num_tokens:
        result["top_ids"] = _top_ids(reader, top)
        if decode is not None:
            for row in result["top_ids"]:
                row["text"] = decode([row["id"]])
    result["files"] = _file_rows(reader)
    return result


def plot_lengths(reader: TokenReader, ax: Any = None, path: Any = None) -> Any:
    """The document-length histogram (log2 bins, as :func:`stats`) on a matplotlib ``ax`` (a new figure when
    None), saved to ``path`` when given; returns the axes."""
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("plotting needs matplotlib: pip install 'tokformats[plot]'") from None
    result = stats(reader, top=0)
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 4))
    rows = result.get("histogram", [])
    ax.bar([f"{r['from']:,}" for r in rows], [r["documents"] for r in rows])
    ax.set_xlabel("tokens per document (from)")
    ax.set_ylabel("documents")
    ax.set_title(f"{result['path']}: {result['documents']:,} documents")
    ax.tick_params(axis="x", rotation=45)
    if path is not None:
        ax.figure.tight_layout()
        ax.figure.savefig(path)
    return ax


def _top_ids(reader: TokenReader, top: int) -> list[dict[str, int]]:
    counts: np.ndarray | None = None
    for chunk in iter_chunks(reader.tokens):
        values = np.asarray(chunk).astype(np.int64, copy=False)
        if len(values) == 0:
            continue
        if values.min() < 0 or values.max() >= 1 << 20:  # beyond any vocabulary: count what is there, not 0..max
            ids, found = np.unique(values, return_counts=True)
            partial = dict(zip(ids.tolist(), found.tolist()))
            ranked = sorted(partial.items(), key=lambda item: -item[1])[:top]
            return [{"id": int(i), "count": int(c)} for i, c in ranked]
        chunk_counts = np.bincount(values)
        if counts is None:
            counts = chunk_counts
        else:
            if len(chunk_counts) > len(counts):
                counts, chunk_counts = chunk_counts, counts
            counts[: len(chunk_counts)] += chunk_counts
    if counts is None:
        return []
    order = np.argsort(-counts, kind="stable")[:top]
    return [{"id": int(i), "count": int(counts[i])} for i in order if counts[i]]


def _file_rows(reader: TokenReader) -> list[dict[str, Any]]:
    """One row per file; with tokens and documents starting in it where the stream is those files end to end."""
    tokens = reader.tokens
    starts = tokens.starts if isinstance(tokens, ConcatenatedArray) else None
    rows = []
    files = reader.files
    for k, file in enumerate(files):
        try:
            size = file.stat().st_size
        except OSError:
            size = None
        row: dict[str, Any] = {"file": str(file), "bytes": size}
        if starts is not None and len(starts) == len(files) + 1:
            row["tokens"] = int(starts[k + 1] - starts[k])
            first, stop = np.searchsorted(reader.offsets[:-1], starts[k : k + 2], side="left")
            row["documents_starting"] = int(stop - first)
        rows.append(row)
    return rows
