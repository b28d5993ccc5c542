"""The writing phase of a tokenize run: each stream's spools fed, partition by partition, to the format's writers,
whose outputs appear atomically once every partition is in, with each output's summary and provenance sidecar."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from .. import api
from ..core.dtypes import dtype_for_vocab
from ..core.protocol import TokenWriter
from ..core.provenance import ROW_DTYPE, Provenance, read_rows, save_provenance
from ..fs.untrusted import read_json_object
from .plan import Plan, stream_name
from .spools import CHECKPOINT, adopt_spool, join_spool

__all__ = ["checked_writer_options", "write_outputs"]


def _output_writer(
    plan: Plan,
    writer_class: type[TokenWriter],
    target: Path,
    split: str,
    writer_options: dict[str, Any],
    *,
    replace: bool,
) -> TokenWriter:
    """The writer of one output, told the delimiter its documents carry (formats that can record it do, so the
    output reads back without options)."""
    options = {
        "vocab_size": plan.vocab_size,
        **writer_class.tokenize_options,
        **writer_class.split_options(split or None),
        **writer_options,
    }
    writer = api.create_corpus(target, plan.format, overwrite=replace, **options)
    if plan.eos_id is not None:
        writer.declare_delimiter("bos" if plan.eos == "prepend" else "eos", plan.eos_id)
    else:
        writer.declare_delimiter("none", None)
    return writer


def checked_writer_options(
    plan: Plan,
    writer_class: type[TokenWriter],
    targets: dict[tuple[str, str], Path],
    writer_options: dict[str, Any],
    tokenizer: Any,
) -> dict[str, Any]:
    """The writer options of the run (with the tokenizer's name where the format records it, as datatrove's
    ``DocumentTokenizer`` does), after creating (and discarding) the first output's writer with them, so that a
    dtype or option the format refuses fails now, not after the whole encode."""
    named = writer_class.tokenizer_name_option
    if named and named not in writer_options and isinstance(tokenizer, (str, os.PathLike)):
        writer_options = {**writer_options, named: os.fspath(tokenizer)}
    (_, split), target = next(iter(targets.items()))
    _output_writer(plan, writer_class, target, split, writer_options, replace=True).abort()
    return writer_options


def write_outputs(
    plan: Plan,
    writer_class: type[TokenWriter],
    targets: dict[tuple[str, str], Path],
    parts: Iterable[Path],
    writer_options: dict[str, Any],
    *,
    replace: bool,
) -> dict[str, Any]:
    """Feed each stream's spools, partition by partition (as ``parts`` yields them: a parallel run's while later
    partitions are still encoding), to the format's writers, all open at once; each output appears atomically, in
    the order of ``targets``, once every partition is in. A failure before the outputs close discards every
    output's temporaries and stops the encoding (partitions not started are cancelled); one while they close keeps
    the outputs already closed, each whole."""
    dtype = dtype_for_vocab(plan.vocab_size)
    writers: dict[str, TokenWriter] = {}
    done: list[Path] = []
    try:
        for (key, split), target in targets.items():
            writers[stream_name(key, split)] = _output_writer(plan, writer_class, target, split, writer_options,
                                                               replace=replace)  # fmt: skip
        # One partition (a run without an executor): its spools become the outputs' data files where the format
        # allows (every id written once); else, and with several partitions, they are copied into the writers.
        single = isinstance(parts, list) and len(parts) == 1
        for part in parts:
            for name, writer in writers.items():
                if not (single and adopt_spool(writer, part, name, dtype)):
                    join_spool(writer, part, name, dtype)
                if not single:  # on the disk while later partitions encode: the close syncs the last one only
                    writer.write_back()
            done.append(part)
        for writer in writers.values():
            writer.close()
    except BaseException:
        close = getattr(parts, "close", None)  # a parallel run's partitions: stop waiting for them
        if close is not None:
            close()
        for writer in writers.values():
            writer.abort()
        raise
    paths = {stream_name(key, split): target for (key, split), target in targets.items()}
    return {name: _output_summary(plan, writer, paths[name], done, name) for name, writer in writers.items()}


def _output_summary(plan: Plan, writer: TokenWriter, target: Path, parts: list[Path], name: str) -> dict[str, Any]:
    """What the summary says of one written output (and its provenance sidecar, written here)."""
    summary: dict[str, Any] = {
        "path": str(target),
        "documents": writer.num_documents,
        "tokens": writer.num_tokens,
        "files": [str(p) for p in writer.written],
        "read_with": writer.read_with(),
    }
    if writer.loss_masked:
        summary["trained_tokens"] = writer.num_trained_tokens
    sources = _provenance(plan, parts, name, writer.num_documents) if plan.provenance else None
    if sources is not None:
        sidecar = save_provenance(sources, api.written_dataset_path(writer, plan.format))
        summary["provenance"] = str(sidecar)  # beside the dataset, not one of its files
    return summary


def _provenance(plan: Plan, parts: list[Path], name: str, documents: int) -> Provenance | None:
    """The sources of one stream's documents, from every partition's row spool in order; None when a spool is
    incomplete (a resumed run that began without provenance)."""
    pieces = []
    for part in parts:
        count = read_json_object(part / CHECKPOINT)["spools"][name]["documents"]
        rows = read_rows(part / f"{name}.provenance", count)
        if rows is None:
            return None
        pieces.append(rows)
    rows = np.concatenate(pieces) if pieces else np.zeros(0, dtype=ROW_DTYPE)
    if len(rows) != documents:
        return None
    units = []
    for k, source in enumerate(plan.inputs):
        suffix = source.lower().removesuffix(".gz").removesuffix(".zst")
        # A JSON array's records are items: its rows carry no byte offset.
        array = suffix.endswith(".json") and bool((rows["offset"][rows["input"] == k] < 0).any())
        units.append("row" if suffix.endswith(".parquet") else "item" if source == "<iterable>" or array else "line")
    return Provenance(list(plan.inputs), units, rows)
