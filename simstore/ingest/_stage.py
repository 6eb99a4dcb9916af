"""Staging an ingest's rows, and its commit: the last step of a run, after every task.

The rows become one staging entry (an identical pending one is reused), with the lineage
that says where they came from; objects a gc may have deleted meanwhile are checked for
first, and a commit that would refuse the schema is refused before anything is staged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from simstore.catalog import Catalog, StagedEntry, gc_overlapped, read_gc_state, taken_along
from simstore.errors import ConflictError, SimstoreError
from simstore.hashing import Hasher, object_key
from simstore.ingest._config import printable_path
from simstore.ingest._engine import EngineRun
from simstore.ingest._records import FileResult, Row, TaskContext
from simstore.manifest import MANIFEST_SCHEMA
from simstore.sample import FieldSpec, Schema, canonical_json, merge_schema
from simstore.stats import merge_stats

__all__ = ["check_still_stored", "rows_digest", "software_sets", "stage"]


def _rows_table(rows: Sequence[Row]) -> pa.Table:
    return pa.table(
        {
            "key": pa.array([r[0] for r in rows], pa.string()),
            "sample_hash": pa.array([bytes.fromhex(r[1]) for r in rows], pa.binary(16)),
            "shard": pa.array([r[2] for r in rows], pa.string()),
            "position": pa.array([r[3] for r in rows], pa.int64()),
            "size_bytes": pa.array([r[4] for r in rows], pa.int64()),
        },
        schema=MANIFEST_SCHEMA,
    )


def check_still_stored(catalog: Catalog, ids: Sequence[str]) -> None:
    """Refresh each object (gc's grace starts again); a ConflictError if any is gone."""
    store = catalog.store
    refresh = getattr(store, "refresh", None)

    def present(oid: str) -> bool:
        key = object_key(oid)
        return bool(refresh(key)) if callable(refresh) else store.exists(key)

    unique = sorted(set(ids))
    with ThreadPoolExecutor(min(16, max(1, len(unique)))) as pool:
        gone = [oid for oid, ok in zip(unique, pool.map(present, unique), strict=True) if not ok]
    if gone:
        more = f" and {len(gone) - 1} more" if len(gone) > 1 else ""
        raise ConflictError(
            f"{store.url}: {object_key(gone[0])}{more}, stored by this ingest, was deleted by "
            f"a gc that ran during it (its --grace is shorter than this ingest); nothing "
            f"was staged: run the ingest again (its journal keeps what survived)"
        )


def _check_staged_entry(
    catalog: Catalog, ctx: TaskContext, entry: StagedEntry, gc_staging: bytes | None
) -> None:
    """Check what ``entry`` names when a gc started while it was being staged.

    A gc lists the objects, then reads the staging entries: one that started after the
    reading of its record before staging (``gc_staging``) may have read the entries
    before this one was there, and delete what it names (all of it, with a grace
    shorter than the time since it was stored). Its record has changed, or says it is
    running: every object the entry names is refreshed then (a gc that has not reached
    it yet keeps it: its age now starts after the gc's clock) and one already gone
    fails the ingest, with the entry removed, rather than commit a snapshot of missing
    objects (found by an audit: 40 ``gc --grace 0s`` beside 16 ingests).
    """
    if not gc_overlapped(gc_staging, read_gc_state(catalog.store)):
        return
    try:
        check_still_stored(catalog, entry.referenced_objects())
    except ConflictError:
        catalog.discard_unless_committed(ctx.dataset, ctx.config.branch, entry)
        raise


def software_sets(staged: Sequence[FileResult]) -> list[dict[str, str]]:
    """The distinct sets of versions the staged files were written with, in a fixed order.

    Usually one; more when a dask cluster's workers differ or files come from journal
    records of an earlier run. Records written before records kept versions add none.
    """
    seen = {canonical_json(r.software): r.software for r in staged if r.software}
    return [seen[k] for k in sorted(seen)]


def rows_digest(rows: Sequence[Row], chunk_rows: int = 8192) -> str:
    """``hash_bytes(canonical_json([list(r) for r in sorted(rows)]))``, in bounded memory.

    The canonical JSON of the whole list is never built: it is hashed chunk by chunk (a
    JSON list is its items joined by commas), so staging many rows does not hold a second,
    larger copy of them as text.
    """
    h = Hasher()
    h.update(b"[")
    ordered = sorted(rows)
    for start in range(0, len(ordered), chunk_rows):
        if start:
            h.update(b",")
        h.update(canonical_json([list(r) for r in ordered[start : start + chunk_rows]])[1:-1])
    h.update(b"]")
    return str(h.hexdigest())


def stage(
    catalog: Catalog,
    ctx: TaskContext,
    run: EngineRun,
    staged: Sequence[FileResult],
    rows: Sequence[Row],
    shards: Sequence[str],
    schema: Schema,
    new_keys_in: str | None,
    pending: Mapping[str, frozenset[str] | None],
    head: Any,
    gc_before: bytes | None = None,
) -> tuple[str, str | None, int]:
    """Stage the rows (reusing an identical pending entry) and commit when asked.

    Until a staging entry names them, the objects the run stored are held by their age
    alone (gc's grace period). If a gc ran since the run started (``gc_before``, the
    store's gc record then, is not what it is now, or said one was running), every object
    the entry will name is refreshed first, and one that is gone (a grace shorter than the
    run) fails the ingest with a ConflictError naming it, rather than stage a snapshot
    of missing shards; the same after staging if a gc started meanwhile
    (:func:`_check_staged_entry`).

    ``new_keys_in``: the snapshot every staged key was checked to be absent from; the
    commit trusts it (skipping its own key-range test) only when that is its parent.
    ``pending``: the keys each earlier staged entry changes. The commit takes, with this
    entry, every earlier one that changes one of its keys, or a key of an entry so taken
    (every earlier one for a replace: :func:`~simstore.catalog.taken_along`): they apply
    first, so this ingest's samples are the last change (left staged, such an entry
    would apply over them at the next commit). An identical pending entry is reused only
    when no later entry changes its keys.

    A commit that would refuse the schema is refused before anything is staged; a commit
    that fails all the same (a concurrent commit changed a field type, it lost too many
    swaps, it was interrupted) removes the entry this call wrote, unless it landed.
    """
    cfg = ctx.config
    digest = rows_digest(rows)
    sources = [
        {
            "key": r.key,
            "path": printable_path(r.path),  # JSON text: bytes that are not UTF-8 escaped
            "hash": r.source_hash,
            "size": r.size_bytes,
            "adapter": r.adapter,
        }
        for r in staged
    ]
    sources_id, sources_new = catalog.put_object(canonical_json(sources))
    extra = len(canonical_json(sources)) if sources_new else 0
    objects = sorted({sources_id, *(r.source_object for r in staged if r.source_object)})
    stats = merge_stats(r.field_stats() for r in staged)  # unpacked one at a time
    lineage = {
        "kind": "ingest",
        "adapter": cfg.adapter,
        "adapters": {r.adapter: r.adapter_version for r in staged},
        "software": software_sets(staged),
        "parameters": cfg.output_params(),
        "engine": run.engine,
        "workers": run.workers,
        "sources": {
            "object": sources_id,
            "files": len(staged),
            "bytes": sum(r.size_bytes for r in staged),
        },
        "objects": objects,
        "rows_digest": digest,
    }
    mine = None if cfg.mode == "replace" else {r[0] for r in rows}  # a replace: every key
    overlapping = taken_along(pending, mine)
    pending_entries = catalog.staged(ctx.dataset)
    entry = next(
        (
            e
            for e in pending_entries
            if e.lineage.get("rows_digest") == digest and e.mode == cfg.mode
            and all(eid <= e.id for eid in overlapping)
        ),
        None,
    )
    written = entry is None
    if entry is None:
        gc_staging = read_gc_state(catalog.store)
        if gc_overlapped(gc_before, gc_staging):
            check_still_stored(catalog, [*shards, *objects])
        if cfg.snapshot and not cfg.allow_schema_change:
            _check_commit_schema(ctx, head, pending_entries, overlapping, staged, schema)
        entry = catalog.stage(
            ctx.dataset,
            changes=_rows_table(rows),
            shards=shards,
            schema=schema,
            stats={"fields": stats, "exact": True, "new_keys_in": new_keys_in},
            lineage=lineage,
            mode=cfg.mode,
        )
        _check_staged_entry(catalog, ctx, entry, gc_staging)
    snapshot_id: str | None = None
    if cfg.snapshot:
        message = cfg.message or f"ingest {len(staged)} files ({len(rows)} samples)"
        try:
            commit = catalog.commit(
                ctx.dataset,
                message=message,
                branch=cfg.branch,
                author=cfg.author,
                # read again now that the entry is staged: one staged meanwhile by
                # another writer, before it, is taken too
                staging_ids=catalog.taken_with(ctx.dataset, entry.id, mine),
                allow_schema_change=cfg.allow_schema_change,
            )
        except BaseException as exc:
            if not written or not catalog.discard_unless_committed(
                ctx.dataset, ctx.config.branch, entry
            ):
                raise
            # the error names this run's entry, which is gone: say whose it was
            own = f"staged entry {entry.id}"
            if isinstance(exc, SimstoreError) and own in str(exc):
                raise type(exc)(str(exc).replace(own, f"{own} (this ingest's, removed)")) \
                    from exc
            raise
        snapshot_id = commit.snapshot_id
    return entry.id, snapshot_id, extra


def _check_commit_schema(
    ctx: TaskContext,
    head: Any,
    pending: Sequence[StagedEntry],
    overlapping: Sequence[str],
    staged: Sequence[FileResult],
    schema: Schema,
) -> None:
    """Refuse, before staging, an entry whose commit would refuse its schema.

    The commit merges, without schema changes, the head's schema (or the last replace's)
    with the earlier entries it takes, then this entry's ``schema``, its files' own field
    types. The error names the file the conflicting type comes from (or, should no file
    hold it, the staged entry or the dataset).
    """
    if ctx.config.mode == "replace":
        return  # the commit starts from this entry's schema alone
    taken = [e for e in pending if e.id in overlapping]
    replaces = [i for i, e in enumerate(taken) if e.mode == "replace"]
    if replaces:
        taken = taken[replaces[-1] :]  # the commit starts from the last replace
    merged: Schema = tuple(head.schema) if head is not None and not replaces else ()
    for e in taken:
        merged = merge_schema(merged, tuple(e.schema), source=f"staged entry {e.id}")
    known = {s.name: s for s in merged}
    for spec in schema:
        if known.get(spec.name, spec) == spec:
            continue
        path = next(
            (
                r.path
                for r in staged
                if any(FieldSpec.from_json(s) == spec for s in r.schema)
            ),
            None,
        )
        if path is not None:  # raises, naming the file and field
            merge_schema(merged, (spec,), source=printable_path(path))
        source = next(
            (f"staged entry {e.id}" for e in reversed(pending) if spec in e.schema),
            f"dataset {ctx.dataset!r}",
        )
        merge_schema(merged, (spec,), source=source)  # raises, naming the entry and field
