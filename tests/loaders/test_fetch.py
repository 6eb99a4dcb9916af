"""Remote reads: the disk cache, ranged reads, verification, throttling, stats."""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import signal
import time

import numpy as np
import pytest
from loader_helpers import (
    RemoteLikeStore,
    assert_filled_again,
    commit_samples,
    corrupt_object,
    keys_of,
    make_samples,
    open_test_shard,
)
from simstore.loaders import PrefetchConfig, SimDataLoader, SimDataset
from simstore.loaders._cache import CacheConfig, ShardCache
from simstore.loaders._fetch import RateLimiter
from simstore.loaders._stats import Counters

from simstore.catalog import Catalog
from simstore.errors import FormatError, IntegrityError, InvalidInputError
from simstore.sample import Sample


def shard_ids(store):
    cat = Catalog.open(store)
    snap = cat.snapshot(cat.resolve("sim"))
    return sorted({r for t in cat.iter_parts(snap) for r in t.column("shard").to_pylist()})


def shard_bytes(store_path):
    return sum(os.path.getsize(os.path.join(store_path, "objects", s[:2], s))
               for s in shard_ids(store_path))


def remote_ds(store_path, **kw):
    kw.setdefault("shard_opener", open_test_shard)
    return SimDataset(RemoteLikeStore(store_path), "sim", **kw)


def test_cold_cache_reads_each_shard_once_then_hits(small, tmp_path):
    store, _, samples = small
    cache = str(tmp_path / "cache")
    ds = remote_ds(store, cache_dir=cache, cache_limit="1MiB")
    assert sorted(keys_of(ds)) == sorted(samples)
    stats = ds.stats()
    shards = len(shard_ids(store))
    assert stats["cache_misses"] == shards and stats["cache_hits"] == 0
    remote = stats["tiers"]["fake-remote"]
    manifest = stats["manifest_bytes"]
    assert remote["bytes"] - manifest == shard_bytes(store)  # exactly 1.0x the shards
    ds.set_epoch(1)
    list(ds)
    again = ds.stats()
    assert again["cache_hits"] == shards and again["cache_misses"] == shards
    # a warm epoch reads nothing from the remote tier: its manifest parts are cache hits too
    assert again["tiers"]["fake-remote"] == remote
    assert again["manifest_cache_hits"] == stats["manifest_parts"] > 0
    assert again["manifest_parts"] == 2 * stats["manifest_parts"]
    assert again["cache_hit_ratio"] == pytest.approx(0.5)


def test_cache_limit_smaller_than_a_shard_is_an_error(tmp_path, monkeypatch):
    store = str(tmp_path / "store")
    commit_samples(store, "sim", make_samples(20, size=4096), per_shard=10)  # 160 KiB shards
    monkeypatch.setenv("SIMSTORE_VERIFIED_DIR", "")  # no node rows: parts come via the cache
    shards = set(shard_ids(store))
    sizes = {name: os.path.getsize(os.path.join(d, name))
             for d, _, names in os.walk(os.path.join(store, "objects")) for name in names}
    catalog = max(n for i, n in sizes.items() if i not in shards)
    smallest = min(sizes[i] for i in shards)
    assert catalog < smallest
    ds = remote_ds(store, cache_dir=str(tmp_path / "c"), cache_limit=catalog)
    with pytest.raises(InvalidInputError, match=f"cache limit of {catalog} bytes is smaller "
                                                f"than shard objects/"):
        list(ds)
    # an object of the catalog's (the snapshot, a manifest part) is not called a shard
    ds = remote_ds(store, cache_dir=str(tmp_path / "d"), cache_limit=100)
    with pytest.raises(InvalidInputError, match="cache limit of 100 bytes is smaller than "
                                                "catalog object objects/"):
        list(ds)


