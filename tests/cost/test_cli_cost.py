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
    assert "2 epochs, 3600 s," in text
    # a short run is not shown as "0 s" (cost.md: 0 s is a run of unknown length)
    path.write_text(json.dumps({**report, "seconds": 0.338}))
    assert "2 epochs, 0.338 s," in run("memory://unused", "cost", "--run", str(path)).output


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
    import simstore.loaders._cache  # noqa: F401
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


def test_pull_says_when_pinned_copies_left_no_room_for_all_of_it(store_url, tmp_path):
    # a job reading the cache pins copies; the pull evicted its own first copies for its
    # last ones and still said a job "asks nothing of the store"
    from simstore.loaders._cache import CacheConfig, ShardCache
    from simstore.loaders._stats import Counters

    from simstore.hashing import hash_bytes

    cat = Catalog.open(store_url)
    sid = commit(cat, "ds", {k: k.encode() * 1000 for k in "abcdefgh"})
    d = tmp_path / "hot"
    job = ShardCache(CacheConfig(directory=str(d), limit_bytes=10**9), Counters())
    blobs = [bytes([i]) * 3000 for i in range(4)]
    pins = [job.acquire(hash_bytes(b), lambda b=b: len(b), lambda out, b=b: out.write(b))
            for b in blobs]
    try:
        need = json.loads(run(store_url, "du", "ds", "--json").output)["bytes"]
        result = run(store_url, "pull", "ds", "--cache", str(d), "--limit", str(need + 4000),
                     "--json")
        pulled = json.loads(result.output)
        assert pulled["fetched"] == pulled["objects"]
        assert pulled["present"] < pulled["objects"]
        after = json.loads(run(store_url, "du", "ds", "--cache", str(d), "--json").output)
        assert after["tiers"][1]["objects"] == pulled["present"]
    finally:
        for pin in pins:
            pin.release()
    text = run(store_url, "pull", "ds", "--cache", str(d), "--limit", str(need)).output
    assert "asks nothing of the store" in text and f"ds@{sid}" in text
    assert "only" not in text


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


def _one_line_error(result, *words):
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    for word in words:
        assert word in lines[0], lines[0]


def _report(**changes):
    report = {
        "format_version": 1, "kind": "simstore-loader-report", "epochs": [0, 1],
        "seconds": 60.0, "tiers": {"s3": {"bytes": 2**30, "requests": 1000}},
        "cache": {"hits": 0, "misses": 10, "fill_bytes": 2**30},
    }
    report.update(changes)
    return report


def test_bad_run_reports_price_files_and_tier_maps_are_one_line_errors(tmp_path):
    # found by an audit: deep nesting was a RecursionError traceback; a mistyped --tier
    # priced nothing and passed; a text field took any type; a run of 1e-320 s cost $inf
    # an hour; a list of anything counted as epochs
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    _one_line_error(run("memory://unused", "cost", "--run", str(deep), code=7),
                    "deep.json", "nested too deeply")
    deep_toml = tmp_path / "deep.toml"
    deep_toml.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    _one_line_error(run("memory://unused", "prices", "--prices", str(deep_toml), code=7),
                    "deep.toml")
    good = tmp_path / "run.json"
    good.write_text(json.dumps(_report()))
    for flag, words in (("S3=s3-standard-ia", ("--tier S3", "no tier 'S3'", "s3")),
                        ("s3=s3-standrd", ("--tier s3=s3-standrd", "no price tier")),
                        ("gs=bogus", ("no price tier 'bogus'",))):
        _one_line_error(run("memory://unused", "cost", "--run", str(good), "--tier", flag,
                            code=2), *words)
    run("memory://unused", "cost", "--run", str(good), "--tier", "gs=gcs-standard")  # known
    for field, value in (("source", 5), ("description", ["a"])):
        p = tmp_path / f"{field}.toml"
        p.write_text(f"[tiers.s3-standard]\n{field} = {json.dumps(value)}\n")
        _one_line_error(run("memory://unused", "prices", "--prices", str(p), code=7),
                        f"{field} must be text")
    dated = tmp_path / "dated.toml"
    dated.write_text("[tiers.s3-standard]\nas_of = 2024-01-01\n")
    out = json.loads(run("memory://unused", "prices", "--prices", str(dated), "--json").output)
    assert "2024-01-01" in json.dumps(out)
    for name, report, words in (
        ("tiny.json", _report(seconds=1e-320), ("seconds", "at least 0.001")),
        ("epochs.json", _report(epochs=["a", "b"]), ("epochs[0]",)),
    ):
        path = tmp_path / name
        path.write_text(json.dumps(report))
        _one_line_error(run("memory://unused", "cost", "--run", str(path), "--json", code=7),
                        name, *words)


