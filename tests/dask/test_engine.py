"""The dask engine stores what the local engine stores, on a local store and on S3."""

import json
import pickle

import pytest
from click.testing import CliRunner
from simstore.cli import main

import simstore
from simstore.catalog import Catalog
from simstore.errors import InvalidInputError
from simstore.ingest import IngestConfig, ingest
from simstore.ingest._dask import ingest_task
from simstore.ingest._plugins import plugins_for
from simstore.ingest._records import TaskContext
from simstore.ingest._sources import discover, plan_tasks
from simstore.storage import open_store
from simstore.testing.s3 import FAKE_ACCESS_KEY, FAKE_SECRET_KEY

pytestmark = pytest.mark.dask

SHARD = 4096  # small shards and tasks: nine files make several of each


def layout(catalog, sid):
    """(content hash, manifest rows) of a snapshot: what must not depend on the engine."""
    snap = catalog.snapshot(sid)
    rows = catalog.manifest(snap).to_pylist()
    return snap.content_hash, [
        (r["key"], r["sample_hash"], r["shard"], r["position"]) for r in rows
    ]


def test_dask_stores_what_the_local_engine_stores(catalog_at, npz_dir, dask_address):
    local_cat, dask_cat = catalog_at("local"), catalog_at("dask")
    local = ingest([npz_dir], dataset="d", store=local_cat, shard_size=SHARD, snapshot=True)
    seen = []
    r = ingest(
        [npz_dir],
        dataset="d",
        store=dask_cat,
        shard_size=SHARD,
        snapshot=True,
        engine="dask",
        address=dask_address,
        progress=seen.append,
    )
    assert r.engine == "dask" and local.engine == "local"
    assert layout(dask_cat, r.snapshot_id) == layout(local_cat, local.snapshot_id)
    assert len({row[2] for row in layout(dask_cat, r.snapshot_id)[1]}) > 1  # several shards
    assert (r.files, r.samples, r.shards, r.bytes_stored) == (
        local.files,
        local.samples,
        local.shards,
        local.bytes_stored,
    )
    # one timing per planned task, each run on a worker of this cluster
    assert len(r.tasks) == len(local.tasks) > 1
    assert [t.task for t in r.tasks] == list(range(len(r.tasks)))
    assert all(t.worker.startswith("tcp://127.0.0.1:") and not t.failed for t in r.tasks)
    assert r.workers == len({t.worker for t in r.tasks}) and 1 <= r.workers <= 2
    assert sum(t.files for t in r.tasks) == r.files and sum(t.samples for t in r.tasks) == 9
    # progress on the driver, one report per finished task
    assert [p.files_done for p in seen] == sorted(p.files_done for p in seen)
    assert seen[-1].files_done == 9 and seen[-1].samples == 9
    assert seen[-1].bytes_done == seen[-1].bytes_total
    lineage = dask_cat.snapshot(r.snapshot_id).lineage["ingests"][0]
    assert lineage["engine"] == "dask" and lineage["workers"] == r.workers


def test_a_rerun_on_dask_reuses_the_journal_and_stages_nothing(catalog_at, npz_dir, dask_address):
    cat = catalog_at("s")
    opts = dict(shard_size=SHARD, snapshot=True, engine="dask", address=dask_address)
    first = ingest([npz_dir], dataset="d", store=cat, **opts)
    again = ingest([npz_dir], dataset="d", store=cat, **opts)
    assert first.files_ingested == 9 and again.files_reused == 9 and again.files_ingested == 0
    assert again.new_bytes == 0 and again.staging_id is None
    assert again.snapshot_id == first.snapshot_id


def test_without_an_address_ingest_starts_a_loopback_cluster(catalog_at, npz_dir):
    local_cat, dask_cat = catalog_at("local"), catalog_at("dask")
    local = ingest([npz_dir], dataset="d", store=local_cat, shard_size=SHARD, snapshot=True)
    r = ingest(
        [npz_dir],
        dataset="d",
        store=dask_cat,
        shard_size=SHARD,
        snapshot=True,
        engine="dask",
        workers=1,
    )
    assert r.engine == "dask" and r.workers == 1
    assert all(t.worker.startswith("tcp://127.0.0.1:") for t in r.tasks)
    assert layout(dask_cat, r.snapshot_id) == layout(local_cat, local.snapshot_id)


