"""Storage accounting: walk snapshots, size their objects, report tiers, warm a cache.

The I/O side of :mod:`simstore.cost`: it reads price tables and run reports from files,
and snapshots, manifest parts and listings from a store, and hands values to the pure
model. Every function here counts what it reads: the catalog is wrapped in a
:class:`~simstore.storage.CountingStore`, and each report carries its own ``read`` usage.

What each costs (the store's own requests; no object is read twice):

- :func:`dataset_cost` reads the snapshot object of every reported snapshot and of the
  parents just outside the report, every distinct manifest part they list (parts shared
  by snapshots are read once), and lists ``objects/`` once (one LIST per 1,000 objects
  in the store). It never reads a shard. Memory grows with the number of distinct objects
  the reported snapshots reach (about 100 bytes each), not with their bytes; ``last``
  limits the report to the newest snapshots.
- :func:`disk_usage` reads one snapshot's manifest parts and sends one HEAD per shard
  (from a small thread pool); without a REF it lists ``objects/`` once.
- :func:`warm_cache` does what ``disk_usage`` does, then downloads each shard and part
  not yet in the cache (hash-verified by the cache as it fills).

The hot tier is the loader's disk cache; this module sees it only through the small
:class:`CacheCopies`/:class:`CacheFiller` protocols (``simstore.loaders``' ``ShardCache``
has that shape), so the core never imports the loader and the cache layout stays the
loader's.
"""

from __future__ import annotations

import heapq
import json
import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources
from typing import Any, BinaryIO, Protocol

import pyarrow.compute as pc

from simstore.catalog import Catalog
from simstore.cost import (
    DEFAULT_TIER_PRICES,
    Footprint,
    FootprintTally,
    PriceTable,
    RunCost,
    RunUsage,
    SnapshotFigures,
    SnapshotObjects,
    TierUsage,
    apply_price_overrides,
    check_new_tiers,
    check_price_data,
    merge_price_data,
    merge_run_usage,
    parse_price_table,
    parse_run_report,
    price_run,
    storage_prices,
    summarise_history,
)
from simstore.errors import (
    FormatError,
    IntegrityError,
    InvalidInputError,
    NotFoundError,
    StorageError,
)
from simstore.hashing import is_object_key, object_key
from simstore.manifest import PartRef
from simstore.names import parse_ref
from simstore.snapshot import Snapshot
from simstore.storage import CountingStore, ObjectStore, tier_of_url

__all__ = [
    "CacheCopies",
    "CacheFiller",
    "CachedCopy",
    "CostReport",
    "DEFAULT_FILL_BLOCK_BYTES",
    "DiskUsage",
    "PullReport",
    "TierPresence",
    "dataset_cost",
    "default_price_text",
    "disk_usage",
    "read_price_table",
    "read_run_reports",
    "run_cost",
    "warm_cache",
]

DEFAULT_FILL_BLOCK_BYTES = 64 * 1024 * 1024
_HEAD_WORKERS = 16


# -- price tables and run reports ------------------------------------------------------


def default_price_text() -> str:
    """The TOML of the price table shipped with simstore (``simstore/prices.toml``)."""
    return resources.files("simstore").joinpath("prices.toml").read_text(encoding="utf-8")


def read_price_table(files: Sequence[str] = (), overrides: Sequence[str] = ()) -> PriceTable:
    """The shipped price table, with each of ``files`` and then ``overrides`` laid over it.

    A file may be partial: it changes the fields it names and may add tiers (see
    :func:`~simstore.cost.merge_price_data`). ``overrides`` are ``TIER.FIELD=VALUE``
    strings. A missing or unreadable file is an :class:`InvalidInputError` naming it.

    Each file is checked on its own before it is merged (a later file or flag setting
    the same field must not hide a bad value), so an error names the one file that
    holds it; a file that is not UTF-8 TOML is a :class:`FormatError` too.
    """
    import tomllib

    data: dict[str, Any] = tomllib.loads(default_price_text())
    origins = ["the default price table"]
    added: dict[str, str] = {}  # a tier the defaults lack -> the file that added it
    for path in files:
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except OSError as exc:
            raise InvalidInputError(f"cannot read price table {path}: {exc.strerror}") from exc
        try:
            extra = tomllib.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise FormatError(
                f"price table {path} is not valid TOML: not UTF-8 text ({exc.reason} at byte "
                f"{exc.start})"
            ) from exc
        except tomllib.TOMLDecodeError as exc:
            raise FormatError(f"price table {path} is not valid TOML: {exc}") from exc
        except RecursionError as exc:
            raise FormatError(
                f"price table {path} is not valid TOML: nested too deeply"
            ) from exc
        check_price_data(extra, origin=f"price table {path}")
        for name in extra.get("tiers", {}):  # a table: check_price_data says so
            if str(name) not in data.get("tiers", {}):
                added.setdefault(str(name), f"price table {path}")
        data = merge_price_data(data, extra)
        origins.append(path)
    data = apply_price_overrides(data, overrides)
    check_new_tiers(data, added)
    if overrides:
        origins.append("--price flags")
    return parse_price_table(data, origin=" + ".join(origins))


