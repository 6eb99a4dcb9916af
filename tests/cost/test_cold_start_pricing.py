"""What a warm cache saved a run, and what the run would have cost with a cold one.

A run report's ``cache.warm_hits``/``warm_hit_bytes`` (and ``manifest.warm_hits``) count
the distinct copies that were in the cache before the run: a cold cache would have
fetched each once. Priced against S3, a warm run's cold start is the cold run's price.
Reports without them keep the old estimate (every hit a GET), marked as such.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from simstore.cli import main

from simstore.accounting import read_price_table, run_cost
from simstore.catalog import Catalog
from simstore.cost import (
    DEFAULT_TIER_PRICES,
    merge_run_usage,
    parse_run_report,
    price_run,
)
from simstore.errors import FormatError
from simstore.storage._s3 import S3Store

FAST = {"backoff_base_s": 0.01, "backoff_max_s": 0.05, "read_timeout_s": 5}

REPORT = {
    "format_version": 1,
    "kind": "simstore-loader-report",
    "epochs": [0, 1, 2],
    "seconds": 600.0,
    "tiers": {"s3": {"bytes": 0, "requests": 0}, "cache": {"bytes": 3 << 30, "requests": 60}},
    # 2 workers x 3 epochs looked 10 copies up: 60 hits
    "cache": {"hits": 60, "hit_bytes": 60 << 27, "misses": 0, "fill_bytes": 0},
}


def _warm(report: dict, shards: int, shard_bytes: int, parts: int = 0,
          part_bytes: int = 0) -> dict:
    out = json.loads(json.dumps(report))
    out["cache"].update(warm_hits=shards, warm_hit_bytes=shard_bytes)
    out["manifest"] = {"parts": 3, "bytes": 3 * part_bytes, "cache_hits": 3,
                       "warm_hits": parts, "warm_hit_bytes": part_bytes}
    return out


def test_warm_copies_are_priced_once_each():
    usage = parse_run_report(_warm(REPORT, 10, 10 << 27, parts=1, part_bytes=1000))
    assert usage.warm_hits == 11 and usage.warm_hit_bytes == (10 << 27) + 1000
    cost = price_run(usage, read_price_table(), DEFAULT_TIER_PRICES, egress=True)
    # 11 GETs at 0.0004 / 1,000 and 1.25 GiB (and 1000 bytes) at 0.09 egress
    assert cost.cache_saved_usd == pytest.approx(11 * 0.0004 / 1000 + ((10 << 27) + 1000)
                                                 / 2**30 * 0.09)
    assert cost.cold_start_usd == pytest.approx(cost.total_usd + cost.cache_saved_usd)
    assert not cost.saved_estimated and cost.warm_hits == 11
    assert cost.cache_hits == 60  # still the lookups
    assert cost.to_json()["cache"]["saved_gets"] == 11


def test_the_cli_counts_warm_copies_and_prices_their_fills_requests(tmp_path):
    # found by an audit: with fills of several requests each (max_bandwidth), the text
    # called the requests "warm copies"
    report = _warm(REPORT, 7, 7 << 20)
    report["cache"]["warm_requests"] = 13
    text = _cli_text(tmp_path, report)
    assert "7 warm copies (in the cache before the run)" in text
    assert "in 13 requests" in text
    cost = price_run(parse_run_report(report), read_price_table(), DEFAULT_TIER_PRICES)
    assert cost.saved_gets == 13 and cost.warm_hits == 7
    assert cost.cache_saved_usd == pytest.approx(13 * 0.0004 / 1000)


def test_a_cold_report_saved_nothing():
    cold = dict(REPORT, tiers={"s3": {"bytes": 10 << 27, "requests": 10},
                               "cache": {"bytes": 3 << 30, "requests": 60}})
    cold["cache"] = {"hits": 50, "hit_bytes": 50 << 27, "misses": 10,
                     "fill_bytes": 10 << 27, "warm_hits": 0, "warm_hit_bytes": 0}
    cost = price_run(parse_run_report(cold), read_price_table(), DEFAULT_TIER_PRICES,
                     egress=True)
    assert cost.cache_saved_usd == 0 and not cost.saved_estimated
    assert cost.cold_start_usd == cost.total_usd > 0


def test_a_report_without_warm_copies_keeps_the_estimate():
    usage = parse_run_report(REPORT)
    assert usage.warm_hits is None
    cost = price_run(usage, read_price_table(), DEFAULT_TIER_PRICES)
    assert cost.saved_estimated and cost.warm_hits is None
    assert cost.saved_gets == 60 and cost.saved_bytes == 60 << 27
    assert cost.cache_saved_usd == pytest.approx(60 * 0.0004 / 1000)


def test_ranks_with_and_without_warm_copies_merge_as_an_estimate():
    measured = parse_run_report(_warm(REPORT, 10, 10 << 27))
    merged = merge_run_usage([measured, measured])
    assert merged.warm_hits == 20 and not merged.warm_estimated
    mixed = merge_run_usage([measured, parse_run_report(REPORT)])
    assert mixed.warm_hits == 10 + 60 and mixed.warm_hit_bytes == (10 << 27) + (60 << 27)
    assert mixed.warm_estimated
    cost = price_run(mixed, read_price_table(), DEFAULT_TIER_PRICES)
    assert cost.saved_estimated


def _on_node(report: dict, node: str | None) -> dict:
    out = json.loads(json.dumps(report))
    out["cache"]["node"] = node
    return out


def test_ranks_that_share_a_node_cache_merge_as_an_upper_bound(tmp_path):
    # found by an audit: three ranks sharing one node's cache, each counting the warm
    # copies it read, claimed twice what the cold run had cost, as measured ("saved")
    rank = _warm(REPORT, 10, 10 << 27)
    shared = merge_run_usage([parse_run_report(_on_node(rank, "a1b2c3d4e5f60718"))] * 2)
    assert shared.warm_shared and shared.warm_estimated and shared.warm_hits == 20
    cost = price_run(shared, read_price_table(), DEFAULT_TIER_PRICES)
    assert cost.saved_estimated and cost.to_json()["cache"]["warm_shared"]
    apart = merge_run_usage([parse_run_report(_on_node(rank, "a1b2c3d4e5f60718")),
                             parse_run_report(_on_node(rank, "0f1e2d3c4b5a6978"))])
    assert not apart.warm_shared and not apart.warm_estimated  # two nodes: exact
    # a node cache that gave no warm copy shares none
    cold = json.loads(json.dumps(rank))
    cold["cache"].update(warm_hits=0, warm_hit_bytes=0)
    cold["manifest"].update(warm_hits=0, warm_hit_bytes=0)
    one = merge_run_usage([parse_run_report(_on_node(rank, "a1b2c3d4e5f60718")),
                           parse_run_report(_on_node(cold, "a1b2c3d4e5f60718"))])
    assert not one.warm_shared
    paths = []
    for i in range(2):
        paths.append(tmp_path / f"rank{i}.json")
        paths[-1].write_text(json.dumps(_on_node(rank, "a1b2c3d4e5f60718")))
    result = CliRunner().invoke(main, ["--store", "memory://unused", "cost", "--run",
                                       str(paths[0]), "--run", str(paths[1])])
    assert result.exit_code == 0, result.output
    assert "20 warm copies counted by the ranks" in result.output
    assert "saved at most" in result.output and "counted once per rank" in result.output
    assert "would cost at most" in result.output


def test_shared_ranks_merged_with_a_report_without_warm_copies_say_both(tmp_path):
    # found by a review: the shared-cache wording hid that an older report's hits were
    # priced as GETs
    rank = _on_node(_warm(REPORT, 10, 10 << 27), "a1b2c3d4e5f60718")
    old = _on_node(REPORT, "a1b2c3d4e5f60718")
    paths = []
    for i, report in enumerate((rank, rank, old)):
        paths.append(tmp_path / f"rank{i}.json")
        paths[-1].write_text(json.dumps(report))
    args = ["--store", "memory://unused", "cost"]
    for path in paths:
        args += ["--run", str(path)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "some reports do not count warm copies" in result.output
    assert "counted once per rank" in result.output and "saved at most" in result.output


@pytest.mark.parametrize("node", [3, "", ["x"]])
def test_a_cache_node_that_is_not_a_name_is_refused(node):
    with pytest.raises(FormatError, match=r"run report: cache.node must be a string or null"):
        parse_run_report(_on_node(_warm(REPORT, 1, 1), node))


def _cli_text(tmp_path, report: dict) -> str:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(report))
    result = CliRunner().invoke(main, ["--store", "memory://unused", "cost", "--run",
                                       str(path)])
    assert result.exit_code == 0, result.output
    return result.output


def test_the_cli_says_what_a_cold_cache_would_cost(tmp_path):
    cold = json.loads(json.dumps(REPORT))
    cold["cache"].update(warm_hits=0, warm_hit_bytes=0)
    text = _cli_text(tmp_path, cold)
    assert "saved nothing" in text and "would cost what it cost" in text
    warm = _cli_text(tmp_path, _warm(REPORT, 10, 10 << 27))
    assert "10 warm copies" in warm and "at most" not in warm
    assert "estimated" not in warm
    old = _cli_text(tmp_path, REPORT)
    assert "saved at most" in old and "(estimated)" in old
    assert "would cost at most" in old


def test_a_cold_tier_with_no_price_is_refused_naming_it(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(REPORT))
    for cold in ("nope", "memory"):  # unknown; known but priced at nothing
        result = CliRunner().invoke(main, ["--store", "memory://unused", "cost", "--run",
                                           str(path), "--cold", cold])
        assert result.exit_code == 2, result.output
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert len(lines) == 1 and f"cold tier {cold!r} has no price tier" in lines[0]
    mapped = CliRunner().invoke(main, ["--store", "memory://unused", "cost", "--run",
                                       str(path), "--cold", "nope", "--tier",
                                       "nope=s3-standard"])
    assert mapped.exit_code == 0, mapped.output


# -- against S3 ------------------------------------------------------------------------


@pytest.fixture
def s3_store(s3_bucket):
    store = S3Store(f"s3://{s3_bucket()}/data", storage_options=dict(FAST))
    Catalog.init(store)
    yield store
    store.close()


def _ingest(store, tmp_path) -> None:
    import numpy as np

    import simstore

    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(0)
    for t in range(12):
        u = rng.standard_normal((8, 16, 16)).astype(np.float32)
        np.savez(src / f"t{t:03d}.npz", u=u, p=np.float64(t))
    simstore.ingest([str(src)], dataset="cfd", store=Catalog.open(store), format="parquet",
                    snapshot=True, message="m", shard_size=20_000)


def _run(store, cache: str, path, max_bandwidth=None) -> dict:
    from simstore.loaders import SimDataLoader, SimDataset

    ds = SimDataset(store, "cfd", cache_dir=cache, cache_limit=1 << 30,
                    max_bandwidth=max_bandwidth)
    loader = SimDataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="fork")
    for epoch in range(2):
        loader.set_epoch(epoch)
        for _ in loader:
            pass
    report = json.loads(json.dumps(loader.report()))
    path.write_text(json.dumps(report))
    return report


@pytest.mark.s3
@pytest.mark.parametrize("max_bandwidth", [None, "256MiB"], ids=["unpaced", "paced"])
def test_a_warm_runs_cold_start_is_what_the_cold_run_cost(s3_store, tmp_path, max_bandwidth):
    # paced (found by an audit): a fill under max_bandwidth asks the size (a HEAD) and
    # GETs blocks, where the warm run's estimate priced one GET per copy
    _ingest(s3_store, tmp_path)
    cache = str(tmp_path / "cache")
    cold_path, warm_path = tmp_path / "cold.json", tmp_path / "warm.json"
    cold = _run(s3_store, cache, cold_path, max_bandwidth)
    warm = _run(s3_store, cache, warm_path, max_bandwidth)
    shards = cold["cache"]["misses"]
    assert shards >= 2 and warm["cache"]["misses"] == 0
    # the warm run looked each shard up once per worker that read it, per epoch...
    assert warm["cache"]["hits"] > shards
    # ...and read every copy the cold run fetched, each counted once
    assert warm["cache"]["warm_hits"] == shards
    assert warm["cache"]["warm_hit_bytes"] == cold["cache"]["fill_bytes"]
    assert cold["cache"]["warm_hits"] == 0 and cold["manifest"]["warm_hits"] == 0
    s3 = cold["tiers"]["s3"]
    assert warm["tiers"]["s3"] == {"bytes": 0, "requests": 0}
    prices = read_price_table()
    cold_cost = run_cost([str(cold_path)], prices, egress=True)
    warm_cost = run_cost([str(warm_path)], prices, egress=True)
    assert cold_cost.cache_saved_usd == 0 and not cold_cost.saved_estimated
    assert cold_cost.cold_start_usd == cold_cost.total_usd > 0
    # a cold cache would have sent the cold run's requests for the same bytes: one GET
    # per shard and manifest part, and a HEAD more per shard where paced
    paced = shards if max_bandwidth else 0
    assert warm["cache"]["warm_requests"] == shards + paced
    assert s3["requests"] == shards + paced + warm["manifest"]["warm_hits"]
    assert not warm_cost.saved_estimated
    assert (warm_cost.saved_gets, warm_cost.saved_bytes) == (s3["requests"], s3["bytes"])
    assert warm_cost.cold_start_usd == pytest.approx(cold_cost.total_usd)
