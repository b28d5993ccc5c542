"""Corrupted inputs for every reader, each read fully in a child process under a memory cap (RLIMIT_AS: the
child's own size plus 256 MiB plus the file) and a time cap per input: only clean reads or FormatError
(issue 15). CI runs a few hundred inputs per reader; ``--reliability-long`` runs 10,000."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

CASES = [
    "llmc",
    "llmc-vocab",
    "megatron",
    "pt",
    "pt-legacy",
    "pt-folder",
    "timemoe",
    "raw",
    "sequences-json",
    "sequences-jsonl",
    "sequences-npy",
    "sequences-npz",
    "sequences-npy.gz",
    "datatrove",
    "dolma",
    "litdata",
    "hf",
]
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(sys.platform != "linux", reason="the memory cap reads /proc and sets RLIMIT_AS")
@pytest.mark.parametrize("case", CASES)
def test_corrupted_inputs_under_memory_and_time_caps(tmp_path: Path, case: str, reliability_long: bool) -> None:
    count = 10_000 if reliability_long else 300
    done = subprocess.run(
        [sys.executable, "-m", "tests.fuzz_worker", case, str(count), "11", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if "skipped" in result:
        pytest.skip(result["skipped"])
    assert result["inputs"] == count and result["failures"] == [], result["failures"]
    assert result["clean"] + result["format_errors"] == count
