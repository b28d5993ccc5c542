"""A single-partition tokenize run publishes its spools as the outputs' data files (Megatron's ``.bin`` is the
spool, hard-linked into the commit): byte-identical to copying them, resumable after a kill or a crash at any
point before the commit, never publishing half an output; formats without a flat data file, and file systems
without hard links, copy as before; ids are checked as they are spooled."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tokformats
from tokformats.errors import FormatError
from tokformats.formats import megatron
from tokformats.fs.pins import pin_file
from tokformats.tokenization import outputs, spools
from tokformats.tokenization.encoder import Encoder
from tokformats.tokenization.engines import Engine, EngineMismatchError
from tokformats.tokenization.sample_text import sample_texts
from tokformats.tokenization.spools import Spool


def _corpus(tmp_path: Path, count: int = 1500) -> Path:
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in sample_texts(count, seed=5)))
    return path


def _files(summary: dict[str, Any]) -> list[Path]:
    return [Path(f) for output in summary["outputs"].values() for f in output["files"]]


def _resumed_equals(corpus: Path, tokenizer_path: Path, target: Path, copied: dict[str, Any]) -> None:
    """Resuming the interrupted run at ``target`` gives the files of the uninterrupted, copied run."""
    resumed = tokformats.tokenize(corpus, tokenizer_path, target, "megatron", progress=False, resume=True)
    for a, b in zip(_files(resumed), _files(copied)):
        assert a.read_bytes() == b.read_bytes(), a.name


def _killed(script: str, corpus: Path, tokenizer_path: Path, target: Path) -> None:
    """Run ``script`` (which tokenizes ``corpus`` into ``target`` and kills itself) in a child process."""
    env = {**os.environ, "PYTHONPATH": str(Path(tokformats.__file__).parents[1])}
    killed = subprocess.run([sys.executable, "-c", script, str(corpus), str(tokenizer_path), str(target)], env=env,
                            capture_output=True, timeout=120)  # fmt: skip
    assert killed.returncode == -9, killed.stderr.decode()


def _copied(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, corpus: Path, tokenizer_path: Path,
            **options: Any) -> dict[str, Any]:  # fmt: skip
    """The run with every spool copied into the writers (the path formats without a flat data file take)."""
    with monkeypatch.context() as patched:
        patched.setattr("tokformats.tokenization.outputs.adopt_spool", lambda *args: False)
        return tokformats.tokenize(corpus, tokenizer_path, tmp_path / "copied" / "c", "megatron", progress=False,
                                   **options)  # fmt: skip


def _copies(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the streams whose spools are copied into the writers from now on (``join_spool``: by the kernel, or
    fed through ``copy_spool``)."""
    fed: list[str] = []
    original = outputs.join_spool

    def counting(writer: Any, folder: Path, name: str, dtype: np.dtype) -> None:
        fed.append(name)
        original(writer, folder, name, dtype)

    monkeypatch.setattr("tokformats.tokenization.outputs.join_spool", counting)
    return fed


@pytest.mark.parametrize("split", [None, "8:1:1"])
def test_megatron_bin_is_the_spool_and_equals_the_copied_output(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tokenizer_path: Path, split: str | None
) -> None:
    corpus = _corpus(tmp_path)
    copied = _copied(monkeypatch, tmp_path, corpus, tokenizer_path, split=split)
    fed = _copies(monkeypatch)
    adopted = tokformats.tokenize(corpus, tokenizer_path, tmp_path / "adopted" / "c", "megatron", progress=False,
                                  split=split)  # fmt: skip
    assert fed == [], "no spool was copied"
    ours, theirs = _files(adopted), _files(copied)
    assert [p.name for p in ours] == [p.name for p in theirs] and len(ours) == (6 if split else 2)
    for a, b in zip(ours, theirs):
        assert a.read_bytes() == b.read_bytes(), a.name
    assert adopted["documents"] == copied["documents"] == 1500
    assert adopted["tokens"] == copied["tokens"] > 0
    assert not Path(f"{tmp_path / 'adopted' / 'c'}.tokenize").exists()
    assert not [p for p in (tmp_path / "adopted").iterdir() if p.name.startswith(".")], "no temporary left"
    with tokformats.open(ours[0].with_suffix("")) as reader:
        assert len(reader) == (adopted["outputs"][next(iter(adopted["outputs"]))]["documents"])
        assert int(reader.sequence_lengths.sum()) == reader.num_tokens


