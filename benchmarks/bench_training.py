"""Training data layer: tokformats.training against megatron-core 0.16.1's GPTDataset/BlendedDataset, same run.

Run: ``python benchmarks/bench_training.py [--documents 10000000] [--repeat 3]``.

1. Index build for N documents of synthetic lengths (mean 300 tokens, no token file needed): megatron-core's own
   document/sample/shuffle index code (``_build_document_index``, ``helpers.build_sample_idx`` compiled,
   ``_build_shuffle_index``, as ``GPTDataset`` calls them) vs ``GPTSamples`` over the same lengths. Each side runs
   in a fresh process (peak RSS is its own), alternated, ``--repeat`` times.
2. Random sample reads over a real Megatron dataset: ``GPTDataset.__getitem__`` (what a training loop calls) and
   its token part alone (``_query_document_sample_shuffle_indices``) vs ``GPTSamples[i]``.
3. Blending 10 datasets to 10 M samples (``Blend``'s index build).
4. DataLoader throughput with 2 workers, batches of 8 x 2049: ``tokformats.torch.Dataset`` vs ``GPTDataset``;
   and vs litdata's ``StreamingDataLoader`` over the same tokens (``--only litdata``), tokformats as int64 (the
   default) and with ``dtype="stored"`` (uint16 batches), every batch widened to int64 by the loop.
5. Dict samples (``GPTSamples(fields=...)``, sequence 4096, documents ending in EOD) vs ``GPTDataset.__getitem__``
   with the same flags: ``eod_mask_loss`` + ``reset_position_ids`` (+ ``cu_seqlens`` on our side, which 0.16.1
   lacks), then with the ``(1, L, L)`` ``attention_mask`` and ``reset_attention_mask``; and a DataLoader (2 workers,
   batches of 8 x 4097) of dicts.
6. The ``PackedSamples`` plan for 10 M documents of lognormal lengths, rows of 4096: seconds, peak memory and
   padding waste vs OLMo-core's ``InstancePacker`` on the same pieces, each in a fresh process.
7. The blending greedy without megatron-core's compiled helper (NumPy lanes) next to the helper: 10 datasets to
   10 M samples, alternated (``bench_blend.py`` does it in fresh processes).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, peak_rss_mb, scratch, table

HERE = Path(__file__).resolve()
SEQUENCE = 2048
#: Sequence length of the dict-sample and packing rows (the issue's figures).
LONG = 4096
PACKED = 4096


class LengthsOnly:
    """A stand-in reader for the index build: only the unit lengths exist (as a memory-mapped .npy)."""

    format = "megatron"
    dtype = np.dtype("<u2")
    metadata: dict[str, Any] = {}  # noqa: RUF012

    def __init__(self, lengths: np.ndarray) -> None:
        self.lengths = lengths

    def sample_units(self) -> tuple[np.ndarray, np.ndarray]:
        return self.lengths, np.zeros(0, dtype=np.int64)  # offsets are not needed to build indices


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmRSS:"))


def pack_task(side: str, lengths_path: Path) -> dict[str, Any]:
    """One packing plan of rows of ``PACKED`` tokens in this (fresh) process: ours (fragmenting included) or
    OLMo-core's ``InstancePacker`` over the same pieces (fragmented beforehand, untimed)."""
    from tokformats.training.packed import pack_plan, plan_pieces

    lengths = np.load(lengths_path)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if side == "olmo":
        from olmo_core.data.utils import InstancePacker

        starts, pieces, _ = plan_pieces(lengths, offsets, PACKED, "fragment")
        bounds = np.stack([starts, starts + pieces], axis=1).astype(np.uint64)
        del starts
        baseline = rss_mb()
        started = time.perf_counter()
        bins, _, _ = InstancePacker(PACKED).pack_documents(bounds)
        elapsed = time.perf_counter() - started
        rows, tokens = len(bins), int(pieces.sum())
    else:
        baseline = rss_mb()
        started = time.perf_counter()
        plan = pack_plan(lengths, offsets, PACKED, "fragment", None, 0)
        elapsed = time.perf_counter() - started
        rows, tokens = len(plan["row_offsets"]) - 1, int(plan["piece_lengths"].sum(dtype=np.int64))
    waste = 100.0 * (rows * PACKED - tokens) / (rows * PACKED)
    return {"seconds": elapsed, "rss_mb": peak_rss_mb() - baseline, "digest": rows, "waste": waste}


