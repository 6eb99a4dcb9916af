"""Ingest end to end: real files in, shards and a snapshot out, values equal to the source."""

import json
import subprocess
import sys
import textwrap
import zipfile

import numpy as np
import pytest
import source_files as sf
from simstore.formats.testing import assert_fields_equal

import simstore
from simstore.catalog import Catalog
from simstore.errors import InvalidInputError, SourceError
from simstore.hashing import object_key
from simstore.ingest import IngestConfig, ingest
from simstore.sample import Sample, hash_sample


def test_npz_folder_round_trips_with_keys_from_relative_paths(catalog, npz_dir, read):
    root, arrays = npz_dir
    result = ingest([root], dataset="cfd", store=catalog, snapshot=True, message="first")
    assert result.files == 6 and result.files_ingested == 6
    assert result.files_ignored == (str(root / "README.txt"),)
    assert result.snapshot_id is not None and result.samples == 6
    snap, got = read(catalog, "cfd")
    assert snap.message == "first"
    assert sorted(got) == sorted(arrays)  # "sub/run4", no extension
    for key, want in arrays.items():
        assert_fields_equal(got[key], want)
    # Parquet shards, readable by stock pyarrow
    import pyarrow.parquet as pq

    shard = catalog.manifest(snap).column("shard")[0].as_py()
    table = pq.read_table(catalog.store.local_path(object_key(shard)))
    assert sorted(table.column("__key__").to_pylist()) == sorted(arrays)


def test_simstore_ingest_is_callable_both_ways(catalog, npz_dir):
    import simstore.ingest as module

    root, _ = npz_dir
    first = simstore.ingest([root], dataset="a", store=catalog)
    again = module([root], dataset="b", store=catalog)
    assert first.samples == again.samples == 6


def test_hdf5_time_windows_into_zarr_shards(catalog, h5_dir, read):
    root, data = h5_dir
    result = ingest(
        [root], dataset="well", store=catalog, format="zarr", time_window=4, stride=4, snapshot=True
    )
    assert result.samples == 9  # 3 files x windows at 0, 4, 8
    snap, got = read(catalog, "well")
    assert sorted(got)[:3] == ["run0.h5/t0000", "run0.h5/t0004", "run0.h5/t0008"]
    d = data["run1.h5"]
    s = got["run1.h5/t0004"]
    np.testing.assert_array_equal(s["fields/velocity"], d["velocity"][4:8])
    np.testing.assert_array_equal(s["time"], d["time"][4:8])
    np.testing.assert_array_equal(s["grid/x"], d["x"])
    assert s["Re"] == 250.0 and s["solver"] == "demo-solver"
    for shard in set(catalog.manifest(snap).column("shard").to_pylist()):
        assert zipfile.is_zipfile(catalog.store.local_path(object_key(shard)))


def test_lance_format_round_trips(catalog, npz_dir, read):
    root, arrays = npz_dir
    ingest([root], dataset="l", store=catalog, format="lance", snapshot=True)
    _, got = read(catalog, "l")
    for key, want in arrays.items():
        assert_fields_equal(got[key], want)


def test_big_dense_fields_go_to_zarr_small_ones_to_parquet(catalog, tmp_path, read):
    root = tmp_path / "mixed"
    root.mkdir()
    big = np.linspace(0, 1, 64 * 64, dtype=np.float32).reshape(64, 64)
    np.savez(root / "big.npz", u=big)
    np.savez(root / "small.npz", u=big[:4, :4])
    ingest([root], dataset="m", store=catalog, dense_threshold=1024, snapshot=True)
    snap, got = read(catalog, "m")
    kinds = {}
    for row in catalog.manifest(snap).to_pylist():
        path = catalog.store.local_path(object_key(row["shard"]))
        kinds[row["key"]] = "zarr" if zipfile.is_zipfile(path) else "parquet"
    assert kinds == {"big": "zarr", "small": "parquet"}
    np.testing.assert_array_equal(got["big"]["u"], big)


