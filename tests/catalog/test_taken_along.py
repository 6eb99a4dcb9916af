"""A change committed on its own (``ingest --snapshot``, ``delete --snapshot``) takes the
earlier staged entries that touch its keys: the next commit then gives what committing
everything at once in staging order gives.

A ``delete --snapshot`` once committed its deletion alone, so an upsert of the key staged
before it applied at the next snapshot and brought the sample back; a replace with
``--snapshot`` left an earlier entry on other keys staged, to apply over the replace.
"""

from __future__ import annotations

import uuid

import hypothesis.strategies as st
import pytest
from catalog_helpers import content, stage_samples
from hypothesis import given, settings

from simstore.catalog import Catalog, taken_along
from simstore.errors import ConflictError

KEYS = [f"k{i}" for i in range(6)]


def test_taken_along_follows_keys_through_entries_and_takes_all_before_a_replace():
    pending = {"1": frozenset({"a"}), "2": frozenset({"b", "c"}), "3": frozenset({"c"}),
               "4": frozenset({"d"})}
    assert taken_along(pending, {"c"}) == ["2", "3"]  # 2 through c
    assert taken_along(pending, {"x"}) == []
    assert taken_along(pending, None) == ["1", "2", "3", "4"]  # a replace takes all
    # an entry before one taken that changes a key only that one changes
    assert taken_along({"1": frozenset({"b"}), "2": frozenset({"a", "b"})}, {"a"}) == ["1", "2"]
    # a staged replace changes every key, and so takes every entry before it
    chain = {"1": frozenset({"z"}), "2": None, "3": frozenset({"y"})}
    assert taken_along(chain, {"a"}) == ["1", "2"]
    assert taken_along(chain, set()) == []


def _entry():
    upserts = st.dictionaries(st.sampled_from(KEYS), st.binary(min_size=1, max_size=4),
                              max_size=3)
    deletes = st.sets(st.sampled_from(KEYS), max_size=2)
    return st.tuples(st.sampled_from(["upsert", "upsert", "replace"]), upserts, deletes)


def _stage(cat: Catalog, change: tuple) -> str:
    mode, upserts, deletes = change
    deletes = () if mode == "replace" else sorted(set(deletes) - set(upserts))
    return stage_samples(cat, "ds", upserts, mode=mode, deleted=deletes).id


def _keys(change: tuple) -> set[str] | None:
    mode, upserts, deletes = change
    return None if mode == "replace" else set(upserts) | set(deletes)


@settings(max_examples=60, deadline=None)
@given(staged=st.lists(_entry(), max_size=4), last=_entry())
def test_a_change_committed_alone_then_the_rest_equals_all_at_once(staged, last):
    base = {k: b"base" for k in KEYS[:4]}
    stores = []
    for _ in range(2):
        cat = Catalog.init(f"memory://taken-{uuid.uuid4().hex}")
        first = stage_samples(cat, "ds", base)
        cat.commit("ds", message="base", staging_ids=[first.id])
        for change in staged:
            _stage(cat, change)
        stores.append(cat)
    alone, together = stores
    pending = alone.staged_keys("ds")
    mine = _stage(alone, last)
    alone.commit("ds", message="alone", staging_ids=[*taken_along(pending, _keys(last)), mine])
    middle = content(alone, "ds@main")
    alone.commit("ds", message="the rest", allow_empty=True)
    _stage(together, last)
    together.commit("ds", message="all")
    assert content(alone, "ds@main") == content(together, "ds@main")
    # and the change's own keys were final at its own commit already
    own = set(KEYS) if last[0] == "replace" else _keys(last)
    assert {k: v for k, v in middle.items() if k in own} == \
        {k: v for k, v in content(together, "ds@main").items() if k in own}


def test_an_entry_discarded_while_a_commit_builds_is_not_published(cat, monkeypatch):
    """unstage said it discarded an entry (exit 0) while a commit already under way then
    published it: the commit reads its entries once, and nothing looked again before its
    swap. It now checks they are still staged first."""
    import simstore.catalog._commit as commit_module

    stage_samples(cat, "ds", {"a": b"1"})
    base = cat.commit("ds", message="base")
    entry = stage_samples(cat, "ds", {"secret": b"do-not-publish"})
    real = commit_module.build_snapshot

    def build_then_unstage(*args, **kwargs):
        built = real(*args, **kwargs)
        cat.discard_staged("ds", [entry.id])  # another process's unstage, meanwhile
        return built

    monkeypatch.setattr(commit_module, "build_snapshot", build_then_unstage)
    with pytest.raises(ConflictError, match=f"staged entry {entry.id} was discarded"):
        cat.commit("ds", message="snap")
    assert cat.resolve("ds") == base.snapshot_id
    assert set(content(cat, "ds")) == {"a"}
