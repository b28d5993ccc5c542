"""The attack suite of issue 21: untrusted stores and downloaded folders, against a malicious HTTP server on 127.0.0.1
(``tests/http_server.py``) and crafted folders.

Every test runs with small timeouts and bounded retries, and checks, besides the error it expects (always a
``tokformats.FormatError`` whose message names the URL without credentials), that nothing outside the test's
served, cache and work folders was created or changed (``outside`` snapshots everything else under ``tmp_path``,
including the ``home`` folder attacks aim at) and that the case ended within its timeouts plus a few seconds.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import time
import traceback
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tokformats
from tokformats.cli import main
from tokformats.fs.journal import UnsafeJournalError
from tokformats.fs.names import UnsafeNameError, safe_relative_name
from tokformats.remote import Cache, NotFoundError, RemoteError, fetch, publish
from tokformats.remote.backends import Limits, OversizeError
from tokformats.remote.cache import IndexFormatError, UnsafeCacheError
from tokformats.remote.publish import StaleFilesError

from .http_server import FileServer

pytestmark = pytest.mark.usefixtures("quick_retries")  # retries back off a few milliseconds here

#: The timeouts every case runs with, and how much longer than its budget a case may take.
STALL = 1.0
RETRIES = 2
SLACK = 5.0
SECRET = "SECRETsig0123"
PASSWORD = "hunter2pw"



def _snapshot(root: Path, skip: set[str]) -> dict[str, Any]:
    """Every entry under ``root`` (but the top-level folders in ``skip``): kind, size, modification time, content
    digest; links are not followed."""
    found: dict[str, Any] = {}
    for top in sorted(root.iterdir()):
        if top.name in skip:
            continue
        for path in [top, *(top.rglob("*") if top.is_dir() and not top.is_symlink() else [])]:
            info = path.lstat()
            digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() and not path.is_symlink() else ""
            found[str(path.relative_to(root))] = (info.st_mode, info.st_size, info.st_mtime_ns, digest)
    return found


class Scene:
    """One attack: the malicious server, the test's own folders, the options every open uses."""

    def __init__(self, root: Path, server: FileServer) -> None:
        self.root, self.server = root, server
        self.served = Path(server.root)
        self.cache = root / "cache"
        self.work = root / "work"
        self.work.mkdir()
        self.home = root / "home"
        self.options: dict[str, Any] = {"cache_dir": self.cache, "stall_timeout": STALL, "connect_timeout": STALL,
                                        "retries": RETRIES}  # fmt: skip

    @property
    def url(self) -> str:
        return self.server.url

    def serve(self, name: str, data: bytes | str) -> Path:
        """Put ``data`` at ``/name`` on the server."""
        path = self.served / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
        return path

    def sums(self, folder: str, names: list[str], data: bytes = b"tokens") -> None:
        """A ``SHA256SUMS`` in ``folder`` naming ``names`` (the digest of ``data``), and a real file beside it."""
        digest = hashlib.sha256(data).hexdigest()
        self.serve(f"{folder}/real.dat", data)
        self.serve(f"{folder}/SHA256SUMS", "".join(f"{digest}  {n}\n" for n in names))

    def llmc(self, name: str, documents: int, seed: int) -> tuple[Path, list[list[int]]]:
        """A local llm.c dataset in the work folder (shards of about 300 tokens): its folder and documents."""
        rng = np.random.default_rng(seed)
        docs = [[0, *rng.integers(1, 900, int(rng.integers(5, 40))).tolist()] for _ in range(documents)]  # bos 0
        folder = self.work / name
        with tokformats.create(folder / "c", "llmc", vocab_size=1000, bos=0, shard_size=300) as writer:
            for doc in docs:
                writer.write(doc[1:])
        return folder, docs


@pytest.fixture
def scene(tmp_path: Path) -> Iterator[Scene]:
    """The server, the folders, and the check that nothing outside the test's own folders changed."""
    home = tmp_path / "home"
    (home / "dir").mkdir(parents=True)
    (home / "important.txt").write_text("do not touch")
    (home / "dir" / "precious.bin").write_bytes(b"precious" * 10)
    served = tmp_path / "served"
    served.mkdir()
    server = FileServer(served)
    skip = {"served", "cache", "work"}
    before = _snapshot(tmp_path, skip)
    try:
        yield Scene(tmp_path, server)
    finally:
        server.stop()
    assert _snapshot(tmp_path, skip) == before, "something outside the test's folders was created or changed"