def test_lru_eviction_keeps_the_cache_within_its_limit(small, tmp_path):
    store, _, samples = small
    one = max(os.path.getsize(os.path.join(store, "objects", s[:2], s)) for s in shard_ids(store))
    limit = int(2.5 * one)
    cache = str(tmp_path / "cache")
    few = PrefetchConfig(chunks=1, shards=1, max_open_shards=1, chunk_samples=4)
    ds = remote_ds(store, cache_dir=cache, cache_limit=limit, shuffle=False, prefetch=few)
    assert sorted(keys_of(ds)) == sorted(samples)
    c = ShardCache(CacheConfig(directory=cache, limit_bytes=limit), Counters())
    assert c.usage_bytes() <= limit
    assert ds.stats()["cache_evictions"] >= len(shard_ids(store)) - 3
    assert ds.stats()["cache_misses"] == len(shard_ids(store))


def test_an_opening_reader_finds_the_idle_ones_beyond_max_open_closed(small, tmp_path, monkeypatch):
    # loader.md sizes a cache for prefetch.shards + max_open_shards copies per process: an
    # idle reader past max_open_shards kept open while the next one opened pinned one more
    # (a cache sized by that rule went over its limit in 74 of 82 fills)
    from simstore.loaders import _readers

    opened_beside: list[int] = []
    plain = _readers.ReaderPool._open_entry

    def counting(self, key, entry, prepared):
        opened_beside.append(sum(1 for k, e in self._entries.items()
                                 if k != key and e.reader is not None))
        return plain(self, key, entry, prepared)

    monkeypatch.setattr(_readers.ReaderPool, "_open_entry", counting)
    store, _, samples = small
    few = PrefetchConfig(chunks=1, shards=1, max_open_shards=1, chunk_samples=4)
    ds = remote_ds(store, cache_dir=str(tmp_path / "cache"), cache_limit="1MiB",
                   shuffle=False, prefetch=few)
    assert sorted(keys_of(ds)) == sorted(samples)
    assert len(opened_beside) >= len(shard_ids(store))
    assert max(opened_beside) == 0  # max_open_shards=1: the one open reader is the new one


def test_cache_refuses_a_foreign_directory_and_keeps_foreign_files(small, tmp_path):
    store, _, _ = small
    foreign = tmp_path / "home"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("precious")
    with pytest.raises(InvalidInputError, match="not a simstore cache"):
        list(remote_ds(store, cache_dir=str(foreign), cache_limit="1MiB"))
    cache = tmp_path / "cache"
    list(remote_ds(store, cache_dir=str(cache), cache_limit=8000))  # forces evictions
    stray = cache / "objects" / "ab" / "notes.txt"
    stray.parent.mkdir(parents=True, exist_ok=True)
    stray.write_text("not a cache copy")
    list(remote_ds(store, cache_dir=str(cache), cache_limit=8000, seed=9))
    assert stray.read_text() == "not a cache copy"
    assert (foreign / "thesis.tex").read_text() == "precious"


def test_a_cache_and_a_store_never_share_a_directory(small, tmp_path):
    """A store made in a cache directory lost its objects to the cache's eviction (both
    keep them under objects/): neither may be made where the other is."""
    store, _, samples = small
    cache = tmp_path / "cache"
    list(remote_ds(store, cache_dir=str(cache), cache_limit="1MiB"))
    with pytest.raises(InvalidInputError, match="is a loader's disk cache"):
        Catalog.init(str(cache))
    assert not (cache / "simstore.json").exists()
    # a store made there by other means (an older simstore): the cache refuses it
    Catalog.init(str(tmp_path / "elsewhere"))
    os.replace(tmp_path / "elsewhere" / "simstore.json", cache / "simstore.json")
    copies = sorted(p.name for p in (cache / "objects").rglob("*") if p.is_file())
    with pytest.raises(InvalidInputError, match="holds a simstore store"):
        list(remote_ds(store, cache_dir=str(cache), cache_limit=8000))  # would evict
    assert sorted(p.name for p in (cache / "objects").rglob("*") if p.is_file()) == copies
    assert sorted(keys_of(remote_ds(store, cache_dir=str(tmp_path / "c2"),
                                    cache_limit="1MiB"))) == sorted(samples)


