"""What the Parquet and Lance shards share: a buffering writer and a by-position reader.

A columnar shard needs its whole schema before its first row group (a field's layout,
fixed-shape or varying, depends on every sample in the shard), so the writer buffers the
shard's samples in memory (bounded by the ingest's ``shard_size``) and writes row groups
of about ``row_group_bytes`` on ``close``. Lazy array sources are read whole on ``add``:
the pipeline routes big dense fields to Zarr, so only small ones arrive here.
"""

from __future__ import annotations

import errno
import os
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from simstore.errors import InvalidInputError, StorageError
from simstore.ingest import ShardOptions, parse_compression
from simstore.protocols import ShardWriteResult, WrittenSample
from simstore.sample import FieldValue, Sample, Schema

from ._arrow import (
    KEY_COLUMN,
    SMALL_TENSOR_BYTES,
    ColumnPlan,
    arrow_schema,
    check_column_types,
    encode_table,
    materialise,
    plan_columns,
    shard_document,
)
from ._arrow_decode import Out, decode_pieces, decode_rows, mapped_out

__all__ = ["ColumnarReader", "ColumnarWriter", "row_groups"]


def row_groups(samples: Sequence[Sample], sizes: Sequence[int], target_bytes: int) -> list[slice]:
    """Cut samples into runs of about ``target_bytes`` logical bytes (at least one sample)."""
    out: list[slice] = []
    start, acc = 0, 0
    for i, size in enumerate(sizes):
        acc += size
        if acc >= target_bytes:
            out.append(slice(start, i + 1))
            start, acc = i + 1, 0
    if start < len(samples):
        out.append(slice(start, len(samples)))
    return out


def write_error(path: str, exc: OSError) -> StorageError:
    """A :class:`StorageError` for a shard file that could not be written, naming it."""
    if exc.errno == errno.ENOSPC or "No space left on device" in str(exc):
        why = "no space left on device"
    else:
        why = exc.strerror or str(exc)
    return StorageError(f"{path}: writing the shard failed: {why}")


