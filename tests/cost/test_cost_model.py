"""The pure cost model: price tables, footprints, snapshot figures and run pricing."""

from __future__ import annotations

import math

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from simstore.accounting import default_price_text
from simstore.cost import (
    DEFAULT_TIER_PRICES,
    GIB,
    Footprint,
    FootprintTally,
    OpClass,
    OpUsage,
    RunUsage,
    SnapshotObjects,
    TierUsage,
    amortised_per_gib_month,
    apply_price_overrides,
    dedup_ratio,
    merge_price_data,
    merge_run_usage,
    parse_price_table,
    parse_run_report,
    price_run,
    storage_prices,
    summarise_history,
)
from simstore.errors import FormatError, InvalidInputError

EXPECTED_TIERS = ("s3-standard", "s3-standard-ia", "s3-glacier-ir", "gcs-standard", "local-nvme")


@pytest.fixture(scope="module")
def table():
    return parse_price_table(default_price_text(), origin="default")


# -- price tables ----------------------------------------------------------------------


def test_default_table_has_the_tiers_with_source_and_date(table):
    assert table.names == EXPECTED_TIERS
    for t in table.tiers:
        assert t.source, t.name
        assert t.as_of == "2024-06", t.name
        assert t.storage_per_gib_month > 0, t.name
    s3 = table.tier("s3-standard")
    assert (s3.storage_per_gib_month, s3.put_per_1000, s3.get_per_1000) == (0.023, 0.005, 0.0004)
    assert table.tier("s3-standard-ia").min_object_bytes == 128 * 1024
    assert table.tier("s3-glacier-ir").retrieval_per_gib == 0.03


def test_local_nvme_is_amortised_from_the_drive(table):
    nvme = table.tier("local-nvme")
    # 1000 USD / (7.68e12 / 2**30 GiB) / 36 months, by hand: 1000 / 7152.557 / 36
    assert nvme.storage_per_gib_month == pytest.approx(0.0038836, rel=1e-4)
    assert nvme.storage_per_gib_month == amortised_per_gib_month(1000.0, 7_680_000_000_000, 36)
    assert "7.68 TB" in nvme.assumption


def test_storage_arithmetic_by_hand(table):
    ten_gib = Footprint(objects=10, bytes=10 * GIB, padding=((128 * 1024, 0),))
    prices = storage_prices(table, ten_gib)
    assert prices["s3-standard"] == pytest.approx(0.23)
    assert prices["s3-standard-ia"] == pytest.approx(0.125)
    assert prices["s3-glacier-ir"] == pytest.approx(0.04)
    assert prices["gcs-standard"] == pytest.approx(0.20)


def test_small_objects_are_billed_at_the_minimum_size(table):
    tally = FootprintTally(table.thresholds)
    for _ in range(1024):
        tally.add(1024)  # 1 KiB objects: IA and GIR bill 128 KiB each
    fp = tally.result()
    assert fp.bytes == 1024 * 1024
    assert fp.billable_bytes(0) == 1024 * 1024
    assert fp.billable_bytes(128 * 1024) == 1024 * 128 * 1024
    ia = table.tier("s3-standard-ia").storage_usd_per_month(fp)
    assert ia == pytest.approx(128 * 1024 * 1024 / GIB * 0.0125)  # 0.125 GiB billed
    std = table.tier("s3-standard").storage_usd_per_month(fp)
    assert std == pytest.approx(1 / 1024 * 0.023)


def test_footprint_refuses_an_untallied_threshold():
    fp = FootprintTally().result()
    assert fp.billable_bytes(4096) == 0  # empty: nothing to pad
    tally = FootprintTally()
    tally.add(10)
    with pytest.raises(InvalidInputError, match="4096"):
        tally.result().billable_bytes(4096)


def test_override_file_merges_field_by_field(table):
    import tomllib

    base = tomllib.loads(default_price_text())
    merged = merge_price_data(
        base,
        {"tiers": {"s3-standard": {"storage_per_gib_month": 0.021}, "mine": {"get_per_1000": 1}}},
    )
    t = parse_price_table(merged)
    assert t.tier("s3-standard").storage_per_gib_month == 0.021
    assert t.tier("s3-standard").put_per_1000 == 0.005  # kept
    assert t.tier("mine").get_per_1000 == 1.0
    assert t.names[-1] == "mine"


