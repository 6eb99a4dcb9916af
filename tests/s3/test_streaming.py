"""Whole-object streaming reads from S3 and the loader's cache fills that use them.

Against moto on 127.0.0.1, directly and through the fault proxy: one GET per object,
resumption after a body cut short, clear failures, verified fills, counters and
throttling.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from simstore.catalog import Catalog
from simstore.errors import IntegrityError, NotFoundError, StorageError
from simstore.hashing import object_key
from simstore.ingest import ingest
from simstore.storage._s3 import S3Store
from simstore.testing.s3 import FAKE_ACCESS_KEY, make_s3_client

pytestmark = pytest.mark.s3

MiB = 1024 * 1024
FAST: dict[str, Any] = {"backoff_base_s": 0.01, "backoff_max_s": 0.05, "read_timeout_s": 5}
BucketFactory = Callable[[], str]


def read_all(reader: Any, block: int = 64 * 1024) -> bytes:
    out = bytearray()
    buf = memoryview(bytearray(block))
    while n := reader.readinto(buf):
        out += buf[:n]
    return bytes(out)


def test_open_read_streams_the_whole_object_with_one_get(store):
    data = os.urandom(3 * MiB + 17)
    store.put("objects/big", data)
    with store.open_read("objects/big") as reader:
        assert reader.size_bytes == len(data)
        assert read_all(reader) == data
        assert reader.readinto(bytearray(10)) == 0  # at the end
        assert reader.requests == 1
    store.put("objects/empty", b"")
    with store.open_read("objects/empty") as reader:
        assert reader.size_bytes == 0 and read_all(reader) == b""


def test_readinto_receives_straight_into_the_buffer_and_gives_the_connection_back(store):
    objects = {f"objects/o{i}": os.urandom(MiB + 1000 * i) for i in range(3)}
    for key, data in objects.items():
        store.put(key, data)
    store.get("objects/o0", byte_range=(0, 1))  # the client and its first connection
    endpoint = store._api._endpoint
    pool = endpoint.http_session._manager.connection_from_url(endpoint.host)
    opened = pool.num_connections
    for key, data in objects.items():
        with store.open_read(key) as reader:
            # a plain body from moto takes the direct way (urllib3's response beneath)
            assert reader._receiver() is not None
            assert read_all(reader, block=256 * 1024) == data
            assert reader.requests == 1
    # each whole body read went back to the pool: the next GET reused its connection
    assert pool.num_connections == opened


def test_open_read_of_a_missing_object_is_not_found(store):
    with pytest.raises(NotFoundError, match=f"{store.url}: no object objects/none"):
        store.open_read("objects/none")


def test_a_body_cut_short_is_resumed_where_it_stopped(store, proxied, fault_proxy):
    data = os.urandom(2 * MiB + 5)
    store.put("objects/cut", data)
    fault_proxy.fail_next("truncate", "truncate", methods=["GET"])
    with proxied.open_read("objects/cut") as reader:
        assert read_all(reader) == data
        assert reader.requests == 3  # the first GET, and a ranged GET after each cut
    assert fault_proxy.count("truncate") == 2
    assert fault_proxy.count(None, "GET") == 1  # the third answered in full


def test_a_dropped_connection_at_the_start_is_retried(store, proxied, fault_proxy):
    data = os.urandom(MiB)
    store.put("objects/drop", data)
    fault_proxy.fail_next("drop", "slowdown", methods=["GET"])
    with proxied.open_read("objects/drop") as reader:
        assert read_all(reader) == data


def test_a_body_that_keeps_failing_fails_clearly(s3_bucket, fault_proxy):
    bucket = s3_bucket()
    opts = {**FAST, "max_attempts": 3}
    S3Store(f"s3://{bucket}/r", storage_options=opts).put("objects/x", os.urandom(MiB))
    flaky = S3Store(
        f"s3://{bucket}/r", storage_options={**opts, "endpoint_url": fault_proxy.endpoint_url}
    )
    fault_proxy.fail_next("truncate", methods=["GET"])
    fault_proxy.fail_share(1.0, "drop", seed=0, methods=["GET"])  # every resumption fails
    with flaky.open_read("objects/x") as reader:
        with pytest.raises(StorageError) as info:
            read_all(reader)
    assert fault_proxy.count("drop") == 3
    text = str(info.value)
    assert f"s3://{bucket}/r/objects/x" in text and "attempts" in text
    assert FAKE_ACCESS_KEY not in text


def test_an_object_replaced_mid_read_is_never_spliced(store, proxied, fault_proxy):
    first = os.urandom(MiB)
    store.put("refs/moving", first)
    fault_proxy.fail_next("truncate", methods=["GET"])
    with proxied.open_read("refs/moving") as reader:
        head = reader.read(1000)
        store.put("refs/moving", os.urandom(MiB))  # replaced before the resumption
        with pytest.raises(StorageError, match="changed while it was read"):
            read_all(reader)
    assert head == first[:1000]


def test_an_object_copied_onto_itself_mid_read_is_resumed(s3_bucket, fault_proxy):
    """Found by an audit: a writer reusing an object refreshes it by a copy onto itself,
    which gives an object uploaded in parts a new ETag (its bytes unchanged); the read
    cut off before it resumed with ``If-Match`` on the old ETag, got 412, and a training
    job's cache fill failed as "changed while it was read"."""
    from simstore.hashing import hash_bytes

    opts = {**FAST, "multipart_threshold_bytes": 6_000_000, "multipart_part_bytes": 5_300_000}
    bucket = s3_bucket()
    writer = S3Store(f"s3://{bucket}/r", storage_options=opts)
    proxied = S3Store(writer.url, storage_options={**opts,
                                                   "endpoint_url": fault_proxy.endpoint_url})
    data = os.urandom(7 * MiB)
    key = object_key(hash_bytes(data))
    assert writer.put_if_absent(key, data)  # in two parts
    before = writer._head(key)["ETag"]
    fault_proxy.fail_next("truncate", methods=["GET"])
    with proxied.open_read(key) as reader:
        head = reader.read(1000)
        assert not writer.put_if_absent(key, data)  # reused: refreshed by a copy
        assert writer._head(key)["ETag"] != before  # the copy's ETag is another
        assert head + read_all(reader) == data
        assert reader.requests == 2
    writer.close()
    proxied.close()


