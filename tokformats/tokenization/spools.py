"""A partition's spools: append-only files of ids, document lengths and loss masks, each with a running SHA-256 of
what was written (checked on resume, pinned once the partition is done), and their publishing into a format's
writer: adopted as its data file, joined by a kernel copy, or copied with every byte hashed again."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from ..core.documents import document_runs, offsets_from_lengths
from ..core.dtypes import check_tokens
from ..core.protocol import TokenWriter
from ..errors import FormatError, option
from ..fs.pins import pin_file, pinned
from ..fs.untrusted import read_json_object

__all__ = ["CHECKPOINT", "Spool", "adopt_spool", "copy_spool", "join_spool"]

#: A partition's checkpoint, in its folder beside its spools: the counts and hashes of each spool, the position
#: reached, and (once done) each ids spool's pin.
CHECKPOINT = "checkpoint.json"


_SPOOL_CHUNK = 1 << 24  # tokens per write_batch call when writing the outputs


_HASH_PIECE = 1 << 22  # bytes read at a time when a spool is hashed


def _spool_hash(path: Path, size: int) -> Any:
    """A running SHA-256 of the first ``size`` bytes of ``path`` (to be continued as the spool grows), or None when
    the file holds fewer bytes."""
    with open(path, "rb") as handle:
        return _hashed(handle, size)


def _hashed(handle: Any, size: int) -> Any:
    """A SHA-256 of the first ``size`` bytes of the open file ``handle`` (read from its start), or None when it
    holds fewer bytes."""
    import hashlib

    digest = hashlib.sha256()
    handle.seek(0)
    # One buffer read into again and again: a new bytes object per piece costs its pages' first touch each time
    # (a fifth of the time of hashing a 125 MB spool).
    view = memoryview(bytearray(min(size, _HASH_PIECE)))
    left = size
    while left:
        count = handle.readinto(view[: min(left, _HASH_PIECE)])
        if not count:
            return None
        digest.update(view[:count])
        left -= count
    return digest


class Spool:
    """Append-only files: ids (in ``dtype``), document lengths (int64) and, for chat data, the loss mask (one byte
    per token), each with a running SHA-256 of everything written (recorded in checkpoints: a resume checks every
    byte up to the checkpoint, so writes the checkpoint does not know about, e.g. by a killed run's orphaned worker,
    are found, not published)."""

    def __init__(
        self,
        folder: Path,
        name: str,
        dtype: np.dtype,
        tokens: int = 0,
        documents: int = 0,
        hashes: dict[str, str] | None = None,
        *,
        masked: bool = False,
        vocab_size: int | None = None,
        pin: Any = None,
        **older: Any,
    ) -> None:
        #: Every id appended must be below it (checked as it is spooled: a spool published as it is, Megatron's
        #: ``.bin``, passes no writer's check).
        self.vocab_size = vocab_size
        del pin  # a done checkpoint's pin of the ids (see :meth:`pin`): taken again when this spool is done
        self.tokens_path = folder / f"{name}.tokens"
        self.lengths_path = folder / f"{name}.lengths"
        self.mask_path = folder / f"{name}.mask" if masked else None
        self.dtype = dtype
        self._hashes: dict[str, Any] = {}
        files = [(self.tokens_path, tokens * dtype.itemsize), (self.lengths_path, documents * 8)]
        if self.mask_path is not None:
            files.append((self.mask_path, tokens))
        for path, size in files:
            digest = self._verified(path, size, (hashes or {}).get(path.suffix), bool(older))
            with open(path, "ab") as handle:
                handle.truncate(size)  # drop whatever was written after the last checkpoint
            self._hashes[path.suffix] = digest
        if documents and _lengths_total(self.lengths_path, documents) != tokens:
            raise FormatError(
                f"{self.lengths_path}'s document lengths do not add up to the {tokens:,} tokens the checkpoint "
                f"records; the unfinished run cannot be resumed. Pass {option('overwrite')} to start over."
            )
        self._tokens = open(self.tokens_path, "ab")  # noqa: SIM115 - closed by close()
        self._lengths = open(self.lengths_path, "ab")  # noqa: SIM115 - closed by close()
        self._mask = open(self.mask_path, "ab") if self.mask_path is not None else None  # noqa: SIM115 - close()
        self.num_tokens, self.num_documents = tokens, documents
        #: Bytes of the ids file read back and found equal to the running hash (just now, on a resume).
        self._read_back = tokens * dtype.itemsize

    @staticmethod
    def _verified(path: Path, size: int, recorded: str | None, old_checkpoint: bool) -> Any:
        """The running hash of ``path``'s first ``size`` bytes, after checking them against the checkpoint's."""
        import hashlib

        if not size:
            return hashlib.sha256()
        found = path.stat().st_size if path.exists() else None
        digest = _spool_hash(path, size) if found is not None and found >= size else None
        if digest is not None and recorded is not None and digest.hexdigest() == recorded:
            return digest
        # Never extend a lost or damaged spool: that would publish zeros, or another run's writes, as documents.
        if found is None:
            state = "is missing"
        elif found < size:
            state = f"has {found:,} bytes"
        elif old_checkpoint or recorded is None:
            state = "has no full hash in the checkpoint (written by an older tokformats)"
        else:
            state = "differs from what the checkpoint recorded"
        raise FormatError(
            f"{path} {state}, but the checkpoint records {size:,} bytes of it; the unfinished run cannot "
            f"be resumed. Pass {option('overwrite')} to start over."
        )

    def append(self, flat: np.ndarray, lengths: np.ndarray, mask: np.ndarray | None = None) -> None:
        """Append documents (and their loss mask, which a chat spool requires)."""
        if (mask is None) != (self._mask is None):
            raise ValueError(f"{self.tokens_path}: a chat spool takes a mask with every batch, a text spool none")
        if self.vocab_size is not None and len(flat):
            check_tokens(flat, self.dtype, vocab_size=self.vocab_size, lengths=lengths,
                         first_document=self.num_documents, where=f"{self.tokens_path}: ")  # fmt: skip
        tokens = np.ascontiguousarray(flat, dtype=self.dtype).data
        counts = np.ascontiguousarray(lengths, dtype="<i8").data
        self._tokens.write(tokens)
        self._lengths.write(counts)
        self._hashes[".tokens"].update(tokens)
        self._hashes[".lengths"].update(counts)
        if self._mask is not None and mask is not None:
            values = np.ascontiguousarray(mask, dtype=np.uint8).data
            self._mask.write(values)
            self._hashes[".mask"].update(values)
        self.num_tokens += len(flat)
        self.num_documents += len(lengths)

    def _handles(self) -> list[Any]:
        return [h for h in (self._tokens, self._lengths, self._mask) if h is not None]

    def sync(self) -> None:
        """Flush and fsync every file of the spool."""
        self.flush()
        self.fsync()

    def flush(self) -> None:
        """Hand what is buffered to the kernel."""
        for handle in self._handles():
            handle.flush()

    def fsync(self) -> None:
        """fsync every file of the spool (what :meth:`flush` handed to the kernel): it changes nothing of the
        spool's state (only its descriptors are read), so another thread may do it while this one reads the spool
        back."""
        for handle in self._handles():
            os.fsync(handle.fileno())

    def hashes(self) -> dict[str, str]:
        """SHA-256 of each file up to the counts (recorded in checkpoints, checked on resume and on publishing)."""
        return {suffix: digest.hexdigest() for suffix, digest in self._hashes.items()}

    def pin(self) -> list[int] | None:
        """Pin the ids file, written and fsynced in full (:func:`~tokformats.fs.pins.pin_file`), after reading it
        back and finding it equal to the running hash of what was written (a write by anything else since the
        spool was opened raises here): recorded in the done checkpoint beside that hash, the pin lets the join
        copy the file by the kernel without reading it again, as long as nothing has written to it since (else
        the join reads and hashes it). The read back is the check the parent made before: in a parallel run it
        now happens in the workers, beside each other, instead of in the parent, one partition after another."""
        self.read_back()
        return pin_file(self.tokens_path)

    def read_back(self) -> None:
        """Read the ids file back (once per size reached) and raise when it is not what was written (its running
        hash); the check :meth:`pin` makes, which :meth:`~.partition_run._PartitionRun.save` runs beside the
        spools' fsync."""
        self._tokens.flush()
        size = self.num_tokens * self.dtype.itemsize
        if self._read_back != size:
            with open(self.tokens_path, "rb") as handle:
                digest = _hashed(handle, size)
                if (
                    digest is None
                    or digest.hexdigest() != self._hashes[".tokens"].hexdigest()
                    or os.fstat(handle.fileno()).st_size != size
                ):
                    _refuse_spool(self.tokens_path)
            self._read_back = size

    def close(self) -> None:
        """Close the spool's files (what was written stays: a resume reopens them)."""
        for handle in self._handles():
            handle.close()