@pytest.mark.parametrize("fmt", ["parquet", "lance"])
def test_an_array_too_large_for_a_columnar_value_goes_to_zarr_whatever_the_thresholds(
    catalog, tmp_path, read, monkeypatch, fmt
):
    """Parquet refuses a value of 2 GiB or more (a raw error, after the row was encoded),
    and a Lance file of one over 4 GiB was written and could not be read: such arrays go
    to Zarr shards even when the thresholds would keep them (the limit is made small here;
    one worker runs the task in this process)."""
    from simstore.ingest import _worker

    monkeypatch.setattr(_worker, "COLUMNAR_VALUE_BYTES", 4096)
    root = tmp_path / "mixed"
    root.mkdir()
    big = np.linspace(0, 1, 64 * 64, dtype=np.float32).reshape(64, 64)  # 16 KiB
    np.savez(root / "big.npz", u=big)
    np.savez(root / "small.npz", u=big[:4, :4])
    ingest([root], dataset="m", store=catalog, format=fmt, workers=1, snapshot=True,
           zarr_threshold=1 << 30, dense_threshold=1 << 30)
    snap, got = read(catalog, "m")
    kinds = {}
    for row in catalog.manifest(snap).to_pylist():
        path = catalog.store.local_path(object_key(row["shard"]))
        kinds[row["key"]] = "zarr" if zipfile.is_zipfile(path) else fmt
    assert kinds == {"big": "zarr", "small": fmt}
    np.testing.assert_array_equal(got["big"]["u"], big)


def test_shards_are_deterministic_across_stores(tmp_path, npz_dir):
    root, _ = npz_dir
    ids = []
    for name in ("s1", "s2"):
        cat = Catalog.init(str(tmp_path / name))
        r = ingest([root], dataset="d", store=cat, snapshot=True)
        snap = cat.snapshot(r.snapshot_id)
        ids.append((snap.content_hash, sorted(set(cat.manifest(snap).column("shard").to_pylist()))))
    assert ids[0] == ids[1]


def test_rerunning_a_finished_ingest_redoes_nothing(catalog, npz_dir):
    root, _ = npz_dir
    first = ingest([root], dataset="d", store=catalog, snapshot=True)
    again = ingest([root], dataset="d", store=catalog, snapshot=True)
    assert again.files_reused == 6 and again.files_ingested == 0
    assert again.files_unchanged == 6 and again.staging_id is None
    assert again.new_bytes == 0 and again.bytes_stored == 0
    assert again.snapshot_id == first.snapshot_id
    assert catalog.staged("d") == []


def test_staging_without_snapshot_then_rerun_reuses_the_entry(catalog, npz_dir):
    root, _ = npz_dir
    a = ingest([root], dataset="d", store=catalog)
    b = ingest([root], dataset="d", store=catalog)
    assert a.staging_id == b.staging_id
    assert [e.id for e in catalog.staged("d")] == [a.staging_id]


def test_changed_file_is_the_only_one_staged(catalog, npz_dir):
    root, arrays = npz_dir
    ingest([root], dataset="d", store=catalog, snapshot=True)
    np.savez(root / "run2.npz", u=np.zeros((2, 2), np.float32))
    r = ingest([root], dataset="d", store=catalog, snapshot=True)
    assert r.files_ingested == 1 and r.files_reused == 5 and r.samples_staged == 1
    snap = catalog.snapshot(r.snapshot_id)
    assert snap.stats["exact"] is False  # a key was replaced: the merge over-counts
    assert snap.samples == 6


def test_mode_replace_keeps_only_the_new_samples(catalog, npz_dir, tmp_path):
    root, _ = npz_dir
    ingest([root], dataset="d", store=catalog, snapshot=True)
    other = tmp_path / "other"
    other.mkdir()
    np.savez(other / "only.npz", u=np.ones((1, 3), np.float32))
    r = ingest([other], dataset="d", store=catalog, mode="replace", snapshot=True)
    snap = catalog.snapshot(r.snapshot_id)
    assert catalog.manifest(snap).column("key").to_pylist() == ["only"]
    assert snap.stats["exact"] is True and snap.stats["fields"]["u"]["count"] == [1, 1, 1]


def test_lineage_names_adapter_parameters_and_sources(catalog, npz_dir):
    root, _ = npz_dir
    r = ingest([root], dataset="d", store=catalog, snapshot=True, compression="zstd:3")
    snap = catalog.snapshot(r.snapshot_id)
    (lin,) = snap.lineage["ingests"]
    assert lin["adapter"] == "auto" and lin["adapters"] == {"npz": "1"}
    assert lin["parameters"]["shard_options"]["compression"] == "zstd:3"
    sources = json.loads(catalog.get_object(lin["sources"]["object"]))
    assert len(sources) == 6 and lin["sources"]["object"] in snap.lineage["objects"]
    from simstore.hashing import hash_file

    for s in sources:
        assert s["hash"] == hash_file(s["path"])[0]


