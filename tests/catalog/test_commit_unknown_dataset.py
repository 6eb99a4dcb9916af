"""A commit never creates a dataset: an unknown name is a NotFoundError naming it, and the
store is left as it was (no branch, no snapshot object)."""

import pytest
from catalog_helpers import content, stage_samples

from simstore.errors import NotFoundError


def _keys(cat):
    return sorted(cat.store.list(""))


def test_commit_to_an_unknown_dataset_is_refused_and_writes_nothing(cat):
    stage_samples(cat, "cfd", {"a": b"1"})
    cat.commit("cfd", message="first")
    before = _keys(cat)
    for kw in ({}, {"staging_ids": []}, {"branch": "dev"}):
        with pytest.raises(NotFoundError) as err:
            cat.commit("cdf", message="typo", **kw)
        msg = str(err.value)
        assert "\n" not in msg
        assert msg.startswith("unknown dataset 'cdf': nothing staged")
        assert "--dataset cdf" in msg  # says how to create one
    assert _keys(cat) == before
    assert cat.datasets() == ["cfd"]
    with pytest.raises(NotFoundError, match="unknown dataset 'cdf'"):
        cat.resolve("cdf")


def test_staging_creates_the_dataset_and_an_existing_one_still_commits(cat):
    # the first staged change (what an ingest does) is what creates a dataset
    stage_samples(cat, "new", {"a": b"1"})
    first = cat.commit("new", message="first")
    assert content(cat, "new") == content(cat, f"new@{first.snapshot_id}")
    # an existing dataset with nothing staged may still commit (an empty commit), as before
    again = cat.commit("new", message="nothing new")
    assert again.parent == first.snapshot_id
    assert again.samples == 1
