"""How a loader's DataLoader workers start.

Their start method, the signals held back while they start (``HELD_AT_START``), and a
shutdown event with no lock. ``SimDataLoader``'s worker iterator
(``loaders/_workers.py``) uses these around torch's own start of the workers; they hold
no state of a loader.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import multiprocessing.queues
import os
import resource
import signal
import time
from collections.abc import Callable
from typing import Any

import torch
from simstore.loaders._corrupt import shortage
from simstore.loaders._world import HELD_AT_START
from torch._utils import ExceptionWrapper
from torch.utils.data import DataLoader, get_worker_info

from simstore.errors import InvalidInputError, SimstoreError, StorageError


def _start_method(loader: DataLoader[Any]) -> str:
    """How ``loader``'s workers start: ``fork``, ``spawn`` or ``forkserver``."""
    import multiprocessing

    ctx = loader.multiprocessing_context
    if ctx is not None:
        return str(ctx.get_start_method())
    # the default, without fixing it (the first of the methods is the platform's)
    return str(multiprocessing.get_start_method(allow_none=True)
               or multiprocessing.get_all_start_methods()[0])


class _FlagEvent:
    """The workers' shutdown event, as a flag in shared memory: no lock to die holding.

    Torch gives its workers one ``multiprocessing.Event``, whose ``is_set()`` takes a lock
    that every process shares; a worker killed (SIGKILL, the OOM killer) while it held it
    left the training process blocked for good the next time it asked, at the next
    epoch's start or at shutdown. Torch only sets the event and asks whether it is set;
    a byte written and read whole needs no lock.
    """

    def __init__(self, ctx: Any) -> None:
        self._flag = ctx.RawValue("b", 0)

    def is_set(self) -> bool:
        return bool(self._flag.value)

    def set(self) -> None:
        self._flag.value = 1

    def clear(self) -> None:
        self._flag.value = 0

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
        return True


class _ReportingQueue(multiprocessing.queues.Queue):  # type: ignore[type-arg]
    """A worker's queue that sends an error in place of a batch it cannot pickle.

    Python's queue pickles what is put on it in a feeder thread; one that does not pickle
    (a transform's result holding a lock, a file, an object that refuses) is printed and
    dropped there, and the training process waited for that batch for ever (torch's own
    loader does the same). The batch's place in the queue gets an error naming it, which
    the training process raises.
    """

    def _on_queue_feeder_error(self, e: Exception, obj: object) -> None:
        replacement = _unsendable(e, obj)
        if replacement is not None:
            with contextlib.suppress(ValueError):  # closed: the worker is stopping and
                self.put(replacement)                 # no one waits for the batch
            return
        multiprocessing.queues.Queue._on_queue_feeder_error(  # type: ignore[attr-defined]
            e, obj)  # Python's: print it


def _unsendable(e: Exception, obj: object) -> tuple[int, ExceptionWrapper] | None:
    """What a worker sends in place of its batch ``obj`` that did not pickle (``e``)."""
    if not (isinstance(obj, tuple) and len(obj) == 2 and isinstance(obj[0], int)
            and not isinstance(obj[1], ExceptionWrapper)):
        return None
    info = get_worker_info()
    worker = info.id if info is not None else "?"
    said = (str(e).strip().splitlines() or [""])[0]
    batch = obj[1][0] if isinstance(obj[1], tuple) and obj[1] else obj[1]
    keys = batch.get("__key__") if isinstance(batch, dict) else None
    which = (f"sample {keys!r}" if isinstance(keys, str)
             else f"the batch of samples {keys[0]!r}..." if isinstance(keys, list) and keys
             else f"batch {obj[0]}")
    short = shortage(e)  # out of descriptors or shared memory: not the batch's content
    error: SimstoreError = StorageError(
        f"DataLoader worker {worker}: {which} cannot be sent to the training process for "
        f"want of {short[0]} in the worker ({said}): {short[1]}"
    ) if short is not None else InvalidInputError(
        f"DataLoader worker {worker}: {which} cannot be sent to the training process "
        f"({type(e).__name__}: {said}): a transform's result must hold tensors, arrays, "
        "numbers, strings and objects that pickle"
    )
    return obj[0], ExceptionWrapper(  # type: ignore[no-untyped-call]
        (type(error), error, None), where=f"in DataLoader worker process {worker}")


DESCRIPTORS_FREE = 6
"""Descriptors a worker must have free to send a storage by descriptor: the storage's own
(torch's shared memory keeps one open), the duplicate that waits for the main process,
the connection the main process makes for it and its copy as a socket, and the server's
own socket and the temporary name it is made with."""