def test_a_relative_cache_dir_stays_one_cache_after_a_chdir(small, tmp_path, monkeypatch):
    store, _, samples = small
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    ds = remote_ds(store, cache_dir="cache", cache_limit="1MiB")  # claims a/cache
    monkeypatch.chdir(tmp_path / "b")
    assert sorted(keys_of(ds)) == sorted(samples)
    assert not (tmp_path / "b" / "cache").exists()  # filled where it was claimed
    filled = {p.name for p in (tmp_path / "a" / "cache" / "objects").rglob("*") if p.is_file()}
    assert set(shard_ids(store)) <= filled  # with the snapshot and its manifest part


def test_corrupt_shard_on_cache_fill_names_the_object(small, tmp_path):
    store, _, _ = small
    bad = shard_ids(store)[2]
    corrupt_object(store, bad)
    ds = remote_ds(store, cache_dir=str(tmp_path / "cache"), cache_limit="1MiB")
    with pytest.raises(IntegrityError, match=f"objects/{bad[:2]}/{bad} has hash .* expected {bad}"
                       ) as info:
        list(ds)
    assert str(info.value).startswith("fake-remote://")  # which store's object: a mixture's
    assert not os.path.exists(tmp_path / "cache" / "objects" / bad[:2] / bad)


def test_corrupt_local_shard_names_the_object_and_snapshot(small):
    store, ref, _ = small
    bad = shard_ids(store)[0]
    corrupt_object(store, bad)
    ds = SimDataset(store, ref, shard_opener=open_test_shard)
    with pytest.raises(IntegrityError, match=f"{bad}.*referenced by snapshot {ds.snapshot_id}"):
        list(ds)


def test_unreadable_shard_without_verification_is_a_format_error(small):
    store, ref, _ = small
    bad = shard_ids(store)[1]
    path = os.path.join(store, "objects", bad[:2], bad)
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 3)
    ds = SimDataset(store, ref, shard_opener=open_test_shard, verify=False)
    with pytest.raises(FormatError, match=f"shard objects/{bad[:2]}/{bad}"):
        list(ds)


@pytest.mark.multiprocess
def test_worker_errors_reach_the_parent_and_pickle(small):
    store, ref, _ = small
    bad = shard_ids(store)[0]
    corrupt_object(store, bad)
    ds = SimDataset(store, ref, shard_opener=open_test_shard)
    loader = SimDataLoader(ds, batch_size=4, num_workers=1, multiprocessing_context="fork")
    with pytest.raises(IntegrityError, match=bad) as info:
        list(loader)
    again = pickle.loads(pickle.dumps(info.value))
    assert type(again) is IntegrityError and bad in str(again)


def big_samples(n, size):
    rng = np.random.default_rng(0)
    return [
        Sample(key=f"k{i:04d}", fields={
            "big": rng.standard_normal(size).astype(np.float32),
            "small": np.full(2, i, dtype=np.int32),
        })
        for i in range(n)
    ]


def test_ranged_reads_fetch_only_the_projected_fields(store_path):
    commit_samples(store_path, "sim", big_samples(8, 128 * 1024), per_shard=8)  # 4 MiB of big
    full = remote_ds(store_path)
    list(full)
    part = remote_ds(store_path, fields=["small"])
    got = list(part)
    assert set(got[0]) == {"small", "__key__", "__pad__"}
    b_full = full.stats()["tiers"]["fake-remote"]
    b_part = part.stats()["tiers"]["fake-remote"]
    assert b_part["bytes"] < 0.5 * b_full["bytes"]
    # 8 reads of 512 KiB each of 'big', coalesced into a few ranged requests
    assert b_full["requests"] < 8


