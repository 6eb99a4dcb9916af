"""Where a reader sits in a training job: rank, world size, worker and worker count.

The context is a value (:class:`World`) found by an injectable function, so tests and
unusual launchers can pass their own. :func:`detect_world` is the default: rank and world
size come from ``torch.distributed`` when it is initialised, else from the ``RANK`` and
``WORLD_SIZE`` environment variables (set by torchrun, Slurm wrappers and the like), else
0 and 1; the worker index and count come from ``torch.utils.data.get_worker_info()``.
This module is the loader's only reader of environment variables: the issue asks for that
fallback, and keeping it in one injectable function keeps the rest of the loader pure.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from simstore.loaders._checks import MAX_COUNT, check_int

from simstore.errors import InvalidInputError

__all__ = [
    "HELD_AT_START",
    "World",
    "WorldDetector",
    "detect_world",
    "in_worker",
    "join_queue_feeders",
    "leave_when_stopped",
    "worker_context",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class World:
    """One reader's place in a job: ``rank`` of ``world_size``, ``worker`` of ``num_workers``.

    ``num_workers`` counts DataLoader worker processes of one rank; a rank that reads in
    its main process has ``worker=0, num_workers=1``.
    """

    rank: int = 0
    world_size: int = 1
    worker: int = 0
    num_workers: int = 1

    def __post_init__(self) -> None:
        for name in ("rank", "world_size", "worker", "num_workers"):
            object.__setattr__(self, name, check_int(getattr(self, name), name))
        if self.world_size > MAX_COUNT:
            raise InvalidInputError(
                f"invalid world size {self.world_size}: at most {MAX_COUNT} ranks"
            )
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise InvalidInputError(
                f"invalid rank {self.rank} of world size {self.world_size}: "
                "need world_size >= 1 and 0 <= rank < world_size"
            )
        if self.num_workers < 1 or not 0 <= self.worker < self.num_workers:
            raise InvalidInputError(
                f"invalid worker {self.worker} of {self.num_workers} workers: "
                "need num_workers >= 1 and 0 <= worker < num_workers"
            )


WorldDetector = Callable[[], World]


def _distributed_rank() -> tuple[int, int] | None:
    try:
        import torch.distributed as dist
    except ImportError:  # torch built without distributed support
        return None
    if dist.is_available() and dist.is_initialized():
        return int(dist.get_rank()), int(dist.get_world_size())
    return None


def _env_rank(environ: Mapping[str, str]) -> tuple[int, int] | None:
    rank, size = environ.get("RANK"), environ.get("WORLD_SIZE")
    if rank is None and size is None:
        return None
    if rank is None or size is None:
        # half a launch's settings: read as rank 0 of 1, every process would read all
        given, missing = ("RANK", "WORLD_SIZE") if size is None else ("WORLD_SIZE", "RANK")
        raise InvalidInputError(
            f"{given} is set in the environment but {missing} is not: set both (as "
            "torchrun does) or neither, or pass rank= and world_size="
        )
    # plain decimal digits: int() also takes "1_0" and other scripts' digits
    if not all(re.fullmatch(r"\s*[+-]?[0-9]+\s*", v, re.ASCII) for v in (rank, size)):
        raise InvalidInputError(f"RANK={rank!r} and WORLD_SIZE={size!r} must be integers")
    return int(rank), int(size)


_WATCH_THREAD = "simstore-parent-watch"

_WARNING_SIGNALS = tuple(getattr(signal, name) for name in ("SIGUSR1", "SIGUSR2")
                         if hasattr(signal, name))
"""A scheduler's early warnings (Slurm's ``--signal=USR1@N``): the training process's."""

HELD_AT_START = frozenset({signal.SIGTERM, signal.SIGINT, *_WARNING_SIGNALS})
"""Signals a job's process group gets that a worker must not die of while it starts: a
scheduler's stop and early warning, Ctrl-C. The training process holds them back while
it starts its workers; each worker unblocks them once its handlers are in place
(:func:`leave_sigterm_to_parent`): a spawned worker imports torch first."""

