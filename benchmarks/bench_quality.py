"""What is in the data, at corpus scale: exact duplicates, contamination, and provenance's cost on tokenize.

Run: ``python benchmarks/bench_quality.py [--tokens 1e9] [--documents 3e6] [--eval-items 10000] [--repeat 3]
[--tokenize-megabytes 40]``.

1. A Megatron corpus of ``--tokens`` uint16 ids in ``--documents`` documents (random lengths, 1% of them copies of
   200 template documents) is written once. ``r.duplicates()`` and the peer, one ``np.memmap`` pass over the same
   ``.bin`` (``.sum()``), run alternately in fresh processes (so each one's peak RSS is its own; the file is in the
   page cache for both), ``--repeat`` times: seconds min/median/max (wall and CPU: CPU time is less shaken by a
   busy host) and peak RSS. The groups found must be exactly the planted ones. ``duplicates-copies`` does the same
   on the worst case, a corpus of as many tokens and documents where every document has ``--copies`` copies (32:
   Nemotron's incident) shuffled through the file, so every document is a candidate.
2. ``tokformats.contamination`` of ``--eval-items`` eval items (20-300 ids; 100 of them cut from corpus documents)
   against the same corpus, n = 13, in fresh processes: seconds and peak RSS; every planted item must be found.
3. ``tokformats.tokenize`` of a JSONL of short documents (each line of ``--tokenize-megabytes`` of Python's own
   library sources, as ``bench_tokenize.py`` picks them: provenance costs per document) into Megatron with
   ``provenance=True`` and ``False``, alternating, ``--repeat`` times: seconds min/median/max and the overhead of
   the median.

``--parts duplicates,duplicates-copies,contamination,provenance`` picks the figures; ``--reuse-corpus`` keeps the
corpora an earlier run of the same size wrote.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, peak_rss_mb, scratch, table

import tokformats

TEMPLATES = 200


def write_corpus(prefix: Path, tokens: int, documents: int) -> dict[str, Any]:
    """A corpus with 1% of its documents copies of ``TEMPLATES`` templates; returns the planted groups' sizes."""
    rng = np.random.default_rng(0)
    mean = tokens / documents
    lengths = rng.integers(1, max(int(2 * mean), 2), documents)
    # at least 4 ids: two random documents are then equal by chance with probability ~1e-19, not planted ones only
    lengths = np.maximum((lengths * (tokens / lengths.sum())).astype(np.int64), 4)
    copies = rng.choice(documents, documents // 100, replace=False)
    template_of = rng.integers(0, TEMPLATES, len(copies))
    templates = [rng.integers(0, 50000, int(n), dtype=np.uint16) for n in rng.integers(50, 1000, TEMPLATES)]
    lengths[copies] = [len(templates[t]) for t in template_of]
    plant = dict(zip(copies.tolist(), template_of.tolist()))
    with tokformats.create(prefix, "megatron", vocab_size=50257, overwrite=True) as writer:
        batch = 1 << 16
        for first in range(0, documents, batch):
            size = lengths[first : first + batch]
            flat = rng.integers(0, 50000, int(size.sum()), dtype=np.uint16)
            starts = np.concatenate([[0], np.cumsum(size)[:-1]])
            for k in np.flatnonzero(np.isin(np.arange(first, first + len(size)), copies)).tolist():
                flat[starts[k] : starts[k] + size[k]] = templates[plant[first + k]]
            writer.write_batch(flat, size)
    groups = np.bincount(template_of, minlength=TEMPLATES)
    return {"documents": documents, "tokens": int(lengths.sum()), "planted": sorted(groups[groups >= 2].tolist())}


def write_copied_corpus(prefix: Path, tokens: int, documents: int, copies: int) -> dict[str, Any]:
    """The worst case: ``documents // copies`` random documents, each written ``copies`` times, in a shuffled order."""
    rng = np.random.default_rng(2)
    distinct = documents // copies
    lengths = rng.integers(1, max(int(2 * tokens / documents), 2), distinct)
    lengths = np.maximum((lengths * (tokens / copies / lengths.sum())).astype(np.int64), 4)
    flat = rng.integers(0, 50000, int(lengths.sum()), dtype=np.uint16)
    starts = np.cumsum(lengths) - lengths
    order = rng.permutation(np.repeat(np.arange(distinct), copies))
    with tokformats.create(prefix, "megatron", vocab_size=50257, overwrite=True) as writer:
        for first in range(0, len(order), 1 << 16):
            size = lengths[order[first : first + (1 << 16)]]
            shift = np.repeat(starts[order[first : first + (1 << 16)]] - (np.cumsum(size) - size), size)
            writer.write_batch(flat[np.arange(int(size.sum())) + shift], size)
    return {"documents": len(order), "tokens": int(lengths.sum()) * copies, "planted": [copies] * distinct}


def worker(task: str, prefix: str, extra: str) -> None:
    """One measurement in this (fresh) process: prints ``{"seconds", "peak_mb", ...}``."""
    started, used = time.perf_counter(), time.process_time()
    result: dict[str, Any] = {}
    if task == "memmap":
        result["sum"] = int(np.memmap(f"{prefix}.bin", dtype=np.uint16, mode="r").sum())
    elif task == "duplicates":
        with tokformats.open(prefix) as reader:
            groups = reader.duplicates()
        result["sizes"] = sorted(len(g) for g in groups)
    elif task == "contamination":
        stored = np.load(extra)
        items = np.split(stored["flat"], np.cumsum(stored["lengths"])[:-1])
        with tokformats.open(prefix) as reader:
            found = tokformats.contamination(reader, items, ngram=13)
        result["contaminated"] = [k for k, f in enumerate(found) if len(f)]
    result["seconds"] = time.perf_counter() - started
    result["cpu_seconds"] = time.process_time() - used
    result["peak_mb"] = peak_rss_mb()
    print(json.dumps(result))


def measure(task: str, prefix: Path, extra: str = "") -> dict[str, Any]:
    command = [sys.executable, __file__, "--worker", task, str(prefix), extra]
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    result: dict[str, Any] = json.loads(output.strip().splitlines()[-1])
    return result


def spread(values: list[float]) -> str:
    return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f} s"