def _lengths_total(path: Path, documents: int) -> int:
    """The sum of the first ``documents`` lengths in a spool's ``.lengths`` file (-1 when one is negative)."""
    lengths = np.fromfile(path, dtype="<i8", count=documents)
    return -1 if len(lengths) != documents or (lengths < 0).any() else int(lengths.sum())


def copy_spool(
    writer: TokenWriter,
    folder: Path,
    name: str,
    dtype: np.dtype,
    spooled: tuple[dict[str, Any], np.ndarray] | None = None,
) -> None:
    """Feed a finished partition's spool to ``writer`` in pieces of about ``_SPOOL_CHUNK`` tokens, hashing what it
    feeds: a spool that differs from its checkpoint's hash raises (inside the writer's block, so nothing is
    published).

    Plain file reads, not a memory map: a map would keep every page it has read resident, so memory would
    grow with the corpus; this way it stays at one piece. ``spooled``: what :func:`_spooled_lengths` gave for it
    already.
    """
    import hashlib

    entry, lengths = spooled or _spooled_lengths(folder, name)
    recorded = entry["hashes"]
    offsets = offsets_from_lengths(lengths)
    tokens_path, mask_path = folder / f"{name}.tokens", folder / f"{name}.mask"
    tokens_hash, mask_hash = hashlib.sha256(), hashlib.sha256()
    with open(tokens_path, "rb") as handle, contextlib.ExitStack() as stack:
        masks = stack.enter_context(open(mask_path, "rb")) if ".mask" in recorded else None
        for first, stop in document_runs(offsets, _SPOOL_CHUNK):
            count = offsets.item(stop) - offsets.item(first)
            flat = np.fromfile(handle, dtype=dtype, count=count)
            mask = np.fromfile(masks, dtype=np.uint8, count=count) if masks is not None else None
            if len(flat) != count or (mask is not None and len(mask) != count):
                _refuse_spool(tokens_path if len(flat) != count else mask_path)
            tokens_hash.update(flat.data)
            if mask is not None:
                mask_hash.update(mask.data)
            writer.write_batch(flat, lengths[first:stop], mask)
    if tokens_hash.hexdigest() != recorded.get(".tokens"):
        _refuse_spool(tokens_path)
    if masks is not None and mask_hash.hexdigest() != recorded.get(".mask"):
        _refuse_spool(mask_path)