def _guarded_reduce_storage(reduce: Callable[[Any], Any], storage: Any) -> Any:
    """Torch's reduction of ``storage``; refused (``EMFILE``) where its descriptor cannot go.

    Torch sends a CPU storage's memory by descriptor: a duplicate waits in the standard
    library's descriptor server until the main process connects for it, and serving the
    connection takes two more. A server that cannot accept retries for ever, printing a
    traceback each time, and the main process waits for the batch with it. A storage the
    worker has no room to serve is refused before it goes out instead, which the queue
    turns into a one-line error in the main process (see :class:`_ReportingQueue`).
    """
    if (storage.device.type == "cpu" and storage.nbytes() > 0
            and torch.multiprocessing.get_sharing_strategy()  # type: ignore[no-untyped-call]
            == "file_descriptor"):
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        try:
            used = len(os.listdir("/proc/self/fd"))
        except OSError as exc:
            if exc.errno == errno.EMFILE:
                raise
            used = None  # no /proc: the limit cannot be read ahead
        if (used is not None and soft != resource.RLIM_INFINITY
                and soft - used < DESCRIPTORS_FREE):
            raise OSError(errno.EMFILE, f"{os.strerror(errno.EMFILE)}: {soft - used} of "
                          f"{soft} descriptors free, {DESCRIPTORS_FREE} needed to send a "
                          "tensor's shared memory")
    return reduce(storage)


def guard_descriptor_sends() -> None:
    """In a DataLoader worker: torch's storages pickle through ``_guarded_reduce_storage``.

    Every tensor torch sends by descriptor, in whatever container a collate put it, goes
    through the reduction of its untyped storage, once per storage and batch.
    """
    from multiprocessing.reduction import ForkingPickler

    reducers = ForkingPickler._extra_reducers  # type: ignore[attr-defined]
    current = reducers.get(torch.UntypedStorage)
    if current is None or isinstance(current, functools.partial):
        return  # torch's reductions not set up, or guarded already
    reducers[torch.UntypedStorage] = functools.partial(_guarded_reduce_storage, current)


_LOCKLESS: dict[type, type] = {}


def _lockless_context(given: Any, method: str) -> Any:
    """The start method's context with :class:`_FlagEvent` for ``Event()``, or None.

    None for a context of the caller's own class (it is left as it is).
    """
    import multiprocessing
    from multiprocessing import context as mp_context

    ctx = multiprocessing.get_context(method) if given is None else given
    base = type(ctx)
    if base not in (mp_context.ForkContext, mp_context.SpawnContext,
                    getattr(mp_context, "ForkServerContext", None)):
        return None
    cls = _LOCKLESS.get(base)
    if cls is None:
        cls = _LOCKLESS[base] = type(
            f"Lockless{base.__name__}", (base,),
            {"Event": lambda self: _FlagEvent(self),
             "Queue": lambda self, maxsize=0: _ReportingQueue(maxsize,
                                                              ctx=self.get_context())})
    return cls()


def _forks(loader: DataLoader[Any]) -> bool:
    """Whether ``loader``'s workers start by fork (they inherit mappings made before)."""
    return _start_method(loader) == "fork"


FORK_SERVER_PRELOAD = ("torch", "simstore.loaders")
"""What the fork server imports once, before it forks any worker. Each worker would
otherwise import them afresh after its fork: about 1 s of every epoch's first batch on
the build machines, as with spawned workers."""


def start_helpers(method: str) -> None:
    """Start what workers of ``method`` need started first, with this thread's mask.

    Workers that do not fork need ``multiprocessing``'s resource tracker, and
    ``forkserver`` ones the fork server, told to import ``FORK_SERVER_PRELOAD`` (the
    modules the caller preloads stay; a server already running keeps what it has).
    """
    if method == "fork":
        return
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    if method == "forkserver":
        from multiprocessing import forkserver

        server = getattr(forkserver, "_forkserver", None)
        _forget_inherited_server(server)
        modules = list(getattr(server, "_preload_modules", None) or ["__main__"])
        missing = [m for m in FORK_SERVER_PRELOAD if m not in modules]
        if missing:
            forkserver.set_forkserver_preload(modules + missing)
        forkserver.ensure_running()


def _forget_inherited_server(server: Any) -> None:
    """Forget a fork server this process inherited through ``os.fork()`` (its parent's).

    ``multiprocessing`` keeps the server's pid across a fork and then waits on it as on a
    child of its own: ``ChildProcessError`` in the forked process, at its first loader
    with fork-server workers. The forked process starts a server of its own instead (its
    copy of the parent's keep-alive descriptor closed: the parent's server stays).
    """
    pid = getattr(server, "_forkserver_pid", None)
    if pid is None or not hasattr(os, "waitid"):
        return
    try:  # WNOWAIT: a server of ours that has ended stays for multiprocessing to reap
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        return
    except ChildProcessError:
        pass
    alive = getattr(server, "_forkserver_alive_fd", None)
    if alive is not None:
        with contextlib.suppress(OSError):
            os.close(alive)
    server._forkserver_pid = None
    server._forkserver_address = None
    server._forkserver_alive_fd = None


def _block_sigterm(method: str) -> set[int | signal.Signals] | None:
    """Block ``HELD_AT_START`` in this thread; its mask before, or None where it cannot.

    The helpers of :func:`start_helpers` are started first: the resource tracker's start
    unblocks SIGTERM in the thread that starts it, and the fork server would keep the
    mask it started with for every process it forks.
    """
    if not hasattr(signal, "pthread_sigmask"):
        return None
    try:
        start_helpers(method)
        return signal.pthread_sigmask(signal.SIG_BLOCK, HELD_AT_START)
    except (OSError, ValueError):
        return None
