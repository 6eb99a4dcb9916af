"""verify and gc: checking what a snapshot reaches, and deleting what nothing reaches."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow.compute as pc

from simstore.catalog._catalog import Catalog
from simstore.catalog._refs import Branches, Tags, is_snapshot_object
from simstore.errors import (
    FormatError,
    IntegrityError,
    InvalidInputError,
    NotFoundError,
    SimstoreError,
)
from simstore.hashing import Hasher, is_object_id, object_key
from simstore.names import Ref
from simstore.snapshot import SNAPSHOT_HEAD, Snapshot, content_hash_of
from simstore.storage import sweep_scratch

__all__ = ["GcReport", "VerifyReport", "gc", "reachable_objects", "verify"]

_HASH_BLOCK = 8 * 1024 * 1024


@dataclass(slots=True, kw_only=True)
class VerifyReport:
    """What ``verify`` checked and what it found wrong."""

    snapshot: str
    deep: bool
    objects_checked: int = 0
    bytes_hashed: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether nothing was wrong."""
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        """JSON shape."""
        return {
            "snapshot": self.snapshot,
            "deep": self.deep,
            "ok": self.ok,
            "objects_checked": self.objects_checked,
            "bytes_hashed": self.bytes_hashed,
            "problems": list(self.problems),
        }


def _hash_object(cat: Catalog, oid: str) -> tuple[str, int]:
    key = object_key(oid)
    path = cat.store.local_path(key)
    h = Hasher()
    if path is not None:
        with open(path, "rb") as f:
            while block := f.read(_HASH_BLOCK):
                h.update(block)
        return h.hexdigest(), h.size_bytes
    open_read = getattr(cat.store, "open_read", None)
    if open_read is not None:
        # one whole-object GET read block by block (S3): no HEAD, no ranged GETs
        with open_read(key) as stream:
            while block := stream.read(_HASH_BLOCK):
                h.update(block)
        return h.hexdigest(), h.size_bytes
    size = cat.store.info(key).size_bytes
    start = 0
    while start < size:
        end = min(size, start + _HASH_BLOCK)
        h.update(cat.store.get(key, byte_range=(start, end)))
        start = end
    return h.hexdigest(), h.size_bytes


def verify(cat: Catalog, ref: str | Ref, *, deep: bool = False) -> VerifyReport:
    """Check a snapshot and everything it reaches.

    Always: the snapshot hashes to its id, every manifest part exists, hashes to its id,
    decodes, has the rows and content the snapshot says, and every shard exists. With
    ``deep``: every shard and lineage object is re-hashed. Problems name the object and
    the snapshot; the report lists them all rather than stopping at the first.
    """
    sid = cat.resolve(ref)
    report = VerifyReport(snapshot=sid, deep=deep)
    try:
        snap = cat.snapshot(sid)
    except SimstoreError as exc:
        report.problems.append(str(exc))
        return report
    report.objects_checked += 1
    if content_hash_of(snap.parts) != snap.content_hash:
        report.problems.append(f"snapshot {sid}: content_hash does not match its parts")
    shards: dict[str, int] = {}
    for part in snap.parts:
        report.objects_checked += 1
        try:
            table = cat.read_part(part, snapshot=sid)
        except (NotFoundError, IntegrityError, FormatError) as exc:
            report.problems.append(f"{exc} (manifest part of snapshot {sid})")
            continue
        if table.num_rows != part.rows:
            report.problems.append(
                f"manifest part {part.id} of snapshot {sid} has {table.num_rows} rows, "
                f"snapshot says {part.rows}"
            )
        for shard in pc.unique(table.column("shard")).to_pylist():
            shards[shard] = shards.get(shard, 0) + 1
    extra = [str(o) for o in snap.lineage.get("objects", [])]
    for oid in [*sorted(shards), *extra]:
        report.objects_checked += 1
        key = object_key(oid)
        if not is_object_id(oid):
            report.problems.append(f"snapshot {sid} references an invalid object id {oid!r}")
            continue
        if not deep:
            if not cat.store.exists(key):
                report.problems.append(f"{key} is missing; referenced by snapshot {sid}")
            continue
        try:
            actual, size = _hash_object(cat, oid)
        except NotFoundError:
            report.problems.append(f"{key} is missing; referenced by snapshot {sid}")
            continue
        report.bytes_hashed += size
        if actual != oid:
            report.problems.append(
                f"{key} has hash {actual}, expected {oid}; referenced by snapshot {sid}"
            )
    return report


