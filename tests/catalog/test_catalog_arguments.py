"""Catalog, refs, gc and log refuse arguments that would do something else than asked,
with an InvalidInputError naming them (not a raw exception, not silent acceptance)."""

import math

import numpy as np
import pytest
from catalog_helpers import stage_samples

from simstore.catalog import Catalog, gc, reachable_objects, verify
from simstore.errors import InvalidInputError, NotFoundError
from simstore.names import parse_ref
from simstore.storage import open_store


@pytest.fixture
def two(tmp_path):
    """Datasets 'a' and 'b', one snapshot each; returns (catalog, a's id, b's id)."""
    cat = Catalog.init(str(tmp_path / "store"))
    ids = []
    for name in ("a", "b"):
        stage_samples(cat, name, {"k": name.encode() * 50})
        ids.append(cat.commit(name, message=name).snapshot_id)
    return cat, ids[0], ids[1]


def test_refs_name_only_snapshots_of_their_dataset(two):
    cat, a, b = two
    shard = next(o for o in sorted(reachable_objects(cat, [a])) if o != a)
    # a branch at a shard made every later gc fail ("not valid JSON")
    with pytest.raises(InvalidInputError, match=f"object {shard} is not a snapshot"):
        cat.branches("a").create("x", shard)
    with pytest.raises(InvalidInputError, match=f"snapshot {b} belongs to dataset 'b'"):
        cat.tags("a").create("t", b)
    with pytest.raises(InvalidInputError, match="'nope' is not a snapshot id"):
        cat.branches("a").create("x", "nope")
    with pytest.raises(NotFoundError, match="no snapshot"):
        cat.tags("a").create("t", "0" * 32)
    assert not cat.branches("a").exists("x") and not cat.tags("a").exists("t")
    gc(cat, grace_s=0)
    cat.tags("a").create("t", a)  # the right thing still works


@pytest.mark.parametrize("grace", [-3600, float("nan"), float("inf"), "1h", True])
def test_gc_grace_must_be_a_non_negative_number(two, grace):
    cat, *_ = two  # a negative grace put the cutoff in the future: fresh writes deleted
    with pytest.raises(InvalidInputError, match="grace_s must be a non-negative number"):
        gc(cat, grace_s=grace)


def test_commit_and_log_arguments_are_checked(two):
    cat, a, _ = two
    stage_samples(cat, "a", {"k2": b"x" * 50})
    for kw, message in [({"message": None}, "commit message must be a string"),
                        ({"message": "m", "author": ["x"]}, "author must be a string"),
                        ({"message": "m", "staging_ids": "abc"}, "not the string 'abc'"),
                        ({"message": "m", "max_attempts": 0}, "max_attempts must be a positive"),
                        ]:
        with pytest.raises(InvalidInputError, match=message):
            cat.commit("a", **kw)
    assert len(cat.staged("a")) == 1  # nothing committed
    for limit in (-1, math.nan, "2"):
        with pytest.raises(InvalidInputError, match="limit must be a non-negative integer"):
            list(cat.log("a", limit=limit))
    assert [sid for sid, _ in cat.log("a", limit=1)] == [a]
    for ref in (None, 123):
        with pytest.raises(InvalidInputError, match="a REF is a string"):
            cat.resolve(ref)
    with pytest.raises(InvalidInputError, match="is not a snapshot id"):
        cat.snapshot(None)


def test_commit_refuses_a_blank_message_or_author(two):
    cat, a, _ = two
    stage_samples(cat, "a", {"k2": b"x" * 50})
    # a blank message or author made a snapshot that log showed as ": "
    for kw, message in [({"message": ""}, "invalid commit message '': a snapshot needs"),
                        ({"message": "  "}, "invalid commit message '  '"),
                        ({"message": "m", "author": ""}, "invalid author '': empty")]:
        with pytest.raises(InvalidInputError, match=message):
            cat.commit("a", **kw)
    assert len(cat.staged("a")) == 1 and cat.resolve("a") == a


@pytest.mark.parametrize(("kwargs", "match"), [
    # a truthy string ran the deep check or walked the history
    ({"deep": "no"}, "invalid deep 'no': must be True or False"),
    ({"history": "no"}, "invalid history 'no'"),
    ({"samples": 1}, "invalid samples 1"),
    ({"split": "0/2"}, "a verify split is a pair"),
    ({"split": (True, 2)}, "a verify split is K/N"),
    ({"split": (0, 2.0)}, "a verify split is K/N"),
    ({"progress": 3}, "invalid progress 3"),
])
def test_verify_refuses_flags_that_are_not_flags(two, kwargs, match):
    cat, *_ = two
    with pytest.raises(InvalidInputError, match=match):
        verify(cat, "a", **kwargs)


def test_verify_and_gc_take_a_catalog(two, tmp_path):
    cat, *_ = two
    for call in (gc, verify):
        # a path was an AttributeError ("'str' object has no attribute 'store'")
        with pytest.raises(InvalidInputError, match=r"takes a Catalog first, got '.*store'"):
            call(str(tmp_path / "store"))
    for now in ("x", float("nan"), True):
        with pytest.raises(InvalidInputError, match="invalid now"):
            gc(cat, now=now)
    with pytest.raises(InvalidInputError, match="invalid dry_run 'yes'"):
        gc(cat, dry_run="yes")
    assert verify(cat, "a", split=(np.int64(0), np.int64(2))).split == (0, 2)
    # NumPy's bools and integers are bools and integers, as the loader takes them
    assert gc(cat, dry_run=np.True_).to_json()["dry_run"] is True
    assert Catalog(cat.store, target_rows=np.int64(64)).target_rows == 64


def test_catalog_and_parse_ref_arguments(two):
    cat, *_ = two
    for rows in (0, 1.5, True):
        with pytest.raises(InvalidInputError, match="invalid target_rows"):
            Catalog(cat.store, target_rows=rows)
    for store in (None, "path", b"path"):
        with pytest.raises(InvalidInputError, match="invalid store"):
            Catalog(store)
        with pytest.raises(InvalidInputError, match="invalid store"):
            open_store(store) if store != "path" else open_store(123)
    with pytest.raises(InvalidInputError, match="invalid ref 123"):
        parse_ref(123)
    with pytest.raises(InvalidInputError, match="invalid read_only 'no'"):
        open_store(str(cat.store.url), read_only="no")
