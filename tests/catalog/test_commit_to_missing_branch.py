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
