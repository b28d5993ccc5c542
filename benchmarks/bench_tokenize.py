"""tokformats.tokenize end to end against the encoders alone and against Megatron-LM's preprocess_data.py.

Run: ``python benchmarks/bench_tokenize.py [--megabytes 220] [--tokenizer FILE] [--megatron-lm DIR] [--repeat 3]``.

The corpus is real text on every machine: the ``.py``, ``.rst`` and ``.txt`` files under Python's library folder
(standard library first, then installed packages), one document per file, written once as JSONL (and gzipped
JSONL). The tokenizer is ``--tokenizer`` (a byte-level BPE ``tokenizer.json``) or a 32,000-token byte-level BPE
trained on the first 20 MB. In the same process, on the same cores, alternating and repeated:

(a)  ``tokenizers``' ``encode_batch_fast`` alone on the pre-loaded texts, batches of 1,000 (the pipeline's size);
(a') ``fastokens``' ``encode_batch_flat`` alone, the same batches;
(b)  ``tokformats.tokenize`` ``.jsonl`` -> megatron, ``engine="auto"`` (in this process: from the second run on,
     the engine gate's result for this tokenizer is reused, as in any process that tokenizes more than once);
(b1) the same in a fresh process each time (the tokenizer load and the gate paid every time, as on the command
     line); the run's own seconds, interpreter start and imports excluded;
(c)  the same from ``.jsonl.gz``.

``--chat`` measures chat data instead (``--megabytes`` defaults to 30 there): the same texts cut into multi-turn
conversations (``messages`` JSONL, system/user/assistant, some thoughts), side by side, alternating and repeated:

(p)  the plain-text pipeline on the same message texts (one JSONL record per conversation, its texts joined) ->
     datatrove;
(q)  ``tokformats.tokenize(chat="messages")`` -> datatrove with ``.ds.loss`` masks;
     (p) and (q) also report this process's CPU seconds (all its threads): steadier than wall time under load;
(r)  the usual hand-written route on a sample of the conversations (TRL / Megatron ``SFTTokenizer`` style): the
     chat template rendered with Jinja as ``transformers`` renders it, the whole conversation encoded, and every
     prefix rendered and encoded to find the turns' spans, then written to datatrove with masks.

Then once each: (b) into every other format, (b) with ``engine="tokenizers"``, and (d) Megatron-LM's
``tools/preprocess_data.py --workers 2 --append-eod`` (``--megatron-lm``: a checkout of Megatron-LM at tag
``core_v0.16.1``, e.g. ``git clone -b core_v0.16.1 https://github.com/NVIDIA/Megatron-LM``; it needs torch, triton,
nltk and regex) with its GPT-2 BPE tokenizer on the same vocabulary and merges; its ``.bin``/``.idx`` must be
byte-identical to (b)'s. Peak RSS of (b) is measured in fresh processes on the corpus and on 5x it.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, scratch, table

import tokformats
from tokformats.api import corpus_writers
from tokformats.core.vocab import SPECIAL_TOKENS
from tokformats.tokenization.engines import FastokensEngine, TokenizersEngine
from tokformats.tokenization.tokenizer import load_tokenizer


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
    """The files as JSONL, one document each, leaving out the few that spell a special token (``<|endoftext|>`` in
    tokenizer code): ``tokenizers`` reads those as the special token and Megatron-LM's GPT-2 BPE as text, so (d)
    and (b) would differ by design, not by either pipeline."""
    jsonl, gz = folder / f"corpus{repeat}.jsonl", folder / f"corpus{repeat}.jsonl.gz"
    size = 0
    with open(jsonl, "w", encoding="utf-8") as out:
        for _ in range(repeat):
            for path in files:
                text = path.read_text(encoding="utf-8", errors="replace")
                if any(token in text for token in SPECIAL_TOKENS):
                    continue
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


FRESH_CHILD = r"""
import sys, tokformats
summary = tokformats.tokenize(sys.argv[1], sys.argv[2], sys.argv[3], "megatron", progress=False, overwrite=True)
print(summary["seconds"], summary["engine"])
"""


def fresh_tokenize(jsonl: Path, tokenizer: Path, output: Path) -> float:
    """(b) in a new process, as the command line runs it: the tokenizer load and the engine gate are paid again
    (in one process, later runs reuse the gate's result for the same tokenizer); the run's own seconds."""
    out = subprocess.run(
        [sys.executable, "-c", FRESH_CHILD, str(jsonl), str(tokenizer), str(output)],
        check=True,
        capture_output=True,
        text=True,
    )
    seconds, engine = out.stdout.split()
    assert engine in ("fastokens", "splintr"), engine
    return float(seconds)


def encode_all(engine: Any, texts: list[str]) -> int:
    tokens = 0
    for k in range(0, len(texts), 1000):
        flat, _ = engine.encode(texts[k : k + 1000])
        tokens += len(flat)
    return tokens


def timed(function: Callable[..., Any], *args: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    result = function(*args)
    return time.perf_counter() - started, result


def spread(values: list[float]) -> str:
    return f"{min(values):.2f}/{statistics.median(values):.2f}/{max(values):.2f}"


def megatron_lm(checkout: Path, jsonl: Path, tokenizer_path: Path, prefix: Path, workers: int) -> float:
    """Run Megatron-LM's preprocess_data.py (its GPT-2 BPE on the tokenizer's vocabulary and merges); seconds."""
    from tokenizers import Tokenizer

    vocab = prefix.parent / "megatron-lm-vocab"
    vocab.mkdir(parents=True, exist_ok=True)
    Tokenizer.from_file(str(tokenizer_path)).model.save(str(vocab))
    command = [
        sys.executable, str(checkout / "tools" / "preprocess_data.py"), "--input", str(jsonl),
        "--output-prefix", str(prefix), "--tokenizer-type", "GPT2BPETokenizer", "--legacy-tokenizer",
        "--vocab-file", str(vocab / "vocab.json"), "--merge-file", str(vocab / "merges.txt"),
        "--workers", str(workers), "--append-eod", "--log-interval", "1000000",
    ]  # fmt: skip
    environment = {**os.environ, "PYTHONPATH": str(checkout)}
    started = time.perf_counter()
    subprocess.run(command, check=True, env=environment, capture_output=True)
    return time.perf_counter() - started


CHATML_JINJA = (
    "{% for m in messages %}<|im_start|>"
    "{% if m.role == 'system' %}<|system|>{% elif m.role == 'user' %}<|user|>"
    "{% elif m.role == 'assistant' %}<|assistant|>{% else %}{{ m.role }}{% endif %}{{ '\\n' }}"
    "{% if m.reasoning_content is defined %}<|thought|>{{ m.reasoning_content }}<|/thought|>{{ '\\n' }}{% endif %}"
    "{{ m.content }}<|im_end|>{{ '\\n' }}{% endfor %}"
)


def write_chats(folder: Path, files: list[Path]) -> tuple[Path, Path, int, int]:
    """Conversations cut from the texts (paragraphs as turns, 2-8 turns, a system turn and a thought now and then),
    as ``messages`` JSONL, and the same texts as plain JSONL (one record per conversation); message bytes and
    conversations."""
    chats, plain = folder / "chats.jsonl", folder / "plain.jsonl"
    size = count = 0
    with open(chats, "w", encoding="utf-8") as out, open(plain, "w", encoding="utf-8") as flat:
        for n, path in enumerate(files):
            text = path.read_text(encoding="utf-8", errors="replace")
            if any(token in text for token in SPECIAL_TOKENS):
                continue
            turns = [t for t in text.split("\n\n") if t.strip()]
            while turns:
                take, turns = turns[: 2 + n % 7], turns[2 + n % 7 :]
                messages = [{"role": "system", "content": "Answer as the file would."}] if n % 3 == 0 else []
                for k, turn in enumerate(take):
                    message = {"role": "user" if k % 2 == 0 else "assistant", "content": turn}
                    if k % 2 and n % 4 == 0:
                        message["reasoning_content"] = take[k - 1][:80]
                    messages.append(message)
                texts = [m["content"] for m in messages] + [m.get("reasoning_content", "") for m in messages]
                size += sum(len(t.encode("utf-8")) for t in texts)
                count += 1
                out.write(json.dumps({"messages": messages}) + "\n")
                flat.write(json.dumps({"text": "\n".join(texts)}) + "\n")
    return chats, plain, size, count


def hand_written(chats: Path, tokenizer_path: Path, output: Path, limit: int) -> tuple[float, int, int]:
    """The usual route on the first ``limit`` conversations: Jinja render (as transformers' apply_chat_template),
    encode, spans from every rendered prefix; written to datatrove with masks. (seconds, conversations, bytes)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    template = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(CHATML_JINJA)
    header = len(tokenizer.encode("<|im_start|><|assistant|>\n", add_special_tokens=False).ids)
    with open(chats, encoding="utf-8") as handle:
        conversations = [json.loads(line)["messages"] for _, line in zip(range(limit), handle)]
    size = sum(len(m["content"].encode("utf-8")) + len(m.get("reasoning_content", "").encode()) for c in conversations
               for m in c)  # fmt: skip
    started = time.perf_counter()
    with tokformats.create(output, format="datatrove", vocab_size=tokenizer.get_vocab_size(), overwrite=True) as w:
        for messages in conversations:
            ids = tokenizer.encode(template.render(messages=messages), add_special_tokens=False).ids
            mask = [0] * len(ids)
            start = 0
            for k, message in enumerate(messages):
                end = len(tokenizer.encode(template.render(messages=messages[: k + 1]), add_special_tokens=False).ids)
                if message["role"] == "assistant":
                    mask[start + header : end - 1] = [1] * max(end - 1 - start - header, 0)
                start = end
            w.write(ids, loss_mask=mask)
    return time.perf_counter() - started, len(conversations), size


def chat_main(args: argparse.Namespace) -> None:
    """(p), (q) alternating ``--repeat`` times, and (r) on a sample; prints one table."""
    folder = scratch("tokenize-chat")
    files = corpus_files(args.megabytes)
    chats, plain, size, count = write_chats(folder, files)
    tokenizer_path = folder / "tokenizer.json"
    if args.tokenizer:
        shutil.copy(args.tokenizer, tokenizer_path)
    else:
        sample = [f.read_text(encoding="utf-8", errors="replace") for f in files[:400]]
        tokformats.train_tokenizer(sample, 32000, progress=False).save(str(tokenizer_path))
    times: dict[str, list[float]] = {"p": [], "q": []}
    cpu: dict[str, list[float]] = {"p": [], "q": []}  # this process's CPU seconds (all threads): steadier under load
    for _ in range(args.repeat):
        for key, source, chat in (("p", plain, None), ("q", chats, "messages")):
            started = time.process_time()
            summary = tokformats.tokenize(source, tokenizer_path, folder / "out" / key, "datatrove", progress=False,
                                          overwrite=True, chat=chat)  # fmt: skip
            cpu[key].append(time.process_time() - started)
            times[key].append(summary["seconds"])
    seconds, sampled, sampled_bytes = hand_written(chats, tokenizer_path, folder / "out" / "r.ds", args.chat_sample)
    rows = []
    for key, label in (("p", "(p) plain text pipeline -> datatrove"), ("q", "(q) tokenize chat=messages -> datatrove")):
        median = statistics.median(times[key])
        rows.append({"run": label, "seconds min/med/max": spread(times[key]), "MB/s": f"{size / median / 1e6:.1f}",
                     "conversations/s": f"{count / median:,.0f}",
                     "x (p)": f"{statistics.median(times['p']) / median:.2f}",
                     "CPU s min/med/max": spread(cpu[key]),
                     "x (p), CPU": f"{statistics.median(cpu['p']) / statistics.median(cpu[key]):.2f}"})  # fmt: skip
    label = f"(r) hand-written route, first {sampled:,} conversations"
    rows.append({"run": label, "seconds min/med/max": f"{seconds:.2f}", "CPU s min/med/max": "", "x (p), CPU": "",
                 "MB/s": f"{sampled_bytes / seconds / 1e6:.2f}", "conversations/s": f"{sampled / seconds:,.0f}",
                 "x (p)": f"(q)/(r) = {count / statistics.median(times['q']) / (sampled / seconds):.1f}x"})  # fmt: skip
    print(f"machine: {machine()}; {count:,} conversations, {size / 1e6:.1f} MB of message text; "
          f"{args.repeat} alternating repeats\n")  # fmt: skip
    print(table(rows))
    shutil.rmtree(folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--megabytes", type=float, default=None, help="corpus size (default 220; 30 with --chat)")
    parser.add_argument("--chat", action="store_true", help="measure chat data: (p), (q), (r) above")
    parser.add_argument("--chat-sample", type=int, default=2000, help="conversations (r) runs on (default 2000)")
    parser.add_argument("--tokenizer", type=Path, help="a byte-level BPE tokenizer.json (default: train a 32k one)")
    parser.add_argument("--megatron-lm", type=Path, help="a Megatron-LM checkout (tag core_v0.16.1) for (d)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-formats", action="store_true", help="only megatron for (b)")
    parser.add_argument("--skip-rss", action="store_true")
    parser.add_argument("--skip-tokenizers", action="store_true",
                        help="leave out (a) and (b) with engine=tokenizers (the slow reference: minutes per run)")
    args = parser.parse_args()
    if args.chat:
        args.megabytes = args.megabytes or 30
        chat_main(args)
        return
    args.megabytes = args.megabytes or 220
    folder = scratch("tokenize")
    files = corpus_files(args.megabytes)
    jsonl, gz, text_bytes = write_corpus(folder, files)
    with open(jsonl, encoding="utf-8") as handle:
        texts = [json.loads(line)["text"] for line in handle]
    tokenizer_path = folder / "tokenizer.json"
    if args.tokenizer:
        shutil.copy(args.tokenizer, tokenizer_path)
    else:
        sample, size = [], 0
        for text in texts:
            sample.append(text)
            size += len(text)
            if size > 20e6:
                break
        tokformats.train_tokenizer(sample, 32000, progress=False).save(str(tokenizer_path))
    tokenizer = load_tokenizer(tokenizer_path)
    reference, fast = TokenizersEngine(tokenizer), FastokensEngine(tokenizer.to_str())

    times: dict[str, list[float]] = {"a": [], "a'": [], "b": [], "b1": [], "c": []}
    tokens = 0
    for _ in range(args.repeat):  # alternate the sides so that machine noise hits all alike
        if not args.skip_tokenizers:
            seconds, tokens = timed(encode_all, reference, texts)
            times["a"].append(seconds)
        seconds, fast_tokens = timed(encode_all, fast, texts)
        times["a'"].append(seconds)
        assert args.skip_tokenizers or fast_tokens == tokens
        tokens = fast_tokens
        for label, source in (("b", jsonl), ("c", gz)):
            summary = tokformats.tokenize(source, tokenizer_path, folder / "out" / "mega", "megatron", progress=False,
                                          overwrite=True)  # fmt: skip
            assert summary["engine"] in ("fastokens", "splintr"), summary["engine_reason"]
            times[label].append(summary["seconds"])
        times["b1"].append(fresh_tokenize(jsonl, tokenizer_path, folder / "out" / "fresh"))
    documents = len(texts)
    del texts
    times = {key: values for key, values in times.items() if values}
    medians = {key: statistics.median(values) for key, values in times.items()}
    encoders, fast_alone = medians.get("a", float("nan")), medians["a'"]
    rows = []
    names = {"a": "(a) encode_batch_fast alone", "a'": "(a') fastokens alone", "b": "(b) tokenize .jsonl -> megatron",
             "b1": "(b) in a fresh process each time", "c": "(c) tokenize .jsonl.gz -> megatron"}  # fmt: skip
    for key, label in names.items():
        if key not in medians:
            continue
        median = medians[key]
        rows.append({
            "run": label, "seconds min/med/max": spread(times[key]), "MB/s": f"{text_bytes / median / 1e6:.1f}",
            "Mtokens/s": f"{tokens / median / 1e6:.2f}", "docs/s": f"{documents / median:,.0f}",
            "x (a)": f"{encoders / median:.2f}", "x (a')": f"{fast_alone / median:.2f}",
        })  # fmt: skip
    once = [] if args.skip_tokenizers else [("engine=tokenizers", "megatron", "tokenizers")]
    if not args.skip_formats:
        once += [(f"-> {name}", name, "auto") for name in sorted(corpus_writers()) if name != "megatron"]
    for label, name, engine in once:
        summary = tokformats.tokenize(jsonl, tokenizer_path, folder / "out" / name, name, progress=False,
                                      overwrite=True, engine=engine)  # fmt: skip
        seconds = summary["seconds"]
        rows.append({
            "run": f"(b) {label}", "seconds min/med/max": f"{seconds:.2f}", "MB/s": f"{text_bytes / seconds / 1e6:.1f}",
            "Mtokens/s": f"{summary['tokens'] / seconds / 1e6:.2f}", "docs/s": f"{documents / seconds:,.0f}",
            "x (a)": f"{encoders / seconds:.2f}", "x (a')": f"{fast_alone / seconds:.2f}",
        })  # fmt: skip
        print(rows[-1], flush=True)
    if args.megatron_lm:
        prefix = folder / "out" / "megatron-lm"
        seconds = megatron_lm(args.megatron_lm, jsonl, tokenizer_path, prefix, 2)
        ours = tokformats.tokenize(jsonl, tokenizer_path, folder / "out" / "mega", "megatron", progress=False,
                                   overwrite=True)  # fmt: skip
        identical = all(
            Path(f"{prefix}_text_document{s}").read_bytes() == Path(ours["outputs"]["text"]["path"] + s).read_bytes()
            for s in (".bin", ".idx")
        )
        rows.append({
            "run": "(d) Megatron-LM preprocess_data.py --workers 2", "seconds min/med/max": f"{seconds:.1f}",
            "MB/s": f"{text_bytes / seconds / 1e6:.2f}", "Mtokens/s": f"{tokens / seconds / 1e6:.3f}",
            "docs/s": f"{documents / seconds:,.0f}", "x (a)": f"{encoders / seconds:.2f}",
            "x (a')": f"(b)/(d) = {seconds / medians['b']:.1f}x; output identical: {identical}",
        })  # fmt: skip
    print(
        f"machine: {machine()}; corpus: {len(files):,} files, {text_bytes / 1e6:.0f} MB of text, {tokens:,} tokens "
        f"({tokenizer.get_vocab_size():,}-token tokenizer); {args.repeat} alternating repeats\n"
    )
    print(table(rows))
    if not args.skip_rss:
        big, _, _ = write_corpus(folder, files, repeat=5)
        one = peak_rss(jsonl, tokenizer_path, folder / "rss1" / "c")
        five = peak_rss(big, tokenizer_path, folder / "rss5" / "c")
        print(f"\npeak RSS of (b) -> megatron in a fresh process: {one:.0f} MB on the corpus, {five:.0f} MB on 5x it")
    shutil.rmtree(folder)


if __name__ == "__main__":
    main()
