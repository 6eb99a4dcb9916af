"""The local engine: tasks in this process, or on a process pool (fork where safe, else spawn).

An engine takes the planned tasks and returns their results in plan order; it never
decides what is stored (the plan and the tasks do), so every engine gives the same shards.
The dask.distributed engine is in :mod:`simstore.ingest._dask`.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from simstore.errors import SimstoreError
from simstore.ingest._plugins import Plugins
from simstore.ingest._records import SourceFile, TaskContext, TaskResult
from simstore.ingest._worker import TaskRunner, run_task, warm_up

__all__ = ["EngineRun", "Report", "run_local"]

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
    if workers <= 1:
        out = [_run_here(ctx, task, plugins, report) for task in tasks]
        return EngineRun(out, "local", ctx.config.workers)
    results: list[TaskResult | None] = [None] * len(tasks)
    method = start_method(ctx.config.start_method)
    pool = cf.ProcessPoolExecutor(
        max_workers=workers - 1, mp_context=multiprocessing.get_context(method)
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
            results[i] = res
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
            results[mine[0]] = _run_here(ctx, mine[1], plugins, report)
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
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return EngineRun([r for r in results if r is not None], "process-pool", ctx.config.workers)


def _died(exc: BaseException) -> SimstoreError:
    return SimstoreError(
        f"an ingest worker process died ({exc}); out of memory? Lower "
        "--workers or --shard-size; a re-run resumes where this one stopped"
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
    first submit, before its own manager thread starts.
    """
    if chosen:
        return chosen
    if sys.platform.startswith("linux") and threading.active_count() == 1:
        return "fork"
    return "spawn"


def _run_here(
    ctx: TaskContext, task: Sequence[SourceFile], plugins: Plugins, report: Report
) -> TaskResult:
    """One task in this process, reporting progress file by file."""
    t0 = time.perf_counter()
    runner = TaskRunner(ctx, lambda src, s: report(int(src.completes_file), src.size, s), plugins)
    res = runner.run(task)
    res.seconds, res.worker = time.perf_counter() - t0, "local"
    return res