@pytest.mark.s3
def test_dask_workers_write_to_s3_from_the_store_url_and_options(
    catalog_at, npz_dir, dask_address, s3_bucket, moto_server
):
    # The workers were started before this test set the AWS environment: they reach
    # the server only through the options that travel, pickled, with the store.
    options = {
        "endpoint_url": moto_server,
        "key": FAKE_ACCESS_KEY,
        "secret": FAKE_SECRET_KEY,
        "region_name": "us-east-1",
    }
    store = open_store(f"s3://{s3_bucket()}/simstore", storage_options=options)
    assert pickle.loads(pickle.dumps(store))._client is None  # the URL and options, no client
    s3_cat = Catalog.init(store)
    local_cat = catalog_at("local")
    local = ingest([npz_dir], dataset="d", store=local_cat, shard_size=SHARD, snapshot=True)
    r = ingest(
        [npz_dir],
        dataset="d",
        store=s3_cat,
        shard_size=SHARD,
        snapshot=True,
        engine="dask",
        address=dask_address,
    )
    assert layout(s3_cat, r.snapshot_id) == layout(local_cat, local.snapshot_id)
    shards = {row[2] for row in layout(s3_cat, r.snapshot_id)[1]}
    assert all(store.exists(f"objects/{oid[:2]}/{oid}") for oid in shards)
    assert r.new_bytes >= r.bytes_stored > 0


