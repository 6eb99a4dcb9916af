"""Races between commits, crashes and gc, placed exactly between two storage calls."""

from __future__ import annotations

import os
import sys
import time

import pytest
import rel_harness as h

from simstore.catalog import Catalog, gc
from simstore.errors import ConflictError
from simstore.hashing import hash_bytes
from simstore.storage import LocalStore

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "catalog"))
from catalog_helpers import stage_samples  # noqa: E402


def _age_all_objects(root: str, seconds: float) -> None:
    """Make every stored object look ``seconds`` old (as if written long ago)."""
    past = time.time() - seconds
    for dirpath, _dirs, files in os.walk(os.path.join(root, "objects")):
        for name in files:
            os.utime(os.path.join(dirpath, name), (past, past))


@pytest.mark.parametrize("commit_at", ["refs/heads/", "/staging/"])
def test_gc_concurrent_with_a_commit_of_an_old_staged_entry(tmp_path, commit_at):
    """A staged entry older than the grace period is committed while gc reads the roots.

    At every instant its objects are reachable from the staging entry or from the branch,
    so gc must keep them whichever of its reads the commit falls between.
    """
    root = str(tmp_path / "store")
    cat = Catalog.init(root)
    stage_samples(cat, "ds", {"a": b"A" * 100})
    cat.commit("ds", message="base")
    entry = stage_samples(cat, "ds", {"b": b"B" * 100, "c": b"C" * 100})
    _age_all_objects(root, 7200)
    fired = []

    def before(method, key, n):
        if method == "list" and commit_at in key and not fired:
            fired.append(key)
            Catalog(LocalStore(root)).commit("ds", message="late", staging_ids=[entry.id])

    report = gc(Catalog(h.HookStore(LocalStore(root), before=before)), grace_s=3600)
    assert fired, "the commit never ran inside gc"
    cat = Catalog.open(root)
    assert h.store_problems(cat) == []
    assert set(h.content(cat, "ds")) == {"a", "b", "c"}
    # only the consumed change sets were garbage (shards of both snapshots are reachable)
    assert len(report.deleted) <= 2


def test_a_staged_entry_left_by_a_crash_is_never_applied_twice(tmp_path):
    """Crash after the ref moved, before the staging entry was removed; then another commit.

    The leftover entry was consumed by a snapshot that is no longer the head. Committing
    everything staged must recognise it rather than re-apply it over the newer write.
    """
    root = str(tmp_path / "store")
    cat = Catalog.init(root)
    stage_samples(cat, "ds", {"base": b"0"})
    cat.commit("ds", message="base")
    first = stage_samples(cat, "ds", {"shared": b"first"})
    key = f"datasets/ds/staging/{first.id}"
    leftover = cat.store.get(key)
    first_sid = cat.commit("ds", message="first", staging_ids=[first.id]).snapshot_id
    cat.store.put(key, leftover)  # as if killed between the swap and the clean-up
    second = stage_samples(cat, "ds", {"shared": b"second"})
    cat.commit("ds", message="second", staging_ids=[second.id])

    result = Catalog.open(root).commit("ds", message="everything staged")

    cat = Catalog.open(root)
    assert h.content(cat, "ds")["shared"] == hash_bytes(b"s" + b"second")
    assert [s.message for _, s in cat.log("ds")] == ["second", "first", "base"]
    assert result.snapshot_id == first_sid  # it names the commit that consumed the entry
    assert cat.staged("ds") == []  # the leftover is cleaned up


def test_a_lost_swap_response_with_a_commit_on_top_is_recognised(tmp_path):
    """The swap lands but its response is lost, and another writer commits on top at once.

    S3 answers the retried conditional PUT with 412, which the store raises as a conflict.
    The writer must find its own snapshot in the branch's history, not commit again.
    """
    root = str(tmp_path / "store")
    cat = Catalog.init(root)
    stage_samples(cat, "ds", {"base": b"0"})
    cat.commit("ds", message="base")
    mine = stage_samples(cat, "ds", {"shared": b"mine", "m": b"m"})
    fired = []

    def after(method, key, n):
        if method == "compare_and_swap" and key.endswith("refs/heads/main") and not fired:
            fired.append(key)
            other = Catalog(LocalStore(root))
            theirs = stage_samples(other, "ds", {"shared": b"theirs"})
            other.commit("ds", message="theirs", staging_ids=[theirs.id])
            raise ConflictError("response lost; the retried request saw 412")

    writer = Catalog(h.HookStore(LocalStore(root), after=after))
    result = writer.commit("ds", message="mine", staging_ids=[mine.id])

    cat = Catalog.open(root)
    log = [(sid, s.message) for sid, s in cat.log("ds")]
    assert [m for _, m in log] == ["theirs", "mine", "base"]
    assert result.snapshot_id == log[1][0]
    assert h.content(cat, "ds")["shared"] == hash_bytes(b"s" + b"theirs")
    assert cat.staged("ds") == []
