"""The command line's errors are one line with the dask engine: dask's own log lines (a
traceback when the scheduler dies, warnings from worker processes) stay off stderr, but
for ``--debug``."""

import logging
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from dask_adapters import write_values
from noisy_adapters import WARNING

from simstore.catalog import Catalog
from simstore.ingest._dask import quiet_dask_logs
from simstore.testing.adapters import adapters_script

pytestmark = pytest.mark.dask

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.path.dirname(sys.executable)

# ``simstore`` itself, with the test adapters registered as entry points would register them
CLI = adapters_script({"testvals": "dask_adapters:ValuesAdapter",
                       "noisyvals": "noisy_adapters:NoisyValuesAdapter"}, HERE) + """
from simstore.cli import main

if __name__ == "__main__":
    main(sys.argv[1:], prog_name="simstore")
"""


@pytest.fixture
def cli(tmp_path):
    script = tmp_path / "simstore_cli.py"
    script.write_text(CLI)

    def start(*args, env=None):
        return subprocess.Popen(
            [sys.executable, str(script), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )

    return start


def wait_for(condition, what, deadline_s=60.0):
    """Poll until ``condition()``; the deadline only stops a hung test, it measures nothing."""
    end = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < end, f"gave up waiting for {what}"
        time.sleep(0.05)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def own_scheduler():
    """A ``dask scheduler`` and a one-process ``dask worker``, as on a real cluster.

    Both import the test adapters from this folder (``PYTHONPATH``).
    """
    import distributed
    address = f"tcp://127.0.0.1:{free_port()}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])}
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    sched = subprocess.Popen(
        [f"{BIN}/dask", "scheduler", "--host", "127.0.0.1", "--port", address.rsplit(":", 1)[1],
         "--no-dashboard"],
        env=env,  # it unpickles the tasks too
        **quiet,
    )
    worker = subprocess.Popen(
        [f"{BIN}/dask", "worker", address, "--nworkers", "1", "--nthreads", "1", "--host",
         "127.0.0.1", "--no-dashboard"],
        env=env,
        **quiet,
    )
    try:
        deadline = time.monotonic() + 60
        while True:  # the scheduler may not listen yet
            try:
                with distributed.Client(address, timeout=5, set_as_default=False) as client:
                    client.wait_for_workers(1, timeout=60)
                break
            except OSError:
                assert time.monotonic() < deadline, "the scheduler never started"
                time.sleep(0.2)
        yield sched, address
    finally:
        for p in (worker, sched):
            if p.poll() is None:
                p.terminate()
        for p in (worker, sched):
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def test_a_scheduler_killed_mid_run_is_one_line_on_stderr(tmp_path, cli, own_scheduler):
    sched, address = own_scheduler
    src = write_values(tmp_path / "src", ["a0", "a1", "gate0"])
    markers = tmp_path / "markers"
    markers.mkdir()
    store = str(tmp_path / "store")
    Catalog.init(store)
    p = cli("--store", store, "ingest", str(src), "--dataset", "d", "--adapter", "testvals",
            "--option", f"marker_dir={markers}", "--shard-size", "1", "--engine", "dask",
            "--address", address)
    try:
        wait_for((markers / "started").exists, "the gated task to start")
        sched.send_signal(signal.SIGKILL)
        sched.wait(timeout=30)
        out, err = p.communicate(timeout=120)
    finally:
        (markers / "open").touch()  # let the worker's task end
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode != 0
    assert out == ""
    assert len(err.splitlines()) == 1, err  # no traceback logged by distributed.client
    line = err.strip()
    assert line.startswith("error: ") and "scheduler restarted?" in line, line
    assert line.endswith("a re-run resumes where this one stopped"), line
    assert Catalog.open(store).staged("d") == []


def test_worker_processes_of_the_engines_local_cluster_are_quiet_but_for_debug(tmp_path, cli):
    import distributed  # noqa: F401
    src = write_values(tmp_path / "src", ["a0", "a1", "a2"])
    for debug in ([], ["--debug"]):
        store = str(tmp_path / f"store{len(debug)}")
        Catalog.init(store)
        p = cli(*debug, "--store", store, "ingest", str(src), "--dataset", "d", "--adapter",
                "noisyvals", "--engine", "dask", "--workers", "1", "--json")
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
        assert '"files_ingested": 3' in out
        if debug:
            assert WARNING in err  # --debug shows dask's log lines, the workers' included
        else:
            assert err == ""


def test_quiet_dask_logs_restores_the_levels_it_raised():
    import distributed  # noqa: F401
    before = {
        name: logger.level
        for name, logger in logging.root.manager.loggerDict.items()
        if isinstance(logger, logging.Logger) and name.startswith("distributed")
    }
    assert before.get("distributed.client", logging.NOTSET) < logging.CRITICAL
    loop_level = logging.getLogger("asyncio").level
    assert loop_level < logging.CRITICAL
    with quiet_dask_logs():
        assert logging.getLogger("distributed.client").getEffectiveLevel() == logging.CRITICAL
        assert logging.getLogger("distributed.scheduler").getEffectiveLevel() == logging.CRITICAL
        # the client's event loop reports gathers it no longer awaits through asyncio's
        assert logging.getLogger("asyncio").getEffectiveLevel() == logging.CRITICAL
    with quiet_dask_logs(False):  # --debug: nothing changes
        assert logging.getLogger("distributed.client").level == before["distributed.client"]
        assert logging.getLogger("asyncio").level == loop_level
    after = {name: logging.getLogger(name).level for name in before}
    assert after == before
    assert logging.getLogger("asyncio").level == loop_level
