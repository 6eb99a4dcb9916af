"""Cost and tier commands: cost, prices, du, pull."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from typing import Any

import click
from simstore.cli._common import (
    CliContext,
    PathArg,
    check_at_least,
    emit,
    fields_arg,
    handle_errors,
    parse_size_flag,
    pass_ctx,
)

from simstore._sizes import human_bytes
from simstore.accounting import (
    CacheFiller,
    CostReport,
    DiskUsage,
    PullReport,
    dataset_cost,
    disk_usage,
    read_price_table,
    run_cost,
    warm_cache,
)
from simstore.accounting._tiers import existing_folder
from simstore.cost import PriceTable, RunCost
from simstore.errors import InvalidInputError
from simstore.names import parse_ref

__all__ = ["COMMANDS", "parse_size"]


def parse_size(text: str, flag: str | None = None) -> int:
    """Bytes in ``1000000``, ``500M``, ``20GiB`` or ``20GB``: :func:`parse_size_flag`."""
    return parse_size_flag(text, flag)


def _usd(x: float) -> str:
    if x == 0:
        return "$0"
    if abs(x) >= 100:
        return f"${x:,.0f}"
    if abs(x) >= 1:
        return f"${x:,.2f}"
    return f"${x:.3g}"


def _emit(as_json: bool, obj: Any, text: str | Callable[[], str]) -> None:
    """:func:`emit`, except that a NaN or an infinity among the figures is refused.

    Python's json writes them as bare ``NaN``/``Infinity``, which are not JSON and which
    strict parsers (jq, JavaScript) refuse, and text showed ``$inf``. The inputs are
    checked one by one, so one here comes of inputs that overflow together.
    """
    where = _non_finite_at(obj)
    if where is not None:
        # finite inputs whose product overflows (a price near 1e308, an epochs_read near
        # 0): text printed "$inf" with exit 0, --json an error naming no input
        raise InvalidInputError(
            f"{where} is not a finite number: a price, count or size this large (or an "
            "epochs_read this small) is out of range; nothing written")
    if not as_json:
        emit(as_json, obj, text)
        return
    click.echo(json.dumps(obj, indent=2, sort_keys=True, default=str, allow_nan=False))


def _non_finite_at(obj: Any, path: str = "") -> str | None:
    """The path (``cache.saved_usd``, ``tiers[0].egress_usd``) of a NaN or an infinity."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return path or "the result"
    if isinstance(obj, dict):
        for key, value in obj.items():
            found = _non_finite_at(value, f"{path}.{key}" if path else str(key))
            if found:
                return found
    if isinstance(obj, list | tuple):
        for i, value in enumerate(obj):
            found = _non_finite_at(value, f"{path}[{i}]")
            if found:
                return found
    return None


def _prices(files: Sequence[str], overrides: Sequence[str]) -> PriceTable:
    return read_price_table(files, overrides)  # its errors name --price


