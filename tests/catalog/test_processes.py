"""Real processes: SIGKILL during commits, and concurrent writers on one branch."""

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from simstore.catalog import Catalog, gc, verify

SCRIPT = os.path.join(os.path.dirname(__file__), "writer_script.py")

pytestmark = pytest.mark.multiprocess


def _start(store, writer, commits):
    return subprocess.Popen(
        [sys.executable, SCRIPT, store, str(writer), str(commits)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_sigkill_during_commits_leaves_old_or_new_snapshot(tmp_path):
    store = str(tmp_path / "store")
    cat = Catalog.init(store)
    rng = random.Random(1234)
    committed_heads = set()
    for trial in range(20):
        before = cat.branches("ds").get_versioned("main")[0]
        proc = _start(store, trial, 1000)
        # once it has committed (its start-up takes as long as the machine's load makes
        # it), kill it at a random instant of the commits that follow
        assert proc.stdout.readline().startswith("committed")
        time.sleep(rng.uniform(0, 0.3))
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate()
        head = Catalog.open(store).branches("ds").get_versioned("main")[0]
        if head is not None:
            report = verify(Catalog.open(store), "ds", deep=True)
            assert report.ok, report.problems
            snap = Catalog.open(store).snapshot(head)
            # the head is the old one or a complete new one with this trial's commits
            assert head == before or snap.message.startswith(f"{trial}:")
            committed_heads.add(head)
        # staged leftovers of the killed writer never break the next commit
    assert committed_heads  # some trials committed before the kill
    # a later writer converges; gc then leaves a clean store
    proc = _start(store, "final", 1)
    proc.communicate(timeout=120)
    assert proc.returncode == 0
    cat = Catalog.open(store)
    gc(cat, grace_s=0)
    assert verify(cat, "ds", deep=True).ok
    for sid, _snap in cat.log("ds"):
        assert verify(cat, f"ds@{sid}").ok


def test_concurrent_writers_lose_no_commit(tmp_path):
    store = str(tmp_path / "store")
    Catalog.init(store)
    writers, commits = 4, 5
    procs = [_start(store, w, commits) for w in range(writers)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    cat = Catalog.open(store)
    log = list(cat.log("ds"))
    assert len(log) == writers * commits
    messages = {s.message for _, s in log}
    assert messages == {f"{w}:{i}" for w in range(writers) for i in range(commits)}
    snap = cat.snapshot(cat.resolve("ds"))
    assert snap.samples == writers * commits + 1
    assert verify(cat, "ds", deep=True).ok