def read_run_reports(paths: Sequence[str]) -> RunUsage:
    """The merged :class:`~simstore.cost.RunUsage` of the run reports at ``paths``.

    Several reports are the ranks of one run (see :func:`~simstore.cost.merge_run_usage`).
    """
    usages = []
    for path in paths:
        try:
            with open(path, "rb") as f:
                obj = json.load(f)
        except OSError as exc:
            raise InvalidInputError(f"cannot read run report {path}: {exc.strerror}") from exc
        except ValueError as exc:
            raise FormatError(f"run report {path} is not valid JSON: {exc}") from exc
        except RecursionError as exc:
            raise FormatError(f"run report {path} is not valid JSON: nested too deeply") from exc
        usages.append(parse_run_report(obj, origin=f"run report {path}"))
    return merge_run_usage(usages)


def run_cost(
    paths: Sequence[str],
    table: PriceTable,
    *,
    tier_prices: Mapping[str, str | None] | None = None,
    cold_tier: str | None = None,
    egress: bool = False,
) -> RunCost:
    """Price the run reports at ``paths`` (one per rank) with ``table``.

    ``tier_prices`` adds to (and overrides) :data:`~simstore.cost.DEFAULT_TIER_PRICES`;
    ``cold_tier`` names the tier cache hits would otherwise have been read from, when the
    report has several remote tiers or none.
    """
    import dataclasses

    mapping = {**DEFAULT_TIER_PRICES, **dict(tier_prices or {})}
    if cold_tier is not None and mapping.get(cold_tier) is None:
        # a tier no price tier is mapped to would price nothing, and say only that no
        # cold tier was given: the name given is the mistake
        raise InvalidInputError(
            f"cold tier {cold_tier!r} has no price tier; name a priced tier "
            f"({', '.join(sorted(k for k, v in mapping.items() if v is not None))}) or map "
            f"it, e.g. --tier {cold_tier}=s3-standard"
        )
    usage = read_run_reports(paths)
    _check_tier_prices(dict(tier_prices or {}), usage, table, cold_tier)
    if cold_tier is not None:
        usage = dataclasses.replace(usage, cold_tier=cold_tier)
    return price_run(usage, table, mapping, egress=egress)


def _check_tier_prices(given: Mapping[str, str | None], usage: RunUsage,
                       table: PriceTable, cold_tier: str | None) -> None:
    """Refuse a ``--tier RUN=PRICE`` that would price nothing: a typo must not pass.

    ``PRICE`` must be a tier of the table (or none); ``RUN`` a tier the reports name, the
    ``--cold`` tier, or one the defaults know (a mapping kept for runs that read it).
    """
    in_reports = {t.tier for t in usage.tiers} | ({cold_tier} if cold_tier else set())
    for run_tier, price_tier in given.items():
        if price_tier is not None and price_tier not in table.names:
            raise InvalidInputError(
                f"--tier {run_tier}={price_tier}: no price tier {price_tier!r} (tiers: "
                f"{', '.join(table.names)}, or none)"
            )
        if run_tier not in in_reports and run_tier not in DEFAULT_TIER_PRICES:
            raise InvalidInputError(
                f"--tier {run_tier}={price_tier or 'none'}: the run reports have no tier "
                f"{run_tier!r} (their tiers: {', '.join(sorted(in_reports)) or 'none'})"
            )


# -- walking snapshots -----------------------------------------------------------------


class _Newest:
    """A heap entry: heapq pops the smallest, and the newest snapshot compares smallest."""

    __slots__ = ("created", "sid")

    def __init__(self, sid: str, snap: Snapshot) -> None:
        self.created = snap.created
        self.sid = sid

    def __lt__(self, other: _Newest) -> bool:
        return (self.created, self.sid) > (other.created, other.sid)


