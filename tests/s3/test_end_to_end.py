"""Every command and SimDataset on s3://, and faults injected between them and the server."""

import json
import time

import numpy as np
import pytest
from click.testing import CliRunner
from simstore.cli import main

from simstore.catalog import Catalog
from simstore.errors import StorageError
from simstore.ingest import ingest

pytestmark = pytest.mark.s3


def _write_sources(root, count=12, seed=0):
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        np.savez(root / f"run{i:03d}.npz", u=rng.normal(size=(2, 16, 16)).astype(np.float32),
                 re=np.float64(100 + i))
    return root


def _cli(store, *args, options=()):
    opts = [x for o in options for x in ("--storage-option", o)]
    result = CliRunner().invoke(main, ["--store", store, *opts, *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def _epoch(store, ref, **kw):
    from simstore.loaders import SimDataset

    ds = SimDataset(store, ref, shuffle=False, **kw)
    return {s["__key__"]: s["u"].numpy().copy() for s in ds}


def test_every_command_on_s3(s3_bucket, tmp_path):
    bucket = s3_bucket()
    store = f"s3://{bucket}/team/cfd"
    src = _write_sources(tmp_path / "src")
    assert "conditional writes: yes" in _cli(store, "init")
    out = json.loads(_cli(store, "ingest", str(src), "--dataset", "cfd", "--snapshot", "-m",
                          "first", "--json"))
    assert out["samples"] == 12
    _cli(store, "tag", "cfd", "v1")
    np.savez(src / "run003.npz", u=np.ones((2, 16, 16), np.float32), re=np.float64(1.0))
    _cli(store, "ingest", str(src), "--dataset", "cfd")
    _cli(store, "snapshot", "cfd", "-m", "second")
    log = json.loads(_cli(store, "log", "cfd", "--json"))
    assert [e["message"] for e in log] == ["second", "first"]
    diff = json.loads(_cli(store, "diff", "cfd@v1", "cfd", "--json"))
    assert diff["modified"] == ["run003"] and diff["added"] == [] == diff["removed"]
    show = json.loads(_cli(store, "show", "cfd", "--json"))
    assert show["samples"] == 12
    _cli(store, "branch", "cfd@v1", "old")
    assert json.loads(_cli(store, "verify", "cfd", "--deep", "--json"))["ok"]
    # S3 times are whole seconds: an object of the gc's own second is not older than a
    # grace of 0 s, so the garbage gets a second behind it first
    time.sleep(1.1)
    assert json.loads(_cli(store, "gc", "--grace", "0s", "--json"))["deleted"] >= 1
    assert json.loads(_cli(store, "verify", "cfd@v1", "--deep", "--json"))["ok"]
    cost = json.loads(_cli(store, "cost", "cfd", "--json"))
    assert cost  # priced per tier
    assert "cfd" in _cli(store, "ls")
    _cli(store, "stats", "cfd")

    # the same sources in a local store give the same content hash
    local = str(tmp_path / "local")
    _cli(local, "init")
    _cli(local, "ingest", str(src), "--dataset", "cfd", "--snapshot", "-m", "x")
    assert json.loads(_cli(local, "show", "cfd", "--json"))["content_hash"] == show[
        "content_hash"]

    # streaming from S3, cold and then warm cache, equals streaming from the local store
    cache = tmp_path / "cache"
    from_s3 = _epoch(store, "cfd", cache_dir=str(cache))
    warm = _epoch(store, "cfd", cache_dir=str(cache))
    from_local = _epoch(local, "cfd")
    assert from_s3.keys() == from_local.keys() == warm.keys()
    for k in from_local:
        np.testing.assert_array_equal(from_s3[k], from_local[k])
        np.testing.assert_array_equal(warm[k], from_local[k])


def test_ingest_and_stream_through_a_flaky_endpoint(s3_bucket, fault_proxy, tmp_path):
    bucket = s3_bucket()
    store = f"s3://{bucket}/flaky"
    opts = {"endpoint_url": fault_proxy.endpoint_url, "backoff_base_s": 0.01,
            "backoff_max_s": 0.05, "max_attempts": 8}
    Catalog.init(store, storage_options=opts)
    src = _write_sources(tmp_path / "src", count=16, seed=3)
    fault_proxy.fail_share(0.25, "slowdown", seed=1)
    result = ingest([str(src)], dataset="d", store=Catalog.open(store, storage_options=opts),
                    snapshot=True, message="through faults")
    assert result.to_json()["samples"] == 16
    fault_proxy.fail_share(0.2, "truncate", seed=2)
    data = _epoch(store, "d", storage_options=opts)
    fault_proxy.clear()
    assert fault_proxy.count("slowdown") > 0 and fault_proxy.count("truncate") > 0
    local = str(tmp_path / "local")
    Catalog.init(local)
    ingest([str(src)], dataset="d", store=local, snapshot=True, message="x")
    expected = _epoch(local, "d")
    assert data.keys() == expected.keys()
    for k in expected:
        np.testing.assert_array_equal(data[k], expected[k])
    from simstore.catalog import verify

    assert verify(Catalog.open(store, storage_options=opts), "d", deep=True).ok


def test_a_dead_endpoint_fails_clearly_and_commits_nothing(s3_bucket, fault_proxy, tmp_path):
    bucket = s3_bucket()
    store = f"s3://{bucket}/dead"
    opts = {"endpoint_url": fault_proxy.endpoint_url, "backoff_base_s": 0.01,
            "backoff_max_s": 0.02, "max_attempts": 3}
    Catalog.init(store, storage_options=opts)
    src = _write_sources(tmp_path / "src", count=4, seed=5)
    fault_proxy.fail_share(1.0, "slowdown", seed=0, methods=["PUT"])
    with pytest.raises(StorageError) as info:
        ingest([str(src)], dataset="d", store=Catalog.open(store, storage_options=opts),
               snapshot=True, message="never lands")
    assert "objects/" in str(info.value) or "datasets/" in str(info.value)
    fault_proxy.clear()
    cat = Catalog.open(store, storage_options=opts)
    assert cat.staged("d") == []
    assert cat.branches("d").get_versioned("main") == (None, None)


def test_a_loader_on_a_prefix_that_is_not_a_store_says_so(s3_bucket, tmp_path):
    # the store's metadata and the ref are read side by side on a remote store; the
    # store's own error comes first
    from simstore.loaders import SimDataset

    from simstore.errors import FormatError, NotFoundError

    bucket = s3_bucket()
    with pytest.raises(NotFoundError, match=r"not a simstore store .*simstore init"):
        SimDataset(f"s3://{bucket}/nothing-here", "d")
    store = f"s3://{bucket}/ok"
    Catalog.init(store)
    src = _write_sources(tmp_path / "src", count=4, seed=2)
    ingest([str(src)], dataset="d", store=Catalog.open(store), snapshot=True, message="x")
    assert len(_epoch(store, "d")) == 4
    with pytest.raises(NotFoundError):
        SimDataset(store, "no-such-dataset")
    # a store written by another format version is refused, whatever the ref
    from simstore.storage import open_store

    s3 = open_store(store)
    meta = json.loads(s3.get("simstore.json"))
    meta["format_version"] = 99
    s3.put("simstore.json", json.dumps(meta).encode())
    with pytest.raises(FormatError, match="format_version 99"):
        SimDataset(store, "d")
    with pytest.raises(FormatError, match="format_version 99"):
        SimDataset(store, "no-such-dataset")


def test_deep_verify_reads_each_object_with_one_get(s3_bucket, fault_proxy, tmp_path):
    from simstore.catalog import verify
    from simstore.hashing import object_key

    store = f"s3://{s3_bucket()}/deep"
    opts = {"endpoint_url": fault_proxy.endpoint_url}
    Catalog.init(store, storage_options=opts)
    src = _write_sources(tmp_path / "src", count=8, seed=5)
    ingest([str(src)], dataset="d", store=Catalog.open(store, storage_options=opts),
           snapshot=True, message="m")
    cat = Catalog.open(store, storage_options=opts)
    snap = cat.snapshot(cat.resolve("d"))
    shards = sorted({s for t in cat.iter_parts(snap) for s in t.column("shard").to_pylist()})
    assert shards
    fault_proxy.records.clear()
    report = verify(cat, "d", deep=True)
    assert report.ok and report.objects_checked >= len(shards)
    for shard in shards:
        seen = [r.method for r in fault_proxy.records if r.path.endswith(object_key(shard))]
        assert seen == ["GET"], (shard, seen)  # one whole-object GET; no HEAD, no ranges
