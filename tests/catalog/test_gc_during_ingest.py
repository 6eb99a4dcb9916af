"""A gc with a grace shorter than an ingest no longer makes a snapshot of missing shards.

Until a staging entry names them, the shards an ingest stored are held by their age alone;
a ``gc --grace 0s`` that ran meanwhile deleted them and the ingest committed a snapshot
that named them, exit 0 (found by an audit: 6 of 6 rounds). A deleting gc now records
that it runs in ``gc.json``; an ingest that sees a gc ran since it started refreshes what
it stored before staging, and fails naming what is gone.
"""

import json

import numpy as np
import pytest

import simstore.ingest._driver as driver
import simstore.ingest._stage as staging
from simstore.catalog import GC_STATE_KEY, Catalog, gc, gc_overlapped, read_gc_state, verify
from simstore.errors import ConflictError
from simstore.ingest import ingest


def _sources(tmp_path, n=3):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(n):
        np.savez(src / f"run{i}.npz", u=np.full((64, 64), i, np.float32))
    return src


def test_gc_records_its_runs_and_a_dry_run_records_nothing(tmp_path):
    cat = Catalog.init(str(tmp_path / "store"))
    assert read_gc_state(cat.store) is None
    gc(cat, grace_s=0, dry_run=True)
    assert read_gc_state(cat.store) is None  # a dry run deletes nothing
    seen = []
    real_put = cat.store.put

    def put(key, data):
        if key == GC_STATE_KEY:
            seen.append(json.loads(data)["state"])
        return real_put(key, data)

    cat.store.put = put
    gc(cat, grace_s=0)
    assert seen == ["running", "done"]
    done = read_gc_state(cat.store)
    assert not gc_overlapped(done, done)  # a finished gc before and after: none between
    assert gc_overlapped(None, done) and gc_overlapped(done, b"other")
    running = json.dumps({"state": "running"}).encode()
    assert gc_overlapped(running, running)  # it may still be deleting, or have died
    assert gc_overlapped(b"not json", b"not json")
    assert not gc_overlapped(None, None)


def test_a_gc_during_an_ingest_fails_it_instead_of_committing_missing_shards(
    tmp_path, monkeypatch
):
    src = _sources(tmp_path)
    cat = Catalog.init(str(tmp_path / "store"))
    real_finish = driver._finish

    def finish_after_a_gc(catalog, *args, **kwargs):
        # shards stored, nothing staged yet: a gc with no grace deletes them now
        report = gc(Catalog(catalog.store), grace_s=0)
        assert report.deleted  # the run's shards went
        return real_finish(catalog, *args, **kwargs)

    monkeypatch.setattr(driver, "_finish", finish_after_a_gc)
    _fails_naming_the_deleted_object_then_ingests(
        src, cat, lambda: monkeypatch.setattr(driver, "_finish", real_finish))


def _fails_naming_the_deleted_object_then_ingests(src, cat, without_gc):
    """The ingest fails in one line, staging and committing nothing; once ``without_gc``
    has taken the gc out, it runs again and the store verifies."""
    with pytest.raises(ConflictError) as err:
        ingest([src], dataset="d", store=cat, snapshot=True, resume=False)
    msg = str(err.value)
    assert "\n" not in msg and "objects/" in msg and "deleted by a gc" in msg
    assert cat.staged("d") == [] and not cat.has_dataset("d")  # nothing staged or committed
    without_gc()
    r = ingest([src], dataset="d", store=cat, snapshot=True, resume=False)
    assert r.samples == 3 and verify(cat, all_refs=True).ok


def test_an_ingest_checks_nothing_when_no_gc_ran_meanwhile(tmp_path, monkeypatch):
    src = _sources(tmp_path)
    cat = Catalog.init(str(tmp_path / "store"))
    gc(cat, grace_s=3600)  # finished before the ingest: no check needed

    def must_not_run(*args, **kwargs):
        raise AssertionError("objects checked though no gc ran during the ingest")

    monkeypatch.setattr(staging, "check_still_stored", must_not_run)
    r = ingest([src], dataset="d", store=cat, snapshot=True)
    assert r.samples == 3


def test_a_gc_that_starts_while_the_entry_is_staged_fails_the_ingest(tmp_path, monkeypatch):
    # The gap the check before staging leaves: a gc that writes its record after that
    # reading, and reads the staging entries before this one is written (an audit: 40
    # `gc --grace 0s` beside 16 ingests committed a snapshot of a deleted shard, exit 0).
    src = _sources(tmp_path)
    cat = Catalog.init(str(tmp_path / "store"))
    real_stage = Catalog.stage
    ran = []

    def stage_after_a_gc(self, *args, **kwargs):
        if not ran:
            ran.append(gc(Catalog(self.store), grace_s=0))
            assert ran[0].deleted  # the run's shards went before its entry was written
        return real_stage(self, *args, **kwargs)

    monkeypatch.setattr(Catalog, "stage", stage_after_a_gc)
    _fails_naming_the_deleted_object_then_ingests(
        src, cat, lambda: monkeypatch.setattr(Catalog, "stage", real_stage))


def test_an_entry_staged_beside_a_gc_that_leaves_its_objects_is_committed(tmp_path, monkeypatch):
    # the same gc with a long grace keeps the run's objects: the check finds them all
    src = _sources(tmp_path)
    cat = Catalog.init(str(tmp_path / "store"))
    real_stage = Catalog.stage
    checked, staged = [], []
    real_check = staging.check_still_stored

    def stage_after_a_gc(self, *args, **kwargs):
        gc(Catalog(self.store), grace_s=3600)
        staged.append(real_stage(self, *args, **kwargs))
        return staged[-1]

    def check(catalog, ids):
        checked.append(sorted(ids))
        return real_check(catalog, ids)

    monkeypatch.setattr(Catalog, "stage", stage_after_a_gc)
    monkeypatch.setattr(staging, "check_still_stored", check)
    r = ingest([src], dataset="d", store=cat, snapshot=True, resume=False)
    assert r.samples == 3 and verify(cat, all_refs=True).ok
    # checked once, after staging (no gc had run before it): all the entry names
    assert checked == [sorted(staged[0].referenced_objects())]
