"""Named vocabularies offline: ``tokenizer="cl100k_base"`` (``"o200k_base"``, ``"llama3"``, ``"deepseek_v3"``, a
``.tiktoken`` file).

A named vocabulary is rebuilt, exactly, as a ``tokenizers.Tokenizer`` from the merge ranks a package ships, so that
everything downstream (the identity gate, the engines, ``head``/``stats`` decoding, a resumable run's tokenizer
hash) treats it like any ``tokenizer.json``:

- the model is a byte-level BPE whose vocabulary is the ranks (each token's bytes through GPT-2's byte/character
  table), whose merges are every split of a token into two lower-ranked tokens, ordered by the token's rank (so BPE
  merges the pair whose result has the lowest rank, as tiktoken does), with ``ignore_merges`` (a piece that is
  itself a token is that token, as in tiktoken);
- the pre-tokenizer is the vocabulary's split regex (``Split``, isolated), then the byte-level mapping;
- the special tokens are vocabulary entries spelled as themselves, *not* added tokens: text that spells
  ``<|endoftext|>`` is encoded as text, like tiktoken's ``encode_ordinary``. ``tokenize`` adds the end-of-document
  id itself. To have specials spelled in the text read as specials, ask for them:
  ``tokenizer.add_special_tokens(["<|endoftext|>"])`` (the id stays the same).

Where the ranks come from:

- names (:data:`VOCABULARIES`) come from ``splintr`` (``pip install 'tokformats[vocab]'``), whose wheel bundles them:
  the ranks are read back with ``decode_token_bytes``, the specials with ``special_tokens()``. splintr adds "agent
  tokens" to each (cl100k_base: 54 at 100277-100330, ``<|im_start|>`` = 100280), kept as decodable specials; the
  vocabulary size is the largest id plus one (cl100k_base: 100,331; ids 100256 and 100261-100275 are unassigned,
  as in tiktoken).
- ``llama3``: Meta's 128,000 ranks and all 256 of Llama 3's specials at 128000-128255: the 11 splintr ships
  (``<|begin_of_text|>`` 128000 ... ``<|python_tag|>`` 128010, with splintr's ``<|step_id|>`` at 128005) and the
  245 it leaves out, :data:`LLAMA3_RESERVED` (``<|reserved_special_token_3|>`` 128011 ...
  ``<|reserved_special_token_247|>`` 128255, Llama 3.1's names); then splintr's multimodal tokens
  128256-128261 and agent tokens 128300-128353. Ids 128262-128299 and 128342-128347 are unassigned; vocabulary
  size 128,354.
- ``deepseek_v3`` (alias ``deepseek-v3``): DeepSeek-V3's 127,997 byte-level ranks (ids 3-127999) under its own
  three splits (digits in runs of up to 3, runs of CJK/kana, then its word regex, as its ``tokenizer.json`` has
  them); specials ``<｜begin▁of▁sentence｜>`` 0, ``<｜end▁of▁sentence｜>`` 1 (the end of document), ``<｜▁pad▁｜>`` 2,
  ``<think>`` 128798 and ``</think>`` 128799 (R1's names; V3's file calls them placeholders 798 and 799), FIM,
  chat and tool markers 128800-128814 (``<|EOT|>`` 128805) and splintr's 54 agent tokens 128900-128953; ids
  128000-128797 (DeepSeek's unused placeholders) and 128815-128899 are unassigned. Vocabulary size 128,954.
- every other vocabulary splintr 0.22 bundles (:data:`REFUSED`) is refused by name with the reason and what to
  pass instead: the SentencePiece ones are not byte-level ranks, and for the byte-level ones no reference for
  their ids is available offline, so identity cannot be proven.
- a ``.tiktoken`` (or ``.tiktoken.gz``) rank file is recognised by its SHA-256 (cl100k_base's and o200k_base's as
  tiktoken checks them; ``bpe-openai`` ships both): it gives tiktoken's own encoding, its specials only
  (cl100k_base: 100,277 ids).
"""

# ruff: noqa: RUF001, RUF002  (DeepSeek's special tokens are spelled with fullwidth bars on purpose)
from __future__ import annotations

import base64
import gzip
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError, FormatError

if TYPE_CHECKING:
    from tokenizers import Tokenizer

__all__ = [
    "VOCABULARIES",
    "ALIASES",
    "REFUSED",
    "LLAMA3_RESERVED",
    "TIKTOKEN_FILES",
    "VocabularySpec",
    "is_vocabulary_name",
    "load_vocabulary",
    "read_tiktoken_ranks",
    "tokenizer_from_ranks",
    "merges_from_ranks",
]

#: cl100k_base's split, as tiktoken wrote it before possessive quantifiers (the same matches; Oniguruma reads it).
CL100K_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
#: o200k_base's split, as tiktoken's ``openai_public`` writes it.
O200K_PATTERN = "|".join(
    [
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]
)


