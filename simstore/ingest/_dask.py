"""The dask.distributed engine: ingest tasks on a cluster, one staged change on the driver.

The driver (this process) plans the tasks exactly as the local engine does and submits
each one to the scheduler at ``address`` (or to a ``LocalCluster`` it starts on
127.0.0.1). A worker unpickles the task's context, which holds the store as its URL and
options (never a live client: each worker process opens its own), runs the adapters and
shard writers, stores the shards under their ids, writes the journal, and returns the
manifest rows. The driver gathers them in plan order and stages and commits once, like
the local engine, so the content and the shard ids do not depend on the engine.

Why retries and duplicates are harmless: a task is a pure function of its files and
parameters, its shards are deterministic and stored with put-if-absent, and its journal
records are rewritten with the same bytes. So dask may rerun a task whose worker died, or
run it twice, and nothing is stored twice. Bad input (``SourceError``) is returned as a
value rather than raised, so dask does not retry it; other failures are retried
(``TASK_RETRIES``), and a task that still fails is either the run's error or, under
``on_error="skip"``, its files are listed as skipped with the reason.

A driver killed mid-way stages nothing (staging is its last step), so it leaves no
snapshot and no staging entry; its finished tasks are journaled, so a re-run reuses them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import CancelledError
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from simstore._env import env_debug
from simstore.catalog import STORE_META_KEY
from simstore.errors import InvalidInputError, SimstoreError, SourceError
from simstore.ingest._config import IngestConfig, printable_path, printable_text
from simstore.ingest._engine import EngineRun, Report
from simstore.ingest._plugins import Plugins
from simstore.ingest._records import (
    FileResult,
    ResultPacker,
    SourceFile,
    TaskContext,
    TaskResult,
)
from simstore.ingest._sources import SourceGone
from simstore.ingest._worker import TaskRunner
from simstore.ingest._writes import task_cores, writer_thread_wanted

__all__ = ["TASK_RETRIES", "TaskOutcome", "ingest_task", "quiet_dask_logs", "run_dask"]

TASK_RETRIES = 2
"""Extra attempts dask makes for a task that raised (a worker's death counts separately,
under the scheduler's ``distributed.scheduler.allowed-failures``)."""

_REFRESH_S = 5.0  # how often the driver re-reads the cluster's size (it may scale)
_STEP_S = 0.1  # the longest the driver waits for a result before it looks at the cluster
_WORKERS_EVERY_S = 1.0  # how often it asks the scheduler for the workers while it waits

NO_WORKERS_ENV = "SIMSTORE_DASK_NO_WORKERS_S"
NO_WORKERS_S = 60.0
"""How long the driver waits while a cluster that had workers has none before it fails the
run (``SIMSTORE_DASK_NO_WORKERS_S`` overrides it): its tasks would wait for ever."""


def no_workers_grace_s() -> float:
    """The grace period for a cluster without workers: the environment's, or 60 s."""
    text = os.environ.get(NO_WORKERS_ENV, "").strip()
    if not text:
        return NO_WORKERS_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise InvalidInputError(
            f"{NO_WORKERS_ENV}={text!r}: must be a number of seconds, 0 or more"
        )
    return value


class _NoWorkers:
    """Fails the run once the cluster, having had workers, has had none for ``grace_s``.

    Dask keeps a task whose workers all died waiting for a worker, for ever; so does the
    driver's wait for its result. The driver asks the scheduler for its workers about once
    a second while it waits; a cluster that gets a worker again within the grace period
    (a nanny restarting it, an adaptive cluster scaling up) goes on. Before the first
    worker joins nothing is timed: a batch queue may hold the workers' jobs for hours.
    """

    def __init__(self, client: Any, where: str, grace_s: float) -> None:
        self.client, self.where, self.grace_s = client, where, grace_s
        self.asked = -_WORKERS_EVERY_S
        self.none_since: float | None = None
        # asked once before the tasks go out: the first wait may come only after every
        # worker took a task and died (a busy driver), and must not take the empty
        # cluster it then finds for one whose workers have not joined yet
        self.had_workers = bool(client.nthreads())

    def check(self) -> None:
        now = time.monotonic()
        if now - self.asked < _WORKERS_EVERY_S:
            return
        self.asked = now
        if self.client.nthreads():
            self.none_since = None
            self.had_workers = True
            return
        if not self.had_workers:
            return  # none joined yet: queued jobs, not dead workers
        if self.none_since is None:
            self.none_since = now
        if now - self.none_since >= self.grace_s:
            raise SimstoreError(
                f"no dask workers at {self.where} for {self.grace_s:g} s (they died); a "
                "re-run resumes where this one stopped"
            )

_QUIET: ContextVar[bool | None] = ContextVar("simstore_quiet_dask_logs", default=None)
"""Set by :func:`quiet_dask_logs`: True (the command line), False (``--debug``), or None
(a library call: the logging of this process is its caller's)."""


def _distributed() -> Any:
    try:
        import distributed
    except ImportError as exc:
        raise ImportError(
            "the dask engine needs dask.distributed: pip install 'simstore[dask]'"
        ) from exc
    return distributed


@dataclass(frozen=True, slots=True)
class TaskOutcome:
    """What a dask task returns: its result, or the error that a retry cannot fix.

    ``error`` is a :class:`SourceError` (a bad file under ``on_error="fail"``) or an
    :class:`InvalidInputError` (the worker cannot see the store, or cannot find a source
    the driver listed); the driver raises it.
    """

    result: TaskResult | None
    error: SimstoreError | None = None


def _worker_threads() -> int:
    """How many tasks this dask worker runs at once (1 outside a worker)."""
    from distributed import get_worker

    try:
        return int(get_worker().state.nthreads)
    except (ValueError, AttributeError):
        return 1


def _worker_name() -> str:
    from distributed import get_worker

    try:
        return str(get_worker().address)
    except ValueError:  # not inside a dask worker (a test running the task directly)
        return f"pid {os.getpid()}"


def ingest_task(
    ctx: TaskContext,
    files: Sequence[SourceFile],
    plugins: Plugins,
    since: float | None = None,
) -> TaskOutcome:
    """Run one ingest task on a dask worker; pure in its arguments, safe to run twice.

    Checks first that this worker sees the store (a local store must sit on a filesystem
    every worker mounts at the same path, an object store needs credentials the worker
    has or that travel with the task). ``since``: when the run started (epoch seconds):
    shards and journal records stored after it are this run's, by an earlier attempt of
    this task (see :class:`TaskRunner`).
    """
    worker = _worker_name()
    t0 = time.perf_counter()
    try:
        seen = ctx.store.exists(STORE_META_KEY)
    except (SimstoreError, OSError) as exc:
        # no credentials, no route, access denied: the store is there, but not for this
        # worker (the driver opened it); a retry on the same worker would fail the same way
        reason = " ".join(str(exc).split()) or type(exc).__name__
        return TaskOutcome(
            None,
            InvalidInputError(
                f"dask worker {worker} cannot see the store {ctx.store.url}: {reason}; the "
                "workers need their own access to it (credentials, network) or storage "
                "options that grant it"
            ),
        )
    if not seen:
        return TaskOutcome(
            None,
            InvalidInputError(
                f"dask worker {worker} cannot see the store {ctx.store.url} (no "
                f"{STORE_META_KEY}): a local store must be on a filesystem every worker "
                "mounts at the same path; or use s3://bucket/prefix"
            ),
        )
    # a writer thread (and chunks compressed side by side) where the worker's task threads
    # leave cores spare, on the local cluster this run started (its processes counted): a
    # worker of another cluster does not know how many others share its machine
    running = max(_worker_threads(), ctx.config.workers)
    local = ctx.config.address is None
    try:
        result = TaskRunner(
            ctx,
            plugins=plugins,
            since=since,
            missing_fails=True,
            writer_thread=local and writer_thread_wanted(running),
            encode_threads=task_cores(running) if local else 1,
        ).run(files)
    except SourceGone as exc:
        # a file the driver listed is not there for this worker: the sources are not at
        # the same paths on every worker (or it was removed since): no bad file to skip
        return TaskOutcome(
            None,
            InvalidInputError(
                f"dask worker {worker} cannot find {printable_path(exc.path)}, a source the "
                "driver listed: the sources must be at the same paths on every worker (a "
                "shared filesystem mounted alike), and stay until the ingest ends"
            ),
        )
    except SourceError as exc:
        return TaskOutcome(None, exc)
    result.seconds = time.perf_counter() - t0
    result.worker = worker
    return TaskOutcome(result)


def _quiet_here() -> list[tuple[logging.Logger, int]]:
    """Raise every ``distributed`` logger of this process, and ``asyncio``'s, to CRITICAL.

    Returns their old levels. Loggers made later have no level of their own and take the
    ``distributed`` logger's. ``asyncio``'s: when the run stops because its workers died,
    the client's event loop may report a gather it no longer awaits ("Task exception was
    never retrieved ... AllExit") through it, before the run's one line.
    """
    saved = []
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger) and (
            name == "distributed" or name.startswith("distributed.")
        ):
            saved.append((logger, logger.level))
            logger.setLevel(logging.CRITICAL)
    loop_log = logging.getLogger("asyncio")
    saved.append((loop_log, loop_log.level))
    loop_log.setLevel(logging.CRITICAL)
    return saved


