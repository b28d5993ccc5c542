"""Loss masks as a side stream of every format that stores one: writers, readers, the owners' readers, convert,
verify, stats and ``head --mask``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tokformats
from tokformats.errors import FormatError

#: Formats whose writers store masks, with the path each writes to (under a folder) and reader options.
MASKED = {
    "datatrove": ("out.ds", {}),
    "megatron": ("out", {}),
    "dolma": ("out", {}),
    "hf": ("out", {}),
    "pt": ("out.pt", {"eos": 0}),
    "pt-folder": ("shards", {"eos": 0}),
}
UNMASKED = ("raw", "llmc", "litdata", "timemoe")


def _corpus(seed: int = 0) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Documents (ids 1..99, never 0: the .pt delimiter) and masks, including an empty document and all-0/all-1."""
    rng = np.random.default_rng(seed)
    documents, masks = [], []
    for length in [5, 0, 1, 17, 3, 40, 2]:
        documents.append(rng.integers(1, 100, length))
        masks.append(rng.integers(0, 2, length).astype(np.uint8))
    masks[2][:] = 0
    masks[3][:] = 1
    return documents, masks


def _write(folder: Path, name: str, documents: list[np.ndarray], masks: list[np.ndarray]) -> Path:
    target, _ = MASKED[name]
    format = name.split("-")[0]
    options = {"eos": 0, "tokens_per_shard": 16} if name == "pt-folder" else {"eos": 0} if name == "pt" else {}
    with tokformats.create(folder / target, format=format, vocab_size=100, **options) as writer:
        writer.write(documents[0], loss_mask=masks[0])
        writer.write_batch(np.concatenate(documents[1:]), [len(d) for d in documents[1:]], np.concatenate(masks[1:]))
    return folder / target


def _expected(name: str, documents: list[np.ndarray], masks: list[np.ndarray]) -> tuple[list, list]:
    """What reads back: .pt documents end with the writer's EOS (trained on); its empty documents vanish."""
    if not name.startswith("pt"):
        return [d.tolist() for d in documents], [m.tolist() for m in masks]
    return [[*d.tolist(), 0] for d in documents], [[*m.tolist(), 1] for m in masks]


@pytest.mark.parametrize("name", sorted(MASKED))
def test_masks_round_trip_in_every_format_that_stores_them(tmp_path: Path, name: str) -> None:
    documents, masks = _corpus()
    path = _write(tmp_path, name, documents, masks)
    with tokformats.open(path, **MASKED[name][1]) as reader:
        want_documents, want_masks = _expected(name, documents, masks)
        assert [reader[i].tolist() for i in range(len(reader))] == want_documents
        assert [reader.loss_mask(i).tolist() for i in range(len(reader))] == want_masks
        assert reader.loss_masks is not None and len(reader.loss_masks) == reader.num_tokens
        assert reader.problems() == []
        stats = reader.stats()
        assert stats["trained_tokens"] == sum(sum(m) for m in want_masks)


@pytest.mark.parametrize("name", sorted(MASKED))
def test_a_dataset_written_without_masks_reads_all_ones(tmp_path: Path, name: str) -> None:
    documents, _ = _corpus()
    target, read_options = MASKED[name]
    format = name.split("-")[0]
    options = {"eos": 0, "tokens_per_shard": 16} if format == "pt" else {}
    if name == "pt":
        options.pop("tokens_per_shard")
    with tokformats.create(tmp_path / target, format=format, vocab_size=100, **options) as writer:
        for document in documents:
            writer.write(document)
    with tokformats.open(tmp_path / target, **read_options) as reader:
        assert reader.loss_masks is None
        assert reader.loss_mask(0).tolist() == [1] * len(reader[0])
        assert "trained_tokens" not in reader.stats()
    names = sorted(p.name for p in (tmp_path / target).parent.rglob("*"))
    assert not any("mask" in n or n.endswith(".loss") for n in names)