def test_formats_without_a_flat_data_file_and_file_systems_without_links_copy(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tokenizer_path: Path
) -> None:
    corpus = _corpus(tmp_path, 300)
    copied = _copied(monkeypatch, tmp_path, corpus, tokenizer_path)
    fed = _copies(monkeypatch)
    tokformats.tokenize(corpus, tokenizer_path, tmp_path / "raw" / "c", "raw", progress=False)
    assert fed == ["text"]  # raw's writer adopts nothing: copied as before

    def no_links(source: Any, target: Any) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link", str(source))

    monkeypatch.setattr(os, "link", no_links)
    linked = tokformats.tokenize(corpus, tokenizer_path, tmp_path / "nolinks" / "c", "megatron", progress=False)
    assert fed == ["text", "text"]  # the link failed: the spool was copied, and nothing was written twice
    for a, b in zip(_files(linked), _files(copied)):
        assert a.read_bytes() == b.read_bytes(), a.name
    assert not [p for p in (tmp_path / "nolinks").iterdir() if p.name.startswith(".")], "no temporary left"


def test_a_crash_while_publishing_leaves_no_output_and_resume_is_identical(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tokenizer_path: Path
) -> None:
    corpus = _corpus(tmp_path)
    copied = _copied(monkeypatch, tmp_path, corpus, tokenizer_path)
    target = tmp_path / "run" / "c"
    with monkeypatch.context() as patched:

        def failing_index(*args: Any) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        patched.setattr(megatron, "_write_index", failing_index)  # after the .bin was adopted, before the commit
        with pytest.raises(OSError, match="No space left"):
            tokformats.tokenize(corpus, tokenizer_path, target, "megatron", progress=False)
    left = sorted(p.name for p in target.parent.iterdir())
    assert left == ["c.tokenize"], left  # no output, whole or half, and no temporary
    spool = Path(f"{target}.tokenize") / "part-0000" / "text.tokens"
    assert spool.stat().st_nlink == 1  # the link the aborted commit made is gone; the spool is whole
    _resumed_equals(corpus, tokenizer_path, target, copied)


KILLED_AT_COMMIT = r"""
import os, signal, sys
import tokformats
from tokformats.fs import atomic

original = atomic.AtomicFiles.commit

def commit(self):
    if any(str(p).endswith("_document.bin") for p in self._finals):
        os.kill(os.getpid(), signal.SIGKILL)  # the .bin adopted and the .idx written, nothing renamed yet
    return original(self)

atomic.AtomicFiles.commit = commit
tokformats.tokenize(sys.argv[1], sys.argv[2], sys.argv[3], "megatron", progress=False)
"""


def test_a_kill_at_the_commit_leaves_no_output_and_resume_is_identical(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tokenizer_path: Path
) -> None:
    corpus = _corpus(tmp_path)
    copied = _copied(monkeypatch, tmp_path, corpus, tokenizer_path)
    target = tmp_path / "run" / "c"
    _killed(KILLED_AT_COMMIT, corpus, tokenizer_path, target)
    assert not list(target.parent.glob("c_text_document*")), "nothing published under a final name"
    _resumed_equals(corpus, tokenizer_path, target, copied)
    assert not [p for p in target.parent.iterdir() if p.name.startswith(".c_")], "the killed run's temporaries went"


def test_adopted_data_must_match_its_lengths(tmp_path: Path) -> None:
    data = tmp_path / "ids"
    np.arange(10, dtype="<u2").tofile(data)
    writer = megatron.Writer(tmp_path / "out", vocab_size=100)
    with pytest.raises(FormatError, match="has 20 bytes; 2 documents of 12 uint16 ids take 24"):
        writer.adopt_data_file(data, np.dtype("<u2"), np.array([5, 7]))
    assert not writer.adopt_data_file(data, np.dtype("<u4"), np.array([5]))  # another width: the caller copies
    assert writer.adopt_data_file(data, np.dtype("<u2"), np.array([4, 0, 6]))
    with pytest.raises(FormatError, match=r"out: its \.bin is .*ids, taken whole"):  # never appended to the link
        writer.write_batch(np.array([1, 2]), np.array([2]))
    writer.close()
    assert data.exists() and (tmp_path / "out.bin").read_bytes() == data.read_bytes()
    with tokformats.open(tmp_path / "out") as reader:
        assert [reader[k].tolist() for k in range(len(reader))] == [[0, 1, 2, 3], [], [4, 5, 6, 7, 8, 9]]


def test_ids_are_checked_as_they_are_spooled(tmp_path: Path) -> None:
    spool = Spool(tmp_path, "text", np.dtype("<u2"), vocab_size=50)
    spool.append(np.array([1, 49], dtype=np.uint16), np.array([2]))
    with pytest.raises(FormatError, match=r"document 2 .*50"):
        spool.append(np.array([3, 4, 50], dtype=np.uint16), np.array([1, 2]))
    spool.close()


