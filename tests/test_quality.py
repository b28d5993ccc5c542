"""What is in the data (issue 27): exact duplicate documents and benchmark contamination, on token ids, compared with
brute force on random corpora with planted copies and planted eval n-grams."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tokformats
import tokformats.core.duplicates as duplicates_module
import tokformats.quality.contamination as contamination_module
from tokformats.cli import main
from tokformats.core.duplicates import document_hashes, duplicate_summary

from .http_server import FileServer


def _random_documents(seed: int, count: int, longest: int, low: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(low, 5000, int(rng.integers(1, longest))) for _ in range(count)]


def _plant_copies(documents: list[np.ndarray], seed: int) -> None:
    """Copy some documents over others: groups of 2, 3 and 9; plus a reversed copy, which is not a duplicate."""
    rng = np.random.default_rng(seed)
    picks = rng.permutation(len(documents))
    for size, start in ((2, 0), (3, 2), (9, 5)):
        for target in picks[start + 1 : start + size]:
            documents[target] = documents[picks[start]].copy()
    documents[picks[20]] = documents[picks[21]][::-1].copy()


def _brute_force_groups(documents: list[np.ndarray]) -> list[list[int]]:
    found: dict[bytes, list[int]] = defaultdict(list)
    for k, document in enumerate(documents):
        found[np.asarray(document, dtype=np.int64).tobytes()].append(k)
    return sorted(g for g in found.values() if len(g) >= 2)


def _write(path: Path, documents: list[np.ndarray]) -> Path:
    with tokformats.create(path, "megatron", vocab_size=50257) as writer:
        writer.write_batch(np.concatenate(documents), [len(d) for d in documents])
    return path


@pytest.mark.parametrize("format", ["megatron", "llmc", "raw", "pt", "timemoe", "datatrove", "litdata"])
def test_planted_duplicates_are_found_exactly_in_every_format(
    tmp_path: Path, format: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    documents = _random_documents(seed=5, count=400, longest=40)
    _plant_copies(documents, seed=6)
    source = _write(tmp_path / "source", documents)
    options = {"eos": 0} if format in ("raw", "pt") else {"bos": 0} if format == "llmc" else {}
    summary = tokformats.convert(source, tmp_path / "out", format, **options)
    written = summary["files"][0] if format in ("raw", "llmc", "datatrove") else tmp_path / "out"
    # Chunks of 7 tokens: nearly every document spans a chunk boundary.
    monkeypatch.setattr(duplicates_module, "CHUNK_TOKENS", 7)
    read_with = {"format": "raw", "dtype": summary["dtype"]} if format == "raw" else {}
    read_with.update(summary["read_with"])  # raw's names its format and dtype too
    with tokformats.open(written, **read_with) as reader:
        assert len(reader) == len(documents)
        groups = reader.duplicates()
        read_back = [np.asarray(reader[k]) for k in range(len(reader))]
    assert [g.tolist() for g in groups] == _brute_force_groups(read_back)
    assert [g.tolist() for g in groups] == _brute_force_groups(documents)  # delimiters added to all: same groups
    assert [len(g) for g in sorted(groups, key=len)] == [2, 3, 9]
    assert all(g.dtype == np.int64 and (np.diff(g) > 0).all() for g in groups)


def test_order_of_ids_counts_and_hashes_do_not_depend_on_chunking(tmp_path: Path) -> None:
    documents = [np.array([1, 2, 3]), np.array([3, 2, 1]), np.array([1, 2, 3]), np.array([2, 1, 3]), np.array([1, 2])]
    with tokformats.open(_write(tmp_path / "c", documents)) as reader:
        assert [g.tolist() for g in reader.duplicates()] == [[0, 2]]
        whole = document_hashes(reader)
        for chunk in (1, 2, 5):
            assert (document_hashes(reader, chunk_tokens=chunk) == whole).all()
            # a subset, in any order, hashes as it does among all documents (candidates are hashed that way)
            assert (document_hashes(reader, np.array([4, 2, 0, 1]), chunk_tokens=chunk) == whole[[4, 2, 0, 1]]).all()
        assert len(set(whole.tolist())) == 4 and whole.dtype == np.uint64
        assert len(document_hashes(reader, np.zeros(0, dtype=np.int64))) == 0


def _constant_hashes(reader: Any, documents: Any = None, chunk_tokens: int | None = None) -> np.ndarray:
    """Every document hashes alike: only the exact comparison tells documents apart."""
    return np.zeros(len(reader) if documents is None else len(documents), dtype=np.uint64)


def test_a_forced_hash_collision_never_groups_different_documents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    documents = _random_documents(seed=8, count=300, longest=6, low=1)  # short ids from 1..4999: several lengths
    _plant_copies(documents, seed=9)
    with tokformats.open(_write(tmp_path / "c", documents)) as reader:
        monkeypatch.setattr(duplicates_module, "document_hashes", _constant_hashes)
        monkeypatch.setattr(duplicates_module, "document_fingerprints", lambda r: np.zeros(len(r), np.uint64))
        groups = reader.duplicates()  # every document a candidate, every candidate in one hash run
    assert [g.tolist() for g in groups] == _brute_force_groups(documents)
    assert [len(g) for g in sorted(groups, key=len)] == [2, 3, 9]


def test_a_long_document_is_compared_piece_by_piece(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    long = np.random.default_rng(1).integers(1, 5000, 1000)
    changed = long.copy()
    changed[1] += 1  # not one of the ids the fingerprint reads (0, 124, 249, ..., 999)
    documents = [long, np.array([4, 5]), long.copy(), changed]
    monkeypatch.setattr(duplicates_module, "CHUNK_TOKENS", 64)
    with tokformats.open(_write(tmp_path / "c", documents)) as reader:
        hashes = document_hashes(reader)
        fingerprints = duplicates_module.document_fingerprints(reader)
        monkeypatch.setattr(duplicates_module, "document_hashes", _constant_hashes)  # 3 looks like 0 and 2 to it
        assert [g.tolist() for g in reader.duplicates()] == [[0, 2]]
    assert hashes[0] == hashes[2] != hashes[3]
    assert fingerprints[0] == fingerprints[2] == fingerprints[3] != fingerprints[1]


def test_same_length_and_sampled_ids_but_different_elsewhere_is_not_a_duplicate(tmp_path: Path) -> None:
    """The fingerprint reads ids (length - 1) * k // 8: for 17 ids, the even positions. Documents that differ only
    at odd positions share it and are candidates; the hash and the comparison keep them apart."""
    rng = np.random.default_rng(21)
    base = rng.integers(1, 5000, 17)
    odd_changed = base.copy()
    odd_changed[1::2] = rng.integers(1, 5000, 8)
    one_changed = base.copy()
    one_changed[7] += 1
    filler = _random_documents(seed=22, count=50, longest=30)
    documents = [base, *filler[:20], odd_changed, one_changed, *filler[20:], base.copy(), one_changed.copy()]
    with tokformats.open(_write(tmp_path / "c", documents)) as reader:
        fingerprints = duplicates_module.document_fingerprints(reader)
        candidates = duplicates_module.duplicate_candidates(reader)
        groups = [g.tolist() for g in reader.duplicates()]
    last = len(documents) - 1
    assert fingerprints[0] == fingerprints[21] == fingerprints[22] == fingerprints[last - 1]
    assert {0, 21, 22, last - 1, last} <= set(candidates.tolist())
    assert groups == _brute_force_groups(documents) == [[0, last - 1], [22, last]]


def test_empty_and_single_token_documents(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(31)
    documents = [np.array([], dtype=np.int64) if k % 7 == 0 else rng.integers(1, 6, 1) for k in range(60)]
    documents += [np.array([3, 3]), np.array([], dtype=np.int64)]  # an empty last document: past the stream's end
    monkeypatch.setattr(duplicates_module, "FINGERPRINT_DOCUMENTS", 5)
    monkeypatch.setattr(duplicates_module, "CHUNK_TOKENS", 3)
    with tokformats.open(_write(tmp_path / "c", documents)) as reader:
        groups = [g.tolist() for g in reader.duplicates()]
    expected = _brute_force_groups(documents)
    assert groups == expected
    assert [k for k, d in enumerate(documents) if not len(d)] in groups  # all empty documents are one group
    assert sum(len(g) for g in groups) == len(documents) - 1  # five values in 52 single ids: only [3, 3] is unique


def test_only_empty_documents_and_no_documents(tmp_path: Path) -> None:
    with tokformats.open(_write(tmp_path / "e", [np.array([], dtype=np.int64)] * 3)) as reader:
        assert [g.tolist() for g in reader.duplicates()] == [[0, 1, 2]]
    with tokformats.open(_write(tmp_path / "one", [np.array([5, 6])])) as reader:
        assert reader.duplicates() == []


@pytest.mark.parametrize("slices", [True, False])
@pytest.mark.parametrize("arrangement", ["repeated", "shuffled"])
def test_every_document_copied_32_times(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, arrangement: str, slices: bool
) -> None:
    """The worst case (a pipeline wrote its output 32 times): every document is a candidate. Copies that follow
    each other in the file are read as slices, scattered ones by fancy indexing; both give the same groups."""
    distinct = _random_documents(seed=41, count=25, longest=90)
    documents = distinct * 32
    if arrangement == "shuffled":
        documents = [documents[k] for k in np.random.default_rng(42).permutation(len(documents))]
    monkeypatch.setattr(duplicates_module, "CHUNK_TOKENS", 100)
    monkeypatch.setattr(duplicates_module, "FINGERPRINT_DOCUMENTS", 64)
    monkeypatch.setattr(duplicates_module, "_SLICE_MIN_AVERAGE", 1 if slices else 1 << 30)
    with tokformats.open(_write(tmp_path / "c", documents)) as reader:
        groups = [g.tolist() for g in reader.duplicates()]
        summary = duplicate_summary(reader, reader.duplicates())
    assert _brute_force_groups(distinct) == []
    assert groups == _brute_force_groups(documents)
    assert [len(g) for g in groups] == [32] * 25
    assert summary["duplicate_token_share"] == pytest.approx(31 / 32)


def test_float_series_across_shards_equal_as_compared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Float values (Time-MoE): -0.0 equals 0.0, as the comparison says, in the fingerprint and the hash too (writers
    refuse NaN); the folder's shards make the stream a ConcatenatedArray."""
    series = [
        np.array([0.5, -0.0, 2.0]),
        np.array([0.5, 0.0, 2.0]),
        np.array([-1.5, 1.0]),
        np.array([-1.5, 1.0]),
        np.array([1.0, -1.5]),
        np.array([0.5, 0.0, 2.5]),
    ]
    with tokformats.create(tmp_path / "t", "timemoe", dtype="float32", max_shard_elements=4) as writer:
        writer.write_batch(np.concatenate(series), [len(s) for s in series])
    monkeypatch.setattr(duplicates_module, "CHUNK_TOKENS", 2)
    with tokformats.open(tmp_path / "t") as reader:
        assert type(reader.tokens).__name__ == "ConcatenatedArray"
        assert [g.tolist() for g in reader.duplicates()] == [[0, 1], [2, 3]]
        monkeypatch.setattr(duplicates_module, "document_hashes", _constant_hashes)
        assert [g.tolist() for g in reader.duplicates()] == [[0, 1], [2, 3]]


