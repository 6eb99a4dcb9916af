"""A batch's scalar fields: one tensor per column, as stacking each sample's would make.

Scalars decode as NumPy 0-d values; a batch used to make a 0-d tensor of each and stack
them (about a third of the loop's time with 256 8 KiB samples per batch). The column is
now one array; these tests hold it to what the per-sample path gives.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from simstore.loaders import SimDataLoader, SimDataset
from simstore.loaders._reading import _scalar_column

import simstore
from simstore.catalog import Catalog

DTYPES = ["float64", "float32", "int64", "int32", "int16", "uint8", "bool"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    src = tmp_path_factory.mktemp("src")
    rng = np.random.default_rng(3)
    for i in range(13):
        values = {f"s_{d}": np.asarray(rng.integers(0, 2) if d in ("bool", "uint8") else
                                       rng.normal() * 50, dtype=d) for d in DTYPES}
        np.savez(os.path.join(src, f"r{i:02d}.npz"), u=rng.normal(size=(4, 4)).astype("f4"),
                 **values)
    path = str(tmp_path_factory.mktemp("store") / "s")
    Catalog.init(path)
    simstore.ingest([str(src)], dataset="d", store=path, snapshot=True, message="t",
                    shard_size=2_000)
    return path


@pytest.mark.parametrize("workers", [0, 2])
def test_scalar_columns_equal_the_samples_stacked(store, workers):
    one = {s["__key__"]: s for s in SimDataset(store, "d", seed=4)}
    loader = SimDataLoader(SimDataset(store, "d", seed=4), batch_size=4, num_workers=workers,
                           multiprocessing_context="fork" if workers else None)
    seen = 0
    for batch in loader:
        keys = batch["__key__"]
        for d in DTYPES:
            column = batch[f"s_{d}"]
            expected = torch.stack([one[k][f"s_{d}"] for k in keys])
            assert column.dtype == expected.dtype == getattr(torch, d)
            assert column.shape == (len(keys),)
            assert torch.equal(column, expected)
        seen += len(keys) - int(batch["__pad__"].sum())
    assert seen == len(one) == 13


def test_only_numeric_native_scalars_of_one_dtype_make_a_column():
    assert torch.equal(_scalar_column([np.float64(1.5), np.asarray(2.5)]),
                       torch.tensor([1.5, 2.5], dtype=torch.float64))
    assert _scalar_column([np.float64(1), np.float32(2)]) is None  # dtypes differ
    assert _scalar_column([np.asarray(1.0, dtype=">f8")]) is None  # byte order
    assert _scalar_column([np.zeros(2)]) is None  # not 0-d
    assert _scalar_column([np.str_("a")]) is None
    assert _scalar_column([1.0, 2.0]) is None  # Python numbers: collate's own path
    assert _scalar_column([np.float64(1), None]) is None
