"""What each ``tokformats`` subcommand does: ``run_NAME(args) -> exit status``, given the parsed arguments
(:mod:`tokformats.cli.parser` declares them)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shlex
import sys
import time
from collections.abc import Callable, Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from .. import api
from ..core.protocol import TokenReader
from ..core.registry import formats
from ..errors import ConfigError, FormatError, NoFilesError, OutputExistsError, TokenRangeError, UnknownFormatError
from ..fs.paths import is_url
from .describe import describe
from .quickstart import format_table

# -- shared pieces -----------------------------------------------------------------------------------------


#: Warnings printed during this command, so that each is printed once (a reader's warning is both raised as a
#: DataWarning and listed by ``info``).
_shown_warnings: set[str] = set()


def print_warning(text: str) -> None:
    """``warning: TEXT`` on stderr, once per command."""
    if text not in _shown_warnings:
        _shown_warnings.add(text)
        print(f"warning: {text}", file=sys.stderr)


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


def _url_options(args: argparse.Namespace, path: Any) -> dict[str, Any]:
    """``cache_dir`` for a dataset opened by URL (a local one has no cache)."""
    return {"cache_dir": args.cache_dir} if getattr(args, "cache_dir", None) and is_url(path) else {}


def _open(args: argparse.Namespace) -> Any:
    path = args.path[0] if len(args.path) == 1 else args.path
    return api.open(path, **_reader_options(args), **_url_options(args, path))


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


def _opened_as(destination: str, files: list[str]) -> str:
    """What ``tokformats info`` opens to read a written dataset: the folder or file itself, the one file written,
    else a glob of the shards (quoted for the shell)."""
    if Path(destination).exists():
        return destination
    if len(files) == 1:
        return files[0]
    suffixes = {Path(f).suffix for f in files}
    stems = {Path(f).name.startswith(Path(destination).name) for f in files}
    if len(suffixes) == 1 and stems == {True}:
        return f"{destination}_*{suffixes.pop()}"
    return destination


def read_back_command(destination: str, files: list[str], read_with: dict[str, Any]) -> str:
    """``tokformats info PATH --OPTION VALUE ...``: the command that reads back what was written, as printed."""
    flags = "".join(f" --{name.replace('_', '-')} {value}" for name, value in read_with.items())
    return f"tokformats info {shlex.quote(_opened_as(destination, files))}{flags}"


# -- subcommands -------------------------------------------------------------------------------------------


def _print_info(info: dict[str, Any]) -> None:
    metadata = info.pop("metadata")
    files = info.pop("files")
    for warning in info.pop("warnings", []):
        print_warning(warning)
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


def _tokenizer_info(path: str) -> dict[str, Any] | None:
    """Facts about a ``tokenizer.json`` (which ``info`` is also given), or None for any other file."""
    file = Path(path)
    if file.suffix != ".json" or not file.is_file():
        return None
    with open(file, "rb") as handle:
        head = handle.read(1 << 16)
    if not head.lstrip().startswith(b"{") or b'"added_tokens"' not in head:  # tokenizers writes it near the top
        return None
    from ..core.vocab import END_OF_TEXT, padded_vocab_size
    from ..tokenization.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(file)
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    model = json.loads(tokenizer.to_str()).get("model", {}).get("type")
    added = tokenizer.get_added_tokens_decoder()
    return {
        "format": "tokenizer",
        "path": path,
        "model": model,
        "vocab_size": size,
        "padded_vocab_size": padded_vocab_size(size),  # what llm.c and Megatron size the embedding to
        "end_of_text_id": tokenizer.token_to_id(END_OF_TEXT),
        "special_tokens": [added[k].content for k in sorted(added) if added[k].special][:20],
        "token_dtype": "uint16" if size <= 1 << 16 else "uint32",
    }


def run_info(args: argparse.Namespace) -> int:
    facts = _tokenizer_info(args.path[0]) if len(args.path) == 1 and not _reader_options(args) else None
    if facts is not None:
        if args.json:
            _print_json(facts)
        else:
            width = max(len(k) for k in facts) + 2
            for key, value in facts.items():
                text = ", ".join(value) if isinstance(value, list) else value
                print(f"{key:<{width}}{f'{text:,}' if isinstance(text, int) else text}")
        return 0
    path = args.path[0]
    by_url = len(args.path) == 1 and is_url(path)
    with _open(args) as reader:
        # By URL, the id scan would download every file: only when asked (--scan).
        info = describe(reader, scan=not args.no_scan and (args.scan or not by_url), url=path if by_url else None)
    if args.json:
        _print_json(info)
    else:
        _print_info(info)
    return 0


def _vocab_size(args: argparse.Namespace) -> int | None:
    if args.vocab_size is not None:
        return int(args.vocab_size)
    if args.tokenizer:
        from ..core.vocab import vocabulary_size
        from ..tokenization.tokenizer import load_tokenizer

        return vocabulary_size(load_tokenizer(args.tokenizer))
    return None


def run_verify(args: argparse.Namespace) -> int:
    vocab_size = _vocab_size(args)
    report = []
    for path in args.path:
        with api.open(path, **_reader_options(args), **_url_options(args, path)) as reader:
            shown = sys.stderr.isatty() or "ipykernel" in sys.modules
            found = reader.problems(vocab_size, progress=shown) if hasattr(reader, "problems") else []
            if getattr(args, "max_duplicate_rate", None) is not None and isinstance(reader, TokenReader):
                found += _duplicate_problems(reader, args.max_duplicate_rate)
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


def _duplicate_problems(reader: TokenReader, limit: float) -> list[Any]:
    """A problem when more than ``limit`` of the documents are exact copies of another (``verify
    --max-duplicate-rate``)."""
    from ..core.duplicates import duplicate_summary
    from ..core.reports import Problem

    summary = duplicate_summary(reader, reader.duplicates(), top=1)
    if summary["duplicate_rate"] <= limit:
        return []
    top = summary["top"][0]
    return [
        Problem(
            str(reader.path),
            "duplicates",
            f"{summary['duplicate_documents']:,} of {summary['documents']:,} documents are exact copies of another "
            f"({summary['duplicate_rate']:.2%}, above --max-duplicate-rate {limit:g}); the largest group has "
            f"{top['size']:,} identical documents ( {', '.join(map(str, top['documents']))})",
        )
    ]


def _histogram_lines(histogram: list[dict[str, int]], width: int = 40) -> list[str]:
    top = max((row["documents"] for row in histogram), default=1)
    lines = []
    for row in histogram:
        bar = "#" * max(1, round(width * row["documents"] / top))
        lines.append(f"  {row['from']:>10,} - {row['to']:<10,} {row['documents']:>12,}  {bar}")
    return lines


def run_stats(args: argparse.Namespace) -> int:
    decode = _decoder(args)
    with _open_corpus(args) as reader:
        result = reader.stats(top=args.top)
        if getattr(args, "duplicates", False):
            from ..core.duplicates import duplicate_summary

            result["duplicates"] = duplicate_summary(reader, reader.duplicates(), top=args.top)
    if decode is not None:
        with _decoding(f"{result['path']}, most frequent ids"):
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
    if "trained_tokens" in result:
        print(f"loss mask: {result['trained_tokens']:,} tokens trained on ({result['trained_fraction']:.1%})")
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
    if "duplicates" in result:
        _print_duplicates(result["duplicates"])
    return 0


def _print_duplicates(summary: dict[str, Any]) -> None:
    """The ``stats --duplicates`` section: rates, group sizes, the most repeated documents."""
    print(
        f"exact duplicates: {summary['duplicate_documents']:,} of {summary['documents']:,} documents are copies "
        f"({summary['duplicate_rate']:.2%}), {summary['duplicate_tokens']:,} tokens "
        f"({summary['duplicate_token_share']:.2%}), "
        f"in {summary['groups']:,} groups"
    )
    if summary["group_sizes"]:
        print("group sizes (documents per group, groups):")
        rows = [{"from": r["size"], "to": r["size"], "documents": r["groups"]} for r in summary["group_sizes"]]
        print("\n".join(_histogram_lines(rows)))
        print("most repeated (documents in the group, tokens each, first indices):")
        for row in summary["top"]:
            print(f"  {row['size']:>10,} {row['length']:>10,}  {', '.join(map(str, row['documents']))}")


def _plot(result: dict[str, Any], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise FormatError("--plot needs matplotlib: pip install 'tokformats[plot]'") from None
    duplicates = result.get("duplicates")
    figure, axes = plt.subplots(1, 2 if duplicates else 1, figsize=(14 if duplicates else 8, 4), squeeze=False)
    axis = axes[0][0]
    if duplicates:  # how many groups have 2, 3, ... copies: a long tail means a document copied many times over
        sizes = duplicates["group_sizes"]
        right = axes[0][1]
        right.bar([str(r["size"]) for r in sizes], [r["groups"] for r in sizes])
        right.set_xlabel("copies per duplicate group")
        right.set_ylabel("groups")
        right.set_yscale("log")
        right.set_title(f"exact duplicates: {duplicates['duplicate_rate']:.2%} of documents")
    rows = result.get("histogram", [])
    axis.bar([f"{r['from']:,}" for r in rows], [r["documents"] for r in rows])
    axis.set_xlabel("tokens per document (from)")
    axis.set_ylabel("documents")
    axis.set_title(f"{result['path']}: {result['documents']:,} documents")
    axis.tick_params(axis="x", rotation=45)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


@contextlib.contextmanager
def _decoding(where: str) -> Iterator[None]:
    """Name where an id the decoder refuses is: the decoder knows only its position in the ids it was given."""
    try:
        yield
    except TokenRangeError as exc:
        raise TokenRangeError(f"{where}: {exc}") from None


def _document_json(index: int, document: Any, decode: Callable[[Any], str] | None) -> dict[str, Any]:
    """One document for ``--json``: its index, length and ids (and text, with a decoder)."""
    found: dict[str, Any] = {"document": index, "tokens": len(document), "ids": document.tolist()}
    if decode is not None:
        found["text"] = decode(document)
    return found


def run_contamination(args: argparse.Namespace) -> int:
    from ..quality.contamination import contamination, contamination_report, read_eval_file
    from ..tokenization.sources import TEXT_SUFFIXES

    suffix = "".join(Path(args.eval).suffixes[-2:]).lower().replace(".gz", "").replace(".zst", "")
    lines: list[int] | None = None
    if Path(args.eval).is_file() and any(suffix.endswith(s) for s in TEXT_SUFFIXES):
        if not args.tokenizer:
            raise FormatError(
                f"{args.eval} is text: name the corpus's tokenizer, e.g. tokformats contamination {args.path[0]} "
                f"--eval {args.eval} --tokenizer tokenizer.json"
            )
        texts, lines = read_eval_file(args.eval, args.text_key or ("text",))
        eval_set: Any = texts
    else:
        eval_set = api.open(args.eval)
        if not isinstance(eval_set, TokenReader):
            raise UnknownFormatError(f"{args.eval} is a {eval_set.format} file, neither eval text nor a corpus.")
    with _open_corpus(args) as reader:
        found = contamination(reader, eval_set, tokenizer=args.tokenizer, ngram=args.ngram)
        report = contamination_report(found, lines, ngram=args.ngram, corpus=str(reader.path), eval_name=args.eval)
    if isinstance(eval_set, TokenReader):
        eval_set.close()
    if args.json:
        _print_json(report)
        return 0
    print(
        f"{report['contaminated_items']:,} of {report['items']:,} eval items ({report['contaminated_rate']:.2%}) share "
        f"a {args.ngram}-gram with documents of {report['corpus']}"
    )
    if report["matches"]:
        where = "line" if lines is not None else "item"
        print(f"  {where:>8} {'documents':>10}  document indices")
        for row in report["matches"]:
            shown = row["document_indices"][: args.show]
            more = f" ... (+{row['documents'] - len(shown):,})" if row["documents"] > len(shown) else ""
            print(f"  {row.get('line', row['item']):>8} {row['documents']:>10,}  {', '.join(map(str, shown))}{more}")
    return 0


def _explained_samples(args: argparse.Namespace, readers: list[TokenReader]) -> Any:
    """The GPTSamples (one path) or Blend (several) the training run built, from the command's options."""
    from ..training import Blend, GPTSamples

    datasets = [
        GPTSamples(
            reader,
            args.sequence_length,
            seed=args.seed,
            num_samples=args.num_samples,
            split=args.split,
            split_name=args.split_name,
            add_extra_token=not args.no_extra_token,
        )
        for reader in readers
    ]
    if len(datasets) == 1 and args.weights is None:
        return datasets[0]
    return Blend(datasets, args.weights, args.size)