def test_flag_overrides_and_drive_fields():
    import tomllib

    base = tomllib.loads(default_price_text())
    data = apply_price_overrides(
        base,
        ["s3-standard.get_per_1000=0.001", "local-nvme.drive_usd=2000", "gcs-standard.as_of=x"],
    )
    t = parse_price_table(data)
    assert t.tier("s3-standard").get_per_1000 == 0.001
    assert t.tier("local-nvme").storage_per_gib_month == pytest.approx(2 * 0.0038836, rel=1e-4)
    assert t.tier("gcs-standard").as_of == "x"
    # a direct price replaces the drive fields instead of clashing with them
    data = apply_price_overrides(base, ["local-nvme.storage_per_gib_month=0.01"])
    assert parse_price_table(data).tier("local-nvme").storage_per_gib_month == 0.01


@pytest.mark.parametrize(
    "override", ["nodot=1", "s3-standard.get_per_1000", "s3-standard.get_per_1000=cheap"]
)
def test_malformed_overrides_are_refused(override):
    with pytest.raises(InvalidInputError, match="price override"):
        apply_price_overrides({"tiers": {"s3-standard": {}}}, [override])


@pytest.mark.parametrize(
    ("toml", "match"),
    [
        ("format_version = 2\n[tiers.a]\nget_per_1000 = 1", "format_version 2"),
        ('currency = "EUR"\n[tiers.a]\nget_per_1000 = 1', "EUR"),
        ("[tiers.a]\nget_per_1000 = -1", "non-negative"),
        ("[tiers.a]\nget_per_1000 = 'x'", "must be a number"),
        ("[tiers.a]\ncolour = 1", "unknown fields"),
        ("[tiers.a]\ndrive_usd = 1", "also needs"),
        ("format_version = 1", "no \\[tiers"),
        ("this is = not toml =", "not valid TOML"),
    ],
)
def test_malformed_tables_are_format_errors(toml, match):
    with pytest.raises(FormatError, match=match):
        parse_price_table(toml, origin="t.toml")


def test_unknown_tier_lists_the_known_ones(table):
    with pytest.raises(InvalidInputError, match="s3-standard, s3-standard-ia"):
        table.tier("s3-deep-archive")


# -- snapshot figures ------------------------------------------------------------------


def _snap(sid, parent, objects, *, created=None, samples=1, logical=1):
    return SnapshotObjects(
        snapshot_id=sid,
        parent_id=parent,
        created=created or sid,
        samples=samples,
        logical_bytes=logical,
        objects=frozenset(objects),
    )


def test_history_figures_by_hand():
    sizes = {"s1": 10, "s2": 10, "p1": 100, "p2": 100, "a": 1000, "b": 2000, "c": 4000}
    history = [
        _snap("s1", None, {"s1", "p1", "a", "b"}),
        _snap("s2", "s1", {"s2", "p2", "b", "c"}),
    ]
    first, second = summarise_history(history, sizes)
    assert (first.reached.bytes, first.new.bytes, first.shared.bytes) == (3110, 3110, 0)
    assert (first.stored.bytes, first.full_copy_bytes, first.dedup_ratio) == (3110, 3110, 1.0)
    assert (second.reached.bytes, second.new.bytes, second.shared.bytes) == (6110, 4110, 2000)
    assert (second.new.objects, second.shared.objects) == (3, 1)
    assert second.stored.bytes == 3110 + 4110
    assert second.full_copy_bytes == 3110 + 6110
    assert second.dedup_ratio == pytest.approx(9220 / 7220)
    assert second.missing == 0


def test_baseline_parent_outside_the_report():
    sizes = {"x": 5, "y": 7}
    (fig,) = summarise_history(
        [_snap("s2", "s1", {"x", "y"})], sizes, baselines={"s1": frozenset({"x"})}
    )
    assert (fig.new.bytes, fig.shared.bytes) == (7, 5)
    assert fig.stored.bytes == 12  # the baseline is not part of the report's store


def test_missing_objects_are_counted_not_sized():
    (fig,) = summarise_history([_snap("s", None, {"s", "gone"})], {"s": 3})
    assert fig.missing == 1 and fig.reached.bytes == 3 and fig.reached.objects == 1


def test_dedup_ratio_of_nothing_is_one():
    assert dedup_ratio(0, 0) == 1.0
    assert dedup_ratio(30, 10) == 3.0


@st.composite
def histories(draw):
    universe = [f"o{i}" for i in range(draw(st.integers(1, 12)))]
    sizes = {o: draw(st.integers(0, 300_000)) for o in universe}
    if draw(st.booleans()):
        sizes.pop(universe[0])  # a missing object
    n = draw(st.integers(1, 8))
    snaps = []
    for i in range(n):
        parent = draw(st.one_of(st.none(), st.integers(0, i - 1))) if i else None
        objects = draw(st.sets(st.sampled_from(universe), max_size=len(universe)))
        snaps.append(_snap(f"s{i}", f"s{parent}" if parent is not None else None, objects))
    return snaps, sizes


