"""Cost accounting, tiers and cache warming against a moto S3 server."""

from __future__ import annotations

import json

import pytest
from cost_helpers import commit

from simstore.accounting import (
    dataset_cost,
    disk_usage,
    read_price_table,
    run_cost,
    warm_cache,
)
from simstore.catalog import Catalog
from simstore.cost import OpClass, OpUsage
from simstore.hashing import hash_bytes, object_key
from simstore.storage import CountingStore
from simstore.storage._s3 import S3Store

pytestmark = pytest.mark.s3

FAST = {"backoff_base_s": 0.01, "backoff_max_s": 0.05, "read_timeout_s": 5}


@pytest.fixture
def s3_catalog(s3_bucket):
    store = S3Store(f"s3://{s3_bucket()}/data", storage_options=dict(FAST))
    yield Catalog.init(store)
    store.close()


def test_counting_store_counts_s3_requests(s3_catalog):
    store = CountingStore(s3_catalog.store)
    store.put("k", b"0123456789")
    assert store.get("k", (2, 5)) == b"234"
    assert store.get_many(["k", ("k", (0, 1))]) == [b"0123456789", b"0"]
    assert store.exists("k") and not store.exists("nope")
    assert list(store.list("k")) == ["k"]
    ops = store.traffic.tier("s3").ops
    assert ops[OpClass.PUT] == OpUsage(requests=1, bytes=10)
    assert ops[OpClass.RANGE_GET] == OpUsage(requests=2, bytes=4)
    assert ops[OpClass.GET] == OpUsage(requests=1, bytes=10)
    assert ops[OpClass.HEAD].requests == 2 and ops[OpClass.LIST].requests == 1


def test_counted_requests_match_what_the_server_saw(s3_bucket, fault_proxy):
    bucket = s3_bucket()
    store = S3Store(
        f"s3://{bucket}/p", storage_options={**FAST, "endpoint_url": fault_proxy.endpoint_url}
    )
    counting = CountingStore(store)
    counting.put("a", b"1")
    counting.get("a")
    counting.get("a", (0, 1))
    counting.info("a")
    before = len(fault_proxy.records)
    assert before == 4
    assert counting.traffic.tier("s3").requests == 4
    assert fault_proxy.count(None, "GET") == 2 and fault_proxy.count(None, "HEAD") == 1
    store.close()


def test_cost_du_and_pull_on_s3(s3_catalog, tmp_path):
    cat = s3_catalog
    s1 = commit(cat, "ds", {"a": b"a" * 1000, "b": b"b" * 2000})
    s2 = commit(cat, "ds", {"b": b"B" * 3000})
    report = dataset_cost(cat, "ds", read_price_table())
    assert report.store_tier == "s3"
    first, second = report.snapshots
    assert (first.snapshot_id, second.snapshot_id) == (s1, s2)
    assert second.shared.bytes == 1000 and second.missing == 0
    assert second.new.bytes == (
        cat.store.info(f"objects/{s2[:2]}/{s2}").size_bytes + cat.snapshot(s2).manifest_bytes + 3000
    )
    # branches, tags, then objects/ once
    assert sum(t.usage(OpClass.LIST).requests for t in report.read) == 3

    import simstore.loaders._cache as cache_mod
    import simstore.loaders._stats as stats_mod
    d = str(tmp_path / "hot")

    def open_cache(limit):
        return cache_mod.ShardCache(
            cache_mod.CacheConfig(directory=d, limit_bytes=limit), stats_mod.Counters()
        )

    pulled = warm_cache(cat, "ds", d, open_cache, max_workers=4)
    assert pulled.fetched == pulled.objects == 3 + len(cat.snapshot(s2).parts)
    gets = sum(t.usage(OpClass.GET).requests for t in pulled.read)
    assert gets >= pulled.objects
    usage = disk_usage(cat, "ds", cache=open_cache(1 << 30))
    s3_tier, hot = usage.tiers
    assert s3_tier.tier == "s3" and s3_tier.missing_objects == 0
    assert hot.objects == usage.objects and hot.bytes == usage.bytes
    with open(open_cache(1 << 30).path_of(hash_bytes(b"B" * 3000)), "rb") as f:
        assert f.read() == b"B" * 3000


