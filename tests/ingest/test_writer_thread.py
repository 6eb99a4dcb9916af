"""Shard writes on the task's writer thread: the same bytes, the same checks, the same errors.

Where an ingest process has a core to spare, a sample of 1 MiB or more bound for the Zarr
writer is written on a thread of the task while the next sample (and the next file) is
read, hashed and summarised; its file is checked against its listing once that last
write is done. These tests force the thread on or off whatever this machine's cores.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import numpy as np
import pytest
from simstore.formats._zarr_write import ZarrShardWriter

import simstore.ingest._engine as engine
import simstore.ingest._worker as worker
from simstore.catalog import Catalog
from simstore.errors import SourceError, StorageError
from simstore.ingest import ingest

BIG = (64, 64, 80)  # float32: 1.25 MiB, past the hand-off size
TASKS = {
    # every file in one task, or a task per file (a shard fills with one file's sample):
    # then a task's last writes run while the next task reads
    "one task": {},
    "a task per file": {"shard_size": 1 << 20},
}


def _sources(root, n=5):
    """``n`` .npz runs of big and small fields; run2 also has a sample too small to hand off."""
    root.mkdir()
    rng = np.random.default_rng(11)
    for i in range(n):
        np.savez(
            root / f"run{i}.npz",
            big=rng.standard_normal(BIG).astype(np.float32),
            small=rng.standard_normal(7).astype(np.float32),
        )
    np.savez(root / "tiny.npz", big=np.zeros((2, 2, 2), np.float32), small=np.ones(7, np.float32))
    return root


@pytest.fixture
def thread_on(monkeypatch):
    """Force the writer thread on (``True``) or off, and count the samples handed to it."""
    handed: list[str] = []
    real = worker._WriterThread.submit

    def submit(self, fn, *args):
        if fn is worker._add:
            handed.append(args[1].key)
        return real(self, fn, *args)

    monkeypatch.setattr(worker._WriterThread, "submit", submit)

    def force(on: bool) -> list[str]:
        monkeypatch.setattr(worker, "writer_thread_wanted", lambda workers: on)
        monkeypatch.setattr(engine, "writer_thread_wanted", lambda workers: on)
        handed.clear()
        return handed

    return force


def _shards(catalog: Catalog, snapshot_id: str) -> list[tuple[str, str, int]]:
    table = catalog.manifest(catalog.snapshot(snapshot_id))
    return sorted(zip(*(table.column(c).to_pylist() for c in ("key", "shard", "position")),
                      strict=True))


@pytest.mark.parametrize("tasks", TASKS)
def test_shards_written_on_the_thread_are_the_bytes_written_inline(tmp_path, thread_on, tasks):
    src = _sources(tmp_path / "src")
    runs = {}
    for on in (True, False):
        handed = thread_on(on)
        cat = Catalog.init(str(tmp_path / f"store-{on}"))
        r = ingest([src], dataset="d", store=cat, format="zarr", snapshot=True, workers=1,
                   **TASKS[tasks])
        runs[on] = (r.shards, _shards(cat, r.snapshot_id), list(handed))
    assert runs[True][2] == [f"run{i}" for i in range(5)]  # tiny stayed on the reading thread
    assert runs[False][2] == []
    # the same shards (content ids), samples at the same positions
    assert runs[True][1] == runs[False][1] and len(runs[True][1]) == 6
    assert runs[True][0] == runs[False][0]
    assert runs[True][0] == (1 if tasks == "one task" else 6)


@pytest.mark.parametrize("tasks", TASKS)
def test_a_file_changed_while_its_last_sample_is_written_is_skipped_not_stored(
    tmp_path, thread_on, monkeypatch, tasks
):
    """The write of run1's sample runs after its samples were read and hashed; the file
    changes meanwhile. Its check waits for the write, so run1 is a changed file, and the
    files read while it was written are kept."""
    src = _sources(tmp_path / "src")
    thread_on(True)
    real = worker._add

    def add(writer, sample, digest, size, position):
        if sample.key == "run1":  # rewritten in place while the thread writes it
            path = src / "run1.npz"
            st = path.stat()
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
        real(writer, sample, digest, size, position)

    monkeypatch.setattr(worker, "_add", add)
    cat = Catalog.init(str(tmp_path / "store"))
    r = ingest([src], dataset="d", store=cat, format="zarr", snapshot=True, workers=1,
               on_error="skip", **TASKS[tasks])
    assert [os.path.basename(s.path) for s in r.files_skipped] == ["run1.npz"]
    assert "changed since it was listed" in r.files_skipped[0].reason
    keys = [k for k, _, _ in _shards(cat, r.snapshot_id)]
    assert keys == ["run0", "run2", "run3", "run4", "tiny"]

    # without --on-error skip the ingest fails naming the file, and stages nothing
    cat2 = Catalog.init(str(tmp_path / "store2"))
    with pytest.raises(SourceError, match=r"run1\.npz.*changed since it was listed"):
        ingest([src], dataset="d", store=cat2, format="zarr", snapshot=True, workers=1,
               **TASKS[tasks])
    assert cat2.staged("d") == [] and cat2.branches("d").get_versioned("main")[0] is None
    # the files read before the failure are journaled (run0; with a task per file also
    # run2, read while run1 was written): the re-run reads the rest
    monkeypatch.setattr(worker, "_add", real)
    again = ingest([src], dataset="d", store=cat2, format="zarr", snapshot=True, workers=1,
                   **TASKS[tasks])
    assert again.files_reused == (1 if tasks == "one task" else 2)
    assert again.files_ingested == 6 - again.files_reused
    assert [k for k, _, _ in _shards(cat2, again.snapshot_id)] == [
        "run0", "run1", "run2", "run3", "run4", "tiny"
    ]


@pytest.mark.parametrize("tasks", TASKS)
def test_a_write_that_fails_on_the_thread_fails_the_ingest_and_leaves_nothing(
    tmp_path, thread_on, monkeypatch, tasks
):
    src = _sources(tmp_path / "src")
    thread_on(True)
    real = ZarrShardWriter.add
    calls = []

    def add(self, sample, **kw):
        calls.append(threading.current_thread().name)
        if sample.key == "run2":
            raise StorageError(f"{self.path}: writing the shard failed: no space left on device")
        return real(self, sample, **kw)

    monkeypatch.setattr(ZarrShardWriter, "add", add)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    cat = Catalog.init(str(tmp_path / "store"))
    before = threading.active_count()
    with pytest.raises(StorageError, match="no space left on device"):
        ingest([src], dataset="d", store=cat, format="zarr", snapshot=True, workers=1,
               on_error="skip", tmp_dir=str(scratch), **TASKS[tasks])
    assert calls[:3] == ["simstore-shard-writer_0"] * 3  # written on the thread
    assert cat.staged("d") == [] and cat.branches("d").get_versioned("main")[0] is None
    assert list(scratch.iterdir()) == []  # the open shard was aborted
    assert threading.active_count() == before  # and the thread stopped


def _touch_while_written(monkeypatch, src, key):
    """Bump ``<key>.npz``'s mtime while its sample is written: it changed meanwhile."""
    real = ZarrShardWriter.add

    def add(self, sample, **kw):
        if sample.key == key:
            path = src / f"{key}.npz"
            st = path.stat()
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
        return real(self, sample, **kw)

    monkeypatch.setattr(ZarrShardWriter, "add", add)


