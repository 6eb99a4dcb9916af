"""gc never deletes through a linked folder: a local store whose ``objects/`` (or a
folder under it) is a symbolic link to another store's objects leaves those objects.

A store crafted with ``objects -> /elsewhere/objects`` made ``simstore gc`` list the
other folder as its own and delete every file there laid out as an object that its
refs did not reach: another store's shards, parts and snapshots.
"""

from __future__ import annotations

import os
import shutil
import time

from catalog_helpers import stage_samples

from simstore.catalog import Catalog, gc, verify

HOUR_S = 3600.0


def _age_everything(root: str, seconds: float) -> None:
    then = time.time() - seconds
    for dirpath, _, files in os.walk(root):
        for name in files:
            os.utime(os.path.join(dirpath, name), (then, then))


def _object_files(folder: str) -> set[str]:
    return {os.path.relpath(os.path.join(d, f), folder)
            for d, _, files in os.walk(folder) for f in files}


def test_gc_does_not_delete_through_a_linked_objects_folder(tmp_path):
    victim = Catalog.init(str(tmp_path / "victim"))
    stage_samples(victim, "mine", {"a": b"the victim's" * 20})
    victim_sid = victim.commit("mine", message="m").snapshot_id
    victim_objects = str(tmp_path / "victim" / "objects")

    crafted_root = str(tmp_path / "crafted")
    crafted = Catalog.init(crafted_root)
    stage_samples(crafted, "theirs", {"b": b"crafted" * 20})
    crafted.commit("theirs", message="c")
    # the crafted store's objects are copied next to the victim's, and linked to
    for name in os.listdir(os.path.join(crafted_root, "objects")):
        src = os.path.join(crafted_root, "objects", name)
        dest = os.path.join(victim_objects, name)
        os.makedirs(dest, exist_ok=True)
        for f in os.listdir(src):
            shutil.copy2(os.path.join(src, f), os.path.join(dest, f))
    shutil.rmtree(os.path.join(crafted_root, "objects"))
    os.symlink(victim_objects, os.path.join(crafted_root, "objects"))
    _age_everything(str(tmp_path), 2 * HOUR_S)
    before = _object_files(victim_objects)

    report = gc(Catalog.open(crafted_root), grace_s=0)

    assert report.deleted == []
    assert _object_files(victim_objects) == before
    assert verify(Catalog.open(str(tmp_path / "victim")), f"mine@{victim_sid}", deep=True).ok


def test_gc_does_not_delete_through_a_linked_object_folder(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    name = "ab" * 16
    (elsewhere / name).write_bytes(b"not the store's")
    root = str(tmp_path / "store")
    cat = Catalog.init(root)
    stage_samples(cat, "ds", {"a": b"kept" * 20})
    cat.commit("ds", message="m")
    os.symlink(str(elsewhere), os.path.join(root, "objects", "ab"))
    _age_everything(str(tmp_path), 2 * HOUR_S)

    gc(cat, grace_s=0)

    assert (elsewhere / name).read_bytes() == b"not the store's"