def _spooled_lengths(folder: Path, name: str) -> tuple[dict[str, Any], np.ndarray]:
    """A finished spool's checkpoint entry (its counts, ``hashes`` and ``pin``) and its document lengths, checked
    against it (their hash, count and total); a spool that differs raises."""
    import hashlib

    sizes = read_json_object(folder / CHECKPOINT)["spools"][name]
    recorded = sizes.get("hashes") or {}
    lengths = np.fromfile(folder / f"{name}.lengths", dtype="<i8", count=sizes["documents"])
    lengths_hash = hashlib.sha256(np.ascontiguousarray(lengths, dtype="<i8").data).hexdigest()
    if (
        len(lengths) != sizes["documents"]
        or lengths_hash != recorded.get(".lengths")
        or (lengths < 0).any()
        or int(lengths.sum()) != sizes["tokens"]
    ):
        _refuse_spool(folder / f"{name}.lengths")
    return {**sizes, "hashes": recorded}, lengths


def adopt_spool(writer: TokenWriter, folder: Path, name: str, dtype: np.dtype) -> bool:
    """Publish a finished spool's ids as ``writer``'s data file, without writing them again
    (:meth:`~tokformats.core.protocol.TokenWriter.adopt_data_file`: Megatron's ``.bin`` is the spool's bytes,
    hard-linked into the commit; its ``.idx`` is built from the spooled lengths), after checking the spool against
    its checkpoint (:func:`_checked_ids`). False when the writer cannot (another format, a chat spool's masks, no
    hard links): nothing was written, and :func:`copy_spool` feeds it instead."""
    if type(writer).adopt_data_file is TokenWriter.adopt_data_file:  # the format has no flat data file
        return False
    entry, lengths = _spooled_lengths(folder, name)
    if ".mask" in entry["hashes"]:
        return False
    tokens_path = folder / f"{name}.tokens"
    with open(tokens_path, "rb") as handle:
        _checked_ids(handle, entry, int(lengths.sum()) * dtype.itemsize)
        adopted = writer.adopt_data_file(tokens_path, dtype, lengths)
        # The link is made by name: it must be the file just checked, not one put in its place meanwhile.
        checked, linked = os.fstat(handle.fileno()), os.stat(tokens_path)
        if adopted and (checked.st_dev, checked.st_ino) != (linked.st_dev, linked.st_ino):
            _refuse_spool(tokens_path)
    return adopted


