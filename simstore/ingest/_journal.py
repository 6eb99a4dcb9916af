"""The journal: one record per finished file, so a re-run redoes none of them.

A record ``journal/<dataset>/<digest>`` is keyed by the file's key, size and mtime and by
the digest of every output parameter; it holds the file's manifest rows, schema and
statistics. It is written only after the shards its rows point to are stored, and a
record whose shards are gone (gc) is ignored, so a record never vouches for missing data.
Nothing else reads the journal; deleting records only makes a re-run read files again.
"""

from __future__ import annotations

import json

from simstore.errors import NotFoundError
from simstore.hashing import hash_bytes, object_key
from simstore.ingest._records import FileResult, Row, SourceFile, TaskContext
from simstore.sample import canonical_json

__all__ = ["JOURNAL_FORMAT_VERSION", "journal_key", "read_journal", "write_journal"]

JOURNAL_FORMAT_VERSION = 1


def journal_key(ctx: TaskContext, src: SourceFile) -> str:
    """The store key of a file's (or a file piece's) record under these output parameters."""
    fields = {
        "v": JOURNAL_FORMAT_VERSION,
        "key": src.key,
        "size": src.size,
        "mtime_ns": src.mtime_ns,
        "params": ctx.params_digest,
    }
    if src.piece is not None:
        fields["samples"] = [src.piece.start, src.piece.stop]
    digest = hash_bytes(canonical_json(fields))
    return f"journal/{ctx.dataset}/{digest}"


def write_journal(ctx: TaskContext, src: SourceFile, res: FileResult) -> None:
    """Record a finished file (its shards must already be stored); no-op without resume."""
    if not ctx.config.resume:
        return
    record = {
        "format_version": JOURNAL_FORMAT_VERSION,
        "kind": "ingest-journal",
        "key": res.key,
        "path": res.path,
        "size_bytes": res.size_bytes,
        "source_hash": res.source_hash,
        "adapter": res.adapter,
        "adapter_version": res.adapter_version,
        "rows": [list(r) for r in res.rows],
        "schema": res.schema,
        "stats": res.stats,
        "source_object": res.source_object,
    }
    ctx.store.put(journal_key(ctx, src), canonical_json(record))


def read_journal(ctx: TaskContext, src: SourceFile) -> FileResult | None:
    """The file's record as a reused result, or None (absent, unreadable, shards gone)."""
    try:
        rec = json.loads(ctx.store.get(journal_key(ctx, src)))
    except NotFoundError:
        return None
    except ValueError:
        return None
    if rec.get("format_version") != JOURNAL_FORMAT_VERSION or rec.get("kind") != "ingest-journal":
        return None
    rows: list[Row] = [(str(k), str(h), str(s), int(p), int(b)) for k, h, s, p, b in rec["rows"]]
    needed = {r[2] for r in rows} | ({rec["source_object"]} if rec.get("source_object") else set())
    if not all(ctx.store.exists(object_key(oid)) for oid in needed):
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
    )
