"""``SimDataLoader``: a thin DataLoader that checkpoints a ``SimDataset`` with workers.

Each worker reads its batches of the rank's block (see :mod:`._plan`) and tags every batch
with its worker index, how many samples it has delivered so far and its reading counters.
The loader strips the tag in the main process, so the dataset there knows exactly what the
training loop has received, whatever the worker count: that is the checkpoint. Batches
the DataLoader has prefetched but not yet handed out are not counted, so nothing is lost
or repeated on resume. What the workers iterate and send is in :mod:`._streams`, torch's
worker iterator as it is subclassed (and the workers' start and exit) in
:mod:`._workers`; this module holds the loader and what the workers share with the main
process.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from multiprocessing.context import BaseContext
from typing import Any, cast

import torch
from simstore.loaders import _tensors
from simstore.loaders._checks import (
    check_bool,
    check_callable,
    check_int,
    check_number,
    check_optional_int,
    shown,
)
from simstore.loaders._collate import Collate, MeshMode
from simstore.loaders._corrupt import short_of_threads
from simstore.loaders._dataset import LoaderState, Sample, SimDataset
from simstore.loaders._filerows import FdChannel, file_rows_of, resolve_batch
from simstore.loaders._metrics import Delivery, timed
from simstore.loaders._pipeline import FORKED_GROUPS
from simstore.loaders._stats import (
    LoaderStats,
    RunReport,
    ledger_keys,
    read_ledger,
)
from simstore.loaders._streams import (
    RING,
    _BatchStream,
    _Stream,
    _WorkerStream,
)
from simstore.loaders._tensors import (
    SHARED_SLOTS,
    ReleaseTracker,
    SharedArena,
)
from simstore.loaders._trust import TRUSTED_SLOTS, VERIFIED_SLOTS
from simstore.loaders._workers import (
    _close_channels,
    _dropped,
    _passthrough,
    _TaggingCollate,
    _WorkerInit,
    _workers_stopped,
    _WorkersIter,
)
from simstore.loaders._workerstart import _forks, _start_method, start_helpers
from simstore.loaders._world import World
from torch.utils.data import DataLoader

from simstore.errors import InvalidInputError

with contextlib.suppress(Exception):
    # an optional module torch's DataLoader imports in its first ``__next__`` (the
    # profiler hook around every batch), 0.7 ms of a fresh process's wait for its first
    # batch: imported here with the loader's other modules instead (moved, not saved)
    import torch.profiler._cupti_monitor  # noqa: F401

_log = logging.getLogger(__name__)

__all__ = ["SimDataLoader"]


def _shared_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A tensor of zeros in shared memory (made before the workers that share it start)."""
    tensor = torch.zeros(shape, dtype=dtype)
    tensor.share_memory_()  # type: ignore[no-untyped-call]
    return tensor


def _check_torch_options(num_workers: int, kwargs: Mapping[str, Any]) -> None:
    """Refuse, naming them, the DataLoader options torch would refuse late or with asserts.

    torch checks ``prefetch_factor`` only when an iterator starts its workers, and a
    ``timeout`` without workers only when it starts (``AssertionError``s, which left a
    half-made iterator behind, and a loaded resume used up).
    """
    factor = kwargs.get("prefetch_factor")
    if factor is not None:
        if num_workers == 0:
            raise InvalidInputError(
                "prefetch_factor applies only with workers: give num_workers > 0"
            )
        check_int(factor, "prefetch_factor", minimum=1)
    if "timeout" in kwargs:
        timeout = check_number(kwargs["timeout"], "timeout")
        if timeout < 0:
            raise InvalidInputError(f"timeout must be non-negative, got {kwargs['timeout']}")
        if timeout > 0 and num_workers == 0:  # torch: an AssertionError at iter()
            raise InvalidInputError("timeout applies only with workers: give num_workers > 0")
    init = kwargs.get("worker_init_fn")
    if init is not None:
        check_callable(init, "worker_init_fn")
    generator = kwargs.get("generator")
    if generator is not None and not isinstance(generator, torch.Generator):
        # torch's TypeError came at the first iter(), four lines long
        raise InvalidInputError(f"generator must be a torch.Generator, got {shown(generator)}")
    context = kwargs.get("multiprocessing_context")
    if context is not None and not isinstance(context, str | BaseContext):
        raise InvalidInputError(
            "multiprocessing_context must be a start method's name ('fork', 'spawn', "
            f"'forkserver') or a multiprocessing context, got {shown(context)}"
        )


