"""One reader's share of an epoch: plan -> resolve and prefetch -> decode -> samples or batches.

:class:`EpochReader` holds what a :class:`~simstore.loaders.SimDataset` pins (its sources,
mixture, epoch length and options) and wires the stages of :mod:`._pipeline` for one
reader (a process, or a DataLoader worker) and one epoch: the epoch plan, the readers'
pool and prefetching, then either samples (tensors, the sample's transform, key and pad
flag) or whole batches made straight from the chunk's decode buffers. It is made afresh
for each iteration, inside the process that reads, so it never crosses a pickle.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import operator
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from simstore.loaders._collate import Collate
from simstore.loaders._corrupt import CorruptFound, CorruptShards, short_of_threads
from simstore.loaders._fetch import RateLimiter, ShardAccess, tier_of
from simstore.loaders._normalise import Normalise
from simstore.loaders._opener import FormatOpener
from simstore.loaders._options import LoaderOptions
from simstore.loaders._order import Mixture
from simstore.loaders._pipeline import (
    FORKED_GROUPS,
    Chunk,
    ReaderPool,
    Resolver,
    ShardRead,
    chunk_limit,
    decode_depth,
    prefetched,
    read_chunk,
)
from simstore.loaders._plan import Interval, plan_epoch
from simstore.loaders._ranged import RangeBlocks, mixture_blocks_bytes, range_blocks_bytes
from simstore.loaders._source import Source, locate
from simstore.loaders._stats import Counters
from simstore.loaders._tensors import ChunkBuffers, SharedPool, to_tensors, value_bytes
from simstore.loaders._trust import TrustTable, VerifiedTable
from simstore.loaders._world import World, in_worker

from simstore._env import usable_cores
from simstore.errors import InvalidInputError

__all__ = ["EpochReader"]

Sample = dict[str, Any]


@dataclass(frozen=True, slots=True)
class EpochReader:
    """The reading side of a dataset: its pinned sources, order and options.

    ``trusted`` is the dataset's table of local files hashed earlier in this process,
    shared by every epoch read through it. ``job_start`` (``time.time()``) is when the
    dataset was made: cache hits on copies filled before are warm hits (see
    ``ShardCache``); None counts none.
    """

    sources: Sequence[Source]
    mixture: Mixture
    epoch_length: int
    options: LoaderOptions
    trusted: np.ndarray
    job_start: float | None = None
    corrupt: CorruptFound | None = None
    """The shards this process found corrupt in earlier epochs (``on_corrupt="skip"``)."""

    def samples(
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

        The plan -> prefetch -> decode pipeline; used by ``SimDataset.__iter__`` and by
        :class:`~simstore.loaders.SimDataLoader`'s workers when they hand the DataLoader
        single samples (whose default collate turns a batch's Python numbers into one
        tensor, so they pass ``numbers_as_tensors=False``). ``trusted`` and ``counters``:
        as for :meth:`batches`. ``drop_last``: the samples of the block's short last batch
        (of ``batch_size``), which the DataLoader would drop, are not read.
        """
        count = 0
        with self._decoded(world, epoch, remaining, batch_size, trusted=trusted,
                           counters=counters, drop_last=drop_last) as (
            chunks, counters
        ):
            for chunk, (values, buffers) in chunks:
                for j in range(len(values)):
                    sample = self._sample(chunk, j, values, buffers, numbers_as_tensors)
                    counters.add("pad_samples" if sample["__pad__"] else "samples")
                    if not sample["__pad__"]:
                        counters.add("sample_bytes", _payload_bytes(sample))
                    count += 1
                    yield sample, count, counters.snapshot()

    def batches(
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

        What a DataLoader would make of the samples of :meth:`samples` in batches of
        ``batch_size`` with ``collate``, made a batch at a time: a fixed-shape field of a
        batch is a view of its chunk's decode buffer, with no per-sample tensors or dicts.
        Samples of a batch that need per-sample work (a transform, fields that differ,
        values outside the buffers) go through ``collate`` as samples. In a DataLoader
        worker with ``shared_pool``, chunk buffers come from that pool and each batch's
        marks say which of them it may hold (see :class:`SharedPool`); else no marks.
        ``siblings``: the table in which the workers share local shards' hashes;
        ``trusted``: the loader's table of files hashed in earlier epochs (else the
        dataset's own). ``counters``: where the reading counts (else new ones); the
        caller may read them after the last batch, for the work done ahead of it.
        ``defer_files`` (a forked worker with a channel to the main process): a batch
        field whose rows are whole mapped chunks is a :class:`FileRows`, whose
        descriptors the caller sends (see ``loaders._filerows``).
        """
        opts = self.options
        # normalise= alone (one source, no transform of the caller's): applied to whole
        # batches, which keep the batch path (see Normalise.columns)
        norm = self.sources[0].transform if len(self.sources) == 1 else None
        if not (isinstance(norm, Normalise) and norm.then is None):
            norm = None
        per_sample = norm is None and any(s.transform is not None for s in self.sources)
        defer = (defer_files and opts.map_files and not per_sample and norm is None
                 and opts.on_corrupt != "skip")
        count = 0
        with self._decoded(world, epoch, remaining, batch_size, shared_pool, siblings,
                           trusted, counters, defer, drop_last) as (
            chunks, counters
        ):
            for chunk, (values, buffers) in chunks:
                n = len(values)
                try:  # the buffers go back to the pool however the chunk ends: a loop
                    # left mid-chunk (a break, then persistent workers' next iteration)
                    # kept them for good, a region of the arena each time
                    for lo in range(0, n, batch_size):
                        hi = min(n, lo + batch_size)
                        if hi - lo < batch_size and drop_last:
                            continue
                        pads = chunk.is_pad[lo:hi]
                        batch, nbytes = self._batch(chunk, values, buffers, lo, hi, pads,
                                                    collate, per_sample, norm, defer)
                        npad = int(np.count_nonzero(pads))
                        counters.add("samples", hi - lo - npad)
                        if npad:
                            counters.add("pad_samples", npad)
                        counters.add("sample_bytes", nbytes)
                        count += hi - lo
                        yield batch, count, counters.snapshot(), buffers.sent()
                finally:
                    buffers.retire()

    def _batch(
        self,
        chunk: Any,
        values: list[dict[str, Any]],
        buffers: ChunkBuffers,
        lo: int,
        hi: int,
        pads: Any,
        collate: Collate,
        per_sample: bool,
        norm: Normalise | None,
        defer: bool,
    ) -> tuple[Any, int]:
        """Slots ``lo:hi`` of a decoded chunk as a batch, and its samples' bytes.

        As :meth:`read_batches` makes each batch; the bytes leave out padding samples.
        """
        n = len(values)
        columns = None if per_sample else _columns(
            values, buffers, lo, hi, chunk.keys[lo:hi], pads, self.options.zero_copy)
        if columns is not None and norm is not None:
            norm.columns(columns, buffers.empty)
        if columns is None:
            buffers.settle(0, n)  # see ChunkBuffers.settle
            samples = [self._sample(chunk, j, values, buffers, False) for j in range(lo, hi)]
            nbytes = sum(_payload_bytes(x) for x in samples if not x["__pad__"])
            return collate(samples, empty=buffers.empty
                           if buffers.pool is not None else None), nbytes
        deferred = {}
        if defer:
            for name, column in columns.items():
                if isinstance(column, torch.Tensor) and collate.as_is(name, column):
                    rows = buffers.file_rows(name, lo, hi)
                    if rows is not None:
                        deferred[name] = rows
            # a private buffer about to leave as a tensor: every noted row of the chunk is
            # read first (see ChunkBuffers.settle)
            sent = buffers.private_fields() - deferred.keys()
            if sent & columns.keys():
                buffers.settle(0, n)
            else:
                buffers.settle(lo, hi)
        nbytes = _columns_bytes(columns, ~np.asarray(pads, dtype=np.bool_))
        batch = collate.columns(columns)
        for name, rows in deferred.items():
            if batch.get(name) is not columns[name]:
                raise AssertionError(f"collate read unread rows of {name}")
            batch[name] = rows
        return batch, nbytes

    def _sample(
        self,
        chunk: Any,
        j: int,
        values: list[dict[str, Any]],
        buffers: ChunkBuffers,
        numbers: bool,
    ) -> Sample:
        """Slot ``j`` of a decoded chunk as a sample: tensors, transform, key, pad flag.

        ``numbers``: scalar parameters as 0-d tensors, else Python numbers (for a batch's
        collate); a transform always gets 0-d tensors, as it does sample by sample.
        """
        fields = values[j]
        transform = self.sources[int(chunk.source[j])].transform
        sample = to_tensors(fields, zero_copy=self.options.zero_copy,
                            given=buffers.tensors(j, fields),
                            numbers=numbers or transform is not None)
        if transform is not None:
            if buffers.pool is not None:
                # a worker's chunk buffers go back to its pool, to be written again, once
                # the batches made of them are released: a transform may keep what it is
                # given (a reference frame, the previous sample) or return it inside an
                # object no release can follow, so it is given copies of its own
                sample = {n: v.clone() if isinstance(v, torch.Tensor) else v
                          for n, v in sample.items()}
            try:
                sample = transform(sample)
            except Exception as exc:
                # the transform's own error keeps its class; the note names the sample
                exc.add_note(f"in transform {_transform_name(transform)} of sample "
                             f"{chunk.keys[j]!r}")
                raise
            if not isinstance(sample, MutableMapping):
                raise InvalidInputError(
                    f"transform {_transform_name(transform)} returned "
                    f"{type(sample).__name__}, not a dict (sample {chunk.keys[j]!r})"
                )
            for name in sample:
                if not isinstance(name, str):
                    raise InvalidInputError(
                        f"transform {_transform_name(transform)} returned a dict with the "
                        f"key {name!r} ({type(name).__name__}): field names are strings "
                        f"(sample {chunk.keys[j]!r})"
                    )
        sample["__key__"] = chunk.keys[j]
        sample["__pad__"] = bool(chunk.is_pad[j])
        return sample

    def _access(
        self, counters: Counters, limiter: RateLimiter, trusted: TrustTable | None,
        siblings: VerifiedTable | None = None,
    ) -> list[ShardAccess]:
        """Each source's shard access (fetches, cache, checks); see :meth:`_readers`."""
        opts = self.options
        trust = trusted if trusted is not None else TrustTable(self.trusted)
        # one budget of ranged blocks for every source: a buffer of each at once, within
        # a bound however many sources a mixture has
        blocks = RangeBlocks(mixture_blocks_bytes([
            range_blocks_bytes(s.buffer_blocks, s.block_bytes, opts.prefetch.range_block_bytes)
            for s in self.sources]))
        return [
            ShardAccess(s.store, counters=counters, limiter=limiter, cache=opts.cache,
                        verify=opts.verify, referenced_by=s.snapshot_id,
                        block_bytes=opts.prefetch.range_block_bytes, range_blocks=blocks,
                        siblings=siblings.scoped(i) if siblings is not None else None,
                        trusted=trust.scoped(i), node=opts.node, job_start=self.job_start)
            for i, s in enumerate(self.sources)
        ]

    def _resolver(self, counters: Counters, access: Sequence[ShardAccess]) -> Resolver:
        """A resolver of this reader's sources; its reads count in ``counters``.

        Manifest parts are read through ``access``, their rows kept on the node
        (``options.part_rows``).
        """
        return Resolver(self.sources, self.mixture, self.epoch_length, counters,
                        [tier_of(s.store) for s in self.sources],
                        part_readers=[a.read_cached for a in access],
                        rows_cache=self.options.part_rows)

    def _readers(
        self, counters: Counters, limiter: RateLimiter, trusted: TrustTable | None,
        siblings: VerifiedTable | None = None,
    ) -> tuple[list[ShardAccess], ReaderPool]:
        """Each source's shard access (fetches, cache, checks) and the readers' pool over them.

        ``trusted``: the table of files hashed earlier (default: the dataset's own);
        ``siblings``: where DataLoader workers share their hashes.
        """
        opts = self.options
        access = self._access(counters, limiter, trusted, siblings)
        pool = ReaderPool(access, opts.shard_opener or FormatOpener(),
                          opts.prefetch.max_open_shards, [s.snapshot_id for s in self.sources],
                          decode_cache_bytes=opts.prefetch.decode_cache_bytes,
                          # copies pinned ahead of their readers; open readers pin
                          # up to max_open_shards more (loader.md sizes the cache so)
                          max_prepared=opts.prefetch.shards,
                          layouts=opts.layouts if opts.node is not None else None)
        return access, pool

    def load_first_groups(
        self, world: World, num_workers: int, epoch: int, remaining: Sequence[Interval],
        batch_size: int, counters: Counters,
    ) -> None:
        """Load the manifest rows of each worker's first chunk into ``FORKED_GROUPS``.

        Called by the process about to fork ``num_workers`` DataLoader workers of rank
        ``world``: each worker's first chunk is its first batch (see :func:`prefetched`),
        whose manifest groups it then finds inherited. Reads count in ``counters``.
        """
        FORKED_GROUPS.clear()
        access = self._access(counters, RateLimiter(None), None)  # manifest parts only
        try:
            resolver = self._resolver(counters, access)
            for w in range(num_workers):
                mine = World(rank=world.rank, world_size=world.world_size, worker=w,
                             num_workers=num_workers)
                plan = plan_epoch(remaining, mine, batch_size=batch_size,
                                  remainder=self.options.remainder,
                                  epoch_length=self.epoch_length)
                first = next(plan.chunks(plan.batch_size, first_samples=plan.batch_size), None)
                if first is not None:
                    resolver.resolve(epoch, *first)
            for (src, e, g), rows in resolver.loaded():
                FORKED_GROUPS[(id(self.sources[src]), e, g)] = (self.sources[src], rows)
        finally:
            for a in access:
                a.close()

    def lookup(
        self, keys: Sequence[str], epoch: int, trusted: TrustTable | None = None
    ) -> list[Sample]:
        """The samples of ``keys`` (one source), as iteration makes them, in the order given.

        Each shard holding some of them is read once, with the checks an epoch's reads
        get (a local shard's hash, a cache copy's, a ranged read's page CRC-32s); a wrong
        hash fails the call. Reads here are not counted in the dataset's statistics.
        """
        if len(self.sources) != 1:
            raise InvalidInputError(
                "get() reads one dataset's samples; call it on a member of the mixture"
            )
        src = self.sources[0]
        opts = self.options
        counters = Counters()
        limiter = RateLimiter(opts.max_bandwidth)
        tier = tier_of(src.store)
        keys = list(keys)
        for key in keys:
            if not isinstance(key, str):
                raise InvalidInputError(f"a sample key is a string, got {type(key).__name__}")
        if not keys:
            return []
        (access,), pool = self._readers(counters, limiter, trusted)
        try:
            rows = locate(src, keys, counters, tier, access.read_cached, opts.part_rows)
            by_shard: dict[str, list[int]] = {}
            for j, (shard, _, _) in enumerate(rows):
                by_shard.setdefault(shard, []).append(j)
            reads = tuple(
                ShardRead(source=0, shard_id=shard,
                          positions=np.asarray([rows[j][1] for j in slots], dtype=np.int64),
                          out=np.asarray(slots, dtype=np.int64), epoch=epoch,
                          keys=tuple(keys[j] for j in slots))
                for shard, slots in by_shard.items()
            )
            chunk = Chunk(source=np.zeros(len(keys), dtype=np.int64),
                          is_pad=np.zeros(len(keys), dtype=np.bool_), keys=keys, reads=reads,
                          size_bytes=sum(r[2] for r in rows))
            values = read_chunk(chunk, pool, self.sources, limiter, counters, [tier],
                                side_by_side=False)
            pool.finish()  # a shard's whole hash, where it was still running
        finally:
            pool.close()
            access.close()
        buffers = ChunkBuffers(len(keys), shared=False)
        return [self._sample(chunk, j, values, buffers, True) for j in range(len(keys))]

    @contextlib.contextmanager
    def _decoded(
        self, world: World, epoch: int, remaining: Sequence[Interval], batch_size: int,
        shared_pool: SharedPool | None = None,
        siblings: VerifiedTable | None = None,
        trusted: TrustTable | None = None,
        counters: Counters | None = None,
        defer_files: bool = False,
        drop_last: bool = False,
    ) -> Iterator[tuple[Iterator[tuple[Any, tuple[list[dict[str, Any]], ChunkBuffers]]],
                        Counters]]:
        """The decoded chunks of one reader's share of the epoch, and its counters.

        ``drop_last``: whole batches only; the short last one, which the loader drops, is
        not read (its bytes, and warm cache copies only it opened, would go unreported).
        """
        plan = plan_epoch(remaining, world, batch_size=batch_size,
                          remainder=self.options.remainder, epoch_length=self.epoch_length,
                          drop_last=drop_last)
        if counters is None:
            counters = Counters()
        opts = self.options
        rate = opts.max_bandwidth / (world.world_size * world.num_workers) if (
            opts.max_bandwidth) else None
        limiter = RateLimiter(rate)
        sources = self.sources
        tiers = [tier_of(s.store) for s in sources]
        for tier in tiers:  # each store's tier is in the report, even if the cache served all
            counters.add_read(tier, 0, requests=0)
        with contextlib.ExitStack() as stack:
            stack.enter_context(short_of_threads(
                "reading " + ", ".join(s.named for s in sources)))
            stack.callback(FORKED_GROUPS.clear)  # what the first chunk did not take
            access, pool = self._readers(counters, limiter, trusted, siblings)
            stack.callback(pool.close)
            resolver = self._resolver(counters, access)

            shared = in_worker()
            # the first chunk is decoded alone: its shards' reads share the cores that
            # this process's sibling workers leave (measured: 0.074 -> 0.055 s to the first
            # batch of 256 x 8 KiB with no workers; no gain with 2 workers on 2 cores)
            first: list[ThreadPoolExecutor] = []
            spare = min(opts.prefetch.decode_threads,
                        usable_cores() // max(1, world.num_workers)) - 1
            if spare > 0:
                first.append(ThreadPoolExecutor(spare, thread_name_prefix="simstore-first"))
                stack.callback(first[0].shutdown)

            depth = decode_depth(opts.prefetch, world.num_workers if shared else 0, usable_cores())
            corrupt = None
            if opts.on_corrupt == "skip":

                def probe() -> dict[str, Any] | None:
                    # a chunk made only of corrupt shards' samples, before any intact one
                    # was read here: walk the stream for one (its own resolver: the
                    # consumer thread resolves with the other)
                    walk = self._resolver(Counters(), access)
                    for start in range(0, self.epoch_length, 64):
                        stop = min(self.epoch_length, start + 64)
                        chunk = walk.resolve(epoch, np.arange(start, stop, dtype=np.int64),
                                             np.zeros(stop - start, dtype=np.bool_))
                        got = read_chunk(chunk, pool, sources, limiter, Counters(), tiers,
                                         corrupt=corrupt, stand_in=False)
                        assert corrupt is not None
                        intact = [v for v, ok in zip(got, corrupt.intact(chunk), strict=True)
                                  if ok]
                        if intact:
                            return intact[0]
                    return None

                corrupt = CorruptShards(counters, probe, self.corrupt)
                for key in corrupt.known():
                    pool.forget(key)  # found in an earlier epoch: not downloaded again

            decoded = itertools.count()

            def decode(chunk: Any) -> tuple[list[dict[str, Any]], ChunkBuffers]:
                # "first": a chunk mapped is one not read before the first batch, but its
                # memory never comes back to the pool, and later chunks read into memory
                # that did come back faster than they map (docs/loader.md#mapped-chunks)
                mapping = opts.map_files is True or (
                    opts.map_files == "first" and next(decoded) == 0)
                buffers = ChunkBuffers(len(chunk), shared=shared, pool=shared_pool,
                                       map_files=mapping, defer_files=defer_files and mapping)
                fan_out = first.pop() if first else None
                values = read_chunk(chunk, pool, sources, limiter, counters, tiers, buffers,
                                    fan_out, side_by_side=depth > 1, corrupt=corrupt)
                if fan_out is not None:
                    fan_out.shutdown(wait=False)
                return values, buffers

            samples = sum(s.num_samples for s in sources)
            mean = sum(s.sample_bytes for s in sources) / samples if samples else 0.0
            chunks = prefetched(plan, epoch, resolver, pool,
                                dataclasses.replace(
                                    opts.prefetch, chunks=depth,
                                    chunk_samples=chunk_limit(opts.prefetch, shared)),
                                decode,
                                mean_sample_bytes=mean, first_alone=shared)
            stack.callback(chunks.close)
            yield chunks, counters
            pool.finish(corrupt)  # the whole-shard hashes still running for shards read



def _transform_name(transform: Any) -> str:
    """The caller's transform, for a message (inside the normalisation that wraps it)."""
    while isinstance(transform, Normalise) and transform.then is not None:
        transform = transform.then
    name = getattr(transform, "__qualname__", None) or type(transform).__qualname__
    return str(name)


def _columns(
    values: list[dict[str, Any]],
    buffers: ChunkBuffers,
    lo: int,
    hi: int,
    keys: list[str],
    pads: np.ndarray,
    zero_copy: bool,
) -> dict[str, Any] | None:
    """Samples ``lo:hi`` of a decoded chunk as batch columns, or None if they differ in fields.

    A field whose values are consecutive rows of a decode buffer becomes a view of those
    rows; any other becomes the list of its values (as tensors, Python numbers, strings).
    """
    first = values[lo]
    names = first.keys()
    if not all(map(names.__eq__, map(dict.keys, values[lo + 1:hi]))):
        return None
    columns: dict[str, Any] = {}
    for name in names:
        rows = buffers.rows(name, lo, hi, values)
        if rows is not None:
            columns[name] = rows
            continue
        column = [values[j][name] for j in range(lo, hi)]
        numbers = _scalar_column(column)
        if numbers is not None:
            columns[name] = numbers
            continue
        if any(isinstance(v, np.ndarray | np.generic) for v in column):
            column = [to_tensors({name: v}, zero_copy=zero_copy, numbers=False)[name]
                      for v in column]
        columns[name] = column
    columns["__key__"] = keys
    # the flags as the bool tensor collate would make of them (a copy: ``pads`` is a view
    # of the chunk's flags)
    columns["__pad__"] = torch.from_numpy(np.array(pads, dtype=np.bool_))
    return columns


def _scalar_column(column: list[Any]) -> torch.Tensor | None:
    """A column of NumPy scalars (0-d arrays) of one numeric dtype as one ``(B,)`` tensor.

    What collating their 0-d tensors would make, without a tensor per sample: for a
    batch of 256 8 KiB samples, the per-sample tensors of one scalar field and their
    stack took about a third of the loop's time. None for any other column.
    """
    types = set(map(type, column))
    if not all(t is np.ndarray or issubclass(t, np.generic) for t in types):
        return None
    dtypes = set(map(_DTYPE, column))
    if len(dtypes) != 1 or any(map(_NDIM, column)):
        return None
    (dtype,) = dtypes
    if dtype.kind not in "biuf" or not dtype.isnative:
        return None
    return torch.from_numpy(np.array(column, dtype=dtype))


_DTYPE = operator.attrgetter("dtype")
_NDIM = operator.attrgetter("ndim")


def _payload_bytes(sample: Mapping[str, Any]) -> int:
    """Logical bytes of a sample's fields (not its key and flags), as the manifest counts."""
    return sum(value_bytes(v) for k, v in sample.items() if not k.startswith("__"))


def _columns_bytes(columns: Mapping[str, Any], real: np.ndarray) -> int:
    """Logical bytes of the fields of a batch's rows that are not padding (``real``).

    Counted as :func:`_payload_bytes` counts a sample's: keys and flags count nothing; a
    tensor column's rows are all one size.
    """
    total = 0
    n, kept = len(real), int(np.count_nonzero(real))
    for name, column in columns.items():
        if name.startswith("__") or not kept:
            continue
        if isinstance(column, torch.Tensor):
            total += value_bytes(column) * kept // n
        else:
            total += sum(value_bytes(v) for v, r in zip(column, real, strict=True) if r)
    return total