def _skipping_one_changed(tmp_path, monkeypatch, thread_on, src, key):
    """Ingest ``src`` with the thread on and ``--on-error skip``, ``<key>.npz`` changing
    while written: only it is skipped."""
    thread_on(True)
    _touch_while_written(monkeypatch, src, key)
    cat = Catalog.init(str(tmp_path / "store"))
    r = ingest([src], dataset="d", store=cat, format="zarr", snapshot=True, workers=1,
               on_error="skip")
    assert [os.path.basename(s.path) for s in r.files_skipped] == [f"{key}.npz"]
    return cat, r


def test_a_last_file_changed_while_written_fails_after_the_files_before_it_are_journaled(
    tmp_path, thread_on, monkeypatch
):
    """The task's last file is checked when the task finishes: under ``fail`` the files
    before it are stored and journaled first, as for a bad file found while reading."""
    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(3)
    for i in range(4):
        np.savez(src / f"run{i}.npz", big=rng.standard_normal(BIG).astype(np.float32))
    thread_on(True)
    _touch_while_written(monkeypatch, src, "run3")
    cat = Catalog.init(str(tmp_path / "store"))
    with pytest.raises(SourceError, match=r"run3\.npz.*changed since it was listed"):
        ingest([src], dataset="d", store=cat, format="zarr", snapshot=True, workers=1)
    monkeypatch.undo()
    again = ingest([src], dataset="d", store=cat, format="zarr", snapshot=True, workers=1)
    assert (again.files_reused, again.files_ingested) == (3, 1)