def test_rate_limiter_waits_for_tokens():
    now = [0.0]
    slept = []

    def sleep(s):
        slept.append(s)
        now[0] += s

    lim = RateLimiter(1000.0, burst_s=0.5, clock=lambda: now[0], sleep=sleep)
    assert lim.take(500) == 0  # the burst allowance
    assert lim.take(1000) == pytest.approx(1.0)
    now[0] += 2.0
    assert lim.take(200) == 0
    assert RateLimiter(None).take(10**9) == 0


def test_max_bandwidth_throttles_reads(store_path, paced_limiters):
    commit_samples(store_path, "sim", big_samples(8, 64 * 1024), per_shard=4)  # 2 MiB
    ds = remote_ds(store_path, max_bandwidth="1MiB")
    assert len(list(ds)) == 8
    stats = ds.stats()
    (limiter,) = paced_limiters.made  # one reader: the whole cap
    assert limiter.rate == 1 << 20 and limiter.burst == (1 << 20) / 4
    # every byte read from the remote tier went through the cap
    assert paced_limiters.taken >= stats["tiers"]["fake-remote"]["bytes"] - stats["manifest_bytes"]
    assert paced_limiters.taken >= shard_bytes(store_path)
    # and once: the decoded values of a ranged read are not charged again (an audit: a job
    # without a cache read at half its cap)
    assert paced_limiters.taken <= stats["tiers"]["fake-remote"]["bytes"]
    # the reader waited for what the burst did not cover, and the stats say so
    assert stats["throttle_s"] == pytest.approx(paced_limiters.waited)
    assert paced_limiters.waited >= (paced_limiters.taken - limiter.burst) / limiter.rate - 1e-9


def test_max_bandwidth_paces_the_whole_shard_hash_of_a_local_shard(store_path):
    """A projected read decodes few bytes, but verifying a local shard reads all of it:
    the cap applies to that read too, window by window."""
    from simstore.loaders._fetch import ShardAccess

    from simstore.storage import open_store

    commit_samples(store_path, "sim", big_samples(8, 64 * 1024), per_shard=4)
    cat = Catalog.open(store_path)
    snap = cat.snapshot(cat.resolve("sim"))
    shard = sorted({s for t in cat.iter_parts(snap) for s in t.column("shard").to_pylist()})[0]
    store = open_store(store_path)
    size = store.info(f"objects/{shard[:2]}/{shard}").size_bytes
    now, slept = [0.0], []

    def sleep(seconds):
        slept.append(seconds)
        now[0] += seconds

    rate = 64 * 1024.0
    limiter = RateLimiter(rate, burst_s=0.0, clock=lambda: now[0], sleep=sleep)
    counters = Counters()
    access = ShardAccess(store, counters=counters, limiter=limiter, cache=None, verify=True)
    assert access.mode(shard) == "local"
    access.prepare(shard)  # the whole-shard hash
    assert sum(slept) == pytest.approx(size / rate)
    assert counters.snapshot()["throttle_s"] == pytest.approx(size / rate)


def test_stats_and_report(small, tmp_path):
    store, _, _ = small
    ds = remote_ds(store, cache_dir=str(tmp_path / "cache"), cache_limit="1MiB")
    n = 0
    started = time.perf_counter()
    for _ in ds:
        n += 1
    around = time.perf_counter() - started
    stats = ds.stats()
    assert stats["samples"] == n == 60
    # the loader's own clocks run inside the loop this test timed around it
    assert 0 < stats["time_to_first_batch_s"] <= stats["seconds"] <= around
    assert stats["samples_per_s"] == pytest.approx(n / stats["seconds"])  # the reported rate
    assert 0 <= stats["data_stall"] <= 1
    report = json.loads(json.dumps(ds.report()))
    assert report["kind"] == "simstore-loader-report" and report["epochs"] == [0]
    assert report["snapshots"] == [ds.snapshot_id]
    assert report["cache"]["misses"] == stats["cache_misses"]
    assert set(report["tiers"]) == {"fake-remote", "cache"}
    assert report["tiers"]["fake-remote"]["requests"] > 0


