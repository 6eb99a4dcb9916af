"""Writers whose clocks disagree: what applies last, what a commit takes along and what it
finds already consumed follow the order the writers saw, not their clocks.

Each test runs two writers on one store in this process; a writer's clock is moved by
shifting ``time.time`` and ``time.time_ns`` (every time the catalog records comes from
them) while it writes.
"""

from __future__ import annotations

import contextlib
import time
import uuid

import pytest
from catalog_helpers import content, expected_hash, stage_samples

from simstore.catalog import Catalog
from simstore.catalog._commit import consumed_in_history


@contextlib.contextmanager
def clock(monkeypatch: pytest.MonkeyPatch, skew_s: float):
    """This process's clock ``skew_s`` seconds off while the block runs."""
    real, real_ns = time.time, time.time_ns
    with monkeypatch.context() as m:
        m.setattr(time, "time", lambda: real() + skew_s)
        m.setattr(time, "time_ns", lambda: real_ns() + int(skew_s * 1e9))
        yield


def _store() -> Catalog:
    cat = Catalog.init(f"memory://clocks-{uuid.uuid4().hex}")
    first = stage_samples(cat, "ds", {"k": b"base", "other": b"o"})
    cat.commit("ds", message="base", staging_ids=[first.id])
    return cat


@pytest.mark.parametrize("skew_s", [0.0, 5.0, 3600.0])
def test_the_entry_staged_later_applies_last_whatever_the_stagers_clocks(
        monkeypatch, skew_s):
    cat = _store()
    with clock(monkeypatch, skew_s):  # writer A, ahead
        ahead = stage_samples(cat, "ds", {"k": b"A"})
    later = stage_samples(cat, "ds", {"k": b"B"})  # writer B, later, its clock right
    assert [e.id for e in cat.staged("ds")] == [ahead.id, later.id]
    assert later.created > ahead.created
    cat.commit("ds", message="all")
    assert content(cat, "ds@main")["k"] == expected_hash(b"B")


@pytest.mark.parametrize("skew_s", [0.0, 3600.0])
def test_a_change_committed_alone_takes_an_entry_a_clock_ahead_staged_before_it(
        monkeypatch, skew_s):
    cat = _store()
    with clock(monkeypatch, skew_s):
        stage_samples(cat, "ds", {"k": b"A"})
    later = stage_samples(cat, "ds", {"k": b"B"})
    taken = cat.taken_with("ds", later.id, {"k"})
    assert len(taken) == 2
    cat.commit("ds", message="B alone", staging_ids=taken)
    assert cat.staged("ds") == []
    cat.commit("ds", message="the rest", allow_empty=True)
    assert content(cat, "ds@main")["k"] == expected_hash(b"B")


@pytest.mark.parametrize("skew_s", [0.0, 30.0, 120.0, 7200.0])
def test_an_entry_left_staged_after_its_commit_is_found_consumed_under_a_clock_behind(
        monkeypatch, skew_s):
    # writer A, ahead, commits k=A and dies before removing its staging entry; writer B,
    # its clock right, commits k=B on top; the next commit must find A's entry consumed
    # (walking back past B's snapshot) and not apply it over B's write
    cat = _store()
    with clock(monkeypatch, skew_s):
        entry = stage_samples(cat, "ds", {"k": b"A"})
        data = cat.store.get(f"datasets/ds/staging/{entry.id}")
        cat.commit("ds", message="A", staging_ids=[entry.id])
    cat.store.put(f"datasets/ds/staging/{entry.id}", data)  # the crash's leftover
    mine = stage_samples(cat, "ds", {"k": b"B"})
    cat.commit("ds", message="B", staging_ids=[mine.id])
    b_head = cat.resolve("ds@main")
    assert consumed_in_history(cat, b_head, [entry])
    cat.commit("ds", message="the rest", allow_empty=True)
    assert content(cat, "ds@main")["k"] == expected_hash(b"B")
    assert cat.staged("ds") == []
    b_snap = cat.snapshot(b_head)
    assert ("after" in b_snap.lineage) == (skew_s > 1.0)


def test_times_along_a_branch_never_go_backwards(monkeypatch):
    cat = _store()
    with clock(monkeypatch, 600.0):
        cat.commit("ds", message="ahead", allow_empty=True)
    ahead = cat.snapshot(cat.resolve("ds@main"))
    cat.commit("ds", message="right", allow_empty=True)
    right = cat.snapshot(cat.resolve("ds@main"))
    assert right.created < ahead.created  # each records its own clock
    assert right.lineage["after"] >= ahead.created  # and that it came after its parent


def test_entries_staged_within_one_tick_of_the_clock_still_order_by_id_and_time(monkeypatch):
    cat = _store()
    now = 1_796_515_573_816_395_637  # a time whose microseconds a float rounds
    monkeypatch.setattr(time, "time_ns", lambda: now)
    first = stage_samples(cat, "ds", {"k": b"A"})
    second = stage_samples(cat, "ds", {"k": b"B"})
    assert first.id < second.id
    assert first.created < second.created
