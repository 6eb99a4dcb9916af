"""A damaged ref or staging entry can be removed by the command meant to remove it, and
``verify --all`` reports what it cannot read as a ref instead of stopping.

Found by an audit of the versioning commands: ``branch --delete``, ``tag --delete`` and
``unstage ID`` read the object they were asked to remove, so a damaged one (a truncated
ref, a staging entry cut short) could only be removed by hand in the store, while it
stopped ``gc``, ``ls`` and every commit of its dataset; and a file copied in beside the
refs (``main copy``) or a folder under ``datasets/`` named against the rules ended
``verify --all`` with a usage error and no report.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from cli_helpers import cli, tagged_store
from click.testing import CliRunner
from simstore.cli import main

from simstore.ingest import ingest


@pytest.fixture
def store(tmp_path):
    root = str(tmp_path / "store")
    tagged_store(root, str(tmp_path / "src"), {"a": np.arange(3.0)})
    cli("--store", root, "branch", "d@v1", "dev", code=0)
    return root


def _ref(root, kind, name):
    return os.path.join(root, "datasets", "d", "refs", kind, name)


@pytest.mark.parametrize(("kind", "command"), [("heads", "branch"), ("tags", "tag")])
def test_a_damaged_ref_is_deleted_by_its_command(store, kind, command):
    name = "dev" if kind == "heads" else "v1"
    with open(_ref(store, kind, name), "r+b") as f:
        f.truncate(10)
    line = cli("--store", store, "ls", code=7)
    assert name in line and "malformed" in line
    cli("--store", store, command, "d", name, "--delete", code=0)
    assert not os.path.exists(_ref(store, kind, name))
    cli("--store", store, "ls", code=0)
    cli("--store", store, "verify", "--all", code=0)


def test_a_damaged_staging_entry_is_discarded_by_unstage(store, tmp_path):
    src = tmp_path / "more"
    src.mkdir()
    np.save(src / "b.npy", np.arange(4.0))
    for i in range(2):
        np.save(src / "b.npy", np.arange(4.0) + i)
        ingest([str(src)], dataset="d", store=store)  # staged, not committed
    folder = os.path.join(store, "datasets", "d", "staging")
    damaged, intact = sorted(os.listdir(folder))
    with open(os.path.join(folder, damaged), "r+b") as f:
        f.truncate(20)
    assert "malformed" in cli("--store", store, "snapshot", "d", "-m", "x", code=7)
    assert "malformed" in cli("--store", store, "unstage", "d", code=7)  # it is named

    out = json.loads(cli("--store", store, "unstage", "d", damaged, "--json", code=0))

    assert out["discarded"] == [{"id": damaged}]
    assert sorted(os.listdir(folder)) == [intact]
    listed = json.loads(cli("--store", store, "unstage", "d", "--json", code=0))
    assert [e["id"] for e in listed["staged"]] == [intact]


def test_unstage_all_discards_damaged_entries_too(store, tmp_path):
    src = tmp_path / "more"
    src.mkdir()
    np.save(src / "b.npy", np.arange(4.0))
    ingest([str(src)], dataset="d", store=store)
    folder = os.path.join(store, "datasets", "d", "staging")
    [entry] = os.listdir(folder)
    with open(os.path.join(folder, entry), "r+b") as f:
        f.truncate(20)
    out = cli("--store", store, "unstage", "d", "--all", code=0)
    assert out.splitlines() == [f"discarded {entry}"]
    assert os.listdir(folder) == []


def test_verify_all_reports_a_ref_named_against_the_rules_and_checks_the_rest(store):
    with open(_ref(store, "heads", "main"), "rb") as f:
        body = f.read()
    with open(_ref(store, "heads", "main copy"), "wb") as f:
        f.write(body)
    os.makedirs(os.path.join(store, "datasets", "bad name", "refs", "heads"))
    with open(os.path.join(store, "datasets", "bad name", "refs", "heads", "main"), "wb") as f:
        f.write(body)

    result = CliRunner().invoke(main, ["--store", store, "verify", "--all", "--json"])
    assert result.exit_code == 6, result.output  # damage found, reported
    report = json.loads(result.stdout)

    problems = {p["object"]: p for p in report["problem_objects"]}
    assert set(problems) == {"d@main copy", "datasets/bad name/"}
    assert "'main copy' is no branch or tag name" in problems["d@main copy"]["message"]
    assert "'bad name' is no dataset name" in problems["datasets/bad name/"]["message"]
    assert report["snapshots"]  # the intact refs were checked
