"""A training process that cannot start a thread gets one line that says so, and ends.

Outside a shard's read (where such an error names the shard, see test_on_corrupt.py), a
thread that would not start was Python's bare ``RuntimeError: can't start new thread``;
with workers, the failed start left them serving with the signals that stop them still
blocked, and the process hung for ever at its exit. Here threads really cannot start: each
new thread asks for a 1 GiB stack under an address-space limit that leaves less.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from loader_helpers import commit_samples, make_samples

SCRIPT = """
import json, os, resource, sys, threading
sys.path.insert(0, sys.argv[2])
from loader_helpers import open_test_shard
from simstore.loaders import SimDataLoader, SimDataset

def vm():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmSize"))

ds = SimDataset(sys.argv[1], "sim", shard_opener=open_test_shard)
threading.stack_size(1 << 30)
resource.setrlimit(resource.RLIMIT_AS, (vm() + (768 << 20), resource.RLIM_INFINITY))
workers = int(sys.argv[3])
loader = SimDataLoader(ds, batch_size=4, num_workers=workers,
                       multiprocessing_context="fork" if workers else None)
batches, said = 0, None
try:
    for _ in loader:
        batches += 1
except Exception as exc:
    said = [type(exc).__name__, str(exc)]
print(json.dumps({"said": said, "batches": batches}), flush=True)
"""


@pytest.mark.multiprocess
@pytest.mark.parametrize("workers", [0, 2])
def test_a_thread_that_cannot_start_is_named_and_the_job_ends(store_path, workers):
    commit_samples(store_path, "sim", make_samples(40), per_shard=10)
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        done = subprocess.run([sys.executable, "-c", SCRIPT, store_path, here, str(workers)],
                              capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as exc:  # its workers still serving, never stopped
        raise AssertionError(f"the job did not end: {exc.stdout!r}") from exc
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["batches"] == 0
    kind, text = got["said"]
    assert kind == "StorageError" and "\n" not in text
    assert "could not start a thread (can't start new thread)" in text
    assert "dataset sim (snapshot " in text and "ulimit -u" in text
