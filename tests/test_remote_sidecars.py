"""A dataset's side files by URL (issues 25 and 27): every format's loss-mask companion and the provenance sidecar
are published, fetched and verified with the tokens, and a reader opened by URL reads them as the local one does."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tokformats
from tokformats.core.provenance import FOLDER_SIDECAR
from tokformats.remote import ChecksumError, fetch, publish
from tokformats.tokenization.sample_text import sample_texts

from .http_server import FileServer
from .test_loss_masks import MASKED, _corpus, _write

pytestmark = pytest.mark.usefixtures("quick_retries")  # retries back off a few milliseconds here




def _chat_file(folder: Path, count: int = 7, name: str = "chats.jsonl") -> Path:
    """A JSONL file of :func:`_chats` (a file input: tokenize records each conversation's line and byte offset)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("".join(json.dumps(chat) + "\n" for chat in _chats(count)), encoding="utf-8")
    return path


def _chats(count: int = 7) -> list[dict[str, Any]]:
    """Conversations with a system turn, a user turn holding a special's spelling, and one or two assistant turns."""
    chats = []
    for k in range(count):
        messages = [
            {"role": "system", "content": f"You answer briefly ({k})."},
            {"role": "user", "content": f"What is {k} + {k}? <|im_end|> is text here."},
            {"role": "assistant", "content": f"It is {2 * k}."},
        ]
        if k % 2:
            messages += [{"role": "user", "content": "And doubled?"}, {"role": "assistant", "content": f"{4 * k}."}]
        chats.append({"messages": messages})
    return chats


#: format -> (what tokenize writes under OUT/sft, the folder published, the URL path opened below the published URL)
TOKENIZED = {
    "datatrove": ("sft.ds", ".", "sft.ds"),
    "megatron": ("sft_text_document", ".", "sft_text_document"),
    "dolma": ("sft", "sft", ""),
    "hf": ("sft", "sft", ""),
    "pt": ("sft", "sft", ""),
}


def _text_file(folder: Path, count: int = 9, name: str = "texts.jsonl") -> Path:
    """A JSONL file of distinct texts (tokenize records each one's line and byte offset)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    texts = [f"{t} ({name} {k})" for k, t in enumerate(sample_texts(count, seed=len(name)))]
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    return path


def _by_url(tmp_path: Path, server: FileServer, out: Path, format: str, tag: str) -> tuple[Path, str, dict[str, Any]]:
    """Publish what tokenize wrote to ``out/sft`` in ``format``: (the local path to open, the URL, reader options)."""
    written, published, opened = TOKENIZED[format]
    summary = publish(out / published, f"{server.url}/{tag}/")
    if published != "." and format != "dolma":  # the sidecar beside the folder is published into it
        assert (FOLDER_SIDECAR in summary["uploaded"]) == (out / "sft.provenance.npz").is_file()
    return out / written, f"{server.url}/{tag}/{opened}", {"eos": 0} if format == "pt" else {}


@pytest.mark.parametrize("format", sorted(TOKENIZED))
def test_chat_loss_masks_of_each_format_by_url(
    tmp_path: Path, server: FileServer, tokenizer_path: Path, format: str
) -> None:
    out = tmp_path / "chat"
    tokformats.tokenize([_chat_file(tmp_path / "in")], tokenizer_path, out / "sft", format, chat="messages",
                        progress=False)  # fmt: skip
    path, url, options = _by_url(tmp_path, server, out, format, f"chat-{format}")
    with tokformats.open(path, **options) as local, tokformats.open(url, cache_dir=tmp_path / "c", **options) as remote:
        assert len(remote) == len(local) == 7
        for i in range(len(local)):
            assert remote[i].tolist() == local[i].tolist()
            assert remote.loss_mask(i).tolist() == local.loss_mask(i).tolist()
        assert 0 < int(np.asarray(remote.loss_masks).sum()) < remote.num_tokens  # the prompts are masked


@pytest.mark.parametrize("format", sorted(TOKENIZED))
def test_provenance_of_each_format_by_url(
    tmp_path: Path, server: FileServer, tokenizer_path: Path, format: str
) -> None:
    out = tmp_path / "text"
    tokformats.tokenize([_text_file(tmp_path / "in")], tokenizer_path, out / "sft", format, progress=False)
    path, url, options = _by_url(tmp_path, server, out, format, f"text-{format}")
    with tokformats.open(path, **options) as local, tokformats.open(url, cache_dir=tmp_path / "c", **options) as remote:
        assert len(remote) == len(local) == 9
        sources = [remote.provenance(i) for i in range(len(remote))]
        assert sources == [local.provenance(i) for i in range(len(local))]
        assert [s["line"] for s in sources if s] == list(range(1, 10))


@pytest.mark.parametrize("name", sorted(MASKED))
def test_masks_written_by_the_writer_api_read_by_url_as_locally(tmp_path: Path, server: FileServer, name: str) -> None:
    documents, masks = _corpus(3)
    path = _write(tmp_path / "src", name, documents, masks)
    folder = path if path.is_dir() else path.parent
    publish(folder, f"{server.url}/{name}/")
    url = f"{server.url}/{name}/" + ("" if path.is_dir() else path.name)
    options = MASKED[name][1]
    with tokformats.open(path, **options) as local, tokformats.open(
        url, cache_dir=tmp_path / "cache", **options
    ) as remote:
        assert remote.loss_masks is not None
        assert [remote.loss_mask(i).tolist() for i in range(len(remote))] == [
            local.loss_mask(i).tolist() for i in range(len(local))
        ]


def test_lazy_readers_fetch_their_masks_on_first_use(tmp_path: Path, server: FileServer) -> None:
    documents, masks = _corpus(5)
    for name in ("dolma", "pt-folder"):
        path = _write(tmp_path / name, name, documents, masks)
        publish(path, f"{server.url}/{name}/")
        with tokformats.open(f"{server.url}/{name}/", cache_dir=tmp_path / "cache", **MASKED[name][1]) as reader:
            mask_gets = [p for p in server.gets if p.startswith(f"/{name}/") and "mask" in p]
            data_gets = [p for p in server.gets if p.startswith(f"/{name}/") and p.endswith((".npy", ".pt"))]
            assert mask_gets == [] and data_gets == []  # opened from its index files alone
            assert reader.loss_mask(3).tolist() == masks[3].tolist() + ([1] if name == "pt-folder" else [])
            assert [p for p in server.gets if p.startswith(f"/{name}/") and "mask" in p]


def test_fetch_brings_masks_verified_and_with_named_shards(tmp_path: Path, server: FileServer) -> None:
    documents, masks = _corpus(6)
    path = _write(tmp_path / "src", "pt-folder", documents, masks)
    publish(path, f"{server.url}/shards/")
    some = fetch(f"{server.url}/shards/", names=["shard_1.pt"], cache_dir=tmp_path / "a")
    assert set(some.files) >= {"shard_1.pt", "shard_1.loss_mask.pt"} and "shard_2.loss_mask.pt" not in some.files
    server.fault("/shards/shard_0.loss_mask.pt", "corrupt")
    with pytest.raises(ChecksumError, match=r"shard_0\.loss_mask\.pt: its SHA-256 is"):
        fetch(f"{server.url}/shards/", cache_dir=tmp_path / "b")
    path = _write(tmp_path / "file", "pt", documents, masks)
    publish(path.parent, f"{server.url}/file/")
    server.fault("/file/out.loss_mask.pt", "corrupt")
    with pytest.raises(ChecksumError, match=r"out\.loss_mask\.pt"):
        tokformats.open(f"{server.url}/file/out.pt", cache_dir=tmp_path / "c", eos=0)
    with tokformats.open(f"{server.url}/file/out.pt", cache_dir=tmp_path / "c", eos=0) as reader:  # fetched again
        assert reader.loss_mask(0).tolist() == [*masks[0].tolist(), 1]


def test_optional_companions_a_published_folder_does_not_list_are_not_asked(
    tmp_path: Path, server: FileServer
) -> None:
    with tokformats.create(tmp_path / "src" / "plain.ds", "datatrove", vocab_size=100) as writer:
        writer.write_batch(np.arange(1, 31), [10, 20])
    publish(tmp_path / "src", f"{server.url}/dt/")
    with tokformats.open(f"{server.url}/dt/plain.ds", cache_dir=tmp_path / "cache") as reader:
        assert reader.loss_masks is None and reader.provenance(1) is None
        assert reader[1].tolist() == list(range(11, 31))
    asked = {p for p in server.paths if p.startswith("/dt/")}
    assert not any(p.endswith((".ds.loss", ".provenance.npz")) for p in asked)


def test_a_provenance_sidecar_by_url_is_verified_and_never_taken_from_beside_the_cache(
    tmp_path: Path, server: FileServer, tokenizer_path: Path
) -> None:
    out = tmp_path / "out"
    texts = _text_file(tmp_path / "in", 5)
    tokformats.tokenize([texts], tokenizer_path, out / "sft", "hf", progress=False)
    publish(out / "sft", f"{server.url}/hf/")
    with tokformats.open(out / "sft") as local:
        expected = [local.provenance(i) for i in range(len(local))]
    server.fault(f"/hf/{FOLDER_SIDECAR}", "corrupt")
    with pytest.raises(ChecksumError, match=FOLDER_SIDECAR):
        tokformats.open(f"{server.url}/hf/", cache_dir=tmp_path / "cache")
    with tokformats.open(f"{server.url}/hf/", cache_dir=tmp_path / "cache") as reader:
        assert [reader.provenance(i) for i in range(len(reader))] == expected
        folder = Path(reader.path)
    # A fetched folder opened by path finds the sidecar it holds.
    with tokformats.open(folder) as copy:
        assert copy.provenance(len(copy) - 1) == expected[-1]
    # A file planted beside a cache folder is not the dataset's: a reader by URL reads the published one only.
    other = _text_file(tmp_path / "in", 5, "other.jsonl")
    tokformats.tokenize([other], tokenizer_path, out / "other", "hf", progress=False)
    tokformats.tokenize([texts], tokenizer_path, out / "bare", "hf", provenance=False, progress=False)
    publish(out / "bare", f"{server.url}/bare/")
    with tokformats.open(f"{server.url}/bare/", cache_dir=tmp_path / "cache") as reader:
        planted = Path(str(reader.path) + ".provenance.npz")
        planted.write_bytes((out / "other.provenance.npz").read_bytes())
        assert reader.provenance(0) is None


def test_a_lazy_reader_reopened_from_a_pickle_reads_its_provenance(
    tmp_path: Path, server: FileServer, tokenizer_path: Path
) -> None:
    out = tmp_path / "text"
    tokformats.tokenize([_text_file(tmp_path / "in")], tokenizer_path, out / "sft", "pt", progress=False)
    publish(out / "sft", f"{server.url}/pt/")
    with tokformats.open(f"{server.url}/pt/", cache_dir=tmp_path / "cache") as reader:
        assert "/pt/shard_0.pt" not in server.gets  # lazy: opened from the manifest
        copy = pickle.loads(pickle.dumps(reader))  # what a DataLoader worker gets
        try:
            assert [copy.provenance(i) for i in range(len(copy))] == [reader.provenance(i) for i in range(9)]
            assert copy.provenance(8)["line"] == 9
        finally:
            copy.close()


def test_a_megatron_bin_or_idx_url_brings_the_prefixs_loss_masks(tmp_path: Path, server: FileServer) -> None:
    documents, masks = _corpus(7)
    path = _write(tmp_path / "src", "megatron", documents, masks)
    publish(path.parent, f"{server.url}/m/")
    for suffix in (".bin", ".idx"):
        with tokformats.open(f"{server.url}/m/{path.name}{suffix}", cache_dir=tmp_path / suffix[1:]) as reader:
            assert [reader.loss_mask(i).tolist() for i in range(len(reader))] == [m.tolist() for m in masks]
    with tokformats.open(f"{server.url}/m/{path.name}_loss_mask.bin", cache_dir=tmp_path / "m") as reader:
        assert reader.loss_masks is None  # the mask dataset itself has none
        assert np.asarray(reader.tokens).tolist() == np.concatenate(masks).tolist()
