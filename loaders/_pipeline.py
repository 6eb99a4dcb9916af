"""The reading stages of one worker: resolve -> prefetch -> decode, as small iterators.

- :class:`Resolver` turns a chunk of stream positions into manifest rows (shard, position,
  key), loading groups of manifest parts as the stream reaches them.
- :func:`prefetched` keeps background work ahead of the consumer: shard fetches (cache
  fills, verification) on an I/O thread pool for the next ``prefetch.shards`` shards, and
  chunk decodes on a decode pool, at most ``prefetch.chunks`` chunks and about
  ``prefetch.budget_bytes`` of decoded samples ahead.
- :func:`read_chunk` reads a chunk's rows from the shards' readers, which a
  :class:`~simstore.loaders._readers.ReaderPool` opens lazily (so nothing is open before
  a worker starts, whatever the start method) and keeps at most ``max_open_shards`` open.

The pools are created inside the generator that uses them and shut down by it, so a
worker owns its threads and a dataset object holds none.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
from collections import OrderedDict, deque
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np
from simstore.loaders._cache import DamagedCopyError
from simstore.loaders._checks import check_int
from simstore.loaders._corrupt import CorruptShards, short_of_resources
from simstore.loaders._fetch import RateLimiter
from simstore.loaders._order import Mixture, SourceLayout
from simstore.loaders._partrows import PartRowsCache
from simstore.loaders._plan import EpochPlan
from simstore.loaders._readers import ReaderPool, ShardOpener
from simstore.loaders._source import GroupRows, PartReader, Source, load_group
from simstore.loaders._stats import Counters

from simstore.errors import (
    FormatError,
    IntegrityError,
    InvalidInputError,
    NotFoundError,
    SimstoreError,
    causes,
)
from simstore.protocols import ShardReader

log = logging.getLogger("simstore.loaders")

__all__ = [
    "Chunk",
    "PrefetchConfig",
    "ReaderPool",
    "Resolver",
    "ShardOpener",
    "ShardRead",
    "prefetched",
]



class OutBuffers(Protocol):
    """Where readers may decode a chunk's fields (``loaders._tensors.ChunkBuffers``)."""

    def take(self, slot: int, name: str, shape: Any, dtype: Any, *,
             mappable: bool = False) -> Any:
        """An array to fill for sample ``slot``'s field ``name``, or None."""
        ...

    def take_many(self, slots: list[int], name: str, shape: Any, dtype: Any) -> Any:
        """``(buffer, slot index array, row arrays)`` for several samples, or None."""
        ...


Decoded = dict[str, Any]
T = TypeVar("T")
U = TypeVar("U")


@dataclass(frozen=True, slots=True, kw_only=True)
class PrefetchConfig:
    """How far background reading runs ahead, and with how many threads.

    A chunk (the unit of decoding) holds at most ``chunk_samples`` samples and about
    ``chunk_bytes`` of them (judged by the snapshot's mean sample size), so the first
    sample waits for one small chunk, not a large one. Memory held by prefetching is
    about ``budget_bytes`` of decoded samples plus, for
    ranged reads, a source's blocks (``loaders._ranged.RangeBlocks``: one shuffle
    buffer's bytes, 80 MiB by default), plus up to ``decode_cache_bytes`` of
    decoded row groups (Parquet) shared by the worker's open shards, so a shuffled read
    decodes each row group about once. Ranged reads fetch aligned blocks of
    ``range_block_bytes`` and coalesce neighbouring ones into one request.

    ``budget_bytes`` is 128 MiB: three chunks of 4 MiB samples in batches of 8 (a chunk's
    size counts its samples' manifest bytes, a little over 32 MiB for such a batch, so a
    budget of 64 MiB let only one decode run at a time: one epoch of 384 MiB of them with
    no workers took a median 0.15 s against 0.10 s with 128 MiB, the decodes then running
    on both cores), and the four chunks ahead of 8 KiB samples. Chunk buffers come from
    a pool of mapped memory (``loaders._tensors.BufferPool``), so a deeper queue costs no
    fresh page faults once the pool is warm.

    ``chunk_samples`` defaults to 2048 in a process with no DataLoader workers, so for small
    samples ``chunk_bytes`` sets the size: the work of a chunk (resolving its rows, a
    gather per page of each row group it draws from) is spread over more samples. 8 KiB
    samples in batches of 256, in one process, alternating: epochs 0.261-0.343 s with
    chunks of 64 samples (one batch), 0.203-0.242 with 1024, 0.178-0.222 with 2048 (the
    16 MiB cap). The first chunk is one batch whatever the size, so the first batch does
    not wait for a bigger chunk. In a worker it defaults to 64 (see :func:`chunk_limit`).

    ``chunks`` (decoded chunks kept ahead) defaults to 4 in a process with no DataLoader
    workers and, in a worker, to ``cores / workers`` between 1 and 4 (see
    :func:`decode_depth`): the DataLoader already queues two batches per worker, and a
    deeper queue inside each worker only holds memory that its siblings' cores need.
    """

    chunks: int | None = None
    shards: int = 8
    budget_bytes: int = 128 << 20
    chunk_samples: int | None = None
    chunk_bytes: int = 16 << 20
    io_threads: int = 4
    decode_threads: int = 2
    max_open_shards: int = 16
    range_block_bytes: int = 1 << 20
    decode_cache_bytes: int = 256 << 20

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None and f.name in ("chunks", "chunk_samples"):
                continue
            # 0 decode cache bytes: none; every other field counts something there must be
            minimum = 0 if f.name == "decode_cache_bytes" else 1
            object.__setattr__(self, f.name,
                               check_int(value, f"prefetch {f.name}", minimum=minimum))


