"""The conformance suite every token format's reader/writer pair passes, shipped for plugins (as ``zarr.testing``).

A format's test module subclasses :class:`TokenFormatTests` and says how to write (``write_options``),
how to open what was written (``open_written``), and what a document looks like when read back
(``expected``: formats with implicit delimiters add one). Everything else is shared: round trips, ids at the
dtype's limits and refusals, atomic commits, pickling (also of a reader opened with defaults), ``close()``
releasing every map, conversion, and detection of the format's output as itself and as no other format.

>>> from tokformats.testing import TokenFormatTests                      # doctest: +SKIP
>>> class TestMyFormat(TokenFormatTests):
...     format = "myformat"

Needs pytest (``pip install tokformats[test]``).
"""

from __future__ import annotations

import itertools
import pickle
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

import tokformats

from . import OutputExistsError, TokenRangeError
from .core.conformance import conformance_problems
from .core.registry import formats as format_table

__all__ = ["TokenFormatTests", "random_corpus"]


def random_corpus(
    rng: np.random.Generator, documents: int, *, low: int, high: int, mean_length: int = 40
) -> tuple[np.ndarray, np.ndarray]:
    """``documents`` documents of ids in ``[low, high]`` with geometric lengths, some empty."""
    lengths = rng.geometric(1 / mean_length, size=documents).astype(np.int64) - 1
    if documents:
        lengths[rng.integers(0, documents, size=max(1, documents // 10))] = 0
    flat = rng.integers(low, high, size=int(lengths.sum()), endpoint=True, dtype=np.int64)
    return flat, lengths


class TokenFormatTests:
    """Round trips, limits, refusals, atomicity, pickling and indexing for one format."""

    format: ClassVar[str]
    #: dtypes to exercise; the first is the default one.
    dtypes: ClassVar[tuple[str, ...]] = ("uint16",)
    #: Smallest id documents may use (formats that split at a delimiter keep it out of documents).
    low_id: ClassVar[int] = 0
    #: An id random corpora (ids up to 900) never use: a delimiter a conversion may add.
    free_id: ClassVar[int] = 950
    #: Output names in this format: a file suffix, or "" for a prefix or folder.
    suffix: ClassVar[str] = ""
    #: Whether the same documents always give the same bytes whatever the output's name.
    name_independent_bytes: ClassVar[bool] = True
    #: Tokens of the single document of ``test_huge_document``.
    huge_tokens: ClassVar[int] = 3_000_000

    # -- hooks ---------------------------------------------------------------------------
    def write_options(self) -> dict[str, Any]:
        """Extra options for ``tokformats.create``."""
        return {}

    def source(self, target: Path) -> Any:
        """What to pass to ``tokformats.open`` for the dataset written at ``target``."""
        return target

    def read_options(self, dtype: str) -> dict[str, Any]:
        """Options ``tokformats.open`` needs for it (none when the format is detected)."""
        return {}

    def open_written(self, target: Path, dtype: str) -> tokformats.TokenReader:
        """Open what was written at ``target``."""
        reader = tokformats.open(self.source(target), **self.read_options(dtype))
        assert isinstance(reader, tokformats.TokenReader)
        return reader

    def expected(self, document: np.ndarray) -> np.ndarray:
        """What the reader returns for a written document."""
        return document

    def convert_options(self) -> dict[str, Any]:
        """Writer options for converting into this format (none that add delimiters)."""
        return {}

    # -- helpers -------------------------------------------------------------------------
    def target(self, tmp_path: Path, name: str = "corpus") -> Path:
        return tmp_path / "out" / f"{name}{self.suffix}"

    def write(
        self, target: Path, flat: np.ndarray, lengths: np.ndarray, dtype: str | None = None, **extra: Any
    ) -> None:
        options = {"dtype": dtype or self.dtypes[0], **self.write_options(), **extra}
        with tokformats.create(target, self.format, **options) as writer:
            assert isinstance(writer, tokformats.TokenWriter)
            writer.write_batch(flat, lengths)

    def check_round_trip(self, reader: tokformats.TokenReader, flat: np.ndarray, lengths: np.ndarray) -> None:
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        assert len(reader) == len(lengths)
        expected = [self.expected(flat[offsets[k] : offsets[k + 1]]) for k in range(len(lengths))]
        for k, document in enumerate(expected):
            np.testing.assert_array_equal(np.asarray(reader[k]), document, err_msg=f"document {k}")
        np.testing.assert_array_equal(reader.lengths, [len(d) for d in expected])
        assert reader.num_tokens == sum(len(d) for d in expected)

    # -- the suite -----------------------------------------------------------------------
    def test_module_keeps_the_format_module_contract(self) -> None:
        """The module the descriptor names has what tokformats looks up in it (:mod:`tokformats.core.format_module`)."""
        module = format_table[self.format].load()
        assert conformance_problems(module) == []

    @pytest.mark.parametrize("seed", [0, 1])
    @pytest.mark.filterwarnings("ignore::tokformats.DataWarning")  # ids across the whole dtype range look odd
    def test_round_trip_random_corpus(self, tmp_path: Path, seed: int) -> None:
        for dtype in self.dtypes:
            rng = np.random.default_rng(seed)
            top = int(min(np.iinfo(dtype).max, 2**31 - 1)) if np.dtype(dtype).kind in "iu" else 1000
            flat, lengths = random_corpus(rng, 300, low=self.low_id, high=top)
            target = self.target(tmp_path, f"c{seed}{dtype}")
            self.write(target, flat, lengths, dtype)
            with self.open_written(target, dtype) as reader:
                assert reader.format == self.format
                assert reader.dtype == np.dtype(dtype)
                self.check_round_trip(reader, flat, lengths)

    def test_loss_masks_round_trip_or_are_refused(self, tmp_path: Path) -> None:
        """A format that stores loss masks gives them back parallel to the tokens; one that does not refuses a mask
        (a :class:`tokformats.FormatError`) and writes nothing."""
        rng = np.random.default_rng(9)
        flat, lengths = random_corpus(rng, 40, low=self.low_id, high=1000)
        mask = rng.integers(0, 2, len(flat)).astype(np.uint8)
        target = self.target(tmp_path, "masked")
        options = {"dtype": self.dtypes[0], **self.write_options()}
        from .api import corpus_writer, create_corpus
        from .errors import FormatError

        if not corpus_writer(self.format).stores_loss_mask:
            with pytest.raises(FormatError, match="stores no loss mask"), create_corpus(
                target, self.format, **options
            ) as writer:
                writer.write_batch(flat, lengths, mask)
            assert not target.exists()
            return
        with create_corpus(target, self.format, **options) as writer:
            writer.write_batch(flat, lengths, mask)
        with self.open_written(target, self.dtypes[0]) as reader:
            masks = reader.loss_masks
            assert masks is not None and len(masks) == reader.num_tokens
            offsets = np.concatenate([[0], np.cumsum(lengths)])
            for k in range(len(lengths)):
                document = flat[offsets[k] : offsets[k + 1]]
                if len(self.expected(document)) == len(document):  # no delimiter added: the mask is as written
                    np.testing.assert_array_equal(reader.loss_mask(k), mask[offsets[k] : offsets[k + 1]])

    def test_write_and_write_batch_agree(self, tmp_path: Path) -> None:
        flat, lengths = random_corpus(np.random.default_rng(5), 50, low=self.low_id, high=1000)
        one, many = self.target(tmp_path, "one"), self.target(tmp_path, "many")
        with tokformats.create(one, self.format, dtype=self.dtypes[0], **self.write_options()) as writer:
            offsets = np.concatenate([[0], np.cumsum(lengths)])
            for k in range(len(lengths)):
                writer.write(flat[offsets[k] : offsets[k + 1]].tolist())
        self.write(many, flat, lengths)
        with self.open_written(one, self.dtypes[0]) as a, self.open_written(many, self.dtypes[0]) as b:
            self.check_round_trip(a, flat, lengths)
            np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
            if self.name_independent_bytes:
                assert [f.read_bytes() for f in a.files] == [f.read_bytes() for f in b.files]

    def test_batches_from_one_refilled_buffer(self, tmp_path: Path) -> None:
        # A loader refills one array for every batch: a writer that keeps a view of it until a later flush would
        # write the last batch's ids in place of the earlier ones.
        flat, lengths = random_corpus(np.random.default_rng(6), 60, low=self.low_id, high=1000)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        target, cuts = self.target(tmp_path), [0, 20, 40, 60]
        buffer, sizes = np.empty(len(flat), dtype=self.dtypes[0]), np.empty(len(lengths), dtype=np.int64)
        with tokformats.create(target, self.format, dtype=self.dtypes[0], **self.write_options()) as writer:
            assert isinstance(writer, tokformats.TokenWriter)
            for first, stop in itertools.pairwise(cuts):
                count = int(offsets[stop] - offsets[first])
                buffer[:count] = flat[offsets[first] : offsets[stop]]
                sizes[: stop - first] = lengths[first:stop]
                writer.write_batch(buffer[:count], sizes[: stop - first])
                buffer[:], sizes[:] = self.free_id % 256, 0  # what the next refill overwrites
        with self.open_written(target, self.dtypes[0]) as reader:
            self.check_round_trip(reader, flat, lengths)

    def test_empty_corpus(self, tmp_path: Path) -> None:
        target = self.target(tmp_path)
        self.write(target, np.zeros(0, np.int64), np.zeros(0, np.int64))
        with self.open_written(target, self.dtypes[0]) as reader:
            assert len(reader) == 0
            assert reader.num_tokens == 0
            assert reader.lengths.tolist() == []
            assert list(reader) == []
            with pytest.raises(IndexError):
                reader[0]

    def test_empty_documents(self, tmp_path: Path) -> None:
        flat = np.array([self.low_id + 1, self.low_id + 2], dtype=np.int64)
        lengths = np.array([0, 1, 0, 0, 1, 0])
        target = self.target(tmp_path)
        self.write(target, flat, lengths)
        with self.open_written(target, self.dtypes[0]) as reader:
            self.check_round_trip(reader, flat, lengths)

    def integer_dtypes(self) -> list[str]:
        """The integer dtypes among :attr:`dtypes` (range refusals only apply to them)."""
        return [d for d in self.dtypes if np.dtype(d).kind in "iu"]

    def test_ids_at_dtype_limits(self, tmp_path: Path) -> None:
        for dtype in self.dtypes:
            if np.dtype(dtype).kind == "f":
                finfo = np.finfo(dtype)
                flat = np.array([finfo.min, finfo.max, finfo.tiny, -0.0, 1.0], dtype=np.float64)
                lengths = np.array([2, 3])
                target = self.target(tmp_path, f"limits{dtype}")
                self.write(target, flat, lengths, dtype)
                with self.open_written(target, dtype) as reader:
                    self.check_round_trip(reader, flat.astype(dtype), lengths)
                for bad in (np.inf, -np.inf, np.nan):  # never stored silently (issue 15, item 7)
                    with pytest.raises(TokenRangeError, match="not a finite number"):
                        self.write(self.target(tmp_path, f"bad{dtype}"), np.array([1.0, bad]), np.array([2]), dtype)
                continue
            info = np.iinfo(dtype)
            low = max(int(info.min), self.low_id)
            top = int(info.max)
            flat = np.array([low, top, top - 1, low + 1], dtype=np.int64)
            lengths = np.array([2, 2])
            target = self.target(tmp_path, f"limits{dtype}")
            self.write(target, flat, lengths, dtype)
            with self.open_written(target, dtype) as reader:
                self.check_round_trip(reader, flat, lengths)

    def test_out_of_range_ids_are_refused_naming_document_and_value(self, tmp_path: Path) -> None:
        if not self.integer_dtypes():
            pytest.skip("no integer dtype: nothing is out of range")
        dtype = min(self.integer_dtypes(), key=lambda d: int(np.iinfo(d).max))  # the narrowest: a too-large id exists
        too_big = int(np.iinfo(dtype).max) + 1
        flat = np.array([self.low_id + 1, self.low_id + 2, self.low_id + 3, too_big], dtype=np.int64)
        target = self.target(tmp_path)
        with pytest.raises(TokenRangeError, match=rf"document 2 holds the value {too_big}"):
            self.write(target, flat, np.array([1, 2, 1]), dtype)
        assert not list(tmp_path.rglob("*")) or all(p.is_dir() for p in tmp_path.rglob("*"))
        if np.iinfo(dtype).min == 0:
            with pytest.raises(TokenRangeError, match=r"document 0 holds the value -1"):
                self.write(target, np.array([-1]), np.array([1]), dtype)

    def test_vocab_size_is_enforced(self, tmp_path: Path) -> None:
        with pytest.raises(TokenRangeError, match=r"document 1 holds the value 1000 .* below vocab_size 1,000"):
            options = {**self.write_options(), **({"dtype": self.integer_dtypes()[0]} if self.integer_dtypes() else {})}
            with tokformats.create(self.target(tmp_path), self.format, vocab_size=1000, **options) as w:
                w.write([self.low_id + 1, 999])
                w.write([1000])

    def test_exception_inside_with_leaves_nothing(self, tmp_path: Path) -> None:
        target = self.target(tmp_path)
        with pytest.raises(RuntimeError, match="boom"):
            with tokformats.create(target, self.format, dtype=self.dtypes[0], **self.write_options()) as writer:
                writer.write([self.low_id + 1] * 1000)
                raise RuntimeError("boom")
        assert list(tmp_path.iterdir()) == [], "an aborted writer must leave no file and no folder it made"

    def test_existing_output_needs_overwrite(self, tmp_path: Path) -> None:
        target = self.target(tmp_path)
        first = np.array([self.low_id + 1, self.low_id + 2]), np.array([2])
        second = np.array([self.low_id + 3]), np.array([1])
        self.write(target, *first)
        with pytest.raises(OutputExistsError, match="overwrite=True"):
            self.write(target, *second)
        with self.open_written(target, self.dtypes[0]) as reader:  # untouched
            self.check_round_trip(reader, *first)
        self.write(target, *second, overwrite=True)
        with self.open_written(target, self.dtypes[0]) as reader:
            self.check_round_trip(reader, *second)

    def required_read_options(self, dtype: str) -> dict[str, Any]:
        """The options without which the format cannot be opened at all (raw: its format and dtype)."""
        return {}

    def test_pickle_of_a_reader_opened_with_defaults(self, tmp_path: Path) -> None:
        """Regression (issue 11, item 6): a reader must pickle its resolved options, not a sentinel."""
        flat, lengths = random_corpus(np.random.default_rng(12), 25, low=self.low_id, high=500)
        target = self.target(tmp_path)
        self.write(target, flat, lengths)
        with tokformats.open(self.source(target), **self.required_read_options(self.dtypes[0])) as reader:
            assert isinstance(reader, tokformats.TokenReader)
            clone = pickle.loads(pickle.dumps(reader))
            assert type(clone) is type(reader) and len(clone) == len(reader)
            np.testing.assert_array_equal(clone.lengths, reader.lengths)
            np.testing.assert_array_equal(np.asarray(clone.tokens), np.asarray(reader.tokens))
            for name in ("eos", "bos"):
                assert getattr(clone, name, None) == getattr(reader, name, None)
                assert isinstance(getattr(clone, name, None), (int, type(None)))
            clone.close()

    def test_detected_as_itself_and_nothing_else(self, tmp_path: Path) -> None:
        """The detection matrix's row for this format: its output is recognised by its own format's detector and
        by no other registered detector."""
        flat, lengths = random_corpus(np.random.default_rng(13), 12, low=self.low_id, high=500)
        target = self.target(tmp_path)
        self.write(target, flat, lengths)
        with self.open_written(target, self.dtypes[0]) as reader:
            probe = reader.path
        for name, entry in format_table.items():
            claims = entry.detect(probe)
            if name == self.format:
                assert claims == entry.detectable, f"{name} does not recognise its own output {probe}"
            else:
                assert not claims, f"{name} claims {probe}, written as {self.format}"

    def test_close_releases_every_map(self, tmp_path: Path) -> None:
        """After close() (and once no document view is kept), none of the dataset's files stays mapped."""
        import gc
        import sys

        if not sys.platform.startswith("linux"):
            pytest.skip("reads /proc/self/maps")
        flat, lengths = random_corpus(np.random.default_rng(9), 30, low=self.low_id, high=500)
        target = self.target(tmp_path)
        self.write(target, flat, lengths)
        reader = self.open_written(target, self.dtypes[0])
        total = sum(int(np.asarray(d).sum()) for d in reader) + int(reader.lengths.sum())
        assert total >= 0
        files = {str(p.resolve()) for p in reader.files}
        reader.close()
        gc.collect()
        with open("/proc/self/maps") as maps:
            mapped = {line.split(maxsplit=5)[-1].strip() for line in maps if "/" in line}
        assert not files & mapped, sorted(files & mapped)
        assert len(reader[0]) == len(self.expected(flat[: lengths[0]]))  # usable again after close: maps anew
        reader.close()

    def test_pickle_reopens_by_path(self, tmp_path: Path) -> None:
        flat, lengths = random_corpus(np.random.default_rng(2), 20, low=self.low_id, high=500)
        target = self.target(tmp_path)
        self.write(target, flat, lengths)
        with self.open_written(target, self.dtypes[0]) as reader:
            payload = pickle.dumps(reader)
            assert len(payload) < 4096, "a reader pickles by path, not by data"
            clone = pickle.loads(payload)
            self.check_round_trip(clone, flat, lengths)
            clone.close()

    def test_indexing_slicing_and_iteration(self, tmp_path: Path) -> None:
        flat, lengths = random_corpus(np.random.default_rng(3), 30, low=self.low_id, high=500)
        target = self.target(tmp_path)
        self.write(target, flat, lengths)
        with self.open_written(target, self.dtypes[0]) as reader:
            documents = list(reader)
            assert len(documents) == 30
            np.testing.assert_array_equal(reader[-1], documents[-1])
            np.testing.assert_array_equal(reader[np.int64(-30)], documents[0])
            for got, want in zip(reader[3:9:2], documents[3:9:2]):
                np.testing.assert_array_equal(got, want)
            assert reader[5:2] == []
            with pytest.raises(IndexError):
                reader[30]
            with pytest.raises(IndexError):
                reader[-31]
            with pytest.raises(TypeError):
                reader["0"]  # type: ignore[call-overload]
            assert not reader[0].flags.writeable
            assert repr(reader).startswith(f"<tokformats.{self.format}")
            assert "documents=30" in repr(reader)
            assert "<table>" in reader._repr_html_()

    def test_huge_document(self, tmp_path: Path) -> None:
        flat = (np.arange(self.huge_tokens, dtype=np.int64) % 50_000) + self.low_id + 1
        target = self.target(tmp_path)
        self.write(target, flat, np.array([len(flat)]))
        with self.open_written(target, self.dtypes[0]) as reader:
            self.check_round_trip(reader, flat, np.array([len(flat)]))

    def test_lengths_must_match_tokens(self, tmp_path: Path) -> None:
        with pytest.raises(TokenRangeError, match="lengths add up to 3 tokens but 2 tokens were given"):
            self.write(self.target(tmp_path), np.array([self.low_id + 1] * 2), np.array([1, 2]))

    def test_convert_to_raw_and_back_preserves_tokens(self, tmp_path: Path) -> None:
        flat, lengths = random_corpus(np.random.default_rng(4), 40, low=self.low_id, high=900)
        source = self.target(tmp_path, "src")
        self.write(source, flat, lengths)
        with self.open_written(source, self.dtypes[0]) as reader:
            stream = np.asarray(reader.tokens).copy()
            documents = len(reader)
        options = self.read_options(self.dtypes[0])
        summary = tokformats.convert(
            self.source(source),
            tmp_path / "flat.bin",
            "raw",
            source_format=options.pop("format", None),
            source_options=options,
            keep_boundaries=False,
        )
        assert summary["tokens"] == len(stream) and summary["documents"] == min(documents, 1)
        assert summary["read_with"] == {"format": "raw", "dtype": summary["dtype"]}
        with tokformats.open(tmp_path / "flat.bin", **summary["read_with"]) as raw:
            assert isinstance(raw, tokformats.TokenReader)
            np.testing.assert_array_equal(np.asarray(raw.tokens), stream)
        # By default the boundaries survive: an EOS id that occurs in no document is added to each one.
        options = self.read_options(self.dtypes[0])
        with self.open_written(source, self.dtypes[0]) as reader:
            originals = [np.asarray(d).tolist() for d in reader]
        summary = tokformats.convert(
            self.source(source),
            tmp_path / "kept.bin",
            "raw",
            source_format=options.pop("format", None),
            source_options=options,
            eos=self.free_id,
        )
        assert summary["documents"] == documents
        assert summary["read_with"] == {"format": "raw", "dtype": summary["dtype"], "eos": self.free_id}
        with tokformats.open(tmp_path / "kept.bin", **summary["read_with"]) as kept:
            assert [np.asarray(d).tolist() for d in kept] == [[*d, self.free_id] for d in originals]
        # Converting into the same format keeps documents; no delimiter options, the stream holds them.
        back = self.target(tmp_path, "back")
        options = self.read_options(self.dtypes[0])
        tokformats.convert(
            self.source(source),
            back,
            self.format,
            source_format=options.pop("format", None),
            source_options=options,
            **self.convert_options(),
        )
        with self.open_written(back, self.dtypes[0]) as again, self.open_written(source, self.dtypes[0]) as original:
            np.testing.assert_array_equal(np.asarray(again.tokens), stream)
            np.testing.assert_array_equal(again.lengths, original.lengths)

    def test_converts_to_and_from_every_format(self, tmp_path: Path) -> None:
        """Into every other corpus format and back: the same documents (a delimiter the way through added stays
        at its end, or start), the same token count."""
        from .api import corpus_writers

        flat, lengths = random_corpus(np.random.default_rng(21), 15, low=max(self.low_id, 1), high=900)
        source = self.target(tmp_path, "src")
        self.write(source, flat, lengths)
        options = self.read_options(self.dtypes[0])
        source_format = options.pop("format", None)
        with tokformats.open(self.source(source), format=source_format, **options) as reader:
            originals = [np.asarray(d).tolist() for d in reader]
        for name, writer in corpus_writers().items():
            middle = writer.output_path(tmp_path / f"via_{name}", "text", None, False)
            conventions: dict[str, dict[str, Any]] = {"eos": {"eos": self.free_id}, "bos": {"bos": self.free_id}}
            # A destination with the source's own convention reuses the source's delimiter; another one gets ours.
            same = writer.boundaries == corpus_writers()[self.format].boundaries
            delimiter = conventions.get(writer.boundaries, {}) if not same else {}
            try:
                there = tokformats.convert(
                    self.source(source), middle, name, source_format=source_format, source_options=options, **delimiter
                )
            except ImportError:  # a format whose optional dependency is not installed here (hf without pyarrow)
                continue
            opened = middle if middle.exists() else there["files"][0]
            how = dict(there["read_with"])
            if not format_table[name].detectable:  # headerless: say what it is
                how.update(format=name, dtype=there["dtype"])
            back = self.target(tmp_path, f"back_{name}")
            tokformats.convert(opened, back, self.format, source_format=how.pop("format", None), source_options=how,
                               dtype=self.dtypes[0], **self.convert_options())  # fmt: skip
            with self.open_written(back, self.dtypes[0]) as again:
                got = [np.asarray(d).tolist() for d in again]
            added = [self.free_id] if delimiter else []
            want = [
                ([*d, *added] if "eos" in delimiter else [*added, *d]) if added else d for d in originals
            ]
            assert got == [self.expected(np.array(w)).tolist() for w in want] or got == want, name
