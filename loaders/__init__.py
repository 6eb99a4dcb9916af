"""Streaming PyTorch loader: ``SimDataset``, ``SimDataLoader`` and their parts.

``SimDataset`` reads one pinned snapshot (or a weighted mixture of several) with rank- and
worker-aware partitioning, a deterministic shard-window shuffle, background prefetch, a
local disk cache for remote stores and an exact, elastic ``state_dict``. The pure pieces
(``plan_epoch``, ``advance``, the stream order) are exported for tests and tools.
See docs/loader.md.
"""

from simstore.loaders._cache import CacheConfig
from simstore.loaders._collate import Collate, MeshMode
from simstore.loaders._dataset import LoaderState, SimDataset
from simstore.loaders._loader import SimDataLoader
from simstore.loaders._options import LoaderOptions
from simstore.loaders._order import Mixture, group_order, source_layout
from simstore.loaders._pipeline import PrefetchConfig, ShardOpener
from simstore.loaders._plan import EpochPlan, Interval, Remainder, advance, plan_epoch
from simstore.loaders._stats import LoaderStats, RunReport, TierReport
from simstore.loaders._world import World, WorldDetector, detect_world

__all__ = [
    "CacheConfig",
    "Collate",
    "EpochPlan",
    "Interval",
    "LoaderOptions",
    "LoaderState",
    "LoaderStats",
    "MeshMode",
    "Mixture",
    "PrefetchConfig",
    "Remainder",
    "RunReport",
    "ShardOpener",
    "SimDataLoader",
    "SimDataset",
    "TierReport",
    "World",
    "WorldDetector",
    "advance",
    "detect_world",
    "group_order",
    "plan_epoch",
    "source_layout",
]
