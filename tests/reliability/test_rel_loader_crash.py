"""A crashed loader leaves nothing that breaks the next start.

A reading process killed in the middle of a cache fill leaves a partial file in the
cache's ``tmp/`` and dies holding a stripe lock (the kernel drops it); a killed DataLoader
leaves its workers to notice and exit. The next start must read the whole epoch, exactly
as a clean run does, sweep the partial file, and leave only verified copies. (Killed
training loops with resume are the ``train`` trials of test_rel_sigkill.py.)

A main process killed while its DataLoader workers start up (before torch's worker loop
records its parent) must not leave them running: torch's watchdog then takes the reaper
for the parent and the workers wait for work for ever. The stress run found 5 such
orphans in 52 training-loop kills on a loaded machine; the last test reproduces it
deterministically; SimDataLoader ties its workers to the main process, so they exit.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest
import rel_harness as h

from simstore.catalog import Catalog
from simstore.hashing import object_key
from simstore.ingest import ingest

pytestmark = pytest.mark.multiprocess


@pytest.fixture
def store(tmp_path):
    root = str(tmp_path / "store")
    src = str(tmp_path / "src")
    h.write_sources(src, 0, count=12, seed=12)
    Catalog.init(root)
    ingest([src], dataset="ds", store=root, snapshot=True, message="m", shard_size=8 * 1024)
    return root


def _shards(root):
    cat = Catalog.open(root)
    snap = cat.snapshot(cat.resolve("ds"))
    return sorted({s for t in cat.iter_parts(snap) for s in t.column("shard").to_pylist()})


@pytest.mark.parametrize("workers", [0, 2])
def test_a_loader_killed_mid_fill_leaves_nothing_that_breaks_the_next_start(
    tmp_path, store, forkserver, workers
):
    cache = str(tmp_path / "cache")
    reference = h.epoch_keys(store, "ds", None, 0)
    shard = _shards(store)[0]
    with open(os.path.join(store, object_key(shard)), "rb") as f:
        data = f.read()
    ready = str(tmp_path / "ready")
    proc = forkserver.Process(target=h.op_stuck_fill, args=(cache, shard, data, ready))
    proc.start()
    deadline = time.monotonic() + 60
    while not os.path.exists(ready):
        assert time.monotonic() < deadline and proc.is_alive(), "the fill never started"
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(30)
    partial = os.listdir(os.path.join(cache, "tmp"))
    assert len(partial) == 1 and partial[0].startswith(shard)  # the crash left its debris
    assert not os.path.exists(os.path.join(cache, "objects", shard[:2], shard))

    assert h.epoch_keys(store, "ds", cache, workers) == reference
    assert os.listdir(os.path.join(cache, "tmp")) == []
    assert h._cache_problems(cache) == []
    assert os.path.exists(os.path.join(cache, "objects", shard[:2], shard))


class OrphanedWorkers(AssertionError):
    """DataLoader workers still running after their main process was killed."""


def test_workers_of_a_main_process_killed_during_their_start_up_exit(tmp_path, store, trainserver):
    import psutil

    ready = tmp_path / "ready"
    ready.mkdir()
    ref = f"ds@{Catalog.open(store).resolve('ds')}"
    proc = trainserver.Process(target=h.op_train_startup, args=(store, ref, 2, str(ready)))
    proc.start()
    deadline = time.monotonic() + 120
    while len(os.listdir(ready)) < 2:
        assert time.monotonic() < deadline and proc.is_alive(), "the workers never started"
        time.sleep(0.02)
    workers = [psutil.Process(int(name.split("-")[1])) for name in os.listdir(ready)]
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(30)
    try:
        gone, alive = psutil.wait_procs(workers, timeout=60)
        if alive:
            raise OrphanedWorkers(f"{len(alive)} workers still running 60 s after the kill")
    finally:
        for p in workers:
            with contextlib.suppress(psutil.Error):
                p.kill()
