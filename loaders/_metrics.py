"""Timing of the training loop's waits, and the counters gathered from reading processes.

Kept by the dataset object of the process that runs the training loop: it times the loop's
``next()`` calls (the *data stall* is the share of loop time spent there) and holds the
latest counter snapshot of each reading process of the current iteration.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from simstore.loaders._stats import LoaderStats, merge_counters, one_line, summarise

__all__ = ["Metrics", "timed"]

T = TypeVar("T")
log = logging.getLogger("simstore.loaders")


class Metrics:
    """Wait, busy and wall time of the loop, and reading counters, across iterations."""

    def __init__(self) -> None:
        self.wait_s = 0.0
        self.busy_s = 0.0
        self.seconds = 0.0
        self.first_batch_s: float | None = None
        self.epochs: list[int] = []
        self._done: dict[str, float] = {}
        self._live: dict[int, dict[str, float]] = {}

    def start(self, epoch: int) -> None:
        """A new iteration begins: fold the last one's counters into the totals."""
        self._done = merge_counters([self._done, *self._live.values()])
        self._live = {}
        if epoch not in self.epochs:
            self.epochs.append(epoch)

    def update(self, worker: int, counters: dict[str, float]) -> None:
        """The latest counter snapshot of one reading process of this iteration."""
        self._live[worker] = counters

    def counters(self) -> dict[str, float]:
        """All counters so far."""
        return merge_counters([self._done, *self._live.values()])

    def stats(self) -> LoaderStats:
        """The summary of everything so far."""
        return summarise(
            self.counters(),
            seconds=self.seconds,
            wait_s=self.wait_s,
            busy_s=self.busy_s,
            first_batch_s=self.first_batch_s,
        )


def timed(
    items: Iterator[T],
    metrics: Metrics,
    *,
    log_every_s: float | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Iterator[T]:
    """Yield ``items``, timing waits in ``next()`` and the loop body between them."""
    start = clock()
    last_yield: float | None = None
    last_log = start
    try:
        while True:
            t0 = clock()
            if last_yield is not None:
                metrics.busy_s += t0 - last_yield
            try:
                item = next(items)
            except StopIteration:
                return
            t1 = clock()
            metrics.wait_s += t1 - t0
            if metrics.first_batch_s is None:
                metrics.first_batch_s = t1 - start
            metrics.seconds += t1 - (last_yield if last_yield is not None else start)
            if log_every_s is not None and t1 - last_log >= log_every_s:
                log.info(one_line(metrics.stats()))
                last_log = t1
            last_yield = clock()
            yield item
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            close()