@pytest.mark.parametrize("format", UNMASKED)
def test_formats_without_masks_refuse_one_naming_those_that_store_them(tmp_path: Path, format: str) -> None:
    target = tmp_path / ("out.bin" if format in ("raw", "llmc") else "out")
    options = {"eos": 0} if format == "raw" else {}
    with pytest.raises(FormatError) as caught, tokformats.create(target, format=format, vocab_size=100, **options) as w:
        w.write([1, 2, 3], loss_mask=[0, 1, 1])
    message = str(caught.value)
    assert f"the {format} format stores no loss mask" in message
    assert all(name in message for name in ("datatrove", "megatron", "dolma", "hf", "pt"))
    assert not target.exists()


def test_bad_masks_are_refused_naming_the_document(tmp_path: Path) -> None:
    with pytest.raises(FormatError, match="one value per token"), tokformats.create(
        tmp_path / "a.ds", format="datatrove", vocab_size=100
    ) as writer:
        writer.write([1, 2, 3], loss_mask=[1, 1])
    with pytest.raises(FormatError, match=r"document 1 has \[2\]"), tokformats.create(
        tmp_path / "b.ds", format="datatrove", vocab_size=100
    ) as writer:
        writer.write_batch([1, 2, 3, 4], [2, 2], [1, 0, 2, 1])
    with pytest.raises(FormatError, match="after 1 documents written without one"), tokformats.create(
        tmp_path / "c.ds", format="datatrove", vocab_size=100
    ) as writer:
        writer.write([1, 2])
        writer.write([3], loss_mask=[1])
    assert not list(tmp_path.iterdir())


def test_after_a_masked_write_an_unmasked_one_is_trained_on(tmp_path: Path) -> None:
    with tokformats.create(tmp_path / "a.ds", format="datatrove", vocab_size=100) as writer:
        writer.write([1, 2], loss_mask=np.array([False, True]))
        writer.write([3, 4, 5])
    assert writer.num_trained_tokens == 4
    with tokformats.open(tmp_path / "a.ds") as reader:
        assert reader.loss_masks[:].tolist() == [0, 1, 1, 1, 1]


def test_datatrove_loss_file_is_byte_identical_to_datatrove(tmp_path: Path, tokenizer_path: Path) -> None:
    pytest.importorskip("datatrove")
    from datatrove.data import Document
    from datatrove.pipeline.tokens.tokenizer import DocumentTokenizer

    texts = ["Question: what is two and two?\nAnswer: four.", "Tell me a story.\nOnce upon a time...", "plain"]
    ranges = [[(0, 31)], [(0, 16)], []]  # the prompts: never reaching the end (datatrove drops such a tail)
    documents = [
        Document(text=t, id=str(k), metadata={"no_loss_ranges": r}) for k, (t, r) in enumerate(zip(texts, ranges))
    ]
    DocumentTokenizer(
        str(tmp_path / "dt"), str(tokenizer_path), eos_token="<|endoftext|>", save_loss_metadata=True,
        shuffle_documents=False,
    ).run(iter(documents))  # fmt: skip
    (golden,) = sorted((tmp_path / "dt").glob("*.ds"))
    with tokformats.open(golden) as reader:
        tokens, lengths, masks = np.asarray(reader.tokens[:]), reader.lengths, np.asarray(reader.loss_masks[:])
        first_line = (Path(f"{golden}.metadata").read_text().split("\n")[0]).rsplit("|", 1)[0]
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    prompt = tokenizer.encode(texts[0][:31], add_special_tokens=False).ids
    assert masks[: len(prompt)].tolist() == [0] * len(prompt) and masks[len(prompt)] == 1
    ours = tmp_path / "ours" / golden.name
    with tokformats.create(ours, format="datatrove", dtype="uint16", tokenizer_name=first_line) as writer:
        writer.write_batch(tokens, lengths, masks)
    for suffix in ("", ".index", ".loss", ".metadata"):
        assert Path(f"{ours}{suffix}").read_bytes() == Path(f"{golden}{suffix}").read_bytes(), suffix


