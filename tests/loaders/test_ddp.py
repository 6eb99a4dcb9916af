"""DDP with the gloo backend on CPU, in real processes: ranks x DataLoader workers."""

from __future__ import annotations

import json
import os

import pytest
import torch.multiprocessing as mp
from ddp_helpers import free_port, plain_loader_rank, rank_main
from loader_helpers import open_test_shard
from simstore.loaders import SimDataLoader, SimDataset

pytestmark = [pytest.mark.ddp, pytest.mark.multiprocess]


def launch(tmp_path, name, world_size, **job):
    out = tmp_path / name
    out.mkdir()
    job = {"seed": 11, "steps": None, "state": None, "workers": 2, **job, "out": str(out)}
    mp.spawn(rank_main, args=(world_size, free_port(), job), nprocs=world_size, join=True)
    results = []
    for r in range(world_size):
        with open(os.path.join(out, f"rank{r}.json")) as f:
            results.append(json.load(f))
    assert len({json.dumps(r["state"], sort_keys=True) for r in results}) == 1
    assert len({r["batches"] for r in results}) == 1, "ranks got different batch counts"
    return results


def test_ddp_epoch_is_exact_equal_and_deterministic(small, tmp_path):
    store, ref, samples = small
    results = launch(tmp_path, "full", 2, store=store, ref=ref, epoch=1, batch=4)
    keys = [k for r in results for k in r["keys"]]
    assert len(keys) == len(set(keys)) and set(keys) == set(samples)
    # the same stream as a single process computes for each rank (determinism across runs)
    for rank, r in enumerate(results):
        ds = SimDataset(store, ref, seed=11, rank=rank, world_size=2, shard_opener=open_test_shard)
        ds.set_epoch(1)
        local = [k for b in SimDataLoader(ds, batch_size=4) for k in b["__key__"]]
        assert r["order"] == local


def test_ddp_resume_is_exact_and_elastic(small, tmp_path):
    store, ref, samples = small
    common = {"store": store, "ref": ref, "epoch": 0}
    first = launch(tmp_path, "a", 4, batch=3, steps=3, **common)
    state = first[0]["state"]
    assert state["delivered"] == 4 * 3 * 3
    second = launch(tmp_path, "b", 2, batch=2, steps=2, state=state, **common)
    third = launch(tmp_path, "c", 4, batch=2, state=second[0]["state"], **common)
    keys = [k for part in (first, second, third) for r in part for k in r["keys"]]
    assert len(keys) == len(set(keys)) and set(keys) == set(samples)
    assert third[0]["state"]["remaining"] == []


def test_ddp_with_persistent_workers_reads_each_epoch_exactly(small, tmp_path):
    store, ref, samples = small
    results = launch(tmp_path, "kept", 2, store=store, ref=ref, epoch=0, epochs=[0, 1, 2],
                     batch=4, persistent=True)
    for epoch_index, epoch in enumerate((0, 1, 2)):
        keys = [k for r in results for k in r["epoch_keys"][epoch_index]]
        assert len(keys) == len(set(keys)) and set(keys) == set(samples)
        for rank, r in enumerate(results):
            ds = SimDataset(store, ref, seed=11, rank=rank, world_size=2,
                            shard_opener=open_test_shard)
            ds.set_epoch(epoch)
            local = [k for b in SimDataLoader(ds, batch_size=4) for k in b["__key__"]]
            assert r["epoch_order"][epoch_index] == local
    for r in results:  # the same two workers served every epoch
        assert len(r["worker_pids"]) == 3 and len({tuple(p) for p in r["worker_pids"]}) == 1


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_plain_dataloader_workers_read_the_rank_of_a_group_started_after_the_dataset(
        small, tmp_path, context):
    # the dataset saw rank 0 of 1 when it was built; its workers read for the process group
    store, ref, samples = small
    job = {"store": store, "ref": ref, "seed": 11, "context": context, "out": str(tmp_path)}
    mp.spawn(plain_loader_rank, args=(2, free_port(), job), nprocs=2, join=True)
    per_rank = []
    for r in range(2):
        with open(os.path.join(tmp_path, f"rank{r}.json")) as f:
            per_rank.append(json.load(f)["keys"])
    keys = [k for r in per_rank for k in r]
    assert [len(r) for r in per_rank] == [30, 30]
    assert len(keys) == len(set(keys)) and set(keys) == set(samples)
