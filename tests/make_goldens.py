"""Regenerate the golden files in ``tests/data/`` with the formats' owners' own tools; never by tokformats.

    python tests/make_goldens.py            # every format whose owner's package is installed
    python tests/make_goldens.py datatrove  # one or more formats

Each format gets a folder written by its owner's code, plus ``expected.json``: the documents the owner's writer
was given (what a reader must return). The corpora are small fixed texts and seeded random ids, so a rerun with the
same tool versions gives the same documents (some owners stamp files with times or random fingerprints; those
bytes differ, the tests do not read them).

- ``datatrove/``: datatrove's ``DocumentTokenizer`` (no shuffling), with the llm.c byte-level BPE tokenizer from
  ``shared/fixtures`` (or ``tests/data/shared/llmc``) and an EOS post-processor.
- ``dolma/``: dolma's ``MemmapWriter`` (``pip install dolma``, or ``DOLMA_SOURCE=`` an unpacked dolma wheel), two
  files of uint16 and one of uint32.
- ``hf/``: ``datasets.Dataset.save_to_disk`` (``int32``, two shards of two record batches) and a ``DatasetDict``.
- ``litdata/``: litdata's ``BinaryWriter`` with ``TokensLoader`` (what ``litdata.optimize`` runs per worker).
- ``shared/``: a copy of ``../shared/fixtures`` (written by megatron-core, llm.c, Time-MoE's converter and
  torch), so that a clone without ``shared/`` beside it runs the same golden tests.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parent / "data"
SHARED = Path(__file__).resolve().parents[2] / "shared" / "fixtures"
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "",
    "Ünïcödé, emoji 🙂 and tabs\tand\nnewlines.",
    "def f(x):\n    return x * 2\n",
    "a" * 300,
    "Short.",
]


def _documents(seed: int, count: int, high: int, dtype: str, shortest: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, high, int(rng.integers(shortest, 60))).astype(dtype) for _ in range(count)]


def _expected(folder: Path, documents: list[list[int]], **facts: object) -> None:
    (folder / "expected.json").write_text(json.dumps({**facts, "documents": documents}) + "\n")


def _fresh(name: str) -> Path:
    folder = DATA / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def _tokenizer_path() -> Path:
    for root in (SHARED, DATA / "shared"):
        path = root / "llmc" / "bytelevel_bpe.tokenizer.json"
        if path.is_file():
            return path
    raise SystemExit("the byte-level BPE tokenizer of shared/fixtures/llmc is needed (shared/ beside the repository)")


def datatrove() -> None:
    import os

    from datatrove.data import Document
    from datatrove.pipeline.tokens.tokenizer import DocumentTokenizer

    folder = _fresh("datatrove")
    shutil.copy(_tokenizer_path(), folder / "tokenizer.json")
    os.chdir(folder)  # .ds.metadata records the tokenizer path as given: keep it relative
    step = DocumentTokenizer(
        str(folder), tokenizer_name_or_path="tokenizer.json", shuffle_documents=False, eos_token="<|endoftext|>"
    )
    documents = [Document(text=text, id=str(k)) for k, text in enumerate(TEXTS)]
    step.run(iter(documents), rank=0, world_size=1)
    step.run(iter(documents[::-1]), rank=1, world_size=2)
    encoded = [step.tokenizer.encode(text).ids for text in TEXTS]
    _expected(folder, encoded + encoded[::-1], dtype="uint16", files=["00000_unshuffled.ds", "00001_unshuffled.ds"])


def _dolma_modules() -> tuple[type, type]:
    """dolma's ``TokenizerOutput`` and ``MemmapWriter``, unchanged, from the installed package or, because dolma
    1.2.1 pins numpy<2 and tokenizers<=0.19 (it cannot be installed beside tokformats' peers), from its unpacked
    wheel named by ``DOLMA_SOURCE`` (``pip download --no-deps dolma && unzip dolma-*.whl -d DIR``). The packages'
    ``__init__`` files import the Rust extension and every tagger; the two modules need only smart_open."""
    import importlib
    import os
    import types

    source = os.environ.get("DOLMA_SOURCE")
    if source:
        for package in ("dolma", "dolma.core", "dolma.tokenizer"):  # namespaces without running __init__
            module = types.ModuleType(package)
            module.__path__ = [str(Path(source, *package.split(".")))]
            sys.modules[package] = module
    data_types = importlib.import_module("dolma.tokenizer.data_types")
    memmap_writer = importlib.import_module("dolma.tokenizer.memmap_writer")
    return data_types.TokenizerOutput, memmap_writer.MemmapWriter


def dolma() -> None:
    TokenizerOutput, MemmapWriter = _dolma_modules()

    folder = _fresh("dolma")
    small = _documents(1, 40, 50_000, "uint16")
    large = _documents(2, 10, 100_000, "uint32")
    facts = {}
    for name, documents, dtype, max_tokens in (
        ("part-0-00000", small[:25], np.uint16, 10_000),
        ("part-0-00001", small[25:], np.uint16, 10_000),
        ("part-1-00000", large, np.uint32, 10_000),
    ):
        with MemmapWriter(str(folder / name), dtype=np.dtype(dtype), max_tokens=max_tokens) as writer:
            for k, document in enumerate(documents):
                output = TokenizerOutput.from_tokens(id=f"doc-{k}", src=f"s3://bucket/{name}.json.gz", loc=k,
                                                     tokens=document.tolist())  # fmt: skip
                assert writer.write(output)
        facts[name] = {"dtype": np.dtype(dtype).name, "documents": [d.tolist() for d in documents]}
    (folder / "expected.json").write_text(json.dumps(facts) + "\n")


def hf() -> None:
    import datasets

    folder = _fresh("hf")
    documents = [d.tolist() for d in _documents(3, 2200, 50_000, "int64")]
    dataset = datasets.Dataset.from_dict({"input_ids": documents, "text": [str(k) for k in range(len(documents))]})
    dataset.save_to_disk(str(folder / "plain"), num_shards=2)
    features = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int64"))})
    wide = datasets.Dataset.from_dict({"input_ids": documents[:50]}, features=features)
    datasets.DatasetDict({"train": wide, "test": wide.select(range(10))}).save_to_disk(str(folder / "dict"))
    _expected(folder, documents, dtype="int32", dict_dtype="int64")


def litdata() -> None:
    from litdata.streaming.item_loader import TokensLoader
    from litdata.streaming.writer import BinaryWriter

    folder = _fresh("litdata")
    # No empty document: litdata 0.2.76's BinaryWriter stops closing chunks at chunk_size after one (and gives a
    # chunk that starts with one "dim": null, which TokensLoader refuses).
    documents = _documents(4, 60, 50_000, "uint16", shortest=1)
    writer = BinaryWriter(str(folder), chunk_size=300, item_loader=TokensLoader())
    for k, document in enumerate(documents):
        writer[k] = document
    writer.done()
    writer.merge()
    _expected(folder, [d.tolist() for d in documents], dtype="uint16", chunk_size=300)


def shared() -> None:
    if not SHARED.is_dir():
        raise SystemExit(f"{SHARED} is missing: the shared fixtures are copied from there")
    target = DATA / "shared"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(SHARED, target)


MAKERS = {"datatrove": datatrove, "dolma": dolma, "hf": hf, "litdata": litdata, "shared": shared}


def main(names: list[str]) -> None:
    for name in names or list(MAKERS):
        try:
            MAKERS[name]()
        except ImportError as error:
            print(f"{name}: skipped, the owner's package is not installed ({error})")
            continue
        print(f"{name}: written to {DATA / name}")


if __name__ == "__main__":
    main(sys.argv[1:])
