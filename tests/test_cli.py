"""The command line as a user meets it (issue 11): no tracebacks, flags in messages, verify/stats/head/tail/sample,
--json everywhere it matters, help with an example for every subcommand."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import tokformats
from tokformats.cli import build_parser, main


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = main(args)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.fixture()
def corpus(tmp_path: Path) -> Path:
    with tokformats.create(tmp_path / "c", "megatron", vocab_size=50257) as writer:
        writer.write_batch(np.arange(1, 3001) % 50000 + 1, [1000, 1500, 500])
    return tmp_path / "c"


def test_every_subcommand_on_bad_input_gives_one_line_and_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tokenizer_path: Path
) -> None:
    (tmp_path / "garbage.bin").write_bytes(b"\x01\x02\x03")
    (tmp_path / "folder").mkdir()
    missing = str(tmp_path / "missing")
    bad_inputs = [
        ["info", missing],
        ["info", "--format", "llmc", str(tmp_path / "folder")],
        ["info", str(tmp_path / "garbage.bin")],
        ["verify", missing],
        ["stats", str(tmp_path / "garbage.bin")],
        ["head", missing],
        ["tail", missing, "-n", "2"],
        ["sample", missing],
        ["convert", missing, str(tmp_path / "out"), "--to", "raw"],
        ["merge", missing, "-o", str(tmp_path / "m")],
        ["train-tokenizer", missing, "--vocab-size", "300", "-o", str(tmp_path / "t.json")],
        ["tokenize", missing, "-t", str(tokenizer_path), "-o", str(tmp_path / "o")],
        ["tokenize", str(tmp_path / "garbage.bin"), "-t", missing, "-o", str(tmp_path / "o")],
        ["info", missing, "--format", "megatrn"],
    ]
    for args in bad_inputs:
        status, _, err = run(args, capsys)
        assert status == 2, args
        assert err.startswith("tokformats: error: ") and err.count("\n") <= 8 and "Traceback" not in err, (args, err)


def test_each_crash_from_the_issue(tmp_path: Path, capsys: pytest.CaptureFixture[str], tokenizer_path: Path) -> None:
    texts = tmp_path / "t.jsonl.gz"
    with gzip.open(texts, "wt") as handle:
        for k in range(60):
            handle.write(json.dumps({"text": f"hello world number {k} " * 4}) + "\n")
    # --split with commas now works; four ratios is refused, naming the flag.
    status, out, _ = run(
        ["tokenize", str(texts), "-t", str(tokenizer_path), "-o", str(tmp_path / "s"), "--split", "0.9,0.1"], capsys
    )
    assert status == 0 and "train" in out and "val" in out
    status, _, err = run(
        ["tokenize", str(texts), "-t", str(tokenizer_path), "-o", str(tmp_path / "s4"), "--split", "8:1:1:1"], capsys
    )
    assert status == 2 and "--split 8:1:1" in err
    # train-tokenizer reads .jsonl.gz like tokenize.
    status, out, _ = run(
        ["train-tokenizer", str(texts), "--vocab-size", "300", "-o", str(tmp_path / "tok.json"), "-q"], capsys
    )
    assert status == 0 and (tmp_path / "tok.json").exists()
    # A pt folder with a manifest and no shards.
    (tmp_path / "pt").mkdir()
    (tmp_path / "pt" / "manifest.json").write_text("{}")
    status, out, _ = run(["info", str(tmp_path / "pt")], capsys)
    assert status == 0 and "documents" in out
    # A folder of llm.c shards opens as the corpus, with --format or without.
    with tokformats.create(tmp_path / "shards" / "c", "llmc", vocab_size=50257, shard_size=100, bos=50256) as w:
        w.write_batch(np.arange(1, 301), [150, 150])
    for args in (["info", str(tmp_path / "shards")], ["info", "--format", "llmc", str(tmp_path / "shards")]):
        status, out, _ = run(args, capsys)
        assert status == 0 and "documents        2" in out.replace("documents  ", "documents  ")


def test_messages_name_flags_and_suggest(tmp_path: Path, corpus: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(["merge", str(corpus), str(corpus), "-o", str(corpus)], capsys)
    assert status == 2 and "pass --overwrite to replace" in err and "overwrite=True" not in err
    status, _, err = run(["info", str(corpus.parent / "missing"), "--format", "megatrn"], capsys)
    assert "Did you mean 'megatron'?" in err
    (corpus.parent / "owt_text_document.bin").write_bytes((corpus.parent / "c.bin").read_bytes())
    (corpus.parent / "owt_text_document.idx").write_bytes((corpus.parent / "c.idx").read_bytes())
    status, _, err = run(["info", str(corpus.parent / "owt")], capsys)
    assert status == 2 and f"Did you mean {corpus.parent / 'owt_text_document'}?" in err
    status, _, err = run(["convert", str(corpus), str(corpus.parent / "x"), "--to", "llmc"], capsys)
    assert status == 2 and "--to-bos ID" in err and "--drop-boundaries" in err and "bos=ID" not in err
    status, _, err = run(["convert", str(corpus), str(corpus.parent / "x.bin"), "--to", "raw", "--to-eos", "0"], capsys)
    assert status == 0


def test_convert_summary_says_how_to_read_it_back(corpus: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(["convert", str(corpus), str(corpus.parent / "r.bin"), "--to", "raw", "--to-eos", "0"], capsys)
    assert status == 0 and "wrote 3 documents, 3,003 tokens" in out and "--eos 0" in out
    status, out, _ = run(
        ["convert", str(corpus), str(corpus.parent / "j.bin"), "--to", "raw", "--to-eos", "0", "--json"], capsys
    )
    summary = json.loads(out)
    assert summary["documents"] == 3 and summary["read_with"] == {"format": "raw", "dtype": "uint16", "eos": 0}


def test_verify_exit_codes_and_json(tmp_path: Path, corpus: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(["verify", str(corpus)], capsys)
    assert status == 0 and out.strip().endswith("ok")
    status, out, _ = run(["verify", str(corpus), "--vocab-size", "2000", "--json"], capsys)
    report = json.loads(out)
    assert status == 1 and not report[0]["ok"]
    first = report[0]["problems"][0]
    assert first["field"] == "ids" and first["document"] == 1 and "not below vocab_size 2,000" in first["message"]
    idx = corpus.with_suffix(".idx")
    data = bytearray(idx.read_bytes())
    data[34 + 4 * 3 + 8 : 34 + 4 * 3 + 16] = (999).to_bytes(8, "little")  # sequence_pointers[1]
    idx.write_bytes(bytes(data))
    status, out, _ = run(["verify", str(corpus)], capsys)
    assert status == 1 and "sequence_pointers[1]: is 999" in out


def test_verify_checks_pt_manifest_checksums(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with tokformats.create(tmp_path / "p", "pt", tokens_per_shard=100) as writer:
        writer.write_batch(np.arange(250), [250])
    manifest = json.loads((tmp_path / "p" / "manifest.json").read_text())
    assert [s["shard_id"] for s in manifest["shards"]] == [0, 1, 2] and len(manifest["shards"][0]["hash"]) == 64
    assert manifest["version"] == 3 and manifest["tokens_per_shard"] == 100
    assert run(["verify", str(tmp_path / "p")], capsys)[0] == 0
    shard = tmp_path / "p" / "shard_1.pt"
    data = bytearray(shard.read_bytes())
    data[-200] ^= 1
    shard.write_bytes(bytes(data))
    status, out, _ = run(["verify", str(tmp_path / "p")], capsys)
    assert status == 1 and "shard_1.pt: hash: its SHA-256 differs" in out


def test_stats_in_terminal_and_json(corpus: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(["stats", str(corpus)], capsys)
    assert status == 0 and "3 documents, 3,000 tokens" in out and "length histogram" in out
    status, out, _ = run(["stats", str(corpus), "--json", "--top", "2"], capsys)
    result = json.loads(out)
    assert result["length"]["p50"] == 1000 and result["length"]["p100"] == 1500 and len(result["top_ids"]) == 2
    with tokformats.open(corpus) as reader:
        assert reader.stats(top=2) == result


def test_head_tail_sample_truncate_and_decode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tokenizer_path: Path
) -> None:
    summary = tokformats.tokenize(
        ["a short one", "x" * 5000, "the last document"], tokenizer_path, tmp_path / "t", "megatron", progress=False
    )
    path = next(iter(summary["outputs"].values()))["path"]
    status, out, _ = run(["head", path, "-n", "2", "-t", str(tokenizer_path), "--max-chars", "100"], capsys)
    assert status == 0 and "a short one" in out and "more characters; --max-chars 0 prints all" in out
    status, out, _ = run(["tail", path, "-n", "1", "-t", str(tokenizer_path)], capsys)
    assert "document 2 " in out and "the last document" in out
    status, first, _ = run(["sample", path, "-n", "2", "--seed", "3"], capsys)
    status, again, _ = run(["sample", path, "-n", "2", "--seed", "3"], capsys)
    assert first == again and "--- document" in first
    with tokformats.open(path) as reader:
        assert reader.decode(0, tokenizer_path).startswith("a short one")


def test_json_on_every_listed_command(
    tmp_path: Path, corpus: Path, capsys: pytest.CaptureFixture[str], tokenizer_path: Path
) -> None:
    assert isinstance(json.loads(run(["formats", "--json"], capsys)[1]), list)
    merged = json.loads(run(["merge", str(corpus), str(corpus), "-o", str(tmp_path / "m"), "--json"], capsys)[1])
    assert merged["documents"] == 6
    text = tmp_path / "in.txt"
    text.write_text("one\ntwo\n")
    summary = json.loads(
        run(["tokenize", str(text), "-t", str(tokenizer_path), "-o", str(tmp_path / "k"), "--json"], capsys)[1]
    )
    assert summary["documents"] == 2


def test_help_has_text_for_every_flag_and_an_example() -> None:
    parser = build_parser()
    (commands,) = [a for a in parser._actions if hasattr(a, "choices") and isinstance(a.choices, dict)]
    for name, sub in commands.choices.items():
        assert "example:\n  tokformats " in (sub.epilog or ""), name
        for action in sub._actions:
            if action.option_strings and action.dest != "help":
                assert action.help, (name, action.option_strings)
            if not action.option_strings and action.dest not in ("help",):
                assert action.help, (name, action.dest)


def test_stale_work_folder_overwrite_and_mismatch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tokenizer_path: Path
) -> None:
    text = tmp_path / "in.jsonl"
    text.write_text("".join(json.dumps({"text": f"line {k}"}) + "\n" for k in range(50)) + "{not json\n")
    with pytest.raises(tokformats.FormatError, match=r"in\.jsonl"):  # a failed run leaves its work folder
        tokformats.tokenize(text, tokenizer_path, tmp_path / "o", eos="prepend", batch_size=5, checkpoint_every=0)
    assert (tmp_path / "o.tokenize").exists()
    text.write_text("".join(json.dumps({"text": f"line {k}"}) + "\n" for k in range(50)))
    status, _, err = run(
        ["tokenize", str(text), "-t", str(tokenizer_path), "-o", str(tmp_path / "o"), "--resume"], capsys
    )
    assert status == 2 and "eos was 'prepend', now 'append'" in err and "--overwrite to start over" in err
    status, _, err = run(["tokenize", str(text), "-t", str(tokenizer_path), "-o", str(tmp_path / "o")], capsys)
    assert status == 2 and "--resume" in err
    status, out, _ = run(
        ["tokenize", str(text), "-t", str(tokenizer_path), "-o", str(tmp_path / "o"), "--overwrite"], capsys
    )
    assert status == 0 and "50 documents" in out and not (tmp_path / "o.tokenize").exists()


#: Runs the CLI with the encoding held after its first batch (a file says so) until the test's SIGINT arrives, so that
#: the signal always lands mid-run however fast the engine is.
HELD_AFTER_FIRST_BATCH = """
import sys, time
from pathlib import Path
from tokformats.cli import main
from tokformats.tokenization.partition_run import _PartitionRun
finish, ready = _PartitionRun.finish, Path(sys.argv[1])
def held(self, started):
    finish(self, started)
    ready.touch()
    while True:
        time.sleep(0.05)
