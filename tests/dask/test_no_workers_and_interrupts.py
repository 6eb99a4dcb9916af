"""A cluster left without workers fails the run in one line; Ctrl-C while the engine's
LocalCluster starts prints one line too. Both through the command line, in real processes."""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from dask_adapters import write_values

from simstore.catalog import Catalog
from simstore.errors import InvalidInputError, SimstoreError
from simstore.ingest import ingest
from simstore.ingest._dask import NO_WORKERS_ENV, _NoWorkers, _outcome
from simstore.testing.adapters import adapters_script

pytestmark = pytest.mark.dask

TESTS = os.path.dirname(__file__)
ROOT = os.path.dirname(os.path.dirname(TESTS))
DASK = os.path.join(os.path.dirname(sys.executable), "dask")

# ``simstore`` itself, with the test adapter registered as its entry point would register it
CLI_WITH_TESTVALS = adapters_script({"testvals": "dask_adapters:ValuesAdapter"}, TESTS) + """
from simstore.cli import main

if __name__ == "__main__":
    main()
"""

CLI_INTERRUPTED_AT_START = """
import os
import signal

import distributed

# Ctrl-C raises KeyboardInterrupt, as in a terminal, even when this test runs where SIGINT
# is ignored (a job started in the background by a shell): Python then installs no
# handler of its own
signal.signal(signal.SIGINT, signal.default_int_handler)
real = distributed.Nanny.__init__
sent = []


def init(self, *args, **kwargs):
    # Ctrl-C while the LocalCluster starts: its first worker is being made
    if not sent:
        sent.append(True)
        os.kill(os.getpid(), signal.SIGINT)
    real(self, *args, **kwargs)


distributed.Nanny.__init__ = init
from simstore.cli import main

if __name__ == "__main__":
    main()
"""


def wait_for(condition, what, deadline_s=60.0):
    """Poll until ``condition()``; the deadline only stops a hung test, it measures nothing."""
    end = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < end, f"gave up waiting for {what}"
        time.sleep(0.05)


def env_with_tests(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (TESTS, ROOT, env.get("PYTHONPATH", "")) if p
    )
    env.update(extra)
    return env


