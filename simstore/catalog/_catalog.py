"""The catalog: datasets, refs, snapshots, staging and commits over one ObjectStore."""

from __future__ import annotations

import io
import json
import numbers
import os
import random
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from simstore.catalog._build import WRITE_THREADS, utc_at_ns, utc_now
from simstore.catalog._caps import Kind, check_written, read_capped, read_capped_versioned
from simstore.catalog._commit import (
    CommitResult,
    commit,
    consumed_in_history,
    staged_at_ns,
    taken_along,
)
from simstore.catalog._merge import CHANGES_SCHEMA, normalise_changes
from simstore.catalog._refs import (
    Branches,
    Tags,
    dataset_prefix,
    gone_after_all,
    is_snapshot_object,
    staging_key,
)
from simstore.catalog._staged import Mode, StagedEntry
from simstore.diff import Diff, diff_tables, parts_to_open
from simstore.errors import (
    ConflictError,
    FormatError,
    IntegrityError,
    InvalidInputError,
    NotFoundError,
    SimstoreError,
    StorageError,
    version_error,
)
from simstore.hashing import ObjectId, hash_bytes, is_object_id, object_key
from simstore.manifest import (
    DEFAULT_TARGET_ROWS,
    MANIFEST_SCHEMA,
    PartRef,
    decode_part,
    empty_rows,
)
from simstore.names import DEFAULT_BRANCH, Ref, check_name, parse_ref
from simstore.sample import Schema, canonical_json
from simstore.snapshot import Snapshot, SnapshotId
from simstore.storage import ObjectStore, is_store, open_store

__all__ = [
    "CACHE_MARKER_KEY",
    "STORE_META_KEY",
    "Catalog",
    "CommitResult",
    "DiffResult",
    "StagedEntry",
    "utc_now",
]

STORE_META_KEY = "simstore.json"
CACHE_MARKER_KEY = "simstore-cache.json"
"""The file that marks a directory as a loader's disk cache: no store is made there (the
cache's eviction deletes what lies under its ``objects/``, as a store's objects do)."""
STORE_FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class DiffResult:
    """A diff and what computing it cost."""

    a: SnapshotId | None
    b: SnapshotId
    diff: Diff
    parts_total: int
    parts_read: int
    bytes_read: int
    manifest_bytes: int

    def to_json(self) -> dict[str, Any]:
        """The diff's JSON plus snapshot ids and read cost."""
        out: dict[str, Any] = dict(self.diff.to_json())
        out["a"] = self.a
        out["b"] = self.b
        out["cost"] = {
            "parts_total": self.parts_total,
            "parts_read": self.parts_read,
            "bytes_read": self.bytes_read,
            "manifest_bytes": self.manifest_bytes,
        }
        return out


_NAMED_MAX = 65_536
"""At most this many snapshot ids a catalog remembers as named by a ref or a snapshot."""