def _checked_sample(sample: int, samples: Any) -> int:
    """``--sample I`` when the run has sample ``I`` (negative counts from the end, as ``samples[I]``)."""
    count = len(samples)
    if -count <= sample < count:
        return sample
    held = f"{count:,} samples (0-{count - 1:,}; negative counts from the end)" if count else "no samples"
    sizes = "--num-samples and --size" if hasattr(samples, "datasets") else "--num-samples (default: one epoch)"
    raise ConfigError(f"--sample {sample} is out of range: the run has {held}; pass the training run's {sizes}.")


def _samples_to_explain(args: argparse.Namespace, samples: Any) -> list[int]:
    """``--sample I``, or the samples of ``--step S`` (Megatron's sampler order, ``--global-batch-size``)."""
    if args.sample is not None:
        return [_checked_sample(args.sample, samples)]
    if not args.global_batch_size:
        raise FormatError(f"--step needs --global-batch-size, e.g. --step {args.step} --global-batch-size 512")
    from ..training import BatchSampler
    from ..training.explain import step_samples

    sampler = BatchSampler(samples, args.global_batch_size, args.global_batch_size)
    return step_samples(sampler, args.step)


def run_explain(args: argparse.Namespace) -> int:
    from ..training.explain import sample_sources

    decode = _decoder(args)
    readers = [api.open(path, **_reader_options(args)) for path in args.path]
    try:
        corpora = [r for r in readers if isinstance(r, TokenReader)]
        if len(corpora) != len(readers):
            raise UnknownFormatError("explain reads corpora of documents; one of the paths is not one.")
        samples = _explained_samples(args, corpora)
        rows = [dict(row, sample=i) for i in _samples_to_explain(args, samples) for row in sample_sources(samples, i)]
        if decode is not None:
            by_path = {str(r.path): r for r in readers}
            for row in rows:
                row["text"] = decode(by_path[row["path"]][row["document"]][row["start"] : row["stop"]])
    finally:
        for reader in readers:
            reader.close()
    if args.json:
        _print_json({"sample": args.sample, "step": args.step, "samples": len(samples), "ranges": rows})
        return 0
    held: dict[int, int] = {}
    for row in rows:
        held[row["sample"]] = held.get(row["sample"], 0) + row["stop"] - row["start"]
    for k, row in enumerate(rows):
        if k == 0 or row["sample"] != rows[k - 1]["sample"]:
            print(f"sample {row['sample']:,} of {len(samples):,} holds {held[row['sample']]:,} tokens of:")
        where = f"dataset {row['dataset']} " if "dataset" in row else ""
        source = row["source"]
        place = next((f"{k} {v:,}" for k, v in (source or {}).items() if k in ("line", "row", "item")), "")
        origin = f"  <- {source['file']} {place}" if source else ""
        print(f"  {where}{row['path']} document {row['document']:,} tokens {row['start']:,}:{row['stop']:,}{origin}")
        if "text" in row:
            print(f"    {_truncate(row['text'], args.max_chars)!r}")
    return 0


