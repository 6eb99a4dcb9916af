"""Storage accounting against a local store: cost figures, tiers, warming a cache."""

from __future__ import annotations

import json
import os
import threading

import pytest
from cost_helpers import commit, stored_size
from simstore.loaders._cache import _stripe

from simstore.accounting import (
    dataset_cost,
    disk_usage,
    read_price_table,
    read_run_reports,
    run_cost,
    warm_cache,
)
from simstore.catalog import Catalog
from simstore.cost import OpClass
from simstore.errors import FormatError, IntegrityError, InvalidInputError, NotFoundError
from simstore.hashing import hash_bytes, object_key

A, B, B2, C = b"a" * 1000, b"b" * 2000, b"B" * 3000, b"c" * 500


@pytest.fixture
def cat(tmp_path):
    return Catalog.init(str(tmp_path / "store"))


@pytest.fixture
def prices():
    return read_price_table()


def _reach(cat, sid):
    """Objects a snapshot reaches, computed by hand from its manifest rows."""
    snap = cat.snapshot(sid)
    objects = {sid} | {p.id for p in snap.parts}
    for table in cat.iter_parts(snap):
        objects |= set(table.column("shard").to_pylist())
    return objects


def _size(cat, objects):
    return sum(stored_size(cat, o) for o in objects)


def test_two_snapshots_by_hand(cat, prices):
    s1 = commit(cat, "ds", {"a": A, "b": B})
    s2 = commit(cat, "ds", {"b": B2, "c": C})
    report = dataset_cost(cat, "ds", prices)
    first, second = report.snapshots
    assert (first.snapshot_id, second.snapshot_id) == (s1, s2)
    r1, r2 = _reach(cat, s1), _reach(cat, s2)
    assert first.reached.bytes == _size(cat, r1) and first.new.bytes == first.reached.bytes
    assert second.shared.bytes == 1000  # shard "a" only: parts and snapshots differ
    assert second.new.bytes == _size(cat, r2 - r1)
    assert second.new.bytes == stored_size(cat, s2) + cat.snapshot(s2).manifest_bytes + 3500
    assert second.samples == 3 and second.logical_bytes == 4500
    assert report.dataset_footprint.bytes == _size(cat, r1 | r2)
    assert report.full_copy_bytes == _size(cat, r1) + _size(cat, r2)
    assert report.dedup_ratio == pytest.approx(report.full_copy_bytes / _size(cat, r1 | r2))
    assert not report.truncated and report.store_tier == "local"
    out = report.to_json()
    assert [s["id"] for s in out["snapshots"]] == [s2, s1]  # newest first, like log
    s3_price = out["dataset_total"]["usd_per_month"]["s3-standard"]
    assert s3_price == pytest.approx(_size(cat, r1 | r2) / 2**30 * 0.023)


def test_store_total_counts_every_object_and_garbage(cat, prices):
    commit(cat, "ds", {"a": A})
    cat.put_object(b"g" * 12345)  # reached by nothing
    report = dataset_cost(cat, "ds", prices)
    listed = list(cat.store.list_info("objects/"))
    assert report.store_footprint.bytes == sum(i.size_bytes for i in listed)
    assert report.store_footprint.bytes >= report.dataset_footprint.bytes + 12345


def test_last_keeps_the_real_parent_as_baseline(cat, prices):
    s1 = commit(cat, "ds", {"a": A, "b": B})
    s2 = commit(cat, "ds", {"b": B2, "c": C})
    report = dataset_cost(cat, "ds", prices, last=1)
    (only,) = report.snapshots
    assert only.snapshot_id == s2 and report.truncated
    assert only.shared.bytes == 1000  # still relative to s1, which is not reported
    assert only.stored.bytes == only.reached.bytes
    assert report.dataset_footprint.bytes == _size(cat, _reach(cat, s2))
    assert s1 not in {f.snapshot_id for f in report.snapshots}
    with pytest.raises(InvalidInputError):
        dataset_cost(cat, "ds", prices, last=0)


def test_name_covers_every_branch_and_ref_only_its_history(cat, prices):
    s1 = commit(cat, "ds", {"a": A})
    s2 = commit(cat, "ds", {"b": B})
    cat.branches("ds").create("dev", s1)
    s3 = commit(cat, "ds", {"c": C}, branch="dev")
    everything = dataset_cost(cat, "ds", prices)
    ids = [f.snapshot_id for f in everything.snapshots]
    assert set(ids) == {s1, s2, s3} and ids[0] == s1  # parents first
    dev = dataset_cost(cat, "ds@dev", prices)
    assert [f.snapshot_id for f in dev.snapshots] == [s1, s3]
    by_id = {f.snapshot_id: f for f in everything.snapshots}
    assert by_id[s3].shared.bytes == 1000 and by_id[s2].shared.bytes == 1000


