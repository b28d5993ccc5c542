"""Dict samples against megatron-core 0.19.2 (``inter_document_masking``), which needs Python >= 3.12: the comparison
(``tests/megatron_fields.py``) runs in the interpreter named by ``TOKFORMATS_MCORE019_PYTHON`` (``.ci/run`` builds
that environment once outside the clone and sets it), with this checkout on its ``PYTHONPATH``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VARIABLE = "TOKFORMATS_MCORE019_PYTHON"


def _interpreter() -> str:
    python = os.environ.get(VARIABLE)
    reason = None
    if not python:
        reason = f"{VARIABLE} is not set (.ci/run sets it to a Python 3.12 with megatron-core 0.19.2)"
    elif not Path(python).is_file():
        reason = f"{VARIABLE}={python} does not exist"
    if reason is not None:
        print(f"skipping the megatron-core 0.19.2 comparison: {reason}", file=sys.stderr)
        pytest.skip(reason)
    assert python is not None
    return python


@pytest.mark.parametrize("trials", [8])
def test_dict_samples_equal_megatron_core_0_19(trials: int) -> None:
    python = _interpreter()
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(
        [python, "-m", "tests.megatron_fields", "--trials", str(trials)],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    found = re.search(
        r"megatron-core (\S+): (\d+) samples equal over (\d+) corpora x (\d+) flag combinations "
        r"\(inter_document_masking: True\)",
        done.stdout,
    )
    assert found is not None, done.stdout[-2000:]
    version, samples, corpora, combinations = found.groups()
    assert version.startswith("0.19.") and int(corpora) == trials and int(combinations) == 32
    assert int(samples) >= trials * 32 * 3
