"""The fields of a training sample (labels, loss mask, positions, attention masks, ``cu_seqlens``) from its ids.

:func:`megatron_sample` turns the ids of one fixed-length sample and the lengths of the unit parts it is cut
from into the dict megatron-core's ``GPTDataset.__getitem__`` returns (0.16.1, and 0.19's
``inter_document_masking``), as NumPy arrays of the same dtypes:

- ``tokens``/``labels`` int64: ``x[:-1]``/``x[1:]`` with the extra token, else ``x`` and ``x`` rolled left with the
  last label the pad id; pads replaced by 0 once the masks are taken.
- ``loss_mask`` float32: 0 where the label is the pad id, where the *input* token is EOD (``eod_mask_loss``), where
  a stored per-token mask says the label token is not trained on, and everywhere in the batch padding sample.
- ``position_ids`` int64: ``arange(L)``, restarting after each EOD (``reset_position_ids``), or at each part
  (``inter_document_masking``).
- ``attention_mask`` bool ``(1, L, L)``, True where masked: causal, and block-diagonal between EODs with
  ``reset_attention_mask``.
- ``cu_seqlens`` int32 ``(L + 1,)`` and ``max_seqlen`` int32 0-d: the parts' cumulative lengths (the extra token
  taken off the last part, padding folded into it), padded with ``L`` so that ``default_collate`` stacks them.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError

__all__ = ["FIELDS", "SampleFields", "megatron_sample", "cu_seqlens_of", "segment_positions"]

#: Every field a sample dict can hold, in megatron-core's key order.
FIELDS = ("tokens", "labels", "attention_mask", "loss_mask", "position_ids", "cu_seqlens", "max_seqlen")


@dataclass(frozen=True)
class SampleFields:
    """Which fields a sample dict holds and the flags that shape them (megatron-core's ``GPTDatasetConfig``).

    Build it with :meth:`resolve`, which checks the names and ties the flags to the fields asked for.
    """

    #: The keys of every sample dict, in order.
    fields: tuple[str, ...]
    sequence_length: int
    add_extra_token: bool
    pad_id: int
    eod_id: int | None = None
    eod_mask_loss: bool = False
    reset_position_ids: bool = False
    reset_attention_mask: bool = False
    inter_document_masking: bool = False

    @classmethod
    def resolve(
        cls,
        fields: str | Sequence[str],
        *,
        sequence_length: int,
        add_extra_token: bool,
        pad_id: int,
        eod_id: int | None,
        eod_mask_loss: bool,
        reset_position_ids: bool,
        reset_attention_mask: bool,
        create_attention_mask: bool | None,
        inter_document_masking: bool | None,
    ) -> SampleFields:
        """The fields and flags, checked.

        ``fields="megatron"`` gives exactly the keys megatron-core returns for the flags (``attention_mask`` when
        ``create_attention_mask``, which defaults to True as there; ``cu_seqlens`` and ``max_seqlen`` instead with
        ``inter_document_masking``). A sequence names the keys: ``"attention_mask"`` in it creates the mask,
        ``"cu_seqlens"`` turns ``inter_document_masking`` on (unless given False) and brings ``max_seqlen`` along,
        as megatron-core pairs them.
        """
        if isinstance(fields, str):
            if fields != "megatron":
                raise ConfigError(f"fields must be 'megatron' or a sequence of names from {FIELDS}, not {fields!r}.")
            masking = bool(inter_document_masking)
            create = True if create_attention_mask is None else bool(create_attention_mask)
            wanted = [f for f in FIELDS if f not in ("attention_mask", "cu_seqlens", "max_seqlen")]
            if masking:
                wanted += ["cu_seqlens", "max_seqlen"]
            elif create:
                wanted.insert(2, "attention_mask")
        else:
            wanted = list(fields)
            unknown = [f for f in wanted if f not in FIELDS]
            if unknown or len(set(wanted)) != len(wanted) or not wanted:
                raise ConfigError(f"fields {tuple(fields)} must be distinct names from {FIELDS}; found {unknown}.")
            masking = ("cu_seqlens" in wanted) if inter_document_masking is None else bool(inter_document_masking)
            if masking and "cu_seqlens" not in wanted:
                wanted.append("cu_seqlens")
            if "cu_seqlens" in wanted and "max_seqlen" not in wanted:
                wanted.append("max_seqlen")
            if "cu_seqlens" in wanted and not masking:
                raise ConfigError("fields name 'cu_seqlens' but inter_document_masking=False; drop one of them.")
            if create_attention_mask and "attention_mask" not in wanted:
                wanted.insert(min(2, len(wanted)), "attention_mask")
        needs_eod = eod_mask_loss or reset_position_ids or reset_attention_mask
        if needs_eod and eod_id is None:
            raise ConfigError(
                "eod_mask_loss, reset_position_ids and reset_attention_mask look for the end-of-document id: pass "
                "eod_id=ID (Megatron: the tokenizer's eod)."
            )
        return cls(
            tuple(wanted),
            int(sequence_length),
            bool(add_extra_token),
            int(pad_id),
            None if eod_id is None else int(eod_id),
            bool(eod_mask_loss),
            bool(reset_position_ids),
            bool(reset_attention_mask),
            masking,
        )

    def describe(self) -> dict[str, object]:
        """The options as a JSON-able dict (for fingerprints)."""
        return {
            "fields": list(self.fields),
            "pad_id": self.pad_id,
            "eod_id": self.eod_id,
            "eod_mask_loss": self.eod_mask_loss,
            "reset_position_ids": self.reset_position_ids,
            "reset_attention_mask": self.reset_attention_mask,
            "inter_document_masking": self.inter_document_masking,
        }


@functools.lru_cache(maxsize=4)
def _strictly_upper(length: int) -> np.ndarray:
    """``(L, L)`` bool, True above the diagonal (a causal mask, True = masked); its top-left ``n x n`` block is the
    causal mask of ``n`` tokens. Read-only, shared."""
    mask = ~np.tri(length, dtype=bool)
    mask.flags.writeable = False
    return mask


def segment_positions(starts_mark: np.ndarray) -> np.ndarray:
    """Positions restarting at every True of ``starts_mark`` (position 0 always starts): int64."""
    length = len(starts_mark)
    index = np.arange(length, dtype=np.int64)
    start = np.where(starts_mark, index, 0)
    np.maximum.accumulate(start, out=start)
    return index - start


def cu_seqlens_of(parts: Sequence[int], sequence_length: int, add_extra_token: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(cu_seqlens padded to L + 1 with L, max_seqlen)`` of a sample cut from ``parts`` (their lengths, in order,
    before padding), as megatron-core 0.19's ``inter_document_masking`` computes them.

    The extra token is taken off the last part (which is dropped when that leaves it empty), a shortfall (padding)
    is folded into the last part. Empty parts inside the sample stay as repeated boundaries, as there; only when
    they would not fit in ``L + 1`` entries (megatron-core fails on such a sample) are they left out.
    """
    lengths = [int(x) for x in parts]
    if add_extra_token and lengths:
        lengths[-1] -= 1
        if lengths[-1] == 0:
            lengths.pop()
    shortfall = sequence_length - sum(lengths)
    if shortfall > 0:
        if lengths:
            lengths[-1] += shortfall
        else:
            lengths.append(shortfall)
    if len(lengths) + 1 > sequence_length + 1:
        lengths = [x for x in lengths if x] or [sequence_length]
    cumulative = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=cumulative[1:])
    padded = np.full(sequence_length + 1, sequence_length, dtype=np.int32)
    padded[: len(cumulative)] = cumulative
    return padded, np.diff(cumulative).max(initial=0).astype(np.int32)


