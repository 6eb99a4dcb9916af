"""Parquet shards: one row per sample, the default for records and meshes.

A shard opens in stock pyarrow (``pyarrow.parquet.read_table(path)``); the column layout is
described in :mod:`simstore.formats._arrow`. Writer settings are fixed (no dictionary
encoding, statistics only on ``__key__``, row groups of about ``row_group_bytes``), so equal
samples give equal bytes. ``shuffle-zstd`` byte-shuffles float data before zstd: small
tensor and scalar columns with Parquet's own BYTE_STREAM_SPLIT encoding (stock readers
undo it), blob columns by shuffling each tensor's bytes (``numcodecs.Shuffle``; the column
plan records it, and a stock reader undoes it with ``Shuffle(itemsize).decode``).
"""

from __future__ import annotations

import functools
import math
import os
import threading
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Executor
from itertools import accumulate
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow._parquet import ParquetReader

from simstore._blockcache import BlockCache
from simstore._reserve import Reservation
from simstore.errors import FormatError
from simstore.ingest import ShardOptions, hash_sample_blocks, parse_compression, sample_nbytes
from simstore.protocols import ShardWriteResult
from simstore.sample import FieldValue, Sample

from ._arrow import KEY_COLUMN, ColumnPlan, memory_pool, plans_from_schema
from ._arrow_decode import Out, blob_shapes, decode_pieces, scalar_out, uniform_shape
from ._columnar import ColumnarReader, ColumnarWriter
from ._layout import PageColumn, ShardLayout
from ._mapped_pages import MappedPages, plain_chunk
from ._pages import (
    PagedColumn,
    SharedWork,
    check_page,
    page_rows,
)

__all__ = ["ParquetFormat", "ParquetShardReader", "ParquetShardWriter"]

_PHYSICAL = {"f4": "FLOAT", "f8": "DOUBLE", "i4": "INT32", "u4": "INT32", "i8": "INT64",
             "u8": "INT64"}
"""The Parquet type that stores a 0-d tensor of each NumPy type as its own bytes."""


MAGIC = b"PAR1"
PAGE_CRC_KEY = b"simstore.page_checksums"
"""Schema metadata of a shard whose every page carries a CRC-32 (``crc32``)."""
OWN_CACHE_BYTES = 64 << 20
"""Decoded row groups a reader keeps when no shared :class:`BlockCache` is given."""
HELP_TASKS = 4
"""At most this many tasks a read hands its ``out``'s helpers (see ``_share``)."""


def _float_leaf_paths(plans: Sequence[ColumnPlan]) -> list[str]:
    paths = []
    for p in plans:
        if p.spec.kind not in ("tensor", "scalar") or np.dtype(p.spec.dtype).kind != "f":
            continue
        if np.dtype(p.spec.dtype).itemsize not in (4, 8):
            continue
        if p.encoding == "fixed":
            paths.append(f"{p.name}.list.element")
        elif p.encoding == "plain":
            paths.append(p.name)
    return paths


class ParquetShardWriter(ColumnarWriter):
    """Streaming side of :class:`ParquetFormat` (buffers one shard, writes on close)."""

    fixed_tensor_bytes = 1 << 10
    """Parquet decodes a list column with a level per value: 6x slower than a blob of the
    same bytes for 8 KiB tensors (pyarrow 26, uncompressed), so only tensors of at most
    1 KiB are fixed-shape columns; Lance keeps its fixed-size lists up to 64 KiB."""

    def _schema(self, plans: Sequence[ColumnPlan], stats: Mapping[str, Any] | None) -> pa.Schema:
        schema = super()._schema(plans, stats)
        return schema.with_metadata({**(schema.metadata or {}), PAGE_CRC_KEY: b"crc32"})

    def _write(
        self, plans: Sequence[ColumnPlan], schema: pa.Schema, groups: Sequence[slice]
    ) -> None:
        codec, level = parse_compression(self.options.compression)
        kwargs: dict[str, Any] = {
            "compression": "none" if codec == "none" else "zstd",
            "use_dictionary": False,
            "write_statistics": [KEY_COLUMN],
            "store_schema": True,
            # CRC-32 per page: a reader that cannot hash the whole object (ranged reads
            # of a remote shard) still catches a flipped bit in the pages it reads
            "write_page_checksum": True,
        }
        if codec != "none":
            kwargs["compression_level"] = level
        if codec == "shuffle-zstd":
            paths = _float_leaf_paths(plans)
            if paths:
                kwargs["column_encoding"] = {p: "BYTE_STREAM_SPLIT" for p in paths}
        # blocks for the buffered samples' bytes are reserved, exactly, before pyarrow
        # appends to the new file (:mod:`simstore._reserve`): uncompressed, the file is
        # a little larger than they are, so nothing is given back (a truncate that waits
        # on the journal's writeback); compressed, its size is not known, and nothing is
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            reserved = Reservation(fd, step=0)
            if codec == "none":
                reserved.ahead(sum(self._sizes))
            sink = pa.OSFile(self.path, mode="a")
            try:
                with pq.ParquetWriter(sink, schema, memory_pool=memory_pool(), **kwargs) as writer:
                    for table in self._tables(plans, schema, groups):
                        writer.write_table(table, row_group_size=max(1, table.num_rows))
            finally:
                sink.close()
            reserved.release(os.fstat(fd).st_size)
        finally:
            os.close(fd)


