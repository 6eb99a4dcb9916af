"""A Zarr shard whose zip index lost a chunk (a central directory entry renamed by one
flipped byte, which no CRC covers) is damaged: an error naming it, never the fill value."""

import os

import numpy as np
import pytest
from simstore.formats import open_shard
from simstore.loaders import SimDataset

from simstore.catalog import Catalog
from simstore.errors import FormatError, IntegrityError
from simstore.hashing import object_key
from simstore.ingest import ingest


def test_a_chunk_missing_from_the_index_is_an_error_not_zeros(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(0)
    for i in range(6):
        np.savez(src / f"r{i}.npz", u=rng.standard_normal((4, 16, 16)).astype(np.float32))
    store = str(tmp_path / "store")
    Catalog.init(store)
    ingest([str(src)], dataset="d", store=store, snapshot=True, format="zarr",
           compression="none", chunks={"u": (1, 16, 16)})
    cat = Catalog.open(store)
    shard = cat.manifest(cat.snapshot(cat.resolve("d"))).to_pylist()[0]["shard"]
    path = os.path.join(store, object_key(shard))
    with open(path, "rb") as f:
        data = bytearray(f.read())
    at = data.find(b"0/u/c/1/0/0", data.find(b"PK\x01\x02")) + len(b"0/u/c/")
    data[at] ^= 0x04  # the central directory's '0/u/c/1/0/0' becomes '0/u/c/5/0/0'
    os.chmod(path, 0o644)
    with open(path, "wb") as f:
        f.write(bytes(data))
    reader = open_shard(path)
    try:
        with pytest.raises(FormatError, match=r"zip entry 0/u/c/1/0/0 is missing .* damaged"):
            list(reader.read([0], fields=["u"]))
    finally:
        reader.close()
    for verify, error in ((False, FormatError), (True, IntegrityError)):
        seen = []
        with pytest.raises(error, match=shard):
            for sample in SimDataset(store, "d", shuffle=False, verify=verify, fields=["u"]):
                seen.append(sample["__key__"])
        assert "r0" not in seen  # the damaged sample was never handed out
