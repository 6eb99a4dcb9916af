"""``SimDataset``: a torch ``IterableDataset`` over one pinned snapshot, or a mixture of several.

``__iter__`` only wires stages, through :class:`._reading.EpochReader`: the epoch plan
(:mod:`._plan`, pure) -> resolution of stream positions to manifest rows and background
fetches (:mod:`._pipeline`, readers from :mod:`._readers`) -> decode in threads ->
conversion to tensors and the sample's transform. The shuffle is part of the
stream order (:mod:`._order`), so a checkpoint needs only the positions still to read.

The object holds values only (stores pickle, readers and threads are created inside each
worker when it starts reading), so it survives ``fork`` and ``spawn``.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from simstore.loaders._cache import ShardCache
from simstore.loaders._checks import (
    MAX_COUNT,
    check_bool,
    check_bytes,
    check_callable,
    check_int,
    check_number,
    check_optional_int,
    is_int,
    parse_bytes,
    shown,
    to_list,
)
from simstore.loaders._collate import Collate
from simstore.loaders._corrupt import CorruptFound
from simstore.loaders._fetch import RateLimiter, ShardAccess, tier_of
from simstore.loaders._metrics import Delivery, Metrics, timed
from simstore.loaders._nodecache import layout_cache
from simstore.loaders._normalise import Normalise, NormaliseSpec
from simstore.loaders._options import LoaderOptions, cache_config
from simstore.loaders._order import BLOCK_BYTES, BUFFER_BLOCKS, Mixture
from simstore.loaders._partrows import part_rows_cache
from simstore.loaders._pipeline import (
    PrefetchConfig,
    ShardOpener,
)
from simstore.loaders._plan import (
    Interval,
    Remainder,
    advance,
    intervals_total,
    samples_per_rank,
)
from simstore.loaders._reading import EpochReader
from simstore.loaders._source import Source, Transform, open_source
from simstore.loaders._state import (
    STATE_FORMAT_VERSION,
    LoaderState,
    check_state,
    order_params,
    state_intervals,
)
from simstore.loaders._stats import (
    Counters,
    LoaderStats,
    RunReport,
    WarmCopies,
    WarmHit,
    run_report,
)
from simstore.loaders._tensors import (
    SharedPool,
)
from simstore.loaders._trust import TRUSTED_SLOTS, TrustTable, VerifiedTable
from simstore.loaders._world import (
    World,
    WorldDetector,
    _distributed_rank,
    detect_world,
    exit_with_parent,
    in_worker,
    worker_context,
)
from torch.utils.data import IterableDataset

from simstore._verified import DEFAULT_VERIFY_EVERY_S, node_records
from simstore.errors import IntegrityError, InvalidInputError
from simstore.snapshot import SNAPSHOT_HEAD
from simstore.storage import ObjectStore, open_store

__all__ = ["LoaderState", "SimDataset"]

Sample = dict[str, Any]


@dataclass(slots=True)
class _Phase:
    """Progress of the current iteration: every rank's workers delivered ``counts``."""

    remaining: tuple[Interval, ...]
    world_size: int
    num_workers: int
    batch_size: int
    counts: list[int]
    live: dict[int, dict[str, float]] = field(default_factory=dict)
    """The metrics' latest counters of this iteration's readers (see ``Metrics.start``)."""


def _snapshot_from_cache(
    access: ShardAccess, sid: str, *, fill: bool = True
) -> tuple[bytes, str] | None:
    """Snapshot ``sid``'s bytes from the disk cache (filled on a miss), or None.

    A snapshot is immutable, so a node that has read it before needs only the ref's round
    trip (none for a REF that names it by its full id). None (read it from the store,
    which checks it too) when the cache cannot hold it (a cache limit below an object's
    size is reported by the first shard that does not fit) or its copy there was damaged
    (taken out of the cache by ``read_cached``) or is not a snapshot; with ``fill=False``
    also on a miss.
    """
    try:
        return access.read_cached(sid, fill=fill, starts_with=SNAPSHOT_HEAD, kind="snapshot")
    except (InvalidInputError, IntegrityError):
        return None


