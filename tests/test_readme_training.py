"""The README's training loop runs as written (in a scratch folder, in a fresh process)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def training_example() -> str:
    section = README.read_text(encoding="utf-8").split("## Training", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "the README's Training section has no Python example"
    return match.group(1)


def test_readme_training_loop_runs(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="the loop trains a torch model")
    (tmp_path / "example.py").write_text(training_example(), encoding="utf-8")
    done = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"resumed after 12 micro-batches, \d+ to go", done.stdout), done.stdout
    assert list((tmp_path / "data" / "index-cache").glob("*-shuffle_index.npy"))


def masking_and_packing_example() -> str:
    section = README.read_text(encoding="utf-8").split("### Samples a model consumes", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "the README's document-masking section has no Python example"
    return match.group(1)


def test_readme_document_masked_and_packed_loops_run(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="the loops train a torch model")
    (tmp_path / "example.py").write_text(masking_and_packing_example(), encoding="utf-8")
    done = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"document-masked loss \d+\.\d+ cu_seqlens \(8, 257\)", done.stdout), done.stdout
    assert re.search(r"packed 2,000 documents into [\d,]+ rows, \d+\.\d+% padding", done.stdout), done.stdout
    assert re.search(r"'packed': \(\d+, 1\.5\), 'masked': \(100096, 0\.\d+\)", done.stdout), done.stdout
    assert list((tmp_path / "data" / "index-cache").glob("*-piece_starts.npy"))