#: DeepSeek-V3's pre-tokenizer: three ``Split`` regexes applied in turn, as its ``tokenizer.json`` lists them.
DEEPSEEK_V3_SPLITS = (
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
)

#: One split regex, or several applied in turn (each piece of one split is split again by the next).
Pattern = str | tuple[str, ...]


#: Llama 3's reserved specials splintr 0.22 leaves out (it ships 128000-128010 only): ids 128011-128255, named as
#: Llama 3.1's ``tokenizer.json`` names them (the tests check them against llama3-tokenizer-js's list),
#: ``<|reserved_special_token_3|>`` 128011 to ``<|reserved_special_token_247|>`` 128255. The numbering counts on
#: from 128005's ``<|reserved_special_token_2|>``, which splintr calls ``<|step_id|>`` (Llama 3.2-Vision's name, its
#: docs say); splintr's name is kept.
LLAMA3_RESERVED: dict[str, int] = {f"<|reserved_special_token_{i - 128008}|>": i for i in range(128011, 128256)}


@dataclass(frozen=True)
class VocabularySpec:
    """A named vocabulary: splintr's name for it, its split regex (or regexes, applied in turn), what it is, and the
    model's specials splintr does not ship (added at their ids)."""

    splintr_name: str
    pattern: Pattern
    description: str
    more_specials: Mapping[str, int] = field(default_factory=dict)


#: The names ``tokenizer=`` accepts (CLI ``-t NAME``).
VOCABULARIES: dict[str, VocabularySpec] = {
    "cl100k_base": VocabularySpec(
        "cl100k_base", CL100K_PATTERN, "GPT-4 / GPT-3.5: tiktoken's 100,256 ranks, <|endoftext|> 100257, FIM "
        "100258-100260, <|endofprompt|> 100276, splintr's 54 agent tokens 100277-100330 (<|im_start|> 100280)"
    ),
    "o200k_base": VocabularySpec(
        "o200k_base", O200K_PATTERN, "GPT-4o: tiktoken's 199,998 ranks, <|endoftext|> 199999, <|endofprompt|> "
        "200018, splintr's 54 agent tokens 200019-200072"
    ),
    "llama3": VocabularySpec(
        "llama3", CL100K_PATTERN, "Llama 3 / 3.1-3.3: Meta's 128,000 tiktoken ranks under cl100k's split, Meta's "
        "256 specials 128000-128255 (<|begin_of_text|> 128000, <|end_of_text|> 128001, <|eot_id|> 128009, "
        "<|reserved_special_token_247|> 128255), splintr's multimodal tokens 128256-128261 and 54 agent tokens "
        "128300-128353", LLAMA3_RESERVED,
    ),
    "deepseek_v3": VocabularySpec(
        "deepseek_v3", DEEPSEEK_V3_SPLITS, "DeepSeek-V3 / R1: 127,997 ranks (ids 3-127999) under DeepSeek's three "
        "splits, <｜begin▁of▁sentence｜> 0, <｜end▁of▁sentence｜> 1, <｜▁pad▁｜> 2, <think> 128798, </think> 128799, "
        "FIM/chat/tool markers 128800-128814, splintr's 54 agent tokens 128900-128953; 128000-128797 unassigned"
    ),
}

#: Other spellings splintr accepts for the same vocabulary (the same ranks and specials) -> the name above.
ALIASES: dict[str, str] = {
    "deepseek-v3": "deepseek_v3",
    "llama3.1": "llama3",
    "llama3.2": "llama3",
    "llama3.3": "llama3",
}

_SENTENCEPIECE = (
    "a SentencePiece vocabulary in splintr, not byte-level ranks: tokformats rebuilds only byte-level BPE ranks, "
    "and no reference here proves splintr's pieces equal the model's own tokenizer"
)
_NO_REFERENCE = (
    "byte-level ranks in splintr, but no reference for its ids (the model's own tokenizer.json or tiktoken rank "
    "file) is shipped by a package here, so tokformats cannot prove its ids identical to the model's"
)
#: The vocabularies splintr 0.22 bundles that tokformats does not offer by name, and why.
REFUSED: dict[str, str] = {
    **dict.fromkeys(
        ("llama2", "llama-2", "tinyllama", "vicuna", "codellama", "code_llama", "code-llama", "mistral_v1",
         "mistral_v2", "gemma2", "gemma3"),
        _SENTENCEPIECE,
    ),
    **dict.fromkeys(
        ("qwen3", "qwen", "qwen2", "qwen2.5", "baichuan_m2", "glm4", "glm", "glm-4", "glm4.5", "glm-4.5", "gpt-oss",
         "gpt_oss", "o200k_harmony", "kimi", "kimi_k2", "kimi_k3", "phi4", "phi-4", "olmo2", "olmo-2", "modernbert",
         "modern-bert", "mistral_v3", "whisper", "whisper_v1", "whisper_v2", "whisper_v3", "gemma4"),
        _NO_REFERENCE,
    ),
}

