"""The local engine: tasks in this process, or on a spawn-started process pool.

An engine takes the planned tasks and returns their results in plan order; it never
decides what is stored (the plan and the tasks do), so every engine gives the same shards.
The dask.distributed engine is in :mod:`simstore.ingest._dask`.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from simstore.errors import SimstoreError
from simstore.ingest._plugins import Plugins
from simstore.ingest._records import SourceFile, TaskContext, TaskResult
from simstore.ingest._worker import TaskRunner, run_task

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
    """Run every task, in process or on a spawn-started process pool; results in task order."""
    workers = min(ctx.config.workers, len(tasks))
    if workers <= 1:
        out = []
        for task in tasks:
            t0 = time.perf_counter()
            res = TaskRunner(
                ctx, lambda src, s: report(int(src.completes_file), src.size, s), plugins
            ).run(task)
            res.seconds, res.worker = time.perf_counter() - t0, "local"
            out.append(res)
        return EngineRun(out, "local", ctx.config.workers)
    results: list[TaskResult | None] = [None] * len(tasks)
    # spawn, not fork: the parent may hold threads (zarr's event loop, a store's pool)
    pool = cf.ProcessPoolExecutor(
        max_workers=workers, mp_context=multiprocessing.get_context("spawn")
    )
    try:
        queue = iter(enumerate(tasks))
        pending: dict[cf.Future[TaskResult], int] = {}

        def submit() -> None:
            for i, task in queue:
                pending[pool.submit(run_task, ctx, list(task), plugins)] = i
                if len(pending) >= 2 * workers:
                    return

        submit()
        while pending:
            done, _ = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
            for fut in done:
                i = pending.pop(fut)
                try:
                    res = fut.result()
                except cf.process.BrokenProcessPool as exc:
                    raise SimstoreError(
                        f"an ingest worker process died ({exc}); out of memory? Lower "
                        "--workers or --shard-size; a re-run resumes where this one stopped"
                    ) from exc
                results[i] = res
                report(
                    sum(f.completes_file for f in tasks[i]),
                    sum(f.size for f in tasks[i]),
                    sum(len(f.rows) for f in res.files),
                )
            submit()
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return EngineRun([r for r in results if r is not None], "process-pool", ctx.config.workers)