def run_cli(store, *args):
    result = CliRunner().invoke(main, ["--store", store, *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_cli_engine_dask_reports_engine_workers_and_task_timings(tmp_path, npz_dir, dask_address):
    contents = []
    for name, extra in (("local", []), ("dask", ["--engine", "dask", "--address", dask_address])):
        store = str(tmp_path / name)
        CliRunner().invoke(main, ["--store", store, "init"], catch_exceptions=False)
        out = run_cli(
            store,
            "ingest",
            str(npz_dir),
            "--dataset",
            "d",
            "--shard-size",
            str(SHARD),
            "--snapshot",
            "--json",
            *extra,
        )
        contents.append(run_cli(store, "show", "d", "--json")["content_hash"])
        if name == "dask":
            assert out["engine"] == "dask" and 1 <= out["workers"] <= 2
            assert out["tasks"] and {
                "task",
                "worker",
                "files",
                "bytes_in",
                "samples",
                "seconds",
            } <= set(out["tasks"][0])
            assert sum(t["files"] for t in out["tasks"]) == out["files"] == 9
            # the tasks' own counts add up to the summary's
            assert sum(t["samples"] for t in out["tasks"]) == out["samples"]
            assert sum(t["bytes_in"] for t in out["tasks"]) == out["bytes_in"]
    assert contents[0] == contents[1]


def test_cli_refuses_an_address_without_the_dask_engine(tmp_path, npz_dir):
    store = str(tmp_path / "s")
    CliRunner().invoke(main, ["--store", store, "init"], catch_exceptions=False)
    result = CliRunner().invoke(
        main,
        [
            "--store",
            store,
            "ingest",
            str(npz_dir),
            "--dataset",
            "d",
            "--address",
            "tcp://127.0.0.1:1",
        ],
    )
    assert result.exit_code != 0 and "needs engine='dask'" in result.output


def test_a_memory_store_cannot_be_used_with_dask(npz_dir):
    mem = Catalog.init("memory://dask-engine-test")
    with pytest.raises(
        InvalidInputError, match="memory:// store lives in one process, so dask workers"
    ):
        ingest([npz_dir], dataset="d", store=mem, engine="dask")
    with pytest.raises(InvalidInputError, match="invalid engine 'spark'"):
        IngestConfig(engine="spark")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="needs engine='dask'"):
        IngestConfig(address="tcp://127.0.0.1:8786")


def test_an_unreachable_scheduler_is_a_clear_error(catalog_at, npz_dir):
    import socket

    import dask
    import distributed  # noqa: F401  (its config defaults first: the set below restores them)

    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"tcp://127.0.0.1:{port}"
    # dask's connect timeout (30 s by default) is the user's to configure; shortened here
    with dask.config.set({"distributed.comm.timeouts.connect": "1s"}):
        with pytest.raises(
            InvalidInputError, match=f"cannot reach the dask scheduler at {address}"
        ):
            ingest([npz_dir], dataset="d", store=catalog_at("s"), engine="dask", address=address)


@pytest.mark.parametrize("kind", ["malformed", "no-port", "silent", "worker"])
def test_an_address_that_is_no_scheduler_is_a_clear_error(catalog_at, npz_dir, kind):
    """A malformed address raised a bare ValueError; a port that accepts connections but
    never answers dask's handshake (a dashboard, any HTTP server) hung for ever."""
    import socket

    import dask
    import distributed

    silent = socket.socket()  # accepts (the kernel's backlog) but never says a word
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    worker_cluster = None
    try:
        if kind == "worker":
            worker_cluster = distributed.LocalCluster(
                host="127.0.0.1", n_workers=1, threads_per_worker=1, processes=True,
                dashboard_address=None, scheduler_kwargs={"dashboard_address": "127.0.0.1:0"})
            address = next(iter(worker_cluster.workers.values())).address
            words = "is not a dask scheduler"
        else:
            address = {"malformed": "http://127.0.0.1:8786", "no-port": "not an address",
                       "silent": f"tcp://127.0.0.1:{silent.getsockname()[1]}"}[kind]
            words = f"cannot reach the dask scheduler at {address}"
        with dask.config.set({"distributed.comm.timeouts.connect": "2s"}):
            with pytest.raises(InvalidInputError, match=words) as info:
                ingest([npz_dir], dataset="d", store=catalog_at("s"), engine="dask",
                       address=address)
        assert "\n" not in str(info.value)
    finally:
        silent.close()
        if worker_cluster is not None:
            worker_cluster.close()


def test_a_worker_that_cannot_see_the_store_says_so(tmp_path, npz_dir):
    cfg = IngestConfig()
    cat = Catalog.init(str(tmp_path / "store"))
    files, _ = discover([str(npz_dir)], plugins_for(cfg)[0])
    elsewhere = open_store(str(tmp_path / "not-mounted-here"))
    ctx = TaskContext(store=elsewhere, dataset="d", config=cfg, base_schema=(), params_digest="x")
    outcome = ingest_task(ctx, plan_tasks(files, SHARD)[0], plugins_for(cfg))
    assert outcome.result is None and isinstance(outcome.error, InvalidInputError)
    assert "cannot see the store" in str(outcome.error) and "shared" not in str(cat.store.url)
    assert "every worker mounts" in str(outcome.error)


def test_simstore_ingest_takes_the_engine_keywords(catalog_at, npz_dir, dask_address):
    r = simstore.ingest(
        [npz_dir],
        dataset="d",
        store=catalog_at("s"),
        engine="dask",
        address=dask_address,
        shard_size=1 << 30,
    )
    assert r.engine == "dask" and len(r.tasks) == 1 and r.workers == 1


def test_the_cluster_listens_on_loopback_only(dask_address):
    import psutil
    me = psutil.Process()
    listening = [
        c.laddr
        for p in [me, *me.children(recursive=True)]
        for c in p.net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN
    ]
    port = int(dask_address.rsplit(":", 1)[1])
    assert port in {a.port for a in listening}
    assert {a.ip for a in listening} == {"127.0.0.1"}


def test_the_staged_rows_digest_is_the_canonical_json_digest():
    """Staging recognises an identical pending entry by this digest: it must not change."""
    from simstore.hashing import hash_bytes
    from simstore.ingest._stage import rows_digest as _rows_digest
    from simstore.sample import canonical_json

    rows = [(f"rün{i % 7}/t{i:04d}", f"{i:032x}", f"{i % 3:032x}", i, 10 * i) for i in range(50)]
    for n in (0, 1, 2, 49, 50):
        expected = hash_bytes(canonical_json([list(r) for r in sorted(rows[:n])]))
        assert _rows_digest(rows[:n], chunk_rows=7) == expected
        assert _rows_digest(rows[:n]) == expected


def test_without_dask_installed_the_error_says_what_to_install(
    monkeypatch, catalog_at, npz_dir, tmp_path
):
    import sys

    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed fails
    with pytest.raises(ImportError, match=r"pip install 'simstore\[dask\]'"):
        ingest([npz_dir], dataset="d", store=catalog_at("s"), engine="dask")
    store = str(tmp_path / "cli")
    CliRunner().invoke(main, ["--store", store, "init"], catch_exceptions=False)
    result = CliRunner().invoke(
        main, ["--store", store, "ingest", str(npz_dir), "--dataset", "d", "--engine", "dask"]
    )
    assert result.exit_code == 1 and "pip install 'simstore[dask]'" in result.output
    assert "Traceback" not in result.output
