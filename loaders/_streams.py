"""What a ``SimDataLoader``'s workers iterate, and what they send back.

A stream (:class:`_BatchStream`, or :class:`_WorkerStream` for a caller's collate) reads
one worker's share of the rank's block and tags every batch with the worker's index, its
count of samples delivered and its reading counters (:class:`_Tag`); small tensors travel
by value, arena tensors as references (:func:`_pack`). A persistent worker learns each
later iteration's share over its queue (:class:`_Iteration`, ``RING``).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple, cast

import torch
from simstore.loaders._collate import Collate
from simstore.loaders._dataset import Sample, SimDataset
from simstore.loaders._filerows import FdChannel, file_rows_of
from simstore.loaders._plan import Interval
from simstore.loaders._stats import Counters, WarmHit
from simstore.loaders._tensors import InArena, SharedArena, SharedPool, set_worker_arena
from simstore.loaders._trust import TrustTable, VerifiedTable
from simstore.loaders._world import World, in_worker, worker_context
from torch.utils.data import IterableDataset

from simstore.errors import StorageError


class _Tag(NamedTuple):
    worker: int
    delivered: int
    counters: dict[str, float]
    marks: tuple[tuple[int, int], ...] = ()
    warm: tuple[WarmHit, ...] = ()
    """Warm cache copies the worker found for the first time since its last batch (see
    ``Counters.take_warm``); those found after its last delivered batch are not carried."""


class _Tagged(NamedTuple):
    """A batch and its worker's tag (a NamedTuple, so ``pin_memory`` pins the batch).

    Sent from a worker, its small tensors travel by value (see :data:`BY_VALUE_BYTES`).
    """

    batch: Any
    tag: _Tag

    def __reduce__(self) -> tuple[Any, ...]:
        sent = _FIRST_SENT[0]
        if sent is not None:  # a worker's first batch is being pickled to go out
            _FIRST_SENT[0] = None
            sent.set()
        return (_unpacked, (_pack(self.batch), self.tag))


FIRST_HANDOVER_WAIT_S = 0.05
"""The longest a worker waits for its first batch to leave before it reads on."""

_FIRST_SENT: list[threading.Event | None] = [None]
"""In a DataLoader worker, until its first batch is pickled: set when it is."""

FIRST_BATCH_WAIT_S = 1.0
"""The longest a worker other than worker 0 waits for worker 0's first batch to go out."""

_FIRST_OUT: list[Any] = [None]
"""In a DataLoader worker of a local dataset: a byte shared by the iteration's workers,
which worker 0 sets once its first batch is going out (see ``_BatchStream._items``)."""


def _wait_first(first_out: Any) -> None:
    """Wait until worker 0 says its first batch is going out (or ``FIRST_BATCH_WAIT_S``)."""
    deadline = time.monotonic() + FIRST_BATCH_WAIT_S
    while not first_out.value and time.monotonic() < deadline:
        time.sleep(0.0005)


BY_VALUE_BYTES = 64 << 10
"""Tensors up to this size cross from a DataLoader worker by value, in the pickle.

Torch sends a tensor through shared memory, which costs a file-descriptor handshake with
the worker per tensor: 0.2-0.4 ms on an idle machine, up to 14 ms when the worker's
decode threads hold the GIL. A batch's scalar fields and its ``__pad__`` flags are a
few bytes each, and were three of its four handshakes."""


class _ByValue:
    """A small tensor's values (a NumPy array pickles its bytes) on the way to the main process."""

    __slots__ = ("array",)

    def __init__(self, array: Any) -> None:
        self.array = array

    def __reduce__(self) -> tuple[Any, ...]:
        return (_ByValue, (self.array,))


