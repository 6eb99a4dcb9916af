"""Catalog, refs, gc and log refuse arguments that would do something else than asked,
with an InvalidInputError naming them (not a raw exception, not silent acceptance)."""

import math

import pytest
from catalog_helpers import stage_samples

from simstore.catalog import Catalog, gc, reachable_objects
from simstore.errors import InvalidInputError, NotFoundError


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
