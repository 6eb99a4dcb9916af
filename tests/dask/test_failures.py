"""Failures on a cluster: duplicated and retried tasks, dead workers, failed tasks, a killed driver."""

import contextlib
import os
import subprocess
import sys
import textwrap
import time
import uuid

import pytest
from dask_adapters import write_values

from simstore.errors import StorageError
from simstore.hashing import hash_bytes
from simstore.ingest import IngestConfig, ingest
from simstore.ingest._dask import TASK_RETRIES, ingest_task
from simstore.ingest._plugins import plugins_for
from simstore.ingest._records import TaskContext
from simstore.ingest._sources import discover, plan_tasks
from simstore.sample import canonical_json
from simstore.testing.adapters import adapters_script

pytestmark = pytest.mark.dask


def objects(catalog):
    return sorted(catalog.store.list("objects/"))


def wait_for(condition, what, deadline_s=60.0):
    """Poll until ``condition()``; the deadline only stops a hung test, it measures nothing."""
    end = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < end, f"gave up waiting for {what}"
        time.sleep(0.05)


def one_task(cat, cfg, source):
    """(context, task, plugins) of ingesting ``source`` as one task into ``cat``."""
    plugins = plugins_for(cfg)
    files, _ = discover([str(source)], plugins[0])
    (task,) = plan_tasks(files, cfg.shard_size)
    ctx = TaskContext(
        store=cat.store,
        dataset="d",
        config=cfg,
        base_schema=(),
        params_digest=hash_bytes(canonical_json(cfg.output_params())),
    )
    return ctx, task, plugins


def test_a_task_run_twice_at_once_and_again_later_stores_nothing_twice(
    catalog_at, npz_dir, dask_address
):
    from distributed import Client

    cfg = IngestConfig(shard_size=1 << 30, resume=False)  # one task; no journal: redo it all
    cat = catalog_at("s")
    ctx, task, plugins = one_task(cat, cfg, npz_dir)
    run = uuid.uuid4().hex
    with Client(dask_address, set_as_default=False) as client:
        # the same task under two keys: dask may run a task twice (a lost worker's task
        # rescheduled while the first attempt still runs); both write the same shards
        futures = [
            client.submit(ingest_task, ctx, task, plugins, key=f"dup-{run}-{n}") for n in range(2)
        ]
        first, second = (f.result().result for f in futures)
    assert [f.rows for f in first.files] == [f.rows for f in second.files]
    assert first.shards == second.shards and len(first.shards) >= 1
    assert first.new_bytes + second.new_bytes == sum(first.shards.values())
    stored = objects(cat)
    assert len(stored) == len(first.shards)
    again = ingest_task(ctx, task, plugins)  # a retry long after, here in process
    assert again.result.shards == first.shards and again.result.new_bytes == 0
    assert objects(cat) == stored


def test_a_result_lost_with_its_worker_is_waited_for_not_reported(
    catalog_at, tmp_path, test_adapter, dask_address
):
    import threading

    from distributed import Client

    from simstore.ingest._dask import _collect, _NoWorkers

    src = write_values(tmp_path / "src", ["gate0"])
    markers = tmp_path / "markers"
    markers.mkdir()
    (markers / "open").touch()
    # no journal: the second run reads the file again (and waits at its gate)
    cfg = IngestConfig(adapter=test_adapter, adapter_options={"marker_dir": str(markers)},
                       resume=False)
    cat = catalog_at("s")
    ctx, task, plugins = one_task(cat, cfg, src)
    with Client(dask_address, set_as_default=False) as client:
        fut = client.submit(ingest_task, ctx, task, plugins, key=f"lost-{uuid.uuid4().hex}")
        first = fut.result().result
        (markers / "open").unlink()
        (markers / "started").unlink()
        # the worker holding the finished result dies (its nanny starts another); the
        # scheduler runs the task again, which now waits at the gate: the result is lost
        with contextlib.suppress(Exception):  # the call's connection dies with it
            client.run(os._exit, 1, workers=list(client.who_has(fut)[fut.key]))
        opener = threading.Timer(0.3, (markers / "open").touch)
        try:
            wait_for((markers / "started").exists, "the task to run again")
            # the client hears of the loss on its own thread, which may come after the
            # second run has started
            wait_for(lambda: fut.status == "lost", "the client to hear of the lost result")
            opener.start()
            # waits for the second run (a worker is there: the check passes), no error
            again = _collect(fut, 0, task, cfg, _NoWorkers(client, dask_address, 60.0).check)
        finally:
            if opener.is_alive():
                opener.join()
            # a failure above must not leave the second run waiting at its gate, holding
            # a worker of the shared cluster from the tests after this one
            (markers / "open").touch()
        assert fut.status == "finished"
    assert again.shards == first.shards
    assert [f.rows for f in again.files] == [f.rows for f in first.files]


