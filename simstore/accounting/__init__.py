"""Storage accounting: walk snapshots, size their objects, report tiers, warm a cache.

The I/O side of :mod:`simstore.cost`: it reads price tables and run reports from files,
and snapshots, manifest parts and listings from a store, and hands values to the pure
model. Every function here counts what it reads: the catalog is wrapped in a
:class:`~simstore.storage.CountingStore`, and each report carries its own ``read`` usage.

What each costs (the store's own requests; no object is read twice):

- :func:`dataset_cost` reads the snapshot object of every reported snapshot and of the
  parents just outside the report, every distinct manifest part they list (parts shared
  by snapshots are read once), and lists ``objects/`` once (one LIST per 1,000 objects
  in the store). It never reads a shard. Memory grows with the number of distinct objects
  the reported snapshots reach (about 100 bytes each), not with their bytes; ``last``
  limits the report to the newest snapshots.
- :func:`disk_usage` reads one snapshot's manifest parts and sends one HEAD per shard
  (from a small thread pool); without a REF it lists ``objects/`` once.
- :func:`warm_cache` does what ``disk_usage`` does, then downloads each shard and part
  not yet in the cache (hash-verified by the cache as it fills).

The hot tier is the loader's disk cache; this module sees it only through the small
:class:`CacheCopies`/:class:`CacheFiller` protocols (``simstore.loaders``' ``ShardCache``
has that shape), so the core never imports the loader and the cache layout stays the
loader's.
"""


from simstore.accounting._dataset_cost import CostReport, dataset_cost
from simstore.accounting._prices import (
    default_price_text,
    read_price_table,
    read_run_reports,
    run_cost,
)
from simstore.accounting._tiers import (
    DEFAULT_FILL_BLOCK_BYTES,
    CacheCopies,
    CachedCopy,
    CacheFiller,
    DiskUsage,
    PullReport,
    TierPresence,
    disk_usage,
    warm_cache,
)

__all__ = [
    "CacheCopies",
    "CacheFiller",
    "CachedCopy",
    "CostReport",
    "DEFAULT_FILL_BLOCK_BYTES",
    "DiskUsage",
    "PullReport",
    "TierPresence",
    "dataset_cost",
    "default_price_text",
    "disk_usage",
    "read_price_table",
    "read_run_reports",
    "run_cost",
    "warm_cache",
]
