"""One pinned snapshot as the loader reads it, and the manifest rows of one group of parts.

A :class:`Source` is what a reading process needs of a snapshot: the store, the snapshot
id, and the manifest parts' ids and row counts as two NumPy arrays (not the snapshot's
Python objects, so worker processes do not copy per-part objects). A reader loads only the
*groups* of parts its stretch of the stream covers (:func:`load_group`), so no rank reads
more of the manifest than it needs.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from simstore.loaders._fetch import missing_text, tier_of
from simstore.loaders._normalise import Normalise, NormaliseSpec, normaliser
from simstore.loaders._order import (
    BLOCK_BYTES,
    BUFFER_BLOCKS,
    SourceLayout,
    group_order,
    source_layout,
)
from simstore.loaders._partrows import PartRows, PartRowsCache, combine
from simstore.loaders._stats import Counters
from simstore.loaders._window import Regions, parse_regions

from simstore.catalog import Catalog
from simstore.catalog._caps import read_capped
from simstore.catalog._refs import is_snapshot_object
from simstore.errors import FormatError, IntegrityError, InvalidInputError, NotFoundError
from simstore.hashing import hash_bytes, object_key
from simstore.manifest import decode_part
from simstore.names import parse_ref
from simstore.sample import Schema
from simstore.snapshot import Snapshot, SnapshotId
from simstore.storage import ObjectStore

__all__ = ["GroupKeys", "GroupRows", "PartReader", "Source", "load_group", "open_source"]

Transform = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Source:
    """A snapshot pinned for reading, with how to shuffle and project it."""

    store: ObjectStore
    dataset: str
    snapshot_id: str
    part_ids: np.ndarray
    part_rows: np.ndarray
    sample_bytes: int
    schema: Schema
    fields: tuple[str, ...] | None
    shuffle: bool
    seed: int
    window_shards: int
    group_parts: int
    block_bytes: int = BLOCK_BYTES
    buffer_blocks: int = BUFFER_BLOCKS
    transform: Transform | None = None
    regions: Regions | None = None
    part_last_keys: tuple[str, ...] = ()
    """Each part's last key (parts are in key order): where a key's row is, for ``get``."""

    @property
    def num_samples(self) -> int:
        """Samples in the snapshot."""
        return int(self.part_rows.sum())

    @property
    def named(self) -> str:
        """The source in an error message: its dataset and snapshot."""
        return f"dataset {self.dataset} (snapshot {self.snapshot_id})"

    def layout(self, epoch: int) -> SourceLayout:
        """The part order and groups of one of this source's epochs."""
        return source_layout(
            self.part_rows,
            snapshot_id=self.snapshot_id,
            seed=self.seed,
            epoch=epoch,
            shuffle=self.shuffle,
            group_parts=self.group_parts,
        )


