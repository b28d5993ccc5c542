"""tokformats.tokenize: every input kind, every format, splits, EOS modes, bad records, resume, executors."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer

import tokformats
from tokformats import ConfigError, FormatError, OutputExistsError
from tokformats.formats import megatron
from tokformats.tokenization.plan import assign_splits, output_paths, split_fractions
from tokformats.tokenization.sample_text import sample_texts
from tokformats.tokenization.sources import SourceError


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return sample_texts(400, seed=7)


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory: pytest.TempPathFactory, texts: list[str]) -> Path:
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tokformats.train_tokenizer(sample_texts(1000), 600, progress=False).save(str(path))
    return path


@pytest.fixture(scope="module")
def tokenizer(tokenizer_path: Path) -> Tokenizer:
    return Tokenizer.from_file(str(tokenizer_path))


def jsonl(path: Path, texts: list[str], key: str = "text") -> Path:
    path.write_text("".join(json.dumps({key: t, "id": i}) + "\n" for i, t in enumerate(texts)), encoding="utf-8")
    return path


def decoded(tokenizer: Tokenizer, documents: Any, strip: slice = slice(None, -1)) -> list[str]:
    return [tokenizer.decode(np.asarray(d)[strip].tolist(), skip_special_tokens=False) for d in documents]


FORMATS = {
    "megatron": ({}, lambda path: path),
    "raw": ({"format": "raw", "dtype": "uint16", "eos": 0}, lambda path: path),
    "llmc": ({"bos": 0}, lambda path: f"{path}_[0-9]*.bin"),
    "pt": ({"eos": 0}, lambda path: path),
    "timemoe": ({}, lambda path: path),
}


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_every_format_round_trips_text(tmp_path: Path, texts: list[str], tokenizer: Tokenizer, name: str) -> None:
    source = jsonl(tmp_path / "in.jsonl", texts)
    eos = "prepend" if name == "llmc" else "append"
    summary = tokformats.tokenize(source, tokenizer, tmp_path / "out" / "c", name, eos=eos, progress=False)
    assert summary["documents"] == len(texts)
    (output,) = summary["outputs"].values()
    options, where = FORMATS[name]
    with tokformats.open(where(output["path"]), **options) as reader:
        assert len(reader) == len(texts)
        strip = slice(1, None) if eos == "prepend" else slice(None, -1)
        assert decoded(tokenizer, reader, strip) == texts
        assert reader.num_tokens == summary["tokens"] == output["tokens"]
    assert not (tmp_path / "out" / "c.tokenize").exists(), "the work folder is removed after success"


def test_ids_match_encode_and_eos_modes(tmp_path: Path, texts: list[str], tokenizer: Tokenizer) -> None:
    expected = [tokenizer.encode(t, add_special_tokens=False).ids for t in texts[:30]]
    for eos, make in (("append", lambda d: [*d, 0]), ("prepend", lambda d: [0, *d]), ("none", lambda d: d)):
        summary = tokformats.tokenize(texts[:30], tokenizer, tmp_path / eos, "megatron", eos=eos, progress=False)
        with tokformats.open(summary["outputs"]["text"]["path"]) as reader:
            assert [d.tolist() for d in reader] == [make(d) for d in expected]
    summary = tokformats.tokenize(texts[:3], tokenizer, tmp_path / "id7", "raw", eos_id=7, progress=False)
    with tokformats.open(summary["outputs"]["text"]["path"], format="raw", dtype="uint16", eos=7) as reader:
        assert reader[0].tolist() == [*expected[0], 7]


def test_megatron_empty_documents_follow_preprocess_data(tmp_path: Path, tokenizer: Tokenizer) -> None:
    summary = tokformats.tokenize(iter(["a b", "", "c"]), tokenizer, tmp_path / "m", "megatron", progress=False)
    with tokformats.open(summary["outputs"]["text"]["path"]) as reader:
        assert isinstance(reader, megatron.Reader)
        assert len(reader) == 3 and len(reader.sequences) == 2  # the empty document has no sequence, no EOD
        assert reader.document_indices.tolist() == [0, 1, 1, 2]
        assert reader[1].tolist() == []
    summary = tokformats.tokenize(iter(["a b", "", "c"]), tokenizer, tmp_path / "r", "raw", progress=False)
    with tokformats.open(summary["outputs"]["text"]["path"], format="raw", dtype="uint16", eos=0) as reader:
        assert reader[1].tolist() == [0]  # nanoGPT/llm.c write the delimiter even for an empty document


def test_input_kinds(tmp_path: Path, texts: list[str], tokenizer: Tokenizer) -> None:
    docs = texts[:40]
    one_line = [t.replace("\n", " ") for t in docs]
    (tmp_path / "lines.txt").write_text("\n".join(one_line) + "\n\n", encoding="utf-8")
    (tmp_path / "paragraphs.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    folder = tmp_path / "files"
    folder.mkdir()
    for k, t in enumerate(docs):
        (folder / f"{k:03d}.txt").write_text(t, encoding="utf-8")
    jsonl(tmp_path / "a.jsonl", docs[:20])
    jsonl(tmp_path / "b.jsonl", docs[20:])
    (tmp_path / "array.json").write_text(json.dumps([{"text": t} for t in docs]), encoding="utf-8")
    with gzip.open(tmp_path / "c.jsonl.gz", "wt", encoding="utf-8") as handle:
        handle.write("".join(json.dumps({"text": t}) + "\n" for t in docs))
    zstandard = pytest.importorskip("zstandard", reason="zstandard is optional")
    (tmp_path / "d.jsonl.zst").write_bytes(
        zstandard.ZstdCompressor().compress("".join(json.dumps({"text": t}) + "\n" for t in docs).encode())
    )
    cases: list[tuple[Any, dict[str, Any], list[str]]] = [
        (tmp_path / "lines.txt", {"unit": "line"}, one_line),
        (tmp_path / "paragraphs.txt", {"unit": "paragraph"}, [d.replace("\n\n", "\n") for d in docs]),
        (folder, {"unit": "file"}, docs),
        (str(tmp_path / "*.jsonl"), {}, docs),
        ([tmp_path / "a.jsonl", tmp_path / "b.jsonl"], {}, docs),
        (tmp_path / "array.json", {}, docs),
        (tmp_path / "c.jsonl.gz", {}, docs),
        (tmp_path / "d.jsonl.zst", {}, docs),
        (iter(docs), {}, docs),
        (docs, {}, docs),
    ]
    for k, (source, options, expected) in enumerate(cases):
        summary = tokformats.tokenize(source, tokenizer, tmp_path / f"out{k}", "raw", progress=False, **options)
        with tokformats.open(summary["outputs"]["text"]["path"], format="raw", dtype="uint16", eos=0) as reader:
            assert decoded(tokenizer, reader) == expected, (k, source)


def test_parquet_input(tmp_path: Path, texts: list[str], tokenizer: Tokenizer) -> None:
    pa = pytest.importorskip("pyarrow", reason="pyarrow is optional")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": texts[:50], "n": list(range(50))}), tmp_path / "t.parquet", row_group_size=7)
    summary = tokformats.tokenize(tmp_path / "t.parquet", tokenizer, tmp_path / "o", "raw", progress=False)
    with tokformats.open(summary["outputs"]["text"]["path"], format="raw", dtype="uint16", eos=0) as reader:
        assert decoded(tokenizer, reader) == texts[:50]
    with pytest.raises(SourceError, match="no column 'body'"):
        tokformats.tokenize(tmp_path / "t.parquet", tokenizer, tmp_path / "p", "raw", text_key="body", progress=False)


def test_several_text_keys_give_several_outputs(tmp_path: Path, texts: list[str], tokenizer: Tokenizer) -> None:
    source = tmp_path / "kv.jsonl"
    source.write_text("".join(json.dumps({"q": t[:20], "a": t}) + "\n" for t in texts[:30]), encoding="utf-8")
    summary = tokformats.tokenize(source, tokenizer, tmp_path / "o", "megatron", text_key=["q", "a"], progress=False)
    assert set(summary["outputs"]) == {"q", "a"}
    assert summary["outputs"]["q"]["path"].endswith("o_q_document")  # Megatron's --json-keys naming
    with tokformats.open(summary["outputs"]["a"]["path"]) as answers:
        assert decoded(tokenizer, answers) == texts[:30]


def test_splits_are_reproducible_and_independent_of_batching(
    tmp_path: Path, texts: list[str], tokenizer: Tokenizer
) -> None:
    source = jsonl(tmp_path / "in.jsonl", texts)
    first = tokformats.tokenize(
        source, tokenizer, tmp_path / "a", "raw", split="8:1:1", seed=3, batch_size=7, progress=False
    )
    second = tokformats.tokenize(
        source,
        tokenizer,
        tmp_path / "b",
        "raw",
        split={"train": 8, "val": 1, "test": 1},
        seed=3,
        batch_size=1000,
        progress=False,
    )
    for name in ("text-train", "text-val", "text-test"):
        a = Path(first["outputs"][name]["path"]).read_bytes()
        assert a == Path(second["outputs"][name]["path"]).read_bytes()
    counts = [first["outputs"][n]["documents"] for n in ("text-train", "text-val", "text-test")]
    assert sum(counts) == len(texts) and counts[0] > counts[1] > 0 and counts[2] > 0
    other = tokformats.tokenize(source, tokenizer, tmp_path / "c", "raw", split="8:1:1", seed=4, progress=False)
    assert (
        Path(other["outputs"]["text-val"]["path"]).read_bytes()
        != Path(first["outputs"]["text-val"]["path"]).read_bytes()
    )
    # every document lands in exactly one split, and in order
    joined = []
    for name in ("text-train", "text-val", "text-test"):
        with tokformats.open(first["outputs"][name]["path"], format="raw", dtype="uint16", eos=0) as reader:
            joined += decoded(tokenizer, reader)
    assert sorted(joined) == sorted(texts)


def test_split_assignment_is_uniform() -> None:
    chosen = assign_splits(0, np.zeros(100_000, np.int64), np.arange(100_000), [0.8, 0.1, 0.1])
    shares = np.bincount(chosen, minlength=3) / len(chosen)
    np.testing.assert_allclose(shares, [0.8, 0.1, 0.1], atol=0.01)
    assert split_fractions("9:1") == {"train": 0.9, "val": 0.1}
    with pytest.raises(ValueError):
        split_fractions("1:-1")


def test_output_names() -> None:
    assert output_paths("o/c", "megatron", ["text"], [""]) == {("text", ""): Path("o/c_text_document")}
    assert output_paths("o/c", "raw", ["text"], ["train"]) == {("text", "train"): Path("o/c_train.bin")}
    assert output_paths("o/c", "llmc", ["text"], ["val"]) == {("text", "val"): Path("o/c")}
    assert output_paths("o/c", "pt", ["q", "a"], [""])[("a", "")] == Path("o/c_a")


def test_bad_records_are_named_or_skipped(tmp_path: Path, texts: list[str], tokenizer: Tokenizer) -> None:
    source = tmp_path / "bad.jsonl"
    good = [json.dumps({"text": t}).encode() for t in texts[:5]]
    source.write_bytes(
        b"\n".join(
            [
                good[0],
                b"{not json",
                good[1],
                b'{"body": 1}',
                good[2],
                b'{"text": "\xff\xfe"}',
                good[3],
                b'{"text": 5}',
                good[4],
            ]
        )
        + b"\n"
    )
    with pytest.raises(SourceError, match=r"bad\.jsonl, line 2: invalid JSON"):
        tokformats.tokenize(source, tokenizer, tmp_path / "a", "raw", progress=False)
    summary = tokformats.tokenize(source, tokenizer, tmp_path / "b", "raw", on_error="skip", progress=False)
    assert summary["skipped"] == 4 and summary["documents"] == 5
    assert any("line 4: the record has no key 'text'" in e for e in summary["errors"])
    assert any("line 6: not UTF-8" in e for e in summary["errors"])
    assert any("line 8: 'text' is a int" in e for e in summary["errors"])
    with tokformats.open(summary["outputs"]["text"]["path"], format="raw", dtype="uint16", eos=0) as reader:
        assert decoded(tokenizer, reader) == texts[:5]
    text = tmp_path / "bad.txt"
    text.write_bytes(b"fine\n\xff\n")
    with pytest.raises(SourceError, match=r"bad\.txt, line 2: not UTF-8"):
        tokformats.tokenize(text, tokenizer, tmp_path / "c", "raw", progress=False)


def test_missing_inputs_and_existing_outputs(tmp_path: Path, texts: list[str], tokenizer: Tokenizer) -> None:
    with pytest.raises(tokformats.NoFilesError, match="does not exist"):
        tokformats.tokenize(["data/missing.jsonl"], tokenizer, tmp_path / "x", "raw", progress=False)
    with pytest.raises(tokformats.NoFilesError, match="matches no file"):
        tokformats.tokenize(str(tmp_path / "*.jsonl"), tokenizer, tmp_path / "x", "raw", progress=False)
    tokformats.tokenize(texts[:3], tokenizer, tmp_path / "x", "raw", progress=False)
    with pytest.raises(OutputExistsError):
        tokformats.tokenize(texts[:3], tokenizer, tmp_path / "x", "raw", progress=False)
    tokformats.tokenize(texts[:3], tokenizer, tmp_path / "x", "raw", progress=False, overwrite=True)
    from tokenizers import models, pre_tokenizers

    bare = Tokenizer(models.BPE())
    bare.pre_tokenizer = pre_tokenizers.ByteLevel()
    with pytest.raises(FormatError, match="pass eos_id=ID or eos='none'"):
        tokformats.tokenize(texts[:3], bare, tmp_path / "y", "raw", progress=False)


def test_progress_line(
    tmp_path: Path, texts: list[str], tokenizer: Tokenizer, capsys: pytest.CaptureFixture[str]
) -> None:
    source = jsonl(tmp_path / "in.jsonl", texts)
    tokformats.tokenize(source, tokenizer, tmp_path / "o", "raw", progress=True)
    err = capsys.readouterr().err
    # a tqdm bar when tqdm is installed, else one line: the same facts, the rate in characters of text
    assert f"{len(texts):,} documents" in err and "M chars/s" in err and "100%" in err
    tokformats.tokenize(source, tokenizer, tmp_path / "q", "raw", progress=False)
    assert capsys.readouterr().err == ""


def test_executor_equals_single_process(tmp_path: Path, texts: list[str], tokenizer_path: Path) -> None:
    files = [jsonl(tmp_path / f"in{k}.jsonl", texts[k * 100 : (k + 1) * 100]) for k in range(4)]
    single = tokformats.tokenize(files, tokenizer_path, tmp_path / "one", "megatron", split="8:2", progress=False)
    with ProcessPoolExecutor(2) as pool:
        parallel = tokformats.tokenize(
            files, tokenizer_path, tmp_path / "many", "megatron", split="8:2", executor=pool, progress=False
        )
    for name, output in single["outputs"].items():
        for suffix in (".bin", ".idx"):
            assert (
                Path(output["path"] + suffix).read_bytes()
                == Path(parallel["outputs"][name]["path"] + suffix).read_bytes()
            )


def test_dask_executor(tmp_path: Path, texts: list[str], tokenizer_path: Path) -> None:
    distributed = pytest.importorskip("dask.distributed", reason="dask[distributed] is optional")
    files = [jsonl(tmp_path / f"in{k}.jsonl", texts[k * 200 : (k + 1) * 200]) for k in range(2)]
    single = tokformats.tokenize(files, tokenizer_path, tmp_path / "one", "llmc", progress=False)
    with (
        distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True) as cluster,
        distributed.Client(cluster) as client,
    ):
        cluster_run = tokformats.tokenize(
            files, tokenizer_path, tmp_path / "dask", "llmc", executor=client.get_executor(), progress=False
        )
    assert [Path(f).read_bytes() for f in single["outputs"]["text"]["files"]] == [
        Path(f).read_bytes() for f in cluster_run["outputs"]["text"]["files"]
    ]


RUNNER = r"""
import sys, tokformats
extra = {"shard_size": 5000} if sys.argv[4] == "llmc" else {}
tokformats.tokenize(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], split="8:1:1", batch_size=50,
                    checkpoint_every=0, progress=False, resume=True, **extra)