def test_du_with_a_cache_folder_writes_nothing_and_counts_alike(store_url, tmp_path):
    import os

    commit(Catalog.open(store_url), "ds", {"a": b"x" * 100, "b": b"y" * 50})
    empty = tmp_path / "empty"
    empty.mkdir()
    absent = tmp_path / "absent"
    outs = []
    for folder in (empty, absent):
        outs.append(json.loads(run(store_url, "du", "--cache", str(folder), "--json").output))
        with_ref = json.loads(
            run(store_url, "du", "ds", "--cache", str(folder), "--json").output)
        cache = [t for t in with_ref["tiers"] if t["tier"] == "cache"][0]
        assert cache["objects"] == 0 and cache["missing_objects"] == with_ref["objects"]
    assert os.listdir(empty) == [] and not absent.exists()  # a report writes nothing
    for out in outs:  # without REF nothing is asked of the cache: nothing missing
        cache = [t for t in out["tiers"] if t["tier"] == "cache"][0]
        assert (cache["objects"], cache["missing_objects"]) == (0, 0)
    afile = tmp_path / "afile"
    afile.write_text("x")
    _one_line_error(run(store_url, "du", "--cache", str(afile / "sub"), code=2), "afile")


def _run_report(tmp_path, name, **fields):
    body = {"kind": "simstore-loader-report", "format_version": 1, "epochs": [0],
            "seconds": 10, "tiers": {"s3": {"bytes": 1000, "requests": 2000}}, **fields}
    path = tmp_path / name
    path.write_text(json.dumps(body))
    return str(path)


@pytest.mark.parametrize("as_json", [False, True])
def test_inputs_that_overflow_together_are_refused_not_printed_as_inf(tmp_path, as_json):
    """Each input was finite, so each passed its check; their product was not: text
    printed "$inf" with exit 0, --json failed (exit 1) naming no input."""
    flag = ["--json"] if as_json else []
    tiny = _run_report(tmp_path, "tiny.json", epochs_read=5e-324)
    out = run("memory://unused", "cost", "--run", tiny, *flag, code=2).output
    assert "per_epoch_usd is not a finite number" in out and "epochs_read" in out
    assert "$inf" not in out
    dear = _run_report(tmp_path, "dear.json")
    out = run("memory://unused", "cost", "--run", dear, "--price",
              "s3-standard.get_per_1000=1e308", *flag, code=2).output
    assert "is not a finite number" in out and "$inf" not in out


def test_warm_hits_are_the_copies_reports_counted_not_an_older_reports_estimate(tmp_path):
    base = {"tiers": {"s3": {"bytes": 0, "requests": 0}, "cache": {"bytes": 100, "requests": 7}}}
    new = _run_report(tmp_path, "new.json", **base, cache={
        "hits": 7, "hit_bytes": 700, "misses": 0, "fill_bytes": 0, "warm_hits": 2,
        "warm_hit_bytes": 200})
    old = _run_report(tmp_path, "old.json", **base, cache={
        "hits": 7, "hit_bytes": 700, "misses": 0, "fill_bytes": 0})
    cache = json.loads(run("memory://unused", "cost", "--run", new, "--run", old,
                           "--json").output)["cache"]
    assert cache["warm_hits"] == 2  # was 9: the older report's 7 hits added in
    assert cache["saved_gets"] == 9 and cache["saved_estimated"]
    alone = json.loads(run("memory://unused", "cost", "--run", old, "--json").output)["cache"]
    assert alone["warm_hits"] is None and alone["saved_gets"] == 7


def test_du_writes_nothing_into_a_cache_and_reads_only_its_own_marker(store_url, tmp_path):
    commit(Catalog.open(store_url), "ds", {"a": b"1"})
    cache = tmp_path / "c"
    cache.mkdir()
    marker = cache / "simstore-cache.json"
    marker.write_text(json.dumps({"kind": "simstore-shard-cache", "format_version": 1}))
    run(store_url, "du", "ds", "--cache", str(cache), "--json")
    assert sorted(p.name for p in cache.iterdir()) == ["simstore-cache.json"]  # made no folder
    marker.write_text(json.dumps({"kind": "simstore-shard-cache", "format_version": 99}))
    out = run(store_url, "du", "ds", "--cache", str(cache), code=7).output
    assert "format_version 99" in out or "99" in out
    out = run(store_url, "pull", "ds", "--cache", str(cache), code=7).output
    assert "99" in out and not (cache / "objects").exists()
    marker.write_text("not json")
    out = run(store_url, "du", "ds", "--cache", str(cache), code=7).output
    assert "is not a simstore shard cache's marker" in out