def _pack(value: Any) -> Any:
    """``value`` with its small CPU tensors (in dicts, lists and tuples) by value.

    And its arena tensors as :class:`InArena`; torch sends any other CPU tensor's memory
    by descriptor (see ``_workerstart.guard_descriptor_sends``).
    """
    kind = type(value)
    if isinstance(value, torch.Tensor):
        if value.device.type != "cpu" or value.requires_grad:
            return value
        if (value.layout == torch.strided
                and value.numel() * value.element_size() <= BY_VALUE_BYTES):
            try:
                return _ByValue(value.numpy())
            except (TypeError, RuntimeError):  # a dtype NumPy lacks (bfloat16, ...)
                pass
        return InArena.of(value) or value
    if kind is dict:
        return {k: _pack(v) for k, v in value.items()}
    if kind is list or kind is tuple:
        return kind(_pack(v) for v in value)
    return value


def _unpack(value: Any) -> Any:
    kind = type(value)
    if kind is _ByValue:
        return torch.from_numpy(value.array)
    if kind is InArena:
        return value.tensor()
    if kind is dict:
        return {k: _unpack(v) for k, v in value.items()}
    if kind is list or kind is tuple:
        return kind(_unpack(v) for v in value)
    return value


def _unpacked(batch: Any, tag: _Tag) -> _Tagged:
    return _Tagged(_unpack(batch), tag)


class _Iteration(NamedTuple):
    """What a persistent worker reads in one iteration, sent to it by the loader.

    Plain values only: a tensor sent over a queue is a descriptor held for its receiver
    until it is unpickled, and a worker stopped before it began the iteration never is.
    """

    number: int
    """The iteration's place among those of the worker set (0 for the first)."""
    epoch: int
    world: World
    remaining: tuple[Interval, ...]


RING = 3
"""Iterations whose tables (reading counters, shards verified by a sibling) a persistent
worker set keeps at once: iteration ``n`` uses slot ``n % RING``, which the loader clears
as ``n`` starts. A worker closes iteration ``k``'s stream when it takes up ``k + 1``
(torch replaces its fetcher), before it acknowledges ``k + 2``; ``n`` starts once every
worker has acknowledged ``n - 1``, so no worker still writes into the slot of ``n - 3``.
(Closing the stream joins its reading threads; a stream kept alive past that by a
reference cycle would be closed only by the garbage collector.)"""


ANNOUNCE_TIMEOUT_S = 120.0
"""The longest a persistent worker waits for the state of an iteration it was asked to read."""


class _Environ:
    """A process's environment variables, set in the process that unpickles them."""

    __slots__ = ("variables",)

    def __init__(self, variables: dict[str, str]) -> None:
        self.variables = variables

    def __reduce__(self) -> tuple[Any, ...]:
        return (_set_environ, (self.variables,))


def _set_environ(variables: dict[str, str]) -> None:
    """Make this process's environment ``variables`` (those it has apart from them go)."""
    for name in [n for n in os.environ if n not in variables]:
        del os.environ[name]
    for name, value in variables.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


