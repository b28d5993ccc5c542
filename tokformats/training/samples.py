"""Fixed-length training samples over any token reader, exactly as megatron-core's ``GPTDataset`` cuts them."""

from __future__ import annotations

import functools
import hashlib
import operator
import os
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from ..core.protocol import TokenReader, checked_position
from ..errors import ConfigError, FormatError
from . import indices
from .explain import Explained
from .index_cache import IndexCache, cache_key
from .sample_fields import SampleFields, megatron_sample

__all__ = ["GPTSamples"]

#: Bumped whenever the arrays built for the same options change, so that old cache entries are not reused.
_INDEX_VERSION = 1
_NAMES = ("document_index", "sample_index", "shuffle_index")


def data_fingerprint(reader: TokenReader, lengths: np.ndarray) -> str:
    """What the indices depend on in the data: the unit lengths (hashed), their count and the token dtype."""
    digest = hashlib.sha256(np.ascontiguousarray(lengths).data).hexdigest()  # as stored: no int64 copy
    return f"{reader.format}:{reader.dtype.name}:{len(lengths)}:{lengths.dtype.str}:{digest[:32]}"


#: Consecutive samples (shuffled positions) whose parts are found together, once, when a loader reads samples in
#: order: a DataLoader over ``GPTSamples`` (shuffled already, so read with ``shuffle=False``) asks for batch after
#: batch of consecutive positions, and one vectorised pass per block costs less than one per batch.
SPAN_BLOCK = 1024
#: Blocks kept per process (a batch's block and the one before: a worker's batches go forward).
_BLOCKS_KEPT = 2
#: A block is found only for a batch that starts at most this many batch lengths after the previous one read in
#: order (a DataLoader worker of 2-8 skips the others' batches; a rank of many reads 8 of every 1,024 samples): a
#: block costs about a tenth of the same samples found batch by batch, so it never costs more.
_DENSE = 8


def _consecutive_start(samples: Sequence[int] | np.ndarray) -> int | None:
    """``start`` when ``samples`` are ``start, start + 1, ...`` with ``start >= 0``, else None."""
    try:
        start = operator.index(samples[0])
    except TypeError:  # not an integer position: the general path says what is wrong
        return None
    expected = range(start, start + len(samples))
    if isinstance(samples, np.ndarray):
        consecutive = samples.ndim == 1 and np.array_equal(samples, expected)
    else:
        consecutive = list(samples) == list(expected)
    return start if consecutive and start >= 0 else None


class SpanBlock(NamedTuple):
    """The parts of samples ``first``, ``first + 1``, ... (shuffled positions): sample ``first + k`` is the reader's
    tokens ``starts[j]:stops[j]`` for ``j`` in ``range(pointers[k], pointers[k + 1])``, joined."""

    first: int
    pointers: list[int]
    starts: list[int]
    stops: list[int]


