"""Timing of the training loop's waits, and the counters gathered from reading processes.

Kept by the dataset object of the process that runs the training loop: it times the loop's
``next()`` calls (the *data stall* is the share of loop time spent there) and holds the
latest counter snapshot of each reading process of the current iteration.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from simstore.loaders._stats import (
    DELIVERY_FIELDS,
    LoaderStats,
    merge_counters,
    one_line,
    summarise,
)

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
        self.logged_at: float | None = None
        """When :func:`timed` last logged a line (its clock), across iterations: a job of
        epochs each shorter than ``log_every_s`` logged none, as each began afresh."""
        self.epochs: list[int] = []
        """Epochs a batch was delivered from (an iteration that delivered nothing, such
        as a resume from the end of an epoch, read no epoch)."""
        self._epoch: int | None = None
        self._done: dict[str, float] = {}
        self._live: dict[int, dict[str, float]] = {}
        self._reading: dict[int, Callable[[], Mapping[str, float]]] = {}
        self._stopped: Callable[[], bool] = _always
        self._earlier: list[_Iteration] = []
        """Earlier iterations whose readers may still be reading (a DataLoader iterator
        left alive while a new one started): watched until they stop."""

    def __getstate__(self) -> dict[str, Any]:
        """What a spawned worker gets with its dataset: the totals, no watchers.

        The watchers hold this process's iterators by weak reference (which cannot be
        pickled: a second iteration started while the first was alive failed to start
        its spawned workers) and read this process's ledgers; a worker has no use for them.
        """
        state = dict(self.__dict__)
        state.update(_reading={}, _stopped=_always, _earlier=[])
        return state

    def start(self, epoch: int) -> dict[int, dict[str, float]]:
        """A new iteration begins: the last one's counters are kept with the totals.

        An earlier iteration whose readers have stopped is folded into the totals (its
        counters are final); one whose readers still run (an iterator left alive, its
        workers reading ahead) stays watched, so what they read is still counted.
        Returns the new iteration's mapping of its readers' latest counters, which
        ``update`` fills (and the caller may fill for the iteration itself).
        """
        self._earlier.append(_Iteration(self._live, self._reading, self._stopped))
        still = []
        for it in self._earlier:
            if it.stopped():
                self._done = merge_counters([self._done, *it.counters()])
            else:
                still.append(it)
        self._earlier = still
        self._live = {}
        self._reading = {}
        self._stopped = _always
        self._epoch = epoch
        return self._live

    def delivered(self) -> None:
        """The current iteration delivered a batch: its epoch is one this run read."""
        if self._epoch is not None and self._epoch not in self.epochs:
            self.epochs.append(self._epoch)

    def update(self, worker: int, counters: dict[str, float]) -> None:
        """The latest counter snapshot of one reading process of this iteration."""
        self._live[worker] = counters

    def watch(self, worker: int, read: Callable[[], Mapping[str, float]]) -> None:
        """Read ``worker``'s counters as they are now with ``read``.

        For the reading work it did after its last delivered batch, which no batch
        carries (see :data:`~simstore.loaders._stats.DELIVERY_FIELDS`).
        """
        self._reading[worker] = read

    def until(self, stopped: Callable[[], bool]) -> None:
        """This iteration's readers have stopped once ``stopped()`` says so.

        Until then a later iteration keeps reading their counters (by default an
        iteration's readers stop when the next one starts: one process reading).
        """
        self._stopped = stopped

    def _current(self) -> list[dict[str, float]]:
        """This iteration's counters and those of earlier ones still reading."""
        now = _Iteration(self._live, self._reading, self._stopped)
        return [c for it in (*self._earlier, now) for c in it.counters()]

    def counters(self) -> dict[str, float]:
        """All counters so far."""
        return merge_counters([self._done, *self._current()])

    def stats(self) -> LoaderStats:
        """The summary of everything so far."""
        return summarise(
            self.counters(),
            seconds=self.seconds,
            wait_s=self.wait_s,
            busy_s=self.busy_s,
            first_batch_s=self.first_batch_s,
        )


def _always() -> bool:
    return True


@dataclass(frozen=True, slots=True)
class _Iteration:
    """One iteration's counters: what batches carried, and its readers' own counts."""

    live: dict[int, dict[str, float]]
    reading: dict[int, Callable[[], Mapping[str, float]]]
    stopped: Callable[[], bool]

    def counters(self) -> list[dict[str, float]]:
        """One mapping per reading process.

        What its last batch carried, with the reading counters brought up to what the
        process has done since.
        """
        out = []
        for worker in sorted(set(self.live) | set(self.reading)):
            merged = dict(self.live.get(worker, {}))
            read = self.reading.get(worker)
            if read is not None:
                for key, value in read().items():
                    if key not in DELIVERY_FIELDS:
                        merged[key] = max(merged.get(key, 0), value)
            out.append(merged)
        return out


@dataclass(frozen=True, slots=True)
class Delivery:
    """An item and how to count it as delivered, for :func:`timed` to do last.

    A checkpoint must count a batch only once the loop has it: a count made before the
    bookkeeping that precedes the ``yield`` (release tracking, metrics, a log line) was
    lost with the batch when a KeyboardInterrupt landed in between, and a state saved in
    the handler skipped that batch on resume. Counted right before the ``yield``, the
    window is the one bytecode between them.
    """

    value: Any
    count: Callable[[], None]


def timed(
    items: Iterator[Any],
    metrics: Metrics,
    *,
    log_every_s: float | None = None,
    clock: Callable[[], float] = time.perf_counter,
    started: float | None = None,
) -> Iterator[Any]:
    """Yield ``items``, timing waits in ``next()`` and the loop body between them.

    A :class:`Delivery` is counted as its last step before it is yielded (its value).
    ``started``: when the loop asked for the iteration (``iter()``, on ``clock``), if
    before the first ``next()``: the first wait, the time to first batch and the
    iteration's seconds count from then (a DataLoader starts its workers in ``iter()``).
    """
    start = clock() if started is None else started
    last_yield: float | None = None
    in_body: float | None = None  # when the loop body began, while it runs
    if metrics.logged_at is None:
        metrics.logged_at = start
    try:
        while True:
            t0 = clock() if last_yield is not None else start
            if in_body is not None:
                metrics.busy_s += t0 - in_body
                in_body = None
            try:
                item = next(items)
            except StopIteration:
                return
            t1 = clock()
            metrics.wait_s += t1 - t0
            if metrics.first_batch_s is None:
                metrics.first_batch_s = t1 - start
            if last_yield is None:
                metrics.delivered()
            metrics.seconds += t1 - (last_yield if last_yield is not None else start)
            if log_every_s is not None and t1 - metrics.logged_at >= log_every_s:
                log.info(one_line(metrics.stats()))
                metrics.logged_at = t1
            last_yield = in_body = clock()
            if isinstance(item, Delivery):
                value = item.value
                item.count()
                yield value
            else:
                yield item
    finally:
        # a loop left after a batch (break, an error in its body): that body's time was
        # the loop's, not a wait (else the stall of a short run is overstated)
        if in_body is not None:
            metrics.busy_s += clock() - in_body
        close = getattr(items, "close", None)
        if close is not None:
            close()