@contextlib.contextmanager
def quiet_dask_logs(quiet: bool = True) -> Iterator[None]:
    """Keep dask's own log lines off stderr during an ingest; restore them after.

    The command line's errors are one line: dask logs a traceback when the scheduler
    dies, and warnings from worker processes about tasks the run cancels, before the one
    line that says what happened. With ``quiet`` the ``distributed`` loggers of this
    process are raised to CRITICAL until the block ends, and a ``LocalCluster`` the
    engine starts quiets its worker processes too. ``quiet=False`` (``--debug``) leaves
    every log line, the cluster's included. Without this block (a library call), this
    process's logging is left as its caller set it.
    """
    token = _QUIET.set(quiet)
    saved: list[tuple[logging.Logger, int]] = []
    try:
        if quiet:
            _distributed()  # configures its loggers on import: quiet what that set up
            saved = _quiet_here()
        yield
    finally:
        for logger, level in saved:
            logger.setLevel(level)
        _QUIET.reset(token)


def _quiet_workers(client: Any) -> None:
    """Quiet the ``distributed`` loggers of the cluster's worker processes, now and later.

    A worker plugin, so a worker process its nanny restarts after a death is quiet too.
    """
    from distributed.diagnostics.plugin import WorkerPlugin

    class QuietLogs(WorkerPlugin):
        name = "simstore-quiet-logs"

        def setup(self, worker: Any) -> None:
            _quiet_here()

    client.register_plugin(QuietLogs())


