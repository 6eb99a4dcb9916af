"""With worker processes on a local dataset, worker 0's first batch is read first.

The first batch is worker 0's; the other workers start reading once it is going out, so
it does not share the cores with their first batches. Worker 0 says so through a byte
in shared memory, also when it ends without a batch or fails, so nobody waits for a
batch that will not come.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
from loader_helpers import open_test_shard
from simstore.loaders import SimDataLoader, SimDataset, _streams

from simstore.errors import SimstoreError

pytestmark = pytest.mark.multiprocess


class _Log:
    """A transform noting when each worker saw each sample (a file per worker process)."""

    def __init__(self, folder: str, fail_in: int | None = None,
                 slow_in: int | None = None) -> None:
        self.folder = folder
        self.fail_in = fail_in
        self.slow_in = slow_in

    def __call__(self, sample):
        info = torch.utils.data.get_worker_info()
        worker = info.id if info is not None else -1
        if worker == self.fail_in:
            raise ValueError("this worker's transform fails")
        if worker == self.slow_in:
            time.sleep(0.05)  # a slow first batch: the other worker has time to start
        with open(os.path.join(self.folder, f"{worker}.txt"), "a") as f:
            f.write(f"{time.monotonic()!r}\n")
        return sample


def _times(folder, worker):
    path = os.path.join(folder, f"{worker}.txt")
    with open(path) as f:
        return [float(line) for line in f]


def _loader(small, folder, **kw):
    store, ref, _ = small
    ds = SimDataset(store, ref, seed=3, shard_opener=open_test_shard,
                    transform=_Log(str(folder), **kw))
    return SimDataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="fork")


def test_the_second_worker_starts_once_the_first_batch_is_going_out(small, tmp_path,
                                                                    monkeypatch):
    # forked workers inherit this: however slow the machine, worker 1 waits for the batch
    monkeypatch.setattr(_streams, "FIRST_BATCH_WAIT_S", 300.0)
    loader = _loader(small, tmp_path, slow_in=0)
    keys = [k for b in loader for k, pad in zip(b["__key__"], b["__pad__"], strict=True)
            if not pad]
    assert sorted(keys) == sorted(small[2])  # every sample once, as before
    first, second = _times(tmp_path, 0), _times(tmp_path, 1)
    assert len(first) + len(second) == len(small[2])
    # worker 0's first batch (its first four samples) was read before worker 1 read any
    assert max(first[:4]) < min(second)
    assert loader._init.first_out is not None and loader._init.first_out.value == 1


def test_a_first_worker_that_fails_still_lets_the_others_go(small, tmp_path, monkeypatch):
    monkeypatch.setattr(_streams, "FIRST_BATCH_WAIT_S", 300.0)
    loader = _loader(small, tmp_path, fail_in=0)
    with pytest.raises((ValueError, SimstoreError, RuntimeError)):
        for _ in loader:
            pass
    # set as worker 0's stream ended: worker 1 did not wait out the limit
    assert loader._init.first_out.value == 1


def test_no_worker_waits_with_one_worker(small, tmp_path):
    store, ref, _ = small
    ds = SimDataset(store, ref, seed=3, shard_opener=open_test_shard)
    one = SimDataLoader(ds, batch_size=4, num_workers=1, multiprocessing_context="fork")
    assert sum(len(b["__key__"]) for b in one) >= len(small[2])
    assert one._init.first_out is None


class _FailInit:
    """A caller's worker_init_fn that raises in worker 0: it never reads, never sends."""

    def __call__(self, worker_id: int) -> None:
        if worker_id == 0:
            raise ValueError("worker 0's init fails")


class _KillFirst:
    """A transform that kills worker 0 (SIGKILL: no finally runs) on its first sample."""

    def __call__(self, sample):
        info = torch.utils.data.get_worker_info()
        if info is not None and info.id == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        return sample


def test_a_first_worker_whose_init_fails_does_not_hold_the_others(small, monkeypatch):
    # worker 0 never reaches its stream: the loader, stopping the workers on its error,
    # lets the others go (they would hold the shutdown, and the error, for the limit)
    monkeypatch.setattr(_streams, "FIRST_BATCH_WAIT_S", 300.0)
    store, ref, _ = small
    ds = SimDataset(store, ref, seed=3, shard_opener=open_test_shard)
    loader = SimDataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="fork",
                           worker_init_fn=_FailInit())
    with pytest.raises(ValueError, match="worker 0's init fails"):
        for _ in loader:
            pass
    assert loader._init.first_out is not None and loader._init.first_out.value == 1


def test_a_first_worker_killed_in_its_first_batch_does_not_hold_the_others(small,
                                                                          monkeypatch):
    monkeypatch.setattr(_streams, "FIRST_BATCH_WAIT_S", 300.0)
    store, ref, _ = small
    ds = SimDataset(store, ref, seed=3, shard_opener=open_test_shard, transform=_KillFirst())
    loader = SimDataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="fork")
    with pytest.raises(RuntimeError, match="exited unexpectedly"):
        for _ in loader:
            pass
    assert loader._init.first_out is not None and loader._init.first_out.value == 1
