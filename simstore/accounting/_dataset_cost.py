"""The cost of a dataset's snapshots: what each adds, and what the store holds."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from simstore.accounting._walk import (
    Reach,
    dataset_heads,
    list_sizes,
    newest_snapshots,
    topological,
)
from simstore.catalog import Catalog
from simstore.cost import (
    Footprint,
    PriceTable,
    SnapshotFigures,
    SnapshotObjects,
    TierUsage,
    storage_prices,
    summarise_history,
)
from simstore.errors import InvalidInputError
from simstore.storage import CountingStore, tier_of_url


@dataclass(frozen=True, slots=True, kw_only=True)
class CostReport:
    """Storage figures of a dataset's snapshots, of the dataset and of the store.

    ``snapshots`` is oldest first (parents before children). ``dataset`` is every object
    the reported snapshots reach, each once; ``store`` every object under ``objects/``.
    ``truncated`` says ``last`` left older snapshots out. ``read`` is what the report
    itself read from the store.
    """

    target: str
    dataset: str
    store_url: str
    store_tier: str
    snapshots: tuple[SnapshotFigures, ...]
    dataset_footprint: Footprint
    full_copy_bytes: int
    store_footprint: Footprint
    prices: PriceTable
    truncated: bool
    read: tuple[TierUsage, ...]

    @property
    def dedup_ratio(self) -> float:
        """The dataset's full-copy bytes over its stored bytes."""
        return self.snapshots[-1].dedup_ratio if self.snapshots else 1.0

    def to_json(self) -> dict[str, Any]:
        """The JSON of ``simstore cost --json``: snapshots newest first, prices per tier."""
        p = self.prices

        def snap(f: SnapshotFigures) -> dict[str, Any]:
            return {
                "id": f.snapshot_id,
                "parent": f.parent_id,
                "created": f.created,
                "samples": f.samples,
                "logical_bytes": f.logical_bytes,
                "reached_bytes": f.reached.bytes,
                "reached_objects": f.reached.objects,
                "new_bytes": f.new.bytes,
                "new_objects": f.new.objects,
                "shared_bytes": f.shared.bytes,
                "shared_objects": f.shared.objects,
                "stored_bytes": f.stored.bytes,
                "stored_objects": f.stored.objects,
                "full_copy_bytes": f.full_copy_bytes,
                "dedup_ratio": f.dedup_ratio,
                "missing_objects": f.missing,
                "usd_per_month": storage_prices(p, f.reached),
                "new_usd_per_month": storage_prices(p, f.new),
            }

        return {
            "target": self.target,
            "dataset": self.dataset,
            "store": self.store_url,
            "store_tier": self.store_tier,
            "truncated": self.truncated,
            "snapshots": [snap(f) for f in reversed(self.snapshots)],
            "dataset_total": {
                "snapshots": len(self.snapshots),
                "objects": self.dataset_footprint.objects,
                "bytes": self.dataset_footprint.bytes,
                "full_copy_bytes": self.full_copy_bytes,
                "dedup_ratio": self.dedup_ratio,
                "usd_per_month": storage_prices(p, self.dataset_footprint),
            },
            "store_total": {
                "objects": self.store_footprint.objects,
                "bytes": self.store_footprint.bytes,
                "usd_per_month": storage_prices(p, self.store_footprint),
            },
            "prices": {
                t.name: {"storage_per_gib_month": t.storage_per_gib_month, "as_of": t.as_of}
                for t in p.tiers
            },
            "read": {t.tier: t.to_json() for t in self.read},
        }


def dataset_cost(
    cat: Catalog, target: str, prices: PriceTable, *, last: int | None = None
) -> CostReport:
    """Storage figures of the snapshots ``target`` names, priced on every tier of ``prices``.

    ``target`` is ``NAME`` (every snapshot reachable from the dataset's branches and
    tags) or ``NAME@REV`` (the history of one ref). ``last`` keeps the newest ``last``
    snapshots; their parents are still read so that "new" stays relative to the real
    parent. See the module docstring for what this reads.
    """
    if last is not None and last < 1:
        raise InvalidInputError(f"last must be at least 1, got {last}")
    counting = CountingStore(cat.store)
    # every snapshot read once: the walks below pass over the history five times
    counted = Catalog(counting, snapshot_cache=None)
    dataset, heads = dataset_heads(counted, target)
    chosen, truncated = newest_snapshots(counted, heads, last)
    order = topological(counted, chosen)
    members = set(order)
    reach = Reach(counted)
    baselines: dict[str, frozenset[str]] = {}
    children: dict[str, int] = {}
    wanted: set[str] = set()
    for sid in order:
        snap = counted.snapshot(sid)
        wanted |= reach.objects_of(sid)
        parent = snap.parents[0] if snap.parents else None
        if parent is not None:
            children[parent] = children.get(parent, 0) + 1
            if parent not in members and parent not in baselines:
                baselines[parent] = reach.objects_of(parent)
    thresholds = prices.thresholds
    sizes, store_footprint = list_sizes(counting, wanted, thresholds)
    del wanted

    def inputs() -> Iterator[SnapshotObjects]:
        for sid in order:
            snap = counted.snapshot(sid)
            yield SnapshotObjects(
                snapshot_id=sid,
                parent_id=snap.parents[0] if snap.parents else None,
                created=snap.created,
                samples=snap.samples,
                logical_bytes=snap.sample_bytes,
                objects=reach.objects_of(sid),
            )

    figures = tuple(
        summarise_history(
            inputs(), sizes, thresholds=thresholds, baselines=baselines, children=children
        )
    )
    return CostReport(
        target=target,
        dataset=dataset,
        store_url=cat.store.url,
        store_tier=tier_of_url(cat.store.url),
        snapshots=figures,
        dataset_footprint=figures[-1].stored if figures else Footprint(),
        full_copy_bytes=figures[-1].full_copy_bytes if figures else 0,
        store_footprint=store_footprint,
        prices=prices,
        truncated=truncated,
        read=counting.traffic.usage(),
    )