def start_scheduler(scheduler_file, procs):
    """A ``dask scheduler`` on 127.0.0.1 (appended to ``procs``); its address."""
    procs.append(subprocess.Popen(
        [DASK, "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
         "--scheduler-file", str(scheduler_file)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env_with_tests(),
    ))  # fmt: skip
    wait_for(lambda: scheduler_file.exists() and scheduler_file.stat().st_size, "scheduler")
    address = json.loads(scheduler_file.read_text())["address"]
    assert address.startswith("tcp://127.0.0.1:")
    return address


def start_worker(address, procs):
    """One ``dask worker`` of one thread, no nanny, for ``address`` (appended to ``procs``)."""
    worker = subprocess.Popen(
        [DASK, "worker", address, "--host", "127.0.0.1", "--nthreads", "1",
         "--no-nanny", "--no-dashboard"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env_with_tests(),
    )
    procs.append(worker)
    return worker


def stop(proc):
    """Kill ``proc`` if it runs, and close its pipes (a failed test must not leave them
    open for a later test's garbage collection to report)."""
    if proc.poll() is None:
        proc.kill()
    proc.communicate()


def start_ingest(tmp_path, src, address, procs, *options):
    """``simstore ingest`` of ``src`` as dataset ``d`` of a new store ``tmp_path/store``, on
    the dask cluster at ``address``, with the test adapter and a grace period of 0 (the
    driver appended to ``procs``); the driver and the store."""
    store = str(tmp_path / "store")
    Catalog.init(store)
    script = tmp_path / "cli.py"
    script.write_text(CLI_WITH_TESTVALS)
    driver = subprocess.Popen(
        [sys.executable, "-X", "faulthandler", str(script), "--store", store, "ingest",
         str(src), "--dataset", "d",
         "--adapter", "testvals", "--engine", "dask", "--address", address, "--no-progress",
         "--snapshot", *options],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env_with_tests(**{NO_WORKERS_ENV: "0"}),
    )
    procs.append(driver)
    return driver, store


def finish(driver, timeout_s=300):
    """The driver's output once it exits; if it is still running after ``timeout_s``, the
    test fails with every thread's traceback (SIGABRT, which ``-X faulthandler`` dumps)."""
    try:
        return driver.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        driver.send_signal(signal.SIGABRT)
        _, err = driver.communicate(timeout=60)
        pytest.fail(f"the driver still ran {timeout_s} s later; its threads:\n{err}")


def test_a_cluster_whose_workers_all_died_fails_the_run_in_one_line(tmp_path):
    """An outside cluster of one worker (no nanny) killed mid-task: the driver does not
    wait for ever; with the grace period at 0 it fails once it sees no worker."""
    import distributed
    src = write_values(tmp_path / "src", ["a0", "gate0"])
    markers = tmp_path / "markers"
    markers.mkdir()
    procs = []
    try:
        address = start_scheduler(tmp_path / "scheduler.json", procs)
        worker = start_worker(address, procs)
        with distributed.Client(address, set_as_default=False) as client:
            client.wait_for_workers(1, timeout=120)  # joined: the run starts with a worker
        driver, store = start_ingest(tmp_path, src, address, procs,
                                     "--option", f"marker_dir={markers}", "--shard-size", "1")
        wait_for(
            lambda: (markers / "started").exists() or driver.poll() is not None,
            "gate0's task to start",
        )
        assert driver.poll() is None, driver.communicate()
        worker.kill()  # the cluster's only worker dies mid-task
        worker.wait()
        out, err = finish(driver)
    finally:
        (markers / "open").touch()
        for proc in reversed(procs):
            stop(proc)
    assert driver.returncode == 1, (out, err)
    assert out == ""
    assert err.splitlines() == [
        f"error: no dask workers at {address} for 0 s (they died); a re-run resumes where "
        "this one stopped"
    ], err
    cat = Catalog.open(store)
    assert cat.staged("d") == [] and cat.branches("d").get_versioned("main")[0] is None


def test_a_result_lost_with_the_last_worker_after_its_task_finished_fails_the_run(tmp_path):
    """The task finished; its worker, the only one, died before the driver took the
    result: the scheduler waits for a worker to compute it again, and the driver's wait
    for the result fails the run instead of waiting with it for ever."""
    import distributed
    procs, taken = [], []
    try:
        address = start_scheduler(tmp_path / "scheduler.json", procs)
        worker = start_worker(address, procs)
        with distributed.Client(address, set_as_default=False) as client:
            client.wait_for_workers(1, timeout=120)
            fut = client.submit(sum, [1, 2, 3], key="lost-with-its-worker")
            assert fut.result(timeout=120) == 6 and fut.status == "finished"
            watch = _NoWorkers(client, address, grace_s=0.0)
            worker.kill()  # the result lived on this worker only
            worker.wait()

            def take():
                try:
                    taken.append(_outcome(fut, watch.check))
                except BaseException as exc:  # noqa: BLE001 - the test looks at it
                    taken.append(exc)

            waiter = threading.Thread(target=take, daemon=True)
            waiter.start()
            waiter.join(timeout=120)  # a deadline for a hung wait only; it measures nothing
            assert not waiter.is_alive(), "the wait for a result no worker will compute hung"
    finally:
        for proc in reversed(procs):
            stop(proc)
    assert len(taken) == 1 and isinstance(taken[0], SimstoreError), taken
    assert str(taken[0]).startswith(f"no dask workers at {address} for 0 s (they died)")


class _Cluster:
    """A client's view of a cluster's workers, changed by the test."""

    def __init__(self, workers: int) -> None:
        self.workers = workers

    def nthreads(self) -> dict[str, int]:
        return {f"tcp://127.0.0.1:{9000 + i}": 1 for i in range(self.workers)}


def test_workers_that_died_before_the_drivers_first_wait_still_fail_the_run():
    # a busy driver: its tasks went out to the cluster's one worker, which took one and
    # died, all before the driver first asked for the workers; the cluster had a worker
    # when the run started, so an empty one is dead workers, not queued ones
    cluster = _Cluster(workers=1)
    watch = _NoWorkers(cluster, "tcp://127.0.0.1:8786", grace_s=0.0)
    cluster.workers = 0
    with pytest.raises(SimstoreError, match="no dask workers at tcp://127.0.0.1:8786 for 0 s"):
        watch.check()


def test_a_cluster_whose_workers_have_not_joined_yet_is_waited_for():
    cluster = _Cluster(workers=0)
    watch = _NoWorkers(cluster, "tcp://127.0.0.1:8786", grace_s=0.0)
    watch.check()  # no worker yet (a batch queue holding their jobs): no error
    assert not watch.had_workers


@pytest.mark.parametrize("value", ["abc", "-1", "nan"])
def test_a_bad_grace_period_is_refused_naming_the_variable(
    catalog_at, tmp_path, monkeypatch, value
):
    src = tmp_path / "src"
    src.mkdir()
    np.savez(src / "a.npz", x=np.arange(3.0))
    monkeypatch.setenv(NO_WORKERS_ENV, value)
    with pytest.raises(InvalidInputError, match=rf"^{NO_WORKERS_ENV}='{re.escape(value)}': "):
        ingest([src], dataset="d", store=catalog_at("s"), engine="dask", workers=1)


def test_ctrl_c_while_the_local_cluster_starts_prints_one_line(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    np.savez(src / "a.npz", x=np.arange(3.0))
    store = str(tmp_path / "store")
    Catalog.init(store)
    script = tmp_path / "cli.py"
    script.write_text(textwrap.dedent(CLI_INTERRUPTED_AT_START))
    p = subprocess.run(
        [sys.executable, str(script), "--store", store, "ingest", str(src), "--dataset", "d",
         "--engine", "dask", "--workers", "2", "--no-progress"],
        capture_output=True, text=True, timeout=300, env=env_with_tests(),
    )
    assert p.returncode == 128 + signal.SIGINT, (p.stdout, p.stderr)
    assert p.stderr == "error: interrupted\n"
    assert Catalog.open(store).staged("d") == []


def test_a_run_waits_for_its_first_worker_however_long_the_grace_period(tmp_path):
    """Before any worker has joined nothing is timed (a batch queue may hold the workers'
    jobs): with the grace period at 0 the run still waits, then ingests once one joins."""
    import distributed
    src = write_values(tmp_path / "src", ["a0", "a1"])
    procs = []
    try:
        address = start_scheduler(tmp_path / "scheduler.json", procs)
        driver, store = start_ingest(tmp_path, src, address, procs, "--json")
        with distributed.Client(address, set_as_default=False) as client:
            wait_for(lambda: client.run_on_scheduler(lambda dask_scheduler: len(
                dask_scheduler.tasks)) > 0 or driver.poll() is not None, "tasks submitted")
        time.sleep(2.5)  # the driver has looked for workers at least twice (once a second)
        assert driver.poll() is None, driver.communicate()
        start_worker(address, procs)
        out, err = finish(driver)
    finally:
        for proc in reversed(procs):
            stop(proc)
    assert driver.returncode == 0, (out, err)
    assert json.loads(out)["samples"] == 2
