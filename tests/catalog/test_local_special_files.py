"""A local store reads only regular files: an object, ref or snapshot planted as a FIFO
or as a link to a character device is one error naming it, not a wait for ever or a read
without end.

A crafted store whose snapshot was a link to /dev/zero made ``ls``, ``log``, ``show`` and
``verify`` read until memory ran out; one whose snapshot was a FIFO made them wait for a
writer that never came.
"""

from __future__ import annotations

import os

import pytest
from catalog_helpers import stage_samples
from click.testing import CliRunner
from simstore.cli import main

from simstore.catalog import Catalog
from simstore.errors import NotFoundError, StorageError
from simstore.hashing import object_key
from simstore.storage import LocalStore


def _plant(path: str, kind: str) -> None:
    os.unlink(path)
    if kind == "fifo":
        os.mkfifo(path)
    else:
        os.symlink(os.devnull, path)  # a character device, empty: the bound is the type


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_get_refuses_what_is_not_a_regular_file(tmp_path, kind):
    store = LocalStore(str(tmp_path))
    store.put("objects/ab/" + "ab" * 16, b"x")
    _plant(str(tmp_path / "objects" / "ab" / ("ab" * 16)), kind)
    with pytest.raises(StorageError, match="objects/ab/abab.*not a regular file"):
        store.get("objects/ab/" + "ab" * 16)
    with pytest.raises(StorageError, match="not a regular file"):
        store.get("objects/ab/" + "ab" * 16, (0, 10))
    store.put("d/x", b"x")
    with pytest.raises(NotFoundError):
        store.get("d")  # a folder is no object, as before


@pytest.mark.parametrize("kind", ["fifo", "device"])
@pytest.mark.parametrize("command", [["ls"], ["log", "ds"], ["show", "ds"], ["verify", "ds"]])
def test_commands_name_a_snapshot_that_is_not_a_regular_file(tmp_path, kind, command):
    root = str(tmp_path / "store")
    cat = Catalog.init(root)
    stage_samples(cat, "ds", {"a": b"kept" * 20})
    sid = cat.commit("ds", message="m").snapshot_id
    _plant(os.path.join(root, *object_key(sid).split("/")), kind)
    res = CliRunner().invoke(main, ["--store", root, *command])
    assert res.exit_code != 0, res.output
    assert "Traceback" not in res.output
    assert sid in res.output and "not a regular file" in res.output
