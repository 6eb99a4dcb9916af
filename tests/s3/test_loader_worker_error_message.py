"""A simstore error raised in a DataLoader worker reaches the training loop as it was raised.

Torch re-raises a worker's exception with its class but a message of the worker's whole
traceback ("Caught StorageError in DataLoader worker process 0." and some hundred lines).
``SimDataLoader`` raises simstore's errors again with their own one-line message, chained
from torch's exception, whose traceback stays at hand as ``__cause__``. Real worker
processes (forked), a real S3 store on moto, and a shard whose every GET is refused.
"""

from __future__ import annotations

import numpy as np
import pytest

from simstore.catalog import Catalog
from simstore.errors import StorageError
from simstore.hashing import object_key
from simstore.ingest import ingest

pytestmark = [pytest.mark.s3, pytest.mark.multiprocess]

FAST = {"backoff_base_s": 0.001, "backoff_max_s": 0.005, "read_timeout_s": 10}


@pytest.fixture
def dataset(s3_bucket, tmp_path):
    """8 samples in 4 shards of dataset 'd' on S3; (url, shard ids)."""
    url = f"s3://{s3_bucket()}/store"
    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(0)
    for i in range(8):
        np.savez(src / f"run{i}.npz", u=rng.normal(size=(64, 64)).astype(np.float32))
    Catalog.init(url, storage_options=FAST)
    ingest([str(src)], dataset="d", store=Catalog.open(url, storage_options=FAST),
           snapshot=True, message="x", shard_size=40_000)
    cat = Catalog.open(url, storage_options=FAST)
    snap = cat.snapshot(cat.resolve("d"))
    shards = sorted({s for t in cat.iter_parts(snap) for s in t.column("shard").to_pylist()})
    assert len(shards) >= 2
    return url, shards


def test_a_fill_that_fails_in_a_worker_raises_the_workers_one_line_error(
    dataset, fault_proxy, tmp_path
):
    from simstore.loaders import SimDataLoader, SimDataset

    url, shards = dataset
    bad = shards[0]
    fault_proxy.fail_share(1.0, "slowdown", seed=0, methods=["GET"], path_contains=bad)
    options = {**FAST, "endpoint_url": fault_proxy.endpoint_url, "max_attempts": 2}
    ds = SimDataset(url, "d", shuffle=False, storage_options=options,
                    cache_dir=str(tmp_path / "cache"))
    loader = SimDataLoader(ds, batch_size=2, num_workers=2)
    with pytest.raises(StorageError) as info:
        for _ in loader:
            pass
    error = info.value
    assert type(error) is StorageError
    assert str(error) == (
        f"{url}/{object_key(bad)}: read failed after 2 attempts: "
        "SlowDown (HTTP 503): Please reduce your request rate."
    )
    assert error.message == str(error)
    # torch's exception, with the worker's traceback, is the cause
    cause = error.__cause__
    assert isinstance(cause, StorageError)
    assert str(cause).startswith("Caught StorageError in DataLoader worker process ")
    assert "Traceback (most recent call last)" in str(cause) and str(error) in str(cause)
    assert fault_proxy.count("slowdown", "GET") >= 2  # each worker that read it: 2 GETs
