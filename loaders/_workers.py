"""The DataLoader's worker processes as ``SimDataLoader`` runs them.

Torch's worker iterator subclassed (:class:`_WorkersIter`): an epoch read to its end does
not wait for the workers' exits, a worker's error comes back as the library's one-line
error, and the workers still alive at the process's exit are stopped as an epoch's end
would stop them. Also what each worker runs first (:class:`_WorkerInit`) and how its
batches are tagged (:class:`_TaggingCollate`). The loader itself is in :mod:`._loader`.
"""

from __future__ import annotations

import atexit
import gc
import logging
import os
import re
import signal
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from simstore.loaders._dataset import Sample
from simstore.loaders._filerows import FdChannel
from simstore.loaders._streams import _FIRST_OUT, _Stream, _Tagged
from simstore.loaders._tensors import ReleaseTracker, remove_dead_process_files
from simstore.loaders._workerstart import (
    _block_sigterm,
    _lockless_context,
    _start_method,
    guard_descriptor_sends,
)
from simstore.loaders._world import (
    SIGTERM_GRACE_S,
    exit_with_parent,
    leave_sigterm_to_parent,
    leave_when_stopped,
)
from torch._utils import ExceptionWrapper
from torch.utils.data._utils.signal_handling import (  # type: ignore[attr-defined]
    _remove_worker_pids,
)
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

from simstore.errors import SimstoreError

_log = logging.getLogger(__name__)


def _close_channels(channels: Sequence[FdChannel]) -> None:
    for channel in channels:
        channel.close()


def _workers_stopped(ref: weakref.ref[Any], number: int = -1) -> bool:
    """Whether the workers of the iterator ``ref`` have stopped reading (or it is gone).

    For persistent workers, whether they have stopped reading its iteration ``number``:
    they have ended their streams, or acknowledged iteration ``number + 2`` (a worker
    closes an iteration's stream after it acknowledges the next, see ``RING``).
    """
    it = ref()
    if it is None or bool(getattr(it, "finished", True)):
        return True
    if number < 0:
        return False
    now = it._sim_number
    if now >= number + 2:
        return True
    # every worker has ended its stream and no batch of theirs waits to be delivered
    # (torch holds those that came out of order; a worker's end may overtake them)
    return (now == number and not any(getattr(it, "_workers_status", ()))
            and not any(len(info) == 2 for info in getattr(it, "_task_info", {}).values()))


def _dropped(tracker: ReleaseTracker, item: Any) -> None:
    """A batch that a new iteration dropped unread: its buffers are let go with it."""
    if isinstance(item, _Tagged):
        tracker.track(item.tag.worker, item.tag.marks, item.batch)


def _passthrough(item: _Tagged) -> _Tagged:
    return item


class _WorkerInit:
    """The workers' init function: freeze, tie the worker to this process, run the caller's.

    Freezing puts what the worker started with out of the garbage collector's sight. A
    forked worker inherits every object of this process (torch, NumPy, pyarrow: some
    hundreds of thousands); each full collection in the worker walked them all, about a
    tenth of the workers' CPU over repeated epochs of 4 MiB samples (``perf record``), and
    wrote to their pages, copying them. ``gc.freeze()`` moves them to the permanent generation,
    which collections skip (what Python's documentation advises for forked children); in
    a spawned worker it does the same for its imports. Objects made later are collected
    as usual.
    """

    def __init__(self, user: Callable[[int], None] | None) -> None:
        self.user = user
        self.parent_pid = os.getpid()
        self.stopping: Any = None
        """A shared byte the training process sets before it stops this set of workers
        (see ``leave_sigterm_to_parent``); given by each worker iterator as it starts."""
        self.first_out: Any = None
        """A shared byte worker 0 sets once its first batch is going out, the others
        waiting for it (see ``_BatchStream._items``); None: none wait."""

    def __call__(self, worker_id: int) -> None:
        _FIRST_OUT[0] = self.first_out
        gc.freeze()
        try:
            exit_with_parent(self.parent_pid)
        finally:
            # the signals held back at the start are released even when the watch thread
            # could not start: held, the SIGTERM that stops this worker waited for ever
            leave_sigterm_to_parent(self.parent_pid, stopping=self.stopping)
        leave_when_stopped(self.stopping)
        guard_descriptor_sends()
        if self.user is not None:
            self.user(worker_id)