WORKER_CHUNK_SAMPLES = 64
"""A DataLoader worker's default ``chunk_samples``."""
CHUNK_SAMPLES = 2048
"""The default ``chunk_samples`` of a process with no DataLoader workers."""


def chunk_limit(config: PrefetchConfig, in_worker: bool) -> int:
    """Samples per chunk at most: ``config.chunk_samples``, or its default for this process.

    A worker's chunks stay near one batch: the DataLoader takes batches from its workers
    in turn, so a worker decoding a chunk of many batches holds back the batches of its
    siblings queued behind its own. In two runs of the local suite with chunks of up to
    2048 samples in workers too, 8 KiB samples with 2 workers went from 1.54-1.63x to
    1.34-1.36x LitData and their first batch from 0.11-0.13 to 0.13-0.16 s (A/B runs of
    the same change saw no difference: 1.00x); with no workers the larger chunks are
    1.35x faster.
    """
    if config.chunk_samples is not None:
        return config.chunk_samples
    return WORKER_CHUNK_SAMPLES if in_worker else CHUNK_SAMPLES


def decode_depth(config: PrefetchConfig, num_workers: int, cores: int) -> int:
    """Decoded chunks kept ahead: ``config.chunks``, or its default for this process.

    With no DataLoader workers, 4; in one of ``num_workers`` workers, ``cores /
    num_workers`` between 1 and 4. With 2 workers on 2 cores, a depth of 1 against 4
    (``benchmarks.ab_epochs``, one epoch per process, 8 rounds): 4 MiB samples 0.355 ->
    0.322 s (1.11x), 8 KiB samples 0.331 -> 0.322 s (1.05x, within the noise).
    """
    if config.chunks is not None:
        return config.chunks
    if num_workers <= 0:
        return 4
    return max(1, min(4, cores // num_workers))


@dataclass(frozen=True, slots=True)
class ShardRead:
    """The rows a chunk needs from one shard, and where they go in the chunk."""

    source: int
    shard_id: str
    positions: np.ndarray
    out: np.ndarray
    epoch: int
    keys: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Chunk:
    """A resolved run of stream positions."""

    source: np.ndarray
    is_pad: np.ndarray
    keys: list[str]
    reads: tuple[ShardRead, ...]
    size_bytes: int

    def __len__(self) -> int:
        return len(self.keys)


class Resolver:
    """Maps stream positions of an epoch to manifest rows; caches a few layouts and groups."""

    def __init__(
        self,
        sources: Sequence[Source],
        mixture: Mixture,
        epoch_length: int,
        counters: Counters,
        tiers: Sequence[str],
        *,
        max_groups: int = 4,
        part_readers: Sequence[PartReader | None] | None = None,
        rows_cache: PartRowsCache | None = None,
    ) -> None:
        self.sources = sources
        self.mixture = mixture
        self.epoch_length = epoch_length
        self.counters = counters
        self.tiers = tiers
        self.part_readers = part_readers or [None] * len(sources)
        """How each source's manifest parts are read (None: from its store)."""
        self.rows_cache = rows_cache
        """The node's decoded manifest rows, for every source (None: decode each part)."""
        self.max_groups = max(max_groups, 2 * len(sources))
        self._layouts: OrderedDict[tuple[int, int], SourceLayout] = OrderedDict()
        self._groups: OrderedDict[tuple[int, int, int], GroupRows] = OrderedDict()

    def _layout(self, src: int, epoch: int) -> SourceLayout:
        key = (src, epoch)
        lay = self._layouts.get(key)
        if lay is None:
            lay = self._layouts[key] = self.sources[src].layout(epoch)
            while len(self._layouts) > 2 * len(self.sources):
                self._layouts.popitem(last=False)
        self._layouts.move_to_end(key)
        return lay

    def _group(self, src: int, epoch: int, group: int) -> GroupRows:
        key = (src, epoch, group)
        rows = self._groups.get(key)
        if rows is None:
            source = self.sources[src]
            # taken out once used: the resolver keeps it from here on, as long as it
            # keeps any group
            forked = FORKED_GROUPS.pop((id(source), epoch, group), None)
            if forked is not None and forked[0] is source:
                rows = forked[1]
            else:
                rows = load_group(source, self._layout(src, epoch), epoch, group,
                                  self.counters, self.tiers[src], self.part_readers[src],
                                  self.rows_cache)
            self._groups[key] = rows
            while len(self._groups) > self.max_groups:
                self._groups.popitem(last=False)
        self._groups.move_to_end(key)
        return rows

    def loaded(self) -> list[tuple[tuple[int, int, int], GroupRows]]:
        """The groups held now, as ``((source, epoch, group), rows)``."""
        return list(self._groups.items())

    def resolve(self, epoch: int, positions: np.ndarray, is_pad: np.ndarray) -> Chunk:
        """The manifest rows of ``positions`` of epoch ``epoch``."""
        n = len(positions)
        src, q = self.mixture.locate(epoch * self.epoch_length + positions)
        keys: list[str] = [""] * n
        reads: list[ShardRead] = []
        size = 0
        for i in _distinct(src):
            sel = np.flatnonzero(src == i)
            total = self.sources[i].num_samples
            sub_epoch, pos = np.divmod(q[sel], total)
            for e in _distinct(sub_epoch):
                esel = sel[sub_epoch == e]
                epos = pos[sub_epoch == e]
                lay = self._layout(i, e)
                groups = lay.group_of(epos)
                for g in _distinct(groups):
                    rows = self._group(i, e, g)
                    idx = epos[groups == g] - int(lay.group_starts[g])
                    out = esel[groups == g]
                    gkeys = rows.keys.take(idx)
                    for o, k in zip(out.tolist(), gkeys, strict=True):
                        keys[o] = k
                    size += int(rows.size_bytes[idx].sum())
                    codes = rows.shard[idx]
                    for c in np.unique(codes).tolist():
                        m = codes == c
                        reads.append(ShardRead(
                            i, rows.shard_ids[c], rows.position[idx[m]], out[m], e,
                            tuple(itertools.compress(gkeys, m.tolist())),
                        ))
        return Chunk(source=src, is_pad=is_pad, keys=keys, reads=tuple(reads), size_bytes=size)


FORKED_GROUPS: dict[tuple[int, int, int], tuple[Source, GroupRows]] = {}
"""Groups of manifest rows loaded for the DataLoader workers about to be forked.

The process that starts fork workers loads the group each worker's first chunk needs
(:meth:`EpochReader.load_first_groups`) and empties this table once they are forked: each
worker inherits it, and its first chunk does not read and shuffle the same manifest parts
as every sibling does at once. A worker takes an entry out when it uses it, and empties
the table when its iteration ends (the entries its siblings' first batches needed).
Keyed by the source's identity (a frozen object the processes share), the epoch and the
group; the entry holds the source, so no other object can take its identity while the
entry is kept."""


def _distinct(values: np.ndarray) -> list[int]:
    """The distinct values of ``values`` in ascending order (usually one: checked first)."""
    if len(values) and (values == values[0]).all():
        return [int(values[0])]
    return [int(v) for v in np.unique(values)]


def read_chunk(
    chunk: Chunk,
    pool: ReaderPool,
    sources: Sequence[Source],
    limiter: RateLimiter,
    counters: Counters,
    tiers: Sequence[str],
    buffers: OutBuffers | None = None,
    fan_out: Executor | None = None,
    side_by_side: bool = True,
    corrupt: CorruptShards | None = None,
    stand_in: bool = True,
) -> list[Decoded]:
    """Decode a chunk's samples, in chunk order, reading each shard's rows in one call.

    With ``buffers``, readers that can (``supports_out``) decode fixed-shape fields straight
    into the chunk's buffers, in chunk order. With ``fan_out``, the shards' reads run on
    its threads as well as this one (the first chunk, decoded alone, uses every core).
    With ``corrupt`` (``on_corrupt="skip"``), the samples of a shard that fails its checks
    are stood in for by an intact sample, marked as padding (``stand_in=False``: left
    empty, for :meth:`CorruptShards.probe`).
    """

    def one(read: ShardRead) -> tuple[ShardRead, list[Decoded], np.ndarray]:
        # out of shared memory, descriptors, disk space: the shard is not to blame
        # (under on_corrupt="skip" it was taken for corrupt, its samples stood in for)
        with short_of_resources(pool._name((read.source, read.shard_id))):
            return again_if_damaged(read)

    def again_if_damaged(read: ShardRead) -> tuple[ShardRead, list[Decoded], np.ndarray]:
        try:
            return once(read)
        except DamagedCopyError as exc:
            # the node's copy went bad on its disk and is out of the cache: the store's
            # object is read again, into a new copy hashed as it is filled
            log.warning("%s: reading the shard again from the store", exc)
            pool.drop((read.source, read.shard_id))
            # the copy at the path may still be the damaged file (rewritten in place)
            settled = pool.access[read.source].settle_copy(read.shard_id)
            if settled or _taken_out(exc):  # once per copy, by the process that took it out
                counters.add("cache_damaged")
            return once(read)

    def once(read: ShardRead) -> tuple[ShardRead, list[Decoded], np.ndarray]:
        src = sources[read.source]
        key = (read.source, read.shard_id)
        uniq, first, inverse = np.unique(read.positions, return_index=True, return_inverse=True)
        with pool.reader(key, functools.partial(_checked_bytes, uniq, src.fields)) as reader:
            mode = pool.access[read.source].mode(read.shard_id)
            try:
                keys = [read.keys[int(j)] for j in first]
                alloc = None
                if buffers is not None and getattr(reader, "supports_out", False):
                    alloc = _SlotAlloc(buffers, read.out[first].tolist(), fan_out)
                values = _read(reader, uniq.tolist(), src, read.epoch, keys, alloc)
            except NotFoundError as exc:  # gone while read: the snapshot names it
                raise IntegrityError(f"{pool._name(key)}: {exc} (it is missing)") from exc
            except SimstoreError as exc:
                raise type(exc)(f"{pool._name(key)}: {exc}") from exc
            except Exception as exc:
                raise FormatError(f"{pool._name(key)}: reading rows failed: {exc}") from exc
        if len(values) != len(uniq):
            raise FormatError(
                f"{pool._name(key)}: asked for {len(uniq)} rows, the reader gave {len(values)}"
            )
        nbytes = sum(_nbytes(v) for v in values)
        if mode != "ranged":
            # a ranged read was charged to the limit as its GETs were made (ShardAccess):
            # charged again here, a job without a cache read at half its cap (an audit)
            counters.add("throttle_s", limiter.take(nbytes))
            counters.add_read("cache" if mode == "cache" else tiers[read.source], nbytes)
        return read, values, inverse

    def guarded(read: ShardRead) -> tuple[ShardRead, list[Decoded] | None, np.ndarray]:
        key = (read.source, read.shard_id)
        assert corrupt is not None
        if not corrupt.is_bad(key):
            try:
                return one(read)
            except CorruptShards.SKIPPED as exc:
                if CorruptShards.environmental(exc):
                    raise  # out of descriptors, say: the shard is not to blame
                corrupt.failed(key, exc)
        else:
            pool.forget(key)  # scheduled with its chunk, and never to be read
        return read, None, read.out

    out: list[Decoded | None] = [None] * len(chunk)
    skipped: list[int] = []
    # chunks decoding side by side start at different shards, so their threads do not
    # queue for the same reader (one user at a time) while another sits idle; one chunk
    # at a time reads its shards in stream order (out of it, the reader-count limit could
    # close a shard the next chunk opens again)
    reads = chunk.reads
    k = pool.rotation() % len(reads) if reads and side_by_side else 0
    reads = reads[k:] + reads[:k]
    if fan_out is not None:
        # the most rows on this thread, the rest first on fan_out's, which then help
        # this one with its checks (``_SlotAlloc.helpers``)
        reads = tuple(sorted(reads, key=lambda r: -len(r.positions)))
    each = one if corrupt is None else guarded
    for read, values, inverse in _map(each, reads, fan_out):
        if values is None:
            skipped += read.out.tolist()
            continue
        for j, o in enumerate(read.out.tolist()):
            value = values[int(inverse[j])]
            out[o] = value if out[o] is None else dict(value)
    result = [v if v is not None else {} for v in out]
    if corrupt is not None:
        corrupt.keep(result, skipped)
        if skipped and stand_in:
            with short_of_resources("on_corrupt='skip': a stand-in sample"):
                corrupt.stand_in(chunk, result, skipped, buffers)
    return result


def _taken_out(exc: BaseException) -> bool:
    """Whether a :class:`DamagedCopyError` took the copy out here (along its causes)."""
    return any(isinstance(e, DamagedCopyError) and e.taken_out for e in causes(exc))


def _checked_bytes(positions: np.ndarray, fields: Sequence[str] | None,
                   reader: ShardReader) -> int:
    """Bytes a read of ``positions`` would check page by page (0 if the reader cannot say)."""
    checked = getattr(reader, "checked_bytes", None)
    return int(checked(positions, fields)) if callable(checked) else 0


def _map(fn: Callable[[T], U], items: Sequence[T], executor: Executor | None) -> list[U]:
    """``[fn(x) for x in items]``, the items after the first on ``executor`` when given.

    Every call has finished when this returns or raises (the first error is raised).
    """
    if executor is None or len(items) < 2:
        return [fn(x) for x in items]
    futures = [executor.submit(fn, x) for x in items[1:]]
    try:
        head = fn(items[0])
    finally:
        wait(futures)
    return [head, *(f.result() for f in futures)]


@dataclass(frozen=True, slots=True)
class _SlotAlloc:
    """A reader's ``out=``: the ``j``-th asked position's arrays, from its chunk slot.

    ``helpers``: threads the read may hand some of its checks to (the first chunk's
    ``fan_out``; see ``ParquetShardReader._share``).
    """

    buffers: OutBuffers
    slots: list[int]
    helpers: Executor | None = None

    def __call__(self, j: int, name: str, shape: Any, dtype: Any, *,
                 mappable: bool = False) -> Any:
        """``mappable``: the reader will offer every chunk of the value to :meth:`map_file`."""
        return self.buffers.take(self.slots[j], name, shape, dtype, mappable=mappable)

    def map_file(self, array: np.ndarray, fd: int, offset: int, check: bool = True) -> bool:
        """Let the buffers fill ``array`` (a row given here) from a file, if they can.

        See ``ChunkBuffers.map_file``; ``check``: the reader checks the bytes next.
        """
        mapper = getattr(self.buffers, "map_file", None)
        return bool(mapper(array, fd, offset, check)) if mapper is not None else False

    @property
    def maps_files(self) -> bool:
        """Whether :meth:`map_file` may take any bytes (False: it declines all of them)."""
        return bool(getattr(self.buffers, "maps_files", True))

    def many(self, js: Any, name: str, shape: Any, dtype: Any) -> Any:
        """``(buffer, rows of it, row arrays)`` for asked positions ``js``, or None."""
        slots = self.slots
        return self.buffers.take_many([slots[j] for j in js], name, shape, dtype)


def _read(
    reader: ShardReader,
    positions: list[int],
    src: Source,
    epoch: int,
    keys: list[str],
    alloc: Callable[[int, str, Any, Any], Any] | None = None,
) -> list[Decoded]:
    regions = src.regions
    names = list(src.fields) if src.fields is not None else [s.name for s in src.schema]
    # the cropped fields this shard holds (an evolved dataset's older shards may hold none,
    # and a shard of small samples routed to Parquet may lack a large field)
    shard_schema = getattr(reader, "schema", None)
    held = {s.name for s in shard_schema} if shard_schema is not None else set(names)
    boxed = [n for n in names if regions is not None and n in regions.fields and n in held]
    if regions is None or not boxed:
        if alloc is not None:
            return list(reader.read(positions, src.fields, out=alloc))  # type: ignore[call-arg]
        return list(reader.read(positions, src.fields))
    read_slices = getattr(reader, "read_slices", None)
    array = getattr(reader, "array", None)
    has_field = getattr(reader, "has_field", None)
    if not callable(read_slices) or not callable(array):
        asked = ", ".join(repr(n) for n in boxed)
        raise InvalidInputError(
            f"crop= and window= (of {asked}) need a shard format with region reads (Zarr); "
            f"this shard is read by {type(reader).__name__}"
        )
    values = list(reader.read(positions, [n for n in names if n not in regions.fields]))
    for value, position, key in zip(values, positions, keys, strict=True):
        boxes = {
            name: regions.box(name, array(position, name).shape, seed=src.seed, epoch=epoch,
                              key=key)
            for name in boxed
            # a sample without the field reads as without a crop: it lacks it
            if not callable(has_field) or has_field(position, name)
        }
        value.update(read_slices(position, boxes))
    return values


def _nbytes(sample: Decoded) -> int:
    total = 0
    for value in sample.values():
        if isinstance(value, np.ndarray):
            total += value.nbytes
        elif isinstance(value, bytes | str):
            total += len(value)
        else:
            total += 8
    return total


def prefetched(
    plan: EpochPlan,
    epoch: int,
    resolver: Resolver,
    pool: ReaderPool,
    config: PrefetchConfig,
    decode: Callable[[Chunk], T],
    *,
    mean_sample_bytes: float = 0.0,
    first_alone: bool = False,
) -> Generator[tuple[Chunk, T], None, None]:
    """Decoded chunks of ``plan`` in order, with fetches and decodes running ahead.

    The local shards' whole-object hashes wait for the first chunk (see
    :meth:`ReaderPool.schedule`); this generator lets them start. ``first_alone``: nothing
    more starts (decodes, fetches, those hashes) until the consumer asks for the chunk
    after the first one (but fetches, where the first chunk itself waits for a download
    into the disk cache): in a DataLoader worker, the first batch then leaves the process
    without this process's threads holding the cores and the interpreter (see
    ``SimDataLoader``).
    """
    # the caller (SimDataset) resolves chunk_samples and chunks for its process; unset,
    # they are a process's without workers
    per_chunk = chunk_limit(config, in_worker=False)
    if mean_sample_bytes > 0:
        per_chunk = max(1, min(per_chunk, int(config.chunk_bytes // mean_sample_bytes)))
    # whole batches per chunk, so a batch is consecutive rows of its chunk's buffers
    batch = plan.batch_size
    per_chunk = max(batch, per_chunk // batch * batch) if batch > 1 else per_chunk
    # the first chunk is one batch: the first batch waits for its rows' row groups to
    # decode, not also for a whole chunk's rows to be gathered
    cuts = plan.chunks(per_chunk, first_samples=batch)
    chunks = (resolver.resolve(epoch, p, pad) for p, pad in cuts)
    io = ThreadPoolExecutor(config.io_threads, thread_name_prefix="simstore-io")
    dec = ThreadPoolExecutor(config.decode_threads, thread_name_prefix="simstore-decode")
    ahead: deque[Chunk] = deque()
    decoding: deque[tuple[Chunk, Future[T]]] = deque()
    in_flight = 0
    depth = decode_depth(config, 0, 1)
    exhausted = False
    def resolve_ahead(limit: int) -> None:
        nonlocal exhausted
        added = 0
        while (
            not exhausted
            and added < limit
            and _shards_ahead(ahead, pool) < config.shards
            and len(ahead) < 64
        ):
            chunk = next(chunks, None)
            if chunk is None:
                exhausted = True
                break
            for read in chunk.reads:
                pool.schedule((read.source, read.shard_id), io)
            ahead.append(chunk)
            added += 1

    def submit(limit: int) -> None:
        nonlocal in_flight
        while (
            ahead
            and len(decoding) < limit
            and (not decoding or in_flight + ahead[0].size_bytes <= config.budget_bytes)
        ):
            chunk = ahead.popleft()
            decoding.append((chunk, dec.submit(decode, chunk)))
            in_flight += chunk.size_bytes

    def refill(chunks_ahead: int) -> None:
        resolve_ahead(chunks_ahead)
        submit(depth)

    follow: Future[None] | None = None
    taken = 0  # decoded chunks taken out of ``decoding``
    try:
        while True:
            # The first chunk is resolved and decoded alone: the first batch shares the
            # cores with no other decode. From then on, resolve a few chunks ahead per
            # chunk handed out (shard fetches are scheduled early without a burst of work
            # up front) and keep up to ``depth`` decoding.
            if follow is not None:
                done, follow = follow, None
                done.result()  # its failure to resolve comes with the next chunk
            first = taken == 0
            # the second chunk's successors are resolved while it goes out (below)
            second = taken == 1 and not first_alone
            if not ahead and not decoding:
                resolve_ahead(1)
            submit(1 if first else depth)
            if not first and not second:
                refill(4)
            elif first and decoding and pool.downloads(
                    (r.source, r.shard_id) for r in decoding[0][0].reads):
                # the first chunk waits for downloads into the disk cache: meanwhile the
                # shards after it are scheduled (the I/O pool takes them in order, behind
                # the first chunk's own), so the last of them do not come one at a time
                # after the first batch (a cold epoch ended with one shard's lone GET)
                resolve_ahead(64)
            if not decoding:
                return
            chunk, fut = decoding.popleft()
            in_flight -= chunk.size_bytes
            value = fut.result()
            taken += 1
            if first:
                if first_alone:  # resumed once the first chunk is out
                    yield chunk, value
                # the first chunk is decoded: the local shards' hashes may run now, and
                # the next chunks decode while its batches go out
                pool.start_hashing()
                if first_alone:
                    refill(4)
                    continue
                # The next chunk is resolved and its decode started while the first goes
                # out, not before (resolving is work for the interpreter: 0.6 ms of the
                # first batch of 256 x 8 KiB when this thread did it), on a decode thread,
                # idle now (the first chunk was decoded alone). The consumer, once back,
                # waits for it first (the top of the loop): no two threads touch the
                # chunks ahead at once.
                follow = dec.submit(refill, 1)
            elif second:
                # The same for the four after the second chunk, while it goes out (every
                # decode thread idle again: the one decode submitted is this chunk's):
                # resolved as the consumer came back, they were 3 ms of the second batch's
                # wait after a training step. Later chunks are resolved here, as the
                # consumer asks: resolved on a thread while batches were out, 8 KiB epochs
                # with no workers took 1.25x as long (the two threads' turns at the
                # interpreter).
                follow = dec.submit(refill, 4)
            yield chunk, value
    finally:
        if follow is not None:  # closed while it runs: it adds to ``decoding``
            wait([follow])
        for _, fut in decoding:
            fut.cancel()
        pool.start_hashing()  # no io thread may wait for a first chunk that never comes
        dec.shutdown(wait=True, cancel_futures=True)
        io.shutdown(wait=True, cancel_futures=True)


def _shards_ahead(ahead: deque[Chunk], pool: ReaderPool) -> int:
    """Shards of the chunks ahead that are scheduled but not yet open in a reader.

    A shard a reader has opened does not count: once the shards of one shuffle window are
    open, the chunks of the next window are resolved and their shards fetched while this
    one decodes. (Counting every shard ahead stopped resolving at the window's own
    shards: a cold epoch of three windows from S3 fetched a window, decoded it, then
    fetched the next.) A fetched shard still waiting for its reader counts, so at most
    ``prefetch.shards`` copies wait in the cache (not counting them let a reader with a
    small cache fetch far ahead and evict copies before their use).
    """
    keys = {(r.source, r.shard_id) for c in ahead for r in c.reads}
    return sum(map(pool.is_pending, keys))