def test_duplicate_summary_counts_copies_beyond_the_first(tmp_path: Path) -> None:
    documents = [np.array([7, 8, 9]), np.array([1]), np.array([7, 8, 9]), np.array([7, 8, 9]), np.array([1])]
    documents.append(np.array([5, 5, 5, 5, 5]))
    with tokformats.open(_write(tmp_path / "c", documents)) as reader:
        summary = duplicate_summary(reader, reader.duplicates())
    assert summary["groups"] == 2
    assert summary["duplicate_documents"] == 3  # two extra [7, 8, 9], one extra [1]
    assert summary["duplicate_tokens"] == 2 * 3 + 1
    assert summary["duplicate_rate"] == pytest.approx(3 / 6)
    assert summary["duplicate_token_share"] == pytest.approx(7 / 16)  # 16 tokens in all
    assert summary["group_sizes"] == [{"size": 2, "groups": 1}, {"size": 3, "groups": 1}]
    assert summary["top"][0] == {"size": 3, "length": 3, "documents": [0, 2, 3]}


def test_duplicates_of_a_corpus_opened_by_url(tmp_path: Path) -> None:
    root = tmp_path / "served"
    root.mkdir()
    documents = _random_documents(seed=11, count=200, longest=30)
    _plant_copies(documents, seed=12)
    _write(root / "corpus", documents)
    server = FileServer(root)
    try:
        with tokformats.open(f"{server.url}/corpus", cache_dir=tmp_path / "cache") as reader:
            groups = reader.duplicates()
    finally:
        server.stop()
    assert [g.tolist() for g in groups] == _brute_force_groups(documents)


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    status = main(args)
    return status, capsys.readouterr().out


