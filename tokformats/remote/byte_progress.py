"""A byte count over the files of one transfer (``fetch``, ``publish``), shown as a progress bar: each file's
position as it arrives (a resumed download starts where its partial file ends, a restarted one goes back to 0),
and a total that grows when a file whose size no record gave is answered by the store."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from ..core.progress import progress_bar

__all__ = ["ByteProgress"]

#: Bytes a file moves forward before the bar hears of it (a download reports every block, often a few KiB: each
#: report to the bar takes a lock and a clock read, which a 10 GB fetch should not pay per block).
STEP = 1 << 18


class ByteProgress:
    """Bytes of several files, counted into a bar (``update(n)``, ``total``, ``refresh()``, ``close()``: tqdm's, or
    any object with those), from several threads.

    Args:
        bar: the bar, or None (then nothing is counted: every method is a no-op).
        sizes: every file's size in bytes, None where no record gives it (added when :meth:`size` learns it).
    """

    def __init__(self, bar: Any, sizes: Mapping[str, int | None]) -> None:
        self.bar = bar
        self._sizes = dict(sizes)
        self._positions: dict[str, int] = {}
        self._lock = threading.Lock()
        if bar is not None:
            bar.total = sum(s for s in self._sizes.values() if s is not None)
            bar.refresh()

    @classmethod
    def shown(cls, sizes: Mapping[str, int | None], description: str, *, enabled: bool) -> ByteProgress:
        """A count into a new byte bar (:func:`~tokformats.core.progress.progress_bar`; none when not ``enabled``
        or tqdm is missing)."""
        known = sum(s for s in sizes.values() if s is not None)
        return cls(progress_bar(known, description, enabled=enabled, unit="B"), sizes)

    def size(self, name: str, size: int) -> None:
        """File ``name`` is ``size`` bytes (the store's answer): added to the total when no record gave it."""
        if self.bar is None:
            return
        with self._lock:
            if self._sizes.get(name) is not None:
                return
            self._sizes[name] = size
            self.bar.total = (self.bar.total or 0) + size
            self.bar.refresh()

    def at(self, name: str, position: int, *, now: bool = False) -> None:
        """File ``name`` holds ``position`` bytes now: the bar moves by the difference once it is :data:`STEP` bytes
        or more (or backwards, after a restart), or at once with ``now``."""
        if self.bar is None:
            return
        if not now and 0 <= position - self._positions.get(name, 0) < STEP:
            return
        with self._lock:
            delta = position - self._positions.get(name, 0)
            self._positions[name] = position
            if delta:
                self.bar.update(delta)

    def done(self, name: str, size: int) -> None:
        """File ``name`` is complete at ``size`` bytes (downloaded, uploaded, or found in the cache)."""
        self.size(name, size)
        self.at(name, size, now=True)

    def close(self) -> None:
        """Close the bar."""
        if self.bar is not None:
            self.bar.close()