def test_a_changed_files_fields_do_not_refuse_the_next_file(tmp_path, thread_on, monkeypatch):
    """a.npz has ``f`` as float32 and changes while written; b.npz has ``f`` as float64.
    a.npz is checked only after b.npz's first sample was read: b.npz is refused for the
    type change only while a.npz is taken as good, and it is not."""
    src = tmp_path / "src"
    src.mkdir()
    big = np.zeros(BIG, np.float32)
    np.savez(src / "a.npz", big=big, f=np.ones(7, np.float32))
    np.savez(src / "b.npz", big=big, f=np.ones(7, np.float64))
    cat, r = _skipping_one_changed(tmp_path, monkeypatch, thread_on, src, "a")
    schema = {spec.name: spec for spec in cat.snapshot(r.snapshot_id).schema}
    assert schema["f"].dtype == "float64"


def test_a_file_of_no_samples_does_not_take_the_check_of_the_file_before(
    tmp_path, thread_on, monkeypatch
):
    """An adapter may give a file no samples; the file before it, still being written,
    is checked all the same (and its listing's descriptor closed)."""
    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(5)
    for name in ("a", "b_empty", "c"):
        np.savez(src / f"{name}.npz", big=rng.standard_normal(BIG).astype(np.float32))
    real_resolve = worker.resolve_adapter

    class NoSamples:
        def __init__(self, inner):
            self._inner = inner

        def __getattr__(self, name):
            return getattr(self._inner, name)

        def iter_samples(self, path, key, options):
            return iter(())

    def resolve(adapter, path, head):
        found = real_resolve(adapter, path, head)
        return NoSamples(found) if "empty" in os.path.basename(path) else found

    monkeypatch.setattr(worker, "resolve_adapter", resolve)
    opened = []
    real_open = worker.ListedSource.open

    def listed_open(self):
        real_open(self)
        opened.append(self)

    monkeypatch.setattr(worker.ListedSource, "open", listed_open)
    _skipping_one_changed(tmp_path, monkeypatch, thread_on, src, "a")
    assert len(opened) == 3 and [x for x in opened if x.fd is not None] == []


def _in_writes_wait(thread: threading.Thread) -> bool:
    """Whether ``thread`` is inside ``_WriterThread.wait`` now."""
    frame = sys._current_frames().get(thread.ident or 0)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "wait" and code.co_filename.endswith(os.path.join("ingest",
                                                                              "_writes.py")):
            return True
        frame = frame.f_back
    return False


def test_an_interrupt_while_waiting_for_the_thread_aborts_nothing_under_a_write(
    tmp_path, thread_on, monkeypatch
):
    """Ctrl-C while the reading thread waits for a write: the shard is aborted only once
    the write is done, and the interrupt is raised."""
    src = _sources(tmp_path / "src")
    thread_on(True)
    events: list[str] = []
    real_add, real_abort = ZarrShardWriter.add, ZarrShardWriter.abort
    main = threading.main_thread()

    def add(self, sample, **kw):
        if sample.key == "run1" and threading.current_thread() is not main:
            # interrupt the reading thread once it waits for this add (seen in its stack,
            # not guessed from a delay, which a loaded machine outran)
            deadline = time.monotonic() + 60
            while not _in_writes_wait(main) and time.monotonic() < deadline:
                time.sleep(0.002)
            signal.pthread_kill(main.ident, signal.SIGINT)
            time.sleep(0.3)
            events.append("add done")
        return real_add(self, sample, **kw)

    def abort(self):
        events.append("abort")
        return real_abort(self)

    monkeypatch.setattr(ZarrShardWriter, "add", add)
    monkeypatch.setattr(ZarrShardWriter, "abort", abort)
    cat = Catalog.init(str(tmp_path / "store"))
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    try:
        with pytest.raises(KeyboardInterrupt):
            ingest([src], dataset="d", store=cat, format="zarr", snapshot=True, workers=1)
    finally:
        signal.signal(signal.SIGINT, before)
    assert events[:2] == ["add done", "abort"]
    assert cat.staged("d") == []


