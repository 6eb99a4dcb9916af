"""Conformance suites for shard formats and source adapters (needs pytest).

Subclass :class:`ShardFormatTests` and provide a ``shard_format`` fixture (a fresh
ShardFormat); subclass :class:`SourceAdapterTests` and provide ``adapter``, ``source`` (a
real file and the samples expected from it) and ``corrupt_source`` (a broken file of that
kind). Third-party formats and adapters can reuse these suites unchanged.
"""

# Test methods of a conformance suite document themselves by name, as in simstore.testing.
# ruff: noqa: D102

from __future__ import annotations

import io
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from simstore.errors import FormatError, InvalidInputError, SourceError
from simstore.ingest import is_array_source
from simstore.protocols import ShardFormat, ShardReader, SourceAdapter
from simstore.sample import Sample, hash_sample

from ._registry import open_shard

__all__ = ["ShardFormatTests", "SourceAdapterTests", "assert_fields_equal", "example_samples"]


def example_samples(n: int = 6, seed: int = 0) -> list[Sample]:
    """Samples that exercise every field kind, uniform and varying shapes, missing fields."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        fields: dict[str, Any] = {
            "velocity": rng.standard_normal((3, 4, 2)).astype(np.float32),
            "points": rng.random((5 + i, 3)),
            "cells/triangle": rng.integers(0, 5, size=(2 + i, 3)).astype(np.int64),
            "mask": rng.random(4) > 0.5,
            "Re": float(100 + i),
            "steps": int(i),
            "dt": np.float32(0.5 * i),
            "name": f"run-{i}",
            "raw": bytes(rng.integers(0, 255, size=i, dtype=np.uint8)),
            "metadata": {"solver": "demo", "i": i, "tags": ["a", "b"]},
        }
        if i % 3 == 2:
            del fields["cells/triangle"]
            del fields["name"]
        out.append(Sample(f"sample/{i:03d}", fields))
    return out


def _materialise(value: Any) -> Any:
    if is_array_source(value):
        return np.asarray(value[tuple(slice(0, n) for n in value.shape)])
    return value


def assert_fields_equal(got: Mapping[str, Any], want: Mapping[str, Any]) -> None:
    """Field dicts equal in names, kinds, dtypes, shapes and values (and in hash)."""
    assert sorted(got) == sorted(want)
    got = {n: _materialise(v) for n, v in got.items()}
    want = {n: _materialise(v) for n, v in want.items()}
    for name, value in want.items():
        g = got[name]
        if isinstance(value, np.ndarray):
            assert isinstance(g, np.ndarray), name
            assert g.dtype == value.dtype, (name, g.dtype, value.dtype)
            assert g.shape == value.shape, (name, g.shape, value.shape)
            np.testing.assert_array_equal(g, value)
        else:
            assert type(g) is type(value) or (
                isinstance(value, Mapping) and isinstance(g, Mapping)
            ), (name, type(g), type(value))
            assert g == value, name
    assert hash_sample(Sample("k", dict(got))) == hash_sample(Sample("k", dict(want)))


class ShardFormatTests:
    """Behaviour every ShardFormat must show. Subclasses supply ``shard_format``."""

    @pytest.fixture
    def shard_format(self) -> ShardFormat:  # pragma: no cover - overridden
        raise NotImplementedError

    @pytest.fixture
    def samples(self) -> list[Sample]:
        return example_samples()

    def write(self, fmt: ShardFormat, samples: list[Sample], path: Path) -> Path:
        result = fmt.write(samples, str(path))
        assert [w.position for w in result.samples] == list(range(len(samples)))
        assert [w.key for w in result.samples] == [s.key for s in samples]
        assert [w.sample_hash for w in result.samples] == [hash_sample(s) for s in samples]
        return path

    def open(self, fmt: ShardFormat, path: Path) -> ShardReader:
        return fmt.open(str(path))

    def test_round_trip(
        self, shard_format: ShardFormat, samples: list[Sample], tmp_path: Path
    ) -> None:
        path = self.write(shard_format, samples, tmp_path / "shard")
        reader = self.open(shard_format, path)
        try:
            got = list(reader.read(range(len(samples))))
        finally:
            reader.close()
        assert len(got) == len(samples)
        for g, s in zip(got, samples, strict=True):
            assert_fields_equal(g, s.fields)

    def test_same_samples_same_bytes(
        self, shard_format: ShardFormat, samples: list[Sample], tmp_path: Path
    ) -> None:
        a = self.write(shard_format, samples, tmp_path / "a").read_bytes()
        b = self.write(shard_format, samples, tmp_path / "b").read_bytes()
        assert a == b
        c = self.write(shard_format, samples[::-1], tmp_path / "c").read_bytes()
        assert c != a

    def test_pickled_format_writes_the_same_bytes(
        self, shard_format: ShardFormat, samples: list[Sample], tmp_path: Path
    ) -> None:
        clone = pickle.loads(pickle.dumps(shard_format))
        a = self.write(shard_format, samples, tmp_path / "a").read_bytes()
        b = self.write(clone, samples, tmp_path / "b").read_bytes()
        assert a == b

    def test_positions_in_the_order_given(
        self, shard_format: ShardFormat, samples: list[Sample], tmp_path: Path
    ) -> None:
        reader = self.open(shard_format, self.write(shard_format, samples, tmp_path / "s"))
        try:
            got = list(reader.read([4, 0, 4, 2]))
        finally:
            reader.close()
        for g, i in zip(got, [4, 0, 4, 2], strict=True):
            assert_fields_equal(g, samples[i].fields)

    def test_projection_reads_only_requested_fields(
        self, shard_format: ShardFormat, samples: list[Sample], tmp_path: Path
    ) -> None:
        reader = self.open(shard_format, self.write(shard_format, samples, tmp_path / "s"))
        try:
            got = list(reader.read([1, 2], fields=["Re", "points", "name", "nope"]))
            empty = list(reader.read([0], fields=[]))
        finally:
            reader.close()
        assert sorted(got[0]) == ["Re", "name", "points"]
        assert sorted(got[1]) == ["Re", "points"]  # sample 2 lacks "name"
        np.testing.assert_array_equal(got[0]["points"], samples[1].fields["points"])
        assert empty == [{}]

    def test_out_of_range_position(
        self, shard_format: ShardFormat, samples: list[Sample], tmp_path: Path
    ) -> None:
        reader = self.open(shard_format, self.write(shard_format, samples, tmp_path / "s"))
        try:
            with pytest.raises(InvalidInputError, match="out of range"):
                list(reader.read([len(samples)]))
        finally:
            reader.close()

    def test_sniff_and_open_shard(
        self, shard_format: ShardFormat, samples: list[Sample], tmp_path: Path
    ) -> None:
        data = self.write(shard_format, samples, tmp_path / "s").read_bytes()
        assert shard_format.sniff(data[:8], data[-8:])
        assert not shard_format.sniff(b"\x00" * 8, b"\x00" * 8)
        reader = open_shard(tmp_path / "s")
        try:
            assert_fields_equal(next(iter(reader.read([3]))), samples[3].fields)
        finally:
            reader.close()

    def test_open_from_file_object(
        self, shard_format: ShardFormat, samples: list[Sample], tmp_path: Path
    ) -> None:
        if not shard_format.supports_file_objects:
            pytest.skip("format reads paths only")
        data = self.write(shard_format, samples, tmp_path / "s").read_bytes()
        reader = open_shard(io.BytesIO(data))
        try:
            assert_fields_equal(next(iter(reader.read([5]))), samples[5].fields)
        finally:
            reader.close()

    def test_truncated_shard_is_a_format_error(
        self, shard_format: ShardFormat, samples: list[Sample], tmp_path: Path
    ) -> None:
        data = self.write(shard_format, samples, tmp_path / "s").read_bytes()
        bad = tmp_path / "bad"
        bad.write_bytes(data[: len(data) // 2])
        with pytest.raises(FormatError):
            reader = shard_format.open(str(bad))
            try:
                list(reader.read(range(len(samples))))
            finally:
                reader.close()

    def test_embedded_statistics(
        self, shard_format: ShardFormat, samples: list[Sample], tmp_path: Path
    ) -> None:
        opener = getattr(shard_format, "open_writer", None)
        if opener is None:
            pytest.skip("format has no streaming writer")
        writer = opener(str(tmp_path / "s"))
        for s in samples:
            writer.add(s, sample_hash=hash_sample(s), size_bytes=1)
        stats = {"Re": {"count": [len(samples)], "mean": [102.5]}}
        writer.close(stats=stats)
        reader = self.open(shard_format, tmp_path / "s")
        try:
            assert reader.stats == stats  # type: ignore[attr-defined]
            assert reader.keys() == [s.key for s in samples]  # type: ignore[attr-defined]
        finally:
            reader.close()

    def test_abort_leaves_no_file(
        self, shard_format: ShardFormat, samples: list[Sample], tmp_path: Path
    ) -> None:
        opener = getattr(shard_format, "open_writer", None)
        if opener is None:
            pytest.skip("format has no streaming writer")
        writer = opener(str(tmp_path / "s"))
        writer.add(samples[0], sample_hash=hash_sample(samples[0]), size_bytes=1)
        writer.abort()
        assert not (tmp_path / "s").exists()


class SourceAdapterTests:
    """Behaviour every SourceAdapter must show. Subclasses supply the fixtures."""

    @pytest.fixture
    def adapter(self) -> SourceAdapter:  # pragma: no cover - overridden
        raise NotImplementedError

    @pytest.fixture
    def source(self, tmp_path: Path) -> tuple[Path, str, dict[str, dict[str, Any]]]:
        """(file, key, {expected sample key: expected fields})."""
        raise NotImplementedError  # pragma: no cover - overridden

    @pytest.fixture
    def corrupt_source(self, tmp_path: Path) -> Path:  # pragma: no cover - overridden
        raise NotImplementedError

    options: dict[str, Any] = {}

    def head(self, path: Path) -> bytes:
        return b"" if path.is_dir() else path.read_bytes()[:64]

    def test_declares_itself(self, adapter: SourceAdapter) -> None:
        assert isinstance(adapter, SourceAdapter)
        assert adapter.name and adapter.version
        assert isinstance(adapter.extensions, tuple)

    def test_reads_its_file(
        self, adapter: SourceAdapter, source: tuple[Path, str, dict[str, dict[str, Any]]]
    ) -> None:
        path, _, _ = source
        assert adapter.can_read(str(path), self.head(path))

    def test_samples_equal_the_source(
        self, adapter: SourceAdapter, source: tuple[Path, str, dict[str, dict[str, Any]]]
    ) -> None:
        path, key, expected = source
        # lazy fields are valid only until the iterator moves on: read them right away
        got = {
            s.key: {n: _materialise(v) for n, v in s.fields.items()}
            for s in adapter.iter_samples(str(path), key, self.options)
        }
        assert sorted(got) == sorted(expected)
        for k, fields in expected.items():
            assert_fields_equal(got[k], fields)

    def test_corrupt_file_is_a_source_error_naming_it(
        self, adapter: SourceAdapter, corrupt_source: Path
    ) -> None:
        with pytest.raises(SourceError) as info:
            for _ in adapter.iter_samples(str(corrupt_source), corrupt_source.name, self.options):
                pass
        assert str(corrupt_source) in str(info.value)
        assert "\n" not in str(info.value)

    def test_adapter_pickles(self, adapter: SourceAdapter) -> None:
        clone = pickle.loads(pickle.dumps(adapter))
        assert clone.name == adapter.name
