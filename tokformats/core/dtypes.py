"""Token dtypes: choosing one from a vocabulary size, and refusing values that do not fit.

NumPy (and Megatron, which relies on it) silently wraps 70000 to 4464 when casting to uint16;
tokformats never does. :func:`check_tokens` finds the first offending value with vectorised
min/max passes and names the document it belongs to.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import DTypeError, TokenRangeError

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = [
    "UINT16_VOCAB_LIMIT",
    "little_endian",
    "parse_dtype",
    "dtype_for_vocab",
    "resolve_dtype",
    "as_token_array",
    "check_tokens",
    "check_lengths",
    "check_id",
]

#: Largest vocabulary whose ids (0 .. 65535) all fit in uint16.
UINT16_VOCAB_LIMIT = 1 << 16


def little_endian(dtype: npt.DTypeLike) -> np.dtype:
    """``dtype`` with explicit little-endian byte order (single-byte dtypes unchanged)."""
    dt = np.dtype(dtype)
    return dt if dt.itemsize == 1 else dt.newbyteorder("<")


def parse_dtype(dtype: npt.DTypeLike, *, what: str = "dtype") -> np.dtype:
    """Turn a user's (or a file's) dtype spelling (``"uint16"``, ``"<u2"``, ``np.int32``) into a little-endian
    dtype, refusing anything but plain integers and floats: bytes mapped as Python objects would crash the
    process, and strings, structures or dates are not tokens or values."""
    try:
        parsed = np.dtype(dtype)
    except Exception as exc:  # NumPy raises TypeError, ValueError or even SyntaxError for odd strings
        raise DTypeError(f"{what} {dtype!r} is not a NumPy dtype name ({type(exc).__name__}: {exc}).") from None
    if parsed.kind not in "iuf" or parsed.fields is not None or parsed.subdtype is not None:
        raise DTypeError(f"{what} {dtype!r} is not an integer or floating dtype; only those hold tokens or values.")
    return little_endian(parsed)


def dtype_for_vocab(vocab_size: int) -> np.dtype:
    """The smallest unsigned dtype that holds every id below ``vocab_size``: uint16 up to 65,536, else uint32."""
    if vocab_size <= 0:
        raise DTypeError(f"vocab_size must be positive, found {vocab_size}.")
    if vocab_size <= UINT16_VOCAB_LIMIT:
        return np.dtype("<u2")
    if vocab_size <= 1 << 32:
        return np.dtype("<u4")
    raise DTypeError(f"vocab_size {vocab_size:,} does not fit in uint32.")


def resolve_dtype(
    dtype: npt.DTypeLike | None,
    vocab_size: int | None,
    *,
    format: str,
    allowed: Iterable[npt.DTypeLike] | None = None,
    default: npt.DTypeLike | None = None,
    rule: Any = dtype_for_vocab,
) -> np.dtype:
    """Pick a writer's dtype: explicit ``dtype``, else ``rule(vocab_size)``, else ``default``.

    Args:
        dtype: what the caller asked for, or None.
        vocab_size: the tokenizer's vocabulary size, or None.
        format: format name, for messages.
        allowed: dtypes the format can store (None: any integer or float dtype).
        default: used when neither ``dtype`` nor ``vocab_size`` is given; None makes one of them required.
        rule: maps a vocabulary size to a dtype (formats differ: Megatron uses int32 from 65,500).
    """
    if dtype is not None:
        chosen = parse_dtype(dtype)
        if vocab_size is not None and chosen.kind in "iu":
            top = np.iinfo(chosen).max
            if vocab_size - 1 > top:
                raise DTypeError(
                    f"{format}: dtype {chosen.name} holds ids up to {top:,}, but vocab_size is {vocab_size:,}."
                )
    elif vocab_size is not None:
        chosen = little_endian(rule(vocab_size))
    elif default is not None:
        chosen = parse_dtype(default)
    else:
        raise DTypeError(f"{format}: pass vocab_size= (or dtype=) so that the token dtype can be chosen.")
    if allowed is not None:
        allowed_dtypes = [little_endian(a) for a in allowed]
        if chosen not in allowed_dtypes:
            names = ", ".join(d.name for d in allowed_dtypes)
            raise DTypeError(f"{format} stores tokens as {names}; {chosen.name} was asked for.")
    elif chosen.kind not in "iuf":
        raise DTypeError(f"{format}: {chosen.name} is not an integer or floating dtype.")
    return chosen


def as_token_array(values: Any, *, what: str = "tokens") -> np.ndarray:
    """``values`` as a 1-D numeric ndarray (no copy when it already is one); booleans are not ids."""
    try:
        array = np.asarray(values)
    except (TypeError, ValueError, OverflowError) as exc:  # ragged lists, huge Python ints
        raise TokenRangeError(f"{what} must be a flat sequence of numbers ({exc}).") from None
    if array.ndim != 1:
        if array.size == 0:
            return np.zeros(0, dtype=np.int64)
        raise TokenRangeError(f"{what} must be one-dimensional, found shape {array.shape}.")
    if array.dtype.kind not in "iuf":
        if array.size == 0:
            return np.zeros(0, dtype=np.int64)
        raise TokenRangeError(f"{what} must be integers or floats, found dtype {array.dtype}.")
    return array


def _fits_by_type(source: np.dtype, target: np.dtype) -> bool:
    return source.kind in "iu" and np.can_cast(source, target, casting="safe")


def check_tokens(
    flat: np.ndarray,
    target: np.dtype,
    *,
    vocab_size: int | None = None,
    lengths: np.ndarray | None = None,
    first_document: int = 0,
    where: str = "",
) -> np.ndarray:
    """Return ``flat`` cast to ``target`` after checking that every value fits; raise otherwise.

    Integer targets refuse values below the dtype's minimum (below 0 when ``vocab_size`` is given: ids are never
    negative) or above its maximum, values of ``vocab_size`` or more, and non-integral or non-finite floats. Float
    targets refuse NaN and infinities, integers they would round (16,777,217 in float32), and, with ``vocab_size``,
    anything that is not an id below it. The error names the document (its index counts from ``first_document``
    through ``lengths``), the position and the value.
    """
    if flat.size == 0:
        return flat.astype(target, copy=False)
    if target.kind == "f":
        return _check_float_target(flat, target, vocab_size, lengths, first_document, where)
    info = np.iinfo(target)
    high = info.max if vocab_size is None else min(info.max, vocab_size - 1)
    low = info.min if vocab_size is None else max(info.min, 0)
    source_max = np.iinfo(flat.dtype).max if flat.dtype.kind in "iu" else None
    source_nonnegative = flat.dtype.kind == "u"
    if _fits_by_type(flat.dtype, target) and (
        vocab_size is None or (source_nonnegative and source_max is not None and high >= source_max)
    ):
        return flat.astype(target, copy=False)  # nothing can be out of range: skip the scan
    bad: np.ndarray | None = None
    if flat.dtype.kind == "f":
        # Compare against the first integer above the range, which is exact as a float where the largest
        # value (2**63 - 1) is not: 2.0**63 must not pass as int64's maximum.
        bad_mask = (flat != np.floor(flat)) | ~np.isfinite(flat) | (flat < float(low)) | (flat >= float(high + 1))
        if bad_mask.any():
            bad = bad_mask
    else:
        # Unsigned input cannot go below zero: one pass (max) instead of two.
        lo = 0 if flat.dtype.kind in "ub" else flat.min()
        hi = flat.max()
        if lo < low or hi > high:
            bad = (flat < low) | (flat > high)
    if bad is not None:
        limit = (
            f"an id below vocab_size {vocab_size:,}"
            if vocab_size is not None
            else f"in {target.name} ({low:,}..{info.max:,})"
        )
        _refuse(flat, bad, limit, lengths, first_document, where)
    if flat.dtype.kind in "iu" and flat.dtype.itemsize == target.itemsize and flat.dtype.isnative == target.isnative:
        # Every value is in the target's range (checked above), where signed and unsigned integers of one width
        # share their bits: a view, not a copy (uint32 ids into Megatron's int32 .bin: a pass over every id saved).
        return flat.view(target)
    return flat.astype(target, copy=False)


def _refuse(
    flat: np.ndarray, bad: np.ndarray, limit: str, lengths: np.ndarray | None, first_document: int, where: str
) -> None:
    position = int(np.argmax(bad))
    value = flat[position].item()
    document = first_document
    if lengths is not None and len(lengths):
        ends = np.cumsum(lengths, dtype=np.int64)
        document += int(np.searchsorted(ends, position, side="right"))
    within = position - _start_of(document - first_document, lengths)
    raise TokenRangeError(
        f"{where}document {document} holds the value {value} (its token {within}), which is not {limit}; "
        "values are never wrapped or rounded. Pick a wider dtype or check the data."
    )


def _check_float_target(
    flat: np.ndarray,
    target: np.dtype,
    vocab_size: int | None,
    lengths: np.ndarray | None,
    first_document: int,
    where: str,
) -> np.ndarray:
    cast = flat.astype(target, copy=False)
    if flat.dtype.kind == "f":
        bad = ~np.isfinite(flat)
        if vocab_size is not None:
            bad |= (flat != np.floor(flat)) | (flat < 0) | (flat >= vocab_size)
        if bad.any():
            limit = f"an id below vocab_size {vocab_size:,}" if vocab_size is not None else "a finite number"
            _refuse(flat, bad, limit, lengths, first_document, where)
        return cast
    bad = cast.astype(flat.dtype) != flat  # integers the float cannot hold exactly
    if vocab_size is not None:
        bad |= (flat < 0) | (flat >= vocab_size)
    if bad.any():
        limit = f"an id below vocab_size {vocab_size:,}" if vocab_size is not None else f"exact in {target.name}"
        _refuse(flat, bad, limit, lengths, first_document, where)
    return cast


def _start_of(document: int, lengths: np.ndarray | None) -> int:
    if lengths is None or document == 0:
        return 0
    return int(np.sum(lengths[:document], dtype=np.int64))


def check_lengths(lengths: Any, total: int, *, where: str = "") -> np.ndarray:
    """Validate a batch's document lengths against its flat token count; return them as int64."""
    array = np.asarray(lengths)
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        raise TokenRangeError(f"{where}lengths must be a 1-D array of integers, found {array.dtype} {array.shape}.")
    array = array.astype(np.int64, copy=False)
    if array.size and array.min() < 0:
        raise TokenRangeError(
            f"{where}lengths must not be negative; document {int(np.argmin(array))} has {int(array.min())}."
        )
    declared = int(array.sum())
    if declared != total:
        raise TokenRangeError(f"{where}lengths add up to {declared:,} tokens but {total:,} tokens were given.")
    return array


def check_id(value: int | None, target: np.dtype, vocab_size: int | None, what: str) -> Any:
    """A single id option (``eos=``, ``bos=``) checked like a token and cast to ``target``; None stays None."""
    if value is None:
        return None
    return check_tokens(np.array([value]), target, vocab_size=vocab_size, where=f"{what}: ")[0]