@contextlib.contextmanager
def within(seconds: float) -> Iterator[None]:
    """The block ends within ``seconds`` (its configured timeouts) plus :data:`SLACK`."""
    started = time.monotonic()
    yield
    assert time.monotonic() - started < seconds + SLACK


def _all_text(error: BaseException) -> str:
    """Everything an error shows: its message, its formatted traceback, its context and cause chain."""
    texts = ["".join(traceback.format_exception(error))]
    seen = error
    while seen.__context__ is not None or seen.__cause__ is not None:
        seen = seen.__cause__ or seen.__context__  # type: ignore[assignment]
        texts.append(repr(seen) + str(seen))
    return "\n".join(texts)


# -- 1. path traversal -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["../../x.dat", "a/../../x.dat", "..", "./x.dat", "a//b.dat", "a\\..\\x.dat", "a\x00b.dat", "a\x1bb",
     "x" * 256 + ".dat"],
)  # fmt: skip
def test_sums_names_leading_outside_the_cache_are_refused(scene: Scene, name: str) -> None:
    scene.sums("d", [name])
    with within(STALL), pytest.raises(UnsafeNameError) as caught:
        fetch(f"{scene.url}/d/", **scene.options)
    assert f"{scene.url}/d/SHA256SUMS, line 1" in str(caught.value)
    assert isinstance(caught.value, tokformats.FormatError)
    assert not list(scene.root.glob("x.dat")) and not list(scene.cache.rglob("x.dat"))


@pytest.mark.parametrize("tail", ["d/a\x00b.bin", "d/a\nb.bin", "d\n/x.bin", "d/x.bin\r\nX-Injected: 1"])
def test_control_characters_in_a_url_are_a_library_error(scene: Scene, tail: str) -> None:
    with within(STALL), pytest.raises(tokformats.FormatError) as caught:
        tokformats.open(f"{scene.url}/{tail}?sig={SECRET}", **scene.options)
    assert SECRET not in _all_text(caught.value)
    assert not any("Injected" in str(auth) for auth in scene.server.auth)


def test_a_sums_entry_naming_an_existing_local_file_is_refused(scene: Scene) -> None:
    target = scene.home / "important.txt"
    scene.sums("d", [str(target)], data=target.read_bytes())  # the digest matches: the local file would "verify"
    with pytest.raises(UnsafeNameError, match="absolute path"):
        fetch(f"{scene.url}/d/", **scene.options)


@pytest.mark.parametrize("filename", ["../../x.arrow", "/tmp/x.arrow", "dir/../../x.arrow"])
def test_an_hf_state_json_filename_outside_the_folder_is_refused(scene: Scene, filename: str) -> None:
    scene.serve("hf/state.json", json.dumps({"_data_files": [{"filename": filename}]}))
    with within(STALL), pytest.raises(UnsafeNameError) as caught:
        tokformats.open(f"{scene.url}/hf/", **scene.options)
    assert f"{scene.url}/hf/state.json, entry 1" in str(caught.value)


def test_a_local_hf_state_json_filename_outside_the_folder_is_refused(scene: Scene) -> None:
    pytest.importorskip("pyarrow")
    folder = scene.work / "hf"
    folder.mkdir()
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": "../../home/important.txt"}]}))
    with pytest.raises(UnsafeNameError, match=r"_data_files\[0\]\.filename"):
        tokformats.open(folder, format="hf")


def test_a_local_litdata_and_timemoe_index_naming_outside_files_is_refused(scene: Scene) -> None:
    folder = scene.work / "lit"
    folder.mkdir()
    config = {"item_loader": "TokensLoader", "data_format": ["no_header_numpy:8"], "compression": None}
    chunk = {"filename": "../home/important.txt", "chunk_size": 1, "dim": 1, "chunk_bytes": 8}
    (folder / "index.json").write_text(json.dumps({"config": config, "chunks": [chunk]}))
    with pytest.raises(UnsafeNameError, match=r"chunks\[0\]\.filename"):
        tokformats.open(folder, format="litdata")
    moe = scene.work / "moe"
    moe.mkdir()
    (moe / "data-1-of-1.bin").write_bytes(b"\0" * 8)
    meta = {"num_sequences": 1, "dtype": "float32", "files": {"../home/data-1-of-1.bin": 2}, "scales": []}
    (moe / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UnsafeNameError, match=r"meta\.json: files"):
        tokformats.open(moe, format="timemoe")


