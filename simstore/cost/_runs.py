"""Loader run reports and their price per run and per epoch. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from simstore.errors import FormatError, InvalidInputError, version_error

from ._prices import PriceTable
from ._usage import OpClass, OpUsage, TierUsage
from ._values import GIB, _count, _price

RUN_REPORT_KIND = "simstore-loader-report"
RUN_REPORT_FORMAT_VERSION = 1
HOT_TIERS = frozenset({"cache", "local", "file", "memory"})
DEFAULT_TIER_PRICES: Mapping[str, str | None] = {
    "s3": "s3-standard",
    "s3a": "s3-standard",
    "gs": "gcs-standard",
    "gcs": "gcs-standard",
    "local": "local-nvme",
    "file": "local-nvme",
    "cache": "local-nvme",
    "memory": None,
}
"""Which price tier a run report's tier names are priced at unless told otherwise."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunUsage:
    """What a loader run read, as its run report (or several, one per rank) gives it.

    ``tiers`` holds requests and bytes per tier; a report that gives only a tier's total
    ``requests`` and ``bytes`` has them counted as GETs (a loader only reads).
    ``cache_hits``/``cache_hit_bytes`` are the shard lookups the local cache answered and
    the sizes of the copies they found (one per lookup: per reading process, epoch and
    reopen); ``hit_bytes_estimated`` says that the report gave no hit bytes and they
    were estimated (see :func:`parse_run_report`).

    ``warm_hits``/``warm_hit_bytes``: the distinct copies (shards and manifest parts)
    that were in the cache before the run started and that it read, and their bytes:
    what a cold (empty) cache would have fetched from ``cold_tier`` on top of what the
    run fetched. None when the report does not say (an older one): the savings are then
    estimated from the lookups, an upper bound. ``warm_estimated``: some of the warm
    figures are such estimates (ranks merged from reports with and without them).
    """

    epochs: float
    seconds: float
    tiers: tuple[TierUsage, ...]
    cache_hits: int = 0
    cache_misses: int = 0
    cache_hit_bytes: int = 0
    cache_fill_bytes: int = 0
    hit_bytes_estimated: bool = False
    cold_tier: str | None = None
    reports: int = 1
    warm_hits: int | None = None
    warm_hit_bytes: int = 0
    warm_estimated: bool = False
    warm_counted: int | None = None
    """The warm copies the reports themselves counted (None when none did): unlike
    ``warm_hits`` of reports merged, it holds no estimate of a report that did not."""
    warm_requests: int | None = None
    """The requests the warm copies' fills would have sent, when the reports say (a paced
    fill sends a HEAD and a GET per 64 MiB); None: one GET per warm copy."""
    cache_nodes: tuple[str, ...] = ()
    """The node caches the reports read warm copies from, one entry per report (a
    report's ``cache.node``): two reports of one node may count one copy once each."""
    warm_shared: bool = False
    """Reports merged that read warm copies from one node's cache: their sum is an upper
    bound (a copy several ranks read is counted once per rank)."""
    warm_partial: bool = False
    """Reports merged of which some did not count warm copies (their hits estimated)."""

    def saved_reads(self) -> tuple[int, int, bool]:
        """``(requests, bytes, estimated)`` a cold cache would have added to the run.

        The warm copies when the report counted them (the requests their fills would have
        sent, or one GET each); else every lookup the cache answered (``estimated``: an
        upper bound, each hit priced as its own GET).
        """
        if self.warm_hits is not None:
            requests = self.warm_hits if self.warm_requests is None else self.warm_requests
            return requests, self.warm_hit_bytes, self.warm_estimated
        return self.cache_hits, self.cache_hit_bytes, self.cache_hits > 0


MIN_RUN_SECONDS = 0.001
"""The shortest run duration a report may give (0 means unknown)."""