def index_task(side: str, lengths_path: Path) -> dict[str, Any]:
    """One index build in this (fresh) process; memory is the peak above what the imports already hold."""
    warnings.filterwarnings("ignore")
    lengths = np.load(lengths_path, mmap_mode="r")
    if side == "megatron":
        from megatron.core.datasets import helpers
        from megatron.core.datasets.gpt_dataset import _build_document_index, _build_shuffle_index

        baseline = rss_mb()
        started = time.perf_counter()
        units = np.arange(0, len(lengths), dtype=np.int32)
        tokens = int(np.sum(lengths[units]))
        state = np.random.RandomState(1234)
        document_index = _build_document_index(units, 1, state, False)
        sizes = lengths.copy() if len(document_index) * 2 > len(lengths) else lengths  # as GPTDataset does
        sample_index = helpers.build_sample_idx(sizes, document_index, SEQUENCE, 1, tokens, True, True)
        shuffle_index = _build_shuffle_index(len(sample_index) - 1, len(sample_index) - 1, state)
        elapsed = time.perf_counter() - started
        digest = int(shuffle_index[:1000].sum()) + int(sample_index[-1].sum())
    else:
        from tokformats.training import GPTSamples

        baseline = rss_mb()
        started = time.perf_counter()
        samples = GPTSamples(LengthsOnly(lengths), SEQUENCE, seed=1234)  # type: ignore[arg-type]
        elapsed = time.perf_counter() - started
        digest = int(samples.shuffle_index[:1000].sum()) + int(samples.sample_index[-1].sum())
    return {"seconds": elapsed, "rss_mb": peak_rss_mb() - baseline, "digest": digest}


def run_child(*args: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, str(HERE), "--child", *args], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def spread(values: list[float], fmt: str = "{:.2f}") -> str:
    return "/".join(fmt.format(v) for v in (min(values), statistics.median(values), max(values)))


def bench_index(documents: int, repeat: int) -> list[dict[str, Any]]:
    folder = scratch("training")
    lengths_path = folder / f"lengths-{documents}.npy"
    if not lengths_path.exists():
        rng = np.random.default_rng(0)
        np.save(lengths_path, np.minimum(rng.geometric(1 / 300, size=documents), 60000).astype(np.int32))
    times: dict[str, list[float]] = {"megatron": [], "ours": []}
    rss: dict[str, list[float]] = {"megatron": [], "ours": []}
    digests = set()
    for _ in range(repeat):
        for side in ("megatron", "ours"):
            result = run_child("index", side, str(lengths_path))
            times[side].append(result["seconds"])
            rss[side].append(result["rss_mb"])
            digests.add(result["digest"])
    assert len(digests) == 1, "the two index builds differ"
    tokens = int(np.load(lengths_path, mmap_mode="r").sum(dtype=np.int64))
    ratios = [m / o for m, o in zip(times["megatron"], times["ours"])]
    return [
        {
            "measure": f"index build, {documents:,} docs / {tokens / 1e9:.2f} G tokens, seq {SEQUENCE} (s)",
            "megatron-core": spread(times["megatron"], "{:.3f}"),
            "tokformats": spread(times["ours"], "{:.3f}"),
            "tokformats advantage (x)": spread(ratios),
        },
        {
            "measure": "index build peak memory above the imports (MB, min/med/max)",
            "megatron-core": spread(rss["megatron"], "{:.0f}"),
            "tokformats": spread(rss["ours"], "{:.0f}"),
            "tokformats advantage (x)": spread([m / o for m, o in zip(rss["megatron"], rss["ours"])]),
        },
    ]


def megatron_gpt(prefix: Path, sequence_length: int, attention_mask: bool = True) -> Any:
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    class Tokenizer:
        eod, vocab_size = 0, None
        unique_identifiers = {"class": "bench"}  # noqa: RUF012

    config = GPTDatasetConfig(
        random_seed=1234,
        sequence_length=sequence_length,
        blend=([str(prefix)], None),
        split="1",
        tokenizer=Tokenizer(),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        path_to_cache=None,
        create_attention_mask=attention_mask,
    )
    return BlendedMegatronDatasetBuilder(GPTDataset, [None, None, None], lambda: True, config).build()[0]


