"""Issue 23, items 1-2: tokenize runs racing on one output, and a run's parent killed under its process pool.

A work folder has one owner at a time (a second run is refused with :class:`FolderBusyError` naming the folder);
pool workers stop when their parent dies; a resume checks every spool byte against its checkpoint. Rounds:
CI size by default, sweep size with ``--reliability-long`` or ``TOKFORMATS_RELIABILITY_LONG=1``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import tokformats
from tokformats import FolderBusyError, FormatError, OutputExistsError

ROOT = Path(__file__).resolve().parents[1]


def make_inputs(folder: Path, files: int = 4, documents: int = 600) -> list[Path]:
    """``files`` JSON-lines inputs of distinct documents (each run of them takes about a second)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for f in range(files):
        path = folder / f"in{f}.jsonl"
        lines = (
            json.dumps({"text": f"file {f} document {k} " + "words of text " * (k % 40 + 5)}) for k in range(documents)
        )
        path.write_text("\n".join(lines) + "\n")
        paths.append(path)
    return paths


def published(folder: Path, stem: str) -> dict[str, bytes]:
    """The published files of output ``folder / stem`` by name (work folders excluded)."""
    return {p.name: p.read_bytes() for p in sorted(folder.glob(f"{stem}*")) if p.is_file()}


VARIANTS = {
    "megatron": {"format": "megatron", "split": "8:1:1"},
    "llmc": {"format": "llmc", "split": "8:2"},
    "megatron-pool": {"format": "megatron", "split": "8:1:1", "pool": 2},
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> dict[str, Any]:
    """Inputs and each variant's uninterrupted output."""
    base = tmp_path_factory.mktemp("corpus")
    inputs = make_inputs(base / "inputs")
    references = {}
    for name, variant in VARIANTS.items():
        out = base / name
        out.mkdir()
        run_tokenize(inputs, tokenizer_path, out / "o", variant)
        references[name] = published(out, "o")
        assert references[name]
    return {"inputs": inputs, "references": references}


def run_tokenize(inputs: list[Path], tokenizer: Path, output: Path, variant: dict[str, Any], **extra: Any) -> Any:
    options = {"format": variant["format"], "split": variant["split"], "progress": False, "batch_size": 50,
               "checkpoint_every": 0.0, **extra}  # fmt: skip
    if "pool" in variant:
        with ProcessPoolExecutor(variant["pool"]) as pool:
            return tokformats.tokenize(inputs, tokenizer, output, executor=pool, **options)
    return tokformats.tokenize(inputs, tokenizer, output, **options)


def rounds(long: bool, ci: int, sweep: int) -> int:
    return sweep if long else ci


# -- item 1: one owner per work folder ----------------------------------------------------------------------------


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_two_resumes_in_threads_never_publish_a_mix(
    tmp_path: Path, corpus: dict[str, Any], tokenizer_path: Path, variant: str, reliability_long: bool
) -> None:
    refused = 0
    for round_ in range(rounds(reliability_long, 2, 50)):
        folder = tmp_path / f"r{round_}"
        folder.mkdir()
        outcomes: list[Any] = []
        start = threading.Barrier(2)

        def racer(folder: Path = folder, outcomes: list[Any] = outcomes, start: threading.Barrier = start) -> None:
            start.wait()
            try:
                outcomes.append(run_tokenize(corpus["inputs"], tokenizer_path, folder / "o", VARIANTS[variant],
                                             resume=True)["documents"])  # fmt: skip
            except (FolderBusyError, OutputExistsError) as refusal:
                outcomes.append(refusal)

        threads = [threading.Thread(target=racer) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(300)
        assert len(outcomes) == 2
        assert any(isinstance(o, int) for o in outcomes), outcomes
        busy = [o for o in outcomes if isinstance(o, FolderBusyError)]
        refused += len(busy)
        for error in busy:
            assert str(folder / "o.tokenize") in str(error)
        assert published(folder, "o") == corpus["references"][variant], round_
        assert not (folder / "o.tokenize").exists()
    print(f"threads {variant}: {round_ + 1} rounds, {refused} refused with FolderBusyError, 0 corrupted publishes")
    assert refused  # the runs did overlap: one was refused at least once


RACER = """
import sys, json, tokformats
from concurrent.futures import ProcessPoolExecutor
inputs, tokenizer, output, variant = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
options = dict(format=variant["format"], split=variant["split"], progress=False, batch_size=50, checkpoint_every=0.0,
               resume=True)
try:
    if "pool" in variant:
        with ProcessPoolExecutor(variant["pool"]) as pool:
            tokformats.tokenize(inputs, tokenizer, output, executor=pool, **options)
    else:
        tokformats.tokenize(inputs, tokenizer, output, **options)
except (tokformats.FolderBusyError, tokformats.OutputExistsError) as error:
    print(type(error).__name__, error)
    sys.exit(3)
"""


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_two_resumes_in_processes_never_publish_a_mix(
    tmp_path: Path, corpus: dict[str, Any], tokenizer_path: Path, variant: str, reliability_long: bool
) -> None:
    refusals = 0
    for round_ in range(rounds(reliability_long, 2, 50)):
        folder = tmp_path / f"r{round_}"
        folder.mkdir()
        args = [sys.executable, "-c", RACER, json.dumps([str(p) for p in corpus["inputs"]]), str(tokenizer_path),
                str(folder / "o"), json.dumps(VARIANTS[variant])]  # fmt: skip
        racers = [subprocess.Popen(args, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                  for _ in range(2)]  # fmt: skip
        results = [(r.wait(300), *r.communicate()) for r in racers]
        codes = sorted(code for code, _, _ in results)
        assert codes[0] == 0 and codes[1] in (0, 3), results
        for code, out, _ in results:
            if code == 3 and out.startswith("FolderBusyError"):
                refusals += 1
                assert str(folder / "o.tokenize") in out
        assert published(folder, "o") == corpus["references"][variant], round_
    print(f"processes {variant}: {round_ + 1} rounds, {refusals} refused with FolderBusyError, 0 corrupted publishes")
    assert refusals


def test_a_busy_folder_names_the_folder_and_the_owner(tmp_path: Path) -> None:
    from tokformats.fs.owner import owned_folder

    with owned_folder(tmp_path / "w", what="tokenize run"):
        with pytest.raises(FolderBusyError) as caught, owned_folder(tmp_path / "w", what="tokenize run"):
            pass
        assert str(tmp_path / "w") in str(caught.value) and f"process {os.getpid()}" in str(caught.value)
    with owned_folder(tmp_path / "w"):  # released on leaving the block
        pass


def test_a_pool_worker_forked_under_a_lock_does_not_keep_it(tmp_path: Path) -> None:
    from tokformats.fs.owner import owned_folder

    with ProcessPoolExecutor(1) as pool:
        with owned_folder(tmp_path / "w"):
            assert pool.submit(os.getpid).result() != os.getpid()  # the worker is forked while the lock is held
        with owned_folder(tmp_path / "w"):  # the idle worker holds no copy of it
            pass


# -- item 2: a killed parent's pool workers stop; resume is byte-identical -----------------------------------------


PARENT = """
import sys, json, tokformats
from concurrent.futures import ProcessPoolExecutor
inputs, tokenizer, output = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
with ProcessPoolExecutor(2) as pool:
    tokformats.tokenize(inputs, tokenizer, output, format="megatron", split="8:1:1", progress=False, batch_size=20,
                        checkpoint_every=0.0, executor=pool)
"""


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("launcher", ["library", "cli"])
def test_killing_the_parent_stops_its_workers_and_resume_is_exact(
    tmp_path: Path, tokenizer_path: Path, launcher: str, reliability_long: bool
) -> None:
    inputs = make_inputs(tmp_path / "inputs", files=4, documents=2500)
    reference = tmp_path / "reference"
    reference.mkdir()
    with ProcessPoolExecutor(2) as pool:
        tokformats.tokenize(inputs, tokenizer_path, reference / "o", format="megatron", split="8:1:1", progress=False,
                            batch_size=20, checkpoint_every=0.0, executor=pool)  # fmt: skip
    expected = published(reference, "o")
    killed = orphans_seen = 0
    for round_ in range(rounds(reliability_long, 2, 50)):
        folder = tmp_path / f"r{round_}"
        folder.mkdir()
        if launcher == "library":
            args = [sys.executable, "-c", PARENT, json.dumps([str(p) for p in inputs]), str(tokenizer_path),
                    str(folder / "o")]  # fmt: skip
        else:
            args = [sys.executable, "-m", "tokformats", "tokenize", *map(str, inputs), "-t", str(tokenizer_path),
                    "-o", str(folder / "o"), "--format", "megatron", "--split", "8:1:1", "--workers", "2"]  # fmt: skip
        parent = subprocess.Popen(args, env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        workers: list[int] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and parent.poll() is None:
            workers = [w for w in children_of(parent.pid) if "part-" in _open_files(w)]
            if workers:
                break
            time.sleep(0.02)
        time.sleep(0.05 * (round_ % 5))
        if parent.poll() is not None or not workers:
            continue  # finished before a worker wrote: nothing to kill this round
        workers = children_of(parent.pid)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        killed += 1
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(alive(w) for w in workers):
            time.sleep(0.05)
        assert not [w for w in workers if alive(w)], "orphaned workers alive 10 s after their parent was killed"
        with ProcessPoolExecutor(2) as pool:
            tokformats.tokenize(inputs, tokenizer_path, folder / "o", format="megatron", split="8:1:1",
                                progress=False, batch_size=20, checkpoint_every=0.0, executor=pool,
                                resume=True)  # fmt: skip
        assert published(folder, "o") == expected, round_
        orphans_seen += len(workers)
    print(f"parent kills ({launcher}): {killed} kills, {orphans_seen} workers, 0 alive after 10 s, 0 resume diffs")
    assert killed


def _open_files(pid: int) -> str:
    names = []
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                names.append(os.readlink(fd))
            except OSError:
                continue
    except OSError:
        return ""
    return "\n".join(names)


def test_resume_finds_writes_after_the_checkpoint_anywhere_in_a_spool(tmp_path: Path, tokenizer_path: Path) -> None:
    texts = tmp_path / "in.jsonl"
    texts.write_text("".join(json.dumps({"text": f"document {k} " * 30}) + "\n" for k in range(200)) + "{bad\n")
    with pytest.raises(FormatError):
        tokformats.tokenize(texts, tokenizer_path, tmp_path / "o", progress=False, batch_size=10, checkpoint_every=0)
    texts.write_text("".join(json.dumps({"text": f"document {k} " * 30}) + "\n" for k in range(200)))
    spool = next((tmp_path / "o.tokenize").rglob("*.tokens"))
    data = bytearray(spool.read_bytes())
    data[10] ^= 1  # far before the last 4 KiB, which is all the old check hashed
    spool.write_bytes(bytes(data))
    with pytest.raises(FormatError, match="differs from what the checkpoint recorded"):
        tokformats.tokenize(texts, tokenizer_path, tmp_path / "o", progress=False, resume=True)
    assert not list(tmp_path.glob("o_*")), "nothing was published"


def test_a_spool_changed_after_its_final_checkpoint_is_never_published(tmp_path: Path, tokenizer_path: Path) -> None:
    from tokformats.tokenization.partition_run import _PartitionRun

    texts = tmp_path / "in.jsonl"
    texts.write_text("".join(json.dumps({"text": f"document {k} " * 30}) + "\n" for k in range(200)))
    original = _PartitionRun.save

    def save_then_tamper(self: Any, done: bool = False) -> None:
        original(self, done)
        if done:  # an orphan writing on after the checkpoint that says "done"
            with open(next(iter(self.spools.values())).tokens_path, "r+b") as handle:
                handle.write(b"\x07\x00")

    _PartitionRun.save = save_then_tamper  # type: ignore[method-assign]
    try:
        with pytest.raises(FormatError, match="differs from what its checkpoint recorded"):
            tokformats.tokenize(texts, tokenizer_path, tmp_path / "o", progress=False)
    finally:
        _PartitionRun.save = original  # type: ignore[method-assign]
    assert not list(tmp_path.glob("o_*")), "nothing was published"
