"""Shard writes on the task's writer thread: the same bytes, the same checks, the same errors.

Where an ingest process has a core to spare, a sample of 1 MiB or more bound for the Zarr
writer is written on a thread of the task while the next sample (and the next file) is
read, hashed and summarised; its file is checked against its listing once that last
write is done. These tests force the thread on or off whatever this machine's cores.
"""

from __future__ import annotations

import os
import threading

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
