import json
import uuid

import pytest
from click.testing import CliRunner
from simstore.cli import main

from simstore.catalog import Catalog
from simstore.storage import open_store


@pytest.fixture
def store_url():
    return f"memory://cli-{uuid.uuid4().hex}"


def run(store_url, *args, ok=True):
    result = CliRunner().invoke(main, ["--store", store_url, *args], catch_exceptions=False)
    if ok:
        assert result.exit_code == 0, result.output
    return result


def _stage(store_url, items, dataset="ds"):
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "catalog"))
    from catalog_helpers import stage_samples

    return stage_samples(Catalog.open(store_url), dataset, items)


def test_full_workflow(store_url):
    assert run(store_url, "init").output.startswith("initialised ")
    assert run(store_url, "init").output.startswith("already initialised ")  # idempotent
    _stage(store_url, {"a": b"1", "b": b"2"})
    out = json.loads(run(store_url, "snapshot", "ds", "-m", "first", "--json").output)
    first = out["snapshot"]
    _stage(store_url, {"b": b"changed", "c": b"3"})
    run(store_url, "snapshot", "ds", "-m", "second")
    log = json.loads(run(store_url, "log", "ds", "--json").output)
    assert [e["message"] for e in log] == ["second", "first"]
    show = json.loads(run(store_url, "show", "ds", "--json").output)
    assert show["samples"] == 3 and show["parents"] == [first]
    assert set(show) >= {"id", "parents", "message", "created", "samples", "bytes", "content_hash"}
    diff = json.loads(run(store_url, "diff", f"ds@{first[:10]}", "ds", "--json").output)
    assert diff["added"] == ["c"] and diff["modified"] == ["b"] and diff["removed"] == []
    assert diff["summary"]["added"] == 1
    run(store_url, "tag", "ds", "v1")
    run(store_url, "branch", f"ds@{first}", "dev")
    assert json.loads(run(store_url, "show", "ds@dev", "--json").output)["id"] == first
    ls = json.loads(run(store_url, "ls", "--json").output)
    assert ls[0]["dataset"] == "ds" and "v1" in ls[0]["tags"]
    out = run(store_url, "delete", "ds", "a", "--snapshot", "-m", "drop a").output
    assert "2 samples" in out
    assert json.loads(run(store_url, "verify", "ds", "--deep", "--json").output)["ok"]
    gcout = json.loads(run(store_url, "gc", "--grace", "0s", "--json").output)
    assert gcout["deleted"] >= 1  # consumed change sets
    assert json.loads(run(store_url, "verify", "ds@v1", "--deep", "--json").output)["ok"]


@pytest.mark.parametrize(
    "args, code, words",
    [
        (["log", "nope"], 3, "unknown dataset 'nope'"),
        (["show", "ds@v404"], 3, "no branch, tag or snapshot 'v404'"),
        (["log", "../x"], 2, "invalid dataset name"),
        (["tag", "ds", "bad/tag"], 2, "invalid tag name"),
        (["branch", "ds", "x" * 201], 2, "201 characters"),
        (["gc", "--grace", "soon"], 2, "invalid duration"),
        (["delete", "ds", "missing-key"], 2, "no sample 'missing-key'"),
        (["snapshot", "nods", "-m", "x"], 3, "unknown dataset 'nods'"),
    ],
)
def test_errors_are_one_line_with_exit_codes(store_url, args, code, words):
    run(store_url, "init")
    _stage(store_url, {"a": b"1"})
    run(store_url, "snapshot", "ds", "-m", "m")
    before = sorted(open_store(store_url).list(""))
    result = run(store_url, *args, ok=False)
    assert result.exit_code == code, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and words in lines[0]
    assert sorted(open_store(store_url).list("")) == before  # nothing written


def test_uninitialised_store(store_url):
    result = run(store_url, "ls", ok=False)
    assert result.exit_code == 3 and "simstore init" in result.output