def _tokens_and_labels(text: np.ndarray, options: SampleFields) -> tuple[np.ndarray, np.ndarray]:
    if options.add_extra_token:
        return text[:-1].copy(), text[1:].copy()
    labels = np.empty_like(text)
    labels[:-1] = text[1:]
    labels[-1] = options.pad_id
    return text.copy(), labels


def _loss_mask(
    tokens: np.ndarray, labels: np.ndarray, text_mask: np.ndarray | None, options: SampleFields, padding: bool
) -> np.ndarray:
    length = len(tokens)
    if padding:  # megatron-core's batch padding sample (idx=None): nothing is trained on
        return np.zeros(length, dtype=np.float32)
    loss = np.ones(length, dtype=np.float32)
    if options.eod_mask_loss:
        loss[tokens == options.eod_id] = 0.0
    loss[labels == options.pad_id] = 0.0
    if text_mask is not None:
        # Label j is text token j + 1: it is trained on when that token's stored mask is 1.
        shifted = np.zeros(length, dtype=np.float32)
        shifted[: len(text_mask) - 1] = text_mask[1 : length + 1]
        loss *= shifted
    return loss


def _attention_mask(eods: np.ndarray | None, length: int) -> np.ndarray:
    """Causal, and with ``eods`` (input positions of EOD) no attention from after an EOD to it or before it."""
    upper = _strictly_upper(length)
    if eods is None or not len(eods):
        return upper.copy()[None]
    mask = np.ones((1, length, length), dtype=bool)
    bounds = [0, *(int(e) + 1 for e in eods if e + 1 < length), length]
    for begin, end in itertools.pairwise(bounds):
        mask[0, begin:end, begin:end] = upper[: end - begin, : end - begin]
    return mask


