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
    import collections, json, os, resource, sys
    import torch
    from simstore.loaders import SimDataLoader, SimDataset
    import simstore.loaders._tensors as tensors

    Batch = collections.namedtuple("Batch", "keys data")

    def as_namedtuple(samples):  # a caller's collate: not a dict, list or tuple
        return Batch([s["__key__"] for s in samples], torch.stack([s["data"] for s in samples]))

    def as_rows(samples):  # many tensors, one storage
        rows = list(torch.stack([s["data"] for s in samples]))
        return {"__key__": [s["__key__"] for s in samples], "data": rows}

    COLLATES = {"default": None, "namedtuple": as_namedtuple, "rows": as_rows}

    class Limit:  # a worker_init_fn: this many descriptors free in the worker
        def __init__(self, free):
            self.free = free

        def __call__(self, worker):
            _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            used = len(os.listdir("/proc/self/fd"))
            resource.setrlimit(resource.RLIMIT_NOFILE, (used + self.free, hard))

    if __name__ == "__main__":
        store, arena, collate, batch_size = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
        tensors.ARENA_BYTES = arena
        for free in map(int, sys.argv[5:]):
            ds = SimDataset(store, "d", shuffle=False)
            loader = SimDataLoader(ds, batch_size=batch_size, num_workers=2,
                                   multiprocessing_context="spawn",
                                   worker_init_fn=Limit(free), collate_fn=COLLATES[collate])
            keys = []
            try:
                for batch in loader:
                    keys += batch.keys if collate == "namedtuple" else batch["__key__"]
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


def _runs(store: str, arena: int, frees: list[int], cwd: str, collate: str = "default",
          batch_size: int = 4) -> tuple[list[dict], str]:
    script = os.path.join(cwd, "limited.py")  # a file: spawned workers import its Limit
    with open(script, "w") as f:
        f.write(_SCRIPT)
    done = subprocess.run(
        [sys.executable, script, store, str(arena), collate, str(batch_size),
         *map(str, frees)],
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


@pytest.mark.parametrize("collate", ["default", "namedtuple"])
def test_batches_sent_by_descriptor_are_refused_when_the_worker_cannot_serve_them(
        megabyte_samples, tmp_path, collate):
    """Without arenas every batch goes by descriptor; a caller's collate's batch does
    anyway, in whatever container (a namedtuple's tensors were not counted)."""
    store, keys = megabyte_samples
    frees = [1, 2, 3, 4, 5, 6, 40]
    runs, stderr = _runs(store, 0, frees, str(tmp_path), collate)
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


def test_many_tensors_over_one_storage_are_not_refused(megabyte_samples, tmp_path):
    """Found by a review: the room was counted per tensor, so a caller's collate giving
    each of a batch's rows as its own tensor (one storage, one descriptor) was refused
    with plenty of descriptors free."""
    store, keys = megabyte_samples
    runs, stderr = _runs(store, 0, [9], str(tmp_path), "rows", batch_size=16)
    assert runs[0]["error"] is None, runs[0]["error"]
    assert sorted(runs[0]["keys"]) == keys


def test_without_a_proc_listing_the_storage_goes_as_torch_sends_it(monkeypatch):
    import torch
    from simstore.loaders import _workerstart

    real = os.listdir

    def no_proc(path="."):
        if str(path).startswith("/proc"):
            raise FileNotFoundError(2, "No such file or directory", path)
        return real(path)

    sent = []
    monkeypatch.setattr(_workerstart.os, "listdir", no_proc)
    storage = torch.ones(4).untyped_storage()
    assert _workerstart._guarded_reduce_storage(sent.append, storage) is None
    assert sent == [storage]
