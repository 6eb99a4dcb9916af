"""The journal: one record per finished file, so a re-run redoes none of them.

A record ``journal/<dataset>/<digest>`` is keyed by the file's key, size, mtime, path and
identity (device, inode and change time) and by the digest of every output parameter; it
holds the file's manifest rows, schema and statistics. It is written only after the
shards its rows point to are stored, and a record whose shards are gone (gc) is ignored,
so a record never vouches for missing data.
Reusing a record refreshes its shards' modification times (``refresh`` on the store), as
storing them again would: gc's grace period then protects them until the rows are
staged, whenever the record was written.
Nothing else reads the journal; deleting records only makes a re-run read files again.

A record is a hint, so it needs no durability of its own: on a local store it is written
without fsync (two fsyncs per file made a small-file ingest several times slower). The
shards it names were stored (and, on a store with fsync, synced) before it was written,
so after a crash a record is either absent or unreadable (the file is redone) or points to
shards that survived.

The records of one task are written after all of its shards are stored, one by one, and
then the task's own record ``journal/<dataset>/task-<digest>`` (the digest of the task's
file records' keys, which each of them names). A file record counts only once its task's
record exists: a task killed while it wrote its records (its shards hold samples of
files not yet recorded) is redone whole, and its shards come out byte-identical to those
already stored, instead of its unrecorded files being packed again into new shards
beside copies of their samples in the old ones.

A record also says which checks its file passed (``--nan``, ``--allow-schema-change``): a
re-run that checks more (``--nan error`` after ``allow``; no ``--allow-schema-change``
after one with it) reads the file again instead of reusing it, so resuming never lets
through what the same command without the journal refuses.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from simstore.errors import NotFoundError
from simstore.hashing import hash_bytes, object_key
from simstore.ingest._config import printable_path
from simstore.ingest._records import FileResult, Row, SourceFile, TaskContext
from simstore.sample import canonical_json
from simstore.storage import LocalStore, ObjectStore

__all__ = [
    "JOURNAL_FORMAT_VERSION",
    "journal_key",
    "read_journal",
    "task_digest",
    "write_journal",
    "write_task_record",
]

JOURNAL_FORMAT_VERSION = 4
"""4: a file record names its task, and counts only once the task's record is written
(version 3 records are never read: their files are read again once).
3: records say which checks their file passed (``checks``: ``--nan`` and
``--allow-schema-change``), and a run stricter than a record is not served by it; version 2
records are never read (their files are read again once).
2: records are keyed by the file's path and identity too (version 1 records, keyed by
key, size and mtime alone, are never read: their files are read again once)."""


def _checks(ctx: TaskContext) -> dict[str, object]:
    """What a file was checked for when its record is written (see :func:`_passes`)."""
    return {"nan": ctx.config.nan, "allow_schema_change": ctx.config.allow_schema_change}


def _passes(ctx: TaskContext, checks: object) -> bool:
    """Whether a record's file passed every check this run makes.

    A record written under ``--nan allow`` does not say the file holds no NaN, nor one
    written under ``--allow-schema-change`` that its fields keep one type from sample to
    sample: a run that checks either reads the file again (and fails it if it must),
    rather than reuse a result its own checks would have refused.
    """
    if not isinstance(checks, dict):
        return False
    if ctx.config.nan == "error" and checks.get("nan") != "error":
        return False
    return bool(ctx.config.allow_schema_change or checks.get("allow_schema_change") is False)


def journal_key(ctx: TaskContext, src: SourceFile) -> str:
    r"""The store key of a file's (or a file piece's) record under these output parameters.

    The path is taken as :func:`printable_path` shows it (the same text for a UTF-8 path;
    a root whose name is not UTF-8 cannot go into JSON as it is): a literal ``\xff`` in a
    name and that byte meet only in such text, and the identity still tells them apart.
    """
    fields = {
        "v": JOURNAL_FORMAT_VERSION,
        "key": src.key,
        "size": src.size,
        "mtime_ns": src.mtime_ns,
        "path": printable_path(src.path),
        "identity": src.identity,
        "params": ctx.params_digest,
    }
    if src.piece is not None:
        fields["samples"] = [src.piece.start, src.piece.stop]
    if src.companions:  # absent otherwise: the keys of files without them are unchanged
        fields["companions"] = [
            [printable_path(path), size, mtime, identity]
            for path, size, mtime, identity in src.companions
        ]
    digest = hash_bytes(canonical_json(fields))
    return f"journal/{ctx.dataset}/{digest}"


def _records_store(store: ObjectStore) -> ObjectStore:
    """Where records go: the same store, without fsync when it is a plain local store."""
    if type(store) is LocalStore and store.fsync and not store.read_only:
        return LocalStore(store.root, fsync=False)
    return store


def task_digest(ctx: TaskContext, files: list[SourceFile]) -> str:
    """The digest that names a task's records: of its recorded files' record keys, in order."""
    return hash_bytes(canonical_json([journal_key(ctx, src) for src in files]))


def _task_key(ctx: TaskContext, task: str) -> str:
    return f"journal/{ctx.dataset}/task-{task}"


def write_task_record(ctx: TaskContext, task: str, files: int) -> None:
    """Record that every file record of ``task`` is written; no-op without resume."""
    if not ctx.config.resume:
        return
    record = {"format_version": JOURNAL_FORMAT_VERSION, "kind": "ingest-journal-task",
              "files": files}
    _records_store(ctx.store).put(_task_key(ctx, task), canonical_json(record))


def write_journal(ctx: TaskContext, src: SourceFile, res: FileResult, task: str) -> None:
    """Record a finished file of ``task`` (its shards must already be stored).

    The record counts once :func:`write_task_record` has recorded the task. No-op without
    resume.
    """
    if not ctx.config.resume:
        return
    record = {
        "task": task,
        "format_version": JOURNAL_FORMAT_VERSION,
        "kind": "ingest-journal",
        "key": res.key,
        "path": printable_path(res.path),
        "size_bytes": res.size_bytes,
        "source_hash": res.source_hash,
        "adapter": res.adapter,
        "adapter_version": res.adapter_version,
        "rows": [list(r) for r in res.rows],
        "schema": res.schema,
        "stats": res.field_stats(),
        "source_object": res.source_object,
        "checks": _checks(ctx),
        "software": res.software,
    }
    _records_store(ctx.store).put(journal_key(ctx, src), canonical_json(record))


def read_journal(
    ctx: TaskContext,
    src: SourceFile,
    present: dict[str, bool] | None = None,
    versions: Mapping[str, str] | None = None,
) -> FileResult | None:
    """The file's record as a reused result, or None (absent, unreadable, shards gone).

    ``present`` remembers which objects exist across calls (the files of a task share
    their shards), so a re-run checks each shard once, not once per file. ``versions``:
    the version of each adapter this run may read a file with, by name; a record written
    by another version of its adapter is not reused (a new version says its samples may
    differ).
    """
    try:
        rec = json.loads(ctx.store.get(journal_key(ctx, src)))
    except NotFoundError:
        return None
    except (ValueError, RecursionError):  # unreadable (or nested too deeply): read the file
        return None
    if rec.get("format_version") != JOURNAL_FORMAT_VERSION or rec.get("kind") != "ingest-journal":
        return None
    if not _passes(ctx, rec.get("checks")):
        return None  # checked less strictly than this run checks: read the file again
    if versions is not None:
        now = versions.get(str(rec.get("adapter")))
        if now is not None and now != str(rec.get("adapter_version")):
            return None  # read by another version of its adapter: read the file again
    known = present if present is not None else {}
    task = rec.get("task")
    if not isinstance(task, str):
        return None
    task_key = _task_key(ctx, task)
    if task_key not in known:
        known[task_key] = ctx.store.exists(task_key)
    if not known[task_key]:
        return None  # its task stopped while writing its records: the task is redone whole
    rows: list[Row] = [(str(k), str(h), str(s), int(p), int(b)) for k, h, s, p, b in rec["rows"]]
    needed = {r[2] for r in rows} | ({rec["source_object"]} if rec.get("source_object") else set())
    refresh = getattr(ctx.store, "refresh", None)
    for oid in needed:
        if oid not in known:
            # reused: its time is refreshed, as a write of it would, so that a gc running
            # before this ingest stages its rows keeps it (within the grace period)
            key = object_key(oid)
            known[oid] = refresh(key) if callable(refresh) else ctx.store.exists(key)
        if not known[oid]:
            return None  # gc removed what it pointed to: redo the file
    return FileResult(
        path=src.path,
        key=src.key,
        size_bytes=int(rec["size_bytes"]),
        source_hash=str(rec["source_hash"]),
        adapter=str(rec["adapter"]),
        adapter_version=str(rec["adapter_version"]),
        rows=rows,
        schema=list(rec["schema"]),
        stats=dict(rec["stats"]),
        reused=True,
        source_object=rec.get("source_object"),
        software=_software_of(rec.get("software")),
    )


def _software_of(value: object) -> dict[str, str]:
    """A record's ``software`` (absent in records written before they kept it: empty)."""
    if not isinstance(value, dict):
        return {}
    return {str(k): str(v) for k, v in value.items()}
