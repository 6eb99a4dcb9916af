"""The local engine: tasks in this process, or on a process pool (fork where safe, else spawn).

An engine takes the planned tasks and returns their results in plan order; it never
decides what is stored (the plan and the tasks do), so every engine gives the same shards.
The dask.distributed engine is in :mod:`simstore.ingest._dask`.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import multiprocessing
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from simstore.errors import SimstoreError
from simstore.ingest._ahead import HashAhead
from simstore.ingest._plugins import Plugins
from simstore.ingest._records import ResultPacker, SourceFile, TaskContext, TaskResult
from simstore.ingest._sources import listed_here
from simstore.ingest._worker import TaskRunner, run_task, warm_up
from simstore.ingest._writes import writer_thread_wanted

__all__ = ["EngineRun", "Report", "exit_with_parent", "run_local"]

Report = Callable[[int, int, int], None]
"""Progress callback of an engine: files, source bytes and samples just finished."""


@dataclass(frozen=True, slots=True)
class EngineRun:
    """What an engine returns: task results in plan order, its name, the workers it used.

    A task that failed under ``on_error="skip"`` has a result whose files carry the error.
    """

    results: list[TaskResult]
    engine: str
    workers: int


def run_local(
    ctx: TaskContext,
    tasks: Sequence[Sequence[SourceFile]],
    plugins: Plugins,
    report: Report,
) -> EngineRun:
    """Run every task, in process or with a process pool; results in task order.

    With ``workers`` N > 1 the pool has N - 1 processes and this process is the Nth
    worker: it runs tasks from the same queue between collecting the pool's results. The
    pool's processes are forked when that is safe (:func:`start_method`), else spawned:
    a spawned worker needs about a second to start (a fresh interpreter importing numpy,
    pyarrow and the shard formats), so it gets tasks only once a probe says it started,
    while this process is already ingesting; a forked one starts in a few milliseconds
    and gets its tasks at once.
    """
    workers = min(ctx.config.workers, len(tasks))
    pack = ResultPacker()  # the results are kept until the driver stages them
    if workers <= 1:
        out = [pack(res) for res in _run_all_here(ctx, tasks, plugins, report)]
        # the workers it used: one (this process), however many were asked for
        return EngineRun(out, "local", 1)
    results: list[TaskResult | None] = [None] * len(tasks)
    method = start_method(ctx.config.start_method)
    pool = cf.ProcessPoolExecutor(
        max_workers=workers - 1,
        mp_context=multiprocessing.get_context(method),
        initializer=exit_with_parent,
        # a forkserver's processes are its children, not this process's
        initargs=(os.getpid(), method != "forkserver"),
    )
    # Tasks are handed out one at a time from one queue. A pool process gets its next task
    # from a callback on the pool's result thread the moment its last one is done (a
    # round trip of a millisecond or two), not when this process next looks up from a
    # task of its own; so no process holds a second task queued behind its current one,
    # and at the end no process waits with nothing to do while another still has two
    # tasks to run (with two workers that tail was up to two tasks, a quarter of an
    # ingest of 24 files when one process ran slow).
    lock = threading.Condition()
    queue = iter(enumerate(tasks))
    pending: dict[cf.Future[TaskResult], int] = {}
    probes: list[cf.Future[Any]] = []
    refused: list[RuntimeError] = []
    finished = 0
    stop = False

    def take() -> tuple[int, Sequence[SourceFile]] | None:
        with lock:
            return None if stop else next(queue, None)

    def feed(last: cf.Future[Any] | None = None) -> None:
        # on the pool's result thread (or here): the process that finished ``last`` takes
        # the next task; none after a failure, which this process raises when it collects
        if last is None or (not last.cancelled() and last.exception() is None):
            nxt = take()
            if nxt is not None:
                try:
                    fut = pool.submit(run_task, ctx, list(nxt[1]), plugins)
                except RuntimeError as exc:  # a broken pool, or one shut down after a failure
                    with lock:
                        refused.append(exc)  # the task is not lost: collect raises this
                        lock.notify_all()
                    return
                with lock:
                    pending[fut] = nxt[0]
                fut.add_done_callback(feed)
        with lock:
            lock.notify_all()

    def collect() -> None:
        # the pool's finished tasks, in this process; a failure is raised here
        nonlocal finished
        for probe in [p for p in probes if p.done()]:
            probes.remove(probe)
            probe.result()
        with lock:
            done = [f for f in pending if f.done()]
            lost = refused[:1]
        for fut in done:
            try:
                res = fut.result()
            except cf.process.BrokenProcessPool as exc:
                raise _died(exc) from exc
            with lock:
                i = pending.pop(fut)
            results[i] = pack(res)
            finished += 1
            report(
                sum(f.completes_file for f in tasks[i]),
                sum(f.size for f in tasks[i]),
                sum(len(f.rows) for f in res.files),
            )
        if lost:  # a task the pool would not take: the run cannot finish
            raise _died(lost[0]) from lost[0]

    try:
        if method == "fork":
            # a forked process starts in a few milliseconds with this one's imports: it
            # gets its first task at once (waiting for a probe left it idle through this
            # process's whole first task: two workers 1.04-1.30x faster without)
            for _ in range(workers - 1):
                feed()
        else:
            # a spawned one gets its first task once its probe says it has imported what
            # a task needs, so no task waits queued behind a start of about a second
            probes.extend(pool.submit(warm_up, plugins) for _ in range(workers - 1))
            for probe in probes:
                probe.add_done_callback(feed)
        while True:
            collect()
            mine = take()
            if mine is None:
                break
            results[mine[0]] = pack(_finished(_run_here(ctx, mine[1], plugins, report)))
            finished += 1
        while True:
            collect()
            if finished == len(tasks):
                break
            with lock:
                if not any(f.done() for f in pending):
                    lock.wait(timeout=1.0)
    except BaseException:
        with lock:
            stop = True
        try:
            pool.shutdown(wait=True, cancel_futures=True)
        except Exception:
            # a pool interrupted while it started (a Ctrl-C between forking its processes
            # and starting the thread that manages them) cannot shut down: its error must
            # not hide the one that stopped the run, nor its processes outlive the call
            _kill_processes(pool)
        raise
    pool.shutdown(wait=True)
    return EngineRun([r for r in results if r is not None], "process-pool", workers)


def _kill_processes(pool: cf.ProcessPoolExecutor) -> None:
    """End the processes of a pool whose own shutdown failed, and reap them."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    for proc in procs:
        with contextlib.suppress(Exception):
            proc.kill()
    for proc in procs:
        with contextlib.suppress(Exception):
            proc.join(timeout=10)


