"""Where a single-process ``tokenize`` run's time goes, thread by thread: before against after, alternated.

Run: ``python benchmarks/bench_tokenize_timeline.py --before /work/main --after . --corpus C.jsonl --tokenizer T.json
[--rounds 5] [--engine auto|fastokens]`` (the corpus and tokenizer of ``bench_tokenize.py``). Each round runs each
checkout in a fresh process (``PYTHONPATH`` set to it, from ``/``), sides alternated, and times
``tokformats.tokenize(corpus, tokenizer, out, "megatron", engine=...)``: its wall seconds, the process's CPU seconds
(``getrusage(RUSAGE_SELF)``: every thread), and ``time.perf_counter`` stamps around the pipeline's phases (the
functions are wrapped in the child, found where the checkout has them: they are private and may move):

- main thread: the encode phase (``encode_partition``), inside it the engine, the check against ``tokenizers`` (in
  line before; the comparison, waiting included, after), end-of-document ids, spooling, and the time it waited for
  the reader (``queue.get``); the set-up (tokenizer load, ``Encoder``: the gate) and the publish;
- the reader thread: the time it was blocked on a full queue (``put``): the parse is the bottleneck only if this is
  near zero;
- the reference's encodes, and the engine's selection (``_gated_engine``: loading and gating it), in whichever
  thread; ``gate (Encoder)`` is what the main thread spends building the ``Encoder`` (the selection itself before
  it ran in a thread of its own);
- ``first sample read ahead``: reading the first sample before the gate (``tok5``: its reference encoding then runs
  beside the gate, inside ``reference encodes``); ``checkpoints``: the run's checkpoints, the last one's fsync and
  read-back of the ids included.

Each child is given 600 s (a hung run stops the benchmark instead of stalling it).

Prints each run, then min/median/max per side; the two sides' ``.bin``/``.idx`` must be byte-identical.
"""

from __future__ import annotations

import filecmp
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import compile_checkout, run_in_checkout, spread, two_checkouts_parser

CHILD = r"""
import collections, importlib, json, os, queue, resource, sys, threading, time
import tokformats
spent = collections.defaultdict(float)

def timed(name, function):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            spent[name] += time.perf_counter() - start
    return wrapper

# The first of the names (module.attribute or module.Class.attribute, under tokformats.tokenization) that this
# checkout has, as (owner, attribute): the pipeline was one module before it was split into several.
def place(*names):
    for name in names:
        module, *path, attribute = name.split(".")
        try:
            owner = importlib.import_module("tokformats.tokenization." + module)
        except ImportError:
            continue
        for part in path:
            owner = getattr(owner, part, None)
        if owner is not None and hasattr(owner, attribute):
            return owner, attribute
    return None, None

reading, read_name = place("partition_run.read_batches", "pipeline._batches")
batches = getattr(reading, read_name)
def reader(records, size, out, stop, counters, *rest):
    out.put = timed("reader blocked on a full queue", out.put)
    batches(records, size, out, stop, counters, *rest)
setattr(reading, read_name, reader)
get = queue.Queue.get
def main_get(self, *args, **kwargs):
    if threading.current_thread() is threading.main_thread():
        return timed("main waiting for the reader", get)(self, *args, **kwargs)
    return get(self, *args, **kwargs)
queue.Queue.get = main_get
for names, label in [
    (("pipeline.encode_partition", "pipeline._encode_partition"), "encode phase"),
    (("pipeline.write_outputs", "pipeline._write_outputs"), "publish"),
    (("pipeline.load_tokenizer",), "tokenizer load"), (("pipeline.Encoder.__init__",), "gate (Encoder)"),
    (("engines.FastokensEngine.encode",), "fastokens"), (("engines.TokenizersEngine.encode",), "reference encodes"),
    (("pipeline.Encoder._compare",), "check compared (waits included)"),
    (("partition_run._add_eos", "pipeline._add_eos"), "end-of-document ids"),
    (("partition_run._PartitionRun._spool", "pipeline._PartitionRun._spool"), "spooling"),
    (("encoder._gated_engine", "pipeline._gated_engine"), "engine selection (any thread)"),
    (("pipeline._first_sample",), "first sample read ahead"),
    (("partition_run._PartitionRun.save", "pipeline._PartitionRun.save"), "checkpoints"),
]:
    owner, name = place(*names)
    if owner is not None:
        setattr(owner, name, timed(label, getattr(owner, name)))
before = resource.getrusage(resource.RUSAGE_SELF)
start = time.perf_counter()
tokformats.tokenize(sys.argv[1], sys.argv[2], sys.argv[3], "megatron", progress=False, overwrite=True,
                    engine=sys.argv[4])
wall = time.perf_counter() - start
after = resource.getrusage(resource.RUSAGE_SELF)
cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
print(json.dumps({"wall": wall, "cpu": cpu, **spent, "file": tokformats.__file__}))
"""

SHOWN = ["wall", "cpu", "first sample read ahead", "gate (Encoder)", "engine selection (any thread)", "encode phase",
         "fastokens", "check compared (waits included)", "reference encodes",
         "main waiting for the reader", "reader blocked on a full queue", "checkpoints", "publish"]  # fmt: skip


def main() -> None:
    parser = two_checkouts_parser(__doc__, rounds=5)
    parser.add_argument("--engine", default="auto", choices=["auto", "fastokens"])
    args = parser.parse_args()
    sides = {"before": args.before.resolve(), "after": args.after.resolve()}
    for checkout in sides.values():
        compile_checkout(checkout)
    runs: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    loads: list[float] = []
    with tempfile.TemporaryDirectory() as folder:
        for round_ in range(args.rounds):
            for side in list(sides) if round_ % 2 == 0 else list(sides)[::-1]:
                loads.append(os.getloadavg()[0])
                argv = [str(args.corpus.resolve()), str(args.tokenizer.resolve()), f"{folder}/{side}/c", args.engine]
                found = run_in_checkout(CHILD, argv, sides[side])
                runs[side].append(found)
                print(f"round {round_} {side}, load {loads[-1]:.1f}: "
                      + ", ".join(f"{k} {found.get(k, 0.0):.2f}" for k in SHOWN), flush=True)  # fmt: skip
        for suffix in (".bin", ".idx"):
            a, b = (Path(f"{folder}/{side}/c_text_document{suffix}") for side in sides)
            if not filecmp.cmp(a, b, shallow=False):
                raise SystemExit(f"{a.name} differs between the checkouts")
    print(f"\nengine={args.engine}, load {min(loads):.1f}-{max(loads):.1f}; seconds min/median/max")
    print("| phase | " + " | ".join(sides) + " |\n|---|" + "---|" * len(sides))
    for key in SHOWN:
        cells = [spread([run.get(key, 0.0) for run in runs[side]], "{:.2f}") for side in sides]
        print(f"| {key} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
