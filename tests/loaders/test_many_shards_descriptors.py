"""A warm disk cache in front of a snapshot of many small shards stays within the
limit on open files.

Each cache copy prepared for a reader is pinned by an open descriptor (a shared flock)
until the reader opens it, and a chunk of small shards names up to one shard per sample:
a warm epoch prepared every shard of a chunk at once, 2,487 descriptors for 2,500
one-sample shards, and failed under the common limit of 1,024 with "Too many open files"
(a raw pyarrow error, or healthy shards skipped as corrupt with ``on_corrupt="skip"``).
At most ``prefetch.shards + max_open_shards`` shards are prepared at once now.
"""

import os
import subprocess
import sys
import textwrap

import numpy as np

import simstore
from simstore.catalog import Catalog

_SCRIPT = textwrap.dedent(
    """
    import resource, sys
    sys.path.insert(0, sys.argv[3])
    from loader_helpers import RemoteLikeStore
    from simstore.loaders import SimDataset

    store, cache = sys.argv[1], sys.argv[2]
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (128, hard))
    ds = SimDataset(RemoteLikeStore(store, read_only=True), "d", cache_dir=cache,
                    on_corrupt="skip")
    for epoch in range(2):  # the first fills the cache, the second reads it warm
        ds.set_epoch(epoch)
        values = sorted(int(s["data"][0]) for s in ds)
        assert values == list(range(300)), (epoch, len(values))
    print(ds.stats()["cache_hits"], ds.stats()["cache_misses"])
    """
)


def test_a_warm_epoch_over_300_one_sample_shards_under_a_limit_of_128(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(300):
        np.save(src / f"f{i:03d}.npy", np.full(4, i, dtype=np.int32))
    store = str(tmp_path / "store")
    r = simstore.ingest([src], dataset="d", store=Catalog.init(store), snapshot=True,
                        shard_size=64)
    assert r.shards == 300  # one sample per shard
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, store, str(tmp_path / "cache"),
         os.path.dirname(__file__)],
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "skipping" not in done.stderr  # no healthy shard taken for a corrupt one
    hits, misses = map(int, done.stdout.split())
    assert (hits, misses) == (300, 300)
