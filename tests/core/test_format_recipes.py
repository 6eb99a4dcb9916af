"""docs/format.md's hash and cut recipes, written again from the page, against simstore.

A reader without simstore's code has only the page: each recipe here is implemented from
its text (xxhash, struct and JSON only) and must give the ids a real ingest wrote.
"""

import json
import struct

import numpy as np
import pyarrow.parquet as pq
import pytest
import xxhash

from simstore.catalog import Catalog
from simstore.hashing import object_key
from simstore.ingest import ingest
from simstore.sample import Sample, hash_sample

M64 = (1 << 64) - 1


def _item(h, data):
    h.update(struct.pack("<Q", len(data)))
    h.update(data)


def _doc_sample_hash(fields, kinds):
    h = xxhash.xxh3_128()
    h.update(b"simstore-sample-v1")
    for name in sorted(fields):
        value, kind = fields[name], kinds[name]
        _item(h, name.encode())
        _item(h, kind.encode())
        if kind == "tensor":
            a = np.asarray(value)
            dt = a.dtype.newbyteorder("<") if a.dtype.byteorder != "|" else a.dtype
            _item(h, dt.str.encode())
            _item(h, b"".join(struct.pack("<q", n) for n in (a.shape or (1,))))
            _item(h, np.ascontiguousarray(a.astype(dt)).tobytes())
        elif kind == "scalar":
            a = np.asarray(value)
            _item(h, str(a.dtype).encode())
            _item(h, a.astype(a.dtype.newbyteorder("<")).tobytes())
        elif kind == "string":
            _item(h, value.encode())
        else:
            raise AssertionError(kind)
    return h.hexdigest()


def _doc_content(keys, hashes):
    h = xxhash.xxh3_128()
    h.update(b"simstore-manifest-content-v1")
    encoded = [k.encode() for k in keys]
    offsets = np.concatenate([[0], np.cumsum([len(k) for k in encoded])]).astype("<i8")
    h.update(offsets.tobytes())
    h.update(b"".join(encoded))
    h.update(b"".join(hashes))
    return h.hexdigest()


def _doc_cuts_after(sample_hash, target_rows):
    lo, hi = struct.unpack("<QQ", sample_hash)
    x = lo ^ hi
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & M64
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & M64
    x ^= x >> 33
    return x % target_rows == 0


@pytest.mark.parametrize("value", [np.float32(1.5), 2.5, 7, True, np.array(3.0),
                                   np.array([3.0]), np.arange(6, dtype=">i2").reshape(2, 3),
                                   np.array([True, False]), np.zeros((0, 2), np.float64)])
def test_the_sample_hash_is_the_documented_recipe(value):
    kind = "tensor" if isinstance(value, np.ndarray) else "scalar"
    fields = {"v": value, "name": "run 7"}
    want = _doc_sample_hash(fields, {"v": kind, "name": "string"})
    assert hash_sample(Sample("k", fields)) == want


def test_part_content_content_hash_and_cuts_are_the_documented_recipes(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    target = 64
    for i in range(700):
        np.savez(src / f"s{i:04d}.npz", x=np.full(3, i, np.float32), t=np.array(float(i)))
    catalog = Catalog.init(str(tmp_path / "store"))
    catalog.target_rows = target  # parts of about 64 rows: several content-defined cuts
    r = ingest([src], dataset="d", store=catalog, snapshot=True)
    snap_obj = json.loads(catalog.store.get(object_key(r.snapshot_id)))
    assert len(snap_obj["parts"]) > 3
    rows_seen = 0
    for i, part in enumerate(snap_obj["parts"]):
        table = pq.read_table(catalog.store.local_path(object_key(part["id"])))
        keys = table.column("key").to_pylist()
        hashes = table.column("sample_hash").to_pylist()
        assert _doc_content(keys, hashes) == part["content"]
        cut = [j for j, h in enumerate(hashes) if _doc_cuts_after(h, target)]
        last = i == len(snap_obj["parts"]) - 1
        # a part ends on a cut row (or at 4 x target rows), and holds no earlier cut row
        # past its first target/4 rows
        assert last or cut[-1:] == [len(keys) - 1] or len(keys) == 4 * target
        assert all(j < target // 4 - 1 or j == len(keys) - 1 for j in cut)
        rows_seen += len(keys)
    assert rows_seen == 700
    contents = "".join(p["content"] for p in snap_obj["parts"])
    assert xxhash.xxh3_128_hexdigest(contents.encode("ascii")) == snap_obj["content_hash"]
