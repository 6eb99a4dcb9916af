"""The cost, prices, du and pull commands through click's CliRunner on the memory store."""

from __future__ import annotations

import json
import uuid

import pytest
from click.testing import CliRunner
from cost_helpers import commit
from simstore.cli import main
from simstore.cli._cost import parse_size

from simstore.catalog import Catalog


@pytest.fixture
def store_url():
    url = f"memory://cli-cost-{uuid.uuid4().hex}"
    Catalog.init(url)
    return url


def run(store_url, *args, code=0):
    result = CliRunner().invoke(main, ["--store", store_url, *args], catch_exceptions=False)
    assert result.exit_code == code, result.output
    return result


def test_cost_json_and_text(store_url):
    cat = Catalog.open(store_url)
    s1 = commit(cat, "ds", {"a": b"a" * 1000, "b": b"b" * 2000})
    s2 = commit(cat, "ds", {"b": b"B" * 3000})
    out = json.loads(run(store_url, "cost", "ds", "--json").output)
    assert [s["id"] for s in out["snapshots"]] == [s2, s1]
    newest = out["snapshots"][0]
    assert newest["shared_bytes"] == 1000
    assert newest["new_bytes"] + newest["shared_bytes"] == newest["reached_bytes"]
    assert newest["samples"] == 2 and newest["logical_bytes"] == 4000
    assert set(newest["usd_per_month"]) == {
        "s3-standard", "s3-standard-ia", "s3-glacier-ir", "gcs-standard", "local-nvme"
    }  # fmt: skip
    assert out["dataset_total"]["dedup_ratio"] >= 1.0
    assert out["store_total"]["bytes"] >= out["dataset_total"]["bytes"]
    assert out["store_tier"] == "memory" and out["prices"]["s3-standard"]["as_of"] == "2024-06"
    text = run(store_url, "cost", "ds").output
    assert s2[:12] in text and "dedup" in text and "check them" in text
    last = json.loads(run(store_url, "cost", "ds", "--last", "1", "--json").output)
    assert [s["id"] for s in last["snapshots"]] == [s2] and last["truncated"]


def test_cost_price_overrides(store_url, tmp_path):
    commit(Catalog.open(store_url), "ds", {"a": b"a" * 1000})
    base = json.loads(run(store_url, "cost", "ds", "--json").output)
    doubled = json.loads(
        run(
            store_url, "cost", "ds", "--json", "--price", "s3-standard.storage_per_gib_month=0.046"
        ).output
    )
    key = ("dataset_total", "usd_per_month", "s3-standard")
    b = base[key[0]][key[1]][key[2]]
    assert doubled[key[0]][key[1]][key[2]] == pytest.approx(2 * b)
    f = tmp_path / "p.toml"
    f.write_text("[tiers.s3-standard]\nstorage_per_gib_month = 0\n")
    free = json.loads(run(store_url, "cost", "ds", "--json", "--prices", str(f)).output)
    assert free[key[0]][key[1]][key[2]] == 0


def test_cost_of_a_run(tmp_path):
    report = {
        "format_version": 1,
        "kind": "simstore-loader-report",
        "epochs": [0, 1],
        "seconds": 3600.0,
        "tiers": {
            "s3": {"bytes": 2**30, "requests": 10_000},
            "cache": {"bytes": 2**31, "requests": 5},
        },
        "cache": {"hits": 30_000, "misses": 10_000, "fill_bytes": 2**30},
    }
    path = tmp_path / "run.json"
    path.write_text(json.dumps(report))
    out = json.loads(run("memory://unused", "cost", "--run", str(path), "--json").output)
    assert out["total_usd"] == pytest.approx(0.004)  # 10,000 GETs at 0.0004 per 1,000
    assert out["per_epoch_usd"] == pytest.approx(0.002)
    assert out["per_hour_usd"] == pytest.approx(0.004)
    assert out["cache"]["saved_usd"] == pytest.approx(0.012)  # 30,000 GETs not sent
    assert out["cache"]["hit_bytes_estimated"] and out["cache"]["cold_tier"] == "s3"
    egress = json.loads(
        run("memory://unused", "cost", "--run", str(path), "--egress", "--json").output
    )
    assert egress["total_usd"] == pytest.approx(0.004 + 0.09)
    ia = json.loads(
        run(
            "memory://unused", "cost", "--run", str(path), "--tier", "s3=s3-standard-ia", "--json"
        ).output
    )
    assert ia["total_usd"] == pytest.approx(0.01 + 0.01)  # GETs at 0.001/1k, 1 GiB at 0.01
    text = run("memory://unused", "cost", "--run", str(path)).output
    assert "per epoch" in text and "saved" in text and "(estimated)" in text