def test_cli_stats_duplicates_and_verify_max_duplicate_rate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    documents = [np.array([7, 8, 9]), np.array([1, 2]), np.array([7, 8, 9]), np.array([3, 4, 5, 6])]
    path = str(_write(tmp_path / "c", documents))
    status, out = _cli(["stats", path, "--duplicates", "--json"], capsys)
    assert status == 0
    result = json.loads(out)["duplicates"]
    assert (result["groups"], result["duplicate_documents"], result["duplicate_tokens"]) == (1, 1, 3)
    assert result["top"] == [{"size": 2, "length": 3, "documents": [0, 2]}]
    status, out = _cli(["stats", path, "--duplicates"], capsys)
    assert "exact duplicates: 1 of 4 documents are copies (25.00%), 3 tokens (25.00%), in 1 groups" in out
    status, out = _cli(["verify", path, "--max-duplicate-rate", "0.3"], capsys)
    assert (status, out.strip()) == (0, f"{path}: ok")
    status, out = _cli(["verify", path, "--max-duplicate-rate", "0.2", "--json"], capsys)
    report = json.loads(out)
    assert status == 1 and report[0]["problems"][0]["field"] == "duplicates"
    assert "1 of 4 documents are exact copies of another (25.00%" in report[0]["problems"][0]["message"]