def _print_documents(args: argparse.Namespace, pick: Callable[[int], list[int]]) -> int:
    decode = _decoder(args)
    with _open_corpus(args) as reader:
        reader.num_tokens  # noqa: B018 - refused up front, as by info, when the data contradicts its index
        masked = getattr(args, "mask", False)
        if masked and reader.loss_masks is None:
            print(f"tokformats: {reader.path} stores no loss mask: every token is trained on.", file=sys.stderr)
        if args.json:
            shown_json = []
            for k in pick(len(reader)):
                with _decoding(f"{reader.path}, document {k:,}"):
                    shown_json.append(_document_json(k, reader[k], decode))
            _print_json(shown_json)
            return 0
        for k in pick(len(reader)):
            document = reader[k]
            mask = reader.loss_mask(k) if masked else None
            trained = f", {int(mask.sum()):,} trained on" if mask is not None else ""
            print(f"--- document {k:,} ({len(document):,} tokens{trained}) ---")
            with _decoding(f"{reader.path}, document {k:,}"):
                if mask is not None:
                    shown = _masked_text(document, mask, decode, args.max_chars)
                elif decode is not None:
                    shown = decode(document)
                else:  # the ids; no more of them than characters will be shown
                    shown = " ".join(map(str, document[: max(args.max_chars, 0) or None].tolist()))
            print(_truncate(shown, args.max_chars))
    return 0


