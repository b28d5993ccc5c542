"""Dict samples of ``GPTSamples(fields=...)`` against megatron-core's own ``GPTDataset.__getitem__``.

Imported by ``tests/test_training_fields.py`` (megatron-core 0.16.1 in the default Python) and run as a script by
``tests/test_training_mcore019.py`` in the Python 3.12 environment that holds megatron-core 0.19.2:

    PYTHONPATH=. python -m tests.megatron_fields --trials 6

The script builds random Megatron corpora (empty sequences, EOD ids inside and at the ends of documents), builds
megatron-core's datasets through ``BlendedMegatronDatasetBuilder`` for every combination of the sample flags the
installed version has, and compares every key, dtype and value of many samples (and the ``idx=None`` padding
sample). It prints one summary line and exits 1 on the first difference.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import logging
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np

import tokformats
from tokformats import training

EOD = 0
#: Flags of ``GPTDatasetConfig`` that shape a sample dict, and whether 0.16.1 has them.
FLAGS = ("eod_mask_loss", "reset_position_ids", "reset_attention_mask", "create_attention_mask")


def megatron_modules() -> Any:
    """megatron-core's dataset modules (quietly: it warns about accelerators it lacks)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets import gpt_dataset
        from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    logging.getLogger("megatron").setLevel(logging.ERROR)
    return gpt_dataset, BlendedMegatronDatasetBuilder


def has_inter_document_masking() -> bool:
    """Whether the installed megatron-core has 0.19's ``inter_document_masking``."""
    gpt, _ = megatron_modules()
    return "inter_document_masking" in {f.name for f in dataclasses.fields(gpt.GPTDatasetConfig)}


def make_tokenizer(pad: int | None) -> Any:
    """What ``GPTDatasetConfig`` asks of a tokenizer; without ``pad`` megatron-core pads with -1."""
    attributes: dict[str, Any] = {"eod": EOD, "vocab_size": None, "unique_identifiers": {"class": f"test-{pad}"}}
    if pad is not None:
        attributes["pad"] = pad
    return type("Tokenizer", (), attributes)()


def write_corpus(path: Path, rng: np.random.Generator, documents: int) -> Path:
    """A Megatron corpus: lengths from 0 (empty sequences) up, ids from 1, EOD at most documents' ends and now
    and then inside one."""
    lengths = rng.geometric(1.0 / float(rng.integers(3, 40)), size=documents) - 1
    lengths[rng.random(documents) < 0.08] = 0
    ids = rng.integers(1, 60, size=int(lengths.sum())).astype(np.int64)
    ends = np.cumsum(lengths)[lengths > 0] - 1
    ids[ends[rng.random(len(ends)) < 0.8]] = EOD
    ids[rng.random(len(ids)) < 0.02] = EOD
    with tokformats.create(path, format="megatron", vocab_size=50257) as writer:
        writer.write_batch(ids, lengths)
    return path


