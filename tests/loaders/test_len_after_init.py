"""``len()`` answers for the process group as it is when asked, not as it was at construction.

The mp.spawn style: the dataset is built before ``init_process_group``, and neither
``RANK`` nor ``WORLD_SIZE`` is in the environment, so construction sees rank 0 of 1.
"""

from __future__ import annotations

import json
import os

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp
from ddp_helpers import free_port
from loader_helpers import commit_samples, make_samples, open_test_shard
from simstore.loaders import SimDataLoader, SimDataset

pytestmark = [pytest.mark.ddp, pytest.mark.multiprocess]


def len_rank(rank: int, world_size: int, port: int, job: dict) -> None:
    """One rank: build the dataset, then join the group; record len() and what it read."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        os.environ.pop(name, None)
    ds = SimDataset(job["store"], job["ref"], seed=3, shard_opener=open_test_shard)
    loader = SimDataLoader(ds, batch_size=job["batch"], num_workers=job["workers"],
                           multiprocessing_context="fork" if job["workers"] else None)
    built_world = ds.world.world_size
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            init_method=f"tcp://127.0.0.1:{port}")
    try:
        len_ds, len_loader = len(ds), len(loader)
        batches = list(loader)
        out = {
            "built_world": built_world,
            "len_ds": len_ds,
            "len_loader": len_loader,
            "batches": len(batches),
            "samples": sum(len(b["__key__"]) for b in batches),
            "len_loader_after": len(loader),
            "world": [ds.world.rank, ds.world.world_size],
        }
        with open(os.path.join(job["out"], f"rank{rank}.json"), "w") as f:
            json.dump(out, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("workers", [0, 2])
def test_len_before_the_first_epoch_counts_the_process_group(store_path, tmp_path,
                                                             monkeypatch, workers):
    commit_samples(store_path, "sim", make_samples(43), per_shard=7)
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    out = tmp_path / "out"
    out.mkdir()
    world_size = 3
    job = {"store": store_path, "ref": "sim", "batch": 4, "workers": workers,
           "out": str(out)}
    mp.spawn(len_rank, args=(world_size, free_port(), job), nprocs=world_size, join=True)
    for rank in range(world_size):
        with open(out / f"rank{rank}.json") as f:
            got = json.load(f)
        assert got["built_world"] == 1  # construction saw no process group
        assert got["world"] == [rank, world_size]
        # 43 samples over 3 ranks: 15 each (2 pad rows), in 4 batches of at most 4
        assert got["len_ds"] == got["samples"] == 15
        assert got["len_loader"] == got["batches"] == got["len_loader_after"] == 4
