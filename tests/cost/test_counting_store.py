"""CountingStore: a conforming ObjectStore that counts requests and bytes per tier."""

from __future__ import annotations

import os
import pickle
import threading
import uuid

import fsspec
import pytest

from simstore.catalog import Catalog
from simstore.cost import OpClass, OpUsage
from simstore.errors import ConflictError, InvalidInputError, NotFoundError, ReadOnlyError
from simstore.storage import CountingStore, FsspecStore, LocalStore, Traffic, tier_of_url
from simstore.storage._counting import LIST_PAGE_KEYS, usage_from_json
from simstore.testing import ObjectStoreTests


class TestCountingLocal(ObjectStoreTests):
    @pytest.fixture
    def store(self, tmp_path):
        return CountingStore(LocalStore(str(tmp_path / "store")))

    def read_only_copy(self, store):
        return CountingStore(LocalStore(store.inner.root, read_only=True))

    def raw_get(self, store, key):
        with open(os.path.join(store.inner.root, *key.split("/")), "rb") as f:
            return f.read()

    def raw_put(self, store, key, data):
        path = os.path.join(store.inner.root, *key.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)


class TestCountingMemory(ObjectStoreTests):
    @pytest.fixture
    def store(self):
        return CountingStore(FsspecStore(f"memory://count-{uuid.uuid4().hex}"))

    def read_only_copy(self, store):
        return CountingStore(FsspecStore(store.url, read_only=True))

    def raw_get(self, store, key):
        return fsspec.filesystem("memory").cat_file(f"{store.inner.root}/{key}")

    def raw_put(self, store, key, data):
        fsspec.filesystem("memory").pipe_file(f"{store.inner.root}/{key}", data)


@pytest.fixture
def counted():
    return CountingStore(FsspecStore(f"memory://count-{uuid.uuid4().hex}"), tier="s3")


def _ops(store, tier=None):
    return store.traffic.tier(tier or store.tier).ops


def test_each_call_is_counted_in_its_class(counted, tmp_path):
    counted.put("a", b"12345")
    counted.put_if_absent("b", b"xy")
    counted.put_if_absent("b", b"xy")
    src = tmp_path / "f"
    src.write_bytes(b"abcdefgh")
    counted.put_file("c", str(src))
    assert counted.get("a") == b"12345"
    assert counted.get("a", (1, 3)) == b"23"
    counted.get_versioned("a")
    counted.exists("a")
    counted.info("a")
    version = counted.compare_and_swap("ref", None, b"r1")
    counted.compare_and_swap("ref", version, None)
    counted.delete("a")
    assert sorted(counted.list()) == ["b", "c"]
    ops = _ops(counted)
    assert ops[OpClass.PUT] == OpUsage(requests=5, bytes=5 + 2 + 2 + 8 + 2)
    assert ops[OpClass.GET] == OpUsage(requests=2, bytes=10)
    assert ops[OpClass.RANGE_GET] == OpUsage(requests=1, bytes=2)
    assert ops[OpClass.HEAD] == OpUsage(requests=2, bytes=0)
    assert ops[OpClass.DELETE] == OpUsage(requests=2, bytes=0)
    assert ops[OpClass.LIST] == OpUsage(requests=1, bytes=0)


def test_failed_requests_count_but_local_refusals_do_not(counted):
    with pytest.raises(NotFoundError):
        counted.get("missing")
    with pytest.raises(NotFoundError):
        counted.info("missing")
    assert _ops(counted)[OpClass.GET] == OpUsage(requests=1, bytes=0)
    assert _ops(counted)[OpClass.HEAD] == OpUsage(requests=1, bytes=0)
    counted.put("ref", b"v1")
    with pytest.raises(ConflictError):
        counted.compare_and_swap("ref", "not-the-version", b"v2")
    assert _ops(counted)[OpClass.PUT] == OpUsage(requests=2, bytes=4)
    with pytest.raises(InvalidInputError):
        counted.put("../escape", b"x")
    read_only = CountingStore(FsspecStore(counted.url, read_only=True))
    with pytest.raises(ReadOnlyError):
        read_only.put("k", b"x")
    with pytest.raises(ReadOnlyError):
        read_only.delete("k")
    assert _ops(counted)[OpClass.PUT].requests == 2
    assert read_only.traffic.usage() == ()


def test_listing_counts_one_request_per_page(counted):
    inner = counted.inner
    n = 2 * LIST_PAGE_KEYS + 1
    for i in range(n):
        inner.put(f"k/{i:05d}", b"")
    assert len(list(counted.list_info("k/"))) == n
    assert _ops(counted)[OpClass.LIST].requests == 3
    counted.traffic.reset()
    assert len(list(counted.list("k/0000"))) == 10
    assert _ops(counted)[OpClass.LIST].requests == 1


