"""gc running while ingests stage and commit: nothing a commit needs is deleted.

First exactly: a full gc runs before every single write an ingest makes (shards, journal,
change set, staging entry, manifest parts, snapshot, ref swap, clean-up). Then loosely:
writer processes ingest and commit version after version while gc runs in a loop. gc's
grace period (here 10 minutes, by default an hour) covers the time between an ingest
writing its shards and committing them, as docs/operations.md requires; commits of
entries staged long ago are covered in test_rel_commit_races.py.
"""

from __future__ import annotations

import os

import pytest
import rel_harness as h

from simstore.catalog import Catalog, gc
from simstore.ingest import ingest
from simstore.storage import LocalStore

GRACE_S = 600.0


@pytest.mark.parametrize("mode", ["upsert", "replace"])
def test_gc_before_every_write_of_an_ingest(tmp_path, mode):
    root = str(tmp_path / "store")
    src = str(tmp_path / "src")
    Catalog.init(root)
    h.write_sources(src, 0, seed=6)
    ingest([src], dataset="ds", store=root, snapshot=True, message="v0", shard_size=8 * 1024)
    h.write_sources(src, 1, seed=6)
    runs = []

    def before(method, key, n):
        if n:  # a mutating call of the ingest: collect garbage first
            runs.append(gc(Catalog(LocalStore(root)), grace_s=GRACE_S))

    ingest(
        [src],
        dataset="ds",
        store=Catalog(h.HookStore(LocalStore(root), before=before)),
        snapshot=True,
        message="v1",
        shard_size=8 * 1024,
        mode=mode,
    )
    assert len(runs) > 5
    cat = Catalog.open(root)
    assert h.store_problems(cat) == []
    expected = Catalog.init(f"memory://gc-race-{mode}")
    ingest([src], dataset="ds", store=expected, snapshot=True, message="x", shard_size=8 * 1024)
    if mode == "replace":
        assert h.content(cat, "ds") == h.content(expected, "ds")
    else:
        assert h.content(expected, "ds").items() <= h.content(cat, "ds").items()


@pytest.mark.multiprocess
def test_gc_loop_while_writer_processes_ingest_and_commit(tmp_path, forkserver):
    root = str(tmp_path / "store")
    Catalog.init(root)
    writers, versions = 3, 4
    procs = []
    for w in range(writers):
        src = str(tmp_path / f"src{w}")
        proc = forkserver.Process(
            target=h.op_ingest_versions, args=(root, src, f"ds{w}", versions, 10 + w)
        )
        proc.start()
        procs.append(proc)
    collections = 0
    while any(p.is_alive() for p in procs):
        gc(Catalog.open(root), grace_s=GRACE_S)
        collections += 1
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert collections > 0
    cat = Catalog.open(root)
    gc(cat, grace_s=GRACE_S)
    assert h.store_problems(cat) == []
    for w in range(writers):
        ref = Catalog.init(f"memory://gc-loop-{w}-{os.getpid()}")
        ingest(
            [str(tmp_path / f"src{w}")],
            dataset="ds",
            store=ref,
            snapshot=True,
            message="x",
            shard_size=64 * 1024,
        )
        assert h.content(cat, f"ds{w}") == h.content(ref, "ds")
        assert len(list(cat.log(f"ds{w}"))) == versions
