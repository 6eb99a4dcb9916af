import pyarrow as pa

from simstore.hashing import hash_bytes, object_key
from simstore.manifest import ManifestRow, rows_from_list


def stage_samples(cat, dataset, items, *, mode="upsert", deleted=()):
    """Stage samples {key: payload bytes}: each payload is stored as its own 'shard'."""
    rows = []
    shards = []
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
    for key in deleted:
        rows.append(
            ManifestRow(key=key, sample_hash="0" * 32, shard="0" * 32, position=0, size_bytes=0)
        )
    table = rows_from_list(rows)
    table = table.append_column("deleted", pa.array([False] * len(items) + [True] * len(deleted)))
    return cat.stage(dataset, changes=table, shards=shards, mode=mode)


def content(cat, ref):
    """{key: sample hash} of a ref."""
    snap = cat.snapshot(cat.resolve(ref))
    out = {}
    for t in cat.iter_parts(snap):
        for k, h in zip(
            t.column("key").to_pylist(), t.column("sample_hash").to_pylist(), strict=True
        ):
            out[k] = h.hex()
    return out


def expected_hash(payload):
    return hash_bytes(b"s" + payload)


__all__ = ["content", "expected_hash", "object_key", "stage_samples"]
