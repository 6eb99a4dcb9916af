"""Walking a dataset's snapshots newest first, and sizing the objects they reach."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

import pyarrow.compute as pc

from simstore.catalog import Catalog
from simstore.cost import Footprint, FootprintTally
from simstore.errors import NotFoundError
from simstore.hashing import is_object_key, object_key
from simstore.manifest import PartRef
from simstore.names import parse_ref
from simstore.snapshot import Snapshot
from simstore.storage import ObjectStore

_HEAD_WORKERS = 16


class _Newest:
    """A heap entry: heapq pops the smallest, and the newest snapshot compares smallest."""

    __slots__ = ("created", "sid")

    def __init__(self, sid: str, snap: Snapshot) -> None:
        self.created = snap.created
        self.sid = sid

    def __lt__(self, other: _Newest) -> bool:
        return (self.created, self.sid) > (other.created, other.sid)


def dataset_heads(cat: Catalog, target: str) -> tuple[str, list[str]]:
    """The dataset and the snapshot ids a target names (NAME: every branch and tag)."""
    ref = parse_ref(target)
    if "@" in target:
        return ref.dataset, [cat.resolve(ref)]
    heads = list(cat.ref_targets(ref.dataset))  # a missing one: damage naming its ref
    if not heads:
        raise NotFoundError(f"{cat.store.url}: dataset {ref.dataset!r} has no branch or tag")
    return ref.dataset, sorted(set(heads))


def newest_snapshots(
    cat: Catalog, heads: Sequence[str], last: int | None
) -> tuple[list[str], bool]:
    """The ``last`` newest snapshots reachable from ``heads`` (all when None).

    Also whether older ones were left out. Reads the chosen snapshots and their frontier.
    """
    heap = [_Newest(sid, cat.snapshot(sid)) for sid in heads]
    heapq.heapify(heap)
    seen = set(heads)
    chosen: list[str] = []
    while heap and (last is None or len(chosen) < last):
        sid = heapq.heappop(heap).sid
        chosen.append(sid)
        for parent in cat.snapshot(sid).parents:
            if parent not in seen:
                seen.add(parent)
                heapq.heappush(heap, _Newest(parent, cat.snapshot(parent)))
    return chosen, bool(heap)


def topological(cat: Catalog, sids: Sequence[str]) -> list[str]:
    """``sids`` with every first parent before its children, oldest first otherwise."""
    members = set(sids)
    children: dict[str, list[str]] = {}
    ready: list[tuple[str, str]] = []
    for sid in sids:
        snap = cat.snapshot(sid)
        parent = snap.parents[0] if snap.parents else None
        if parent in members:
            children.setdefault(parent, []).append(sid)
        else:
            ready.append((snap.created, sid))
    heapq.heapify(ready)
    out: list[str] = []
    while ready:
        _, sid = heapq.heappop(ready)
        out.append(sid)
        for child in children.get(sid, []):
            heapq.heappush(ready, (cat.snapshot(child).created, child))
    return out


class Reach:
    """The objects snapshots reach; each manifest part is read once and its shards kept."""

    def __init__(self, cat: Catalog) -> None:
        self.cat = cat
        self._part_shards: dict[str, frozenset[str]] = {}

    def shards_of(self, part: PartRef, sid: str) -> frozenset[str]:
        shards = self._part_shards.get(part.id)
        if shards is None:
            table = self.cat.read_part(part, snapshot=sid)
            shards = frozenset(str(s) for s in pc.unique(table.column("shard")).to_pylist())
            self._part_shards[part.id] = shards
        return shards

    def objects_of(self, sid: str) -> frozenset[str]:
        snap = self.cat.snapshot(sid)
        out: set[str] = {sid}
        for part in snap.parts:
            out.add(part.id)
            out |= self.shards_of(part, sid)
        out.update(str(o) for o in snap.lineage.get("objects", []))
        return frozenset(out)


def list_sizes(
    store: ObjectStore, wanted: set[str] | None, thresholds: Iterable[int]
) -> tuple[dict[str, int], Footprint]:
    """Sizes of the ``wanted`` objects (all when None) and the footprint of every object.

    One listing of ``objects/``.
    """
    sizes: dict[str, int] = {}
    tally = FootprintTally(thresholds)
    for info in store.list_info("objects/"):
        if not is_object_key(info.key):  # not the store's (gc lists it as foreign)
            continue
        oid = info.key.rsplit("/", 1)[-1]
        tally.add(info.size_bytes)
        if wanted is None or oid in wanted:
            sizes[oid] = info.size_bytes
    return sizes, tally.result()


def head_sizes(store: ObjectStore, oids: Iterable[str]) -> dict[str, int]:
    """Sizes of ``oids`` by one HEAD each, from a small thread pool; missing ones left out."""

    def size(oid: str) -> tuple[str, int | None]:
        try:
            return oid, store.info(object_key(oid)).size_bytes
        except NotFoundError:
            return oid, None

    ids = sorted(set(oids))
    if not ids:
        return {}
    with ThreadPoolExecutor(max_workers=min(_HEAD_WORKERS, len(ids))) as pool:
        return {oid: n for oid, n in pool.map(size, ids) if n is not None}
