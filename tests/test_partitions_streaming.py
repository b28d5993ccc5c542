"""Planning that does not block: partitions cut at line starts without reading the inputs, line counts taken only
as each partition is handed out (each byte once), the first submitted before any counting; the workers gate the
engine (the parent does not); outputs, provenance and error texts identical to a single-process run."""

from __future__ import annotations

import json
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import tokformats
from tokformats.errors import FormatError
from tokformats.tokenization import engines
from tokformats.tokenization import partitions as partitions_module
from tokformats.tokenization.encoder import _GATED
from tokformats.tokenization.engines import select_engine
from tokformats.tokenization.parallel import _WORKER_ENGINES
from tokformats.tokenization.partitions import count_lines, iter_partitions, partition_inputs
from tokformats.tokenization.sample_text import sample_texts
from tokformats.tokenization.sources import SourceError, iter_records, resolve_inputs


def _outputs(summary: dict[str, Any]) -> dict[str, bytes]:
    """Every output file's bytes (and the provenance sidecars'), by file name without the output's prefix."""
    files = {}
    for output in summary["outputs"].values():
        for name in [*output["files"], output.get("provenance")]:
            if name:
                files[Path(name).name.split("_", 1)[1]] = Path(name).read_bytes()
    return files


def _counted_ranges(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    ranges: list[tuple[int, int]] = []
    counting = partitions_module.count_lines

    def recorded(path: Path, start: int, stop: int) -> int:
        ranges.append((start, stop))
        return counting(path, start, stop)

    monkeypatch.setattr(partitions_module, "count_lines", recorded)
    return ranges


def test_count_lines_counts_newlines_in_a_byte_range(tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    path.write_bytes(b"one\r\ntwo\n\nthree" + b"x" * (3 << 20) + b"\nfour")
    assert count_lines(path, 0, path.stat().st_size) == 4
    assert count_lines(path, 0, 5) == 1 and count_lines(path, 5, 10) == 2 and count_lines(path, 10, 10) == 0
    with pytest.raises(FormatError, match="when the run was planned"):  # a stop past the end: the file shrank
        count_lines(path, 10, path.stat().st_size + 100)


def test_the_first_partition_comes_before_any_line_is_counted_and_each_byte_is_counted_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "big.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in sample_texts(4000)), encoding="utf-8")
    ranges = _counted_ranges(monkeypatch)
    planned = iter_partitions(resolve_inputs(source), 12)
    first, group = next(planned)
    assert (first, group[0].start, group[0].first_record) == (0, 0, 0) and ranges == []
    rest = list(planned)
    starts = [group[0].start for _, group in rest]
    assert len(rest) == 11 and ranges == list(zip([0, *starts[:-1]], starts))  # consecutive: one pass, no overlap
    lines = source.read_bytes().split(b"\n")
    for _, (piece,) in rest:  # each piece starts at a line start, with the lines before it
        assert piece.first_record == source.read_bytes()[: piece.start].count(b"\n")
        assert lines[piece.first_record].startswith(b'{"text"')


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
@pytest.mark.parametrize("trailing", [True, False])
def test_pieces_of_crlf_and_unterminated_files_hold_every_record_at_its_line(
    tmp_path: Path, newline: str, trailing: bool
) -> None:
    texts = sample_texts(900)
    rows = [json.dumps({"text": t * (1 + k % 40)}) if k % 13 else "" for k, t in enumerate(texts)]  # long lines
    jsonl = tmp_path / "a.jsonl"
    jsonl.write_bytes((newline.join(rows) + (newline if trailing else "")).encode("utf-8"))
    text = tmp_path / "b.txt"
    text.write_bytes((newline.join(texts) + (newline if trailing else "")).encode("utf-8"))
    for source in (jsonl, text):
        inputs = resolve_inputs(source)
        whole = [(r.index, r.texts, r.offset, r.error) for r in iter_records(inputs)]
        data = source.read_bytes()
        assert len(whole) == data.count(b"\n") + (0 if trailing else 1) and len(whole) >= len(rows)
        for parts in (2, 3, 7, 31, 250):
            joined = []
            for first, group in partition_inputs(inputs, parts):
                assert first == 0
                joined += [(r.index, r.texts, r.offset, r.error) for r in iter_records(group)]
            assert joined == whole, (source.name, parts)


def _run(source: Any, tokenizer: Path, out: Path, executor: Executor | None = None, **options: Any) -> dict[str, Any]:
    return tokformats.tokenize(source, tokenizer, out, "megatron", progress=False, executor=executor, **options)


def test_provenance_and_outputs_are_identical_one_or_many_partitions(tmp_path: Path, tokenizer_path: Path) -> None:
    source = tmp_path / "big.jsonl"
    rows = [json.dumps({"text": t}) if k % 101 else "" for k, t in enumerate(sample_texts(2500))]
    source.write_bytes("\r\n".join(rows).encode("utf-8"))  # CRLF, no newline after the last record
    single = _run(source, tokenizer_path, tmp_path / "one")
    assert "text_document.provenance.npz" in _outputs(single)
    with ThreadPoolExecutor(2) as pool:
        for parts in (1, 2, 9, 70):
            summary = _run(source, tokenizer_path, tmp_path / f"p{parts}", pool, partitions=parts)
            assert _outputs(summary) == _outputs(single), parts
    with tokformats.open(tmp_path / "p70_text_document") as reader:
        last = reader.provenance(len(reader) - 1)
    assert last is not None and last["line"] == len(rows)


def test_a_bad_record_in_a_process_workers_piece_names_its_line_in_the_file(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    source = tmp_path / "bad.jsonl"
    lines = [json.dumps({"text": t}) for t in sample_texts(3000)]
    lines[2700] = '{"text": 5}'
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with ProcessPoolExecutor(2) as pool:
        with pytest.raises(SourceError, match=r"bad\.jsonl, line 2701: 'text' is a int, not a string"):
            _run(source, tokenizer_path, tmp_path / "o", pool, partitions=7)
        skipped = _run(source, tokenizer_path, tmp_path / "s", pool, partitions=7, on_error="skip")
    single = _run(source, tokenizer_path, tmp_path / "one", on_error="skip")
    assert skipped["errors"] == single["errors"] and "line 2701" in skipped["errors"][0]
    assert skipped["skipped"] == 1 and skipped["documents"] == single["documents"] == 2999


def test_the_workers_gate_the_engine_once_each_and_the_parent_not_at_all(
    tmp_path: Path, tokenizer_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[str] = []
    select = select_engine

    def counted(tokenizer: Any, engine: str = "auto", **gate: Any) -> Any:
        asked.append(engine)
        return select(tokenizer, engine, **gate)

    monkeypatch.setattr(engines, "select_engine", counted)
    _WORKER_ENGINES.clear()
    _GATED.clear()
    source = tmp_path / "a.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in sample_texts(1500)), encoding="utf-8")
    with ThreadPoolExecutor(2) as pool:  # one process: its workers share one gated engine
        summary = _run(source, tokenizer_path, tmp_path / "o", pool, partitions=6, engine="tokenizers")
    assert asked == ["tokenizers"] and not _GATED  # no gate in the parent, no second cache
    assert (summary["engine"], summary["engine_reason"]) == ("tokenizers", "asked for")
    assert summary["documents"] == 1500


class _MapOnly:
    """An executor with ``map`` only, as ``ray.util.multiprocessing.Pool``: the partitions go in one call."""

    def __init__(self, pool: ThreadPoolExecutor) -> None:
        self.pool = pool
        self.calls: list[int] = []  # the partitions of each call

    def map(self, fn: Any, jobs: list[Any]) -> list[Any]:
        self.calls.append(len(jobs))
        return list(self.pool.map(fn, jobs))


def test_an_executor_with_map_only_gets_every_partition_in_one_call(tmp_path: Path, tokenizer_path: Path) -> None:
    source = tmp_path / "a.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in sample_texts(1200)), encoding="utf-8")
    single = _run(source, tokenizer_path, tmp_path / "one")
    with ThreadPoolExecutor(2) as pool:
        mapping = _MapOnly(pool)
        summary = _run(source, tokenizer_path, tmp_path / "m", mapping, partitions=5)  # type: ignore[arg-type]
    assert mapping.calls == [5] and _outputs(summary) == _outputs(single)


def test_a_file_that_shrank_since_planning_is_refused_naming_it(tmp_path: Path) -> None:
    from tokformats.tokenization.partitions import count_lines

    source = tmp_path / "a.jsonl"
    source.write_bytes(b'{"text": "x"}\n' * 10)
    assert count_lines(source, 0, 140) == 10
    with pytest.raises(FormatError, match=r"a\.jsonl ends at byte 140; it had at least 200 bytes"):
        count_lines(source, 0, 200)