def parse_run_report(obj: object, *, origin: str = "run report") -> RunUsage:
    """Parse one loader run report (the JSON of docs/loader.md, already decoded).

    Read: ``epochs`` (a list of epoch numbers, or a count), ``epochs_read`` (when
    present and not null, the epochs counted instead: a fraction for a part), ``seconds``, ``tiers``
    (``{tier: {"bytes": b, "requests": n}}``, or per request class
    ``{tier: {"get": {"requests": n, "bytes": b}, ...}}`` as :class:`TierUsage` writes
    it), ``cache`` (``hits``, ``misses``, ``fill_bytes`` and, when present,
    ``hit_bytes``, ``warm_hits`` and ``warm_hit_bytes``) and ``manifest.warm_hits`` and
    ``.warm_hit_bytes`` when present. Other fields are ignored. Without ``hit_bytes``,
    the bytes a hit saved are estimated as the mean fill (``fill_bytes / misses``) times
    the hits, or, with no misses, as the bytes read from the ``cache`` tier. With
    ``cache.warm_hits`` the warm copies (shards and manifest parts) are what a cold cache
    would have fetched; without it :attr:`RunUsage.warm_hits` is None (estimated from the
    hits). The cold tier is the one tier that is not local (``cache``, ``local``,
    ``file``, ``memory``), if there is exactly one. Raises :class:`FormatError` naming
    ``origin`` when malformed.
    """
    if not isinstance(obj, Mapping):
        raise FormatError(f"{origin} is not a JSON object")
    # no defaults: any JSON object would otherwise read as a valid run that cost $0
    if "kind" not in obj:
        raise FormatError(
            f"{origin} is not a loader run report: it has no kind (expected {RUN_REPORT_KIND!r})"
        )
    kind = obj["kind"]
    if kind != RUN_REPORT_KIND:
        raise FormatError(f"{origin} has kind {kind!r}, expected {RUN_REPORT_KIND!r}")
    if "format_version" not in obj:
        raise FormatError(
            f"{origin} has no format_version (this simstore reads {RUN_REPORT_FORMAT_VERSION})"
        )
    version = obj["format_version"]
    if type(version) is not int or version != RUN_REPORT_FORMAT_VERSION:
        raise version_error(f"{origin} has", version, RUN_REPORT_FORMAT_VERSION)
    epochs_raw = obj.get("epochs", 1)
    if isinstance(epochs_raw, list):
        for i, epoch in enumerate(epochs_raw):  # epoch numbers, as a loader writes them
            _count(epoch, f"{origin}: epochs[{i}]")
        epochs = len(epochs_raw)
    else:
        epochs = _count(epochs_raw, f"{origin}: epochs")
    read: float | None = None
    if obj.get("epochs_read") is not None:
        # what this rank read, in epochs: a resumed or stopped job's part of one counts
        # as that part (its list of epoch numbers would count it whole)
        read = _price(obj["epochs_read"], f"{origin}: epochs_read")
    # a price's checks: a number, finite (JSON decoders accept NaN), not negative
    seconds = _price(obj.get("seconds", 0.0), f"{origin}: seconds")
    if 0 < seconds < MIN_RUN_SECONDS:
        # per-hour figures of such a "duration" are infinite or absurd
        raise FormatError(
            f"{origin}: seconds is {seconds!r}; a run lasts 0 (unknown) or at least "
            f"{MIN_RUN_SECONDS} s"
        )
    if "tiers" not in obj:  # what the run read: without it any report priced at $0
        raise FormatError(f"{origin} has no tiers (the bytes and requests of each tier read)")
    raw_tiers = obj["tiers"]
    if not isinstance(raw_tiers, Mapping):
        raise FormatError(f"{origin}: tiers must be an object")
    if not raw_tiers:  # a loader lists each store it reads, even one it read nothing from
        raise FormatError(f"{origin}: tiers is empty (a loader names each tier it reads)")
    for name in raw_tiers:
        if not str(name) or "=" in str(name):  # --tier RUN=PRICE could never map it
            raise FormatError(f"{origin}: tier name {str(name)!r} is empty or holds '='")
    tiers = tuple(_tier_usage(str(name), body, origin) for name, body in raw_tiers.items())
    cache = obj.get("cache", {})
    if not isinstance(cache, Mapping):
        raise FormatError(f"{origin}: cache must be an object")
    hits = _count(cache.get("hits", 0), f"{origin}: cache.hits")
    misses = _count(cache.get("misses", 0), f"{origin}: cache.misses")
    fill_bytes = _count(cache.get("fill_bytes", 0), f"{origin}: cache.fill_bytes")
    estimated = "hit_bytes" not in cache and hits > 0
    if "hit_bytes" in cache:
        hit_bytes = _count(cache["hit_bytes"], f"{origin}: cache.hit_bytes")
    elif misses > 0:
        hit_bytes = round(hits * fill_bytes / misses)
    else:
        hit_bytes = sum(t.bytes_read for t in tiers if t.tier == "cache") if hits else 0
    warm_hits: int | None = None
    warm_requests: int | None = None
    warm_bytes = 0
    if "warm_hits" in cache:
        warm_hits = _count(cache["warm_hits"], f"{origin}: cache.warm_hits")
        warm_bytes = _count(cache.get("warm_hit_bytes", 0), f"{origin}: cache.warm_hit_bytes")
        manifest = obj.get("manifest", {})
        if not isinstance(manifest, Mapping):
            raise FormatError(f"{origin}: manifest must be an object")
        part_hits = _count(manifest.get("warm_hits", 0), f"{origin}: manifest.warm_hits")
        warm_bytes += _count(manifest.get("warm_hit_bytes", 0),
                             f"{origin}: manifest.warm_hit_bytes")
        # the requests their fills would have sent (a report without them: one GET each)
        warm_requests = (
            _count(cache.get("warm_requests", warm_hits), f"{origin}: cache.warm_requests")
            + _count(manifest.get("warm_requests", part_hits),
                     f"{origin}: manifest.warm_requests"))
        warm_hits += part_hits
    node = cache.get("node")
    if node is not None and (not isinstance(node, str) or not node):
        raise FormatError(f"{origin}: cache.node must be a string or null, got {node!r}")
    remote = [t.tier for t in tiers if t.tier not in HOT_TIERS]
    return RunUsage(
        epochs=epochs if read is None else read,
        seconds=float(seconds),
        tiers=tiers,
        cache_hits=hits,
        cache_misses=misses,
        cache_hit_bytes=hit_bytes,
        cache_fill_bytes=fill_bytes,
        hit_bytes_estimated=estimated,
        cold_tier=remote[0] if len(remote) == 1 else None,
        warm_hits=warm_hits,
        warm_hit_bytes=warm_bytes,
        warm_counted=warm_hits,
        warm_requests=warm_requests,
        cache_nodes=(node,) if node is not None and warm_hits else (),
    )