# -- the loader's cache fills ------------------------------------------------------------


def write_sources(root, count=12, seed=0):
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        np.savez(root / f"run{i:03d}.npz", u=rng.normal(size=(4, 64, 64)).astype(np.float32))
    return root


@pytest.fixture
def dataset(s3_bucket, tmp_path):
    """12 samples of 64 KiB in 4 shards on S3; (url, shard ids, expected arrays by key)."""
    url = f"s3://{s3_bucket()}/store"
    src = write_sources(tmp_path / "src")
    Catalog.init(url, storage_options=FAST)
    ingest(
        [str(src)],
        dataset="d",
        store=Catalog.open(url, storage_options=FAST),
        snapshot=True,
        message="x",
        shard_size=200_000,
    )
    cat = Catalog.open(url, storage_options=FAST)
    snap = cat.snapshot(cat.resolve("d"))
    shards = sorted({s for t in cat.iter_parts(snap) for s in t.column("shard").to_pylist()})
    expected = {}
    for path in sorted(src.iterdir()):
        with np.load(path) as z:
            expected[path.stem] = z["u"].copy()
    return url, shards, expected


def epoch(url, options, **kw):
    from simstore.loaders import SimDataset

    ds = SimDataset(url, "d", shuffle=False, storage_options=options, **kw)
    return ds, {s["__key__"]: s["u"].numpy().copy() for s in ds}


def same(data, expected):
    assert data.keys() == expected.keys()
    for key, value in expected.items():
        np.testing.assert_array_equal(data[key], value)


def test_a_cold_fill_is_one_get_per_shard_and_counted(dataset, fault_proxy, tmp_path):
    url, shards, expected = dataset
    assert len(shards) >= 3
    opts = {**FAST, "endpoint_url": fault_proxy.endpoint_url}
    ds, data = epoch(url, opts, cache_dir=str(tmp_path / "cache"))
    same(data, expected)
    shard_paths = [r for r in fault_proxy.records if any(s in r.path for s in shards)]
    assert sorted(r.method for r in shard_paths) == ["GET"] * len(shards)  # no HEAD
    stats = ds.stats()
    s3 = stats["tiers"]["s3"]
    client = make_s3_client(os.environ["AWS_ENDPOINT_URL"])
    bucket, prefix = url[len("s3://") :].split("/", 1)
    sizes = sum(
        client.head_object(Bucket=bucket, Key=f"{prefix}/{object_key(s)}")["ContentLength"]
        for s in shards
    )
    client.close()
    assert s3["bytes"] - stats["manifest_bytes"] == sizes  # each shard exactly once
    gets = len(fault_proxy.records)
    assert s3["requests"] == gets - 3  # all but the catalog's 3 reads (metadata, ref, snapshot)
    assert stats["cache_misses"] == len(shards) and stats["cache_fill_bytes"] == sizes
    fault_proxy.records.clear()
    ds, warm = epoch(url, opts, cache_dir=str(tmp_path / "cache"))
    same(warm, expected)
    assert not [r for r in fault_proxy.records if any(s in r.path for s in shards)]
    assert ds.stats()["cache_hits"] == len(shards)
    # a warm node reads the store's metadata and the ref; the snapshot it names, the
    # manifest parts and the shards come from the disk cache
    sid = Catalog.open(url, storage_options=FAST).resolve("d")
    prefix = "/" + url[len("s3://"):]
    assert sorted((r.method, r.path) for r in fault_proxy.records) == [
        ("GET", f"{prefix}/datasets/d/refs/heads/main"), ("GET", f"{prefix}/simstore.json")]
    assert not [r for r in fault_proxy.records if sid in r.path]