def _masked_text(
    document: np.ndarray, mask: np.ndarray, decode: Callable[[Any], str] | None, max_chars: int
) -> str:
    """A document with its runs of tokens not trained on shown between ``[[`` and ``]]`` (decoded run by run, so a
    boundary is exactly where the mask changes), or as ids with ``~`` before each masked one."""
    if decode is None:
        limit = max(max_chars, 0) or None
        return " ".join(f"{t}" if m else f"~{t}" for t, m in zip(document[:limit].tolist(), mask[:limit].tolist()))
    changes = np.flatnonzero(np.diff(mask.astype(np.int8))) + 1
    edges = [0, *changes.tolist(), len(document)]
    pieces = []
    for start, stop in pairwise(edges):
        if start == stop:
            continue
        with _decoding(f"tokens {start:,}:{stop:,}"):
            text = decode(document[start:stop])
        pieces.append(text if mask[start] else f"[[{text}]]")
        if max_chars > 0 and sum(len(p) for p in pieces) > max_chars:
            break
    return "".join(pieces)


def run_head(args: argparse.Namespace) -> int:
    return _print_documents(args, lambda n: list(range(min(args.n, n))))


def run_tail(args: argparse.Namespace) -> int:
    return _print_documents(args, lambda n: list(range(max(n - args.n, 0), n)))


