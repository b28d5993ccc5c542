"""Fixed-length training samples over any token reader, exactly as megatron-core's ``GPTDataset`` cuts them."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from typing import Any, overload

import numpy as np

from ..core.protocol import TokenReader, checked_position
from ..errors import ConfigError, FormatError
from . import indices
from .index_cache import IndexCache, cache_key

__all__ = ["GPTSamples"]

#: Bumped whenever the arrays built for the same options change, so that old cache entries are not reused.
_INDEX_VERSION = 1
_NAMES = ("document_index", "sample_index", "shuffle_index")


def data_fingerprint(reader: TokenReader, lengths: np.ndarray) -> str:
    """What the indices depend on in the data: the unit lengths (hashed), their count and the token dtype."""
    digest = hashlib.sha256(np.ascontiguousarray(lengths).data).hexdigest()  # as stored: no int64 copy
    return f"{reader.format}:{reader.dtype.name}:{len(lengths)}:{lengths.dtype.str}:{digest[:32]}"


class GPTSamples(Sequence[np.ndarray]):
    """Fixed-length samples over a token reader, equal to megatron-core 0.16.1's ``GPTDataset``.

    The reader's units (Megatron: its sequences, as ``GPTDataset`` uses them; every other format: documents) of
    the chosen split are repeated for as many epochs as ``num_samples`` needs, shuffled, laid end to end and cut
    into samples of ``sequence_length + add_extra_token`` ids that overlap by the extra token, and the samples are
    shuffled: :attr:`document_index`, :attr:`sample_index` and :attr:`shuffle_index` equal megatron-core's in
    dtype and value for the same options (``BlendedMegatronDatasetBuilder`` with ``random_seed=seed``,
    ``split``, ``sequence_length``, ``add_extra_token_to_sequence``).

    Args:
        reader: any token reader (``tokformats.open(...)``).
        sequence_length: tokens per sample (a sample holds one more when ``add_extra_token``).
        seed: seed of NumPy's legacy ``RandomState``, as Megatron's ``random_seed``.
        num_samples: samples wanted (more epochs are added until they fit); None for exactly one epoch.
            ``len()`` can exceed it, as Megatron's does: whole epochs are built.
        split: train/valid/test weights, ``"969,30,1"`` (Megatron's string) or a sequence of numbers.
        split_name: ``"train"``, ``"valid"`` or ``"test"``.
        add_extra_token: each sample holds ``sequence_length + 1`` ids so that ``x[:-1]``/``x[1:]`` are
            inputs/labels (Megatron's ``add_extra_token_to_sequence``).
        drop_last_partial: drop a last sample shorter than the others; when False it is kept and padded with
            ``pad_id``. Megatron applies its ``drop_last_partial_validation_sequence`` to the valid split only
            (train and test always drop): pass False only for that split to match it.
        pad_id: the id that pads a kept partial sample (Megatron: the tokenizer's pad, else -1).
        cache_dir: keep the three index arrays there as ``.npy`` (built once across processes, memory-mapped
            after), under a key that covers every option above and the data's unit lengths.
        vocab_size: the vocabulary the ids come from; blends refuse to mix different ones.
    """

    def __init__(
        self,
        reader: TokenReader,
        sequence_length: int,
        *,
        seed: int = 1234,
        num_samples: int | None = None,
        split: str | Sequence[float] = "1",
        split_name: str = "train",
        add_extra_token: bool = True,
        drop_last_partial: bool = True,
        pad_id: int = -1,
        cache_dir: str | os.PathLike[str] | None = None,
        vocab_size: int | None = None,
    ) -> None:
        if not isinstance(sequence_length, (int, np.integer)) or sequence_length <= 0:
            raise ConfigError(f"sequence_length must be a positive integer, not {sequence_length!r}.")
        if num_samples is not None and num_samples < 0:
            raise ConfigError(f"num_samples must be None or >= 0, not {num_samples}.")
        self.reader = reader
        self.sequence_length = int(sequence_length)
        self.seed = int(seed)
        self.num_samples = num_samples
        self.split = split if isinstance(split, str) else [float(x) for x in split]
        self.split_name = indices.SPLIT_NAMES[indices.split_index(split_name)]
        self.add_extra_token = bool(add_extra_token)
        self.drop_last_partial = bool(drop_last_partial)
        self.pad_id = int(pad_id)
        self.cache_dir = None if cache_dir is None else os.fspath(cache_dir)
        self.vocab_size = vocab_size if vocab_size is not None else reader.metadata.get("vocab_size")
        self._lengths, self._offsets = reader.sample_units()
        begin, end = indices.split_range(self.split, self.split_name, len(self._lengths))
        self.units = (begin, end)
        extra = int(self.add_extra_token)
        #: Tokens in one pass over the split.
        self.tokens_per_epoch = int(self._lengths[begin:end].sum(dtype=np.int64))
        #: Passes over the split the samples need (refuses a split without tokens when samples are asked for).
        self.epochs = indices.num_epochs(self.tokens_per_epoch, num_samples, self.sequence_length, extra)
        self.description = {
            "class": "GPTSamples",
            "version": _INDEX_VERSION,
            "data": data_fingerprint(reader, self._lengths),
            "units": [begin, end],
            "sequence_length": self.sequence_length,
            "seed": self.seed,
            "num_samples": num_samples,
            "split": self.split,
            "split_name": self.split_name,
            "add_extra_token": self.add_extra_token,
            "drop_last_partial": self.drop_last_partial,
        }
        #: A digest of every option and of the data's unit lengths: equal fingerprints, equal samples.
        self.fingerprint = cache_key(self.description)
        self._load_indices()

    # -- building ----------------------------------------------------------------------------------
    def _build(self) -> dict[str, np.ndarray]:
        begin, end = self.units
        units = np.arange(begin, end, dtype=np.int32 if end <= np.iinfo(np.int32).max else np.int64)
        extra = int(self.add_extra_token)
        tokens_per_epoch, epochs = self.tokens_per_epoch, self.epochs
        separate, before = indices.separate_final_epoch(
            epochs, tokens_per_epoch, self.num_samples, self.sequence_length, extra
        )
        random_state = np.random.RandomState(self.seed)
        document_index = indices.document_index(units, epochs, random_state, separate)
        sample_index = indices.sample_index(
            self._lengths,
            document_index,
            self.sequence_length,
            epochs,
            tokens_per_epoch,
            self.drop_last_partial,
            extra,
        )
        total = len(sample_index) - 1
        shuffle_index = indices.shuffle_index(before if separate else total, total, random_state)
        return {"document_index": document_index, "sample_index": sample_index, "shuffle_index": shuffle_index}

    def _load_indices(self) -> None:
        if self.cache_dir is None:
            arrays = self._build()
        else:
            arrays = IndexCache(self.cache_dir).get_or_build(self.fingerprint, self.description, _NAMES, self._build)
            self._check(arrays)
        #: Units (Megatron sequences or documents) in the order samples walk them, int32.
        self.document_index: np.ndarray = arrays["document_index"]
        #: ``(samples + 1, 2)`` rows ``(position in document_index, offset)`` where each sample starts.
        self.sample_index: np.ndarray = arrays["sample_index"]
        #: The order samples are served in: ``self[i]`` is unshuffled sample ``shuffle_index[i]``.
        self.shuffle_index: np.ndarray = arrays["shuffle_index"]

    def _check(self, arrays: dict[str, np.ndarray]) -> None:
        """A cached entry is trusted only as far as O(samples) checks go: shapes, dtypes and ranges."""
        doc, sample, shuffle = (arrays[name] for name in _NAMES)
        problems = []
        units = len(self._lengths)
        if doc.ndim != 1 or doc.dtype.kind != "i" or (len(doc) and not 0 <= doc.min() <= doc.max() < units):
            problems.append("document_index holds units outside the data")
        if sample.ndim != 2 or sample.shape[1:] != (2,) or sample.dtype.kind != "i":
            problems.append(f"sample_index has shape {sample.shape} and dtype {sample.dtype}")
        elif len(sample) > 1 and not 0 <= sample[:, 0].min() <= sample[:, 0].max() < max(len(doc), 1):
            problems.append("sample_index points outside document_index")
        if shuffle.ndim != 1 or len(shuffle) != len(sample) - 1:
            problems.append(f"shuffle_index has {len(shuffle)} entries for {len(sample) - 1} samples")
        elif len(shuffle) and not 0 <= shuffle.min() <= shuffle.max() < len(shuffle):
            problems.append("shuffle_index holds samples that do not exist")
        if problems:
            raise FormatError(
                f"{self.cache_dir}: the cached indices {self.fingerprint}-* do not fit the data ("
                + "; ".join(problems)
                + "); delete them to rebuild."
            )

    # -- the samples ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.shuffle_index)

    @overload
    def __getitem__(self, index: int) -> np.ndarray: ...
    @overload
    def __getitem__(self, index: slice) -> list[np.ndarray]: ...
    def __getitem__(self, index: Any) -> Any:
        """Sample ``index`` (after shuffling): ``sequence_length + add_extra_token`` ids as int64."""
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return self.unshuffled(int(self.shuffle_index[checked_position(index, len(self), "sample", "samples")]))

    def unshuffled(self, j: int) -> np.ndarray:
        """Sample ``j`` in the order the units are laid out (before :attr:`shuffle_index`)."""
        size = self.sequence_length + self.add_extra_token
        extra = int(self.add_extra_token)
        rows = self.sample_index
        first, first_offset = int(rows[j, 0]), int(rows[j, 1])
        last, last_offset = int(rows[j + 1, 0]), int(rows[j + 1, 1])
        out = np.empty(size, dtype=np.int64)
        doc, offsets, reader = self.document_index, self._offsets, self.reader
        filled = 0
        for position in range(first, last + 1):
            unit = int(doc[position])
            start = int(offsets[unit]) + (first_offset if position == first else 0)
            stop = int(offsets[unit]) + last_offset + extra if position == last else int(offsets[unit + 1])
            piece = reader.span(start, max(start, stop))
            out[filled : filled + len(piece)] = piece
            filled += len(piece)
        if filled < size:  # only a kept partial last sample
            out[filled:] = self.pad_id
        return out

    def batch(self, samples: Sequence[int] | np.ndarray) -> np.ndarray:
        """Several samples as one ``(len(samples), sequence_length + add_extra_token)`` int64 array."""
        return np.stack([self[int(i)] for i in samples]) if len(samples) else self._empty_batch()

    def _empty_batch(self) -> np.ndarray:
        return np.zeros((0, self.sequence_length + self.add_extra_token), dtype=np.int64)

    @property
    def dtype(self) -> np.dtype:
        """The on-disk dtype of the reader's tokens (samples are int64)."""
        return self.reader.dtype

    def __repr__(self) -> str:
        return (
            f"<tokformats.training.GPTSamples {len(self):,} samples of {self.sequence_length}"
            f"{' + 1' if self.add_extra_token else ''} tokens, split {self.split_name} of {self.reader.path}>"
        )

    # -- pickling: the reader by path; the indices from the cache when there is one ------------------
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_lengths"], state["_offsets"]  # views of the reader's index: taken again from the reader
        if self.cache_dir is not None:
            for name in _NAMES:
                state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lengths, self._offsets = self.reader.sample_units()
        if "shuffle_index" not in state:
            found = IndexCache(self.cache_dir or ".").load(self.fingerprint, _NAMES)
            if found is None:
                self._load_indices()
            else:
                self.document_index, self.sample_index, self.shuffle_index = (found[n] for n in _NAMES)
