"""Page checks until the shard's hash is known: local shards, cache fills and cache hits.

Parquet pages and Zarr chunks carry CRC-32s, which the readers check while the shard's
whole-object hash is pending; once it has matched they stop (a CRC costs more than the
decode). A cache hit is hashed once per epoch too, so a copy damaged after its fill is
found, named and taken out of the cache, and the shard is read again from the store.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from loader_helpers import RemoteLikeStore, assert_filled_again, write_npz_sources
from simstore.loaders import SimDataset
from simstore.loaders._fetch import RateLimiter, ShardAccess
from simstore.loaders._opener import FormatOpener
from simstore.loaders._readers import ReaderPool
from simstore.loaders._stats import Counters

import simstore
from simstore.catalog import Catalog
from simstore.errors import FormatError, IntegrityError
from simstore.storage import open_store


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """24 .npz files: u is (8, 16, 16) float32 (8 KiB), p a scalar."""
    root = tmp_path_factory.mktemp("src")
    arrays = write_npz_sources(str(root), 24, seed=3)
    return str(root), arrays


def _ingest(tmp_path, sources, fmt):
    root, arrays = sources
    store = str(tmp_path / f"store-{fmt}")
    Catalog.init(store)
    simstore.ingest([root], dataset="d", store=store, format=fmt, snapshot=True,
                    message="t", shard_size=60_000, zarr_threshold=1 << 30)
    return store, arrays


def _shard_ids(store):
    cat = Catalog.open(store)
    snap = cat.snapshot(cat.resolve("d"))
    return sorted({s for t in cat.iter_parts(snap) for s in t.column("shard").to_pylist()})


def _pool(store):
    access = ShardAccess(open_store(store), counters=Counters(), limiter=RateLimiter(None),
                         cache=None, verify=True)
    return ReaderPool([access], FormatOpener(), max_open=8, referenced_by=["snap"])


def _values(ds):
    return {s["__key__"]: s["u"].numpy().copy() for s in ds}


@pytest.mark.parametrize("fmt", ["parquet", "zarr"])
def test_a_local_reader_checks_pages_until_the_shard_hash_matches(
    tmp_path, sources, fmt, monkeypatch
):
    store, _ = _ingest(tmp_path, sources, fmt)
    shard = _shard_ids(store)[0]
    import simstore.loaders._fetch as fetch

    real, release = fetch.hash_file, []

    def held(path, *args, **kw):
        while not release:  # the hash ends only when the test says so
            time.sleep(0.01)
        return real(path, *args, **kw)

    monkeypatch.setattr(fetch, "hash_file", held)
    pool = _pool(store)
    with ThreadPoolExecutor(2) as io:
        pool.schedule((0, shard), io)
        pool.start_hashing()
        with pool.reader((0, shard)) as reader:
            assert reader.verifies_pages  # opened while its hash runs
        release.append(True)
        deadline = time.monotonic() + 60
        while not pool._entries[(0, shard)].checking.future.done():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with pool.reader((0, shard)) as reader:
            assert not reader.verifies_pages  # the hash matched: no more page checks
    pool.close()


@pytest.mark.parametrize("fmt", ["parquet", "zarr"])
def test_a_shard_opened_after_its_hash_is_read_without_page_checks(tmp_path, sources, fmt):
    store, arrays = _ingest(tmp_path, sources, fmt)
    shard = _shard_ids(store)[0]
    pool = _pool(store)
    with ThreadPoolExecutor(2) as io:
        pool.schedule((0, shard), io)
        pool.start_hashing()
        pool._prepared[(0, shard)].result()
        with pool.reader((0, shard)) as reader:
            assert not reader.verifies_pages
    pool.close()
    # and an epoch read so reads the sources' values
    got = _values(SimDataset(store, "d", shuffle=False))
    assert got.keys() == arrays.keys()
    assert all(np.array_equal(got[k], arrays[k]) for k in arrays)


def _flip_in_pages(path):
    """Flip a bit in the first quarter of the file: inside a data page or chunk."""
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        at = len(data) // 4
        data[at] ^= 0x10
        f.seek(0)
        f.write(data)


@pytest.mark.parametrize("fmt", ["parquet", "zarr", "lance"])
def test_a_cache_copy_damaged_after_its_fill_is_found_and_refetched(
    tmp_path, sources, fmt, caplog
):
    """Parquet and Zarr readers check pages while the hit is hashed; a Lance reader
    checks nothing itself, so its hit is hashed before the first read. Either way the
    damaged copy is named in a warning, taken out of the cache and read again from the
    store (it failed the epoch, though the store's object was intact)."""
    store, arrays = _ingest(tmp_path, sources, fmt)
    cache = str(tmp_path / "cache")
    remote = RemoteLikeStore(store)

    def epoch():
        ds = SimDataset(remote, "d", shuffle=False, cache_dir=cache, cache_limit="64MiB")
        return _values(ds), ds.stats()

    got, stats = epoch()  # fills
    assert all(np.array_equal(v, arrays[k]) for k, v in got.items())
    assert stats["cache_damaged"] == 0
    shard = _shard_ids(store)[0]
    copy = os.path.join(cache, "objects", shard[:2], shard)
    os.chmod(copy, 0o644)
    _flip_in_pages(copy)
    with caplog.at_level("WARNING", logger="simstore.loaders"):
        got, stats = epoch()  # a hit: its pages fail their CRC, or its hash is wrong
    assert got.keys() == arrays.keys()
    assert all(np.array_equal(got[k], arrays[k]) for k in arrays)
    assert stats["cache_damaged"] == 1 and stats["corrupt_shards"] == 0
    [warned] = [r.getMessage() for r in caplog.records if "again from the store" in
                r.getMessage()]
    assert copy in warned and "removed from the cache" in warned
    assert_filled_again(cache, shard)


def test_a_copy_found_damaged_again_after_its_refill_fails_the_epoch(tmp_path, sources,
                                                                      monkeypatch):
    """One new fill per read: a node that finds every copy damaged still fails the
    epoch, naming the copy, instead of downloading the shard without end."""
    from simstore.loaders._cache import DamagedCopyError

    store, _ = _ingest(tmp_path, sources, "parquet")
    cache = str(tmp_path / "cache")
    shard = _shard_ids(store)[0]
    real, opened = ShardAccess.open, []

    def damaged(self, shard_id, *args, **kwargs):
        if shard_id == shard:
            opened.append(shard_id)
            error = DamagedCopyError(f"cache copy {shard} has hash 00, expected {shard} "
                                     "(removed from the cache)")
            error.taken_out = True
            raise error
        return real(self, shard_id, *args, **kwargs)

    monkeypatch.setattr(ShardAccess, "open", damaged)
    ds = SimDataset(RemoteLikeStore(store), "d", shuffle=False, cache_dir=cache,
                    cache_limit="64MiB")
    with pytest.raises(IntegrityError, match=f"cache copy {shard} .*removed from the cache"):
        _values(ds)
    assert len(opened) == 2 and ds.stats()["cache_damaged"] == 1


@pytest.mark.parametrize("fmt", ["parquet", "zarr", "lance"])
def test_a_lookup_hashes_a_cache_hit_before_it_reads_it(tmp_path, sources, fmt):
    """``get`` has no epoch's pool to hash a hit in while its pages are checked: it hashes
    the copy first, so a damaged one is found, taken out of the cache and read again
    from the store (a page CRC error blamed the store's shard and left the copy; a flip
    no CRC covers gave wrong values)."""
    store, arrays = _ingest(tmp_path, sources, fmt)
    cache = str(tmp_path / "cache")
    remote = RemoteLikeStore(store)
    _values(SimDataset(remote, "d", shuffle=False, cache_dir=cache, cache_limit="64MiB"))
    shard = _shard_ids(store)[0]
    cat = Catalog.open(store)
    rows = cat.manifest(cat.snapshot(cat.resolve("d"))).to_pylist()
    key = next(r["key"] for r in rows if r["shard"] == shard)
    copy = os.path.join(cache, "objects", shard[:2], shard)
    os.chmod(copy, 0o644)
    _flip_in_pages(copy)
    ds = SimDataset(remote, "d", cache_dir=cache, cache_limit="64MiB")
    got = ds.get(key)
    assert np.array_equal(got["u"].numpy(), arrays[key])
    assert_filled_again(cache, shard)


@pytest.mark.parametrize("fmt", ["parquet", "zarr"])
def test_a_damaged_cache_copy_is_read_again_by_two_workers(tmp_path, sources, fmt):
    """Workers share cache copies' hashes: a damaged copy is found whichever worker meets
    it first (its hash, a page's CRC, or a sibling's copy gone when this worker opens
    it), and each worker that meets it reads the shard again from a new fill."""
    from simstore.loaders import SimDataLoader

    store, arrays = _ingest(tmp_path, sources, fmt)
    cache = str(tmp_path / "cache")
    remote = RemoteLikeStore(store)

    def epoch():
        ds = SimDataset(remote, "d", cache_dir=cache, cache_limit="64MiB")
        loader = SimDataLoader(ds, batch_size=4, num_workers=2,
                               multiprocessing_context="fork")
        got = {k: u.numpy().copy()
               for b in loader for k, u in zip(b["__key__"], b["u"], strict=True)}
        return got, ds.stats()

    got, _ = epoch()  # fills
    assert got.keys() == arrays.keys()
    from simstore.loaders._trust import VerifiedTable

    owners = [VerifiedTable(np.zeros(8, dtype=np.int64), w, 2) for w in (0, 1)]
    shards = _shard_ids(store)
    for shard in [next(s for s in shards if o.owns(s)) for o in owners]:  # one per worker
        copy = os.path.join(cache, "objects", shard[:2], shard)
        os.chmod(copy, 0o644)
        _flip_in_pages(copy)
        got, stats = epoch()
        assert got.keys() == arrays.keys()
        assert all(np.array_equal(got[k], arrays[k]) for k in arrays)
        assert stats["cache_damaged"] == 1 and stats["corrupt_shards"] == 0
        assert_filled_again(cache, shard)


def test_a_damaged_lance_cache_copy_is_never_read_by_workers(tmp_path, sources):
    """A Lance reader checks no pages: each worker hashes a hit before reading it, so a
    copy damaged since its fill yields none of its rows; the shard is read again from
    the store."""
    from simstore.loaders import SimDataLoader

    store, arrays = _ingest(tmp_path, sources, "lance")
    cache = str(tmp_path / "cache")
    remote = RemoteLikeStore(store)

    def epoch():
        ds = SimDataset(remote, "d", shuffle=False, cache_dir=cache, cache_limit="64MiB")
        # Lance is not fork-safe once this process has used it (docs/loader.md)
        loader = SimDataLoader(ds, batch_size=4, num_workers=2,
                               multiprocessing_context="spawn")
        got = {k: u.numpy().copy()
               for b in loader for k, u in zip(b["__key__"], b["u"], strict=True)}
        return got, ds.stats()

    got, _ = epoch()
    assert got.keys() == arrays.keys()  # fills
    shard = _shard_ids(store)[0]
    copy = os.path.join(cache, "objects", shard[:2], shard)
    os.chmod(copy, 0o644)
    with open(copy, "r+b") as f:  # a byte in the middle: inside the column data
        f.seek(os.path.getsize(copy) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    got, stats = epoch()
    assert got.keys() == arrays.keys()
    assert all(np.array_equal(got[k], arrays[k]) for k in arrays)  # nothing damaged came out
    assert stats["cache_damaged"] == 1
    assert_filled_again(cache, shard)


@pytest.mark.parametrize("fmt", ["parquet", "zarr"])
@pytest.mark.parametrize("tier", ["local", "ranged", "cache"])
def test_reads_without_verification_check_nothing_and_read_right(
    tmp_path, sources, fmt, tier, monkeypatch
):
    store, arrays = _ingest(tmp_path, sources, fmt)
    kw = {}
    if tier != "local":
        store = RemoteLikeStore(store)
    if tier == "cache":
        kw = {"cache_dir": str(tmp_path / "cache"), "cache_limit": "64MiB"}
    import simstore.loaders._pipeline as pipeline

    opened = []
    real = pipeline.ReaderPool._open

    def spy(self, key, handle):
        reader = real(self, key, handle)
        opened.append(reader)
        return reader

    monkeypatch.setattr(pipeline.ReaderPool, "_open", spy)
    for _ in range(2):  # the cache's fill, then its hit
        got = _values(SimDataset(store, "d", shuffle=False, verify=False, **kw))
        assert got.keys() == arrays.keys()
        assert all(np.array_equal(got[k], arrays[k]) for k in arrays)
    assert opened and not any(r.verifies_pages for r in opened)


def _ingest_grouped(tmp_path, sources):
    """One Parquet shard of 24 samples in row groups of about two samples."""
    root, _ = sources
    store = str(tmp_path / "store-grouped")
    Catalog.init(store)
    simstore.ingest([root], dataset="d", store=store, format="parquet", snapshot=True,
                    message="t", shard_size=1 << 20, row_group_bytes=16_000)
    return store


def test_a_read_that_would_check_most_of_a_shard_hashes_it_first(
    tmp_path, sources, monkeypatch
):
    """Hashing a file costs less than checking its pages: a read over most of an
    unhashed shard hashes it first, once, and reads it unchecked; a small read does not."""
    store = _ingest_grouped(tmp_path, sources)
    shard = _shard_ids(store)[0]
    import simstore.loaders._fetch as fetch

    real, hashed = fetch.hash_file, []

    def counted(path, *args, **kw):
        hashed.append(path)
        return real(path, *args, **kw)

    monkeypatch.setattr(fetch, "hash_file", counted)
    pool = _pool(store)
    with ThreadPoolExecutor(2) as io:
        pool.schedule((0, shard), io)  # its hash waits for the first chunk: not started
        with pool.reader((0, shard), lambda r: r.checked_bytes([0])) as reader:
            n = reader.num_samples
            assert reader._pf.metadata.num_row_groups > 4
            assert 0 < reader.checked_bytes([0]) * 4 < os.path.getsize(reader._source)
            assert reader.verifies_pages and not hashed  # one row group: pages checked
        with pool.reader((0, shard), lambda r: r.checked_bytes(range(n))) as reader:
            assert not reader.verifies_pages  # hashed first, then trusted
            assert reader.checked_bytes(range(n)) == 0
        assert len(hashed) == 1
    pool.close()
    assert len(hashed) == 1  # the background hash did not run again


def test_checked_bytes_counts_the_requested_columns_of_groups_not_yet_decoded(
    tmp_path, sources
):
    from simstore.formats import ParquetFormat

    store = _ingest_grouped(tmp_path, sources)
    shard = _shard_ids(store)[0]
    reader = ParquetFormat().open(os.path.join(store, "objects", shard[:2], shard))
    try:
        both = reader.checked_bytes([0], ["u", "p"])
        only_u = reader.checked_bytes([0], ["u"])
        assert 0 < only_u < both
        assert reader.checked_bytes([0, 1], ["u"]) == only_u  # one row group
        assert reader.checked_bytes([-1, reader.num_samples]) == 0  # the read says why
        list(reader.read([0], ["u"]))  # decoded and kept: nothing left to check there
        assert reader.checked_bytes([0], ["u"]) == 0
        assert reader.checked_bytes([0], ["u", "p"]) == both
        reader.trust()
        assert reader.checked_bytes(range(reader.num_samples)) == 0
    finally:
        reader.close()


def test_a_damaged_local_shard_read_whole_fails_its_hash_naming_it(tmp_path, sources):
    store = _ingest_grouped(tmp_path, sources)
    shard = _shard_ids(store)[0]
    _flip_in_pages(os.path.join(store, "objects", shard[:2], shard))
    with pytest.raises(IntegrityError) as info:
        _values(SimDataset(store, "d", seed=1))
    assert shard in str(info.value)


def test_manifest_parts_come_from_the_cache_and_a_damaged_one_is_replaced(tmp_path, sources):
    """With a disk cache, a warm epoch reads its manifest parts from the node's copies;
    a copy damaged since its fill is named, taken out, and downloaded again."""
    store, arrays = _ingest(tmp_path, sources, "parquet")
    cache = str(tmp_path / "cache")
    remote = RemoteLikeStore(store)

    def epoch():
        ds = SimDataset(remote, "d", shuffle=False, cache_dir=cache, cache_limit="64MiB")
        return _values(ds), ds.stats()

    got, cold = epoch()
    assert got.keys() == arrays.keys() and cold["manifest_cache_hits"] == 0
    got, warm = epoch()
    assert warm["manifest_cache_hits"] == warm["manifest_parts"] > 0
    assert warm["tiers"]["fake-remote"]["requests"] == 0  # not even the manifest
    cat = Catalog.open(store)
    part = cat.snapshot(cat.resolve("d")).parts[0].id
    copy = os.path.join(cache, "objects", part[:2], part)
    os.chmod(copy, 0o644)
    with open(copy, "r+b") as f:
        f.seek(os.path.getsize(copy) // 2)
        f.write(b"\0\1\2")
    with pytest.raises(IntegrityError) as info:
        epoch()
    assert part in str(info.value) and "removed from the cache" in str(info.value)
    assert not os.path.exists(copy)
    got, again = epoch()  # downloaded again
    assert all(np.array_equal(got[k], arrays[k]) for k in arrays)
    assert os.path.exists(copy) and again["manifest_cache_hits"] == again["manifest_parts"] - 1


# -- DataLoader workers share local shards' hashes ----------------------------------------
def _worker_pool(store, table, worker, workers=2, cache=None):
    """A DataLoader worker's reader pool; ``cache``: a cache directory in front of
    ``store`` read as a remote store."""
    from simstore.loaders._cache import CacheConfig
    from simstore.loaders._trust import VerifiedTable

    counters = Counters()
    backend = open_store(store) if cache is None else RemoteLikeStore(store)
    config = None if cache is None else CacheConfig(directory=cache, limit_bytes=1 << 26)
    access = ShardAccess(backend, counters=counters, limiter=RateLimiter(None),
                         cache=config, verify=True,
                         siblings=VerifiedTable(table, worker, workers))
    return ReaderPool([access], FormatOpener(), max_open=8, referenced_by=["snap"]), counters


def _read_all(pool, shards):
    with ThreadPoolExecutor(2) as io:
        for shard in shards:
            pool.schedule((0, shard), io)
        pool.start_hashing()
        for shard in shards:
            with pool.reader((0, shard)) as reader:
                list(reader.read([0]))
        pool.finish()
    pool.close()


def test_verified_table_gives_each_shard_one_owner_and_matches_whole_tags():
    from simstore.loaders._trust import VERIFIED_SLOTS, VerifiedTable

    table = np.zeros(VERIFIED_SLOTS, dtype=np.int64)
    rng = np.random.default_rng(5)
    ids = [bytes(rng.integers(0, 256, 16, dtype=np.uint8)).hex() for _ in range(200)]
    workers = [VerifiedTable(table, w, 3) for w in range(3)]
    assert all(sum(t.owns(i) for t in workers) == 1 for i in ids)
    assert {w for w in range(3) for i in ids if workers[w].owns(i)} == {0, 1, 2}
    workers[0].publish(ids[0], 11)
    assert workers[2].has(ids[0], 11) and not workers[2].has(ids[1], 11)
    # a match is for the file the owner hashed: a file with another stamp has none
    assert not workers[2].has(ids[0], 12)
    # another id in the same slot replaces the first: neither is mistaken for the other
    other = ("f" if ids[0][0] != "f" else "e") + ids[0][1:]  # same slot, another tag
    assert workers[0]._slot_value(other, 11)[0] == workers[0]._slot_value(ids[0], 11)[0]
    workers[1].publish(other, 11)
    assert workers[0].has(other, 11) and not workers[0].has(ids[0], 11)
    # the sources of a mixture are different files under one id: a match for one source
    # is not one for another
    workers[0].publish(ids[2], 11)
    assert workers[1].has(ids[2], 11) and not workers[1].scoped(1).has(ids[2], 11)
    workers[1].scoped(1).publish(ids[2], 11)
    assert workers[0].scoped(1).has(ids[2], 11) and workers[0].has(ids[2], 11)


@pytest.mark.parametrize("fmt", ["parquet", "zarr"])
@pytest.mark.parametrize("tier", ["local", "cache"])
def test_a_worker_trusts_the_shards_its_sibling_hashed(tmp_path, sources, fmt, tier):
    store, _ = _ingest(tmp_path, sources, fmt)
    shards = _shard_ids(store)
    assert len(shards) >= 3
    cache = None
    if tier == "cache":  # copies filled earlier: each worker's read of one is a hit
        cache = str(tmp_path / "cache")
        _values(SimDataset(RemoteLikeStore(store), "d", cache_dir=cache, cache_limit=1 << 26))
    table = np.zeros(4096, dtype=np.int64)
    first, c1 = _worker_pool(store, table, 0, cache=cache)
    _read_all(first, shards)
    # the first worker hashed every shard it read: those it owns, and at its epoch's end
    # the others, whose owner had not published them
    assert c1.snapshot()["shards_verified"] == len(shards)
    second, c2 = _worker_pool(store, table, 1, cache=cache)
    _read_all(second, shards)
    counts = c2.snapshot()
    assert counts["shards_verified"] == 0
    assert counts["shards_verified_by_sibling"] == len(shards)


def test_a_damaged_shard_that_no_sibling_published_fails_in_the_worker_that_read_it(
    tmp_path, sources
):
    store, _ = _ingest(tmp_path, sources, "zarr")
    shards = _shard_ids(store)
    table = np.zeros(4096, dtype=np.int64)
    pool, counters = _worker_pool(store, table, 1)
    from simstore.loaders._trust import VerifiedTable

    theirs = next(s for s in shards if not VerifiedTable(table, 1, 2).owns(s))
    _flip_in_pages(os.path.join(store, "objects", theirs[:2], theirs))
    with pytest.raises(IntegrityError) as info, ThreadPoolExecutor(2) as io:
        pool.schedule((0, theirs), io)
        pool.start_hashing()
        with pool.reader((0, theirs)) as reader:
            assert reader.verifies_pages  # read with page checks while awaiting the word
        pool.finish()  # no word came: hashed here, and wrong
    pool.close()
    assert theirs in str(info.value)
    assert counters.snapshot()["shards_verified_by_sibling"] == 0


@pytest.mark.parametrize("fmt", ["parquet", "zarr"])
def test_a_siblings_match_does_not_vouch_for_the_file_written_in_place_since(
    tmp_path, sources, fmt
):
    """Found by a review: a sibling's published match named the shard id alone, so a
    local shard written in place after its owner hashed it was trusted by the other
    worker, and its damaged values were read with no page checks and no error."""
    from simstore.loaders._trust import VerifiedTable

    store, _ = _ingest(tmp_path, sources, fmt)
    table = np.zeros(4096, dtype=np.int64)
    owner, _ = _worker_pool(store, table, 0)
    theirs = next(s for s in _shard_ids(store) if VerifiedTable(table, 0, 2).owns(s))
    _read_all(owner, [theirs])  # hashed by its owner, the match published
    path = os.path.join(store, "objects", theirs[:2], theirs)
    os.chmod(path, 0o644)
    _flip_in_pages(path)  # written in place: the same file, another stamp
    pool, counters = _worker_pool(store, table, 1)
    try:
        with pytest.raises(IntegrityError, match=theirs):
            _read_all(pool, [theirs])
    finally:
        pool.close()
    assert counters.snapshot()["shards_verified_by_sibling"] == 0


def _siblings_damaged_copy(tmp_path, sources, fmt):
    """Worker 1's reader pool over a filled cache, and a shard worker 0 owns the hash of,
    its copy damaged: ``(store, pool, counters, table, shard, its rows, copy path)``."""
    from simstore.loaders._trust import VerifiedTable

    store, _ = _ingest(tmp_path, sources, fmt)
    cache = str(tmp_path / "cache")
    _values(SimDataset(RemoteLikeStore(store), "d", cache_dir=cache, cache_limit=1 << 26))
    table = np.zeros(4096, dtype=np.int64)
    pool, counters = _worker_pool(store, table, 1, cache=cache)
    theirs = next(s for s in _shard_ids(store) if not VerifiedTable(table, 1, 2).owns(s))
    cat = Catalog.open(store)
    rows = sum(t.column("shard").to_pylist().count(theirs)
               for t in cat.iter_parts(cat.snapshot(cat.resolve("d"))))
    copy = os.path.join(cache, "objects", theirs[:2], theirs)
    os.chmod(copy, 0o644)
    _flip_in_pages(copy)
    return store, pool, counters, table, theirs, rows, copy


@pytest.mark.parametrize("fmt", ["parquet", "zarr"])
def test_a_page_error_in_a_copy_taken_out_as_damaged_names_the_damaged_copy(
    tmp_path, sources, fmt
):
    """The worker that owns a shard's hash found its cache copy damaged and took it out
    of the cache while a sibling read the same (pinned) copy with page checks: the
    sibling cannot hash a copy that is gone, and its page error is the damaged copy's,
    an IntegrityError naming the shard (it was a FormatError that hid the damage)."""
    _, pool, counters, _, theirs, rows, copy = _siblings_damaged_copy(tmp_path, sources, fmt)
    with ThreadPoolExecutor(2) as io, pytest.raises(IntegrityError) as info:
        pool.schedule((0, theirs), io)
        pool.start_hashing()
        with pool.reader((0, theirs)) as reader:
            assert reader.verifies_pages  # awaiting the owner's word
            os.unlink(copy)  # the owner hashed it, found it wrong and took it out
            list(reader.read(list(range(rows))))
    pool.close()
    assert theirs in str(info.value) and "damaged" in str(info.value)
    assert isinstance(info.value.__cause__, FormatError)  # what the page checks found
    assert counters.snapshot()["shards_verified"] == 0


@pytest.mark.parametrize("fmt", ["parquet", "zarr"])
def test_a_siblings_match_on_a_new_copy_does_not_vouch_for_the_readers_damaged_one(
    tmp_path, sources, fmt
):
    """Found by an audit: the worker that owns a shard's hash found the copy damaged,
    took it out and filled a new one at its path, and published the new one's match; a
    sibling still reading the damaged file (pinned) took that match for its own copy,
    stopped checking pages and delivered damaged values, with no error."""
    import shutil

    from simstore.loaders._cache import DamagedCopyError
    from simstore.loaders._trust import VerifiedTable, file_stamp

    store, pool, _, table, theirs, rows, copy = _siblings_damaged_copy(tmp_path, sources,
                                                                       fmt)
    with ThreadPoolExecutor(2) as io:
        pool.schedule((0, theirs), io)
        pool.start_hashing()
        with pool.reader((0, theirs)) as reader:  # pins the damaged copy
            assert reader.verifies_pages  # awaiting the owner's word
        # the owner: the damaged copy out, a new one from the store in its place, and
        # the new one's match published
        os.unlink(copy)
        shutil.copyfile(os.path.join(store, "objects", theirs[:2], theirs), copy)
        VerifiedTable(table, 0, 2).publish(theirs, file_stamp(copy))
        got = []
        with pytest.raises(DamagedCopyError, match=theirs):
            with pool.reader((0, theirs)) as reader:
                assert reader.verifies_pages  # the match was not this reader's copy's
                got = list(reader.read(list(range(rows))))
    pool.close()
    assert got == []  # nothing came out of the damaged file


def test_a_cache_copy_gone_before_its_hash_leaves_its_reader_checking_pages(tmp_path, sources):
    """A sibling's copy taken out of the cache (by the worker that found it damaged) is
    not hashed here: its reader must not be trusted, and goes on checking pages."""
    store, _ = _ingest(tmp_path, sources, "zarr")
    shards = _shard_ids(store)
    cache = str(tmp_path / "cache")
    _values(SimDataset(RemoteLikeStore(store), "d", cache_dir=cache, cache_limit=1 << 26))
    table = np.zeros(4096, dtype=np.int64)
    pool, counters = _worker_pool(store, table, 1, cache=cache)
    from simstore.loaders._trust import VerifiedTable

    theirs = next(s for s in shards if not VerifiedTable(table, 1, 2).owns(s))
    with ThreadPoolExecutor(2) as io:
        pool.schedule((0, theirs), io)
        pool.start_hashing()
        with pool.reader((0, theirs)) as reader:
            assert reader.verifies_pages  # awaiting the owner's word
            os.unlink(os.path.join(cache, "objects", theirs[:2], theirs))
        pool.finish()  # no word came, and the copy is gone: nothing to hash
        with pool.reader((0, theirs)) as reader:
            assert reader.verifies_pages
            list(reader.read([0]))  # still readable: the pinned copy is open
    pool.close()
    assert counters.snapshot()["shards_verified"] == 0


def test_a_hash_run_in_place_of_a_cancelled_one_runs_once_and_keeps_its_error():
    """A wrong copy's hash takes the copy out of the cache: run again, it would find
    nothing to hash and say so (False), hiding the damage. The reader pool waits on a
    shard's hash more than once (before a read, and again when the read fails)."""
    from concurrent.futures import Future

    from simstore.loaders._readers import _Check

    runs = []

    def redo():
        runs.append(1)
        if len(runs) == 1:
            raise IntegrityError("cache copy c has hash h, expected s (removed from the cache)")
        return False  # the copy is gone

    never: Future = Future()
    assert never.cancel()
    check = _Check(never, redo)
    for _ in range(2):
        with pytest.raises(IntegrityError, match="removed from the cache"):
            check.wait()
    assert len(runs) == 1


def _flip_a_value(store, values):
    """Flip one bit of one of ``values`` where its bytes lie in a shard; that shard's id."""
    hit = []
    for shard in _shard_ids(store):
        path = os.path.join(store, "objects", shard[:2], shard)
        with open(path, "rb") as f:
            data = bytearray(f.read())
        at = data.find(values.tobytes())
        if at >= 0:
            data[at + 100] ^= 0x01
            os.chmod(path, 0o644)
            with open(path, "wb") as f:
                f.write(bytes(data))
            hit.append(shard)
    (shard,) = hit
    return shard


@pytest.mark.parametrize("fmt", ["parquet", "zarr"])
def test_a_flipped_value_read_by_ranged_reads_fails_its_crc_naming_the_shard_once(
    tmp_path, sources, fmt
):
    """Ranged reads (a remote store, no cache) cannot hash the whole shard; Parquet pages
    and Zarr chunks (zip entries) carry CRC-32s that catch a flipped bit in a value."""
    root, arrays = sources
    store = str(tmp_path / f"store-{fmt}")
    Catalog.init(store)
    simstore.ingest([root], dataset="d", store=store, format=fmt, snapshot=True,
                    message="t", shard_size=60_000, zarr_threshold=1 << 30, compression="none")
    shard = _flip_a_value(store, arrays[sorted(arrays)[0]])
    with pytest.raises(FormatError) as info:
        _values(SimDataset(RemoteLikeStore(store), "d", shuffle=False))
    message = str(info.value)
    assert f"shard objects/{shard[:2]}/{shard} of snapshot" in message
    # Zarr's own check, or pyarrow's (it verifies the pages it decodes)
    assert "CRC-32" in message or "CRC checksum verification failed" in message
    assert message.count(f"{fmt} shard") == 1  # the format named once, not twice


def test_a_lance_shard_read_by_ranged_reads_is_hashed_whole_on_its_copy(tmp_path, sources):
    """Lance reads a file object from a copy of the whole object; that copy is hashed,
    so a flipped value (which Lance's encoding does not notice) is an IntegrityError
    naming the shard, and an intact shard reads right."""
    store, arrays = _ingest(tmp_path, sources, "lance")
    got = _values(SimDataset(RemoteLikeStore(store), "d", shuffle=False))
    assert got.keys() == arrays.keys() and all(np.array_equal(got[k], arrays[k]) for k in arrays)
    key = sorted(arrays)[0]
    shard = _flip_a_value(store, arrays[key])
    with pytest.raises(IntegrityError) as info:
        _values(SimDataset(RemoteLikeStore(store), "d", shuffle=False))
    assert f"shard objects/{shard[:2]}/{shard} of snapshot" in str(info.value)
    assert f"expected {shard}" in str(info.value)
    # verify=False checks nothing, as documented: the flipped value is read as it is
    unchecked = _values(SimDataset(RemoteLikeStore(store), "d", shuffle=False, verify=False))
    assert not np.array_equal(unchecked[key], arrays[key])


@pytest.mark.parametrize("fmt", ["parquet", "zarr"])
def test_opener_reads_simstores_own_formats_without_an_entry_point_scan(tmp_path, sources,
                                                                        fmt, monkeypatch):
    """A shard of simstore's own formats opens with no scan of the installed packages.

    The scan costs milliseconds in every fresh DataLoader worker, on its first batch; it
    is for shards no built-in format claims.
    """
    import simstore.loaders._opener as opener_module

    store, _ = _ingest(tmp_path, sources, fmt)
    scans = []

    def counted():
        scans.append(1)
        return opener_module.installed_shard_formats.__wrapped__()

    counted.__wrapped__ = opener_module.installed_shard_formats
    monkeypatch.setattr(opener_module, "installed_shard_formats", counted)
    shard = _shard_ids(store)[0]
    path = os.path.join(store, "objects", shard[:2], shard)
    reader = FormatOpener()(path)
    try:
        assert reader.num_samples > 0
        assert scans == []
    finally:
        reader.close()
    # a file no built-in format claims still goes to the installed formats
    other = tmp_path / "other.bin"
    other.write_bytes(b"not a shard" * 10)
    with pytest.raises(FormatError):
        FormatOpener()(str(other))
    assert scans == [1]


def test_an_error_raised_from_itself_ends_the_walk_for_who_took_a_copy_out():
    # found by an audit: the reader pool raised a hash's stored error "from" itself, and
    # the walk along its causes for the process that took the copy out never ended
    from simstore.loaders._cache import DamagedCopyError
    from simstore.loaders._pipeline import _taken_out

    error = DamagedCopyError("cache copy x has hash y, expected x (removed from the cache)")
    error.__cause__ = error
    assert _taken_out(error) is False
    error.taken_out = True
    assert _taken_out(error) is True


@pytest.mark.timeout(300)  # it hung: a worker spun in the walk above, the loop waited
@pytest.mark.parametrize("fmt", ["parquet", "zarr"])
def test_copies_damaged_between_epochs_under_max_bandwidth_are_read_again(tmp_path, fmt):
    """Found by an audit on S3: with max_bandwidth and 2 workers, a copy both workers
    found damaged made one of them spin forever (see the test above)."""
    from simstore.loaders import SimDataLoader

    root = tmp_path / "src"
    root.mkdir()
    arrays = write_npz_sources(str(root), 64, seed=5)
    store = str(tmp_path / "store")
    Catalog.init(store)
    simstore.ingest([str(root)], dataset="d", store=store, format=fmt, snapshot=True,
                    message="t", shard_size=100_000, zarr_threshold=1 << 30)
    cache = str(tmp_path / "cache")
    ds = SimDataset(RemoteLikeStore(store), "d", cache_dir=cache, seed=1,
                    max_bandwidth=2_000_000)
    loader = SimDataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="fork")
    for epoch in range(3):
        ds.set_epoch(epoch)
        if epoch:
            copies = sorted(p for p in (tmp_path / "cache" / "objects").glob("*/*")
                            if p.stat().st_size > 50_000)
            for copy in copies[: len(copies) // 2 + 1]:
                os.chmod(copy, 0o644)
                _flip_in_pages(str(copy))
        got = {k: u.numpy().copy()
               for b in loader for k, u in zip(b["__key__"], b["u"], strict=True)}
        assert got.keys() == arrays.keys()
        assert all(np.array_equal(got[k], arrays[k]) for k in arrays)
    assert ds.stats()["cache_damaged"] >= 2


@pytest.mark.parametrize("fmt", ["parquet", "zarr"])
def test_a_file_changed_after_its_hash_is_checked_again_at_its_next_open(tmp_path, sources,
                                                                           fmt):
    """Found by an audit: a shard hashed once in an epoch was trusted by its id at every
    later open of that epoch, though its file (a cache copy, a local shard) was rewritten
    in place meanwhile: a copy reopened after such damage gave wrong values, unnoticed
    until the next epoch."""
    store, _ = _ingest(tmp_path, sources, fmt)
    shard = _shard_ids(store)[0]
    access = ShardAccess(open_store(store), counters=Counters(), limiter=RateLimiter(None),
                         cache=None, verify=True)
    access.prepare(shard)  # hashed: the file holds the shard's bytes
    assert not access.unchecked(shard)
    path = os.path.join(store, "objects", shard[:2], shard)
    os.chmod(path, 0o644)
    _flip_in_pages(path)
    assert access.unchecked(shard)  # another file now: checked again, not trusted
    with pytest.raises(IntegrityError, match=shard):
        access.prepare(shard)


def test_a_cache_copy_damaged_between_two_opens_in_one_epoch_is_read_again(tmp_path,
                                                                           sources):
    """The same through the loader: one reader open at a time and small chunks, so a
    shard is opened again later in the epoch; its copy, damaged in between, is found and
    read again from the store."""
    from simstore.loaders import SimDataLoader

    store, arrays = _ingest(tmp_path, sources, "parquet")
    cat = Catalog.open(store)
    shard_of = {k: s for t in cat.iter_parts(cat.snapshot(cat.resolve("d")))
                for k, s in zip(t.column("key").to_pylist(), t.column("shard").to_pylist(),
                                strict=True)}
    opts = dict(seed=5, window_shards=8, prefetch={
        "max_open_shards": 1, "shards": 1, "chunks": 1, "chunk_samples": 4,
        "decode_cache_bytes": 1})
    plain = SimDataset(store, "d", **opts)
    plain.set_epoch(1)
    order = [s["__key__"] for s in plain]
    cache = str(tmp_path / "cache")
    ds = SimDataset(RemoteLikeStore(store), "d", cache_dir=cache, cache_limit="64MiB", **opts)
    loader = SimDataLoader(ds, batch_size=4)
    for _ in loader:
        pass  # fills the cache
    loader.set_epoch(1)
    seen, flipped = [], None
    for batch in loader:
        for k, u in zip(batch["__key__"], batch["u"], strict=True):
            seen.append(k)
            assert np.array_equal(u.numpy(), arrays[k]), k
        if flipped is None and len(seen) >= 8:
            again = {shard_of[k] for k in seen} & {shard_of[k] for k in order[len(seen) + 4:]}
            if again:
                flipped = sorted(again)[0]
                copy = os.path.join(cache, "objects", flipped[:2], flipped)
                os.chmod(copy, 0o644)
                _flip_in_pages(copy)
    assert flipped is not None and sorted(seen) == sorted(arrays)
    assert ds.stats()["cache_damaged"] == 1
