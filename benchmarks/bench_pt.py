"""PyTorch .pt shards: tokformats (NumPy only) against torch.load and torch.load(mmap=True).

Run: ``python benchmarks/bench_pt.py``. A 2,500,000-token int64 shard (NeuroShard Genesis's size) is written by
``torch.save``; each route runs in a fresh process (best of 5) that imports its library, opens the shard, sums
it and reads 1,000 random 1,025-token windows. "process" is the whole process's wall time from the parent;
"open + sum" and "windows" are timed inside it, after the import; "again" opens and sums the shard a second time
in the same process (the per-open cost once every module is loaded). Ratios are torch's time over ours.
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
route, path = sys.argv[1], sys.argv[2]
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
# The per-open cost once everything is imported: open and sum the shard again.
if route == "tokformats":
    total_again = int(tokformats.open(path).tokens.sum())
else:
    total_again = int(torch.load(path, mmap=(route == "torch.load(mmap=True)"), weights_only=True).sum())
reopened = time.perf_counter()
assert total_again == total
with open("/proc/self/status") as status:
    rss = next(int(l.split()[1]) / 1024 for l in status if l.startswith("VmHWM:"))
print(json.dumps({"import": imported - started, "open_sum": opened - imported, "windows": done - opened,
                  "reopen_sum": reopened - done,
                  "total": total, "checksum": checksum, "rss": rss}))
"""

ROUTES = ("tokformats", "torch.load", "torch.load(mmap=True)")


def run(route: str, path: Path) -> dict[str, float]:
    best: dict[str, float] = {}
    for _ in range(5):
        started = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-c", CHILD, route, str(path)], check=True, capture_output=True, text=True
        )
        result = json.loads(out.stdout)
        result["process"] = time.perf_counter() - started
        for key, value in result.items():
            best[key] = value if key in ("total", "checksum") else min(best.get(key, float("inf")), value)
    return best


def main() -> None:
    import numpy as np
    import torch

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
