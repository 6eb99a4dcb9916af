"""A worker that dies mid-epoch is named, with how it ended and what that most likely means.

Torch says only that a worker "exited unexpectedly": a worker the kernel's out-of-memory
killer ended (SIGKILL) said nothing of memory. These workers die for real: a transform
that kills its own process, or leaves it with an exit code.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
from loader_helpers import open_test_shard
from simstore.loaders import SimDataLoader, SimDataset

pytestmark = pytest.mark.multiprocess


class _Die:
    """A transform that ends worker 1 at its third sample: by ``signal``, or by
    ``os._exit(code)`` (no handler, no finally runs either way).

    ``leave``: first make a file in ``/dev/shm`` named as torch names the file of a
    batch it is making (``torch_<pid>_<random>_<n>``), as a worker killed between
    torch's making it and unlinking it leaves one.
    """

    def __init__(self, signal: int | None = None, code: int = 0, leave: bool = False) -> None:
        self.signal = signal
        self.code = code
        self.leave = leave
        self.seen = 0
        self.said = ""
        """A file the dying worker writes its pid to."""

    def __call__(self, sample):
        info = torch.utils.data.get_worker_info()
        if info is not None and info.id == 1:
            self.seen += 1
            if self.seen == 3:
                with open(self.said, "w") as f:
                    f.write(str(os.getpid()))
                if self.leave:
                    with open(f"/dev/shm/torch_{os.getpid()}_2718281828_0", "wb") as f:
                        f.truncate(1 << 20)
                if self.signal is not None:
                    os.kill(os.getpid(), self.signal)
                os._exit(self.code)
        return sample


def _epoch_error(small, tmp_path, transform: _Die, method: str) -> str:
    store, ref, _ = small
    transform.said = str(tmp_path / "pid")
    ds = SimDataset(store, ref, seed=1, shard_opener=open_test_shard, transform=transform)
    loader = SimDataLoader(ds, batch_size=2, num_workers=2, multiprocessing_context=method)
    with pytest.raises(RuntimeError) as err:
        for _ in loader:
            pass
    pid = (tmp_path / "pid").read_text()
    msg = str(err.value)
    assert "\n" not in msg
    assert f"DataLoader worker 1 (pid {pid}) exited unexpectedly" in msg
    assert "worker 0" not in msg  # stopped by the loader afterwards, not a death to report
    return msg


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_worker_killed_by_sigkill_is_named_with_the_out_of_memory_killer(small, tmp_path, method):
    msg = _epoch_error(small, tmp_path, _Die(signal=signal.SIGKILL), method)
    assert "killed by SIGKILL" in msg and "out-of-memory killer" in msg
    assert "give the job more memory" in msg


def test_a_worker_killed_by_sigbus_points_at_shared_memory(small, tmp_path):
    msg = _epoch_error(small, tmp_path, _Die(signal=signal.SIGBUS), "fork")
    assert "killed by SIGBUS" in msg and "/dev/shm" in msg


def test_a_worker_that_exits_with_a_code_says_the_code(small, tmp_path):
    msg = _epoch_error(small, tmp_path, _Die(code=3), "fork")
    assert "it exited with code 3, after printing its own error on standard error" in msg
    assert "num_workers=0 raises it here" in msg


def test_a_worker_that_exits_with_code_0_mid_epoch_says_when_workers_do(small, tmp_path):
    # a worker's SIGTERM grace running out leaves so; torch's words were the same as for
    # any other death
    msg = _epoch_error(small, tmp_path, _Die(code=0), "fork")
    assert "it exited with code 0, which a worker does 30 s after a SIGTERM" in msg


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_the_dev_shm_file_a_killed_worker_left_is_removed(small, tmp_path, method):
    msg = _epoch_error(small, tmp_path, _Die(signal=signal.SIGKILL, leave=True), method)
    pid = (tmp_path / "pid").read_text()
    assert f"(pid {pid})" in msg
    left = [n for n in os.listdir("/dev/shm") if n.startswith(f"torch_{pid}_")]
    for name in left:  # not left behind by this test either
        os.unlink(f"/dev/shm/{name}")
    assert not left


def test_files_of_a_process_still_running_are_kept(tmp_path):
    from simstore.loaders._tensors import remove_dead_process_files

    mine = f"/dev/shm/torch_{os.getpid()}_1414213562_0"
    with open(mine, "wb"):
        pass
    try:
        assert remove_dead_process_files(os.getpid()) == 0
        assert os.path.exists(mine)
    finally:
        os.unlink(mine)


class _DieOnCue:
    """A transform that kills worker 1 at its third sample once the cue file exists."""

    def __init__(self, cue: str) -> None:
        self.cue = cue
        self.seen = 0

    def __call__(self, sample):
        info = torch.utils.data.get_worker_info()
        if info is not None and info.id == 1:
            self.seen += 1
            if self.seen == 3:
                while not os.path.exists(self.cue):
                    time.sleep(0.01)
                os.kill(os.getpid(), signal.SIGKILL)
        return sample


def test_a_worker_killed_during_the_training_step_is_named_there(small, tmp_path):
    # torch's SIGCHLD check raised its own words ("is killed by signal: Killed") inside
    # the loop's step, where the loader's next() could not reword them
    store, ref, _ = small
    cue = tmp_path / "cue"
    ds = SimDataset(store, ref, seed=1, shard_opener=open_test_shard,
                    transform=_DieOnCue(str(cue)))
    loader = SimDataLoader(ds, batch_size=2, num_workers=2, multiprocessing_context="fork")
    stepped = []
    with pytest.raises(RuntimeError) as err:
        for _ in loader:
            cue.touch()  # the step: worker 1 dies while it runs
            stepped.append(1)
            deadline = time.monotonic() + 120  # a liveness bound, no timing is asserted
            while time.monotonic() < deadline:
                time.sleep(0.01)
    assert stepped == [1]  # raised in the first step, not by next()
    assert "is killed by signal" in str(err.value.__cause__)  # torch's check, reworded
    msg = str(err.value)
    assert "DataLoader worker 1 (pid " in msg and "killed by SIGKILL" in msg
    assert "out-of-memory killer" in msg and "\n" not in msg


def test_a_pid_reused_from_a_stopped_set_is_not_blamed(small, tmp_path):
    # found by a review: the reworded SIGCHLD check matched a pid against every worker set
    # still referenced, and could describe a stopped set's long-dead worker that had the
    # pid before (its worker number, signal and advice)
    from simstore.loaders._workers import _RUNNING, _deaths_by_pid

    store, ref, _ = small
    ds = SimDataset(store, ref, seed=1, shard_opener=open_test_shard)
    loader = SimDataLoader(ds, batch_size=2, num_workers=2, multiprocessing_context="fork")
    before = {id(it) for it in _RUNNING}
    stopped = iter(loader)
    next(stopped)
    (it,) = [it for it in _RUNNING if id(it) not in before]  # this loader's set
    pid = it._workers[1].pid
    it._shutdown_workers()  # stopped: its workers ended and were reaped
    assert it._shutdown and it._workers[1].exitcode is not None
    told = _deaths_by_pid(RuntimeError(f"DataLoader worker (pid {pid}) is killed by signal: "
                                       "Killed. "))
    assert told is None  # torch's own words stand rather than a stale set's
