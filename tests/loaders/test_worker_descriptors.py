"""Spawned workers short of file descriptors: every batch, or one line; never a hang.

Torch sends a worker's batch memory to the main process by its descriptor, through the
standard library's descriptor server, a thread of the worker that needs two free
descriptors per batch. Out of them, a spawned worker's server retried ``accept`` for
ever, printing a traceback each time (millions of lines), while the main process waited
for the batch; at other limits the job failed with a bare ``EOFError``, or with a
"No usable temporary directory" blamed on the transform. Spawned workers now get the
arena forked ones have (its descriptor handed over with the worker's start), so their
batches need no descriptor at all; a batch that still goes by descriptor (the arena
full) is refused in the worker when it has no room to serve it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import simstore
from simstore.catalog import Catalog

pytestmark = pytest.mark.multiprocess

_SCRIPT = textwrap.dedent(
    """
    import json, os, resource, sys
    from simstore.loaders import SimDataLoader, SimDataset
    import simstore.loaders._tensors as tensors

    class Limit:  # a worker_init_fn: this many descriptors free in the worker
        def __init__(self, free):
            self.free = free

        def __call__(self, worker):
            _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            used = len(os.listdir("/proc/self/fd"))
            resource.setrlimit(resource.RLIMIT_NOFILE, (used + self.free, hard))

    if __name__ == "__main__":
        store, arena = sys.argv[1], int(sys.argv[2])
        tensors.ARENA_BYTES = arena
        for free in map(int, sys.argv[3:]):
            ds = SimDataset(store, "d", shuffle=False)
            loader = SimDataLoader(ds, batch_size=4, num_workers=2,
                                   multiprocessing_context="spawn",
                                   worker_init_fn=Limit(free))
            keys = []
            try:
                for batch in loader:
                    keys += batch["__key__"]
                said = None
            except Exception as e:
                said = [type(e).__name__, str(e)]
            print(json.dumps({"free": free, "keys": keys, "error": said}), flush=True)
    """
)


@pytest.fixture(scope="module")
def megabyte_samples(tmp_path_factory):
    root = tmp_path_factory.mktemp("descriptors")
    src = root / "src"
    src.mkdir()
    for i in range(16):  # 1 MiB each: past what travels by value, in shared memory
        np.save(src / f"f{i:02d}.npy", np.full((256, 1024), i, dtype=np.float32))
    store = str(root / "store")
    simstore.ingest([src], dataset="d", store=Catalog.init(store), snapshot=True)
    return store, [f"f{i:02d}" for i in range(16)]


def _runs(store: str, arena: int, frees: list[int], cwd: str) -> tuple[list[dict], str]:
    script = os.path.join(cwd, "limited.py")  # a file: spawned workers import its Limit
    with open(script, "w") as f:
        f.write(_SCRIPT)
    done = subprocess.run(
        [sys.executable, script, store, str(arena), *map(str, frees)],
        capture_output=True, text=True, timeout=300, cwd=cwd,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines()], done.stderr


def test_spawned_workers_with_few_descriptors_send_every_batch(megabyte_samples, tmp_path):
    store, keys = megabyte_samples
    runs, stderr = _runs(store, 256 << 20, [1, 2, 3, 4, 5], str(tmp_path))
    assert [r["free"] for r in runs] == [1, 2, 3, 4, 5]
    for run in runs:
        assert run["error"] is None, run
        assert sorted(run["keys"]) == keys, run["free"]
    assert "Too many open files" not in stderr


def test_batches_sent_by_descriptor_are_refused_when_the_worker_cannot_serve_them(
        megabyte_samples, tmp_path):
    store, keys = megabyte_samples
    frees = [1, 2, 3, 4, 5, 6, 40]
    runs, stderr = _runs(store, 0, frees, str(tmp_path))  # no arenas: every batch by descriptor
    assert [r["free"] for r in runs] == frees
    for run in runs[:-1]:
        if run["error"] is None:
            assert sorted(run["keys"]) == keys, run["free"]
            continue
        kind, said = run["error"]
        assert kind == "StorageError", run
        assert "\n" not in said
        assert "for want of file descriptors in the worker" in said, said
        assert "ulimit -n" in said
    assert any(r["error"] is not None for r in runs[:-1])  # the limits do bite
    assert runs[-1]["error"] is None and sorted(runs[-1]["keys"]) == keys  # room: as ever
    assert "Traceback" not in stderr