#: SHA-256 of the rank files tiktoken knows (as ``tiktoken_ext.openai_public`` checks them) -> their encoding.
TIKTOKEN_FILES: dict[str, tuple[str, str, dict[str, int]]] = {
    "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7": (
        "cl100k_base",
        CL100K_PATTERN,
        {
            "<|endoftext|>": 100257,
            "<|fim_prefix|>": 100258,
            "<|fim_middle|>": 100259,
            "<|fim_suffix|>": 100260,
            "<|endofprompt|>": 100276,
        },
    ),
    "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d": (
        "o200k_base",
        O200K_PATTERN,
        {"<|endoftext|>": 199999, "<|endofprompt|>": 200018},
    ),
}

_MAX_RANK_FILE = 64 << 20  # bytes; cl100k's is 1.7 MB, o200k's 3.6 MB


def is_vocabulary_name(value: object) -> bool:
    """Whether ``value`` names a vocabulary (:data:`VOCABULARIES`) or a ``.tiktoken`` rank file."""
    if isinstance(value, str) and (value in VOCABULARIES or value in ALIASES or value in REFUSED):
        return True
    name = str(value).lower() if isinstance(value, (str, Path)) else ""
    return name.endswith((".tiktoken", ".tiktoken.gz"))


def read_tiktoken_ranks(path: str | Path) -> tuple[dict[bytes, int], str]:
    """The ranks of a ``.tiktoken`` file (``.gz`` too) and the SHA-256 of its uncompressed bytes.

    Every line must be ``BASE64 RANK``; the tokens and the ranks must be unique.
    """
    path = Path(path)
    if not path.is_file():
        raise FormatError(f"{path} does not exist; pass a vocabulary name ({', '.join(VOCABULARIES)}) or a rank file.")
    if path.stat().st_size > _MAX_RANK_FILE:
        raise FormatError(f"{path} has {path.stat().st_size:,} bytes; a rank file has at most {_MAX_RANK_FILE:,}.")
    data = path.read_bytes()
    if path.name.lower().endswith(".gz"):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise FormatError(f"{path} is not a gzip file ({exc}).") from None
    ranks: dict[bytes, int] = {}
    seen: set[int] = set()
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            token_text, rank_text = line.split()
            token, rank = base64.b64decode(token_text, validate=True), int(rank_text)
        except ValueError:
            raise FormatError(f"{path}, line {number}: expected 'BASE64 RANK', found {line[:60]!r}.") from None
        if token in ranks or rank in seen or rank < 0:
            raise FormatError(f"{path}, line {number}: the token or rank {rank} appears twice (or is negative).")
        ranks[token] = rank
        seen.add(rank)
    return ranks, hashlib.sha256(data).hexdigest()


