"""A killed ingest's scratch folder is reclaimed by the next ingest and by gc; a live one's
never is.

Shards are built in a scratch folder (``--tmp-dir``, a local store's ``.scratch``, else
the system temp dir) that its process keeps locked for its life: SIGKILL drops the lock.
"""

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

from simstore.catalog import gc
from simstore.ingest import ingest

CHILD = """
import sys, time
from simstore.storage import Scratch
s = Scratch(sys.argv[1])
with open(s.path + "/0.zarr", "wb") as f:
    f.write(b"half a shard" * 1000)
print(s.path, flush=True)
time.sleep(600)
"""


@pytest.fixture
def owners():
    """Start processes that each create a scratch folder under a parent and wait."""
    procs = []

    def start(parent):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(parent)], stdout=subprocess.PIPE, text=True,
            env=env,
        )
        procs.append(proc)
        path = proc.stdout.readline().strip()
        assert os.path.isdir(path), path
        return proc, path

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()


def _killed(start, parent):
    proc, path = start(parent)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return path


def _scratch_folders(parent):
    return sorted(n for n in os.listdir(parent) if n.startswith("simstore-ingest-"))


@pytest.fixture
def source(tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    np.savez(root / "run0.npz", u=np.zeros(4, np.float32))
    return root


def test_the_next_ingest_removes_a_killed_ingests_scratch_and_keeps_a_live_one(
    catalog, tmp_path, owners, source
):
    parent = tmp_path / "scratch"
    parent.mkdir()
    dead = _killed(owners, parent)
    _, live = owners(parent)
    assert len(_scratch_folders(parent)) == 2
    ingest([source], dataset="d", store=catalog, tmp_dir=str(parent), snapshot=True)
    assert not os.path.exists(dead)
    assert _scratch_folders(parent) == [os.path.basename(live)]  # its own went as well
    assert os.path.exists(os.path.join(live, "0.zarr"))


def test_an_unmarked_folder_is_removed_only_once_nothing_in_it_changed_for_a_day(
    catalog, tmp_path, source
):
    """A folder of a version before markers (or one being created) has no owner to ask."""
    parent = tmp_path / "scratch"
    old, recent = parent / "simstore-ingest-old", parent / "simstore-ingest-recent"
    for folder in (old, recent):
        folder.mkdir(parents=True)
        (folder / "0.parquet").write_bytes(b"x")
    day_ago = time.time() - 25 * 3600
    for path in (old / "0.parquet", old):
        os.utime(path, (day_ago, day_ago))
    ingest([source], dataset="d", store=catalog, tmp_dir=str(parent))
    assert _scratch_folders(parent) == ["simstore-ingest-recent"]


def test_gc_removes_a_killed_ingests_scratch_in_the_temp_dir_and_keeps_a_live_one(
    catalog, tmp_path, owners, monkeypatch
):
    """An ingest to S3 builds its shards in the system temp dir, outside the store."""
    parent = tmp_path / "systemp"
    parent.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(parent))
    dead = _killed(owners, parent)
    _, live = owners(parent)
    report = gc(catalog, grace_s=0, dry_run=True)
    assert report.temporary_removed == 1 and os.path.exists(dead)
    report = gc(catalog, grace_s=0)
    assert report.temporary_removed == 1
    assert _scratch_folders(parent) == [os.path.basename(live)]


def test_gc_of_a_local_store_keeps_a_live_ingests_scratch_however_old(catalog, owners):
    scratch = catalog.store.scratch_dir()
    dead = _killed(owners, scratch)
    _, live = owners(scratch)
    long_ago = time.time() - 30 * 86400
    for folder in (dead, live):
        for path in [os.path.join(folder, n) for n in os.listdir(folder)] + [folder]:
            os.utime(path, (long_ago, long_ago))
    gc(catalog, grace_s=3600)
    assert _scratch_folders(scratch) == [os.path.basename(live)]