@pytest.mark.parametrize(
    ("threads", "workers", "address", "asked"),
    [(1, 1, None, [1]), (4, 1, None, [4]), (1, 3, None, [3]), (1, 1, "tcp://127.0.0.1:9", [])],
)
def test_a_dask_task_asks_for_the_thread_by_its_workers_threads(
    tmp_path, monkeypatch, threads, workers, address, asked
):
    """A dask worker runs ``nthreads`` tasks at once (a local cluster: ``workers``
    processes of one thread each): the thread is wanted only where those leave a core.
    A worker of a cluster the run did not start cannot tell: no thread."""
    import simstore.ingest._dask as dask_engine
    from simstore.ingest import IngestConfig
    from simstore.ingest._plugins import plugins_for
    from simstore.ingest._records import TaskContext
    from simstore.ingest._sources import discover, plan_tasks

    src = _sources(tmp_path / "src", n=1)
    cfg = IngestConfig(workers=workers, format="zarr", engine="dask", address=address)
    cat = Catalog.init(str(tmp_path / "store"))
    files, _ = discover([str(src)], plugins_for(cfg)[0])
    ctx = TaskContext(store=cat.store, dataset="d", config=cfg, base_schema=(), params_digest="x")
    seen: list[int] = []

    def wanted(n: int) -> bool:
        seen.append(n)
        return True

    monkeypatch.setattr(dask_engine, "_worker_threads", lambda: threads)
    monkeypatch.setattr(dask_engine, "writer_thread_wanted", wanted)
    outcome = dask_engine.ingest_task(ctx, plan_tasks(files, 1 << 30)[0], plugins_for(cfg))
    assert outcome.error is None and seen == asked
    assert sorted(f.key for f in outcome.result.files) == ["run0.npz", "tiny.npz"]


def test_a_task_failing_while_the_one_before_is_written_reports_the_earlier_error(
    tmp_path, thread_on, monkeypatch
):
    """A task per file: run0's task is read, its last write still on the thread, when
    run1's task fails on a corrupt file; run0 is then found changed. Its error is the
    one raised, as when the tasks ran one after the other."""
    src = tmp_path / "src"
    src.mkdir()
    np.savez(src / "run0.npz", big=np.zeros(BIG, np.float32))
    (src / "run1.npz").write_bytes(b"PK\x03\x04 not a zip")
    thread_on(True)
    _touch_while_written(monkeypatch, src, "run0")
    cat = Catalog.init(str(tmp_path / "store"))
    with pytest.raises(SourceError, match=r"run0\.npz.*changed since it was listed"):
        ingest([src], dataset="d", store=cat, format="zarr", snapshot=True, workers=1,
               shard_size=1 << 20)


def test_two_tasks_found_changed_report_the_first(tmp_path, thread_on, monkeypatch):
    """A task per file, run0 and run1 both change while written: run0's task fails as it
    finishes, with run1's already read; run1's failure does not take run0's place."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("run0", "run1"):
        np.savez(src / f"{name}.npz", big=np.zeros(BIG, np.float32))
    thread_on(True)
    _touch_while_written(monkeypatch, src, "run0")
    _touch_while_written(monkeypatch, src, "run1")
    cat = Catalog.init(str(tmp_path / "store"))
    with pytest.raises(SourceError, match=r"run0\.npz.*changed since it was listed"):
        ingest([src], dataset="d", store=cat, format="zarr", snapshot=True, workers=1,
               shard_size=1 << 20)