class _Wide(Engine):
    """An engine whose ids do not fit the run's dtype (what a cast would wrap into a valid-looking id)."""

    name = "wide"

    def encode(self, texts: list[str], split_special: bool = False) -> tuple[np.ndarray, np.ndarray]:
        flat = np.full(len(texts), 70_000, dtype=np.uint32)
        flat[0] = 5  # the first fits; the second does not
        return flat, np.ones(len(texts), dtype=np.int64)


def test_an_id_beyond_the_dtype_is_never_wrapped(tokenizer_path: Path) -> None:
    from tokenizers import Tokenizer

    # A later partition (no first sample) with no random draws: only the width check stands between.
    encoder = Encoder(Tokenizer.from_file(str(tokenizer_path)), "fastokens", 0.0, 0, 1,
                               chosen=(_Wide(), "a test engine"))  # fmt: skip
    with pytest.raises(EngineMismatchError, match="gave id 70,000 for doc 1, beyond the vocabulary's uint16"):
        encoder.encode(["a", "b"], np.dtype("<u2"), lambda k: f"doc {k}")


KILLED_AFTER_COMMIT = r"""
import os, signal, sys
import tokformats
from tokformats.tokenization import pipeline

def killed(work):
    os.kill(os.getpid(), signal.SIGKILL)  # the outputs committed, the work folder not yet removed

pipeline.remove_work_folder = killed
tokformats.tokenize(sys.argv[1], sys.argv[2], sys.argv[3], "megatron", progress=False)
"""


def test_a_resume_after_the_commit_republishes_the_same_bytes_and_leaves_no_link_behind(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    corpus = _corpus(tmp_path, 300)
    target = tmp_path / "run" / "c"
    _killed(KILLED_AFTER_COMMIT, corpus, tokenizer_path, target)
    published = {p.name: p.read_bytes() for p in target.parent.glob("c_text_document.*")}
    assert sorted(published) == ["c_text_document.bin", "c_text_document.idx", "c_text_document.provenance.npz"]
    spool = Path(f"{target}.tokenize") / "part-0000" / "text.tokens"
    assert spool.stat().st_nlink == 2  # the .bin is the spool
    tokformats.tokenize(corpus, tokenizer_path, target, "megatron", progress=False, resume=True)
    assert {p.name: p.read_bytes() for p in target.parent.glob("c_text_document.*")} == published
    left = sorted(p.name for p in target.parent.iterdir())
    assert left == sorted(published)  # no temporary link left beside the outputs, no work folder
    assert (target.parent / "c_text_document.bin").stat().st_nlink == 1


def _hashed_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the spool files read back and hashed from now on."""
    read: list[str] = []
    original = spools._hashed

    def recording(handle: Any, size: int) -> Any:
        read.append(Path(handle.name).name)
        return original(handle, size)

    monkeypatch.setattr("tokformats.tokenization.spools._hashed", recording)
    return read


def test_a_spool_is_read_back_once_by_the_final_checkpoint_and_published_on_its_pin(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tokenizer_path: Path
) -> None:
    _skip_without_nanosecond_times(tmp_path)
    corpus = _corpus(tmp_path)
    copied = _copied(monkeypatch, tmp_path, corpus, tokenizer_path)
    read = _hashed_reads(monkeypatch)
    pinned = tokformats.tokenize(corpus, tokenizer_path, tmp_path / "p" / "c", "megatron", progress=False)
    # Read back once, by the final checkpoint, before it was pinned; the pin held: not read again to publish it.
    assert read == ["text.tokens"]
    for a, b in zip(_files(pinned), _files(copied)):
        assert a.read_bytes() == b.read_bytes(), a.name

    # Where the time cannot be set to the nanosecond (no pin), the spool is read back again where it is published.
    def refused(*args: Any, **kwargs: Any) -> None:
        raise PermissionError(errno.EPERM, "not permitted")

    monkeypatch.setattr(os, "utime", refused)
    read.clear()
    unpinned = tokformats.tokenize(corpus, tokenizer_path, tmp_path / "u" / "c", "megatron", progress=False)
    assert read == ["text.tokens", "text.tokens"]
    for a, b in zip(_files(unpinned), _files(copied)):
        assert a.read_bytes() == b.read_bytes(), a.name


def _skip_without_nanosecond_times(folder: Path) -> None:
    probe = folder / "probe"
    probe.write_bytes(b"x")
    if pin_file(probe) is None:
        pytest.skip(f"the file system of {folder} does not keep a time set to the nanosecond: nothing is pinned")

