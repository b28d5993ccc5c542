"""What a tokenize run reports as it goes: its counters (:class:`Stats`) and its progress on stderr."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Progress", "Stats"]


@dataclass
class Stats:
    """Counters of one partition (or of the whole run)."""

    records: int = 0
    documents: int = 0
    #: Characters of text encoded (the uncompressed input, whatever its compression).
    text: int = 0
    tokens: int = 0
    skipped: int = 0
    errors: list[str] = field(default_factory=list)

    @classmethod
    def total(cls, parts: list[Stats]) -> Stats:
        """The counters of the whole run from its partitions' (the first 100 errors)."""
        return cls(
            records=sum(s.records for s in parts),
            documents=sum(s.documents for s in parts),
            text=sum(s.text for s in parts),
            tokens=sum(s.tokens for s in parts),
            skipped=sum(s.skipped for s in parts),
            errors=[e for s in parts for e in s.errors][:100],
        )


class Progress:
    """Progress of a run on stderr: a tqdm bar when tqdm is installed (a widget in a notebook), else one line,
    refreshed at most twice a second: documents, tokens, the rate in characters of text encoded (uncompressed), and
    the share of the input bytes (compressed, as on disk) whose documents are encoded, with an ETA."""

    def __init__(self, enabled: bool, total_bytes: int | None, counters: list[Any], *, style: str = "auto") -> None:
        self.enabled, self.total, self.counters = enabled, total_bytes, counters
        self.started = self.last = time.perf_counter()
        self.done_before = 0
        #: Input bytes whose documents are encoded (set by the encoding loop; None: count what was read).
        self.encoded: int | None = None
        self._bar: Any = None
        if enabled and style != "line":
            try:
                from tqdm.auto import tqdm
            except ImportError:  # the plain line below
                pass
            else:
                self._bar = tqdm(total=total_bytes, unit="B", unit_scale=True, desc="tokenize", mininterval=0.5)

    def update(self, stats: Stats, *, final: bool = False) -> None:
        """Show ``stats`` (at most twice a second, unless ``final``: the last line, which ends the bar)."""
        now = time.perf_counter()
        if not self.enabled or (not final and now - self.last < 0.5):
            return
        self.last = now
        read = self.done_before + (self.encoded if self.encoded is not None else sum(c.count for c in self.counters))
        elapsed = max(now - self.started, 1e-9)
        facts = f"{stats.documents:,} documents, {stats.tokens:,} tokens, {stats.text / elapsed / 1e6:.1f} M chars/s"
        if stats.skipped:
            facts += f", {stats.skipped:,} bad records skipped"
        if self._bar is not None:
            self._bar.n = min(read, self.total) if self.total else read
            self._bar.set_postfix_str(facts, refresh=False)
            self._bar.refresh()
            if final:
                self._bar.close()
            return
        line = f"tokenize: {facts}"
        if self.total:
            share = min(read / self.total, 1.0)
            rate = read / elapsed
            eta = (self.total - read) / rate if rate > 0 and not final else 0
            line += f", {share:.0%}, ETA {int(eta) // 60}:{int(eta) % 60:02d}"
        sys.stderr.write("\r" + line + ("\n" if final else ""))
        sys.stderr.flush()
