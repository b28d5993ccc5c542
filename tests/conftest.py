"""Shared fixtures: where the golden files live, a deterministic random corpus, and the remote tests' local server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .http_server import FileServer

#: Golden files written by the owners' tools (read-only, never regenerated): ``shared/`` beside the repository.
_REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "fixtures"
#: The project's own golden files, written by the owners' tools through ``tests/make_goldens.py``; ``data/shared``
#: holds a copy of the reference so that a clone alone runs every golden test.
_GOLDENS = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="session")
def reference_fixtures() -> Path | None:
    """``shared/fixtures`` beside the repository (the owners' golden files, the reference), or None without it."""
    return _REFERENCE if _REFERENCE.is_dir() else None


@pytest.fixture(scope="session")
def fixtures(reference_fixtures: Path | None) -> Path:
    """The shared golden files: the reference when it is there, else the copy committed in ``tests/data/shared``."""
    return reference_fixtures or _GOLDENS / "shared"


@pytest.fixture(scope="session")
def goldens() -> Path:
    """``tests/data``: golden files of the formats ``shared/fixtures`` does not cover."""
    return _GOLDENS




@pytest.fixture(autouse=True, scope="session")
def _no_gate_cache_on_disk() -> Iterator[None]:
    """The engine gate's results are kept in the process only (the tests of the cache on disk turn it on in a
    folder of their own): the user's cache is never written, and a test never sees another test's entry."""
    import os

    before = os.environ.get("TOKFORMATS_GATE_CACHE")
    os.environ["TOKFORMATS_GATE_CACHE"] = "off"
    yield
    if before is None:
        os.environ.pop("TOKFORMATS_GATE_CACHE", None)
    else:
        os.environ["TOKFORMATS_GATE_CACHE"] = before


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--reliability-long",
        action="store_true",
        default=False,
        help="run the reliability suite at full size (10,000 corrupted inputs per reader, 100+ kills per writer)",
    )


@pytest.fixture(scope="session")
def reliability_long(request: pytest.FixtureRequest) -> bool:
    """Whether the reliability suite runs at full size (``--reliability-long`` or ``TOKFORMATS_RELIABILITY_LONG=1``)
    or CI size."""
    import os

    return bool(request.config.getoption("--reliability-long")) or os.environ.get("TOKFORMATS_RELIABILITY_LONG") == "1"


@pytest.fixture(scope="session")
def tokenizer_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small byte-level BPE (``<|endoftext|>`` among its specials) trained on the package's built-in sample text,
    so that tests needing a tokenizer run on a fresh clone without ``shared/``."""
    from tokformats.tokenization.sample_text import sample_texts
    from tokformats.tokenization.tokenizer import train_tokenizer

    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    train_tokenizer(sample_texts(300), 500, progress=False).save(str(path))
    return path


@pytest.fixture
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Remote retries back off a few milliseconds (the same bounded count); the remote test modules use it for every
    test (``pytestmark``)."""
    import tokformats.remote.backends

    monkeypatch.setattr(tokformats.remote.backends, "BACKOFF", 0.005)
    monkeypatch.setattr(tokformats.remote.backends, "MAX_BACKOFF", 0.02)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[FileServer]:
    """A local HTTP file server (127.0.0.1 only) over ``tmp_path / "served"``, stopped after the test."""
    root = tmp_path / "served"
    root.mkdir()
    running = FileServer(root)
    yield running
    running.stop()
