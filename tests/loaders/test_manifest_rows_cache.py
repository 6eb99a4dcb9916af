"""The node's cache of decoded manifest rows: a later job loads a part's stream rows from
a flat file instead of reading and decoding the part's Parquet bytes.

The rows decide which shards and byte ranges are read and the stream's order, so an
entry is used only when it checks out (its checksum, its part, its row count) and only
from a folder private to the user; anything else is a miss, and the part is read from
the store and the entry written again. The stream is the same with the cache as without.
"""

from __future__ import annotations

import logging
import os

import hypothesis.strategies as st
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from loader_helpers import commit_samples, keys_of, make_samples, open_test_shard
from simstore.loaders import SimDataLoader, SimDataset
from simstore.loaders._partrows import PartRows, PartRowsCache, part_rows_cache
from simstore.loaders._source import STREAM_COLUMNS

from simstore.errors import IntegrityError
from simstore.hashing import hash_bytes, object_key
from simstore.manifest import MANIFEST_SCHEMA, decode_part, encode_part


def _part(keys: list[str], shards: list[str], positions: list[int]) -> PartRows:
    n = len(keys)
    table = pa.table({
        "key": pa.array(keys, pa.string()),
        "sample_hash": pa.array([bytes(16)] * n, pa.binary(16)),
        "shard": pa.array(shards, pa.string()),
        "position": pa.array(positions, pa.int64()),
        "size_bytes": pa.array([p * 3 + 1 for p in positions], pa.int64()),
    }, schema=MANIFEST_SCHEMA)
    return PartRows.from_table(decode_part(encode_part(table), columns=STREAM_COLUMNS))


_IDS = [hash_bytes(str(i).encode()) for i in range(6)]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=12), min_size=0, max_size=40, unique=True),
       st.data())
def test_rows_survive_the_round_trip_and_find_each_key(keys, data):
    keys = sorted(keys, key=lambda k: k.encode())  # a part's keys are in order
    shards = [_IDS[data.draw(st.integers(0, 5))] for _ in keys]
    positions = data.draw(st.lists(st.integers(0, 1 << 40), min_size=len(keys),
                                   max_size=len(keys)))
    rows = _part(keys, shards, positions)
    back = PartRows.from_bytes(rows.to_bytes("p1"), "p1", len(keys))
    assert back.shard_ids == rows.shard_ids
    assert [back.shard_ids[c] for c in back.shard] == shards
    assert back.position.tolist() == positions
    assert back.size_bytes.tolist() == [p * 3 + 1 for p in positions]
    assert [back.key(i) for i in range(len(back))] == keys
    for i, key in enumerate(keys):
        assert back.find(key) == i
    assert back.find(data.draw(st.text(max_size=12).filter(lambda k: k not in keys))) is None


def test_an_entry_that_does_not_check_out_is_refused():
    rows = _part(["a", "b", "c"], [_IDS[0], _IDS[1], _IDS[0]], [0, 1, 2])
    good = rows.to_bytes("p1")
    assert PartRows.from_bytes(good, "p1", 3).position.tolist() == [0, 1, 2]
    for at in range(0, len(good), 7):  # any byte changed
        bad = bytearray(good)
        bad[at] ^= 0x20
        with pytest.raises(ValueError):
            PartRows.from_bytes(bytes(bad), "p1", 3)
    for cut in (0, 10, len(good) - 1):
        with pytest.raises(ValueError):
            PartRows.from_bytes(good[:cut], "p1", 3)
    with pytest.raises(ValueError, match="holds 'p1'"):
        PartRows.from_bytes(good, "p2", 3)  # another part's rows under its name
    with pytest.raises(ValueError, match="of 3 rows"):
        PartRows.from_bytes(good, "p1", 4)


@pytest.fixture
def node(tmp_path, monkeypatch):
    folder = tmp_path / "node"
    monkeypatch.setenv("SIMSTORE_VERIFIED_DIR", str(folder))
    return folder / "rows"


@pytest.fixture
def parts_store(tmp_path):
    store = str(tmp_path / "s")
    samples = make_samples(300, runs=6)
    commit_samples(store, "ds", samples, per_shard=25, target_rows=16)
    return store, samples


