"""`simstore unstage`: list a dataset's staged entries, discard some or all.

Found by an audit of the docs: operations.md told users to remove a dataset's staged
entries, and no command did (an ingest without --snapshot made by mistake stayed staged,
to be committed by the next `snapshot`).
"""

from __future__ import annotations

import json

import numpy as np
from cli_helpers import cli

from simstore.catalog import Catalog, gc, verify


def _staged_twice(tmp_path):
    store = str(tmp_path / "st")
    cli("--store", store, "init", code=0)
    for name, values in (("s1", [0]), ("s2", [1, 2])):
        src = tmp_path / name
        src.mkdir()
        for v in values:
            np.savez(src / f"a{v}.npz", x=np.full(4, v, np.float64))
        cli("--store", store, "ingest", str(src), "--dataset", "d", code=0)
    return store


def test_unstage_lists_then_discards_what_it_is_named(tmp_path):
    store = _staged_twice(tmp_path)
    listed = json.loads(cli("--store", store, "unstage", "d", "--json", code=0))
    assert listed["discarded"] == [] and [e["rows"] for e in listed["staged"]] == [1, 2]
    first, second = (e["id"] for e in listed["staged"])
    # the part after the '-' names an entry too (ids staged together share their digits)
    out = json.loads(cli("--store", store, "unstage", "d", second.partition("-")[2][:6],
                         "--json", code=0))
    assert [e["id"] for e in out["discarded"]] == [second]
    assert [e["id"] for e in out["staged"]] == [first]
    assert [e.id for e in Catalog.open(store).staged("d")] == [first]
    # what is left commits alone: the discarded entry's samples are not in the snapshot
    cli("--store", store, "snapshot", "d", "-m", "first only", code=0)
    assert cli("--store", store, "keys", "d", code=0).split() == ["a0"]
    gc(Catalog.open(store), grace_s=0)  # the discarded entry's objects go
    assert verify(Catalog.open(store), all_refs=True, deep=True).ok


def test_unstage_all_and_its_errors(tmp_path):
    store = _staged_twice(tmp_path)
    ids = [e["id"] for e in json.loads(cli("--store", store, "unstage", "d", "--json",
                                           code=0))["staged"]]
    assert "ambiguous" in cli("--store", store, "unstage", "d", ids[0][:8], code=2)
    assert "6 or more" in cli("--store", store, "unstage", "d", "abc", code=2)
    assert "no staged entry 'ffffffffff'" in cli("--store", store, "unstage", "d",
                                                 "ffffffffff", code=3)
    assert "not both" in cli("--store", store, "unstage", "d", ids[0], "--all", code=2)
    assert "no dataset 'nope'" in cli("--store", store, "unstage", "nope", code=3)
    assert len(Catalog.open(store).staged("d")) == 2  # no error discarded anything
    out = cli("--store", store, "unstage", "d", "--all", code=0)
    assert out.splitlines() == [f"discarded {i}" for i in ids]
    assert Catalog.open(store).staged("d") == []
    # nothing else was d's (no branch, no tag): d is gone with its entries
    assert "no dataset 'd'" in cli("--store", store, "unstage", "d", code=3)


def test_unstage_of_a_dataset_with_a_branch_and_nothing_staged(tmp_path):
    store = _staged_twice(tmp_path)
    cli("--store", store, "snapshot", "d", "-m", "both", code=0)
    assert cli("--store", store, "unstage", "d", code=0).strip() == "nothing staged for d"


def test_an_entry_a_snapshot_commits_while_it_is_discarded_is_said_to_be(tmp_path,
                                                                        monkeypatch):
    # found by a review: a snapshot landing between unstage's listing and its delete
    # published the entry while unstage said it discarded it, exit 0
    import simstore.catalog._catalog as catalog_module

    store = _staged_twice(tmp_path)
    ids = [e["id"] for e in json.loads(cli("--store", store, "unstage", "d", "--json",
                                           code=0))["staged"]]
    real = catalog_module.Catalog.discard_staged
    raced: list[str] = []
    busy: list[bool] = []

    def after_a_snapshot(self, dataset, entry_ids):
        if not busy:  # the commit removes its entries through this too
            busy.append(True)
            raced.append(Catalog.open(store).commit("d", message="concurrent").snapshot_id)
        return real(self, dataset, entry_ids)

    monkeypatch.setattr(catalog_module.Catalog, "discard_staged", after_a_snapshot)
    out = cli("--store", store, "unstage", "d", ids[0], code=5)
    assert f"staged entry {ids[0]} was committed by snapshot {raced[0]} on main" in out
    assert sorted(cli("--store", store, "keys", "d", code=0).split()) == ["a0", "a1", "a2"]
