"""What an ingest stored, read back through the shard reader (for the adapter tests)."""

import os

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


def zarr_shard_of(tmp_path, src, **options):
    """``src`` ingested into a new store as dataset ``d``, in one uncompressed Zarr shard.

    Returns the store's path, the shard's id and the shard file's path.
    """
    store = str(tmp_path / "store")
    Catalog.init(store)
    ingest([str(src)], dataset="d", store=store, snapshot=True, format="zarr",
           compression="none", **options)
    cat = Catalog.open(store)
    shard = cat.manifest(cat.snapshot(cat.resolve("d"))).to_pylist()[0]["shard"]
    return store, shard, os.path.join(store, object_key(shard))


def same(a, b):
    """``a`` and ``b`` are the same values bit for bit: dtype, shape and bytes."""
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.tobytes() == b.tobytes()