def test_megatron_core_opens_the_mask_dataset(tmp_path: Path) -> None:
    pytest.importorskip("megatron.core")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import IndexedDataset
    documents, masks = _corpus()
    _write(tmp_path, "megatron", documents, masks)
    tokens, mask_dataset = IndexedDataset(str(tmp_path / "out")), IndexedDataset(str(tmp_path / "out_loss_mask"))
    assert len(mask_dataset) == len(tokens) == len(documents)
    assert mask_dataset.index.dtype == np.uint8
    assert [mask_dataset[i].tolist() for i in range(len(documents))] == [m.tolist() for m in masks]
    assert (mask_dataset.document_indices == tokens.document_indices).all()


def test_olmo_core_reads_the_label_mask(tmp_path: Path) -> None:
    pytest.importorskip("olmo_core")
    from olmo_core.data.numpy_dataset import NumpyFSLDataset

    documents, masks = _corpus()
    _write(tmp_path, "dolma", documents, masks)
    (npy,) = sorted((tmp_path / "out").glob("part-*[0-9].npy"))
    dataset = NumpyFSLDataset(
        str(npy), sequence_length=8, pad_token_id=1, eos_token_id=0, vocab_size=100, dtype=np.uint16,
        label_mask_paths=[str(npy).replace(".npy", ".label_mask.npy")],
    )  # fmt: skip
    dataset.work_dir = tmp_path / "work"
    flat_masks = np.concatenate(masks).astype(bool)
    flat_tokens = np.concatenate(documents)
    for i in range(len(dataset)):
        item = dataset[i]
        assert item["input_ids"].tolist() == flat_tokens[8 * i : 8 * i + 8].tolist()
        assert item["label_mask"].tolist() == flat_masks[8 * i : 8 * i + 8].tolist()


