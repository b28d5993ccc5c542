"""The ``tokformats`` command line.

Every subcommand prints a one-line error and exits 2 on bad input (never a traceback); messages name command-line
flags (``--overwrite``), not Python keywords; ``--json`` prints what scripts need.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .. import __version__, api
from ..core.protocol import TokenReader
from ..core.registry import default_corpus_format, formats
from ..errors import FormatError, OutputExistsError, UnknownFormatError, command_line_flags
from .describe import describe
from .quickstart import format_table

__all__ = ["main", "build_parser"]


# -- shared pieces -----------------------------------------------------------------------------------------


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


def _open(args: argparse.Namespace) -> Any:
    path = args.path[0] if len(args.path) == 1 else args.path
    return api.open(path, **_reader_options(args))


def _open_corpus(args: argparse.Namespace) -> Any:
    from ..core.protocol import TokenReader

    reader = _open(args)
    if not isinstance(reader, TokenReader):
        reader.close()
        raise UnknownFormatError(f"{reader.path} is a {reader.format} file, not a corpus of documents.")
    return reader


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


def _decoder(args: argparse.Namespace) -> Callable[[Any], str] | None:
    if not (getattr(args, "tokenizer", None) or getattr(args, "vocab", None)):
        return None
    from ..tokenization.tokenizer import text_decoder

    return text_decoder(tokenizer=args.tokenizer, vocab=args.vocab)


def _truncate(text: str, limit: int) -> str:
    if limit <= 0 or len(text) <= limit:
        return text
    return f"{text[:limit]} ... [{len(text) - limit:,} more characters; --max-chars 0 prints all]"


# -- subcommands -------------------------------------------------------------------------------------------


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
    shown = f" ({files[0]} ...)" if len(files) > 1 else f" ({files[0]})" if files else ""
    print(f"{'files':<{width}}{len(files)}{shown}")
    for key, value in metadata.items():
        text = json.dumps(value) if isinstance(value, (list, dict)) else value
        if isinstance(text, str) and len(text) > 200:
            text = text[:197] + "..."
        print(f"{key:<{width}}{text}")


def _cmd_info(args: argparse.Namespace) -> int:
    with _open(args) as reader:
        info = describe(reader, scan=not args.no_scan)
    if args.json:
        _print_json(info)
    else:
        _print_info(info)
    return 0


def _vocab_size(args: argparse.Namespace) -> int | None:
    if args.vocab_size is not None:
        return int(args.vocab_size)
    if args.tokenizer:
        from ..tokenization.tokenizer import load_tokenizer

        return int(load_tokenizer(args.tokenizer).get_vocab_size(with_added_tokens=True))
    return None


def _cmd_verify(args: argparse.Namespace) -> int:
    vocab_size = _vocab_size(args)
    report = []
    for path in args.path:
        with api.open(path, **_reader_options(args)) as reader:
            found = reader.problems(vocab_size) if hasattr(reader, "problems") else []
        report.append({"path": path, "ok": not found, "problems": [p._asdict() for p in found]})
    if args.json:
        _print_json(report)
    else:
        for entry in report:
            if entry["ok"]:
                print(f"{entry['path']}: ok")
            for problem in entry["problems"]:
                where = f" document {problem['document']:,}" if problem["document"] is not None else ""
                print(f"{problem['file']}:{where} {problem['field']}: {problem['message']}")
    return 0 if all(entry["ok"] for entry in report) else 1


def _histogram_lines(histogram: list[dict[str, int]], width: int = 40) -> list[str]:
    top = max((row["documents"] for row in histogram), default=1)
    lines = []
    for row in histogram:
        bar = "#" * max(1, round(width * row["documents"] / top))
        lines.append(f"  {row['from']:>10,} - {row['to']:<10,} {row['documents']:>12,}  {bar}")
    return lines


def _cmd_stats(args: argparse.Namespace) -> int:
    decode = _decoder(args)
    with _open_corpus(args) as reader:
        result = reader.stats(top=args.top)
    if decode is not None:
        for row in result.get("top_ids", []):
            row["text"] = decode([row["id"]])
    if args.plot:
        _plot(result, args.plot)
    if args.json:
        _print_json(result)
        return 0
    print(f"{result['format']} {result['path']}: {result['documents']:,} documents, {result['tokens']:,} tokens")
    if "length" in result:
        length = result["length"]
        print("document length: " + ", ".join(f"{k} {v:,}" for k, v in length.items()))
        print("length histogram (tokens per document, documents):")
        print("\n".join(_histogram_lines(result["histogram"])))
    if result.get("top_ids"):
        print(f"most frequent ids (top {len(result['top_ids'])}):")
        for row in result["top_ids"]:
            text = f"  {row['text']!r}" if "text" in row else ""
            print(f"  {row['id']:>10} {row['count']:>14,}{text}")
    print("files:")
    for row in result["files"]:
        facts = [f"{row['bytes']:,} bytes"] if row["bytes"] is not None else []
        if "tokens" in row:
            facts += [f"{row['tokens']:,} tokens", f"{row['documents_starting']:,} documents start here"]
        print(f"  {row['file']}  " + ", ".join(facts))
    return 0


def _plot(result: dict[str, Any], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise FormatError("--plot needs matplotlib: pip install matplotlib") from None
    figure, axis = plt.subplots(figsize=(8, 4))
    rows = result.get("histogram", [])
    axis.bar([f"{r['from']:,}" for r in rows], [r["documents"] for r in rows])
    axis.set_xlabel("tokens per document (from)")
    axis.set_ylabel("documents")
    axis.set_title(f"{result['path']}: {result['documents']:,} documents")
    axis.tick_params(axis="x", rotation=45)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def _print_documents(args: argparse.Namespace, pick: Callable[[int], list[int]]) -> int:
    decode = _decoder(args)
    with _open_corpus(args) as reader:
        for k in pick(len(reader)):
            document = reader[k]
            print(f"--- document {k:,} ({len(document):,} tokens) ---")
            # Without a decoder, the ids; no more of them than characters will be shown.
            shown = (
                decode(document)
                if decode is not None
                else " ".join(map(str, document[: max(args.max_chars, 0) or None].tolist()))
            )
            print(_truncate(shown, args.max_chars))
    return 0


def _cmd_head(args: argparse.Namespace) -> int:
    return _print_documents(args, lambda n: list(range(min(args.n, n))))


def _cmd_tail(args: argparse.Namespace) -> int:
    return _print_documents(args, lambda n: list(range(max(n - args.n, 0), n)))


def _cmd_sample(args: argparse.Namespace) -> int:
    return _print_documents(args, lambda n: sorted(random.Random(args.seed).sample(range(n), min(args.n, n))))


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
        eos=args.to_eos,
        bos=args.to_bos,
        keep_boundaries=not args.drop_boundaries,
        **writer_options,
    )
    files = [str(f) for f in summary["files"] or []]
    if args.json:
        _print_json({**summary, "files": files})
        return 0
    print(f"wrote {summary['documents']:,} documents, {summary['tokens']:,} tokens to {len(files)} file(s):")
    for f in files:
        print(f"  {f}")
    if summary["delimiters_added"]:
        print(f"added the delimiter to {summary['delimiters_added']:,} documents that lacked it")
    if summary["read_with"]:
        flags = " ".join(f"--{k} {v}" for k, v in summary["read_with"].items())
        print(f"read it back with: tokformats info {args.destination} {flags}")
    return 0


def _cmd_merge(args: argparse.Namespace) -> int:
    with api.merge(args.inputs, args.output, overwrite=args.overwrite) as merged:
        assert isinstance(merged, TokenReader)
        summary = {
            "path": str(merged.path),
            "format": merged.format,
            "inputs": len(args.inputs),
            "documents": len(merged),
            "tokens": merged.num_tokens,
            "dtype": merged.dtype.name,
            "files": [str(f) for f in merged.files],
        }
    if args.json:
        _print_json(summary)
    else:
        print(
            f"merged {summary['inputs']} {summary['format']} datasets into {summary['path']}: "
            f"{summary['documents']:,} documents, {summary['tokens']:,} tokens, {summary['dtype']}"
        )
    return 0


def _cmd_train_tokenizer(args: argparse.Namespace) -> int:
    from ..tokenization.tokenizer import padded_vocab_size, train_tokenizer

    exports = []
    for item in args.export:
        format, _, path = item.partition("=")
        if not path or format not in api.vocabulary_formats():
            names = ", ".join(api.vocabulary_formats())
            raise FormatError(f"--export takes FORMAT=PATH with FORMAT one of {names}; found {item!r}.")
        exports.append((format, path))

    output = Path(args.output)
    if output.exists() and not args.overwrite:
        raise OutputExistsError(f"{output} already exists; pass --overwrite to replace it.")
    tokenizer = train_tokenizer(
        [Path(p) for p in args.inputs],
        args.vocab_size,
        min_frequency=args.min_frequency,
        unit=args.unit,
        sample_docs=args.sample_docs,
        progress=False if args.quiet else None,
    )
    output.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(output))
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    print(f"vocabulary size {size:,} (padded to a multiple of 64: {padded_vocab_size(size):,}) -> {output}")
    for format, path in exports:
        written = api.export_tokenizer(tokenizer, path, format, overwrite=args.overwrite)
        print(f"{format} vocabulary -> {written}")
    return 0


def _number(text: str) -> Any:
    """A ``-w NAME=VALUE`` value as int, float or bool when it reads as one, else the string."""
    for kind in (int, float):
        with contextlib.suppress(ValueError):
            return kind(text)
    return {"true": True, "false": False}.get(text.lower(), text)


def _cmd_tokenize(args: argparse.Namespace) -> int:
    from ..tokenization.pipeline import tokenize

    bad = [option for option in args.writer_option if "=" not in option]
    if bad:
        raise FormatError(f"--writer-option takes NAME=VALUE, found {bad[0]!r}.")
    writer_options = dict(option.split("=", 1) for option in args.writer_option)
    executor = None
    if args.workers and args.workers > 1:
        from concurrent.futures import ProcessPoolExecutor

        executor = ProcessPoolExecutor(args.workers)
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
            progress=args.progress,
            resume=args.resume,
            on_error=args.on_error,
            executor=executor,
            overwrite=args.overwrite,
            engine=args.engine,
            verify_fraction=args.verify_fraction,
            **{k: _number(v) for k, v in writer_options.items()},
        )
    except KeyboardInterrupt:
        print(
            f"\ntokformats: interrupted; the work so far is kept in {args.output}.tokenize/: run the same command "
            "with --resume to continue it.",
            file=sys.stderr,
        )
        return 130
    finally:
        if executor is not None:
            executor.shutdown()
    if args.json:
        _print_json(summary)
        return 0
    seconds = summary["seconds"]
    rate = f", {summary['bytes'] / seconds / 1e6:.1f} MB/s" if summary["bytes"] and seconds else ""
    print(f"tokenized {summary['documents']:,} documents into {summary['tokens']:,} tokens in {seconds:.1f} s{rate}")
    print(f"engine: {summary['engine']} ({summary['engine_reason']})")
    if summary["skipped"]:
        print(f"skipped {summary['skipped']:,} bad records, e.g. {summary['errors'][0]}")
    for name, output in summary["outputs"].items():
        print(f"  {name}: {output['documents']:,} documents, {output['tokens']:,} tokens -> {output['path']}")
    return 0


def _cmd_publish(args: argparse.Namespace) -> int:
    from ..remote import publish

    summary = publish(args.folder, args.url, dry_run=args.dry_run, prune=args.prune)
    if args.json:
        _print_json(summary)
        return 0
    verb = "would upload" if args.dry_run else "uploaded"
    print(f"{verb} {len(summary['uploaded'])} files ({summary['bytes']:,} bytes); {len(summary['skipped'])} unchanged")
    for name in summary["uploaded"]:
        print(f"  {name}")
    for name in summary["removed"]:
        print(f"  {'would remove' if args.dry_run else 'removed'} {name}")
    return 0


def _cmd_fetch(args: argparse.Namespace) -> int:
    from ..fs.paths import public_url
    from ..remote import fetch

    started = time.perf_counter()
    dataset = fetch(
        args.url, cache_dir=args.cache_dir, max_cache_bytes=args.max_cache_bytes, offline=args.offline or None
    )
    dataset.lease.release()
    folder = dataset.cache.folder
    size = sum((folder / name).stat().st_size for name in dataset.files if (folder / name).is_file())
    summary = {
        "url": public_url(args.url),  # never a signed URL's query or a password
        "folder": str(folder),
        "files": dataset.files,
        "bytes": size,
        "seconds": round(time.perf_counter() - started, 3),
    }
    if args.json:
        _print_json(summary)
        return 0
    print(f"{len(dataset.files)} files ({size:,} bytes) verified in {folder} ({summary['seconds']:.1f} s)")
    return 0


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
    if args.json:
        _print_json(rows)
    else:
        print(format_table(rows))
    return 0


def _cmd_quickstart(args: argparse.Namespace) -> int:
    from .quickstart import run

    rows = run(Path(args.output) if args.output else None)
    print(format_table(rows))
    done = [r for r in rows if r["check"] == "ok"]
    skipped = [r["format"] for r in rows if r["check"] != "ok"]
    print(f"\n{len(done)} formats written, read back and decoded to the original text: round-tripped exactly.")
    if skipped:
        print(f"skipped (an optional dependency is missing): {', '.join(skipped)}")
    return 0


# -- the parser --------------------------------------------------------------------------------------------


def _reader_arguments(parser: argparse.ArgumentParser, what: str = "the dataset") -> None:
    parser.add_argument("--format", "-f", help=f"the format of {what} (detected from its content when omitted)")
    parser.add_argument("--dtype", help=f"token dtype of {what} when it is a headerless raw stream, e.g. uint16")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--eos", type=int, metavar="ID", help=f"split {what}'s documents after this id")
    group.add_argument(
        "--bos", metavar="ID", help=f"split {what}'s documents before this id ('none': the stream is one document)"
    )


def _decoder_arguments(parser: argparse.ArgumentParser, required: bool = False) -> None:
    decoder = parser.add_mutually_exclusive_group(required=required)
    decoder.add_argument("--tokenizer", "-t", help="decode ids with this tokenizer.json (or its folder)")
    decoder.add_argument("--vocab", help="decode ids with this llm.c vocabulary (gpt2_tokenizer.bin format)")


def _command(
    commands: Any, name: str, help: str, example: str, run: Callable[[argparse.Namespace], int]
) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(
        name,
        help=help,
        description=help[0].upper() + help[1:] + ".",
        epilog=f"example:\n  {example}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.set_defaults(run=run)
    return parser


def _add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the result as JSON for scripts")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``tokformats`` command."""
    parser = argparse.ArgumentParser(prog="tokformats", description="Read, write and convert tokenized training data.")
    parser.add_argument("--version", action="version", version=f"tokformats {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    corpus_formats = sorted(api.corpus_writers())

    info = _command(
        commands,
        "info",
        "describe a dataset: format, files, documents, tokens, dtype, ids, header",
        "tokformats info data/fineweb_train_*.bin",
        _cmd_info,
    )
    info.add_argument("path", nargs="+", help="a file, prefix, folder, glob or several files")
    _reader_arguments(info)
    _add_json(info)
    info.add_argument("--no-scan", action="store_true", help="skip the min/max id scan over all tokens")

    verify = _command(
        commands,
        "verify",
        "check datasets by reading every token: structure, index, ids, delimiters, recorded checksums",
        "tokformats verify data/owt_text_document --vocab-size 50257",
        _cmd_verify,
    )
    verify.add_argument("path", nargs="+", help="datasets to check (exit 0: all sound; 1: problems found)")
    _reader_arguments(verify)
    verify.add_argument("--vocab-size", type=int, help="every id must be below this")
    verify.add_argument("--tokenizer", "-t", help="take --vocab-size from this tokenizer.json")
    _add_json(verify)

    stats = _command(
        commands,
        "stats",
        "document and token counts, length percentiles and histogram, most frequent ids, files",
        "tokformats stats data/owt_text_document --tokenizer tokenizer.json --plot lengths.png",
        _cmd_stats,
    )
    stats.add_argument("path", nargs="+", help="a file, prefix, folder, glob or several files")
    _reader_arguments(stats)
    _decoder_arguments(stats)
    stats.add_argument("--top", type=int, default=20, help="how many of the most frequent ids (default 20)")
    stats.add_argument("--plot", metavar="FILE.png", help="also draw the length histogram (needs matplotlib)")
    _add_json(stats)

    for name, what, example, run in (
        ("head", "the first documents", "tokformats head data/owt_text_document -n 3 -t tokenizer.json", _cmd_head),
        ("tail", "the last documents", "tokformats tail data/fineweb_train_000001.bin -n 2 --vocab tok.bin", _cmd_tail),
        (
            "sample",
            "random documents",
            "tokformats sample data/owt_text_document -n 5 --seed 1 -t tok.json",
            _cmd_sample,
        ),
    ):
        command = _command(commands, name, f"print {what} of a corpus (as text with a decoder, else ids)", example, run)
        command.add_argument("path", nargs="+", help="a file, prefix, folder, glob or several files")
        command.add_argument("-n", type=int, default=3, help="how many documents (default 3)")
        if name == "sample":
            command.add_argument("--seed", type=int, default=0, help="which documents: the same seed, the same ones")
        command.add_argument(
            "--max-chars", type=int, default=2000, help="cut each document after this many characters (0: all)"
        )
        _decoder_arguments(command)
        _reader_arguments(command)

    convert = _command(
        commands,
        "convert",
        "copy a corpus into another format, keeping every token and document boundary",
        "tokformats convert data/owt_text_document out/owt --to llmc --to-bos 50256",
        _cmd_convert,
    )
    convert.add_argument("source", help="the corpus to read (a file, prefix, folder or glob)")
    convert.add_argument("destination", help="where to write (a file, prefix or folder, as the format names it)")
    convert.add_argument("--to", required=True, choices=corpus_formats, help="the destination's format")
    _reader_arguments(convert, "the source")
    convert.add_argument("--vocab-size", type=int, help="ids must be below it; also picks the destination's dtype")
    convert.add_argument("--to-dtype", help="the destination's token dtype (default: the source's, or the format's)")
    marks = convert.add_mutually_exclusive_group()
    marks.add_argument("--to-eos", type=int, metavar="ID", help="end each destination document with this id")
    marks.add_argument("--to-bos", type=int, metavar="ID", help="start each destination document with this id")
    marks.add_argument(
        "--drop-boundaries", action="store_true", help="copy the bare token stream (documents read back merged)"
    )
    convert.add_argument("--overwrite", action="store_true", help="replace an existing destination")
    _add_json(convert)

    publishing = _command(
        commands,
        "publish",
        "upload a dataset folder: data files first, SHA256SUMS, then the index files readers key on",
        "tokformats publish out/shards s3://bucket/genesis/",
        _cmd_publish,
    )
    publishing.add_argument("folder", help="the dataset folder")
    publishing.add_argument("url", help="where to publish it (https://, s3://, gs://, hf://)")
    publishing.add_argument("--dry-run", action="store_true", help="say what would be uploaded, upload nothing")
    publishing.add_argument(
        "--prune", action="store_true", help="delete files of an earlier version the new one does not hold"
    )
    _add_json(publishing)

    fetching = _command(
        commands,
        "fetch",
        "download a dataset by URL into the verified cache now (a node warming its cache before training)",
        "tokformats fetch s3://bucket/genesis/ --cache-dir ~/.cache/tokformats",
        _cmd_fetch,
    )
    fetching.add_argument("url", help="a folder URL (ending in /), a file or prefix, or a glob on a store that lists")
    fetching.add_argument("--cache-dir", help="the cache root (default: $TOKFORMATS_CACHE or ~/.cache/tokformats)")
    fetching.add_argument(
        "--max-cache-bytes", type=float, metavar="N", help="evict least-recently-used files no reader holds beyond N"
    )
    fetching.add_argument("--offline", action="store_true", help="use the cache only: fail naming a file not there")
    _add_json(fetching)

    merging = _command(
        commands,
        "merge",
        "merge datasets of one format into one, in order (Megatron's: byte-identical to its add_index)",
        "tokformats merge data/a data/b -o data/ab",
        _cmd_merge,
    )
    merging.add_argument("inputs", nargs="+", help="datasets (paths, prefixes or folders), in order")
    merging.add_argument("--output", "-o", required=True, help="where the merged dataset goes")
    merging.add_argument("--overwrite", action="store_true", help="replace an existing dataset at --output")
    _add_json(merging)

    train = _command(
        commands,
        "train-tokenizer",
        "train a byte-level BPE tokenizer on any input tokenize reads",
        "tokformats train-tokenizer corpus.jsonl.gz --vocab-size 32000 -o tokenizer.json --export llmc-vocab=tok.bin",
        _cmd_train_tokenizer,
    )
    train.add_argument("inputs", nargs="+", help=".txt/.json/.jsonl/.parquet files (.gz/.zst), globs or folders")
    train.add_argument("--vocab-size", type=int, required=True, help="vocabulary size, specials included")
    train.add_argument("--min-frequency", type=int, default=2, help="merge only pairs seen this often (default 2)")
    train.add_argument(
        "--unit", choices=["line", "file", "paragraph"], default="line", help="a .txt document is a ... (default line)"
    )
    train.add_argument("--sample-docs", type=int, help="learn merges from the first N documents only")
    train.add_argument("--output", "-o", required=True, help="where to write tokenizer.json")
    train.add_argument(
        "--export",
        action="append",
        default=[],
        metavar="FORMAT=PATH",
        help="also write the vocabulary in a vocabulary format (tokformats formats lists them), repeatable",
    )
    train.add_argument("--overwrite", action="store_true", help="replace existing outputs")
    train.add_argument("--quiet", "-q", action="store_true", help="no progress bar")

    tok = _command(
        commands,
        "tokenize",
        "tokenize text files into any format, resumably",
        "tokformats tokenize crawl/*.jsonl.gz -t tokenizer.json -o out/crawl --format megatron --split 98:1:1",
        _cmd_tokenize,
    )
    tok.add_argument("inputs", nargs="+", help=".txt/.json/.jsonl/.parquet files (.gz/.zst), globs or folders")
    tok.add_argument("--tokenizer", "-t", required=True, help="tokenizer.json or its folder")
    tok.add_argument("--output", "-o", required=True, help="output path prefix (names: see the README)")
    default = default_corpus_format()
    tok.add_argument("--format", "-f", default=default, choices=corpus_formats, help=f"output format ({default})")
    tok.add_argument("--text-key", action="append", help="JSON/Parquet key(s) holding the text (default: text)")
    tok.add_argument(
        "--eos",
        choices=["append", "prepend", "none"],
        help="add the end-of-text id after each document, before it, or not (default: the format's convention: "
        "prepend where documents start with a delimiter, append elsewhere)",
    )
    tok.add_argument("--eos-id", type=int, metavar="ID", help="end-of-text id (default: the tokenizer's <|endoftext|>)")
    tok.add_argument("--split", help="split by document, e.g. 8:1:1 (train:val:test) or 0.9,0.1")
    tok.add_argument("--seed", type=int, default=0, help="seed of the split assignment (default 0)")
    tok.add_argument(
        "--unit", choices=["line", "file", "paragraph"], default="line", help="a .txt document is a ... (default line)"
    )
    tok.add_argument("--batch-size", type=int, default=1000, help="documents per encoder call (default 1000)")
    tok.add_argument("--workers", type=int, default=0, help="encode partitions of the inputs in N processes")
    tok.add_argument(
        "--on-error", choices=["raise", "skip"], default="raise", help="on a bad record: stop (raise) or skip it"
    )
    tok.add_argument(
        "--engine",
        choices=("auto", "tokenizers", "fastokens"),
        default="auto",
        help="encoder: fastokens where it passes the identity gate (auto, the default), or one of the two",
    )
    tok.add_argument(
        "--verify-fraction",
        type=float,
        default=0.01,
        metavar="F",
        help="fraction of batches a faster engine's ids are checked against tokenizers' during the run (0.01)",
    )
    tok.add_argument("--resume", action="store_true", help="continue an interrupted run")
    tok.add_argument("--overwrite", action="store_true", help="replace existing outputs and a failed run's work")
    tok.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a progress line on stderr (default: when stderr is a terminal; logs under Slurm are not)",
    )
    tok.add_argument("--quiet", "-q", dest="progress", action="store_false", help="the same as --no-progress")
    tok.add_argument(
        "--writer-option",
        "-w",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="passed to the format's writer, e.g. -w shard_size=100000000",
    )
    _add_json(tok)

    listing = _command(commands, "formats", "list the formats", "tokformats formats --json", _cmd_formats)
    _add_json(listing)

    quick = _command(
        commands,
        "quickstart",
        "tokenize built-in sample text into every format, read it back, check it decodes",
        "tokformats quickstart -o /tmp/tokformats-demo",
        _cmd_quickstart,
    )
    quick.add_argument("--output", "-o", help="keep the files in this folder (default: a temporary one)")
    return parser


