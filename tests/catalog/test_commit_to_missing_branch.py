"""Only a dataset's first commit creates its branch: a commit to a branch a dataset lacks
(a mistyped ``--branch``) is refused, and the staged changes stay staged for the right one."""

import os

import numpy as np
import pytest
from catalog_helpers import content, stage_samples
from click.testing import CliRunner
from simstore.cli import main

from simstore.catalog import Catalog
from simstore.errors import NotFoundError


def test_a_commit_to_a_branch_the_dataset_lacks_is_refused(cat):
    stage_samples(cat, "ds", {"a": b"1"})
    first = cat.commit("ds", message="first")  # the first commit creates main
    entry = stage_samples(cat, "ds", {"b": b"2"})
    with pytest.raises(NotFoundError) as err:
        cat.commit("ds", message="typo", branch="mian")
    msg = str(err.value)
    assert "\n" not in msg
    assert "has no branch 'mian' (branches: main)" in msg
    assert "simstore branch ds@main mian" in msg  # says how to make one
    assert [b for b, _ in cat.branches("ds").list()] == ["main"]
    assert cat.resolve("ds") == first.snapshot_id
    assert [e.id for e in cat.staged("ds")] == [entry.id]  # still there for main
    cat.commit("ds", message="right branch")
    assert set(content(cat, "ds")) == {"a", "b"}


def test_a_branch_made_at_a_snapshot_takes_commits(cat):
    stage_samples(cat, "ds", {"a": b"1"})
    first = cat.commit("ds", message="first", branch="trunk")  # any name for the first
    cat.branches("ds").create("dev", first.snapshot_id)
    stage_samples(cat, "ds", {"b": b"2"})
    cat.commit("ds", message="dev work", branch="dev")
    assert set(content(cat, "ds@dev")) == {"a", "b"}
    assert set(content(cat, "ds@trunk")) == {"a"}