def run_sample(args: argparse.Namespace) -> int:
    return _print_documents(args, lambda n: sorted(random.Random(args.seed).sample(range(n), min(args.n, n))))


def run_convert(args: argparse.Namespace) -> int:
    source_options = {k: v for k, v in _reader_options(args).items() if k != "format"}
    source_options.update(_url_options(args, args.source))
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
        progress=sys.stderr.isatty() or "ipykernel" in sys.modules,
        drop_masks=args.drop_masks,
        **writer_options,
    )
    files = [str(f) for f in summary["files"] or []]
    if args.json:
        _print_json({**summary, "files": files})
        return 0
    print(f"wrote {summary['documents']:,} documents, {summary['tokens']:,} tokens to {len(files)} file(s):")
    for f in files:
        print(f"  {f}")
    if summary["delimiter_moved"]:
        print("moved each document's delimiter to the edge where the destination's reader looks for it")
    if summary["delimiters_added"]:
        print(f"added the delimiter to {summary['delimiters_added']:,} documents that lacked it")
    if summary["read_with"]:
        print(f"read it back with: {read_back_command(args.destination, files, summary['read_with'])}")
    return 0


def _progress_shown(args: argparse.Namespace) -> bool:
    """Whether a command shows its progress bar (on stderr): ``--progress``/``--no-progress``, else when stderr is
    a terminal (or a notebook) and ``--json`` was not asked for."""
    if args.progress is not None:
        return bool(args.progress)
    return not args.json and (sys.stderr.isatty() or "ipykernel" in sys.modules)


def run_merge(args: argparse.Namespace) -> int:
    with api.merge(args.inputs, args.output, overwrite=args.overwrite, progress=_progress_shown(args)) as merged:
        if not isinstance(merged, TokenReader):
            raise FormatError(f"{args.output}: the merged dataset is not a token corpus ({merged.format}).")
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


def run_train_tokenizer(args: argparse.Namespace) -> int:
    from ..core.vocab import padded_vocab_size
    from ..tokenization.tokenizer import train_tokenizer

    exports = []
    for item in args.export:
        format, _, path = item.partition("=")
        if not path or format not in api.vocabulary_formats():
            names = ", ".join(api.vocabulary_formats())
            raise FormatError(f"--export takes FORMAT=PATH with FORMAT one of {names}; found {item!r}.")
        exports.append((format, path))

    output = Path(args.output)
    for path in [output, *(Path(p) for _, p in exports)]:  # every output, before the training starts
        if path.exists() and not args.overwrite:
            raise OutputExistsError(f"{path} already exists; pass --overwrite to replace it (nothing was written).")
    tokenizer = train_tokenizer(
        _input_paths(args.inputs),
        args.vocab_size,
        min_frequency=args.min_frequency,
        unit=args.unit,
        sample_docs=args.sample_docs,
        progress=False if args.quiet else None,
    )
    output.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(output))
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    written = {format: str(api.export_tokenizer(tokenizer, path, format, overwrite=args.overwrite))
               for format, path in exports}  # fmt: skip
    if args.json:
        _print_json(
            {"tokenizer": str(output), "vocab_size": size, "padded_vocab_size": padded_vocab_size(size), **written}
        )
        return 0
    print(f"vocabulary size {size:,} (padded to a multiple of 64: {padded_vocab_size(size):,}) -> {output}")
    for format, path in written.items():
        print(f"{format} vocabulary -> {path}")
    return 0