def test_safe_relative_name_accepts_plain_names_and_refuses_links_out(tmp_path: Path) -> None:
    folder = tmp_path / "d"
    (folder / "sub").mkdir(parents=True)
    assert safe_relative_name("sub/shard_0.bin", where="test", folder=folder) == "sub/shard_0.bin"
    assert safe_relative_name("données-é.bin", where="test") == "données-é.bin"
    os.symlink(tmp_path, folder / "out")
    with pytest.raises(UnsafeNameError, match="symbolic link"):
        safe_relative_name("out/x.bin", where="https://host/d/SHA256SUMS, line 2", folder=folder)
    for bad in (123, ["x"], None, "", "/x", "a\nb"):
        with pytest.raises(UnsafeNameError, match=r"index\.json, entry 0"):
            safe_relative_name(bad, where="https://host/d/index.json, entry 0")


# -- 2. the commit journal ---------------------------------------------------------------------------------------


def _dataset_with_journal(scene: Scene, journal: dict[str, Any]) -> Path:
    folder = scene.work / "downloaded"
    with tokformats.create(folder / "d", "megatron", vocab_size=100) as writer:
        writer.write([1, 2, 3])
    (folder / "notes.txt").write_text("the user's own file beside the dataset")
    (folder / ".tokformats-commit.json").write_text(json.dumps(journal))
    return folder


@pytest.mark.parametrize(
    "journal",
    [
        {"renames": [], "remove": ["HOME/important.txt"]},
        {"renames": [], "remove": ["../../home/important.txt"]},
        {"renames": [["HOME/dir/precious.bin", "d.bin"]], "remove": []},
        {"renames": [[".d.bin.1.0123456789ab.tmp", "../home/important.txt"]], "remove": []},
        {"renames": [["d.idx", "d.bin"]], "remove": []},  # not a temporary: a journal never moves outputs
        {"renames": [], "remove": [".tokformats-commit.json"]},
        {"renames": [], "remove": ["notes.txt"]},  # inside the folder, but not a file tokformats writes
    ],
)
def test_a_journal_in_a_downloaded_folder_touches_nothing_it_should_not(scene: Scene, journal: dict[str, Any]) -> None:
    text = json.dumps(journal).replace("HOME", str(scene.home))
    folder = _dataset_with_journal(scene, json.loads(text))
    before = _snapshot(folder, set())
    with pytest.raises(UnsafeJournalError, match="refused, and nothing was changed") as caught:
        tokformats.open(folder / "d")
    assert "rm '" in str(caught.value) and isinstance(caught.value, tokformats.FormatError)
    assert _snapshot(folder, set()) == before  # the journal too: nothing was carried out


def test_a_journal_naming_only_its_own_temporaries_still_completes(scene: Scene) -> None:
    folder = scene.work / "local"
    with tokformats.create(folder / "d", "megatron", vocab_size=100) as writer:
        writer.write([1, 2, 3])
    with tokformats.create(scene.work / "new" / "d", "megatron", vocab_size=100) as writer:
        writer.write([7, 8])
    renames = []
    for suffix in (".bin", ".idx"):
        temporary = f".d{suffix}.4242.0123456789ab.tmp"
        os.replace(scene.work / "new" / f"d{suffix}", folder / temporary)
        renames.append([temporary, f"d{suffix}"])
    (folder / ".tokformats-commit.json").write_text(json.dumps({"renames": renames, "remove": []}))
    with tokformats.open(folder / "d") as reader:
        assert [d.tolist() for d in reader] == [[7, 8]]
    assert not (folder / ".tokformats-commit.json").exists()


def test_a_store_never_delivers_a_journal(scene: Scene) -> None:
    journal = json.dumps({"renames": [], "remove": [str(scene.home / "important.txt")]})
    scene.serve("d/.tokformats-commit.json", journal)
    scene.sums("d", ["real.dat", ".tokformats-commit.json"])
    with pytest.raises(UnsafeNameError, match="hidden files"):
        fetch(f"{scene.url}/d/", **scene.options)
    config = {"item_loader": "TokensLoader", "data_format": ["no_header_numpy:8"]}
    chunk = {"filename": ".tokformats-commit.json", "chunk_size": 1, "dim": 1, "chunk_bytes": len(journal)}
    scene.serve("lit/index.json", json.dumps({"config": config, "chunks": [chunk]}))
    scene.serve("lit/.tokformats-commit.json", journal)
    with pytest.raises(UnsafeNameError, match=r"index.json, entry 0"):
        tokformats.open(f"{scene.url}/lit/", **scene.options)
    assert not list(scene.cache.rglob(".tokformats-commit.json"))
    assert all("commit" not in path for path in scene.server.paths)  # never even asked for