def test_datasets_loads_the_mask_column(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    documents, masks = _corpus()
    _write(tmp_path, "hf", documents, masks)
    loaded = datasets.load_from_disk(str(tmp_path / "out"))
    assert loaded.column_names == ["input_ids", "assistant_masks"]
    assert [row["assistant_masks"] for row in loaded] == [m.tolist() for m in masks]
    assert [row["input_ids"] for row in loaded] == [d.tolist() for d in documents]


def test_torch_loads_the_mask_tensors(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    documents, masks = _corpus()
    _write(tmp_path, "pt", documents, masks)
    _write(tmp_path, "pt-folder", documents, masks)
    want = np.concatenate([np.append(m, 1) for m in masks]).astype(bool).tolist()
    single = torch.load(tmp_path / "out.loss_mask.pt", weights_only=True)
    assert single.dtype == torch.bool and single.tolist() == want
    shards = sorted((tmp_path / "shards").glob("shard_*.loss_mask.pt"), key=lambda p: int(p.name.split(".")[0][6:]))
    joined = torch.cat([torch.load(p, weights_only=True) for p in shards])
    assert joined.dtype == torch.bool and joined.tolist() == want
    assert [len(torch.load(p, weights_only=True)) for p in shards][:-1] == [16] * (len(shards) - 1)


@pytest.mark.parametrize("source", sorted(MASKED))
@pytest.mark.parametrize("destination", sorted(MASKED))
def test_convert_carries_masks_to_every_mask_capable_format(tmp_path: Path, source: str, destination: str) -> None:
    documents, masks = _corpus(1)
    path = _write(tmp_path / "src", source, documents, masks)
    target, read_options = MASKED[destination]
    format = destination.split("-")[0]
    options: dict = {"tokens_per_shard": 16} if destination == "pt-folder" else {}
    if format == "pt":  # its documents end at an EOS: convert inserts it, trained on
        options["eos"] = 0
    summary = tokformats.convert(path, tmp_path / "dst" / target, format, source_options=MASKED[source][1], **options)
    assert summary["loss_masks"] is True
    with tokformats.open(tmp_path / "dst" / target, **read_options) as reader:
        either = "pt" if "pt" in (source.split("-")[0], format) else format
        want_documents, want_masks = _expected(either, documents, masks)
        got = [reader[i].tolist() for i in range(len(reader))]
        assert got == want_documents
        assert [reader.loss_mask(i).tolist() for i in range(len(reader))] == want_masks


def test_convert_refuses_to_drop_masks_unless_asked(tmp_path: Path) -> None:
    documents, masks = _corpus()
    path = _write(tmp_path, "datatrove", documents, masks)
    with pytest.raises(FormatError, match="drop_masks=True"):
        tokformats.convert(path, tmp_path / "x.bin", "raw", eos=0)
    assert not (tmp_path / "x.bin").exists()
    summary = tokformats.convert(path, tmp_path / "x.bin", "raw", eos=0, drop_masks=True)
    assert summary["loss_masks"] is False and summary["tokens"] == sum(len(d) + 1 for d in documents)


def test_merge_keeps_masks(tmp_path: Path) -> None:
    from tokformats.api import merge

    documents, masks = _corpus()
    _write(tmp_path / "a", "megatron", documents, masks)
    _write(tmp_path / "b", "datatrove", documents, masks)
    want = np.concatenate(masks + masks).tolist()
    with merge([tmp_path / "a" / "out", tmp_path / "a" / "out"], tmp_path / "m") as merged:
        assert merged.format == "megatron" and merged.loss_masks[:].tolist() == want
    with merge([tmp_path / "b" / "out.ds", tmp_path / "b" / "out.ds"], tmp_path / "m.ds") as merged:
        assert merged.format == "datatrove" and merged.loss_masks[:].tolist() == want


def test_verify_finds_a_mask_that_does_not_fit(tmp_path: Path) -> None:
    documents, masks = _corpus()
    path = _write(tmp_path, "datatrove", documents, masks)
    loss = Path(f"{path}.loss")
    loss.write_bytes(loss.read_bytes()[:-1] + b"\x07")
    with tokformats.open(path) as reader:
        found = reader.problems()
    assert len(found) == 1 and found[0].field == "loss_masks" and "mask value 7" in found[0].message
    assert found[0].document == len(documents) - 1
    loss.write_bytes(loss.read_bytes()[:-2])
    with tokformats.open(path) as reader:
        found = reader.problems()
    assert found and found[0].field == "loss_masks" and "loss bytes" in found[0].message


def test_cli_head_mask_stats_and_convert_drop_masks(tmp_path: Path) -> None:
    documents, masks = _corpus()
    path = _write(tmp_path, "megatron", documents, masks)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "tokformats", *args], capture_output=True, text=True, env=env)

    head = run("head", str(path), "-n", "1", "--mask")
    assert head.returncode == 0, head.stderr
    want = " ".join(f"{t}" if m else f"~{t}" for t, m in zip(documents[0].tolist(), masks[0].tolist()))
    assert head.stdout.splitlines()[1] == want
    assert f"{int(masks[0].sum())} trained on" in head.stdout.splitlines()[0]
    info = run("info", str(path), "--json")
    assert info.returncode == 0, info.stderr
    import json

    assert json.loads(info.stdout)["loss_masks"] is True
    stats = run("stats", str(path))
    trained = int(sum(m.sum() for m in masks))
    assert f"loss mask: {trained:,} tokens trained on" in stats.stdout
    refused = run("convert", str(path), str(tmp_path / "x.bin"), "--to", "raw", "--to-eos", "0")
    assert refused.returncode != 0 and "--drop-masks" in refused.stderr
    dropped = run("convert", str(path), str(tmp_path / "x.bin"), "--to", "raw", "--to-eos", "0", "--drop-masks")
    assert dropped.returncode == 0, dropped.stderr