class _PooledFile:
    """A Parquet file whose row groups decode into :func:`memory_pool`.

    ``pq.ParquetFile`` takes no memory pool, so this opens pyarrow's ``ParquetReader``
    (which does) the way ``ParquetFile`` would, and maps a top-level column to its leaf
    columns as ``ParquetFile.read_row_group`` does.
    """

    def __init__(self, source: str | BinaryIO, name: str, *, verify: bool,
                 metadata: pq.FileMetaData | None = None) -> None:
        self.name = name
        self._owns = isinstance(source, str)  # a file object stays the caller's to close
        self.reader = ParquetReader(memory_pool=memory_pool())
        options: dict[str, Any] = {
            "use_memory_map": self._owns, "metadata": metadata,
            "page_checksum_verification": verify,
        }
        if _EXTENSIONS is not None:
            options["arrow_extensions_enabled"] = _EXTENSIONS
        self.reader.open(source, **options)
        self.metadata: pq.FileMetaData = self.reader.metadata
        self.schema_arrow: pa.Schema = self.reader.schema_arrow
        leaves: dict[str, list[int]] = {}
        self.paths: list[str] = []
        for i, path in enumerate(self.reader.column_paths):
            leaves.setdefault(path[0], []).append(i)
            self.paths.append(".".join(path))
        self._leaves = leaves

    def read_row_group(
        self, g: int, columns: Sequence[str], skip: frozenset[str] = frozenset()
    ) -> pa.Table:
        """Row group ``g``'s top-level ``columns``, less the leaf columns in ``skip``."""
        try:
            indices = [i for name in columns for i in self._leaves[name]
                       if self.paths[i] not in skip]
        except KeyError as exc:
            raise FormatError(f"{self.name}: no column {exc.args[0]!r}") from None
        # on the calling thread: the loader decodes row groups on its own threads, and
        # Arrow's pool would only add threads to start and to share the cores with
        table: pa.Table = self.reader.read_row_group(g, column_indices=indices, use_threads=False)
        return table

    def close(self) -> None:
        if self._owns:
            self.reader.close()


def _extensions_default() -> bool | None:
    """``ParquetFile``'s default for ``arrow_extensions_enabled`` (None: no such option)."""
    import inspect

    param = inspect.signature(pq.ParquetFile.__init__).parameters.get("arrow_extensions_enabled")
    return None if param is None else bool(param.default)


_EXTENSIONS = _extensions_default()