@settings(max_examples=200, deadline=None)
@given(histories(), st.sampled_from([(), (131072,), (4096, 131072)]))
def test_history_properties(history, thresholds):
    snaps, sizes = history
    children: dict[str, int] = {}
    for s in snaps:
        if s.parent_id:
            children[s.parent_id] = children.get(s.parent_id, 0) + 1
    figures = list(summarise_history(snaps, sizes, thresholds=thresholds))
    frugal = list(summarise_history(snaps, sizes, thresholds=thresholds, children=children))
    assert figures == frugal  # dropping finished object sets changes no figure
    union: set[str] = set()
    previous = 0
    for snap, f in zip(snaps, figures, strict=True):
        assert f.new.bytes + f.shared.bytes == f.reached.bytes
        assert f.new.objects + f.shared.objects == f.reached.objects
        for t in thresholds:
            assert f.new.billable_bytes(t) + f.shared.billable_bytes(t) == f.reached.billable_bytes(
                t
            )
            assert f.reached.billable_bytes(t) >= f.reached.bytes
        if snap.parent_id is None:
            assert f.shared.bytes == 0 and f.shared.objects == 0
        assert f.dedup_ratio >= 1.0
        assert f.stored.bytes >= previous
        previous = f.stored.bytes
        union |= snap.objects
        assert f.stored.bytes == sum(sizes[o] for o in union if o in sizes)
        assert f.reached.objects + f.missing == len(snap.objects)
    assert figures[-1].full_copy_bytes == sum(f.reached.bytes for f in figures)


# -- runs ------------------------------------------------------------------------------


def _usage(tier, **ops):
    return TierUsage(
        tier=tier, ops={OpClass(k): OpUsage(requests=r, bytes=b) for k, (r, b) in ops.items()}
    )


def test_price_run_by_hand(table):
    usage = RunUsage(
        epochs=4,
        seconds=7200.0,
        tiers=(
            _usage("s3", get=(10_000, 10 * GIB), range_get=(5_000, 0), list=(2_000, 0)),
            _usage("cache", get=(90_000, 90 * GIB)),
        ),
        cache_hits=90_000,
        cache_misses=10_000,
        cache_hit_bytes=90 * GIB,
        cold_tier="s3",
    )
    cost = price_run(usage, table, DEFAULT_TIER_PRICES)
    s3, cache = cost.tiers
    # 15,000 GETs at 0.0004/1k = 0.006; 2,000 LISTs at 0.005/1k = 0.01
    assert s3.requests_usd == pytest.approx(0.016)
    assert s3.retrieval_usd == 0.0 and s3.egress_usd == 0.0
    assert cache.total_usd == 0.0 and cache.price_tier == "local-nvme"
    assert cost.total_usd == pytest.approx(0.016)
    assert cost.per_epoch_usd == pytest.approx(0.004)
    assert cost.per_hour_usd == pytest.approx(0.008)
    assert cost.cache_hit_rate == pytest.approx(0.9)
    # 90,000 GETs not sent: 0.036
    assert cost.cache_saved_usd == pytest.approx(0.036)
    egress = price_run(usage, table, DEFAULT_TIER_PRICES, egress=True)
    assert egress.tiers[0].egress_usd == pytest.approx(0.9)  # 10 GiB at 0.09
    assert egress.cache_saved_usd == pytest.approx(0.036 + 8.1)  # and 90 GiB not egressed
    assert egress.cold_start_usd == pytest.approx(egress.total_usd + egress.cache_saved_usd)


def test_retrieval_tier_prices_bytes(table):
    usage = RunUsage(epochs=1, seconds=0, tiers=(_usage("s3", get=(1000, 2 * GIB)),))
    cost = price_run(usage, table, {"s3": "s3-glacier-ir"})
    assert cost.tiers[0].requests_usd == pytest.approx(0.01)
    assert cost.tiers[0].retrieval_usd == pytest.approx(0.06)
    assert cost.per_hour_usd is None  # unknown duration: no per-hour figure
    assert cost.per_epoch_usd == pytest.approx(cost.total_usd)
    none = price_run(RunUsage(epochs=0, seconds=10, tiers=usage.tiers), table,
                     {"s3": "s3-glacier-ir"})
    assert none.per_epoch_usd is None and none.per_hour_usd is not None