@contextlib.contextmanager
def _torch_refusals() -> Iterator[None]:
    """An option torch's ``DataLoader`` refuses (a ``ValueError``) as an InvalidInputError."""
    try:
        yield
    except InvalidInputError:
        raise
    except ValueError as exc:
        raise InvalidInputError(f"SimDataLoader: {exc}") from None


def _index_fields(value: object, dataset: SimDataset) -> dict[str, str]:
    """``index_fields=``: ``{index field: field it indexes}``, both fields the dataset reads.

    Not checked against the fields when a source has a transform of its own (it may add
    fields).
    """
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidInputError(
            "index_fields must be a mapping {index field: field it indexes}, e.g. "
            f"{{'cells/triangle': 'points'}}, got {shown(value)}"
        )
    out: dict[str, str] = {}
    for key, target in value.items():
        if not isinstance(key, str) or not isinstance(target, str):
            raise InvalidInputError(
                f"index_fields: field names must be strings, got {key!r}: {target!r}"
            )
        out[key] = target
    known = dataset._fields_read()
    if known is not None:
        for name in (n for pair in out.items() for n in pair):
            if name not in known:
                raise InvalidInputError(
                    f"index_fields names {name!r}, which the dataset does not read "
                    f"(fields: {sorted(known)})"
                )
    return out


