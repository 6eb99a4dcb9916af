"""A DataLoader worker leaves as soon as its training process dies (SIGKILL), and leaves
cleanly when the loader is shut down with batches still being sent."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import time

import pytest
from loader_helpers import commit_samples, make_samples

SCRIPT = """
import os, sys
sys.path.insert(0, sys.argv[2])
from loader_helpers import open_test_shard
from simstore.loaders import SimDataLoader, SimDataset
ds = SimDataset(sys.argv[1], "sim", shard_opener=open_test_shard)
loader = SimDataLoader(ds, batch_size=2, num_workers=2, multiprocessing_context=sys.argv[3])
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


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        kids = _children(todo.pop())
        out += kids
        todo += kids
    return out


def _survivors(pids: list[int]) -> list[int]:
    """Those of ``pids`` still alive a minute on (then killed)."""
    deadline = time.monotonic() + 60  # a liveness bound, not a speed measurement
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [p for p in pids if _alive(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    return left


@pytest.mark.parametrize("context", ["fork", "forkserver"])
def test_workers_exit_when_the_training_process_is_killed(store_path, context):
    commit_samples(store_path, "sim", make_samples(200), per_shard=20)
    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, store_path, here, context],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    # the two workers (and, with forkserver, the fork server and its resource tracker)
    pids = _descendants(proc.pid)
    assert len(pids) >= 2 and all(_alive(p) for p in pids)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    left = _survivors(pids)
    assert not left, f"workers {left} outlived their killed parent"


def _send_and_leave(q) -> None:
    """A spawned worker's last moments: batches still being pickled by the queue's feeder
    thread (tensor storages shared from torch's C++ code) while the process exits."""
    import torch
    import torch.multiprocessing  # noqa: F401  (the tensor reductions a worker uses)
    from simstore.loaders._world import exit_with_parent

    exit_with_parent()  # what a SimDataset does first in each worker process
    batch = torch.ones(16 * 2**20)
    for _ in range(4):
        q.put(batch.clone())
    q.cancel_join_thread()  # as torch's worker loop does when told to stop
    q.close()


@pytest.mark.multiprocess
def test_spawned_worker_exits_cleanly_while_batches_are_in_flight():
    # Without the exit hook this dies of SIGABRT every time ("terminate called without an
    # active exception"): the feeder asks for the GIL back during finalization.
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    codes = []
    for _ in range(2):
        q = ctx.Queue()
        proc = ctx.Process(target=_send_and_leave, args=(q,))
        proc.start()
        proc.join(120)
        codes.append(proc.exitcode)
    assert codes == [0, 0]


def _second_waits(folder: str) -> _FailingTransform:
    """Unpickled in each spawned worker: the first goes on, the second waits until the first
    has raised (and a little more, for the error to reach the training process)."""
    try:
        os.close(os.open(os.path.join(folder, "first"), os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        deadline = time.monotonic() + 60  # a liveness bound
        while not os.path.exists(os.path.join(folder, "raised")):
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        time.sleep(0.5)
    return _FailingTransform(folder)


class _FailingTransform:
    def __init__(self, folder: str) -> None:
        self.folder = folder

    def __reduce__(self):
        return _second_waits, (self.folder,)

    def __call__(self, sample):
        open(os.path.join(self.folder, "raised"), "w").close()
        raise ValueError("transform refuses every sample")


@pytest.mark.multiprocess
def test_a_worker_error_stops_the_other_workers_before_it_is_raised(small, tmp_path,
                                                                    monkeypatch):
    # Left to the garbage collector (the error's traceback holds the iterator in a cycle),
    # the queues' semaphores were unlinked before the iterator's shutdown: a worker still
    # starting up then died on them (exit code 1), and torch's SIGCHLD check raised that
    # inside a later, unrelated piece of code.
    from loader_helpers import open_test_shard
    from simstore.loaders import SimDataLoader, SimDataset, _workers

    store, ref, _ = small
    folder = str(tmp_path / "markers")
    os.mkdir(folder)
    iters = []
    real_init = _workers._WorkersIter.__init__

    def keep(self, loader):
        iters.append(self)
        real_init(self, loader)

    monkeypatch.setattr(_workers._WorkersIter, "__init__", keep)
    ds = SimDataset(store, ref, shuffle=False, transform=_FailingTransform(folder),
                    shard_opener=open_test_shard)
    loader = SimDataLoader(ds, batch_size=2, num_workers=2, multiprocessing_context="spawn")
    with pytest.raises(ValueError, match="refuses every sample"):
        for _ in loader:
            pass
    (it,) = iters
    assert [w.exitcode for w in it._workers] == [0, 0]


GRACEFUL = """
import json, os, signal, sys, time
sys.path.insert(0, sys.argv[2])
from loader_helpers import open_test_shard
from simstore.loaders import SimDataLoader, SimDataset
stop = []
signal.signal(getattr(signal, sys.argv[5]), lambda s, f: stop.append(s))
ds = SimDataset(sys.argv[1], "sim", shard_opener=open_test_shard, shuffle=True, seed=1)
loader = SimDataLoader(ds, batch_size=2, num_workers=2, multiprocessing_context=sys.argv[3])
keys = []
for batch in loader:
    keys += batch["__key__"]
    if len(keys) == 4:
        print("ready", flush=True)
        while not stop:  # a training step, during which the job gets its SIGTERM
            time.sleep(0.01)
        time.sleep(1.0)  # the rest of the step
    if stop:  # at the end of the step: save and leave
        with open(sys.argv[4], "w") as f:
            json.dump({"state": loader.state_dict(), "keys": keys}, f)
        sys.exit(0)
"""


@pytest.mark.parametrize("context", ["fork", "spawn"])
@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT", "SIGUSR1"])
def test_a_job_stopped_by_sigterm_saves_its_state_at_the_end_of_the_step(
        store_path, tmp_path, context, signame):
    # Slurm (and a signal to the process group) sends SIGTERM to every process of the job:
    # the workers died of it at once and the training process's SIGCHLD check raised
    # "DataLoader worker ... is killed by signal: Terminated" in the middle of the step.
    # Found by an audit: the same with SIGINT (Ctrl-C reaches the whole group) and with a
    # scheduler's early warning (SIGUSR1): a spawned worker died of either
    import json

    from loader_helpers import open_test_shard
    from simstore.loaders import SimDataLoader, SimDataset

    commit_samples(store_path, "sim", make_samples(80), per_shard=10)
    here = os.path.dirname(os.path.abspath(__file__))
    saved = str(tmp_path / "state.json")
    proc = subprocess.Popen([sys.executable, "-c", GRACEFUL, store_path, here, context, saved,
                             signame],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stdout.readline().strip() == "ready"
    pids = _descendants(proc.pid)
    assert len(pids) >= 2
    os.killpg(proc.pid, getattr(signal, signame))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    left = _survivors(pids)
    assert not left, f"workers {left} outlived the job"
    with open(saved) as f:
        got = json.load(f)

    def stream(state=None):
        ds = SimDataset(store_path, "sim", shard_opener=open_test_shard, shuffle=True, seed=1)
        loader = SimDataLoader(ds, batch_size=2, num_workers=0)
        if state is not None:
            loader.load_state_dict(state)
        return [k for b in loader for k in b["__key__"]]

    assert len(got["keys"]) >= 4
    assert got["keys"] + stream(got["state"]) == stream()


AT_EPOCH_END = """
import json, signal, sys, time
sys.path.insert(0, sys.argv[2])
from loader_helpers import open_test_shard
from simstore.loaders import SimDataLoader, SimDataset
stop = []
signal.signal(signal.SIGTERM, lambda s, f: stop.append(s))
if __name__ == "__main__":
    ds = SimDataset(sys.argv[1], "sim", shard_opener=open_test_shard, shuffle=True, seed=1)
    loader = SimDataLoader(ds, batch_size=2, num_workers=2, multiprocessing_context="spawn")
    for epoch in range(3):
        loader.set_epoch(epoch)
        for batch in loader:
            time.sleep(0.005)
            if stop:
                with open(sys.argv[3], "w") as f:
                    json.dump({"state": loader.state_dict(), "epoch": epoch}, f)
                sys.exit(0)
        print("epoch done", flush=True)
"""


@pytest.mark.multiprocess
@pytest.mark.parametrize("delay_s", [0.0, 0.05, 0.1, 0.2, 0.3])
def test_a_sigterm_to_the_job_as_an_epochs_spawn_workers_leave_is_saved_not_raised(
        store_path, tmp_path, delay_s):
    """Found by an audit: a job's SIGTERM to its process group just after an epoch ended
    met that epoch's spawn workers in their interpreter's teardown, where a signal's
    default action is back; one died of it, and torch's SIGCHLD check raised "DataLoader
    worker ... is killed by signal: Terminated" in the next epoch's first batch, before
    the loop could save its state (8 runs in 12). Now a worker told to stop leaves at
    once, and an epoch's workers are off torch's watch once every batch is received."""
    import json

    commit_samples(store_path, "sim", make_samples(40), per_shard=10)
    here = os.path.dirname(os.path.abspath(__file__))
    saved = str(tmp_path / "state.json")
    proc = subprocess.Popen(
        [sys.executable, "-c", AT_EPOCH_END, store_path, here, saved],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout.readline().strip() == "epoch done"
    time.sleep(delay_s)
    os.killpg(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    with open(saved) as f:
        got = json.load(f)
    assert got["epoch"] >= 1 and got["state"]["delivered"] > 0


WHILE_STARTING = """
import os, signal, sys, threading, time
sys.path.insert(0, sys.argv[2])
from loader_helpers import open_test_shard
from simstore.loaders import SimDataLoader, SimDataset

def spawned():
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{name}/cmdline") as f:
                    cmd = f.read()
            except (OSError, ValueError, IndexError):
                continue
            if ppid == os.getpid() and "spawn_main" in cmd:
                out.append(int(name))
    return out

def send(sig):
    deadline = time.monotonic() + 30
    while not spawned() and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # importing torch, its handlers not yet in place
    for pid in spawned():
        os.kill(pid, sig)

if __name__ == "__main__":
    sig = getattr(signal, sys.argv[3])
    signal.signal(sig, lambda s, f: None)  # the training process's own handler
    ds = SimDataset(sys.argv[1], "sim", shard_opener=open_test_shard)
    loader = SimDataLoader(ds, batch_size=2, num_workers=2, multiprocessing_context="spawn")
    threading.Thread(target=send, args=(sig,), daemon=True).start()
    print(sum(len(b["__key__"]) for b in loader))
"""


@pytest.mark.multiprocess
@pytest.mark.parametrize("signame", ["SIGINT", "SIGUSR1"])
def test_a_signal_to_spawn_workers_while_they_start_leaves_them_serving(store_path, signame):
    """Found by a review: only SIGTERM was held back while workers started; a SIGINT or a
    scheduler's SIGUSR1 reaching a spawned worker while it imported torch killed it by
    the signal's default action, and the epoch raised "exited unexpectedly"."""
    commit_samples(store_path, "sim", make_samples(40), per_shard=10)
    here = os.path.dirname(os.path.abspath(__file__))
    done = subprocess.run([sys.executable, "-c", WHILE_STARTING, store_path, here, signame],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "40"


AT_EXIT_HOOKS = """
import atexit, logging, logging.handlers, os, sys
sys.path.insert(0, sys.argv[2])
from loader_helpers import open_test_shard
from simstore.loaders import SimDataLoader, SimDataset
OUT = sys.argv[3]

def bye():
    with open(os.path.join(OUT, f"hook-{os.getpid()}"), "w") as f:
        f.write("ran")

def init(worker_id):
    target = logging.FileHandler(os.path.join(OUT, f"log-{worker_id}"))
    logging.getLogger().addHandler(logging.handlers.MemoryHandler(1000, target=target))
    logging.getLogger().setLevel(logging.INFO)
    logging.info("worker %d started", worker_id)  # buffered until the logging shuts down
    atexit.register(bye)

if __name__ == "__main__":
    ds = SimDataset(sys.argv[1], "sim", shard_opener=open_test_shard)
    loader = SimDataLoader(ds, batch_size=2, num_workers=2, multiprocessing_context="spawn",
                           worker_init_fn=init)
    print(sum(len(b["__key__"]) for b in loader))
"""


@pytest.mark.multiprocess
def test_spawn_workers_at_an_epochs_end_run_their_exit_hooks_and_flush_their_logs(
        store_path, tmp_path):
    """Found by a review: a worker told to stop left with ``os._exit`` at every epoch's
    end, so a buffered log handler lost its records and a user's exit hooks never ran
    (5 runs in 8). It leaves that way now only when its queue is blocked."""
    commit_samples(store_path, "sim", make_samples(40), per_shard=10)
    here = os.path.dirname(os.path.abspath(__file__))
    out = tmp_path / "out"
    out.mkdir()
    script = tmp_path / "job.py"  # a file: spawned workers import its worker_init_fn
    script.write_text(AT_EXIT_HOOKS)
    done = subprocess.run([sys.executable, str(script), store_path, here, str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    deadline = time.monotonic() + 30  # the workers leave on the reaper's thread
    while len(list(out.glob("hook-*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(list(out.glob("hook-*"))) == 2
    assert [(out / f"log-{w}").read_text().strip() for w in (0, 1)] == [
        "worker 0 started", "worker 1 started"]


def _serve(parent: int, grace_s: float, ready, without_threads: bool = False) -> None:
    """A worker's SIGTERM handling, then serving; ``without_threads``: no thread starts."""
    import resource
    import threading

    from simstore.loaders._world import leave_sigterm_to_parent

    leave_sigterm_to_parent(parent, grace_s=grace_s)
    if without_threads:
        with open("/proc/self/status") as f:
            size = next(int(line.split()[1]) * 1024 for line in f
                        if line.startswith("VmSize"))
        threading.stack_size(1 << 30)  # a new thread's stack: more than the limit leaves
        resource.setrlimit(resource.RLIMIT_AS, (size + (256 << 20), resource.RLIM_INFINITY))
    ready.set()
    while True:
        time.sleep(0.05)


def test_a_worker_outlives_a_sigterm_while_its_parent_runs_then_leaves_quietly():
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    worker = ctx.Process(target=_serve, args=(os.getpid(), 5.0, ready), daemon=True)
    worker.start()
    assert ready.wait(60)
    os.kill(worker.pid, signal.SIGTERM)
    time.sleep(0.3)
    assert worker.is_alive()  # still serving its parent
    worker.join(60)  # a liveness bound
    assert worker.exitcode == 0  # its grace over: gone, with nothing for SIGCHLD to report


def test_a_worker_that_cannot_start_its_grace_timer_serves_on():
    # the handler's timer thread would not start (a pids limit): its RuntimeError was
    # raised inside whatever the worker was doing, ending the batch under way with it
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    worker = ctx.Process(target=_serve, args=(os.getpid(), 5.0, ready, True), daemon=True)
    worker.start()
    try:
        assert ready.wait(60)
        os.kill(worker.pid, signal.SIGTERM)
        time.sleep(0.5)
        assert worker.is_alive(), f"the worker ended (exit code {worker.exitcode})"
    finally:
        worker.kill()
        worker.join(60)


STARTING = """
import signal, sys, time
sys.path.insert(0, sys.argv[2])
from loader_helpers import open_test_shard
from simstore.loaders import SimDataLoader, SimDataset
stop = []
signal.signal(signal.SIGTERM, lambda s, f: stop.append(s))
if __name__ == "__main__":
    ds = SimDataset(sys.argv[1], "sim", shard_opener=open_test_shard)
    loader = SimDataLoader(ds, batch_size=2, num_workers=2,
                           multiprocessing_context=sys.argv[3])
    it = iter(loader)
    print("started", flush=True)
    while not stop:
        time.sleep(0.01)
    batch = next(it)  # the workers, signalled while they started, still serve
    print("got", len(batch["__key__"]), flush=True)
"""


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_sigterm_while_the_workers_start_leaves_them_serving(store_path, tmp_path,
                                                               context):
    # a spawned worker imports torch for a second or so before its handler is in place;
    # a job's SIGTERM then killed it
    commit_samples(store_path, "sim", make_samples(40), per_shard=10)
    here = os.path.dirname(os.path.abspath(__file__))
    script = tmp_path / "starting.py"
    script.write_text(STARTING)
    proc = subprocess.Popen([sys.executable, str(script), store_path, here, context],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stdout.readline().strip() == "started"
    os.killpg(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert out.strip() == "got 2"


FORKED_CHILD = """
import os, sys
sys.path.insert(0, sys.argv[2])
from loader_helpers import open_test_shard
from simstore.loaders import SimDataLoader, SimDataset
ds = SimDataset(sys.argv[1], "sim", shard_opener=open_test_shard)
loader = SimDataLoader(ds, batch_size=2, num_workers=2, multiprocessing_context="fork",
                       persistent_workers=sys.argv[3] == "1")
it = iter(loader)
keys = list(next(it)["__key__"])
pid = os.fork()
if pid == 0:
    sys.exit(0)  # its exit hooks run: the workers are not its own to stop
os.waitpid(pid, 0)
keys += [k for batch in it for k in batch["__key__"]]
print(len(keys))
"""


@pytest.mark.parametrize("persistent", [False, True])
def test_a_process_forked_from_the_training_process_leaves_its_workers_alone(
        store_path, persistent):
    commit_samples(store_path, "sim", make_samples(40), per_shard=10)
    here = os.path.dirname(os.path.abspath(__file__))
    p = subprocess.run([sys.executable, "-c", FORKED_CHILD, store_path, here,
                        str(int(persistent))], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "40"


FORKSERVER_AFTER = """
import sys, time
sys.path.insert(0, sys.argv[2])
from loader_helpers import open_test_shard
from simstore.loaders import SimDataLoader, SimDataset
if __name__ == "__main__":
    import multiprocessing
    ctx = multiprocessing.get_context("forkserver")
    ds = SimDataset(sys.argv[1], "sim", shard_opener=open_test_shard)
    for batch in SimDataLoader(ds, batch_size=2, num_workers=2, multiprocessing_context=ctx):
        pass
    other = ctx.Process(target=time.sleep, args=(120,))
    other.start()
    other.terminate()
    other.join(60)  # a liveness bound
    print(other.exitcode)
    if other.exitcode is None:
        other.kill()
"""


def test_the_fork_server_a_loader_started_forks_processes_sigterm_can_end(store_path,
                                                                          tmp_path):
    # SIGTERM is blocked while the workers start; the fork server, started then, kept that
    # mask for every process it forked later: a terminate() of one did nothing
    commit_samples(store_path, "sim", make_samples(20), per_shard=10)
    here = os.path.dirname(os.path.abspath(__file__))
    script = tmp_path / "forkserver_after.py"
    script.write_text(FORKSERVER_AFTER)
    p = subprocess.run([sys.executable, str(script), store_path, here],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == str(-signal.SIGTERM)


STUCK = """
import sys, time
sys.path.insert(0, sys.argv[2])
from loader_helpers import open_test_shard
from simstore.loaders import SimDataLoader, SimDataset
calls = []
def collate(samples):
    calls.append(1)
    if len(calls) > 1:
        time.sleep(300)  # stuck: it never sees the request to stop
    return [s["__key__"] for s in samples]
ds = SimDataset(sys.argv[1], "sim", shard_opener=open_test_shard)
loader = SimDataLoader(ds, batch_size=2, num_workers=1, collate_fn=collate,
                       multiprocessing_context="fork")
it = iter(loader)
next(it)
from simstore.loaders._workers import _RUNNING
(workers_iter,) = list(_RUNNING)
workers = list(workers_iter._workers)
workers_iter._shutdown_workers()  # asks, waits, then terminate()s the stuck worker
print(sum(w.is_alive() for w in workers))
"""


def test_a_stuck_worker_the_training_process_terminates_ends_at_once(store_path):
    # its SIGTERM handler took torch's terminate() for a job's SIGTERM and lingered 30 s
    commit_samples(store_path, "sim", make_samples(20), per_shard=10)
    here = os.path.dirname(os.path.abspath(__file__))
    p = subprocess.run([sys.executable, "-c", STUCK, store_path, here],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "0"


def _hold_and_die(event) -> None:
    """Take whatever lock ``event`` has (torch's ``multiprocessing.Event`` has one) and die."""
    cond = getattr(event, "_cond", None)
    if cond is not None:
        cond.acquire()
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_process_killed_inside_the_workers_shutdown_event_hangs_nothing(tmp_path, context):
    """A worker killed in the instant it asks torch's shutdown event leaves no lock held.

    Torch's event takes a lock shared by every process in ``is_set()`` and ``set()``; a
    process that dies holding it (here one made to, as a SIGKILLed worker could) used to
    leave the training process blocked for good at its next shutdown.
    """
    import multiprocessing
    import threading

    from loader_helpers import open_test_shard
    from simstore.loaders import SimDataLoader, SimDataset

    store = str(tmp_path / "store")
    samples = make_samples(40)
    commit_samples(store, "sim", samples, per_shard=10)
    ds = SimDataset(store, "sim", shard_opener=open_test_shard)
    # persistent: the loader keeps torch's iterator (``_iterator``), whose event this is
    loader = SimDataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context=context,
                           persistent_workers=True)
    it = iter(loader)
    first = next(it)
    workers = loader._iterator
    holder = multiprocessing.get_context(context).Process(
        target=_hold_and_die, args=(workers._workers_done_event,))
    holder.start()
    holder.join()
    assert holder.exitcode == -signal.SIGKILL
    got: list = []

    def finish() -> None:
        got.extend(it)
        workers._shutdown_workers()
        got.append("stopped")

    runner = threading.Thread(target=finish, daemon=True)
    runner.start()
    runner.join(120)
    assert not runner.is_alive(), "the loader blocked on the shutdown event's lock"
    keys = [k for b in [first, *got[:-1]] for k in b["__key__"]]
    assert sorted(keys) == sorted(s.key for s in samples)
    assert got[-1] == "stopped"


@pytest.mark.parametrize("persistent", [False, True])
def test_a_ctrl_c_while_the_workers_start_stops_them_before_it_is_raised(
        small, monkeypatch, persistent):
    """A KeyboardInterrupt inside torch's iterator start (its workers started, their
    queues being primed) leaves no worker serving.

    The half-made iterator was never returned: its workers served on, and at the
    script's exit multiprocessing's hook sent them a SIGTERM they outlive for 30 s while
    the training process runs, and waited for them (Ctrl-C took 30 s to end the script).
    """
    from loader_helpers import open_test_shard
    from simstore.loaders import SimDataLoader, SimDataset
    from torch.utils.data import dataloader as torch_loader

    store, ref, _ = small
    started: list = []

    def interrupted(self):
        started.extend(self._workers)
        raise KeyboardInterrupt

    monkeypatch.setattr(torch_loader._MultiProcessingDataLoaderIter, "_try_put_index",
                        interrupted)
    ds = SimDataset(store, ref, shard_opener=open_test_shard)
    loader = SimDataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="fork",
                           persistent_workers=persistent)
    with pytest.raises(KeyboardInterrupt) as info:
        iter(loader)
    # the traceback holds the half-made iterator, as an uncaught one does to the exit
    assert info.traceback
    alive = [w.is_alive() for w in started]
    del info
    gc.collect()  # the iterator, collected, stops any worker left
    assert len(started) == 2
    assert alive == [False, False]
    monkeypatch.undo()
    keys = [k for batch in loader for k in batch["__key__"]]  # the next iteration reads
    assert len(keys) == 60


RANK_PROCESS = """
import multiprocessing, os, sys, time
sys.path.insert(0, sys.argv[2])
from loader_helpers import open_test_shard
from simstore.loaders import SimDataLoader, SimDataset


def mark():
    # a worker's exit that takes a while after its last batch (a large address space to
    # unmap, a long teardown): it leaves this mark only if nothing terminates it first
    time.sleep(0.5)
    open(os.path.join(sys.argv[4], f"left-{os.getpid()}"), "w").close()


def slow_exit(worker_id):
    from multiprocessing import util
    util.Finalize(None, mark, exitpriority=10)


def rank_main(store, context):
    ds = SimDataset(store, "sim", shard_opener=open_test_shard)
    loader = SimDataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context=context,
                           worker_init_fn=slow_exit)
    print("read", sum(len(b["__key__"]) for b in loader), flush=True)
    # and returns at once, as a DDP script's rank function does after its last epoch


if __name__ == "__main__":
    rank = multiprocessing.get_context("spawn").Process(target=rank_main,
                                                        args=(sys.argv[1], sys.argv[3]))
    rank.start()
    rank.join(120)  # a liveness bound
    print("exit", rank.exitcode, flush=True)
"""


@pytest.mark.multiprocess
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_rank_started_by_multiprocessing_lets_its_workers_leave(small, tmp_path, context):
    # found by an audit: a rank of mp.spawn that returned right after reading an epoch to
    # its end ran multiprocessing's exit function, which terminated the workers the
    # loader's reaper thread was still joining (that process never runs atexit); a worker
    # SIGTERM met in its interpreter's teardown died of it, torch's SIGCHLD check raised
    # "killed by signal: Terminated", and the rank exited 1 (1 run in 4)
    store, _, samples = small
    script = tmp_path / "rank.py"
    script.write_text(RANK_PROCESS)
    marks = tmp_path / "marks"
    marks.mkdir()
    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run([sys.executable, str(script), store, here, context, str(marks)],
                          capture_output=True, text=True, timeout=300)
    assert proc.stdout.split() == ["read", str(len(samples)), "exit", "0"], proc.stderr
    assert len(os.listdir(marks)) == 2  # both workers ended their own way, none terminated
