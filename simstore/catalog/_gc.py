"""gc: deleting what no ref, ancestor or staging entry reaches, past a grace period."""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow.compute as pc

from simstore.catalog._caps import max_bytes, read_capped
from simstore.catalog._catalog import Catalog
from simstore.catalog._refs import is_snapshot_object, misplaced_refs
from simstore.catalog._verify import check_catalog, check_flags
from simstore.errors import (
    FormatError,
    IntegrityError,
    InvalidInputError,
    NotFoundError,
    ReadOnlyError,
    StorageError,
)
from simstore.hashing import is_object_key, object_key
from simstore.snapshot import SNAPSHOT_HEAD, Snapshot
from simstore.storage import sweep_scratch

__all__ = [
    "GC_STATE_KEY",
    "GcReport",
    "gc",
    "gc_overlapped",
    "reachable_objects",
    "read_gc_state",
]


def _all_ref_targets(cat: Catalog) -> Iterator[str]:
    # a missing target is damage naming its ref, whichever root is walked first
    for dataset in cat.datasets():
        yield from cat.ref_targets(dataset)


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


def _is_snapshot(cat: Catalog, key: str, size: int) -> bool:
    """Whether object ``key`` is a snapshot (by its first bytes; see docs/format.md).

    One larger than any snapshot (``_caps.py``) is not read to find out: it is none.
    """
    if size < len(SNAPSHOT_HEAD) or size > max_bytes("snapshot"):
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
    foreign: list[str] = field(default_factory=list)
    """Keys under ``objects/`` that are not laid out as objects (``objects/<2 hex>/<id>``):
    put there by something else, never deleted."""
    restored: list[str] = field(default_factory=list)
    """Objects a killed gc had left aside (a local store), put back before the listing."""
    clock: str = "store"
    """Whose time the ages were measured on: ``store`` (its :meth:`~ObjectStore.clock`),
    ``given`` (``now=``) or, for a dry run only, ``local: <why the store's was not read>``."""

    def to_json(self) -> dict[str, Any]:
        """JSON shape."""
        return {
            "dry_run": self.dry_run,
            "grace_s": self.grace_s,
            "clock": self.clock,
            "reachable": self.reachable,
            "kept_recent": self.kept_recent,
            "deleted": len(self.deleted),
            "deleted_bytes": self.deleted_bytes,
            "deleted_objects": list(self.deleted),
            "temporary_removed": self.temporary_removed,
            "foreign": len(self.foreign),
            "foreign_keys": list(self.foreign),
            "restored": list(self.restored),
        }


def _delete_unless_since(store: Any, key: str, cutoff: float) -> str:
    """Delete ``key`` unless written or reused since ``cutoff``: deleted, recent or gone.

    A store that decides both in one step (``LocalStore.delete_unless_since``) keeps an
    object a writer reuses while gc deletes it; elsewhere the time is read again just
    before the delete (a writer reusing the object in between loses it, a window of one
    round trip).
    """
    atomic = getattr(store, "delete_unless_since", None)
    if callable(atomic):
        return str(atomic(key, cutoff))
    try:
        if store.info(key).mtime >= cutoff:
            return "recent"
    except NotFoundError:
        return "gone"
    store.delete(key)
    return "deleted"


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


def _store_clock(cat: Catalog, dry_run: bool = False) -> float:
    """The store's current time (:meth:`ObjectStore.clock`); its errors propagate.

    A dry run reads it with no write where the store can (``read_clock``: the ``Date``
    of a LIST on S3, where ``clock`` writes a probe object), so read-only credentials
    give the server's time too. A store without a ``clock`` (a wrapper written before
    stores had one) is taken to share this machine's clock, as every store was before.
    """
    read = getattr(cat.store, "read_clock", None)
    if dry_run and callable(read):
        return float(read())
    clock = getattr(cat.store, "clock", None)
    if not callable(clock):
        return time.time()
    return float(clock())


GC_STATE_KEY = "gc.json"
"""Where a deleting gc says it is running, and then that it is done (see :func:`gc_overlapped`)."""


def _write_gc_state(cat: Catalog, run: str, state: str, grace_s: float, now: float) -> None:
    body = {"format_version": 1, "kind": "gc-state", "run": run, "state": state,
            "grace_s": grace_s, "started": now}
    cat.store.put(GC_STATE_KEY, json.dumps(body, sort_keys=True).encode())


_OVERSIZED_RECORD = b"\0a gc record larger than any gc writes"
"""What :func:`read_gc_state` gives for such a record: unreadable, as damaged ones are."""


def read_gc_state(store: Any) -> bytes | None:
    """The store's gc record as it is now (None: no gc ever deleted anything here).

    One larger than any gc writes is not read: it counts as unreadable, for which
    :func:`gc_overlapped` assumes the worst (a check), as for one that does not parse.
    """
    try:
        data = read_capped(store, GC_STATE_KEY, "store record")
    except NotFoundError:
        return None
    except FormatError:
        return _OVERSIZED_RECORD
    return data


