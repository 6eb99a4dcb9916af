"""The default cache limit counts what the cache holds as its own.

It was half the disk's free space: a warm cache that filled most of a small disk (a
``simstore pull`` counts the copies as room) left little free, so a job reading through
it with the default limit got a limit below what the cache held, and trimmed it at its
end: every warm copy evicted, the next job cold. The disk is a real size-limited tmpfs.
"""

from __future__ import annotations

import os
import uuid

import numpy as np
from click.testing import CliRunner
from simstore.cli import main
from simstore.loaders import SimDataset
from simstore.loaders._cache import copies_bytes

from simstore.catalog import Catalog
from simstore.ingest import ingest


def test_a_job_with_the_default_limit_keeps_a_warm_cache(tmp_path, small_fs):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(6):  # about 1 MiB a sample, one sample a shard
        np.savez(src / f"r{i}.npz", x=np.random.default_rng(i).random(1 << 17))
    store = f"memory://default-limit-{uuid.uuid4().hex}"  # read through the cache
    Catalog.init(store)
    ingest([str(src)], dataset="d", store=store, snapshot=True, shard_size="1MiB",
           compression="none")
    disk = small_fs("16m")
    cache = os.path.join(disk, "cache")
    r = CliRunner().invoke(main, ["--store", store, "pull", "d", "--cache", cache])
    assert r.exit_code == 0, r.output
    held = copies_bytes(cache)
    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    assert held > free // 2  # the case: half the free space is less than the cache holds

    ds = SimDataset(store, "d", cache_dir=cache)
    assert ds._options.cache.limit_bytes >= held
    assert len(list(ds)) == 6
    stats = ds.stats()
    assert stats["cache_hits"] >= 6 and stats["cache_misses"] == 0, stats
    assert stats["cache_evictions"] == 0, stats
    assert copies_bytes(cache) == held  # every warm copy is still there
