"""Fixtures of the ingest tests: an initialised local store and folders of real files."""

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "formats"))
sys.path.insert(0, os.path.dirname(__file__))

import source_files  # noqa: E402

from simstore.catalog import Catalog  # noqa: E402


@pytest.fixture
def catalog(tmp_path):
    return Catalog.init(str(tmp_path / "store"))


@pytest.fixture
def npz_dir(tmp_path):
    """Six .npz runs (two in a subfolder) and an unrelated text file."""
    root = tmp_path / "npz"
    (root / "sub").mkdir(parents=True)
    arrays = {}
    for i in range(6):
        rel = f"sub/run{i}" if i >= 4 else f"run{i}"
        arrays[rel] = source_files.write_npz(root / f"{rel}.npz", seed=i)
    (root / "README.txt").write_text("not data")
    return root, arrays


@pytest.fixture
def h5_dir(tmp_path):
    root = tmp_path / "h5"
    root.mkdir()
    data = {}
    for i in range(3):
        data[f"run{i}.h5"] = source_files.write_h5(root / f"run{i}.h5")
    return root, data


def read_snapshot(catalog, ref, fields=None):
    """{key: fields} of every sample of a snapshot, read through the stock shard readers."""
    from simstore.formats import open_shard

    from simstore.hashing import object_key

    snap = catalog.snapshot(catalog.resolve(ref))
    rows = catalog.manifest(snap).to_pylist()
    out = {}
    by_shard = {}
    for r in rows:
        by_shard.setdefault(r["shard"], []).append(r)
    for shard, rs in by_shard.items():
        path = catalog.store.local_path(object_key(shard))
        reader = open_shard(path)
        try:
            for r, fields_ in zip(
                rs, reader.read([r["position"] for r in rs], fields), strict=False
            ):
                out[r["key"]] = fields_
        finally:
            reader.close()
    return snap, out


@pytest.fixture
def read():
    return read_snapshot


def all_values(arrays, name):
    return np.concatenate([np.asarray(a[name], dtype=np.float64).ravel() for a in arrays])
