"""A new job on a node trusts shard files an earlier job hashed there, while unchanged.

With ``verify=True`` every job used to hash every shard it read, once: a restarted or a
second job on the same node paid for the whole dataset's hash again (4 MiB samples: an
epoch of a fresh process 1.2x slower than trusting). A match is now recorded per file
stamp under ``SIMSTORE_VERIFIED_DIR`` for ``verify_every_s`` (default a day). A file
changed since has another stamp and is hashed again; so is one whose record is too old.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from loader_helpers import (
    RemoteLikeStore,
    assert_filled_again,
    flip_byte_keeping_times,
    npz_parquet_store,
    snapshot_shards,
)
from simstore.loaders import SimDataLoader, SimDataset

from simstore import _verified
from simstore._verified import NodeRecords, node_records, records_dir, stamp_info
from simstore.catalog import Catalog
from simstore.errors import IntegrityError, InvalidInputError
from simstore.hashing import object_key


@pytest.fixture
def records(node_records):
    return node_records


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return npz_parquet_store(tmp_path_factory, seed=7)


def _epoch(ds: SimDataset, workers: int = 0) -> tuple[dict[str, np.ndarray], int, int]:
    """(samples by key, shards hashed, shards trusted) of one epoch of a new job's dataset."""
    loader = SimDataLoader(ds, batch_size=None, num_workers=workers,
                           multiprocessing_context="fork") if workers else ds
    out = {s["__key__"]: s["u"].numpy().copy() for s in loader}
    st = ds.stats()
    return out, st["shards_hashed"], st["shards_trusted"]


def _record_files(folder: str) -> list[str]:
    """The shard records (not the decoded manifest rows in ``rows/`` beside them, nor the
    shards' page layouts in ``layouts/``)."""
    caches = [os.path.join(folder, name) + os.sep for name in ("rows", "layouts")]
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(folder) for f in fs
                  if not (d + os.sep).startswith(tuple(caches)))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_new_job_trusts_what_an_earlier_one_hashed(store, records, workers):
    shards = snapshot_shards(store)
    assert len(shards) > 2
    first, hashed, trusted = _epoch(SimDataset(store, "d@main", seed=1), workers)
    # (a worker may trust what its sibling recorded moments before)
    assert hashed >= len(shards) and (trusted == 0 or workers)
    assert len(_record_files(records)) == len(shards)
    second, hashed, trusted = _epoch(SimDataset(store, "d@main", seed=1), workers)
    assert hashed == 0 and trusted >= len(shards)
    assert first.keys() == second.keys()
    for key, value in first.items():
        np.testing.assert_array_equal(second[key], value)


def test_a_file_damaged_since_its_record_is_hashed_and_named(store, records, tmp_path):
    import shutil

    copy = str(tmp_path / "copy")
    shutil.copytree(store, copy)
    _epoch(SimDataset(copy, "d@main", seed=1))
    shard = snapshot_shards(copy)[0]
    path = os.path.join(copy, object_key(shard))
    flip_byte_keeping_times(path)  # its times put back as they were
    with pytest.raises(IntegrityError) as info:
        _epoch(SimDataset(copy, "d@main", seed=1))
    assert object_key(shard) in str(info.value)


def test_a_record_older_than_verify_every_s_is_hashed_again_and_refreshed(store, records):
    shards = snapshot_shards(store)
    _epoch(SimDataset(store, "d@main", seed=1))
    old = time.time() - 3600
    for path in _record_files(records):
        os.utime(path, (old, old))
    before = time.time()
    _, hashed, trusted = _epoch(SimDataset(store, "d@main", seed=1, verify_every_s=1800))
    assert hashed >= len(shards) and trusted == 0
    # refreshed by this epoch's hashes (a second of slack for coarse file times)
    assert all(os.stat(p).st_mtime >= before - 1 for p in _record_files(records))
    # within a limit the records still meet, they are trusted
    _, hashed, trusted = _epoch(SimDataset(store, "d@main", seed=1, verify_every_s=1800))
    assert hashed == 0 and trusted >= len(shards)


def test_verify_every_s_zero_neither_records_nor_trusts(store, records):
    shards = snapshot_shards(store)
    _epoch(SimDataset(store, "d@main", seed=1, verify_every_s=0))
    assert _record_files(records) == []
    _epoch(SimDataset(store, "d@main", seed=1))  # records
    _, hashed, trusted = _epoch(SimDataset(store, "d@main", seed=1, verify_every_s=0))
    assert hashed >= len(shards) and trusted == 0
    _, hashed, _ = _epoch(SimDataset(store, "d@main", seed=1, verify=False))
    assert hashed == 0


