"""crop= and window= on a field some samples lack: those samples read as they do without
a crop (the field missing), in a Zarr shard and in a shard of another format without it."""

import numpy as np
import pytest
from simstore.loaders import SimDataset

from simstore.catalog import Catalog
from simstore.ingest import ingest


def _read(store, **kw):
    return {s["__key__"]: (tuple(s["dense"].shape) if "dense" in s else None)
            for s in SimDataset(store, "d", shuffle=False, **kw)}


@pytest.mark.parametrize("kw", [{"crop": {"dense": (0, 2)}}, {"window": {"dense": 2}}])
def test_a_sample_without_the_cropped_field_in_a_zarr_shard(tmp_path, kw):
    src = tmp_path / "src"
    src.mkdir()
    np.savez(src / "a.npz", x=np.zeros((4, 8), np.float32))  # no 'dense'
    np.savez(src / "b.npz", x=np.ones((4, 8), np.float32), dense=np.arange(64.0).reshape(8, 8))
    store = str(tmp_path / "store")
    Catalog.init(store)
    ingest([str(src)], dataset="d", store=store, snapshot=True, format="zarr")
    assert _read(store, **kw) == {"a": None, "b": (2, 8)}


def test_a_parquet_shard_without_the_cropped_field_reads_without_a_crop(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(0)
    for i in range(2):  # fields over 128 KiB go to Zarr shards by default
        np.savez(src / f"r{i}.npz", dense=rng.standard_normal((8, 64, 128)).astype(np.float32))
    np.savez(src / "small.npz", x=np.zeros(4, np.float32))  # a Parquet shard, no 'dense'
    store = str(tmp_path / "store")
    Catalog.init(store)
    ingest([str(src)], dataset="d", store=store, snapshot=True)
    assert _read(store, crop={"dense": (0, 2)}) == {
        "r0": (2, 64, 128), "r1": (2, 64, 128), "small": None}