def test_publish_never_uploads_a_journal_or_hidden_files(scene: Scene) -> None:
    folder, _ = scene.llmc("local", 20, seed=1)
    (folder / ".tokformats-commit.json").write_text('{"renames": [], "remove": []}')
    (folder / ".hidden").write_text("x")
    summary = publish(folder, f"{scene.url}/d/")
    assert summary["uploaded"] and not any(n.startswith(".") for n in summary["uploaded"])
    assert not any("/." in path for path in scene.server.puts)


# -- 3. unbounded downloads --------------------------------------------------------------------------------------


def test_a_body_longer_than_announced_is_stopped_and_deleted(scene: Scene) -> None:
    scene.serve("d/blob.dat", b"x" * 100)
    scene.server.fault("/d/blob.dat", "endless", 100)
    with within(STALL), pytest.raises(OversizeError, match="more than the 100 bytes it announced") as caught:
        fetch(f"{scene.url}/d/blob.dat", **scene.options)
    assert f"{scene.url}/d/blob.dat" in str(caught.value)
    assert not list(scene.cache.rglob("*.partial*"))
    assert sum(p.stat().st_size for p in scene.cache.rglob("*") if p.is_file()) < 1 << 16


def test_a_stalled_transfer_fails_after_the_stall_timeout(scene: Scene) -> None:
    scene.serve("d/blob.dat", b"y" * 5000)
    for _ in range(RETRIES + 2):
        scene.server.fault("/d/blob.dat", "stall", 30)
    with within((RETRIES + 1) * STALL), pytest.raises(RemoteError, match="timed out") as caught:
        fetch(f"{scene.url}/d/blob.dat", **scene.options)
    assert f"{scene.url}/d/blob.dat" in str(caught.value) and f"after {RETRIES} attempts" in str(caught.value)
    assert scene.server.gets["/d/blob.dat"] == RETRIES  # retries= is the attempts a request makes, a download's too


def test_a_trickling_transfer_counts_as_stalled(scene: Scene) -> None:
    scene.serve("d/blob.dat", b"t" * 100_000)
    for _ in range(RETRIES + 2):
        scene.server.fault("/d/blob.dat", "trickle", 20, 0.1)  # 200 bytes a second: never silent, never done
    with within((RETRIES + 1) * (STALL + 0.2)), pytest.raises(RemoteError, match="trickles") as caught:
        fetch(f"{scene.url}/d/blob.dat", **scene.options)
    assert f"{scene.url}/d/blob.dat" in str(caught.value)


def test_a_silent_server_fails_after_the_connect_timeout(scene: Scene) -> None:
    scene.serve("d/blob.dat", b"z" * 10)
    for _ in range(RETRIES + 2):
        scene.server.fault("/d/blob.dat", "silent", 30)
    with within((RETRIES + 1) * STALL), pytest.raises(RemoteError, match="timed out"):
        fetch(f"{scene.url}/d/blob.dat", **scene.options)


def test_limits_are_options_with_environment_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Limits.of() == Limits(30.0, 60.0, 5, 64 << 20)
    monkeypatch.setenv("TOKFORMATS_STALL_TIMEOUT", "2.5")
    monkeypatch.setenv("TOKFORMATS_MAX_INDEX_BYTES", "1000")
    assert Limits.of(retries=2) == Limits(30.0, 2.5, 2, 1000)
    assert Cache("https://host/d", stall_timeout=7).limits.stall_timeout == 7
    with pytest.raises(tokformats.FormatError, match=r"retries=0: it must be positive"):
        Limits.of(retries=0)  # refused, not read as "not given" (it was the environment's or the default's 5)
    monkeypatch.setenv("TOKFORMATS_CONNECT_TIMEOUT", "soon")
    with pytest.raises(tokformats.FormatError, match="TOKFORMATS_CONNECT_TIMEOUT"):
        Limits.of()


def test_a_404_probe_leaves_no_partial_file(scene: Scene) -> None:
    with pytest.raises(NotFoundError, match="does not exist"):
        fetch(f"{scene.url}/d/missing.dat", **scene.options)
    assert not [p for p in scene.cache.rglob("*") if p.name.endswith((".partial", ".partial.json"))]


# -- 4. index files without limits -------------------------------------------------------------------------------