def make_dataset(documents: int) -> Path:
    import tokformats

    prefix = scratch("training") / f"reads-{documents}"
    if not Path(f"{prefix}.idx").exists():
        rng = np.random.default_rng(1)
        lengths = rng.geometric(1 / 300, size=documents)
        with tokformats.create(prefix, format="megatron", vocab_size=50257) as writer:
            writer.write_batch(rng.integers(0, 50257, size=int(lengths.sum()), dtype=np.int64), lengths)
    return prefix


def bench_reads(documents: int, repeat: int, reads: int = 20_000) -> list[dict[str, Any]]:
    import tokformats
    from tokformats.training import GPTSamples

    prefix = make_dataset(documents)
    theirs = megatron_gpt(prefix, SEQUENCE)
    ours = GPTSamples(tokformats.open(prefix), SEQUENCE, seed=1234)
    assert np.array_equal(ours.shuffle_index, theirs.shuffle_index)
    picks = np.random.default_rng(2).integers(0, len(ours), size=reads).tolist()
    for i in picks[:50]:
        assert np.array_equal(ours[i], theirs._query_document_sample_shuffle_indices(i)[0])
    sides = {
        "GPTDataset.__getitem__": lambda: [theirs[i] for i in picks],
        "tokens part only": lambda: [theirs._query_document_sample_shuffle_indices(i) for i in picks],
        "ours": lambda: [ours[i] for i in picks],
    }
    times: dict[str, list[float]] = {k: [] for k in sides}
    for _ in range(repeat):
        for name, read in sides.items():
            started = time.perf_counter()
            read()
            times[name].append(reads / (time.perf_counter() - started))
    rows = []
    for name in ("GPTDataset.__getitem__", "tokens part only"):
        rows.append(
            {
                "measure": f"random sample reads/s vs {name} ({documents:,} docs, seq {SEQUENCE}, min/med/max)",
                "megatron-core": spread(times[name], "{:,.0f}"),
                "tokformats": spread(times["ours"], "{:,.0f}"),
                "tokformats advantage (x)": spread([o / m for o, m in zip(times["ours"], times[name])]),
            }
        )
    return rows


def bench_blend(repeat: int, datasets: int = 10, size: int = 10_000_000) -> list[dict[str, Any]]:
    from megatron.core.datasets import helpers

    from tokformats.training import Blend

    class Counted:
        def __init__(self, n: int) -> None:
            self.n = n

        def __len__(self) -> int:
            return self.n

    weights = np.random.default_rng(3).uniform(0.5, 2.0, size=datasets)
    normalized = (weights / weights.sum()).tolist()
    parts = [Counted(size) for _ in range(datasets)]
    ours_t, theirs_t = [], []
    for _ in range(repeat):
        started = time.perf_counter()
        index = np.zeros(size, np.int16)
        sample = np.zeros(size, np.int64)
        helpers.build_blending_indices(index, sample, normalized, datasets, size, False)
        np.unique(index, return_counts=True)  # BlendedDataset's oversampling check
        theirs_t.append(time.perf_counter() - started)
        started = time.perf_counter()
        blend = Blend(parts, weights.tolist(), size)
        ours_t.append(time.perf_counter() - started)
        assert np.array_equal(blend.dataset_index, index)
    return [
        {
            "measure": f"blend {datasets} datasets to {size:,} samples (s, min/med/max)",
            "megatron-core": spread(theirs_t),
            "tokformats": spread(ours_t),
            "tokformats advantage (x)": spread([t / o for t, o in zip(theirs_t, ours_t)]),
        }
    ]


def bench_loader(documents: int, repeat: int, batches: int = 300) -> list[dict[str, Any]]:
    import torch

    import tokformats
    from tokformats import torch as tft
    from tokformats.training import GPTSamples

    prefix = make_dataset(documents)
    theirs = megatron_gpt(prefix, SEQUENCE, attention_mask=False)  # its cheaper setting: no (1, S, S) mask
    ours = tft.Dataset(GPTSamples(tokformats.open(prefix), SEQUENCE, seed=1234))
    rates: dict[str, list[float]] = {"megatron": [], "ours": []}
    for _ in range(repeat):
        for name, dataset in (("megatron", theirs), ("ours", ours)):
            loader = torch.utils.data.DataLoader(dataset, batch_size=8, num_workers=2, shuffle=False)
            started = time.perf_counter()
            for k, _batch in enumerate(loader):
                if k + 1 == batches:
                    break
            rates[name].append(batches * 8 / (time.perf_counter() - started))
    return [
        {
            "measure": f"DataLoader, 2 workers, batches of 8 x {SEQUENCE + 1}, no attention mask (samples/s)",
            "megatron-core": spread(rates["megatron"], "{:,.0f}"),
            "tokformats": spread(rates["ours"], "{:,.0f}"),
            "tokformats advantage (x)": spread([o / m for o, m in zip(rates["ours"], rates["megatron"])]),
        }
    ]


