"""Storage footprints and the figures of a dataset's snapshots. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TypedDict

from simstore.errors import InvalidInputError

from ._prices import PriceTable


class FootprintJSON(TypedDict):
    """JSON shape of a :class:`Footprint`."""

    objects: int
    bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Footprint:
    """Objects and bytes of a set of stored objects.

    ``padding`` holds, for each minimum billable object size ``m`` a price table uses,
    the bytes that billing adds by rounding objects smaller than ``m`` up to ``m``.
    """

    objects: int = 0
    bytes: int = 0
    padding: tuple[tuple[int, int], ...] = ()

    def billable_bytes(self, min_object_bytes: int = 0) -> int:
        """Bytes billed by a tier that bills every object as at least ``min_object_bytes``.

        A threshold the footprint was not tallied for raises :class:`InvalidInputError`
        rather than silently ignoring the padding.
        """
        if min_object_bytes <= 0:
            return self.bytes
        for threshold, pad in self.padding:
            if threshold == min_object_bytes:
                return self.bytes + pad
        if self.objects == 0:
            return 0
        raise InvalidInputError(
            f"footprint was not tallied for a minimum object size of {min_object_bytes} bytes"
        )

    def __add__(self, other: Footprint) -> Footprint:
        pads = dict(self.padding)
        for threshold, pad in other.padding:
            pads[threshold] = pads.get(threshold, 0) + pad
        return Footprint(
            objects=self.objects + other.objects,
            bytes=self.bytes + other.bytes,
            padding=tuple(sorted(pads.items())),
        )

    def to_json(self) -> FootprintJSON:
        """The JSON shape (padding is reflected in the prices, not shown)."""
        return {"objects": self.objects, "bytes": self.bytes}


class FootprintTally:
    """Accumulates object sizes into a :class:`Footprint` for the given thresholds."""

    __slots__ = ("_bytes", "_objects", "_pads", "thresholds")

    def __init__(self, thresholds: Iterable[int] = ()) -> None:
        self.thresholds = tuple(sorted({t for t in thresholds if t > 0}))
        self._objects = 0
        self._bytes = 0
        self._pads = [0] * len(self.thresholds)

    def add(self, size_bytes: int) -> None:
        """Count one object of ``size_bytes``."""
        self._objects += 1
        self._bytes += size_bytes
        for i, t in enumerate(self.thresholds):
            if size_bytes < t:
                self._pads[i] += t - size_bytes

    def result(self) -> Footprint:
        """The footprint so far."""
        return Footprint(
            objects=self._objects,
            bytes=self._bytes,
            padding=tuple(zip(self.thresholds, self._pads, strict=True)),
        )


def footprint_of(
    objects: Iterable[str], sizes: Mapping[str, int], thresholds: Iterable[int] = ()
) -> tuple[Footprint, int]:
    """The footprint of the objects ``sizes`` knows, and how many it does not know."""
    tally = FootprintTally(thresholds)
    missing = 0
    for oid in objects:
        size = sizes.get(oid)
        if size is None:
            missing += 1
        else:
            tally.add(size)
    return tally.result(), missing


def dedup_ratio(full_copy_bytes: int, stored_bytes: int) -> float:
    """How many times smaller the deduplicated store is than full copies (1.0 when empty).

    ``full_copy_bytes`` is what keeping every snapshot as a complete, separate copy would
    store; ``stored_bytes`` what is stored with each object once. It is at least 1
    whenever ``stored_bytes`` counts a subset of ``full_copy_bytes``'s objects.
    """
    if stored_bytes <= 0:
        return 1.0
    return full_copy_bytes / stored_bytes


# -- snapshot figures ------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotObjects:
    """What one snapshot reaches: itself, its manifest parts, shards and lineage objects."""

    snapshot_id: str
    parent_id: str | None
    created: str
    samples: int
    logical_bytes: int
    objects: frozenset[str]


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotFigures:
    """Storage figures of one snapshot.

    - ``reached``: every object the snapshot reaches, each once (what holding this
      snapshot alone stores);
    - ``new``/``shared``: objects it reaches that its parent does not / does
      (``new + shared == reached``; without a parent everything is new);
    - ``stored``: the dataset's objects once this snapshot exists: the objects of this
      and every earlier snapshot of the report, each once;
    - ``full_copy_bytes``: the reached bytes of those same snapshots, summed, as if each
      were a full copy; ``dedup_ratio`` is ``full_copy_bytes / stored.bytes``;
    - ``missing``: reached objects the store does not hold (not counted in any bytes).
    """

    snapshot_id: str
    parent_id: str | None
    created: str
    samples: int
    logical_bytes: int
    reached: Footprint
    new: Footprint
    shared: Footprint
    stored: Footprint
    full_copy_bytes: int
    missing: int

    @property
    def dedup_ratio(self) -> float:
        """``full_copy_bytes / stored.bytes`` (1.0 when nothing is stored)."""
        return dedup_ratio(self.full_copy_bytes, self.stored.bytes)


def summarise_history(
    snapshots: Iterable[SnapshotObjects],
    sizes: Mapping[str, int],
    *,
    thresholds: Iterable[int] = (),
    baselines: Mapping[str, frozenset[str]] | None = None,
    children: Mapping[str, int] | None = None,
) -> Iterator[SnapshotFigures]:
    """Figures of each snapshot, in the order given (parents before their children).

    ``sizes`` maps object ids to stored sizes; an id it lacks is counted as missing.
    ``baselines`` gives the object sets of parents outside the report (so the oldest
    reported snapshot's ``new`` is still relative to its real parent); a parent found in
    neither is treated as absent (everything new). ``children`` maps a snapshot id to how
    many of the given snapshots name it as parent: with it, a snapshot's object set is
    dropped once its last child is done, so memory holds the sets of the open branches,
    not of the whole history; without it, every set is kept.
    """
    thresholds = tuple(thresholds)
    kept: dict[str, frozenset[str]] = dict(baselines or {})
    pending = dict(children) if children is not None else None
    seen: set[str] = set()
    stored = FootprintTally(thresholds)
    full_copy = 0
    for snap in snapshots:
        parent_objects = kept.get(snap.parent_id) if snap.parent_id else None
        reached, missing = footprint_of(snap.objects, sizes, thresholds)
        if parent_objects is None:
            new, shared = reached, Footprint(padding=_zero_pads(thresholds))
        else:
            new, _ = footprint_of(snap.objects - parent_objects, sizes, thresholds)
            shared, _ = footprint_of(snap.objects & parent_objects, sizes, thresholds)
        for oid in snap.objects:
            if oid not in seen:
                seen.add(oid)
                size = sizes.get(oid)
                if size is not None:
                    stored.add(size)
        full_copy += reached.bytes
        yield SnapshotFigures(
            snapshot_id=snap.snapshot_id,
            parent_id=snap.parent_id,
            created=snap.created,
            samples=snap.samples,
            logical_bytes=snap.logical_bytes,
            reached=reached,
            new=new,
            shared=shared,
            stored=stored.result(),
            full_copy_bytes=full_copy,
            missing=missing,
        )
        if pending is None:
            kept[snap.snapshot_id] = snap.objects
            continue
        if pending.get(snap.snapshot_id, 0) > 0:
            kept[snap.snapshot_id] = snap.objects
        if snap.parent_id is not None and snap.parent_id in pending:
            pending[snap.parent_id] -= 1
            if pending[snap.parent_id] <= 0:
                kept.pop(snap.parent_id, None)


def _zero_pads(thresholds: Sequence[int]) -> tuple[tuple[int, int], ...]:
    return tuple((t, 0) for t in thresholds)


def storage_prices(table: PriceTable, footprint: Footprint) -> dict[str, float]:
    """Dollars a month to hold ``footprint`` on each tier of ``table``."""
    return {t.name: t.storage_usd_per_month(footprint) for t in table.tiers}
