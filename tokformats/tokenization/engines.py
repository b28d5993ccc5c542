"""Encoding engines for ``tokenize``: HF ``tokenizers`` (the reference) and faster engines proven to give its ids.

An engine turns a batch of texts into one flat id array plus per-text lengths, the shape the writers take; no
per-document Python list is built. ``fastokens`` (a Rust BPE engine, ``pip install tokformats[fast]``) encodes
byte-level BPE tokenizers many times faster than ``encode_batch_fast``, but speed without identity is worthless
here, so it runs only behind the *identity gate*: before a run, a built-in adversarial set (scripts, emoji, ZWJ
sequences, combining marks, whitespace runs, contractions after tabs, the tokenizer's own added and special
tokens, replaced surrogates, very long words, empty strings) is encoded by both engines; then the run's first batch,
and a random ``verify_fraction`` of later batches, are encoded by ``tokenizers`` too and compared. A difference
before the run falls back to ``tokenizers`` (``engine="auto"``) or refuses (``engine="fastokens"``); during the run
it stops with :class:`EngineMismatchError` naming the document. Either way the output is what ``tokenizers`` gives,
so a run can resume after switching engines.

Chat message text is encoded with ``split_special=True``: special tokens spelled in it are encoded as the text
they are, never as the special id (``tokenizers``' ``encode_special_tokens``, fastokens' ``split_special_tokens``).
The gate checks both ways of encoding.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from ..errors import ConfigError

__all__ = [
    "ENGINES",
    "Engine",
    "TokenizersEngine",
    "FastokensEngine",
    "EngineError",
    "EngineMismatchError",
    "adversarial_texts",
    "first_difference",
    "differing_text",
    "select_engine",
    "encoded",
]

#: The values of ``tokenize(engine=...)``.
ENGINES = ("auto", "tokenizers", "fastokens")


class EngineError(ConfigError):
    """An engine asked for cannot run: not installed, or it refuses the tokenizer."""


class EngineMismatchError(EngineError):
    """An engine gave other ids than ``tokenizers`` for a document."""


class Engine(ABC):
    """Encodes batches of texts to ``(flat uint32 ids, int64 lengths)``."""

    name: str = ""

    @abstractmethod
    def encode(self, texts: list[str], split_special: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """The ids of ``texts`` back to back, and how many each text has (no special tokens added). With
        ``split_special``, special tokens spelled in a text are encoded as text, never as their id."""


class TokenizersEngine(Engine):
    """HF ``tokenizers``' ``encode_batch_fast``: the reference every other engine must equal."""

    name = "tokenizers"

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._splitting: Any = None  # a copy with encode_special_tokens set, made on first use

    def encode(self, texts: list[str], split_special: bool = False) -> tuple[np.ndarray, np.ndarray]:
        from itertools import chain

        tokenizer = self.tokenizer
        if split_special:
            if self._splitting is None:  # a copy: the caller's tokenizer keeps its own setting
                self._splitting = type(tokenizer).from_str(tokenizer.to_str())
                self._splitting.encode_special_tokens = True
            tokenizer = self._splitting
        ids = [e.ids for e in tokenizer.encode_batch_fast(texts, add_special_tokens=False)]
        lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        flat = np.fromiter(chain.from_iterable(ids), dtype=np.uint32, count=int(lengths.sum()))
        return flat, lengths


class FastokensEngine(Engine):
    """``fastokens``' ``encode_batch_flat``: one flat little-endian uint32 buffer and uint64 offsets per batch."""

    name = "fastokens"

    def __init__(self, tokenizer_json: str) -> None:
        import fastokens

        self.tokenizer = fastokens.Tokenizer.from_json_str(tokenizer_json)

    def encode(self, texts: list[str], split_special: bool = False) -> tuple[np.ndarray, np.ndarray]:
        ids, offsets = self.tokenizer.encode_batch_flat(
            texts, add_special_tokens=False, split_special_tokens=split_special
        )
        flat = np.frombuffer(ids, dtype="<u4")
        bounds = np.frombuffer(offsets, dtype="<u8").astype(np.int64)
        return flat, np.diff(bounds)