def test_cost_argument_errors(store_url, tmp_path):
    assert "either a dataset" in run(store_url, "cost", code=2).output
    path = tmp_path / "r.json"
    path.write_text("{}")
    assert "either" in run(store_url, "cost", "ds", "--run", str(path), code=2).output
    assert "--run" in run(store_url, "cost", "ds", "--egress", code=2).output
    assert (
        "price override"
        in run(store_url, "cost", "--run", str(path), "--price", "x", code=2).output
    )
    assert "no branch or tag" in run(store_url, "cost", "nope", code=3).output
    bad = tmp_path / "bad.toml"
    bad.write_text("[tiers.x]\ncolour = 1\n")
    assert (
        "unknown fields"
        in run(store_url, "cost", "--run", str(path), "--prices", str(bad), code=7).output
    )


def test_prices_command():
    out = json.loads(run("memory://unused", "prices", "--json").output)
    assert out["tiers"]["s3-standard"]["storage_per_gib_month"] == 0.023
    assert out["tiers"]["local-nvme"]["assumption"]
    text = run("memory://unused", "prices", "--price", "gcs-standard.egress_per_gib=0.5").output
    assert "0.500" in text and "list prices as of 2024-06" in text


def test_du_and_pull(store_url, tmp_path):
    pytest.importorskip("simstore.loaders._cache")
    cat = Catalog.open(store_url)
    sid = commit(cat, "ds", {"a": b"a" * 1000, "b": b"b" * 2000})
    d = tmp_path / "hot"
    before = json.loads(run(store_url, "du", "ds", "--cache", str(d), "--json").output)
    assert not d.exists()  # du does not create the cache
    store_tier, hot = before["tiers"]
    assert store_tier["tier"] == "memory" and store_tier["objects"] == before["objects"]
    assert hot["objects"] == 0 and hot["missing_bytes"] == before["bytes"]
    small = run(store_url, "pull", "ds", "--cache", str(d), "--limit", "1K", code=2)
    assert f"needs {before['bytes']} bytes" in small.output
    pulled = json.loads(run(store_url, "pull", "ds", "--cache", str(d), "--json").output)
    assert pulled["snapshot"] == sid and pulled["fetched"] == before["objects"]
    after = json.loads(run(store_url, "du", "ds", "--cache", str(d), "--json").output)
    assert after["tiers"][1]["objects"] == after["objects"]
    assert after["tiers"][1]["bytes"] == after["bytes"]
    text = run(store_url, "pull", "ds", "--cache", str(d), "--fields", "u").output
    assert f"{before['objects']} already cached" in text
    assert f"reads ds@{sid} with this cache_dir" in text  # the REF that needs no request
    assert (
        "no field 'zz'"
        in run(store_url, "pull", "ds", "--cache", str(d), "--fields", "zz", code=2).output
    )
    whole = json.loads(run(store_url, "du", "--cache", str(d), "--json").output)
    assert whole["snapshot"] is None and whole["tiers"][1]["bytes"] >= 3000


@pytest.mark.parametrize(
    ("text", "size"),
    [("1000", 1000), ("1K", 1024), ("2MiB", 2 << 20), ("2MB", 2_000_000), ("1.5G", 3 << 29)],
)
def test_parse_size(text, size):
    assert parse_size(text) == size


def test_parse_size_refuses_nonsense():
    from simstore.errors import InvalidInputError

    with pytest.raises(InvalidInputError):
        parse_size("lots")