class _Stream(IterableDataset[Any]):
    """What the DataLoader's workers iterate: this rank's share, set per epoch by the loader.

    A worker that is started for one iteration gets the share with the stream (pickled or
    inherited). A persistent worker keeps the stream it started with: each later
    iteration's share reaches it over its queue in ``announcements`` (see
    :meth:`announce`), and the worker takes the one whose number matches its count of
    ``iter()`` calls (torch calls it once at the worker's start and once per
    iteration after).
    """

    def __init__(self, dataset: SimDataset, batch_size: int) -> None:
        self.dataset = dataset
        self.batch_size = batch_size
        # the epoch and world this iteration reads (not named as the SimDataset's own
        # ``epoch`` and ``world``, which ``loader.dataset`` answers with, see __getattr__)
        self.reading_world = dataset.world
        self.reading_epoch = 0
        self.remaining: tuple[Interval, ...] = ()
        self.trusted: torch.Tensor | None = None
        """The workers' table of files hashed in earlier epochs (see ``TrustTable``), made
        once per loader in shared memory; None with no workers."""
        self.ledger: torch.Tensor | None = None
        """The workers' reading counters, a float64 row each in shared memory (see
        ``Counters``), made per iteration; None with no workers."""
        self.ledger_keys: tuple[str, ...] = ()
        self.counters: Counters | None = None
        """The reading counters of an iteration with no workers (never pickled)."""
        self.announcements: Sequence[Any] | None = None
        """With persistent workers: a queue per worker that carries each iteration's
        :class:`_Iteration`; None otherwise."""
        self.number = 0
        """In the main process, with persistent workers: the iteration about to start."""
        self.ledgers: torch.Tensor | None = None
        """With persistent workers: ``RING`` ledgers, made with the workers (see ``RING``)."""
        self._calls = 0
        """In a persistent worker: how many times torch has called ``iter()`` on it."""

    def announce(self) -> int:
        """In the main process: send the next iteration's share to each persistent worker.

        Returns its number.
        """
        assert self.announcements is not None
        state = _Iteration(self.number, self.reading_epoch, self.reading_world,
                           tuple(self.remaining))
        for channel in self.announcements:
            channel.put(state)
        return self.number

    def __iter__(self) -> Iterator[Any]:
        if not in_worker():
            return self._counting_into(self.counters, self._items())
        if self.announcements is None:
            return self._items()
        number = self._calls
        self._calls += 1
        return self._announced(number)

    def _counting_into(self, counters: Counters | None, items: Iterator[Any]) -> Iterator[Any]:
        """``items``, read in this process, counting into the counters of its own iteration.

        ``_items`` takes the stream's counters at its first item: an iterator made before
        a later ``iter()`` and first read after it counted into the later one's, whose
        samples the metrics then summed twice (once in each iteration's watch).
        """
        later = self.counters
        self.counters = counters
        try:
            first = next(items)
        except StopIteration:
            return
        finally:
            self.counters = later
        yield first
        yield from items

    def _announced(self, number: int) -> Iterator[Any]:
        """A persistent worker's iteration ``number``: its share first, then its items."""
        self._take(self._await(number))
        yield from self._items()

    def _take(self, state: _Iteration) -> None:
        """In a persistent worker: read the iteration ``state`` describes."""
        self.reading_epoch, self.reading_world = state.epoch, state.world
        self.remaining = state.remaining
        if self.ledgers is not None:
            self.ledger = self.ledgers[state.number % RING]

    def _await(self, number: int) -> _Iteration:
        """The share of iteration ``number``, passing over those of iterations not read.

        An iteration the loader started again before this worker began it (a new epoch
        straight after ``iter()``) left its share in the queue unread.
        """
        worker, _ = worker_context()
        assert self.announcements is not None
        channel = self.announcements[worker]
        deadline = time.monotonic() + ANNOUNCE_TIMEOUT_S
        while True:
            try:
                state = channel.get(timeout=1.0)
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise StorageError(
                        f"DataLoader worker {worker} was not sent the state of its "
                        f"iteration {number} within {ANNOUNCE_TIMEOUT_S:.0f} s") from None
                continue
            if state.number == number:
                return cast(_Iteration, state)
            if state.number > number:
                raise StorageError(f"DataLoader worker {worker} was sent iteration "
                                   f"{state.number} while it began iteration {number}")

    def _items(self) -> Iterator[Any]:
        raise NotImplementedError

    def _reader(self) -> World:
        """The world of the process iterating (a DataLoader worker, or the main one)."""
        worker, num_workers = worker_context()
        return World(rank=self.reading_world.rank, world_size=self.reading_world.world_size,
                     worker=worker, num_workers=num_workers)

    def _trust(self) -> TrustTable | None:
        """This worker's view of the loader's ``trusted`` table (None outside workers)."""
        if self.trusted is None or not in_worker():
            return None
        return TrustTable(self.trusted.numpy())

    def _counters(self, world: World) -> Counters:
        """Where this process counts its reads.

        Its ledger row in a worker; with no workers, the counters the metrics watch.
        """
        if self.ledger is not None and in_worker():
            return Counters(self.ledger[world.worker].numpy(), self.ledger_keys)
        if in_worker() or self.counters is None:
            return Counters()
        return self.counters

    def __getstate__(self) -> dict[str, Any]:
        from multiprocessing import context

        state = dict(self.__dict__)
        state["counters"] = None  # a lock; workers count into their ledger rows
        state["_pool"] = None  # a worker's own (the main process never has one)
        if context.get_spawning_popen() is not None:
            # a worker being started: this process's environment as it is now, set
            # first thing in the worker. A spawned worker has it already; a fork
            # server's would have the server's, from the moment the server started
            # (credentials, OMP_NUM_THREADS or per-rank variables set since: missing)
            state = {"_environ": _Environ(dict(os.environ)), **state}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state.pop("_environ", None)  # applied as it was unpickled, before the rest
        self.__dict__.update(state)

    # ``loader.dataset`` is this stream (torch iterates it): what code written for a
    # DataLoader asks of its dataset is the SimDataset's (``len(loader.dataset)``,
    # ``loader.dataset.set_epoch(e)``, ``.epoch``, ``.world``, ``.report()``); the
    # stream's own attributes are named apart from the SimDataset's public ones
    def __len__(self) -> int:
        return len(self.dataset)

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch`` next (the SimDataset's :meth:`~SimDataset.set_epoch`)."""
        self.dataset.set_epoch(epoch)

    def __getattr__(self, name: str) -> Any:
        dataset = self.__dict__.get("dataset")  # absent while unpickling
        if name.startswith("_") or dataset is None:
            raise AttributeError(name)
        return getattr(dataset, name)


class _WorkerStream(_Stream):
    """Single samples with their tags, for a caller's collate (or no batching).

    ``drop_last``: the DataLoader batches them and drops each reader's short last batch,
    so its samples are not read (a reader's share is whole batches but for its last).
    """

    drop_last = False

    def _items(self) -> Iterator[tuple[Sample, _Tag]]:
        world = self._reader()
        reading = self._counters(world)
        for sample, count, counters in self.dataset.read(
            world, self.reading_epoch, self.remaining, self.batch_size, trusted=self._trust(),
            counters=reading, drop_last=self.drop_last,
        ):
            yield sample, _Tag(world.worker, count, counters, warm=reading.take_warm())


class _BatchStream(_Stream):
    """Whole batches, already tagged, with the default collate.

    The worker collates a batch from its decode buffers in one step (see
    :meth:`SimDataset.read_batches`) instead of handing the DataLoader single samples to
    gather; the DataLoader runs without automatic batching and passes batches through.
    """

    def __init__(self, dataset: SimDataset, batch_size: int, collate: Collate,
                 drop_last: bool) -> None:
        super().__init__(dataset, batch_size)
        self.collate = collate
        self.drop_last = drop_last
        self.released: torch.Tensor | None = None
        """Release counters of the workers' pooled buffers (see ``SharedPool``), made by
        the loader in shared memory before it starts them; None with no workers."""
        self.verified: torch.Tensor | None = None
        """The workers' table of local shards hashed (see ``VerifiedTable``), made with
        ``released``; None with no workers."""
        self.verified_ring: torch.Tensor | None = None
        """With persistent workers: ``RING`` such tables (see ``RING``), one per iteration:
        a shard verified in one epoch is verified again in the next, as fresh workers do."""
        self.arenas: Sequence[SharedArena | None] = ()
        """Each worker's arena (see ``SharedArena``), mapped before the workers start;
        empty with no workers (None in a copy that is not a starting worker's)."""
        self.channels: Sequence[FdChannel | None] = ()
        """Each worker's channel for the descriptors of the shard files its batches leave
        unread (see ``loaders._filerows``); as ``arenas``."""
        self.spawned = 0
        """Workers started so far by spawn or a fork server from this iteration's stream
        (see :meth:`__getstate__`); reset with ``arenas``."""
        self._pool: SharedPool | None = None
        """In a worker: its pooled shared buffers, kept by a persistent worker from one
        iteration to the next (batches of the last may still be held by the main process,
        which the pool's release counters know)."""

    def __getstate__(self) -> dict[str, Any]:
        """The stream as a worker being started gets it: its own arena and channel only.

        A worker started by spawn or a fork server gets their descriptors with its
        start, and a fork server takes fewer than 256 per start: every worker's would
        cap the workers at about 120 (60 persistent ones). Torch starts workers 0, 1, ...
        in turn, one pickle of the stream each; a worker that finds its own missing (a
        start out of that order) uses fresh shared memory and reads every row.
        """
        from multiprocessing import context

        state = super().__getstate__()
        if context.get_spawning_popen() is not None and (self.arenas or self.channels):
            mine = self.spawned % max(len(self.arenas), len(self.channels))
            self.spawned += 1
            state["arenas"] = [a if i == mine else None for i, a in enumerate(self.arenas)]
            state["channels"] = [c if i == mine else None for i, c in enumerate(self.channels)]
        return state

    def _take(self, state: _Iteration) -> None:
        super()._take(state)
        if self.verified_ring is not None:
            self.verified = self.verified_ring[state.number % RING]

    def _items(self) -> Iterator[_Tagged]:
        world = self._reader()
        pool = None
        siblings = None
        if self.released is not None and in_worker():
            arena = self.arenas[world.worker] if world.worker < len(self.arenas) else None
            # its own is the one it writes: a forked worker's others go
            self.arenas = [a if i == world.worker else None
                           for i, a in enumerate(self.arenas)]
            set_worker_arena(arena)
            if self._pool is None:
                self._pool = SharedPool(self.released[world.worker].numpy(), arena=arena)
            pool = self._pool
        if self.verified is not None and in_worker() and world.num_workers > 1:
            siblings = VerifiedTable(self.verified.numpy(), world.worker, world.num_workers)
        trusted = self._trust()
        # The first batch goes out before the worker reads on. Torch's queue pickles and
        # sends it from a thread of this process; with the next chunk's decode and the
        # shards' hashes already running here, that thread waited 1-30 ms for the
        # interpreter and a core (2 workers on 2 cores). The worker's pipeline starts
        # them only when asked for the second batch (``first_alone``), and waits here
        # until the first is pickled (at most ``FIRST_HANDOVER_WAIT_S``).
        sent = threading.Event() if in_worker() else None
        _FIRST_SENT[0] = sent
        # The first batch is worker 0's (torch asks the workers in turn from worker 0). On
        # a local dataset the other workers start reading once it is going out: reading
        # side by side, each first batch shared the cores with the others' (2 workers on
        # 2 cores: worker 0's first batch 27 ms, against 16 ms with one worker), and the
        # second batch is not due before the training step on the first is done.
        first_out = _FIRST_OUT[0] if in_worker() and world.num_workers > 1 else None
        leader = first_out if first_out is not None and world.worker == 0 else None
        if first_out is not None and leader is None:
            _wait_first(first_out)
        reading = self._counters(world)
        channel = None
        if in_worker() and world.worker < len(self.channels):
            channel = self.channels[world.worker]
        try:
            for batch, count, counters, marks in self.dataset.read_batches(
                world, self.reading_epoch, self.remaining, self.batch_size, self.collate,
                drop_last=self.drop_last, shared_pool=pool, siblings=siblings,
                trusted=trusted, counters=reading, defer_files=channel is not None,
            ):
                rows = file_rows_of(batch)
                if rows:
                    assert channel is not None
                    channel.send(rows)
                yield _Tagged(batch, _Tag(world.worker, count, counters, marks,
                                          reading.take_warm()))
                if sent is not None:
                    sent.wait(FIRST_HANDOVER_WAIT_S)
                    sent = None
                    if leader is not None:
                        leader.value = 1
        finally:
            if leader is not None:  # no batch (resumed past its share), an error, closed
                leader.value = 1