def test_tag_exists_is_an_error(store_url):
    run(store_url, "init")
    _stage(store_url, {"a": b"1"})
    run(store_url, "snapshot", "ds", "-m", "m")
    run(store_url, "tag", "ds", "v1")
    run(store_url, "tag", "ds", "v1")  # where it already points: done, exit 0
    _stage(store_url, {"b": b"2"})
    run(store_url, "snapshot", "ds", "-m", "m2")
    result = run(store_url, "tag", "ds", "v1", ok=False)
    assert result.exit_code == 4 and "already exists" in result.output


def test_verify_failure_exits_nonzero(store_url):
    run(store_url, "init")
    _stage(store_url, {"a": b"payload" * 10})
    run(store_url, "snapshot", "ds", "-m", "m")
    cat = Catalog.open(store_url)
    snap = cat.snapshot(cat.resolve("ds"))
    shard = next(cat.iter_parts(snap)).column("shard")[0].as_py()
    from simstore.hashing import object_key

    cat.store.put(object_key(shard), b"tampered")
    result = run(store_url, "verify", "ds", "--deep", ok=False)
    assert result.exit_code != 0
    assert shard in result.output and "expected" in result.output


def test_store_from_environment(store_url, monkeypatch):
    monkeypatch.setenv("SIMSTORE_STORE", store_url)
    result = CliRunner().invoke(main, ["init"])
    assert result.exit_code == 0 and store_url.split("://")[1] in result.output


def test_json_output_is_strict_json_whatever_the_numbers(capsys):
    from simstore.cli._common import emit

    emit(True, {"mean": [float("nan"), 1.5], "max": float("inf"), "min": -float("inf")}, "")
    text = capsys.readouterr().out

    def refuse(name):
        raise ValueError(f"non-standard JSON number {name}")

    assert json.loads(text, parse_constant=refuse) == {
        "mean": ["NaN", 1.5], "max": "Infinity", "min": "-Infinity"}


def test_ls_counts_samples_on_every_branch_and_needs_no_main(store_url):
    run(store_url, "init")
    _stage(store_url, {"a": b"1", "b": b"2"})
    run(store_url, "snapshot", "ds", "-m", "first", "--branch", "dev")  # a first snapshot
    listed = json.loads(run(store_url, "ls", "--json").output)
    assert listed[0]["branch_samples"] == {"dev": 2} and listed[0]["samples"] is None
    line = run(store_url, "ls").output.strip()
    assert line.startswith("ds  branches: dev=") and "(2 samples)" in line


def test_snapshot_with_nothing_staged_needs_allow_empty(store_url):
    run(store_url, "init")
    _stage(store_url, {"a": b"1"})
    first = json.loads(run(store_url, "snapshot", "ds", "-m", "first", "--json").output)
    refused = run(store_url, "snapshot", "ds", "-m", "again", ok=False)
    assert refused.exit_code == 2 and "nothing staged to commit" in refused.output
    assert Catalog.open(store_url).resolve("ds") == first["snapshot"]
    empty = json.loads(run(store_url, "snapshot", "ds", "-m", "again", "--allow-empty",
                           "--json").output)
    assert empty["parent"] == first["snapshot"] and empty["samples"] == 1


def test_branch_delete_removes_only_that_branch_and_a_missing_one_is_exit_3(store_url):
    run(store_url, "init")
    _stage(store_url, {"a": b"1"})
    sid = json.loads(run(store_url, "snapshot", "ds", "-m", "m", "--json").output)["snapshot"]
    run(store_url, "branch", "ds", "dev")
    run(store_url, "tag", "ds", "v1")
    out = run(store_url, "branch", "ds", "dev", "--delete").output
    assert "deleted branch ds@dev" in out
    cat = Catalog.open(store_url)
    assert [n for n, _ in cat.branches("ds").list()] == ["main"]
    assert cat.resolve("ds@v1") == sid  # the tag and main untouched
    result = run(store_url, "branch", "ds", "dev", "--delete", ok=False)
    assert result.exit_code == 3 and "dev" in result.output
    run(store_url, "branch", f"ds@{sid}", "dev")  # created again at its head
    assert cat.resolve("ds@dev") == sid