def _all_ref_targets(cat: Catalog) -> Iterator[str]:
    for dataset in cat.datasets():
        for refs in (Branches(cat.store, dataset), Tags(cat.store, dataset)):
            for _name, sid in refs.list():
                yield sid


def reachable_objects(
    cat: Catalog, roots: Iterable[str], *, missing_ok: bool = False,
    seen: set[str] | None = None,
) -> set[str]:
    """Every object id reachable from snapshot ids ``roots`` (snapshots, parts, shards).

    ``missing_ok``: a snapshot or manifest part that is gone is passed over instead of
    raising (a snapshot no ref names may have lost its ancestors to an earlier gc).
    ``seen``: snapshot ids already walked (updated), whose objects are not returned again.
    """
    seen_snaps: set[str] = set() if seen is None else seen
    seen_parts: set[str] = set()
    keep: set[str] = set()
    stack = list(roots)
    while stack:
        sid = stack.pop()
        if sid in seen_snaps:
            continue
        seen_snaps.add(sid)
        try:
            snap: Snapshot = cat.snapshot(sid)
        except NotFoundError:
            if not missing_ok:
                raise
            continue
        keep.add(sid)
        stack.extend(snap.parents)
        keep.update(str(o) for o in snap.lineage.get("objects", []))
        for part in snap.parts:
            if part.id in seen_parts:
                continue
            seen_parts.add(part.id)
            try:
                table = cat.read_part(part, snapshot=sid)
            except NotFoundError:
                if not missing_ok:
                    raise
                continue
            keep.add(part.id)
            keep.update(pc.unique(table.column("shard")).to_pylist())
    return keep


# A snapshot is a small JSON object; anything larger is not read to find out whether it is one.
_SNAPSHOT_MAX_BYTES = 64 * 1024 * 1024


def _is_snapshot(cat: Catalog, key: str, size: int) -> bool:
    """Whether object ``key`` is a snapshot (by its first bytes; see docs/format.md)."""
    if size < len(SNAPSHOT_HEAD) or size > _SNAPSHOT_MAX_BYTES:
        return False
    return is_snapshot_object(cat.store, key.rsplit("/", 1)[-1])


@dataclass(slots=True, kw_only=True)
class GcReport:
    """What ``gc`` kept and deleted (or would delete, in a dry run)."""

    dry_run: bool
    grace_s: float
    reachable: int = 0
    kept_recent: int = 0
    deleted: list[str] = field(default_factory=list)
    deleted_bytes: int = 0
    temporary_removed: int = 0

    def to_json(self) -> dict[str, Any]:
        """JSON shape."""
        return {
            "dry_run": self.dry_run,
            "grace_s": self.grace_s,
            "reachable": self.reachable,
            "kept_recent": self.kept_recent,
            "deleted": len(self.deleted),
            "deleted_bytes": self.deleted_bytes,
            "deleted_objects": list(self.deleted),
            "temporary_removed": self.temporary_removed,
        }


def _restore(cat: Catalog, roots: Iterable[str], removed: dict[str, tuple[Any, bytes]]) -> None:
    """Write back the snapshots in ``removed`` (taken out of it) that ``roots`` reach."""
    seen: set[str] = set()
    stack = list(roots)
    while stack:
        sid = stack.pop()
        if sid in seen:
            continue
        seen.add(sid)
        if sid in removed:
            data = removed.pop(sid)[1]
            cat.store.put_if_absent(object_key(sid), data)
            snap = Snapshot.from_bytes(data, object_id=sid)
        else:
            try:
                snap = cat.snapshot(sid)
            except NotFoundError:
                continue
        stack.extend(snap.parents)