class _TaggingCollate:
    """Collates the samples of a batch and keeps the tag of its last sample.

    With the warm copies of all its samples' tags (each sample's tag carries those found
    since the one before).
    """

    def __init__(self, collate: Callable[[list[Sample]], Any], batched: bool,
                 per_sample: bool = False) -> None:
        self.collate = collate
        self.batched = batched
        self.per_sample = per_sample
        """Without batching, the caller's ``collate_fn`` takes each sample, as torch's
        DataLoader calls it (the default collate leaves a sample as it is)."""

    def __call__(self, items: Any) -> _Tagged:
        if not self.batched:
            sample, tag = items
            return _Tagged(self.collate(sample) if self.per_sample else sample, tag)
        samples = [s for s, _ in items]
        tag = items[-1][1]
        warm = tuple(hit for _, t in items for hit in t.warm)
        return _Tagged(self.collate(samples), tag._replace(warm=warm) if warm else tag)


def _dead_workers(it: Any, wait_s: float = 0.5) -> list[int]:
    """Pids of ``it``'s workers that have exited (waiting up to ``wait_s`` for one to)."""
    workers = list(getattr(it, "_workers", ()))
    deadline = time.monotonic() + wait_s
    while True:
        dead = [w.pid for w in workers if not w.is_alive()]
        if dead or time.monotonic() >= deadline:
            return dead
        time.sleep(0.01)


_DEATH_ADVICE = {
    signal.SIGKILL: "which nothing in the loader sends and the kernel's out-of-memory "
                    "killer does (dmesg or the container's events say so): lower "
                    "num_workers or prefetch=, or give the job more memory",
    signal.SIGBUS: "which a batch in a full /dev/shm raises: give /dev/shm more room (a "
                   "container's --shm-size) or lower prefetch or num_workers",
    signal.SIGSEGV: "a crash in native code (a transform's library, a reader): run with "
                    "num_workers=0 to see where",
}
"""What a worker's death by each signal most likely means, and what to do."""


def _how_workers_died(it: Any) -> str | None:
    """How each of ``it``'s dead workers ended, and what to do; None when none has.

    Torch says only that a worker "exited unexpectedly" (and, from its SIGCHLD check,
    the signal's name): a worker ended by the kernel's out-of-memory killer said nothing
    of memory. The ``/dev/shm`` files torch left for a killed worker are removed.
    """
    told = []
    for number, worker in enumerate(getattr(it, "_workers", ())):
        code = worker.exitcode
        if code is None:  # alive
            continue
        if code < 0:  # killed: torch's file of a batch it was making may be left
            remove_dead_process_files(worker.pid)
        advice: str | None
        if code == 0:
            how, advice = "exited with code 0", (
                f"which a worker does {SIGTERM_GRACE_S:.0f} s after a SIGTERM that its "
                "training process outlived, or when a transform calls sys.exit()")
        elif code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            how = f"was killed by {name}"
            advice = _DEATH_ADVICE.get(-code)
        else:
            how, advice = f"exited with code {code}", (
                "after printing its own error on standard error, if it had one (a spawned "
                "worker fails so when the script starts its loader outside `if __name__ "
                "== '__main__':`); num_workers=0 raises it here")
        said = f"DataLoader worker {number} (pid {worker.pid}) exited unexpectedly: it {how}"
        told.append(f"{said}, {advice}" if advice else said)
    return "; ".join(told) or None


_TORCH_DEATH = re.compile(r"DataLoader worker \(pid (\d+)\)")