def test_a_worker_that_dies_mid_task_is_retried_and_the_content_is_unchanged(
    catalog_at, tmp_path, test_adapter, dask_address
):
    src = write_values(tmp_path / "src", ["a0", "a1", "crash0", "a2", "a3"])
    markers = tmp_path / "markers"
    markers.mkdir()
    opts = dict(adapter=test_adapter, adapter_options={"marker_dir": str(markers)}, snapshot=True)
    local_markers = tmp_path / "local-markers"
    local_markers.mkdir()
    (local_markers / "crash0.vals.crashed").touch()  # in process, never crash
    local_cat, dask_cat = catalog_at("local"), catalog_at("dask")
    local = ingest(
        [src],
        dataset="d",
        store=local_cat,
        shard_size=64,
        **{**opts, "adapter_options": {"marker_dir": str(local_markers)}},
    )
    r = ingest(
        [src],
        dataset="d",
        store=dask_cat,
        shard_size=64,
        engine="dask",
        address=dask_address,
        **opts,
    )
    assert (markers / "crash0.vals.crashed").exists()  # a worker did die on it
    # tasks whose results died with the worker ran again; they found their journal records
    assert r.files_ingested + r.files_reused == 5 and r.samples == 5
    assert not r.files_skipped and not any(t.failed for t in r.tasks)
    assert (
        dask_cat.snapshot(r.snapshot_id).content_hash
        == local_cat.snapshot(local.snapshot_id).content_hash
    )
    # the same objects in both stores (shards, manifest parts, change set, sources list),
    # but for the snapshot object itself (its time differs): nothing extra, nothing twice
    assert set(objects(dask_cat)) - {f"objects/{r.snapshot_id[:2]}/{r.snapshot_id}"} == set(
        objects(local_cat)
    ) - {f"objects/{local.snapshot_id[:2]}/{local.snapshot_id}"}


def test_a_failed_task_is_retried_then_reported_like_a_skipped_file(
    catalog_at, tmp_path, test_adapter, dask_address
):
    src = write_values(tmp_path / "src", ["a0", "a1", "vanish0", "a2"])
    clean = write_values(tmp_path / "clean", ["a0", "a1", "vanish0", "a2"])
    os.unlink(clean / "vanish0.vals")
    markers = tmp_path / "markers"
    markers.mkdir()
    opts = dict(adapter=test_adapter, adapter_options={"marker_dir": str(markers)})
    cat = catalog_at("dask")
    r = ingest(
        [src],
        dataset="d",
        store=cat,
        shard_size=1,
        engine="dask",
        address=dask_address,
        on_error="skip",
        snapshot=True,
        **opts,
    )
    assert (markers / "vanish0.vals.attempts").read_text().count("attempt") == TASK_RETRIES + 1
    (skipped,) = r.files_skipped
    assert skipped.path == str(src / "vanish0.vals")
    assert "failed on the dask cluster: StorageError: the source disk vanished" in skipped.reason
    assert r.to_json()["skipped"][0]["path"] == skipped.path
    assert [t.failed for t in r.tasks] == [
        False,
        False,
        False,
        True,
    ]  # plan order: a0 a1 a2 vanish0
    assert r.files_ingested == 3 and r.samples == 3
    clean_cat = catalog_at("clean")
    ref = ingest([clean], dataset="d", store=clean_cat, shard_size=1, snapshot=True, **opts)
    assert (
        cat.snapshot(r.snapshot_id).content_hash == clean_cat.snapshot(ref.snapshot_id).content_hash
    )

    # without skip, the run's error is the task's own (simstore's errors are one line)
    with pytest.raises(StorageError, match="the source disk vanished"):
        ingest(
            [src], dataset="e", store=cat, shard_size=1, engine="dask", address=dask_address, **opts
        )
    assert cat.staged("e") == [] and cat.branches("e").get_versioned("main")[0] is None


DRIVER = """
import simstore.ingest as module

if __name__ == "__main__":
    module.ingest(
        [{src!r}], dataset="d", store={store!r}, adapter="testvals",
        adapter_options={{"marker_dir": {markers!r}}}, shard_size=1,
        engine="dask", address={address!r}, snapshot=True,
    )
"""


def test_a_killed_driver_leaves_no_snapshot_and_the_rerun_redoes_no_finished_file(
    catalog_at, tmp_path, test_adapter, dask_address
):
    src = write_values(tmp_path / "src", ["a0", "a1", "a2", "a3", "gate0"])
    markers = tmp_path / "markers"
    markers.mkdir()
    cat = catalog_at("dask")
    script = tmp_path / "driver.py"
    script.write_text(
        adapters_script({"testvals": "dask_adapters:ValuesAdapter"}, os.path.dirname(__file__))
        + textwrap.dedent(DRIVER).format(
            src=str(src),
            store=cat.store.url,
            markers=str(markers),
            address=dask_address,
        )
    )
    journal = lambda: len([k for k in cat.store.list("journal/d/")  # noqa: E731
                            if "/task-" not in k])  # file records, not tasks' ones
    driver = subprocess.Popen([sys.executable, str(script)], stderr=subprocess.PIPE)
    try:
        # the four a* files finish and are journaled; gate0 holds its worker
        wait_for(lambda: journal() == 4 and (markers / "started").exists(), "the first tasks")
        assert driver.poll() is None
        driver.kill()
        driver.wait()
        assert cat.branches("d").get_versioned("main")[0] is None  # no snapshot
        assert cat.staged("d") == []  # and nothing staged
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        (markers / "open").touch()
        driver.stderr.close()
    # the orphaned task runs to its end on the cluster and journals gate0 as well
    wait_for(lambda: journal() == 5, "the orphaned task")
    r = ingest(
        [src],
        dataset="d",
        store=cat,
        adapter=test_adapter,
        adapter_options={"marker_dir": str(markers)},
        shard_size=1,
        engine="dask",
        address=dask_address,
        snapshot=True,
    )
    assert r.files_reused == 5 and r.files_ingested == 0 and r.samples == 5
    local_cat = catalog_at("local")
    local = ingest(
        [src],
        dataset="d",
        store=local_cat,
        adapter=test_adapter,
        adapter_options={"marker_dir": str(markers)},
        shard_size=1,
        snapshot=True,
    )
    assert (
        cat.snapshot(r.snapshot_id).content_hash
        == local_cat.snapshot(local.snapshot_id).content_hash
    )
