"""Issue 23, items 6-7: allocations bounded by the file, FIFOs refused under every explicit format, and every
environmental or foreign exception either the library's error or its own type naming the file.
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tokformats
from tokformats import FormatError

ROOT = Path(__file__).resolve().parents[1]


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


# -- item 6: JSON inputs are parsed under a size cap, and only numbers reach NumPy ----------------------------------


def _json_inputs(tmp_path: Path) -> dict[str, tuple[Any, dict[str, Any], Path]]:
    """Each JSON input tokformats parses: (what to open, options, the JSON file)."""
    found: dict[str, tuple[Any, dict[str, Any], Path]] = {}
    with tokformats.create(tmp_path / "tm", "timemoe") as writer:
        writer.write([1.0, 2.0])
    found["timemoe meta.json"] = (tmp_path / "tm", {"format": "timemoe"}, tmp_path / "tm" / "meta.json")
    with tokformats.create(tmp_path / "pt", "pt", tokens_per_shard=4, vocab_size=100) as writer:
        writer.write_batch(np.arange(8), [8])
    found["pt manifest.json"] = (tmp_path / "pt", {"format": "pt"}, tmp_path / "pt" / "manifest.json")
    found["pt checkpoints.json"] = (tmp_path / "pt", {"format": "pt"}, tmp_path / "pt" / "checkpoints.json")
    with tokformats.create(tmp_path / "lit", "litdata", vocab_size=100) as writer:
        writer.write_batch(np.arange(8), [8])
    found["litdata index.json"] = (tmp_path / "lit", {"format": "litdata"}, tmp_path / "lit" / "index.json")
    pytest.importorskip("pyarrow")
    with tokformats.create(tmp_path / "hf", "hf", vocab_size=100) as writer:
        writer.write_batch(np.arange(8), [8])
    found["hf state.json"] = (tmp_path / "hf", {"format": "hf"}, tmp_path / "hf" / "state.json")
    found["hf dataset_info.json"] = (tmp_path / "hf", {"format": "hf"}, tmp_path / "hf" / "dataset_info.json")
    (tmp_path / "s.json").write_text(json.dumps([[1.0, 2.0, 3.0]] * 10))
    found["sequences .json"] = (tmp_path / "s.json", {"format": "sequences"}, tmp_path / "s.json")
    (tmp_path / "s.jsonl").write_text("\n".join(json.dumps([1.0, 2.0, 3.0]) for _ in range(10)))
    found["sequences .jsonl"] = (tmp_path / "s.jsonl", {"format": "sequences"}, tmp_path / "s.jsonl")
    return found


def test_every_json_input_is_refused_past_the_size_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inputs = _json_inputs(tmp_path)
    for name, (target, options, json_file) in inputs.items():
        with tokformats.open(target, **options) as reader:  # under the default cap: read
            assert len(reader) >= 1, name
        assert json_file.stat().st_size < 5000, name
        original = json_file.read_bytes()
        json_file.write_bytes(original + b" " * 10_000)  # still valid JSON; now the one file past the cap
        monkeypatch.setenv("TOKFORMATS_MAX_JSON_BYTES", "5000")
        with pytest.raises(FormatError, match="TOKFORMATS_MAX_JSON_BYTES") as caught:
            with tokformats.open(target, **options) as reader:
                reader.problems()
        assert str(json_file) in str(caught.value) and "5,000 bytes" in str(caught.value), name
        monkeypatch.delenv("TOKFORMATS_MAX_JSON_BYTES")
        with tokformats.open(target, **options) as reader:  # padded, under the default cap: read
            assert len(reader) >= 1, name
        json_file.write_bytes(original)


def test_a_tokenize_checkpoint_is_read_under_the_cap(
    tmp_path: Path, tokenizer_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    texts = tmp_path / "in.jsonl"
    texts.write_text("".join(json.dumps({"text": f"document {k}"}) + "\n" for k in range(50)) + "{bad\n")
    with pytest.raises(FormatError):
        tokformats.tokenize(texts, tokenizer_path, tmp_path / "o", progress=False, batch_size=10, checkpoint_every=0)
    monkeypatch.setenv("TOKFORMATS_MAX_JSON_BYTES", "40")
    with pytest.raises(FormatError, match=r"checkpoint\.json is .* bytes, more than the 40 bytes"):
        tokformats.tokenize(texts, tokenizer_path, tmp_path / "o", progress=False, resume=True)


MIXED = """
import json, resource, sys, tokformats
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))  # far below the 7.45 GiB NumPy asked for
try:
    tokformats.open(sys.argv[1], format="sequences")