# -- contamination -------------------------------------------------------------------------------------------


def _ngrams(ids: np.ndarray, n: int) -> set[tuple[int, ...]]:
    return {tuple(ids[p : p + n].tolist()) for p in range(len(ids) - n + 1)}


def _brute_force_contamination(documents: list[np.ndarray], items: list[np.ndarray], n: int) -> list[list[int]]:
    grams = [_ngrams(d, n) for d in documents]
    return [[k for k, g in enumerate(grams) if g & _ngrams(item, n)] for item in items]


def _planted_corpus(seed: int, n: int) -> tuple[list[np.ndarray], list[np.ndarray], list[set[int]]]:
    """A random corpus and eval set; 60 eval n-grams copied into random documents, and one split across two
    documents' boundary (not an n-gram of the corpus)."""
    rng = np.random.default_rng(seed)
    documents = [rng.integers(0, 3000, int(rng.integers(0, 200))) for _ in range(500)]
    items = [rng.integers(0, 3000, int(rng.integers(1, 60))) for _ in range(150)]
    planted: list[set[int]] = [set() for _ in items]
    while sum(map(len, planted)) < 60:
        item, document = int(rng.integers(len(items))), int(rng.integers(len(documents)))
        if len(items[item]) < n or len(documents[document]) < n or any(document in p for p in planted):
            continue  # one plant per document: a second could overwrite the first
        p, q = int(rng.integers(len(items[item]) - n + 1)), int(rng.integers(len(documents[document]) - n + 1))
        documents[document] = documents[document].copy()
        documents[document][q : q + n] = items[item][p : p + n]
        planted[item].add(document)
    long_item = next(k for k, item in enumerate(items) if len(item) >= n)
    half = n // 2
    documents[10] = np.concatenate([documents[10], items[long_item][:half]])
    documents[11] = np.concatenate([items[long_item][half:n], documents[11]])
    return documents, items, planted


def test_planted_eval_ngrams_are_found_exactly(tmp_path: Path) -> None:
    n = 13
    documents, items, planted = _planted_corpus(seed=21, n=n)
    with tokformats.open(_write(tmp_path / "c", documents)) as reader:
        found = tokformats.contamination(reader, items, ngram=n, chunk_tokens=50)  # windows straddle chunks
    expected = _brute_force_contamination(documents, items, n)
    assert [f.tolist() for f in found] == expected
    assert all(planted[k] <= set(expected[k]) for k in range(len(items)))  # no planted one missed
    assert all(f.dtype == np.int64 for f in found)
    assert sum(map(len, expected)) >= 55


def test_contamination_survives_forced_hash_collisions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    n = 8
    documents, items, _ = _planted_corpus(seed=22, n=n)
    original = contamination_module._RollingHash.windows

    def weak(self: Any, ids: np.ndarray) -> np.ndarray:
        return original(self, ids) & np.uint64(0xF)  # 16 hash values: almost every window is a candidate

    monkeypatch.setattr(contamination_module._RollingHash, "windows", weak)
    with tokformats.open(_write(tmp_path / "c", documents)) as reader:
        found = tokformats.contamination(reader, items, ngram=n, chunk_tokens=97)
    assert [f.tolist() for f in found] == _brute_force_contamination(documents, items, n)


