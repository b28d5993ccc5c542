"""Shared fixtures: where the golden files live, and a deterministic random corpus."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

#: Golden files written by the owners' tools (read-only, never regenerated): ``shared/`` beside the repository.
FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures"


@pytest.fixture(scope="session")
def fixtures() -> Path:
    """The ``shared/fixtures`` folder; tests that need it skip with a reason when it is missing."""
    if not FIXTURES.is_dir():
        pytest.skip(f"golden files not found at {FIXTURES} (shared/ must sit beside the repository)")
    return FIXTURES


def random_corpus(
    rng: np.random.Generator, documents: int, *, low: int, high: int, mean_length: int = 40
) -> tuple[np.ndarray, np.ndarray]:
    """``documents`` documents of ids in ``[low, high]`` with geometric lengths, some empty."""
    lengths = rng.geometric(1 / mean_length, size=documents).astype(np.int64) - 1
    if documents:
        lengths[rng.integers(0, documents, size=max(1, documents // 10))] = 0
    flat = rng.integers(low, high, size=int(lengths.sum()), endpoint=True, dtype=np.int64)
    return flat, lengths


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--reliability-long",
        action="store_true",
        default=False,
        help="run the reliability suite at full size (10,000 corrupted inputs per reader, 100+ kills per writer)",
    )


@pytest.fixture(scope="session")
def reliability_long(request: pytest.FixtureRequest) -> bool:
    """Whether the reliability suite runs at full size (``--reliability-long``) or CI size."""
    return bool(request.config.getoption("--reliability-long"))