@pytest.mark.parametrize("index", ["SHA256SUMS", "index.json", "manifest.json"])
def test_an_index_larger_than_the_cap_is_refused_before_its_first_byte(scene: Scene, index: str) -> None:
    scene.server.fault(f"/d/{index}", "huge", 10**9)  # announced: 1 GB (the server sends at most 256 MiB)
    if index != "SHA256SUMS":
        scene.serve(f"d/{index}", "{}")  # the other index files are not found; this one is huge
    with within(STALL), pytest.raises(OversizeError, match="max_index_bytes") as caught:
        fetch(f"{scene.url}/d/", **scene.options)
    assert f"{scene.url}/d/{index} is 1,000,000,000 bytes, more than the 67,108,864 allowed" in str(caught.value)
    assert not list(scene.cache.rglob("*.partial"))


def test_the_index_cap_is_an_option(scene: Scene) -> None:
    scene.sums("d", ["real.dat"] * 50)
    with pytest.raises(OversizeError, match="more than the 1,000 allowed"):
        fetch(f"{scene.url}/d/", max_index_bytes=1000, **scene.options)


def test_a_sums_line_too_long_binary_or_compressed_is_refused(scene: Scene) -> None:
    digest = "0" * 64
    scene.serve("long/SHA256SUMS", f"{digest}  {'a/' * 50_000}x\n")
    with pytest.raises(IndexFormatError, match="SHA256SUMS, line 1 is longer than"):
        fetch(f"{scene.url}/long/", **scene.options)
    scene.serve("binary/SHA256SUMS", f"{digest}  a.dat\n".encode() + b"\xff\xfe\x00garbage\n")
    with pytest.raises(IndexFormatError, match="SHA256SUMS, line 2 is not UTF-8"):
        fetch(f"{scene.url}/binary/", **scene.options)
    scene.serve("bomb/SHA256SUMS", f"{digest}  a.dat\n" * 200_000)  # 14 MB of text, 40 kB gzipped
    scene.server.fault("/bomb/SHA256SUMS", "gzip")
    with within(STALL), pytest.raises(IndexFormatError, match=r"SHA256SUMS, line 1 is (longer than|not UTF-8)"):
        fetch(f"{scene.url}/bomb/", **scene.options)


def test_a_manifest_claiming_10_12_shards_is_refused(scene: Scene) -> None:
    scene.serve("g/manifest.json", json.dumps({"total_shards": 10**12}))
    with within(STALL), pytest.raises(IndexFormatError, match="total_shards is 1000000000000") as caught:
        tokformats.open(f"{scene.url}/g/", **scene.options)
    assert f"{scene.url}/g/manifest.json" in str(caught.value)


# -- 5. every value from a store is checked ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("chunk", "message"),
    [
        ({"filename": 123}, "a name must be a string, found int 123"),
        ({"filename": ["x"]}, "a name must be a string, found list"),
        ({"filename": "a\nb.bin"}, "control character"),
        ({"filename": "c.bin", "chunk_bytes": "lots"}, "the size is 'lots', not a byte count"),
        ({"filename": "c.bin", "chunk_bytes": -5}, "the size is -5, not a byte count"),
    ],
)
def test_a_bad_litdata_index_value_is_a_library_error(scene: Scene, chunk: dict[str, Any], message: str) -> None:
    config = {"item_loader": "TokensLoader", "data_format": ["no_header_numpy:8"]}
    scene.serve("lit/index.json", json.dumps({"config": config, "chunks": [chunk]}))
    with pytest.raises(tokformats.FormatError, match=message) as caught:
        tokformats.open(f"{scene.url}/lit/", **scene.options)
    assert f"{scene.url}/lit/index.json, entry 0" in str(caught.value)


def test_a_bad_timemoe_meta_value_is_a_library_error(scene: Scene) -> None:
    meta = {"num_sequences": 1, "dtype": "float32", "files": {"data-1-of-1.bin": [1]}, "scales": []}
    scene.serve("moe/meta.json", json.dumps(meta))
    with pytest.raises(IndexFormatError, match=r"meta.json.*must be a non-negative element count"):
        tokformats.open(f"{scene.url}/moe/", **scene.options)


# -- 6. signed URLs ----------------------------------------------------------------------------------------------


def test_a_signed_url_opens_and_its_query_is_sent_never_shown(scene: Scene) -> None:
    folder, docs = scene.llmc("local", 30, seed=2)
    publish(folder, f"{scene.url}/d/")
    signed = f"{scene.url}/d/c_000000.bin?X-Amz-Signature={SECRET}&X-Amz-Expires=60"
    with tokformats.open(signed, bos=0, **scene.options) as reader:
        assert reader.format == "llmc" and len(reader) > 0
        assert reader[0].tolist() == docs[0]
    assert f"/d/c_000000.bin?X-Amz-Signature={SECRET}&X-Amz-Expires=60" in scene.server.paths
    assert not any(SECRET in str(p) for p in scene.cache.rglob("*"))  # nor in a cache folder or file name


