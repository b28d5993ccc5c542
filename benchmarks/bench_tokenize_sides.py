"""Before against after: ``tokenize`` JSONL -> Megatron from two checkouts, against fastokens alone, in fresh
processes, alternating sides round after round.

Run: ``python benchmarks/bench_tokenize_sides.py --before /work/main --after . --corpus C.jsonl --tokenizer T.json
[--rounds 3]`` (the corpus and tokenizer of ``bench_tokenize.py``). Sides, each in a new process:

- ``alone``: fastokens' ``encode_batch_flat`` on the texts parsed beforehand (batches of 1,000; the parse, imports and
  the engine's load not timed);
- ``before`` / ``after``: ``tokformats.tokenize(corpus, tokenizer, out, "megatron")`` with ``PYTHONPATH`` set to the
  checkout, timed from before ``import tokformats`` (the tokenizer load and the engine gate included);
- ``after, no gate cache``: the same with ``TOKFORMATS_GATE_CACHE=off`` (a first run's set-up).
- ``floor`` (``--floor``): the least a run doing the same work can cost, written out here with no library: timed
  from before its imports, both tokenizers loaded (fastokens' in a thread), a reader thread parsing the JSONL with
  orjson into batches, fastokens encoding each batch, ``tokenizers`` re-encoding the same check as ``tokenize``'s
  (the first MiB of text, then about 1 MiB drawn across the input) in a thread of its own, each document ended by
  EOS and every id written once to one file, fsynced; no spools, hashes, index, provenance or checkpoints. Its ids
  are the ``.bin``'s (checked). Against ``alone``, it shows what two cores allow for the job with the check kept.

Children run with bytecode caching on (``common.installed_env``), as an installed package would.

Wall seconds and the process's CPU seconds (every thread) per run, the 1-minute load average before each, then
min/median/max per side; the two checkouts' ``.bin``/``.idx`` must be byte-identical.
"""

from __future__ import annotations

import filecmp
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import compile_checkout, installed_env, spread, two_checkouts_parser

ALONE = r"""
import sys, time, orjson, fastokens
texts = [orjson.loads(line)["text"] for line in open(sys.argv[1], "rb")]
tokenizer = fastokens.Tokenizer.from_json_str(open(sys.argv[2], encoding="utf-8").read())
cpu, wall = time.process_time(), time.perf_counter()
for k in range(0, len(texts), 1000):
    tokenizer.encode_batch_flat(texts[k : k + 1000], add_special_tokens=False, split_special_tokens=False)
print(time.perf_counter() - wall, time.process_time() - cpu)
"""

FLOOR = r"""
import sys, time
cpu, wall = time.process_time(), time.perf_counter()
import os, queue, threading
from concurrent.futures import ThreadPoolExecutor
import numpy as np, orjson, fastokens, tokenizers
corpus, tokenizer_path, output = sys.argv[1:4]
text = open(tokenizer_path, encoding="utf-8").read()
loading = ThreadPoolExecutor(1)
fast = loading.submit(fastokens.Tokenizer.from_json_str, text)  # overlaps the reference's load and the first batch
reference = tokenizers.Tokenizer.from_str(text)
eos = reference.token_to_id("<|endoftext|>")  # tokformats' default for such a tokenizer
if eos is None:
    raise SystemExit("the floor knows the end-of-text id of tokenizers that have <|endoftext|> only")
dtype = np.uint16 if reference.get_vocab_size() < 65500 else np.int32  # Megatron's rule, as tokformats applies it
batches = queue.Queue(4)

def read():
    batch, size = [], 0
    with open(corpus, "rb") as lines:
        for line in lines:
            batch.append(orjson.loads(line)["text"])
            size += len(batch[-1])
            if len(batch) == 1000 or size >= 1 << 20:  # tokformats' batches: 1,000 documents or 1 MiB of text
                batches.put(batch)
                batch, size = [], 0
    batches.put(batch)
    batches.put(None)

threading.Thread(target=read, daemon=True).start()
verifier, checks = ThreadPoolExecutor(1), []
rate = min(0.01, (1 << 20) / os.path.getsize(corpus))
draws, first = np.random.default_rng(0), 1 << 20
fast = fast.result()
with open(output, "wb") as out:
    while (batch := batches.get()) is not None:
        if first > 0:  # the first MiB of text, then about 1 MiB drawn across the input
            sizes = np.cumsum([len(t) for t in batch])
            chosen = np.arange(max(1, int(np.searchsorted(sizes, first, side="right"))))
            first -= int(sizes[len(chosen) - 1])
        else:
            chosen = np.flatnonzero(draws.random(len(batch)) < rate)
        picked = [batch[k] for k in chosen.tolist()]
        expected = verifier.submit(lambda p: [e.ids for e in reference.encode_batch_fast(p, add_special_tokens=False)],
                                   picked) if picked else None
        ids, offsets = fast.encode_batch_flat(batch, add_special_tokens=False, split_special_tokens=False)
        flat, bounds = np.frombuffer(ids, dtype="<u4"), np.frombuffer(offsets, dtype="<u8").astype(np.int64)
        if expected is not None:
            checks.append((expected, [flat[bounds[k] : bounds[k + 1]].copy() for k in chosen.tolist()]))
        ends = bounds[1:][np.diff(bounds) > 0]  # Megatron's preprocess_data ends no empty document
        out.write(np.insert(flat, ends, eos).astype(dtype).data)  # each document ended by EOS, written once
    for expected, found in checks:
        if any(list(a) != b.tolist() for a, b in zip(expected.result(), found)):
            raise SystemExit("fastokens differs from tokenizers")
    out.flush()
    os.fsync(out.fileno())
print(time.perf_counter() - wall, time.process_time() - cpu)
"""