def megatron_sample(
    text: np.ndarray,
    parts: Sequence[int],
    options: SampleFields,
    *,
    text_mask: np.ndarray | None = None,
    padding: bool = False,
) -> dict[str, np.ndarray]:
    """The sample dict of ``text`` (``L + extra`` int64 ids, pads included) cut from unit parts of lengths
    ``parts``; ``text_mask`` is the stored per-token loss mask of ``text`` (0 on pads), or None."""
    tokens, labels = _tokens_and_labels(text, options)
    length = options.sequence_length
    wanted = options.fields
    eod = options.eod_id
    out: dict[str, np.ndarray] = {}
    eods = None
    if eod is not None and (options.reset_position_ids or options.reset_attention_mask):
        eods = np.flatnonzero(tokens == eod)
    loss_mask = _loss_mask(tokens, labels, text_mask, options, padding) if "loss_mask" in wanted else None
    if "attention_mask" in wanted:
        out["attention_mask"] = _attention_mask(eods if options.reset_attention_mask else None, length)
    cu_seqlens = max_seqlen = None
    if options.inter_document_masking:
        cu_seqlens, max_seqlen = cu_seqlens_of(parts, length, options.add_extra_token)
    if "position_ids" in wanted:
        if cu_seqlens is not None:
            marks = np.zeros(length, dtype=bool)
            marks[cu_seqlens[cu_seqlens < length]] = True
            out["position_ids"] = segment_positions(marks)
        elif options.reset_position_ids and eods is not None and len(eods):
            marks = np.zeros(length + 1, dtype=bool)
            marks[eods + 1] = True
            out["position_ids"] = segment_positions(marks[:length])
        else:
            out["position_ids"] = np.arange(length, dtype=np.int64)
    pad = options.pad_id
    tokens[tokens == pad] = 0  # after the masks were taken: the embedding must be able to look every id up
    labels[labels == pad] = 0
    out["tokens"], out["labels"] = tokens, labels
    if loss_mask is not None:
        out["loss_mask"] = loss_mask
    if cu_seqlens is not None and max_seqlen is not None:
        out["cu_seqlens"], out["max_seqlen"] = cu_seqlens, max_seqlen
    return {name: out[name] for name in wanted}