class Catalog:
    """Datasets, refs, snapshots, staging and commits in one store.

    Cheap to construct; holds only the store (which pickles) and a per-instance cache of
    immutable snapshot objects: up to ``snapshot_cache`` of them (emptied when full), or
    every one read with None, for a command that walks a long history several times.
    """

    def __init__(
        self,
        store: ObjectStore,
        *,
        target_rows: int = DEFAULT_TARGET_ROWS,
        snapshot_cache: int | None = 1024,
    ) -> None:
        if not is_store(store):
            raise InvalidInputError(
                f"invalid store {store!r}: an open store (for a path or URL: Catalog.open(URL))"
            )
        for name, value in (("target_rows", target_rows), ("snapshot_cache", snapshot_cache)):
            if value is None and name == "snapshot_cache":
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise InvalidInputError(f"invalid {name} {value!r}: a whole number, at least 1")
        if snapshot_cache is not None:
            snapshot_cache = int(snapshot_cache)
        self.store = store
        self.target_rows = int(target_rows)
        self._snapshots: dict[str, Snapshot] = {}
        self._named_by: dict[str, str] = {}
        """Snapshot ids this catalog met as a ref's target or a snapshot's parent, and what
        named them: such a snapshot missing from the store is damage, not a wrong id."""
        self._snapshot_cache = snapshot_cache
        self.conditional_writes: bool | None = None
        self.created = False
        """Whether :meth:`init` made the store (False: it was there already)."""
        """What the store's metadata records (set by :meth:`open` and :meth:`init`):
        False for a store whose server ignores conditional writes, where no commit can
        move a ref safely; None when not read."""

    # -- opening -----------------------------------------------------------------------
    @classmethod
    def open(
        cls,
        url: str | os.PathLike[str] | ObjectStore,
        *,
        storage_options: Mapping[str, Any] | None = None,
        read_only: bool = False,
    ) -> Catalog:
        """Open an initialised store; NotFoundError when ``init`` was never run there."""
        store = open_store(url, storage_options=storage_options, read_only=read_only)
        cat = cls(store)
        meta = cat.check_initialised()
        cat.conditional_writes = meta.get("conditional_writes")
        if cat.conditional_writes is False:
            # init found no conditional writes: ref updates must fail loudly, not race
            store.supports_atomic_cas = False
        return cat

    @classmethod
    def init(
        cls,
        url: str | os.PathLike[str] | ObjectStore,
        *,
        storage_options: Mapping[str, Any] | None = None,
        exist_ok: bool = True,
    ) -> Catalog:
        """Initialise a store (idempotent with ``exist_ok``) and return its catalog.

        On a store that exists, a store that can probe for conditional writes (S3) probes
        again, through this endpoint: an endpoint that ignores them where the store was
        made with one that enforces them is a StorageError (refs would move unsafely
        through it), and one that enforces them where the store recorded none updates
        the record (so commits work from then on).
        """
        store = open_store(url, storage_options=storage_options)
        cat = cls(store)
        if store.exists(STORE_META_KEY):
            if not exist_ok:
                from simstore.errors import AlreadyExistsError

                raise AlreadyExistsError(f"{store.url}: store already initialised")
            cat.conditional_writes = cat._probe_again(cat.check_initialised())
            return cat
        if store.exists(CACHE_MARKER_KEY):
            raise InvalidInputError(
                f"{store.url} is a loader's disk cache ({CACHE_MARKER_KEY}): its eviction "
                "would delete a store's objects; make the store in another directory"
            )
        conditional = bool(store.supports_atomic_cas)
        probe = getattr(store, "probe_conditional_writes", None)
        if callable(probe):
            conditional = bool(probe())
        meta = {
            "format_version": STORE_FORMAT_VERSION,
            "kind": "simstore-store",
            "created": utc_now(),
            "hash": "xxh3-128",
            "conditional_writes": conditional,
        }
        cat.created = bool(store.put_if_absent(STORE_META_KEY, canonical_json(meta)))
        cat.conditional_writes = conditional
        return cat

    def _probe_again(self, meta: Mapping[str, Any]) -> bool | None:
        """``init`` of an existing store: check the recorded conditional writes anew.

        Returns what the store records from now on.
        """
        store = self.store
        recorded = meta.get("conditional_writes")
        probe = getattr(store, "probe_conditional_writes", None)
        if not callable(probe) or store.read_only:
            if recorded is False:
                store.supports_atomic_cas = False
            return recorded if isinstance(recorded, bool) else None
        enforced = bool(probe())
        if recorded is not False and not enforced:
            raise StorageError(
                f"{store.url}: this endpoint ignores conditional writes (If-None-Match, "
                "If-Match), but the store was initialised through one that enforces them: "
                "refs cannot move safely through it; use an endpoint that enforces them"
            )
        if recorded is False and enforced:
            # the endpoint enforces them now: record it, so commits work from here on
            data, version = read_capped_versioned(store, STORE_META_KEY, "store record")
            now = {**json.loads(data), "conditional_writes": True}
            try:
                store.compare_and_swap(STORE_META_KEY, version, canonical_json(now))
            except ConflictError:
                self.check_initialised()  # another init changed it meanwhile: still valid
        return enforced

    def check_initialised(self) -> dict[str, Any]:
        """The store's metadata; NotFoundError/FormatError when missing or unsupported."""
        try:
            data = read_capped(self.store, STORE_META_KEY, "store record")
        except NotFoundError:
            raise NotFoundError(
                f"{self.store.url}: not a simstore store (no {STORE_META_KEY}); "
                "run `simstore init` first"
            ) from None
        try:
            meta = json.loads(data)
        except (ValueError, RecursionError) as exc:  # RecursionError: nested too deeply
            raise FormatError(f"{self.store.url}/{STORE_META_KEY} is not valid JSON") from exc
        if not isinstance(meta, dict) or meta.get("kind") != "simstore-store":
            raise FormatError(
                f"{self.store.url}/{STORE_META_KEY} is not a simstore store's metadata "
                '(a JSON object with "kind": "simstore-store")'
            )
        if meta.get("format_version") != STORE_FORMAT_VERSION:
            raise version_error(
                f"{self.store.url}: store", meta.get("format_version"), STORE_FORMAT_VERSION
            )
        return dict(meta)

    # -- datasets and refs -------------------------------------------------------------
    def datasets(self) -> list[str]:
        """Names of datasets that have a branch, a tag or staged changes."""
        names: set[str] = set()
        for key in self.store.list("datasets/"):
            parts = key.split("/")
            if len(parts) >= 3:
                names.add(parts[1])
        return sorted(names)

    def has_dataset(self, dataset: str) -> bool:
        """Whether anything exists under the dataset's prefix."""
        return next(iter(self.store.list(dataset_prefix(dataset))), None) is not None

    def check_commit_branch(self, dataset: str, branch: str) -> bool:
        """Refuse a commit that cannot or should not land, before anything is written.

        On a store recorded without conditional writes: a StorageError. To ``branch`` of
        a dataset that has branches, none of them it: a NotFoundError.

        A commit creates its branch only for a dataset's first snapshot: anywhere else a
        new branch starts at a snapshot (:meth:`Branches.create`, ``simstore branch``), so
        a mistyped ``--branch`` never takes staged changes off to an orphan history.
        Returns whether ``branch`` exists (see :meth:`require_branch`).
        """
        if self.conditional_writes is False:
            raise StorageError(
                f"{self.store.url}: the store's server ignores conditional writes (recorded "
                "by init), so no commit can move a ref safely; run `simstore init` through "
                "an endpoint that enforces them"
            )
        return self.require_branch(dataset, branch)

    def require_branch(self, dataset: str, branch: str) -> bool:
        """Refuse changes meant for ``branch`` unless it is a branch of the dataset or its first.

        A dataset with branches: one of them (:meth:`Branches.require`). One without
        branches but with tags has a history (its branches were deleted): a commit would
        start a second one, with no parent, beside it, so a branch must be made at one of
        its snapshots first. Only a dataset with neither passes: its first snapshot
        creates its branch. A NotFoundError says which. Returns whether ``branch`` exists
        (False: the dataset's first snapshot will create it).
        """
        if self.branches(dataset).require(branch):
            return True
        tags = self.tags(dataset).names()
        if tags:
            more = f" and {len(tags) - 10} more" if len(tags) > 10 else ""
            raise NotFoundError(
                f"dataset {dataset!r} has no branches, only tags ({', '.join(tags[:10])}"
                f"{more}): a commit to {branch!r} would start a history of its own beside "
                f"theirs; create the branch at a snapshot first: simstore branch "
                f"{dataset}@{tags[0]} {branch}"
            )
        return False

    def branches(self, dataset: str) -> Branches:
        """The dataset's branches."""
        return Branches(self.store, check_name(dataset, "dataset name"))

    def tags(self, dataset: str) -> Tags:
        """The dataset's tags."""
        return Tags(self.store, check_name(dataset, "dataset name"))

    def resolve(self, ref: str | Ref, *, check: bool = True) -> SnapshotId:
        """The snapshot id a REF names: a full snapshot id, a branch, a tag, a unique prefix.

        A full id (32 hex characters, which no branch or tag may be named) is looked up as
        an object first: two small reads, with no ref lookups or listing. A branch or tag's
        snapshot is read to check it is of the REF's dataset (see :meth:`ref_names`);
        ``check=False`` leaves that to a caller that reads the snapshot elsewhere (the
        loader, from its disk cache).
        """
        if not isinstance(ref, str | Ref):
            raise InvalidInputError(f"a REF is a string such as 'name@branch', not {ref!r}")
        r = parse_ref(ref) if isinstance(ref, str) else ref
        full = r.full_id
        if full is not None:
            if self._is_snapshot_of(full, r.dataset, named=True):
                return SnapshotId(full)
            if not self.has_dataset(r.dataset):
                raise NotFoundError(f"{self.store.url}: unknown dataset {r.dataset!r}")
            raise NotFoundError(f"dataset {r.dataset!r} has no snapshot {r.rev!r}")
        sid, _ = self.branches(r.dataset).get_versioned(r.rev)
        if sid is not None:
            self.ref_names(sid, f"branch {r.dataset}@{r.rev}", r.dataset, check=check)
            return SnapshotId(sid)
        sid, _ = self.tags(r.dataset).get_versioned(r.rev)  # one GET, none on a miss
        if sid is not None:
            self.ref_names(sid, f"tag {r.dataset}@{r.rev}", r.dataset, check=check)
            return SnapshotId(sid)
        rev = r.rev.lower()
        if 4 <= len(rev) <= 32 and all(c in "0123456789abcdef" for c in rev):
            matches = [
                sid for sid in self._ids_with_prefix(rev) if self._is_snapshot_of(sid, r.dataset)
            ]
            if len(matches) == 1:
                return SnapshotId(matches[0])
            if len(matches) > 1:
                shown = ", ".join(m[:12] for m in matches[:5])
                raise InvalidInputError(
                    f"ambiguous snapshot prefix {r.rev!r} in dataset {r.dataset!r}: "
                    f"matches {shown}; give more characters"
                )
        if not self.has_dataset(r.dataset):
            raise NotFoundError(f"{self.store.url}: unknown dataset {r.dataset!r}")
        raise NotFoundError(f"dataset {r.dataset!r} has no branch, tag or snapshot {r.rev!r}")

    def ref_names(self, sid: str, by: str, dataset: str, *, check: bool = True) -> None:
        """Remember that ref ``by`` (``"branch d@main"``) of ``dataset`` names ``sid``.

        The snapshot missing is then damage naming the ref (exit 6), not an unknown id;
        and a snapshot of another dataset is refused (a ref file overwritten with another
        dataset's, which nothing in simstore writes, would serve that dataset's samples
        under this name). The snapshot is read here: its callers read it next (from the
        cache then); one that cannot be read is left to them, who say what is wrong.
        """
        self._name(sid, by)
        if not check:
            return
        try:
            snap = self._snapshot(sid, "")
        except SimstoreError:
            return
        self.check_ref(snap, sid, by, dataset)

    def ref_targets(self, dataset: str) -> Iterator[str]:
        """The snapshot ids of ``dataset``'s branches, then its tags.

        Each is named by its ref (:meth:`ref_names`: a missing one is damage naming it).
        """
        for what, refs in (("branch", self.branches(dataset)), ("tag", self.tags(dataset))):
            for name, sid in refs.list():
                self.ref_names(sid, f"{what} {dataset}@{name}", dataset)
                yield sid

    def check_ref(self, snap: Snapshot, sid: str, by: str, dataset: str) -> None:
        """Refuse snapshot ``sid`` that ref ``by`` of ``dataset`` names if it is another's.

        Damage naming the ref (see :meth:`ref_names`).
        """
        if snap.dataset != dataset:
            raise IntegrityError(
                f"{self.store.url}: {by} names snapshot {sid} of dataset "
                f"{snap.dataset!r}, not of {dataset!r}: the ref is damaged"
            )

    def _ids_with_prefix(self, prefix: str) -> Iterator[str]:
        for key in self.store.list(f"objects/{prefix[:2]}/{prefix}"):
            oid = key.rsplit("/", 1)[-1]
            if is_object_id(oid):
                yield oid

    def _is_snapshot_of(self, oid: str, dataset: str, *, named: bool = False) -> bool:
        """Whether object ``oid`` is a snapshot of ``dataset``.

        ``named``: the REF gave the full id, so a snapshot that does not read is that
        damaged snapshot's :class:`FormatError` (not "no snapshot"); among a prefix's
        candidates it is passed over.
        """
        if not is_snapshot_object(self.store, oid):  # shards are never read whole
            return False
        try:
            return self.snapshot(oid).dataset == dataset
        except FormatError:
            if named:
                raise
            return False

    # -- objects -----------------------------------------------------------------------
    def get_object(
        self, oid: str, *, verify: bool = True, referenced_by: str = "", kind: Kind | None = None,
    ) -> bytes:
        """Read an immutable object, checking its hash unless ``verify`` is False.

        ``kind`` (``"snapshot"``, ``"manifest part"``): one larger than any of that kind
        is refused unread (an :class:`IntegrityError`, see ``_caps.py``).
        """
        by = f"; referenced by snapshot {referenced_by}" if referenced_by else ""
        key = object_key(oid)
        if kind is None:
            data = self.store.get(key)
        else:
            named = self._named_by.get(oid) if kind == "snapshot" else None
            data = read_capped(self.store, key, kind,
                               by=f"; referenced by {named}" if named else by)
        if verify:
            actual = hash_bytes(data)
            if actual != oid:
                raise IntegrityError(
                    f"{self.store.url}: {object_key(oid)} has hash {actual}, expected {oid}{by}"
                )
        return data

    def put_object(self, data: bytes) -> tuple[ObjectId, bool]:
        """Store bytes under their hash; returns (id, whether new bytes were written)."""
        oid = hash_bytes(data)
        return oid, self.store.put_if_absent(object_key(oid), data)

    def _name(self, sid: str, by: str) -> None:
        """Remember that ``by`` names snapshot ``sid`` (see ``_named_by``), within a bound.

        A walk over a long history names every parent: at :data:`_NAMED_MAX` entries the
        record starts again (a snapshot named before and missing then reads as unknown,
        exit 3, instead of as damage), so it does not grow with the history, as the
        snapshot cache beside it does not.
        """
        if sid in self._named_by:
            return
        if len(self._named_by) >= _NAMED_MAX:
            self._named_by.clear()
        self._named_by[sid] = by

    def snapshot(self, sid: str, *, named_by: str = "", dataset: str | None = None) -> Snapshot:
        """Read (and cache) a snapshot, checking its hash.

        ``named_by`` (a ref or snapshot that names it, e.g. ``"branch d@main"``): missing,
        it is damage (IntegrityError), not an unknown id (NotFoundError); refs resolved
        and parents read by this catalog count so already. ``dataset``: the dataset whose
        ref ``named_by`` names it; a snapshot of another dataset is damage too (refs
        resolved by this catalog are checked so already, see :meth:`ref_names`).
        """
        snap = self._snapshot(sid, named_by)
        if dataset is not None:
            self.check_ref(snap, sid, named_by or f"a ref of dataset {dataset!r}", dataset)
        return snap

    def _snapshot(self, sid: str, named_by: str) -> Snapshot:
        if not isinstance(sid, str) or not is_object_id(sid):
            raise InvalidInputError(f"{sid!r} is not a snapshot id (32 hex characters)")
        if named_by:
            self._name(sid, named_by)
        cached = self._snapshots.get(sid)
        if cached is not None:
            return cached
        try:
            data = self.get_object(sid, kind="snapshot")
        except NotFoundError:
            named = self._named_by.get(sid)
            if named is not None:  # a ref or a snapshot names it: damage, as verify says
                raise IntegrityError(
                    f"{self.store.url}: {object_key(sid)} is missing; referenced by {named}"
                ) from None
            raise NotFoundError(f"{self.store.url}: no snapshot {sid}") from None
        snap = Snapshot.from_bytes(data, object_id=sid)
        for parent in snap.parents:
            self._name(parent, f"snapshot {sid} (its parent)")
        if self._snapshot_cache is not None and len(self._snapshots) >= self._snapshot_cache:
            self._snapshots.clear()
        self._snapshots[sid] = snap
        return snap

    def read_part(self, part: PartRef, *, verify: bool = True, snapshot: str = "") -> pa.Table:
        """Read one manifest part as a table (hash-checked, and as long as the entry says).

        A part missing from the store is damage (an :class:`IntegrityError` naming it and
        its snapshot), as ``verify`` reports it: a snapshot names it.
        """
        try:
            data = self.get_object(part.id, verify=verify, referenced_by=snapshot,
                                   kind="manifest part")
        except NotFoundError:
            by = f"; referenced by snapshot {snapshot}" if snapshot else ""
            raise IntegrityError(
                f"{self.store.url}: {object_key(part.id)} is missing{by}"
            ) from None
        table = decode_part(data, object_id=part.id)
        if table.num_rows != part.rows:
            by = f"snapshot {snapshot}" if snapshot else "its snapshot"
            raise FormatError(
                f"manifest part {part.id} has {table.num_rows} rows, {by} says {part.rows}"
            )
        return table

    def iter_parts(self, snap: Snapshot, *, verify: bool = True) -> Iterator[pa.Table]:
        """Manifest parts of a snapshot in key order."""
        sid = snap.id
        for part in snap.parts:
            yield self.read_part(part, verify=verify, snapshot=sid)

    def iter_rows(self, snap: Snapshot, *, prefix: str = "") -> Iterator[pa.Table]:
        """The snapshot's manifest rows whose key starts with ``prefix``, in key order.

        Parts are in key order and each lists its first and last key, so only the parts
        whose key range can hold such keys are read; a table per part read (possibly
        empty).
        """
        try:
            prefix.encode("utf-8")
        except UnicodeEncodeError:  # a command-line argument's undecodable bytes
            shown = prefix.encode("utf-8", "surrogateescape")
            raise InvalidInputError(
                f"key prefix {shown!r} is not UTF-8 text (keys are)"
            ) from None
        sid = snap.id
        for part in snap.parts:
            if part.last_key < prefix:
                continue
            if part.first_key > prefix and not part.first_key.startswith(prefix):
                return  # this part's keys, and every later part's, sort after the prefix
            table = self.read_part(part, snapshot=sid)
            if prefix:
                table = table.filter(pc.starts_with(table.column("key"), prefix))
            yield table

    def manifest(self, snap: Snapshot) -> pa.Table:
        """All manifest rows of a snapshot in one table (memory grows with the dataset)."""
        tables = list(self.iter_parts(snap))
        return pa.concat_tables(tables) if tables else empty_rows()

    # -- staging -----------------------------------------------------------------------
    def stage(
        self,
        dataset: str,
        *,
        changes: pa.Table,
        shards: Sequence[str] = (),
        schema: Schema = (),
        stats: Mapping[str, Any] | None = None,
        lineage: Mapping[str, Any] | None = None,
        mode: Mode = "upsert",
    ) -> StagedEntry:
        """Record changes (manifest rows, optionally with a ``deleted`` column) for a commit.

        The shards the rows point to must already be stored. The change set is written as
        an object first and the staging entry last, so a crash leaves no entry that points
        at missing objects.
        """
        check_name(dataset, "dataset name")
        if mode not in ("upsert", "replace"):
            raise InvalidInputError(f"invalid mode {mode!r}: expected upsert or replace")
        table = normalise_changes([changes])
        buf = io.BytesIO()
        # change sets are transient (gc collects them once committed): fast lz4
        pq.write_table(table, buf, compression="lz4")
        changes_id, _ = self.put_object(buf.getvalue())
        deletions = int(pa.compute.sum(table.column("deleted")).as_py() or 0)
        # after every entry staged so far, whatever clock staged it: staging order (which
        # applies last, what a commit takes along) is the order writers saw, not their
        # clocks' (a writer an hour ahead would otherwise apply after everything staged
        # in that hour)
        ns = max(time.time_ns(), self._last_staged_ns(dataset) + 1000)
        sid = f"{ns:020d}-{uuid.uuid4().hex[:12]}"
        entry = StagedEntry(
            id=sid,
            dataset=dataset,
            created=utc_at_ns(ns),
            mode=mode,
            changes=changes_id,
            rows=table.num_rows - deletions,
            deletions=deletions,
            shards=tuple(sorted(set(shards))),
            schema=tuple(schema),
            stats=dict(stats or {}),
            lineage=dict(lineage or {}),
        )
        body = entry.to_bytes()
        check_written("staging entry", len(body),
                      f"{dataset}: a staging entry of {len(entry.shards)} shards",
                      "stage them in several entries")
        self.store.put(staging_key(dataset, sid), body)
        return entry

    def _last_staged_ns(self, dataset: str) -> int:
        """The staging time (ns, from its id) of the dataset's latest staged entry, or 0."""
        stamps = (staged_at_ns(key.rsplit("/", 1)[-1])
                  for key in self.store.list(staging_key(dataset)))
        return max((ns for ns in stamps if ns is not None), default=0)

    def staged(self, dataset: str) -> list[StagedEntry]:
        """Staged entries of a dataset, oldest first."""
        out = []
        for key in self.store.list(staging_key(dataset)):
            try:
                data = read_capped(self.store, key, "staging entry")
            except NotFoundError:
                continue  # committed and removed meanwhile
            out.append(StagedEntry.from_bytes(data, key))
        return sorted(out, key=lambda e: e.id)

    def staged_keys(self, dataset: str) -> dict[str, frozenset[str] | None]:
        """Per staged entry of the dataset (oldest first), the keys it changes.

        Upserts and deletions alike; None for an entry that replaces the whole dataset
        (every key may change).
        """
        return {
            e.id: None if e.mode == "replace"
            else frozenset(self._read_changes(e).column("key").to_pylist())
            for e in self.staged(dataset)
        }

    def taken_with(
        self, dataset: str, entry_id: str, keys: frozenset[str] | set[str] | None
    ) -> list[str]:
        """The staging ids to commit for the entry ``entry_id`` that changes ``keys``.

        The entry and the earlier ones :func:`~simstore.catalog.taken_along` picks (None:
        the entry is a replace). Read once the entry is staged, so an entry another
        writer staged just before it is among them; one staged after it applies later,
        as its place in the staging order says.
        """
        before = {eid: k for eid, k in self.staged_keys(dataset).items() if eid < entry_id}
        return sorted({*taken_along(before, keys), entry_id})

    def discard_staged(self, dataset: str, ids: Sequence[str]) -> None:
        """Remove staging entries (their objects stay until gc).

        A delete whose every response was lost (the retries used up) is looked up again,
        as a ref's is: an entry gone is discarded; otherwise the error stands.
        """
        for sid in ids:
            key = staging_key(dataset, sid)
            try:
                self.store.delete(key)
            except StorageError:
                if not gone_after_all(self.store, key):
                    raise

    def discard_unless_committed(self, dataset: str, branch: str, entry: StagedEntry) -> bool:
        """After a commit that raised: remove ``entry`` unless a snapshot consumed it.

        For a command that staged ``entry`` and then failed to commit it: the entry is kept
        when a snapshot on ``branch`` consumed it (the commit landed though it raised, or
        another writer committed it), or when that cannot be told: a consumed entry is
        harmless, and gc keeps what a kept entry references. A failure here is swallowed,
        so the commit's own error is the one reported. Returns whether it was removed.
        """
        try:
            head, _ = self.branches(dataset).get_versioned(branch)
            # the test the commit's own retries use to recognise a swap that landed
            if consumed_in_history(self, head, [entry]):
                return False
            self.discard_staged(dataset, [entry.id])
        except Exception:
            return False
        return True

    def _read_changes(self, entry: StagedEntry) -> pa.Table:
        data = self.get_object(entry.changes)
        try:
            # ParquetFile, not read_table: pyarrow.dataset's import (tens of milliseconds
            # on a commit's first read) is more than reading the change set
            table = pq.ParquetFile(pa.BufferReader(data)).read(use_threads=False)
            if table.schema.names != CHANGES_SCHEMA.names:
                raise ValueError(f"columns {table.schema.names}, expected {CHANGES_SCHEMA.names}")
            return table.cast(CHANGES_SCHEMA)
        except (pa.ArrowException, ValueError) as exc:
            raise FormatError(f"staged change set {entry.changes} is unreadable: {exc}") from exc

    # -- commit ------------------------------------------------------------------------
    def commit(
        self,
        dataset: str,
        *,
        message: str,
        branch: str = DEFAULT_BRANCH,
        author: str | None = None,
        staging_ids: Sequence[str] | None = None,
        allow_empty: bool = True,
        max_attempts: int = 50,
        rng: random.Random | None = None,
        allow_schema_change: bool = False,
    ) -> CommitResult:
        """Commit staged entries as a new snapshot on ``branch``.

        ``branch`` must exist, unless this is the dataset's first snapshot (which creates
        it): see :meth:`check_commit_branch`.

        The dataset must exist: an unknown dataset (nothing staged, no branch or tag) is a
        NotFoundError, so a mistyped name never creates an empty dataset. A dataset comes
        into being with its first staged change (an ingest or :meth:`stage`).

        ``staging_ids`` commits those entries alone; the rest stay staged and apply, in
        staging order, at a later commit. A command that commits its own change at once
        names with it the earlier entries :func:`~simstore.catalog.taken_along` picks
        (those touching its keys), so an entry left staged cannot undo the change later.

        Atomic: every object is written before the branch moves by one compare-and-swap.
        A writer that loses the swap re-applies its staged changes on the new head and
        tries again (backing off with jitter); keys that a concurrent commit also wrote are
        reported in ``overwritten_concurrent`` (this, the later commit, wins). A swap whose
        response was lost but which landed is recognised as this writer's own success,
        also when every retry's response was lost too: after a ``StorageError`` the branch
        is read back, and this commit's snapshot there, or in the history of a commit made
        on it since, is success; otherwise the error stands.
        """
        return commit(
            self, dataset, message=message, branch=branch, author=author,
            staging_ids=staging_ids, allow_empty=allow_empty, max_attempts=max_attempts,
            rng=rng, allow_schema_change=allow_schema_change,
        )

    # -- history -----------------------------------------------------------------------
    def log(
        self, ref: str | Ref, *, limit: int | None = None
    ) -> Iterator[tuple[SnapshotId, Snapshot]]:
        """Snapshots from ``ref`` back along first parents, newest first."""
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                                  or limit < 0):
            raise InvalidInputError(f"limit must be a non-negative integer, got {limit!r}")
        sid: str | None = self.resolve(ref)
        n = 0
        while sid and (limit is None or n < limit):
            snap = self.snapshot(sid)
            yield SnapshotId(sid), snap
            n += 1
            sid = snap.parents[0] if snap.parents else None

    def diff(self, a: str | Ref, b: str | Ref) -> DiffResult:
        """Diff two REFs, reading only the manifest parts they do not share."""
        return self.diff_snapshots(self.resolve(a), self.resolve(b))

    def diff_snapshots(self, a: str | None, b: str) -> DiffResult:
        """Diff two snapshot ids (``a`` may be None: the empty dataset)."""
        sa = self.snapshot(a) if a else None
        sb = self.snapshot(b)
        a_parts: dict[str, PartRef] = {p.id: p for p in sa.parts} if sa else {}
        b_parts: dict[str, PartRef] = {p.id: p for p in sb.parts}
        only_a, only_b = parts_to_open(a_parts, b_parts)
        jobs = [(a_parts[pid], a or "") for pid in only_a] + [(b_parts[pid], b) for pid in only_b]
        # parts decode independently: read them on a few threads (I/O and Parquet decoding
        # release the GIL)
        with ThreadPoolExecutor(max_workers=WRITE_THREADS) as pool:
            tables = list(pool.map(lambda job: self.read_part(job[0], snapshot=job[1]), jobs))
        tables_a, tables_b = tables[: len(only_a)], tables[len(only_a) :]
        bytes_read = sum(part.size_bytes for part, _ in jobs)
        ta = pa.concat_tables(tables_a) if tables_a else empty_rows()
        tb = pa.concat_tables(tables_b) if tables_b else empty_rows()
        return DiffResult(
            a=SnapshotId(a) if a else None,
            b=SnapshotId(b),
            diff=diff_tables(ta.cast(MANIFEST_SCHEMA), tb.cast(MANIFEST_SCHEMA)),
            parts_total=len(a_parts) + len(b_parts),
            parts_read=len(only_a) + len(only_b),
            bytes_read=bytes_read,
            manifest_bytes=(sa.manifest_bytes if sa else 0) + sb.manifest_bytes,
        )