def _job(store, workers=0, context="fork", **kw):
    ds = SimDataset(store, "ds@main", shuffle=True, seed=4, shard_opener=open_test_shard,
                    **kw)
    ds.set_epoch(1)
    if workers:
        loader = SimDataLoader(ds, batch_size=16, num_workers=workers,
                               multiprocessing_context=context)
        keys = keys_of(loader)
        return keys, loader.stats()
    return keys_of(ds), ds.stats()


@pytest.mark.parametrize(("workers", "context"), [(0, "fork"), (2, "fork"), (1, "spawn")])
def test_a_later_job_loads_the_rows_from_the_node_and_streams_the_same(
        parts_store, node, monkeypatch, workers, context):
    store, samples = parts_store
    monkeypatch.setenv("SIMSTORE_VERIFIED_DIR", "")
    plain, _ = _job(store, workers, context)  # no cache at all
    monkeypatch.setenv("SIMSTORE_VERIFIED_DIR", str(node.parent))
    first, cold = _job(store, workers, context)
    entries = sorted(os.listdir(node))
    parts = SimDataset(store, "ds@main", shard_opener=open_test_shard)._sources[0].part_ids
    assert entries == sorted(f"{p.decode()}.rows" for p in parts) and len(parts) >= 8
    # (with workers, a process may load what its parent or sibling kept moments before)
    assert cold["manifest_parts"] > 0 and (cold["manifest_rows_cached"] == 0 or workers)
    second, warm = _job(store, workers, context)  # (a spawned worker: the cache pickled)
    assert warm["manifest_parts"] == 0 and warm["manifest_bytes"] == 0
    assert warm["manifest_rows_cached"] >= len(parts)
    assert first == second == plain
    assert sorted(second) == sorted(s.key for s in samples)
    report = SimDataset(store, "ds@main", shard_opener=open_test_shard)
    for _ in report:
        pass
    assert report.report()["manifest"]["rows_cached"] > 0


def test_get_finds_keys_through_the_cached_rows(parts_store, node):
    store, samples = parts_store
    want = [samples[i].key for i in (0, 77, 299, 150)]
    cold = SimDataset(store, "ds@main", shard_opener=open_test_shard)
    got = cold.get_many(want)
    kept = [name.removesuffix(".rows") for name in os.listdir(node)]
    assert 1 <= len(kept) <= len(want)  # the parts that hold the keys
    for part in kept:  # the later job cannot read them from the store
        os.unlink(os.path.join(store, object_key(part)))
    warm = SimDataset(store, "ds@main", shard_opener=open_test_shard)
    again = warm.get_many(want)
    assert [s["__key__"] for s in got] == [s["__key__"] for s in again] == want
    for a, b, i in zip(got, again, (0, 77, 299, 150), strict=True):
        np.testing.assert_array_equal(a["u"].numpy(), samples[i].fields["u"])
        np.testing.assert_array_equal(b["u"].numpy(), samples[i].fields["u"])