def _ingest_and_pull(s3_catalog, tmp_path):
    """12 samples of dataset ``cfd`` over several shards, pulled into a cache; (dir, pull)."""
    import numpy as np

    import simstore

    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(0)
    for t in range(12):
        u = rng.standard_normal((8, 16, 16)).astype(np.float32)
        np.savez(src / f"t{t:03d}.npz", u=u, p=np.float64(t))
    simstore.ingest([str(src)], dataset="cfd", store=s3_catalog, format="parquet",
                    snapshot=True, message="m", shard_size=20_000)  # fmt: skip
    d = str(tmp_path / "hot")
    import simstore.loaders._cache as cache_mod
    import simstore.loaders._stats as stats_mod

    def open_cache(limit):
        return cache_mod.ShardCache(
            cache_mod.CacheConfig(directory=d, limit_bytes=limit), stats_mod.Counters()
        )

    return d, warm_cache(s3_catalog, "cfd", d, open_cache)


def test_pulled_cache_serves_a_whole_epoch_and_the_run_is_priced(s3_catalog, tmp_path):
    """pull, then a SimDataset over S3 with the same cache_dir reads no shard from S3."""
    from simstore.loaders import SimDataset

    d, pulled = _ingest_and_pull(s3_catalog, tmp_path)
    snap = s3_catalog.snapshot(pulled.snapshot)
    shards = pulled.objects - len(snap.parts) - 1  # less the snapshot object
    assert shards >= 2 and pulled.fetched == pulled.objects
    # the snapshot object comes from the pulled cache: the store may lose it now
    s3_catalog.store.delete(object_key(pulled.snapshot))

    ds = SimDataset(s3_catalog.store, "cfd", cache_dir=d, cache_limit=1 << 30, shuffle=False)
    keys = [s["__key__"] for s in ds]
    assert len(keys) == 12
    report = ds.report()
    assert report["cache"]["misses"] == 0 and report["cache"]["hits"] >= shards
    # nothing came from S3: the pulled manifest parts were cache hits too
    assert report["tiers"]["s3"] == {"bytes": 0, "requests": 0}
    assert report["manifest"]["cache_hits"] == report["manifest"]["parts"] > 0
    path = tmp_path / "run.json"
    path.write_text(json.dumps(report))
    cost = run_cost([str(path)], read_price_table())
    assert cost.cold_tier == "s3" and cost.cache_hits == report["cache"]["hits"]
    assert cost.cache_saved_usd > 0 and cost.cold_start_usd > cost.total_usd


def test_a_pinned_snapshot_in_the_cache_starts_without_the_store(s3_catalog, tmp_path):
    """REF by full snapshot id, all of it pulled: no request at all, so a dead endpoint
    streams the same epoch; a branch REF through that endpoint fails (it is dead)."""
    import socket

    import numpy as np
    from simstore.loaders import SimDataset

    from simstore.errors import StorageError

    d, pulled = _ingest_and_pull(s3_catalog, tmp_path)
    sid = pulled.snapshot

    def epoch(store, ref):
        ds = SimDataset(store, ref, cache_dir=d, cache_limit=1 << 30, shuffle=False)
        return ds, [(s["__key__"], s["u"].numpy()) for s in ds]

    _, live = epoch(s3_catalog.store, f"cfd@{sid}")
    with socket.socket() as sock:  # a loopback port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dead = S3Store(f"s3://{s3_catalog.store.bucket}/data", storage_options={
        **FAST, "endpoint_url": f"http://127.0.0.1:{port}", "max_attempts": 1,
        "connect_timeout_s": 1})
    try:
        ds, offline = epoch(dead, f"cfd@{sid.upper()}")
        assert ds.snapshot_id == sid and len(offline) == len(live) == 12
        for (k1, a1), (k2, a2) in zip(live, offline, strict=True):
            assert k1 == k2 and np.array_equal(a1, a2)
        assert ds.report()["tiers"]["s3"] == {"bytes": 0, "requests": 0}
        with pytest.raises(StorageError):
            epoch(dead, "cfd")  # the branch is asked of the store, which is not there
    finally:
        dead.close()
