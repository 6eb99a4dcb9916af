"""The summary's byte figures: what a run read (pieces) and what it added to the store
(a task whose worker died and that ran again)."""

import json
import time
import uuid

import numpy as np
import pytest
from dask_adapters import write_values

from simstore.hashing import hash_bytes
from simstore.ingest import IngestConfig, ingest
from simstore.ingest._dask import ingest_task
from simstore.ingest._plugins import plugins_for
from simstore.ingest._records import TaskContext
from simstore.ingest._sources import discover
from simstore.sample import canonical_json

pytestmark = pytest.mark.dask

SHARD = 2048


@pytest.fixture
def series_dir(tmp_path):
    """Two small files and a 60-row table cut into pieces (as in test_pieces.py)."""
    root = tmp_path / "src"
    root.mkdir()
    np.savetxt(root / "a0.vals", np.arange(4.0))
    np.savetxt(root / "a1.vals", np.arange(6.0))
    np.savetxt(root / "series0.vals", np.random.default_rng(3).standard_normal((60, 14)))
    return root


@pytest.mark.parametrize("engine", ["local", "dask"])
def test_bytes_read_counts_the_pieces_redone_not_the_whole_file(
    catalog_at, series_dir, test_adapter, dask_address, engine
):
    cat = catalog_at(engine)
    opts = dict(
        dataset="d", store=cat, adapter=test_adapter, shard_size=SHARD, piece_bytes=SHARD,
        engine=engine, address=dask_address if engine == "dask" else None,
    )
    first = ingest([series_dir], **opts)
    size = (series_dir / "series0.vals").stat().st_size
    pieces = [t for t in first.tasks if t.files == 1 and t.bytes_in < size]
    assert len(pieces) >= 8 and first.bytes_read == first.bytes_in
    # forget one piece in the middle of the file (not the first, which hashes the file)
    records = {
        key: [row[0] for row in json.loads(cat.store.get(key))["rows"]]
        for key in cat.store.list("journal/d/")
        if "/task-" not in key
    }
    middle = next(
        (k for k, keys in records.items() if "/r" in keys[0] and not keys[0].endswith("/r0000")),
        None,
    )
    assert middle is not None
    cat.store.delete(middle)
    again = ingest([series_dir], **opts)
    redone = [t for t in again.tasks if t.shards]
    assert len(redone) == 1 and redone[0].bytes_in < size // 4
    assert again.bytes_read == redone[0].bytes_in  # the piece's share, not the file
    assert again.files_ingested == 1 and again.files_reused == 2  # a0, a1 from the journal
    # the rate is of the bytes read (the piece), not of the whole file
    assert again.to_json()["mib_per_s"] == round(again.bytes_read / 2**20 / again.seconds, 1)


def test_shards_a_dead_attempt_stored_count_as_new_for_its_run(
    catalog_at, tmp_path, test_adapter, dask_address
):
    from distributed import Client

    src = write_values(tmp_path / "src", ["a0", "a1", "crash0"])
    markers = tmp_path / "markers"
    markers.mkdir()
    # shards of one sample each: a0's and a1's are stored before crash0 kills the worker
    cfg = IngestConfig(
        adapter=test_adapter, adapter_options={"marker_dir": str(markers)}, shard_size=1,
        resume=False,
    )
    cat = catalog_at("s")
    plugins = plugins_for(cfg)
    files, _ = discover([str(src)], plugins[0])
    task = list(files)  # one task of all three files
    ctx = TaskContext(
        store=cat.store, dataset="d", config=cfg, base_schema=(),
        params_digest=hash_bytes(canonical_json(cfg.output_params())),
    )
    since = time.time()
    with Client(dask_address, set_as_default=False) as client:
        fut = client.submit(ingest_task, ctx, task, plugins, since, key=f"dead-{uuid.uuid4().hex}")
        res = fut.result().result
    assert (markers / "crash0.vals.crashed").exists()  # the first attempt died on crash0
    assert len(res.shards) == 3
    # a fresh store: every shard is new to this run, those the dead attempt stored too
    assert res.new_bytes == sum(res.shards.values())
    # a later run finds them all from before it started
    later = ingest_task(ctx, task, plugins, time.time()).result
    assert later.shards == res.shards and later.new_bytes == 0