def test_cache_copies_are_trusted_by_later_jobs_until_they_change(store, records, tmp_path):
    # the cache keeps its LRU clock beside the copies (used/), so a hit leaves a copy's
    # times alone and its full stamp (change time included) can be recorded: a copy
    # rewritten in place with its modification time put back moves its change time
    shards = snapshot_shards(store)
    cache = str(tmp_path / "cache")

    def job():
        return SimDataset(RemoteLikeStore(store), "d@main", seed=1, cache_dir=cache,
                          cache_limit="64MiB")

    _epoch(job())  # fills the cache: each copy hashed as it is written, not recorded
    _, hashed, trusted = _epoch(job())  # hits: hashed once, recorded
    assert hashed >= len(shards) and trusted == 0
    assert len(_record_files(records)) == len(shards)
    copy = os.path.join(cache, "objects", shards[0][:2], shards[0])
    stamp = stamp_info(copy)
    expected, hashed, trusted = _epoch(job())  # a later job trusts every copy
    assert hashed == 0 and trusted == len(shards)
    assert stamp_info(copy) == stamp  # hits do not touch the copies
    flip_byte_keeping_times(copy)
    ds = job()
    got, _, _ = _epoch(ds)  # the damaged copy is taken out and read again from the store
    assert ds.stats()["cache_damaged"] == 1
    assert {k: v.tobytes() for k, v in got.items()} == {
        k: v.tobytes() for k, v in expected.items()}
    assert_filled_again(cache, shards[0])


def test_a_file_changed_moments_before_its_stamp_is_not_recorded(tmp_path):
    # file times come from a coarse clock: a write in the same tick as the stamp could
    # leave it unchanged, so only a settled file is recorded
    f = tmp_path / "shard"
    f.write_bytes(b"x" * 100)
    info = stamp_info(str(f))
    assert info is not None
    stamp, changed = info
    recs = NodeRecords(str(tmp_path / "verified"), 3600.0)
    shard = "ab" * 16
    assert not recs.add(shard, stamp, changed, changed + int(0.5e9))
    assert not recs.has(shard, stamp)
    assert recs.add(shard, stamp, changed, changed + int(_verified.SETTLED_S * 1e9))
    assert recs.has(shard, stamp)
    assert not recs.has(shard, stamp + 1)  # another state of the file
    assert not recs.has("cd" * 16, stamp)


def test_a_folder_others_can_write_is_not_used(tmp_path):
    folder = tmp_path / "verified"
    folder.mkdir(mode=0o700)
    os.chmod(folder, 0o777)
    recs = NodeRecords(str(folder), 3600.0)
    assert not recs.add("ab" * 16, 1, 0, 10**19)
    assert not recs.has("ab" * 16, 1)
    assert os.listdir(folder) == []
    os.chmod(folder, 0o700)
    assert NodeRecords(str(folder), 3600.0).add("ab" * 16, 1, 0, 10**19)


def test_a_record_from_the_future_is_not_trusted(tmp_path):
    recs = NodeRecords(str(tmp_path / "verified"), 3600.0)
    assert recs.add("ab" * 16, 1, 0, 10**19)
    (path,) = _record_files(str(tmp_path / "verified"))
    later = time.time() + 600  # recorded under a clock since set back
    os.utime(path, (later, later))
    assert not recs.has("ab" * 16, 1)


