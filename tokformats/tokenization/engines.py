"""Encoding engines for ``tokenize``: HF ``tokenizers`` (the reference) and faster engines proven to give its ids.

An engine turns a batch of texts into one flat id array plus per-text lengths, the shape the writers take; no
per-document Python list is built. ``fastokens`` and ``splintr`` (Rust BPE engines, ``pip install tokformats[fast]``)
encode byte-level BPE tokenizers many times faster than ``encode_batch_fast``, but speed without identity is
worthless here, so they run only behind the *identity gate*: before a run, a built-in adversarial set (scripts,
emoji, ZWJ sequences, combining marks, whitespace runs, contractions after tabs, the tokenizer's own added and
special tokens, replaced surrogates, very long words, empty strings) is encoded by both engines; then the run's
first batch, and a random ``verify_fraction`` of later batches, are encoded by ``tokenizers`` too and compared. A
difference before the run falls back to ``tokenizers`` (``engine="auto"``) or refuses (an engine asked for by
name); during the run it stops with :class:`EngineMismatchError` naming the document. Either way the output is
what ``tokenizers`` gives, so a run can resume after switching engines.

Chat message text is encoded with ``split_special=True``: special tokens spelled in it are encoded as the text
they are, never as the special id (``tokenizers``' ``encode_special_tokens``, fastokens' ``split_special_tokens``).
The gate checks both ways of encoding (``select_engine(..., chat=False)``, a plain-text run: the first only).

``engine="auto"`` *measures* every installed fast engine on the same calibration text (:func:`calibration_texts`,
the engines taking turns) and gates them fastest first: the first that passes runs, and the slower ones are not
gated; the reason names the measured rates. ``tokenize`` keeps the result per tokenizer (by its SHA-256) in the
process, so the gate and the engines' loading are paid once per process, not once per run or partition.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from ..errors import ConfigError

__all__ = [
    "ENGINES",
    "Engine",
    "TokenizersEngine",
    "FastokensEngine",
    "SplintrEngine",
    "EngineError",
    "EngineMismatchError",
    "adversarial_texts",
    "first_difference",
    "differing_text",
    "select_engine",
    "ReferenceIds",
    "calibration_texts",
    "encoded",
    "limit_threads",
    "size_fastokens_pool",
    "unset_environment",
]

#: The values of ``tokenize(engine=...)``.
ENGINES = ("auto", "tokenizers", "fastokens", "splintr")
#: The engines ``auto`` considers, each behind the identity gate.
FAST_ENGINES = ("fastokens", "splintr")


class EngineError(ConfigError):
    """An engine asked for cannot run: not installed, or it refuses the tokenizer."""


class EngineMismatchError(EngineError):
    """An engine gave other ids than ``tokenizers`` for a document."""


class Engine(ABC):
    """Encodes batches of texts to ``(flat uint32 ids, int64 lengths)``."""

    name: str = ""
    #: Whether ``encode(texts, split_special=True)`` is the engine's own work (False: it hands it to tokenizers).
    splits_specials: bool = True

    @abstractmethod
    def encode(self, texts: list[str], split_special: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """The ids of ``texts`` back to back, and how many each text has (no special tokens added). With
        ``split_special``, special tokens spelled in a text are encoded as text, never as their id."""


#: The copies of tokenizers that read special tokens spelled in text as text (chat message text), by the SHA-256 of
#: their ``to_str()``: a copy (a serialisation and a parse, tens of milliseconds) is made once per tokenizer in a
#: process, not once per run or partition. Equal ``to_str()``, equal copies: which run made it does not matter.
_SPLITTING: dict[str, Any] = {}


class TokenizersEngine(Engine):
    """HF ``tokenizers``' ``encode_batch_fast``: the reference every other engine must equal.

    Args:
        tokenizer: a ``tokenizers.Tokenizer``.
        tokenizer_hash: the SHA-256 of its ``to_str()`` when the caller knows it (its copy for ``split_special`` is
            then shared by every engine of this process on the same tokenizer).
    """

    name = "tokenizers"

    def __init__(self, tokenizer: Any, tokenizer_hash: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.tokenizer_hash = tokenizer_hash
        self._splitting: Any = None  # a copy with encode_special_tokens set, made on first use

    def _splitting_copy(self) -> Any:
        """The tokenizer's copy with ``encode_special_tokens`` set (the caller's tokenizer keeps its own setting)."""
        copy = _SPLITTING.get(self.tokenizer_hash) if self.tokenizer_hash is not None else None
        if copy is None:
            copy = type(self.tokenizer).from_str(self.tokenizer.to_str())
            copy.encode_special_tokens = True
            if self.tokenizer_hash is not None:
                if len(_SPLITTING) >= 8:  # a process tokenizing with many tokenizers keeps a few
                    _SPLITTING.clear()
                _SPLITTING[self.tokenizer_hash] = copy
        return copy

    def encode(self, texts: list[str], split_special: bool = False) -> tuple[np.ndarray, np.ndarray]:
        from itertools import chain

        tokenizer = self.tokenizer
        if split_special:
            if self._splitting is None:
                self._splitting = self._splitting_copy()
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


def limit_threads(threads: int | None, submitter: int | None = None) -> dict[str, str]:
    """In a pool worker, before its first batch: size the engines' thread pools to ``threads`` (None: leave them at
    their default, one thread per core), so that several worker processes do not each start a pool as large as the
    machine. splintr's and ``tokenizers``' pools are rayon's, which reads ``RAYON_NUM_THREADS`` when it starts (the
    process's first batch call: setting it later changes nothing; in a worker forked after the parent's engines
    ran, the pools did not survive the fork and the engines encode on the calling thread whatever is set);
    fastokens' batch threads are counted by ``FASTOKENS_BPE_THREADS`` (1: the calling thread alone); with one
    thread, ``TOKENIZERS_PARALLELISM=false`` has ``tokenizers`` encode on the calling thread. The ids do not
    depend on the threads.

    A variable already set, by the user or an earlier run, is left as it is, and what this sets stays set in the
    worker after the run (a later run in the same pool finds it; another rayon library in that worker sees it).
    ``submitter``: the id of the process that submitted the job; in that process itself (an executor that runs
    jobs where they are submitted) nothing is set, its environment being the caller's. The variables this set."""
    if threads is None or threads < 1 or os.getpid() == submitter:
        return {}
    wanted = {"RAYON_NUM_THREADS": str(threads), "FASTOKENS_BPE_THREADS": str(threads)}
    if threads == 1:
        wanted["TOKENIZERS_PARALLELISM"] = "false"
    return _set_absent(wanted)