def _number(text: str) -> Any:
    """A ``-w NAME=VALUE`` value as int, float or bool when it reads as one, else the string."""
    for kind in (int, float):
        with contextlib.suppress(ValueError):
            return kind(text)
    return {"true": True, "false": False}.get(text.lower(), text)


def _input_paths(texts: list[str]) -> list[Path]:
    """The positional inputs, each a path, glob or folder (a missing one is refused, naming it), as ``Path``
    objects: to ``tokenize`` a list of strings naming no file would be texts to tokenize."""
    if not all(texts):  # Path("") is the current folder: an empty argument must not read the files around it
        raise NoFilesError("an empty path names no file.")
    return [Path(text) for text in texts]


def run_tokenize(args: argparse.Namespace) -> int:
    from ..tokenization.pipeline import tokenize

    inputs = _input_paths(args.inputs)
    output = args.output  # a prefix: one naming a folder ("out/") is refused by tokenize
    bad = [option for option in args.writer_option if "=" not in option]
    if bad:
        raise FormatError(f"--writer-option takes NAME=VALUE, found {bad[0]!r}.")
    writer_options = dict(option.split("=", 1) for option in args.writer_option)
    if args.dtype:
        writer_options["dtype"] = args.dtype
    executor = None
    if args.workers and args.workers > 1:
        from concurrent.futures import ProcessPoolExecutor

        from ..tokenization.workers import die_with_parent

        # Workers die with this process (kill -9, the OOM killer) instead of writing on as orphans.
        executor = ProcessPoolExecutor(args.workers, initializer=die_with_parent, initargs=(os.getpid(),))
    try:
        summary = tokenize(
            inputs,
            args.tokenizer,
            output,
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
            partitions=args.partitions,
            overwrite=args.overwrite,
            engine=args.engine,
            verify_fraction=args.verify_fraction,
            verify_bytes=getattr(args, "verify_bytes", 1 << 20),
            chat=args.chat,
            template=args.template,
            train_on=args.train_on,
            thought=args.thought,
            provenance=getattr(args, "provenance", True),
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
    rate = f", {summary['text_characters'] / seconds / 1e6:.1f} M characters/s" if seconds else ""
    print(f"tokenized {summary['documents']:,} documents into {summary['tokens']:,} tokens in {seconds:.1f} s{rate}")
    print(f"engine: {summary['engine']} ({summary['engine_reason']})")
    if summary["skipped"]:
        print(f"skipped {summary['skipped']:,} bad records, e.g. {summary['errors'][0]}")
    for name, output in summary["outputs"].items():
        files = output["files"]
        shown = _opened_as(output["path"], files)
        trained = f" ({output['trained_tokens']:,} trained on)" if "trained_tokens" in output else ""
        print(f"  {name}: {output['documents']:,} documents, {output['tokens']:,} tokens{trained} -> {shown}")
        if output["read_with"]:
            print(f"    read it back with: {read_back_command(output['path'], files, output['read_with'])}")
    return 0


def run_publish(args: argparse.Namespace) -> int:
    from ..remote import publish

    summary = publish(args.folder, args.url, dry_run=args.dry_run, prune=args.prune, progress=_progress_shown(args))
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


def run_fetch(args: argparse.Namespace) -> int:
    from ..fs.paths import public_url
    from ..remote import fetch

    started = time.perf_counter()
    dataset = fetch(
        args.url,
        cache_dir=args.cache_dir,
        max_cache_bytes=args.max_cache_bytes,
        offline=args.offline or None,
        progress=_progress_shown(args),
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


def run_formats(args: argparse.Namespace) -> int:
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


def run_quickstart(args: argparse.Namespace) -> int:
    from .quickstart import run

    rows = run(Path(args.output) if args.output else None)
    if args.json:
        _print_json(rows)
        return 0
    print(format_table(rows))
    done = [r for r in rows if r["check"] == "ok"]
    skipped = [r["format"] for r in rows if r["check"] != "ok"]
    print(f"\n{len(done)} formats written, read back and decoded to the original text: round-tripped exactly.")
    if skipped:
        print(f"skipped (an optional dependency is missing): {', '.join(skipped)}")
    return 0