def gc_overlapped(before: bytes | None, after: bytes | None) -> bool:
    """Whether a deleting gc may have run between two readings of :func:`read_gc_state`.

    Yes when the record changed (a gc started, or finished, in between), or when the
    first reading found one running (it may still be deleting, or have died doing so). A
    writer that stored objects in between, and holds them by nothing but their age (gc's
    grace period), then checks them before it names them in a staging entry.
    """
    if before != after:
        return True
    if before is None:
        return False
    try:
        state = json.loads(before).get("state")
    except (ValueError, AttributeError, RecursionError):
        return True  # unreadable: assume the worst, which only costs a check
    return bool(state != "done")


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

    Ages are measured on the store's clock (:meth:`ObjectStore.clock`: the server's for S3,
    read once, before the listing), not this machine's, unless ``now`` is given; a
    store that cannot tell its time (a failed probe) fails gc rather than let the local
    clock decide. Scratch folders in this machine's temp dir are aged on its own clock.

    Snapshots are deleted before anything else, each read first; then the refs are read
    again, and a snapshot deleted here that a ref created meanwhile names is written
    back, with everything it reaches kept. A ref created after that second reading finds
    its snapshot gone (the create checks) and is removed again by its writer.
    """
    check_catalog(cat, "gc")
    check_flags(dry_run=dry_run)
    dry_run = bool(dry_run)
    if now is not None and (isinstance(now, bool) or not isinstance(now, int | float)
                            or not math.isfinite(now)):
        raise InvalidInputError(f"invalid now {now!r}: seconds since the epoch, or None")
    if isinstance(grace_s, bool) or not isinstance(grace_s, int | float) \
            or not math.isfinite(grace_s) or grace_s < 0:
        raise InvalidInputError(
            f"grace_s must be a non-negative number of seconds, got {grace_s!r} (objects "
            "written within the grace period are what protects writers in flight)"
        )
    if now is None:
        # The store's "now", not this machine's: object times on S3 are the server's, and
        # a local clock running ahead of it would make what a writer stored a moment ago
        # look older than the grace period. Read before the listing, so nothing listed is
        # newer than it. The scratch folders swept below are this machine's files, with
        # this machine's times.
        clock = "store"
        try:
            now = _store_clock(cat, dry_run)
        except (ReadOnlyError, StorageError) as exc:
            if not dry_run:
                raise
            # a dry run deletes nothing: read-only credentials may still see what a gc
            # would do, with ages on this machine's clock (said in the report)
            now, clock = time.time(), f"local: {exc}"
        local_now = time.time()
    else:
        local_now, clock = now, "given"
    misplaced = misplaced_refs(cat.store)
    if misplaced:
        more = f" (and {len(misplaced) - 1} more)" if len(misplaced) > 1 else ""
        raise IntegrityError(
            f"gc refused: {misplaced[0][1]}; its history would be taken for unreachable{more}"
        )
    report = GcReport(dry_run=dry_run, grace_s=grace_s, clock=clock)
    run = uuid.uuid4().hex
    restore = getattr(cat.store, "restore_set_aside", None)
    if not dry_run and callable(restore):
        # an object a killed gc left aside may be one a writer had just reused: back
        # under its name before the listing, it is judged again like any other
        report.restored = list(restore())
    if not dry_run:
        # before anything is listed or deleted: an ingest that read the record before
        # this and reads it again before staging sees that a gc ran meanwhile, and checks
        # that what it stored is still there (a grace shorter than the ingest deletes it)
        _write_gc_state(cat, run, "running", grace_s, now)
    # Objects first listed, then roots read: an object written after the listing is
    # not considered at all, and one written before it is either reachable or recent.
    # Only keys laid out as objects are (objects/<2 hex>/<id>): a file put under objects/
    # by hand, or another store nested there, is not this store's to delete
    listing = []
    for info in cat.store.list_info("objects/"):
        if is_object_key(info.key):
            listing.append(info)
        else:
            report.foreign.append(info.key)
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
            # kept to write back if a new ref names it
            data = read_capped(cat.store, info.key, "snapshot")
        except NotFoundError:
            continue
        state = _delete_unless_since(cat.store, info.key, cutoff)
        if state == "recent":  # refreshed since the listing: a ref is on its way
            report.kept_recent += 1
            refreshed.append(oid)
            continue
        if state == "gone":
            continue
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
            # re-checked: a writer may have reused (and so refreshed) it since the listing
            state = _delete_unless_since(cat.store, info.key, cutoff)
            if state == "recent":
                report.kept_recent += 1
                continue
            if state == "gone":
                continue
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
    report.temporary_removed += len(
        sweep_scratch(unmarked_before=local_now - grace_s, dry_run=dry_run)
    )
    if not dry_run:
        _write_gc_state(cat, run, "done", grace_s, now)
    return report