except tokformats.FormatError as error:
    print("refused:", str(error)[:200])
"""


@pytest.mark.parametrize("suffix", [".json", ".jsonl"])
@pytest.mark.parametrize(
    "series",
    [[1.0] * 2000 + ["A" * 10**6], ["A" * 10**7], [1, {"x": 2}], [2**70, 1], [[1, 2], [3]]],
    ids=["numbers-then-a-1MB-string", "a-10MB-string", "an-object", "an-integer-past-64-bits", "ragged-rows"],
)
def test_a_series_of_non_numbers_is_refused_without_a_large_allocation(
    tmp_path: Path, suffix: str, series: list[Any]
) -> None:
    path = tmp_path / f"s{suffix}"
    path.write_text(json.dumps([series]) if suffix == ".json" else json.dumps(series) + "\n")
    done = subprocess.run([sys.executable, "-c", MIXED, str(path)], capture_output=True, text=True, timeout=60,
                          env=child_env())  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("refused:") and "item 0 must be a list of numbers" in done.stdout


FIFO = """
import os, signal, sys, tokformats
signal.alarm(20)  # a hang fails the test instead of blocking it
folder = sys.argv[1]
for name in list(tokformats.formats):
    for file in ("x.bin", "x.npy", "x.ds", "x.pt", "x.json", "x.jsonl"):
        path = os.path.join(folder, file)
        if os.path.lexists(path):
            os.unlink(path)
        os.mkfifo(path)
        try:
            tokformats.open(path, format=name)
            print("opened", name, file)
        except tokformats.FormatError:
            print("refused", name, file)
