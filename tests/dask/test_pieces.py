"""A very large file whose adapter reads sample ranges is planned as several tasks."""

import json

import numpy as np
import pytest

from simstore.hashing import hash_file
from simstore.ingest import ingest

pytestmark = pytest.mark.dask

SHARD = 2048


@pytest.fixture
def series_dir(tmp_path):
    """Two small files and a 60-row table about ten times the shard size."""
    root = tmp_path / "src"
    root.mkdir()
    rng = np.random.default_rng(3)
    np.savetxt(root / "a0.vals", np.arange(4.0))
    np.savetxt(root / "a1.vals", np.arange(6.0))
    np.savetxt(root / "series0.vals", rng.standard_normal((60, 14)))
    assert (root / "series0.vals").stat().st_size > 8 * SHARD
    return root


def rows_of(catalog, r):
    snap = catalog.snapshot(r.snapshot_id)
    return snap.content_hash, [
        (x["key"], x["sample_hash"], x["shard"], x["position"])
        for x in catalog.manifest(snap).to_pylist()
    ]


def test_a_large_file_runs_as_pieces_with_the_same_keys_and_content(
    catalog_at, series_dir, test_adapter, dask_address
):
    opts = dict(shard_size=SHARD, piece_bytes=SHARD, snapshot=True)
    whole_cat, local_cat, dask_cat = catalog_at("whole"), catalog_at("local"), catalog_at("dask")
    whole = ingest([series_dir], dataset="d", store=whole_cat, adapter="testvals-whole", **opts)
    seen = []
    local = ingest(
        [series_dir],
        dataset="d",
        store=local_cat,
        adapter=test_adapter,
        progress=seen.append,
        **opts,
    )
    on_dask = ingest(
        [series_dir],
        dataset="d",
        store=dask_cat,
        adapter=test_adapter,
        engine="dask",
        address=dask_address,
        **opts,
    )
    # whole: one task [a0 a1 series0]; in pieces: [a0 a1], then one task per piece
    assert [t.files for t in whole.tasks] == [3]
    assert local.tasks[0].files == 2
    pieces = local.tasks[1:]
    assert len(pieces) >= 8 and all(t.files == 1 for t in pieces)
    assert sum(t.samples for t in pieces) == 60
    assert sum(t.bytes_in for t in pieces) == (series_dir / "series0.vals").stat().st_size
    # same keys and samples; the shard cut differs from the whole-file run's
    assert rows_of(local_cat, local)[0] == rows_of(whole_cat, whole)[0]
    assert [r[:2] for r in rows_of(local_cat, local)[1]] == [
        r[:2] for r in rows_of(whole_cat, whole)[1]
    ]
    # but not between engines: the plan is the same
    assert rows_of(dask_cat, on_dask) == rows_of(local_cat, local)
    assert [t.files for t in on_dask.tasks] == [t.files for t in local.tasks]
    # a file is one file, however many pieces: counts, progress, lineage, statistics
    assert local.files == local.files_ingested == 3 and local.samples == 62
    assert seen[-1].files_done == 3 and seen[-1].bytes_done == seen[-1].bytes_total
    snap = local_cat.snapshot(local.snapshot_id)
    listed = json.loads(local_cat.get_object(snap.lineage["ingests"][0]["sources"]["object"]))
    sources = {s["key"]: s for s in listed}
    assert sources["series0.vals"]["hash"] == hash_file(str(series_dir / "series0.vals"))[0]
    assert sources["series0.vals"]["size"] == (series_dir / "series0.vals").stat().st_size
    stats = snap.stats["fields"]["index"]
    assert stats["count"] == [60] and stats["min"] == [0.0] and stats["max"] == [59.0]
    # merged in another order than the whole file's: equal up to rounding
    other = whole_cat.snapshot(whole.snapshot_id).stats["fields"]
    for name, summary in snap.stats["fields"].items():
        for k, v in summary.items():
            assert v == pytest.approx(other[name][k], rel=1e-12), (name, k)
    # between engines the plan, and so the merge order, is the same: equal bits
    assert dask_cat.snapshot(on_dask.snapshot_id).stats == snap.stats


def test_pieces_are_journaled_one_by_one(catalog_at, series_dir, test_adapter, dask_address):
    cat = catalog_at("s")
    opts = dict(
        shard_size=SHARD, piece_bytes=SHARD, adapter=test_adapter, engine="dask",
        address=dask_address,
    )
    first = ingest([series_dir], dataset="d", store=cat, snapshot=True, **opts)
    records = [k for k in cat.store.list("journal/d/") if "/task-" not in k]
    assert len(records) == 2 + len(first.tasks) - 1  # a0, a1 and one per piece
    # lose one piece's record: the re-run redoes that piece only, and stages nothing new
    piece_records = [k for k in records if json.loads(cat.store.get(k))["key"] == "series0.vals"]
    assert len(piece_records) == len(first.tasks) - 1
    cat.store.delete(piece_records[len(piece_records) // 2])
    again = ingest([series_dir], dataset="d", store=cat, snapshot=True, **opts)
    redone = [t for t in again.tasks if t.shards]
    assert (again.files_ingested, again.files_reused, again.files_unchanged) == (1, 2, 3)
    assert len(redone) == 1 and again.new_bytes == 0 and again.staging_id is None
