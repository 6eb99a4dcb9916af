"""What an ingest stored, read back through the shard reader (for the adapter tests)."""

import numpy as np
from simstore.formats import open_shard

from simstore.catalog import Catalog
from simstore.hashing import object_key
from simstore.ingest import ingest


def stored(tmp_path, src, **options):
    """{key: fields} of what ingest stored from ``src``, read through the shard reader."""
    catalog = Catalog.init(str(tmp_path / "store"))
    ingest([str(src)], dataset="d", store=catalog, snapshot=True, **options)
    snap = catalog.snapshot(catalog.resolve("d@main"))
    out = {}
    for row in catalog.manifest(snap).to_pylist():
        reader = open_shard(catalog.store.local_path(object_key(row["shard"])))
        try:
            (out[row["key"]],) = list(reader.read([row["position"]]))
        finally:
            reader.close()
    return out


def same(a, b):
    """``a`` and ``b`` are the same values bit for bit: dtype, shape and bytes."""
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.tobytes() == b.tobytes()
