"""A local Parquet shard mapped into memory, and what reads from its pages learn of it.

The Parquet reader (:mod:`._parquet`) copies rows of fixed width straight from the file
where the pages allow it (uncompressed PLAIN pages, no nulls): a blob field's bytes, a 0-d
value's. :class:`MappedPages` holds what those reads share: the mapping, views of it with
a row of each width at every byte offset, each row group's walked data pages, and where
each page's values start (learned from the pages, or given by a page layout). The reader
decides what may be read this way and checks it; this module only maps, walks and copies.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from simstore.sample import FieldValue

from ._arrow_decode import Out, _many
from ._layout import PageColumn
from ._pages import PagedColumn, column_pages

__all__ = ["MappedPages", "ValuesAt", "plain_chunk"]

_rows: types.ModuleType | None
try:  # rows copied once, from the mapped file to the batch; else NumPy's gather
    from simstore import _rows
except ImportError:  # pragma: no cover (built by every install with a C compiler)
    _rows = None

ValuesAt = dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray] | None]
"""``(row group, leaf, step)`` -> each page's first row and where its first value starts
(None: that column chunk is not read from its pages)."""


def plain_chunk(chunk: Any) -> bool:
    """Whether a column chunk (``pq.ColumnChunkMetaData``) may be read from its pages.

    Uncompressed, with no dictionary page.
    """
    return bool(chunk.compression == "UNCOMPRESSED" and chunk.dictionary_page_offset is None)


class MappedPages:
    """The mapping of a local shard at ``path`` and the page facts read from it.

    ``values_at``: where pages' values start, already known (from a page layout). Nothing
    is mapped until a read needs it; :meth:`close` lets the mapping go (it is unmapped
    once no row of it is referenced) and a later read maps the file again.
    """

    def __init__(self, path: str | None, values_at: ValuesAt | None = None) -> None:
        self.path = path
        self._map: np.ndarray | None = None
        self._views: dict[int, np.ndarray] = {}  # rows_view's, of the mapping _views_of
        self._views_of: np.ndarray | None = None
        self._paged: dict[tuple[int, int], PagedColumn | None] = {}  # (group, leaf)
        self.values_at: ValuesAt = dict(values_at or {})

    def data(self) -> np.ndarray:
        """The whole file, mapped read-only."""
        if self._map is None:
            assert self.path is not None
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        return self._map

    def rows_view(self, width: int) -> np.ndarray:
        """A read-only view of the mapped file whose row ``i`` is the ``width`` bytes at ``i``.

        Indexing it checks the offsets against the file's size.
        """
        data = self.data()
        if self._views_of is not data:
            self._views = {}
            self._views_of = data
        view = self._views.get(width)
        if view is None:
            flat = np.asarray(data)
            view = self._views[width] = np.lib.stride_tricks.as_strided(
                flat, shape=(max(len(flat) - width + 1, 0), width), strides=(1, 1),
                writeable=False,
            )
        return view

    def lengths_are(self, at: np.ndarray, width: int) -> bool:
        """Whether the length prefix before each blob value at offset ``at`` says ``width``."""
        return bool((self.rows_view(4)[at - 4].view("<u4") == width).all())

    def copy_rows(self, name: str, at: np.ndarray, width: int, shape: tuple[int, ...],
                  native: np.dtype[Any], out: Out, result: list[dict[str, FieldValue]]
                  ) -> bool:
        """Copy the ``width`` bytes at each offset ``at`` of the mapped file into ``out``.

        Into ``out``'s rows of field ``name``, which go into ``result``; False (nothing
        written) when ``out`` declines.
        """
        n = len(at)
        bulk = _many(out, n, name, shape, native)
        if bulk is None:
            return False
        buffer, index, rows_out = bulk
        target = buffer.reshape(len(buffer), -1).view(np.uint8)
        if _rows is not None and target.flags.c_contiguous and target.shape[1] == width:
            # each row once, from the mapped file to its row of the batch, the interpreter
            # released: no gathered temporary (fresh memory in a new process)
            slots = np.ascontiguousarray(index[:n], dtype=np.int64)
            _rows.gather(self.data(), np.ascontiguousarray(at, dtype=np.int64), width,
                         target, slots, False)
        elif width < (64 << 10):
            target[index[:n]] = self.rows_view(width)[at]
        else:  # large rows: one copy each, no gathered temporary
            data = self.data()
            for k, a in zip(np.asarray(index[:n]).tolist(), at.tolist(), strict=True):
                target[k] = data[a : a + width]
        for i, row in enumerate(rows_out):
            result[i][name] = row
        return True

    def leaf_pages(self, g: int, leaf: int, max_def: int,
                   metadata: Callable[[], pq.FileMetaData]) -> PagedColumn | None:
        """Leaf column ``leaf``'s data pages in row group ``g`` (walked once), or None.

        ``metadata``: the file's footer, asked for only when the pages are first walked
        (a reader opened from a layout has not opened the file in Arrow).
        """
        key = (g, leaf)
        if key not in self._paged:
            paged = None
            group = metadata().row_group(g)
            chunk = group.column(leaf)
            if plain_chunk(chunk):
                paged = column_pages(
                    self.data(), chunk.data_page_offset, chunk.total_compressed_size,
                    group.num_rows, max_def=max_def, max_rep=0,
                )
            self._paged[key] = paged
        return self._paged[key]

    def value_pages(self, g: int, col: PageColumn, metadata: Callable[[], pq.FileMetaData]
                    ) -> tuple[np.ndarray, np.ndarray] | None:
        """``(first row, where its value starts)`` of each page of ``col`` in row group ``g``.

        A blob's value starts after its length prefix. None where the chunk is not
        uncompressed PLAIN pages without nulls whose values are each ``width`` bytes.
        """
        key = (g, col.leaf, col.step)
        if key in self.values_at:
            return self.values_at[key]
        paged = self.leaf_pages(g, col.leaf, col.max_def, metadata)
        got = None
        if paged is not None and paged.pages and all(
                pg.body + pg.body_bytes - pg.values == pg.rows * col.step
                for pg in paged.pages):
            got = (paged.starts, np.asarray([pg.values + col.prefix for pg in paged.pages],
                                            dtype=np.int64))
        self.values_at[key] = got
        return got

    def close(self) -> None:
        """Let the mapping go (unmapped once no row of it is referenced)."""
        self._map = None
        self._views.clear()
        self._views_of = None
