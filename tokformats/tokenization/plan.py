"""What decides a tokenize run's output: its :class:`Plan` (what a checkpoint records and a resume must match),
the output paths, the split each document goes to, and the checks of the run's plain options."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from .. import api
from ..core.protocol import TokenWriter
from ..core.vocab import END_OF_TEXT, vocabulary_size
from ..errors import ConfigError, FormatError, option
from .chat import schema_name
from .chat_encoding import ChatSpec
from .engines import ENGINES
from .sources import Input, check_unit
from .templates import THOUGHT, TRAIN_ON, load_template

__all__ = [
    "END_OF_DOCUMENT",
    "EOS_MODES",
    "Plan",
    "assign_splits",
    "chat_plan",
    "check_options",
    "checked_seed",
    "eos_mode",
    "make_plan",
    "output_paths",
    "split_fractions",
    "stream_name",
    "verify_budget",
]

EOS_MODES = ("append", "prepend", "none")


#: The end-of-document tokens looked up, in order, when no ``eos_id`` is given (GPT's and tiktoken's, Llama 3's,
#: DeepSeek's).
END_OF_DOCUMENT = (END_OF_TEXT, "<|end_of_text|>", "<\uff5cend\u2581of\u2581sentence\uff5c>")


def split_fractions(split: Any) -> dict[str, float] | None:
    """``{"train": 0.8, ...}``, ``"8:1:1"`` or ``"0.9,0.1"`` (train, val[, test]) or None; fractions normalised
    to sum to 1."""
    if split is None:
        return None
    example = option("split", repr("8:1:1"))
    if isinstance(split, str):
        try:
            parts = [float(p) for p in re.split(r"[:,]", split.strip())]
        except ValueError:
            raise ConfigError(f"split {split!r} is not ratios separated by ':' or ',', e.g. {example}.") from None
        if len(parts) > 3:
            raise ConfigError(
                f"split {split!r} has {len(parts)} ratios; give up to three (train, val, test): {example}."
            )
        split = dict(zip(["train", "val", "test"], parts))
    try:
        weights = {str(k): float(v) for k, v in dict(split).items()}
    except (TypeError, ValueError):
        raise ConfigError(f"split must map split names to ratios, e.g. {example}; found {split!r}.") from None
    total = sum(weights.values())
    if not weights or total <= 0 or any(v < 0 or v != v for v in weights.values()):
        raise ConfigError(f"split ratios must be non-negative and not all zero, found {weights}.")
    return {k: v / total for k, v in weights.items()}


@dataclass
class Plan:
    """Everything that decides the output; a resumed run must have the same plan."""

    inputs: list[str]
    format: str
    keys: list[str]
    eos: str
    eos_id: int | None
    split: dict[str, float] | None
    seed: int
    unit: str
    vocab_size: int
    tokenizer_hash: str
    on_error: str
    #: Chat data: the schema (or ``callable:NAME``), the template's name, train_on and thought; None for text.
    chat: str | None = None
    template: str | None = None
    train_on: str | None = None
    thought: str | None = None
    #: Record each document's source (input, record, byte offset) in a sidecar (:mod:`tokformats.core.provenance`).
    provenance: bool = True

    @property
    def splits(self) -> list[str]:
        """The split names, in order (``[""]``: no split)."""
        return list(self.split) if self.split else [""]

    @property
    def streams(self) -> list[tuple[str, str]]:
        """Every (text key, split) stream the run writes, each to spools and an output of its own."""
        return [(key, split) for key in self.keys for split in self.splits]


def stream_name(key: str, split: str) -> str:
    """The name of a (text key, split) stream's spools and output: ``text``, ``text-train``, ``all``, ..."""
    return "-".join(part for part in (key, split) if part) or "all"


def output_paths(output: Any, format: str, keys: list[str], splits: list[str]) -> dict[tuple[str, str], Path]:
    """Where each (key, split) stream is written: the format's :meth:`TokenWriter.output_path` (``OUTPUT`` plus
    ``_KEY`` when several text keys are tokenized and ``_SPLIT`` when splitting, unless the format names its files
    its own way)."""
    writer = api.corpus_writer(format)
    return {
        (key, split): writer.output_path(output, key, split or None, len(keys) > 1) for key in keys for split in splits
    }


