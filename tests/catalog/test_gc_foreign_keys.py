"""gc deletes only objects laid out as objects (``objects/<2 hex>/<id>``), never a file
something else put under ``objects/`` or a store nested there.

gc deleted every old key under ``objects/`` that nothing reached: files put there by hand
and the metadata, refs and journal of a second store made at ``objects/team``, which then
said "not a simstore store".
"""

from __future__ import annotations

import json
import os
import time

import pytest
from catalog_helpers import stage_samples
from click.testing import CliRunner
from simstore.cli import main

from simstore.catalog import Catalog, gc, verify
from simstore.hashing import object_key

HOUR_S = 3600.0
FOREIGN = ["objects/readme.txt", "objects/photos/cat.jpg", "objects/ab/not-an-id",
           f"objects/ab/{'cd' * 16}", f"objects/ab/{'ab' * 16}.bak"]


def _age_everything(root: str, seconds: float) -> None:
    then = time.time() - seconds
    for dirpath, _, files in os.walk(root):
        for name in files:
            os.utime(os.path.join(dirpath, name), (then, then))


@pytest.mark.parametrize("dry_run", [False, True])
def test_gc_leaves_what_it_did_not_write(tmp_path, dry_run):
    root = str(tmp_path / "store")
    cat = Catalog.init(root)
    stage_samples(cat, "ds", {"a": b"kept" * 20})
    sid = cat.commit("ds", message="m").snapshot_id
    garbage, _ = cat.put_object(b"unreachable, two hours old")
    for key in FOREIGN:
        cat.store.put(key, b"not simstore's")
    nested = Catalog.init(os.path.join(root, "objects", "team"))
    stage_samples(nested, "other", {"b": b"theirs" * 20})
    nested_sid = nested.commit("other", message="n").snapshot_id
    notes = os.path.join(root, "objects", ".tmp-notes")  # not named as the store names its own
    with open(notes, "wb") as f:
        f.write(b"someone's notes")
    _age_everything(root, 2 * HOUR_S)

    report = gc(cat, grace_s=0, dry_run=dry_run)

    assert garbage in report.deleted
    assert cat.store.exists(object_key(garbage)) == dry_run
    assert all(cat.store.exists(key) for key in FOREIGN)
    assert set(FOREIGN) <= set(report.foreign)
    assert report.to_json()["foreign"] == len(report.foreign)
    assert os.path.exists(notes)
    assert verify(cat, f"ds@{sid}", deep=True).ok
    nested = Catalog.open(os.path.join(root, "objects", "team"))
    assert nested.resolve("other") == nested_sid
    assert verify(nested, "other", deep=True).ok


def test_cost_counts_only_the_stores_objects(tmp_path):
    # cost's store total counted every key under objects/ whose last part looked like an
    # id: a store nested at objects/team added its objects to the outer store's bill
    root = str(tmp_path / "store")
    cat = Catalog.init(root)
    stage_samples(cat, "ds", {"a": b"kept" * 20})
    cat.commit("ds", message="m")
    runner = CliRunner()

    def store_total():
        out = runner.invoke(main, ["--store", root, "cost", "ds", "--json"])
        assert out.exit_code == 0, out.output
        return json.loads(out.output)["store_total"]

    before = store_total()
    nested = Catalog.init(os.path.join(root, "objects", "team"))
    nested.put_object(b"theirs" * 1000)
    cat.store.put(f"objects/ab/{'cd' * 16}", b"not simstore's")
    after = store_total()
    assert (after["objects"], after["bytes"]) == (before["objects"], before["bytes"])
