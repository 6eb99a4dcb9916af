"""Reading counters include the work readers do after the loop's last batch.

A training loop that stops early (a step limit, a preemption) leaves its readers' fetches
ahead done but undelivered; in DataLoader workers no batch carries them. The stats and the
run report (which ``simstore cost --run`` prices) must still count every byte fetched.
"""

from __future__ import annotations

import gc
import os
import time

import numpy as np
import pytest
from loader_helpers import RemoteLikeStore, open_test_shard
from simstore.loaders import PrefetchConfig, SimDataLoader, SimDataset
from simstore.loaders._metrics import Metrics
from simstore.loaders._stats import Counters, ledger_keys, read_ledger

from simstore.catalog import Catalog


def _shard_copies(store: str, cache: str) -> list[str]:
    """The cache copies of the dataset's shards (the cache holds its manifest too)."""
    cat = Catalog.open(store)
    snap = cat.snapshot(cat.resolve("sim"))
    shards = {s for t in cat.iter_parts(snap) for s in t.column("shard").to_pylist()}
    paths = [os.path.join(cache, "objects", s[:2], s) for s in sorted(shards)]
    return [p for p in paths if os.path.exists(p)]


def _wait_for(condition, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"still waiting for {what} after {timeout_s} s")
        time.sleep(0.02)


@pytest.mark.multiprocess
@pytest.mark.parametrize(("workers", "start"), [(0, None), (2, "fork"), (2, "spawn")])
def test_fills_after_the_last_delivered_batch_are_counted(small, tmp_path, workers, start):
    store, _, _ = small
    cache = str(tmp_path / "cache")
    ds = SimDataset(RemoteLikeStore(store, delay_s=0.05), "sim", shuffle=False, cache_dir=cache,
                    cache_limit="64MiB", shard_opener=open_test_shard,
                    prefetch=PrefetchConfig(shards=8))
    loader = SimDataLoader(ds, batch_size=2, num_workers=workers,
                           multiprocessing_context=start)
    it = iter(loader)
    next(it)  # one batch (one shard's samples); the readers fetch the other shards ahead
    _wait_for(lambda: len(_shard_copies(store, cache)) == 6, "every shard in the cache")
    on_disk = sum(os.path.getsize(p) for p in _shard_copies(store, cache))
    _wait_for(lambda: ds.stats()["cache_fill_bytes"] == on_disk,
              f"the stats to count {on_disk} bytes of fills")
    del it
    gc.collect()
    stats = ds.stats()
    assert stats["samples"] == 2  # what the loop received, not what was read ahead
    assert stats["cache_misses"] == 6
    assert stats["cache_fill_bytes"] == on_disk
    # every object the readers fetched (shards, manifest parts: all of the cache but the
    # snapshot, which the dataset read before its readers started) fetched and counted once
    fetched = [os.path.join(d, f) for d, _, files in os.walk(os.path.join(cache, "objects"))
               for f in files if f != ds.snapshot_id]
    report = ds.report()
    assert report["tiers"]["fake-remote"]["bytes"] == sum(map(os.path.getsize, fetched))


def test_a_ledger_row_mirrors_the_counters_it_names():
    keys = ledger_keys(["s3"])
    row = np.zeros(len(keys))
    counters = Counters(row, keys)
    counters.add("cache_misses")
    counters.add("cache_fill_bytes", 100)
    counters.add_read("s3", 4096, requests=2)
    counters.add_read("elsewhere", 7)  # not in the ledger: kept in the process only
    seen = read_ledger(row, keys)
    assert seen["cache_misses"] == 1 and seen["cache_fill_bytes"] == 100
    assert seen["tier:s3:bytes"] == 4096 and seen["tier:s3:requests"] == 2
    assert "tier:elsewhere:bytes" not in seen
    assert counters.snapshot()["tier:elsewhere:bytes"] == 7


def test_metrics_take_delivered_samples_and_the_readers_latest_reads():
    metrics = Metrics()
    metrics.start(0)
    live = {"samples": 50, "sample_bytes": 5000, "cache_fill_bytes": 900, "tier:s3:bytes": 990}
    metrics.watch(0, lambda: live)
    metrics.update(0, {"samples": 10, "sample_bytes": 1000, "cache_fill_bytes": 300,
                       "tier:s3:bytes": 330})
    counters = metrics.counters()
    assert counters["samples"] == 10 and counters["sample_bytes"] == 1000  # delivered
    assert counters["cache_fill_bytes"] == 900 and counters["tier:s3:bytes"] == 990  # read
    metrics.start(1)  # the next iteration keeps the totals, and watches nothing yet
    live["cache_fill_bytes"] = 10**9
    assert metrics.counters()["cache_fill_bytes"] == 900


@pytest.mark.multiprocess
def test_an_iterator_left_alive_keeps_counting_after_a_new_one_starts(small, tmp_path):
    store, _, _ = small
    cache = str(tmp_path / "cache")
    ds = SimDataset(RemoteLikeStore(store, delay_s=0.05), "sim", cache_dir=cache,
                    cache_limit="64MiB", shard_opener=open_test_shard,
                    prefetch=PrefetchConfig(shards=8))
    loader = SimDataLoader(ds, batch_size=2, num_workers=2, multiprocessing_context="fork")
    first = iter(loader)
    next(first)  # its workers go on fetching ahead; the loop moves to a new epoch
    ds.set_epoch(1)
    n = sum(len(batch["__key__"]) for batch in loader)
    assert n == 60
    _wait_for(lambda: len(_shard_copies(store, cache)) == 6, "every shard in the cache")
    fetched = lambda: sum(  # noqa: E731  (every object the readers fetched, bar the snapshot)
        os.path.getsize(os.path.join(d, f))
        for d, _, files in os.walk(os.path.join(cache, "objects"))
        for f in files if f != ds.snapshot_id)
    _wait_for(lambda: ds.report()["tiers"]["fake-remote"]["bytes"] == fetched(),
              "the report to count every fetch, the first iterator's included")
    del first
    gc.collect()
    report = ds.report()
    assert report["tiers"]["fake-remote"]["bytes"] == fetched()
    assert report["cache"]["misses"] == 6  # each shard filled once, whichever iterator did
    assert report["samples"] == 62  # one batch of the first iteration, then a whole epoch


@pytest.mark.multiprocess
@pytest.mark.parametrize("workers", [0, 2])
def test_a_job_without_a_cache_reports_no_cache_tier(small, workers):
    store, _, _ = small
    ds = SimDataset(store, "sim", shard_opener=open_test_shard)
    loader = SimDataLoader(ds, batch_size=4, num_workers=workers,
                           multiprocessing_context="fork" if workers else None)
    assert sum(len(b["__key__"]) for b in loader) == 60
    tiers = ds.report()["tiers"]
    assert set(tiers) == {"local"} and tiers["local"]["bytes"] > 0
