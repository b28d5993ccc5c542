"""Messages a user meets on bad input (review of error messages): library error types, full sentences that name
the file and the option, hints that run as printed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tokformats
from tokformats import ConfigError, NoFilesError, OutputExistsError
from tokformats.cli import main
from tokformats.formats import megatron
from tokformats.remote import NotFoundError, RemoteError
from tokformats.remote.cache import NotCachedError

from .http_server import FileServer


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = main(args)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def megatron_dataset(prefix: Path, start: int = 0) -> Path:
    """Three small documents of uint16 ids from ``start``."""
    with tokformats.create(prefix, "megatron", dtype="uint16") as writer:
        for k in range(3):
            writer.write(np.arange(start, start + 10 + k, dtype=np.uint16))
    return prefix


@pytest.fixture()
def two(tmp_path: Path) -> tuple[Path, Path]:
    return megatron_dataset(tmp_path / "m" / "a"), megatron_dataset(tmp_path / "m" / "b", 300)


# 1. An output that exists: the library's sentence, not a tuple rebuilt from (errno, strerror, filename).


def test_merge_onto_an_existing_output_says_so_in_a_sentence(
    two: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = two
    output = a.parent / "ab"
    megatron.merge([a, b], output)
    with pytest.raises(OutputExistsError) as caught:
        megatron.merge([a, b], output)
    assert str(caught.value) == f"{output}.idx already exists; pass overwrite=True to replace it (nothing was written)."
    status, _, err = run(["merge", str(a), str(b), "-o", str(output)], capsys)
    assert status == 2
    assert (
        err
        == f"tokformats: error: {output}.idx already exists; pass --overwrite to replace it (nothing was written).\n"
    )


def test_naming_output_leaves_library_errors_as_they_are(tmp_path: Path) -> None:
    from tokformats.fs.atomic import naming_output

    for error in (OutputExistsError("x.idx already exists."), NoFilesError("no file matches x*.bin.")):
        assert naming_output(error, tmp_path / "out") is error
    disk_full = OSError(28, "No space left on device", str(tmp_path / "out.idx.tmp"))
    renamed = naming_output(disk_full, tmp_path / "out")
    assert type(renamed) is OSError and renamed.filename == str(tmp_path / "out") and renamed.errno == 28


# 2. A list or a glob given for a Megatron dataset: opened when it names one dataset, else a sentence that says so.


def test_a_list_or_glob_naming_one_megatron_dataset_opens_it(two: tuple[Path, Path]) -> None:
    a, _ = two
    for path in ([a], [str(a)], [f"{a}.bin", f"{a}.idx"], f"{a}.*", f"{a.parent}/a.?dx"):
        with tokformats.open(path) as reader:
            assert isinstance(reader, megatron.Reader) and reader.prefix == a and len(reader) == 3, path


def test_a_list_or_glob_naming_several_megatron_datasets_says_how_to_merge(
    two: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = two
    for path, given in (([a, b], "the list of paths"), (f"{a.parent}/*.bin", repr(f"{a.parent}/*.bin"))):
        with pytest.raises(ConfigError) as caught:
            tokformats.open(path)
        message = str(caught.value)
        assert message.startswith(f"a Megatron dataset is opened by one PREFIX (or its .bin or .idx); {given} names 2")
        assert f"tokformats merge {a} {b} -o {a.parent / 'merged'}" in message
        assert "[" not in message.split(";")[0] and ".idx does not exist" not in message
    status, _, err = run(["stats", str(a), str(b)], capsys)
    assert status == 2 and "names 2 datasets" in err
    command = err.split("merge them first: ")[1].split(" (in Python")[0]
    status, out, _ = run(command.split()[1:], capsys)  # the hint runs as printed
    assert status == 0 and "6 documents" in out
    call = err.split("(in Python, ")[1].rsplit(").", 1)[0]
    assert call.startswith("tokformats.megatron.merge(")
    merged = eval(call.replace("merged'", "merged_in_python'"))  # the Python spelling runs as printed too
    assert len(merged) == 6


# 3. A delimiter that cannot occur in the stream is refused, naming the option and the dtype's range.

IMPOSSIBLE = ["x", 2.5, True, -1, 70000, np.int64(70000)]


@pytest.fixture()
def raw_stream(tmp_path: Path) -> Path:
    path = tmp_path / "train.bin"
    np.arange(100, dtype=np.uint16).tofile(path)
    return path


@pytest.mark.parametrize("value", IMPOSSIBLE, ids=repr)
@pytest.mark.parametrize("name", ["eos", "bos"])
def test_raw_reader_refuses_a_delimiter_the_dtype_cannot_hold(raw_stream: Path, name: str, value: object) -> None:
    with pytest.raises(ConfigError) as caught:
        tokformats.open(raw_stream, format="raw", dtype="uint16", **{name: value})
    message = str(caught.value)
    assert message.startswith(f"{raw_stream}: {name}=ID must be an id from 0 to 65,535 (uint16's range)")
    assert message.endswith(
        f"found {value.item() if isinstance(value, np.generic) else value!r} ({type(value).__name__})."
    )


def test_raw_reader_refuses_eos_and_bos_together(raw_stream: Path) -> None:
    with pytest.raises(ConfigError, match=r"train.bin: pass eos=ID .* or bos=ID .*, not both; found eos=1, bos=2"):
        tokformats.open(raw_stream, format="raw", dtype="uint16", eos=1, bos=2)


def test_raw_reader_takes_an_id_of_any_integer_type(raw_stream: Path) -> None:
    for value in (5, np.uint16(5), np.int64(5)):
        with tokformats.open(raw_stream, format="raw", dtype="uint16", eos=value) as reader:
            assert reader.eos == 5 and type(reader.eos) is int and len(reader) == 2


@pytest.fixture()
def llmc_shard(tmp_path: Path) -> Path:
    with tokformats.create(tmp_path / "s", "llmc", bos=50256, vocab_size=50257) as writer:
        writer.write([1, 2, 3])
        writer.write([4, 5])
    (shard,) = tmp_path.glob("s*.bin")
    return shard


@pytest.mark.parametrize("value", IMPOSSIBLE[1:], ids=repr)
def test_llmc_reader_refuses_a_delimiter_the_dtype_cannot_hold(llmc_shard: Path, value: object) -> None:
    for name in ("bos", "eos"):
        with pytest.raises(ConfigError, match=rf"{llmc_shard.name}: {name}=ID must be an id from 0 to 65,535"):
            tokformats.open(llmc_shard, **{name: value})


def test_llmc_reader_delimiters_given_still_open(llmc_shard: Path) -> None:
    with pytest.raises(ConfigError, match="not both; found eos=3, bos=50256"):
        tokformats.open(llmc_shard, eos=3, bos=50256)
    with tokformats.open(llmc_shard, eos=3) as reader:
        assert (reader.bos, reader.eos, len(reader)) == (None, 3, 2)
    with tokformats.open(llmc_shard, bos=None) as reader:
        assert (reader.bos, reader.eos, len(reader)) == (None, None, 1)
    with tokformats.open(llmc_shard) as reader:
        assert (reader.bos, reader.bos_rule, len(reader)) == (50256, "family", 2)


# 4. Bare Python errors from user input are library errors that say what was expected.


@pytest.mark.parametrize("path", [None, 123, 1.5, b"data/a", [None], ["data/a", 3]], ids=repr)
def test_open_of_something_that_is_no_path_says_what_open_takes(path: object) -> None:
    with pytest.raises(ConfigError) as caught:
        tokformats.open(path)
    message = str(caught.value)
    assert message.startswith("a dataset is named by a path (a str or os.PathLike: a file, a Megatron prefix, a folder")
    found = path[-1] if isinstance(path, list) else path
    assert f"found {found!r} ({type(found).__name__})" in message
    assert message.endswith(" in the list.") == isinstance(path, list)


@pytest.mark.parametrize("format", ["megatron", "raw", "llmc"])
def test_a_write_after_close_names_the_file(tmp_path: Path, format: str) -> None:
    writer = tokformats.create(tmp_path / "out", format, dtype="uint16")
    writer.write([1, 2])
    writer.close()
    with pytest.raises(tokformats.FormatError) as caught:
        writer.write([3])
    assert str(caught.value).startswith(f"{writer.path}: this {format} writer is already committed")
    aborted = tokformats.create(tmp_path / "gone", format, dtype="uint16")
    aborted.abort()
    with pytest.raises(tokformats.FormatError, match=r"already aborted \(nothing of it was written\)"):
        aborted.write([3])


def test_a_document_that_is_not_numbers_names_the_file(tmp_path: Path) -> None:
    for format in ("megatron", "raw"):
        with tokformats.create(tmp_path / format, format, dtype="uint16") as writer:
            writer.write([1])
            with pytest.raises(tokformats.TokenRangeError) as caught:
                writer.write(["a"])
            assert str(caught.value) == f"{writer.path}: document 1 must be integers or floats, found dtype <U1."
            with pytest.raises(tokformats.TokenRangeError, match=rf"^{writer.path}: flat_ids must be integers"):
                writer.write_batch(["a", "b"], [2])
    with tokformats.create(tmp_path / "m2", "megatron", dtype="uint16") as writer:
        with pytest.raises(tokformats.TokenRangeError, match=rf"^{writer.path}: a sequence of document 0 must be"):
            writer.add_item(["a"])


# 5. verify names an id out of range by its document and its place there, with plain numbers.


def test_verify_names_the_document_and_the_token_within_it(
    two: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _, b = two  # documents of 10, 11 and 12 ids from 300
    with tokformats.open(b) as reader:
        found = reader.problems(vocab_size=310)
    assert [str(p) for p in found] == [
        f"{b}: document 1 ids: its token 10 (token 20 of the stream) holds 310, which is not below vocab_size 310",
        f"{b}: document 2 ids: its token 10 (token 31 of the stream) holds 310, which is not below vocab_size 310",
        f"{b}: document 2 ids: its token 11 (token 32 of the stream) holds 311, which is not below vocab_size 310",
    ]
    status, out, err = run(["verify", str(b), "--vocab-size", "310"], capsys)
    assert status != 0 and "np." not in out + err and "its token 10 (token 20 of the stream) holds 310" in out + err


def test_verify_names_a_float_value_plainly(tmp_path: Path) -> None:
    path = tmp_path / "v.bin"
    np.array([1.0, np.nan, 2.0], dtype=np.float32).tofile(path)
    with tokformats.open(path, format="raw", dtype="float32", eos=None) as reader:
        (problem,) = reader.problems()
    assert problem.message == "its token 1 (token 1 of the stream) holds nan, which is not finite"


# 6. A refused option's hint spells each option as the caller can type it: no Python keyword offered as a flag.


def test_a_refused_option_names_the_options_as_the_caller_types_them(
    two: tuple[Path, Path], llmc_shard: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, _ = two
    status, _, err = run(["head", str(a), "--eos", "5"], capsys)
    assert status == 2
    assert err == (
        f"tokformats: error: {a}: the megatron reader takes no command-line option (multimodal= in Python only), "
        "not --eos; it applies to dolma, llmc, pt, raw.\n"
    )
    status, _, err = run(["info", str(llmc_shard), "--dtype", "uint32"], capsys)
    assert status == 2
    assert err == (
        f"tokformats: error: {llmc_shard}: the llmc reader takes --bos, --eos (and open_maps= in Python only), "
        "not --dtype; it applies to datatrove, dolma, raw, sequences.\n"
    )
    with pytest.raises(ConfigError) as caught:
        tokformats.open(llmc_shard, dtype="uint32")
    assert str(caught.value) == (
        f"{llmc_shard}: the llmc reader takes bos=, eos=, open_maps=, not dtype=; "
        "it applies to datatrove, dolma, raw, sequences."
    )


# 7. By URL: the file the URL names is the one a message is about, and a folder that is not there says the status.


@pytest.fixture()
def served_shard(server: FileServer) -> str:
    with tokformats.create(Path(server.root) / "l" / "owt2", "llmc", vocab_size=1000, bos=0) as writer:
        writer.write([1, 2])
        writer.write([3])
    return f"{server.url}/l/owt2_000000.bin"


@pytest.mark.usefixtures("quick_retries")
def test_an_llmc_shard_by_url_offline_and_uncached_names_the_shard(tmp_path: Path, served_shard: str) -> None:
    with pytest.raises(NotCachedError) as caught:
        tokformats.open(served_shard, cache_dir=tmp_path / "cache", offline=True)
    assert str(caught.value).startswith(f"{served_shard} is not in the cache (")
    assert ".idx" not in str(caught.value)
    with tokformats.open(served_shard, cache_dir=tmp_path / "cache") as reader:  # online once: then offline opens
        assert reader.format == "llmc"
    with tokformats.open(served_shard, cache_dir=tmp_path / "cache", offline=True) as reader:
        assert [d.tolist() for d in reader] == [[0, 1, 2], [0, 3]]


@pytest.mark.usefixtures("quick_retries")
def test_a_missing_file_by_url_names_that_file(tmp_path: Path, server: FileServer) -> None:
    with pytest.raises(NotFoundError) as caught:
        tokformats.open(f"{server.url}/nothere/x.bin", cache_dir=tmp_path / "cache")
    assert str(caught.value) == f"{server.url}/nothere/x.bin does not exist (HTTP 404)."


@pytest.mark.usefixtures("quick_retries")
def test_a_folder_url_that_is_not_there_names_the_http_status(
    tmp_path: Path, server: FileServer, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"{server.url}/nothere/"
    with pytest.raises(NotFoundError) as caught:
        tokformats.open(url, cache_dir=tmp_path / "cache")
    message = str(caught.value)
    assert message.startswith(f"{url} names no dataset: the store lists no file there")
    assert "(SHA256SUMS, manifest.json, meta.json, index.json, state.json: each answered HTTP 404)" in message
    assert "Check the URL" in message
    server.fault("elsewhere/SHA256SUMS", "status", 404)
    for name in ("manifest.json", "meta.json", "index.json", "state.json"):
        server.fault(f"elsewhere/{name}", "status", 403)
    with pytest.raises(RemoteError, match=r"answered HTTP 403") as denied:
        tokformats.open(f"{server.url}/elsewhere/", cache_dir=tmp_path / "cache")
    assert not isinstance(denied.value, NotFoundError)
    with pytest.raises(RemoteError, match=r"cannot be listed offline: none of SHA256SUMS, manifest.json"):
        tokformats.open(url, cache_dir=tmp_path / "cache2", offline=True)


# 8. A truncated Megatron .bin: no token count the index contradicts; head refuses it as info does.


@pytest.fixture()
def truncated(tmp_path: Path) -> Path:
    """A Megatron dataset of 10,000 five-token documents (three blocks of sequences) whose .bin lost its last 5
    tokens: the leading documents read, the far end of the index does not match."""
    prefix = tmp_path / "big" / "c"
    with tokformats.create(prefix, "megatron", dtype="uint16") as writer:
        writer.write_batch(np.arange(50_000) % 1000, np.full(10_000, 5))
    data = Path(f"{prefix}.bin")
    data.write_bytes(data.read_bytes()[:-10])
    return prefix


SHORT = r"c.bin: the index's sequences end at byte 100,000 \(50,000 uint16 tokens\), but the file has 99,990 bytes"


def test_a_truncated_megatron_bin_states_no_token_count(truncated: Path) -> None:
    with tokformats.open(truncated) as reader:
        assert reader[0].tolist() == [0, 1, 2, 3, 4]  # what is readable reads (no far page at open or first read)
        with pytest.raises(tokformats.SizeMismatchError, match=SHORT):
            reader.num_tokens  # noqa: B018
        text = repr(reader)
        assert "tokens=unknown (" in text and "99,990 bytes" in text and "49,995" not in text
        assert "49,995" not in reader._repr_html_()


@pytest.mark.parametrize("command", ["head", "tail", "sample"])
def test_head_refuses_a_truncated_megatron_bin_as_info_does(
    truncated: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run([command, str(truncated), "-n", "2"], capsys)
    assert status == 2 and out == ""
    assert err.startswith("tokformats: error: ") and "99,990 bytes (truncated, or not this index's data)" in err
    status, _, err = run(["info", str(truncated)], capsys)
    assert status == 2 and "99,990 bytes" in err


def test_an_intact_megatron_dataset_counts_its_tokens(
    two: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    a, _ = two
    with tokformats.open(a) as reader:
        assert reader.num_tokens == 33 and "tokens=33 " in repr(reader)
    status, out, _ = run(["head", str(a), "-n", "1"], capsys)
    assert status == 0 and out.startswith("--- document 0 (10 tokens) ---")


def test_a_tokenizer_that_is_not_there_lists_the_vocabularies_or_names_the_one_misspelt(tmp_path: Path) -> None:
    from tokformats.core.vocab import load_tokenizer

    with pytest.raises(NoFilesError, match=r"^gpt2 does not exist; give a tokenizer.json, .* available offline "
                       r"\(cl100k_base, o200k_base, llama3, deepseek_v3\); from Python, a tokenizers.Tokenizer too\.$"):
        load_tokenizer("gpt2")
    with pytest.raises(NoFilesError, match=r"^CL100K_BASE does not exist; the vocabulary's name is cl100k_base "):
        load_tokenizer("CL100K_BASE")
    with pytest.raises(NoFilesError, match=r"tok\.json does not exist; give a tokenizer\.json"):
        load_tokenizer(tmp_path / "tok.json")


def test_a_megatron_prefix_spelling_glob_characters_opens_as_the_prefix(tmp_path: Path) -> None:
    prefix = tmp_path / "run[1]"
    with tokformats.create(prefix, "megatron", vocab_size=1000) as writer:
        writer.write_batch(np.arange(10) % 100, [4, 6])
    with tokformats.open(prefix, format="megatron") as reader:
        assert [len(d) for d in reader] == [4, 6]


@pytest.mark.parametrize("options", [{"eos": -1}, {"eos": 70_000}, {"eos": "x"}, {"eos": 3, "bos": 1}])
def test_pt_and_dolma_readers_refuse_a_delimiter_their_dtype_cannot_hold(tmp_path: Path, options: dict) -> None:
    for name, target in (("pt", tmp_path / "p.pt"), ("dolma", tmp_path / "d")):
        if (name == "dolma" and "bos" in options) or (name == "pt" and options == {"eos": 70_000}):
            continue  # dolma's reader takes eos= only; a .pt stream is int64, which holds 70,000
        with tokformats.create(target, name, vocab_size=1000, overwrite=True) as writer:
            writer.write_batch(np.arange(10) % 100, [4, 6])
        with pytest.raises(ConfigError, match=rf"{target.name}: (eos=ID must be an id from 0 to|pass eos=ID)"):
            tokformats.open(target, format=name, **options)