class ParquetShardReader(ColumnarReader):
    """An open Parquet shard; reads whole row groups of only the requested columns.

    Decoded row groups are kept in a :class:`BlockCache` (the reader's own, or one shared
    through :meth:`share_cache`), so rows asked for in any order, over many calls, decode
    each row group once while it stays in the cache.
    """

    def __init__(
        self,
        source: str | BinaryIO,
        name: str = "parquet shard",
        cache: BlockCache | None = None,
        layout: ShardLayout | None = None,
    ) -> None:
        self.name = name
        self._source = source
        self._unchecked: _PooledFile | None = None
        self._file: _PooledFile | None = None
        self._opening = threading.Lock()
        self._layout = layout
        """Where the reader came from a layout (:meth:`layout_bytes`), the Arrow file is opened
        only when a read needs it (see ``_layout``)."""
        self._trusted = False
        if layout is not None:
            if not isinstance(source, str):
                raise FormatError(f"{name}: a page layout is for a local file")
            try:
                size = os.stat(source).st_size
            except OSError as exc:
                raise FormatError(f"{name} is not a readable Parquet file: {exc}") from exc
            if size != layout.size:
                raise FormatError(f"{name}: {size} bytes, its page layout says {layout.size}")
            schema, counts = layout.schema, list(layout.counts)
        else:
            schema = self._pf.schema_arrow
            meta = self._pf.metadata
            counts = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        self._starts = [0, *accumulate(counts)]
        self._bounds = np.asarray(self._starts, dtype=np.int64)
        self._sizes: dict[str, list[int]] | None = None
        self._blocks = cache if cache is not None else BlockCache(OWN_CACHE_BYTES)
        self._token = object()
        self.decodes = 0
        self.verifies_pages = (schema.metadata or {}).get(PAGE_CRC_KEY) == b"crc32"
        """Each page's CRC-32 is checked as it is decoded (the writer says it wrote them)."""
        try:
            plans = plans_from_schema(schema, source=name)
        except FormatError:  # not a simstore shard, or of another version: not kept open
            if self._file is not None:
                self._file.close()
            raise
        super().__init__(name, schema, plans, self._starts[-1])
        self._pages = MappedPages(source if isinstance(source, str) else None,
                                  layout.pages if layout is not None else None)
        self._crc_checked: set[tuple[int, str, int]] = set()
        self._sharing: SharedWork | None = None
        self.direct_rows = 0
        """Rows whose blob bytes were copied straight from the file (for tests, metrics)."""
        self.helped_groups = 0
        """Row groups an ``out``'s helpers decoded and checked (for tests)."""
        self.paged_reads = 0
        """Reads made from the pages alone, no row group decoded (for tests, metrics)."""
        self._page_plans: dict[tuple[str, ...], list[PageColumn] | None] = {}

    @property
    def _pf(self) -> _PooledFile:
        """The file opened in Arrow, checking pages (at the first need, from a layout)."""
        if self._file is None:
            with self._opening:
                if self._file is None:
                    try:
                        # a local path is memory-mapped: uncompressed column chunks decode
                        # from the page cache without a read() copy (3,915 vs 2,044 MiB/s
                        # for 4 MiB blobs); every page's CRC-32 is verified as it is
                        # decoded: a ranged reader over a remote object is never
                        # hash-checked as a whole, and a local shard is read while its
                        # whole-object hash is still running
                        self._file = _PooledFile(self._source, self.name, verify=True)
                    except (pa.ArrowException, OSError, ValueError) as exc:
                        raise FormatError(
                            f"{self.name} is not a readable Parquet file: {exc}") from exc
        return self._file

    @functools.cached_property
    def _direct(self) -> dict[str, tuple[int, int]]:
        """Blob fields whose bytes may be copied from the mapped file (see ``_pages``).

        Field name -> (leaf column index, its max definition level).
        """
        return self._direct_leaves() if isinstance(self._source, str) else {}

    def layout_bytes(self, shard_id: str) -> bytes | None:
        """This file's page layout (see ``_layout``), for a later open of the same bytes.

        Only of a trusted local shard (hashed to ``shard_id``: the layout is then its
        bytes'), only if some field is read from its pages, and not of a reader opened
        from one (kept already). Walks the pages of every row group not yet read.
        """
        if not self._trusted or not isinstance(self._source, str) or self._layout is not None:
            return None
        columns = {name: self._page_column(name) for name in sorted(self.plans)}
        if not any(columns.values()):
            return None
        pages = {(g, col.leaf, col.step): self._pages.value_pages(g, col, self._metadata)
                 for col in columns.values() if col is not None
                 for g in range(len(self._starts) - 1)}
        layout = ShardLayout(size=len(self._pages.data()), schema=self.arrow_schema,
                             counts=tuple(np.diff(self._starts).tolist()), columns=columns,
                             pages=pages)
        return layout.to_bytes(shard_id)

    @functools.cached_property
    def _leaf_index(self) -> dict[str, int]:
        """Each leaf column's index, by its dotted path (``u.data``, ``Re``)."""
        return {path: i for i, path in enumerate(self._pf.paths)}

    def _direct_leaves(self) -> dict[str, tuple[int, int]]:
        schema = self._pf.metadata.schema
        index = self._leaf_index
        out: dict[str, tuple[int, int]] = {}
        for name, plan in self.plans.items():
            if plan.encoding != "blob" or plan.shuffle:
                continue
            native = np.dtype(plan.spec.dtype)
            if native.newbyteorder("<") != native:
                continue
            i = index.get(f"{name}.data")
            if i is not None and schema.column(i).max_repetition_level == 0:
                out[name] = (i, schema.column(i).max_definition_level)
        return out

    def trust(self) -> None:
        """Stop checking page CRC-32s: the whole file has been hashed to its id.

        A page CRC costs more than decoding the page (a 4 MiB row group of 8 KiB blobs:
        2.9 ms with the checks, 1.1 ms without), so a shard is read with them only
        until its whole-object hash is known.
        """
        self.verifies_pages = False  # row groups decode from a file opened unchecked
        self._trusted = True

    def _decoder(self) -> _PooledFile:
        """The file the reading thread's row groups decode from.

        The one opened checking pages until the reader is trusted; then one opened
        without, made at its first decode (a trusted read from the pages alone decodes
        nothing: opening it at trust cost a shard's first read 0.1-0.4 ms).
        """
        if self.verifies_pages:
            return self._pf
        if self._unchecked is None:
            self._unchecked = _PooledFile(self._source, self.name, verify=False,
                                          metadata=self._pf.metadata)
        return self._unchecked

    def checked_bytes(self, positions: Sequence[int], fields: Sequence[str] | None = None) -> int:
        """Stored bytes whose page CRC-32s a read of ``positions`` would check in Arrow.

        The requested columns' chunks in the row groups those rows fall in, less the row
        groups already decoded (kept in the block cache); 0 once the reader is trusted.
        Blob bytes read straight from the pages do not count: their CRC-32s (ISA-L, about
        0.05 ms per MiB) cost less than hashing the same bytes, so hashing the whole file
        first never pays for them, unlike Arrow's (about 0.55 ms per MiB).
        """
        if not self.verifies_pages or len(positions) == 0:
            return 0
        cols = tuple(self._columns(fields))
        skip = frozenset(f"{c}.data" for c in cols if c in self._direct)
        if self._sizes is None:
            meta = self._pf.metadata
            sizes: dict[str, list[int]] = {}
            for g in range(meta.num_row_groups):
                group = meta.row_group(g)
                per: dict[str, int] = {}
                for j in range(group.num_columns):
                    chunk = group.column(j)
                    top = chunk.path_in_schema.split(".")[0]
                    per[top] = per.get(top, 0) + chunk.total_compressed_size
                for name, n in per.items():
                    sizes.setdefault(name, [0] * meta.num_row_groups)[g] = n
            self._sizes = sizes
        groups = np.unique(np.searchsorted(self._bounds, positions, side="right") - 1)
        total = 0
        for g in groups.tolist():
            if not 0 <= g < len(self._starts) - 1:
                continue  # out of range: the read itself says so
            if not self._blocks.contains(self._block_key(g, cols, skip)):
                total += sum(self._sizes[c][g] for c in cols
                             if c in self._sizes and not self._plain_blob(g, c))
        return total

    def _plain_blob(self, g: int, name: str) -> bool:
        """Whether field ``name``'s bytes in row group ``g`` may be read from the pages."""
        return name in self._direct and self._plain_leaf(g, self._direct[name][0])

    def _plain_leaf(self, g: int, leaf: int) -> bool:
        """Whether leaf ``leaf``'s chunk in row group ``g`` may be read from its pages.

        Uncompressed, with no dictionary page.
        """
        return plain_chunk(self._pf.metadata.row_group(g).column(leaf))

    def _metadata(self) -> pq.FileMetaData:
        """The file's footer (opening it in Arrow, for a reader opened from a layout)."""
        return self._pf.metadata

    def _group_batches(self, positions: list[int]) -> Iterator[tuple[int, list[int]]]:
        """``(row group, its positions)`` for sorted ``positions``, one searchsorted in all."""
        if not positions:
            return
        groups = np.searchsorted(self._bounds, positions, side="right") - 1
        lo = 0
        for hi in (np.flatnonzero(groups[1:] != groups[:-1]) + 1).tolist():
            yield int(groups[lo]), positions[lo:hi]
            lo = hi
        yield int(groups[lo]), positions[lo:]

    def _batches(self, positions: list[int]) -> Iterator[list[int]]:
        for _, batch in self._group_batches(positions):
            yield batch

    def share_cache(self, cache: BlockCache) -> None:
        """Keep decoded row groups in ``cache`` (shared with other readers) from now on."""
        if cache is not self._blocks:
            self._blocks.drop(self._token)
            self._blocks = cache

    def _row_group(self, g: int, columns: tuple[str, ...]) -> pa.Table:
        return self._group(g, columns)[0]

    def _block_key(
        self, g: int, columns: tuple[str, ...], skip: frozenset[str] = frozenset()
    ) -> tuple[object, int, tuple[str, ...], frozenset[str]]:
        """Where row group ``g``'s ``columns`` (less leaves ``skip``) are kept decoded."""
        return (self._token, g, columns, skip)

    def _group(
        self, g: int, columns: tuple[str, ...], skip: frozenset[str] = frozenset(),
        pf: _PooledFile | None = None,
    ) -> tuple[pa.Table, dict[str, Any]]:
        """A decoded row group and its memo (what decoding its columns prepared once).

        ``pf``: the file to decode it from (a helper thread's own; else the reader's).
        """
        key = self._block_key(g, columns, skip)
        cached: tuple[pa.Table, dict[str, Any]] | None = self._blocks.get(key)
        if cached is not None:
            return cached
        try:
            table = (pf or self._decoder()).read_row_group(g, columns, skip)
        except (pa.ArrowException, OSError) as exc:
            raise FormatError(f"{self.name}: row group {g} is unreadable: {exc}") from exc
        self.decodes += 1
        entry: tuple[pa.Table, dict[str, Any]] = (table, {})
        self._blocks.put(key, entry, table.nbytes)
        return entry

    def _read_groups(
        self, positions: list[int], columns: Sequence[str], skip: frozenset[str] = frozenset()
    ) -> Iterator[tuple[pa.Table, np.ndarray | None, int, dict[str, Any]]]:
        """Each row group's cached table with the rows asked of it (no ``take`` copy)."""
        cols = tuple(columns)
        for g, batch in self._group_batches(positions):
            if self._sharing is not None:
                self._sharing.do(g)  # decoded and checked here, or by a helper
            table, memo = self._group(g, cols, skip)
            local = np.asarray(batch, dtype=np.int64) - self._starts[g]
            memo.setdefault("__group__", g)
            yield table, (None if len(local) == table.num_rows else local), len(batch), memo

    # -- direct reads of blob bytes ------------------------------------------------------
    def _decode_unique(
        self, positions: list[int], columns: Sequence[str], out: Out | None
    ) -> list[dict[str, FieldValue]]:
        """As decoding does, but a blob field's bytes go from the mapped file to ``out``.

        For the loader's bulk reads (an ``out`` with ``many``) of an uncompressed shard on
        a local path: the blob fields' byte columns are not decoded; their rows' bytes
        are copied from the pages (checked by ``_pages``: CRC-32 until the reader is
        trusted, layout always). A field whose pages or shapes do not allow it (ragged,
        compressed, nulls) is decoded as before.
        """
        if out is None or getattr(out, "many", None) is None:
            return super()._decode_unique(positions, columns, out)
        paged = self._read_pages(positions, columns, out)
        if paged is not None:
            return paged
        direct = [c for c in columns if c in self._direct]
        if not direct:
            return super()._decode_unique(positions, columns, out)
        skip = frozenset(f"{c}.data" for c in direct)
        helpers = getattr(out, "helpers", None)
        self._sharing = self._share(positions, columns, skip, helpers) if helpers else None
        try:
            pieces = list(self._read_groups(positions, columns, skip))
            rest = {k: v for k, v in self.plans.items() if k not in direct}
            result = decode_pieces(pieces, rest, out)
            failed = [c for c in direct
                      if not self._gather(c, pieces, len(positions), out, result)]
        finally:
            if self._sharing is not None:
                self._sharing.close()
                self.helped_groups += self._sharing.helped
                self._sharing = None
        if failed:
            again = decode_pieces(list(self._read_groups(positions, failed)),
                                  {c: self.plans[c] for c in failed}, out)
            for mine, theirs in zip(result, again, strict=True):
                mine.update(theirs)
        return result

    def _page_columns(self, columns: Sequence[str]) -> list[PageColumn] | None:
        """How each of ``columns`` is read from the pages alone, or None if any is not."""
        key = tuple(columns)
        if key not in self._page_plans:
            layout = [self._page_column(name) for name in columns]
            whole = [c for c in layout if c is not None]
            self._page_plans[key] = whole if len(whole) == len(layout) else None
        return self._page_plans[key]

    def _page_column(self, name: str) -> PageColumn | None:
        """Field ``name`` as a column of one width in every row, or None.

        A blob field of the direct kind whose plan records its rows' one shape, or a 0-d
        numeric tensor or scalar stored as a Parquet value of its own width (``float32``,
        ``float64``, ``int32``, ``int64``, their unsigned kin), little-endian.
        """
        if self._layout is not None:
            return self._layout.columns.get(name)
        plan = self.plans.get(name)
        if plan is None or plan.spec.kind not in ("tensor", "scalar"):
            return None  # strings, bytes, JSON: Arrow decodes them
        native = np.dtype(plan.spec.dtype)
        if native.newbyteorder("<") != native:
            return None
        if name in self._direct and plan.encoding == "blob" and plan.shape:
            leaf, max_def = self._direct[name]
            width = math.prod(plan.shape) * native.itemsize
            if width <= 0:  # rows of no bytes (a shape with a 0): no row to copy, decoded
                return None
            return PageColumn(name, leaf, max_def, 4, width, plan.shape, native)
        leaf_at = self._leaf_index.get(name)
        if leaf_at is None or plan.encoding != "plain" or plan.spec.ndim:
            return None
        column = self._pf.metadata.schema.column(leaf_at)
        if (column.max_repetition_level
                or _PHYSICAL.get(native.str[1:]) != column.physical_type):
            return None
        return PageColumn(name, leaf_at, column.max_definition_level, 0, native.itemsize,
                           (), native, scalar=plan.spec.kind == "scalar")

    def _read_pages(
        self, positions: list[int], columns: Sequence[str], out: Out
    ) -> list[dict[str, FieldValue]] | None:
        """A trusted shard's rows straight from the pages, every column; None to decline.

        Where every requested column has a fixed width in every row (see
        :meth:`_page_columns`) and the pages allow it (uncompressed, PLAIN, no nulls, the
        values section exactly ``rows x width``), no row group is decoded in Arrow: each
        column's rows are copied from the mapped file into ``out`` (a shuffled batch takes
        a few rows from each of many row groups, and each decode cost as much for those
        few as for all). Blob rows' length prefixes are checked as in :meth:`_gather`.
        While the page CRC-32s are still checked, the reads decode as before.
        """
        if self.verifies_pages or not positions or not isinstance(self._source, str):
            return None
        layout = self._page_columns(columns)
        if not layout:
            return None
        groups = list(self._group_batches(positions))
        found: list[tuple[PageColumn, np.ndarray]] = []
        for col in layout:
            picked = []
            for g, batch in groups:
                if not 0 <= g < len(self._starts) - 1:
                    return None  # out of range: the read says so
                got = self._pages.value_pages(g, col, self._metadata)
                if got is None:
                    return None
                first_rows, values = got
                local = np.asarray(batch, dtype=np.int64) - self._starts[g]
                p = np.searchsorted(first_rows, local, side="right") - 1
                picked.append(values[p] + (local - first_rows[p]) * (col.prefix + col.width))
            at = picked[0] if len(picked) == 1 else np.concatenate(picked)
            if col.prefix and not self._pages.lengths_are(at, col.width):
                return None
            found.append((col, at))
        result: list[dict[str, FieldValue]] = [{} for _ in positions]
        for col, at in found:
            if col.scalar:  # Python numbers (or NumPy scalars) per row, as decoding gives
                dtype = self.plans[col.name].spec.dtype
                values = self._pages.rows_view(col.width)[at].view(col.native).reshape(-1)
                # a float32 through a Python float is widened and back: a signalling NaN
                # comes back quiet (another bit); NumPy scalars keep the stored bytes
                each = values.tolist() if dtype in ("int64", "float64") else list(values)
                for row, value in zip(result, each, strict=True):
                    row[col.name] = scalar_out(value, dtype)
            elif not self._pages.copy_rows(col.name, at, col.width, col.shape, col.native, out,
                                     result):
                return None
        self.direct_rows += len(positions)
        self.paged_reads += 1
        return result

    def _share(
        self, positions: list[int], columns: Sequence[str], skip: frozenset[str],
        helpers: Executor,
    ) -> SharedWork | None:
        """This read's row groups, shared with ``helpers``' threads, or None for one group.

        A shuffled first chunk takes a few rows from each of many row groups (256 rows of
        8 KiB from a buffer of 16 row groups of 4 MiB), and each group costs the same
        whether one row of it is asked or all: decoding its other columns in Arrow and,
        until the shard's hash is in, the CRC-32 of every page of its blob columns. With
        the chunk's shards read side by side, the thread of the biggest shard had most of
        them to itself. A unit is a row group, decoded (with a helper's own handle on the
        file: one Arrow reader is not shared between threads) into the block cache and its
        blob pages checked; this thread takes units in order, helpers from the other end
        (see :class:`SharedWork`).
        """
        groups = [g for g, _ in self._group_batches(positions)]
        if len(groups) < 2:
            return None
        cols = tuple(columns)
        direct = [name for name in cols if f"{name}.data" in skip]
        data = self._pages.data()  # mapped here: a helper never maps the file itself
        verify = self.verifies_pages
        reading = threading.get_ident()
        own = threading.local()

        def unit(g: Hashable) -> None:
            assert isinstance(g, int)
            pf = self._decoder() if threading.get_ident() == reading else getattr(own, "pf", None)
            if pf is None:
                pf = own.pf = _PooledFile(self._source, self.name, verify=verify,
                                          metadata=self._pf.metadata)
            self._group(g, cols, skip, pf)
            for name in direct if verify else ():  # trusted: no pages to walk
                paged = self._pages_of(g, name)
                for p, page in enumerate(paged.pages if paged is not None else ()):
                    self._check_page(data, g, name, p, page)

        shared = SharedWork(groups, unit)
        for _ in range(min(HELP_TASKS, len(groups) // 2)):
            helpers.submit(shared.help)
        return shared

    def _gather(self, name: str, pieces: Sequence[Any], n: int, out: Out,
                result: list[dict[str, FieldValue]]) -> bool:
        """Copy field ``name``'s rows of ``pieces`` into ``out``'s buffer; False to decline.

        Each row group knows where its rows' bytes start in the mapped file
        (:meth:`_group_pages`); the rows of every piece are gathered by one indexing of a
        view that has a row of ``width`` bytes at each byte offset of the file, so a read's
        cost does not grow with the pages and row groups its rows come from (a shuffled
        batch of 256 rows of 8 KiB takes rows of about 100 pages). Where the shard is
        trusted, the length prefixes of the rows taken are checked the same way.
        """
        plan = self.plans[name]
        native = np.dtype(plan.spec.dtype)
        key = f"__direct__{name}"
        shape: tuple[int, ...] | None = None
        check = False
        picked: list[np.ndarray] = []
        for table, rows, _count, memo in pieces:
            if key not in memo:
                memo[key] = self._group_pages(int(memo["__group__"]), name, table, native)
            got = memo[key]
            if got is None or (shape is not None and got[0] != shape):
                return False
            shape, starts, unchecked = got
            check = check or unchecked  # a group first read once trusted: check its rows
            picked.append(starts if rows is None else starts[rows])
        if shape is None:
            return False
        at = picked[0] if len(picked) == 1 else np.concatenate(picked)
        width = math.prod(shape) * native.itemsize
        if len(at) != n:
            return False
        if check and not self._pages.lengths_are(at, width):
            return False
        if not self._pages.copy_rows(plan.name, at, width, shape, native, out, result):
            return False
        self.direct_rows += n
        return True

    def _group_pages(
        self, g: int, name: str, table: pa.Table, native: np.dtype[Any]
    ) -> tuple[tuple[int, ...], np.ndarray, bool] | None:
        """``(shape, where each row's bytes start, check prefixes)`` of ``name`` in ``g``.

        None unless every row of the group is present with one shape and every page of
        its byte column is plain, uncompressed and of that width. While the pages' CRC-32s
        are checked (each page is read whole for it), every length prefix is checked here;
        once the shard is trusted, only the pages' sizes are, and :meth:`_gather` checks
        the length prefixes of the rows it takes (the third item says so).
        """
        col = table.column(name)
        col = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
        if col.null_count or len(col) == 0:
            return None
        shape_col = col.field("shape")
        if shape_col.null_count:
            return None
        shape = uniform_shape(*blob_shapes(shape_col, len(col)), len(col))
        if shape is None:
            return None
        width = math.prod(shape) * native.itemsize
        paged = self._pages_of(g, name)
        if paged is None or paged.num_rows != len(col) or width <= 0:
            return None
        data = self._pages.data()
        every = self.verifies_pages
        starts = []
        for p, page in enumerate(paged.pages):
            if page_rows(data, page, width, check_crc=False, name=self.name,
                         every_length=every) is None:
                return None
            self._check_page(data, g, name, p, page)
            starts.append(page.values + 4 + np.arange(page.rows, dtype=np.int64) * (4 + width))
        at = starts[0] if len(starts) == 1 else np.concatenate(starts)
        return shape, at, not every

    def _check_page(self, data: np.ndarray, g: int, name: str, p: int, page: Any) -> None:
        """Check page ``p`` of field ``name`` in row group ``g`` once, until trusted."""
        if self.verifies_pages and (g, name, p) not in self._crc_checked:
            check_page(data, page, self.name)
            self._crc_checked.add((g, name, p))

    def _pages_of(self, g: int, name: str) -> PagedColumn | None:
        leaf, max_def = self._direct[name]
        return self._pages.leaf_pages(g, leaf, max_def, self._metadata)

    def _read_positions(self, positions: Sequence[int], columns: Sequence[str]) -> pa.Table:
        cols = tuple(columns)
        parts = []
        for g, batch in self._group_batches(list(positions)):
            table = self._row_group(g, cols)
            local = np.asarray(batch, dtype=np.int64) - self._starts[g]
            if len(local) == table.num_rows:
                parts.append(table)
            else:
                parts.append(table.take(pa.array(local)))
        return pa.concat_tables(parts) if len(parts) != 1 else parts[0]

    def close(self) -> None:
        """Release the file handle and this reader's cached row groups."""
        self._blocks.drop(self._token)
        if self._file is not None:
            self._file.close()
        if self._unchecked is not None:
            self._unchecked.close()
        self._pages.close()


class ParquetFormat:
    """The Parquet shard format (``--format parquet``, the default)."""

    name = "parquet"
    libraries = ("pyarrow", "numcodecs")  # numcodecs: the byte shuffle of float blobs
    """Distributions this writer's bytes depend on (recorded in an ingest's lineage)."""
    supports_file_objects = True
    supports_streaming_writes = True

    def __init__(self, options: ShardOptions | None = None) -> None:
        self.options = options or ShardOptions()

    def open_writer(self, path: str) -> ParquetShardWriter:
        """A writer that buffers samples and writes ``path`` on close."""
        return ParquetShardWriter(path, self.options)

    def write(self, samples: Iterable[Sample], path: str) -> ShardWriteResult:
        """Write samples to one file; equal samples in equal order give equal bytes."""
        writer = self.open_writer(path)
        for s in samples:
            writer.add(s, sample_hash=hash_sample_blocks(s), size_bytes=sample_nbytes(s))
        return writer.close()

    def open(self, source: str | BinaryIO) -> ParquetShardReader:
        """Open a shard from a local path or a seekable binary file object."""
        # a file object's name is the format's alone (the caller names the object)
        name = f"parquet shard {source}" if isinstance(source, str) else "parquet shard"
        return ParquetShardReader(source, name=name)

    def open_laid_out(self, path: str, layout: bytes, shard_id: str) -> ParquetShardReader | None:
        """Open a local shard from its page layout (see ``_layout``); None if it does not fit.

        For a file that hashed to ``shard_id`` (the layout is then its bytes'): one whose
        layout is damaged, another shard's or of another size opens as :meth:`open` would.
        """
        try:
            laid = ShardLayout.from_bytes(layout, shard_id)
            return ParquetShardReader(path, name=f"parquet shard {path}", layout=laid)
        except (ValueError, FormatError):
            return None

    def sniff(self, head: bytes, tail: bytes) -> bool:
        """Parquet files start and end with ``PAR1``."""
        return head[:4] == MAGIC and (not tail or tail[-4:] == MAGIC)

    def describe(self) -> Mapping[str, Any]:
        """Parameters that shape the bytes (for lineage)."""
        return {"name": self.name, **self.options.to_json()}