def test_a_presigned_url_of_one_file_opens_on_a_private_store(scene: Scene) -> None:
    folder, docs = scene.llmc("local", 30, seed=13)
    publish(folder, f"{scene.url}/d/")
    query = f"X-Amz-Signature={SECRET}&X-Amz-Expires=60"
    scene.server.signatures = {"/d/c_000000.bin": query}  # nothing else may be read, not even SHA256SUMS
    with tokformats.open(f"{scene.url}/d/c_000000.bin?{query}", bos=0, **scene.options) as reader:
        assert reader[0].tolist() == docs[0]
    assert f"/d/SHA256SUMS?{query}" not in scene.server.paths  # the signature is sent for its own file only
    fresh = {**scene.options, "cache_dir": scene.cache / "fresh"}
    with pytest.raises(tokformats.FormatError, match="HTTP 403") as caught:
        tokformats.open(f"{scene.url}/d/c_000000.bin?X-Amz-Signature=wrong{SECRET}", **fresh)
    assert SECRET not in _all_text(caught.value)


def test_errors_about_a_signed_url_never_quote_its_secret(scene: Scene) -> None:
    failures = []
    for url in (
        f"{scene.url}/d/missing.bin?X-Amz-Signature={SECRET}",
        f"http://alice:{PASSWORD}@127.0.0.1:{scene.server.server_address[1]}/d/missing.bin",
        f"http://127.0.0.1:1/d/x.bin?X-Amz-Signature={SECRET}",  # nothing listens: connection refused
        f"{scene.url}/d/*.bin?X-Amz-Signature={SECRET}",
    ):
        with pytest.raises(tokformats.FormatError) as caught:
            tokformats.open(url, **scene.options)
        failures.append(caught.value)
    for error in failures:
        text = _all_text(error)
        assert SECRET not in text and PASSWORD not in text and "alice" not in text
        assert "127.0.0.1" in str(error)
    assert any(auth and auth.startswith("Basic ") for auth in scene.server.auth)  # user info: sent as a header


def test_credentials_never_follow_a_redirect_to_another_host(scene: Scene) -> None:
    scene.serve("d/blob.dat", b"moved here")
    port = scene.server.server_address[1]
    scene.server.fault("/d/old.dat", "redirect", f"http://localhost:{port}/d/blob.dat")  # another host name
    got = fetch(f"http://alice:{PASSWORD}@127.0.0.1:{port}/d/old.dat", **scene.options)
    assert Path(got.target).read_bytes() == b"moved here"
    sent = dict(zip(scene.server.paths, scene.server.auth))
    assert sent["/d/old.dat"] is not None and sent["/d/blob.dat"] is None
    scene.server.fault("/d/ftp.dat", "redirect", "ftp://127.0.0.1/etc/passwd")
    with pytest.raises(tokformats.FormatError, match="HTTP 302"):
        fetch(f"{scene.url}/d/ftp.dat", **scene.options)


# -- 7. the shared cache -----------------------------------------------------------------------------------------


def test_planted_links_in_the_cache_are_never_followed(scene: Scene) -> None:
    data = b"the real bytes" * 100
    scene.serve("d/blob.dat", data)
    scene.serve("d/other.dat", data)
    folder = Cache(f"{scene.url}/d", cache_dir=scene.cache).folder
    folder.mkdir(parents=True)
    precious = scene.home / "dir" / "precious.bin"
    os.symlink(precious, folder / "blob.dat.partial")  # resuming would append into it
    etag = '"' + hashlib.sha256(data).hexdigest()[:32] + '"'
    (folder / "blob.dat.partial.json").write_text(json.dumps({"etag": etag, "size": len(data)}))
    os.symlink(scene.home / "important.txt", folder / "other.dat")  # "already cached"
    got = fetch(f"{scene.url}/d/blob.dat", **scene.options)
    assert Path(got.target).read_bytes() == data and not Path(got.target).is_symlink()
    got = fetch(f"{scene.url}/d/other.dat", **scene.options)
    assert Path(got.target).read_bytes() == data and not Path(got.target).is_symlink()