def open_source(
    store: ObjectStore,
    ref: str,
    *,
    fields: Sequence[str] | None,
    shuffle: bool,
    seed: int,
    window_shards: int,
    group_parts: int,
    transform: Transform | None,
    block_bytes: int = BLOCK_BYTES,
    buffer_blocks: int = BUFFER_BLOCKS,
    crop: Mapping[str, Any] | None = None,
    window: Mapping[str, Any] | None = None,
    read: PartReader | None = None,
    peek: PartReader | None = None,
    normalise: NormaliseSpec = None,
) -> Source:
    """Resolve ``ref`` once and pin its snapshot; check the requested fields exist.

    ``read``: how immutable objects come from a remote store's disk cache (see
    :data:`PartReader`); the snapshot object is read through it, so a node that has read
    this snapshot before makes one round trip for the ref and none for the snapshot.
    ``peek``: the same, but None on a miss. A REF that names its snapshot by the full id
    and finds it in the cache asks nothing of the store (it is immutable, and its copy
    hashes to that id); the store is first contacted, if ever, for an object the cache
    does not hold.
    """
    catalog = Catalog(store)
    pinned = _pinned(ref, peek) if peek is not None else None  # from the cache alone
    if pinned is not None:
        sid, snap = pinned
    elif tier_of(store) in ("local", "memory"):
        catalog.check_initialised()
        sid = catalog.resolve(ref)
        snap = catalog.snapshot(sid)
    else:
        # a remote store: the store's metadata and the ref are two round trips that need
        # not wait for each other; the metadata's error (not a simstore store, another
        # format version) still comes first
        with ThreadPoolExecutor(1, thread_name_prefix="simstore-meta") as pool:
            meta = pool.submit(catalog.check_initialised)
            try:
                pinned = _pinned_fetched(ref, store, read) if read is not None else None
                if pinned is not None:
                    sid, snap = pinned
                else:
                    # the snapshot comes from the disk cache where it can: the ref's
                    # dataset is checked here, not by reading it from the store
                    sid = catalog.resolve(ref, check=False)
                    got = read(sid) if read is not None else None
                    snap = (Snapshot.from_bytes(got[0], object_id=sid) if got is not None
                            else catalog.snapshot(sid))
                    catalog.check_ref(snap, sid, f"ref {ref}", parse_ref(ref).dataset)
            except Exception:
                meta.result()
                raise
            meta.result()
    names = {spec.name for spec in snap.schema}
    if fields is not None:
        fields = tuple(fields)  # a list of names (SimDataset refuses a string)
        unknown = [f for f in fields if f not in names]
        if unknown:
            raise InvalidInputError(
                f"{ref} (snapshot {sid}) has no field {unknown[0]!r}; "
                f"fields are {sorted(names)}"
            )
    if seed < 0:
        raise InvalidInputError(f"seed must be non-negative, got {seed}")
    for name, value in (("window_shards", window_shards), ("group_parts", group_parts),
                        ("shuffle_block_bytes", block_bytes),
                        ("shuffle_buffer_blocks", buffer_blocks)):
        if value < 1:
            raise InvalidInputError(f"{name} must be at least 1, got {value}")
    regions = (parse_regions(crop, window, snap.schema)
               if crop is not None or window is not None else None)
    if regions is not None and not regions.fields:
        regions = None  # empty mappings: nothing cropped
    transform = normaliser(normalise, snap, fields, ref, transform)
    if regions is not None and isinstance(transform, Normalise):
        transform = transform.fitted(regions, {s.name: s.ndim for s in snap.schema})
    if regions is not None and fields is not None:
        left_out = sorted(regions.fields - set(fields))
        if left_out:
            raise InvalidInputError(
                f"a crop or window names {left_out[0]!r}, which fields= does not read"
            )
    return Source(
        store=store,
        dataset=snap.dataset,
        snapshot_id=sid,
        part_ids=np.asarray([p.id for p in snap.parts], dtype="S32"),
        part_rows=np.asarray([p.rows for p in snap.parts], dtype=np.int64),
        part_last_keys=tuple(p.last_key for p in snap.parts),
        sample_bytes=snap.sample_bytes,
        schema=snap.schema,
        fields=fields,
        shuffle=shuffle,
        seed=seed,
        window_shards=window_shards,
        group_parts=group_parts,
        block_bytes=block_bytes,
        buffer_blocks=buffer_blocks,
        transform=transform,
        regions=regions,
    )


def _pinned_fetched(
    ref: str, store: ObjectStore, read: PartReader
) -> tuple[SnapshotId, Snapshot] | None:
    """The snapshot a REF names by its full id, read once through the disk cache.

    Two round trips: the object's first bytes (a shard named by mistake is never
    downloaded whole) and the cache's fill, which is hashed to the id and parsed here.
    ``Catalog.resolve`` then ``read`` made three, the snapshot downloaded twice. None
    when the REF is not a full id or the object is not a snapshot of its dataset: the
    catalog's lookup then finds it another way or says what is wrong.
    """
    return _pinned(ref, lambda sid: read(sid) if is_snapshot_object(store, sid) else None)


