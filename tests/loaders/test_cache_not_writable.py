"""A cache directory the job may not write: one line naming it, from the start.

Every reader writes to the cache it reads through (locks, fills, the LRU clock), so a
cache on a read-only mount or another user's is refused when it is opened, not at the
first miss as a raw ``OSError``. The tests take the write permission away for real: as
root (who writes anywhere) in a forked child that drops to an unprivileged user, else by
``chmod``.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid

import numpy as np
import pytest
from permissions import without_write_access
from simstore.loaders import SimDataset
from simstore.loaders._cache import CacheConfig, ShardCache
from simstore.loaders._stats import Counters

from simstore.catalog import Catalog
from simstore.errors import StorageError
from simstore.hashing import hash_bytes
from simstore.ingest import ingest

BLOB = b"x" * 1000


def _cache(directory: str) -> ShardCache:
    return ShardCache(CacheConfig(directory=directory, limit_bytes=1 << 20), Counters())


def test_a_cache_that_may_not_be_written_is_refused_when_opened(open_dir):
    cache_dir = os.path.join(open_dir, "cache")
    filled = _cache(cache_dir)  # a real cache, holding one copy
    filled.acquire(hash_bytes(BLOB), lambda: len(BLOB), lambda out: out.write(BLOB)).release()
    kind, text = without_write_access(cache_dir, lambda: _cache(cache_dir))
    assert kind == "StorageError", text
    assert text.startswith(f"cache directory {cache_dir}: not writable (")
    assert "give a cache_dir it may write" in text
    assert "\n" not in text


def test_a_lock_that_cannot_be_made_later_is_a_storage_error_naming_the_cache(open_dir):
    cache_dir = os.path.join(open_dir, "cache")
    _cache(cache_dir)
    opened: list[ShardCache] = []

    def miss() -> None:  # opened while writable; a fill's lock is made after that
        opened[0].acquire(hash_bytes(BLOB), lambda: len(BLOB), lambda out: out.write(BLOB))

    kind, text = without_write_access(cache_dir, miss, before=lambda: opened.append(
        _cache(cache_dir)))
    assert kind == "StorageError", text
    assert text.startswith(f"cache directory {cache_dir}: lock ")
    assert "\n" not in text


def test_a_dataset_reading_through_such_a_cache_says_so(open_dir):
    src = os.path.join(open_dir, "src")
    os.makedirs(src)
    for i in range(3):
        np.savez(os.path.join(src, f"r{i}.npz"), x=np.full(4, float(i)))
    store = f"memory://cache-not-writable-{uuid.uuid4().hex}"  # read through the cache
    Catalog.init(store)
    ingest([src], dataset="d", store=store, snapshot=True)
    cache_dir = os.path.join(open_dir, "cache")
    _cache(cache_dir)

    def read() -> None:
        ds = SimDataset(store, "d", shuffle=False, cache_dir=cache_dir)
        assert len(list(ds)) == 3

    kind, text = without_write_access(cache_dir, read)
    assert kind == "StorageError", text
    assert f"cache directory {cache_dir}: not writable (" in text


def test_du_reads_such_a_cache_and_pull_into_it_is_refused(open_dir):
    from click.testing import CliRunner
    from simstore.cli import main

    src = os.path.join(open_dir, "src")
    os.makedirs(src)
    np.savez(os.path.join(src, "r.npz"), x=np.arange(4.0))
    store = f"memory://cache-not-writable-{uuid.uuid4().hex}"
    Catalog.init(store)
    ingest([src], dataset="d", store=store, snapshot=True)
    cache_dir = os.path.join(open_dir, "cache")

    def cli(*args: str) -> tuple[int, str]:
        r = CliRunner().invoke(main, ["--store", store, *args])
        return r.exit_code, r.output

    assert cli("pull", "d", "--cache", cache_dir)[0] == 0
    _, out = cli("du", "d", "--cache", cache_dir, "--json")
    writable_du = json.loads(out)
    outcomes: dict[str, tuple[int, str]] = {}

    def both() -> None:
        outcomes["du"] = cli("du", "d", "--cache", cache_dir, "--json")
        outcomes["pull"] = cli("pull", "d", "--cache", cache_dir)
        raise RuntimeError(json.dumps(outcomes))  # carried back from a forked child

    kind, text = without_write_access(cache_dir, both)
    assert kind == "RuntimeError", text
    got = json.loads(text)
    code, out = got["du"]
    assert code == 0, out
    assert json.loads(out) == writable_du  # every copy still counted where it lies
    code, out = got["pull"]
    assert code == 10, out
    assert out.startswith(f"error: cache directory {cache_dir}: not writable (")
    assert out.count("\n") == 1


def test_a_fill_whose_rename_lock_fails_keeps_no_descriptor(tmp_path):
    cache_dir = str(tmp_path / "cache")
    cache = _cache(cache_dir)

    def download(out) -> None:  # the cache's locks folder is removed while it fills
        shutil.rmtree(os.path.join(cache_dir, "locks"))
        out.write(BLOB)

    before = sorted(os.listdir("/proc/self/fd"))
    with pytest.raises(StorageError, match=f"cache directory {cache_dir}: lock evict"):
        cache.acquire(hash_bytes(BLOB), lambda: len(BLOB), download)
    assert sorted(os.listdir("/proc/self/fd")) == before  # the filled copy's not left open
    assert os.listdir(os.path.join(cache_dir, "tmp")) == []


def test_du_changes_nothing_in_the_cache_it_reports(tmp_path):
    from click.testing import CliRunner
    from simstore.cli import main

    store = f"memory://cache-du-{uuid.uuid4().hex}"
    Catalog.init(store)
    cache_dir = str(tmp_path / "cache")
    _cache(cache_dir).acquire(hash_bytes(BLOB), lambda: len(BLOB),
                              lambda out: out.write(BLOB)).release()
    stale = os.path.join(cache_dir, "used", "ab", "ab" + "0" * 30)  # its copy is gone
    os.makedirs(os.path.dirname(stale), exist_ok=True)
    open(stale, "wb").close()
    r = CliRunner().invoke(main, ["--store", store, "du", "--cache", cache_dir, "--json"])
    assert r.exit_code == 0, r.output
    assert os.path.exists(stale)  # a report lists; the next filler's pass removes it
    _cache(cache_dir).trim()
    assert not os.path.exists(stale)
