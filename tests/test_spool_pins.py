"""Joining a parallel run's partitions by a kernel copy: each worker pins its finished spool (fs/pins.py), the parent
copies pinned spools without reading them, and any write after the pin, before or during the copy, is still found
and nothing is published."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tokformats
from tokformats.errors import FormatError
from tokformats.fs.pins import pin_file, pinned
from tokformats.tokenization import outputs, spools
from tokformats.tokenization.partition_run import _PartitionRun
from tokformats.tokenization.sample_text import sample_texts
from tokformats.tokenization.spools import Spool


def _corpus(path: Path, count: int = 3000) -> Path:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in sample_texts(count)), encoding="utf-8")
    return path


def _run(corpus: Path, tokenizer: Path, out: Path, executor: Any = None, **options: Any) -> dict[str, Any]:
    return tokformats.tokenize(corpus, tokenizer, out, "megatron", progress=False, executor=executor, **options)


def _files(summary: dict[str, Any]) -> dict[str, bytes]:
    return {Path(f).name: Path(f).read_bytes() for o in summary["outputs"].values() for f in o["files"]}


def _recorded(monkeypatch: pytest.MonkeyPatch, name: str) -> list[str]:
    """The spools (by file name) that ``NAME`` is called for from now on, where the run calls it: ``join_spool``
    from the outputs' writing, ``copy_spool`` from the spools' joining."""
    seen: list[str] = []
    module = outputs if name == "join_spool" else spools
    original = getattr(module, name)

    def recording(writer: Any, folder: Path, stream: str, dtype: np.dtype, *rest: Any) -> Any:
        seen.append(f"{folder.name}/{stream}")
        return original(writer, folder, stream, dtype, *rest)

    monkeypatch.setattr(module, name, recording)
    return seen


def test_a_pin_moves_with_every_write_but_not_with_reads(tmp_path: Path) -> None:
    path = tmp_path / "spool.tokens"
    path.write_bytes(bytes(range(256)) * 64)
    pin = pin_file(path)
    assert pin is not None and pin[2] == 16384
    with open(path, "rb") as handle:
        assert pinned(handle.fileno(), pin)
        assert handle.read() == bytes(range(256)) * 64  # reading leaves it pinned
        assert pinned(handle.fileno(), pin)
    with open(path, "r+b") as handle:
        handle.write(b"\x00")  # same size, in place, right after the pin (the same clock tick, most likely)
        handle.flush()
        assert not pinned(handle.fileno(), pin)
    pin = pin_file(path)
    with open(path, "ab") as handle:
        handle.write(b"\x01")
        handle.flush()
        assert not pinned(handle.fileno(), pin)
    pin = pin_file(path)
    other = tmp_path / "other"
    other.write_bytes(path.read_bytes())
    os.replace(other, path)  # the same bytes in another file
    with open(path, "rb") as handle:
        assert not pinned(handle.fileno(), pin)
        for wrong in (None, "pin", [1, 2, 3, 4], [1, 2, 3, 4, 5.0], [*pin[:4], True]):
            assert not pinned(handle.fileno(), wrong)


def test_a_parallel_run_joins_pinned_spools_by_the_kernel_byte_identical(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tokenizer_path: Path
) -> None:
    corpus = _corpus(tmp_path / "in.jsonl")
    single = _run(corpus, tokenizer_path, tmp_path / "single" / "c", split="8:1:1")
    fed = _recorded(monkeypatch, "copy_spool")
    joined = _recorded(monkeypatch, "join_spool")
    with ThreadPoolExecutor(2) as pool:
        parallel = _run(corpus, tokenizer_path, tmp_path / "parallel" / "c", pool, partitions=5, split="8:1:1")
    assert len(joined) == 15 and fed == [], "every spool copied by the kernel, none read back"
    assert _files(parallel) == _files(single)
    assert parallel["documents"] == single["documents"] == 3000


def test_a_spool_written_after_its_pin_is_read_back_and_never_published(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tokenizer_path: Path
) -> None:
    corpus = _corpus(tmp_path / "in.jsonl")
    original = _PartitionRun.save

    def save_then_tamper(self: Any, done: bool = False) -> None:
        original(self, done)
        if done and self.checkpoint.parent.name == "part-0002":  # an orphan writing on after "done"
            with open(next(iter(self.spools.values())).tokens_path, "r+b") as handle:
                handle.write(b"\x07\x00")

    monkeypatch.setattr(_PartitionRun, "save", save_then_tamper)
    fed = _recorded(monkeypatch, "copy_spool")
    with ThreadPoolExecutor(2) as pool, pytest.raises(FormatError, match="differs from what its checkpoint recorded"):
        _run(corpus, tokenizer_path, tmp_path / "o", pool, partitions=4)
    assert fed == ["part-0002/text"], "the moved pin sent that spool (only) to be read and hashed"
    assert not list(tmp_path.glob("o_*")), "nothing was published"


def test_a_write_while_the_kernel_copies_is_found(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tokenizer_path: Path
) -> None:
    from tokformats.formats import megatron

    corpus = _corpus(tmp_path / "in.jsonl")
    copy = megatron.append_open_file

    def copy_while_written(source: Any, destination: Any, size: int, **options: Any) -> int:
        with open(source.name, "r+b") as other:
            other.write(b"\x07\x00")  # in place: the same size, and the same bytes go on being copied
        return copy(source, destination, size, **options)

    monkeypatch.setattr(megatron, "append_open_file", copy_while_written)
    with ThreadPoolExecutor(2) as pool, pytest.raises(FormatError, match="differs from what its checkpoint recorded"):
        _run(corpus, tokenizer_path, tmp_path / "o", pool, partitions=3)
    assert not list(tmp_path.glob("o_*")), "nothing was published"


def test_a_resumed_done_partition_is_pinned_anew_and_joined_by_the_kernel(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tokenizer_path: Path
) -> None:
    corpus = _corpus(tmp_path / "in.jsonl")
    reference = _run(corpus, tokenizer_path, tmp_path / "ref" / "c")

    def failing(*args: Any, **kwargs: Any) -> None:
        raise OSError("the disk is full (a test)")

    with monkeypatch.context() as patched, ThreadPoolExecutor(1) as pool:
        patched.setattr("tokformats.tokenization.outputs.join_spool", failing)
        with pytest.raises(OSError, match="the disk is full"):
            _run(corpus, tokenizer_path, tmp_path / "o", pool, partitions=3)
    done = tmp_path / "o.tokenize" / "part-0000"
    checkpoint = json.loads((done / "checkpoint.json").read_text())
    assert checkpoint["done"] and len(checkpoint["spools"]["text"]["pin"]) == 5
    os.utime(done / "text.tokens")  # the pin moves (as a backup's restore moves it); the bytes do not
    fed = _recorded(monkeypatch, "copy_spool")
    with ThreadPoolExecutor(2) as pool:
        resumed = _run(corpus, tokenizer_path, tmp_path / "o", pool, partitions=3, resume=True)
    assert fed == [], "the resumed worker checked the bytes and pinned them anew"
    assert list(_files(resumed).values()) == list(_files(reference).values())


def test_a_spool_written_to_by_another_before_its_pin_is_refused(tmp_path: Path) -> None:
    """The worker reads its spool back before pinning it: bytes changed in place while it was being written (by
    anything but the spool) are found there, not pinned and copied unread."""
    spool = Spool(tmp_path, "text", np.dtype(np.uint16))
    spool.append(np.arange(100, dtype=np.uint16), np.array([60, 40]))
    spool.sync()
    with open(spool.tokens_path, "r+b") as other:
        other.write(b"\x07\x00")
    with pytest.raises(FormatError, match=r"text\.tokens differs from what its checkpoint recorded"):
        spool.pin()
    spool.close()
    (tmp_path / "ok").mkdir()
    fine = Spool(tmp_path / "ok", "text", np.dtype(np.uint16))
    fine.append(np.arange(100, dtype=np.uint16), np.array([60, 40]))
    fine.sync()
    pin = fine.pin()
    with open(fine.tokens_path, "rb") as handle:
        assert pin is None or pinned(handle.fileno(), pin)
    fine.close()