def test_a_planted_dataset_folder_link_is_refused(scene: Scene) -> None:
    scene.serve("d/blob.dat", b"data")
    folder = Cache(f"{scene.url}/d", cache_dir=scene.cache).folder
    folder.parent.mkdir(parents=True)
    os.symlink(scene.home / "dir", folder)
    with pytest.raises(UnsafeCacheError, match="never follows") as caught:
        fetch(f"{scene.url}/d/blob.dat", **scene.options)
    assert f"rm {folder}" in str(caught.value)
    assert Cache(f"{scene.url}/e", cache_dir=scene.cache, max_cache_bytes=0).evict() == []  # nor through the link


@pytest.mark.parametrize("planted", [".tokformats-locks", ".tokformats-meta"])
def test_a_planted_link_for_the_caches_own_folders_is_refused(scene: Scene, planted: str) -> None:
    scene.serve("d/blob.dat", b"data")
    folder = Cache(f"{scene.url}/d", cache_dir=scene.cache).folder
    folder.mkdir(parents=True)
    os.symlink(scene.home / "dir", folder / planted)
    with pytest.raises(UnsafeCacheError, match=f"{planted} is a link or a file"):
        fetch(f"{scene.url}/d/blob.dat", **scene.options)


def test_public_url_drops_user_info_query_and_fragment() -> None:
    from tokformats.fs.paths import public_url, scrub_secrets

    assert public_url(f"https://u:{PASSWORD}@h.example:8443/d/x.bin?sig={SECRET}#f") == "https://h.example:8443/d/x.bin"
    assert public_url("http://[::1]:8080/x?y=1") == "http://[::1]:8080/x"
    assert public_url(f"s3://bucket/key?versionId={SECRET}") == "s3://bucket/key"
    text = scrub_secrets(f"failed: /d/x.bin?sig={SECRET} for u:{PASSWORD}", f"https://u:{PASSWORD}@h/d/x.bin?sig={SECRET}")
    assert SECRET not in text and PASSWORD not in text


def test_a_warm_cache_sees_a_republish_unless_offline(scene: Scene) -> None:
    first, docs_a = scene.llmc("a", 60, seed=3)
    second, docs_b = scene.llmc("b", 15, seed=4)
    publish(first, f"{scene.url}/d/")
    with tokformats.open(f"{scene.url}/d/", bos=0, **scene.options) as reader:
        assert [d.tolist() for d in reader] == docs_a
    publish(second, f"{scene.url}/d/", prune=True)
    with tokformats.open(f"{scene.url}/d/", bos=0, **{**scene.options, "offline": True}) as reader:
        assert [d.tolist() for d in reader] == docs_a  # offline: the cached version, no request
    with tokformats.open(f"{scene.url}/d/", bos=0, **scene.options) as reader:
        assert [d.tolist() for d in reader] == docs_b  # SHA256SUMS revalidated: the new version only


# -- 8. republishing ---------------------------------------------------------------------------------------------


def test_republishing_fewer_files_is_refused_without_prune(scene: Scene) -> None:
    first, _ = scene.llmc("a", 60, seed=5)
    second, docs_b = scene.llmc("b", 15, seed=6)
    publish(first, f"{scene.url}/d/")
    puts = list(scene.server.puts)
    with pytest.raises(StaleFilesError, match=r"--prune") as caught:
        publish(second, f"{scene.url}/d/")
    assert f"{scene.url}/d/ holds" in str(caught.value) and scene.server.puts == puts  # nothing uploaded
    summary = publish(second, f"{scene.url}/d/", prune=True)
    assert summary["removed"] and scene.server.deletes == [f"/d/{n}" for n in summary["removed"]]
    with tokformats.open(f"{scene.url}/d/", bos=0, cache_dir=scene.root / "cache" / "fresh") as reader:
        assert [d.tolist() for d in reader] == docs_b


def test_readers_go_by_sums_not_by_files_it_does_not_name(scene: Scene) -> None:
    first, _ = scene.llmc("a", 60, seed=7)
    second, docs_b = scene.llmc("b", 15, seed=8)
    publish(first, f"{scene.url}/d/")
    leftovers = {p.name: p.read_bytes() for p in (scene.served / "d").iterdir()}
    publish(second, f"{scene.url}/d/", prune=True)
    for name, data in leftovers.items():  # an older publisher's leftovers, still on the store
        if not (scene.served / "d" / name).exists():
            scene.serve(f"d/{name}", data)
    with tokformats.open(f"{scene.url}/d/c_*.bin", bos=0, **scene.options) as reader:
        assert [d.tolist() for d in reader] == docs_b