_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def exit_with_parent(parent: int, direct: bool = True, interval_s: float = 1.0) -> None:
    """Pool initializer: end this worker process as soon as the ingesting process dies.

    A pool process otherwise outlives a ``kill -9`` of the ingest for ever: it waits for
    its next task on the call queue's pipe, whose write end it and its siblings inherited
    with the fork, so no end of file ever comes (and it holds the dead ingest's stdout and
    stderr open, so a shell pipeline reading them never ends either). On Linux the kernel
    sends SIGKILL when the parent dies (``prctl(PR_SET_PDEATHSIG)``); elsewhere a daemon
    thread polls the parent's pid, as the loader's ``exit_with_parent`` does for
    DataLoader workers. Either way the worker leaves without cleanup, which loses
    nothing: a shard is stored whole or not at all, and journal records are hints.

    ``parent`` is the ingesting process's pid, taken before the fork: a parent that died
    between the fork and the ``prctl`` sends no signal (this process was re-parented
    already), and the check after it notices. ``direct=False`` (``forkserver``): this
    process is the fork server's child, and the fork server lives as long as its
    children do (each holds the pipe whose end of file would stop it), so a thread
    watches the ingesting process itself: it waits on a pidfd (Linux 5.3+), else polls.
    """
    # a forked worker inherits the command line's SIGTERM handler (an interrupt, for the
    # command's clean-up): a worker has nothing to clean up, and the interrupt, raised
    # while it waited for a task, printed multiprocessing's traceback
    from simstore._launch import is_command_handler

    if is_command_handler(signal.getsignal(signal.SIGTERM)):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if direct:
        armed = _parent_death_signal(signal.SIGKILL)
        if os.getppid() != parent:
            os._exit(0)
        if armed:
            return

        def reparented() -> None:
            while os.getppid() == parent:
                time.sleep(interval_s)

        wait = reparented
    else:
        wait = _waiter(parent, interval_s)

    def watch() -> None:
        wait()
        os._exit(0)

    threading.Thread(target=watch, name="simstore-ingest-parent-watch", daemon=True).start()


def _waiter(pid: int, interval_s: float) -> Callable[[], None]:
    """A function that returns once process ``pid`` (not this one's parent) has ended."""
    pidfd_open = getattr(os, "pidfd_open", None)
    fd: int | None = None
    if pidfd_open is not None:
        try:
            fd = int(pidfd_open(pid))
        except ProcessLookupError:  # gone already
            os._exit(0)
        except OSError:  # a kernel without pidfds
            fd = None

    def wait() -> None:
        if fd is not None:
            select.select([fd], [], [])  # readable once the process has exited
            return
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            except PermissionError:  # alive, as another user
                pass
            time.sleep(interval_s)

    return wait


