"""Helpers of the cost tests: stage samples whose shards have known sizes."""

from __future__ import annotations

import pyarrow as pa

from simstore.hashing import hash_bytes, object_key
from simstore.manifest import ManifestRow, rows_from_list
from simstore.sample import FieldSpec

SCHEMA = (FieldSpec(name="u", kind="tensor", dtype="float32", ndim=1),)


def stage(cat, dataset, items):
    """Stage samples {key: payload}; each payload is stored as its own shard."""
    rows, shards = [], []
    for key, payload in sorted(items.items()):
        oid, _ = cat.put_object(payload)
        shards.append(oid)
        rows.append(
            ManifestRow(
                key=key,
                sample_hash=hash_bytes(b"s" + payload),
                shard=oid,
                position=0,
                size_bytes=len(payload),
            )
        )
    table = rows_from_list(rows)
    table = table.append_column("deleted", pa.array([False] * len(rows)))
    return cat.stage(dataset, changes=table, shards=shards, schema=SCHEMA)


def commit(cat, dataset, items, *, branch="main", message="m"):
    stage(cat, dataset, items)
    return cat.commit(dataset, message=message, branch=branch).snapshot_id


def stored_size(cat, oid):
    return cat.store.info(object_key(oid)).size_bytes


__all__ = ["SCHEMA", "commit", "stage", "stored_size"]
