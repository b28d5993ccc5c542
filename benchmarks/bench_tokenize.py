"""tokformats.tokenize end to end against ``Tokenizer.encode_batch_fast`` alone, same text, same threads.

Run: ``python benchmarks/bench_tokenize.py [--megabytes 220]``. The corpus is real text on every machine: the
``.py``, ``.rst`` and ``.txt`` files under Python's library folder (standard library first, then installed packages),
one document per file, written once as JSONL (and gzipped JSONL). A byte-level BPE (32,000 tokens) is trained on
the first 20 MB. Then, in this order, all in the same process and on the same cores:

(a) ``encode_batch_fast`` alone on the pre-loaded texts, in batches of 1,000 (the pipeline's batch size);
(b) ``tokformats.tokenize`` from ``.jsonl`` into each format;
(c) the same from ``.jsonl.gz``.

Peak RSS of (b) is measured in fresh processes on the corpus and on a 5x larger one (the same files repeated).
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, scratch, table

import tokformats

FORMATS = ("megatron", "llmc", "raw", "pt", "timemoe")


def corpus_files(megabytes: float) -> list[Path]:
    library = Path(json.__file__).resolve().parent.parent
    files = sorted(p for p in library.rglob("*") if p.suffix in (".py", ".rst", ".txt") and p.is_file())
    files.sort(key=lambda p: "site-packages" in p.parts)  # the standard library first
    chosen, total = [], 0
    for path in files:
        if total >= megabytes * 1e6:
            break
        chosen.append(path)
        total += path.stat().st_size
    return chosen


def write_corpus(folder: Path, files: list[Path], repeat: int = 1) -> tuple[Path, Path, int]:
    jsonl, gz = folder / f"corpus{repeat}.jsonl", folder / f"corpus{repeat}.jsonl.gz"
    size = 0
    with open(jsonl, "w", encoding="utf-8") as out:
        for _ in range(repeat):
            for path in files:
                text = path.read_text(encoding="utf-8", errors="replace")
                size += len(text.encode("utf-8"))
                out.write(json.dumps({"text": text}) + "\n")
    if repeat == 1:
        with open(jsonl, "rb") as source, gzip.open(gz, "wb", compresslevel=1) as target:
            while chunk := source.read(1 << 24):
                target.write(chunk)
    return jsonl, gz, size


RSS_CHILD = r"""
import sys, tokformats
tokformats.tokenize(sys.argv[1], sys.argv[2], sys.argv[3], "megatron", progress=False, overwrite=True)
with open("/proc/self/status") as status:
    print(next(int(l.split()[1]) / 1024 for l in status if l.startswith("VmHWM:")))
"""


def peak_rss(jsonl: Path, tokenizer: Path, output: Path) -> float:
    out = subprocess.run(
        [sys.executable, "-c", RSS_CHILD, str(jsonl), str(tokenizer), str(output)],
        check=True,
        capture_output=True,
        text=True,
    )
    return float(out.stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--megabytes", type=float, default=220)
    parser.add_argument("--skip-rss", action="store_true")
    parser.add_argument("--rss-only", action="store_true", help="only the peak-RSS comparison")
    args = parser.parse_args()
    folder = scratch("tokenize")
    files = corpus_files(args.megabytes)
    jsonl, gz, text_bytes = write_corpus(folder, files)
    with open(jsonl, encoding="utf-8") as handle:
        texts = [json.loads(line)["text"] for line in handle]
    tokenizer_path = folder / "tokenizer.json"
    if args.rss_only:
        tokformats.train_tokenizer(texts[:2000], 32000, progress=False).save(str(tokenizer_path))
        print_rss(folder, files, jsonl, tokenizer_path)
        return
    sample, size = [], 0
    for text in texts:
        sample.append(text)
        size += len(text)
        if size > 20e6:
            break
    tokenizer = tokformats.train_tokenizer(sample, 32000, progress=False)
    tokenizer.save(str(tokenizer_path))

    started = time.perf_counter()
    tokens = empty = 0
    for k in range(0, len(texts), 1000):
        for encoding in tokenizer.encode_batch_fast(texts[k : k + 1000], add_special_tokens=False):
            tokens += len(encoding.ids)
            empty += not encoding.ids
    baseline = time.perf_counter() - started
    rows = [
        {
            "run": "(a) encode_batch_fast alone, pre-loaded texts",
            "MB/s": f"{text_bytes / baseline / 1e6:.1f}",
            "tokens/s": f"{tokens / baseline / 1e6:.2f} M",
            "seconds": f"{baseline:.1f}",
            "(b)/(a)": "1.00",
        }
    ]
    del texts
    for source, label in ((jsonl, "(b) .jsonl"), (gz, "(c) .jsonl.gz")):
        for name in FORMATS if source == jsonl else ("megatron",):
            summary = tokformats.tokenize(
                source, tokenizer, folder / "out" / name, name, progress=False, overwrite=True
            )
            seconds = summary["seconds"]
            # one end-of-text per document (Megatron's preprocess_data gives empty documents none)
            assert summary["tokens"] == tokens + summary["documents"] - (empty if name == "megatron" else 0)
            rows.append(
                {
                    "run": f"{label} -> {name}",
                    "MB/s": f"{text_bytes / seconds / 1e6:.1f}",
                    "tokens/s": f"{summary['tokens'] / seconds / 1e6:.2f} M",
                    "seconds": f"{seconds:.1f}",
                    "(b)/(a)": f"{baseline / seconds:.2f}",
                }
            )
            print(rows[-1], flush=True)
    print(
        f"machine: {machine()}; corpus: {len(files):,} files, {text_bytes / 1e6:.0f} MB of text, "
        f"{tokens:,} tokens (32,000-token byte-level BPE)\n"
    )
    print(table(rows))
    if not args.skip_rss:
        print_rss(folder, files, jsonl, tokenizer_path)
    shutil.rmtree(folder)


def print_rss(folder: Path, files: list[Path], jsonl: Path, tokenizer_path: Path) -> None:
    big, _, _ = write_corpus(folder, files, repeat=5)
    one = peak_rss(jsonl, tokenizer_path, folder / "rss1" / "c")
    five = peak_rss(big, tokenizer_path, folder / "rss5" / "c")
    print(f"\npeak RSS of (b) -> megatron in a fresh process: {one:.0f} MB on the corpus, {five:.0f} MB on 5x it")


if __name__ == "__main__":
    main()
