"""Downloading a shard folder through tokformats' cache against a plain single-stream copy, on loopback.

Run: ``python benchmarks/bench_remote.py [--megabytes 1000] [--repeat 3]``.

A NeuroShard-style folder of ``shard_N.pt`` files (int64, ~``--megabytes`` in all) is published with
``tokformats.publish`` to an HTTP server on 127.0.0.1 (the tests' server, which answers Range requests, in its own
process). Then, taking turns, repeated:

(a) a ``curl``-equivalent copy: one GET per file streamed to disk in 1 MiB blocks (``urllib``), no verification;
(a2) the same, each file fsynced (what any copy that survives a crash pays; (b) does it too);
(b) ``tokformats.remote.fetch`` of the folder into an empty cache: one GET per file (two files at a time), SHA-256
    of every byte (checked against the manifest's and ``SHA256SUMS``), fsync and rename per file.

The client's CPU time (every thread) is shown beside each: on two cores shared with the server, the SHA-256 of (b)
is work no core is free for. Each run starts after ``os.sync()`` (untimed), so that no run pays for writing back
the previous run's pages, and the three take turns going first.

Also: time to the first document of the first shard with ``tokformats.open(url)`` into an empty cache, and the cost
of hashing alone (``hashlib.sha256`` over the same bytes), which (b) overlaps with the download.
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import os
import shutil
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import machine, scratch, table

import tokformats
from tests.http_server import FileServer
from tokformats.remote import fetch, publish


def plain_copy(base: str, names: list[str], into: Path, durable: bool = False) -> None:
    into.mkdir(parents=True, exist_ok=True)
    for name in names:
        with urllib.request.urlopen(f"{base}/{name}") as answer, open(into / name, "wb") as out:
            while block := answer.read(1 << 20):
                out.write(block)
            if durable:
                out.flush()
                os.fsync(out.fileno())


def serve(root: Path, pipe: Any) -> None:
    """The server in its own process (its threads must not share the client's interpreter lock)."""
    server = FileServer(root)
    pipe.send(server.url)
    pipe.recv()  # until the benchmark is done
    server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--megabytes", type=float, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    folder = scratch("remote")
    shutil.rmtree(folder, ignore_errors=True)
    served = folder / "served"
    served.mkdir(parents=True)
    tokens = int(args.megabytes * 1e6 / 8)
    per_shard = 2_500_000  # Genesis: 20 MB int64 shards
    flat = np.random.default_rng(0).integers(0, 50_000, tokens)
    with tokformats.create(folder / "shards", "pt", tokens_per_shard=per_shard) as writer:
        writer.write_batch(flat, [len(flat)])
    del flat
    ours, theirs = multiprocessing.Pipe()
    process = multiprocessing.get_context("spawn").Process(target=serve, args=(served, theirs), daemon=True)
    process.start()
    url = f"{ours.recv()}/genesis"
    publish(folder / "shards", f"{url}/")
    names = sorted(p.name for p in (folder / "shards").iterdir())
    total = sum((folder / "shards" / n).stat().st_size for n in names)
    times: dict[str, list[float]] = {"copy": [], "durable": [], "fetch": []}
    cpu_times: dict[str, list[float]] = {key: [] for key in times}  # the client's CPU (all its threads)
    try:
        runs = {
            "copy": lambda into: plain_copy(url, names, into),
            "durable": lambda into: plain_copy(url, names, into, durable=True),
            "fetch": lambda into: fetch(f"{url}/", cache_dir=into),
        }
        order = list(runs)
        for k in range(args.repeat):
            for key in order[k % 3 :] + order[: k % 3]:  # each side goes first in turn
                into = folder / f"{key}{k}"
                os.sync()  # the previous run's dirty pages are written back before this one is timed, not during it
                started, cpu = time.perf_counter(), time.process_time()
                runs[key](into)
                times[key].append(time.perf_counter() - started)
                cpu_times[key].append(time.process_time() - cpu)
                shutil.rmtree(into)
        started = time.perf_counter()
        with tokformats.open(f"{url}/", cache_dir=folder / "first") as reader:
            reader[0][:1]
        first_document = time.perf_counter() - started
        started = time.perf_counter()
        for name in names:
            digest = hashlib.sha256()
            with open(folder / "shards" / name, "rb") as handle:
                while block := handle.read(1 << 22):
                    digest.update(block)
        hashing = time.perf_counter() - started
    finally:
        ours.send("stop")
        process.join(10)
    rows = []
    labels = (
        ("copy", "(a) single-stream copy (curl-like)"),
        ("durable", "(a2) the same, each file fsynced"),
        ("fetch", "(b) tokformats fetch, verified"),
    )
    for key, label in labels:
        values = times[key]
        rows.append({
            "run": label, "seconds min/med/max": "/".join(f"{v:.2f}" for v in (min(values), statistics.median(values),
                                                                              max(values))),
            "MB/s (median)": f"{total / statistics.median(values) / 1e6:.0f}",
            "(a)/run": f"{statistics.median(times['copy']) / statistics.median(values):.2f}",
            "(a2)/run": f"{statistics.median(times['durable']) / statistics.median(values):.2f}",
            "client CPU s (median)": f"{statistics.median(cpu_times[key]):.2f}",
        })  # fmt: skip
    print(f"machine: {machine()}; {len(names)} files, {total / 1e6:.0f} MB, loopback HTTP; {args.repeat} repeats\n")
    print(table(rows))
    print(f"\nSHA-256 of the same bytes alone: {hashing:.2f} s ({total / hashing / 1e6:.0f} MB/s)")
    print(f"time to the first document of tokformats.open(url) into an empty cache: {first_document:.2f} s "
          "(the manifest, then the first shard)")  # fmt: skip
    shutil.rmtree(folder)


if __name__ == "__main__":
    main()
