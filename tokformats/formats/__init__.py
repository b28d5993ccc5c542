"""One module per on-disk format, each holding that format's ``Reader``, ``Writer`` and ``detect``.

This package registers the built-in formats with :mod:`tokformats.registry` (the registry itself knows none):
adding a format is its module here plus one line below (or, outside tokformats, a ``tokformats.formats`` entry
point).
"""

from __future__ import annotations

from ..registry import FormatDescriptor, register, set_default_corpus_format

# The built-in formats, in detection order: formats with magic numbers first, layouts after, and
# headerless raw last (never detected: its bytes say nothing).
_BUILTIN = (
    ("llmc-vocab", "llm.c tokenizer vocabulary (gpt2_tokenizer.bin)", (".bin",), True),
    ("llmc", "llm.c token shards (1 KiB header, uint16/uint32)", (".bin",), True),
    ("megatron", "Megatron-LM indexed dataset (PREFIX.bin + PREFIX.idx)", (".bin", ".idx"), True),
    ("pt", "PyTorch .pt token shards, or a folder of shard_N.pt + manifest.json", (".pt",), True),
    ("timemoe", "Time-MoE / Time-300B folder: meta.json + data-K-of-N.bin", (), True),
    ("datatrove", "HF datatrove token files: NAME.ds + NAME.ds.index (+ .ds.loss, .ds.metadata)", (".ds",), True),
    ("litdata", "litdata TokensLoader folder: index.json + chunk-R-K.bin", (".json",), True),
    ("hf", "HF datasets save_to_disk folder with a token column (input_ids)", (".arrow",), True),
    ("dolma", "OLMo / dolma token memmaps: headerless NAME.npy + NAME.csv.gz", (".npy",), True),
    (
        "sequences",
        "single-file sequence dataset (.json, .jsonl, .npy, .npz, .npy.gz)",
        (".json", ".jsonl", ".npy", ".npz", ".gz"),
        True,
    ),
    ("raw", "headerless token stream (dtype must be given)", (".bin",), False),
)
for _name, _description, _suffixes, _detectable in _BUILTIN:
    _module = f"{__name__}.{_name.replace('-', '_')}"
    register(FormatDescriptor(_name, _description, _suffixes, _module, _detectable, writable=_name != "sequences"))
# What tokenize writes unless told: Megatron's indexed dataset, the format most pretraining stacks read.
set_default_corpus_format("megatron")
