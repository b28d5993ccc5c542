"""Helpers shared by the benchmarks: timing, scratch space, table printing."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def best_of(function: Callable[[], Any], repeat: int = 3) -> tuple[float, Any]:
    """The fastest of ``repeat`` runs in seconds, and the last result."""
    best, result = float("inf"), None
    for _ in range(repeat):
        started = time.perf_counter()
        result = function()
        best = min(best, time.perf_counter() - started)
    return best, result


def interleaved(
    first: Callable[[], Any], second: Callable[[], Any], repeat: int = 5, setup: Callable[[], Any] | None = None
) -> tuple[float, float]:
    """Best times of two functions run alternately, so that disk and cache noise hits both alike.

    ``setup`` runs untimed before every call (for example, to delete the previous run's output).
    """
    times = alternated(first, second, repeat, setup)
    return min(times[0]), min(times[1])


def alternated(
    first: Callable[[], Any], second: Callable[[], Any], repeat: int = 5, setup: Callable[[], Any] | None = None
) -> tuple[list[float], list[float]]:
    """Every time of two functions run alternately (``setup`` untimed before each call): the lists give
    min/median/max and the ratio of each pair, which load on a shared machine hits alike."""
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeat):
        for k, function in enumerate((first, second)):
            if setup is not None:
                setup()
            started = time.perf_counter()
            function()
            times[k].append(time.perf_counter() - started)
    return times


def spread(values: list[float], fmt: str = "{:.3f}") -> str:
    """``min/median/max`` of ``values``."""
    ordered = sorted(values)
    return "/".join(fmt.format(v) for v in (ordered[0], statistics.median(ordered), ordered[-1]))


def two_checkouts_parser(description: str | None, rounds: int) -> argparse.ArgumentParser:
    """The arguments of a before/after comparison of two checkouts on the tokenize corpus."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, required=True, help="checkout of the code before")
    parser.add_argument("--after", type=Path, required=True, help="checkout of the code after")
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=rounds)
    return parser


def installed_env(checkout: Path | None = None) -> dict[str, str]:
    """The environment of a child that imports tokformats as an installed package would: from ``checkout`` (None:
    whatever this process imports), with bytecode caching on (a private ``PYTHONPYCACHEPREFIX``), so that a
    machine that sets ``PYTHONDONTWRITEBYTECODE`` does not add the compiling of every module to each run."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(scratch("pycache"))
    if checkout is not None:
        env["PYTHONPATH"] = str(checkout)
    return env


def compile_checkout(checkout: Path) -> None:
    """Compile ``checkout``'s tokformats into :func:`installed_env`'s bytecode cache, as ``pip install`` does, so that
    a benchmark's first round does not pay for compiling every module."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(checkout.resolve() / "tokformats")],
                   env=installed_env(), check=True, capture_output=True)  # fmt: skip


def run_in_checkout(code: str, argv: list[str], checkout: Path) -> dict[str, Any]:
    """Run ``python -c code *argv`` in a fresh process that imports tokformats from ``checkout`` (bytecode cached:
    :func:`installed_env`); its last line of output, a JSON object, with its ``file`` (the tokformats it imported,
    which must lie in ``checkout``) taken out. A failed child stops the benchmark with its error."""
    env = installed_env(checkout)
    out = subprocess.run([sys.executable, "-c", code, *argv], env=env, capture_output=True, text=True, check=False,
                         cwd="/", timeout=600)  # fmt: skip
    if out.returncode:
        raise SystemExit(out.stderr)
    found: dict[str, Any] = json.loads(out.stdout.splitlines()[-1])
    if not Path(found.pop("file")).resolve().is_relative_to(checkout):
        raise SystemExit(f"the child did not import the checkout {checkout}")
    return found


def peak_rss_mb() -> float:
    """This process's peak resident memory in MB (``VmHWM``: reset by exec, unlike ``ru_maxrss``)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def scratch(name: str) -> Path:
    """A scratch folder under ``$TOKFORMATS_BENCH_DIR`` (default: the system temporary folder)."""
    root = Path(os.environ.get("TOKFORMATS_BENCH_DIR", tempfile.gettempdir())) / f"tokformats-bench-{name}"
    root.mkdir(parents=True, exist_ok=True)
    return root


def machine() -> str:
    """One line describing the machine the figures come from."""
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def table(rows: list[dict[str, Any]]) -> str:
    """Rows as a Markdown table (what goes into the README)."""
    headers = list(rows[0])
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(r[h]) for h in headers) + " |" for r in rows]
    return "\n".join(lines)


def drop_from_cache(path: Path) -> None:
    """Best effort: ask the kernel to forget a file's pages, so a run does not time the page cache twice."""
    try:
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    except (AttributeError, OSError):
        pass