def _tier_map(items: Sequence[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for item in items:
        name, sep, price = item.partition("=")
        if not sep or not name or not price:
            raise InvalidInputError(
                f"invalid --tier {item!r}: expected RUN_TIER=PRICE_TIER, e.g. s3=s3-standard-ia "
                "(or RUN_TIER=none)"
            )
        out[name] = None if price == "none" else price
    return out


_price_options = [
    click.option(
        "--prices",
        "price_files",
        multiple=True,
        type=PathArg(dir_okay=False),
        help="TOML price table laid over the defaults (repeatable; see docs/cost.md).",
    ),
    click.option(
        "--price",
        "price_overrides",
        multiple=True,
        metavar="TIER.FIELD=VALUE",
        help="Override one price, e.g. s3-standard.storage_per_gib_month=0.021 (repeatable).",
    ),
]


def _with_price_options(fn: Any) -> Any:
    for option in reversed(_price_options):
        fn = option(fn)
    return fn


# -- cost ------------------------------------------------------------------------------


@click.command("cost")
@click.argument("target", required=False)
@click.option(
    "--run",
    "runs",
    multiple=True,
    type=PathArg(dir_okay=False),
    help="Price a loader run report (JSON) instead; repeat for the reports of several ranks.",
)
@click.option("--last", type=int, default=None, help="Only the newest N snapshots.")
@_with_price_options
@click.option(
    "--tier",
    "tier_map",
    multiple=True,
    metavar="RUN_TIER=PRICE_TIER",
    help="With --run: price a run tier as a price tier, e.g. s3=s3-standard-ia, memory=none.",
)
@click.option("--cold", default=None, help="With --run: the tier cache hits would come from.")
@click.option("--egress", is_flag=True, help="With --run: charge internet egress on reads.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_ctx
@handle_errors
def cost_cmd(
    ctx: CliContext,
    target: str | None,
    runs: tuple[str, ...],
    last: int | None,
    price_files: tuple[str, ...],
    price_overrides: tuple[str, ...],
    tier_map: tuple[str, ...],
    cold: str | None,
    egress: bool,
    as_json: bool,
) -> None:
    """Storage cost of TARGET's snapshots, or (--run) the cost of a loader run.

    TARGET is NAME (every snapshot reachable from its branches and tags) or NAME@REV.
    Reads every manifest part of the reported snapshots and lists the store's objects
    once; --last limits the snapshots. Prices are list prices: check them (docs/cost.md).
    """
    if bool(target) == bool(runs):
        raise InvalidInputError("give either a dataset (NAME or NAME@REV) or --run REPORT.json")
    check_at_least(last, "--last", 1)
    prices = _prices(price_files, price_overrides)
    if runs:
        if last is not None:
            raise InvalidInputError("--last applies to a dataset, not to --run")
        result = run_cost(runs, prices, tier_prices=_tier_map(tier_map), cold_tier=cold,
                          egress=egress)  # fmt: skip
        _emit(as_json, result.to_json(), lambda: _run_text(result))
        return
    if tier_map or cold or egress:
        raise InvalidInputError("--tier, --cold and --egress apply to --run")
    assert target is not None
    report = dataset_cost(ctx.catalog(read_only=True), target, prices, last=last)
    _emit(as_json, report.to_json(), lambda: _cost_text(report))


def _cost_text(report: CostReport) -> str:
    out = report.to_json()
    tiers = list(report.prices.names)
    lines = [
        f"{report.target}: {len(report.snapshots)} snapshots"
        + (" (older ones left out by --last)" if report.truncated else "")
        + f"; store {report.store_url} ({report.store_tier})",
        "",
        f"{'snapshot':<12}  {'created':<10}  {'samples':>9}  {'logical':>10}  {'new':>10}  "
        f"{'shared':>10}  {'stored':>10}  {'dedup':>6}",
    ]
    for s in out["snapshots"]:
        lines.append(
            f"{s['id'][:12]:<12}  {s['created'][:10]:<10}  {s['samples']:>9}  "
            f"{human_bytes(s['logical_bytes']):>10}  {human_bytes(s['new_bytes']):>10}  "
            f"{human_bytes(s['shared_bytes']):>10}  {human_bytes(s['stored_bytes']):>10}  "
            f"{s['dedup_ratio']:>5.2f}x"
            + (f"  ({s['missing_objects']} objects missing)" if s["missing_objects"] else "")
        )
    lines += ["", "$/month to hold each snapshot alone (its new bytes alone):"]
    lines.append(f"{'snapshot':<12}" + "".join(f"  {t:>22}" for t in tiers))
    for s in out["snapshots"]:
        cells = "".join(
            f"  {_usd(s['usd_per_month'][t]) + ' (' + _usd(s['new_usd_per_month'][t]) + ')':>22}"
            for t in tiers
        )
        lines.append(f"{s['id'][:12]:<12}{cells}")
    d, st = out["dataset_total"], out["store_total"]
    lines += [
        "",
        f"dataset: {d['objects']} objects, {human_bytes(d['bytes'])} stored after dedup "
        f"({human_bytes(d['full_copy_bytes'])} as full copies, {d['dedup_ratio']:.2f}x)",
        "  $/month: " + ", ".join(f"{t} {_usd(d['usd_per_month'][t])}" for t in tiers),
        f"store:   {st['objects']} objects, {human_bytes(st['bytes'])}",
        "  $/month: " + ", ".join(f"{t} {_usd(st['usd_per_month'][t])}" for t in tiers),
        _read_line(out["read"], "this report"),
        _prices_note(report.prices),
    ]
    return "\n".join(lines)


def _read_line(read: dict[str, dict[str, dict[str, int]]], what: str) -> str:
    requests = sum(u["requests"] for ops in read.values() for u in ops.values())
    size = sum(u["bytes"] for ops in read.values() for u in ops.values())
    noun = "request" if requests == 1 else "requests"
    return f"{what} made {requests} {noun} reading {human_bytes(size)}"


def _prices_note(prices: PriceTable) -> str:
    dates = sorted({t.as_of for t in prices.tiers if t.as_of})
    return f"prices: list prices as of {', '.join(dates) or '?'}; check them (docs/cost.md)"


def _duration(seconds: float) -> str:
    """Seconds for a person: whole ones from 10 s, three digits below (0 is unknown)."""
    return f"{seconds:.0f} s" if seconds >= 10 or seconds == 0 else f"{seconds:.3g} s"


def _run_text(result: RunCost) -> str:
    out = result.to_json()
    lines = [
        f"run: {result.epochs:g} epochs, {_duration(result.seconds)}, {result.reports} "
        "report(s); "
        + ("internet egress charged" if result.egress else "no egress charged (same region)"),
        "",
        f"{'tier':<8}  {'priced as':<16}  {'requests':>10}  {'bytes read':>10}  "
        f"{'requests':>9}  {'retrieval':>9}  {'egress':>9}  {'total':>9}",
    ]
    for t in out["tiers"]:
        lines.append(
            f"{t['tier']:<8}  {t['price_tier'] or '-':<16}  {t['requests']:>10}  "
            f"{human_bytes(t['bytes_read']):>10}  {_usd(t['requests_usd']):>9}  "
            f"{_usd(t['retrieval_usd']):>9}  {_usd(t['egress_usd']):>9}  {_usd(t['total_usd']):>9}"
        )
    c = out["cache"]
    lines += [
        "",
        f"total {_usd(result.total_usd)} per run, "
        + (f"{_usd(result.per_epoch_usd)} per epoch, " if result.per_epoch_usd is not None
           else "no epoch read (no per-epoch figure), ")
        + (f"{_usd(result.per_hour_usd)} per hour" if result.per_hour_usd is not None
           else "no per-hour figure (the report's duration is unknown)"),
    ]
    lines.append(_cache_line(c, result.total_usd))
    return "\n".join(lines)


def _cache_line(c: dict[str, Any], total_usd: float) -> str:
    """What the warm cache saved, in words.

    Measured (the reports count warm copies: those in the cache before the run): the
    copies and what a cold cache would have cost; a run that found none saved nothing.
    Estimated (older reports): every hit priced as a GET, said to be an upper bound.
    """
    lookups = f"cache: {c['hits']} hits ({100 * c['hit_rate']:.0f}% of lookups)"
    warm = c["warm_hits"]
    if c["cold_price_tier"] is None:
        found = "" if warm is None else f", {warm} warm copies (in the cache before the run)"
        return f"{lookups}{found}; no cold tier to price them against (give --cold TIER)"
    source = f"{c['cold_tier']} ({c['cold_price_tier']})"
    if not c["saved_estimated"]:
        if not c["saved_gets"]:
            return (
                f"{lookups}, none on a copy from before the run: the warm cache saved "
                f"nothing; with a cold cache the run would cost what it cost "
                f"({_usd(total_usd)})"
            )
        copies = f"{warm} warm copies" if warm is not None else "warm copies"
        return (
            f"{lookups}; {copies} (in the cache before the run), "
            f"{human_bytes(c['saved_bytes'])} in {c['saved_gets']} requests not read from "
            f"{source}: saved "
            f"{_usd(c['saved_usd'])}; with a cold cache the run would cost "
            f"{_usd(c['cold_start_usd'])}"
        )
    per_rank = ("ranks that share a node's cache each count the warm copies they read, so "
                "a copy several of them read is counted once per rank")
    shared = f"; {per_rank}" if c.get("warm_shared") else ""
    if c.get("warm_shared") and c["warm_hits"] is not None and not c.get("warm_partial"):
        return (
            f"{lookups}; {warm} warm copies counted by the ranks (in the cache before the "
            f"run), {human_bytes(c['saved_bytes'])} in {c['saved_gets']} requests not read "
            f"from {source}: saved at most {_usd(c['saved_usd'])} ({per_rank}); with a cold "
            f"cache the run would cost at most {_usd(c['cold_start_usd'])}"
        )
    if warm is None:
        what = "the reports do not count warm copies, so every hit is priced as a GET"
    else:
        what = "some reports do not count warm copies, whose hits are each priced as a GET"
    hit_bytes = " (bytes estimated)" if c["hit_bytes_estimated"] else ""
    return (
        f"{lookups}, {c['saved_gets']} reads of {human_bytes(c['saved_bytes'])}{hit_bytes} "
        f"not sent to {source}: saved at most {_usd(c['saved_usd'])} (estimated: {what}, "
        f"though hits on copies the run filled itself, and repeated hits on one copy, saved "
        f"nothing); with a cold cache the run would cost at most "
        f"{_usd(c['cold_start_usd'])} (estimated){shared}"
    )


# -- prices ----------------------------------------------------------------------------


@click.command("prices")
@_with_price_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@handle_errors
def prices_cmd(
    price_files: tuple[str, ...], price_overrides: tuple[str, ...], as_json: bool
) -> None:
    """The price table in effect (defaults, --prices files, --price overrides)."""
    prices = _prices(price_files, price_overrides)

    def text() -> str:
        lines = [
            f"{'tier':<16}  {'$/GiB-month':>11}  {'PUT/1k':>7}  {'GET/1k':>7}  "
            f"{'retr/GiB':>8}  {'egress/GiB':>10}  {'min obj':>8}  {'min days':>8}  as of"
        ]
        for t in prices.tiers:
            lines.append(
                f"{t.name:<16}  {t.storage_per_gib_month:>11.5f}  {t.put_per_1000:>7.4f}  "
                f"{t.get_per_1000:>7.4f}  {t.retrieval_per_gib:>8.3f}  {t.egress_per_gib:>10.3f}  "
                f"{human_bytes(t.min_object_bytes):>8}  {t.min_storage_days:>8}  {t.as_of}"
            )
        lines.append(_prices_note(prices))
        return "\n".join(lines)

    _emit(as_json, prices.to_json(), text)


# -- du --------------------------------------------------------------------------------


def _cache_opener(directory: str, *, writable: bool = True) -> Callable[[int], CacheFiller]:
    """Opens the loader's disk cache at ``directory`` with a given byte limit.

    The loader (which brings torch) is imported here, before any timing starts.
    ``writable=False`` for a report, which may read a cache it cannot write.
    """
    try:
        from simstore.loaders._cache import CacheConfig, ShardCache
        from simstore.loaders._stats import Counters
    except ImportError as exc:  # pragma: no cover - depends on the loader being installed
        raise InvalidInputError(f"--cache needs simstore.loaders' disk cache: {exc}") from exc

    def open_cache(limit_bytes: int) -> CacheFiller:
        config = CacheConfig(directory=directory, limit_bytes=limit_bytes)
        return ShardCache(config, Counters(), writable=writable)

    return open_cache


@click.command("du")
@click.argument("ref", required=False)
@click.option(
    "--cache",
    "cache_dir",
    type=PathArg(file_okay=False),
    default=None,
    help="Also report a hot-tier cache directory (a SimDataset cache_dir).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_ctx
@handle_errors
def du_cmd(ctx: CliContext, ref: str | None, cache_dir: str | None, as_json: bool) -> None:
    """Where REF's snapshot, manifest parts and shards live: the store's tier and a cache.

    Without REF, what the store and the cache hold in all. Sends one HEAD per shard.
    """
    import os

    # a report writes nothing: a cache directory that does not exist, or is empty, holds
    # nothing and is not opened (opening makes a folder a cache); one under a file is
    # refused, as pull refuses it
    if cache_dir is not None:
        existing_folder(cache_dir, "--cache")
    holds = cache_dir is not None and os.path.isdir(cache_dir) and bool(os.listdir(cache_dir))
    cache = (_cache_opener(cache_dir, writable=False)(1) if cache_dir is not None and holds
             else None)
    usage = disk_usage(ctx.catalog(read_only=True), ref, cache=cache)
    out = usage.to_json()
    if cache_dir is not None and cache is None:
        # what it lacks of REF: all of it; without REF nothing is asked of it
        wanted = usage.snapshot is not None
        out["tiers"].append(
            {"tier": "cache", "location": os.path.abspath(cache_dir), "objects": 0, "bytes": 0,
             "missing_objects": usage.objects if wanted else 0,
             "missing_bytes": usage.bytes if wanted else 0}
        )  # fmt: skip
    _emit(as_json, out, lambda: _du_text(usage, out))


def _du_text(usage: DiskUsage, out: dict[str, Any]) -> str:
    if usage.snapshot is None:
        head = f"store: {usage.objects} objects, {human_bytes(usage.bytes)}"
    else:
        head = (
            f"snapshot {usage.snapshot}: {usage.objects} objects (the snapshot, manifest "
            f"parts and shards), {human_bytes(usage.bytes)}"
            + (f"; {usage.unknown_size} of unknown size" if usage.unknown_size else "")
        )
    lines = [head, f"{'tier':<8}  {'objects':>15}  {'bytes':>10}  {'missing':>22}  location"]
    for t in out["tiers"]:
        objects = "-" if t["objects"] is None else str(t["objects"])
        if usage.snapshot is not None:
            objects = f"{objects}/{usage.objects}"
        missing = (
            f"{t['missing_objects']} ({human_bytes(t['missing_bytes'])})"
            if t["missing_objects"]
            else "-"
        )
        lines.append(
            f"{t['tier']:<8}  {objects:>15}  {human_bytes(t['bytes']):>10}  {missing:>22}  "
            f"{t['location']}"
        )
    lines.append(_read_line(out["read"], "du"))
    return "\n".join(lines)


# -- pull ------------------------------------------------------------------------------


@click.command("pull")
@click.argument("ref")
@click.option(
    "--cache",
    "cache_dir",
    required=True,
    type=PathArg(file_okay=False),
    help="The hot-tier directory: give the same one as SimDataset's cache_dir.",
)
@click.option(
    "--fields",
    default=None,
    help="Comma-separated fields the job reads (checked; whole shards are pulled).",
)
@click.option(
    "--limit",
    default=None,
    help="Cache size limit, e.g. 500G (default: its copies plus the disk's free space).",
)
@click.option("--jobs", type=int, default=8, show_default=True, help="Parallel downloads.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_ctx
@handle_errors
def pull_cmd(
    ctx: CliContext,
    ref: str,
    cache_dir: str,
    fields: str | None,
    limit: str | None,
    jobs: int,
    as_json: bool,
) -> None:
    """Warm a node's cache: copy REF's snapshot, manifest parts and shards into --cache DIR.

    Every copy is hash-checked as it lands; objects already cached are kept. A later
    SimDataset with cache_dir=DIR reads only the ref from the store, the rest from local disk
    (nothing at all for a REF that names the snapshot by its full id).
    """
    check_at_least(jobs, "--jobs", 1)
    existing_folder(cache_dir, "--cache")  # under a file: one line naming the flag
    wanted = tuple(fields_arg(fields) or ())
    report = warm_cache(
        ctx.catalog(read_only=True),
        ref,
        cache_dir,
        _cache_opener(cache_dir),
        limit_bytes=parse_size_flag(limit, "--limit") if limit is not None else None,
        fields=wanted,
        max_workers=jobs,
    )
    _emit(as_json, report.to_json(), lambda: _pull_text(ref, report))


def _pull_text(ref: str, r: PullReport) -> str:
    pinned = f"{parse_ref(ref).dataset}@{r.snapshot}"
    head = (
        f"pulled {ref} ({r.snapshot[:12]}) into {r.cache_dir}: {r.objects} objects, "
        f"{human_bytes(r.bytes)}; fetched {r.fetched} ({human_bytes(r.fetched_bytes)}), "
        f"{r.already_cached} already cached; {r.seconds:.1f} s\n"
    )
    if r.present < r.objects:
        return head + (
            f"only {r.present} of the {r.objects} objects are in the cache now: copies that "
            "jobs reading it pin took the rest of its limit, and the pull's own were evicted "
            f"to make room; a job that reads {pinned} fetches the others from the store "
            "(pull when no job reads the cache, or with a larger --limit)"
        )
    return head + f"a job that reads {pinned} with this cache_dir asks nothing of the store"


COMMANDS = [cost_cmd, prices_cmd, du_cmd, pull_cmd]
