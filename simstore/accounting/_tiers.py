"""Tiers: where a snapshot's bytes live (``du``), and warming the hot tier (``pull``)."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, BinaryIO, Protocol

from simstore._sizes import human_bytes
from simstore.accounting._walk import Reach, head_sizes, list_sizes
from simstore.catalog import Catalog
from simstore.cost import TierUsage
from simstore.errors import IntegrityError, InvalidInputError, StorageError
from simstore.hashing import object_key
from simstore.manifest import PartRef
from simstore.snapshot import Snapshot
from simstore.storage import CountingStore, tier_of_url

DEFAULT_FILL_BLOCK_BYTES = 64 * 1024 * 1024


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
    reach = Reach(cat)
    shards: set[str] = set()
    for part in snap.parts:
        shards |= reach.shards_of(part, sid)
    sizes = head_sizes(cat.store, shards | {sid})
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
        _, footprint = list_sizes(counting, set(), ())
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
    existing = existing_folder(cache_dir)
    # only to measure what it holds: nothing is filled with it; a folder that is not
    # there, or is empty, holds nothing (and opening it would make it a cache)
    empty = not os.path.isdir(cache_dir) or not os.listdir(cache_dir)
    opened = None if empty else open_cache(1)
    held = 0 if opened is None else opened.usage_bytes()
    room = held + shutil.disk_usage(existing).free
    if limit_bytes is not None and total > limit_bytes:
        raise InvalidInputError(
            f"snapshot {sid} needs {total} bytes ({human_bytes(total)}) of cache for "
            f"{len(wanted)} objects (the snapshot, its manifest parts and shards), but the "
            f"cache limit is {limit_bytes} bytes ({human_bytes(limit_bytes)}); a limit of at "
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
            f"snapshot {sid} needs {need} bytes ({human_bytes(need)}) of room on the disk of "
            f"{cache_dir} for the {len(wanted) - len(present)} of its {len(wanted)} objects "
            f"not cached yet (in whole blocks, with the cache's folders), but the free "
            f"space of {cache_dir} and its copies of other objects come to {have} bytes "
            f"({human_bytes(have)}); a limit of at "
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


def existing_folder(cache_dir: str, name: str = "cache directory") -> str:
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