def _pinned(
    ref: str, get: Callable[[str], tuple[bytes, str] | None]
) -> tuple[SnapshotId, Snapshot] | None:
    """The snapshot of ``ref``'s dataset that ``get`` gives for its full id; else None."""
    r = parse_ref(ref)
    sid = r.full_id
    if sid is None:
        return None
    got = get(sid)
    if got is None:
        return None
    try:
        snap = Snapshot.from_bytes(got[0], object_id=sid)
    except FormatError:
        return None  # not a snapshot: the store's lookup says what it is
    return (SnapshotId(sid), snap) if snap.dataset == r.dataset else None


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class GroupRows:
    """A group's manifest rows in stream order: shard (as a code), position, size, key."""

    shard_ids: tuple[str, ...]
    shard: np.ndarray
    position: np.ndarray
    size_bytes: np.ndarray
    keys: GroupKeys


class GroupKeys:
    """A group's sample keys in stream order, made Python strings when first asked for.

    Held as the parts' UTF-8 bytes and offsets (arrays: a DataLoader worker that forks
    with a group loaded copies no per-key objects). The first two chunks of a group (the
    first batch of an epoch, and the chunk resolved before it goes out) convert only
    their own keys; the next request converts them all, so later chunks pick theirs by
    index (a conversion per chunk costs more than that). A group of 131,072 rows took
    20-30 ms to convert and reorder in full before its first batch could go out.
    """

    __slots__ = ("_all", "_asked", "_data", "_offsets", "_order")

    def __init__(self, offsets: np.ndarray, data: bytes, order: np.ndarray) -> None:
        self._offsets = offsets
        self._data = data
        self._order = order
        self._all: np.ndarray | None = None
        self._asked = 0

    def __len__(self) -> int:
        return len(self._order)

    def take(self, idx: np.ndarray) -> list[str]:
        """The keys of the group's stream rows ``idx``."""
        if self._all is None and self._asked < _PARTIAL_TAKES:
            self._asked += 1
            rows = self._order[idx]
            data = self._data
            return [data[a:b].decode() for a, b in zip(self._offsets[rows].tolist(),
                                                       self._offsets[rows + 1].tolist(),
                                                       strict=True)]
        if self._all is None:
            column = pa.LargeStringArray.from_buffers(
                len(self._offsets) - 1, pa.py_buffer(self._offsets), pa.py_buffer(self._data))
            self._all = column.to_numpy(zero_copy_only=False)[self._order]
        return list(self._all[idx].tolist())


_PARTIAL_TAKES = 2
"""Requests for a group's keys answered by converting only the keys asked for."""

STREAM_COLUMNS = ("key", "shard", "position", "size_bytes")
"""The manifest columns a stream reads (not the sample hashes)."""

_PART_THREADS = 4
"""Manifest parts of a group read and decoded side by side (a group has at most
``group_parts`` of them, 4 by default)."""

_PARALLEL_PART_ROWS = 32768
"""A group's parts are read side by side when they hold at least this many rows."""


PartReader = Callable[[str], "tuple[bytes, str] | None"]
"""``read(part_id) -> (bytes, tier)``: a manifest part's bytes, already checked against its
id, and the tier that served them; None: read it from the store (and check it here)."""


def _read_part(
    source: Source, part_id: str, counters: Counters, tier: str, rows: int,
    read: PartReader | None = None, cache: PartRowsCache | None = None,
) -> PartRows:
    """A part's stream rows: from the node's cache of them, else read and decoded.

    Rows read and decoded are then kept in ``cache``.
    """
    if cache is not None:
        got = cache.get(part_id, rows)
        if got is not None:
            counters.add("manifest_rows_cached")
            return got
    key = object_key(part_id)
    try:
        got_bytes = read(part_id) if read is not None else None
        data = (read_capped(source.store, key, "manifest part",
                            by=f"; referenced by snapshot {source.snapshot_id}")
                if got_bytes is None else b"")
    except NotFoundError:
        # the snapshot names it: damage (as the catalog says), not an unknown object
        raise IntegrityError(missing_text(source.store, key, source.snapshot_id)) from None
    if got_bytes is None:
        actual = hash_bytes(data)
        if actual != part_id:
            raise IntegrityError(
                f"{source.store.url}: {key} has hash {actual}, expected {part_id}; "
                f"referenced by snapshot {source.snapshot_id}"
            )
    else:
        data, tier = got_bytes  # checked by the reader (a cache fill or hit)
    counters.add_read(tier, len(data))
    counters.add("manifest_parts")
    counters.add("manifest_bytes", len(data))
    table = decode_part(data, object_id=part_id, columns=STREAM_COLUMNS)
    if table.num_rows != rows:
        # the stream's positions come from the snapshot's row counts: a part that holds
        # more or fewer rows would shift every later position of its group
        raise FormatError(
            f"{source.store.url}: {key} holds {table.num_rows} rows, but snapshot "
            f"{source.snapshot_id} says {rows}"
        )
    part = PartRows.from_table(table)
    if cache is not None:
        cache.put(part_id, part)
    return part


