"""PyTorch .pt shards: tokformats (NumPy only) against torch.load and torch.load(mmap=True).

Run: ``python benchmarks/bench_pt.py``. A 2,500,000-token int64 shard (NeuroShard Genesis's size) is written by
``torch.save``; each route runs in a fresh process (best of 5) that imports its library, opens the shard, sums
it and reads 1,000 random 1,025-token windows. "process" is the whole process's wall time from the parent;
"open + sum" and "windows" are timed inside it, after the import; "again" opens and sums the shard a second time
in the same process, and "open alone" is the best of 50 warm opens without the sum (the per-open cost once every
module is loaded; the sum itself is NumPy's or torch's arithmetic). Ratios are torch's time over ours.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, scratch, table

CHILD = r"""
import json, sys, time
started = time.perf_counter()
route, path, mode = sys.argv[1], sys.argv[2], sys.argv[3]
import numpy as np
if route == "tokformats":
    import tokformats
else:
    import torch
imported = time.perf_counter()
if route == "tokformats":
    tokens = tokformats.open(path).tokens
else:
    tokens = torch.load(path, mmap=(route == "torch.load(mmap=True)"), weights_only=True)
total = int(tokens.sum())
opened = time.perf_counter()
starts = np.random.default_rng(0).integers(0, len(tokens) - 1025, size=1000)
checksum = 0
for s in starts.tolist():
    window = tokens[s : s + 1025]
    checksum += int(window[0]) + int(window[-1])
done = time.perf_counter()
if mode == "job":  # the whole job ends here: its process time is measured by the parent
    print(json.dumps({"total": total, "checksum": checksum}))
    sys.exit(0)
# The per-open cost once everything is imported: open and sum the shard again.
if route == "tokformats":
    total_again = int(tokformats.open(path).tokens.sum())
else:
    total_again = int(torch.load(path, mmap=(route == "torch.load(mmap=True)"), weights_only=True).sum())
reopened = time.perf_counter()
assert total_again == total
# The open alone, warm, best of 50 (the sum is NumPy's or torch's arithmetic, not the file format's cost).
best = float("inf")
for _ in range(50):
    t0 = time.perf_counter()
    if route == "tokformats":
        tokformats.open(path).tokens
    else:
        torch.load(path, mmap=(route == "torch.load(mmap=True)"), weights_only=True)
    best = min(best, time.perf_counter() - t0)
with open("/proc/self/status") as status:
    rss = next(int(l.split()[1]) / 1024 for l in status if l.startswith("VmHWM:"))
print(json.dumps({"import": imported - started, "open_sum": opened - imported, "windows": done - opened,
                  "reopen_sum": reopened - done, "open_warm": best,
                  "total": total, "checksum": checksum, "rss": rss}))
"""

ROUTES = ("tokformats", "torch.load", "torch.load(mmap=True)")


def run(route: str, path: Path) -> dict[str, float]:
    """Best of 5 of each measure: the whole job's process time, and the in-process details."""
    best: dict[str, float] = {}
    for _ in range(5):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", CHILD, route, str(path), "job"], check=True, capture_output=True)
        best["process"] = min(best.get("process", float("inf")), time.perf_counter() - started)
        detail = [sys.executable, "-c", CHILD, route, str(path), "detail"]
        out = subprocess.run(detail, check=True, capture_output=True, text=True)
        for key, value in json.loads(out.stdout).items():
            best[key] = value if key in ("total", "checksum") else min(best.get(key, float("inf")), value)
    return best


def main() -> None:
    import compileall

    import numpy as np
    import torch

    import tokformats

    # pip byte-compiles an installed package; an editable checkout run with PYTHONDONTWRITEBYTECODE=1 would
    # otherwise recompile tokformats' sources in every fresh process and time the compiler, not the library.
    compileall.compile_dir(Path(tokformats.__file__).parent, quiet=1)

    path = scratch("pt") / "shard_0.pt"
    torch.save(torch.from_numpy(np.random.default_rng(0).integers(0, 50257, size=2_500_000)), path)
    results = {route: run(route, path) for route in ROUTES}
    assert len({r["total"] for r in results.values()}) == 1 and len({r["checksum"] for r in results.values()}) == 1
    ours = results["tokformats"]
    rows = []
    for route in ROUTES:
        r = results[route]

        def cell(key: str, digits: int = 2, r: dict[str, float] = r) -> str:
            return f"{r[key] * 1000:.{digits}f} ms ({r[key] / ours[key]:.1f}x)"

        rows.append(
            {
                "route": route,
                "process (import included)": cell("process", digits=0),
                "import": f"{r['import'] * 1000:.0f} ms",
                "open + sum (import excluded)": cell("open_sum"),
                "open + sum again (warm)": cell("reopen_sum"),
                "open alone (warm)": cell("open_warm", digits=3),
                "1,000 random 1,025-token windows": cell("windows", digits=1),
                "peak RSS": f"{r['rss']:.0f} MB",
            }
        )
    print(
        f"machine: {machine()}; shard: 2,500,000 int64 tokens (20 MB) written by torch.save; best of 5 fresh processes"
    )
    print("ratios in parentheses: that route's time / tokformats' time\n")
    print(table(rows))
    path.unlink()


if __name__ == "__main__":
    main()