def bench_duplicates(prefix: Path, corpus: dict[str, Any], repeat: int, what: str = "") -> list[dict[str, Any]]:
    ours, peer = [], []
    measure("memmap", prefix)  # the page cache holds the file for both sides
    for _ in range(repeat):
        ours.append(measure("duplicates", prefix))
        peer.append(measure("memmap", prefix))
    expected = corpus["planted"]
    assert all(run["sizes"] == expected for run in ours), "duplicates differ from the planted groups"
    ratio = statistics.median(r["seconds"] for r in ours) / statistics.median(r["seconds"] for r in peer)
    cpu_ratio = statistics.median(r["cpu_seconds"] for r in ours) / statistics.median(r["cpu_seconds"] for r in peer)
    cpu = spread([r["cpu_seconds"] for r in ours])
    return [
        {
            "figure": f"r.duplicates(), {corpus['tokens'] / 1e9:.2f} G tokens, {corpus['documents'] / 1e6:.1f} M docs"
            + what,
            "min / median / max": f"{spread([r['seconds'] for r in ours])} (CPU {cpu})",
            "peak RSS": f"{max(r['peak_mb'] for r in ours):,.0f} MB",
            "peer": f"np.memmap(...).sum() {spread([r['seconds'] for r in peer])} "
            f"(CPU {spread([r['cpu_seconds'] for r in peer])}), {max(r['peak_mb'] for r in peer):,.0f} MB",
            "ratio": f"{ratio:.2f}x the peer's time, {cpu_ratio:.2f}x its CPU time (medians; goal 2x); "
            f"{len(expected):,} planted groups found exactly",
        }
    ]


def prepared(prefix: Path, wanted: list[int], reuse: bool, write: Any) -> dict[str, Any]:
    """The corpus at ``prefix`` written by ``write(prefix, *wanted)``, or the one an earlier run wrote (``reuse``)."""
    facts = prefix.with_suffix(".json")
    known = json.loads(facts.read_text()) if reuse and facts.exists() else {}
    if known.get("asked") == wanted and Path(f"{prefix}.idx").exists():
        return dict(known)
    started = time.perf_counter()
    corpus = {**write(prefix, *wanted), "asked": wanted}
    facts.write_text(json.dumps(corpus))
    seconds = time.perf_counter() - started
    print(f"{prefix.name} written in {seconds:.0f} s: {corpus['tokens']:,} tokens", file=sys.stderr)
    return corpus