def _set_absent(wanted: dict[str, str]) -> dict[str, str]:
    """Set the variables of ``wanted`` that the environment does not hold yet (one set already, by the user or an
    earlier run, counts); the ones set here."""
    set_here = {name: value for name, value in wanted.items() if name not in os.environ}
    os.environ.update(set_here)
    return set_here


def size_fastokens_pool(threads: int | None) -> dict[str, str]:
    """In a run encoding in this process, before its engine is loaded: have fastokens' batch threads (its pool,
    started by the process's first fastokens encode, the gate's, and kept for the process's life) counted as
    ``threads`` (``FASTOKENS_BPE_THREADS``, caller included; 1: each batch on the calling thread alone), where its
    default is one per core. Only where fastokens is not loaded yet (its pool may exist already: it is left as it
    is) and the variable is not set (by the user: theirs counts). The variables this set, to be removed by
    :func:`unset_environment` once the run's threads are done (the pool keeps its size; the environment the
    user's later processes inherit does not keep the variable). None: nothing set (fastokens' default). The ids do
    not depend on the threads."""
    if threads is None or "fastokens" in sys.modules:
        return {}
    return _set_absent({"FASTOKENS_BPE_THREADS": str(max(1, threads))})


def unset_environment(set_here: dict[str, str]) -> None:
    """Remove the variables :func:`size_fastokens_pool` set, unless something changed them since."""
    for name, value in set_here.items():
        if os.environ.get(name) == value:
            del os.environ[name]


#: Whether this process used splintr's thread pool, and whether it is a child forked after that: rayon's threads do
#: not survive a fork, and a batch call in such a child waits for them forever.
_SPLINTR_POOL = {"started": False, "lost": False}


