"""What a transform keeps stays as it was, in DataLoader workers too.

A worker's chunk buffers come from a pool and are written again once the main process has
released the batches made of them. A transform that kept a tensor it was given (a
reference frame, the previous sample), or returned it inside an object the release could
not follow, saw its values replaced by later samples' (up to half the samples of three
epochs, fork and spawn, persistent workers or not): a transform now gets copies.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from simstore.loaders import SimDataLoader, SimDataset

import simstore
from simstore.catalog import Catalog

N = 48


def _values(key: str) -> np.ndarray:
    i = int(re.search(r"s(\d+)", key).group(1))
    return np.arange(128 * 512, dtype=np.float32).reshape(128, 512) + np.float32(i * 1e6)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("kept")
    src = root / "src"
    src.mkdir()
    for i in range(N):
        np.savez(src / f"s{i:03d}.npz", data=_values(f"s{i:03d}"), y=np.arange(16.0) + i)
    url = str(root / "store")
    Catalog.init(url)
    simstore.ingest([src], dataset="d", store=url, format="zarr", shard_size="2MiB",
                    compression="none", snapshot=True)
    return url


class _Kept:
    """A sample's tensor in an object a batch's release cannot look into."""

    def __init__(self, tensor: torch.Tensor, key: object) -> None:
        self.tensor, self.key = tensor, key


_FIRST: dict[str, torch.Tensor] = {}


def _keep_first(sample: dict) -> dict:
    """Keeps the first sample's tensor; says in each later sample whether it still holds."""
    if not _FIRST:
        _FIRST["held"], _FIRST["was"] = sample["data"], sample["data"].clone()
    return {**sample, "held_ok": torch.tensor(torch.equal(_FIRST["held"], _FIRST["was"]))}


def _in_object(sample: dict) -> dict:
    return {**sample, "obj": _Kept(sample["data"], None)}


@pytest.mark.parametrize("context", ["fork", "spawn"])
@pytest.mark.parametrize("persistent", [False, True])
def test_a_tensor_a_transform_keeps_keeps_its_values(store, context, persistent):
    ds = SimDataset(store, "d", seed=1, transform=_keep_first,
                    prefetch={"chunk_bytes": 2 << 20})
    loader = SimDataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context=context,
                           persistent_workers=persistent)
    seen = changed = 0
    for epoch in range(3):
        loader.set_epoch(epoch)
        for batch in loader:
            seen += len(batch["held_ok"])
            changed += int((~batch["held_ok"]).sum())
    assert seen == 3 * N and changed == 0


@pytest.mark.parametrize("persistent", [False, True])
def test_a_tensor_returned_inside_an_object_keeps_its_values(store, persistent):
    """The loop keeps the objects of each batch (the default collate lists them)."""
    ds = SimDataset(store, "d", seed=2, transform=_in_object,
                    prefetch={"chunk_bytes": 2 << 20})
    loader = SimDataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="fork",
                           persistent_workers=persistent)
    kept = []
    for epoch in range(3):
        loader.set_epoch(epoch)
        for batch in loader:
            kept += [(k, o.tensor) for k, o in zip(batch["__key__"], batch["obj"],
                                                     strict=True)]
    del loader, ds
    assert len(kept) == 3 * N
    wrong = [k for k, t in kept if not np.array_equal(t.numpy(), _values(k))]
    assert wrong == []


def _plus_one(sample: dict) -> dict:
    return {**sample, "data": sample["data"] + 1}


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_batches_stacked_from_transformed_samples_keep_their_values(store, context):
    """A worker stacks such a batch into its pooled shared memory: one the loop keeps is
    never written again, over later batches and epochs."""
    ds = SimDataset(store, "d", seed=4, transform=_plus_one, prefetch={"chunk_bytes": 2 << 20})
    loader = SimDataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context=context,
                           persistent_workers=True)
    kept = []
    for epoch in range(3):
        loader.set_epoch(epoch)
        kept += [(batch["__key__"], batch["data"]) for batch in loader]
    assert sum(len(keys) for keys, _ in kept) == 3 * N
    wrong = [k for keys, data in kept for k, row in zip(keys, data, strict=True)
             if not np.array_equal(row.numpy(), _values(k) + 1)]
    assert wrong == []