def test_cad_original_bytes_are_stored_content_addressed(catalog, tmp_path, read):
    root = tmp_path / "cad"
    root.mkdir()
    sf.write_step(root / "box.step")
    r = ingest(
        [root],
        dataset="parts",
        store=catalog,
        snapshot=True,
        adapter_options={"cad_tolerance": 0.2},
    )
    snap, got = read(catalog, "parts")
    oid = got["box.step"]["source_object"]
    assert catalog.get_object(oid) == (root / "box.step").read_bytes()
    assert oid in snap.lineage["objects"]
    assert got["box.step"]["volume"] == pytest.approx(6.0)
    from simstore.catalog import verify

    assert verify(catalog, "parts", deep=True).problems == []
    assert r.new_bytes >= (root / "box.step").stat().st_size


def test_meshes_of_several_formats_and_a_pvd_series(catalog, tmp_path, read):
    root = tmp_path / "meshes"
    root.mkdir()
    want_vtu = sf.write_mesh(root / "a.vtu")
    sf.write_pvd(root)
    r = ingest([root], dataset="meshes", store=catalog, snapshot=True)
    # step_*.vtu belong to series.pvd and are not ingested on their own
    assert r.files == 2
    _, got = read(catalog, "meshes")
    assert sorted(got) == ["a.vtu", "series.pvd/t0000", "series.pvd/t0001", "series.pvd/t0002"]
    assert_fields_equal({k: got["a.vtu"][k] for k in want_vtu}, want_vtu)


def test_netcdf_and_zarr_group_sources(catalog, tmp_path, read):
    root = tmp_path / "src"
    root.mkdir()
    d = sf.write_nc(root / "ocean.nc")
    sf.write_zarr_group(root / "run.zarr")
    r = ingest([root], dataset="x", store=catalog, snapshot=True)
    assert r.files == 2  # the Zarr group is one source, not walked into
    _, got = read(catalog, "x")
    np.testing.assert_array_equal(got["ocean.nc"]["fields/pressure"], d["density"])
    np.testing.assert_array_equal(got["run.zarr"]["fields/density"], d["density"])


def test_options_are_validated(catalog, npz_dir):
    root, _ = npz_dir
    with pytest.raises(InvalidInputError, match="invalid compression 'lz4'"):
        ingest([root], dataset="d", store=catalog, compression="lz4")
    with pytest.raises(InvalidInputError, match="unknown adapter 'nope'"):
        ingest([root], dataset="d", store=catalog, adapter="nope")
    with pytest.raises(InvalidInputError, match="invalid ingest option"):
        ingest([root], dataset="d", store=catalog, colour="blue")  # type: ignore[call-arg]
    with pytest.raises(InvalidInputError, match="memory:// store lives in one process"):
        mem = Catalog.init("memory://ingest-test-workers")
        ingest([root], dataset="d", store=mem, workers=2)
    with pytest.raises(InvalidInputError, match="no such file"):
        ingest([root / "missing"], dataset="d", store=catalog)
    with pytest.raises(InvalidInputError, match="shard_size: invalid size 'lots'"):
        ingest([root], dataset="d", store=catalog, shard_size="lots")
    with pytest.raises(InvalidInputError, match="invalid chunk_bytes 2.5: give a number"):
        ingest([root], dataset="d", store=catalog, chunk_bytes=2.5)
    for kw, message in [({"snapshot": "no"}, "invalid snapshot 'no': must be True or False"),
                        ({"resume": "no"}, "invalid resume 'no'"),
                        ({"message": 123, "snapshot": True}, "invalid message 123: must be a"),
                        ({"workers": 2.5}, "invalid workers 2.5: must be a whole number"),
                        ({"time_window": 2.5}, "invalid time_window 2.5")]:
        with pytest.raises(InvalidInputError, match=message):  # truthy, truncated, str()
            ingest([root], dataset="d", store=catalog, **kw)
    assert catalog.staged("d") == []


def test_sizes_may_be_given_as_on_the_command_line(catalog, npz_dir):
    root, _ = npz_dir
    r = ingest([root], dataset="d", store=catalog, shard_size="1KiB", row_group_bytes=4e3)
    assert r.shards == r.samples == 6  # each sample is larger than 1 KiB: one per shard