def _tier_usage(tier: str, body: object, origin: str) -> TierUsage:
    if not isinstance(body, Mapping):
        raise FormatError(f"{origin}: tier {tier!r} must be an object")
    if not body:
        raise FormatError(f"{origin}: tier {tier!r} gives neither bytes nor requests")
    plain = set(body) & {"bytes", "requests"}
    if plain and set(body) - plain:
        extra = ", ".join(repr(k) for k in sorted(set(body) - plain))
        raise FormatError(
            f"{origin}: tier {tier!r} has unknown fields {extra} beside bytes and requests"
        )
    if plain:
        usage = OpUsage(
            requests=_count(body.get("requests", 0), f"{origin}: {tier}.requests"),
            bytes=_count(body.get("bytes", 0), f"{origin}: {tier}.bytes"),
        )
        return TierUsage(tier=tier, ops={OpClass.GET: usage})
    return TierUsage.from_json(tier, body, origin=origin)


def merge_run_usage(usages: Sequence[RunUsage]) -> RunUsage:
    """The reports of the ranks of one run as one: traffic and cache counts summed.

    Ranks run side by side, so the run lasts as long as its slowest rank and has as many
    epochs as the rank that saw most. The cold tier is kept when all reports agree.
    Warm copies are summed over ranks (each rank counts its own; ranks of one node that
    read the same warm copy count it once each, so reports that name one node's cache
    mark the sum ``warm_shared`` and ``warm_estimated``: an upper bound); a report
    without them adds its estimate (its hits) and marks the sum ``warm_estimated``.
    """
    if not usages:
        raise InvalidInputError("no run reports to merge")
    tiers: dict[str, TierUsage] = {}
    for u in usages:
        for t in u.tiers:
            tiers[t.tier] = tiers[t.tier] + t if t.tier in tiers else t
    colds = {u.cold_tier for u in usages}
    warm_hits = warm_bytes = warm_requests = None
    warm_estimated = False
    if any(u.warm_hits is not None for u in usages):
        saved = [u.saved_reads() for u in usages]
        warm_hits = sum(u.cache_hits if u.warm_hits is None else u.warm_hits for u in usages)
        warm_requests = sum(s[0] for s in saved)
        warm_bytes = sum(s[1] for s in saved)
        # reports that did not count warm copies (their hits priced), not those merged
        # as an upper bound for sharing a node cache: a merge of merges keeps them apart
        warm_estimated = any(u.warm_partial if u.warm_hits is not None else s[2]
                             for u, s in zip(usages, saved, strict=True))
    nodes = tuple(n for u in usages for n in u.cache_nodes)
    shared = any(u.warm_shared for u in usages) or len(set(nodes)) < len(nodes)
    return RunUsage(
        epochs=max(u.epochs for u in usages),
        seconds=max(u.seconds for u in usages),
        tiers=tuple(tiers[name] for name in sorted(tiers)),
        cache_hits=sum(u.cache_hits for u in usages),
        cache_misses=sum(u.cache_misses for u in usages),
        cache_hit_bytes=sum(u.cache_hit_bytes for u in usages),
        cache_fill_bytes=sum(u.cache_fill_bytes for u in usages),
        hit_bytes_estimated=any(u.hit_bytes_estimated for u in usages),
        cold_tier=colds.pop() if len(colds) == 1 else None,
        reports=sum(u.reports for u in usages),
        warm_hits=warm_hits,
        warm_hit_bytes=warm_bytes or 0,
        warm_estimated=warm_estimated or shared,
        warm_counted=_sum_counted(usages),
        warm_requests=warm_requests,
        cache_nodes=nodes,
        warm_shared=shared,
        warm_partial=warm_estimated,
    )


