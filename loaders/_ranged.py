"""Reads of a remote object's byte ranges, paced by ``max_bandwidth`` and counted per tier.

:class:`RangedFile` is the loader's way to a remote shard with no disk cache (see
:mod:`._fetch`); :class:`RateLimiter` paces every remote read of a process, and
:func:`count_retries` and :func:`billed_if_failed` count requests the way the store is billed.
"""

from __future__ import annotations

import contextlib
import io
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator

from simstore.loaders._stats import Counters

from simstore.errors import NotFoundError, StorageError
from simstore.storage import ObjectStore
from simstore.storage._base import never_sent

__all__ = ["RangeBlocks", "RangedFile", "RateLimiter", "billed_if_failed", "count_retries",
           "MIN_RANGE_BLOCKS_BYTES", "mixture_blocks_bytes", "range_blocks_bytes", "tier_of"]


def tier_of(store: ObjectStore) -> str:
    """The tier name a store's reads are counted under (``local``, ``s3``, ``memory``...)."""
    url = str(getattr(store, "url", ""))
    if "://" not in url:
        return "local"
    scheme = url.split("://", 1)[0]
    return "local" if scheme == "file" else scheme


def count_retries(store: ObjectStore, counters: Counters, tier: str) -> None:
    """Count the attempts ``store`` retries as reads of ``tier`` (they were billed too).

    A store that retries on its own (S3) tells each failed attempt before the last through
    ``on_retry``; the loader counts each call's last attempt where it makes the call.
    """
    if hasattr(store, "on_retry"):
        store.on_retry = lambda _request, received: counters.add_read(tier, received)


@contextlib.contextmanager
def billed_if_failed(counters: Counters, tier: str) -> Iterator[None]:
    """Count a request made within this block that failed for good, as it was billed.

    The store tells the attempts it retried (``count_retries``); a call's last attempt
    is counted by its caller where the call returns, so one that raised went uncounted.
    A connect that was refused or timed out reached no server and is not counted.
    """
    try:
        yield
    except (StorageError, NotFoundError) as exc:
        if not never_sent(exc):
            counters.add_read(tier, 0)
        raise