def _mix(values: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a well-mixed 64-bit hash of each value (NumPy uint64 arithmetic wraps)."""
    z = values + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def assign_splits(seed: int, inputs: np.ndarray, positions: np.ndarray, fractions: list[float]) -> np.ndarray:
    """The split index of each record, from a hash of (seed, input, position): reproducible in any batching."""
    with np.errstate(over="ignore"):
        key = _mix(
            np.uint64(seed & 0xFFFFFFFFFFFFFFFF)
            ^ _mix(inputs.astype(np.uint64) << np.uint64(40) ^ positions.astype(np.uint64))
        )
    uniform = (key >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    edges = np.cumsum(fractions)[:-1]
    return np.searchsorted(edges, uniform, side="right")


def eos_mode(eos: str | None, writer_class: type[TokenWriter]) -> str:
    """The run's end-of-document mode: ``eos`` checked, by default the format's convention."""
    if eos is None:
        eos = "prepend" if writer_class.boundaries == "bos" else "append"
    if eos not in EOS_MODES:
        raise ConfigError(f"eos must be one of {', '.join(EOS_MODES)}; found {option('eos', repr(eos))}.")
    return eos


def check_options(*, output: Any, engine: str, on_error: str, verify_fraction: float, unit: str, seed: Any) -> None:
    """Refuse a run's plain options before anything starts (before its work folder exists): the engine's name too,
    since a parallel run's parent gates nothing."""
    if isinstance(output, str) and output.endswith(("/", os.sep)):  # a Path drops the slash: a prefix already
        raise ConfigError(
            f"output takes a path prefix, not a folder: found {option('output', repr(output))}; name the files inside "
            f"it, e.g. {option('output', repr(output + 'corpus'))} (a prefix beside it writes beside the folder)."
        )
    if engine not in ENGINES:
        raise ConfigError(f"engine must be one of {', '.join(ENGINES)}; found {option('engine', repr(engine))}.")
    if on_error not in ("raise", "skip"):
        raise ConfigError(f"on_error must be raise or skip; found {option('on_error', repr(on_error))}.")
    if not 0 <= verify_fraction <= 1:
        raise ConfigError(
            f"verify_fraction must be between 0 and 1; found {option('verify_fraction', repr(verify_fraction))}."
        )
    check_unit(unit)
    checked_seed(seed)  # here, before the tokenizer loads and the workers start; the plan records it


def checked_seed(seed: Any) -> int:
    """``seed`` checked: an integer (a Python or NumPy one), 0 or more; it seeds the split assignment and the
    verification's draws."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"seed must be an integer, 0 or more; found {option('seed', repr(seed))}.")
    return int(seed)


def verify_budget(verify_bytes: Any) -> int | None:
    """``verify_bytes`` checked: None or a non-negative whole number of bytes."""
    if verify_bytes is None:
        return None
    if isinstance(verify_bytes, bool) or not isinstance(verify_bytes, int) or verify_bytes < 0:
        raise ConfigError(f"verify_bytes must be a number of bytes (0 or more) or None, found {verify_bytes!r}.")
    return verify_bytes


def make_plan(
    resolved: list[Input],
    loaded: Any,
    format: str,
    text_key: str | list[str],
    eos: str,
    eos_id: int | None,
    split: Any,
    seed: int,
    unit: str,
    on_error: str,
) -> tuple[Plan, str]:
    """Everything that decides the output (what a checkpoint must match to be resumed), and the tokenizer's
    ``tokenizer.json`` text that its hash is of (a parallel run's workers read it; serialised once, 0.1 s for
    cl100k)."""
    import hashlib

    if eos != "none" and eos_id is None:
        found = next((i for i in map(loaded.token_to_id, END_OF_DOCUMENT) if i is not None), None)
        if found is None:
            raise FormatError(
                f"the tokenizer has no {END_OF_TEXT!r} token; pass {option('eos_id', 'ID')} or "
                f"{option('eos', repr('none'))}."
            )
        eos_id = int(found)
    stored_eos = eos_id if eos != "none" else None
    serialised = loaded.to_str()
    if stored_eos is not None and stored_eos < 0:
        raise ConfigError(f"the end-of-text id must not be negative, found {option('eos_id', str(stored_eos))}.")
    return Plan(
        inputs=[i.name for i in resolved],
        format=format,
        keys=[text_key] if isinstance(text_key, str) else list(text_key),
        eos=eos,
        eos_id=eos_id if eos != "none" else None,
        split=split_fractions(split),
        seed=int(seed),  # checked by check_options
        unit=unit,
        # Every id stored: the tokenizer's, and an end-of-text id given beyond them (cl100k's 100257 with a
        # smaller tokenizer), so that the spools and the writer's dtype hold it from the start.
        vocab_size=max(vocabulary_size(loaded), 0 if stored_eos is None else stored_eos + 1),
        tokenizer_hash=hashlib.sha256(serialised.encode("utf-8")).hexdigest(),
        on_error=on_error,
    ), serialised


def chat_plan(
    plan: Plan,
    writer_class: type[TokenWriter],
    chat: Any,
    template: str,
    train_on: str,
    thought: str,
    tokenizer_source: Any,
    loaded: Any,
) -> tuple[Plan, ChatSpec | None]:
    """The plan of a chat run (its schema, template and masking recorded, so a resume must match) and what every
    partition needs to encode conversations; a text run's (``chat`` None) as it is, and None."""
    if chat is None:
        return plan, None
    if train_on not in TRAIN_ON:
        raise ConfigError(f"train_on must be one of {', '.join(TRAIN_ON)}; found {train_on!r}.")
    if thought not in THOUGHT:
        raise ConfigError(f"thought must be one of {', '.join(THOUGHT)}; found {thought!r}.")
    if len(plan.keys) > 1:
        raise ConfigError(
            f"chat data is read whole from each record; text_key names {plan.keys}, which chat= does not use. "
            "Leave text_key out."
        )
    if not writer_class.stores_loss_mask:
        from ..core.protocol import loss_mask_formats

        raise ConfigError(
            f"chat data is stored with its loss masks, and the {writer_class.format} format stores none; use one of "
            f"{loss_mask_formats()}."
        )
    chosen = load_template(template, tokenizer_source, loaded)
    recorded = replace(plan, chat=schema_name(chat), template=chosen.name, train_on=train_on, thought=thought)
    return recorded, ChatSpec(chat, chosen, train_on, thought)