def _sum_counted(usages: Sequence[RunUsage]) -> int | None:
    """The warm copies the merged reports counted; None when none counted any."""
    counted = [n for n in (_counted(u) for u in usages) if n is not None]
    return sum(counted) if counted else None


def _counted(u: RunUsage) -> int | None:
    """The warm copies ``u``'s reports counted (see :attr:`RunUsage.warm_counted`)."""
    if u.warm_counted is not None:
        return u.warm_counted
    return None if u.warm_estimated else u.warm_hits


@dataclass(frozen=True, slots=True, kw_only=True)
class TierRunCost:
    """What one tier's traffic in a run cost, split into requests, retrieval and egress."""

    tier: str
    price_tier: str | None
    requests: int
    bytes_read: int
    requests_usd: float
    retrieval_usd: float
    egress_usd: float

    @property
    def total_usd(self) -> float:
        """All three parts."""
        return self.requests_usd + self.retrieval_usd + self.egress_usd

    def to_json(self) -> dict[str, Any]:
        """JSON shape."""
        return {
            "tier": self.tier,
            "price_tier": self.price_tier,
            "requests": self.requests,
            "bytes_read": self.bytes_read,
            "requests_usd": self.requests_usd,
            "retrieval_usd": self.retrieval_usd,
            "egress_usd": self.egress_usd,
            "total_usd": self.total_usd,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class RunCost:
    """A run priced: per tier, per run, per epoch, per hour, and what the warm cache saved.

    ``cache_saved_usd`` is what the warm copies the run read (those in the cache before
    it started) would have cost from the cold tier: one GET each and their bytes;
    ``cold_start_usd`` is the run's cost with a cold (empty) cache
    (``total_usd + cache_saved_usd``). ``saved_estimated``: the report did not count warm
    copies, so every cache hit (lookup) was priced as a GET and its copy's bytes, an
    upper bound (a hit on a copy the run itself filled saved nothing, and one copy is
    hit once per reading process and epoch). ``warm_hits``: the warm copies the reports
    counted (None when none did); ``saved_gets``/``saved_bytes``: what was priced.
    """

    tiers: tuple[TierRunCost, ...]
    epochs: float
    seconds: float
    egress: bool
    cold_tier: str | None
    cold_price_tier: str | None
    cache_hits: int
    cache_hit_bytes: int
    cache_hit_rate: float
    cache_saved_usd: float
    hit_bytes_estimated: bool = False
    reports: int = 1
    warm_hits: int | None = None
    saved_gets: int = 0
    saved_bytes: int = 0
    saved_estimated: bool = False
    warm_shared: bool = False
    """Ranks' reports that read one node's cache: their warm copies, summed, may count a
    copy once per rank (``saved_estimated`` too: an upper bound)."""
    warm_partial: bool = False
    """Some of the reports merged did not count warm copies (their hits are priced)."""

    @property
    def total_usd(self) -> float:
        """The whole run."""
        return sum(t.total_usd for t in self.tiers)

    @property
    def per_epoch_usd(self) -> float | None:
        """The run divided by its epochs; None when it read no epoch (none to divide by)."""
        return self.total_usd / self.epochs if self.epochs > 0 else None

    @property
    def per_hour_usd(self) -> float | None:
        """The run's cost per hour of its duration; None when the duration is unknown (0)."""
        return self.total_usd / (self.seconds / 3600) if self.seconds > 0 else None

    @property
    def cold_start_usd(self) -> float:
        """What the run would have cost with a cold (empty) cache.

        An upper bound when ``saved_estimated``.
        """
        return self.total_usd + self.cache_saved_usd

    def to_json(self) -> dict[str, Any]:
        """JSON shape."""
        return {
            "tiers": [t.to_json() for t in self.tiers],
            "epochs": self.epochs,
            "seconds": self.seconds,
            "egress": self.egress,
            "reports": self.reports,
            "total_usd": self.total_usd,
            "per_epoch_usd": self.per_epoch_usd,
            "per_hour_usd": self.per_hour_usd,
            "cache": {
                "hits": self.cache_hits,
                "hit_bytes": self.cache_hit_bytes,
                "hit_rate": self.cache_hit_rate,
                "hit_bytes_estimated": self.hit_bytes_estimated,
                "warm_hits": self.warm_hits,
                "saved_gets": self.saved_gets,
                "saved_bytes": self.saved_bytes,
                "saved_estimated": self.saved_estimated,
                "warm_shared": self.warm_shared,
                "warm_partial": self.warm_partial,
                "cold_tier": self.cold_tier,
                "cold_price_tier": self.cold_price_tier,
                "saved_usd": self.cache_saved_usd,
                "cold_start_usd": self.cold_start_usd,
            },
        }


def price_run(
    usage: RunUsage,
    table: PriceTable,
    tier_prices: Mapping[str, str | None],
    *,
    egress: bool = False,
) -> RunCost:
    """Price a run's traffic.

    ``tier_prices`` maps each tier name of the run to a price tier of ``table`` (None: not
    priced, e.g. ``memory``); a run tier it does not map is an
    :class:`InvalidInputError` naming it. Requests are priced per class; bytes read pay
    the tier's retrieval price, and its egress price when ``egress`` is true (a job
    outside the provider's region or network; same-region reads carry no transfer fee).
    What the warm cache saved is priced at the cold tier: see :meth:`RunUsage.saved_reads`.
    """
    costs = []
    for tu in usage.tiers:
        if tu.tier not in tier_prices:
            raise InvalidInputError(
                f"run tier {tu.tier!r} has no price tier; map it, e.g. --tier {tu.tier}=s3-standard"
            )
        name = tier_prices[tu.tier]
        if name is None:
            costs.append(
                TierRunCost(
                    tier=tu.tier,
                    price_tier=None,
                    requests=tu.requests,
                    bytes_read=tu.bytes_read,
                    requests_usd=0.0,
                    retrieval_usd=0.0,
                    egress_usd=0.0,
                )
            )
            continue
        price = table.tier(name)
        requests_usd = sum(u.requests / 1000 * price.request_price(op) for op, u in tu.ops.items())
        gib = tu.bytes_read / GIB
        costs.append(
            TierRunCost(
                tier=tu.tier,
                price_tier=name,
                requests=tu.requests,
                bytes_read=tu.bytes_read,
                requests_usd=requests_usd,
                retrieval_usd=gib * price.retrieval_per_gib,
                egress_usd=gib * price.egress_per_gib if egress else 0.0,
            )
        )
    cold_name = tier_prices.get(usage.cold_tier) if usage.cold_tier is not None else None
    saved = 0.0
    saved_gets, saved_bytes, saved_estimated = usage.saved_reads()
    if cold_name is not None:
        cold = table.tier(cold_name)
        per_gib = cold.retrieval_per_gib + (cold.egress_per_gib if egress else 0.0)
        saved = saved_gets / 1000 * cold.get_per_1000 + saved_bytes / GIB * per_gib
    looked_up = usage.cache_hits + usage.cache_misses
    return RunCost(
        tiers=tuple(costs),
        epochs=usage.epochs,
        seconds=usage.seconds,
        egress=egress,
        cold_tier=usage.cold_tier,
        cold_price_tier=cold_name,
        cache_hits=usage.cache_hits,
        cache_hit_bytes=usage.cache_hit_bytes,
        cache_hit_rate=usage.cache_hits / looked_up if looked_up else 0.0,
        cache_saved_usd=saved,
        hit_bytes_estimated=usage.hit_bytes_estimated,
        reports=usage.reports,
        warm_hits=_counted(usage),  # an older report's estimate is in saved_gets only
        saved_gets=saved_gets,
        saved_bytes=saved_bytes,
        saved_estimated=saved_estimated,
        warm_shared=usage.warm_shared,
        warm_partial=usage.warm_partial,
    )
