"""PyTorch adapters for tokformats' training datasets (this module imports torch; ``import tokformats`` does not).

>>> from tokformats import torch as tft                                          # doctest: +SKIP
>>> loader = torch.utils.data.DataLoader(tft.Dataset(samples), batch_size=8, num_workers=2, shuffle=False)
>>> stream = tft.IterableDataset(blend, global_batch_size=512, micro_batch_size=4, rank=r, world_size=w)
>>> loader = torch.utils.data.DataLoader(stream, batch_size=None, num_workers=2)   # batches come whole

Samples that are arrays become int64/float tensors (``dtype="stored"``: bare ids in their on-disk dtype, uint16 or
a 4-byte one, widened by the consumer); samples that are dicts of arrays (``GPTSamples(fields=...)``,
``PackedSamples`` rows, Time-MoE windows) become dicts of tensors, which ``default_collate`` stacks key by key.

``collate_fn=tft.collate_by_value`` stacks the same batches and sends each one from its worker by value, through the
worker's result pipe, instead of through a shared-memory file of its own (torch's way for every tensor): for batches
of up to :data:`BY_VALUE_BYTES` that more than halves the DataLoader's CPU per batch.

>>> loader = torch.utils.data.DataLoader(tft.Dataset(samples, dtype="stored"), batch_size=8, num_workers=2,
...                                      collate_fn=tft.collate_by_value)               # doctest: +SKIP
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator, Sequence
from multiprocessing.context import get_spawning_popen
from typing import Any

import numpy as np

try:
    import torch
    import torch.utils.data
except ImportError as error:  # pragma: no cover - exercised only without torch
    raise ImportError(
        "tokformats.torch needs PyTorch; install it (the CPU build: pip install torch --index-url "
        "https://download.pytorch.org/whl/cpu). The rest of tokformats.training works without it."
    ) from error

from .errors import ConfigError
from .training.sampler import BatchSampler
from .training.samples import GPTSamples

__all__ = ["BY_VALUE_BYTES", "Dataset", "IterableDataset", "collate", "collate_by_value", "to_tensor"]


def _tensor(value: Any) -> Any:
    array = np.asarray(value)
    if array.ndim == 0:  # ascontiguousarray would make it 1-d: megatron's max_seqlen is a 0-d tensor
        return torch.from_numpy(array.copy())
    return torch.from_numpy(np.ascontiguousarray(array))


def to_tensor(sample: Any) -> Any:
    """A sample as tensors: an array becomes a tensor, a dict of arrays (``fields=`` samples, packed rows) a dict
    of tensors of the same dtypes and shapes, which ``default_collate`` stacks."""
    if isinstance(sample, dict):
        return {key: _tensor(value) for key, value in sample.items()}
    return _tensor(sample)


def collate(samples: Sequence[Any]) -> Any:
    """Samples stacked into one batch: a ``(B, ...)`` tensor, or a dict of them."""
    if samples and isinstance(samples[0], dict):
        return {key: torch.from_numpy(np.stack([s[key] for s in samples])) for key in samples[0]}
    return torch.from_numpy(np.stack(samples))


#: The largest batch (in bytes, all its tensors) :func:`collate_by_value` sends by value. A tensor leaving a worker
#: otherwise goes through a shared-memory file made for it (created and mapped, its descriptor passed to the main
#: process over a socket, mapped there): measured with 2 workers, that costs 3x the CPU of sending 32 KiB through
#: the pipe, 1.4x at 512 KiB, and less than the pipe's copies at 2 MiB and above (benchmarks/README.md).
BY_VALUE_BYTES = 512 * 1024


def _tensors(arrays: Any) -> Any:
    """The tensors of a batch sent by value (:class:`_ByValue`), over the arrays unpickling made."""
    if isinstance(arrays, dict):
        return {key: torch.from_numpy(value) for key, value in arrays.items()}
    return torch.from_numpy(arrays)


class _ByValue:
    """A worker's batch on its way to the main process: pickled as NumPy arrays (their bytes in the pickle), so that
    it arrives as tensors of its own memory rather than through a shared-memory file per tensor."""

    __slots__ = ("arrays",)

    def __init__(self, arrays: Any) -> None:
        self.arrays = arrays

    def __reduce__(self) -> tuple[Any, ...]:
        return (_tensors, (self.arrays,))


def _stacked(batch: Any) -> Any:
    """A list of samples (arrays or tensors, or dicts of them) stacked as ``default_collate`` stacks them; a whole
    batch (a DataLoader with ``batch_size=None``) as tensors. None when a sample holds anything else (numbers,
    strings, nested lists): ``default_collate`` keeps its own rules for those."""
    if isinstance(batch, (list, tuple)):
        if not batch:
            raise ConfigError("collate_by_value() needs at least one sample.")
        if not _all_arrays(batch[0]):
            return None
        if isinstance(batch[0], dict):
            return {key: torch.stack([torch.as_tensor(sample[key]) for sample in batch]) for key in batch[0]}
        return torch.stack([torch.as_tensor(sample) for sample in batch])
    if not _all_arrays(batch):
        return None
    if isinstance(batch, dict):
        return {key: torch.as_tensor(value) for key, value in batch.items()}
    return torch.as_tensor(batch)


def _all_arrays(sample: Any) -> bool:
    """Whether ``sample`` is a tensor or an array, or a dict of only those."""
    values = sample.values() if isinstance(sample, dict) else [sample]
    return all(isinstance(value, (torch.Tensor, np.ndarray)) for value in values)


def _arrays(batch: Any) -> Any:
    """The NumPy arrays sharing a batch's tensors' memory, or None when it cannot go by value: over
    :data:`BY_VALUE_BYTES`, or a tensor ``Tensor.numpy()`` refuses (on a device, needing grad, bfloat16, ...)."""
    tensors = list(batch.values()) if isinstance(batch, dict) else [batch]
    if sum(tensor.nbytes for tensor in tensors) > BY_VALUE_BYTES:
        return None
    try:
        if isinstance(batch, dict):
            return {key: value.numpy() for key, value in batch.items()}
        return batch.numpy()
    except (TypeError, RuntimeError):  # what numpy() raises for those: torch's shared memory carries them
        return None


def collate_by_value(batch: Any) -> Any:
    """A DataLoader ``collate_fn``: samples stacked as ``default_collate`` stacks tensors (a ``(B, ...)`` tensor,
    or a dict of them, the same values and dtypes), sent from a worker to the main process by value.

    ``default_collate`` stacks a worker's batch into a shared-memory file of its own, which torch then hands to
    the main process as a file descriptor over a socket: for the small batches of token ids a loader ships (8 x
    2,049 uint16 is 32 KiB) that costs more CPU than everything else the DataLoader does per batch. Here a batch of
    up to :data:`BY_VALUE_BYTES` is pickled into the worker's result pipe instead and arrives as tensors of their
    own memory; larger batches (and tensors NumPy cannot hold) go through shared memory as before. In the main
    process (``num_workers=0``) the tensors are returned as they are.

    Takes what :class:`Dataset` and :class:`IterableDataset` serve: a list of samples (tensors or arrays, or dicts
    of them), or, with ``batch_size=None``, one whole batch. Samples holding anything else (a number, a string)
    are collated by ``default_collate`` (``default_convert`` for a whole batch), unchanged.
    """
    stacked = _stacked(batch)
    if stacked is None:  # not the arrays a tokformats dataset serves: torch's own collation, unchanged
        if isinstance(batch, (list, tuple)):
            return torch.utils.data.default_collate(list(batch))
        return torch.utils.data.default_convert(batch)  # type: ignore[no-untyped-call]
    if torch.utils.data.get_worker_info() is None:
        return stacked
    arrays = _arrays(stacked)
    return stacked if arrays is None else _ByValue(arrays)


def _stored_dtype(samples: Sequence[Any], dtype: str | None) -> np.dtype | None:
    """The dtype samples are served in: None (as the sequence serves them) or, for ``"stored"``, its token dtype."""
    if dtype is None:
        return None
    if dtype != "stored":
        raise ConfigError(f"dtype must be None (int64 samples) or 'stored' (the on-disk dtype), not {dtype!r}.")
    stored = getattr(samples, "dtype", None)
    if not callable(getattr(samples, "ids", None)) or stored is None:
        raise ConfigError(
            f"dtype='stored' needs bare-id samples that serve their stored dtype (GPTSamples, or a Blend of them); "
            f"a {type(samples).__name__} does not: leave dtype=None."
        )
    chosen: np.dtype = np.dtype(stored)
    return chosen


def _item(samples: Sequence[Any], index: int, dtype: np.dtype | None) -> Any:
    return samples[index] if dtype is None else samples.ids(index, dtype)  # type: ignore[attr-defined]


def _gathered(samples: Sequence[Any], indices: Sequence[int], dtype: np.dtype | None) -> np.ndarray | None:
    """A batch of bare-id ``GPTSamples`` gathered at once (:meth:`GPTSamples.batch`), or None for other samples."""
    if isinstance(samples, GPTSamples) and samples.sample_fields is None and len(indices):
        batch: np.ndarray = samples.batch(indices, np.int64 if dtype is None else dtype)
        return batch
    return None


class Dataset(torch.utils.data.Dataset[Any]):
    """A map-style torch dataset over any tokformats sample sequence (``GPTSamples``, ``Blend``, windows, ...).

    Picklable into DataLoader workers: readers pickle by path and re-open in the worker.

    Args:
        samples: the sample sequence.
        dtype: None (the default): samples as the sequence serves them (``GPTSamples``: int64 tensors, ready for an
            embedding). ``"stored"``: bare-id samples in the data's on-disk dtype (uint16, or a 4-byte type for a
            larger vocabulary), which workers copy and ship in a quarter (a half) of the bytes; widen on the
            consumer, best after the copy to the device: ``batch.to(device, non_blocking=True).long()``.
    """

    def __init__(self, samples: Sequence[Any], dtype: str | None = None) -> None:
        self.samples = samples
        self.dtype = _stored_dtype(samples, dtype)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> Any:
        return to_tensor(_item(self.samples, index, self.dtype))

    def __getitems__(self, indices: list[int]) -> list[Any]:
        """A DataLoader's batch in one call: bare-id ``GPTSamples`` gather all the batch's parts together."""
        gathered = _gathered(self.samples, indices, self.dtype)
        return [self[i] for i in indices] if gathered is None else list(torch.from_numpy(gathered))


class IterableDataset(torch.utils.data.IterableDataset[Any]):
    """This rank's micro-batches (as :class:`~tokformats.training.BatchSampler` orders them), split across
    DataLoader workers, resumable.

    Worker ``w`` of ``W`` produces micro-batches ``anchor + w, anchor + w + W, ...``, which a DataLoader (with
    ``batch_size=None``) hands out round-robin: the loop sees exactly the sampler's order whatever ``W`` is.
    :meth:`state_dict`/:meth:`load_state_dict` follow torchdata's ``Stateful`` protocol, so a
    ``StatefulDataLoader`` checkpoints and restores each worker; without one, :meth:`state_after` gives the
    state after the loop consumed a number of micro-batches.

    Args:
        samples: the sample sequence (``GPTSamples``, ``Blend``, windows, ...).
        global_batch_size / micro_batch_size / rank / world_size: as :class:`~tokformats.training.BatchSampler`;
        dtype: None or ``"stored"``, as :class:`Dataset`'s;
        **sampler_options: its keyword options (``drop_last``, ``shuffle``, ``seed``).
    """

    def __init__(
        self,
        samples: Sequence[Any],
        global_batch_size: int,
        micro_batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        dtype: str | None = None,
        **sampler_options: Any,
    ) -> None:
        self.samples = samples
        self.dtype = _stored_dtype(samples, dtype)
        self.sampler = BatchSampler(samples, global_batch_size, micro_batch_size, rank, world_size, **sampler_options)
        self._anchor = 0  # the step worker 0 starts at: workers deal steps round-robin from it
        # Set by a DataLoader worker that iterates this dataset: this process then does not know the position, and
        # state_dict() here refuses rather than return the start (shared by inheritance with the workers).
        self._in_workers: Any = multiprocessing.RawValue("b", 0)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        if get_spawning_popen() is None:  # only a worker being started shares the flag; any other pickle drops it
            state["_in_workers"] = None
        return state

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[Any]:
        info = torch.utils.data.get_worker_info()
        workers, worker = (1, 0) if info is None else (info.num_workers, info.id)
        if info is not None and self._in_workers is not None:
            self._in_workers.value = 1
        sampler = self.sampler
        order = sampler.order()
        steps = -(-sampler.end // sampler.step)
        for step in range(sampler.consumed_samples // sampler.step, steps):
            if (step - self._anchor) % workers != worker:
                continue
            batch = sampler.micro_batch(step, order)
            sampler.consumed_samples = (step + 1) * sampler.step
            if batch:
                gathered = _gathered(self.samples, batch, self.dtype)
                if gathered is None:
                    yield collate([_item(self.samples, i, self.dtype) for i in batch])
                else:
                    yield torch.from_numpy(gathered)
        sampler.epoch += 1
        sampler.consumed_samples = 0
        self._anchor = 0

    def state_dict(self) -> dict[str, Any]:
        """The position after the last micro-batch this iterator (or this worker) produced: JSON-able.

        Raises:
            ConfigError: called in the main process after a plain DataLoader iterated this dataset in workers
                (their positions are not visible here); :meth:`state_after` or a ``StatefulDataLoader`` gives it.
        """
        if torch.utils.data.get_worker_info() is None and self._in_workers is not None and self._in_workers.value:
            raise ConfigError(
                "this IterableDataset was iterated by DataLoader workers, whose positions this process does not see, "
                "so its state_dict() would restart the data: take the state with "
                "stream.state_after(MICRO_BATCHES_CONSUMED), or iterate with torchdata's StatefulDataLoader and "
                "save loader.state_dict()."
            )
        return {**self.sampler.state_dict(), "anchor": self._anchor * self.sampler.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``; refuses a state of another dataset or batch layout."""
        self.sampler.load_state_dict(state)
        if self._in_workers is not None:
            self._in_workers.value = 0  # the position is known again
        self._anchor = int(state.get("anchor", state["consumed_samples"])) // self.sampler.step

    def state_after(self, micro_batches: int) -> dict[str, Any]:
        """The state once a loop (over a plain DataLoader) has consumed ``micro_batches`` more of this rank's
        micro-batches than the current state holds."""
        state = self.sampler.state_dict()
        consumed = min(self.sampler.consumed_samples + micro_batches * self.sampler.step, self.sampler.end)
        return {**state, "consumed_samples": consumed, "anchor": consumed}