def _fill_slowly(cache_dir, oid, data, ready):
    cache = ShardCache(CacheConfig(directory=cache_dir, limit_bytes=1 << 20), Counters())

    def download(out):
        out.write(data[:10])
        ready.set()
        time.sleep(60)

    cache.acquire(oid, lambda: len(data), download)


@pytest.mark.multiprocess
def test_a_killed_fill_leaves_nothing_that_blocks_the_next(tmp_path):
    from simstore.hashing import hash_bytes

    data = b"x" * 5000
    oid = hash_bytes(data)
    cache_dir = str(tmp_path / "cache")
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    p = ctx.Process(target=_fill_slowly, args=(cache_dir, oid, data, ready))
    p.start()
    assert ready.wait(30)
    assert os.listdir(os.path.join(cache_dir, "tmp"))  # a fill in progress
    os.kill(p.pid, signal.SIGKILL)
    p.join()
    cache = ShardCache(CacheConfig(directory=cache_dir, limit_bytes=1 << 20), Counters())
    assert os.listdir(os.path.join(cache_dir, "tmp")) == []  # the dead fill swept
    copy = cache.acquire(oid, lambda: len(data), lambda out: out.write(data))
    with open(copy.path, "rb") as f:
        assert not copy.hit and f.read() == data
    copy.release()


def _acquire(cache_dir, oid, data, barrier, results):
    counters = Counters()
    cache = ShardCache(CacheConfig(directory=cache_dir, limit_bytes=1 << 20), counters)
    barrier.wait()

    def download(out):
        time.sleep(0.2)
        out.write(data)

    copy = cache.acquire(oid, lambda: len(data), download)
    results.put(copy.hit)
    copy.release()


@pytest.mark.multiprocess
def test_processes_filling_one_shard_download_it_once(tmp_path):
    from simstore.hashing import hash_bytes

    data = os.urandom(4000)
    oid = hash_bytes(data)
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(3), ctx.Queue()
    procs = [ctx.Process(target=_acquire, args=(str(tmp_path / "c"), oid, data, barrier, results))
             for _ in range(3)]
    for p in procs:
        p.start()
    hits = sorted(results.get(timeout=30) for _ in procs)
    for p in procs:
        p.join()
    assert hits == [False, True, True]


def test_pinned_copies_are_not_evicted(tmp_path):
    from simstore.hashing import hash_bytes

    cache = ShardCache(CacheConfig(directory=str(tmp_path / "c"), limit_bytes=3000), Counters())
    blobs = [bytes([i]) * 1000 for i in range(4)]
    held = [cache.acquire(hash_bytes(b), lambda b=b: len(b), lambda out, b=b: out.write(b))
            for b in blobs]
    # four pinned copies of 1000 bytes exceed the 3000-byte limit: over, but no deadlock
    assert all(os.path.exists(h.path) for h in held)
    assert cache.counters.snapshot()["cache_over_limit"] >= 1
    for h in held:
        h.release()
    extra = b"z" * 1000
    cache.acquire(hash_bytes(extra), lambda: 1000, lambda out: out.write(extra)).release()
    assert cache.usage_bytes() <= 3000


def _claim(cache_dir, barrier, results):
    barrier.wait()
    try:
        ShardCache(CacheConfig(directory=cache_dir, limit_bytes=1 << 20), Counters())
        results.put("ok")
    except Exception as exc:  # reported to the test
        results.put(repr(exc))