def test_each_manifest_part_is_read_once(tmp_path, prices):
    Catalog.init(str(tmp_path / "s"))
    cat = Catalog(Catalog.open(str(tmp_path / "s")).store, target_rows=4)
    items = {f"k{i:03d}": bytes([i]) * (100 + i) for i in range(60)}
    commit(cat, "ds", items)
    commit(cat, "ds", {"k007": b"changed"})
    commit(cat, "ds", {"k050": b"changed again"})
    snaps = [s for _, s in cat.log("ds")]
    parts = {p.id for s in snaps for p in s.parts}
    assert len(parts) < sum(len(s.parts) for s in snaps)  # they share parts
    report = dataset_cost(cat, "ds", prices)
    gets = sum(t.usage(OpClass.GET).requests for t in report.read)
    refs = 1  # the one branch ref
    assert gets == refs + len(snaps) + len(parts)
    assert sum(t.usage(OpClass.LIST).requests for t in report.read) >= 1


def test_a_history_longer_than_the_snapshot_cache_is_read_once(tmp_path, prices):
    """cost walks the history five times: each snapshot object is still one GET."""
    Catalog.init(str(tmp_path / "s"))
    cat = Catalog.open(str(tmp_path / "s"))
    commit(cat, "ds", {"a": A})
    for i in range(1030):  # more than a Catalog keeps by default
        cat.commit("ds", message=f"e{i}", allow_empty=True)
    report = dataset_cost(cat, "ds", prices)
    parts = {p.id for f in report.snapshots for p in cat.snapshot(f.snapshot_id).parts}
    gets = sum(t.usage(OpClass.GET).requests for t in report.read)
    assert len(report.snapshots) == 1031
    assert gets == 1 + len(report.snapshots) + len(parts)


def test_missing_shard_is_reported(cat, prices):
    sid = commit(cat, "ds", {"a": A, "b": B})
    cat.store.delete(object_key(hash_bytes(B)))
    (fig,) = dataset_cost(cat, "ds", prices).snapshots
    assert fig.missing == 1 and fig.snapshot_id == sid
    assert fig.reached.bytes == _size(cat, _reach(cat, sid) - {hash_bytes(B)})


def test_unknown_dataset(cat, prices):
    with pytest.raises(NotFoundError):
        dataset_cost(cat, "nope", prices)


# -- du and pull -----------------------------------------------------------------------


class FakeCache:
    """A CacheCopies over a directory with one file per object id."""

    def __init__(self, root):
        self.root = str(root)
        os.makedirs(self.root, exist_ok=True)

    def path_of(self, object_id):
        return os.path.join(self.root, object_id)

    def usage_bytes(self):
        return sum(os.path.getsize(os.path.join(self.root, n)) for n in os.listdir(self.root))


def test_disk_usage_per_tier(cat, tmp_path):
    sid = commit(cat, "ds", {"a": A, "b": B})
    cache = FakeCache(tmp_path / "cache")
    (tmp_path / "cache" / hash_bytes(A)).write_bytes(A)
    usage = disk_usage(cat, "ds", cache=cache)
    snap = cat.snapshot(sid)
    assert usage.snapshot == sid
    assert usage.objects == 3 + len(snap.parts)  # the snapshot object, its parts, 2 shards
    assert usage.bytes == 3000 + snap.manifest_bytes + len(cat.store.get(object_key(sid)))
    store, hot = usage.tiers
    assert (store.tier, store.objects, store.missing_objects) == ("local", usage.objects, 0)
    assert (hot.tier, hot.objects, hot.bytes) == ("cache", 1, 1000)
    assert hot.missing_bytes == usage.bytes - 1000
    # one per shard and one for the snapshot object (parts: sizes from the snapshot)
    assert sum(t.usage(OpClass.HEAD).requests for t in usage.read) == 3


def test_disk_usage_of_the_whole_store(cat, tmp_path):
    commit(cat, "ds", {"a": A})
    cache = FakeCache(tmp_path / "cache")
    (tmp_path / "cache" / "x").write_bytes(b"12345")
    usage = disk_usage(cat, cache=cache)
    listed = list(cat.store.list_info("objects/"))
    assert usage.snapshot is None and usage.objects == len(listed)
    assert usage.tiers[0].bytes == sum(i.size_bytes for i in listed)
    assert usage.tiers[1].bytes == 5 and usage.tiers[1].objects is None


@pytest.fixture
def shard_cache():
    import simstore.loaders._cache as cache_mod
    import simstore.loaders._stats as stats_mod

    def open_cache(directory, limit):
        return cache_mod.ShardCache(
            cache_mod.CacheConfig(directory=directory, limit_bytes=limit), stats_mod.Counters()
        )

    return open_cache


