"""The body of one DDP rank for the loader's torch.distributed tests (gloo on CPU)."""

from __future__ import annotations

import itertools
import json
import os
import socket
from typing import Any

import torch
import torch.distributed as dist
from loader_helpers import keys_of, open_test_shard
from simstore.loaders import SimDataLoader, SimDataset


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_main(rank: int, world_size: int, port: int, job: dict[str, Any]) -> None:
    """Read `job['steps']` batches (all when None) as one rank; write what it saw."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size, init_method="env://")
    try:
        ds = SimDataset(job["store"], job["ref"], seed=job["seed"], shard_opener=open_test_shard)
        assert ds.world.rank == rank and ds.world.world_size == world_size
        if job.get("state") is not None:
            ds.load_state_dict(job["state"])
        loader = SimDataLoader(ds, batch_size=job["batch"], num_workers=job["workers"],
                               multiprocessing_context="fork",
                               persistent_workers=job.get("persistent", False))
        epochs = []
        pids = []
        for epoch in job.get("epochs", [job["epoch"]]):
            ds.set_epoch(epoch)
            batches = []
            for batch in itertools.islice(loader, job["steps"]):
                batches.append(batch)
                # a training step's collective: keeps ranks in lockstep as DDP would
                step = torch.tensor([float(len(batch["__key__"]))])
                dist.all_reduce(step)
            epochs.append(batches)
            if loader._iterator is not None:
                pids.append(sorted(w.pid for w in loader._iterator._workers))
        batches = epochs[-1]
        out = {
            "keys": keys_of(batches),
            "order": [k for b in batches for k in b["__key__"]],
            "batches": len(batches),
            "state": loader.state_dict(),
            "epoch_keys": [keys_of(b) for b in epochs],
            "epoch_order": [[k for b in e for k in b["__key__"]] for e in epochs],
            "worker_pids": pids,
        }
        with open(os.path.join(job["out"], f"rank{rank}.json"), "w") as f:
            json.dump(out, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def plain_loader_rank(rank: int, world_size: int, port: int, job: dict[str, Any]) -> None:
    """Build the dataset before ``init_process_group`` (the ``mp.spawn`` style, no
    ``RANK``/``WORLD_SIZE``), read it through a plain DataLoader with workers, write the keys."""
    from torch.utils.data import DataLoader

    ds = SimDataset(job["store"], job["ref"], seed=job["seed"], shard_opener=open_test_shard)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size, init_method="env://")
    try:
        loader = DataLoader(ds, batch_size=None, num_workers=2,
                            multiprocessing_context=job["context"])
        keys = [s["__key__"] for s in loader if not bool(s["__pad__"])]
        with open(os.path.join(job["out"], f"rank{rank}.json"), "w") as f:
            json.dump({"keys": keys}, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()
