"""A DataLoader worker leaves as soon as its training process dies (SIGKILL)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from loader_helpers import commit_samples, make_samples

SCRIPT = """
import os, sys
sys.path.insert(0, sys.argv[2])
from loader_helpers import open_test_shard
from simstore.loaders import SimDataLoader, SimDataset
ds = SimDataset(sys.argv[1], "sim", shard_opener=open_test_shard)
loader = SimDataLoader(ds, batch_size=2, num_workers=2, multiprocessing_context="fork")
it = iter(loader)
next(it)
print("ready", flush=True)
import time
time.sleep(600)
"""


def _children(pid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if int(fields[1]) == pid:
                out.append(int(name))
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_workers_exit_when_the_training_process_is_killed(store_path):
    commit_samples(store_path, "sim", make_samples(200), per_shard=20)
    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, store_path, here],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    pids = _children(proc.pid)  # the two workers (and nothing else forks here)
    assert len(pids) >= 2 and all(_alive(p) for p in pids)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    deadline = time.monotonic() + 60  # a liveness bound, not a speed measurement
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [p for p in pids if _alive(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert not left, f"workers {left} outlived their killed parent"
