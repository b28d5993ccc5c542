"""GPT-2's byte-level alphabet: the reversible map between the 256 byte values and printable characters that
byte-level BPE vocabularies spell their tokens in."""

from __future__ import annotations

from functools import lru_cache

__all__ = ["bytes_to_unicode", "unicode_to_bytes"]


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table used by byte-level BPE."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    characters = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            characters.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, characters)))


@lru_cache(maxsize=1)
def unicode_to_bytes() -> dict[str, int]:
    """The inverse of :func:`bytes_to_unicode`: each printable character's byte value."""
    return {character: byte for byte, character in bytes_to_unicode().items()}