@pytest.mark.multiprocess
def test_workers_claiming_a_new_cache_directory_together_all_succeed(tmp_path):
    ctx = multiprocessing.get_context("fork")
    for attempt in range(5):
        barrier, results = ctx.Barrier(3), ctx.Queue()
        cache_dir = str(tmp_path / f"c{attempt}")
        procs = [ctx.Process(target=_claim, args=(cache_dir, barrier, results))
                 for _ in range(3)]
        for p in procs:
            p.start()
        outcomes = [results.get(timeout=30) for _ in procs]
        for p in procs:
            p.join()
        assert outcomes == ["ok"] * 3
    # a claim writes the marker before any folder, so no worker mid-claim leaves folders
    # without one: such a directory is someone else's (a copy of a store's objects/)
    half = tmp_path / "half"
    (half / "objects").mkdir(parents=True)
    with pytest.raises(InvalidInputError, match="not a simstore cache"):
        ShardCache(CacheConfig(directory=str(half), limit_bytes=1 << 20), Counters())
    assert not (half / "simstore-cache.json").exists()


def test_memory_store_reads_ranged_and_through_the_cache(tmp_path):
    url = f"memory://loader-{tmp_path.name}"
    samples = make_samples(30)
    commit_samples(url, "sim", samples, per_shard=7)
    ranged = SimDataset(url, "sim", shard_opener=open_test_shard)
    assert sorted(keys_of(ranged)) == sorted(s.key for s in samples)
    assert ranged.stats()["tiers"]["memory"]["requests"] > 0
    cached = SimDataset(url, "sim", shard_opener=open_test_shard,
                        cache_dir=str(tmp_path / "c"), cache_limit="1MiB")
    assert sorted(keys_of(cached)) == sorted(s.key for s in samples)
    assert cached.stats()["cache_misses"] == 5


def test_a_warm_reports_hit_bytes_are_the_copies_a_cold_run_fetched(small, tmp_path):
    from simstore.cost import parse_run_report

    store, _, _ = small
    cache = str(tmp_path / "cache")
    cold = remote_ds(store, cache_dir=cache, cache_limit="1MiB")
    list(cold)
    warm = remote_ds(store, cache_dir=cache, cache_limit="1MiB")
    list(warm)
    cold_report = json.loads(json.dumps(cold.report()))
    warm_report = json.loads(json.dumps(warm.report()))
    assert cold_report["cache"]["misses"] == 6 and cold_report["cache"]["hit_bytes"] == 0
    assert warm_report["cache"]["hits"] == 6 and warm_report["cache"]["misses"] == 0
    # every hit found a copy of the size a miss fetched: no more, whatever the reader
    # decoded or hashed from it (the cache tier's bytes count those)
    assert warm_report["cache"]["hit_bytes"] == cold_report["cache"]["fill_bytes"]
    assert warm_report["cache"]["hit_bytes"] == shard_bytes(store)
    usage = parse_run_report(warm_report)
    assert usage.cache_hit_bytes == shard_bytes(store) and not usage.hit_bytes_estimated


@pytest.mark.parametrize("workers", [0, 2])
def test_later_epochs_trust_unchanged_cache_copies_and_hash_changed_ones(small, tmp_path,
                                                                        workers):
    store, _, samples = small
    cache = str(tmp_path / "cache")
    shards = len(shard_ids(store))
    ds = remote_ds(store, cache_dir=cache, cache_limit="1MiB", shuffle=False)
    loader = SimDataLoader(ds, batch_size=4, num_workers=workers,
                           multiprocessing_context="fork" if workers else None)
    for epoch in range(2):  # the first fills the cache, the second hits it
        ds.set_epoch(epoch)
        assert sorted(keys_of(loader)) == sorted(samples)
    hashed = ds.stats()["shards_hashed"]
    ds.set_epoch(2)  # unchanged copies: trusted, not hashed again
    assert sorted(keys_of(loader)) == sorted(samples)
    stats = ds.stats()
    assert stats["shards_hashed"] == hashed and stats["shards_trusted"] >= shards
    # a copy rewritten in place (a new modification time) is hashed again, caught, taken
    # out and read again from the store
    victim = os.path.join(cache, "objects", shard_ids(store)[0][:2], shard_ids(store)[0])
    os.chmod(victim, 0o644)
    with open(victim, "r+b") as f:
        f.seek(40)
        byte = f.read(1)
        f.seek(40)
        f.write(bytes([byte[0] ^ 0xFF]))
    ds.set_epoch(3)
    assert sorted(keys_of(loader)) == sorted(samples)
    assert ds.stats()["cache_damaged"] == 1  # once, by the worker that took it out
    assert_filled_again(cache, shard_ids(store)[0])