def test_two_sources_with_the_same_key_are_refused(catalog, tmp_path):
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        np.save(tmp_path / d / "x.npy", np.zeros(2))
    with pytest.raises(InvalidInputError, match="two sources map to the key 'x.npy'"):
        ingest([tmp_path / "a" / "x.npy", tmp_path / "b" / "x.npy"], dataset="d", store=catalog)


def test_memory_stays_bounded_by_configuration(catalog, tmp_path):
    """A 48 MiB array streamed with 1 MiB blocks never sits in memory whole.

    (The Zarr writer reads slabs of up to 64 chunks: 4 MiB of 64 KiB chunks.)
    """
    import tracemalloc

    big = np.arange(6 * 1024 * 1024, dtype=np.float64).reshape(96, 256, 256)
    np.save(tmp_path / "big.npy", big)
    cfg = IngestConfig(
        dense_threshold=1 << 20, block_bytes=1 << 20, chunk_bytes=1 << 16, compression="none"
    )
    tracemalloc.start()
    try:
        r = ingest([tmp_path / "big.npy"], dataset="big", store=catalog, config=cfg, snapshot=True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert r.samples == 1
    assert peak < big.nbytes / 4, peak
    snap = catalog.snapshot(r.snapshot_id)
    assert snap.stats["fields"]["data"]["count"] == [big.size]
    assert snap.stats["fields"]["data"]["max"] == [float(big.size - 1)]


@pytest.mark.multiprocess
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_two_workers_give_the_same_snapshot_content_and_shards(tmp_path, npz_dir, method):
    root, _ = npz_dir
    out = []
    for workers in (1, 2):
        cat = Catalog.init(str(tmp_path / f"w{workers}"))
        r = ingest([root], dataset="d", store=cat, workers=workers, shard_size=2048,
                   snapshot=True, start_method=method)
        snap = cat.snapshot(r.snapshot_id)
        out.append(
            (
                r.engine,
                snap.content_hash,
                sorted(set(cat.manifest(snap).column("shard").to_pylist())),
            )
        )
    assert out[0][0] == "local" and out[1][0] == "process-pool"
    assert out[0][1:] == out[1][1:]
    assert len(out[0][2]) > 1


def _forked_pool_ingest(tmp_path, files, **options):
    """``files`` .npz runs, one task each, ingested by two workers (a forked pool)."""
    (tmp_path / "src").mkdir()
    for i in range(files):
        sf.write_npz(tmp_path / "src" / f"run{i}.npz", seed=i)
    cat = Catalog.init(str(tmp_path / "store"))
    return ingest([tmp_path / "src"], dataset="d", store=cat, workers=2, shard_size=1,
                  start_method="fork", **options)


@pytest.mark.multiprocess
def test_a_forked_pool_gets_work_before_this_process_finishes_its_first_task(
    tmp_path, monkeypatch
):
    """Two tasks, two workers: one runs here, one in the forked process, however slowly
    a start-up probe would answer (a pool that waited for one first left its process
    idle through this one's first task; here this process would have run both)."""
    import os
    import time

    import simstore.ingest._engine as engine

    def slow_probe(plugins):
        time.sleep(2)
        return os.getpid()

    monkeypatch.setattr(engine, "warm_up", slow_probe)
    r = _forked_pool_ingest(tmp_path, files=2)
    assert len(r.tasks) == 2 and r.engine == "process-pool"
    ran = sorted(t.worker for t in r.tasks)
    assert ran[0] == "local" and ran[1].startswith("pid ") and ran[1] != f"pid {os.getpid()}"


@pytest.mark.multiprocess
def test_the_summary_names_the_workers_a_run_used_not_those_asked_for(tmp_path):
    # one task cannot use four workers: the run is local, with one; two tasks use two
    (tmp_path / "one").mkdir()
    sf.write_npz(tmp_path / "one" / "run0.npz", seed=0)
    cat = Catalog.init(str(tmp_path / "a"))
    r = ingest([tmp_path / "one"], dataset="d", store=cat, workers=4, snapshot=True)
    assert len(r.tasks) == 1 and (r.engine, r.workers) == ("local", 1)
    assert r.to_json()["workers"] == 1
    assert cat.snapshot(r.snapshot_id).lineage["ingests"][0]["workers"] == 1
    two = _forked_pool_ingest(tmp_path, files=2)
    assert len(two.tasks) == 2 and (two.engine, two.workers) == ("process-pool", 2)
    r4 = ingest([tmp_path / "src"], dataset="d", store=Catalog.init(str(tmp_path / "b")),
                workers=4, shard_size=1, start_method="fork")
    assert len(r4.tasks) == 2 and (r4.engine, r4.workers) == ("process-pool", 2)


def test_the_pool_forks_only_while_no_other_python_thread_runs(monkeypatch):
    import sys
    import threading

    from simstore.ingest._engine import start_method

    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert start_method() == "spawn"  # an event loop or a pool may hold a lock
    finally:
        stop.set()
        thread.join()
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    import simstore.formats._lance as lance

    monkeypatch.setattr(lance, "_USED_BY", None)  # an earlier test's Lance shards
    assert start_method() == ("fork" if sys.platform.startswith("linux") else "spawn")
    assert start_method("spawn") == "spawn"
    with pytest.raises(InvalidInputError, match="invalid start_method 'vfork'"):
        IngestConfig(start_method="vfork")


def test_a_process_that_wrote_lance_shards_spawns_its_pool(tmp_path):
    # Lance's runtime threads do not survive a fork: a second ingest in a notebook that
    # had written Lance shards lost a forked worker to a crash in 1 run of 3
    code = textwrap.dedent(f"""
        import numpy as np
        from simstore.formats import LanceFormat
        from simstore.ingest._engine import start_method
        from simstore.sample import Sample
        before = start_method()
        LanceFormat().write([Sample("a", {{"x": np.arange(3.0)}})], {str(tmp_path / "s")!r})
        print(before, start_method())
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=False)
    assert run.returncode == 0, run.stderr
    expected = "fork" if sys.platform.startswith("linux") else "spawn"
    assert run.stdout.split() == [expected, "spawn"]


def test_hash_sample_blocks_equals_hash_sample():
    from simstore.formats.testing import example_samples

    from simstore.ingest import hash_sample_blocks

    for s in example_samples(4):
        assert hash_sample_blocks(s, block_bytes=7) == hash_sample(s)
    odd = Sample("k", {"z": np.array(2.5), "be": np.arange(6, dtype=">i4").reshape(2, 3)})
    assert hash_sample_blocks(odd, 4) == hash_sample(odd)


def test_a_journal_record_cut_short_by_a_crash_is_ignored_and_its_file_redone(tmp_path, npz_dir):
    # records are written without fsync (they are hints): after a crash one may be empty
    # or cut short; the re-run must then redo that file, never fail or trust it
    root, _ = npz_dir
    cat = Catalog.init(str(tmp_path / "store"))  # a local store with fsync on (the default)
    first = ingest([root], dataset="d", store=cat, snapshot=True)
    records = sorted(p for p in (tmp_path / "store" / "journal" / "d").iterdir()
                     if not p.name.startswith("task-"))
    assert len(records) == 6
    records[0].write_bytes(b"")
    records[1].write_bytes(records[1].read_bytes()[:20])
    again = ingest([root], dataset="d", store=cat, snapshot=True)
    assert again.files_ingested == 2 and again.files_reused == 4
    assert again.snapshot_id == first.snapshot_id  # same samples, nothing new to commit
    assert again.files_unchanged == 6


def _gated_run_task(ctx, task, plugins):
    """A pool process's task that starts only once the gate file exists (or 20 s pass)."""
    import os
    import time

    import simstore.ingest._worker as worker

    gate = os.environ["SIMSTORE_TEST_GATE"]
    deadline = time.monotonic() + 20
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.01)
    return worker.run_task(ctx, task, plugins)


@pytest.mark.multiprocess
def test_a_busy_pool_process_holds_no_task_this_process_could_run(tmp_path, monkeypatch):
    """Six tasks, two workers, the pool's process stuck in its first task until this
    process has run five: it ran the other five, as none was queued behind the stuck one
    (the pool used to keep a second task queued per process, which this process could not
    take: the stuck process then ran two and this one four)."""
    import simstore.ingest._engine as engine

    gate = tmp_path / "gate"
    monkeypatch.setenv("SIMSTORE_TEST_GATE", str(gate))
    monkeypatch.setattr(engine, "run_task", _gated_run_task)
    here = engine._run_here
    ran_here = []

    def run_here(*args):
        out = here(*args)
        ran_here.append(out)
        if len(ran_here) == 5:
            gate.touch()
        return out

    monkeypatch.setattr(engine, "_run_here", run_here)
    r = _forked_pool_ingest(tmp_path, files=6, snapshot=True)
    workers = [t.worker for t in r.tasks]
    assert len(workers) == 6 and workers.count("local") == 5
    assert r.samples == 6 and r.snapshot_id is not None


@pytest.mark.multiprocess
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_bad_file_in_either_process_fails_a_pooled_ingest_and_stages_nothing(
    tmp_path, method
):
    from simstore.errors import SourceError

    root = tmp_path / "src"
    root.mkdir()
    for i in range(8):
        sf.write_npz(root / f"run{i}.npz", seed=i)
    # every other file is bad: whichever process takes one fails the run
    for i in (1, 3, 5, 7):
        (root / f"run{i}.npz").write_bytes(b"PK\x03\x04 not a zip")
    cat = Catalog.init(str(tmp_path / "store"))
    with pytest.raises(SourceError, match=r"run\d\.npz"):
        ingest([root], dataset="d", store=cat, workers=2, shard_size=1, snapshot=True,
               start_method=method)
    assert cat.staged("d") == []
    assert cat.branches("d").get_versioned("main")[0] is None
    r = ingest([root], dataset="d", store=cat, workers=2, shard_size=1, snapshot=True,
               start_method=method, on_error="skip")
    assert sorted(s.path.rsplit("/", 1)[1] for s in r.files_skipped) == [
        f"run{i}.npz" for i in (1, 3, 5, 7)
    ]
    assert r.samples == 4


def _dying_run_task(ctx, task, plugins):
    """A pool process's task that ends its process, as a native crash or the OOM killer."""
    import os

    os._exit(3)


@pytest.mark.multiprocess
def test_a_pool_process_that_dies_fails_the_ingest_clearly(tmp_path, monkeypatch):
    import simstore.ingest._engine as engine
    from simstore.errors import SimstoreError

    monkeypatch.setattr(engine, "run_task", _dying_run_task)
    with pytest.raises(SimstoreError, match="ingest worker process died"):
        _forked_pool_ingest(tmp_path, files=4, snapshot=True)
    cat = Catalog.init(str(tmp_path / "store"))  # idempotent: opens the store
    assert cat.staged("d") == []


@pytest.mark.multiprocess
def test_a_task_the_pool_refuses_fails_the_ingest_instead_of_waiting_for_it(
    tmp_path, monkeypatch
):
    """The pool breaks between one task's result and the next task's submission (its
    process died in between): the task it refuses is not silently dropped, which would
    leave the ingest waiting for it forever."""
    import concurrent.futures as cf

    import simstore.ingest._engine as engine
    from simstore.errors import SimstoreError

    class BreaksAfterOne(cf.ProcessPoolExecutor):
        submitted = 0

        def submit(self, *args, **kwargs):
            BreaksAfterOne.submitted += 1
            if BreaksAfterOne.submitted > 1:
                raise cf.process.BrokenProcessPool("a child process terminated abruptly")
            return super().submit(*args, **kwargs)

    monkeypatch.setattr(engine.cf, "ProcessPoolExecutor", BreaksAfterOne)
    with pytest.raises(SimstoreError, match="ingest worker process died"):
        _forked_pool_ingest(tmp_path, files=6, snapshot=True)
    assert BreaksAfterOne.submitted == 2


def test_shards_reused_from_the_journal_survive_a_gc_before_they_are_staged(
    tmp_path, monkeypatch
):
    """A failed ingest leaves a finished file's shard and record behind; hours later the
    re-run reuses them. The reuse refreshes the shard's time as a write would, so a gc
    that runs before the rows are staged keeps it, and the snapshot is complete."""
    import os
    import time

    from simstore.catalog import gc, verify

    src = tmp_path / "src"
    src.mkdir()
    np.savez(src / "a.npz", x=np.arange(5, dtype=np.float32))
    np.savez(src / "b.npz", x=np.arange(5, dtype=np.float64))  # breaks a's schema
    cat = Catalog.init(str(tmp_path / "store"))
    with pytest.raises(SourceError, match="b.npz"):
        ingest([str(src)], dataset="d", store=cat, snapshot=True)
    hours_ago = time.time() - 7200
    for folder in ("objects", "journal"):
        for path in (tmp_path / "store" / folder).rglob("*"):
            if path.is_file():
                os.utime(path, (hours_ago, hours_ago))
    np.savez(src / "b.npz", x=np.arange(5, dtype=np.float32))
    stage = Catalog.stage
    collected = []

    def gc_then_stage(self, *args, **kwargs):
        collected.append(gc(self, grace_s=3600))
        return stage(self, *args, **kwargs)

    monkeypatch.setattr(Catalog, "stage", gc_then_stage)
    result = ingest([str(src)], dataset="d", store=cat, snapshot=True)
    assert result.files_reused == 1 and collected  # a.npz came from its record
    report = verify(cat, "d", deep=True)
    assert report.ok, report.problems


def test_a_file_changed_by_a_staged_entry_is_staged_again_and_its_last_ingest_wins(
    tmp_path, read
):
    """Unchanged against the head is not unchanged when a staged entry changes the key:
    a file changed and staged, then reverted and ingested with a snapshot, must commit
    the reverted values, not the staged ones."""
    src = tmp_path / "src"
    src.mkdir()
    np.savez(src / "a.npz", x=np.zeros(4, dtype=np.float32))
    cat = Catalog.init(str(tmp_path / "store"))
    ingest([str(src)], dataset="d", store=cat, snapshot=True)
    np.savez(src / "a.npz", x=np.ones(4, dtype=np.float32))
    assert ingest([str(src)], dataset="d", store=cat).staging_id is not None  # staged only
    np.savez(src / "a.npz", x=np.zeros(4, dtype=np.float32))
    last = ingest([str(src)], dataset="d", store=cat, snapshot=True)
    assert last.files_unchanged == 0 and last.samples_staged == 1
    assert cat.staged("d") == []
    _, got = read(cat, "d")
    np.testing.assert_array_equal(got["a"]["x"], np.zeros(4, dtype=np.float32))


def test_a_file_whose_key_has_a_staged_deletion_is_ingested_again(tmp_path, read):
    from click.testing import CliRunner
    from simstore.cli import main

    src = tmp_path / "src"
    src.mkdir()
    for name in ("a", "b"):
        np.savez(src / f"{name}.npz", x=np.arange(3, dtype=np.float32))
    store = str(tmp_path / "store")
    cat = Catalog.init(store)
    ingest([str(src)], dataset="d", store=cat, snapshot=True)
    out = CliRunner().invoke(main, ["--store", store, "delete", "d", "a"])
    assert out.exit_code == 0, out.output
    again = ingest([str(src)], dataset="d", store=cat, snapshot=True)
    assert again.files_unchanged == 1 and again.samples_staged == 1  # b only is unchanged
    assert cat.staged("d") == []
    _, got = read(cat, "d")
    assert sorted(got) == ["a", "b"]


def test_an_identical_staged_entry_is_not_reused_when_a_later_one_changes_its_keys(
    tmp_path, read
):
    src = tmp_path / "src"
    src.mkdir()
    cat = Catalog.init(str(tmp_path / "store"))
    staged = []
    for value in (2, 0, 1):  # committed twos; then zeros staged, ones staged
        np.savez(src / "a.npz", x=np.full(4, value, dtype=np.float32))
        staged.append(ingest([str(src)], dataset="d", store=cat, snapshot=value == 2))
    np.savez(src / "a.npz", x=np.zeros(4, dtype=np.float32))
    last = ingest([str(src)], dataset="d", store=cat, snapshot=True)
    assert last.staging_id not in {s.staging_id for s in staged}  # a new, later entry
    assert cat.staged("d") == []
    _, got = read(cat, "d")
    np.testing.assert_array_equal(got["a"]["x"], np.zeros(4, dtype=np.float32))


def test_a_resumed_skip_run_skips_what_a_fresh_one_skips(tmp_path):
    """A file reused from the journal counts in the schema of its task's later files, as
    a file read again would: a bad file after it is the one skipped, not the good one."""
    src = tmp_path / "src"
    src.mkdir()
    np.savez(src / "a.npz", x=np.arange(10.0))
    np.savez(src / "b.npz", x=np.arange(10, dtype=np.float32))  # the odd one out
    np.savez(src / "c.npz", x=np.arange(10.0))
    fresh = ingest([str(src)], dataset="d", store=Catalog.init(str(tmp_path / "fresh")),
                   on_error="skip")
    cat = Catalog.init(str(tmp_path / "store"))
    with pytest.raises(SourceError, match="b.npz"):
        ingest([str(src)], dataset="d", store=cat)  # fails at b; a is journaled
    resumed = ingest([str(src)], dataset="d", store=cat, on_error="skip")
    assert resumed.files_reused == 1
    assert [s.path for s in resumed.files_skipped] == [s.path for s in fresh.files_skipped]
    assert resumed.samples == fresh.samples == 2


def test_a_file_with_the_key_size_and_mtime_of_a_journaled_one_is_read(tmp_path, read):
    """Two folders' run.npz, written with the same size and mtime (as tar or rsync -a
    keep them): the second is not taken from the first's journal record."""
    import os

    cat = Catalog.init(str(tmp_path / "store"))
    for value in (1.0, 2.0):
        folder = tmp_path / f"v{int(value)}"
        folder.mkdir()
        np.savez(folder / "run.npz", x=np.full(4, value))
        os.utime(folder / "run.npz", ns=(1_700_000_000_000_000_000,) * 2)
        result = ingest([str(folder)], dataset="d", store=cat, snapshot=True)
        assert result.files_reused == 0
        _, got = read(cat, "d")
        np.testing.assert_array_equal(got["run"]["x"], np.full(4, value))


def test_a_scratch_folder_that_cannot_be_made_is_a_storage_error_naming_it(tmp_path):
    """A read-only store (or a --tmp-dir that is a file) fails in one line, not a
    traceback; nothing is staged."""
    from simstore.errors import StorageError

    src = tmp_path / "src"
    src.mkdir()
    np.savez(src / "a.npz", x=np.arange(3.0))
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    cat = Catalog.init(str(tmp_path / "store"))
    with pytest.raises(StorageError, match="scratch folder") as info:
        ingest([str(src)], dataset="d", store=cat, tmp_dir=str(not_a_folder))
    assert str(not_a_folder) in str(info.value) and "\n" not in str(info.value)
    assert cat.staged("d") == []


def test_a_file_reached_by_two_sources_under_two_keys_is_refused(catalog, tmp_path):
    """A folder and a folder inside it, both given: their files are not ingested twice."""
    (tmp_path / "runs" / "sub").mkdir(parents=True)
    np.save(tmp_path / "runs" / "r0.npy", np.zeros(2))
    np.save(tmp_path / "runs" / "sub" / "s.npy", np.ones(2))
    for sources in ([tmp_path / "runs", tmp_path / "runs" / "sub"],
                    [tmp_path / "runs", tmp_path / "runs" / "sub" / "s.npy"]):
        with pytest.raises(InvalidInputError, match=r"s\.npy is reached by two sources.*"
                           r"'sub/s\.npy' and 's\.npy'"):
            ingest(sources, dataset="d", store=catalog)
    assert catalog.staged("d") == []
    # the same file under the key it already has is listed once
    r = ingest([tmp_path / "runs", tmp_path / "runs" / "r0.npy"], dataset="d", store=catalog)
    assert (r.files, r.samples) == (2, 2)


def test_a_file_reached_by_two_sources_through_a_linked_folder_is_refused(catalog, tmp_path):
    """A folder given through a link, and a folder inside it given as it is (or the other
    way round): the same files, under two keys, were ingested twice."""
    (tmp_path / "runs" / "sub").mkdir(parents=True)
    np.save(tmp_path / "runs" / "r0.npy", np.zeros(2))
    np.save(tmp_path / "runs" / "sub" / "s.npy", np.ones(2))
    (tmp_path / "linked").symlink_to(tmp_path / "runs")
    (tmp_path / "sublink").symlink_to(tmp_path / "runs" / "sub")
    for sources in ([tmp_path / "linked", tmp_path / "runs" / "sub"],
                    [tmp_path / "runs", tmp_path / "sublink"],
                    [tmp_path / "runs", tmp_path / "sublink" / "s.npy"]):
        with pytest.raises(InvalidInputError, match=r"s\.npy is reached by two sources.*"
                           r"'sub/s\.npy' and 's\.npy'"):
            ingest(sources, dataset="d", store=catalog)
    assert catalog.staged("d") == []
    # a file that is a link is a source of its own, as before: in the same folder, or in
    # another source's
    (tmp_path / "runs" / "again.npy").symlink_to(tmp_path / "runs" / "r0.npy")
    (tmp_path / "more").mkdir()
    (tmp_path / "more" / "alias.npy").symlink_to(tmp_path / "runs" / "r0.npy")
    r = ingest([tmp_path / "runs", tmp_path / "more"], dataset="d", store=catalog)
    assert (r.files, r.samples) == (4, 4)