class RateLimiter:
    """A token bucket of ``rate_bytes_per_s``; :meth:`take` sleeps until the bytes fit.

    Shared by the threads of one process. ``clock`` and ``sleep`` are injectable for tests.
    """

    def __init__(
        self,
        rate_bytes_per_s: float | None,
        *,
        burst_s: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.rate = rate_bytes_per_s
        self.burst = (rate_bytes_per_s or 0) * burst_s
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._tokens = self.burst
        self._last = clock()

    def take(self, nbytes: int) -> float:
        """Wait until ``nbytes`` may be read; returns the seconds waited."""
        if not self.rate or nbytes <= 0:
            return 0.0
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
            self._last = now
            self._tokens -= nbytes
            wait = -self._tokens / self.rate if self._tokens < 0 else 0.0
        if wait > 0:
            self._sleep(wait)
        return wait


class RangeBlocks:
    """Blocks of ranged reads kept for a reading process's ranged files, within a budget.

    Shared by every :class:`RangedFile` of a reading process's sources, keyed by store,
    object and block number, least recently used out first. One budget for all the
    files, not one per file: a shuffle buffer draws its rows from the blocks of one or
    many shards, and all of them must stay until its rows are read, or each block is
    fetched again for nearly every sample taken from it (a shuffled epoch of one 44 MB
    Zarr shard of 8 KiB samples fetched 3.2x its bytes through 32 MiB per file).
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._blocks: OrderedDict[tuple[str, int], bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()  # the files are read on several threads

    def get(self, key: str, block: int) -> bytes | None:
        """Block ``block`` of object ``key`` (its store's URL and key), if kept (now newest)."""
        with self._lock:
            data = self._blocks.get((key, block))
            if data is not None:
                self._blocks.move_to_end((key, block))
            return data

    def put(self, key: str, block: int, data: bytes) -> None:
        """Keep block ``block`` of object ``key``; the oldest go past the budget."""
        with self._lock:
            old = self._blocks.pop((key, block), None)
            if old is not None:
                self._bytes -= len(old)
            self._blocks[(key, block)] = data
            self._bytes += len(data)
            while self._bytes > self.max_bytes and len(self._blocks) > 1:
                _, out = self._blocks.popitem(last=False)
                self._bytes -= len(out)

    @property
    def nbytes(self) -> int:
        """Bytes of the blocks kept."""
        with self._lock:
            return self._bytes


MIN_RANGE_BLOCKS_BYTES = 32 << 20
"""The least a reading process keeps of ranged blocks (and a lone ranged file, of its own)."""
MAX_RANGE_BLOCKS_BYTES = 512 << 20
"""The most a reading process keeps of ranged blocks for a mixture of many sources."""


def range_blocks_bytes(buffer_blocks: int, shuffle_block_bytes: int, block_bytes: int) -> int:
    """The blocks budget for a source shuffled in buffers of ``buffer_blocks`` blocks.

    A buffer's rows lie in ``buffer_blocks`` blocks of about ``shuffle_block_bytes``, each
    covered by at most one more ranged block than its own size in them; at least 32 MiB.
    """
    return max(MIN_RANGE_BLOCKS_BYTES, buffer_blocks * (shuffle_block_bytes + block_bytes))


def mixture_blocks_bytes(budgets: list[int]) -> int:
    """The blocks budget of a reading process whose sources need ``budgets`` each.

    Their sum (a mixture reads a buffer of each source at once), at most
    :data:`MAX_RANGE_BLOCKS_BYTES` unless one source alone needs more.
    """
    return min(sum(budgets), max(max(budgets), MAX_RANGE_BLOCKS_BYTES))


class RangedFile(io.RawIOBase):
    """A read-only, seekable file over one stored object, read by ranged GETs.

    A read of at least ``block_bytes`` is one GET of exactly its range, less the cached
    blocks at its ends (:meth:`_large`). Smaller reads are served from aligned blocks of
    ``block_bytes``; the blocks a read lacks are fetched with one GET per run of
    neighbouring blocks and kept in ``blocks`` (shared with the reading process's other
    ranged files; one of ``max_cached_bytes`` of its own if not given), so a reader's small
    neighbouring reads (footers, pages, headers) coalesce into one request.
    """

    def __init__(
        self,
        store: ObjectStore,
        key: str,
        size_bytes: int,
        *,
        counters: Counters,
        limiter: RateLimiter,
        block_bytes: int = 1 << 20,
        max_cached_bytes: int = MIN_RANGE_BLOCKS_BYTES,
        blocks: RangeBlocks | None = None,
    ) -> None:
        super().__init__()
        self.store = store
        self.key = key
        self.size = size_bytes
        self.block = block_bytes
        self._blocks = blocks if blocks is not None else RangeBlocks(max_cached_bytes)
        self._name = f"{store.url}/{key}"
        """The object's name among the blocks (another store may hold the same key)."""
        self._span: tuple[int, memoryview] | None = None
        """Bytes fetched ahead for the reads a reader said are next (:meth:`will_read`)."""
        self._pos = 0
        self._counters = counters
        self._limiter = limiter
        self._tier = tier_of(store)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        view = memoryview(buffer).cast("B")
        end = min(self.size, self._pos + len(view))
        if end <= self._pos:
            return 0
        span = self._span
        if span is not None and span[0] <= self._pos and end <= span[0] + len(span[1]):
            n = end - self._pos
            view[:n] = span[1][self._pos - span[0] : end - span[0]]
            self._pos = end
            return n
        data = self._range(self._pos, end)
        view[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def will_read(self, lo: int, hi: int) -> None:
        """Fetch bytes ``lo:hi`` in one request now: the reads that follow lie inside them.

        For a reader that knows the extent of what it reads next, laid out end to end (a
        Zarr sample's metadata documents and chunks): one GET for all of them, not one or
        two per entry. Reads wholly inside are served from these bytes until
        :meth:`done_reading` (or the next call); any other read goes the usual way.
        Nothing is fetched for less than a block: the aligned blocks serve such extents
        better (a block's request holds neighbouring samples too); nor what blocks held
        at its ends already hold (those an open's reads pulled in, say).
        """
        self._span = None
        hi = min(hi, self.size)
        if lo >= 0 and hi - lo >= self.block:
            self._span = (lo, memoryview(self._large(lo, hi)))

    def done_reading(self) -> None:
        """Let go of the bytes :meth:`will_read` fetched."""
        self._span = None

    def close(self) -> None:
        self._span = None
        super().close()

    def _get(self, lo: int, hi: int) -> bytes:
        self._counters.add("throttle_s", self._limiter.take(hi - lo))
        with billed_if_failed(self._counters, self._tier):
            data = self.store.get(self.key, byte_range=(lo, hi))
        self._counters.add_read(self._tier, len(data))
        return data

    def _range(self, start: int, end: int) -> bytes:
        if end - start >= self.block:
            # a large read (a column chunk, a row group) is fetched exactly, in one request
            return self._large(start, end)
        first, last = start // self.block, (end - 1) // self.block
        # held here as well as kept: another thread's blocks may push these out meanwhile
        have: dict[int, bytes] = {}
        runs: list[list[int]] = []
        for b in range(first, last + 1):
            kept = self._blocks.get(self._name, b)
            if kept is not None:
                have[b] = kept
            elif runs and runs[-1][-1] == b - 1:
                runs[-1].append(b)
            else:
                runs.append([b])
        for run in runs:
            lo = run[0] * self.block
            data = self._get(lo, min(self.size, (run[-1] + 1) * self.block))
            for i, b in enumerate(run):
                have[b] = data[i * self.block : (i + 1) * self.block]
                self._blocks.put(self._name, b, have[b])
        parts = [have[b] for b in range(first, last + 1)]
        joined = b"".join(parts) if len(parts) > 1 else parts[0]
        off = start - first * self.block
        return joined[off : off + (end - start)]

    def _large(self, start: int, end: int) -> bytes:
        """Bytes ``start:end`` (a block or more): one GET, less what cached blocks hold.

        A Zarr shard's small reads (a sample's metadata, a zip header) pull in the aligned
        block around them, and the sample's chunk that follows was then fetched again in
        full: each byte of a sample twice (1.94x a Zarr store's bytes read without a
        cache). The blocks held at either end of the range are used; what lies between
        them is one request.
        """
        head: list[bytes] = []
        tail: list[bytes] = []
        lo, hi = start, end
        while lo < hi:  # cached blocks at the start
            b = lo // self.block
            blk = self._blocks.get(self._name, b)
            if blk is None:
                break
            upto = min(hi, b * self.block + len(blk))
            if upto <= lo:  # a block cut short (the object shrank since its size was read)
                break
            head.append(blk[lo - b * self.block : upto - b * self.block])
            lo = upto
        while hi > lo:  # and at the end
            b = (hi - 1) // self.block
            blk = self._blocks.get(self._name, b)
            base = b * self.block
            if blk is None or base + len(blk) < hi:
                break
            first = max(lo, base)
            tail.append(blk[first - base : hi - base])
            hi = first
        if not head and not tail:
            return self._get(start, end)
        middle = [self._get(lo, hi)] if hi > lo else []
        return b"".join(head + middle + tail[::-1])