def _heads(cat: Catalog, target: str) -> tuple[str, list[str]]:
    """The dataset and the snapshot ids a target names (NAME: every branch and tag)."""
    ref = parse_ref(target)
    if "@" in target:
        return ref.dataset, [cat.resolve(ref)]
    heads = list(cat.ref_targets(ref.dataset))  # a missing one: damage naming its ref
    if not heads:
        raise NotFoundError(f"{cat.store.url}: dataset {ref.dataset!r} has no branch or tag")
    return ref.dataset, sorted(set(heads))


def _select(cat: Catalog, heads: Sequence[str], last: int | None) -> tuple[list[str], bool]:
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


def _topological(cat: Catalog, sids: Sequence[str]) -> list[str]:
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


class _Reach:
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


def _list_sizes(
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


def _head_sizes(store: ObjectStore, oids: Iterable[str]) -> dict[str, int]:
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


# -- cost of a dataset -----------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class CostReport:
    """Storage figures of a dataset's snapshots, of the dataset and of the store.

    ``snapshots`` is oldest first (parents before children). ``dataset`` is every object
    the reported snapshots reach, each once; ``store`` every object under ``objects/``.
    ``truncated`` says ``last`` left older snapshots out. ``read`` is what the report
    itself read from the store.
    """

    target: str
    dataset: str
    store_url: str
    store_tier: str
    snapshots: tuple[SnapshotFigures, ...]
    dataset_footprint: Footprint
    full_copy_bytes: int
    store_footprint: Footprint
    prices: PriceTable
    truncated: bool
    read: tuple[TierUsage, ...]

    @property
    def dedup_ratio(self) -> float:
        """The dataset's full-copy bytes over its stored bytes."""
        return self.snapshots[-1].dedup_ratio if self.snapshots else 1.0

    def to_json(self) -> dict[str, Any]:
        """The JSON of ``simstore cost --json``: snapshots newest first, prices per tier."""
        p = self.prices

        def snap(f: SnapshotFigures) -> dict[str, Any]:
            return {
                "id": f.snapshot_id,
                "parent": f.parent_id,
                "created": f.created,
                "samples": f.samples,
                "logical_bytes": f.logical_bytes,
                "reached_bytes": f.reached.bytes,
                "reached_objects": f.reached.objects,
                "new_bytes": f.new.bytes,
                "new_objects": f.new.objects,
                "shared_bytes": f.shared.bytes,
                "shared_objects": f.shared.objects,
                "stored_bytes": f.stored.bytes,
                "stored_objects": f.stored.objects,
                "full_copy_bytes": f.full_copy_bytes,
                "dedup_ratio": f.dedup_ratio,
                "missing_objects": f.missing,
                "usd_per_month": storage_prices(p, f.reached),
                "new_usd_per_month": storage_prices(p, f.new),
            }

        return {
            "target": self.target,
            "dataset": self.dataset,
            "store": self.store_url,
            "store_tier": self.store_tier,
            "truncated": self.truncated,
            "snapshots": [snap(f) for f in reversed(self.snapshots)],
            "dataset_total": {
                "snapshots": len(self.snapshots),
                "objects": self.dataset_footprint.objects,
                "bytes": self.dataset_footprint.bytes,
                "full_copy_bytes": self.full_copy_bytes,
                "dedup_ratio": self.dedup_ratio,
                "usd_per_month": storage_prices(p, self.dataset_footprint),
            },
            "store_total": {
                "objects": self.store_footprint.objects,
                "bytes": self.store_footprint.bytes,
                "usd_per_month": storage_prices(p, self.store_footprint),
            },
            "prices": {
                t.name: {"storage_per_gib_month": t.storage_per_gib_month, "as_of": t.as_of}
                for t in p.tiers
            },
            "read": {t.tier: t.to_json() for t in self.read},
        }


def dataset_cost(
    cat: Catalog, target: str, prices: PriceTable, *, last: int | None = None
) -> CostReport:
    """Storage figures of the snapshots ``target`` names, priced on every tier of ``prices``.

    ``target`` is ``NAME`` (every snapshot reachable from the dataset's branches and
    tags) or ``NAME@REV`` (the history of one ref). ``last`` keeps the newest ``last``
    snapshots; their parents are still read so that "new" stays relative to the real
    parent. See the module docstring for what this reads.
    """
    if last is not None and last < 1:
        raise InvalidInputError(f"last must be at least 1, got {last}")
    counting = CountingStore(cat.store)
    # every snapshot read once: the walks below pass over the history five times
    counted = Catalog(counting, snapshot_cache=None)
    dataset, heads = _heads(counted, target)
    chosen, truncated = _select(counted, heads, last)
    order = _topological(counted, chosen)
    members = set(order)
    reach = _Reach(counted)
    baselines: dict[str, frozenset[str]] = {}
    children: dict[str, int] = {}
    wanted: set[str] = set()
    for sid in order:
        snap = counted.snapshot(sid)
        wanted |= reach.objects_of(sid)
        parent = snap.parents[0] if snap.parents else None
        if parent is not None:
            children[parent] = children.get(parent, 0) + 1
            if parent not in members and parent not in baselines:
                baselines[parent] = reach.objects_of(parent)
    thresholds = prices.thresholds
    sizes, store_footprint = _list_sizes(counting, wanted, thresholds)
    del wanted

    def inputs() -> Iterator[SnapshotObjects]:
        for sid in order:
            snap = counted.snapshot(sid)
            yield SnapshotObjects(
                snapshot_id=sid,
                parent_id=snap.parents[0] if snap.parents else None,
                created=snap.created,
                samples=snap.samples,
                logical_bytes=snap.sample_bytes,
                objects=reach.objects_of(sid),
            )

    figures = tuple(
        summarise_history(
            inputs(), sizes, thresholds=thresholds, baselines=baselines, children=children
        )
    )
    return CostReport(
        target=target,
        dataset=dataset,
        store_url=cat.store.url,
        store_tier=tier_of_url(cat.store.url),
        snapshots=figures,
        dataset_footprint=figures[-1].stored if figures else Footprint(),
        full_copy_bytes=figures[-1].full_copy_bytes if figures else 0,
        store_footprint=store_footprint,
        prices=prices,
        truncated=truncated,
        read=counting.traffic.usage(),
    )


# -- tiers: where a snapshot's bytes live ----------------------------------------------


class CacheCopies(Protocol):
    """A hot tier of object copies on local disk, as ``du`` sees it.

    ``simstore.loaders``' ``ShardCache`` has this shape; the layout behind ``path_of`` is
    the cache's own.
    """

    root: str

    def path_of(self, object_id: str) -> str:
        """Where the copy of ``object_id`` lives (whether or not it is there)."""
        ...

    def usage_bytes(self) -> int:
        """Bytes the cache holds."""
        ...


class CachedCopy(Protocol):
    """A copy the cache holds pinned until :meth:`release`."""

    hit: bool

    def release(self) -> None:
        """Unpin the copy."""
        ...


class CacheFiller(CacheCopies, Protocol):
    """A hot tier that can be filled (``ShardCache``).

    ``acquire`` returns a verified copy, downloading it with ``download`` on a miss.
    """

    def acquire(
        self,
        object_id: str,
        size_bytes: Callable[[], int],
        download: Callable[[BinaryIO], None],
        *,
        referenced_by: str = "",
    ) -> CachedCopy:
        """A pinned copy of ``object_id``, filled and hash-checked on a miss."""
        ...

    def drop_if_not_size(self, object_id: str, size: int) -> bool:
        """Remove the copy of ``object_id`` if it is not ``size`` bytes (never mid-fill)."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class TierPresence:
    """How much of a set of objects one tier holds."""

    tier: str
    location: str
    objects: int | None
    bytes: int
    missing_objects: int
    missing_bytes: int

    def to_json(self) -> dict[str, Any]:
        """JSON shape."""
        return {
            "tier": self.tier,
            "location": self.location,
            "objects": self.objects,
            "bytes": self.bytes,
            "missing_objects": self.missing_objects,
            "missing_bytes": self.missing_bytes,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class DiskUsage:
    """Where the objects of a snapshot (or of the whole store) live, tier by tier.

    With a snapshot, ``objects``/``bytes`` count the snapshot object, its manifest parts
    and its shards (the objects a loader reads), and each tier says how many of them it
    holds. Without one, each tier reports everything it holds. ``unknown_size`` counts
    objects missing from the store whose size is not known (they count as 0 bytes in
    ``bytes``).
    """

    snapshot: str | None
    objects: int
    bytes: int
    tiers: tuple[TierPresence, ...]
    unknown_size: int
    read: tuple[TierUsage, ...]

    def to_json(self) -> dict[str, Any]:
        """JSON shape of ``simstore du --json``."""
        return {
            "snapshot": self.snapshot,
            "objects": self.objects,
            "bytes": self.bytes,
            "unknown_size": self.unknown_size,
            "tiers": [t.to_json() for t in self.tiers],
            "read": {t.tier: t.to_json() for t in self.read},
        }


def _load_objects(
    cat: Catalog, sid: str
) -> tuple[Snapshot, dict[str, PartRef], set[str], dict[str, int]]:
    """A snapshot, its parts by id, its shards and the sizes the store has for them.

    ``sizes`` covers the snapshot object itself too (:func:`_objects_of`).
    """
    snap = cat.snapshot(sid)
    parts: dict[str, PartRef] = {p.id: p for p in snap.parts}
    reach = _Reach(cat)
    shards: set[str] = set()
    for part in snap.parts:
        shards |= reach.shards_of(part, sid)
    sizes = _head_sizes(cat.store, shards | {sid})
    # the parts were just read, so they are there; their sizes are in the snapshot
    sizes.update({pid: p.size_bytes for pid, p in parts.items()})
    return snap, parts, shards, sizes


def _objects_of(sid: str, parts: Mapping[str, PartRef], shards: set[str]) -> set[str]:
    """Every object a reader of snapshot ``sid`` fetches: the snapshot, its parts, shards."""
    return shards | set(parts) | {sid}


def _copy_size(cache: CacheCopies, oid: str) -> int | None:
    try:
        return os.stat(cache.path_of(oid)).st_size
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StorageError(f"cache copy {cache.path_of(oid)}: {exc.strerror or exc}") from exc


def _whole_copy(cache: CacheCopies, oid: str, size: int | None) -> bool:
    """Whether the cache holds a copy of ``oid`` of the object's size (when known)."""
    held = _copy_size(cache, oid)
    return held is not None and (size is None or held == size)


def disk_usage(
    cat: Catalog, ref: str | None = None, *, cache: CacheCopies | None = None
) -> DiskUsage:
    """Where ``ref``'s snapshot object, manifest parts and shards live: store and cache.

    Without ``ref``, totals of everything the store and the cache hold.
    """
    counting = CountingStore(cat.store)
    counted = Catalog(counting)
    store_tier = tier_of_url(cat.store.url)
    if ref is None:
        _, footprint = _list_sizes(counting, set(), ())
        tiers = [
            TierPresence(tier=store_tier, location=cat.store.url, objects=footprint.objects,
                         bytes=footprint.bytes, missing_objects=0, missing_bytes=0)
        ]  # fmt: skip
        if cache is not None:
            used = cache.usage_bytes()
            # the cache's layout is its own: it reports bytes, not an object count
            tiers.append(TierPresence(tier="cache", location=cache.root, objects=None, bytes=used,
                                      missing_objects=0, missing_bytes=0))  # fmt: skip
        return DiskUsage(
            snapshot=None,
            objects=footprint.objects,
            bytes=footprint.bytes,
            tiers=tuple(tiers),
            unknown_size=0,
            read=counting.traffic.usage(),
        )
    sid = counted.resolve(ref)
    _snap, parts, shards, sizes = _load_objects(counted, sid)
    wanted = _objects_of(sid, parts, shards)
    known = {oid: sizes.get(oid) for oid in wanted}
    total = sum(n for n in known.values() if n is not None)
    unknown = sum(1 for n in known.values() if n is None)
    in_store = [oid for oid in wanted if oid in sizes]
    present = [_presence(store_tier, cat.store.url, in_store, known, wanted)]
    if cache is not None:
        # a copy whose size is not its object's is damaged (a loader would drop it)
        in_cache = [oid for oid in wanted if _whole_copy(cache, oid, known[oid])]
        present.append(_presence("cache", cache.root, in_cache, known, wanted))
    return DiskUsage(
        snapshot=sid,
        objects=len(wanted),
        bytes=total,
        tiers=tuple(present),
        unknown_size=unknown,
        read=counting.traffic.usage(),
    )


def _presence(
    tier: str, location: str, held: Sequence[str], known: Mapping[str, int | None],
    wanted: set[str],
) -> TierPresence:  # fmt: skip
    held_set = set(held)
    have = sum(known[o] or 0 for o in held_set)
    lacking = wanted - held_set
    return TierPresence(
        tier=tier,
        location=location,
        objects=len(held_set),
        bytes=have,
        missing_objects=len(lacking),
        missing_bytes=sum(known[o] or 0 for o in lacking),
    )


# -- pull: warm the hot tier -----------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class PullReport:
    """What :func:`warm_cache` did."""

    snapshot: str
    cache_dir: str
    objects: int
    bytes: int
    already_cached: int
    fetched: int
    fetched_bytes: int
    limit_bytes: int
    seconds: float
    fields: tuple[str, ...]
    read: tuple[TierUsage, ...]
    present: int = -1
    """Objects whose whole copy is in the cache once the pull ends (-1: not looked at).
    Fewer than ``objects`` when other readers' pinned copies filled the limit and the
    pull's own copies were evicted to make room."""

    def to_json(self) -> dict[str, Any]:
        """JSON shape of ``simstore pull --json``."""
        return {
            "snapshot": self.snapshot,
            "cache_dir": self.cache_dir,
            "objects": self.objects,
            "bytes": self.bytes,
            "already_cached": self.already_cached,
            "fetched": self.fetched,
            "fetched_bytes": self.fetched_bytes,
            "limit_bytes": self.limit_bytes,
            "seconds": self.seconds,
            "fields": list(self.fields),
            "read": {t.tier: t.to_json() for t in self.read},
            "present": self.present,
        }


def warm_cache(
    cat: Catalog,
    ref: str,
    cache_dir: str,
    open_cache: Callable[[int], CacheFiller],
    *,
    limit_bytes: int | None = None,
    fields: Sequence[str] = (),
    max_workers: int = 8,
    block_bytes: int = DEFAULT_FILL_BLOCK_BYTES,
) -> PullReport:
    """Copy ``ref``'s snapshot object, manifest parts and shards into the hot tier.

    The hot tier is the loader's disk cache at ``cache_dir``: a ``SimDataset`` with that
    cache then reads nothing from the store but the ref (and the store's metadata).

    ``open_cache(limit_bytes)`` opens the loader's cache there (``ShardCache``); each
    object goes in through its ``acquire``, which downloads on a miss and keeps the copy
    only if its bytes hash to its id. ``limit_bytes`` defaults to what the cache holds
    plus the free space of its file system; when the snapshot needs more, nothing is
    downloaded, no folder is made, and :class:`InvalidInputError` says how much is needed;
    a ``cache_dir`` under a file is an :class:`InvalidInputError` too, and an object the
    snapshot references that the store lacks an :class:`IntegrityError`. ``fields`` must be
    fields of the snapshot's schema; every shard object holds all fields of its samples,
    so whole shards are pulled whatever fields are named. Objects are fetched by
    ``max_workers`` threads, each in ranged reads of at most ``block_bytes``.
    """
    if max_workers < 1:
        raise InvalidInputError(f"max_workers must be at least 1, got {max_workers}")
    started = time.monotonic()
    counting = CountingStore(cat.store)
    counted = Catalog(counting)
    sid = counted.resolve(ref)
    snap, parts, shards, sizes = _load_objects(counted, sid)
    names = {f.name for f in snap.schema}
    unknown = [f for f in fields if f not in names]
    if unknown:
        raise InvalidInputError(
            f"snapshot {sid} has no field {unknown[0]!r}; its fields: {', '.join(sorted(names))}"
        )
    wanted = sorted(_objects_of(sid, parts, shards))
    missing = [oid for oid in wanted if oid not in sizes]
    if missing:
        # an object a snapshot references and the store lacks is damage, as for verify
        raise IntegrityError(
            f"{cat.store.url}: {object_key(missing[0])} is missing"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
            + f"; referenced by snapshot {sid}"
        )
    total = sum(sizes[o] for o in wanted)
    # a refused pull creates nothing: the folder is made only once the snapshot fits
    existing = _existing_folder(cache_dir)
    # only to measure what it holds: nothing is filled with it; a folder that is not
    # there, or is empty, holds nothing (and opening it would make it a cache)
    empty = not os.path.isdir(cache_dir) or not os.listdir(cache_dir)
    opened = None if empty else open_cache(1)
    held = 0 if opened is None else opened.usage_bytes()
    room = held + shutil.disk_usage(existing).free
    if limit_bytes is not None and total > limit_bytes:
        raise InvalidInputError(
            f"snapshot {sid} needs {total} bytes ({_human(total)}) of cache for "
            f"{len(wanted)} objects (the snapshot, its manifest parts and shards), but the "
            f"cache limit is {limit_bytes} bytes ({_human(limit_bytes)}); a limit of at "
            f"least {total} bytes is needed"
        )
    # with a limit or without, the disk's room decides too (a limit above it filled the
    # disk and stopped half way), in whole blocks: each copy still to write rounded up,
    # with the cache's folders and marker still to make (a check of bytes alone let a
    # pull with a few KiB to spare fill the disk); the copies it holds already stay, its
    # others may be evicted
    present = {o for o in wanted if opened is not None and _whole_copy(opened, o, sizes[o])}
    block = max(1, os.statvfs(existing).f_frsize)
    folders = {f"{sub}/{o[:2]}" for o in wanted if o not in present for sub in ("objects", "used")}
    root = os.path.abspath(cache_dir)
    made = sum(os.path.isdir(os.path.join(root, f)) for f in folders)
    need = sum(-(-sizes[o] // block) * block for o in wanted if o not in present) + block * (
        len(folders) - made + (6 if opened is None else 0))
    have = room - sum(sizes[o] for o in present)
    if need > have:
        raise InvalidInputError(
            f"snapshot {sid} needs {need} bytes ({_human(need)}) of room on the disk of "
            f"{cache_dir} for the {len(wanted) - len(present)} of its {len(wanted)} objects "
            f"not cached yet (in whole blocks, with the cache's folders), but the free "
            f"space of {cache_dir} and its copies of other objects come to {have} bytes "
            f"({_human(have)}); a limit of at "
            f"least {total} bytes and {need} bytes of room on its disk (whole blocks) are "
            "needed"
        )
    limit_bytes = room if limit_bytes is None else limit_bytes
    try:
        os.makedirs(cache_dir, exist_ok=True)
    except OSError as exc:
        raise StorageError(f"cache directory {cache_dir}: {exc.strerror or exc}") from exc
    cache = open_cache(limit_bytes)

    def fetch(oid: str) -> tuple[bool, int]:
        size = sizes[oid]

        def download(out: BinaryIO) -> None:
            key = object_key(oid)
            if size <= block_bytes:
                out.write(counting.get(key))
                return
            for start in range(0, size, block_bytes):
                out.write(counting.get(key, (start, min(size, start + block_bytes))))

        # damaged on the node's disk (cut short, or grown): fetched again
        cache.drop_if_not_size(oid, size)
        copy = cache.acquire(oid, lambda: size, download, referenced_by=sid)
        try:
            return copy.hit, size
        finally:
            copy.release()

    hits = fetched = fetched_bytes = 0
    with ThreadPoolExecutor(max_workers=min(max_workers, max(1, len(wanted)))) as pool:
        for hit, size in pool.map(fetch, wanted):
            if hit:
                hits += 1
            else:
                fetched += 1
                fetched_bytes += size
    return PullReport(
        snapshot=sid,
        cache_dir=os.path.abspath(cache_dir),
        objects=len(wanted),
        bytes=total,
        already_cached=hits,
        fetched=fetched,
        fetched_bytes=fetched_bytes,
        limit_bytes=limit_bytes,
        seconds=time.monotonic() - started,
        fields=tuple(fields),
        read=counting.traffic.usage(),
        # what is there now: a job reading the cache meanwhile may have pinned enough of
        # the limit that this pull's first copies were evicted for its last ones
        present=sum(_copy_size(cache, oid) == sizes[oid] for oid in wanted),
    )


def _existing_folder(cache_dir: str, name: str = "cache directory") -> str:
    """``cache_dir``, or the nearest folder above it that exists (the one to make it in).

    A path that is, or lies under, something other than a folder (a file) is an
    :class:`InvalidInputError` naming ``name`` (the CLI's ``--cache``) and both paths: no
    cache can be made there.
    """
    path = os.path.normpath(cache_dir)
    while not os.path.isdir(path):
        if os.path.lexists(path):
            what = "a file, not a directory" if os.path.isfile(path) else "not a directory"
            raise InvalidInputError(f"{name} {cache_dir}: {path} is {what}")
        parent = os.path.dirname(path) or "."
        if parent == path:
            break
        path = parent
    return path


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"