def locate(
    source: Source, keys: Sequence[str], counters: Counters, tier: str,
    read: PartReader | None = None, cache: PartRowsCache | None = None,
) -> list[tuple[str, int, int]]:
    """``(shard, position, size_bytes)`` of each key, reading only the parts that hold them.

    Parts are in key order and each snapshot lists its parts' last keys, so a key's part
    is found by bisection. A key the snapshot lacks is a :class:`NotFoundError`.
    """
    wanted: dict[int, list[str]] = {}
    for key in keys:
        i = bisect.bisect_left(source.part_last_keys, key)
        wanted.setdefault(i, []).append(key)
    found: dict[str, tuple[str, int, int]] = {}
    for i, names in wanted.items():
        if i >= len(source.part_ids):
            continue
        part = _read_part(source, source.part_ids[i].decode(), counters, tier,
                          int(source.part_rows[i]), read, cache)
        for name in names:
            j = part.find(name)
            if j is not None:
                found[name] = (part.shard_ids[int(part.shard[j])], int(part.position[j]),
                               int(part.size_bytes[j]))
    missing = [k for k in keys if k not in found]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise NotFoundError(
            f"{source.dataset}@{source.snapshot_id} has no sample {missing[0]!r}{more}"
        )
    return [found[k] for k in keys]


def load_group(
    source: Source, layout: SourceLayout, epoch: int, group: int, counters: Counters, tier: str,
    read: PartReader | None = None, cache: PartRowsCache | None = None,
) -> GroupRows:
    """Read a group's manifest parts in stream order.

    Through ``read``, if given; their decoded rows from ``cache``, where it has them.
    """
    parts = list(layout.parts_of(group))

    def part(p: int) -> PartRows:
        return _read_part(source, source.part_ids[p].decode("ascii"), counters, tier,
                          int(source.part_rows[p]), read, cache)

    if len(parts) > 1 and int(source.part_rows[parts].sum()) >= _PARALLEL_PART_ROWS:
        # side by side: the reads, hashes and Parquet decodes release the interpreter
        # (four parts of 32,768 rows: 16-28 ms against 32-37 one after another; for a
        # few thousand rows the threads cost more than they save); the first failing
        # part in stream order raises
        with ThreadPoolExecutor(min(len(parts), _PART_THREADS),
                                thread_name_prefix="simstore-parts") as pool:
            futures = [pool.submit(part, p) for p in parts]
            loaded = [f.result() for f in futures]
    else:
        loaded = [part(p) for p in parts]
    rows = combine(loaded)
    codes = np.asarray(rows.shard, dtype=np.int64)
    if source.shuffle:
        order = group_order(
            codes,
            window_shards=source.window_shards,
            seed=source.seed,
            epoch=epoch,
            snapshot_id=source.snapshot_id,
            group=group,
            positions=rows.position,
            sizes=rows.size_bytes,
            block_bytes=source.block_bytes,
            buffer_blocks=source.buffer_blocks,
        )
    else:
        order = np.arange(len(codes), dtype=np.int64)
    return GroupRows(
        shard_ids=rows.shard_ids,
        shard=codes[order],
        position=np.asarray(rows.position[order], dtype=np.int64),
        size_bytes=np.asarray(rows.size_bytes[order], dtype=np.int64),
        keys=GroupKeys(rows.key_offsets, rows.key_data, order),
    )