SIGTERM_GRACE_S = 30.0
"""How long a DataLoader worker outlives a SIGTERM while its training process runs on
(Slurm's default wait between a job's SIGTERM and its SIGKILL)."""


def _parent_gone(parent: int | None) -> Callable[[], bool]:
    """Whether this worker's training process (pid ``parent``, else its parent) is gone."""
    expected = os.getppid()
    # the training process, when it is not this worker's parent (forkserver)
    watched = parent if parent is not None and parent != expected else None

    def gone() -> bool:
        return os.getppid() != expected or (watched is not None and not _alive(watched))

    return gone


def leave_sigterm_to_parent(parent: int | None = None, grace_s: float = SIGTERM_GRACE_S,
                            stopping: Any = None) -> None:
    """In a DataLoader worker: a SIGTERM (or SIGINT) sent to the whole job leaves it serving.

    Schedulers stop a job by sending SIGTERM to every process in it (Slurm's job step, a
    signal to the process group) and SIGKILL a while later. A torch worker died of it at
    once (torch's handler spares only its parent's signal), and the training process's
    SIGCHLD check then raised ``DataLoader worker ... is killed by signal: Terminated``
    inside whatever it was doing: a loop that catches SIGTERM to save its state at the end
    of the step never got there. Now the worker goes on serving; it leaves when its
    training process is gone (at once, or through :func:`exit_with_parent`) or, should
    that process run on, ``grace_s`` later (exit status 0, so its end raises nothing in
    the parent until the parent asks it for a batch again). The training process stops
    its workers at the end of an epoch or at its exit as always (``SimDataLoader`` stops
    every worker set it still has at exit, before ``multiprocessing`` would terminate
    them). ``stopping``: a shared byte (``RawValue``) the training process sets before it
    stops this worker's set; a SIGTERM then is its ``terminate()`` of a worker that did
    not leave when asked, and ends the worker at once, as torch's own handler did.
    """
    import threading

    gone = _parent_gone(parent)
    started: list[threading.Timer] = []

    def on_term(signum: int, frame: object) -> None:
        if gone() or (stopping is not None and stopping.value):
            os._exit(0)
        if not started:
            timer = threading.Timer(grace_s, os._exit, args=(0,))
            timer.daemon = True
            try:
                timer.start()
            except RuntimeError:
                # no thread to bound the wait with (a pids limit): serve on, raising
                # nothing into the batch under way; the training process's stop of this
                # set, or its exit, ends this worker
                return
            started.append(timer)

    signal.signal(signal.SIGTERM, on_term)
    # Ctrl-C in a terminal reaches the whole process group too: the worker leaves it to
    # its training process as it does SIGTERM (torch's worker ended its stream at it, so
    # a loop that took SIGINT as its cue to save met "worker exited unexpectedly"), and a
    # scheduler's early warning (Slurm's --signal=USR1@N), which ended a spawned worker
    # by its default action, is the training process's alone
    signal.signal(signal.SIGINT, on_term)
    for warning in _WARNING_SIGNALS:
        signal.signal(warning, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):  # blocked while the workers started
        signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD_AT_START)


