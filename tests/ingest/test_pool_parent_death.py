"""Pool processes end when the ingesting process dies, even by ``kill -9``.

They used to wait for ever on the pool's call queue (its pipe's write end is shared by
every forked sibling, so no end of file comes), holding the dead ingest's stdout open.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="finds the process tree in /proc"
)

GATE_ADAPTER = '''
import os, time
import numpy as np
from simstore.sample import Sample


class GateAdapter:
    """``*.gate`` files: ``wait*`` ones write ``started-<pid>`` next to them and never end."""

    name = "gate"
    version = "1"
    extensions = (".gate",)

    def can_read(self, path, head):
        return path.endswith(".gate")

    def iter_samples(self, path, key, options):
        if os.path.basename(path).startswith("wait"):
            markers = os.path.join(os.path.dirname(os.path.dirname(path)), "markers")
            open(os.path.join(markers, f"started-{os.getpid()}"), "w").close()
            while True:
                time.sleep(0.05)
        yield Sample(key, {"x": np.arange(3.0)})
'''

INGEST = """
import sys
from importlib.metadata import EntryPoint

import simstore.ingest as module
from simstore.catalog import Catalog

real = module.entry_points


def entry_points(group):
    eps = list(real(group=group))
    if group == module.ADAPTER_GROUP:
        eps.append(EntryPoint("gate", "gate_adapter:GateAdapter", group))
    return eps


if __name__ == "__main__":
    module.entry_points = entry_points
    store, src, method = sys.argv[1:]
    module.ingest(
        [src], dataset="d", store=Catalog.init(store), adapter="gate",
        workers=3, start_method=method, shard_size=1,
    )
"""


def _started(pid):
    """The start time of a live process (field 22 of its stat), None when gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def _descendants(pid):
    out = []
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    kids = [int(c) for c in f.read().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return [(p, _started(p)) for p in out]


def _wait_gone(procs, deadline_s):
    deadline = time.monotonic() + deadline_s
    alive = procs
    while time.monotonic() < deadline:
        alive = [(p, t) for p, t in procs if t is not None and _started(p) == t]
        if not alive:
            return []
        time.sleep(0.05)
    return alive


def _kill_all(procs):
    for p, t in procs:
        if t is not None and _started(p) == t:
            os.kill(p, signal.SIGKILL)


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_pool_processes_exit_when_the_ingest_is_killed(tmp_path, method):
    (tmp_path / "gate_adapter.py").write_text(GATE_ADAPTER)
    (tmp_path / "run.py").write_text(INGEST)
    src = tmp_path / "src"
    src.mkdir()
    (tmp_path / "markers").mkdir()
    for name in ("a.gate", "wait1.gate", "wait2.gate"):  # one task each (shard_size=1)
        (src / name).write_text("x")
    err = tmp_path / "stderr.txt"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]))
    with open(err, "wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, str(tmp_path / "run.py"), str(tmp_path / "store"), str(src), method],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env=env,
        )
    procs = []
    try:
        # the ingest and one pool process block in a ``wait`` file; the other pool
        # process ran ``a.gate`` (or nothing) and waits on the pool's queue for a task
        deadline = time.monotonic() + 120
        while len(os.listdir(tmp_path / "markers")) < 2:
            assert proc.poll() is None, err.read_text()
            assert time.monotonic() < deadline, "the ingest never started its tasks"
            time.sleep(0.05)
        procs = _descendants(proc.pid)
        assert len(procs) >= 2, procs  # the pool's two processes (and helpers)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        left = _wait_gone(procs, 60)
        assert not left, f"processes outlived the killed ingest: {left}"
    finally:
        if proc.poll() is None:
            procs = procs or _descendants(proc.pid)
            proc.kill()
            proc.wait()
        _kill_all(procs)


def test_a_worker_whose_parent_died_before_it_started_exits_at_once(tmp_path):
    code = textwrap.dedent(
        """
        import os
        from simstore.ingest._engine import exit_with_parent
        exit_with_parent(os.getppid() + 1)  # not our parent: it died while we started
        print("still running")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == ""


def test_a_forkserver_worker_whose_ingest_died_before_it_started_exits_at_once(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # reaped: its pid names no process
    code = textwrap.dedent(
        f"""
        from simstore.ingest._engine import exit_with_parent
        exit_with_parent({dead.pid}, direct=False)
        print("still running")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == ""


def test_without_a_parent_death_signal_a_thread_notices_the_parent_is_gone(tmp_path):
    # the fallback where prctl is missing (not Linux): a thread polls the parent's pid
    pid_file = tmp_path / "grandchild"
    code = textwrap.dedent(
        f"""
        import os, time
        from simstore.ingest import _engine
        if os.fork() == 0:
            _engine._parent_death_signal = lambda sig: False
            _engine.exit_with_parent(os.getppid(), interval_s=0.05)
            with open({str(pid_file)!r} + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.rename({str(pid_file)!r} + ".tmp", {str(pid_file)!r})
            while True:
                time.sleep(0.05)
        while True:
            time.sleep(0.05)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    procs = []
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        pid = int(pid_file.read_text())
        procs = [(pid, _started(pid))]
        proc.kill()
        proc.wait()
        assert not _wait_gone(procs, 60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        _kill_all(procs)


def test_a_forked_pool_process_dies_of_sigterm_quietly():
    """The command line turns SIGTERM into an interrupt for its own clean-up; a forked pool
    process inherited that, and a SIGTERM to the job's process group while it waited for
    a task printed multiprocessing's traceback of the interrupt."""
    code = textwrap.dedent("""
        import os, signal, sys, time
        from simstore import _launch
        from simstore.ingest._engine import exit_with_parent
        signal.signal(signal.SIGTERM, _launch._on_sigterm)
        pid = os.fork()
        if pid == 0:
            exit_with_parent(os.getppid())
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(60)
            os._exit(3)
        _, status = os.waitpid(pid, 0)
        print(os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM)
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert p.stdout.strip() == "True", (p.stdout, p.stderr)
    assert "Traceback" not in p.stderr


def test_a_programs_own_sigterm_handler_stays_in_its_pool_processes():
    """Only the command line's handler is reset: a program that ingests through the
    library with a SIGTERM handler of its own keeps it in its forked pool processes."""
    code = textwrap.dedent("""
        import os, signal
        from simstore.ingest._engine import exit_with_parent
        def mine(signum, frame):
            pass
        signal.signal(signal.SIGTERM, mine)
        pid = os.fork()
        if pid == 0:
            exit_with_parent(os.getppid())
            os._exit(0 if signal.getsignal(signal.SIGTERM) is mine else 1)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status))
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert p.stdout.strip() == "0", (p.stdout, p.stderr)