def gc(
    cat: Catalog, *, grace_s: float = 3600.0, dry_run: bool = False, now: float | None = None
) -> GcReport:
    """Delete objects that no ref, staging entry or recent write can reach.

    Reachable: every snapshot a branch or tag points to and their ancestors, their
    manifest parts and shards and lineage objects, and everything a staging entry names.
    Objects modified within ``grace_s`` are kept whatever they are: a writer that has
    stored (or reused, which refreshes the time) objects but not yet committed is
    protected as long as it commits within the grace period. A snapshot modified within
    it is a root as well, kept with everything it reaches: a branch deleted a moment ago
    can be created again at its head, and creating a branch or tag refreshes its
    snapshot first. Temporary files of killed writers older than the grace period are
    removed too, and the scratch folders of killed ingests in this machine's temp dir
    (their owner's lock tells them from a live ingest's).

    Snapshots are deleted before anything else, each read first; then the refs are read
    again, and a snapshot deleted here that a ref created meanwhile names is written
    back, with everything it reaches kept. A ref created after that second reading finds
    its snapshot gone (the create checks) and is removed again by its writer.
    """
    if isinstance(grace_s, bool) or not isinstance(grace_s, int | float) \
            or not math.isfinite(grace_s) or grace_s < 0:
        raise InvalidInputError(
            f"grace_s must be a non-negative number of seconds, got {grace_s!r} (objects "
            "written within the grace period are what protects writers in flight)"
        )
    now = time.time() if now is None else now
    report = GcReport(dry_run=dry_run, grace_s=grace_s)
    # Objects first listed, then roots read: an object written after the listing is
    # not considered at all, and one written before it is either reachable or recent.
    listing = list(cat.store.list_info("objects/"))
    # Staging entries before refs: a commit moves the ref first and removes its staging
    # entry after, so an entry gone by the time it is read has its snapshot on a ref read
    # later. Read the other way round, a commit landing between the two reads hides its
    # objects from both, and an entry staged longer ago than the grace period loses them.
    keep: set[str] = set()
    for dataset in cat.datasets():
        for entry in cat.staged(dataset):
            keep.update(entry.referenced_objects())
    walked: set[str] = set()
    keep |= reachable_objects(cat, set(_all_ref_targets(cat)), seen=walked)
    cutoff = now - grace_s

    def unreached(infos: Iterable[Any]) -> list[Any]:
        return [i for i in infos if i.key.rsplit("/", 1)[-1] not in keep]

    recent_snaps = [i.key.rsplit("/", 1)[-1] for i in unreached(listing)
                    if i.mtime >= cutoff and _is_snapshot(cat, i.key, i.size_bytes)]
    keep |= reachable_objects(cat, recent_snaps, missing_ok=True, seen=walked)
    report.reachable = len(keep)
    old = [i for i in unreached(listing) if i.mtime < cutoff]
    report.kept_recent = len(unreached(listing)) - len(old)
    snaps = [i for i in old if _is_snapshot(cat, i.key, i.size_bytes)]
    removed: dict[str, tuple[Any, bytes]] = {}  # snapshot id -> (listing entry, its bytes)
    refreshed: list[str] = []
    for info in snaps:
        oid = info.key.rsplit("/", 1)[-1]
        if dry_run:
            removed[oid] = (info, b"")
            continue
        try:
            if cat.store.info(info.key).mtime >= cutoff:  # refreshed: a ref is on its way
                report.kept_recent += 1
                refreshed.append(oid)
                continue
            data = cat.store.get(info.key)
        except NotFoundError:
            continue
        cat.store.delete(info.key)
        removed[oid] = (info, data)
    if not dry_run and (removed or refreshed):
        # refs created since the first reading, and snapshots refreshed for one: they and
        # their ancestors come back if deleted above, and all they reach stays
        late = [*(set(_all_ref_targets(cat)) - walked), *refreshed]
        _restore(cat, late, removed)
        keep |= reachable_objects(cat, late, missing_ok=True)
    snap_keys = {i.key for i in snaps}
    others = [i for i in old
              if i.key not in snap_keys and i.key.rsplit("/", 1)[-1] not in keep]
    for oid, (info, _) in removed.items():
        report.deleted.append(oid)
        report.deleted_bytes += info.size_bytes
    for info in others:
        oid = info.key.rsplit("/", 1)[-1]
        if not dry_run:
            # re-check: a writer may have reused (and so refreshed) it since the listing
            try:
                if cat.store.info(info.key).mtime >= cutoff:
                    report.kept_recent += 1
                    continue
            except NotFoundError:
                continue
            cat.store.delete(info.key)
        report.deleted.append(oid)
        report.deleted_bytes += info.size_bytes
    list_tmp = getattr(cat.store, "list_temporary", None)
    if callable(list_tmp):
        import os
        import shutil

        for path in list(list_tmp(cutoff)):
            report.temporary_removed += 1
            if dry_run:
                continue
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                try:
                    os.unlink(path)
                except OSError:
                    pass
    # ingest scratch folders in this machine's temp dir (where shards for a store that
    # cannot link a local file into place are built) whose owner died: a live ingest
    # holds its folder's lock, so whatever store it writes to, its folder stays
    report.temporary_removed += len(sweep_scratch(unmarked_before=cutoff, dry_run=dry_run))
    return report
