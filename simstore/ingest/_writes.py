"""Where an ingest task's shard writes run: a writer thread, and the cores a task may use.

A task reads, hashes and summarises samples on its own thread; where the process has a
core to spare, the Zarr writer's adds and shard closes run behind it on one helper
thread (:class:`_WriterThread`, driven by ``_worker.TaskRunner``), and compressed chunks
are encoded side by side on the task's share of the cores (:func:`task_cores`).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import Any

from simstore._env import usable_cores
from simstore.sample import Sample

__all__ = ["HANDOFF_BYTES", "task_cores", "writer_thread_wanted"]


HANDOFF_BYTES = 1 << 20
"""Samples of at least this many bytes, all in memory, go to a writer that works in its
``add`` (``writes_in_add``, as the Zarr writer does) on the task's writer thread."""


def task_cores(running: int) -> int:
    """The cores each of ``running`` tasks run at once on this machine may count on."""
    return max(1, usable_cores() // max(1, running))


def writer_thread_wanted(workers: int) -> bool:
    """Whether a task's shard writes run on a thread of their own (:class:`_WriterThread`).

    Where each ingest process has a core to spare: with as many processes as cores the
    thread only adds its hand-offs (and a malloc arena) to cores already busy.
    """
    return task_cores(workers) >= 2


class _WriterThread:
    """Shard writers' adds and closes, run behind the reader on one helper thread.

    The Zarr writer does its work (CRC-32s, the shard's hash, the write system calls) in
    ``add``, and a shard's close writes its index and stores it; the task reads, hashes
    and summarises the next sample meanwhile, which the GIL allows as NumPy, xxhash, the
    statistics module and ``write`` release it. The work runs one item at a time in the
    order given, so a writer sees its samples as it would on the reading thread and
    writes the same bytes; once an item fails, the ones queued after it are dropped. A
    sample is held until its add is done: pooled arrays it views are not reused meanwhile.
    """

    def __init__(self, pool: ThreadPoolExecutor | None = None) -> None:
        self._pool = pool
        self._owned = pool is None
        """Whether the thread is this object's (else a pool of one thread that tasks run
        one after another share, see ``_engine``)."""
        self._pending: list[Future[None]] = []
        self._failed = False  # written and read on the helper thread only

    @property
    def pending(self) -> bool:
        """Whether work was queued and not yet waited for."""
        return bool(self._pending)

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        """Queue ``fn(*args)`` behind the work queued before it."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="simstore-shard-writer")
        self._pending.append(self._pool.submit(self._run, fn, args))

    def _run(self, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        if self._failed:
            return
        try:
            fn(*args)
        except BaseException:
            self._failed = True
            raise

    def wait(self, idle: Callable[[], bool] | None = None) -> None:
        """Wait for the queued work; raise what failed first.

        ``idle()``, while the work is not done, does a small piece of other work (see
        ``_ahead``) and says whether there is more; once it says no, this blocks.
        Work stays queued until it is done: an interrupt while waiting (Ctrl-C) leaves
        what still runs for :meth:`close` to wait for, so nothing is aborted under it.
        """
        while self._pending:
            first = self._pending[0]
            if idle is not None:
                while not first.done() and idle():
                    pass
            try:
                first.result()
            except BaseException:
                if first.done():  # its own error; what follows it is dropped (_run)
                    self._pending.pop(0)
                raise
            self._pending.pop(0)

    def close(self) -> None:
        """Wait for the queued work (errors dropped: the caller is failing) and stop.

        An interrupt while waiting is raised once the work is done.
        """
        interrupted: BaseException | None = None
        while self._pending:
            try:
                wait_futures(self._pending)
                break
            except KeyboardInterrupt as exc:
                interrupted = exc
        self._pending = []
        if self._pool is not None and self._owned:
            self._pool.shutdown(wait=True)
            self._pool = None
        if interrupted is not None:
            raise interrupted


def _add(writer: Any, sample: Sample, digest: str, size: int, position: int) -> None:
    ws = writer.add(sample, sample_hash=digest, size_bytes=size)
    if ws.position != position:  # the reading thread recorded the row at ``position``
        raise RuntimeError(
            f"shard writer put sample {sample.key!r} at position {ws.position}, not {position}"
        )