_PartitionRun.finish = held
sys.exit(main(sys.argv[2:]))
"""


def test_ctrl_c_during_tokenize_says_how_to_resume(tmp_path: Path, tokenizer_path: Path) -> None:
    text = tmp_path / "big.txt"
    text.write_text("\n".join(f"document number {k} " * 20 for k in range(5_000)))
    ready = tmp_path / "encoding"
    arguments = ["tokenize", str(text), "-t", str(tokenizer_path), "-o", str(tmp_path / "b")]
    command = [sys.executable, "-c", HELD_AFTER_FIRST_BATCH, str(ready), *arguments]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 60
    while not ready.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ready.exists(), "the run never reached its first batch"
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert "--resume" in err and "Traceback" not in err


def test_progress_counts_encoded_bytes_and_can_be_forced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tokenizer_path: Path
) -> None:
    from tokformats.tokenization.progress import Progress, Stats

    class Read:
        count = 900  # the reader thread is ahead: 900 of 1,000 bytes read

    monitor = Progress(True, 1000, [Read()], style="line")
    monitor.encoded = 100  # but only 100 bytes' documents are encoded
    monitor.update(Stats(), final=True)
    assert ", 10%," in capsys.readouterr().err
    text = tmp_path / "in.txt"
    text.write_text("one\ntwo\n")
    args = ["tokenize", str(text), "-t", str(tokenizer_path), "-o", str(tmp_path / "p")]
    assert "2 documents, " in run([*args, "--progress"], capsys)[2]  # stderr is not a terminal (tqdm or a line)
    assert "tokenize:" not in run([*args, "--overwrite", "--no-progress"], capsys)[2]


def test_quickstart_skips_a_format_whose_extra_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from tokformats.cli.quickstart import run

    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as on a machine with only `pip install tokformats`
    rows = {row["format"]: row["check"] for row in run(documents=100, vocab_size=400)}
    assert rows.pop("hf").startswith("skipped: HF save_to_disk folders are Arrow files: install pyarrow")
    assert set(rows.values()) == {"ok"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["head", "{c}", "-n", "-2"], "argument -n: must be 1 or more, found -2"),
        (["head", "{c}", "-n", "0"], "argument -n: must be 1 or more, found 0"),
        (["head", "{c}", "--max-chars", "-1"], "argument --max-chars: must be 0 or more, found -1"),
        (["stats", "{c}", "--top", "0"], "argument --top: must be 1 or more, found 0"),
        (["tokenize", "{c}", "-t", "t.json", "-o", "o", "--batch-size", "0"], "argument --batch-size: must be 1 or"),
        (["tokenize", "{c}", "-t", "t.json", "-o", "o", "--workers", "x"], "--workers: expected a whole number"),
    ],
)
def test_counts_on_the_command_line_are_checked_naming_the_flag(
    corpus: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([a.replace("{c}", str(corpus)) for a in args])
    assert exited.value.code == 2 and message in capsys.readouterr().err
