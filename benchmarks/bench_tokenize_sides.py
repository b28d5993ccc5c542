"""Before against after: ``tokenize`` JSONL -> Megatron from two checkouts, against fastokens alone, in fresh
processes, alternating sides round after round.

Run: ``python benchmarks/bench_tokenize_sides.py --before /work/main --after . --corpus C.jsonl --tokenizer T.json
[--rounds 3]`` (the corpus and tokenizer of ``bench_tokenize.py``). Sides, each in a new process:

- ``alone``: fastokens' ``encode_batch_flat`` on the texts parsed beforehand (batches of 1,000; the parse, imports and
  the engine's load not timed);
- ``before`` / ``after``: ``tokformats.tokenize(corpus, tokenizer, out, "megatron")`` with ``PYTHONPATH`` set to the
  checkout, timed from before ``import tokformats`` (the tokenizer load and the engine gate included);
- ``after, no gate cache``: the same with ``TOKFORMATS_GATE_CACHE=off`` (a first run's set-up).

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
from common import installed_env, spread, two_checkouts_parser

ALONE = r"""
import sys, time, orjson, fastokens
texts = [orjson.loads(line)["text"] for line in open(sys.argv[1], "rb")]
tokenizer = fastokens.Tokenizer.from_json_str(open(sys.argv[2], encoding="utf-8").read())
cpu, wall = time.process_time(), time.perf_counter()
for k in range(0, len(texts), 1000):
    tokenizer.encode_batch_flat(texts[k : k + 1000], add_special_tokens=False, split_special_tokens=False)
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
    args = parser.parse_args()
    sides = ["alone", "before", "after", "after, no gate cache"]
    results: dict[str, list[tuple[float, float, float]]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory() as folder:
        outputs = {"before": Path(folder) / "before" / "c", "after": Path(folder) / "after" / "c"}
        for round_ in range(args.rounds):
            for side in sides if round_ % 2 == 0 else sides[::-1]:
                load = os.getloadavg()[0]
                env = installed_env()  # bytecode cached, as installed: compiling is no part of a run
                if side == "alone":
                    wall, cpu = map(float, child(ALONE, [str(args.corpus), str(args.tokenizer)], env))
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
            assert filecmp.cmp(a, b, shallow=False), f"{a.name} differs between the checkouts"
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
