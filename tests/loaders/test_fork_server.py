"""Workers from a fork server fork from an interpreter that has imported torch already.

A fork server's worker imported torch and the loader after its fork, every epoch: about
1 s of each first batch, as a spawned worker's. The loader now has the server import them
once, before its first fork, and starts the server when the loader is made, so that its
start overlaps what the script does before its first ``iter()``. Each script runs in a
process of its own: a fork server, once started, lives as long as its process.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from loader_helpers import write_npz_sources

from simstore.catalog import Catalog
from simstore.ingest import ingest

_SCRIPT = textwrap.dedent("""
    import multiprocessing, os, sys
    from multiprocessing import forkserver
    from simstore.loaders import SimDataLoader, SimDataset

    def parent(worker_id):
        with open(os.path.join(sys.argv[2], f"w{worker_id}-{os.getpid()}"), "w") as f:
            f.write(str(os.getppid()))

    def mapped(pid, name):
        with open(f"/proc/{pid}/maps") as f:
            return name in f.read()

    if __name__ == "__main__":
        if sys.argv[3] == "own":  # the caller's own preload stays
            multiprocessing.set_forkserver_preload(["__main__", "json"])
        server = forkserver._forkserver
        assert server._forkserver_pid is None
        ds = SimDataset(sys.argv[1], "d", shuffle=True, seed=1)
        loader = SimDataLoader(ds, batch_size=4, num_workers=2, worker_init_fn=parent,
                               multiprocessing_context="forkserver")
        started = server._forkserver_pid
        assert started is not None, "no fork server when the loader was made"
        keys = []
        for epoch in range(2):
            ds.set_epoch(epoch)
            got = sorted(k for b in loader for k in b["__key__"])
            assert len(got) == 24 and len(set(got)) == 24, got
            keys.append(got)
        assert keys[0] == keys[1]
        assert server._forkserver_pid == started  # one server for every epoch
        modules = server._preload_modules
        assert "torch" in modules and "simstore.loaders" in modules, modules
        assert mapped(started, "libtorch"), "the fork server has not imported torch"
        parents = set()
        for name in os.listdir(sys.argv[2]):
            with open(os.path.join(sys.argv[2], name)) as f:
                parents.add(int(f.read()))
        assert len(os.listdir(sys.argv[2])) == 4, os.listdir(sys.argv[2])  # 2 x 2 epochs
        assert parents == {started}, (parents, started)
        if sys.argv[3] == "own":
            assert modules[:2] == ["__main__", "json"], modules
        print("ok")
""")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    base = tmp_path_factory.mktemp("forkserver")
    src = base / "src"
    src.mkdir()
    write_npz_sources(str(src), 24, seed=2)
    path = str(base / "store")
    Catalog.init(path)
    ingest([str(src)], dataset="d", store=path, snapshot=True, format="parquet",
           message="t")
    return path


@pytest.mark.multiprocess
@pytest.mark.parametrize("preload", ["default", "own"])
def test_fork_server_workers_fork_from_a_server_that_imported_torch(tmp_path, store,
                                                                     preload):
    script = tmp_path / "job.py"  # a file: the server imports the main module by path
    script.write_text(_SCRIPT)
    marks = tmp_path / "marks"
    marks.mkdir()
    run = subprocess.run([sys.executable, str(script), store, str(marks), preload],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-3000:]