def sample_spans(samples: GPTSamples, unshuffled: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The parts of samples ``unshuffled`` (positions before shuffling), found with array arithmetic: each sample's
    cumulative part count (``ends``), and every part's ``starts`` and ``stops`` in the reader's token stream. None
    when a sample is not whole (a kept partial sample, or rows that do not describe one): the per-sample path
    serves, pads or refuses those."""
    length = samples.sequence_length + samples.add_extra_token
    count, offsets = len(unshuffled), samples._offsets
    # ``take`` rather than fancy indexing (several times faster on a few indices, and a batch is a few): rows u and
    # u + 1 of the sample index, where sample u starts and where it ends
    bounds = samples.sample_index.take(np.concatenate((unshuffled, unshuffled + 1)), axis=0).astype(np.int64)
    first, first_offset, last, last_offset = bounds[:count, 0], bounds[:count, 1], bounds[count:, 0], bounds[count:, 1]
    counts = last - first + 1  # units each sample is cut from
    if int(counts.min()) < 1:
        return None
    ends = np.cumsum(counts)
    heads, tails = ends - counts, ends - 1
    units = samples.document_index.take(np.arange(int(ends[-1])) + np.repeat(first - heads, counts))
    starts, stops = offsets.take(units), offsets.take(units + 1)
    stops[tails] = starts[tails] + last_offset + samples.add_extra_token  # before the head moves: one unit's start
    starts[heads] += first_offset
    np.maximum(stops, starts, out=stops)
    if not np.all(np.add.reduceat(stops - starts, heads) == length):
        return None
    return ends, starts, stops


def _joined(samples: GPTSamples, starts: list[int], stops: list[int], count: int, dtype: np.dtype) -> np.ndarray:
    """The tokens of parts ``starts[j]:stops[j]`` joined (:meth:`~tokformats.TokenReader.joined_spans`), as
    ``count`` samples' rows of ``dtype``."""
    gathered = samples.reader.joined_spans(starts, stops)
    if gathered.dtype != dtype:
        gathered = gathered.astype(dtype)  # casts as the per-sample path's assignment does ("unsafe")
    return gathered.reshape(count, samples.sequence_length + samples.add_extra_token)


def gathered_samples(samples: GPTSamples, unshuffled: np.ndarray, dtype: np.dtype) -> np.ndarray | None:
    """Bare-id samples ``unshuffled`` (positions before shuffling) as one array: every part of every sample found
    with array arithmetic (:func:`sample_spans`) and the parts joined by one ``concatenate``, instead of Python
    work per part. None when a sample is not whole."""
    spans = sample_spans(samples, unshuffled)
    if spans is None:
        return None
    _, starts, stops = spans
    return _joined(samples, starts.tolist(), stops.tolist(), len(unshuffled), dtype)


def span_block(samples: GPTSamples, number: int) -> SpanBlock | None:
    """The parts of block ``number`` of :data:`SPAN_BLOCK` consecutive samples (shuffled positions), or None when
    one of them is not whole (the per-batch path then serves that block)."""
    first = number * SPAN_BLOCK
    unshuffled = samples.shuffle_index[first : min(first + SPAN_BLOCK, len(samples))].astype(np.int64)
    spans = sample_spans(samples, unshuffled)
    if spans is None:
        return None
    ends, starts, stops = spans
    return SpanBlock(first, [0, *ends.tolist()], starts.tolist(), stops.tolist())


class GPTSamples(Sequence[Any], Explained):
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
        fields: None (the default) serves each sample as its bare ids; ``"megatron"`` or a sequence of names from
            ``("tokens", "labels", "attention_mask", "loss_mask", "position_ids", "cu_seqlens", "max_seqlen")``
            serves dicts of NumPy arrays equal to megatron-core's ``GPTDataset.__getitem__`` for the same flags
            (see :mod:`tokformats.training.sample_fields`; ``"cu_seqlens"`` brings ``max_seqlen``). When the
            reader stores per-token loss masks (:attr:`~tokformats.TokenReader.loss_masks`), ``loss_mask`` also
            drops the labels whose token is stored as not trained on.
        eod_id: the end-of-document id the three EOD flags look for (Megatron: the tokenizer's ``eod``).
        eod_mask_loss: no loss where the *input* token is EOD.
        reset_position_ids: positions restart after each EOD.
        reset_attention_mask: no attention across an EOD (with ``"attention_mask"``).
        create_attention_mask: add the ``(1, L, L)`` bool ``attention_mask`` (True = masked); with
            ``fields="megatron"`` it defaults to True, as megatron-core's.
        inter_document_masking: megatron-core 0.19's flag: ``cu_seqlens``/``max_seqlen`` from the unit parts each
            sample is cut from (the index, not an EOD scan) and positions restarting at each part.
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
        fields: str | Sequence[str] | None = None,
        eod_id: int | None = None,
        eod_mask_loss: bool = False,
        reset_position_ids: bool = False,
        reset_attention_mask: bool = False,
        create_attention_mask: bool | None = None,
        inter_document_masking: bool | None = None,
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
        #: What each sample dict holds (None: samples are bare ids).
        self.sample_fields = self._resolve_fields(
            fields,
            eod_id,
            eod_mask_loss,
            reset_position_ids,
            reset_attention_mask,
            create_attention_mask,
            inter_document_masking,
        )
        self._load_indices()

    # Hashing the unit lengths costs about as much as a small index build: the digests are taken when first asked
    # for (a cache, a sampler's state, a blend), not by every build.
    @functools.cached_property
    def description(self) -> dict[str, Any]:
        """What the three index arrays depend on: every option above and a digest of the data's unit lengths."""
        begin, end = self.units
        return {
            "class": "GPTSamples",
            "version": _INDEX_VERSION,
            "data": data_fingerprint(self.reader, self._lengths),
            "units": [begin, end],
            "sequence_length": self.sequence_length,
            "seed": self.seed,
            "num_samples": self.num_samples,
            "split": self.split,
            "split_name": self.split_name,
            "add_extra_token": self.add_extra_token,
            "drop_last_partial": self.drop_last_partial,
        }

    @functools.cached_property
    def index_key(self) -> str:
        """The key of the three index arrays: a digest of :attr:`description`."""
        return cache_key(self.description)

    @functools.cached_property
    def fingerprint(self) -> str:
        """A digest of every option and of the data's unit lengths: equal fingerprints, equal samples."""
        if self.sample_fields is None:
            return self.index_key
        return cache_key({"indices": self.index_key, **self.sample_fields.describe()})

    def _resolve_fields(
        self,
        fields: str | Sequence[str] | None,
        eod_id: int | None,
        eod_mask_loss: bool,
        reset_position_ids: bool,
        reset_attention_mask: bool,
        create_attention_mask: bool | None,
        inter_document_masking: bool | None,
    ) -> SampleFields | None:
        if fields is None:
            if (
                eod_mask_loss
                or reset_position_ids
                or reset_attention_mask
                or create_attention_mask
                or eod_id is not None
            ):
                raise ConfigError(
                    "eod_id and the mask flags shape sample dicts: pass fields='megatron' (or the names you want) too."
                )
            return None
        return SampleFields.resolve(
            fields,
            sequence_length=self.sequence_length,
            add_extra_token=self.add_extra_token,
            pad_id=self.pad_id,
            eod_id=eod_id,
            eod_mask_loss=eod_mask_loss,
            reset_position_ids=reset_position_ids,
            reset_attention_mask=reset_attention_mask,
            create_attention_mask=create_attention_mask,
            inter_document_masking=inter_document_masking,
        )

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
        document_index = indices.document_index(units, epochs, random_state, separate, in_place=True)
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
            arrays = IndexCache(self.cache_dir).get_or_build(self.index_key, self.description, _NAMES, self._build)
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
                f"{self.cache_dir}: the cached indices {self.index_key}-* do not fit the data ("
                + "; ".join(problems)
                + "); delete them to rebuild."
            )

    # -- the samples ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.shuffle_index)

    def __getitem__(self, index: Any) -> Any:
        """Sample ``index`` (after shuffling): ``sequence_length + add_extra_token`` ids as int64, or with
        ``fields`` a dict of arrays. ``None`` gives megatron-core's batch padding sample: sample 0 with an all-zero
        ``loss_mask`` (dict samples only)."""
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index is None:
            if self.sample_fields is None:
                raise ConfigError("the batch padding sample (index None) is a dict sample: pass fields= too.")
            return self.sample(int(self.shuffle_index[checked_position(0, len(self), "sample", "samples")]), True)
        j = int(self.shuffle_index[checked_position(index, len(self), "sample", "samples")])
        return self.unshuffled(j) if self.sample_fields is None else self.sample(j)

    def ids(self, index: int, dtype: Any = np.int64) -> np.ndarray:
        """Sample ``index`` (after shuffling) as bare ids in ``dtype``: int64 gives ``self[index]``; the stored
        :attr:`dtype` (uint16, uint32) copies the tokens as they are on disk, a quarter (a half) of int64's bytes
        for a DataLoader to ship, to be widened by the consumer (``batch.long()``, on the device).

        Raises:
            ConfigError: dict samples (``fields=``), a dtype that cannot hold every stored id (not an integer one,
                or narrower than :attr:`dtype`), or a kept partial sample's ``pad_id`` that ``dtype`` cannot hold.
        """
        if self.sample_fields is not None:
            raise ConfigError("ids() serves bare-id samples; these samples are dicts (fields=): index them instead.")
        wanted = self._ids_dtype(dtype)
        j = int(self.shuffle_index[checked_position(index, len(self), "sample", "samples")])
        return self._gather(self._spans(j), self.reader.span, self.pad_id, wanted.type)

    def _ids_dtype(self, dtype: Any) -> np.dtype:
        """``dtype`` checked for :meth:`ids` and :meth:`batch`: int64 (what ``self[i]`` gives), or an integer dtype
        that holds every stored id (the stored dtype, or a wider one: a narrower one would wrap ids silently), and
        holds a kept partial sample's pad."""
        wanted: np.dtype = np.dtype(dtype)
        stored = self.dtype if self.dtype is not None and self.dtype.kind in "iu" else None
        holds = wanted == np.int64 or (stored is not None and np.can_cast(stored, wanted, "safe"))
        if wanted.kind not in "iu" or not holds:  # int64 is what self[i] gives, whatever is stored
            held = f"{stored.name} or int64" if stored is not None else "int64"
            raise ConfigError(
                f"ids() needs an integer dtype that holds the stored ids, such as {held}; not {wanted.name}."
            )
        if not self.drop_last_partial and not np.iinfo(wanted).min <= self.pad_id <= np.iinfo(wanted).max:
            raise ConfigError(
                f"pad_id {self.pad_id} does not fit {wanted.name}, the dtype asked of ids(); pass a pad_id in "
                f"[{np.iinfo(wanted).min}, {np.iinfo(wanted).max}] or keep the default int64."
            )
        return wanted

    def _spans(self, j: int) -> list[tuple[int, int]]:
        """The stream spans ``[start, stop)`` sample ``j`` is cut from, one per unit part, in order."""
        # Per-sample work is Python: rows and units come out as lists in one call each, not as NumPy scalars.
        (first, first_offset), (last, last_offset) = self.sample_index[j : j + 2].tolist()
        offsets = self._offsets
        spans = [
            (offsets.item(unit), offsets.item(unit + 1)) for unit in self.document_index[first : last + 1].tolist()
        ]
        start = spans[-1][0]
        spans[-1] = (start, start + last_offset + int(self.add_extra_token))  # the last part ends inside its unit
        spans[0] = (spans[0][0] + first_offset, spans[0][1])  # and the first starts inside its own
        return [(start, max(start, stop)) for start, stop in spans]

    def _gather(self, spans: list[tuple[int, int]], source: Any, pad: int, dtype: type) -> np.ndarray:
        out: np.ndarray = np.empty(self.sequence_length + self.add_extra_token, dtype=dtype)
        filled = 0
        for start, stop in spans:
            piece = source(start, stop)
            out[filled : filled + len(piece)] = piece
            filled += len(piece)
        if filled < len(out):  # only a kept partial last sample
            out[filled:] = pad
        return out

    def unshuffled(self, j: int) -> np.ndarray:
        """Sample ``j`` in the order the units are laid out (before :attr:`shuffle_index`), as int64 ids."""
        return self._gather(self._spans(j), self.reader.span, self.pad_id, np.int64)

    def sample(self, j: int, padding: bool = False) -> dict[str, np.ndarray]:
        """Sample ``j`` (before shuffling) as a dict of the chosen ``fields``; ``padding``: megatron-core's batch
        padding sample (its loss mask all zeros)."""
        options = self.sample_fields
        if options is None:
            raise ConfigError("dict samples need fields=: pass fields='megatron' or the names you want.")
        spans = self._spans(j)
        text = self._gather(spans, self.reader.span, self.pad_id, np.int64)
        masks = self.reader.loss_masks
        text_mask = None
        if masks is not None and "loss_mask" in options.fields:
            text_mask = self._gather(spans, lambda a, b: masks[a:b], 0, np.uint8)
        parts = [stop - start for start, stop in spans]
        return megatron_sample(text, parts, options, text_mask=text_mask, padding=padding)

    def batch(self, samples: Sequence[int] | np.ndarray, dtype: Any = np.int64) -> Any:
        """Several samples as one ``(len(samples), sequence_length + add_extra_token)`` array of ``dtype`` (int64,
        or the stored :attr:`dtype` as :meth:`ids` serves it), every part gathered in one NumPy call; with
        ``fields``: a dict of stacked arrays."""
        if self.sample_fields is not None:
            rows = [self[int(i)] for i in samples]
            if not rows:
                raise ConfigError("batch() of dict samples needs at least one sample index.")
            return {key: np.stack([row[key] for row in rows]) for key in rows[0]}
        if not len(samples):
            return self._empty_batch().astype(dtype)
        wanted = self._ids_dtype(dtype)
        in_order = self._batch_in_order(samples, wanted)
        if in_order is not None:
            return in_order
        picks = np.asarray(samples)
        whole = picks.ndim == 1 and picks.dtype.kind in "iu"
        if whole and -len(self) <= int(picks.min()) and int(picks.max()) < len(self):
            gathered = gathered_samples(self, self.shuffle_index[picks].astype(np.int64), wanted)
            if gathered is not None:
                return gathered
        return np.stack([self.ids(int(i), wanted) for i in samples])  # raises for what the fast path passed on

    def _batch_in_order(self, samples: Sequence[int] | np.ndarray, dtype: np.dtype) -> np.ndarray | None:
        """Consecutive samples (``start``, ``start + 1``, ..., in range and in one :data:`SPAN_BLOCK`) from their
        block's parts, found once per block (:func:`span_block`), when this process read another batch shortly
        before (a block serves at least one sample in :data:`_DENSE` of its own, so it never costs more than
        batches found one by one); None for any other batch, or a block with a sample that is not whole."""
        start = _consecutive_start(samples)
        count = len(samples)
        if start is None or start + count > len(self) or (start + count - 1) // SPAN_BLOCK != start // SPAN_BLOCK:
            return None
        # (where the last such batch started, the blocks kept): replaced whole, never changed in place, so that
        # threads sharing these samples at worst find a block twice
        previous, blocks = self.__dict__.get("_span_blocks", (None, ()))
        self.__dict__["_span_blocks"] = (start, blocks)
        if previous is None or not 0 < start - previous <= _DENSE * count:
            return None
        number = start // SPAN_BLOCK
        found = [block for kept, block in blocks if kept == number]
        if found:
            block = found[0]
        else:
            block = span_block(self, number)
            self.__dict__["_span_blocks"] = (start, (*blocks, (number, block))[-_BLOCKS_KEPT:])
        if block is None:
            return None
        low, high = block.pointers[start - block.first], block.pointers[start - block.first + count]
        return _joined(self, block.starts[low:high], block.stops[low:high], count, dtype)

    def sample_tokens(self) -> np.ndarray:
        """The tokens each sample feeds a model (``sequence_length`` each, int64): what a token budget counts."""
        return np.full(len(self), self.sequence_length, dtype=np.int64)

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
        state.pop("_span_blocks", None)  # found again where they are read
        if self.cache_dir is not None:
            for name in _NAMES:
                state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lengths, self._offsets = self.reader.sample_units()
        if "shuffle_index" not in state:
            found = IndexCache(self.cache_dir or ".").load(self.index_key, _NAMES)
            if found is None:
                self._load_indices()
            else:
                self.document_index, self.sample_index, self.shuffle_index = (found[n] for n in _NAMES)
