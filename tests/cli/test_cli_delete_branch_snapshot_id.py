"""``delete --branch <snapshot id>``: exit 3, and no hint to create a branch of that name.

A branch may not be named with 32 hex characters (they name a snapshot), so the error
must not suggest ``simstore branch DS@main <id>``, a command that is refused (exit 2).
"""

import json
import os
import sys
import uuid

from click.testing import CliRunner
from simstore.cli import main

from simstore.catalog import Catalog

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "catalog"))
from catalog_helpers import stage_samples  # noqa: E402


def _run(url, *args):
    return CliRunner().invoke(main, ["--store", url, *args], catch_exceptions=False)


def test_delete_on_a_snapshot_id_branch_suggests_no_refused_command():
    url = f"memory://cli-{uuid.uuid4().hex}"
    assert _run(url, "init").exit_code == 0
    stage_samples(Catalog.open(url), "ds", {"a": b"1", "b": b"2"})
    done = _run(url, "snapshot", "ds", "-m", "first", "--json")
    sid = json.loads(done.output)["snapshot"]

    res = _run(url, "delete", "ds", "a", "--branch", sid, "--snapshot")
    assert res.exit_code == 3, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    assert sid in lines[0]
    # whatever the message suggests running must not be refused
    hint = lines[0].rsplit(": ", 1)[-1]
    assert hint.startswith("simstore branch "), lines[0]
    args = hint.split()[2:]
    if "NEW_NAME" in args:
        args[args.index("NEW_NAME")] = "fromsnap"
    assert _run(url, "branch", *args).exit_code == 0
    assert Catalog.open(url).staged("ds") == []  # nothing was staged
