"""The ``tokformats`` command line as a table: every subcommand is a :class:`Command` (name, one line, example, what
it runs) with its :class:`Arg` rows; the argument groups several commands share (the dataset's paths, how to read
it, how to decode ids, ``--json``) are declared once. :func:`build_parser` turns the table into ``argparse``."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import __version__, api
from ..core.registry import default_corpus_format
from . import commands as run

__all__ = ["Arg", "Exclusive", "Command", "commands", "build_parser", "flags"]


class Arg:
    """One ``add_argument`` call: its flags (or positional name) and its keywords."""

    def __init__(self, *names: str, **options: Any) -> None:
        self.names = names
        self.options = options

    def add_to(self, parser: Any) -> None:
        """Add the argument to ``parser`` (a parser or a group)."""
        parser.add_argument(*self.names, **self.options)


@dataclass
class Exclusive:
    """Arguments of which at most one (exactly one when ``required``) may be given."""

    args: list[Arg]
    required: bool = False

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        """Add the group to ``parser``."""
        group = parser.add_mutually_exclusive_group(required=self.required)
        for arg in self.args:
            arg.add_to(group)


Row = Arg | Exclusive


def _at_least(least: int) -> Callable[[str], int]:
    """An ``argparse`` type: a whole number, ``least`` or more (argparse names the flag: ``argument -n: must be 1 or
    more, found -2``)."""

    def whole_number(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, found {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"must be {least} or more, found {value}")
        return value

    return whole_number


#: Counts that must be at least one (documents to show, a batch's size, ...) and those that may be zero.
COUNT, SIZE = _at_least(1), _at_least(0)


@dataclass
class Command:
    """One subcommand: ``help`` is its one line (also its description), ``example`` a command that runs."""

    name: str
    help: str
    example: str
    run: Callable[[argparse.Namespace], int]
    args: list[Row] = field(default_factory=list)


# -- argument groups several commands share ----------------------------------------------------------------


def paths(help: str = "a file, prefix, folder, glob or several files") -> Arg:
    """The datasets a command reads."""
    return Arg("path", nargs="+", help=help)


def reader_args(what: str = "the dataset") -> list[Row]:
    """How to read a dataset whose format or boundaries its content does not say."""
    return [
        Arg("--format", "-f", help=f"the format of {what} (detected from its content when omitted)"),
        Arg("--dtype", help=f"token dtype of {what} when it is a headerless raw stream, e.g. uint16"),
        Exclusive(
            [
                Arg("--eos", type=int, metavar="ID", help=f"split {what}'s documents after this id"),
                Arg("--bos", metavar="ID", help=f"split {what}'s documents before this id ('none': one document)"),
            ]
        ),
        CACHE_DIR,
    ]


def decoder_args(required: bool = False) -> list[Row]:
    """How to turn ids into text."""
    return [
        Exclusive(
            [
                Arg(
                    "--tokenizer",
                    "-t",
                    help="decode ids with this tokenizer.json (or its folder, a vocabulary name such as cl100k_base, "
                    "a .tiktoken file)",
                ),
                Arg("--vocab", help="decode ids with this llm.c vocabulary (gpt2_tokenizer.bin format)"),
            ],
            required=required,
        )
    ]


JSON = Arg("--json", action="store_true", help="print the result as JSON for scripts")
PROGRESS = Arg(
    "--progress",
    action=argparse.BooleanOptionalAction,
    default=None,
    help="a progress bar on stderr, once the work has run a second (default: when stderr is a terminal and "
    "--json is not given)",
)
OVERWRITE = Arg("--overwrite", action="store_true", help="replace existing outputs")
TEXT_INPUTS = Arg("inputs", nargs="+", help=".txt/.json/.jsonl/.parquet files (.gz/.zst), globs or folders")
UNIT = Arg(
    "--unit", choices=["line", "file", "paragraph"], default="line", help="a .txt document is a ... (default line)"
)
CACHE_DIR = Arg("--cache-dir", help="the cache root (default: $TOKFORMATS_CACHE or ~/.cache/tokformats)")


def _documents_command(name: str, what: str, example: str, runner: Callable[[argparse.Namespace], int]) -> Command:
    """``head``, ``tail`` and ``sample``: print documents of a corpus."""
    seed = [Arg("--seed", type=int, default=0, help="which documents: the same seed, the same ones")]
    return Command(
        name,
        f"print {what} of a corpus (as text with a decoder, else ids)",
        example,
        runner,
        [
            paths(),
            Arg("-n", type=COUNT, default=3, help="how many documents (default 3)"),
            *(seed if name == "sample" else []),
            Arg("--max-chars", type=SIZE, default=2000, help="cut each document after this many characters (0: all)"),
            Arg(
                "--mask",
                action="store_true",
                help="show the stored loss mask: tokens not trained on between [[ and ]] (ids: prefixed with ~)",
            ),
            *decoder_args(),
            *reader_args(),
            JSON,
        ],
    )


def _tokenize_args() -> list[Row]:
    default = default_corpus_format()
    return [
        TEXT_INPUTS,
        Arg(
            "--tokenizer",
            "-t",
            required=True,
            help="tokenizer.json or its folder, a vocabulary name (cl100k_base, o200k_base, llama3, deepseek_v3) or a "
            ".tiktoken file",
        ),
        Arg("--output", "-o", required=True, help="output path prefix (names: see the README)"),
        Arg("--format", "-f", default=default, choices=sorted(api.corpus_writers()), help=f"output format ({default})"),
        Arg("--text-key", action="append", help="JSON/Parquet key(s) holding the text (default: text)"),
        Arg(
            "--chat",
            choices=["messages", "sharegpt", "alpaca"],
            help="read each record as a conversation of this schema; stores each token's loss mask",
        ),
        Arg(
            "--template",
            default="chatml",
            help="chat template: chatml (built in), tokenizer (its tokenizer_config.json chat_template), or a "
            "tokenizer_config.json / .jinja path (default: chatml)",
        ),
        Arg(
            "--train-on",
            choices=["assistant", "all", "last"],
            default="assistant",
            help="which chat tokens are trained on: the assistant's turns, all, or the last assistant turn",
        ),
        Arg("--thought", choices=["train", "mask"], default="train", help="train on assistants' thoughts or mask them"),
        Arg(
            "--eos",
            choices=["append", "prepend", "none"],
            help="add the end-of-text id after each document, before it, or not (default: the format's convention: "
            "prepend where documents start with a delimiter, append elsewhere)",
        ),
        Arg("--eos-id", type=int, metavar="ID", help="end-of-text id (default: the tokenizer's <|endoftext|>)"),
        Arg(
            "--dtype",
            help="token dtype of the output, e.g. uint32 (default: the smallest holding every id, the end-of-text "
            "id included)",
        ),
        Arg("--split", help="split by document, e.g. 8:1:1 (train:val:test) or 0.9,0.1"),
        Arg("--seed", type=SIZE, default=0, help="seed of the split assignment (default 0)"),
        UNIT,
        Arg("--batch-size", type=COUNT, default=1000, help="documents per encoder call (default 1000)"),
        Arg("--workers", type=SIZE, default=0, help="encode partitions of the inputs in N processes"),
        Arg(
            "--partitions",
            type=COUNT,
            metavar="N",
            help="with --workers: cut the inputs into N partitions (default: one per file and per 64 MiB; large "
            "JSONL/text files are cut at line starts, Parquet at row groups)",
        ),
        Arg("--on-error", choices=["raise", "skip"], default="raise", help="on a bad record: stop (raise) or skip it"),
        *_tokenize_run_args(),
    ]


def _tokenize_run_args() -> list[Row]:
    """How a tokenize run goes: engine, checks, resume, progress, writer options."""
    return [
        Arg(
            "--engine",
            choices=("auto", "tokenizers", "fastokens", "splintr"),
            default="auto",
            help="encoder: the fastest engine that passes the identity gate (auto, the default), or one by name",
        ),
        Arg(
            "--verify-fraction",
            type=float,
            default=0.01,
            metavar="F",
            help="after the first MiB, the largest share of documents a faster engine's ids are checked against "
            "tokenizers' for (0.01)",
        ),
        Arg(
            "--verify-bytes",
            type=int,
            default=1 << 20,
            metavar="N",
            help="characters of text drawn across the input for that check, beyond the first MiB (1048576)",
        ),
        Arg(
            "--provenance",
            action=argparse.BooleanOptionalAction,
            default=True,
            help="record each document's file, line and byte offset in OUTPUT.provenance.npz (default: on)",
        ),
        Arg("--resume", action="store_true", help="continue an interrupted run"),
        Arg("--overwrite", action="store_true", help="replace existing outputs and a failed run's work"),
        Arg(
            "--progress",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="a progress line on stderr (default: when stderr is a terminal; logs under Slurm are not)",
        ),
        Arg("--quiet", "-q", dest="progress", action="store_false", help="the same as --no-progress"),
        Arg(
            "--writer-option",
            "-w",
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help="passed to the format's writer, e.g. -w shard_size=100000000",
        ),
        JSON,
    ]


def _convert_args() -> list[Row]:
    return [
        Arg("source", help="the corpus to read (a file, prefix, folder or glob)"),
        Arg("destination", help="where to write (a file, prefix or folder, as the format names it)"),
        Arg("--to", required=True, choices=sorted(api.corpus_writers()), help="the destination's format"),
        *reader_args("the source"),
        Arg("--vocab-size", type=int, help="ids must be below it; also picks the destination's dtype"),
        Arg("--to-dtype", help="the destination's token dtype (default: the source's, or the format's)"),
        Exclusive(
            [
                Arg("--to-eos", type=int, metavar="ID", help="end each destination document with this id"),
                Arg("--to-bos", type=int, metavar="ID", help="start each destination document with this id"),
                Arg(
                    "--drop-boundaries",
                    action="store_true",
                    help="copy the bare token stream (documents read back merged)",
                ),
            ]
        ),
        Arg(
            "--drop-masks",
            action="store_true",
            help="copy the tokens without the source's loss masks (needed when the destination cannot store them)",
        ),
        Arg("--overwrite", action="store_true", help="replace an existing destination"),
        JSON,
    ]


def _reading_commands() -> list[Command]:
    """Commands that look at datasets."""
    return [
        Command(
            "info",
            "describe a dataset: format, files, documents, tokens, dtype, ids, header",
            "tokformats info data/fineweb_train_*.bin",
            run.run_info,
            [
                paths(),
                *reader_args(),
                JSON,
                Arg("--no-scan", action="store_true", help="skip the min/max id scan over all tokens"),
                Arg(
                    "--scan",
                    action="store_true",
                    help="scan a dataset opened by URL for its min/max id too (downloads every file)",
                ),
            ],
        ),
        Command(
            "verify",
            "check datasets by reading every token: structure, index, ids, delimiters, recorded checksums",
            "tokformats verify data/owt_text_document --vocab-size 50257",
            run.run_verify,
            [
                paths("datasets to check (exit 0: all sound; 1: problems found)"),
                *reader_args(),
                Arg("--vocab-size", type=int, help="every id must be below this"),
                Arg("--tokenizer", "-t", help="take --vocab-size from this tokenizer.json (or a vocabulary name)"),
                Arg(
                    "--max-duplicate-rate",
                    type=float,
                    metavar="F",
                    help="also fail when more than this fraction of documents are exact copies of another (0.01)",
                ),
                JSON,
            ],
        ),
        Command(
            "stats",
            "document and token counts, length percentiles and histogram, most frequent ids, files",
            "tokformats stats data/owt_text_document --tokenizer tokenizer.json --plot lengths.png",
            run.run_stats,
            [
                paths(),
                *reader_args(),
                *decoder_args(),
                Arg("--top", type=COUNT, default=20, help="how many of the most frequent ids (default 20)"),
                Arg(
                    "--plot",
                    metavar="FILE.png",
                    help="also draw the length histogram (and group sizes with --duplicates); needs matplotlib",
                ),
                Arg(
                    "--duplicates",
                    action="store_true",
                    help="also find exact duplicate documents: rate, token share, groups, the most repeated",
                ),
                JSON,
            ],
        ),
        _documents_command(
            "head", "the first documents", "tokformats head data/owt_text_document -n 3 -t tokenizer.json", run.run_head
        ),
        _documents_command(
            "tail",
            "the last documents",
            "tokformats tail data/fineweb_train_000001.bin -n 2 --vocab tok.bin",
            run.run_tail,
        ),
        _documents_command(
            "sample",
            "random documents",
            "tokformats sample data/owt_text_document -n 5 --seed 1 -t tok.json",
            run.run_sample,
        ),
    ]


def _explain_args() -> list[Row]:
    return [
        paths("the corpus (several: a blend of them, with --weights)"),
        *reader_args(),
        Exclusive(
            [
                Arg("--sample", type=int, metavar="I", help="the sample's index (as samples[I] takes it)"),
                Arg("--step", type=int, metavar="S", help="the samples of optimizer step S (--global-batch-size)"),
            ],
            required=True,
        ),
        Arg("--global-batch-size", type=int, metavar="B", help="samples per optimizer step (for --step)"),
        Arg("--sequence-length", type=int, required=True, metavar="L", help="tokens per sample, as in training"),
        Arg("--seed", type=int, default=1234, help="the samples' seed, as in training (default 1234)"),
        Arg("--num-samples", type=int, help="samples built per dataset, as in training (default: one epoch)"),
        Arg("--split", default="1", help="train/valid/test weights, as Megatron's --split (default 1)"),
        Arg("--split-name", default="train", choices=["train", "valid", "test"], help="the split (default train)"),
        Arg("--no-extra-token", action="store_true", help="samples hold L ids, not L + 1"),
        Arg("--weights", type=float, nargs="+", help="blend weights, one per path"),
        Arg("--size", type=int, help="samples in the blend (default: every sample of every dataset)"),
        *decoder_args(),
        Arg("--max-chars", type=SIZE, default=200, help="cut each range's text after this many characters (0: all)"),
        JSON,
    ]


def _quality_commands() -> list[Command]:
    """Commands that look at what is in the data (``stats --duplicates`` sits with the reading commands)."""
    return [
        Command(
            "explain",
            "which documents, token ranges and source lines a training sample holds",
            "tokformats explain data/owt_text_document --sample 123456 --sequence-length 2048 --seed 1234",
            run.run_explain,
            _explain_args(),
        ),
        Command(
            "contamination",
            "eval items sharing an n-gram of token ids with corpus documents (benchmark contamination)",
            "tokformats contamination data/owt_text_document --eval mmlu.jsonl --tokenizer tok.json --ngram 13",
            run.run_contamination,
            [
                paths("the corpus"),
                *reader_args("the corpus"),
                Arg(
                    "--eval",
                    required=True,
                    metavar="FILE",
                    help="the eval set: a .jsonl/.json/.parquet/.txt file (with --tokenizer), or a tokenized corpus",
                ),
                Arg("--tokenizer", "-t", help="tokenizer.json (or its folder) the corpus was tokenized with"),
                Arg(
                    "--text-key",
                    action="append",
                    help="JSON/Parquet key(s) of an eval item's text, joined by newlines (default: text)",
                ),
                Arg("--ngram", type=COUNT, default=13, help="n-gram length in tokens (default 13)"),
                Arg("--show", type=SIZE, default=10, help="document indices shown per item in the table (default 10)"),
                JSON,
            ],
        ),
    ]


def _writing_commands() -> list[Command]:
    """Commands that copy, merge, publish or fetch datasets."""
    return [
        Command(
            "convert",
            "copy a corpus into another format, keeping every token and document boundary",
            "tokformats convert data/owt_text_document out/owt --to llmc --to-bos 50256",
            run.run_convert,
            _convert_args(),
        ),
        Command(
            "publish",
            "upload a dataset folder: data files first, SHA256SUMS, then the index files readers key on",
            "tokformats publish out/shards s3://bucket/genesis/",
            run.run_publish,
            [
                Arg("folder", help="the dataset folder"),
                Arg("url", help="where to publish it (https://, s3://, gs://, hf://)"),
                Arg("--dry-run", action="store_true", help="say what would be uploaded, upload nothing"),
                Arg(
                    "--prune", action="store_true", help="delete files of an earlier version the new one does not hold"
                ),
                PROGRESS,
                JSON,
            ],
        ),
        Command(
            "fetch",
            "download a dataset by URL into the verified cache now (a node warming its cache before training)",
            "tokformats fetch s3://bucket/genesis/ --cache-dir ~/.cache/tokformats",
            run.run_fetch,
            [
                Arg("url", help="a folder URL (ending in /), a file or prefix, or a glob on a store that lists"),
                CACHE_DIR,
                Arg(
                    "--max-cache-bytes",
                    type=float,
                    metavar="N",
                    help="evict least-recently-used files no reader holds beyond N",
                ),
                Arg("--offline", action="store_true", help="use the cache only: fail naming a file not there"),
                PROGRESS,
                JSON,
            ],
        ),
        Command(
            "merge",
            "merge datasets of one format into one, in order (Megatron's: byte-identical to its add_index)",
            "tokformats merge data/a data/b -o data/ab",
            run.run_merge,
            [
                Arg("inputs", nargs="+", help="datasets (paths, prefixes or folders), in order"),
                Arg("--output", "-o", required=True, help="where the merged dataset goes"),
                Arg("--overwrite", action="store_true", help="replace an existing dataset at --output"),
                PROGRESS,
                JSON,
            ],
        ),
    ]


def _tokenizing_commands() -> list[Command]:
    """Commands that train tokenizers and turn text into datasets, and the tour."""
    return [
        Command(
            "train-tokenizer",
            "train a byte-level BPE tokenizer on any input tokenize reads; ids 0-8 are <|endoftext|>, <|padding|> and "
            "the chat tokens of tokenize --chat (<|im_start|>, <|im_end|>, <|system|>, <|user|>, <|assistant|>, "
            "<|thought|>, <|/thought|>)",
            "tokformats train-tokenizer corpus.jsonl.gz --vocab-size 32000 -o tokenizer.json "
            "--export llmc-vocab=tok.bin",
            run.run_train_tokenizer,
            [
                TEXT_INPUTS,
                Arg("--vocab-size", type=int, required=True, help="vocabulary size, specials included"),
                Arg("--min-frequency", type=int, default=2, help="merge only pairs seen this often (default 2)"),
                UNIT,
                Arg("--sample-docs", type=COUNT, help="learn merges from the first N documents only"),
                Arg("--output", "-o", required=True, help="where to write tokenizer.json"),
                Arg(
                    "--export",
                    action="append",
                    default=[],
                    metavar="FORMAT=PATH",
                    help="also write the vocabulary in a vocabulary format (tokformats formats lists them), repeatable",
                ),
                OVERWRITE,
                Arg("--quiet", "-q", action="store_true", help="no progress bar"),
                JSON,
            ],
        ),
        Command(
            "tokenize",
            "tokenize text files into any format, resumably",
            "tokformats tokenize crawl/*.jsonl.gz -t tokenizer.json -o out/crawl --format megatron --split 98:1:1",
            run.run_tokenize,
            _tokenize_args(),
        ),
        Command("formats", "list the formats", "tokformats formats --json", run.run_formats, [JSON]),
        Command(
            "quickstart",
            "tokenize built-in sample text into every format, read it back, check it decodes",
            "tokformats quickstart -o /tmp/tokformats-demo",
            run.run_quickstart,
            [Arg("--output", "-o", help="keep the files in this folder (default: a temporary one)"), JSON],
        ),
    ]


def commands() -> list[Command]:
    """Every subcommand, in the order ``tokformats --help`` lists them."""
    return [*_reading_commands(), *_quality_commands(), *_writing_commands(), *_tokenizing_commands()]


def build_parser(table: Sequence[Command] | None = None) -> argparse.ArgumentParser:
    """The argument parser of the ``tokformats`` command (of ``table``, by default :func:`commands`)."""
    parser = argparse.ArgumentParser(prog="tokformats", description="Read, write and convert tokenized training data.")
    parser.add_argument("--version", action="version", version=f"tokformats {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in commands() if table is None else table:
        sub = subparsers.add_parser(
            command.name,
            help=command.help,
            description=command.help[0].upper() + command.help[1:] + ".",
            epilog=f"example:\n  {command.example}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        sub.set_defaults(run=command.run)
        for row in command.args:
            row.add_to(sub)
    return parser


#: Python option names whose flag is not ``--`` + the name with dashes, per subcommand.
_RENAMED = {"convert": {"eos": "--to-eos", "bos": "--to-bos", "keep_boundaries": "not --drop-boundaries"}}


def flags(parser: argparse.ArgumentParser, command: str) -> dict[str, str]:
    """Python option name -> this subcommand's flag, for messages (see :func:`tokformats.errors.option`)."""
    sub = next(
        action.choices[command]
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction) and command in action.choices
    )
    found = {}
    for action in sub._actions:
        longs = [s for s in action.option_strings if s.startswith("--")]
        if longs and action.dest not in found:
            found[action.dest] = longs[0]
    return {**found, **_RENAMED.get(command, {})}