def make_litdata(prefix: Path) -> Path:
    """The Megatron dataset's tokens as a litdata ``TokensLoader`` folder (uint16 chunks, as LitGPT prepares)."""
    import tokformats

    folder = Path(f"{prefix}-litdata")
    if not (folder / "index.json").exists():
        tokformats.convert(prefix, folder, "litdata", keep_boundaries=False)
    return folder


class _WorkerClock:
    """The CPU seconds each DataLoader worker spends from its ``worker_init_fn`` to its exit, in shared memory (a
    worker's ``process_time`` counts its queue feeder thread too: what the worker costs the machine)."""

    def __init__(self, workers: int) -> None:
        import multiprocessing

        self.seconds = multiprocessing.Array("d", workers, lock=False)

    def __call__(self, worker: int) -> None:
        import multiprocessing.util

        started = time.process_time()
        seconds = self.seconds

        def record() -> None:
            seconds[worker] = time.process_time() - started

        multiprocessing.util.Finalize(None, record, exitpriority=100)

    def total(self, timeout: float = 2.0) -> float:
        """The workers' CPU seconds, once every worker has exited and recorded them (0 for one that did not)."""
        waited = 0.0
        while not all(self.seconds) and waited < timeout:
            time.sleep(0.02)
            waited += 0.02
        return float(sum(self.seconds))