def test_eval_items_shorter_than_the_ngram_match_nothing_and_empty_sets(tmp_path: Path) -> None:
    documents = [np.arange(1, 40), np.arange(100, 140)]
    items = [np.arange(5, 10), np.arange(101, 115), np.array([], dtype=np.int64)]
    with tokformats.open(_write(tmp_path / "c", documents)) as reader:
        found = tokformats.contamination(reader, items, ngram=13)
        assert [f.tolist() for f in found] == [[], [1], []]
        assert [f.tolist() for f in tokformats.contamination(reader, items, ngram=5)] == [[0], [1], []]
        assert tokformats.contamination(reader, [], ngram=13) == []
        with pytest.raises(tokformats.ConfigError, match="ngram must be at least 1"):
            tokformats.contamination(reader, items, ngram=0)


def test_contamination_of_texts_and_of_a_tokenized_eval_set(tmp_path: Path, tokenizer_path: Path) -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    questions = [
        "What is the capital of France? Paris is the capital and the largest city of the country.",
        "Which planet is known as the red planet in our solar system, the fourth from the sun?",
        "Short one.",
    ]
    corpus_texts = ["Some unrelated text about cooking pasta with tomatoes and basil for dinner tonight.",
                    "Trivia: " + questions[1] + " Mars, of course."]
    documents = [np.array(tokenizer.encode(t, add_special_tokens=False).ids) for t in corpus_texts]
    with tokformats.open(_write(tmp_path / "c", documents)) as reader:
        found = tokformats.contamination(reader, questions, tokenizer=tokenizer_path, ngram=8)
        assert [f.tolist() for f in found] == [[], [1], []]
        eval_ids = [np.array(tokenizer.encode(q, add_special_tokens=False).ids) for q in questions]
        with tokformats.open(_write(tmp_path / "eval", eval_ids)) as eval_reader:
            assert [f.tolist() for f in tokformats.contamination(reader, eval_reader, ngram=8)] == [[], [1], []]
        with pytest.raises(tokformats.ConfigError, match="pass tokenizer="):
            tokformats.contamination(reader, questions)
    assert [f.tolist() for f in tokformats.contamination(tmp_path / "c", eval_ids, ngram=8)] == [[], [1], []]


def test_cli_contamination_reads_jsonl_and_prints_a_table_and_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tokenizer_path: Path
) -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    questions = ["The quick brown fox jumps over the lazy dog near the river bank.", "Nothing matches this line!"]
    eval_file = tmp_path / "eval.jsonl"
    lines = [json.dumps({"question": questions[0]}), "", json.dumps({"question": questions[1]})]
    eval_file.write_text("\n".join(lines) + "\n")  # a blank line is no item
    documents = [np.array(tokenizer.encode(t, add_special_tokens=False).ids) for t in ("hello there", questions[0])]
    corpus = str(_write(tmp_path / "c", documents))
    args = ["contamination", corpus, "--eval", str(eval_file), "-t", str(tokenizer_path), "--text-key", "question"]
    status, out = _cli([*args, "--ngram", "6", "--json"], capsys)
    report = json.loads(out)
    assert status == 0
    assert (report["items"], report["contaminated_items"], report["ngram"]) == (2, 1, 6)
    assert report["matches"] == [{"item": 0, "line": 1, "documents": 1, "document_indices": [1]}]
    status, out = _cli([*args, "--ngram", "6"], capsys)
    assert out.splitlines()[0] == f"1 of 2 eval items (50.00%) share a 6-gram with documents of {corpus}"
    assert out.splitlines()[2].split() == ["1", "1", "1"]


def test_cli_stats_plot_draws_duplicate_group_sizes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib", reason="--plot draws with matplotlib, an optional extra")
    documents = [np.array([7, 8, 9]), np.array([1, 2]), np.array([7, 8, 9]), np.array([3, 4, 5, 6])]
    path = str(_write(tmp_path / "c", documents))
    status, _ = _cli(["stats", path, "--duplicates", "--plot", str(tmp_path / "p.png")], capsys)
    assert status == 0 and (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
