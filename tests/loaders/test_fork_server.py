"""Workers from a fork server fork from an interpreter that has imported torch already.

They get the environment of the moment they start, as spawned ones do (the server's is
that of its own start).

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
        # set after the loader (and its server) was made: the worker has it all the same
        assert os.environ.get("SIMSTORE_TEST_LATE") == "set late", "an old environment"
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
        os.environ["SIMSTORE_TEST_LATE"] = "set late"  # credentials, say
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


_TOP_LEVEL = textwrap.dedent("""
    import os, sys
    from simstore.loaders import SimDataLoader, SimDataset

    # made as the script is imported: a fork server's worker imports it again, still
    # starting, and the loader made there must not start a server of its own
    ds = SimDataset(sys.argv[1], "d", shuffle=True, seed=1)
    loader = SimDataLoader(ds, batch_size=4, num_workers=2,
                           multiprocessing_context="forkserver")

    if __name__ == "__main__":
        got = sorted(k for b in loader for k in b["__key__"])
        assert len(got) == 24 and len(set(got)) == 24, got
        if os.fork() == 0:  # a forked process: the parent's server is not its own
            try:
                ds = SimDataset(sys.argv[1], "d", shuffle=True, seed=1)
                child = SimDataLoader(ds, batch_size=4, num_workers=2,
                                      multiprocessing_context="forkserver")
                again = sorted(k for b in child for k in b["__key__"])
                os._exit(0 if again == got else 3)
            except BaseException as exc:
                print("child:", repr(exc), file=sys.stderr, flush=True)
                os._exit(4)
        _, status = os.wait()
        assert os.waitstatus_to_exitcode(status) == 0, status
        print("ok")
""")


@pytest.mark.multiprocess
def test_a_loader_made_at_the_top_of_a_script_and_one_in_a_forked_process(tmp_path, store):
    """Found by a review: a loader made as the script is imported started a fork server
    in each worker importing it again (Python refuses a start while a process starts: the
    workers died), and a process forked after a loader was made found its parent's
    server and failed with ``ChildProcessError``."""
    script = tmp_path / "job.py"
    script.write_text(_TOP_LEVEL)
    run = subprocess.run([sys.executable, str(script), store], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-3000:]


def test_a_started_worker_gets_its_own_arena_and_channel_alone(store):
    """Found by a review: each worker started by spawn or a fork server got every
    worker's arena and channel descriptors, and a fork server takes fewer than 256 per
    start: 64 persistent workers failed with a bare ``ValueError: too many fds``."""
    import pickle
    from multiprocessing import context

    from simstore.loaders import SimDataLoader, SimDataset

    class Starting:  # what a spawn or fork-server start is asked (see reduction.DupFd)
        def __init__(self) -> None:
            self.fds: list[int] = []

        def duplicate_for_child(self, fd: int) -> int:
            self.fds.append(fd)
            return fd

        def DupFd(self, fd: int) -> int:  # noqa: N802 (multiprocessing's name)
            return fd

    loader = SimDataLoader(SimDataset(store, "d"), batch_size=4, num_workers=2,
                           multiprocessing_context="spawn")
    loader._share(loader.sim_dataset)
    stream = loader._stream
    assert len(stream.arenas) == len(stream.channels) == 2
    sent = []
    for _ in range(2):  # workers 0 and 1 in turn
        start = Starting()
        context.set_spawning_popen(start)
        try:
            pickle.dumps(stream)
        finally:
            context.set_spawning_popen(None)
        sent.append(start.fds)
    assert sent == [[stream.arenas[w]._fd, stream.channels[w]._worker.fileno()]
                    for w in range(2)]
    for channel in stream.channels:  # as the iteration's end closes them
        channel.close()
    loader._share(loader.sim_dataset)  # the next iteration's workers start from 0
    start = Starting()
    context.set_spawning_popen(start)
    try:
        pickle.dumps(loader._stream)
    finally:
        context.set_spawning_popen(None)
    assert start.fds == [loader._stream.arenas[0]._fd,
                         loader._stream.channels[0]._worker.fileno()]
    for channel in loader._stream.channels:
        channel.close()
