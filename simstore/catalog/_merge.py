"""Apply a change set to a manifest, rewriting only the parts it touches.

The parent's parts are walked in key order. A part that no change falls into is kept
verbatim (not even read) whenever the cutter is on a boundary; otherwise its rows are read,
merged with the changes in its key range and fed to the cutter. Because the cut points
depend only on the rows, the result is the same manifest a full rebuild would give, and
commit cost grows with the change, not with the dataset.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from simstore._columns import numpy_column
from simstore.manifest import MANIFEST_SCHEMA, PartCutter, PartRef, sort_rows

__all__ = ["CHANGES_SCHEMA", "apply_changes", "normalise_changes", "merge_manifest"]

CHANGES_SCHEMA = MANIFEST_SCHEMA.append(pa.field("deleted", pa.bool_(), nullable=False))


def normalise_changes(tables: Sequence[pa.Table]) -> pa.Table:
    """Concatenate change tables in order, keep the last change per key, sort by key."""
    parts = []
    for t in tables:
        if "deleted" not in t.column_names:
            t = t.append_column("deleted", numpy_column(np.zeros(t.num_rows, dtype=bool)))
        parts.append(t.select(CHANGES_SCHEMA.names).cast(CHANGES_SCHEMA))
    if not parts:
        return CHANGES_SCHEMA.empty_table()
    table = pa.concat_tables(parts).combine_chunks() if len(parts) > 1 else parts[0]
    n = table.num_rows
    if n <= 1:
        return table
    keys = table.column("key")
    if pc.all(pc.less(keys.slice(0, n - 1), keys.slice(1))).as_py():
        return table  # already sorted with unique keys (the common case for one ingest)
    table = table.append_column("_order", numpy_column(np.arange(n, dtype=np.int64)))
    table = table.sort_by([("key", "ascending"), ("_order", "ascending")])
    keys = table.column("key")
    last = np.ones(n, dtype=bool)
    same_next = pc.equal(keys.slice(0, n - 1), keys.slice(1)).to_numpy(zero_copy_only=False)
    last[:-1] = ~same_next
    return table.filter(numpy_column(last)).drop_columns(["_order"])


def apply_changes(rows: pa.Table, changes: pa.Table) -> pa.Table:
    """Rows with the changes applied (upserts replace, deletions remove), sorted."""
    if changes.num_rows == 0:
        return rows
    keep = pc.invert(pc.is_in(rows.column("key"), value_set=changes.column("key")))
    kept = rows.filter(keep)
    live = changes.filter(pc.invert(changes.column("deleted"))).drop_columns(["deleted"])
    return sort_rows(pa.concat_tables([kept.cast(MANIFEST_SCHEMA), live.cast(MANIFEST_SCHEMA)]))


class _ArrowKeys:
    """A sorted Arrow string column seen as a sequence, for ``bisect`` without copying."""

    def __init__(self, column: pa.ChunkedArray) -> None:
        self._column = column
        self._array: pa.Array | None = None

    def __len__(self) -> int:
        return len(self._column)

    def __getitem__(self, i: int) -> str:
        if self._array is None:  # combined on first lookup only
            col = self._column
            self._array = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
        return str(self._array[i].as_py())


def merge_manifest(
    parent_parts: Sequence[PartRef],
    changes: pa.Table,
    *,
    read_part: Callable[[PartRef], pa.Table],
    write_part: Callable[[pa.Table], PartRef],
    target_rows: int,
) -> list[PartRef]:
    """Parts of ``parent + changes``. ``changes`` must come from :func:`normalise_changes`."""
    cutter = PartCutter(target_rows)
    out: list[PartRef] = []
    keys = _ArrowKeys(changes.column("key"))
    ci = 0
    last = len(parent_parts) - 1
    for i, part in enumerate(parent_parts):
        # the last part may end where the manifest ended, not at a cut: rows after it
        # must be cut together with it, so it takes every remaining change
        hi = (
            len(keys)
            if i == last
            else bisect.bisect_right(keys, part.last_key, lo=ci)
        )
        if hi == ci and cutter.is_clean:
            out.append(part)
            continue
        merged = apply_changes(read_part(part), changes.slice(ci, hi - ci))
        ci = hi
        for table in cutter.feed(merged):
            out.append(write_part(table))
    if ci < len(keys):
        tail = changes.slice(ci)
        deleted = tail.column("deleted")
        if pc.any(deleted).as_py():  # filtering copies every column: only when needed
            tail = tail.filter(pc.invert(deleted))
        live = tail.drop_columns(["deleted"])
        for table in cutter.feed(live):
            out.append(write_part(table))
    for table in cutter.finish():
        out.append(write_part(table))
    return out
