"""``simstore verify --history`` and ``--all``: exit codes, text and JSON output."""

from __future__ import annotations

import json
import os
import sys
import uuid

import pytest
from cli_helpers import cli
from click.testing import CliRunner
from simstore.cli import main

from simstore.catalog import Catalog
from simstore.hashing import hash_bytes, object_key


def _stage(cat, dataset, items):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "catalog"))
    from catalog_helpers import stage_samples

    return stage_samples(cat, dataset, items)


def _failed(*args):
    """verify's exit code 6: the report on stdout (it is output, not one error line)."""
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 6, (result.stdout, result.stderr)
    return result.stdout


@pytest.fixture
def store():
    """Dataset ``ds``: s1 {a, b}, s2 with ``a`` replaced; dataset ``other``: o1."""
    url = f"memory://verify-history-{uuid.uuid4().hex}"
    cat = Catalog.init(url)
    _stage(cat, "ds", {"a": b"old a" * 30, "b": b"shared b" * 30})
    s1 = cat.commit("ds", message="first").snapshot_id
    _stage(cat, "ds", {"a": b"new a" * 30})
    s2 = cat.commit("ds", message="second").snapshot_id
    _stage(cat, "other", {"x": b"x" * 30})
    o1 = cat.commit("other", message="o1").snapshot_id
    return url, cat, s1, s2, o1


def test_history_names_the_missing_shard_and_the_ancestor(store):
    url, cat, s1, s2, _ = store
    gone = hash_bytes(b"old a" * 30)
    cat.store.delete(object_key(gone))

    assert cli("--store", url, "verify", "ds", code=0).startswith(f"ok: snapshot {s2}, ")
    out = json.loads(_failed("--store", url, "verify", "ds", "--history", "--json"))
    assert out["history"] is True and out["all"] is False and out["ok"] is False
    assert out["snapshot"] == s2 and out["snapshots"] == [s2, s1]
    (p,) = out["problem_objects"]
    assert (p["object"], p["kind"], p["problem"], p["snapshots"]) == (gone, "shard", "missing", [s1])
    assert out["problems"] == [p["message"]]

    text = _failed("--store", url, "verify", "ds", "--history")
    assert text.startswith(f"FAILED: snapshot {s2} and its history, 2 snapshots")
    assert object_key(gone) in text and s1 in text.splitlines()[1]


def test_deep_history_reports_a_damaged_shared_shard_once(store):
    url, cat, s1, s2, _ = store
    shared = hash_bytes(b"shared b" * 30)
    cat.store.put(object_key(shared), b"tampered")
    assert json.loads(cli("--store", url, "verify", "ds", "--history", "--json", code=0))["ok"]
    out = json.loads(_failed("--store", url, "verify", "ds", "--deep", "--history", "--json"))
    (p,) = out["problem_objects"]
    assert (p["object"], p["problem"], p["snapshots"]) == (shared, "damaged", [s2, s1])
    assert len(out["problems"]) == 1 and out["bytes_hashed"] > 0


def test_all_covers_both_datasets(store):
    url, cat, s1, s2, o1 = store
    out = json.loads(cli("--store", url, "verify", "--all", "--deep", "--json", code=0))
    assert out["all"] is True and out["snapshot"] is None
    assert sorted(out["snapshots"]) == sorted([s1, s2, o1])
    assert cli("--store", url, "verify", "--all", code=0).startswith(
        "ok: every branch and tag, 3 snapshots, "
    )
    cat.store.delete(object_key(hash_bytes(b"x" * 30)))
    text = _failed("--store", url, "verify", "--all")
    assert text.startswith("FAILED: every branch and tag, 3 snapshots")
    assert f"referenced by snapshot {o1}" in text


def test_missing_parent_is_reported_not_a_crash(store):
    url, cat, s1, s2, _ = store
    cat.store.delete(object_key(s1))
    cli("--store", url, "verify", "ds", code=0)
    for args in (("ds", "--history"), ("--all",)):
        out = json.loads(_failed("--store", url, "verify", *args, "--json"))
        (p,) = out["problem_objects"]
        assert (p["object"], p["kind"], p["problem"], p["snapshots"]) == (
            s1, "snapshot", "missing", [s2]
        )
        assert f"no snapshot {s1}" in p["message"] and f"parent of snapshot {s2}" in p["message"]


def test_ref_with_all_or_neither_is_a_usage_error(store):
    url = store[0]
    line = cli("--store", url, "verify", "ds", "--all", code=2)
    assert "--all" in line and "ds" in line and "not both" in line
    line = cli("--store", url, "verify", code=2)
    assert "REF" in line and "--all" in line