def test_a_folder_killed_before_its_marker_is_removed_after_a_minute(tmp_path):
    """A process killed between making its folder and marking it (microseconds apart)
    left an empty folder that waited a day: it holds nothing, so a minute is enough."""
    import fcntl

    from simstore.storage import sweep_scratch

    parent = tmp_path / "scratch"
    names = ["empty-old", "empty-new", "pending-old", "pending-locked", "files-old"]
    for name in names:
        (parent / f"simstore-ingest-{name}").mkdir(parents=True)
    for name in ("pending-old", "pending-locked"):
        (parent / f"simstore-ingest-{name}" / ".owner.new").write_bytes(b"")
    (parent / "simstore-ingest-files-old" / "0.zarr").write_bytes(b"half a shard")
    two_minutes_ago = time.time() - 120
    for name in ("empty-old", "pending-old", "pending-locked", "files-old"):
        folder = parent / f"simstore-ingest-{name}"
        for path in [*folder.iterdir(), folder]:
            os.utime(path, (two_minutes_ago, two_minutes_ago))
    # a live process holds its pending marker locked, as Scratch does while it makes one
    held = os.open(parent / "simstore-ingest-pending-locked" / ".owner.new", os.O_RDONLY)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        removed = sweep_scratch(str(parent))
    finally:
        os.close(held)
    assert sorted(os.path.basename(p) for p in removed) == [
        "simstore-ingest-empty-old", "simstore-ingest-pending-old"]
    # a folder with a shard in it keeps the day's grace; a new empty one its minute
    assert _scratch_folders(parent) == [
        "simstore-ingest-empty-new", "simstore-ingest-files-old",
        "simstore-ingest-pending-locked"]


# -- a folder its own process leaves: an interrupt while it is made, a dropped Scratch ---

def _interrupting_after(real):
    """``real``, that raises KeyboardInterrupt once it has done its work."""
    def call(*args, **kwargs):
        real(*args, **kwargs)
        raise KeyboardInterrupt
    return call


@pytest.mark.parametrize("step", ["mkdir", "open", "flock", "write", "rename"])
def test_an_interrupt_at_any_step_of_making_a_scratch_folder_leaves_nothing(
        tmp_path, monkeypatch, step):
    # SIGTERM under the command line is raised as an exception wherever the main thread
    # is: once right after the folder was made, it stayed behind a stopped ingest
    import fcntl
    import types

    from simstore.storage import Scratch, _scratch

    # the module's own calls only (its clean-up, shutil's, must run as they do)
    name = "fcntl" if step == "flock" else "os"
    real = fcntl if step == "flock" else os
    stand_in = types.SimpleNamespace(**{k: getattr(real, k) for k in dir(real)
                                        if not k.startswith("__")})
    setattr(stand_in, step, _interrupting_after(getattr(real, step)))
    monkeypatch.setattr(_scratch, name, stand_in)
    with pytest.raises(KeyboardInterrupt):
        Scratch(str(tmp_path))
    monkeypatch.undo()
    assert os.listdir(tmp_path) == []


def test_a_scratch_dropped_without_remove_takes_its_folder_with_it(tmp_path):
    import gc as collector

    from simstore.storage import Scratch

    kept, dropped = Scratch(str(tmp_path)), Scratch(str(tmp_path))
    path = dropped.path
    del dropped
    collector.collect()
    assert not os.path.exists(path)
    assert _scratch_folders(tmp_path) == [os.path.basename(kept.path)]
    kept.remove()


HOLDER = """
import gc, os, sys
from simstore.storage import Scratch
s = Scratch(sys.argv[1])
print(s.path, flush=True)
pid = os.fork()
if pid == 0:  # a forked child's copy is its parent's folder: dropped, exited, left alone
    del s
    gc.collect()
    sys.exit(0)
os.waitpid(pid, 0)
assert os.path.isdir(s.path), "the child removed its parent's folder"
held = s  # held to the end: removed at exit
"""


def test_a_process_that_exits_holding_a_scratch_removes_it_and_a_fork_leaves_it(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-c", HOLDER, str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    path = done.stdout.strip()
    assert path.startswith(str(tmp_path)), done.stdout
    assert _scratch_folders(tmp_path) == []


DROPS_ITS_COPY = """
import gc, os, sys, time
from simstore.storage import Scratch
s = Scratch(sys.argv[1])
print(s.path, flush=True)
r, w = os.pipe()
if os.fork() == 0:  # a forked child drops its copy, then lives on
    print(os.getpid(), flush=True)
    os.close(1)
    os.close(2)
    del s
    gc.collect()
    os.write(w, b"x")
    time.sleep(120)
    os._exit(0)
os.read(r, 1)
os._exit(0)  # the owner dies with no clean-up, as a SIGKILL leaves it
"""


def test_a_forked_child_that_dropped_its_copy_does_not_keep_the_folder_locked(tmp_path):
    # the child's descriptor shares the owner's lock: kept open, a dead owner's folder
    # looked in use for as long as the child lived
    from simstore.storage import scratch_in_use

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    owner = subprocess.run([sys.executable, "-c", DROPS_ITS_COPY, str(tmp_path)], env=env,
                           capture_output=True, text=True, timeout=120)
    path, child = owner.stdout.split()
    try:
        assert os.path.isdir(path), owner.stderr
        assert scratch_in_use(path) is False
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(child), signal.SIGKILL)
