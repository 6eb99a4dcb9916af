"""What is measured: the systems, the tiers each reads from, and the read cases.

A *system* is one writer and one reader on one format (``simstore-parquet``,
``mosaic``, ...). A *tier* is where its bytes are read from: ``local`` (a directory, warm
page cache), ``memory`` (simstore's ``memory://`` store), or S3 on moto on loopback:
``s3`` with no cache (simstore: ranged GETs; WebDataset: ``pipe:curl``), ``s3-cold``
(through an empty disk cache), ``s3-warm`` (through one filled by an untimed epoch
before the reads) and
``s3-cold-20ms`` (cold, through a proxy that adds 20 ms to every request).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class System:
    """A writer and reader pair; ``family`` names its module in :mod:`.systems`."""

    name: str
    family: str
    venv: str  # "main": the project's virtualenv; "peers": .bench/peers-venv
    write_options: dict[str, Any] = field(default_factory=dict)
    tiers: tuple[str, ...] = ("local",)
    start_method: str = "fork"
    shuffle: str = ""
    default: bool = True


S3_TIERS = ("s3", "s3-cold", "s3-warm", "s3-cold-20ms")

SYSTEMS: tuple[System, ...] = (
    System("simstore-parquet", "simstore", "main", {"format": "parquet", "compression": "none"},
           ("local", "memory", *S3_TIERS),
           shuffle="shard-window shuffle (8 shards) + sample order within the window"),
    System("simstore-lance", "simstore", "main", {"format": "lance", "compression": "none"},
           ("local", "memory", "s3-cold", "s3-warm"),
           shuffle="shard-window shuffle (8 shards) + sample order within the window"),
    System("simstore-zarr", "simstore", "main", {"format": "zarr", "compression": "none"},
           ("local", "memory", "s3-cold", "s3-warm"),
           shuffle="shard-window shuffle (8 shards) + sample order within the window"),
    System("simstore-parquet-zstd", "simstore", "main",
           {"format": "parquet", "compression": "shuffle-zstd:1"}, ("local",),
           shuffle="as simstore-parquet; simstore's default compression", default=False),
    System("mosaic", "mosaic", "peers", {}, ("local", "s3-cold", "s3-warm"),
           shuffle="py1e (its default)"),
    System("litdata", "litdata", "peers", {}, ("local", "s3-cold", "s3-warm"),
           shuffle="chunk order + items within chunks (its default)"),
    System("webdataset", "webdataset", "peers", {}, ("local", "s3"),
           shuffle="shard order + a buffer of about one shard"),
    System("lance", "lance", "main", {}, ("local",), start_method="spawn",
           shuffle="fragment order only (ShardedFragmentSampler randomize=True)"),
    System("parquet", "parquet", "main", {}, ("local",),
           shuffle="row-group order + rows within the row group"),
    System("naive", "naive", "main", {}, ("local",), shuffle="full (DataLoader sampler)"),
)

BY_NAME = {s.name: s for s in SYSTEMS}
PEERS = ("mosaic", "litdata", "webdataset")


@dataclass(frozen=True, slots=True)
class Case:
    """One read configuration, measured once per repetition."""

    system: System
    profile: str
    tier: str
    workers: int

    @property
    def label(self) -> str:
        return f"{self.system.name} {self.profile} {self.tier} w{self.workers}"


def cases(systems: list[System], profiles: list[str], tiers: list[str], workers: list[int],
          s3_profiles: list[str], memory_systems: list[str] | None,
          s3_systems: list[str] | None, s3_workers: list[int] | None = None) -> list[Case]:
    """Every case, ordered so that a repetition alternates systems on the same bytes.

    Tiers other than local (memory, S3) run on ``s3_profiles`` only; ``memory_systems``
    and ``s3_systems`` (None: all that support the tier) narrow those tiers (``--quick``);
    S3 tiers run with ``s3_workers`` (default: ``workers``); a cold run is directly
    followed by the warm run of the same system (each with a cache of its own).
    """
    out: list[Case] = []
    for profile in profiles:
        for tier in tiers:
            if tier != "local" and profile not in s3_profiles:
                continue
            tier_workers = s3_workers if (tier.startswith("s3") and s3_workers) else workers
            for w in tier_workers:
                for s in systems:
                    if tier not in s.tiers:
                        continue
                    if tier == "memory" and memory_systems is not None and \
                            s.name not in memory_systems:
                        continue
                    if tier.startswith("s3") and s3_systems is not None and \
                            s.name not in s3_systems:
                        continue
                    out.append(Case(s, profile, tier, w))
    # keep each s3-warm right after its s3-cold (where s3-cold runs at all)
    cold = {(c.system.name, c.profile, c.workers) for c in out if c.tier == "s3-cold"}
    ordered: list[Case] = []
    for c in out:
        if c.tier == "s3-warm" and (c.system.name, c.profile, c.workers) in cold:
            continue
        ordered.append(c)
        if c.tier == "s3-cold" and "s3-warm" in tiers and "s3-warm" in c.system.tiers:
            ordered.append(Case(c.system, c.profile, "s3-warm", c.workers))
    return ordered