def test_get_many_uses_the_fast_path_and_counts_each(counted):
    calls = []

    class Fast(FsspecStore):
        def get_many(self, items, *, max_workers=8):
            calls.append(len(items))
            return [self.get(k, r) for k, r in items]

    store = CountingStore(Fast(f"memory://fast-{uuid.uuid4().hex}"), tier="s3")
    store.inner.put("x", b"0123456789")
    assert store.get_many(["x", ("x", (0, 4))]) == [b"0123456789", b"0123"]
    assert calls == [2]
    ops = _ops(store)
    assert ops[OpClass.GET] == OpUsage(requests=1, bytes=10)
    assert ops[OpClass.RANGE_GET] == OpUsage(requests=1, bytes=4)
    # without a fast path it reads one by one, counted the same way
    counted.inner.put("x", b"abc")
    assert counted.get_many(["x", "x"]) == [b"abc", b"abc"]
    assert _ops(counted)[OpClass.GET] == OpUsage(requests=2, bytes=6)


def test_shared_meter_keeps_tiers_apart(tmp_path):
    traffic = Traffic()
    cold = CountingStore(FsspecStore(f"memory://c-{uuid.uuid4().hex}"), traffic=traffic)
    hot = CountingStore(LocalStore(str(tmp_path / "hot")), tier="cache", traffic=traffic)
    cold.put("k", b"1234")
    hot.put("k", b"12")
    hot.get("k")
    assert [t.tier for t in traffic.usage()] == ["cache", "memory"]
    assert traffic.tier("memory").bytes_written == 4
    assert traffic.tier("cache").bytes_read == 2
    assert traffic.tier("nothing").requests == 0
    assert usage_from_json(traffic.to_json()) == traffic.usage()


def test_concurrent_counting_loses_nothing(counted):
    counted.inner.put("k", b"abc")
    threads = [
        threading.Thread(target=lambda: [counted.get("k") for _ in range(200)]) for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert _ops(counted)[OpClass.GET] == OpUsage(requests=1600, bytes=4800)


def test_pickle_carries_counts_and_a_working_meter(counted):
    counted.inner.put("k", b"abc")
    counted.get("k")
    clone = pickle.loads(pickle.dumps(counted))
    assert clone.tier == "s3"
    assert clone.traffic.usage() == counted.traffic.usage()
    clone.get("k")
    assert _ops(clone)[OpClass.GET].requests == 2
    assert _ops(counted)[OpClass.GET].requests == 1  # each process counts its own
    counted.traffic.add(clone.traffic.usage())
    assert _ops(counted)[OpClass.GET].requests == 3


def test_catalog_runs_through_a_counting_store(tmp_path):
    store = CountingStore(LocalStore(str(tmp_path / "s")))
    cat = Catalog.init(store)
    assert cat.check_initialised()["conditional_writes"] is True
    opened = Catalog.open(store)
    assert opened.store is store
    assert store.traffic.tier("local").requests >= 3
    store.supports_atomic_cas = False
    assert store.inner.supports_atomic_cas is False


@pytest.mark.parametrize(
    ("url", "tier"),
    [
        ("s3://b/p", "s3"),
        ("s3a://b", "s3"),
        ("gs://b", "gcs"),
        ("memory://x", "memory"),
        ("file:///x", "local"),
        ("/data/store", "local"),
        ("abfs://c", "abfs"),
    ],
)
def test_tier_of_url(url, tier):
    assert tier_of_url(url) == tier


def test_resolving_a_branch_or_a_tag_costs_its_lookups_and_the_snapshot_once(counted):
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "catalog"))
    from catalog_helpers import stage_samples

    cat = Catalog.init(counted)
    stage_samples(cat, "ds", {"a": b"1"})
    sid = cat.commit("ds", message="m").snapshot_id
    cat.tags("ds").create("v1", sid)
    fresh = Catalog.open(counted)
    counted.traffic.reset()
    assert fresh.resolve("ds@main") == sid
    fresh.snapshot(sid)  # what a reader does next: read from the cache
    ops = _ops(counted)
    # the branch, then its snapshot (read to check it is this dataset's): nothing else
    assert ops[OpClass.GET].requests == 2 and sum(u.requests for u in ops.values()) == 2
    counted.traffic.reset()
    assert fresh.resolve("ds@v1") == sid
    ops = _ops(counted)
    # the branch of that name first (a miss), then the tag: no HEAD before the tag's GET
    assert ops[OpClass.GET].requests == 2 and sum(u.requests for u in ops.values()) == 2
