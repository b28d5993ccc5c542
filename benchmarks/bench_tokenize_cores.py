"""How busy the two cores are during one fresh-process ``tokenize`` run, thread by thread: before against after.

Run: ``python benchmarks/bench_tokenize_cores.py --before /work/main --after . --corpus C.jsonl --tokenizer T.json
[--rounds 3] [--show]`` (the corpus and tokenizer of ``bench_tokenize.py``). Each round runs each checkout in a fresh
process (``PYTHONPATH`` set to it, from ``/``), sides alternated. The child samples every thread's CPU time from
``/proc/self/task`` every 20 ms from before ``import tokformats`` to the return of ``tokenize(corpus, tokenizer, out,
"megatron")``, and stamps when the engine's first and last batches return. Per run:

- ``start-up``: from the process's first sample to the engine's first batch (imports, tokenizer load, plan, gate,
  the first sample's reference encoding where it runs ahead), its wall seconds and the cores it kept busy;
- ``encode``: from the first to the last batch of the engine, wall and cores busy;
- ``tail``: from the engine's last batch to ``tokenize``'s return (the last checks compared, the last checkpoint's
  fsync and read-back, the publish, the work folder's removal), wall and cores busy;
- ``cpu``: the process's CPU seconds in all.

The sampler's own thread is left out of the counts (it costs about 1% of a core). ``--show`` prints each run's
timeline: 100 ms rows, the cores each group of threads kept busy (the main thread, the reader, the engine's thread
and fastokens' own, the reference's, the rest). Then min/median/max per side.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import compile_checkout, run_in_checkout, spread, two_checkouts_parser

CHILD = r"""
import json, os, sys, threading, time
t0 = time.perf_counter()
ticks = os.sysconf("SC_CLK_TCK")
names, samples, stop = {}, [], threading.Event()

def snapshot():
    found = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                text = f.read()
        except OSError:
            continue
        fields = text.rsplit(")", 1)[1].split()
        found[int(tid)] = (text[text.index("(") + 1 : text.rindex(")")], (int(fields[11]) + int(fields[12])) / ticks)
    return found

def sample():
    while not stop.is_set():
        for thread in threading.enumerate():
            if thread.native_id:
                names[thread.native_id] = thread.name
        samples.append((time.perf_counter() - t0, snapshot()))
        time.sleep(0.02)

threading.Thread(target=sample, daemon=True, name="sampler").start()
import tokformats
from tokformats.tokenization import engines
stamps = []
encode = engines.FastokensEngine.encode
def stamped(self, *args, **kwargs):
    result = encode(self, *args, **kwargs)
    stamps.append(time.perf_counter() - t0)
    return result
engines.FastokensEngine.encode = stamped
tokformats.tokenize(sys.argv[1], sys.argv[2], sys.argv[3], "megatron", progress=False, overwrite=True)
end = time.perf_counter() - t0
stop.set()
samples.append((end, snapshot()))

def group(tid, comm):
    name = names.get(tid, comm)
    if name == "sampler":
        return None
    for prefix, label in (("MainThread", "main"), ("Thread-", "reader"), ("tokformats-encode", "engine"),
                          ("fastokens", "engine"), ("tokformats-verify", "reference"),
                          ("tokformats-first", "reference")):
        if name.startswith(prefix):
            return label
    return "other"

rows = []
for (t1, before), (t2, after) in zip(samples, samples[1:]):
    busy = {}
    for tid, (comm, cpu) in after.items():
        label = group(tid, comm)
        if label is not None:
            busy[label] = busy.get(label, 0.0) + cpu - before.get(tid, (comm, 0.0))[1]
    rows.append((t1, t2, busy))
first = min(stamps[1:] or stamps)  # the gate's own call to the engine is the first; the run's first batch next
print(json.dumps({"rows": rows, "first": first, "last": max(stamps), "end": end, "cpu": time.process_time(),
                  "file": tokformats.__file__}))
"""

GROUPS = ["main", "reader", "engine", "reference", "other"]


def stretch(rows: list[list[object]], start: float, stop: float) -> tuple[float, float]:
    """Wall seconds from ``start`` to ``stop`` and the cores busy over them (samples overlapping it, prorated)."""
    cpu = 0.0
    for t1, t2, busy in rows:
        t1, t2 = float(t1), float(t2)  # type: ignore[arg-type]
        overlap = max(0.0, min(t2, stop) - max(t1, start))
        if overlap and t2 > t1:
            cpu += sum(busy.values()) * overlap / (t2 - t1)  # type: ignore[union-attr]
    wall = max(stop - start, 1e-9)
    return wall, cpu / wall


def show(rows: list[list[object]]) -> None:
    print("   s  " + " ".join(f"{g:>9}" for g in GROUPS) + "  cores")
    bucket: dict[int, dict[str, float]] = {}
    for t1, _, busy in rows:
        row = bucket.setdefault(int(float(t1) * 10), {})  # type: ignore[arg-type]
        for label, cpu in busy.items():  # type: ignore[union-attr]
            row[label] = row.get(label, 0.0) + cpu
    for k in sorted(bucket):
        row = bucket[k]
        print(f"{k / 10:4.1f}  " + " ".join(f"{row.get(g, 0.0) / 0.1:9.2f}" for g in GROUPS)
              + f"  {sum(row.values()) / 0.1:5.2f}")  # fmt: skip


def main() -> None:
    parser = two_checkouts_parser(__doc__, rounds=3)
    parser.add_argument("--show", action="store_true", help="print each run's timeline")
    args = parser.parse_args()
    sides = {"before": args.before.resolve(), "after": args.after.resolve()}
    for checkout in sides.values():
        compile_checkout(checkout)
    figures: dict[str, dict[str, list[float]]] = {side: {} for side in sides}
    loads: list[float] = []
    with tempfile.TemporaryDirectory() as folder:
        for round_ in range(args.rounds):
            for side in list(sides) if round_ % 2 == 0 else list(sides)[::-1]:
                loads.append(os.getloadavg()[0])
                argv = [str(args.corpus.resolve()), str(args.tokenizer.resolve()), f"{folder}/{side}/c"]
                found = run_in_checkout(CHILD, argv, sides[side])
                rows, first, last, end = found["rows"], found["first"], found["last"], found["end"]
                start = float(rows[0][0])
                parts = {"start-up": stretch(rows, start, first), "encode": stretch(rows, first, last),
                         "tail": stretch(rows, last, end)}  # fmt: skip
                for name, (wall, cores) in parts.items():
                    figures[side].setdefault(f"{name} wall", []).append(wall)
                    figures[side].setdefault(f"{name} cores", []).append(cores)
                figures[side].setdefault("wall", []).append(end - start)
                figures[side].setdefault("cpu", []).append(found["cpu"])
                print(f"round {round_} {side}, load {loads[-1]:.1f}: wall {end - start:.2f}, cpu {found['cpu']:.2f}, "
                      + ", ".join(f"{n} {w:.2f} s at {c:.2f} cores" for n, (w, c) in parts.items()), flush=True)
                if args.show:
                    show(rows)
    print(f"\nload {min(loads):.1f}-{max(loads):.1f}; min/median/max")
    print("| | " + " | ".join(sides) + " |\n|---|" + "---|" * len(sides))
    for key in figures["before"]:
        print(f"| {key} | " + " | ".join(spread(figures[side][key], "{:.2f}") for side in sides) + " |")


if __name__ == "__main__":
    main()