def join_spool(writer: TokenWriter, folder: Path, name: str, dtype: np.dtype) -> None:
    """Append a finished partition's spool to ``writer``: its ids by a kernel copy where the format's data file is
    the bare id stream (:meth:`~tokformats.core.protocol.TokenWriter.append_data_file`) and the spool's pin shows
    that nothing has written to it since its worker read it back and pinned it (checked before and after the copy, see
    :mod:`tokformats.fs.pins`); else (another format, a chat spool's masks, no pin or a moved one) fed by
    :func:`copy_spool`, which reads and hashes every byte it feeds."""
    spooled = None
    if type(writer).append_data_file is not TokenWriter.append_data_file:  # the format has a flat data file
        spooled = entry, lengths = _spooled_lengths(folder, name)
        tokens_path = folder / f"{name}.tokens"
        size = int(lengths.sum()) * dtype.itemsize
        with open(tokens_path, "rb") as handle:
            if ".mask" not in entry["hashes"] and _pinned(handle, entry, size) and (
                writer.append_data_file(handle, dtype, lengths)
            ):
                if not pinned(handle.fileno(), entry.get("pin")):  # written to while the kernel copied
                    _refuse_spool(tokens_path)
                return
    copy_spool(writer, folder, name, dtype, spooled)


def _pinned(handle: Any, entry: dict[str, Any], size: int) -> bool:
    """Whether a finished spool's open ids file is as its worker pinned it (checkpoint ``entry``) and ``size``
    bytes long."""
    return pinned(handle.fileno(), entry.get("pin")) and os.fstat(handle.fileno()).st_size == size


def _checked_ids(handle: Any, entry: dict[str, Any], size: int) -> None:
    """Check a finished spool's open ids file against its checkpoint ``entry``: its pin, or, without a pin or where
    it moved, every byte read and hashed again. Raises when the file differs."""
    if _pinned(handle, entry, size):
        return
    digest = _hashed(handle, size)
    if digest is None or digest.hexdigest() != entry["hashes"].get(".tokens") or (
        os.fstat(handle.fileno()).st_size != size
    ):
        _refuse_spool(Path(handle.name))


def _refuse_spool(path: Path) -> NoReturn:
    raise FormatError(
        f"{path} differs from what its checkpoint recorded (written to after the checkpoint, or damaged); nothing "
        f"was published. Pass {option('overwrite')} to start over."
    )
