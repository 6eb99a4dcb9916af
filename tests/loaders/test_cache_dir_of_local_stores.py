"""A dataset on a local store neither creates nor opens its ``cache_dir``.

docs/loader.md: "a local store reads no cache, so its cache_dir is not opened"; yet
``SimDataset(local_store, ..., cache_dir=...)`` made the folder (and its parents) to
measure its free space. Stores read through the cache (memory://, S3) still make it.
"""

from __future__ import annotations

import uuid

import pytest
from loader_helpers import commit_samples, keys_of, make_samples, open_test_shard, refused
from simstore.loaders import SimDataLoader, SimDataset


@pytest.mark.parametrize("limit", [None, "1MiB"])
def test_a_local_store_leaves_cache_dir_alone(small, tmp_path, limit):
    store, ref, samples = small
    parent = tmp_path / "nvme"
    cache = parent / "cache"
    ds = SimDataset(store, ref, shard_opener=open_test_shard, cache_dir=str(cache),
                    cache_limit=limit)
    assert sorted(keys_of(ds)) == sorted(samples)
    assert sorted(keys_of(SimDataLoader(ds, batch_size=8))) == sorted(samples)
    other = SimDataset(store, ref, shard_opener=open_test_shard, cache_dir=str(cache),
                       seed=1)
    assert sorted(keys_of(SimDataset.mix([ds, other]))) == sorted(list(samples) * 2)
    assert not parent.exists()


def test_a_local_store_still_checks_cache_dir(small, tmp_path):
    store, ref, _ = small
    refused("cache_dir must be a directory path, got 123", SimDataset, store, ref,
            cache_dir=123)
    refused("cache_dir must be a directory path", SimDataset, store, ref, cache_dir="")


def test_the_default_limit_is_measured_without_making_the_folder(small, tmp_path):
    store, ref, _ = small
    cache = tmp_path / "a" / "b" / "cache"
    ds = SimDataset(store, ref, shard_opener=open_test_shard, cache_dir=str(cache))
    limit = ds._options.cache.limit_bytes
    assert 0 < limit <= 32 << 30
    assert not (tmp_path / "a").exists()


def test_a_memory_store_reads_through_cache_dir_and_makes_it(tmp_path):
    url = f"memory://cache-dir-{uuid.uuid4().hex}"
    samples = make_samples(20)
    commit_samples(url, "sim", samples, per_shard=5)
    cache = tmp_path / "nvme" / "cache"
    ds = SimDataset(url, "sim", shard_opener=open_test_shard, cache_dir=str(cache))
    assert sorted(keys_of(ds)) == sorted(s.key for s in samples)
    assert (cache / "simstore-cache.json").is_file()
    assert ds.stats()["cache_misses"] == 4


@pytest.mark.s3
def test_an_s3_store_makes_cache_dir(s3_bucket, tmp_path):
    url = f"s3://{s3_bucket()}/root"
    samples = make_samples(20)
    commit_samples(url, "sim", samples, per_shard=5)
    cache = tmp_path / "nvme" / "cache"
    ds = SimDataset(url, "sim", shard_opener=open_test_shard, cache_dir=str(cache))
    assert (cache / "simstore-cache.json").is_file()  # claimed at construction
    assert sorted(keys_of(ds)) == sorted(s.key for s in samples)
    assert ds.stats()["cache_misses"] == 4