@contextlib.contextmanager
def _client(cfg: IngestConfig) -> Iterator[Any]:
    """A client of the scheduler at ``cfg.address``, or of a LocalCluster on 127.0.0.1."""
    distributed = _distributed()
    if cfg.address is None:
        cluster = _local_cluster(distributed, cfg.workers)
        quiet = _QUIET.get()
        if quiet is None:  # a library call: this run's own processes are quiet
            quiet = not env_debug()
        try:
            with distributed.Client(cluster, set_as_default=False) as client:
                if quiet:
                    _quiet_workers(client)
                yield client
        finally:
            cluster.close()
        return
    _check_scheduler(cfg.address)
    try:
        client = distributed.Client(cfg.address, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as exc:
        raise InvalidInputError(
            f"cannot reach the dask scheduler at {cfg.address}: {type(exc).__name__}: {exc}"
        ) from exc
    with client:
        yield client


def _local_cluster(distributed: Any, workers: int) -> Any:
    """A LocalCluster of ``workers`` one-thread processes on 127.0.0.1, no dashboard.

    Loopback only and no dashboard: this cluster serves nobody but this process. The
    scheduler's HTTP server (health and metrics routes) still starts; it gets an ephemeral
    loopback port rather than 8787, which another cluster may hold.

    Interrupted while it starts (Ctrl-C), the half-built cluster is closed here, its own
    errors suppressed: left to distributed's exit handler, closing it would fail on the
    workers still starting and print a traceback after the run's one line.
    """
    # made in two steps so that a cluster interrupted inside its constructor is at hand
    cluster = distributed.LocalCluster.__new__(distributed.LocalCluster)
    try:
        cluster.__init__(
            host="127.0.0.1",
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
        )
    except BaseException:
        _close_partial(distributed, cluster)
        raise
    return cluster


def _close_partial(distributed: Any, cluster: Any) -> None:
    """Close a cluster whose start was cut short, silently, and forget it.

    Its workers may be starting still (their nannies spawning processes): each is let
    finish its start, then closed, since closing a worker that is starting fails, and a
    start given up logs its own traceback; then the cluster closes.
    """

    async def settle() -> None:
        async def stop(worker: Any) -> None:
            with contextlib.suppress(Exception):
                await worker  # its start, already under way: waited for, not repeated
            with contextlib.suppress(Exception):
                await worker.close()

        await asyncio.gather(*(stop(w) for w in list(getattr(cluster, "_created", ()))))

    with contextlib.suppress(BaseException):
        cluster.sync(settle, callback_timeout=30)
    with contextlib.suppress(BaseException):
        cluster.close(timeout=10)
    # a close that failed half-way leaves it for the exit handler to close again (and
    # fail again, loudly): it is closed as far as it can be
    with contextlib.suppress(BaseException):
        distributed.SpecCluster._instances.discard(cluster)


def _check_scheduler(address: str) -> None:
    """Refuse an address that is no dask scheduler, within dask's connect timeout.

    ``Client`` waits for ever on a port whose server accepts the connection but never
    answers dask's handshake (the dashboard's 8787 for the scheduler's 8786), and raises
    a bare ``ValueError`` on a malformed address. One ``identity`` call, bounded by
    ``distributed.comm.timeouts.connect``, tells a scheduler from anything else first. It
    runs on a thread of its own, so a caller with a running event loop (a notebook) can
    still ingest.
    """
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    import dask.config
    from dask.utils import parse_timedelta
    from distributed.core import rpc

    timeout_s = float(parse_timedelta(dask.config.get("distributed.comm.timeouts.connect")))

    async def identity() -> Any:
        remote = rpc(address, timeout=timeout_s)  # type: ignore[no-untyped-call]
        try:
            return await asyncio.wait_for(remote.identity(), timeout_s)
        finally:
            await remote.close_rpc()  # type: ignore[no-untyped-call]

    with ThreadPoolExecutor(1) as pool:
        try:
            found = pool.submit(asyncio.run, identity()).result()
        except (OSError, TimeoutError, ValueError) as exc:
            why = f"{type(exc).__name__}: {exc}" if str(exc) else (
                f"no answer to dask's handshake within {timeout_s:g} s (not a scheduler?)")
            raise InvalidInputError(f"cannot reach the dask scheduler at {address}: {why}") from exc
    kind = found.get("type") if isinstance(found, dict) else None
    if kind != "Scheduler":
        raise InvalidInputError(
            f"{address} is not a dask scheduler (it answers as {kind or 'something else'})"
        )


def _describe(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    if type(exc).__name__ == "KilledWorker":
        return f"its dask workers died running it (out of memory? a crash in a library?): {text}"
    return f"{type(exc).__name__}: {text}"


def _failed(i: int, task: Sequence[SourceFile], exc: BaseException) -> TaskResult:
    """The result of a task that failed for good, under ``on_error="skip"``."""
    reason = _describe(exc)
    files = [
        FileResult(
            path=f.path,
            key=f.key,
            size_bytes=f.size,
            error=printable_text(f"{f.path}: ingest task {i} failed on the dask cluster: {reason}"),
        )
        for f in task
    ]
    return TaskResult(files=files, shards={}, new_bytes=0, failed=True)


def _outcome(fut: Any, check: Callable[[], None]) -> tuple[Any, BaseException | None]:
    """A future's result or the error its task ended with, taken in steps.

    Between steps ``check`` looks at the cluster (it raises once no worker is left), so
    that a result lost with its worker after the task finished, which the scheduler
    computes again, cannot hold the driver for ever when no worker is left to do it.
    """
    step = _STEP_S
    while True:
        try:
            return fut.result(timeout=step), None
        except CancelledError:
            raise
        except Exception as exc:
            if fut.status == "error":
                return None, fut.exception()
            if not isinstance(exc, TimeoutError):
                raise
        check()
        step = min(2 * step, 2.0)  # a slow gather of a result still finishes in its step


def _collect(
    fut: Any, i: int, task: Sequence[SourceFile], cfg: IngestConfig, check: Callable[[], None]
) -> TaskResult:
    """The result of a finished future, or the run's error (``check`` as for _outcome)."""
    outcome: TaskOutcome | None
    try:
        outcome, exc = _outcome(fut, check)
    except CancelledError as cancelled:  # a restart of the scheduler
        raise SimstoreError(
            f"ingest task {i} was cancelled on the dask cluster (scheduler restarted?); "
            "a re-run resumes where this one stopped"
        ) from cancelled
    if exc is not None:
        if cfg.on_error == "skip":
            return _failed(i, task, exc)
        if isinstance(exc, SimstoreError):
            raise exc
        first = printable_path(task[0].path) if task else "-"
        raise SimstoreError(
            f"ingest task {i} ({len(task)} files from {first}) failed on the dask cluster: "
            f"{_describe(exc)}; a re-run resumes where this one stopped"
        ) from exc
    assert outcome is not None
    if outcome.error is not None:
        raise outcome.error
    assert outcome.result is not None
    return outcome.result


def run_dask(
    ctx: TaskContext,
    tasks: Sequence[Sequence[SourceFile]],
    plugins: Plugins,
    report: Report,
) -> EngineRun:
    """Run every task on a dask.distributed cluster; results in plan order.

    At most about four tasks per worker thread are in flight, so neither the scheduler
    nor the workers hold more than that many tasks' arguments and results; results are
    gathered as they finish and released on the cluster.
    """
    distributed = _distributed()
    cfg = ctx.config
    results: list[TaskResult | None] = [None] * len(tasks)
    pack = ResultPacker()  # the results are kept until the driver stages them
    run_id = uuid.uuid4().hex[:12]
    since = time.time()  # what tasks store from now on is this run's (new_bytes)
    grace_s = no_workers_grace_s()  # a bad setting is refused before a cluster starts
    with _client(cfg) as client:
        pending: dict[Any, int] = {}
        finished = distributed.as_completed(loop=client.loop)
        queue = iter(enumerate(tasks))
        limit, limit_at = 0, -_REFRESH_S

        def in_flight_limit() -> int:
            nonlocal limit, limit_at
            if time.monotonic() - limit_at >= _REFRESH_S:
                limit = max(8, 4 * sum(client.nthreads().values()))
                limit_at = time.monotonic()
            return limit

        def submit() -> None:
            cap = in_flight_limit()
            for i, task in queue:
                fut = client.submit(
                    ingest_task,
                    ctx,
                    list(task),
                    plugins,
                    since,
                    key=f"simstore-ingest-{run_id}-{i:07d}",
                    retries=TASK_RETRIES,
                )
                pending[fut] = i
                finished.add(fut)
                if len(pending) >= cap:
                    return

        where = cfg.address or getattr(client.scheduler, "address", None) or "the LocalCluster"
        watch = _NoWorkers(client, where, grace_s)

        def next_done() -> Any:
            """The next finished future; None once every one was; fails with no workers.

            Waits in steps, as ``as_completed`` does inside, so that a cluster whose
            workers all died (tasks that no worker will ever run) fails the run instead
            of waiting for ever.
            """
            cond = getattr(finished, "thread_condition", None)
            while not finished.has_ready():
                if finished.is_empty():
                    return None
                watch.check()
                if cond is None:
                    time.sleep(0.05)
                    continue
                with cond:
                    cond.wait(timeout=_STEP_S)
            return next(finished)

        try:
            submit()
            while (fut := next_done()) is not None:
                i = pending.pop(fut)
                res = _collect(fut, i, tasks[i], cfg, watch.check)
                del fut  # the cluster forgets the result once no future refers to it
                results[i] = pack(res)
                report(
                    sum(f.completes_file for f in tasks[i]),
                    sum(f.size for f in tasks[i]),
                    sum(len(f.rows) for f in res.files),
                )
                submit()
        except BaseException as exc:
            with contextlib.suppress(Exception):  # the scheduler may be gone
                client.cancel(list(pending))
            if isinstance(exc, OSError):  # a call to the scheduler whose connection closed
                where = cfg.address or "of the LocalCluster"
                raise SimstoreError(
                    f"lost the dask scheduler {where} mid-run ({_describe(exc)}; scheduler "
                    "restarted?); a re-run resumes where this one stopped"
                ) from exc
            raise
    done = [r for r in results if r is not None]
    return EngineRun(done, "dask", len({r.worker for r in done if not r.failed}))