@pytest.fixture
def bucket(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An S3 bucket on moto's server on 127.0.0.1 (skipped without moto and s3fs)."""
    moto_server = pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    running = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    running.start()
    host, port = running.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint,
                       "AWS_ENDPOINT_URL_S3": endpoint}.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="tokformats-security")
    s3fs = pytest.importorskip("s3fs")
    s3fs.S3FileSystem.clear_instance_cache()  # fsspec keeps file systems by arguments: never one of another server's
    yield "s3://tokformats-security"
    s3fs.S3FileSystem.clear_instance_cache()
    running.stop()


def test_a_store_listing_never_adds_files_sums_does_not_name(scene: Scene, bucket: str) -> None:
    import fsspec

    first, _ = scene.llmc("a", 60, seed=11)
    second, docs_b = scene.llmc("b", 15, seed=12)
    publish(first, f"{bucket}/d/")
    old, new = {p.name for p in first.iterdir()}, {p.name for p in second.iterdir()}
    assert old - new
    with pytest.raises(StaleFilesError, match=sorted(old - new)[-1]):  # the listing shows them
        publish(second, f"{bucket}/d/")
    summary = publish(second, f"{bucket}/d/", prune=True)
    s3 = fsspec.filesystem("s3")
    s3.invalidate_cache()
    assert sorted(p.rsplit("/", 1)[1] for p in s3.find(f"{bucket}/d/")) == sorted({"SHA256SUMS", *new})
    assert summary["removed"] == sorted(old - new)
    s3.pipe_file(f"{bucket}/d/c_000007.bin", (first / "c_000001.bin").read_bytes())  # another writer's leftover
    s3.invalidate_cache()
    with tokformats.open(f"{bucket}/d/", bos=0, cache_dir=scene.cache) as reader:
        assert [d.tolist() for d in reader] == docs_b


def test_command_line_publish_prune(scene: Scene, capsys: pytest.CaptureFixture[str]) -> None:
    first, _ = scene.llmc("a", 60, seed=9)
    second, _ = scene.llmc("b", 15, seed=10)
    assert main(["publish", str(first), f"{scene.url}/d/"]) == 0
    assert main(["publish", str(second), f"{scene.url}/d/"]) != 0
    assert "--prune" in capsys.readouterr().err
    assert main(["publish", "--prune", str(second), f"{scene.url}/d/"]) == 0
    assert "removed c_" in capsys.readouterr().out


# -- 9. the .pt parser differential -------------------------------------------------------------------------------


def _pt_file(scene: Scene) -> Path:
    path = scene.work / "tokens.pt"
    with tokformats.create(path, "pt", dtype="int64") as writer:
        writer.write(list(range(1, 65)))
    return path


def test_a_pt_archive_with_two_records_of_one_name_is_refused(scene: Scene) -> None:
    path = _pt_file(scene)
    with zipfile.ZipFile(path) as archive:
        data_name = next(n for n in archive.namelist() if "/data/" in n)
        size = archive.getinfo(data_name).file_size
    with pytest.warns(UserWarning, match="Duplicate name"), zipfile.ZipFile(path, "a") as archive:
        archive.writestr(zipfile.ZipInfo(data_name), b"\x07" * size, compress_type=zipfile.ZIP_STORED)
    with pytest.raises(tokformats.FormatError, match=f"more than one record named {data_name}"):
        tokformats.open(path)


def test_a_pt_record_with_a_wrong_crc_is_reported_by_verify(scene: Scene) -> None:
    path = _pt_file(scene)
    with tokformats.open(path) as reader:
        assert reader.problems() == []
    with zipfile.ZipFile(path) as archive:
        data_name = next(n for n in archive.namelist() if "/data/" in n)
        original = archive.read(data_name)
    raw = bytearray(path.read_bytes())
    at = raw.index(original)
    raw[at] ^= 0x01  # token 1 becomes 0: the archive's CRC no longer matches
    path.write_bytes(bytes(raw))
    with tokformats.open(path) as reader:
        assert reader[0][0] == 0
        found = reader.problems()
    assert [(p.field, "CRC-32" in p.message) for p in found] == [(data_name, True)]
    with tokformats.open(path) as reader, pytest.raises(tokformats.FormatError, match="CRC-32"):
        reader.verify()


def test_a_gzip_crc_mismatch_is_refused(scene: Scene) -> None:
    from tokformats.formats.dolma import read_metadata

    path = scene.work / "m.csv.gz"
    raw = bytearray(gzip.compress(b"0,3,a,b,c\n3,5,d,e,f\n", mtime=0))
    raw[-8] ^= 0xFF  # the CRC-32 in the trailer
    path.write_bytes(bytes(raw))
    with pytest.raises(tokformats.FormatError, match="not a readable gzip file"):
        read_metadata(path)
