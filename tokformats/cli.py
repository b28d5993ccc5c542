"""The ``tokformats`` command line: info, head, convert, merge, train-tokenizer, formats, quickstart."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import __version__, api
from .errors import FormatError, OutputExistsError, UnknownFormatError
from .inspect import describe
from .quickstart import format_table
from .registry import formats

__all__ = ["main"]


def _int_or_none(text: str) -> int | None:
    return None if text.lower() == "none" else int(text)


def _reader_options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if getattr(args, "format", None):
        options["format"] = args.format
    if getattr(args, "dtype", None):
        options["dtype"] = args.dtype
    if getattr(args, "eos", None) is not None:
        options["eos"] = args.eos
    if getattr(args, "bos", None) is not None:
        options["bos"] = _int_or_none(args.bos)
    return options


def _print_info(info: dict[str, Any]) -> None:
    metadata = info.pop("metadata")
    files = info.pop("files")
    for warning in info.pop("warnings", []):
        print(f"warning: {warning}", file=sys.stderr)
    width = max(len(k) for k in [*info, "files", *metadata]) + 2
    for key, value in info.items():
        text = f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else value
        text = json.dumps(text) if isinstance(text, dict) else text
        print(f"{key:<{width}}{text}")
    print(f"{'files':<{width}}{len(files)}" + (f" ({files[0]} ...)" if len(files) > 1 else f" ({files[0]})"))
    for key, value in metadata.items():
        text = json.dumps(value) if isinstance(value, (list, dict)) else value
        if isinstance(text, str) and len(text) > 200:
            text = text[:197] + "..."
        print(f"{key:<{width}}{text}")


def _cmd_info(args: argparse.Namespace) -> int:
    options = _reader_options(args)
    path = args.path[0] if len(args.path) == 1 else args.path
    with api.open(path, **options) as reader:
        info = describe(reader, scan=not args.no_scan)
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        _print_info(info)
    return 0


def _cmd_convert(args: argparse.Namespace) -> int:
    source_options = {k: v for k, v in _reader_options(args).items() if k != "format"}
    writer_options: dict[str, Any] = {"overwrite": args.overwrite}
    if args.vocab_size is not None:
        writer_options["vocab_size"] = args.vocab_size
    if args.to_dtype:
        writer_options["dtype"] = args.to_dtype
    summary = api.convert(
        args.source,
        args.destination,
        args.to,
        source_format=args.format,
        source_options=source_options,
        **writer_options,
    )
    files = summary["files"] or []
    print(f"wrote {summary['documents']:,} documents, {summary['tokens']:,} tokens to {len(files)} file(s):")
    for f in files:
        print(f"  {f}")
    return 0


def _cmd_merge(args: argparse.Namespace) -> int:
    from .formats.megatron import merge

    with merge(args.prefixes, args.output, overwrite=args.overwrite) as merged:
        print(
            f"merged {len(args.prefixes)} datasets into {merged.path}: {len(merged):,} documents, "
            f"{merged.num_tokens:,} tokens, {merged.dtype.name}"
        )
    return 0


def _cmd_train_tokenizer(args: argparse.Namespace) -> int:
    from .formats.llmc_vocab import Vocab
    from .tokenizer import padded_vocab_size, train_tokenizer

    tokenizer = train_tokenizer(
        [Path(p) for p in args.inputs],
        args.vocab_size,
        min_frequency=args.min_frequency,
        unit=args.unit,
        sample_docs=args.sample_docs,
        progress=False if args.quiet else None,
    )
    output = Path(args.output)
    if output.exists() and not args.overwrite:
        raise OutputExistsError(f"{output} already exists; pass --overwrite to replace it.")
    output.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(output))
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    print(f"vocabulary size {size:,} (padded to a multiple of 64: {padded_vocab_size(size):,}) -> {output}")
    if args.llmc_vocab:
        path = Vocab.from_tokenizer(tokenizer).save(args.llmc_vocab, overwrite=args.overwrite)
        print(f"llm.c vocabulary -> {path}")
    return 0


def _cmd_head(args: argparse.Namespace) -> int:
    from .protocol import TokenReader
    from .tokenizer import text_decoder

    decode = text_decoder(tokenizer=args.tokenizer, vocab=args.vocab)
    path = args.path[0] if len(args.path) == 1 else args.path
    with api.open(path, **_reader_options(args)) as reader:
        if not isinstance(reader, TokenReader):
            raise UnknownFormatError(f"{reader.path} is a {reader.format} file, not a corpus of documents.")
        count = min(args.n, len(reader))
        for k in range(count):
            document = reader[k]
            print(f"--- document {k} ({len(document):,} tokens) ---")
            print(decode(document))
    return 0


def _cmd_tokenize(args: argparse.Namespace) -> int:
    from .pipeline import tokenize

    executor = None
    if args.workers and args.workers > 1:
        from concurrent.futures import ProcessPoolExecutor

        executor = ProcessPoolExecutor(args.workers)
    writer_options = dict(option.split("=", 1) for option in args.writer_option)
    try:
        summary = tokenize(
            args.inputs,
            args.tokenizer,
            args.output,
            args.format,
            text_key=args.text_key or "text",
            eos=args.eos,
            eos_id=args.eos_id,
            split=args.split,
            seed=args.seed,
            unit=args.unit,
            batch_size=args.batch_size,
            progress=False if args.quiet else None,
            resume=args.resume,
            on_error=args.on_error,
            executor=executor,
            overwrite=args.overwrite,
            **{k: _number(v) for k, v in writer_options.items()},
        )
    finally:
        if executor is not None:
            executor.shutdown()
    seconds = summary["seconds"]
    rate = f", {summary['bytes'] / seconds / 1e6:.1f} MB/s" if summary["bytes"] and seconds else ""
    print(f"tokenized {summary['documents']:,} documents into {summary['tokens']:,} tokens in {seconds:.1f} s{rate}")
    if summary["skipped"]:
        print(f"skipped {summary['skipped']:,} bad records, e.g. {summary['errors'][0]}")
    for name, output in summary["outputs"].items():
        print(f"  {name}: {output['documents']:,} documents, {output['tokens']:,} tokens -> {output['path']}")
    return 0


def _number(text: str) -> Any:
    """A ``-w NAME=VALUE`` value as int, float or bool when it reads as one, else the string."""
    for kind in (int, float):
        with contextlib.suppress(ValueError):
            return kind(text)
    return {"true": True, "false": False}.get(text.lower(), text)


def _cmd_formats(args: argparse.Namespace) -> int:
    rows = [
        {
            "format": d.name,
            "detect": "yes" if d.detectable else "no",
            "write": "yes" if d.writable else "no",
            "suffixes": " ".join(d.suffixes) or "(folder)",
            "description": d.description,
        }
        for d in formats.values()
    ]
    print(format_table(rows))
    return 0


def _cmd_quickstart(args: argparse.Namespace) -> int:
    from .quickstart import run

    rows = run(Path(args.output) if args.output else None)
    print(format_table(rows))
    print(f"\nall {len(rows)} formats written, read back and decoded to the original text: round-tripped exactly.")
    return 0


def _reader_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", "-f", help="the format (detected from content when omitted)")
    parser.add_argument("--dtype", help="token dtype of a headerless stream, e.g. uint16")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--eos", type=int, help="split documents after this id")
    group.add_argument("--bos", help="split documents before this id ('none': one document)")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``tokformats`` command."""
    parser = argparse.ArgumentParser(prog="tokformats", description="Read, write and convert tokenized training data.")
    parser.add_argument("--version", action="version", version=f"tokformats {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    info = commands.add_parser("info", help="describe a dataset: format, files, documents, tokens, dtype, ids, header")
    info.add_argument("path", nargs="+", help="a file, prefix, folder, glob or several files")
    _reader_arguments(info)
    info.add_argument("--json", action="store_true", help="print JSON for scripts")
    info.add_argument("--no-scan", action="store_true", help="skip the min/max id scan over all tokens")
    info.set_defaults(run=_cmd_info)

    convert = commands.add_parser("convert", help="copy a corpus into another format")
    convert.add_argument("source")
    convert.add_argument("destination")
    corpus_formats = sorted(n for n, d in formats.items() if d.writable and n != "llmc-vocab")
    convert.add_argument("--to", required=True, choices=corpus_formats)
    _reader_arguments(convert)
    convert.add_argument("--vocab-size", type=int)
    convert.add_argument("--to-dtype", help="dtype of the output")
    convert.add_argument("--overwrite", action="store_true")
    convert.set_defaults(run=_cmd_convert)

    merging = commands.add_parser("merge", help="merge Megatron datasets (byte-identical to Megatron's add_index)")
    merging.add_argument("prefixes", nargs="+", help="dataset prefixes, in order")
    merging.add_argument("--output", "-o", required=True, help="the merged dataset's prefix")
    merging.add_argument("--overwrite", action="store_true")
    merging.set_defaults(run=_cmd_merge)

    train = commands.add_parser("train-tokenizer", help="train a byte-level BPE tokenizer on text files")
    train.add_argument("inputs", nargs="+", help="UTF-8 text files")
    train.add_argument("--vocab-size", type=int, required=True)
    train.add_argument("--min-frequency", type=int, default=2)
    train.add_argument("--unit", choices=["line", "file"], default="line", help="one document per line or per file")
    train.add_argument("--sample-docs", type=int, help="learn merges from the first N documents only")
    train.add_argument("--output", "-o", required=True, help="where to write tokenizer.json")
    train.add_argument("--llmc-vocab", help="also write llm.c's vocabulary (gpt2_tokenizer.bin format) here")
    train.add_argument("--overwrite", action="store_true")
    train.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    train.set_defaults(run=_cmd_train_tokenizer)

    head = commands.add_parser("head", help="print the first documents of a corpus as text")
    head.add_argument("path", nargs="+", help="a file, prefix, folder, glob or several files")
    head.add_argument("-n", type=int, default=3, help="how many documents (default 3)")
    decoder = head.add_mutually_exclusive_group(required=True)
    decoder.add_argument("--tokenizer", "-t", help="a tokenizer.json (or its folder)")
    decoder.add_argument("--vocab", help="an llm.c vocabulary file")
    _reader_arguments(head)
    head.set_defaults(run=_cmd_head)

    tok = commands.add_parser("tokenize", help="tokenize text files into any format")
    tok.add_argument("inputs", nargs="+", help=".txt/.json/.jsonl/.parquet files (.gz/.zst), globs or folders")
    tok.add_argument("--tokenizer", "-t", required=True, help="tokenizer.json or its folder")
    tok.add_argument("--output", "-o", required=True, help="output path prefix")
    tok.add_argument("--format", "-f", default="megatron", choices=corpus_formats)
    tok.add_argument("--text-key", action="append", help="JSON/Parquet key(s) holding the text (default: text)")
    tok.add_argument(
        "--eos",
        choices=["append", "prepend", "none"],
        help="add the end-of-text id after each document, before it, or not (default: the format's convention: "
        "prepend for llmc, append for the others)",
    )
    tok.add_argument("--eos-id", type=int, help="end-of-text id (default: the tokenizer's <|endoftext|>)")
    tok.add_argument("--split", help="e.g. 8:1:1 for train:val:test, by document")
    tok.add_argument("--seed", type=int, default=0)
    tok.add_argument("--unit", choices=["line", "file", "paragraph"], default="line", help="a .txt document is a ...")
    tok.add_argument("--batch-size", type=int, default=1000)
    tok.add_argument("--workers", type=int, default=0, help="encode partitions of the inputs in N processes")
    tok.add_argument("--on-error", choices=["raise", "skip"], default="raise")
    tok.add_argument("--resume", action="store_true", help="continue an interrupted run")
    tok.add_argument("--overwrite", action="store_true")
    tok.add_argument("--quiet", "-q", action="store_true", help="no progress line")
    tok.add_argument(
        "--writer-option",
        "-w",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="passed to the format's writer, e.g. -w shard_size=100000000",
    )
    tok.set_defaults(run=_cmd_tokenize)

    listing = commands.add_parser("formats", help="list the formats")
    listing.set_defaults(run=_cmd_formats)

    quick = commands.add_parser(
        "quickstart", help="tokenize built-in sample text into every format, read it back, check it decodes"
    )
    quick.add_argument("--output", "-o", help="keep the files in this folder (default: a temporary one)")
    quick.set_defaults(run=_cmd_quickstart)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (2 for a dataset error, with its message on stderr)."""
    args = build_parser().parse_args(argv)
    try:
        status: int = args.run(args)
    except FormatError as exc:
        print(f"tokformats: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    return status
