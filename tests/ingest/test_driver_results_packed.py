"""Each file's result is packed as its task finishes it, and the run stages the same snapshot.

A task keeps every file's result until its end, and the driver keeps them all until it
stages the run; packed, a file's statistics are JSON text and files of one schema or one
set of versions share one object. Packing must change nothing the run stages or journals:
statistics round-trip exactly, whichever engine or piece path they take.
"""

import math

import numpy as np
import pytest

import simstore
from simstore.catalog import Catalog
from simstore.ingest import _engine
from simstore.ingest._records import FileResult, ResultPacker, TaskResult
from simstore.stats import merge_stats


def _awkward_stats():
    return {
        "u": {
            "count": [3, 2**62 + 1],
            "nan_count": [0, 1],
            "inf_count": [0, 0],
            "mean": [0.1, -0.0],
            "m2": [5e-324, 1.7976931348623157e308],
            "min": [-(2**63), 2.2250738585072014e-308],
            "max": [2**64 - 1, 1 / 3],
            "components": 2,
        },
        "a": {"count": [1], "nan_count": [0], "inf_count": [0], "mean": [math.pi],
              "m2": [0.0], "min": [True], "max": [7], "components": 1},
    }


def test_packed_statistics_round_trip_bit_for_bit_and_schemas_are_shared():
    schema = [{"name": "u", "kind": "tensor", "dtype": "float32", "ndim": 2}]
    a = FileResult("a.npz", "a.npz", 1, schema=schema, stats=_awkward_stats(),
                   software={"numpy": "2.0", "simstore": "0.1"})
    b = FileResult("b.npz", "b.npz", 1, schema=[dict(s) for s in schema],
                   stats=_awkward_stats(), software={"simstore": "0.1", "numpy": "2.0"})
    pack = ResultPacker()
    pack(TaskResult(files=[a, b], shards={}, new_bytes=0))
    assert a.stats == {} and a.packed_stats
    got = a.field_stats()
    assert got == _awkward_stats()
    # same types and the same bits, not only equal values (-0.0 == 0.0, True == 1)
    for name, summary in _awkward_stats().items():
        for key, want in summary.items():
            have = got[name][key]
            if isinstance(want, list):
                assert [type(x) for x in have] == [type(x) for x in want], (name, key)
                assert [repr(x) for x in have] == [repr(x) for x in want], (name, key)
    assert b.schema is a.schema
    assert b.software is a.software
    assert merge_stats([a.field_stats(), b.field_stats()]) == merge_stats(
        [_awkward_stats(), _awkward_stats()]
    )


def test_an_unpacked_result_reads_its_own_statistics():
    fr = FileResult("a", "a", 1, stats=_awkward_stats())
    assert fr.field_stats() is fr.stats


@pytest.mark.parametrize("workers", [1, 2])
def test_tasks_hand_the_driver_packed_results_and_the_snapshot_is_unchanged(
    tmp_path, monkeypatch, workers
):
    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(3)
    for i in range(12):
        np.savez(src / f"run{i:02d}.npz", u=rng.standard_normal((5, 3)).astype(np.float32),
                 re=np.float64(i) / 7)
    seen = []
    real = _engine.run_local

    def spy(*args, **kwargs):
        run = real(*args, **kwargs)
        seen.extend(fr for res in run.results for fr in res.files)
        return run

    monkeypatch.setattr("simstore.ingest._driver.run_local", spy)
    store = tmp_path / "store"
    cat = Catalog.init(str(store))
    r = simstore.ingest([src], dataset="d", store=cat, snapshot=True, workers=workers,
                        shard_size=4096)
    assert len(seen) == 12
    assert all(fr.packed_stats and fr.stats == {} for fr in seen)
    assert len({id(fr.schema) for fr in seen}) == 1
    # the same run with nothing packed stages the same snapshot, statistics and all
    monkeypatch.setattr(FileResult, "pack", lambda self, shared: None)
    seen.clear()
    other = Catalog.init(str(tmp_path / "other"))
    r2 = simstore.ingest([src], dataset="d", store=other, snapshot=True, workers=workers,
                         shard_size=4096)
    assert all(fr.stats and not fr.packed_stats for fr in seen)
    one, two = cat.snapshot(r.snapshot_id), other.snapshot(r2.snapshot_id)
    assert one.content_hash == two.content_hash
    assert one.stats == two.stats
    us = np.stack([np.load(src / f"run{i:02d}.npz")["u"] for i in range(12)]).reshape(-1, 3)
    assert one.stats["fields"]["u"]["count"] == [60, 60, 60]
    assert one.stats["fields"]["u"]["min"] == [float(x) for x in us.min(axis=0)]