def bench_contamination(prefix: Path, folder: Path, items: int, repeat: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(1)
    with tokformats.open(prefix) as reader:
        eval_set: list[np.ndarray] = [rng.integers(0, 50000, int(n)) for n in rng.integers(20, 300, items)]
        planted = []
        for k in range(min(100, items)):
            document = np.asarray(reader[int(rng.integers(len(reader)))])
            if len(document) >= 30:
                eval_set[k] = document[:30].astype(np.int64)
                planted.append(k)
    path = folder / "eval.npz"
    np.savez(path, flat=np.concatenate(eval_set), lengths=np.array([len(x) for x in eval_set]))
    runs = [measure("contamination", prefix, str(path)) for _ in range(repeat)]
    assert all(set(planted) <= set(r["contaminated"]) for r in runs), "a planted eval item was missed"
    return [
        {
            "figure": f"tokformats.contamination, {items:,} eval items (n=13) vs the same corpus",
            "min / median / max": spread([r["seconds"] for r in runs]),
            "peak RSS": f"{max(r['peak_mb'] for r in runs):,.0f} MB",
            "peer": "none installed (goal: minutes, not hours, on 2 cores)",
            "ratio": f"{len(planted)} planted items found, {len(runs[0]['contaminated'])} items matched in all",
        }
    ]


def bench_provenance(folder: Path, megabytes: float, repeat: int) -> list[dict[str, Any]]:
    from bench_tokenize import corpus_files

    from tokformats.tokenization.sample_text import sample_texts
    from tokformats.tokenization.tokenizer import train_tokenizer

    # Short documents (each non-blank line of Python's library sources): provenance's cost is per document.
    source = folder / "lines.jsonl"
    with source.open("w", encoding="utf-8") as out:
        for path in corpus_files(megabytes):
            for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
                if line.strip() and "<|" not in line:
                    out.write(json.dumps({"text": line}) + "\n")
    tokenizer = folder / "tokenizer.json"
    train_tokenizer(sample_texts(3000), 8000, progress=False).save(str(tokenizer))
    times: dict[bool, list[float]] = {True: [], False: []}
    cpu: dict[bool, list[float]] = {True: [], False: []}  # CPU seconds of every thread: less shaken by a busy host
    for _ in range(repeat):
        for provenance in (True, False):
            started, used = time.perf_counter(), time.process_time()
            tokformats.tokenize(
                source, tokenizer, folder / "out", "megatron", provenance=provenance, overwrite=True, progress=False
            )
            times[provenance].append(time.perf_counter() - started)
            cpu[provenance].append(time.process_time() - used)
    overhead = statistics.median(times[True]) / statistics.median(times[False]) - 1
    cpu_overhead = statistics.median(cpu[True]) / statistics.median(cpu[False]) - 1
    size = source.stat().st_size / 1e6
    with tokformats.open(folder / "out_text_document") as reader:
        documents = len(reader)
    return [
        {
            "figure": f"tokenize {size:.0f} MB JSONL ({documents:,} documents) -> megatron, provenance=True",
            "min / median / max": spread(times[True]),
            "peak RSS": "",
            "peer": f"provenance=False {spread(times[False])}",
            "ratio": f"{overhead:+.1%} wall time, {cpu_overhead:+.1%} CPU time (medians; goal <= 5%)",
        }
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=float, default=1e9)
    parser.add_argument("--documents", type=float, default=3e6)
    parser.add_argument("--eval-items", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--contamination-repeat", type=int, default=1)
    parser.add_argument("--tokenize-megabytes", type=float, default=40)
    parser.add_argument("--copies", type=int, default=32, help="copies of each document in duplicates-copies")
    parser.add_argument("--parts", default="duplicates,contamination,provenance", help="which figures (comma list)")
    parser.add_argument("--reuse-corpus", action="store_true", help="keep a corpus an earlier run wrote")
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker)
        return
    folder = scratch("quality")
    parts = set(args.parts.split(","))
    rows: list[dict[str, Any]] = []
    wanted = [int(args.tokens), int(args.documents)]
    if parts & {"duplicates", "contamination"}:
        prefix = folder / "corpus"
        corpus = prepared(prefix, wanted, args.reuse_corpus, write_corpus)
        if "duplicates" in parts:
            rows += bench_duplicates(prefix, corpus, args.repeat)
            print(table(rows[-1:]), file=sys.stderr)
        if "contamination" in parts:
            rows += bench_contamination(prefix, folder, args.eval_items, args.contamination_repeat)
            print(table(rows[-1:]), file=sys.stderr)
    if "duplicates-copies" in parts:
        prefix = folder / "copies"
        corpus = prepared(prefix, [*wanted, args.copies], args.reuse_corpus, write_copied_corpus)
        rows += bench_duplicates(prefix, corpus, args.repeat, f", every one {args.copies}x (shuffled)")
        print(table(rows[-1:]), file=sys.stderr)
    if "provenance" in parts:
        rows += bench_provenance(folder, args.tokenize_megabytes, args.repeat)
    print(f"\n{machine()}\n")
    print(table(rows))


if __name__ == "__main__":
    main()