def test_unmapped_run_tier_is_an_error(table):
    usage = RunUsage(epochs=1, seconds=1, tiers=(_usage("azure", get=(1, 1)),))
    with pytest.raises(InvalidInputError, match="--tier azure="):
        price_run(usage, table, DEFAULT_TIER_PRICES)


LOADER_REPORT = {
    "format_version": 1,
    "kind": "simstore-loader-report",
    "snapshots": ["ab" * 16],
    "epochs": [0, 1],
    "world_size": 1,
    "num_workers": 2,
    "seconds": 100.0,
    "samples": 1000,
    "sample_bytes": 10_000,
    "tiers": {"s3": {"bytes": 4000, "requests": 4}, "cache": {"bytes": 9000, "requests": 9}},
    "cache": {"hits": 6, "misses": 4, "fill_bytes": 4000, "evictions": 0, "evicted_bytes": 0},
    "manifest": {"parts": 1, "bytes": 100},
    "time_to_first_batch_s": 0.5,
    "data_stall": 0.1,
    "wait_s": 10.0,
}


def test_parse_loader_report():
    usage = parse_run_report(LOADER_REPORT)
    assert usage.epochs == 2 and usage.seconds == 100.0
    assert usage.cold_tier == "s3"
    s3 = next(t for t in usage.tiers if t.tier == "s3")
    assert s3.usage(OpClass.GET) == OpUsage(requests=4, bytes=4000)
    # no hit_bytes given: 6 hits at the mean fill of 4000 / 4 bytes
    assert usage.cache_hit_bytes == 6000 and usage.hit_bytes_estimated


def test_parse_report_with_request_classes_and_hit_bytes():
    report = dict(LOADER_REPORT)
    report["tiers"] = {"gs": {"get": {"requests": 3, "bytes": 30}, "head": {"requests": 2}}}
    report["cache"] = {"hits": 1, "misses": 0, "hit_bytes": 77}
    usage = parse_run_report(report)
    gs = usage.tiers[0]
    assert gs.requests == 5 and gs.bytes_read == 30
    assert usage.cache_hit_bytes == 77 and not usage.hit_bytes_estimated
    assert usage.cold_tier == "gs"


@pytest.mark.parametrize(
    ("patch", "match"),
    [
        ({"kind": "other"}, "kind"),
        ({"format_version": 9}, "format_version 9"),
        ({"seconds": -1}, "seconds"),
        ({"tiers": {"s3": {"bytes": -5}}}, "non-negative"),
        ({"tiers": {"s3": {"teleport": {"requests": 1}}}}, "unknown request class"),
        ({"cache": {"hits": 1.5}}, "whole number"),
    ],
)
def test_malformed_reports(patch, match):
    with pytest.raises(FormatError, match=match):
        parse_run_report({**LOADER_REPORT, **patch}, origin="r.json")


def test_merge_rank_reports():
    a = parse_run_report(LOADER_REPORT)
    b = parse_run_report({**LOADER_REPORT, "seconds": 150.0, "epochs": [0, 1, 2]})
    merged = merge_run_usage([a, b])
    assert merged.seconds == 150.0 and merged.epochs == 3 and merged.reports == 2
    s3 = next(t for t in merged.tiers if t.tier == "s3")
    assert s3.usage(OpClass.GET) == OpUsage(requests=8, bytes=8000)
    assert merged.cache_hits == 12 and merged.cold_tier == "s3"
    with pytest.raises(InvalidInputError):
        merge_run_usage([])


def test_tier_usage_json_round_trip():
    tu = _usage("s3", get=(3, 30), put=(1, 10))
    assert TierUsage.from_json("s3", tu.to_json()) == tu
    assert (tu + tu).usage(OpClass.GET) == OpUsage(requests=6, bytes=60)
    assert math.isclose(tu.bytes_read, 30) and tu.bytes_written == 10


# -- the module's shape ----------------------------------------------------------------


def test_cost_model_is_pure_and_exports_are_sorted():
    import ast
    import pathlib

    import simstore.accounting
    import simstore.cost
    import simstore.storage

    paths = sorted(pathlib.Path(simstore.cost.__file__).parent.glob("*.py"))
    assert len(paths) > 1  # the package's modules, each checked
    imported = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
    banned = {"os", "io", "time", "random", "datetime", "fsspec", "pathlib", "shutil"}
    assert not imported & banned
    assert not {m for m in imported if m.startswith(("simstore.storage", "simstore.catalog"))}
    for module in (simstore.cost, simstore.accounting):
        assert module.__all__ == sorted(module.__all__)
    assert simstore.storage.__all__ == sorted(simstore.storage.__all__)
    assert {"CountingStore", "Traffic", "tier_of_url"} <= set(simstore.storage.__all__)