#: Python option names whose flag is not ``--`` + the name with dashes, per subcommand.
_RENAMED = {"convert": {"eos": "--to-eos", "bos": "--to-bos", "keep_boundaries": "--drop-boundaries"}}


def _flags(parser: argparse.ArgumentParser, command: str) -> dict[str, str]:
    """Python option name -> this subcommand's flag, for messages (see :func:`tokformats.errors.option`)."""
    sub = next(
        action.choices[command]
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction) and command in action.choices
    )
    flags = {}
    for action in sub._actions:
        longs = [s for s in action.option_strings if s.startswith("--")]
        if longs and action.dest not in flags:
            flags[action.dest] = longs[0]
    return {**flags, **_RENAMED.get(command, {})}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status: 0 success, 1 problems found (verify), 2 bad input or
    arguments (one line on stderr), 130 interrupted."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        with command_line_flags(_flags(parser, args.command)):
            status: int = args.run(args)
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        print("\ntokformats: interrupted.", file=sys.stderr)
        return 130
    except (FormatError, OSError, ValueError, ImportError) as exc:  # bad input, a missing file or extra: one line
        if os.environ.get("TOKFORMATS_DEBUG"):
            raise
        print(f"tokformats: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a bug: say so, without burying the message under a traceback
        if os.environ.get("TOKFORMATS_DEBUG"):
            raise
        print(
            f"tokformats: internal error ({type(exc).__name__}: {exc}); please report it. "
            "TOKFORMATS_DEBUG=1 shows the traceback.",
            file=sys.stderr,
        )
        return 3
    return status