class ColumnarWriter(ABC):
    """Buffers one shard's samples and writes them as row groups on ``close``."""

    fixed_tensor_bytes = SMALL_TENSOR_BYTES
    """Uniform tensors up to this size per sample are fixed-shape columns, larger blobs."""

    def __init__(self, path: str, options: ShardOptions) -> None:
        self.path = path
        self.options = options
        self._samples: list[Sample] = []
        self._sizes: list[int] = []
        self._written: list[WrittenSample] = []
        self._closed = False

    def add(self, sample: Sample, *, sample_hash: str, size_bytes: int) -> WrittenSample:
        """Buffer one sample (lazy fields are read now, while their source is open)."""
        if self._closed:
            raise InvalidInputError(f"shard writer for {self.path} is closed")
        fields = {name: materialise(value) for name, value in sample.fields.items()}
        self._samples.append(Sample(sample.key, fields))
        self._sizes.append(size_bytes)
        ws = WrittenSample(
            key=sample.key,
            sample_hash=sample_hash,
            position=len(self._written),
            size_bytes=size_bytes,
        )
        self._written.append(ws)
        return ws

    def _fixed_ok(self, dtype: np.dtype[Any], shape: tuple[int, ...]) -> bool:
        """Whether a uniform tensor of ``dtype`` and ``shape`` may be a fixed-shape column.

        Only asked for one of at most ``fixed_tensor_bytes``; a refused one is a blob.
        """
        return True

    def close(self, stats: Mapping[str, Any] | None = None) -> ShardWriteResult:
        """Write the buffered samples to ``path``; equal samples give equal bytes."""
        self._closed = True
        codec, _ = parse_compression(self.options.compression)
        plans = plan_columns(
            self._samples, shuffle=codec == "shuffle-zstd", fixed_bytes=self.fixed_tensor_bytes,
            fixed_ok=self._fixed_ok,
        )
        schema = self._schema(plans, stats)
        groups = row_groups(self._samples, self._sizes, self.options.row_group_bytes)
        try:
            self._write(plans, schema, groups)
        except OSError as exc:  # a full disk, a lost mount: the shard is not written
            self.abort()
            raise write_error(self.path, exc) from exc
        except BaseException:
            self.abort()
            raise
        self._samples, self._sizes = [], []
        return ShardWriteResult(
            path=self.path,
            samples=tuple(self._written),
            schema=tuple(p.spec for p in plans),
            stats=dict(stats or {}),
        )

    def _tables(
        self, plans: Sequence[ColumnPlan], schema: pa.Schema, groups: Sequence[slice]
    ) -> Iterator[pa.Table]:
        for g in groups:
            yield encode_table(self._samples[g], plans, schema)

    def _schema(self, plans: Sequence[ColumnPlan], stats: Mapping[str, Any] | None) -> pa.Schema:
        return arrow_schema(plans, stats)

    @abstractmethod
    def _write(
        self, plans: Sequence[ColumnPlan], schema: pa.Schema, groups: Sequence[slice]
    ) -> None:
        """Write the row groups to ``self.path``."""

    def abort(self) -> None:
        """Drop the buffer and any partial file."""
        self._closed = True
        self._samples, self._sizes = [], []
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class ColumnarReader(ABC):
    """Reads samples of a columnar shard by position, reading only the requested columns."""

    def __init__(
        self, name: str, schema: pa.Schema, plans: Mapping[str, ColumnPlan], num_rows: int,
        columns: Mapping[str, str] | None = None,
    ):
        check_column_types(schema, plans, name, columns)
        self.name = name
        self.arrow_schema = schema
        self.plans = dict(plans)
        self.num_samples = num_rows

    @property
    def schema(self) -> Schema:
        """The field specs of this shard, sorted by name."""
        return tuple(self.plans[n].spec for n in sorted(self.plans))

    @property
    def stats(self) -> dict[str, Any]:
        """The field summaries embedded in the shard when it was written."""
        return dict(shard_document(self.arrow_schema, source=self.name).get("stats", {}))

    def keys(self) -> list[str]:
        """Every sample key in position order."""
        return [
            str(k)
            for k in self._read_positions(range(self.num_samples), [KEY_COLUMN])
            .column(KEY_COLUMN)
            .to_pylist()
        ]

    def _columns(self, fields: Sequence[str] | None) -> list[str]:
        if fields is None:
            return sorted(self.plans)
        return [f for f in dict.fromkeys(fields) if f in self.plans]

    def _check(self, positions: Sequence[int]) -> list[int]:
        out = [int(p) for p in positions]
        for p in out:
            if not 0 <= p < self.num_samples:
                raise InvalidInputError(
                    f"{self.name}: position {p} out of range "
                    f"(shard holds {self.num_samples} samples)"
                )
        return out

    supports_out = True
    """``read`` takes ``out=``: tensors decode into arrays the caller provides."""

    def read(
        self,
        positions: Sequence[int],
        fields: Sequence[str] | None = None,
        out: Out | None = None,
    ) -> Iterator[dict[str, FieldValue]]:
        """Field values of the samples at ``positions``, in the order given.

        Only the requested fields' columns are read (a field this shard lacks is simply
        absent from the dicts). Sorted positions stream row group by row group.
        ``out(i, field, shape, dtype)``, when given, may return a writable C-contiguous
        array for the ``i``-th sample's tensor field; the value is then copied into it.
        """
        wanted = self._check(positions)
        cols = self._columns(fields)
        if not wanted:
            return
        if not cols:
            for _ in wanted:
                yield {}
            return
        unique = sorted(set(wanted))
        if unique == wanted and out is None:
            for batch in self._batches(unique):  # row group by row group, as they decode
                for table, rows, _count, memo in self._read_groups(batch, cols):
                    yield from decode_rows(table, self.plans, rows, memo=memo)
            return
        if unique == wanted:
            yield from self._decode_unique(unique, cols, out)
            return
        first = {p: i for i, p in reversed(list(enumerate(wanted)))}
        mapped = mapped_out(out, [first[p] for p in unique]) if out is not None else None
        by_position = dict(zip(unique, self._decode_unique(unique, cols, mapped), strict=True))
        for p in wanted:
            yield by_position[p]

    def _decode_unique(
        self, positions: list[int], columns: Sequence[str], out: Out | None
    ) -> list[dict[str, FieldValue]]:
        """Field dicts of sorted unique ``positions`` (``out`` numbered as they are)."""
        return decode_pieces(list(self._read_groups(positions, columns)), self.plans, out)

    def _batches(self, positions: list[int]) -> Iterator[list[int]]:
        """Sorted positions cut where a reader would start a new read unit."""
        yield positions

    def _read_groups(
        self, positions: list[int], columns: Sequence[str]
    ) -> Iterator[tuple[pa.Table, np.ndarray | None, int, dict[str, Any] | None]]:
        """``(table, rows, count, memo)`` covering sorted unique ``positions`` in order.

        ``rows`` are the table's rows to decode (None: all of them); ``count`` how many
        positions the piece covers; ``memo``, a dict kept with a cached table (None for a
        table read for this call), lets the decoder prepare each column once (see
        :func:`decode_rows`).
        """
        yield self._read_positions(positions, columns), None, len(positions), None

    @abstractmethod
    def _read_positions(self, positions: Sequence[int], columns: Sequence[str]) -> pa.Table:
        """Rows at sorted, unique ``positions`` with only ``columns``."""

    @abstractmethod
    def close(self) -> None:
        """Release file handles."""
