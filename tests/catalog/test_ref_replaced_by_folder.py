"""A folder where a branch or tag belongs is damage that gc refuses and verify reports.

A ref replaced by a folder (empty, or holding files) read as no ref: ``verify --all``
passed, and gc took the branch's whole history for unreachable and deleted it, as it
would after the branch had been deleted. On S3 the same slot is taken by keys below the
ref's name (a console's folder marker ``refs/heads/main/``).
"""

from __future__ import annotations

import os
import time

import pytest
from catalog_helpers import stage_samples
from click.testing import CliRunner
from simstore.cli import main

from simstore.catalog import Catalog, gc, verify
from simstore.catalog._refs import misplaced_refs
from simstore.errors import IntegrityError
from simstore.hashing import object_key

HOUR_S = 3600.0


def _aged_store(tmp_path):
    root = str(tmp_path / "store")
    cat = Catalog.init(root)
    stage_samples(cat, "ds", {"a": b"first" * 20})
    first = cat.commit("ds", message="one").snapshot_id
    cat.tags("ds").create("v1", first)
    stage_samples(cat, "ds", {"b": b"second" * 20})
    head = cat.commit("ds", message="two").snapshot_id
    then = time.time() - 2 * HOUR_S
    for dirpath, _, files in os.walk(root):
        for name in files:
            os.utime(os.path.join(dirpath, name), (then, then))
    return root, cat, head


def _objects(root):
    found = set()
    for dirpath, _, files in os.walk(os.path.join(root, "objects")):
        found.update(os.path.join(dirpath, f) for f in files)
    return found


@pytest.mark.parametrize("inside", [None, "stray"], ids=["empty-folder", "folder-with-a-file"])
@pytest.mark.parametrize("dry_run", [False, True])
def test_gc_refuses_a_store_whose_branch_is_a_folder(tmp_path, inside, dry_run):
    root, cat, head = _aged_store(tmp_path)
    ref = os.path.join(root, "datasets", "ds", "refs", "heads", "main")
    os.unlink(ref)
    os.mkdir(ref)
    if inside:
        with open(os.path.join(ref, inside), "wb") as f:
            f.write(b"x")
    before = _objects(root)

    with pytest.raises(IntegrityError, match=r"datasets/ds/refs/heads/main: a folder stands "
                                             r"where branch ds@main belongs"):
        gc(cat, grace_s=0, dry_run=dry_run)

    assert _objects(root) == before
    assert cat.store.exists(object_key(head))


def test_verify_all_reports_a_tag_that_is_a_folder(tmp_path):
    root, cat, _ = _aged_store(tmp_path)
    ref = os.path.join(root, "datasets", "ds", "refs", "tags", "v1")
    os.unlink(ref)
    os.mkdir(ref)

    report = verify(cat, all_refs=True)

    assert not report.ok
    [problem] = report.problem_objects
    assert (problem.object, problem.kind, problem.problem) == ("ds@v1", "ref", "damaged")
    assert "a folder stands where tag ds@v1 belongs" in problem.message


def test_the_command_line_says_which_folder_in_one_line(tmp_path):
    root, _, _ = _aged_store(tmp_path)
    ref = os.path.join(root, "datasets", "ds", "refs", "heads", "main")
    os.unlink(ref)
    os.mkdir(ref)
    before = _objects(root)
    runner = CliRunner()

    out = runner.invoke(main, ["--store", root, "gc", "--grace", "0"])
    assert out.exit_code != 0
    assert "Traceback" not in out.output
    [line] = [x for x in out.output.splitlines() if x.strip()]
    assert "datasets/ds/refs/heads/main: a folder stands where branch ds@main" in line
    assert _objects(root) == before

    out = runner.invoke(main, ["--store", root, "verify", "--all"])
    assert out.exit_code != 0
    assert "a folder stands where branch ds@main belongs" in out.output


def test_an_intact_store_has_no_misplaced_refs(tmp_path):
    # the check is not set off by the folders a store always has
    _, cat, _ = _aged_store(tmp_path)
    assert misplaced_refs(cat.store) == []
    assert verify(cat, all_refs=True).ok
