"""Warm cache copies: those in the cache before a job started, each counted once per job.

``cache.hits`` counts lookups (per reading process, epoch and reopen); what a warm cache
saved a run is the distinct copies it held before the run started (``warm_hits``), which
the cost accounting prices as a cold start (docs/loader.md, Metrics; docs/cost.md).
"""

from __future__ import annotations

import os
import time

import pytest
from loader_helpers import RemoteLikeStore, open_test_shard
from simstore.loaders import SimDataLoader, SimDataset
from simstore.loaders._cache import CacheConfig, ShardCache
from simstore.loaders._stats import Counters

from simstore.catalog import Catalog
from simstore.hashing import hash_bytes


def _shards(store: str) -> dict[str, int]:
    """The dataset's shard ids and their sizes in the store."""
    cat = Catalog.open(store)
    snap = cat.snapshot(cat.resolve("sim"))
    ids = {r for t in cat.iter_parts(snap) for r in t.column("shard").to_pylist()}
    return {s: os.path.getsize(os.path.join(store, "objects", s[:2], s)) for s in ids}


def _dataset(store: str, cache: str) -> SimDataset:
    return SimDataset(RemoteLikeStore(store), "sim", cache_dir=cache, cache_limit="64MiB",
                      shard_opener=open_test_shard)


def _run(ds: SimDataset, epochs: int, workers: int = 0, context: str | None = None,
         batch_size: int = 4, **kw: object) -> dict:
    loader = SimDataLoader(ds, batch_size=batch_size, num_workers=workers,
                           multiprocessing_context=context if workers else None, **kw)
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for _ in loader:
            pass
    return dict(loader.report())


def test_a_cold_run_reports_no_warm_hits(small, tmp_path):
    store, _, _ = small
    report = _run(_dataset(store, str(tmp_path / "cache")), epochs=2, workers=2,
                  context="fork")
    cache = report["cache"]
    # its lookups hit the copies its own misses filled: none was there before it started
    assert cache["misses"] == len(_shards(store)) and cache["hits"] > 0
    assert cache["warm_hits"] == 0 and cache["warm_hit_bytes"] == 0
    assert report["manifest"]["warm_hits"] == 0 and report["manifest"]["warm_hit_bytes"] == 0


@pytest.mark.parametrize(
    ("workers", "context", "epochs"),
    [(0, None, 3), (2, "fork", 3), (2, "spawn", 2)],
)
def test_a_warm_run_counts_each_copy_once(small, tmp_path, workers, context, epochs):
    store, _, _ = small
    cache = str(tmp_path / "cache")
    _run(_dataset(store, cache), epochs=1)  # fills the cache
    shards = _shards(store)
    ds = _dataset(store, cache)
    report = _run(ds, epochs=epochs, workers=workers, context=context)
    c = report["cache"]
    assert c["misses"] == 0
    # every worker and epoch looked each shard up again...
    assert c["hits"] >= epochs * len(shards)
    # ...but each warm copy counts once for the job
    assert c["warm_hits"] == len(shards)
    assert c["warm_hit_bytes"] == sum(shards.values())
    assert report["manifest"]["warm_hits"] >= 1
    stats = ds.stats()
    assert stats["cache_warm_hits"] == len(shards)
    assert stats["cache_warm_hit_bytes"] == sum(shards.values())


def test_warm_copies_ride_a_callers_collate(small, tmp_path):
    """Workers handing single samples to a caller's collate: the batch keeps every
    sample's warm copies, not only its last sample's."""
    store, _, _ = small
    cache = str(tmp_path / "cache")
    _run(_dataset(store, cache), epochs=1)
    shards = _shards(store)
    report = _run(_dataset(store, cache), epochs=2, workers=2, context="fork",
                  collate_fn=lambda samples: [s["__key__"] for s in samples])
    assert report["cache"]["warm_hits"] == len(shards)
    assert report["cache"]["warm_hit_bytes"] == sum(shards.values())


@pytest.mark.parametrize("collate", [None, "callers"])
@pytest.mark.parametrize(("workers", "context"), [(0, None), (1, "fork"), (2, "fork")])
def test_drop_last_reads_and_reports_only_the_batches_it_delivers(small, tmp_path, workers,
                                                                   context, collate):
    """Found by an audit: with drop_last, a reader read its short last batch only to drop
    it, and the warm copies only that batch opened were never reported (they ride the
    batches): a warm run said a cold one would fetch 5 shards where it fetched 8."""
    store, _, _ = small  # 60 samples, 10 a shard, in key order without shuffling
    shards = _shards(store)
    fn = (lambda samples: [s["__key__"] for s in samples]) if collate else None
    ds = SimDataset(RemoteLikeStore(store), "sim", cache_dir=str(tmp_path / "cold"),
                    cache_limit="64MiB", shard_opener=open_test_shard, shuffle=False)
    cold = _run(ds, epochs=1, workers=workers, context=context, batch_size=33,
                drop_last=True, collate_fn=fn)
    # one batch of positions 0-32: the first four shards, not the last two
    assert cold["samples"] == 33
    assert cold["cache"]["misses"] == 4 < len(shards)
    warm_cache = str(tmp_path / "warm")
    _run(_dataset(store, warm_cache), epochs=1)  # every shard in the cache
    ds = SimDataset(RemoteLikeStore(store), "sim", cache_dir=warm_cache, cache_limit="64MiB",
                    shard_opener=open_test_shard, shuffle=False)
    warm = _run(ds, epochs=1, workers=workers, context=context, batch_size=33,
                drop_last=True, collate_fn=fn)
    assert warm["cache"]["warm_hits"] == cold["cache"]["misses"]
    assert warm["cache"]["warm_hit_bytes"] == cold["cache"]["fill_bytes"]