def test_a_damaged_cached_snapshot_is_read_from_the_store(dataset, tmp_path):
    url, _, expected = dataset
    cache = tmp_path / "cache"
    epoch(url, FAST, cache_dir=str(cache))
    sid = Catalog.open(url, storage_options=FAST).resolve("d")
    copy = next(p for p in cache.rglob(sid))
    copy.write_bytes(copy.read_bytes()[:-1] + b"!")
    ds, data = epoch(url, FAST, cache_dir=str(cache))
    same(data, expected)
    assert ds.snapshot_ids == [sid]
    assert not copy.exists()  # the damaged copy was taken out; the store served it
    epoch(url, FAST, cache_dir=str(cache))  # and the next build fills the cache again
    assert Catalog.open(url, storage_options=FAST).snapshot(sid).to_bytes() == copy.read_bytes()


def test_fills_through_cut_bodies_yield_exact_data(dataset, fault_proxy, tmp_path):
    url, shards, expected = dataset
    opts = {**FAST, "endpoint_url": fault_proxy.endpoint_url}
    fault_proxy.fail_share(0.3, "truncate", seed=4, methods=["GET"], path_contains="/objects/")
    ds, data = epoch(url, opts, cache_dir=str(tmp_path / "cache"))
    fault_proxy.clear()
    assert fault_proxy.count("truncate") > 0
    same(data, expected)
    assert ds.stats()["cache_misses"] == len(shards)


