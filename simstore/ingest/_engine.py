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
    try:
        queue = iter(enumerate(tasks))
        pending: dict[cf.Future[TaskResult], int] = {}
        if method == "fork":
            # a forked process starts in a few milliseconds with this one's imports: it
            # gets its tasks at once (waiting for a probe left it idle through this
            # process's whole first task: two workers 1.04-1.30x faster without)
            probes: set[cf.Future[Any]] = set()
            ready = workers - 1
        else:
            # one probe per process: it returns once the process has imported what a
            # task needs; only started processes get tasks, so none waits queued behind
            # a start of about a second
            probes = {pool.submit(warm_up, plugins) for _ in range(workers - 1)}
            ready = 0

        def submit(depth: int = 2) -> None:
            # each started process has a next task queued behind its current one
            while len(pending) < depth * ready:
                nxt = next(queue, None)
                if nxt is None:
                    return
                pending[pool.submit(run_task, ctx, list(nxt[1]), plugins)] = nxt[0]

        def collect(timeout: float | None) -> None:
            nonlocal ready
            waiting: list[cf.Future[Any]] = [*pending, *probes]
            done, _ = cf.wait(waiting, timeout=timeout, return_when=cf.FIRST_COMPLETED)
            for fut in done:
                try:
                    res = fut.result()
                except cf.process.BrokenProcessPool as exc:
                    raise SimstoreError(
                        f"an ingest worker process died ({exc}); out of memory? Lower "
                        "--workers or --shard-size; a re-run resumes where this one stopped"
                    ) from exc
                if fut in probes:
                    probes.discard(fut)
                    ready += 1
                    continue
                i = pending.pop(fut)
                results[i] = res
                report(
                    sum(f.completes_file for f in tasks[i]),
                    sum(f.size for f in tasks[i]),
                    sum(len(f.rows) for f in res.files),
                )

        first = True
        while True:
            collect(0)
            submit(1 if first else 2)  # at first one each: this process takes the next
            first = False
            mine = next(queue, None)
            if mine is None:
                break
            results[mine[0]] = _run_here(ctx, mine[1], plugins, report)
        while pending:
            collect(None)
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return EngineRun([r for r in results if r is not None], "process-pool", ctx.config.workers)


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