def _parent_death_signal(sig: int) -> bool:
    """Ask Linux to send ``sig`` to this process when its parent dies; False elsewhere."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)) == 0
    except (OSError, AttributeError):  # no libc to call (a static or unusual build)
        return False


def _died(exc: BaseException) -> SimstoreError:
    return SimstoreError(
        f"an ingest worker process died ({exc}): out of memory (lower --workers or "
        "--shard-size) or a crash in a native library (the kernel log says which); a "
        "re-run resumes where this one stopped"
    )


def start_method(chosen: str | None = None) -> str:
    """How the pool starts processes: ``chosen``, else ``fork`` where safe, else ``spawn``.

    ``fork`` on Linux while this process runs no Python thread but the main one: a fork
    copies every lock in the state it had, and a lock another thread held then is never
    released in the child. Event loops (an S3 client's, zarr's) and thread pools started
    from Python are Python threads and make it ``spawn``. The native threads of libraries
    that prepare for a fork themselves (OpenBLAS's pool, which numpy starts on import;
    jemalloc's background thread; Arrow's thread pools) do not count, as they do not for
    PyTorch's DataLoader, which forks by default. The pool forks its processes on the
    first submit, before its own manager thread starts. Lance's runtime threads are the
    exception: they do not survive a fork, and a pool forked in a process that had
    written Lance shards (a notebook's second ingest) lost a worker to a crash in 1 run
    of 3 in an audit; such a process spawns.
    """
    if chosen:
        return chosen
    if sys.platform.startswith("linux") and threading.active_count() == 1:
        lance = sys.modules.get("simstore.formats._lance")  # not imported: not used
        if lance is None or not lance.used_here():
            return "fork"
    return "spawn"


def _run_here(
    ctx: TaskContext,
    task: Sequence[SourceFile],
    plugins: Plugins,
    report: Report,
    writer_pool: cf.ThreadPoolExecutor | None = None,
    ahead: HashAhead | None = None,
) -> TaskRunner:
    """One task read in this process, reporting progress file by file; ``finish`` it."""
    runner = TaskRunner(
        ctx,
        lambda src, s: report(int(src.completes_file), src.size, s),
        plugins,
        writer_pool=writer_pool,
    )
    runner.read(task, ahead)
    return runner


def _finished(runner: TaskRunner) -> TaskResult:
    res = runner.finish()
    res.seconds, res.worker = time.perf_counter() - runner.started, "local"
    return res


def _run_all_here(
    ctx: TaskContext, tasks: Sequence[Sequence[SourceFile]], plugins: Plugins, report: Report
) -> Iterator[TaskResult]:
    """Every task in this process, in order, each finished once the next one is read.

    Where the process has a core to spare, the tasks share one writer thread, and a
    task's last shard writes (and the check of its last file, which waits for them) run
    while the next task reads: with shards the size of a file or two, each task is
    otherwise a read and then a wait for its own writes. A task that fails still lets
    the one before it store and journal what it wrote, as when they ran one after another.
    The source hashes taken in the waits for the writer (``_ahead``) run across the
    tasks too: the next task's first file is hashed while this one's last writes finish.
    """
    if not writer_thread_wanted(ctx.config.workers):
        for task in tasks:
            yield _finished(_run_here(ctx, task, plugins, report))
        return
    ahead = HashAhead([f for task in tasks for f in task], listed_here(ctx.listed_on))
    with contextlib.closing(ahead), cf.ThreadPoolExecutor(
        1, thread_name_prefix="simstore-shard-writer"
    ) as pool:
        read: list[TaskRunner] = []  # read, not yet finished: at most two
        reading = False  # whether a failure came from a read (the runners left are earlier)
        try:
            for task in tasks:
                reading = True
                read.append(_run_here(ctx, task, plugins, report, pool, ahead))
                reading = False
                if len(read) == 2:
                    yield _finished(read.pop(0))
            while read:
                yield _finished(read.pop(0))
        except BaseException as exc:
            earlier: BaseException | None = None
            for runner in read:  # store and journal what it read, or abort it
                try:
                    _finished(runner)
                except BaseException as failed:
                    earlier = earlier or failed
            if reading and earlier is not None and not isinstance(exc, KeyboardInterrupt):
                # the task before failed too (its last file found changed, say): its error,
                # as when the tasks ran one after the other
                raise earlier from exc
            raise