def test_a_corrupt_shard_on_s3_never_reaches_the_cache(dataset, tmp_path):
    url, shards, _ = dataset
    bad = shards[1]
    bucket, prefix = url[len("s3://") :].split("/", 1)
    client = make_s3_client(os.environ["AWS_ENDPOINT_URL"])
    key = f"{prefix}/{object_key(bad)}"
    body = bytearray(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    body[len(body) // 2] ^= 0xFF
    client.put_object(Bucket=bucket, Key=key, Body=bytes(body))
    client.close()
    cache = tmp_path / "cache"
    with pytest.raises(IntegrityError, match=f"{bad} has hash .* expected {bad}"):
        epoch(url, FAST, cache_dir=str(cache))
    assert not (cache / "objects" / bad[:2] / bad).exists()
    assert os.listdir(cache / "tmp") == []
    # with on_corrupt="skip" the damaged fill is a miss and its bytes were downloaded:
    # the counters agree with the s3 tier (it was neither a hit nor a miss)
    from simstore.loaders import SimDataset

    ds = SimDataset(url, "d", shuffle=False, storage_options=FAST,
                    cache_dir=str(tmp_path / "cache2"), on_corrupt="skip")
    list(ds)
    stats = ds.stats()
    assert stats["cache_misses"] == len(shards) and stats["cache_hits"] == 0
    assert stats["cache_fill_bytes"] == stats["tiers"]["s3"]["bytes"] - stats["manifest_bytes"]


def test_max_bandwidth_throttles_a_streamed_fill(dataset, tmp_path, paced_limiters):
    url, _, expected = dataset
    ds, data = epoch(url, FAST, cache_dir=str(tmp_path / "cache"), max_bandwidth="1MiB")
    same(data, expected)
    stats = ds.stats()
    (limiter,) = paced_limiters.made
    assert limiter.rate == 1 << 20
    # every byte the fills received was paced, and every byte read from the cache
    # copies: ~800 KiB of shards twice at 1 MiB/s, past the 0.25 s burst, so the
    # reader waited, and the stats say how long (the manifest's reads are not paced)
    fills = stats["tiers"]["s3"]["bytes"] - stats["manifest_bytes"]
    assert fills == stats["cache_fill_bytes"] > 0
    assert paced_limiters.taken == fills + stats["tiers"]["cache"]["bytes"]
    assert paced_limiters.waited >= (paced_limiters.taken - limiter.burst) / limiter.rate - 1e-9
    assert paced_limiters.waited > 0
    assert stats["throttle_s"] == pytest.approx(paced_limiters.waited)


def _child_reads(store, key, queue):
    parent_client = store._client
    session = store._session
    data = read_all(store.open_read(key))
    queue.put((len(data), store._client is not parent_client, store._session is session))


@pytest.mark.multiprocess
def test_a_forked_worker_makes_its_own_client_from_the_inherited_session(store):
    import multiprocessing

    store.put("objects/f", b"x" * 5000)
    assert store.get("objects/f") == b"x" * 5000  # the parent's client and session exist
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child_reads, args=(store, "objects/f", queue))
    proc.start()
    got = queue.get(timeout=60)
    proc.join()
    # the whole object; a client (and connection pool) of its own; the parsed session kept
    assert got == (5000, True, True)
    assert store.get("objects/f") == b"x" * 5000  # the parent's client still works


def test_retried_attempts_are_counted_with_what_their_cut_bodies_delivered(
    store, proxied, fault_proxy
):
    """Each call counted one request: two 503s and a body cut in half before a GET that
    got through were three requests sent (and billed) that no meter saw."""
    from simstore.storage import CountingStore

    data = os.urandom(100_000)
    store.put("objects/x", data)
    counting = CountingStore(proxied)
    fault_proxy.fail_next("slowdown", "truncate", "slowdown", methods=["GET"])
    assert counting.get("objects/x") == data
    fault_proxy.fail_next("slowdown", methods=["GET"])
    assert counting.get("objects/x", (10, 20)) == data[10:20]
    fault_proxy.fail_next("slowdown", methods=["HEAD"])
    assert counting.exists("objects/x")
    assert fault_proxy.count(None, "GET") == 2 and fault_proxy.count(None, "HEAD") == 1
    usage = {op: (u.requests, u.bytes) for op, u in counting.traffic.tier("s3").ops.items()}
    # the cut body delivered half of its 100,000 bytes before the connection closed
    assert usage == {"get": (4, len(data) + len(data) // 2), "range_get": (2, 10),
                     "head": (2, 0)}
    # a pickled meter counts its inner store's retries too (a DataLoader worker's copy)
    import pickle

    again = pickle.loads(pickle.dumps(counting))
    fault_proxy.fail_next("slowdown", methods=["GET"])
    again.get("objects/x", (0, 1))
    assert again.traffic.tier("s3").ops["range_get"].requests == 4


def test_two_meters_on_one_store_each_count_their_own_retries(proxied, store, fault_proxy):
    """The retry listener was one slot on the store: the meter made last took every
    retry, and a loader's counters lost theirs to a cost command's temporary meter."""
    from simstore.loaders._fetch import RateLimiter, ShardAccess
    from simstore.loaders._stats import Counters

    from simstore.storage import CountingStore

    store.put("objects/x", b"x" * 1000)
    a, b = CountingStore(proxied), CountingStore(proxied)
    counters = Counters()
    ShardAccess(proxied, counters=counters, limiter=RateLimiter(None), cache=None, verify=False)
    CountingStore(proxied)  # made after the loader's: takes nothing from it
    fault_proxy.fail_next("slowdown", "slowdown", methods=["GET"])
    a.get("objects/x")
    assert a.traffic.tier("s3").ops["get"].requests == 3
    assert b.traffic.tier("s3").requests == 0
    fault_proxy.fail_next("slowdown", methods=["GET"])
    proxied.get("objects/x", (0, 10))  # a read of the loader's, its last attempt its own
    assert counters.snapshot().get("tier:s3:requests", 0) == 1
    assert a.traffic.tier("s3").ops["get"].requests == 3


def test_the_loader_counts_throttled_and_cut_requests_as_sent(dataset, fault_proxy):
    """Without a cache every read is a ranged GET through the proxy; 503s and cut bodies
    on the shards' reads were retried and left out of the run's requests."""
    url, shards, expected = dataset
    opts = {**FAST, "endpoint_url": fault_proxy.endpoint_url}
    fault_proxy.fail_next("slowdown", "truncate", "slowdown", "truncate",
                          methods=["GET"], path_contains=object_key(shards[1]))
    ds, data = epoch(url, opts)
    same(data, expected)
    assert fault_proxy.count("slowdown") == 2 and fault_proxy.count("truncate") == 2
    s3 = ds.stats()["tiers"]["s3"]
    sent = len(fault_proxy.records) - 3  # all but the catalog's 3 reads, as above
    assert s3["requests"] == sent


@pytest.mark.parametrize("cached", [False, True])
def test_a_request_that_fails_for_good_is_counted_as_sent(dataset, fault_proxy, tmp_path,
                                                          cached):
    """Found by an audit: a read whose attempts all failed counted all but its last
    (sent and billed as the others), with and without a cache in front."""
    from simstore.loaders import SimDataset

    url, shards, _ = dataset
    opts = {**FAST, "endpoint_url": fault_proxy.endpoint_url, "max_attempts": 3}
    kw = {"cache_dir": str(tmp_path / "cache")} if cached else {}
    ds = SimDataset(url, "d", shuffle=False, storage_options=opts, **kw)
    before = len(fault_proxy.records)  # the dataset's construction: counted elsewhere
    fault_proxy.fail_share(1.0, "slowdown", seed=0, methods=["GET", "HEAD"],
                           path_contains=object_key(shards[0]))
    with pytest.raises(StorageError, match=object_key(shards[0])):
        list(ds)
    assert fault_proxy.count("slowdown") >= 3
    assert ds.stats()["tiers"]["s3"]["requests"] == len(fault_proxy.records) - before


def test_a_connect_that_is_refused_is_no_request():
    """Found by an audit: attempts refused at connect reached no server, and were counted
    as requests (a server down for good: the loader said 9 where 7 were sent)."""
    from simstore.loaders._fetch import RateLimiter, ShardAccess
    from simstore.loaders._stats import Counters

    from simstore.storage import CountingStore
    from simstore.storage._s3 import S3Store

    down = S3Store("s3://bucket/root", storage_options={
        **FAST, "endpoint_url": "http://127.0.0.1:1", "max_attempts": 3,
        "key": "k", "secret": "s"})
    counting = CountingStore(down)
    counters = Counters()
    ShardAccess(down, counters=counters, limiter=RateLimiter(None), cache=None, verify=False)
    with pytest.raises(StorageError, match="failed after 3 attempts"):
        counting.get("objects/x")
    assert counting.traffic.tier("s3").requests == 0
    with pytest.raises(StorageError, match="failed after 3 attempts"):
        down.get("objects/x")  # its retries told to the loader's counters
    assert counters.snapshot().get("tier:s3:requests", 0) == 0


def test_max_bandwidth_pays_for_each_fill_request_before_it_is_sent(
    dataset, tmp_path, paced_limiters, monkeypatch
):
    """A streamed fill paid for its blocks as it read them, but the server sends a GET's
    body at once into the socket's buffers: a cold start's fills took whole shards in
    their first second at a 1 MiB/s cap. Under max_bandwidth a fill asks the size (a
    HEAD) and pays for each block before its GET."""
    url, _, expected = dataset
    cat = Catalog.open(url, storage_options=FAST)
    shards = {object_key(s) for t in cat.iter_parts(cat.snapshot(cat.resolve("d")))
              for s in t.column("shard").to_pylist()}
    sent: list[tuple[float, int]] = []  # (bytes paid when a shard's GET went out, its size)
    streamed: list[str] = []
    real_get, real_open = S3Store.get, S3Store.open_read

    def get(self, key, byte_range=None, *, max_bytes=None):
        if any(key.endswith(s) for s in shards):
            size = (byte_range[1] - byte_range[0]) if byte_range else self.info(key).size_bytes
            sent.append((paced_limiters.taken, size))
        return real_get(self, key, byte_range=byte_range, max_bytes=max_bytes)

    def open_read(self, key):
        streamed.append(key)
        return real_open(self, key)

    monkeypatch.setattr(S3Store, "get", get)
    monkeypatch.setattr(S3Store, "open_read", open_read)
    ds, data = epoch(url, FAST, cache_dir=str(tmp_path / "cache"), max_bandwidth="1MiB")
    same(data, expected)
    assert not streamed and len(sent) == len(shards)
    asked = 0
    for paid, size in sent:  # one process, one request at a time here
        asked += size
        assert paid >= asked  # paid for before it went out
    assert ds.stats()["cache_fill_bytes"] == asked