def _name_deaths_in_sigchld() -> None:
    """Once torch's SIGCHLD check is set, have its error name the worker as ``next()`` does.

    The check raises "DataLoader worker (pid N) is killed by signal: Killed." wherever
    the training process is when a worker dies, most often in its own step, outside the
    loader: the handler that wraps it raises :func:`_how_workers_died`'s words instead
    (and so removes what torch left for that worker). Set once per process, from the
    main thread only, as torch's own.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    torch_check = signal.getsignal(signal.SIGCHLD)
    if not callable(torch_check) or getattr(torch_check, "simstore", False):
        return

    def check(signum: int, frame: Any) -> None:
        try:
            torch_check(signum, frame)
        except RuntimeError as exc:
            told = _deaths_by_pid(exc)
            if told is None:
                raise
            raise RuntimeError(told) from exc

    check.simstore = True  # type: ignore[attr-defined]
    signal.signal(signal.SIGCHLD, check)


def _deaths_by_pid(exc: RuntimeError) -> str | None:
    """:func:`_how_workers_died` for the worker set of the pid torch's error names."""
    found = _TORCH_DEATH.match(str(exc))
    if found is None:
        return None
    pid = int(found.group(1))
    try:  # no lock: this runs in a signal handler, maybe while the lock is held
        running = list(_RUNNING)
    except RuntimeError:  # the set changed while it was copied
        return None
    for it in running:
        if getattr(it, "_shutdown", True):
            continue  # stopped: its workers' pids may be another set's now
        for worker in getattr(it, "_workers", ()):
            popen = getattr(worker, "_popen", None)
            # a death torch's check found is not yet reaped (it waits with WNOWAIT): a
            # worker of this pid reaped long ago is another that had it before
            if worker.pid == pid and popen is not None and popen.returncode is None:
                return _how_workers_died(it)
    return None


def _death_of_workers(it: Any, exc: BaseException) -> str | None:
    """:func:`_how_workers_died` when ``exc`` is torch's word that a worker died.

    Read before the workers are shut down: the shutdown ends the others with SIGTERM.
    """
    if isinstance(exc, RuntimeError) and str(exc).startswith("DataLoader worker (pid"):
        return _how_workers_died(it)
    return None


_RUNNING: weakref.WeakSet[_WorkersIter] = weakref.WeakSet()
"""The worker sets of this process not yet collected (stopped at its exit)."""
_RUNNING_LOCK = threading.Lock()
_AT_EXIT: list[int] = [0]
"""The process (pid) whose exit hooks are registered: a forked child registers its own."""

_EXIT_PRIORITY = 1000
"""Where the stop runs among multiprocessing's exit finalizers: first, before the
queues' own finalizers and before the daemonic children are terminated."""


def _stop_workers_at_exit() -> None:
    """At exit: stop the workers still alive, as the end of an epoch would.

    Persistent workers, and those of an iterator still referenced (a loop at a script's
    top level left by ``sys.exit``). Left alone, multiprocessing's own exit hook
    (registered before this one, so run after it) terminates them with SIGTERM: a spawned
    worker then never runs its exit handlers, and leaves, for one, the ``pymp-*`` folder
    of the listener through which it shared its batches' memory; and a worker outlives a
    SIGTERM while its training process runs (``leave_sigterm_to_parent``), which that
    hook's join would wait out.
    """
    with _RUNNING_LOCK:
        # a process forked from the one that started them (os.fork, then sys.exit) does not
        # own them: stopping them would stop that process's workers
        running = [it for it in _RUNNING if it._sim_owner == os.getpid()]
    for it in running:
        try:
            it._shutdown_workers()
            reaper = it._sim_reaper
            if reaper is not None and reaper is not threading.current_thread():
                # an epoch read to its end: its workers are leaving, joined on the reaper;
                # a process started by multiprocessing (a rank of ``mp.spawn``) runs the
                # hook that terminates them before it waits for that thread, and a worker
                # that SIGTERM met in its interpreter's teardown died of it, which torch's
                # SIGCHLD check raised: the rank exited 1
                reaper.join()
        except Exception as exc:  # at exit: stop the others all the same
            _log.debug("stopping workers at exit: %s", exc)


