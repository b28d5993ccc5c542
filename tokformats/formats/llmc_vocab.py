"""llm.c's tokenizer vocabulary (``gpt2_tokenizer.bin``), written by llm.c's ``write_tokenizer``.

Layout (little-endian)::

    offset 0     uint32  magic    20240328
    offset 4     uint32  version  1 or 2
    offset 8     uint32  N        number of tokens
    offset 12    uint32  eot      end-of-text id (version 2 only; version 1 implies 50256 and N == 50257)
    offset 16    1008 bytes of zeros
    offset 1024  N records: uint8 length L (1..255), then L raw bytes

Records hold each token's raw bytes (partial UTF-8 stays partial; special tokens are their UTF-8
text). llm.c's C reader NUL-terminates records, so it cuts a token at a 0x00 byte; this reader
keeps every byte. Decoding concatenates records, then decodes UTF-8 with replacement.

Ids no token has. The file holds one record per id below N, and llm.c's reader asserts every record
is non-empty (``tokenizer.h``: ``assert(length > 0)``), so a vocabulary with gaps (cl100k_base: 100256
and 100261-100275 between its ranks and its specials; o200k_base, deepseek_v3 likewise) cannot leave
them out or write them empty. llm.c itself has no answer: its ``write_tokenizer`` (``train_gpt2.py``)
writes ``enc.decode_bytes([i])`` for every ``i`` up to ``max_token_value``, which tiktoken refuses for
cl100k_base's 100256 (``KeyError: Invalid token for decoding``). The export writes the placeholder
:func:`unassigned_token` (``<|unassigned_100256|>``) there: llm.c reads it and prints it, tokformats'
reader decodes it to the same text, and an id that should never occur is visible where it does.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.protocol import PathLike
from ..core.protocol import Reader as BaseReader
from ..core.protocol import Writer as BaseWriter
from ..core.registry import FormatDescriptor, Probe
from ..errors import HeaderError, NoFilesError, SizeMismatchError, TokenRangeError
from ..fs.untrusted import read_file

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = [
    "Vocab",
    "Reader",
    "Writer",
    "detect",
    "export_tokenizer",
    "unassigned_token",
    "MAGIC",
    "GPT2_EOT",
    "GPT2_VOCAB_SIZE",
]

#: This format's entry in :data:`tokformats.formats` (the registry finds it here).
DESCRIPTOR = FormatDescriptor(
    "llmc-vocab", "llm.c tokenizer vocabulary (gpt2_tokenizer.bin)", (".bin",), __name__, order=10
)

MAGIC = 20240328
HEADER_BYTES = 1024
#: Version 1 files are GPT-2's vocabulary: 50,257 tokens, end-of-text 50,256.
GPT2_VOCAB_SIZE = 50257
GPT2_EOT = 50256
_MAX_TOKEN_BYTES = 255


def unassigned_token(token_id: int) -> bytes:
    """The record written for an id no token has (see the module's notes): ``<|unassigned_ID|>`` in ASCII."""
    return f"<|unassigned_{token_id}|>".encode("ascii")


def detect(probe: Probe) -> bool:
    """True for a file starting with the vocabulary magic and version 1 or 2."""
    head = probe.head(8)
    if len(head) < 8:
        return False
    magic, version = (int(v) for v in np.frombuffer(head, dtype="<u4"))
    return magic == MAGIC and version in (1, 2)


def _check_token(token_id: int, data: bytes) -> None:
    if not 1 <= len(data) <= _MAX_TOKEN_BYTES:
        raise TokenRangeError(
            f"token {token_id} has {len(data)} bytes; an llm.c vocabulary record holds 1 to 255 bytes."
        )


def _header(version: int, count: int, eot_token: int) -> bytes:
    header = np.zeros(HEADER_BYTES // 4, dtype="<u4")
    header[:3] = MAGIC, version, count
    if version == 2:
        header[3] = eot_token
    return header.tobytes()


def _check_version(version: int, count: int, eot_token: int | None, where: str) -> int:
    """Validate the version/size/end-of-text combination; return the end-of-text id to store."""
    if version == 1:
        if count != GPT2_VOCAB_SIZE or eot_token not in (None, GPT2_EOT):
            raise HeaderError(
                f"{where}: version 1 is GPT-2's vocabulary ({GPT2_VOCAB_SIZE:,} tokens, end-of-text {GPT2_EOT}); "
                f"found {count:,} tokens and end-of-text {eot_token}. Write version 2."
            )
        return GPT2_EOT
    if version != 2:
        raise HeaderError(f"{where}: version must be 1 or 2, not {version}.")
    if eot_token is None:
        raise HeaderError(f"{where}: version 2 needs the end-of-text id (eot_token=).")
    if not 0 <= eot_token < count:
        raise HeaderError(f"{where}: the end-of-text id {eot_token} is not below the vocabulary size {count:,}.")
    return eot_token


class Vocab(BaseReader[bytes]):
    """An llm.c vocabulary: ``len(v)`` tokens, ``v[i]`` the raw bytes of token ``i``.

    Open a file with ``tokformats.open(path)`` or ``Vocab(path)``; build one from a ``tokenizers``
    tokenizer with :meth:`from_tokenizer`; write it with :meth:`save`.
    """

    format = "llmc-vocab"

    def __init__(self, path: PathLike) -> None:
        super().__init__(path)
        self._path: Path | None = Path(path)
        tokens, self.version, self.eot_token = self._parse(self._path)
        self._set_tokens(tokens)

    @classmethod
    def from_tokens(cls, tokens: Sequence[bytes], eot_token: int, *, version: int = 2) -> Vocab:
        """A vocabulary in memory from each token's bytes."""
        vocab = cls.__new__(cls)
        BaseReader.__init__(vocab)
        for token_id, data in enumerate(tokens):
            _check_token(token_id, data)
        vocab._path = None
        vocab.version = version
        vocab.eot_token = _check_version(version, len(tokens), eot_token, "vocabulary")
        vocab._set_tokens(list(tokens))
        return vocab

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, *, eot_token: int | str | None = None, version: int = 2) -> Vocab:
        """Export a ``tokenizers`` tokenizer (object, ``tokenizer.json`` or its folder).

        Byte-level BPE and SentencePiece-style vocabularies are supported (a name such as ``"cl100k_base"``
        too). The end-of-text id is ``eot_token`` (an id or a token string) or else the tokenizer's
        ``<|endoftext|>``. An id no token has gets :func:`unassigned_token`.
        """
        from ..core.vocab import end_of_text_id, load_tokenizer, token_bytes

        loaded = load_tokenizer(tokenizer)
        tokens = token_bytes(loaded, unassigned=unassigned_token)
        return cls.from_tokens(tokens, end_of_text_id(loaded, eot_token), version=version)

    def __reduce__(self) -> tuple[Any, ...]:
        if self._path is None:
            return (Vocab.from_tokens, (self._tokens, self.eot_token), {"version": self.version})
        return super().__reduce__()

    @staticmethod
    def _parse(path: Path) -> tuple[list[bytes], int, int]:
        try:
            data = read_file(path)
        except FileNotFoundError:
            raise NoFilesError(f"{path} does not exist.") from None
        if len(data) < HEADER_BYTES:
            raise SizeMismatchError(
                f"{path}: an llm.c vocabulary starts with a {HEADER_BYTES}-byte header; "
                f"the file has {len(data):,} bytes."
            )
        magic, version, count, eot = (int(v) for v in np.frombuffer(data, dtype="<u4", count=4))
        if magic != MAGIC:
            raise HeaderError(f"{path}: header field 'magic' is {magic}; an llm.c vocabulary has {MAGIC}.")
        if version not in (1, 2):
            raise HeaderError(f"{path}: header field 'version' is {version}; llm.c writes 1 or 2.")
        eot_token = _check_version(version, count, eot if version == 2 else None, str(path))
        # Each record needs at least 2 bytes: refuse a lying N before looping over it.
        if HEADER_BYTES + 2 * count > len(data):
            raise SizeMismatchError(
                f"{path}: header field 'N' says {count:,} tokens, which need at least {HEADER_BYTES + 2 * count:,} "
                f"bytes; the file has {len(data):,}."
            )
        tokens = []
        position = HEADER_BYTES
        for token_id in range(count):
            if position >= len(data):
                raise SizeMismatchError(f"{path}: the file ends before the record of token {token_id} of {count:,}.")
            length = data[position]
            if length == 0:
                raise HeaderError(f"{path}: token {token_id} has a record length of 0 (at byte {position:,}).")
            end = position + 1 + length
            if end > len(data):
                raise SizeMismatchError(
                    f"{path}: the record of token {token_id} needs {length} bytes at byte {position + 1:,}, "
                    f"past the end of the file ({len(data):,} bytes)."
                )
            tokens.append(data[position + 1 : end])
            position = end
        if position != len(data):
            raise SizeMismatchError(f"{path}: {len(data) - position:,} bytes follow the last of the {count:,} records.")
        return tokens, version, eot_token

    def _set_tokens(self, tokens: list[bytes]) -> None:
        self._tokens = tokens
        sizes = np.fromiter((len(t) for t in tokens), dtype=np.int64, count=len(tokens))
        self._sizes = sizes
        self._starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self._blob = np.frombuffer(b"".join(tokens), dtype=np.uint8)

    # -- the protocol ------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._tokens)

    def _item(self, index: int) -> bytes:
        return self._tokens[index]

    @property
    def path(self) -> Path:
        return self._path if self._path is not None else Path("<memory>")

    @property
    def files(self) -> list[Path]:
        return [] if self._path is None else [self._path]

    @property
    def metadata(self) -> dict[str, Any]:
        return {"magic": MAGIC, "version": self.version, "vocab_size": len(self), "eot_token": self.eot_token}

    @property
    def tokens(self) -> list[bytes]:
        """Every token's bytes, in id order."""
        return list(self._tokens)

    def _summary(self) -> dict[str, Any]:
        return {"format": self.format, "path": str(self.path), "tokens": len(self), "eot_token": self.eot_token}

    def _preview(self) -> str | None:
        return repr(self._tokens[:16]) if self._tokens else None

    # -- decoding ------------------------------------------------------------------------------
    def decode_bytes(self, ids: npt.ArrayLike) -> bytes:
        """The concatenated raw bytes of ``ids`` (vectorised: no Python loop per token)."""
        array = np.asarray(ids)
        if array.size == 0:
            return b""
        if array.dtype.kind not in "iu":
            raise TokenRangeError(f"token ids must be integers, found {array.dtype}.")
        array = array.ravel().astype(np.int64, copy=False)
        bad = (array < 0) | (array >= len(self))
        if bad.any():
            value = int(array[np.argmax(bad)])
            raise TokenRangeError(f"token id {value} is not in this vocabulary of {len(self):,} tokens.")
        sizes = self._sizes[array]
        total = int(sizes.sum())
        # Position of every output byte in the blob: its token's start plus its offset in the token.
        ends = np.cumsum(sizes)
        positions = np.arange(total, dtype=np.int64) - np.repeat(ends - sizes - self._starts[array], sizes)
        joined: bytes = self._blob[positions].tobytes()
        return joined

    def decode(self, ids: npt.ArrayLike) -> str:
        """The text of ``ids``: their bytes decoded as UTF-8 with replacement characters."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def save(self, path: PathLike, *, version: int | None = None, overwrite: bool = False) -> Path:
        """Write this vocabulary as llm.c's ``write_tokenizer`` would (version 2 unless told)."""
        with Writer(path, eot_token=self.eot_token, version=version or self.version, overwrite=overwrite) as writer:
            for token in self._tokens:
                writer.write(token)
        return writer.written[0]


Reader = Vocab  # the registry looks for ``Reader``


def export_tokenizer(tokenizer: Any, path: PathLike, *, overwrite: bool = False) -> Path:
    """Write ``tokenizer``'s vocabulary as llm.c's ``gpt2_tokenizer.bin`` (the hook ``tokformats.api.export_tokenizer``
    and ``tokformats train-tokenizer --export llmc-vocab=PATH`` use)."""
    return Vocab.from_tokenizer(tokenizer).save(path, overwrite=overwrite)


class Writer(BaseWriter[bytes]):
    """Writes an llm.c vocabulary, one token's bytes per ``write``, in id order.

    Args:
        path: the output file (``gpt2_tokenizer.bin``).
        eot_token: the end-of-text id (required for version 2; version 1 implies 50,256).
        version: 2 (default) or 1 (GPT-2's 50,257 tokens only).
        overwrite: replace an existing file.
    """

    format = "llmc-vocab"

    def __init__(
        self, path: PathLike, *, eot_token: int | None = None, version: int = 2, overwrite: bool = False
    ) -> None:
        super().__init__(path, overwrite=overwrite)
        if version not in (1, 2):
            raise HeaderError(f"{self.path}: version must be 1 or 2, not {version}.")
        self.version = version
        self.eot_token = eot_token
        self._records = bytearray()
        self._count = 0
        self._handle = self._files.create(self.path)

    def write(self, item: bytes | str) -> None:
        """Append the next token's bytes (a ``str`` is written as UTF-8)."""
        self._check_open()
        data = item.encode("utf-8") if isinstance(item, str) else bytes(item)
        _check_token(self._count, data)
        self._records.append(len(data))
        self._records += data
        self._count += 1

    def _finish(self) -> None:
        eot = _check_version(self.version, self._count, self.eot_token, str(self.path))
        self._handle.write(_header(self.version, self._count, eot))
        self._handle.write(self._records)