@pytest.mark.parametrize("damage", ["flip", "truncate", "swap"])
def test_a_damaged_entry_is_a_miss_and_written_again(parts_store, node, damage):
    store, _ = parts_store
    first, _ = _job(store)
    entries = sorted(os.listdir(node))
    victim = node / entries[0]
    good = victim.read_bytes()
    if damage == "flip":
        victim.write_bytes(good[:40] + bytes([good[40] ^ 1]) + good[41:])
    elif damage == "truncate":
        victim.write_bytes(good[:len(good) // 2])
    else:  # another part's (valid) entry under this part's name
        victim.write_bytes((node / entries[1]).read_bytes())
    second, stats = _job(store)
    assert second == first
    assert stats["manifest_parts"] == 1  # that part alone was read from the store
    assert victim.read_bytes() == good  # and its entry written again


def test_a_damaged_part_in_the_store_is_named_when_not_cached(parts_store, node):
    store, _ = parts_store
    ds = SimDataset(store, "ds@main", shuffle=True, seed=4, shard_opener=open_test_shard)
    part = ds._sources[0].part_ids[ds._sources[0].layout(0).parts_of(0)[0]].decode()
    with open(os.path.join(store, object_key(part)), "r+b") as f:
        f.seek(20)
        f.write(b"\xff")
    with pytest.raises(IntegrityError, match=part):
        next(iter(ds))
    assert not (node / f"{part}.rows").exists()


def test_a_folder_others_can_write_is_not_used(parts_store, node, caplog):
    store, _ = parts_store
    node.mkdir(parents=True, mode=0o700)
    os.chmod(node, 0o777)
    with caplog.at_level(logging.WARNING, logger="simstore.loaders"):
        _, stats = _job(store)
    assert os.listdir(node) == []
    assert stats["manifest_rows_cached"] == 0
    assert any("manifest rows not cached" in r.getMessage() and str(node) in r.getMessage()
               for r in caplog.records)


def test_an_empty_records_setting_turns_the_cache_off(monkeypatch, tmp_path):
    monkeypatch.setenv("SIMSTORE_VERIFIED_DIR", "")
    assert part_rows_cache() is None
    monkeypatch.setenv("SIMSTORE_VERIFIED_DIR", str(tmp_path / "v"))
    cache = part_rows_cache()
    assert cache is not None and cache.root == str(tmp_path / "v" / "rows")


def test_eviction_keeps_the_entries_used_last_within_the_limit(tmp_path):
    rows = _part([f"k{i:04d}" for i in range(50)], [_IDS[i % 3] for i in range(50)],
                 list(range(50)))
    size = len(rows.to_bytes("p0"))
    cache = PartRowsCache(str(tmp_path / "rows"), limit_bytes=100 * size)
    for i in range(4):
        assert cache.put(f"p{i}", rows)
        os.utime(cache._path(f"p{i}"), (1000 + i, 1000 + i))  # written in this order
    cache.limit_bytes = 3 * size
    assert cache.get("p0", 50) is not None  # used now: the newest
    stale = tmp_path / "rows" / "p9.rows.1-2.tmp"  # a writer that died
    stale.write_bytes(b"x")
    os.utime(stale, (1, 1))
    assert cache.evict() == 1
    assert sorted(os.listdir(tmp_path / "rows")) == ["p0.rows", "p2.rows", "p3.rows"]
    assert cache.get("p1", 50) is None and cache.get("p0", 50) is not None


def test_a_process_evicts_when_it_has_written_enough(tmp_path):
    rows = _part([f"k{i:04d}" for i in range(50)], [_IDS[0]] * 50, list(range(50)))
    size = len(rows.to_bytes("p0"))
    cache = PartRowsCache(str(tmp_path / "rows"), limit_bytes=2 * size)
    for i in range(40):
        assert cache.put(f"p{i}", rows)
    # the folder never holds much more than the limit (a scan after each limit / 8)
    assert len(os.listdir(tmp_path / "rows")) <= 3
    assert cache.get("p39", 50) is not None


def test_many_short_jobs_evict_too_at_random(tmp_path, monkeypatch):
    from simstore.loaders import _nodecache

    rows = _part([f"k{i:04d}" for i in range(50)], [_IDS[0]] * 50, list(range(50)))
    size = len(rows.to_bytes("p0"))
    folder = str(tmp_path / "rows")
    limit = 9 * size  # one entry is less than the eighth of it a process writes to scan
    monkeypatch.setattr(_nodecache, "_draw", lambda: 0.999)  # the draw never says scan
    for i in range(12):  # twelve jobs, an entry each
        assert PartRowsCache(folder, limit_bytes=limit).put(f"a{i:02d}", rows)
    assert len(os.listdir(folder)) == 12  # over the limit: none of them scanned
    monkeypatch.setattr(_nodecache, "_draw", lambda: 0.0)  # the draw says scan
    assert PartRowsCache(folder, limit_bytes=limit).put("b", rows)
    assert len(os.listdir(folder)) == 9
    assert "b.rows" in os.listdir(folder)  # the newest kept