def build_megatron(prefix: Path, sizes: list[int | None], options: dict[str, Any], pad: int | None) -> list[Any]:
    """megatron-core's three split datasets over ``prefix`` with ``options`` (GPTDatasetConfig fields)."""
    gpt, builder = megatron_modules()
    config = gpt.GPTDatasetConfig(
        tokenizer=make_tokenizer(pad), path_to_cache=None, mmap_bin_files=True, blend=([str(prefix)], None), **options
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return builder(gpt.GPTDataset, sizes, lambda: True, config).build()


def to_numpy(value: Any) -> np.ndarray:
    """A megatron-core field as NumPy (its tensors share their memory)."""
    return value.numpy() if hasattr(value, "numpy") else np.asarray(value)


def compare(ours: training.GPTSamples, theirs: Any, picks: list[int | None]) -> int:
    """Samples ``picks`` (None: the padding sample) equal key for key, dtype for dtype; the number compared.

    A sample megatron-core fails on (more parts than ``L + 1`` ``cu_seqlens`` entries hold) is skipped."""
    compared = 0
    for i in picks:
        try:
            expected = theirs[i]
        except RuntimeError:
            continue
        got = ours[i]
        assert list(got) == list(expected), f"sample {i}: keys {list(got)} != {list(expected)}"
        for key, value in expected.items():
            want = to_numpy(value)
            assert got[key].dtype == want.dtype, f"sample {i} {key}: dtype {got[key].dtype} != {want.dtype}"
            assert got[key].shape == want.shape, f"sample {i} {key}: shape {got[key].shape} != {want.shape}"
            if not np.array_equal(got[key], want):
                raise AssertionError(f"sample {i} {key}: {got[key].tolist()} != {want.tolist()}")
        compared += 1
    return compared


def flag_combinations(masking: bool) -> list[dict[str, bool]]:
    """Every combination of the sample flags (and ``inter_document_masking`` when the version has it)."""
    names = (*FLAGS, "inter_document_masking") if masking else FLAGS
    return [dict(zip(names, values)) for values in itertools.product((False, True), repeat=len(names))]


def run_trial(folder: Path, trial: int, masking: bool, flags_subset: int | None = None) -> int:
    """One random corpus and configuration, every flag combination (or ``flags_subset`` random ones); the number
    of samples compared."""
    rng = np.random.default_rng(7000 + trial)
    prefix = write_corpus(folder / f"corpus{trial}", rng, int(rng.integers(20, 200)))
    reader = tokformats.open(prefix)
    sequence_length = int(rng.choice([7, 16, 33]))
    add_extra = trial % 3 != 1
    pad = [None, 3, 5][trial % 3]
    tokens = int(reader.sequence_lengths.sum())
    per_epoch = max(1, tokens // sequence_length)
    num_samples = [None, per_epoch * 3 + 2, per_epoch // 2 + 1][trial % 3]
    if tokens <= sequence_length + 1:
        return 0
    combinations = flag_combinations(masking)
    if flags_subset is not None:
        combinations = [combinations[k] for k in rng.choice(len(combinations), flags_subset, replace=False)]
    # The valid split keeps its padded last sample on even trials (drop_last_partial_validation_sequence=False).
    keep_partial = trial % 2 == 0
    compared = 0
    for flags in combinations:
        options = {
            "random_seed": trial,
            "sequence_length": sequence_length,
            "split": "85,15",
            "add_extra_token_to_sequence": add_extra,
            "drop_last_partial_validation_sequence": not keep_partial,
            **flags,
        }
        built = build_megatron(prefix, [num_samples, None, None], options, pad)
        for split_name, theirs, samples in (("train", built[0], num_samples), ("valid", built[1], None)):
            if theirs is None or len(theirs) == 0:
                continue
            ours = training.GPTSamples(
                reader,
                sequence_length,
                seed=trial,
                num_samples=samples,
                split="85,15",
                split_name=split_name,
                drop_last_partial=not (keep_partial and split_name == "valid"),
                add_extra_token=add_extra,
                pad_id=-1 if pad is None else pad,
                fields="megatron",
                eod_id=EOD,
                **flags,
            )
            count = len(ours)
            assert count == len(theirs), f"trial {trial} {split_name}: {count} samples, megatron-core {len(theirs)}"
            picks: list[int | None] = [
                None,
                count - 1,
                *np.unique(rng.integers(0, count, size=min(count, 40))).tolist(),
            ]
            compared += compare(ours, theirs, picks)
    return compared


def main(argv: list[str] | None = None) -> int:
    """Run the comparison against the installed megatron-core; print a summary; 0 when everything is equal."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=6)
    args = parser.parse_args(argv)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import megatron.core

    masking = has_inter_document_masking()
    total = 0
    with tempfile.TemporaryDirectory() as folder:
        for trial in range(args.trials):
            total += run_trial(Path(folder), trial, masking)
    combinations = len(flag_combinations(masking))
    print(
        f"megatron-core {megatron.core.__version__}: {total} samples equal over {args.trials} corpora x "
        f"{combinations} flag combinations (inter_document_masking: {masking})"
    )
    return 0 if total else 1


if __name__ == "__main__":
    sys.exit(main())