def test_where_records_live(monkeypatch, tmp_path):
    monkeypatch.setenv("SIMSTORE_VERIFIED_DIR", str(tmp_path / "v"))
    assert records_dir() == str(tmp_path / "v")
    monkeypatch.setenv("SIMSTORE_VERIFIED_DIR", "")
    assert records_dir() is None and node_records(True, 60.0) is None
    monkeypatch.delenv("SIMSTORE_VERIFIED_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert records_dir() == str(tmp_path / "xdg" / "simstore" / "verified")
    assert node_records(False, 60.0) is None and node_records(True, 0.0) is None
    assert node_records(True, 60.0) == NodeRecords(records_dir() or "", 60.0)
    # a relative XDG_CACHE_HOME is ignored (the XDG specification); no home, no records
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    monkeypatch.setenv("HOME", str(home))
    assert records_dir() == str(home / ".cache" / "simstore" / "verified")
    for missing in ("", str(tmp_path / "no-such-home"), "/"):
        monkeypatch.setenv("HOME", missing)
        assert records_dir() is None, missing


def test_a_records_folder_deleted_meanwhile_comes_back_private(tmp_path):
    import shutil

    recs = NodeRecords(str(tmp_path / "verified"), 3600.0)
    assert recs.usable()
    shutil.rmtree(recs.root)
    old = os.umask(0o002)
    try:
        assert recs.add("ab" * 16, 1, 0, 10**19)
    finally:
        os.umask(old)
    for folder in (recs.root, os.path.join(recs.root, "ab")):
        assert os.stat(folder).st_mode & 0o777 == 0o700, folder
    assert NodeRecords(recs.root, 3600.0).usable()


def test_verify_deep_forgets_the_records_of_a_damaged_shard(store, records, tmp_path):
    # damage no stamp sees (a disk's) cannot be made here; a record of the shard under
    # another stamp stands in for it: verify finds the damage and forgets every record
    import shutil

    from simstore.catalog import verify

    copy = str(tmp_path / "copy")
    shutil.copytree(store, copy)
    shard = snapshot_shards(copy)[0]
    recs = node_records(True, 3600.0)
    assert recs is not None and recs.add(shard, 12345, 0, 10**19)
    flip_byte_keeping_times(os.path.join(copy, object_key(shard)))
    report = verify(Catalog.open(copy), "d", deep=True)
    assert not report.ok
    assert not any(os.path.basename(r).startswith(shard) for r in _record_files(records))
    assert not recs.has(shard, 12345)


@pytest.mark.parametrize("bad", [-1, float("nan"), "1d", True, None, 10**400])
def test_bad_verify_every_s_is_refused(store, bad):
    with pytest.raises(InvalidInputError, match="verify_every_s"):
        SimDataset(store, "d@main", verify_every_s=bad)


_JOB = """
import json, sys
from simstore.loaders import SimDataset
ds = SimDataset(sys.argv[1], "d@main", seed=1)
keys = [s["__key__"] for s in ds]
st = ds.stats()
print(json.dumps({"keys": keys, "hashed": st["shards_hashed"], "trusted": st["shards_trusted"]}))
"""


def test_fresh_processes(store, tmp_path, monkeypatch):
    # real jobs, one after the other, with the default settled time: wait until the
    # store's files are old enough to be recorded
    monkeypatch.setenv("SIMSTORE_VERIFIED_DIR", str(tmp_path / "verified"))
    paths = [os.path.join(store, object_key(s)) for s in snapshot_shards(store)]
    newest = max(max(os.stat(p).st_mtime, os.stat(p).st_ctime) for p in paths)
    time.sleep(max(0.0, newest + _verified.SETTLED_S + 0.1 - time.time()))
    runs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", _JOB, store], capture_output=True,
                             text=True, check=True)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert runs[0]["hashed"] >= len(paths) and runs[0]["trusted"] == 0
    assert runs[1]["hashed"] == 0 and runs[1]["trusted"] >= len(paths)
    assert runs[0]["keys"] == runs[1]["keys"]


def test_verify_deep_records_a_local_stores_shards_for_the_loaders(store, records, tmp_path):
    import shutil

    from simstore.catalog import verify

    copy = str(tmp_path / "copy")
    shutil.copytree(store, copy)
    shards = snapshot_shards(copy)
    report = verify(Catalog.open(copy), "d", deep=True)
    assert report.ok and report.shards_recorded == len(shards)
    assert report.to_json()["shards_recorded"] == len(shards)
    _, hashed, trusted = _epoch(SimDataset(copy, "d@main", seed=1))
    assert hashed == 0 and trusted >= len(shards)
    # a shallow verify hashes nothing, so records nothing
    assert verify(Catalog.open(store), "d").shards_recorded == 0
    # a damaged shard is a problem, not a record
    path = os.path.join(copy, object_key(shards[0]))
    with open(path, "r+b") as f:
        f.seek(10)
        f.write(b"\xff\xfe")
    for rec in _record_files(records):
        os.unlink(rec)
    report = verify(Catalog.open(copy), "d", deep=True)
    assert not report.ok and report.shards_recorded == len(shards) - 1
    assert not any(os.path.basename(r).startswith(shards[0]) for r in _record_files(records))


def test_no_records_where_a_folder_has_no_owner_to_check(tmp_path, monkeypatch):
    monkeypatch.delattr(os, "getuid")
    recs = NodeRecords(str(tmp_path / "verified"), 3600.0)
    assert not recs.add("ab" * 16, 1, 0, 10**19)
    assert not recs.has("ab" * 16, 1)
    assert not (tmp_path / "verified").exists()