"""


@pytest.mark.parametrize("name", ["megatron", "llmc"])
def test_resume_after_kill_is_byte_identical(tmp_path: Path, tokenizer_path: Path, name: str) -> None:
    corpus = sample_texts(6000, seed=11)
    source = jsonl(tmp_path / "big.jsonl", corpus)
    reference = tokformats.tokenize(
        source,
        tokenizer_path,
        tmp_path / "ref" / "c",
        name,
        split="8:1:1",
        progress=False,
        **({"shard_size": 5000} if name == "llmc" else {}),
    )
    target = tmp_path / "run" / "c"
    checkpoint = Path(f"{target}.tokenize") / "part-0000" / "checkpoint.json"
    process = subprocess.Popen([sys.executable, "-c", RUNNER, str(source), str(tokenizer_path), str(target), name])
    deadline = time.time() + 60
    while time.time() < deadline:
        if checkpoint.exists():
            try:
                position = json.loads(checkpoint.read_text())["position"][1]
            except (json.JSONDecodeError, KeyError):
                position = 0
            if position >= 1000:
                break
        time.sleep(0.005)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    state = json.loads(checkpoint.read_text())
    assert not state["done"] and 0 < state["position"][1] < len(corpus), "killed mid-run"
    resumed = tokformats.tokenize(
        source,
        tokenizer_path,
        target,
        name,
        split="8:1:1",
        progress=False,
        resume=True,
        **({"shard_size": 5000} if name == "llmc" else {}),
    )
    assert resumed["documents"] == reference["documents"] == len(corpus)
    for key, output in reference["outputs"].items():
        mine = resumed["outputs"][key]["files"]
        assert [Path(f).name for f in mine] == [Path(f).name for f in output["files"]]
        assert [Path(f).read_bytes() for f in mine] == [Path(f).read_bytes() for f in output["files"]]


def test_resume_refuses_other_settings(tmp_path: Path, texts: list[str], tokenizer: Tokenizer) -> None:
    work = tmp_path / "o.tokenize" / "part-0000"
    work.mkdir(parents=True)
    (work / "checkpoint.json").write_text(json.dumps({"plan": {"seed": 99}, "position": [0, 0]}))
    source = jsonl(tmp_path / "in.jsonl", texts[:10])
    with pytest.raises(FormatError, match="other settings"):
        tokformats.tokenize(source, tokenizer, tmp_path / "o", "raw", resume=True, progress=False)
    with pytest.raises(OutputExistsError, match="resume=True"):
        tokformats.tokenize(source, tokenizer, tmp_path / "o", "raw", progress=False)


def test_cli_tokenize(
    tmp_path: Path, texts: list[str], tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tokformats.cli import main

    source = jsonl(tmp_path / "in.jsonl", texts)
    args = [
        "tokenize",
        str(source),
        "-t",
        str(tokenizer_path),
        "-o",
        str(tmp_path / "c"),
        "--format",
        "llmc",
        "--eos",
        "prepend",
        "--split",
        "9:1",
        "-w",
        "shard_size=20000",
        "--quiet",
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"tokenized {len(texts):,} documents" in out and "text-val" in out
    assert (tmp_path / "c_train_000001.bin").exists() and (tmp_path / "c_val_000000.bin").exists()


def test_fast_json_parser_changes_no_text(tmp_path: Path) -> None:
    """orjson (when installed) parses JSONL; what it refuses goes to json, so texts and errors are the same."""
    from tokformats.tokenization import sources

    lines = [
        b'{"text": "caf\\u00e9 \\ud800 lone surrogate"}',
        b'{"text": "nan elsewhere", "score": NaN}',
        b'{"text": "big int elsewhere", "n": 123456789012345678901234567890}',
        b'{"text": "dup", "text": "last wins"}',
        b'{"text": "\xff not utf-8"}',
        b"not json",
    ]
    corpus = tmp_path / "c.jsonl"
    corpus.write_bytes(b"\n".join(lines) + b"\n")
    inputs = sources.resolve_inputs([corpus])
    with_fast = [(r.texts, r.error) for r in sources.iter_records(inputs, ("text",), "line")]
    saved = sources._orjson
    sources._orjson = None
    try:
        plain = [(r.texts, r.error) for r in sources.iter_records(inputs, ("text",), "line")]
    finally:
        sources._orjson = saved
    assert with_fast == plain
    assert plain[0][0] == ("café \ud800 lone surrogate",) and plain[3][0] == ("last wins",)
    assert "not UTF-8" in str(plain[4][1]) and "invalid JSON" in str(plain[5][1])


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"seed": -3}, r"seed must be an integer, 0 or more; found seed=-3\."),
        ({"seed": 2.5}, r"seed must be an integer, 0 or more; found seed=2\.5\."),
        ({"seed": True}, r"seed must be an integer, 0 or more; found seed=True\."),
        ({"eos": "end"}, r"eos must be one of append, prepend, none; found eos='end'\."),
        ({"on_error": "ignore"}, r"on_error must be raise or skip; found on_error='ignore'\."),
        ({"unit": "sentence"}, r"unit must be one of line, file, paragraph; found unit='sentence'\."),
        ({"verify_fraction": 2.0}, r"verify_fraction must be between 0 and 1; found verify_fraction=2\.0\."),
        ({"engine": "fast"}, r"engine must be one of .*; found engine='fast'\."),
    ],
)
def test_plain_options_are_refused_with_the_option_and_its_value(
    tmp_path: Path, texts: list[str], tokenizer: Tokenizer, options: dict[str, Any], message: str
) -> None:
    source = jsonl(tmp_path / "in.jsonl", texts[:5])
    with pytest.raises(ConfigError, match=message):
        tokformats.tokenize(source, tokenizer, tmp_path / "out", "raw", progress=False, **options)
    assert not list(tmp_path.glob("out*"))  # refused before any work


def test_a_negative_seed_on_the_command_line_names_the_flag(
    tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tokformats.cli import main

    source = jsonl(tmp_path / "in.jsonl", ["a b c"])
    with pytest.raises(SystemExit) as exited:  # refused where it is parsed
        main(["tokenize", str(source), "-t", str(tokenizer_path), "-o", str(tmp_path / "o"), "--seed", "-3"])
    assert exited.value.code == 2 and "argument --seed: must be 0 or more, found -3" in capsys.readouterr().err


@pytest.mark.parametrize(("name", "home"), [("Spool", "spools"), ("assign_splits", "plan"), ("CHAT_CHUNK", "batching")])
def test_names_moved_out_of_the_pipeline_module_still_import_with_a_deprecation_warning(name: str, home: str) -> None:
    import importlib

    from tokformats.tokenization import pipeline

    with pytest.warns(DeprecationWarning, match=rf"pipeline\.{name} is now tokformats\.tokenization\.{home}\.{name}"):
        moved = getattr(pipeline, name)
    assert moved is getattr(importlib.import_module(f"tokformats.tokenization.{home}"), name)
    with pytest.raises(AttributeError):
        pipeline.no_such_name  # noqa: B018 - an attribute that never was

