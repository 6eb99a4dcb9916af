"""A REF that names its snapshot by the full id, read from a remote store through a disk
cache: a cold cache costs two round trips for the snapshot (its first bytes, the cache's
fill), not three; a warm cache asks nothing; an id that is not a snapshot of the dataset
is refused as before, and a shard named by mistake is never downloaded whole."""

from __future__ import annotations

import os

import pytest
from loader_helpers import RemoteLikeStore, commit_samples, make_samples, open_test_shard
from simstore.loaders import SimDataset

from simstore.catalog import Catalog
from simstore.errors import NotFoundError
from simstore.hashing import object_key


class CountingStore(RemoteLikeStore):
    """A remote-like store that notes every read: (key, whether it was ranged)."""

    def __init__(self, root: str) -> None:
        super().__init__(root, read_only=True)
        self.reads: list[tuple[str, bool]] = []

    def get(
        self, key: str, byte_range: tuple[int, int] | None = None, *,
        max_bytes: int | None = None,
    ) -> bytes:
        self.reads.append((key, byte_range is not None))
        return super().get(key, byte_range, max_bytes=max_bytes)

    def count(self, oid: str) -> int:
        return sum(1 for key, _ in self.reads if key == object_key(oid))


def _dataset(store: CountingStore, ref: str, cache: str) -> SimDataset:
    return SimDataset(store, ref, cache_dir=cache, cache_limit="64MiB",
                      shard_opener=open_test_shard)


def test_a_full_id_on_a_cold_cache_reads_the_snapshot_in_two_round_trips(store_path, tmp_path):
    sid = commit_samples(store_path, "sim", make_samples(20), per_shard=10)
    cache = str(tmp_path / "cache")
    store = CountingStore(store_path)
    ds = _dataset(store, f"sim@{sid}", cache)
    assert ds.snapshot_id == sid
    assert store.count(sid) == 2  # its first bytes, then the cache's fill
    assert os.path.exists(os.path.join(cache, "objects", sid[:2], sid))
    keys = sorted(s["__key__"] for s in ds)
    assert keys == sorted(s.key for s in make_samples(20))
    again = CountingStore(store_path)
    assert _dataset(again, f"sim@{sid}", cache).snapshot_id == sid
    assert again.count(sid) == 0  # a warm cache holds it


def test_a_full_id_of_another_datasets_snapshot_or_of_a_shard_is_refused(store_path, tmp_path):
    commit_samples(store_path, "sim", make_samples(20), per_shard=10)
    other = commit_samples(store_path, "other", make_samples(10, seed=1), per_shard=10)
    cache = str(tmp_path / "cache")
    with pytest.raises(NotFoundError, match=f"dataset 'sim' has no snapshot '{other}'"):
        _dataset(CountingStore(store_path), f"sim@{other}", cache)
    cat = Catalog.open(store_path)
    shard = next(iter(cat.iter_parts(cat.snapshot(cat.resolve("sim"))))).column("shard")[0]
    store = CountingStore(store_path)
    with pytest.raises(NotFoundError, match=f"dataset 'sim' has no snapshot '{shard}'"):
        _dataset(store, f"sim@{shard}", cache)
    # only its first bytes were read (each lookup reads them), and nothing of it was cached
    heads = [ranged for key, ranged in store.reads if key == object_key(str(shard))]
    assert heads and all(heads)
    assert not os.path.exists(os.path.join(cache, "objects", str(shard)[:2], str(shard)))