def _register_exit_hooks() -> None:
    """Stop this process's workers at its exit, both ways a Python process exits.

    ``atexit`` for a process the interpreter ends (it runs before multiprocessing's own
    hook, registered earlier); a multiprocessing finalizer for a process that
    multiprocessing started (a rank of ``mp.spawn``), which leaves through ``os._exit``
    with no ``atexit`` at all, after its exit function has terminated its daemonic
    children: the finalizer runs first in that function. Called under ``_RUNNING_LOCK``.
    """
    if _AT_EXIT[0] == os.getpid():
        return
    from multiprocessing import util

    atexit.register(_stop_workers_at_exit)
    util.Finalize(None, _stop_workers_at_exit, exitpriority=_EXIT_PRIORITY)
    _AT_EXIT[0] = os.getpid()


class _WorkersIter(_MultiProcessingDataLoaderIter):
    """Torch's worker iterator, except that an epoch read to its end does not wait for exits.

    Once every worker has reported its stream exhausted (after its last batch and its
    shards' final hash checks), torch stops the workers before it ends the epoch: it
    tells each to exit and joins it, and a forked worker's exit unmaps the address space
    it inherited, 9-16 ms after the last batch here (2 workers) with nothing left to
    deliver. Those joins run on a thread instead, so the epoch ends at once; a later
    shutdown call (the iterator collected) finds that thread's work done or under way.
    An epoch cut short (a break, an error) shuts down as torch does: its workers may
    still be writing.

    An error raised out of the epoch stops the workers before it leaves: its traceback
    holds this iterator in a reference cycle, and the garbage collector runs the queues'
    finalizers (which unlink their semaphores) before the iterator's own, so a worker
    still starting up would die on a missing semaphore and torch's SIGCHLD check would
    raise that inside whatever code the collection interrupted.
    """

    _sim_reaper: threading.Thread | None = None

    def __init__(self, loader: Any) -> None:
        # SIGTERM blocked while the workers start: a worker inherits the mask, through the
        # exec of a spawned one too, and unblocks it once its handler is in place
        # (leave_sigterm_to_parent), so a job's SIGTERM in the second or so a spawned
        # worker spends importing torch does not kill it; here it waits, not lost
        method = _start_method(loader)
        self._sim_stopping: Any = None
        self._sim_first_out: Any = None
        init = getattr(loader, "worker_init_fn", None)
        if isinstance(init, _WorkerInit):
            import multiprocessing

            context = multiprocessing.get_context(method)
            self._sim_stopping = init.stopping = context.RawValue("b", 0)
            # worker 0's first batch first, on a local dataset (a remote one's first batch
            # waits on the network, not on the cores: there the workers' fetches overlap)
            local = all(t == "local" for t in loader.sim_dataset._tiers())
            init.first_out = (context.RawValue("b", 0)
                              if loader.num_workers > 1 and local else None)
            self._sim_first_out = init.first_out
        blocked = _block_sigterm(method)
        given = loader.multiprocessing_context
        lockless = _lockless_context(given, method)
        try:
            if lockless is not None:
                loader.multiprocessing_context = lockless
            super().__init__(loader)
            if blocked is not None:
                # a Ctrl-C held back while the workers started is raised here, where the
                # workers it would leave serving are stopped (below)
                mask, blocked = blocked, None
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        except BaseException:
            self._stop_after_failed_start()
            raise
        finally:
            if lockless is not None:
                loader.multiprocessing_context = given
            if blocked is not None:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        self._sim_owner = os.getpid()
        with _RUNNING_LOCK:
            _RUNNING.add(self)
            _register_exit_hooks()
        _name_deaths_in_sigchld()

    def _stop_after_failed_start(self) -> None:
        """Stop the workers torch's ``__init__`` started before it failed.

        A Ctrl-C (or any error) while torch starts the workers or primes their index
        queues leaves the iterator half made: never returned, never in ``_RUNNING``, its
        workers serving. Left to the exit, multiprocessing's hook sends them SIGTERM,
        which a worker outlives for ``SIGTERM_GRACE_S`` while this process runs, and
        joins them: the interrupted script hung 30 s before it exited. Marked as
        stopping, a worker of this set that is still starting (not yet in ``_workers``)
        ends at once at that SIGTERM too.
        """
        self._mark_stopping()
        if not getattr(self, "_workers", None):
            return
        if not hasattr(self, "_workers_status"):  # failed before torch's first _reset
            self._workers_status = [True] * len(self._workers)
        try:
            self._shutdown_workers()
        except Exception as exc:  # the error being raised says more than this one
            _log.debug("stopping the workers of an iterator that failed to start: %s", exc)

    _sim_number = -1
    """With persistent workers: the number of the iteration under way (see ``_Stream``)."""
    _sim_dropped: Callable[[Any], None] | None = None
    """Called with each item of an earlier iteration that a new one drops unread."""
    _sim_draining = False

    def _reset(self, loader: Any, first_iter: bool = False) -> None:
        """Torch's, sending persistent workers their share of the new iteration first.

        The batches of the last iteration still on their way (torch drops those it
        receives while the workers acknowledge the reset, and those it held out of
        order) go to ``_sim_dropped``: their shared buffers must be released.
        """
        stream = getattr(loader, "_stream", None)
        if isinstance(stream, _Stream) and stream.announcements is not None:
            self._sim_number = stream.announce()
        if first_iter:
            super()._reset(loader, first_iter)
            return
        if self._sim_dropped is not None:
            for info in getattr(self, "_task_info", {}).values():
                if len(info) == 2:
                    self._sim_dropped(info[1])
        self._sim_draining = True
        try:
            super()._reset(loader, first_iter)
        except BaseException as exc:
            # a worker died between iterations (torch's wait for the acknowledgements
            # says so): stop the set, so the next iteration starts a new one
            died = _death_of_workers(self, exc)
            try:
                self._shutdown_workers()
            except Exception as stop:  # the error being raised says more than this one
                _log.debug("stopping the workers after a failed reset: %s", stop)
            if died:
                raise RuntimeError(died) from exc
            raise
        finally:
            self._sim_draining = False

    def _get_data(self) -> Any:
        got = super()._get_data()  # type: ignore[no-untyped-call]
        if self._sim_draining and self._sim_dropped is not None:
            self._sim_dropped(got[1])
        return got

    def _process_data(self, data: Any, worker_idx: int) -> Any:
        """Torch's, except that a worker's simstore error comes out as it was raised.

        Torch re-raises a worker's exception as a new one of the same class whose message
        is ``Caught StorageError in DataLoader worker process 0.`` and the worker's whole
        traceback. For the errors of :mod:`simstore.errors`, whose message is what a user
        (and the CLI) shows, that is raised again with the worker's own message, chained
        from torch's exception: the worker's traceback stays reachable as ``__cause__``.
        """
        try:
            return super()._process_data(data, worker_idx)  # type: ignore[no-untyped-call]
        except SimstoreError as exc:
            if not isinstance(data, ExceptionWrapper):
                raise
            own = _worker_error(data)
            if own is None:
                raise
            raise own from exc

    def _next_data(self) -> Any:
        try:
            return super()._next_data()  # type: ignore[no-untyped-call]
        except StopIteration:
            raise
        except BaseException as exc:
            # a worker killed while its batch's storage was being fetched by descriptor
            # surfaces as the sharer's broken connection, naming no worker (torch names
            # the dead only once it sees them gone): say which died, as torch does
            dead = _dead_workers(self) if isinstance(exc, ConnectionError | EOFError) else []
            died = _how_workers_died(self) if dead else _death_of_workers(self, exc)
            try:
                self._shutdown_workers()
            except Exception as stop:  # the error being raised says more than this one
                _log.debug("stopping the workers after an error: %s", stop)
            if dead:
                raise RuntimeError(
                    f"DataLoader worker (pid(s) {', '.join(map(str, dead))}) exited "
                    f"unexpectedly while a batch was being received ({exc!r})"
                    + (f": {died}" if died else "")
                ) from exc
            if died:
                raise RuntimeError(died) from exc
            raise

    def __del__(self) -> None:
        try:
            self._shutdown_workers()
        except RuntimeError as exc:
            # torch's SIGCHLD check: a worker of an iterator no one reads any more died
            # while it was being stopped (torch's shutdown has stopped the others)
            _log.debug("stopping a collected iterator's workers: %s", exc)

    def _mark_stopping(self) -> None:
        """Tell this set's workers that it is being stopped, through their shared bytes.

        A SIGTERM from here on is this process's (``terminate()``), and the workers still
        waiting for worker 0's first batch stop waiting: one that never sends it (its
        ``worker_init_fn`` raised, it was killed) would hold each of them, and so the
        shutdown's joins and the error it precedes, for ``FIRST_BATCH_WAIT_S``. (Read with
        ``getattr``: torch may stop an iterator whose ``__init__`` never got that far.)
        """
        for flag in (getattr(self, "_sim_stopping", None),
                     getattr(self, "_sim_first_out", None)):
            if flag is not None:
                flag.value = 1

    def _shutdown_workers(self) -> None:
        self._mark_stopping()
        if self._sim_reaper is not None:
            return  # the reaper does it (and holds this iterator until it has)
        if not hasattr(self, "_shutdown"):
            return  # torch's __init__ failed before it started any worker
        status = getattr(self, "_workers_status", None)
        if (getattr(self, "_shutdown", True) or getattr(self, "_persistent_workers", True)
                or status is None or any(status)):
            super()._shutdown_workers()
            return
        if getattr(self, "_worker_pids_set", False):
            # every worker has ended its stream and every batch was received: how a
            # worker ends now is no error of this epoch (torch's SIGCHLD check raised a
            # job's SIGTERM to its process group meeting a leaving spawn worker in the
            # next epoch's first batch, before the loop could save its state)
            _remove_worker_pids(id(self))
            self._worker_pids_set = False
        # not a daemon: the interpreter waits for it at exit (a daemon thread stopped
        # inside torch's shutdown aborts the process)
        reaper = threading.Thread(target=super()._shutdown_workers,
                                  name="simstore-reap-workers", daemon=False)
        self._sim_reaper = reaper
        reaper.start()

    @property
    def finished(self) -> bool:
        """Whether every worker has ended its stream (so none writes into its arena)."""
        return self._sim_reaper is not None or bool(getattr(self, "_shutdown", True))


def _worker_error(wrapper: ExceptionWrapper) -> SimstoreError | None:
    """The simstore error a worker raised, rebuilt from torch's wrapper of it, or None.

    The wrapper keeps the exception's class (``exc_type``) and its formatted traceback
    (``exc_msg``), which ends with the line ``simstore.errors.StorageError: <message>``
    and then the exception's notes, a line each (a transform's error names its sample in
    one): the message is what follows the class's name on the last line it starts, one
    line as every simstore error's is, and the lines after it are notes again.
    """
    cls = wrapper.exc_type
    if not (isinstance(cls, type) and issubclass(cls, SimstoreError)):
        return None
    name = cls.__qualname__
    if cls.__module__ not in ("__main__", "builtins"):
        name = f"{cls.__module__}.{name}"
    text = str(wrapper.exc_msg)
    lines = text.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        line = lines[i]
        if line == name or line.startswith(name + ": "):
            try:
                error = cls(line[len(name) + 2 :])
            except Exception:  # a subclass that takes other arguments: keep torch's
                return None
            for note in lines[i + 1 :]:
                if note.strip():
                    error.add_note(note)
            return error
    return None