RUN = r"""
import sys, time
cpu, wall = time.process_time(), time.perf_counter()
import tokformats
summary = tokformats.tokenize(sys.argv[1], sys.argv[2], sys.argv[3], "megatron", progress=False, overwrite=True)
print(time.perf_counter() - wall, time.process_time() - cpu, summary["engine"], tokformats.__file__)
"""


def child(code: str, args: list[str], env: dict[str, str]) -> list[str]:
    # Run from the file system's root: ``python -c`` puts the working folder first on sys.path, and a checkout
    # there would be imported whatever PYTHONPATH says.
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, check=False,
                         cwd="/")  # fmt: skip
    if out.returncode:
        raise SystemExit(out.stderr)
    return out.stdout.split()


def main() -> None:
    parser = two_checkouts_parser(__doc__, rounds=3)
    parser.add_argument("--floor", action="store_true", help="add the floor side (see above)")
    args = parser.parse_args()
    sides = ["alone", "before", "after", "after, no gate cache"] + (["floor"] * args.floor)
    results: dict[str, list[tuple[float, float, float]]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory() as folder:
        outputs = {"before": Path(folder) / "before" / "c", "after": Path(folder) / "after" / "c"}
        for checkout in (args.before, args.after):
            compile_checkout(checkout)
        for round_ in range(args.rounds):
            for side in sides if round_ % 2 == 0 else sides[::-1]:
                load = os.getloadavg()[0]
                env = installed_env()  # bytecode cached, as installed: compiling is no part of a run
                if side == "alone":
                    wall, cpu = map(float, child(ALONE, [str(args.corpus), str(args.tokenizer)], env))
                    engine = "fastokens"
                elif side == "floor":
                    floor_ids = str(Path(folder) / "floor.ids")
                    wall, cpu = map(float, child(FLOOR, [str(args.corpus), str(args.tokenizer), floor_ids], env))
                    engine = "fastokens"
                else:
                    env["PYTHONPATH"] = str((args.before if side == "before" else args.after).resolve())
                    if side == "after, no gate cache":
                        env["TOKFORMATS_GATE_CACHE"] = "off"
                    target = outputs["before" if side == "before" else "after"]
                    found = child(RUN, [str(args.corpus), str(args.tokenizer), str(target)], env)
                    wall, cpu, engine = float(found[0]), float(found[1]), found[2]
                    if not Path(found[3]).resolve().is_relative_to(Path(env["PYTHONPATH"])):
                        raise SystemExit(f"{side} imported {found[3]}, not the checkout {env['PYTHONPATH']}")
                results[side].append((wall, cpu, load))
                print(f"round {round_} {side}: wall {wall:.2f} s, CPU {cpu:.2f} s, load {load:.1f}, {engine}",
                      flush=True)  # fmt: skip
        for suffix in (".bin", ".idx"):
            a, b = (Path(f"{outputs[s]}_text_document{suffix}") for s in ("before", "after"))
            if not filecmp.cmp(a, b, shallow=False):
                raise SystemExit(f"{a.name} differs between the checkouts")
        if args.floor:
            floor_bin = Path(folder) / "floor.ids"
            after_bin = f"{outputs['after']}_text_document.bin"
            if not filecmp.cmp(floor_bin, after_bin, shallow=False):
                raise SystemExit("the floor's ids differ from the .bin")
    print("\n| side | wall s min/med/max | CPU s min/med/max | load | x alone (wall medians) |\n|---|---|---|---|---|")
    alone = sorted(w for w, _, _ in results["alone"])[len(results["alone"]) // 2]
    for side, runs in results.items():
        walls = [w for w, _, _ in runs]
        ratio = alone / sorted(walls)[len(walls) // 2]
        loads = [load for _, _, load in runs]
        cpu = spread([c for _, c, _ in runs], "{:.2f}")
        print(f"| {side} | {spread(walls, '{:.2f}')} | {cpu} | {min(loads):.1f}-{max(loads):.1f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