class SimDataLoader(DataLoader[Any]):
    """A ``DataLoader`` over a :class:`SimDataset` with ``state_dict``/``load_state_dict``.

    The default collate stacks tensors and pads (``mesh="pad"``, with ``<field>__mask``) or
    packs (``mesh="pack"``, with ``<field>__offsets``) variable-size fields. Works with
    ``num_workers`` 0 or more and fork or spawn worker start methods; ``pin_memory`` pins
    batches. With ``persistent_workers`` the workers outlive an iteration: each new one
    (an epoch, a resume) sends them their share before they read.
    """

    _tracker: ReleaseTracker | None = None
    """The main process's side of the workers' pooled buffers (see ``SharedPool``)."""
    _channels: Sequence[FdChannel] = ()
    """The workers' descriptor channels (see ``loaders._filerows``)."""

    def __init__(
        self,
        dataset: SimDataset,
        batch_size: int | None = 1,
        num_workers: int = 0,
        *,
        collate_fn: Callable[[list[Sample]], Any] | None = None,
        mesh: MeshMode = "pad",
        index_fields: Mapping[str, str] | None = None,
        pad_value: float = 0.0,
        pin_memory: bool = False,
        drop_last: bool = False,
        persistent_workers: bool = False,
        **kwargs: Any,
    ) -> None:
        if not isinstance(dataset, SimDataset):
            raise InvalidInputError("SimDataLoader reads a SimDataset")
        if "in_order" in kwargs and not check_bool(kwargs["in_order"], "in_order"):
            raise InvalidInputError("in_order=False would make batches' order nondeterministic")
        if kwargs.get("shuffle") is False:  # torch takes it for an IterableDataset too
            kwargs.pop("shuffle")
        for name in ("sampler", "batch_sampler", "shuffle"):
            if kwargs.get(name) is not None:
                raise InvalidInputError(f"{name}= does not apply: the dataset plans its order")
        batch_size = check_optional_int(batch_size, "batch_size", minimum=1)
        num_workers = check_int(num_workers, "num_workers", minimum=0)
        pin_memory = check_bool(pin_memory, "pin_memory")
        drop_last = check_bool(drop_last, "drop_last")
        persistent_workers = check_bool(persistent_workers, "persistent_workers")
        if persistent_workers and num_workers == 0:  # torch: a ValueError naming no one
            raise InvalidInputError("persistent_workers applies only with workers: give "
                                    "num_workers > 0")
        kwargs["persistent_workers"] = persistent_workers
        _check_torch_options(num_workers, kwargs)
        if collate_fn is not None:
            check_callable(collate_fn, "collate_fn")
        collate = collate_fn or Collate(mesh=mesh, pad_value=pad_value,
                                        index_fields=_index_fields(index_fields, dataset))
        self._init = _WorkerInit(kwargs.pop("worker_init_fn", None))
        kwargs["worker_init_fn"] = self._init
        self._context_given = kwargs.get("multiprocessing_context") is not None
        self.sim_dataset = dataset
        self._whole_batches = batch_size if drop_last and batch_size else None
        self._stream: _Stream
        if collate_fn is None and batch_size is not None:
            # the default collate: workers make whole batches from their decode buffers
            assert isinstance(collate, Collate)
            self._stream = _BatchStream(dataset, batch_size, collate, drop_last)
            with _torch_refusals():
                super().__init__(
                    self._stream,
                    batch_size=None,
                    num_workers=num_workers,
                    collate_fn=cast(Any, _passthrough),
                    pin_memory=pin_memory,
                    **kwargs,
                )
            # what the caller asked for, for whoever reads these attributes (the
            # DataLoader batches nothing itself: its batch sampler stays None)
            object.__setattr__(self, "batch_size", batch_size)
            object.__setattr__(self, "drop_last", drop_last)
            self._start_fork_server()
            return
        # a caller's collate gets the samples' tensors, as a DataLoader gathers them
        self._stream = _WorkerStream(dataset, batch_size or 1)
        self._stream.drop_last = drop_last and batch_size is not None
        # torch's batch sampler makes a list of batch_size items per batch; a rank reads at
        # most an epoch's samples, so a batch of one more is as good as any larger one
        # (with drop_last too: it is never full)
        torch_batch = (min(batch_size, dataset.num_samples + 1)
                       if batch_size is not None else None)
        with _torch_refusals():
            super().__init__(
                self._stream,
                batch_size=torch_batch,
                num_workers=num_workers,
                collate_fn=_TaggingCollate(collate, batch_size is not None,
                                           per_sample=collate_fn is not None),
                pin_memory=pin_memory,
                drop_last=drop_last,
                **kwargs,
            )
        object.__setattr__(self, "batch_size", batch_size)
        self._start_fork_server()

    def _start_fork_server(self) -> None:
        """Start the fork server now when this loader's workers will come from one.

        Its start (an interpreter importing torch and this package, about 1 s) then
        overlaps what the script does before its first ``iter()``. Not in a process still
        starting (a spawned process importing the script that made this loader at its
        top level), which may not start processes; one that cannot start here is started
        again there, which says why.
        """
        import multiprocessing

        if getattr(multiprocessing.current_process(), "_inheriting", False):
            return
        if self.num_workers > 0 and (self._instead_of_fork() or _start_method(self)
                                     ) == "forkserver":
            with contextlib.suppress(OSError, ValueError, RuntimeError):
                start_helpers("forkserver")

    def _get_iterator(self) -> Any:
        if self.num_workers == 0:
            return super()._get_iterator()
        self.check_worker_number_rationality()
        return _WorkersIter(self)

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        # the loop's wait for its first batch starts here: starting the workers is part
        # of it (time to first batch, data stall)
        started = time.perf_counter()
        # one that cannot start delivers nothing, so uses up no resume (``_begin``)
        return self._iterate(self.sim_dataset, started)

    def _iterate(self, ds: SimDataset, started: float) -> Iterator[Any]:
        self._avoid_forking_lance()
        self._init.parent_pid = os.getpid()  # the process about to start the workers
        world = ds.refresh_world()
        # a whole epoch of this loader delivers whole batches only: the run report's
        # epochs_read counts against that, not the rank's samples (a whole epoch read as
        # 0.625 of one); the loader that reads says so, not the last one made
        ds.whole_batches = self._whole_batches
        workers = max(1, self.num_workers)
        self._stream.reading_world = world
        self._stream.reading_epoch = ds.epoch
        self._stream.remaining = ds._begin(world.world_size, workers, self._stream.batch_size)
        if self.num_workers > 0 and self._stream.trusted is None:
            self._stream.trusted = _shared_zeros((TRUSTED_SLOTS,), torch.int64)  # kept
        kept = self._kept_workers()
        if kept is None:
            self._share(ds)
        self._stream.number = 0 if kept is None else kept._sim_number + 1
        self._watch(ds)
        tracker, arenas, channels = self._tracker, self._stream_arenas(), self._channels
        if kept is None and self.num_workers > 0 and _forks(self):
            self._load_first_groups(ds, world)
        try:
            with short_of_threads("starting the DataLoader of " + ", ".join(
                    s.named for s in ds._sources)):
                tagged = super().__iter__()
        except BaseException:
            if kept is None and channels:  # made for workers that are stopped (or none)
                _close_channels(channels)
            raise
        finally:
            FORKED_GROUPS.clear()  # the workers have their copy (or none started)
        if kept is None:
            if channels:
                weakref.finalize(tagged, _close_channels, channels)
            if arenas:
                self._arena_iter = weakref.ref(tagged)
        pin = bool(getattr(tagged, "_pin_memory", False))
        if self.num_workers > 0:
            # the metrics watch this iteration's workers until they stop, even if a
            # later iteration starts while this iterator is still alive (reading ahead)
            ds._metrics.until(functools.partial(_workers_stopped, weakref.ref(tagged),
                                                getattr(tagged, "_sim_number", -1)))
        ended = threading.Event()
        if self.num_workers == 0:
            # read in this process until its generator ends: a later iteration started
            # meanwhile must not take this one's counters as final (its later batches
            # went uncounted)
            ds._metrics.until(ended.is_set)
        number = -1
        if isinstance(tagged, _WorkersIter) and self.persistent_workers:
            number = tagged._sim_number
            if tracker is not None:
                tagged._sim_dropped = functools.partial(_dropped, tracker)
        phase = ds._phase

        def untag(held: Sequence[SharedArena]) -> Iterator[Any]:
            """The batches, untagged.

            ``held``, this iteration's arenas, live as long as it does, even once the
            loader has newer ones: its batches are looked up in them as they arrive.
            Persistent workers serve one iteration at a time: once a later ``iter()``
            has taken them over, reading this one is an error (its batches would be the
            later one's).
            """
            try:
                while True:
                    if number >= 0 and getattr(tagged, "_sim_number", -1) != number:
                        raise InvalidInputError(
                            "this SimDataLoader iteration was superseded by a later iter() "
                            "on the same loader: its persistent workers read the later one "
                            "now")
                    try:
                        batch, tag = next(tagged)
                    except StopIteration:
                        return
                    rows = file_rows_of(batch)
                    if rows:
                        resolve_batch(batch, rows,
                                      channels[tag.worker] if channels else None,
                                      _tensors.POOL, pin)
                    if tracker is not None:
                        tracker.track(tag.worker, tag.marks, batch)
                        tracker.poll()
                    # counted by ``timed`` as its last step before the loop gets the batch
                    yield Delivery(batch, functools.partial(
                        ds._delivered, tag.worker, tag.delivered, tag.counters, tag.warm,
                        phase=phase))
            finally:
                ended.set()

        # the clock ``started`` was read on (timed's default is bound where it is defined)
        return timed(untag(arenas), ds._metrics, log_every_s=ds._options.log_every_s,
                     clock=time.perf_counter, started=started)

    def _load_first_groups(self, ds: SimDataset, world: World) -> None:
        """Load the manifest rows of the fork workers' first batches, for them to inherit.

        Each worker would otherwise read and shuffle the same manifest parts at the same
        time as its siblings (12-18 ms of an 8 KiB first batch with 2 workers on 2
        cores). The reads count in this process's own slot of the metrics. A failure
        here is left to the workers, which read the parts themselves and report it as
        they always have (with the batch that needs them).
        """
        counters = ds._watched_counters(reader=-1)
        stream = self._stream
        try:
            ds._reader().load_first_groups(world, self.num_workers, stream.reading_epoch,
                                           stream.remaining, stream.batch_size, counters)
        except Exception as exc:
            FORKED_GROUPS.clear()
            _log.debug("the workers load their first manifest rows themselves: %s", exc)

    def _kept_workers(self) -> _WorkersIter | None:
        """The persistent workers this iteration reads with, or None if it starts its own.

        Workers stopped after an error are not kept: the iteration starts new ones.
        """
        if not (self.persistent_workers and self.num_workers > 0):
            return None
        running = self._iterator
        if isinstance(running, _WorkersIter) and not running.finished:
            if all(w.is_alive() for w in running._workers):
                return running
            try:  # a worker died between iterations
                running._shutdown_workers()
            except Exception as exc:
                _log.debug("stopping persistent workers, one of which died: %s", exc)
        self._iterator = None
        return None

    def _share(self, ds: SimDataset) -> None:
        """What the workers about to start share with this process, made before they start.

        For one iteration, or for all the iterations of persistent workers.
        """
        self._tracker = None
        self._channels = ()
        stream = self._stream
        stream.announcements = stream.ledgers = None
        persistent = self.persistent_workers and self.num_workers > 0
        if persistent:
            context = self.multiprocessing_context or torch.multiprocessing
            queues = [context.Queue() for _ in range(self.num_workers)]
            for q in queues:
                q.cancel_join_thread()  # a share never read does not hold up the exit
            stream.announcements = queues
            keys = ledger_keys(ds._tiers())
            stream.ledgers = _shared_zeros((RING, self.num_workers, len(keys)), torch.float64)
            stream.ledger_keys = keys
        if not isinstance(stream, _BatchStream):
            return
        released = verified = None
        stream.verified_ring = None
        if self.num_workers > 0:
            released = _shared_zeros((self.num_workers, SHARED_SLOTS), torch.int64)
            self._tracker = ReleaseTracker(released)
            if persistent:
                stream.verified_ring = _shared_zeros((RING, VERIFIED_SLOTS), torch.int64)
                verified = stream.verified_ring[0]
            else:
                verified = _shared_zeros((VERIFIED_SLOTS,), torch.int64)
        stream.released = released
        stream.verified = verified
        stream.arenas = self._worker_arenas()
        stream.spawned = 0
        stream.channels = self._channels = (
            [FdChannel() for _ in range(self.num_workers)]
            if self.num_workers > 0 and ds._options.map_files else [])

    def _stream_arenas(self) -> list[SharedArena]:
        """This iteration's arenas (a stream of single samples has none)."""
        if not isinstance(self._stream, _BatchStream):
            return []
        return [a for a in self._stream.arenas if a is not None]

    def _watch(self, ds: SimDataset) -> None:
        """Counters for this iteration's readers that the metrics read as they are.

        A worker counts into its row of a ledger in shared memory as it reads, so the
        reads it makes after its last delivered batch (fetching ahead, a loop that stops
        early, evictions at close) are in the stats and the run report too.
        """
        stream = self._stream
        if self.num_workers == 0:
            stream.ledger = None
            stream.counters = ds._watched_counters()
            return
        if stream.ledgers is not None:  # persistent workers: this iteration's slot, cleared
            slot = stream.number % RING
            ledger, keys = stream.ledgers[slot], stream.ledger_keys
            ledger.zero_()
            if isinstance(stream, _BatchStream) and stream.verified_ring is not None:
                stream.verified_ring[slot].zero_()
        else:
            keys = ledger_keys(ds._tiers())
            ledger = _shared_zeros((self.num_workers, len(keys)), torch.float64)
        stream.ledger, stream.ledger_keys = ledger, keys
        self._stream.counters = None
        for w in range(self.num_workers):
            ds._metrics.watch(w, functools.partial(read_ledger, ledger[w].numpy(), keys))

    def _avoid_forking_lance(self) -> None:
        """Start workers from a fork server once this process has read or written Lance files.

        Lance's runtime threads do not survive a fork: a worker forked after the main
        process read a Lance snapshot (a validation pass, say) could crash on its first
        read (1 run in 5 in an audit). Left to the platform's default, the workers come
        from a fork server instead (a fresh interpreter that has imported torch and this
        package, never Lance), or spawn where there is none. A caller who asks for fork
        keeps it (Lance itself warns at the fork: a dataset without Lance shards forks
        safely).
        """
        instead = self._instead_of_fork()
        if instead is not None:
            self.multiprocessing_context = instead

    def _instead_of_fork(self) -> str | None:
        """The start method to use in place of the default fork now; None: keep it."""
        if self.num_workers <= 0 or self._context_given or not _forks(self):
            return None
        from simstore.formats._lance import used_here  # not before: 0.4 ms of a first batch

        if not used_here():
            return None
        import multiprocessing

        return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"

    def _worker_arenas(self) -> list[SharedArena]:
        """One arena per worker (kept for later epochs); none without workers."""
        if self.num_workers <= 0 or _tensors.ARENA_BYTES <= 0:
            return []
        arenas: list[SharedArena] = getattr(self, "_arenas", [])
        running = getattr(self, "_arena_iter", None)
        running = running() if running is not None else None
        if running is not None and not getattr(running, "finished", True):
            arenas = []  # an earlier iterator's workers may still write into theirs
        if len(arenas) != self.num_workers or any(
                a.nbytes != _tensors.ARENA_BYTES for a in arenas):
            arenas = [SharedArena(_tensors.ARENA_BYTES) for _ in range(self.num_workers)]
            self._arenas = arenas
        for arena in arenas:
            arena.hold_views()
        return list(arenas)

    def __getstate__(self) -> dict[str, Any]:
        """This loader as ``pickle`` and ``copy.deepcopy`` take it, before it has run workers.

        Once it has, it holds what they share with this process (their arenas' mappings,
        descriptors, queues): a copy of those would be another process's, or nothing.
        """
        stream = getattr(self, "_stream", None)
        if (getattr(self, "_arenas", None) or getattr(self, "_channels", None)
                or getattr(self, "_tracker", None) is not None
                or getattr(stream, "announcements", None) is not None
                or getattr(stream, "trusted", None) is not None):
            raise InvalidInputError(
                "SimDataLoader: a loader whose workers have run holds memory and queues it "
                "shares with them and cannot be pickled or copied; make a new "
                "SimDataLoader of its dataset (state_dict() carries the progress)"
            )
        return dict(self.__dict__)

    def __len__(self) -> int:
        n = len(self.sim_dataset)
        bs = self._stream.batch_size
        return n // bs if self.drop_last else -(-n // bs)

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch`` next (see :meth:`SimDataset.set_epoch`)."""
        self.sim_dataset.set_epoch(epoch)

    def state_dict(self) -> LoaderState:
        """The dataset's state: what the training loop has received so far."""
        return self.sim_dataset.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`state_dict`, with any world size and worker count."""
        self.sim_dataset.load_state_dict(state)

    def stats(self) -> LoaderStats:
        """The dataset's stats (see :meth:`SimDataset.stats`)."""
        return self.sim_dataset.stats()

    def report(self) -> RunReport:
        """The dataset's run report (see :meth:`SimDataset.report`)."""
        return self.sim_dataset.report()

