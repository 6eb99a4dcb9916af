"""What reading costs: counters, the stats summary and the JSON run report.

Each reading process keeps one :class:`Counters` (thread-safe; the I/O threads add to it)
and sends a snapshot of it, a small dict of numbers, with every batch; the process that
runs the training loop adds them up and times its own waits in ``next()``. The run report
is the summary's JSON shape for the cost accounting; its schema is in docs/loader.md.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypedDict

__all__ = [
    "DELIVERY_FIELDS",
    "REPORT_FORMAT_VERSION",
    "WARM_KINDS",
    "Counters",
    "LoaderStats",
    "RunReport",
    "TierReport",
    "WarmCopies",
    "WarmHit",
    "ledger_keys",
    "merge_counters",
    "read_ledger",
    "summarise",
    "warm_key",
]

REPORT_FORMAT_VERSION = 1
_MIB = 1024 * 1024

# Counter names (flat, so a snapshot is a plain dict of numbers that pickles cheaply).
_FIELDS = (
    "samples",
    "pad_samples",
    "corrupt_shards",
    "corrupt_samples",
    "sample_bytes",
    "cache_hits",
    "cache_hit_bytes",
    "cache_misses",
    "cache_fill_bytes",
    "cache_evictions",
    "cache_evicted_bytes",
    "cache_over_limit",
    "cache_damaged",
    "manifest_parts",
    "manifest_bytes",
    "manifest_cache_hits",
    "manifest_cache_misses",
    "manifest_rows_cached",
    "shards_opened",
    "shards_verified",
    "shards_verified_by_sibling",
    "shards_trusted",
    "shards_laid_out",
    "shards_reopened",
    "throttle_s",
)


DELIVERY_FIELDS = frozenset({"samples", "pad_samples", "sample_bytes"})
"""Counters of what the training loop received: they travel with its batches only. Every
other counter measures reading work, which a reader may do after its last delivered batch
(fetching ahead, hashing, evicting at close)."""


WARM_KINDS = ("cache", "manifest_cache")
"""What a warm hit found: a shard's copy, or a manifest part's (the counters' prefixes)."""

WarmHit = tuple[str, str, int, int]
"""``(kind, key, size, requests)``: a copy a reading process found in the cache that was
there before the job started (a *warm* copy; see :class:`WarmCopies`). ``kind`` is one
of :data:`WARM_KINDS`, ``key`` the copy's :func:`warm_key`, ``size`` its bytes,
``requests`` those its fill would have sent (one streamed GET; a HEAD and a GET per
64 MiB block where fills are paced by ``max_bandwidth``)."""

_WARM_KEY_HEX = 16


def warm_key(object_id: str) -> str:
    """The compact name of a warm copy: the first 16 hex digits of its object id.

    Two objects of one job whose ids share them would count as one copy: with 64 bits of
    a cryptographic hash, about one chance in 10^10 for a million copies.
    """
    return object_id[:_WARM_KEY_HEX]


def ledger_keys(tiers: Iterable[str]) -> tuple[str, ...]:
    """The counters a reading process mirrors into its row of a shared ledger.

    Every named counter, and bytes and requests of each of ``tiers`` and of ``cache``.
    """
    keys = list(_FIELDS)
    for tier in sorted({*tiers, "cache"}):
        keys += [f"tier:{tier}:bytes", f"tier:{tier}:requests"]
    return tuple(keys)


def read_ledger(row: Any, keys: Sequence[str]) -> dict[str, float]:
    """A ledger row (a float64 array, see :class:`Counters`) as counters by name.

    A tier nothing was read from is left out (the row has a slot for the cache whether
    or not the job has one); the sources' own tiers come with every batch anyway.
    """
    values = dict(zip(keys, row.tolist(), strict=True))
    idle = {
        k.rsplit(":", 1)[0]
        for k, v in values.items()
        if k.startswith("tier:") and k.endswith(":bytes") and not v
        and not values.get(k[: -len("bytes")] + "requests")
    }
    return {k: float(v) for k, v in values.items() if k.rsplit(":", 1)[0] not in idle}


class Counters:
    """Thread-safe running totals of one reading process.

    ``tier:<name>:bytes`` and ``tier:<name>:requests`` count reads per storage tier: the
    store's own (``local``, ``memory``, ``s3``, ...) and ``cache`` for the local disk cache.

    With ``row`` (a float64 array, one row of a ledger in shared memory) and its ``keys``
    (:func:`ledger_keys`), every change of a counter named in ``keys`` is also written to
    its slot: the process that runs the training loop can then read a DataLoader worker's
    counters as they are, including reads done after the worker's last delivered batch,
    which no batch carries.
    """

    def __init__(
        self, row: Any = None, keys: Sequence[str] = (), *,
        on_warm: Callable[[WarmHit], None] | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, float] = dict.fromkeys(_FIELDS, 0)
        self._row = row
        self._slots = {k: i for i, k in enumerate(keys)} if row is not None else {}
        self._on_warm = on_warm
        self._warm_seen: set[str] = set()
        self._warm_new: list[WarmHit] = []

    def add(self, name: str, value: float = 1) -> None:
        """Add ``value`` to counter ``name``."""
        with self._lock:
            total = self._values[name] = self._values.get(name, 0) + value
            slot = self._slots.get(name)
            if slot is not None:
                self._row[slot] = total

    def add_read(self, tier: str, nbytes: int, requests: int = 1) -> None:
        """Count ``requests`` reads of ``nbytes`` in all from ``tier``."""
        with self._lock:
            for suffix, value in (("bytes", nbytes), ("requests", requests)):
                key = f"tier:{tier}:{suffix}"
                total = self._values[key] = self._values.get(key, 0) + value
                slot = self._slots.get(key)
                if slot is not None:
                    self._row[slot] = total

    def snapshot(self) -> dict[str, float]:
        """A copy of every counter."""
        with self._lock:
            return dict(self._values)

    def add_warm(self, kind: str, object_id: str, size: int, requests: int = 1) -> None:
        """A hit found a warm copy (one filled before the job started).

        Given ``on_warm`` (the process that runs the loop reads), it is told at once;
        otherwise (a DataLoader worker) a copy new to this process waits for
        :meth:`take_warm`, which the worker calls for each batch it sends. Each copy is
        kept once per process: a set of :func:`warm_key` strings, whose size is bounded
        by the copies the cache held when the job started.
        """
        hit = (kind, warm_key(object_id), int(size), int(requests))
        if self._on_warm is not None:
            self._on_warm(hit)
            return
        with self._lock:
            if hit[1] in self._warm_seen:
                return
            self._warm_seen.add(hit[1])
            self._warm_new.append(hit)

    def take_warm(self) -> tuple[WarmHit, ...]:
        """The warm copies this process found since the last call (each once per process)."""
        with self._lock:
            if not self._warm_new:
                return ()
            out = tuple(self._warm_new)
            self._warm_new.clear()
            return out


class WarmCopies:
    """The distinct warm copies one job's readers hit: what a cold cache would have fetched.

    A copy is *warm* for a job when the cache held it before the job started (its
    modification time, the fill's, is before the dataset's construction). Kept by the
    dataset of the process that runs the loop, across epochs and iterations: each copy
    counts once however many lookups, reading processes and epochs hit it. About 100
    bytes per distinct copy (its :func:`warm_key` and size in a dict); the copies are
    at most those the cache held when the job started. Pickles empty (a worker's own
    finds travel with its batches, see :meth:`Counters.take_warm`).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sizes: dict[str, dict[str, tuple[int, int]]] = {kind: {} for kind in WARM_KINDS}
        """Per kind, each copy's size and the requests its fill would have sent."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (WarmCopies, ())

    def add(self, hit: WarmHit) -> None:
        """One warm copy found (again, perhaps)."""
        kind, key, size, requests = hit
        with self._lock:
            self._sizes.setdefault(kind, {}).setdefault(key, (int(size), int(requests)))

    def add_all(self, hits: Iterable[WarmHit]) -> None:
        """Several warm copies (a batch's tag)."""
        for hit in hits:
            self.add(hit)

    def counters(self) -> dict[str, float]:
        """Per kind: ``<kind>_warm_hits``, ``_warm_hit_bytes`` and ``_warm_requests``.

        The distinct copies, their bytes, and the requests their fills would have sent.
        """
        with self._lock:
            out: dict[str, float] = {}
            for kind, sizes in self._sizes.items():
                out[f"{kind}_warm_hits"] = len(sizes)
                out[f"{kind}_warm_hit_bytes"] = sum(size for size, _ in sizes.values())
                out[f"{kind}_warm_requests"] = sum(n for _, n in sizes.values())
            return out


def merge_counters(snapshots: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """Sum counter snapshots (of several workers or iterations)."""
    out: dict[str, float] = dict.fromkeys(_FIELDS, 0)
    for snap in snapshots:
        for key, value in snap.items():
            out[key] = out.get(key, 0) + value
    return out


class TierReport(TypedDict):
    """Reads from one storage tier."""

    bytes: int
    requests: int


class LoaderStats(TypedDict):
    """``SimDataset.stats()``: throughput, latency, cache and stall of the reads so far."""

    samples: int
    pad_samples: int
    corrupt_shards: int
    corrupt_samples: int
    seconds: float
    samples_per_s: float
    mib_per_s: float
    time_to_first_batch_s: float | None
    cache_hits: int
    cache_misses: int
    cache_hit_ratio: float | None
    cache_warm_hits: int
    cache_warm_hit_bytes: int
    cache_fill_bytes: int
    cache_evictions: int
    cache_over_limit: int
    cache_damaged: int
    tiers: dict[str, TierReport]
    manifest_parts: int
    manifest_bytes: int
    manifest_cache_hits: int
    manifest_rows_cached: int
    shards_hashed: int
    shards_verified_by_sibling: int
    shards_trusted: int
    shards_laid_out: int
    shards_reopened: int
    wait_s: float
    data_stall: float | None
    throttle_s: float


class RunReport(TypedDict):
    """The JSON run report the cost accounting prices (schema in docs/loader.md)."""

    format_version: int
    kind: str
    snapshots: list[str]
    epochs: list[int]
    epochs_read: float | None
    world_size: int
    num_workers: int
    seconds: float
    samples: int
    sample_bytes: int
    corrupt: dict[str, int]
    tiers: dict[str, TierReport]
    cache: dict[str, int | str | None]
    manifest: dict[str, int]
    time_to_first_batch_s: float | None
    data_stall: float | None
    wait_s: float


def tiers_of(counters: Mapping[str, float]) -> dict[str, TierReport]:
    """The per-tier bytes and requests in a counter snapshot."""
    tiers: dict[str, TierReport] = {}
    for key, value in sorted(counters.items()):
        if not key.startswith("tier:"):
            continue
        _, tier, what = key.split(":", 2)
        entry = tiers.setdefault(tier, {"bytes": 0, "requests": 0})
        if what == "bytes":
            entry["bytes"] += int(value)
        else:
            entry["requests"] += int(value)
    return tiers


def summarise(
    counters: Mapping[str, float],
    *,
    seconds: float,
    wait_s: float,
    busy_s: float,
    first_batch_s: float | None,
) -> LoaderStats:
    """The stats of some reading: ``wait_s`` in ``next()``, ``busy_s`` in the loop body."""
    samples = int(counters.get("samples", 0))
    hits, misses = int(counters.get("cache_hits", 0)), int(counters.get("cache_misses", 0))
    looped = wait_s + busy_s
    return {
        "samples": samples,
        "pad_samples": int(counters.get("pad_samples", 0)),
        "corrupt_shards": int(counters.get("corrupt_shards", 0)),
        "corrupt_samples": int(counters.get("corrupt_samples", 0)),
        "seconds": seconds,
        "samples_per_s": samples / seconds if seconds > 0 else 0.0,
        "mib_per_s": counters.get("sample_bytes", 0) / _MIB / seconds if seconds > 0 else 0.0,
        "time_to_first_batch_s": first_batch_s,
        "cache_hits": hits,
        "cache_misses": misses,
        "cache_hit_ratio": hits / (hits + misses) if hits + misses else None,
        "cache_warm_hits": int(counters.get("cache_warm_hits", 0)),
        "cache_warm_hit_bytes": int(counters.get("cache_warm_hit_bytes", 0)),
        "cache_fill_bytes": int(counters.get("cache_fill_bytes", 0)),
        "cache_evictions": int(counters.get("cache_evictions", 0)),
        "cache_over_limit": int(counters.get("cache_over_limit", 0)),
        "cache_damaged": int(counters.get("cache_damaged", 0)),
        "tiers": tiers_of(counters),
        "manifest_parts": int(counters.get("manifest_parts", 0)),
        "manifest_bytes": int(counters.get("manifest_bytes", 0)),
        "manifest_cache_hits": int(counters.get("manifest_cache_hits", 0)),
        "manifest_rows_cached": int(counters.get("manifest_rows_cached", 0)),
        "shards_hashed": int(counters.get("shards_verified", 0)),
        "shards_verified_by_sibling": int(counters.get("shards_verified_by_sibling", 0)),
        "shards_trusted": int(counters.get("shards_trusted", 0)),
        "shards_laid_out": int(counters.get("shards_laid_out", 0)),
        "shards_reopened": int(counters.get("shards_reopened", 0)),
        "wait_s": wait_s,
        "data_stall": wait_s / looped if looped > 0 else None,
        "throttle_s": float(counters.get("throttle_s", 0)),
    }


def one_line(stats: LoaderStats) -> str:
    """The periodic log line."""
    stall = "n/a" if stats["data_stall"] is None else f"{100 * stats['data_stall']:.1f}%"
    hit = "n/a" if stats["cache_hit_ratio"] is None else f"{100 * stats['cache_hit_ratio']:.0f}%"
    corrupt = (f", {stats['corrupt_samples']} samples of corrupt shards stood in for"
               if stats["corrupt_samples"] else "")
    return (
        f"simstore loader: {stats['samples']} samples, {stats['samples_per_s']:.1f} samples/s, "
        f"{stats['mib_per_s']:.1f} MiB/s, stall {stall}, cache hits {hit}{corrupt}"
    )


def run_report(
    stats: LoaderStats,
    counters: Mapping[str, Any],
    *,
    snapshots: list[str],
    epochs: list[int],
    world_size: int,
    num_workers: int,
    rank_epoch: int = 0,
    cache_node: str | None = None,
) -> RunReport:
    """The run report of one rank.

    ``epochs_read``: the positions this rank delivered (samples and the padding that
    evens ranks out) over the positions of its epoch (``rank_epoch``, what ``len(ds)``
    says), what a run's cost per epoch divides by: a job resumed mid-epoch, or stopped
    early, read a fraction of one (None when this rank's epoch holds nothing).
    ``cache_node``: the id of the disk cache read (see ``CacheConfig.node_id``), None
    without one.
    """
    return {
        "format_version": REPORT_FORMAT_VERSION,
        "kind": "simstore-loader-report",
        "snapshots": snapshots,
        "epochs": epochs,
        "epochs_read": (round((stats["samples"] + stats["pad_samples"]) / rank_epoch, 6)
                        if rank_epoch > 0 else None),
        "world_size": world_size,
        "num_workers": num_workers,
        "seconds": stats["seconds"],
        "samples": stats["samples"],
        "sample_bytes": int(counters.get("sample_bytes", 0)),
        "corrupt": {"shards": stats["corrupt_shards"], "samples": stats["corrupt_samples"]},
        "tiers": stats["tiers"],
        "cache": {
            "hits": stats["cache_hits"],
            "hit_bytes": int(counters.get("cache_hit_bytes", 0)),
            "warm_hits": int(counters.get("cache_warm_hits", 0)),
            "warm_hit_bytes": int(counters.get("cache_warm_hit_bytes", 0)),
            "warm_requests": int(counters.get("cache_warm_requests", 0)),
            "misses": stats["cache_misses"],
            "fill_bytes": stats["cache_fill_bytes"],
            "evictions": stats["cache_evictions"],
            "evicted_bytes": int(counters.get("cache_evicted_bytes", 0)),
            "over_limit": stats["cache_over_limit"],
            "damaged": stats["cache_damaged"],
            "node": cache_node,
        },
        "manifest": {"parts": stats["manifest_parts"], "bytes": stats["manifest_bytes"],
                     "cache_hits": stats["manifest_cache_hits"],
                     "rows_cached": stats["manifest_rows_cached"],
                     "warm_hits": int(counters.get("manifest_cache_warm_hits", 0)),
                     "warm_hit_bytes": int(counters.get("manifest_cache_warm_hit_bytes", 0)),
                     "warm_requests": int(counters.get("manifest_cache_warm_requests", 0))},
        "time_to_first_batch_s": stats["time_to_first_batch_s"],
        "data_stall": stats["data_stall"],
        "wait_s": stats["wait_s"],
    }