def test_pull_fills_the_loader_cache(cat, tmp_path, shard_cache):
    sid = commit(cat, "ds", {"a": A, "b": B})
    d = str(tmp_path / "hot")
    report = warm_cache(cat, "ds", d, lambda limit: shard_cache(d, limit), fields=["u"])
    snap = cat.snapshot(sid)
    snap_bytes = len(cat.store.get(object_key(sid)))
    assert report.objects == 3 + len(snap.parts) and report.fetched == report.objects
    assert report.fetched_bytes == 3000 + snap.manifest_bytes + snap_bytes == report.bytes
    cache = shard_cache(d, 1 << 30)
    for oid in [sid, hash_bytes(A), hash_bytes(B), *(p.id for p in snap.parts)]:
        with open(cache.path_of(oid), "rb") as f:
            assert hash_bytes(f.read()) == oid
    usage = disk_usage(cat, "ds", cache=cache)
    assert usage.tiers[1].objects == usage.objects and usage.tiers[1].missing_objects == 0
    again = warm_cache(cat, "ds", d, lambda limit: shard_cache(d, limit))
    assert again.already_cached == again.objects and again.fetched == 0


def test_a_cut_cache_copy_is_missing_for_du_and_fetched_again_by_pull(
    cat, tmp_path, shard_cache
):
    commit(cat, "ds", {"a": A, "b": B})
    d = str(tmp_path / "hot")
    warm_cache(cat, "ds", d, lambda limit: shard_cache(d, limit))
    cache = shard_cache(d, 1 << 30)
    with open(cache.path_of(hash_bytes(B)), "r+b") as f:
        f.truncate(100)
    usage = disk_usage(cat, "ds", cache=cache)
    hot = usage.tiers[1]
    assert (hot.objects, hot.missing_objects) == (usage.objects - 1, 1)
    assert (hot.bytes, hot.missing_bytes) == (usage.bytes - len(B), len(B))
    dropped = []

    def opened(limit):  # the pull's cache, watched: the cut copy goes under the fill lock
        filler = shard_cache(d, limit)
        drop = filler.drop_if_not_size
        filler.drop_if_not_size = lambda oid, size: dropped.append(drop(oid, size))
        return filler

    again = warm_cache(cat, "ds", d, opened)
    assert (again.fetched, again.fetched_bytes) == (1, len(B))
    assert sorted(dropped) == [False] * (len(dropped) - 1) + [True]
    with open(cache.path_of(hash_bytes(B)), "rb") as f:
        assert f.read() == B


def test_pull_reads_big_objects_in_ranges(cat, tmp_path, shard_cache):
    big = os.urandom(10_000)
    commit(cat, "ds", {"big": big})
    d = str(tmp_path / "hot")
    report = warm_cache(cat, "ds", d, lambda limit: shard_cache(d, limit), block_bytes=4096)
    ranged = sum(t.usage(OpClass.RANGE_GET).requests for t in report.read)
    assert ranged == 3  # 4096 + 4096 + 1808 bytes
    with open(shard_cache(d, 1 << 30).path_of(hash_bytes(big)), "rb") as f:
        assert f.read() == big


def test_pull_refuses_a_limit_smaller_than_the_snapshot(cat, tmp_path, shard_cache):
    sid = commit(cat, "ds", {"a": A, "b": B})
    need = 3000 + cat.snapshot(sid).manifest_bytes + len(cat.store.get(object_key(sid)))
    d = str(tmp_path / "hot")
    with pytest.raises(InvalidInputError, match=f"needs {need} bytes") as info:
        warm_cache(cat, "ds", d, lambda limit: shard_cache(d, limit), limit_bytes=2000)
    assert "2000 bytes" in str(info.value)
    assert not os.path.exists(os.path.join(d, "objects", hash_bytes(A)[:2], hash_bytes(A)))


def test_pull_with_a_limit_above_the_free_space_is_refused_before_any_copy(
    cat, tmp_path, shard_cache, monkeypatch
):
    # a --limit larger than the disk's free space filled the disk and stopped half way
    import shutil as real_shutil
    from collections import namedtuple

    sid = commit(cat, "ds", {"a": A, "b": B})
    need = 3000 + cat.snapshot(sid).manifest_bytes + len(cat.store.get(object_key(sid)))
    usage = namedtuple("usage", "total used free")

    real_usage = real_shutil.disk_usage

    def tiny_disk(path):
        real_usage(path)  # the folder checked is a real one
        return usage(1 << 20, (1 << 20) - 1000, 1000)

    monkeypatch.setattr(real_shutil, "disk_usage", tiny_disk)
    d = str(tmp_path / "hot")
    with pytest.raises(InvalidInputError, match=r"needs \d+ bytes") as info:
        warm_cache(cat, "ds", d, lambda limit: shard_cache(d, limit), limit_bytes=1 << 40)
    on_disk = int(str(info.value).split("needs ")[1].split(" bytes")[0])
    assert on_disk >= need  # in whole blocks of the disk
    assert "free space of" in str(info.value) and "1000 bytes" in str(info.value)
    assert not os.path.exists(d)  # nothing made, nothing copied
    monkeypatch.setattr(real_shutil, "disk_usage", real_usage)
    report = warm_cache(cat, "ds", d, lambda limit: shard_cache(d, limit), limit_bytes=1 << 40)
    assert report.fetched == report.objects and report.limit_bytes == 1 << 40