def test_ingest_with_snapshot_to_a_missing_branch_fails_before_reading(tmp_path):
    store = str(tmp_path / "store")
    src = tmp_path / "src"
    src.mkdir()
    np.savez(src / "run0.npz", u=np.arange(6, dtype=np.float32))
    runner = CliRunner()
    ok = runner.invoke(main, ["--store", store, "init"])
    assert ok.exit_code == 0, ok.output
    ok = runner.invoke(main, ["--store", store, "ingest", str(src), "--dataset", "ds",
                              "--snapshot", "-m", "first"])
    assert ok.exit_code == 0, ok.output
    before = sorted(os.path.relpath(os.path.join(d, f), store)
                    for d, _, files in os.walk(store) for f in files)
    np.savez(src / "run1.npz", u=np.arange(6, dtype=np.float32) + 1)
    bad = runner.invoke(main, ["--store", store, "ingest", str(src), "--dataset", "ds",
                               "--branch", "mian", "--snapshot", "-m", "typo"])
    assert bad.exit_code == 3, bad.output
    lines = [line for line in bad.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "has no branch 'mian'" in lines[0]
    after = sorted(os.path.relpath(os.path.join(d, f), store)
                   for d, _, files in os.walk(store) for f in files)
    assert after == before  # nothing read, nothing written
    assert Catalog.open(store).staged("ds") == []


def test_a_dataset_whose_branches_were_all_deleted_takes_no_commit_to_a_new_name(cat, tmp_path):
    # its history is kept by a tag: a commit to any name would start a second, parentless
    # one beside it; the branch is made at a snapshot first
    stage_samples(cat, "ds", {"a": b"1"})
    base = cat.commit("ds", message="base").snapshot_id
    cat.tags("ds").create("v1", base)
    cat.branches("ds").delete("main")
    entry = stage_samples(cat, "ds", {"b": b"2"})
    with pytest.raises(NotFoundError) as err:
        cat.commit("ds", message="typo", branch="mian")
    msg = str(err.value)
    assert "\n" not in msg
    assert "has no branches, only tags (v1)" in msg
    assert "simstore branch ds@v1 mian" in msg
    assert cat.branches("ds").names() == []
    assert [e.id for e in cat.staged("ds")] == [entry.id]
    # the CLI says the same in one line, exit 3, and an ingest staged for it is refused too
    out = CliRunner().invoke(main, ["--store", cat.store.root, "snapshot", "ds", "-m", "x",
                                    "--branch", "mian"])
    assert out.exit_code == 3, out.output
    assert "has no branches, only tags (v1)" in out.output
    src = tmp_path / "src"
    src.mkdir()
    np.savez(src / "run0.npz", u=np.arange(6, dtype=np.float32))
    out = CliRunner().invoke(main, ["--store", cat.store.root, "ingest", str(src),
                                    "--dataset", "ds", "--branch", "mian"])
    assert out.exit_code == 3, out.output
    assert [e.id for e in cat.staged("ds")] == [entry.id]
    # made at the tag's snapshot, the branch takes the commit on top of the history
    cat.branches("ds").create("mian", base)
    done = cat.commit("ds", message="now", branch="mian")
    assert done.parent == base
    assert set(content(cat, "ds@mian")) == {"a", "b"}


def test_a_branch_deleted_while_a_commit_runs_is_not_created_again(cat, monkeypatch):
    stage_samples(cat, "ds", {"a": b"1"})
    base = cat.commit("ds", message="base").snapshot_id
    cat.branches("ds").create("dev", base)
    entry = stage_samples(cat, "ds", {"b": b"2"})
    real = cat.store.compare_and_swap
    deleted = []

    def swap(key, expected, data):
        # another process deletes the branch after this commit read its head
        if key.endswith("refs/heads/dev") and not deleted:
            Catalog.open(cat.store.root).branches("ds").delete("dev")
            deleted.append(key)
        return real(key, expected, data)

    monkeypatch.setattr(cat.store, "compare_and_swap", swap)
    with pytest.raises(NotFoundError) as err:
        cat.commit("ds", message="to dev", branch="dev")
    assert deleted
    assert "branch 'dev' was deleted while this commit ran" in str(err.value)
    assert cat.branches("ds").names() == ["main"]  # not created again, with no history
    assert [e.id for e in cat.staged("ds")] == [entry.id]


def test_a_branch_deleted_before_the_commit_first_reads_it_is_not_created_again(
    cat, monkeypatch
):
    # deleted between the commit's check that the branch exists and its first read of
    # the branch (while it reads the change sets): that read saw no head, and the commit
    # took itself for the dataset's first, creating the branch with no history under it
    stage_samples(cat, "ds", {"a": b"1"})
    base = cat.commit("ds", message="base").snapshot_id
    cat.branches("ds").create("dev", base)
    entry = stage_samples(cat, "ds", {"b": b"2"})
    real = Catalog._read_changes

    def read_changes(self, staged):
        Catalog.open(cat.store.root).branches("ds").delete("dev")  # another process
        return real(self, staged)

    monkeypatch.setattr(Catalog, "_read_changes", read_changes)
    with pytest.raises(NotFoundError) as err:
        cat.commit("ds", message="to dev", branch="dev")
    assert "branch 'dev' was deleted while this commit ran" in str(err.value)
    assert cat.branches("ds").names() == ["main"]
    assert [e.id for e in cat.staged("ds")] == [entry.id]


def test_entries_another_writer_committed_and_removed_are_this_commit_done(cat):
    # writer A stages; writer B commits every pending entry (A's too) and removes them;
    # A's commit of its own entry then finds it gone: done by B, not an error
    stage_samples(cat, "ds", {"a": b"1"})
    cat.commit("ds", message="base")
    mine = stage_samples(cat, "ds", {"b": b"2"})
    theirs = stage_samples(cat, "ds", {"b": b"3", "c": b"4"})
    by_b = cat.commit("ds", message="B", staging_ids=[mine.id, theirs.id])
    assert cat.staged("ds") == []
    done = cat.commit("ds", message="A", staging_ids=[mine.id])
    assert done.snapshot_id == by_b.snapshot_id and done.staged == (mine.id,)
    assert cat.resolve("ds") == by_b.snapshot_id  # no second snapshot
    # an id no snapshot consumed stays an error
    with pytest.raises(NotFoundError) as err:
        cat.commit("ds", message="A", staging_ids=["0" * 20 + "-" + "a" * 12])
    assert "has no staged entries" in str(err.value)
    with pytest.raises(NotFoundError):
        cat.commit("ds", message="A", staging_ids=["not-a-staging-id"])
