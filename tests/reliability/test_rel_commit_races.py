"""Races between commits, crashes and gc, placed exactly between two storage calls."""

from __future__ import annotations

import os
import sys
import time

import pytest
import rel_harness as h

from simstore.catalog import Catalog, gc
from simstore.errors import ConflictError, NotFoundError
from simstore.hashing import hash_bytes, object_key
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


def _deleted_branch(tmp_path, *, age_head: bool):
    """main at {a}; branch exp with two more commits ({a,b}, then {a,b,c}), deleted.

    Every object is aged past the grace period, but for ``age_head=False`` the head
    commit's objects, written after the ageing. Returns (root, exp head id)."""
    root = str(tmp_path / "store")
    cat = Catalog.init(root)
    stage_samples(cat, "ds", {"a": b"A" * 100})
    cat.commit("ds", message="base")
    cat.branches("ds").create("exp", cat.resolve("ds"))
    stage_samples(cat, "ds", {"b": b"B" * 100})
    cat.commit("ds", message="b", branch="exp")
    if not age_head:
        _age_all_objects(root, 7200)
    stage_samples(cat, "ds", {"c": b"C" * 100})
    exp = cat.commit("ds", message="c", branch="exp").snapshot_id
    if age_head:
        _age_all_objects(root, 7200)
    cat.branches("ds").delete("exp")
    return root, exp


def test_a_recent_snapshot_no_ref_names_keeps_everything_it_reaches(tmp_path):
    """A branch deleted by mistake, its head younger than the grace period: gc kept the
    head but deleted the older snapshot and shard it reaches; the branch re-created
    there failed verify, and every later gc failed on the missing parent."""
    root, exp = _deleted_branch(tmp_path, age_head=False)
    gc(Catalog.open(root), grace_s=3600)
    cat = Catalog.open(root)
    cat.branches("ds").create("exp", exp)
    assert h.store_problems(cat) == []
    assert set(h.content(cat, "ds@exp")) == {"a", "b", "c"}
    gc(cat, grace_s=3600)
    assert h.store_problems(Catalog.open(root)) == []


@pytest.mark.parametrize("at", ["list refs", "info", "get", "delete", "list refs again"])
def test_a_branch_created_at_an_old_snapshot_while_gc_runs(tmp_path, at):
    """`simstore branch ds@<id> exp` on a snapshot no ref names, at each step of a gc
    that would delete it. Either the branch is created and everything it reaches stays,
    or the create fails naming the snapshot and leaves no ref; the store stays clean."""
    root, exp = _deleted_branch(tmp_path, age_head=True)
    fired: list[object] = []
    ref_lists: list[str] = []

    def before(method, key, n):
        if fired:
            return
        if method == "list" and "/refs/heads/" in key:
            ref_lists.append(key)
        hit = {"list refs": len(ref_lists) == 1,
               "info": method == "info" and exp in key,
               "get": method == "get" and exp in key,
               "delete": method == "delete",
               "list refs again": len(ref_lists) == 2}[at]
        if hit:
            try:
                Catalog(LocalStore(root)).branches("ds").create("exp", exp)
                fired.append("created")
            except NotFoundError as exc:
                assert exp in str(exc)
                fired.append("refused")

    gc(Catalog(h.HookStore(LocalStore(root), before=before)), grace_s=3600)
    assert fired, "the branch was never created inside gc"
    cat = Catalog.open(root)
    assert h.store_problems(cat) == []
    if fired == ["created"]:
        assert set(h.content(cat, "ds@exp")) == {"a", "b", "c"}
    else:
        assert not cat.branches("ds").exists("exp")
    gc(cat, grace_s=3600)
    assert h.store_problems(Catalog.open(root)) == []


def test_refs_deleted_while_they_are_listed_are_skipped(tmp_path):
    """A tag deleted between the listing of tags and the read of it made gc and ls fail
    ("no object datasets/ds/refs/tags/t")."""
    root = str(tmp_path / "store")
    cat = Catalog.init(root)
    stage_samples(cat, "ds", {"a": b"A" * 100})
    cat.commit("ds", message="base")
    for name in ("t0", "t1"):
        cat.tags("ds").create(name, cat.resolve("ds"))

    def before(method, key, n):
        if method == "get" and key.endswith("/refs/tags/t0"):
            LocalStore(root).delete(key)

    hooked = Catalog(h.HookStore(LocalStore(root), before=before))
    assert [name for name, _ in hooked.tags("ds").list()] == ["t1"]
    gc(hooked, grace_s=0)
    assert h.store_problems(Catalog.open(root)) == []


def test_a_ref_whose_snapshot_goes_while_it_is_written_is_taken_back(tmp_path):
    """gc deleted the snapshot after the create refreshed it but before the ref landed:
    the create removes its ref and fails naming the snapshot (no ref to a missing one)."""
    root, exp = _deleted_branch(tmp_path, age_head=True)

    def after(method, key, n):
        if method == "compare_and_swap" and key.endswith("/refs/heads/exp"):
            LocalStore(root).delete(object_key(exp))

    cat = Catalog(h.HookStore(LocalStore(root), after=after))
    with pytest.raises(NotFoundError, match=f"snapshot {exp} was deleted by a garbage"):
        cat.branches("ds").create("exp", exp)
    assert not Catalog.open(root).branches("ds").exists("exp")
    with pytest.raises(NotFoundError, match=f"no snapshot {exp}"):
        Catalog.open(root).tags("ds").create("t", exp)
