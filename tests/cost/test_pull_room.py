"""`simstore pull` onto a disk with too little room is refused before any copy.

The check compared the snapshot's bytes with the free space; the disk gives whole
blocks, and the cache's folders and marker take some too, so a disk with a few KiB to
spare passed the check and the pull filled it half way (exit 10). The disk is a real
size-limited tmpfs, filled by another file to leave the snapshot's bytes and one block.
"""

from __future__ import annotations

import json
import os
import uuid

import numpy as np
from click.testing import CliRunner
from simstore.cli import main

from simstore.catalog import Catalog
from simstore.ingest import ingest


def test_a_pull_that_would_fill_the_disk_is_refused_up_front(tmp_path, small_fs):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(8):  # 8 shards of odd sizes: each wastes part of its last block
        np.savez(src / f"r{i}.npz", x=np.random.default_rng(i).random(30_000 + 77 * i))
    store = f"memory://pull-room-{uuid.uuid4().hex}"
    Catalog.init(store)
    ingest([str(src)], dataset="d", store=store, snapshot=True, shard_size="64KiB",
           compression="none")
    probe = CliRunner().invoke(main, ["--store", store, "du", "d", "--json"])
    assert probe.exit_code == 0, probe.output
    total = json.loads(probe.output)["tiers"][0]["bytes"]
    disk = small_fs("16m")
    st = os.statvfs(disk)
    free = st.f_bavail * st.f_frsize
    with open(os.path.join(disk, "other-job"), "wb") as f:  # leaves total + one block
        f.write(b"\0" * (free - total - st.f_frsize))
    cache = os.path.join(disk, "cache")
    r = CliRunner().invoke(main, ["--store", store, "pull", "d", "--cache", cache])
    assert r.exit_code == 2, r.output
    assert "bytes of room on its disk (whole blocks) are needed" in r.output
    assert not os.path.exists(cache)  # nothing made, nothing copied
    os.unlink(os.path.join(disk, "other-job"))
    r = CliRunner().invoke(main, ["--store", store, "pull", "d", "--cache", cache])
    assert r.exit_code == 0, r.output


def test_a_pull_of_what_a_full_disk_holds_already_needs_no_room(tmp_path, small_fs):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(4):
        np.savez(src / f"r{i}.npz", x=np.random.default_rng(i).random(30_000 + 77 * i))
    store = f"memory://pull-full-{uuid.uuid4().hex}"
    Catalog.init(store)
    ingest([str(src)], dataset="d", store=store, snapshot=True, shard_size="64KiB",
           compression="none")
    cache = os.path.join(small_fs("4m"), "cache")
    r = CliRunner().invoke(main, ["--store", store, "pull", "d", "--cache", cache])
    assert r.exit_code == 0, r.output
    with open(os.path.join(os.path.dirname(cache), "other-job"), "wb", buffering=0) as f:
        try:  # another job fills the disk to its last block
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    r = CliRunner().invoke(main, ["--store", store, "pull", "d", "--cache", cache, "--json"])
    assert r.exit_code == 0, r.output  # every copy is there: nothing to write
    out = json.loads(r.output)
    assert out["fetched"] == 0 and out["already_cached"] == out["objects"]