def _no_read_dataset(length: int) -> Any:
    """A map-style dataset serving the same rows (2,049 uint16) without reading anything: the DataLoader's own cost
    per batch (index queue, collate into shared memory, result queue)."""
    import torch

    class NoRead(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __init__(self) -> None:
            self.row = torch.zeros(SEQUENCE + 1, dtype=torch.uint16)

        def __len__(self) -> int:
            return length

        def __getitem__(self, index: int) -> Any:
            return self.row

        def __getitems__(self, indices: list[int]) -> list[Any]:
            return [self.row] * len(indices)

    return NoRead()


def bench_loader_litdata(documents: int, repeat: int, batches: int = 1000) -> list[dict[str, Any]]:
    """DataLoader, 2 workers, batches of 8 x 2049 token ids, each batch widened to int64 by the consumer (what an
    embedding needs): litdata's ``StreamingDataLoader`` over ``TokensLoader`` blocks (uint16, in order) vs
    ``tft.Dataset(GPTSamples)`` as int64 (the default), with ``dtype="stored"`` (uint16, widened after), the same
    with ``collate_fn=tft.collate_by_value`` (batches sent through the workers' pipes; skipped for a checkout
    without it, to compare against an older one), and a dataset that reads nothing (the DataLoader's own cost).
    Samples/s (wall, worker start-up included) and the CPU of the main process plus both workers per batch, which a
    loaded machine disturbs less than the wall clock."""
    import torch
    from litdata import StreamingDataLoader, StreamingDataset, TokensLoader

    import tokformats
    from tokformats import torch as tft
    from tokformats.training import GPTSamples

    prefix = make_dataset(documents)
    folder = make_litdata(prefix)
    samples = GPTSamples(tokformats.open(prefix), SEQUENCE, seed=1234)
    sides = {
        "litdata": lambda clock: StreamingDataLoader(
            StreamingDataset(str(folder), item_loader=TokensLoader(block_size=SEQUENCE + 1), shuffle=False),
            batch_size=8,
            num_workers=2,
            worker_init_fn=clock,
        ),
        "int64": lambda clock: torch.utils.data.DataLoader(
            tft.Dataset(samples), batch_size=8, num_workers=2, worker_init_fn=clock
        ),
        "stored": lambda clock: torch.utils.data.DataLoader(
            tft.Dataset(samples, dtype="stored"), batch_size=8, num_workers=2, worker_init_fn=clock
        ),
        "by value": lambda clock: torch.utils.data.DataLoader(
            tft.Dataset(samples, dtype="stored"),
            batch_size=8,
            num_workers=2,
            worker_init_fn=clock,
            collate_fn=tft.collate_by_value,
        ),
        "litdata by value": lambda clock: StreamingDataLoader(
            StreamingDataset(str(folder), item_loader=TokensLoader(block_size=SEQUENCE + 1), shuffle=False),
            batch_size=8,
            num_workers=2,
            worker_init_fn=clock,
            collate_fn=tft.collate_by_value,
        ),
        "no read": lambda clock: torch.utils.data.DataLoader(
            _no_read_dataset(len(samples)), batch_size=8, num_workers=2, worker_init_fn=clock
        ),
    }
    if not hasattr(tft, "collate_by_value"):
        del sides["by value"], sides["litdata by value"]
    dtypes: dict[str, Any] = {}
    rates: dict[str, list[float]] = {name: [] for name in sides}
    cpu: dict[str, list[float]] = {name: [] for name in sides}  # microseconds per batch, main + workers
    for round_ in range(repeat):
        for name, make in sides.items() if round_ % 2 == 0 else reversed(list(sides.items())):
            clock = _WorkerClock(2)
            started, main = time.perf_counter(), time.process_time()  # worker start-up included, as training pays it
            loader = make(clock)
            for k, batch in enumerate(loader):
                assert type(batch) is torch.Tensor, type(batch)
                dtypes[name] = batch.dtype
                wide = batch.long()
                assert wide.shape == (8, SEQUENCE + 1)
                if k + 1 == batches:
                    break
            rates[name].append(batches * 8 / (time.perf_counter() - started))
            main = time.process_time() - main
            del loader  # the workers exit and record their CPU
            cpu[name].append((main + clock.total()) / batches * 1e6)
    label = {
        "int64": "tokformats default",
        "stored": "tokformats dtype=stored",
        "by value": "tokformats dtype=stored, collate_fn=tft.collate_by_value",
        "no read": "a dataset reading nothing",
    }
    pairs = [(name, "litdata") for name in label if name in sides]
    if "by value" in sides:  # the same transport on both sides: what is left is the reading
        pairs.append(("by value", "litdata by value"))
        label["litdata by value"] = "litdata with collate_fn=tft.collate_by_value"
    return [
        {
            "measure": f"DataLoader, 2 workers, 8 x {SEQUENCE + 1}, widened to int64 by the loop, {label[name]} "
            f"({dtypes[name]}) vs {label.get(peer, peer)} ({dtypes[peer]}) (samples/s; CPU us per batch)",
            "litdata": f"{spread(rates[peer], '{:,.0f}')}; CPU {spread(cpu[peer], '{:,.0f}')}",
            "tokformats": f"{spread(rates[name], '{:,.0f}')}; CPU {spread(cpu[name], '{:,.0f}')}",
            "tokformats advantage (x)": spread([o / t for o, t in zip(rates[name], rates[peer])]),
            "CPU advantage (x)": spread([t / o for o, t in zip(cpu[name], cpu[peer])]),
        }
        for name, peer in pairs
    ]


def make_eod_dataset(documents: int) -> Path:
    """A Megatron dataset whose documents end in EOD (id 0), as Megatron's preprocessing writes them."""
    import tokformats

    prefix = scratch("training") / f"eod-{documents}"
    if not Path(f"{prefix}.idx").exists():
        rng = np.random.default_rng(4)
        lengths = rng.geometric(1 / 300, size=documents)
        ids = rng.integers(1, 50257, size=int(lengths.sum()), dtype=np.int64)
        ids[np.cumsum(lengths) - 1] = 0
        with tokformats.create(prefix, format="megatron", vocab_size=50257) as writer:
            writer.write_batch(ids, lengths)
    return prefix


def megatron_flags(prefix: Path, sequence_length: int, **flags: bool) -> Any:
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    class Tokenizer:
        eod, vocab_size = 0, None
        unique_identifiers = {"class": "bench"}  # noqa: RUF012

    config = GPTDatasetConfig(
        random_seed=1234,
        sequence_length=sequence_length,
        blend=([str(prefix)], None),
        split="1",
        tokenizer=Tokenizer(),
        path_to_cache=None,
        **flags,
    )
    return BlendedMegatronDatasetBuilder(GPTDataset, [None, None, None], lambda: True, config).build()[0]


DICT_CASES = {
    "eod_mask_loss + reset_position_ids (+ cu_seqlens ours)": (
        {"eod_mask_loss": True, "reset_position_ids": True, "reset_attention_mask": False},
        {"create_attention_mask": False},
        {"fields": ("tokens", "labels", "loss_mask", "position_ids", "cu_seqlens")},
    ),
    "attention_mask + reset_attention_mask + eod_mask_loss + reset_position_ids": (
        {"eod_mask_loss": True, "reset_position_ids": True, "reset_attention_mask": True},
        {"create_attention_mask": True},
        {"fields": "megatron", "create_attention_mask": True},
    ),
}


def dict_pair(prefix: Path, case: str) -> tuple[Any, Any]:
    """megatron-core's GPTDataset and GPTSamples with the flags of ``case``."""
    import tokformats
    from tokformats.training import GPTSamples

    flags, theirs_only, ours_only = DICT_CASES[case]
    theirs = megatron_flags(prefix, LONG, **flags, **theirs_only)
    ours = GPTSamples(tokformats.open(prefix), LONG, seed=1234, eod_id=0, **flags, **ours_only)
    return theirs, ours


def bench_dicts(documents: int, repeat: int, reads: int = 2_000) -> list[dict[str, Any]]:
    prefix = make_eod_dataset(documents)
    rows = []
    for case in DICT_CASES:
        theirs, ours = dict_pair(prefix, case)
        count = reads if "attention_mask" not in case else max(20, reads // 10)  # (1, L, L) masks: 16 MB each
        picks = np.random.default_rng(5).integers(0, len(ours), size=count).tolist()
        for i in picks[:20]:  # the same sample, the fields both sides have
            mine, megatrons = ours[i], theirs[i]
            for key in megatrons:
                assert np.array_equal(mine[key], megatrons[key].numpy()), key
        times: dict[str, list[float]] = {"megatron": [], "ours": []}
        for _ in range(repeat):
            for name, dataset in (("megatron", theirs), ("ours", ours)):
                started = time.perf_counter()
                for i in picks:
                    dataset[i]
                times[name].append(count / (time.perf_counter() - started))
        rows.append(
            {
                "measure": f"dict samples/s, seq {LONG}, {case} (min/med/max)",
                "megatron-core": spread(times["megatron"], "{:,.0f}"),
                "tokformats": spread(times["ours"], "{:,.0f}"),
                "tokformats advantage (x)": spread([o / m for o, m in zip(times["ours"], times["megatron"])]),
            }
        )
    return rows


def bench_dict_loader(documents: int, repeat: int, batches: int = 100) -> list[dict[str, Any]]:
    import torch

    from tokformats import torch as tft

    prefix = make_eod_dataset(documents)
    theirs, ours = dict_pair(prefix, next(iter(DICT_CASES)))
    rates: dict[str, list[float]] = {"megatron": [], "ours": []}
    for _ in range(repeat):
        for name, dataset in (("megatron", theirs), ("ours", tft.Dataset(ours))):
            loader = torch.utils.data.DataLoader(dataset, batch_size=8, num_workers=2, shuffle=False)
            started = time.perf_counter()
            for k, _batch in enumerate(loader):
                if k + 1 == batches:
                    break
            rates[name].append(batches * 8 / (time.perf_counter() - started))
    return [
        {
            "measure": f"DataLoader, 2 workers, dicts of 8 x {LONG + 1}, eod_mask_loss, reset_position_ids (samples/s)",
            "megatron-core": spread(rates["megatron"], "{:,.0f}"),
            "tokformats": spread(rates["ours"], "{:,.0f}"),
            "tokformats advantage (x)": spread([o / m for o, m in zip(rates["ours"], rates["megatron"])]),
        }
    ]


def bench_pack(documents: int, repeat: int) -> list[dict[str, Any]]:
    folder = scratch("training")
    lengths_path = folder / f"lognormal-{documents}.npy"
    if not lengths_path.exists():
        rng = np.random.default_rng(6)
        np.save(lengths_path, np.maximum(1, rng.lognormal(6.0, 1.2, size=documents)).astype(np.int64))
    result: dict[str, dict[str, list[float]]] = {
        s: {"seconds": [], "rss_mb": [], "waste": []} for s in ("olmo", "ours")
    }
    digests = set()
    for _ in range(repeat):
        for side in ("olmo", "ours"):
            got = run_child("pack", side, str(lengths_path))
            for key in ("seconds", "rss_mb", "waste"):
                result[side][key].append(got[key])
            digests.add(got["digest"])
    assert len(digests) == 1, f"the two packers made different numbers of rows: {digests}"
    olmo, ours = result["olmo"], result["ours"]
    return [
        {
            "measure": f"packing plan, {documents:,} lognormal docs, rows of {PACKED}, BFD (s, min/med/max)",
            "megatron-core": f"OLMo-core InstancePacker {spread(olmo['seconds'])}",
            "tokformats": spread(ours["seconds"]),
            "tokformats advantage (x)": spread([t / o for t, o in zip(olmo["seconds"], ours["seconds"])]),
        },
        {
            "measure": "packing plan peak memory above the input (MB, min/med/max)",
            "megatron-core": f"OLMo-core {spread(olmo['rss_mb'], '{:.0f}')}",
            "tokformats": spread(ours["rss_mb"], "{:.0f}"),
            "tokformats advantage (x)": spread([t / o for t, o in zip(olmo["rss_mb"], ours["rss_mb"])]),
        },
        {
            "measure": f"packing padding waste (% of the rows; {digests.pop():,} rows on both sides)",
            "megatron-core": f"OLMo-core {olmo['waste'][0]:.4f}",
            "tokformats": f"{ours['waste'][0]:.4f}",
            "tokformats advantage (x)": "same rows",
        },
    ]


def bench_blend_python(repeat: int, datasets: int = 10, size: int = 10_000_000) -> list[dict[str, Any]]:
    """The blend without megatron-core's compiled helper (the NumPy lanes of ``training/greedy.py``) next to the
    helper, alternated in this process (``benchmarks/bench_blend.py`` runs each side in a fresh process)."""
    from megatron.core.datasets import helpers_cpp

    from tokformats.training import greedy

    weights = np.random.default_rng(3).uniform(0.5, 2.0, size=datasets)
    normalized = weights / weights.sum()
    times: dict[str, list[float]] = {"cpp": [], "ours": []}
    for _ in range(repeat):
        started = time.perf_counter()
        expected = np.zeros(size, np.int16), np.zeros(size, np.int64)
        helpers_cpp.build_blending_indices(*expected, normalized, datasets, size, False)
        times["cpp"].append(time.perf_counter() - started)
        started = time.perf_counter()
        index, sample = np.zeros(size, np.int16), np.zeros(size, np.int64)
        greedy.lockstep_greedy(normalized, size, index, sample)
        times["ours"].append(time.perf_counter() - started)
        assert np.array_equal(index, expected[0]) and np.array_equal(sample, expected[1])
    return [
        {
            "measure": f"blend {datasets} datasets to {size:,} samples without megatron-core's helper (s)",
            "megatron-core": f"C++ helper {spread(times['cpp'])}",
            "tokformats": spread(times["ours"]),
            "tokformats advantage (x)": spread([c / o for c, o in zip(times["cpp"], times["ours"])]),
        }
    ]


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        task = pack_task if sys.argv[2] == "pack" else index_task
        print(json.dumps(task(sys.argv[3], Path(sys.argv[4]))))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=10_000_000, help="documents for the index build")
    parser.add_argument("--read-documents", type=int, default=200_000, help="documents of the dataset read back")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--pack-documents", type=int, default=10_000_000, help="documents for the packing plan")
    parser.add_argument(
        "--only",
        choices=["index", "reads", "blend", "loader", "litdata", "dicts", "dict-loader", "pack", "blend-python"],
        help="run one measurement",
    )
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    benches = {
        "index": lambda: bench_index(args.documents, args.repeat),
        "reads": lambda: bench_reads(args.read_documents, args.repeat),
        "blend": lambda: bench_blend(args.repeat),
        "loader": lambda: bench_loader(args.read_documents, args.repeat),
        "litdata": lambda: bench_loader_litdata(args.read_documents, args.repeat),
        "dicts": lambda: bench_dicts(args.read_documents, args.repeat),
        "dict-loader": lambda: bench_dict_loader(args.read_documents, args.repeat),
        "pack": lambda: bench_pack(args.pack_documents, args.repeat),
        "blend-python": lambda: bench_blend_python(args.repeat),
    }
    print(f"machine: {machine()}")
    for name, bench in benches.items():
        if args.only in (None, name):
            print(table(bench()))  # one table per measure: their peers differ


if __name__ == "__main__":
    main()