"""


def test_a_fifo_is_refused_under_every_explicit_format(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", FIFO, str(tmp_path)], capture_output=True, text=True, timeout=120,
                          env=child_env())  # fmt: skip
    assert done.returncode == 0, (done.returncode, done.stdout[-500:], done.stderr[-2000:])
    lines = done.stdout.splitlines()
    assert len(lines) == 6 * len(tokformats.formats) and all(line.startswith("refused") for line in lines)


# -- item 7: foreign exceptions ------------------------------------------------------------------------------------


def dolma_with_rows(tmp_path: Path, rows: str) -> Path:
    import gzip

    np.arange(10, dtype="<u2").tofile(tmp_path / "a.npy")
    with gzip.open(tmp_path / "a.csv.gz", "wt") as handle:
        handle.write(rows)
    return tmp_path / "a.npy"


def test_odd_dolma_rows_are_a_format_error(tmp_path: Path) -> None:
    path = dolma_with_rows(tmp_path, f"0,{2**63},x,y,z\n")
    with pytest.raises(FormatError, match="must fit int64"):
        tokformats.open(path, format="dolma")[:]


def test_a_dolma_field_past_the_csv_limit_is_a_format_error_where_it_is_read(tmp_path: Path) -> None:
    """The reader needs only the start,end columns (parsed vectorised); the other fields go through ``csv`` when
    asked for, and a field past its size limit is then a library error."""
    path = dolma_with_rows(tmp_path, '0,10,"' + "x" * 200_000 + '",y,z\n')
    with tokformats.open(path, format="dolma") as reader:
        assert reader[0].tolist() == list(range(10))
        with pytest.raises(FormatError, match="not CSV rows"):
            reader.document_metadata(0)


@pytest.mark.parametrize("name", [3.0, [], {}, None])
def test_hf_state_filenames_that_are_not_strings_are_a_format_error(tmp_path: Path, name: Any) -> None:
    pytest.importorskip("pyarrow")
    with tokformats.create(tmp_path / "h", "hf", vocab_size=100) as writer:
        writer.write([1, 2, 3])
    state = json.loads((tmp_path / "h" / "state.json").read_text())
    state["_data_files"] = [{"filename": name}]
    (tmp_path / "h" / "state.json").write_text(json.dumps(state))
    for options in ({}, {"format": "hf"}):
        with pytest.raises(FormatError):
            tokformats.open(tmp_path / "h", **options)[:]


def test_a_self_referencing_legacy_pt_is_a_format_error(tmp_path: Path) -> None:
    loop: list[Any] = []
    loop.append(loop)
    pieces = [0x1950A86A20F9469CFC6C, 1001, {"protocol_version": 1001, "little_endian": True}, loop, []]
    (tmp_path / "r.pt").write_bytes(b"".join(pickle.dumps(p, protocol=2) for p in pieces))
    for options in ({}, {"format": "pt"}):
        with pytest.raises(FormatError):
            tokformats.open(tmp_path / "r.pt", **options)[:]


def test_names_longer_than_the_file_system_allows_are_a_format_error(tmp_path: Path) -> None:
    long = tmp_path / ("x" * 300)
    with pytest.raises(FormatError, match="longer than the file system allows"):
        tokformats.open(f"{long}.bin")
    with pytest.raises(FormatError, match="longer than the file system allows"):
        tokformats.open(f"{long}.bin", format="raw", dtype="uint16")
    with pytest.raises(FormatError, match="longer than the file system allows"):
        tokformats.create(long, "megatron", vocab_size=10)


def test_an_unreadable_file_keeps_its_permission_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    with tokformats.create(tmp_path / "m", "megatron", vocab_size=100) as writer:
        writer.write([1, 2, 3])
    if os.geteuid() != 0:  # a real chmod 000 where it means something
        os.chmod(tmp_path / "m.idx", 0)
    else:  # root reads everything: make the index unreadable to this process only
        real_open, denied = builtins.open, str(tmp_path / "m.idx")

        def deny(file: Any, *args: Any, **kwargs: Any) -> Any:
            if str(file) == denied:
                raise PermissionError(errno.EACCES, "Permission denied", denied)
            return real_open(file, *args, **kwargs)

        monkeypatch.setattr(builtins, "open", deny)
    try:
        with pytest.raises(PermissionError) as caught:
            tokformats.open(tmp_path / "m")
        assert caught.value.filename == str(tmp_path / "m.idx")
    finally:
        os.chmod(tmp_path / "m.idx", 0o644)


def test_importing_a_format_module_first_keeps_the_registry_whole() -> None:
    code = (
        "import tokformats.formats.pt as pt\n"
        "import tokformats\n"
        "print(pt.__name__, 'pt' in tokformats.formats, len(tokformats.formats), tokformats.formats['pt'].name)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=child_env())
    assert done.returncode == 0, done.stderr[-2000:]
    name, registered, count, found = done.stdout.split()
    assert (name, registered, found) == ("tokformats.formats.pt", "True", "pt") and int(count) >= 11


def test_a_journal_staging_file_is_removed_when_the_disk_fills(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tokformats.fs import journal

    def full(_: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(journal.os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        journal.write_journal(tmp_path, [(tmp_path / ".a.1.000000000000.tmp", tmp_path / "a")], [])
    assert list(tmp_path.iterdir()) == []


@pytest.fixture()
def small_disk(tmp_path: Path):  # type: ignore[no-untyped-def]
    folder = tmp_path / "small"
    folder.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode(errors='replace').strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], capture_output=True)


def test_a_full_disk_names_the_output_of_tokenize_and_merge(
    small_disk: Path, tmp_path: Path, tokenizer_path: Path
) -> None:
    source = tmp_path / "source"
    with tokformats.create(source, "megatron", vocab_size=50000) as writer:
        writer.write_batch(np.arange(100_000) % 50000, [100_000])
    with pytest.raises(OSError, match="No space left") as caught:
        tokformats.megatron.merge([source, source], small_disk / "merged")
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(small_disk / "merged")
    texts = tmp_path / "in.jsonl"
    texts.write_text("".join(json.dumps({"text": f"doc {k} " * 50}) + "\n" for k in range(3000)))
    with pytest.raises(OSError, match="No space left") as caught:
        tokformats.tokenize(texts, tokenizer_path, small_disk / "out", progress=False)
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(small_disk / "out")


def test_a_read_only_fully_populated_cache_is_usable(tmp_path: Path) -> None:
    from .http_server import FileServer

    if os.geteuid() != 0:
        pytest.skip("remounting a tmpfs read-only needs root")
    cache = tmp_path / "cache"
    cache.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(cache)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    served = tmp_path / "served"
    with tokformats.create(served / "d" / "m", "megatron", vocab_size=100) as writer:
        writer.write_batch(np.arange(50) % 100, [10] * 5)
    server = FileServer(served)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/d/m"
        from tokformats.cli import main

        assert main(["fetch", url, "--cache-dir", str(cache)]) == 0
        assert subprocess.run(["mount", "-o", "remount,ro", str(cache)], capture_output=True).returncode == 0
        for offline in (False, True):
            with tokformats.open(url, cache_dir=cache, offline=offline) as reader:
                assert [d.tolist() for d in reader] == [list(range(k, k + 10)) for k in range(0, 50, 10)]
    finally:
        server.stop()
        subprocess.run(["umount", str(cache)], capture_output=True)