def merges_from_ranks(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """BPE merges equivalent to tiktoken's rank order: for each token, each split into two tokens of lower rank,
    ordered by the token's rank (then by the parts' ranks)."""
    merges: list[tuple[int, int, int, bytes, bytes]] = []
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            left_rank, right_rank = ranks.get(left), ranks.get(right)
            if left_rank is not None and right_rank is not None and left_rank < rank and right_rank < rank:
                merges.append((rank, left_rank, right_rank, left, right))
    merges.sort()
    return [(left, right) for _, _, _, left, right in merges]


def tokenizer_from_ranks(ranks: dict[bytes, int], pattern: Pattern, special_tokens: dict[str, int]) -> Tokenizer:
    """A byte-level BPE ``tokenizers.Tokenizer`` giving tiktoken's ``encode_ordinary`` ids for these ranks, split
    regex (or regexes, applied in turn) and specials (see the module's notes)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    from .byte_level import bytes_to_unicode

    # Each byte's printable stand-in, applied by str.translate to the token read as latin-1 (one char per byte): C
    # speed for the ~100,000 tokens and their merges, where a join per token took half a second.
    table = str.maketrans({chr(b): char for b, char in bytes_to_unicode().items()})

    def characters(token: bytes) -> str:
        return token.decode("latin-1").translate(table)

    vocab = {characters(token): rank for token, rank in ranks.items()}
    taken = set(vocab.values())
    for text, token_id in special_tokens.items():
        if text in vocab or token_id in taken:
            raise ConfigError(f"the special token {text!r} ({token_id}) collides with a ranked token.")
        vocab[text] = token_id
        taken.add(token_id)
    merges = [(characters(a), characters(b)) for a, b in merges_from_ranks(ranks)]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=True))
    splits = (pattern,) if isinstance(pattern, str) else pattern
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            *(pre_tokenizers.Split(Regex(split), behavior="isolated") for split in splits),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _splintr_ranks(name: str) -> tuple[dict[bytes, int], dict[str, int]]:
    """The ranks and specials of splintr's bundled vocabulary ``name``."""
    try:
        import splintr
    except ImportError:
        raise ConfigError(
            f"the vocabulary {name!r} ships with splintr, which is not installed: pip install 'tokformats[vocab]'."
        ) from None
    bundled = splintr.Tokenizer.from_pretrained(name)
    specials = {str(k): int(v) for k, v in bundled.special_tokens().items()}
    special_ids = set(specials.values())
    ranks: dict[bytes, int] = {}
    for token_id in range(splintr.base_vocab_size(name)):
        if token_id in special_ids:
            continue
        try:
            ranks[bundled.decode_token_bytes(token_id)] = token_id
        except ValueError:  # an unassigned id (cl100k_base's 100256, deepseek_v3's 128000-128797)
            continue
    return ranks, specials


def _with_more_specials(name: str, shipped: dict[str, int], more: Mapping[str, int]) -> dict[str, int]:
    """splintr's specials for ``name`` and the model's own that splintr leaves out. A name both hold at other ids, or
    an id both give other names, means splintr changed what it ships and the table here must be checked again; the
    same name at the same id (a splintr that ships them too) is taken as it is."""
    names_at = {i: n for n, i in shipped.items()}
    clashes = sorted(n for n, i in more.items() if (n in shipped and shipped[n] != i) or names_at.get(i, n) != n)
    if clashes:
        raise ConfigError(
            f"the vocabulary {name!r}: splintr now ships {', '.join(clashes[:5])}, which tokformats adds itself; "
            "check tokformats.core.vocabularies against this splintr version."
        )
    return {**shipped, **more}


#: A named vocabulary's tokenizer as just built by :func:`_named`, handed out by the first :func:`load_vocabulary`
#: (taken, never shared: a caller may change its tokenizer); later loads parse the cached json (0.35 s for cl100k).
_FRESH: dict[str, Tokenizer] = {}


@lru_cache(maxsize=4)
def _named(name: str) -> str:
    spec = VOCABULARIES[name]
    ranks, specials = _splintr_ranks(spec.splintr_name)
    built = tokenizer_from_ranks(ranks, spec.pattern, _with_more_specials(name, specials, spec.more_specials))
    _FRESH[name] = built
    return str(built.to_str())


@lru_cache(maxsize=4)
def _rank_file(path: str, modified: float) -> str:
    ranks, digest = read_tiktoken_ranks(path)
    known = TIKTOKEN_FILES.get(digest)
    if known is None:
        names = ", ".join(f"{v[0]} ({k[:12]}...)" for k, v in TIKTOKEN_FILES.items())
        raise ConfigError(
            f"{path}: SHA-256 {digest} is not a rank file tokformats knows the split regex of (expected one of "
            f"{names}); build it with tokformats.core.vocabularies.tokenizer_from_ranks(ranks, pattern, "
            "specials)."
        )
    _, pattern, specials = known
    return str(tokenizer_from_ranks(ranks, pattern, specials).to_str())


def load_vocabulary(value: str | Path) -> Tokenizer:
    """The ``tokenizers.Tokenizer`` of a vocabulary name (:data:`VOCABULARIES`, :data:`ALIASES`) or a ``.tiktoken``
    rank file; a name in :data:`REFUSED` raises :class:`ConfigError` saying why and what to pass instead.

    Built once per process (a second load parses the cached ``tokenizer.json``); offline.
    """
    from tokenizers import Tokenizer

    if isinstance(value, str) and value in ALIASES:
        value = ALIASES[value]
    if isinstance(value, str) and value in VOCABULARIES:
        text = _named(value)
        fresh = _FRESH.pop(value, None)  # the object that text was serialised from: the same tokenizer, unparsed
        return fresh if fresh is not None else Tokenizer.from_str(text)
    if isinstance(value, str) and value in REFUSED:
        raise ConfigError(
            f"tokenizer={value!r}: splintr ships this vocabulary but tokformats does not offer it by name: "
            f"{REFUSED[value]}. Pass the model's own tokenizer.json instead (tokenizer='path/to/tokenizer.json', "
            f"CLI -t path/to/tokenizer.json); named vocabularies are {', '.join(VOCABULARIES)}."
        )
    path = Path(value)
    if not path.is_file():
        raise FormatError(
            f"{path} does not exist; pass a vocabulary name ({', '.join(VOCABULARIES)}), a .tiktoken rank file, a "
            "tokenizer.json or its folder."
        )
    return Tokenizer.from_str(_rank_file(str(path.resolve()), path.stat().st_mtime))