def test_pull_verifies_hashes(cat, tmp_path, shard_cache):
    commit(cat, "ds", {"a": A})
    path = cat.store.local_path(object_key(hash_bytes(A)))
    with open(path, "wb") as f:
        f.write(b"x" * 1000)  # same size, wrong bytes
    d = str(tmp_path / "hot")
    with pytest.raises(IntegrityError, match=hash_bytes(A)):
        warm_cache(cat, "ds", d, lambda limit: shard_cache(d, limit))
    assert not os.path.exists(shard_cache(d, 1 << 30).path_of(hash_bytes(A)))


def test_pull_checks_fields_and_missing_objects(cat, tmp_path, shard_cache):
    commit(cat, "ds", {"a": A})
    d = str(tmp_path / "hot")
    with pytest.raises(InvalidInputError, match="no field 'v'"):
        warm_cache(cat, "ds", d, lambda limit: shard_cache(d, limit), fields=["v"])
    cat.store.delete(object_key(hash_bytes(A)))
    with pytest.raises(IntegrityError, match=hash_bytes(A)):
        warm_cache(cat, "ds", d, lambda limit: shard_cache(d, limit))


# -- files -----------------------------------------------------------------------------


def test_price_files_and_run_reports(tmp_path):
    table_file = tmp_path / "p.toml"
    table_file.write_text('[tiers.s3-standard]\nget_per_1000 = 0.001\nas_of = "2025-01"\n')
    prices = read_price_table([str(table_file)], ["s3-standard.put_per_1000=1"])
    s3 = prices.tier("s3-standard")
    assert (s3.get_per_1000, s3.put_per_1000, s3.storage_per_gib_month) == (0.001, 1.0, 0.023)
    report = tmp_path / "run.json"
    report.write_text(
        json.dumps(
            {
                "kind": "simstore-loader-report",
                "format_version": 1,
                "epochs": [0],
                "seconds": 10,
                "tiers": {"s3": {"bytes": 5, "requests": 2000}},
            }
        )
    )
    assert read_run_reports([str(report)]).tiers[0].requests == 2000
    cost = run_cost([str(report)], prices)
    assert cost.total_usd == pytest.approx(2 * 0.001)
    cheaper = run_cost([str(report)], prices, tier_prices={"s3": "gcs-standard"})
    assert cheaper.total_usd == pytest.approx(2 * 0.0004)
    with pytest.raises(InvalidInputError, match="missing.toml"):
        read_price_table([str(tmp_path / "missing.toml")])
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(FormatError, match="bad.json"):
        read_run_reports([str(bad)])



def test_a_cut_copy_is_dropped_under_the_lock_its_fills_hold(cat, tmp_path, shard_cache):
    # pull measured a cut copy, then unlinked the path with no lock: a good copy another
    # process had renamed into place in between was deleted (and fetched again)
    commit(cat, "ds", {"a": A, "b": B})
    d = str(tmp_path / "hot")
    warm_cache(cat, "ds", d, lambda limit: shard_cache(d, limit))
    cache = shard_cache(d, 1 << 30)
    oid = hash_bytes(B)
    assert not cache.drop_if_not_size(oid, len(B))  # a whole copy stays
    with open(cache.path_of(oid), "r+b") as f:
        f.truncate(100)
    dropped = []
    with cache._lock(_stripe(oid)):  # a fill of this object under way elsewhere
        waiting = threading.Thread(
            target=lambda: dropped.append(cache.drop_if_not_size(oid, len(B))))
        waiting.start()
        waiting.join(0.5)
        assert waiting.is_alive() and not dropped  # it waits for the fill
        tmp = cache.path_of(oid) + ".filled"
        with open(tmp, "wb") as f:
            f.write(B)
        os.replace(tmp, cache.path_of(oid))  # the fill's good copy lands
    waiting.join()
    assert dropped == [False]
    with open(cache.path_of(oid), "rb") as f:
        assert f.read() == B
    assert not cache.drop_if_not_size(oid[::-1], 5)  # none held: nothing to drop