def _after_fork_in_child() -> None:
    if _SPLINTR_POOL["started"]:
        _SPLINTR_POOL["lost"] = True


os.register_at_fork(after_in_child=_after_fork_in_child)


class SplintrEngine(Engine):
    """``splintr``'s ``encode_batch_flat`` on the tokenizer's ``tokenizer.json`` (``splintr.from_json_bytes``): the
    same flat layout as fastokens'. splintr's own bundled vocabularies read a special token spelled in the text as
    that token; loaded from the json, it keeps the file's policy, which the gate checks.

    In a process forked after splintr's thread pool started (a fork-started process pool's worker), the batch call
    would hang: there each text is encoded on the calling thread (``encode_flat``), the same ids."""

    name = "splintr"
    splits_specials = False

    def __init__(self, tokenizer_json: str, reference: TokenizersEngine | None = None) -> None:
        import splintr

        self.tokenizer = splintr.from_json_bytes(tokenizer_json.encode("utf-8"))
        self._json = tokenizer_json
        #: What encodes chat message text (``split_special``): the run's reference engine when given, so that its
        #: copy of the tokenizer is the only one built; else one built from the json on first use.
        self._splitting: TokenizersEngine | None = reference

    def encode(self, texts: list[str], split_special: bool = False) -> tuple[np.ndarray, np.ndarray]:
        if split_special:  # splintr has no way to read a spelled special as text: tokenizers' ids, the same
            if self._splitting is None:
                from tokenizers import Tokenizer

                self._splitting = TokenizersEngine(Tokenizer.from_str(self._json))
            return self._splitting.encode(texts, split_special=True)
        if _SPLINTR_POOL["lost"]:
            pieces = [self.tokenizer.encode_flat(text) for text in texts]
            lengths = np.fromiter((len(p) // 4 for p in pieces), dtype=np.int64, count=len(pieces))
            return np.frombuffer(b"".join(pieces), dtype="<u4"), lengths
        _SPLINTR_POOL["started"] = True
        ids, offsets = self.tokenizer.encode_batch_flat(texts)
        flat = np.frombuffer(ids, dtype="<u4")
        bounds = np.frombuffer(offsets, dtype="<u8").astype(np.int64)
        return flat, np.diff(bounds)


_ENGINE_CLASSES: dict[str, type[FastokensEngine] | type[SplintrEngine]] = {
    "fastokens": FastokensEngine,
    "splintr": SplintrEngine,
}


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
    # Named vocabularies keep their specials in the model's vocabulary (text spelling one stays text): check them too.
    spelled = sorted((i, t) for t, i in tokenizer.get_vocab(with_added_tokens=False).items() if _looks_special(t))
    specials += [t for _, t in spelled if t not in specials]
    for token in specials[:64]:
        texts += [token, f"before{token}after", f"{token} {token}{token}", f"\n{token}\n"]
    return texts


def _looks_special(token: str) -> bool:
    return len(token) > 4 and token[:2] in ("<|", "<｜") and token[-2:] in ("|>", "｜>")


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


@functools.lru_cache(maxsize=1)
def _calibration() -> tuple[str, ...]:
    from .sample_text import sample_texts

    return tuple(sample_texts(CALIBRATION_DOCUMENTS))


#: Documents of the sample corpus ``auto`` times the engines on (about 40 kB: a few milliseconds per engine, and
#: generated once per process).
CALIBRATION_DOCUMENTS = 200


def calibration_texts() -> list[str]:
    """The texts ``auto`` times each engine on: the package's multi-script sample corpus (about 40 kB; generated
    once per process)."""
    return list(_calibration())


def _rates(engines: list[Engine], texts: list[str], rounds: int = 7) -> dict[int, float]:
    """Each engine's best throughput on ``texts`` in MB/s (UTF-8 bytes), by ``id``: the engines take turns, round
    after round, so that a busy machine slows them alike rather than whichever ran during a burst."""
    import time

    size = sum(len(t.encode("utf-8")) for t in texts)
    best = {id(engine): float("inf") for engine in engines}
    for _ in range(rounds):
        for engine in engines:
            started = time.perf_counter()
            engine.encode(texts)
            best[id(engine)] = min(best[id(engine)], time.perf_counter() - started)
    return {key: size / max(seconds, 1e-9) / 1e6 for key, seconds in best.items()}


def _built(tokenizer_json: str, name: str, reference: TokenizersEngine) -> tuple[Engine | None, str]:
    """Engine ``name`` on the tokenizer when it is installed and accepts it; else None and the error an explicit
    request raises (its message says why)."""
    try:
        if name == "splintr":
            return SplintrEngine(tokenizer_json, reference), ""
        return _ENGINE_CLASSES[name](tokenizer_json), ""
    except ImportError:
        return None, f"engine {name!r} is not installed: pip install 'tokformats[fast]'."
    except Exception as exc:  # the engines raise their own errors for components they do not implement
        return None, f"{name} refuses this tokenizer: {exc}"


class ReferenceIds:
    """``tokenizers``' ids of the gate's texts in each way of encoding, each computed once however many engines
    are gated."""

    def __init__(self, reference: Engine, texts: list[str]) -> None:
        self.reference, self.texts = reference, texts
        self.known: dict[bool, tuple[np.ndarray, np.ndarray]] = {}

    def __call__(self, split_special: bool) -> tuple[np.ndarray, np.ndarray]:
        if split_special not in self.known:
            self.known[split_special] = encoded(self.reference, self.texts, split_special)
        return self.known[split_special]


def _gate(candidate: Engine, want: ReferenceIds, modes: tuple[bool, ...]) -> str | None:
    """Why ``candidate`` fails the identity gate on the adversarial texts (``want``: tokenizers' ids of them) in each
    way of encoding of ``modes`` (``False``: text; ``True``: chat message text, specials spelled out staying text),
    or None when it passes."""
    texts = want.texts
    for split_special in modes:
        difference = differing_text(*want(split_special), *encoded(candidate, texts, split_special))
        if difference is not None:
            shown = _describe(texts[difference])
            how = " with special tokens split as text" if split_special else ""
            return f"{candidate.name} gives other ids than tokenizers{how} for the gate's text {difference} ({shown})"
    return None


def _gated(
    tokenizer: Any, name: str, reference: TokenizersEngine, want: ReferenceIds, modes: tuple[bool, ...]
) -> tuple[Engine | None, str]:
    """Engine ``name`` on ``tokenizer`` when it is installed, accepts the tokenizer and gives the reference's ids on
    the adversarial texts (``want``), and why; else None and the error an explicit request raises (its message
    says why)."""
    candidate, refusal = _built(tokenizer.to_str(), name, reference)
    if candidate is None:
        return None, refusal
    failure = _gate(candidate, want, modes)
    if failure is not None:
        return None, failure
    return candidate, f"{name} passed the identity gate ({len(want.texts)} adversarial texts)"


def select_engine(
    tokenizer: Any, engine: str = "auto", *, chat: bool = True, tokenizer_hash: str | None = None
) -> tuple[Engine, str]:
    """The engine to encode with, and why (for the progress line and the summary).

    ``"auto"``: of the fast engines (fastokens, splintr) that are installed and pass the identity gate on
    :func:`adversarial_texts`, the one measured fastest on :func:`calibration_texts`; else tokenizers. The engines
    are timed first and gated fastest first: the first that passes runs, and the slower ones are never gated.
    ``"fastokens"`` / ``"splintr"``: the same gate, raising :class:`EngineError` when the engine is missing or
    refuses the tokenizer, :class:`EngineMismatchError` when it differs. ``"tokenizers"``: the reference, unchecked.
    ``chat=False`` (a plain-text run) gates the way text is encoded only; by default chat message text's way too,
    and ``auto`` prefers the engines that encode such text themselves (splintr hands it to tokenizers).

    With ``tokenizer_hash`` (the SHA-256 of ``tokenizer.to_str()``), what the selection found is kept on disk and
    read back by later processes (:mod:`.gate_cache`; ``TOKFORMATS_GATE_CACHE=off`` turns it off): they load the
    engine found and gate it again against ``tokenizers``' ids of the adversarial texts, without timing or loading
    the others.
    """
    if engine not in ENGINES:
        raise ConfigError(f"engine must be one of {', '.join(ENGINES)}; found {engine!r}.")
    reference = TokenizersEngine(tokenizer)
    if engine == "tokenizers":
        return reference, "asked for"
    modes = (False, True) if chat else (False,)
    from . import gate_cache

    texts = adversarial_texts(tokenizer)
    want = ReferenceIds(reference, texts)
    path = gate_cache.entry_path(tokenizer_hash, engine, modes) if tokenizer_hash else None
    texts_hash = hashlib.sha256("\x00".join(texts).encode("utf-8", "surrogatepass")).hexdigest()
    cached = gate_cache.load(path, tokenizer_hash or "", engine, modes, texts_hash) if path is not None else None
    if cached is not None:
        hit = _from_cache(tokenizer, reference, cached, want, modes, path)
        if hit is not None:
            return hit
    chosen, reason = _selected(tokenizer, engine, reference, want, modes)
    if path is not None and tokenizer_hash:
        gate_cache.save(path, tokenizer_hash, engine, modes, texts_hash, gate_cache.GateEntry(chosen.name, reason))
    return chosen, reason


def _selected(
    tokenizer: Any, engine: str, reference: TokenizersEngine, want: ReferenceIds, modes: tuple[bool, ...]
) -> tuple[Engine, str]:
    """The full selection of :func:`select_engine` (no cache): the gate on a named engine, or ``auto``'s timing
    and gating, against ``want`` (the reference's ids of the adversarial texts)."""
    if engine != "auto":
        chosen, reason = _gated(tokenizer, engine, reference, want, modes)
        if chosen is not None:
            return chosen, reason
        if " gives other ids " in reason:
            raise EngineMismatchError(f"{reason}; use engine='tokenizers'.")
        raise EngineError(reason)
    tokenizer_json = tokenizer.to_str()
    built: list[Engine] = []
    refused: list[str] = []
    for name in FAST_ENGINES:
        candidate, refusal = _built(tokenizer_json, name, reference)
        if candidate is None:
            refused.append(refusal)
        else:
            built.append(candidate)
    return _fastest_gated(built, refused, want, modes)


def _from_cache(
    tokenizer: Any, reference: TokenizersEngine, cached: Any, want: ReferenceIds, modes: tuple[bool, ...], path: Any
) -> tuple[Engine, str] | None:
    """The engine a cached selection chose, gated here against ``tokenizers``' ids of the adversarial texts
    (``want``); None when it is no longer built or fails (the caller then selects anew and rewrites the entry)."""
    if cached.engine == "tokenizers":
        return reference, f"{cached.reason} (the gate's result cached in {path})"
    candidate, _ = _built(tokenizer.to_str(), cached.engine, reference)
    if candidate is None or _gate(candidate, want, modes) is not None:
        return None
    return candidate, f"{cached.reason} (the engine chosen cached in {path}; gated again)"


def _fastest_gated(
    built: list[Engine], refused: list[str], want: ReferenceIds, modes: tuple[bool, ...]
) -> tuple[Engine, str]:
    """Of the ``built`` engines, the fastest on the calibration text that passes the gate (the rest are not gated),
    with the reason; tokenizers when none passes. When chat message text is among the ``modes``, the engines that
    split special tokens themselves come first: one that hands such text to tokenizers is no faster at it than
    tokenizers itself, however fast it is on plain text."""
    chat = True in modes
    first = [c for c in built if c.splits_specials or not chat]
    rates = _rates(first, calibration_texts()) if len(first) > 1 else {}
    ranked = sorted(first, key=lambda c: -rates.get(id(c), 0.0)) + [c for c in built if c not in first]
    for candidate in ranked:
        failure = _gate(candidate, want, modes)
        if failure is not None:
            refused.append(failure)
            continue
        reason = f"{candidate.name} passed the identity gate ({len(want.texts)} adversarial texts)"
        if rates:
            measured = ", ".join(f"{c.name} {rates[id(c)]:.0f} MB/s" for c in first)
            reason += f"; the fastest that passed (measured on the calibration text: {measured})"
        if refused:
            reason += f"; {'; '.join(refused)}"
        return candidate, reason
    return want.reference, "; ".join(refused)
