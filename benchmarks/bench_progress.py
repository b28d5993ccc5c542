"""What a progress bar costs ``merge`` (Megatron's, by OS copy) and ``fetch``: the same work with the bar on and off.

Run: ``python benchmarks/bench_progress.py [--megabytes 400] [--repeat 5]``.

(a) ``tokformats.api.merge`` of two Megatron datasets (uint16 tokens with uint8 loss masks, ~``--megabytes`` of
    ``.bin`` in all), ``progress=False`` then ``progress=True`` (tqdm's bar on stderr, written to /dev/null here),
    taking turns, the output deleted before each run (untimed, with ``os.sync()``).
(b) ``tokformats.remote.fetch`` of a published shard folder (~``--megabytes``/2) from a server on 127.0.0.1 (its own
    process) into an empty cache, bar off then on, taking turns.

Each row gives min / median / max seconds over the runs and the median ratio (on / off): > 1 means the bar costs.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import machine, scratch, table

import tokformats
import tokformats.api
from tests.http_server import FileServer
from tokformats.remote import fetch, publish


def serve(root: Path, pipe: Any) -> None:
    """The server in its own process (its threads must not share the client's interpreter lock)."""
    server = FileServer(root)
    pipe.send(server.url)
    pipe.recv()
    server.stop()


def turns(sides: dict[str, Callable[[], Any]], setup: Callable[[], Any], repeat: int) -> dict[str, list[float]]:
    """Seconds of each side over ``repeat`` rounds, the sides taking turns going first."""
    times: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for round_ in range(repeat):
        for name in names if round_ % 2 == 0 else names[::-1]:
            setup()
            started = time.perf_counter()
            sides[name]()
            times[name].append(time.perf_counter() - started)
    return times


def rows_of(operation: str, times: dict[str, list[float]]) -> list[dict[str, Any]]:
    off = statistics.median(times["off"])
    return [
        {
            "operation": operation,
            "bar": name,
            "min s": f"{min(t):.3f}",
            "median s": f"{statistics.median(t):.3f}",
            "max s": f"{max(t):.3f}",
            "on / off": f"{statistics.median(t) / off:.3f}",
        }
        for name, t in times.items()
    ]


def bench_merge(folder: Path, megabytes: float, repeat: int) -> list[dict[str, Any]]:
    tokens = int(megabytes * 1e6 / 3 / 2)  # two halves; 2 bytes of token and 1 of mask each
    rng = np.random.default_rng(0)
    for half in range(2):
        flat = rng.integers(0, 50_000, tokens, dtype=np.uint16)
        lengths = np.full(tokens // 1000, 1000)
        mask = (flat % 3 != 0).astype(np.uint8)
        with tokformats.create(folder / f"half{half}", "megatron", vocab_size=50_000, overwrite=True) as writer:
            writer.write_batch(flat[: lengths.sum()], lengths, mask[: lengths.sum()])
    sources = [folder / "half0", folder / "half1"]

    def clear() -> None:
        for path in folder.glob("merged*"):
            path.unlink()
        os.sync()

    def merge(progress: bool) -> None:
        tokformats.api.merge(sources, folder / "merged", progress=progress).close()

    return rows_of("merge (Megatron, OS copy)", turns({"off": lambda: merge(False), "on": lambda: merge(True)},
                                                     clear, repeat))  # fmt: skip


def bench_fetch(folder: Path, megabytes: float, repeat: int) -> list[dict[str, Any]]:
    shards = folder / "shards"
    per_shard = 4_000_000
    flat = np.random.default_rng(1).integers(1, 60_000, max(int(megabytes * 1e6 / 2 / 8), per_shard))
    flat = flat[: len(flat) // per_shard * per_shard]
    shutil.rmtree(shards, ignore_errors=True)
    with tokformats.create(shards, "pt", tokens_per_shard=per_shard, final_shard=False) as writer:
        writer.write_batch(flat, [len(flat)])
    root = folder / "served"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir()
    ours, theirs = multiprocessing.Pipe()
    server = multiprocessing.Process(target=serve, args=(root, theirs), daemon=True)
    server.start()
    url = ours.recv()
    try:
        publish(shards, f"{url}/g/")
        cache = folder / "cache"

        def clear() -> None:
            shutil.rmtree(cache, ignore_errors=True)
            os.sync()

        def get(progress: bool) -> None:
            fetch(f"{url}/g/", cache_dir=cache, progress=progress).lease.release()

        times = turns({"off": lambda: get(False), "on": lambda: get(True)}, clear, repeat)
    finally:
        ours.send("stop")
        server.join(timeout=10)
    return rows_of("fetch (HTTP, 127.0.0.1)", times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--megabytes", type=float, default=400)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    folder = scratch("progress")
    sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - the bars go nowhere; the cost of drawing them stays
    rows = bench_merge(folder, args.megabytes, args.repeat) + bench_fetch(folder, args.megabytes, args.repeat)
    sys.stderr = sys.__stderr__
    print(f"{machine()}; {args.megabytes:g} MB, {args.repeat} runs per side")
    print(table(rows))
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
