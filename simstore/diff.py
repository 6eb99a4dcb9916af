"""Differences between two manifests. Pure.

``diff_tables(a, b)`` compares two sets of manifest rows by key. A key is *added* when only
``b`` has it, *removed* when only ``a`` has it, *modified* when both have it with different
sample hashes, and *relocated* when the content is equal but stored elsewhere (another
shard or position, as after re-ingesting into another format). ``apply_diff(a, d)`` gives
``b`` back exactly. The catalog calls ``diff_tables`` only on the rows of the manifest
parts the two snapshots do not share, so the cost of a diff grows with the change.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypedDict

import pyarrow as pa
import pyarrow.compute as pc

from simstore.manifest import (
    MANIFEST_SCHEMA,
    ManifestRow,
    rows_from_list,
    rows_to_list,
    sort_rows,
)

__all__ = ["Diff", "DiffJSON", "apply_diff", "diff_tables", "parts_to_open"]


class DiffSummaryJSON(TypedDict):
    """Counts and bytes of a diff."""

    added: int
    removed: int
    modified: int
    relocated: int
    added_bytes: int
    removed_bytes: int
    modified_bytes_before: int
    modified_bytes_after: int


class DiffJSON(TypedDict):
    """JSON shape of a :class:`Diff`, as ``simstore diff --json`` prints it."""

    added: list[str]
    removed: list[str]
    modified: list[str]
    summary: DiffSummaryJSON


@dataclass(frozen=True, slots=True, kw_only=True)
class Diff:
    """What changes from manifest A to manifest B, with the rows needed to apply it."""

    added: tuple[ManifestRow, ...] = ()
    removed: tuple[ManifestRow, ...] = ()
    modified: tuple[tuple[ManifestRow, ManifestRow], ...] = ()
    relocated: tuple[tuple[ManifestRow, ManifestRow], ...] = ()

    @property
    def is_empty(self) -> bool:
        """Whether A and B hold the same rows."""
        return not (self.added or self.removed or self.modified or self.relocated)

    def to_json(self) -> DiffJSON:
        """The JSON shape: sorted key lists and a summary."""
        return {
            "added": [r.key for r in self.added],
            "removed": [r.key for r in self.removed],
            "modified": [new.key for _, new in self.modified],
            "summary": {
                "added": len(self.added),
                "removed": len(self.removed),
                "modified": len(self.modified),
                "relocated": len(self.relocated),
                "added_bytes": sum(r.size_bytes for r in self.added),
                "removed_bytes": sum(r.size_bytes for r in self.removed),
                "modified_bytes_before": sum(old.size_bytes for old, _ in self.modified),
                "modified_bytes_after": sum(new.size_bytes for _, new in self.modified),
            },
        }


def diff_tables(a: pa.Table, b: pa.Table) -> Diff:
    """Compare two manifest tables (any order) by key, vectorised with a full outer join."""
    if a.num_rows == 0 and b.num_rows == 0:
        return Diff()
    joined = a.join(
        b, keys="key", join_type="full outer", left_suffix="_a", right_suffix="_b",
        coalesce_keys=True,
    )
    in_a = pc.is_valid(joined.column("sample_hash_a"))
    in_b = pc.is_valid(joined.column("sample_hash_b"))
    added = joined.filter(pc.and_(in_b, pc.invert(in_a)))
    removed = joined.filter(pc.and_(in_a, pc.invert(in_b)))
    both = joined.filter(pc.and_(in_a, in_b))
    same_hash = pc.equal(both.column("sample_hash_a"), both.column("sample_hash_b"))
    modified = both.filter(pc.invert(same_hash))
    same_place = pc.and_(
        pc.equal(both.column("shard_a"), both.column("shard_b")),
        pc.and_(
            pc.equal(both.column("position_a"), both.column("position_b")),
            pc.equal(both.column("size_bytes_a"), both.column("size_bytes_b")),
        ),
    )
    relocated = both.filter(pc.and_(same_hash, pc.invert(same_place)))
    return Diff(
        added=tuple(_side(added, "_b")),
        removed=tuple(_side(removed, "_a")),
        modified=tuple(zip(_side(modified, "_a"), _side(modified, "_b"), strict=True)),
        relocated=tuple(zip(_side(relocated, "_a"), _side(relocated, "_b"), strict=True)),
    )


def _side(joined: pa.Table, suffix: str) -> list[ManifestRow]:
    """Rows of one side of a joined table, sorted by key."""
    if joined.num_rows == 0:
        return []
    cols = ["key", *(f"{c}{suffix}" for c in MANIFEST_SCHEMA.names[1:])]
    table = joined.select(cols).rename_columns(MANIFEST_SCHEMA.names)
    return rows_to_list(sort_rows(table.cast(MANIFEST_SCHEMA)))


def apply_diff(a: pa.Table, diff: Diff) -> pa.Table:
    """Apply ``diff`` to manifest ``a``; ``apply_diff(a, diff_tables(a, b))`` equals sorted b."""
    rows = {r.key: r for r in rows_to_list(a)}
    for r in diff.removed:
        rows.pop(r.key, None)
    for r in diff.added:
        rows[r.key] = r
    for _, new in diff.modified:
        rows[new.key] = new
    for _, new in diff.relocated:
        rows[new.key] = new
    return sort_rows(rows_from_list(rows.values()))


def parts_to_open(a_ids: Iterable[str], b_ids: Iterable[str]) -> tuple[list[str], list[str]]:
    """The part ids only A has and only B has (order kept); shared parts need no reading."""
    a_list, b_list = list(a_ids), list(b_ids)
    shared = set(a_list) & set(b_list)
    return [p for p in a_list if p not in shared], [p for p in b_list if p not in shared]