def test_a_copy_filled_during_the_run_is_not_warm(small, tmp_path):
    store, _, _ = small
    cache = str(tmp_path / "cache")
    ds = _dataset(store, cache)  # the job starts here
    time.sleep(0.01)
    _run(_dataset(store, cache), epochs=1)  # another job fills the cache meanwhile
    report = _run(ds, epochs=2, workers=2, context="fork")
    assert report["cache"]["misses"] == 0 and report["cache"]["hits"] > 0
    assert report["cache"]["warm_hits"] == 0 and report["cache"]["warm_hit_bytes"] == 0
    assert report["manifest"]["warm_hits"] == 0


def test_without_workers_warm_copies_count_once_over_iterations(small, tmp_path):
    """``SimDataset`` iterated directly, twice: one set per job."""
    store, _, _ = small
    cache = str(tmp_path / "cache")
    list(_dataset(store, cache))
    ds = _dataset(store, cache)
    for epoch in range(2):
        ds.set_epoch(epoch)
        list(ds)
    shards = _shards(store)
    report = ds.report()
    assert report["cache"]["hits"] == 2 * len(shards)
    assert report["cache"]["warm_hits"] == len(shards)
    assert report["cache"]["warm_hit_bytes"] == sum(shards.values())


# -- the cache's clocks ------------------------------------------------------------------


def _fill(cache: ShardCache, data: bytes) -> str:
    oid = hash_bytes(data)
    cache.acquire(oid, lambda: len(data), lambda out: out.write(data)).release()
    return oid


def _two_copies(tmp_path) -> tuple[Counters, ShardCache, str, str]:
    """A cache with room for two 1,000-byte copies and a half, and two copies in it."""
    counters = Counters()
    cache = ShardCache(CacheConfig(directory=str(tmp_path / "c"), limit_bytes=2500),
                       counters)
    return counters, cache, _fill(cache, b"a" * 1000), _fill(cache, b"b" * 1000)


def _age(path: str, seconds: int, now: int) -> None:
    """Set ``path``'s access and modification times to ``seconds`` before ``now`` (ns)."""
    os.utime(path, ns=(now - seconds * 10**9, now - seconds * 10**9))


def test_a_hit_keeps_the_fill_time_and_lru_evicts_the_least_recently_used(tmp_path):
    counters, cache, a, b = _two_copies(tmp_path)
    now = time.time_ns()
    # a was filled and used first, b later; neither used since
    for oid, ago in ((a, 100), (b, 50)):
        for path in (cache.path_of(oid), cache.used_path(oid)):
            _age(path, ago, now)
    before = os.stat(cache.path_of(a))
    hit = cache.peek(a)
    assert hit is not None
    hit.release()
    st = os.stat(cache.path_of(a))
    # the copy is not touched (its change time too: a later job recognises it) ...
    assert (st.st_mtime_ns, st.st_ctime_ns) == (before.st_mtime_ns, before.st_ctime_ns)
    # ... its use is marked beside it (now, by the file clock, which lags a little)
    assert os.stat(cache.used_path(a)).st_mtime_ns > now - 10 * 10**9
    _fill(cache, b"c" * 1000)  # room for one more: the least recently used goes
    assert os.path.exists(cache.path_of(a))  # filled first, but used last
    assert not os.path.exists(cache.path_of(b))
    assert not os.path.exists(cache.used_path(b))  # its clock went with it
    assert counters.snapshot()["cache_evictions"] == 1


def test_a_copy_without_a_use_file_ages_by_its_access_time(tmp_path):
    """A cache of an earlier version (no used/ files) evicts by the copies' access times,
    and a use file left behind by a copy that is gone is swept."""
    _, cache, a, b = _two_copies(tmp_path)
    os.unlink(cache.used_path(b))
    _age(cache.path_of(b), 100, time.time_ns())
    os.unlink(cache.path_of(a))
    orphan = cache.used_path(a)
    os.makedirs(os.path.dirname(orphan), exist_ok=True)
    open(orphan, "w").close()
    c = _fill(cache, b"c" * 1000)
    d = _fill(cache, b"d" * 1000)  # over the limit: b (oldest access time) goes
    assert not os.path.exists(cache.path_of(b))
    assert os.path.exists(cache.path_of(c)) and os.path.exists(cache.path_of(d))
    assert not os.path.exists(orphan)


def test_a_hit_on_a_copy_filled_before_the_job_is_warm_once(tmp_path):
    config = CacheConfig(directory=str(tmp_path / "c"), limit_bytes=1 << 20)
    old = _fill(ShardCache(config, Counters()), b"o" * 700)
    then = time.time_ns()
    os.utime(os.path.join(str(tmp_path / "c"), "objects", old[:2], old),
             ns=(then - 10**9, then - 10**9))
    counters = Counters()
    cache = ShardCache(config, counters, job_start=then / 1e9)
    new = _fill(cache, b"n" * 300)  # filled by this job
    for _ in range(3):
        for oid in (old, new):
            copy = cache.peek(oid)
            assert copy is not None
            copy.release()
    assert counters.snapshot()["cache_hits"] == 6
    # once, by the first 16 hex digits of its id, whatever the lookups
    assert counters.take_warm() == (("cache", old[:16], 700, 1),)  # its fill: one GET
    assert counters.take_warm() == ()