class SimDataset(IterableDataset[Sample]):
    """Samples of one snapshot (or a mixture) as dicts of tensors plus ``__key__``/``__pad__``.

    ``ref`` is resolved once, here, and the snapshot stays pinned for the life of the
    object and its ``state_dict``. Each epoch every sample is delivered exactly once across
    ranks and workers, every rank gets the same count (``remainder="pad"`` repeats a few
    samples, marked ``__pad__``; ``"drop"`` leaves out fewer than ``world_size``), and the
    order is a pure function of (snapshot, seed, epoch). See docs/loader.md.

    Args:
        store: a store URL or an ``ObjectStore``.
        ref: ``name``, ``name@branch``, ``name@tag`` or ``name@<snapshot id prefix>``; a
            full snapshot id found in ``cache_dir`` asks nothing of a remote store.
        fields: fields to read (default all); only their bytes are read.
        shuffle: shuffle (default) or read in manifest order (validation).
        seed: the shuffle seed.
        rank, world_size: default to torch.distributed, then ``RANK``/``WORLD_SIZE``.
        cache_dir, cache_limit: local disk cache for remote stores and its byte limit.
        prefetch: a :class:`PrefetchConfig`, or how many chunks to decode ahead.
        transform: applied to each sample (a dict of tensors) in the reading process.
        normalise: ``(x - mean) / std`` with the pinned snapshot's exact statistics, before
            ``transform``: True (every numeric field read), a list of field names, or
            ``{field: (mean, std)}`` (constants given, e.g. another snapshot's). Per
            component on a vector field's last axis; floating fields keep their dtype,
            integer ones become float32. Statistics marked inexact are refused (see
            ``simstore.stats.normalisation``).
        remainder: ``"pad"`` (default) or ``"drop"``.
        on_corrupt: ``"raise"`` (default): a corrupt shard stops the iteration with an
            error naming it. ``"skip"``: its samples are logged, counted
            (``stats()["corrupt_samples"]``) and stood in for by copies of intact samples
            marked ``__pad__``, so every rank keeps its count (see docs/loader.md); a
            shard of a later format version is no damage: ``UnsupportedFormatError``.
        window, crop: ``{field: region}`` reads of part of an array field (Zarr shards).
        window_shards: shards shuffled together (the shuffle window).
        group_parts: manifest parts per shuffle group.
        shuffle_block_bytes: rows of a shard kept together in the shuffle (about the
            shards' row-group size, the unit a reader decodes; default 4 MiB).
        shuffle_buffer_blocks: blocks whose rows are shuffled together (default 16), so
            a reader keeps at most that many blocks decoded.
        verify: hash-check each shard (a local store's file, a cache copy) as a whole
            before trusting what is read from it: once per job, or on cache fill.
        verify_every_s: a shard file whose hash matched in an earlier job on this node
            within this many seconds (default a day), and which is unchanged since, is
            not hashed again (records under ``$SIMSTORE_VERIFIED_DIR``, default
            ``~/.cache/simstore/verified``); 0: every job hashes every shard it reads.
        max_bandwidth: bytes/s cap for the whole job (split over its ranks and workers).
        zero_copy: share memory with decoded buffers where possible (do not modify
            samples in place in a transform when true).
        map_files: on Linux, a large uncompressed Zarr chunk that starts at a page
            boundary of a local shard file (or cache copy) can be mapped into its batch,
            copy-on-write, instead of read: no copy of its bytes (see docs/loader.md).
            ``"first"`` (the default): the chunks of each iteration's first batches are
            mapped, and the rest are read into memory handed back by batches the
            training loop has let go of (a copy, but no page faults and no unmapping).
            True: every such chunk is mapped (the batches share the page cache: for a
            loop that keeps its batches, or a node short of memory). False: every
            chunk is read.
        shard_opener: how to open a shard (default: any installed format, by its magic
            bytes, as ``simstore.formats.open_shard`` does).
        world_detector: how to find rank and world size (default :func:`detect_world`).
        log_every_s: log a one-line summary this often while iterating.
        storage_options: options for the store backend.
    """

    def __init__(
        self,
        store: str | os.PathLike[str] | ObjectStore,
        ref: str,
        fields: Sequence[str] | None = None,
        shuffle: bool = True,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
        prefetch: PrefetchConfig | Mapping[str, int] | int | None = None,
        transform: Transform | None = None,
        *,
        remainder: Remainder = "pad",
        on_corrupt: str = "raise",
        window: Mapping[str, Any] | None = None,
        crop: Mapping[str, Any] | None = None,
        window_shards: int = 8,
        group_parts: int = 4,
        shuffle_block_bytes: int | str = BLOCK_BYTES,
        shuffle_buffer_blocks: int = BUFFER_BLOCKS,
        verify: bool = True,
        verify_every_s: float = DEFAULT_VERIFY_EVERY_S,
        max_bandwidth: int | str | None = None,
        zero_copy: bool = True,
        map_files: bool | Literal["first"] = "first",
        shard_opener: ShardOpener | None = None,
        world_detector: WorldDetector | None = None,
        log_every_s: float | None = None,
        storage_options: Mapping[str, Any] | None = None,
        normalise: NormaliseSpec = None,
    ) -> None:
        # the job starts now: cache copies filled before are warm (see ``report``), the
        # snapshot's and manifest's copies this construction fills are not
        job_start = time.time()
        if not isinstance(store, str | os.PathLike | ObjectStore):
            raise InvalidInputError(
                f"store must be a store URL or an ObjectStore, got {shown(store)}"
            )
        if not isinstance(ref, str):
            raise InvalidInputError(
                f"ref must be a string such as 'name' or 'name@tag', got {shown(ref)}"
            )
        if fields is not None:
            if isinstance(fields, str | bytes):
                raise InvalidInputError(
                    f"fields= takes a list of field names, not the string {fields!r} "
                    f"(for one field: fields=[{fields!r}])"
                )
            fields = to_list(fields, "fields", "field names")
            for name in fields:
                if not isinstance(name, str):
                    raise InvalidInputError(f"fields: a field name must be a string, "
                                            f"got {shown(name)}")
        shuffle = check_bool(shuffle, "shuffle")
        seed = check_int(seed, "seed", minimum=0)
        rank = check_optional_int(rank, "rank", minimum=0)
        world_size = check_optional_int(world_size, "world_size", minimum=1, maximum=MAX_COUNT)
        if transform is not None:
            check_callable(transform, "transform")
        window_shards = check_int(window_shards, "window_shards", minimum=1, maximum=MAX_COUNT)
        group_parts = check_int(group_parts, "group_parts", minimum=1, maximum=MAX_COUNT)
        block_bytes = check_bytes(shuffle_block_bytes, "shuffle_block_bytes")
        buffer_blocks = check_int(shuffle_buffer_blocks, "shuffle_buffer_blocks", minimum=1,
                                  maximum=MAX_COUNT)
        verify = check_bool(verify, "verify")
        verify_every_s = check_number(verify_every_s, "verify_every_s", finite=False)
        if not verify_every_s >= 0:
            raise InvalidInputError(f"verify_every_s must be >= 0, got {verify_every_s}")
        zero_copy = check_bool(zero_copy, "zero_copy")
        if isinstance(map_files, bool | np.bool_):
            map_files = bool(map_files)
        elif not (isinstance(map_files, str) and map_files == "first"):
            raise InvalidInputError(
                f"map_files must be 'first', True or False, got {shown(map_files)}")
        bandwidth = parse_bytes(max_bandwidth, "max_bandwidth")
        for name, value in (("shard_opener", shard_opener), ("world_detector", world_detector)):
            if value is not None:
                check_callable(value, name)
        if log_every_s is not None:
            log_every_s = check_number(log_every_s, "log_every_s", positive=True)
        if storage_options is not None and not isinstance(storage_options, Mapping):
            raise InvalidInputError(
                f"storage_options must be a mapping, got {shown(storage_options)}"
            )
        cache = cache_config(cache_dir, parse_bytes(cache_limit, "cache_limit"))
        prefetch = _prefetch_config(prefetch)
        backend = open_store(store, storage_options=storage_options, read_only=True)
        read = peek = None
        if cache is not None and tier_of(backend) not in ("local", "memory"):
            # claim the directory now: one that is not a simstore cache is refused here,
            # not by the first reader (in a DataLoader worker, whose traceback wraps it)
            ShardCache(cache, Counters())
            access = ShardAccess(backend, counters=Counters(), limiter=RateLimiter(None),
                                 cache=cache, verify=True)
            read = functools.partial(_snapshot_from_cache, access)
            peek = functools.partial(_snapshot_from_cache, access, fill=False)
        source = open_source(
            backend, ref, fields=fields, shuffle=shuffle, seed=seed,
            window_shards=window_shards, group_parts=group_parts, transform=transform,
            block_bytes=block_bytes, buffer_blocks=buffer_blocks, crop=crop, window=window,
            read=read, peek=peek, normalise=normalise,
        )
        options = LoaderOptions(
            remainder=remainder,
            on_corrupt=on_corrupt,
            cache=cache,
            prefetch=prefetch,
            verify=verify,
            node=node_records(verify, verify_every_s),
            part_rows=part_rows_cache(),
            layouts=layout_cache(),
            max_bandwidth=bandwidth,
            zero_copy=zero_copy,
            map_files=map_files,
            shard_opener=shard_opener,
            log_every_s=log_every_s,
        )
        self._setup((source,), (1.0,), seed, shuffle, None, options,
                    rank, world_size, world_detector, job_start)

    def _setup(
        self,
        sources: tuple[Source, ...],
        weights: tuple[float, ...],
        seed: int,
        shuffle: bool,
        samples_per_epoch: int | None,
        options: LoaderOptions,
        rank: int | None,
        world_size: int | None,
        detector: WorldDetector | None,
        job_start: float,
    ) -> None:
        if options.remainder not in ("pad", "drop"):
            raise InvalidInputError(f"invalid remainder {options.remainder!r}: 'pad' or 'drop'")
        if options.on_corrupt not in ("raise", "skip"):
            raise InvalidInputError(
                f"invalid on_corrupt {options.on_corrupt!r}: 'raise' or 'skip'"
            )
        self._sources = sources
        self._mixture = Mixture.of(weights, seed=seed, shuffle=shuffle)
        self._epoch_length = (
            samples_per_epoch if samples_per_epoch is not None
            else sum(s.num_samples for s in sources)
        )
        self._options = options
        self._detector: WorldDetector = detector or functools.partial(
            detect_world, rank, world_size
        )
        self._world = self._detect()
        self._epoch = 0
        self._resume: tuple[Interval, ...] | None = None
        self._phase: _Phase | None = None
        self._readers = 1
        """Reading processes per rank of the last iteration begun (for the run report:
        ``set_epoch`` and ``load_state_dict`` end the phase, not what the run did)."""
        self._metrics = Metrics()
        self._trusted = np.zeros(TRUSTED_SLOTS, dtype=np.int64)
        """Shards hashed by this process's reads, for its later epochs (``TrustTable``)."""
        self._job_start = job_start
        """When the job started (``time.time()`` at construction, in the process that
        built the dataset; pickled to workers): cache copies filled before are warm."""
        self.whole_batches: int | None = None
        """Set by the loader that reads it last, when it drops a short last batch: its
        batch size (a whole epoch then delivers whole batches only, see :meth:`report`)."""
        self._corrupt = CorruptFound()
        """Shards this process found corrupt (``on_corrupt="skip"``), for its later epochs."""
        self._warm = WarmCopies()
        """The distinct warm copies this job's readers hit, across epochs and iterations
        (kept in the process that runs the loop; a worker gets an empty one)."""

    # -- construction of mixtures ----------------------------------------------------
    @classmethod
    def mix(
        cls,
        datasets: Sequence[SimDataset],
        weights: Sequence[float] | None = None,
        *,
        seed: int = 0,
        shuffle: bool = True,
        samples_per_epoch: int | None = None,
    ) -> SimDataset:
        """Several datasets streamed as one, by weight; deterministic and resumable.

        Each dataset keeps its snapshot, fields, shuffle and transform; the mixture takes
        the reading options and world of the first. An epoch is ``samples_per_epoch``
        samples (at least 1; default: all datasets' samples together); a dataset whose
        share runs past its end starts its next epoch. See docs/loader.md for the algorithm.
        """
        if isinstance(datasets, SimDataset):
            raise InvalidInputError(
                "mix takes a list of SimDatasets, got one SimDataset (for one: mix([dataset]))"
            )
        datasets = to_list(datasets, "mix: datasets", "SimDatasets", ordered=True)
        if not datasets:
            raise InvalidInputError("mix needs at least one dataset")
        sources: list[Source] = []
        for i, ds in enumerate(datasets):
            if not isinstance(ds, SimDataset):
                raise InvalidInputError(
                    f"mix: datasets[{i}] must be a SimDataset, got {shown(ds)}"
                )
            if len(ds._sources) != 1:
                raise InvalidInputError("mix takes plain datasets, not mixtures")
            if ds._sources[0].num_samples == 0:
                raise InvalidInputError(f"{ds._sources[0].named} has no samples to mix")
            sources.append(ds._sources[0])
        if weights is None:
            w = (1.0,) * len(sources)
        else:
            given = to_list(weights, "mix: weights", "numbers", ordered=True)
            w = tuple(check_number(x, f"mix: weights[{i}]") for i, x in enumerate(given))
        if len(w) != len(sources):
            raise InvalidInputError(f"{len(w)} weights for {len(sources)} datasets")
        seed = check_int(seed, "mix: seed", minimum=0)
        shuffle = check_bool(shuffle, "mix: shuffle")
        samples_per_epoch = check_optional_int(samples_per_epoch, "samples_per_epoch",
                                               minimum=1, maximum=(1 << 63) - 1)
        first = datasets[0]
        out = cls.__new__(cls)
        # the job started when its first dataset was made (copies filled since are not
        # warm for it)
        job_start = min(ds._job_start for ds in datasets)
        out._setup(tuple(sources), w, seed, shuffle, samples_per_epoch, first._options,
                   None, None, first._detector, job_start)
        return out

    # -- properties ------------------------------------------------------------------
    @property
    def snapshot_ids(self) -> list[str]:
        """The pinned snapshot of each source."""
        return [s.snapshot_id for s in self._sources]

    @property
    def snapshot_id(self) -> str:
        """The pinned snapshot (of the first source, for a mixture)."""
        return self._sources[0].snapshot_id

    @property
    def epoch(self) -> int:
        """The epoch the next iteration reads."""
        return self._epoch

    @property
    def num_samples(self) -> int:
        """Samples in one epoch of the stream (all ranks together)."""
        return self._epoch_length

    @property
    def world(self) -> World:
        """The rank and world size this dataset reads as."""
        return self._world

    def _fields_read(self) -> set[str] | None:
        """The fields samples hold (all sources); None when a transform may add others."""
        names: set[str] = set()
        for source in self._sources:
            transform = source.transform
            if transform is not None and not (
                    isinstance(transform, Normalise) and transform.then is None):
                return None
            names.update(source.fields if source.fields is not None
                         else (spec.name for spec in source.schema))
        return names

    def __len__(self) -> int:
        """Samples this rank delivers in a full epoch.

        In the main process the world is detected again first (:meth:`refresh_world`),
        as an iteration does: a dataset built before ``init_process_group`` answers for
        the process group as it is now.
        """
        world = self._world if in_worker() else self.refresh_world()
        return samples_per_rank(self._epoch_length, world.world_size,
                                self._options.remainder)

    def get(self, key: str) -> Sample:
        """The sample stored under ``key``, as iterating over the dataset would yield it.

        Random access for inspection, evaluation on chosen samples and debugging: the
        pinned snapshot's manifest part that holds the key is read (parts are in key
        order), then the one shard row, with the same checks, disk cache, projection
        (``fields``), crops and windows (drawn for the current :attr:`epoch`),
        normalisation and ``transform`` as the stream; ``__pad__`` is False. A key the
        snapshot lacks raises :class:`~simstore.errors.NotFoundError` (a ``LookupError``).
        Not counted in :meth:`stats`. A mixture has no keys of its own: call ``get`` on
        one of its datasets.
        """
        if not isinstance(key, str):
            raise InvalidInputError(f"a sample key is a string, got {shown(key)}")
        return self.get_many([key])[0]

    def get_many(self, keys: Sequence[str]) -> list[Sample]:
        """The samples of ``keys``, in the order given (see :meth:`get`).

        Each manifest part and each shard involved is read once for the whole call.
        """
        if isinstance(keys, str) or not isinstance(keys, Sequence):
            raise InvalidInputError(f"keys must be a sequence of strings, got {shown(keys)}")
        return self._reader().lookup(keys, self._epoch)

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch`` next; a resume loaded for this same epoch is kept."""
        epoch = self._check_epoch(epoch, "epoch")
        if epoch != self._epoch:
            self._epoch = epoch
            self._resume = None
            self._phase = None

    def _check_epoch(self, epoch: object, name: str) -> int:
        """``epoch`` as an int; refused unless an integer whose stream positions fit int64."""
        # the stream positions of epoch e are e * L .. (e + 1) * L - 1 (see ``Resolver``)
        most = (1 << 63) // max(self._epoch_length, 1) - 1
        return check_int(epoch, name, minimum=0, maximum=most)

    # -- state -----------------------------------------------------------------------
    def _full(self) -> tuple[Interval, ...]:
        return ((0, self._epoch_length),) if self._epoch_length else ()

    def _remaining(self) -> tuple[Interval, ...]:
        if self._resume is not None:
            return self._resume
        phase = self._phase
        if phase is None:
            return self._full()
        return advance(
            phase.remaining, world_size=phase.world_size, num_workers=phase.num_workers,
            batch_size=phase.batch_size, remainder=self._options.remainder,
            consumed=phase.counts,
        )

    def state_dict(self) -> LoaderState:
        """Snapshots, seeds, epoch and the positions of the epoch still to read.

        Every rank of a synchronous job holds the same state, so saving one rank's is
        enough; loading it into any world size or worker count resumes exactly.
        """
        remaining = self._remaining()
        return {
            "format_version": STATE_FORMAT_VERSION,
            "kind": "simstore-loader-state",
            "snapshots": self.snapshot_ids,
            "seeds": [s.seed for s in self._sources],
            "weights": list(self._mixture.weights),
            "mix_seed": self._mixture.seed,
            "mix_shuffle": self._mixture.shuffle,
            "epoch": self._epoch,
            "epoch_length": self._epoch_length,
            "remaining": [[a, b] for a, b in remaining],
            "delivered": self._epoch_length - intervals_total(remaining),
            "order": [order_params(s) for s in self._sources],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`state_dict`; the next iteration reads exactly what was left."""
        state = check_state(state, self.state_dict(), mixed=len(self._sources) > 1,
                            mix_shuffle=self._mixture.shuffle)
        epoch = self._check_epoch(state["epoch"], "loader state field 'epoch'")
        remaining = state_intervals(state["remaining"], self._epoch_length)
        self._epoch = epoch
        self._resume = remaining
        self._phase = None

    def _begin(self, world_size: int, num_workers: int, batch_size: int) -> tuple[Interval, ...]:
        """Start tracking an iteration; returns the positions it reads.

        Those of a loaded resume, or of the latest iteration of this epoch if it delivered
        nothing; else the whole epoch. An iteration that delivered no batch used up
        nothing, as ``state_dict`` says: an ``iter()`` never read from, workers that did
        not start, a ``worker_init_fn`` or a first read that failed (the next iteration
        read the whole epoch while the state said it resumed).
        """
        phase = self._phase
        if self._resume is not None:
            remaining = self._resume
        elif phase is not None and not any(phase.counts):
            remaining = phase.remaining
        else:
            remaining = self._full()
        self._resume = None
        live = self._metrics.start(self._epoch)
        self._phase = _Phase(remaining, world_size, num_workers, batch_size,
                             [0] * num_workers, live)
        self._readers = num_workers
        return remaining

    def _delivered(self, worker: int, count: int, counters: dict[str, float],
                   warm: Sequence[WarmHit] = (), phase: _Phase | None = None) -> None:
        """A batch came out of ``worker``: it has now delivered ``count`` samples.

        ``warm``: the warm copies the worker found since its last batch (see
        ``Counters.take_warm``). ``phase``: the iteration it came from, when that may be
        an earlier one than the latest (an iterator still read after a later one
        started): its progress and counters are that iteration's, not the latest's.
        """
        phase = phase or self._phase
        if phase is not None:
            phase.counts[worker] = count
            phase.live[worker] = counters
        else:
            self._metrics.update(worker, counters)
        if warm:
            self._warm.add_all(warm)

    def _watched_counters(self, reader: int = 0) -> Counters:
        """Counters for reading in this process, watched by the metrics as ``reader``.

        Call after ``_begin``: reads made after the last delivered batch count too, and
        the warm copies found go straight into the job's set. ``reader`` -1: the reads a
        process with workers makes for them before it forks them.
        """
        counters = Counters(on_warm=self._warm.add)
        self._metrics.watch(reader, counters.snapshot)
        return counters

    def _tiers(self) -> list[str]:
        """The storage tiers of the sources' stores, as the reading counters name them."""
        return [tier_of(s.store) for s in self._sources]

    # -- metrics ---------------------------------------------------------------------
    def stats(self) -> LoaderStats:
        """Throughput, time to first batch, cache, bytes and requests per tier, data stall."""
        stats = self._metrics.stats()
        warm = self._warm.counters()
        stats["cache_warm_hits"] = int(warm["cache_warm_hits"])
        stats["cache_warm_hit_bytes"] = int(warm["cache_warm_hit_bytes"])
        for source in self._sources:
            # each source's tier, even where nothing was read from it, or nothing counted
            # in this process (workers that delivered no batch)
            stats["tiers"].setdefault(tier_of(source.store), {"bytes": 0, "requests": 0})
        return stats

    def report(self) -> RunReport:
        """The JSON run report for the cost accounting (schema in docs/loader.md)."""
        return run_report(
            self.stats(), {**self._metrics.counters(), **self._warm.counters()},
            snapshots=self.snapshot_ids, epochs=list(self._metrics.epochs),
            world_size=self._world.world_size, num_workers=self._readers,
            rank_epoch=self._rank_epoch(),
            cache_node=(self._options.cache.node_id()
                        if self._options.cache is not None else None),
        )

    def _rank_epoch(self) -> int:
        """The positions a whole epoch delivers to this rank (what ``epochs_read`` counts in).

        With a loader that drops a short last batch (``drop_last``), whole batches only.
        """
        n = samples_per_rank(self._epoch_length, self._world.world_size,
                             self._options.remainder)
        return n - n % self.whole_batches if self.whole_batches else n

    # -- iteration -------------------------------------------------------------------
    def refresh_world(self) -> World:
        """Detect rank and world size again (call in the main process, before reading)."""
        self._world = self._detect()
        return self._world

    def _detect(self) -> World:
        world = self._detector()
        if not isinstance(world, World):
            raise InvalidInputError(f"world_detector returned {shown(world)}, not a World")
        return world

    def __getstate__(self) -> dict[str, Any]:
        # pickled in the main process for a plain DataLoader's spawn or forkserver workers:
        # they read as the world is now, not as it was at construction (a dataset built
        # before ``init_process_group`` would read everything on every rank). Detected
        # here as iteration would, so ``world`` and ``report()`` say it too.
        if not in_worker():
            self.refresh_world()
        return self.__dict__.copy()

    def __iter__(self) -> Iterator[Sample]:
        if in_worker():
            exit_with_parent()
            worker, num_workers = worker_context()
            # inside a plain DataLoader's worker: read this worker's share, untracked. A
            # fork worker holds the dataset as it was at construction or its last
            # detection, but inherits the process group: detect again where there is one
            # (a spawned worker has none, and its dataset was detected when pickled)
            rank = self._detect() if _distributed_rank() is not None else self._world
            world = World(rank=rank.rank, world_size=rank.world_size,
                          worker=worker, num_workers=num_workers)
            remaining = self._resume if self._resume is not None else self._full()
            for sample, _count, _counters in self.read(world, self._epoch, remaining, 1):
                yield sample
            return
        world = self.refresh_world()
        remaining = self._begin(world.world_size, 1, 1)
        phase = self._phase
        counters = self._watched_counters()
        items = self.read(world, self._epoch, remaining, 1, counters=counters)
        ended = threading.Event()
        # read until this generator ends: a later iteration started meanwhile must not
        # take this one's counters as final (its later samples went uncounted)
        self._metrics.until(ended.is_set)

        def tracked() -> Iterator[Delivery]:
            try:
                for sample, count, counters in items:
                    # counted by ``timed`` as its last step before the loop gets the sample
                    yield Delivery(sample, functools.partial(self._delivered, 0, count,
                                                             counters, phase=phase))
            finally:
                ended.set()

        yield from timed(tracked(), self._metrics, log_every_s=self._options.log_every_s)

    def _reader(self) -> EpochReader:
        return EpochReader(self._sources, self._mixture, self._epoch_length, self._options,
                           self._trusted, self._job_start, self._corrupt)

    def read(
        self,
        world: World,
        epoch: int,
        remaining: Sequence[Interval],
        batch_size: int,
        *,
        numbers_as_tensors: bool = True,
        trusted: TrustTable | None = None,
        counters: Counters | None = None,
        drop_last: bool = False,
    ) -> Iterator[tuple[Sample, int, dict[str, float]]]:
        """One reader's samples, each with its running count and the reading counters.

        See :meth:`EpochReader.samples <simstore.loaders._reading.EpochReader.samples>`;
        used by ``__iter__`` and by :class:`SimDataLoader`'s workers.
        """
        return self._reader().samples(world, epoch, remaining, batch_size,
                                      numbers_as_tensors=numbers_as_tensors, trusted=trusted,
                                      counters=counters, drop_last=drop_last)

    def read_batches(
        self,
        world: World,
        epoch: int,
        remaining: Sequence[Interval],
        batch_size: int,
        collate: Collate,
        *,
        drop_last: bool = False,
        shared_pool: SharedPool | None = None,
        siblings: VerifiedTable | None = None,
        trusted: TrustTable | None = None,
        counters: Counters | None = None,
        defer_files: bool = False,
    ) -> Iterator[tuple[Any, int, dict[str, float], tuple[tuple[int, int], ...]]]:
        """One reader's batches, collated, each with its running count, counters and marks.

        See :meth:`EpochReader.batches <simstore.loaders._reading.EpochReader.batches>`.
        """
        return self._reader().batches(world, epoch, remaining, batch_size, collate,
                                      drop_last=drop_last, shared_pool=shared_pool,
                                      siblings=siblings, trusted=trusted, counters=counters,
                                      defer_files=defer_files)


def _prefetch_config(value: object) -> PrefetchConfig:
    """``prefetch=`` as a :class:`PrefetchConfig`.

    One, None, a chunk count or a mapping of its fields; anything else is an error that
    names the parameter.
    """
    if value is None:
        return PrefetchConfig()
    if isinstance(value, PrefetchConfig):
        return value
    if is_int(value):
        return PrefetchConfig(chunks=check_int(value, "prefetch"))
    if isinstance(value, Mapping):
        known = {f.name for f in dataclasses.fields(PrefetchConfig)}
        unknown = sorted(str(k) for k in value if k not in known)
        if unknown:
            raise InvalidInputError(
                f"prefetch: unknown field {unknown[0]!r} (fields: {', '.join(sorted(known))})"
            )
        given: dict[str, Any] = {
            str(k): None if v is None else check_int(v, f"prefetch: field {k!r}")
            for k, v in sorted(value.items())
        }
        return PrefetchConfig(**given)
    raise InvalidInputError(
        f"prefetch must be a PrefetchConfig, a mapping of its fields or a chunk count, "
        f"not {type(value).__name__}"
    )