def test_a_cold_first_chunk_schedules_the_shards_after_it_while_it_waits(small, tmp_path,
                                                                         monkeypatch):
    """A first chunk that waits for downloads into the cache lets the fetches of the
    windows after it be scheduled meanwhile (the last shards of a cold epoch used to be
    fetched one at a time after the first batch); a warm cache's first chunk does not."""
    import simstore.loaders._pipeline as pipeline_mod

    store, _, samples = small
    scheduled: list[str] = []
    plain = pipeline_mod.ReaderPool.schedule

    def spy(self, key, pool):
        if key[1] not in scheduled:
            scheduled.append(key[1])
        return plain(self, key, pool)

    monkeypatch.setattr(pipeline_mod.ReaderPool, "schedule", spy)
    cache = str(tmp_path / "cache")
    at_first = {}
    for run in ("cold", "warm"):
        scheduled.clear()
        # GETs of 20 ms: the first chunk's fills are still running when it is checked
        ds = SimDataset(RemoteLikeStore(store, delay_s=0.02), "sim", cache_dir=cache,
                        cache_limit="1MiB", window_shards=2, prefetch={"chunk_samples": 4},
                        seed=3, shard_opener=open_test_shard)
        it = iter(SimDataLoader(ds, batch_size=4, num_workers=0))
        got = list(next(it)["__key__"])
        at_first[run] = len(scheduled)
        got.extend(k for b in it for k in b["__key__"])
        assert sorted(got) == sorted(samples)
        assert ds.stats()["cache_misses"] == (6 if run == "cold" else 0)
    # six shards, windows of two: cold, every shard is asked for before the first batch
    assert at_first["cold"] == 6
    assert at_first["warm"] < 6


@pytest.mark.parametrize("cached", [False, True])
def test_a_missing_manifest_part_is_damage_naming_the_snapshot(small, tmp_path, cached):
    """The snapshot names the part: gone, it is damage (exit 6 in the CLI's terms), not an
    unknown object, and the error says which snapshot needs it."""
    store, _, _ = small
    cat = Catalog.open(store)
    sid = cat.resolve("sim")
    part = cat.snapshot(sid).parts[0].id
    os.unlink(os.path.join(store, "objects", part[:2], part))
    kw = {"cache_dir": str(tmp_path / "cache"), "cache_limit": "1MiB"} if cached else {}
    with pytest.raises(IntegrityError, match=rf"{part} is missing; referenced by snapshot "
                                             rf"{sid}"):
        list(remote_ds(store, **kw))


@pytest.mark.parametrize("cached", [False, True])
def test_a_branch_naming_another_datasets_snapshot_is_refused_by_a_remote_read(
    small, tmp_path, cached
):
    """The loader reads a remote snapshot from its disk cache, not through the catalog's
    check: it checks the ref's dataset itself (a branch file overwritten with another
    dataset's served that dataset's samples)."""
    store, _, _ = small
    commit_samples(store, "other", make_samples(5, seed=1), per_shard=5)
    theirs = Catalog.open(store).resolve("other@main")
    with open(os.path.join(store, "datasets", "other", "refs", "heads", "main"), "rb") as f:
        data = f.read()
    ours = os.path.join(store, "datasets", "sim", "refs", "heads", "main")
    os.chmod(ours, 0o644)
    with open(ours, "wb") as f:
        f.write(data)
    kw = {"cache_dir": str(tmp_path / "cache"), "cache_limit": "1MiB"} if cached else {}
    with pytest.raises(IntegrityError, match=rf"names snapshot {theirs} of dataset 'other', "
                                             r"not of 'sim'"):
        remote_ds(store, **kw)
