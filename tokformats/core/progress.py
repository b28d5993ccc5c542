"""Progress bars for long operations (``convert``, ``verify``): tqdm's when it is installed, shown only once an
operation has run for a second, so that quick ones print nothing."""

from __future__ import annotations

from typing import Any

__all__ = ["progress_bar"]

#: Seconds an operation runs before its bar appears.
DELAY = 1.0


def progress_bar(total: int, description: str, *, enabled: bool, unit: str = "tok") -> Any:
    """A tqdm bar of ``total`` ``unit`` (``update(n)``, ``close()``), or None when disabled or tqdm is missing
    (progress is optional: nothing else changes)."""
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=description, unit=unit, unit_scale=True, delay=DELAY, mininterval=0.5)