def exit_with_parent(parent: int | None = None, interval_s: float = 1.0) -> None:
    """In a DataLoader worker: end this process as soon as its training process is gone.

    torch's worker notices a dead parent only between batches, and may then wait for
    ever in its exit path: its queue's feeder thread blocks writing to a pipe whose read
    end sibling workers still hold. A daemon thread polls and leaves with ``os._exit``
    instead; a worker holds nothing that must be saved (cache fills are atomic, as for a
    SIGKILL). ``parent`` is the pid of the training process, recorded before the workers
    start: a fork or spawn worker is its child, so a parent that died while this worker
    started is noticed too (torch's own watchdog records whatever parent the worker has
    once started); a forkserver worker is the fork server's child, and then both are
    watched: the training process by its pid, the fork server as the parent. Started
    once per process, together with :func:`join_queue_feeders` at exit.
    """
    import threading

    gone = _parent_gone(parent)

    if gone():
        os._exit(0)
    if any(t.name == _WATCH_THREAD for t in threading.enumerate()):
        return

    def watch() -> None:
        import time

        while True:
            time.sleep(interval_s)
            if gone():
                os._exit(0)

    threading.Thread(target=watch, name=_WATCH_THREAD, daemon=True).start()
    import atexit

    atexit.register(join_queue_feeders)


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (this user's or not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_FEEDER_THREAD = "QueueFeederThread"  # multiprocessing.Queue's sending thread


def join_queue_feeders(timeout_s: float = 5.0) -> None:
    """Wait (at most ``timeout_s``) for this process's queue feeder threads to finish.

    Run at exit of a DataLoader worker. torch's worker ends by closing its result queue
    without joining the queue's feeder, a daemon thread that may still be pickling a
    batch: sharing a tensor's storage drops the GIL inside torch's C++ code. A daemon
    thread that asks for the GIL back once the interpreter is finalizing is ended with
    ``pthread_exit``; unwinding that through C++ frames calls ``std::terminate``, and the
    worker dies of SIGABRT ("terminate called without an active exception"), which the
    DataLoader reports as a failed worker. atexit callbacks run before finalization, so
    joining the feeders here lets them finish first. A closed queue's feeder ends once
    its buffer is written; the bound covers a reader that stopped reading (torch's parent
    terminates a worker that has not exited after 5 s in any case). Worker processes
    made by ``fork`` leave with ``os._exit`` and never run this; ``spawn`` and
    ``forkserver`` workers do.
    """
    import threading
    import time

    deadline = time.monotonic() + timeout_s
    for thread in threading.enumerate():
        if thread.name == _FEEDER_THREAD and thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))


def leave_when_stopped(stopping: Any, wait_s: float = 0.2) -> None:
    """In a spawned DataLoader worker: at exit, once told to stop, do not wait on its queue.

    Registered after :func:`join_queue_feeders` (``atexit`` runs the last first). A worker
    told to stop (``stopping``, set by its training process before it stops the set) has
    nothing left that anyone will read. Its queue's feeder, blocked writing to a pipe its
    parent no longer reads, held each worker for the whole 5 s of that join (every stop
    of spawn workers mid-epoch, a preemption's grace included). So: the feeders get
    ``wait_s``; when they are done the exit goes on as any (every exit hook runs), and
    when one is still blocked the worker flushes its logging and output and leaves with
    ``os._exit(0)``, as a fork worker always does (exit hooks registered before this one,
    a user module's, do not run then).
    """
    import atexit

    def leave() -> None:
        if stopping is None or not stopping.value:
            return
        import threading

        join_queue_feeders(wait_s)
        if not any(t.name == _FEEDER_THREAD and t.is_alive() for t in threading.enumerate()):
            return
        import logging

        with contextlib.suppress(Exception):
            logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                if stream is not None:
                    stream.flush()
        os._exit(0)

    atexit.register(leave)


def in_worker() -> bool:
    """Whether the caller runs in a DataLoader worker process."""
    try:
        from torch.utils.data import get_worker_info
    except ImportError:
        return False
    return get_worker_info() is not None


def worker_context() -> tuple[int, int]:
    """``(worker, num_workers)`` of the calling DataLoader worker, ``(0, 1)`` outside one."""
    try:
        from torch.utils.data import get_worker_info
    except ImportError:
        return 0, 1
    info = get_worker_info()
    if info is None:
        return 0, 1
    return int(info.id), int(info.num_workers)


def detect_world(
    rank: int | None = None,
    world_size: int | None = None,
    *,
    environ: Mapping[str, str] | None = None,
) -> World:
    """The calling process's :class:`World`; explicit ``rank``/``world_size`` win.

    Order: the arguments, then ``torch.distributed``, then ``RANK``/``WORLD_SIZE`` from
    ``environ`` (default ``os.environ``), then rank 0 of 1.
    """
    if (rank is None) != (world_size is None):
        raise InvalidInputError("pass both rank and world_size, or neither")
    found: tuple[int, int] | None
    if rank is not None and world_size is not None:
        found = (rank, world_size)
    else:
        found = _distributed_rank() or _env_rank(os.environ if environ is None else environ)
    r, w = found or (0, 1)
    worker, workers = worker_context()
    return World(rank=r, world_size=w, worker=worker, num_workers=workers)