def adversarial_texts(tokenizer: Any) -> list[str]:
    """Texts where BPE engines are known to disagree, plus the tokenizer's own added and special tokens alone,
    inside words and repeated."""
    texts = [
        "",
        " ",
        "\t\t  \n\n\r\n   \u3000 \u00a0x",
        "Hello, world! It's, we'll, they've, I'M, she'd\tdon't\t's",
        "naïve café, Ångström; ﬁ ligature, ½, ℌ𝔢𝔩𝔩𝔬, ＦＵＬＬＷＩＤＴＨ",
        "e\u0301\u0302\u0303 combining marks a\u0308\u0308\u0308, Zalgo z\u0351\u0352\u0353\u0354\u0355",
        "👩‍👩‍👧‍👦 family, 🏳️‍🌈 flag, 👍🏽 skin tone, 1️⃣ keycap, 🇯🇵 🇫🇷 flags",
        "中文分词测试，日本語のテキスト、한국어 텍스트 and ไทย ภาษา ລາວ",
        "العربية مع أرقام ١٢٣ and עברית, हिन्दी देवनागरी, தமிழ்",
        "Ελληνικά κείμενα, кириллица Ёё, Ǆǅǆ titlecase, İstanbul ı",
        "x" * 5000,
        "supercalifragilisticexpialidocious" * 40,
        "1234567890" * 50 + " 3.14159e-10 0x1F 1,000,000",
        "def f(x):\n    return {'a': [1, 2, 3]}  # comment\n\n\n\tpass\n",
        "   leading and trailing spaces   ",
        "line\u2028separator\u2029paragraph\u0085next\u000bvtab\u000cff",
        "\ufeffBOM inside \u200b zero width \u200c\u200d joiners \u2060",
        "replaced surrogate \ufffd and private use \ue000 \U000f0000",
        "mixed 👋🏻hello世界мир🌍" * 20,
        "a\u0000b nul and \u0007 bell",
    ]
    specials = [token.content for token in tokenizer.get_added_tokens_decoder().values()]
    for token in specials[:64]:
        texts += [token, f"before{token}after", f"{token} {token}{token}", f"\n{token}\n"]
    return texts


def differing_text(
    want: np.ndarray, want_lengths: np.ndarray, got: np.ndarray, got_lengths: np.ndarray
) -> int | None:
    """The index of the first text whose ids differ between two encodings of the same texts (flat ids and
    lengths each), or None."""
    if np.array_equal(want_lengths, got_lengths) and np.array_equal(want, got):
        return None
    want_ends, got_ends = np.cumsum(want_lengths), np.cumsum(got_lengths)
    for k in range(len(want_lengths)):
        a = want[want_ends[k] - want_lengths[k] : want_ends[k]]
        b = got[got_ends[k] - got_lengths[k] : got_ends[k]]
        if not np.array_equal(a, b):
            return k
    return None


def first_difference(
    reference: Engine, candidate: Engine, texts: list[str], split_special: bool = False
) -> int | None:
    """The index of the first text ``candidate`` encodes differently from ``reference``, or None."""
    return differing_text(*encoded(reference, texts, split_special), *encoded(candidate, texts, split_special))


def encoded(engine: Engine, texts: list[str], split_special: bool) -> tuple[np.ndarray, np.ndarray]:
    """``engine.encode(texts)``, asking for ``split_special`` only when set (an engine written before chat encoding
    takes the texts alone)."""
    return engine.encode(texts, True) if split_special else engine.encode(texts)


def _describe(text: str) -> str:
    return repr(text if len(text) <= 60 else text[:57] + "...")


def select_engine(tokenizer: Any, engine: str = "auto") -> tuple[Engine, str]:
    """The engine to encode with, and why (for the progress line and the summary).

    ``"auto"``: fastokens when installed and it passes the identity gate on :func:`adversarial_texts`, else
    tokenizers. ``"fastokens"``: the same gate, raising :class:`EngineError` when it is missing, refuses the
    tokenizer, or differs. ``"tokenizers"``: the reference, unchecked.
    """
    if engine not in ENGINES:
        raise ConfigError(f"engine must be one of {', '.join(ENGINES)}; found {engine!r}.")
    reference = TokenizersEngine(tokenizer)
    if engine == "tokenizers":
        return reference, "asked for"
    explicit = engine == "fastokens"
    try:
        fast = FastokensEngine(tokenizer.to_str())
    except ImportError:
        if explicit:
            raise EngineError("engine 'fastokens' is not installed: pip install 'tokformats[fast]'.") from None
        return reference, "fastokens is not installed (pip install 'tokformats[fast]')"
    except Exception as error:  # fastokens raises its own errors for components it does not implement
        if explicit:
            raise EngineError(f"fastokens refuses this tokenizer: {error}") from None
        return reference, f"fastokens refuses this tokenizer ({error})"
    texts = adversarial_texts(tokenizer)
    for split_special in (False, True):  # text, and chat message text (specials spelled out stay text)
        difference = first_difference(reference, fast, texts, split_special)
        if difference is not None:
            break
    if difference is not None:
        shown = _describe(texts[difference])
        how = " with special tokens split as text" if split_special else ""
        reason = f"fastokens gives other ids than tokenizers{how} for the gate's text {difference} ({shown})"
        if explicit:
            raise EngineMismatchError(f"{reason}; use engine='tokenizers'.")
        return reference, reason
    return fast, f"fastokens passed the identity gate ({len(texts)} adversarial texts)"
