"""Building a snapshot from staged entries: the manifest merged, its new parts stored."""

from __future__ import annotations

import bisect
import datetime
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from simstore.catalog._caps import check_written
from simstore.catalog._merge import _ArrowKeys, merge_manifest, normalise_changes
from simstore.hashing import object_key
from simstore.manifest import PartRef, encode_part, part_ref
from simstore.sample import Schema, merge_schema
from simstore.snapshot import Snapshot, content_hash_of
from simstore.stats import merge_stats

if TYPE_CHECKING:
    from simstore.catalog._catalog import Catalog
    from simstore.catalog._staged import StagedEntry

__all__ = ["WRITE_THREADS", "BuildCounters", "build_snapshot", "utc_now"]

WRITE_THREADS = 4
"""Threads that encode and store manifest parts (and read them for a diff)."""


def utc_now() -> str:
    """The current UTC time, ISO 8601 with microseconds."""
    return utc_at(time.time())


def utc_at(seconds: float) -> str:
    """A time in seconds since the epoch as UTC, ISO 8601 with microseconds."""
    return datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC).isoformat(
        timespec="microseconds")


def utc_at_ns(ns: int) -> str:
    """A time in nanoseconds since the epoch as UTC, ISO 8601 with exact microseconds.

    Through a float, two times a microsecond apart could print alike.
    """
    moment = _EPOCH + datetime.timedelta(microseconds=ns // 1000)
    return moment.isoformat(timespec="microseconds")


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


@dataclass(frozen=True, slots=True)
class _Pending:
    """A part whose encoding and upload is still under way."""

    future: Future[PartRef]


@dataclass(slots=True)
class BuildCounters:
    """What building a snapshot read and wrote."""

    parts_read: int = 0
    bytes_read: int = 0
    new_part_bytes: int = 0
    written: list[str] = field(default_factory=list)


def build_snapshot(
    cat: Catalog,
    dataset: str,
    parent: Snapshot | None,
    parent_id: str | None,
    entries: Sequence[StagedEntry],
    change_tables: Mapping[str, pa.Table],
    *,
    message: str,
    author: str,
    created: str,
    allow_schema_change: bool,
    after: str | None = None,
) -> tuple[Snapshot, BuildCounters]:
    """The snapshot that applies staged ``entries`` to ``parent``, its parts stored.

    From the last ``replace`` entry on (or the parent's parts): the entries' change tables
    merged into the manifest (new parts encoded and stored on a small thread pool), their
    schemas merged, their statistics merged (exact only when no key can have been counted
    twice). Nothing is committed: the caller moves the branch. ``after``: a time later
    than ``created`` that the snapshot must not be taken to precede (``lineage.after``).
    """
    counters = BuildCounters()
    base_parts: Sequence[PartRef] = parent.parts if parent else ()
    schema: Schema = parent.schema if parent else ()
    stats_list: list[Mapping[str, Any]] = [parent.stats.get("fields", {})] if parent else []
    stats_exact = bool(parent.stats.get("exact", True)) if parent else True
    start = 0
    for i, e in enumerate(entries):
        if e.mode == "replace":
            start = i
    if entries and entries[start].mode == "replace":
        base_parts = ()
        stats_list = []
        stats_exact = True
        schema = ()
    tables: list[pa.Table] = []
    for e in entries[start:]:
        schema = merge_schema(
            schema, e.schema, source=f"staged entry {e.id}", allow_change=allow_schema_change
        )
        tables.append(change_tables[e.id])
        stats_list.append(e.stats.get("fields", {}))
        if e.deletions or not e.stats.get("exact", True):
            stats_exact = False
    # a single staged entry was normalised when it was staged
    changes = tables[0] if len(tables) == 1 else normalise_changes(tables)
    if sum(e.rows for e in entries[start:]) != changes.num_rows:
        stats_exact = False  # two staged entries wrote one key: their statistics overlap
    if parent is not None and base_parts and changes.num_rows:
        # replacing an existing key makes merged statistics an over-count; a stager that
        # checked its keys against this very parent vouches that they are all new
        vouched = all(e.stats.get("new_keys_in") == parent_id for e in entries[start:])
        if not vouched:
            stats_exact = stats_exact and not _touches_existing(base_parts, changes)

    def read_part(p: PartRef) -> pa.Table:
        counters.parts_read += 1
        return cat.read_part(p, snapshot=parent_id or "")

    # Encoding and storing parts overlaps on a small thread pool (Parquet encoding and
    # file writes release the GIL); results keep their order.
    pool = ThreadPoolExecutor(max_workers=WRITE_THREADS)
    in_flight: deque[Future[PartRef]] = deque()
    counters_lock = threading.Lock()

    def store_part(table: pa.Table) -> PartRef:
        data = encode_part(table)
        check_written("manifest part", len(data),
                      f"dataset {dataset!r}: a manifest part of {table.num_rows} rows",
                      f"lower target_rows (now {cat.target_rows}) or use shorter keys")
        ref = part_ref(table, data)
        if cat.store.put_if_absent(object_key(ref.id), data):
            with counters_lock:
                counters.new_part_bytes += len(data)
        return ref

    def write_part(table: pa.Table) -> PartRef:
        future = pool.submit(store_part, table)
        in_flight.append(future)
        if len(in_flight) > 2 * WRITE_THREADS:  # bound memory held by queued parts
            in_flight.popleft().result()
        return _Pending(future)  # type: ignore[return-value]

    try:
        pending = merge_manifest(
            base_parts,
            changes,
            read_part=read_part,
            write_part=write_part,
            target_rows=cat.target_rows,
        )
        parts = [p.future.result() if isinstance(p, _Pending) else p for p in pending]
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    consumed = [e.id for e in entries]
    lineage: dict[str, Any] = {"staging": consumed}
    if after is not None:
        lineage["after"] = after
    ingests = [dict(e.lineage) for e in entries if e.lineage]
    if ingests:
        lineage["ingests"] = ingests
        objects = sorted({str(o) for e in entries for o in e.lineage.get("objects", [])})
        if objects:
            lineage["objects"] = objects
    snap = Snapshot(
        dataset=dataset,
        parents=(parent_id,) if parent_id else (),
        created=created,
        author=author,
        message=message,
        schema=schema,
        parts=tuple(parts),
        samples=sum(p.rows for p in parts),
        sample_bytes=sum(p.sample_bytes for p in parts),
        content_hash=content_hash_of(parts),
        stats={"fields": merge_stats(stats_list), "exact": stats_exact} if stats_list else {},
        lineage=lineage,
    )
    return snap, counters

def _touches_existing(parts: Sequence[PartRef], changes: pa.Table) -> bool:
    """Whether any change key falls inside a parent part's key range (may replace)."""
    keys = _ArrowKeys(changes.column("key"))
    for part in parts:
        lo = bisect.bisect_left(keys, part.first_key)
        if lo < len(keys) and keys[lo] <= part.last_key:
            return True
    return False

