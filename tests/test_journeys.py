"""What a user sees is right (issue 22): the journeys of the issue, run as a user runs them (the CLI as a
subprocess), asserting the documents read back, the one-line messages and the exit statuses."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tokformats
from tokformats.formats import llmc
from tokformats.tokenization.sample_text import sample_texts

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str, cwd: Path) -> tuple[int, str, str]:
    """``python -m tokformats ARGS`` in ``cwd`` with this checkout on the path: (status, stdout, stderr)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "tokformats", *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=300
    )
    return done.returncode, done.stdout, done.stderr


def run_hint(command: str, cwd: Path) -> tuple[int, str, str]:
    """Run a ``tokformats ...`` command exactly as a message printed it."""
    words = shlex.split(command)
    assert words[0] == "tokformats", command
    return cli(*words[1:], "--json", cwd=cwd)


@pytest.fixture(scope="module")
def novel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A text of 400 blank-line separated paragraphs (the issue's novel)."""
    path = tmp_path_factory.mktemp("novel") / "novel.txt"
    path.write_text("\n\n".join(sample_texts(400)), encoding="utf-8")
    return path


def tokenize(novel: Path, tokenizer_path: Path, out: Path, *extra: str) -> str:
    status, stdout, stderr = cli(
        "tokenize", str(novel), "-t", str(tokenizer_path), "-o", str(out), "--unit", "paragraph", "-q", *extra,
        cwd=out.parent,
    )  # fmt: skip
    assert status == 0, stderr
    return stdout


def info(path: str, cwd: Path, *extra: str) -> dict:
    status, stdout, stderr = cli("info", path, "--json", *extra, cwd=cwd)
    assert status == 0, stderr
    return json.loads(stdout)


# -- item 1: llm.c delimiters are never guessed ------------------------------------------------------------------


def test_llmc_with_eos_appended_reads_back_every_document(novel: Path, tokenizer_path: Path, tmp_path: Path) -> None:
    tokenize(novel, tokenizer_path, tmp_path / "n", "--format", "llmc", "--eos", "append")
    shard = tmp_path / "n_000000.bin"
    found = info(str(shard), tmp_path)
    assert found["documents"] == 400 and found["warnings"] == []
    assert (found["metadata"]["eos"], found["metadata"]["bos_rule"]) == (0, "recorded")
    assert llmc.read_convention(shard.read_bytes()[:1024]) == ("eos", 0)
    assert cli("verify", str(shard), cwd=tmp_path)[:2] == (0, f"{shard}: ok\n")


def test_llmc_header_records_only_what_is_not_llmcs_own(tmp_path: Path) -> None:
    with tokformats.create(tmp_path / "own", "llmc", vocab_size=50257, bos=50256) as writer:
        writer.write_batch([5, 6, 7], [2, 1])
    header = np.fromfile(tmp_path / "own_000000.bin", dtype="<i4", count=256)
    assert header[:3].tolist() == [20240520, 1, 5] and not header[3:].any()  # byte-identical to write_datafile
    with tokformats.create(tmp_path / "zero", "llmc", vocab_size=500, bos=0) as writer:
        writer.write_batch([5, 6, 7], [2, 1])
    header = np.fromfile(tmp_path / "zero_000000.bin", dtype="<i4", count=6)
    assert header.tolist() == [20240520, 1, 5, llmc.CONVENTION_MARK, 1, 0]
    with tokformats.open(tmp_path / "zero_000000.bin") as reader:
        assert [d.tolist() for d in reader] == [[0, 5, 6], [0, 7]]


def test_unknown_llmc_convention_is_flagged_with_runnable_options(tmp_path: Path) -> None:
    header = np.zeros(256, dtype="<i4")
    header[:3] = 20240520, 1, 7
    tokens = np.array([9, 4, 1, 0, 5, 2, 0], dtype="<u2")  # two documents ending with 0, as llm.c never writes
    (tmp_path / "x_000000.bin").write_bytes(header.tobytes() + tokens.tobytes())
    status, stdout, stderr = cli("info", "x_000000.bin", cwd=tmp_path)
    assert status == 0 and stderr.count("warning:") == 1 and "DataWarning" not in stderr
    assert "the document delimiter is unknown" in stderr and "pass --bos 9" in stderr and "pass --eos 0" in stderr
    assert "documents        1\n" in stdout
    status, stdout, _ = cli("verify", "x_000000.bin", cwd=tmp_path)
    assert status == 1 and "delimiter: the document delimiter is unknown" in stdout
    assert info("x_000000.bin", tmp_path, "--eos", "0")["documents"] == 2
    with pytest.warns(tokformats.DataWarning, match="eos=0"), tokformats.open(tmp_path / "x_000000.bin") as reader:
        assert len(reader) == 1


def test_raw_without_delimiter_into_llmc_reads_back_as_reported(tmp_path: Path) -> None:
    np.arange(1, 501, dtype="<u2").tofile(tmp_path / "s.bin")
    status, stdout, stderr = cli(
        "convert", "s.bin", "l", "--format", "raw", "--dtype", "uint16", "--to", "llmc", "--json", cwd=tmp_path
    )
    assert status == 0, stderr
    assert json.loads(stdout)["documents"] == 1
    assert info("l_000000.bin", tmp_path)["documents"] == 1


# -- item 2: an end-of-document convention becomes a start-of-document one, and back ---------------------------


def test_megatron_eod_appended_to_llmc_moves_the_delimiter(tmp_path: Path) -> None:
    documents = [[5, 6, 0], [7, 0], [8, 9, 10, 0]]  # preprocess_data.py --append-eod
    with tokformats.create(tmp_path / "m", "megatron", vocab_size=500) as writer:
        for document in documents:
            writer.write(document)
    status, stdout, stderr = cli("convert", "m", "l", "--to", "llmc", cwd=tmp_path)
    assert status == 0 and "moved each document's delimiter" in stdout, stderr
    with tokformats.open(tmp_path / "l_000000.bin") as reader:
        assert [d.tolist() for d in reader] == [[0, 5, 6], [0, 7], [0, 8, 9, 10]]
    status, _, stderr = cli("convert", "m", "l2", "--to", "llmc", "--to-bos", "0", cwd=tmp_path)
    assert status == 0, stderr
    with tokformats.open(tmp_path / "l2_000000.bin") as reader:
        assert [d.tolist() for d in reader] == [[0, 5, 6], [0, 7], [0, 8, 9, 10]]
    status, _, stderr = cli("convert", "l_000000.bin", "back", "--to", "pt", cwd=tmp_path)  # and back: EOS again
    assert status == 0, stderr
    with tokformats.open(tmp_path / "back") as reader:
        assert [d.tolist() for d in reader] == documents


# -- item 3: .pt folders and raw u32 from tokenize read back as written --------------------------------------


def test_tokenize_outputs_say_how_to_read_them_back(novel: Path, tokenizer_path: Path, tmp_path: Path) -> None:
    tokenize(novel, tokenizer_path, tmp_path / "p", "--format", "pt")
    assert info("p", tmp_path)["documents"] == 400
    stdout = tokenize(novel, tokenizer_path, tmp_path / "r", "--format", "raw", "-w", "dtype=uint32")
    (hint,) = [line.split("read it back with: ")[1] for line in stdout.splitlines() if "read it back with" in line]
    assert hint == f"tokformats info {tmp_path / 'r.bin'} --format raw --dtype uint32 --eos 0"
    status, out, stderr = run_hint(hint, tmp_path)
    assert status == 0 and json.loads(out)["documents"] == 400, stderr


# -- item 7: split outputs are named as they are ---------------------------------------------------------------


def test_split_outputs_are_named_by_their_files(novel: Path, tokenizer_path: Path, tmp_path: Path) -> None:
    stdout = tokenize(novel, tokenizer_path, tmp_path / "s", "--format", "llmc", "--split", "8:1:1")
    for split in ("train", "val", "test"):
        assert f"-> {tmp_path / f's_{split}_000000.bin'}\n" in stdout
    status, _, stderr = cli("info", "s", cwd=tmp_path)
    assert status == 2
    assert stderr.strip() == (
        "tokformats: error: s does not exist. Did you mean s_test_000000.bin, s_train_000000.bin, s_val_000000.bin?"
    )


# -- item 4: every reader option is meaningful for a format or refused in one line ------------------------------


def written_corpora(folder: Path) -> dict[str, tuple[Path, dict]]:
    """One small corpus per writable format (each document ends with id 0): name -> (path, reader options)."""
    corpora = {}
    for name, writer_class in tokformats.api.corpus_writers().items():
        target = writer_class.output_path(folder / name, "text", None, False)
        try:
            writer = tokformats.create(target, name, vocab_size=500)
        except ImportError:  # an optional extra (pyarrow for hf) is missing
            continue
        with writer:
            writer.write_batch([5, 6, 0, 7, 0], [3, 2])
        opened = target if target.exists() else writer.written[0]
        corpora[name] = (opened, {"format": "raw", "dtype": "uint16"} if name == "raw" else {})
    return corpora


def test_reader_options_open_or_are_refused_naming_the_formats(tmp_path: Path) -> None:
    corpora = written_corpora(tmp_path)
    assert {"megatron", "llmc", "pt", "raw", "timemoe"} <= set(corpora)
    for name, (path, base) in corpora.items():
        for extra in ({"eos": 0}, {"bos": 0}, {"dtype": "uint16"}):
            key = next(iter(extra))
            try:
                with tokformats.open(path, **{**base, **extra}) as reader:
                    assert len(reader) >= 1
            except tokformats.ConfigError as error:
                assert f"not {key}=" in str(error) and "it applies to" in str(error), error
            except tokformats.FormatError as error:  # the option is taken, and the data says why it cannot be
                assert name in ("raw", "llmc", "pt", "dolma", "datatrove"), (name, key, error)
    status, _, stderr = cli("info", str(corpora["megatron"][0]), "--eos", "0", cwd=tmp_path)
    assert status == 2 and stderr.count("\n") == 1
    assert stderr.endswith(
        "the megatron reader takes no command-line option (multimodal= in Python only), not --eos; "
        "it applies to dolma, llmc, pt, raw.\n"
    )


# -- item 5: the dtype holds every id stored, chosen before encoding -------------------------------------------


def test_eos_id_beyond_the_vocabulary_widens_the_dtype(novel: Path, tokenizer_path: Path, tmp_path: Path) -> None:
    tokenize(novel, tokenizer_path, tmp_path / "big", "--format", "raw", "--eos-id", "100257")
    with tokformats.open(tmp_path / "big.bin", format="raw", dtype="uint32", eos=100257) as reader:
        assert len(reader) == 400 and int(reader[0][-1]) == 100257
    status, stdout, stderr = cli(
        "tokenize", str(novel), "-t", str(tokenizer_path), "-o", "small", "--format", "raw", "--eos-id", "100257",
        "--dtype", "uint16", "-q", cwd=tmp_path,
    )  # fmt: skip
    assert (status, stdout) == (2, "")
    assert stderr == "tokformats: error: raw: dtype uint16 holds ids up to 65,535, but vocab_size is 100,258.\n"
    assert not (tmp_path / "small.tokenize").exists() and not (tmp_path / "small.bin").exists()


# -- item 6: every hint a message prints runs as printed ------------------------------------------------------


def test_every_hint_printed_in_the_journeys_runs(novel: Path, tokenizer_path: Path, tmp_path: Path) -> None:
    """Walk the journeys, collect each hint (a command, or flags to add to the command that printed it), run it."""
    import re

    tokenize(novel, tokenizer_path, tmp_path / "r", "--format", "raw")
    tokenize(novel, tokenizer_path, tmp_path / "s", "--format", "llmc", "--split", "8:1:1")
    tokenize(novel, tokenizer_path, tmp_path / "m", "--format", "megatron", "--eos", "none")
    header = np.zeros(256, dtype="<i4")
    header[:3] = 20240520, 1, 5
    (tmp_path / "u_000000.bin").write_bytes(header.tobytes() + np.array([9, 1, 0, 2, 0], dtype="<u2").tobytes())
    journeys = [
        ["convert", "m_text_document", "out.bin", "--to", "raw", "--to-eos", "1000"],
        ["convert", "m_text_document", "out2", "--to", "llmc"],
        ["info", "s"],
        ["info", "r"],
        ["info", "u_000000.bin"],
        ["head", "-n", "1", "--max-chars", "5", "m_text_document"],
    ]
    hints: list[list[str]] = []
    for command in journeys:
        _, stdout, stderr = cli(*command, cwd=tmp_path)
        text = stdout + stderr
        hints += [shlex.split(h) for h in re.findall(r"read it back with: (tokformats .*)", text)]
        for names in re.findall(r"Did you mean (.*)\?", text):
            hints += [["tokformats", "info", name] for name in names.split(", ")]
        hints += [["tokformats", *command, flag, value] for flag, value in re.findall(r"pass (--[a-z-]+) (\d+)", text)]
        hints += [["tokformats", *command, flag] for flag in re.findall(r"pass (--drop-boundaries)\b", text)]
        hints += [["tokformats", *command[:-3], "--max-chars", "0", command[-1]]] * ("--max-chars 0" in text)
    assert len(hints) >= 9, hints
    for hint in hints:
        if hint[1] == "convert":  # the same destination again: the hint is run into a fresh one
            hint[3] = f"hinted-{hint[3]}"
        status, _, stderr = cli(*hint[1:], cwd=tmp_path)
        followed = re.findall(r"open it with (--format raw --dtype \w+)\.", stderr)
        if followed:  # a headerless file named by "Did you mean": its message says how to open it; that runs
            status, _, stderr = cli(*hint[1:], *followed[0].split(), cwd=tmp_path)
        assert status == 0, (hint, stderr)


# -- item 10: an odd-sized file is not called uint16 ------------------------------------------------------------


def test_odd_sized_file_names_no_dtype(tmp_path: Path) -> None:
    (tmp_path / "odd.bin").write_bytes(bytes(1001))
    status, _, stderr = cli("info", "odd.bin", cwd=tmp_path)
    assert status == 2 and "uint16: impossible, 1,001 bytes is not a multiple of 2" in stderr
    assert stderr.endswith(
        "Hint: no candidate dtype divides the file size (1,001 bytes is odd): it is truncated or not ids.\n"
    )


# -- item 11: a stream's state after a plain DataLoader with workers is refused with the call to use ------------


def test_state_dict_after_dataloader_workers_is_refused_with_the_call_to_use(tmp_path: Path) -> None:
    import pickle

    torch = pytest.importorskip("torch", reason="torch is not installed")
    tft = pytest.importorskip("tokformats.torch")
    from tokformats import training

    with tokformats.create(tmp_path / "c", "megatron", vocab_size=50257) as writer:
        writer.write_batch(np.arange(1, 6001) % 50000 + 1, [100] * 60)
    samples = training.GPTSamples(tokformats.open(tmp_path / "c"), 16, seed=1)
    for workers, consumed in ((0, 20), (2, None)):
        stream = tft.IterableDataset(samples, 8, 4)
        for k, _ in enumerate(torch.utils.data.DataLoader(stream, batch_size=None, num_workers=workers)):
            if k == 4:
                break
        if consumed is not None:
            assert stream.state_dict()["consumed_samples"] == consumed
            continue
        with pytest.raises(tokformats.ConfigError, match=r"stream\.state_after\(MICRO_BATCHES_CONSUMED\)"):
            stream.state_dict()
        state = stream.state_after(5)
        assert state["consumed_samples"] == 20
        assert pickle.loads(pickle.dumps(stream)).state_after(0)["consumed_samples"] == 0
        stream.load_state_dict(state)
        assert stream.state_dict()["consumed_samples"] == 20


# -- items 8 and 9: outputs are checked before work starts; quickstart -o creates its folder ---------------------


def test_train_tokenizer_checks_every_output_before_training(novel: Path, tmp_path: Path) -> None:
    (tmp_path / "tok.bin").write_bytes(b"mine")
    status, stdout, stderr = cli(
        "train-tokenizer", str(novel), "--vocab-size", "300", "-o", "tokenizer.json", "--export", "llmc-vocab=tok.bin",
        "-q", cwd=tmp_path,
    )  # fmt: skip
    assert (status, stdout) == (2, "")
    expected = "tokformats: error: tok.bin already exists; pass --overwrite to replace it (nothing was written).\n"
    assert stderr == expected
    assert not (tmp_path / "tokenizer.json").exists() and (tmp_path / "tok.bin").read_bytes() == b"mine"


def test_quickstart_creates_its_output_folder(tmp_path: Path) -> None:
    status, stdout, stderr = cli("quickstart", "-o", "demo/new", cwd=tmp_path)
    assert status == 0, stderr
    assert "round-tripped exactly" in stdout and (tmp_path / "demo" / "new" / "tokenizer.json").is_file()


# -- item 12: Time-MoE scales and strides that cannot work are refused, saying why ----------------------------


def test_timemoe_zero_std_and_bad_strides_are_refused(tmp_path: Path) -> None:
    from tokformats.formats import timemoe

    with tokformats.create(tmp_path / "tm", "timemoe", dtype="float32") as writer:
        zero_std = r"std=0\.0; .* std non-zero \(for a constant series pass std=1\.0\)"
        with pytest.raises(tokformats.FormatError, match=zero_std):
            writer.write([1.0, 1.0, 1.0], mean=1.0, std=0.0)
        with pytest.raises(tokformats.FormatError, match="both must be finite"):
            writer.write([1.0, 2.0], mean=float("nan"), std=1.0)
        writer.write(np.arange(10, dtype=np.float32))
    with tokformats.open(tmp_path / "tm") as reader:
        for stride in (0, -4, 2.5):
            with pytest.raises(tokformats.ConfigError, match=f"found {stride}; pass stride=None for the window length"):
                timemoe.Windows(reader, 4, stride=stride)
        assert len(timemoe.Windows(reader, 4, stride=2)) == 3 and len(timemoe.Windows(reader, 4)) == 2


# -- item 13: info on a tokenizer, publish to a path, a missing .idx, --cache-dir -----------------------------


def test_info_on_a_tokenizer_shows_its_vocabulary(tokenizer_path: Path, tmp_path: Path) -> None:
    found = info(str(tokenizer_path), tmp_path)
    assert found["format"] == "tokenizer" and found["model"] == "BPE"
    assert (found["vocab_size"], found["padded_vocab_size"], found["end_of_text_id"]) == (500, 512, 0)
    assert found["special_tokens"][0] == "<|endoftext|>" and found["token_dtype"] == "uint16"


def test_publish_to_a_local_path_says_it_needs_a_url(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.bin").write_bytes(bytes(4))
    status, _, stderr = cli("publish", "data", str(tmp_path / "elsewhere"), cwd=tmp_path)
    assert status == 2
    assert stderr == (
        f"tokformats: error: {tmp_path / 'elsewhere'} is not a URL; pass a store's folder URL "
        "(http, https, s3, gs, gcs, hf).\n"
    )


def test_opening_the_bin_of_a_megatron_dataset_names_its_missing_index(tmp_path: Path) -> None:
    with tokformats.create(tmp_path / "c", "megatron", vocab_size=500) as writer:
        writer.write([1, 2, 3])
    (tmp_path / "c.idx").unlink()
    status, _, stderr = cli("info", "c.bin", cwd=tmp_path)
    assert status == 2 and "If it is the data of a Megatron dataset, its index c.idx is missing." in stderr


def test_info_head_stats_take_a_cache_dir(tmp_path: Path) -> None:
    from tests.http_server import FileServer

    with tokformats.create(tmp_path / "served" / "c", "megatron", vocab_size=500) as writer:
        writer.write_batch([1, 2, 3, 4, 5], [2, 3])
    server = FileServer(tmp_path / "served")
    try:
        for command in ("info", "head", "stats"):
            cache = tmp_path / f"cache-{command}"
            status, _, stderr = cli(command, f"{server.url}/c", "--cache-dir", str(cache), cwd=tmp_path)
            assert status == 0, stderr
            assert any(p.name == "c.idx" for p in cache.rglob("*")), command
    finally:
        server.stop()


# -- F1-F4: owners read what tokformats writes ------------------------------------------------------------------


def test_pt_bool_tensors_read_as_uint8(tmp_path: Path) -> None:
    from tokformats.formats import pt

    pt.save(np.array([True, False, True]), tmp_path / "ours.pt")
    with tokformats.open(tmp_path / "ours.pt") as reader:
        assert reader.dtype == np.uint8 and np.asarray(reader.tokens).tolist() == [1, 0, 1]
    torch = pytest.importorskip("torch", reason="torch is not installed")
    assert torch.load(tmp_path / "ours.pt").tolist() == [True, False, True]
    torch.save({"mask": torch.tensor([True, False]), "tokens": torch.tensor([4, 5])}, tmp_path / "theirs.pt")
    with tokformats.open(tmp_path / "theirs.pt", key="tokens") as reader:
        assert np.asarray(reader.tokens).tolist() == [4, 5]
    with tokformats.open(tmp_path / "theirs.pt", key="mask") as reader:
        assert reader.dtype == np.uint8 and np.asarray(reader.tokens).tolist() == [1, 0]


def test_datatrove_merger_reads_what_tokenize_wrote(novel: Path, tokenizer_path: Path, tmp_path: Path) -> None:
    pytest.importorskip("datatrove", reason="datatrove is not installed")
    from datatrove.pipeline.tokens.merger import DocumentTokenizerMerger

    (tmp_path / "in").mkdir()
    summary = tokformats.tokenize(
        [novel.read_text().split("\n\n")[k] for k in range(50)], str(tokenizer_path), tmp_path / "in" / "00000_part",
        "datatrove", progress=False,
    )  # fmt: skip
    (output,) = summary["outputs"].values()
    metadata = Path(output["path"] + ".metadata").read_text().splitlines()
    assert metadata[0] == f"{tokenizer_path}|2"
    DocumentTokenizerMerger(str(tmp_path / "in"), str(tmp_path / "out"), "merged", shuffle=False, progress=False).run()
    (merged,) = sorted((tmp_path / "out").glob("*.ds"))
    with tokformats.open(output["path"]) as ours, tokformats.open(merged) as theirs:
        assert [d.tolist() for d in theirs] == [d.tolist() for d in ours] and len(ours) == 50
    assert Path(f"{merged}.metadata").read_text().splitlines()[0] == f"{tokenizer_path}|2"


def test_convert_to_raw_picks_the_smallest_dtype_and_names_it(tmp_path: Path) -> None:
    with tokformats.create(tmp_path / "c.pt", "pt", eos=0) as writer:  # int64, as .pt users expect
        writer.write_batch([5, 6, 7, 300], [2, 2])
    summary = tokformats.convert(tmp_path / "c.pt", tmp_path / "r.bin", "raw", source_options={"eos": 0})
    assert summary["dtype"] == "uint16" and summary["read_with"] == {"format": "raw", "dtype": "uint16", "eos": 0}
    assert (tmp_path / "r.bin").stat().st_size == 6 * 2
    with tokformats.open(tmp_path / "r.bin", **summary["read_with"]) as reader:
        assert [d.tolist() for d in reader] == [[5, 6, 0], [7, 300, 0]]


def test_timemoe_trailing_empty_sequence_is_where_time_moe_finds_it(tmp_path: Path) -> None:
    with tokformats.create(tmp_path / "src", "megatron", vocab_size=500) as writer:
        for document in ([1, 2], [], [3], []):
            writer.write(document)
    tokformats.convert(tmp_path / "src", tmp_path / "tm", "timemoe")
    meta = json.loads((tmp_path / "tm" / "meta.json").read_text())
    total = sum(meta["files"].values())
    # Time-MoE's BinaryDataset reads a sequence from the file its offset falls in: every offset must be in one.
    assert total == 3 and all(0 <= scale["offset"] < total for scale in meta["scales"])
    assert [s["length"] for s in meta["scales"]] == [2, 0, 1, 0]
    with tokformats.open(tmp_path / "tm") as reader:
        assert [d.tolist() for d in reader] == [[1, 2], [], [3], []] and reader.problems() == []


# -- every output of tokenize and convert, in every format, reads back as exactly the documents written ---------


def _opened(output: dict) -> object:
    """What to open for a written output: its path when that exists (file, folder), else its files."""
    path, files = output["path"], output["files"]
    if Path(path).exists() or len({Path(f).suffix for f in files}) != 1:
        return path  # a file or folder; or a prefix whose files differ by suffix (Megatron's .bin and .idx)
    return files


def test_every_tokenize_output_reads_back_exactly(tokenizer_path: Path, tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    texts = [*sample_texts(40)[:20], "", *sample_texts(40)[20:], ""]
    encoder = Tokenizer.from_file(str(tokenizer_path))
    encoded = [e.ids for e in encoder.encode_batch(texts, add_special_tokens=False)]
    eos = encoder.token_to_id("<|endoftext|>")
    checked = []
    for name, writer_class in tokformats.api.corpus_writers().items():
        try:
            summary = tokformats.tokenize(texts, tokenizer_path, tmp_path / name / "t", name, progress=False)
        except ImportError:  # an optional extra (pyarrow for hf) is missing
            continue
        (output,) = summary["outputs"].values()
        prepend = writer_class.boundaries == "bos"
        expected = [
            ([eos, *ids] if prepend else [*ids, eos]) if ids or writer_class.delimit_empty_documents else ids
            for ids in encoded
        ]
        with tokformats.open(_opened(output), **output["read_with"]) as reader:
            assert [np.asarray(d).tolist() for d in reader] == expected, name
        assert output["documents"] == len(texts), name
        checked.append(name)
    assert {"megatron", "llmc", "pt", "raw", "timemoe", "datatrove", "dolma", "litdata"} <= set(checked)


def test_every_convert_output_reads_back_exactly(tmp_path: Path) -> None:
    documents = [[5, 6, 0], [], [7, 0], [8, 9, 10, 0]]  # Megatron's convention: EOD appended, none on empty
    with tokformats.create(tmp_path / "src", "megatron", vocab_size=500) as writer:
        for document in documents:
            writer.write(document)
    checked = []
    for name, writer_class in tokformats.api.corpus_writers().items():
        destination = writer_class.output_path(tmp_path / name / "c", "text", None, False)
        try:
            summary = tokformats.convert(tmp_path / "src", destination, name)
        except ImportError:
            continue
        if writer_class.boundaries == "bos":  # the delimiter moves to the start; the empty document gets one
            expected = [[0, *d[:-1]] if d else [0] for d in documents]
        elif writer_class.boundaries == "eos":
            expected = [d if d else [0] for d in documents]
        else:
            expected = documents
        output = {"path": str(destination), "files": [str(f) for f in summary["files"]]}
        with tokformats.open(_opened(output), **summary["read_with"]) as reader:
            assert [np.asarray(d).tolist() for d in reader] == expected, name
        assert summary["documents"] == len(documents), name
        checked.append(name)
    assert {"megatron", "llmc", "pt", "raw", "timemoe", "datatrove", "dolma", "litdata"} <= set(checked)


# -- item 10: a dataset opened by URL is named by its URL in messages --------------------------------------------


def test_headerless_file_by_url_is_named_by_its_url(tmp_path: Path) -> None:
    from tests.http_server import FileServer

    (tmp_path / "served").mkdir()
    np.arange(1, 101, dtype="<u4").tofile(tmp_path / "served" / "train.bin")
    server = FileServer(tmp_path / "served")
    try:
        status, _, stderr = cli("info", f"{server.url}/train.bin", "--cache-dir", "cache", cwd=tmp_path)
    finally:
        server.stop()
    assert status == 2
    assert stderr.startswith(f"tokformats: error: {server.url}/train.bin is not in a format tokformats recognises")
    assert "cache" not in stderr.split("\n")[0].split("recognises")[0]


# -- item 14 (part): --json on every command ----------------------------------------------------------------------


def test_every_command_takes_json(novel: Path, tmp_path: Path) -> None:
    from tokformats.cli import build_parser

    parser = build_parser()
    (commands,) = [a for a in parser._actions if hasattr(a, "choices") and isinstance(a.choices, dict)]
    lacking = [n for n, sub in commands.choices.items() if not any("--json" in a.option_strings for a in sub._actions)]
    assert lacking == []
    status, stdout, stderr = cli(
        "train-tokenizer", str(novel), "--vocab-size", "300", "-o", "tok.json", "-q", "--json", cwd=tmp_path
    )
    assert status == 0, stderr
    assert json.loads(stdout) == {"tokenizer": "tok.json", "vocab_size": 300, "padded_vocab_size": 320}
    with tokformats.create(tmp_path / "c", "megatron", vocab_size=500) as writer:
        writer.write_batch([1, 2, 3, 4, 5], [2, 3])
    for command in ("head", "tail", "sample"):
        status, stdout, stderr = cli(command, "c", "-n", "1", "--json", cwd=tmp_path)
        assert status == 0, stderr
        assert json.loads(stdout) == (
            [{"document": 1, "tokens": 3, "ids": [3, 4, 5]}]
            if command == "tail"
            else [{"document": 0, "tokens": 2, "ids": [1, 2]}] if command == "head" else json.loads(stdout)
        )
        assert len(json.loads(stdout)) == 1


# -- item 15: stats for a notebook, and a plot ------------------------------------------------------------------


def test_stats_display_and_plot(tokenizer_path: Path, tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    with tokformats.create(tmp_path / "c", "megatron", vocab_size=500) as writer:
        writer.write_batch([22, 22, 22, 5, 22, 6, 7], [2, 5])
    decode = Tokenizer.from_file(str(tokenizer_path)).decode
    with tokformats.open(tmp_path / "c") as reader:
        report = reader.stats(top=2, decode=decode)
        assert report["top_ids"][0] == {"id": 22, "count": 4, "text": decode([22])}
        assert json.loads(json.dumps(report))["documents"] == 2  # still the JSON-able dict
        text = repr(report).splitlines()
        assert text[0] == f"megatron {tmp_path / 'c'}: 2 documents, 7 tokens, uint16"
        assert text[-1] == f"most frequent ids: 22 {decode([22])!r} (4), 5 {decode([5])!r} (1)"
        html = report._repr_html_()
        assert "<th>p50</th>" in html and "<td>4</td>" in html and html.count("<tr>") == 2 + 3 + 3
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            with pytest.raises(ImportError, match=r"pip install 'tokformats\[plot\]'"):
                reader.plot()
            return
        axes = reader.plot(path=tmp_path / "lengths.png")
        assert [p.get_height() for p in axes.patches] == [1, 1] and (tmp_path / "lengths.png").is_file()


# -- item 16: the README is a guide: install first, every extra in a table, benchmarks beside their scripts ---------


def test_readme_installs_first_and_lists_every_extra() -> None:
    import tomllib

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    first_command = readme.split("```bash\n", 1)[1].split("\n", 1)[0]
    assert first_command.startswith('pip install ".[fast,hf]" && tokformats quickstart')
    sections = [line for line in readme.splitlines() if line.startswith("## ")]
    assert sections[0] == "## Install" and {"## Benchmarks", "## Tests"} <= set(sections)
    install = readme.split("## Install", 1)[1].split("\n## ", 1)[0]
    listed = {name.strip("` ") for row in install.splitlines() if row.startswith("| `") for name in
              row.split("|")[1].split(",")}  # fmt: skip
    assert set(extras) <= listed, set(extras) - listed
    benchmarks = readme.split("## Benchmarks", 1)[1].split("\n## ", 1)[0]
    assert len(benchmarks) < 2500 and "benchmarks/README.md" in benchmarks
    assert "bench_tokenize.py" in (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")


# -- item 14: progress on the text encoded, in batches bounded by text as well as documents ----------------------


def test_progress_counts_text_and_batches_long_documents_apart(tokenizer_path: Path, tmp_path: Path) -> None:
    import queue
    import threading

    from tokformats.tokenization.batching import MAX_BATCH_TEXT, read_batches
    from tokformats.tokenization.sources import Record

    long = "x" * (MAX_BATCH_TEXT // 2)
    out: queue.Queue = queue.Queue()
    read_batches(iter([Record(0, k, (long,)) for k in range(5)]), 1000, out, threading.Event(), [])
    sizes = []
    while (item := out.get()) is not None:
        sizes.append(len(item[0]))
    assert sizes == [2, 2, 1]  # not one batch of 5: each batch is encoded (and reported) after about 1 MiB of text
    texts = ["héllo wörld", "", "日本語のテキスト"]
    summary = tokformats.tokenize(texts, tokenizer_path, tmp_path / "t", "raw", progress=False)
    assert summary["text_characters"] == sum(map(len, texts))


# -- item 13 (by URL): info names the URL, sizes from the store, no download for the id scan, no empty .partial -


def test_info_by_url_names_the_url_and_downloads_only_the_index(tmp_path: Path) -> None:
    from tests.http_server import FileServer

    with tokformats.create(tmp_path / "served" / "c", "megatron", vocab_size=500) as writer:
        writer.write_batch(np.arange(1, 2001) % 400, [1000, 1000])
    server = FileServer(tmp_path / "served")
    try:
        found = info(f"{server.url}/c", tmp_path, "--cache-dir", "cache")
        scanned = info(f"{server.url}/c", tmp_path, "--cache-dir", "cache", "--scan")
    finally:
        server.stop()
    assert found["path"] == f"{server.url}/c" and found["files"] == [f"{server.url}/c.bin", f"{server.url}/c.idx"]
    sizes = {p.suffix: p.stat().st_size for p in (tmp_path / "served").iterdir()}
    assert found["bytes"] == sizes[".bin"] + sizes[".idx"]
    assert found["bytes_cached"] == sizes[".idx"]  # the .bin was not downloaded
    assert "min_id" not in found and (scanned["min_id"], scanned["max_id"]) == (0, 399)
    assert not [p for p in (tmp_path / "cache").rglob("*.partial") if not p.stat().st_size]


def test_convert_and_verify_show_a_bar_after_a_second(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tokformats.core.progress import DELAY, progress_bar

    assert progress_bar(10, "x", enabled=False) is None
    tqdm = pytest.importorskip("tqdm", reason="tqdm is not installed")
    bar = progress_bar(10, "convert", enabled=True)
    assert isinstance(bar, tqdm.tqdm) and bar.delay == DELAY == 1.0 and bar.total == 10
    bar.close()
    with tokformats.create(tmp_path / "c", "megatron", vocab_size=500) as writer:
        writer.write_batch([1, 2, 3], [3])
    tokformats.convert(tmp_path / "c", tmp_path / "r.bin", "raw", progress=True)  # quick: nothing printed
    with tokformats.open(tmp_path / "c") as reader:
        assert reader.problems(progress=True) == []
    assert capsys.readouterr().err == ""


def test_info_on_a_pt_folder_without_a_recorded_delimiter_says_how_to_split_it(tmp_path: Path) -> None:
    with tokformats.create(tmp_path / "old", "pt", tokens_per_shard=50, eos=0) as writer:
        writer.write_batch([5] * 30 + [6] * 30 + [7] * 30, [30, 30, 30])
    manifest = json.loads((tmp_path / "old" / "manifest.json").read_text())
    assert manifest.pop("document_delimiter") == {"eos": 0}
    (tmp_path / "old" / "manifest.json").write_text(json.dumps(manifest))  # as written before it was recorded
    status, stdout, stderr = cli("info", "old", cwd=tmp_path)
    assert status == 0 and "documents        2\n" in stdout
    assert stderr == (
        "warning: no document delimiter is recorded, so each of the 2 files reads as one document; if documents end "
        "with an id (the stream ends with 0), pass --eos 0.\n"
    )
    assert info("old", tmp_path, "--eos", "0")["documents"] == 3
