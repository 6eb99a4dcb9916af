"""What else lies in a cache's ``objects/`` and ``used/`` folders is left alone.

docs/loader.md: eviction deletes only copies (names under ``objects/`` that are object
ids) and the ``used/`` files of copies gone. A file in ``objects/`` or ``used/`` made
every fill fail ("Not a directory"), a folder there that was a link had the files it
points at evicted, and a ``used/`` file that is no object id's was deleted.
"""

from __future__ import annotations

import os

import pytest
from simstore.loaders._cache import CacheConfig, ShardCache
from simstore.loaders._stats import Counters

from simstore.errors import StorageError
from simstore.hashing import hash_bytes

SIZE = 1000


def _fill_three(directory: str) -> ShardCache:
    """Three copies through a cache that holds one: each fill evicts the one before."""
    cache = ShardCache(CacheConfig(directory=directory, limit_bytes=SIZE), Counters())
    for i in range(3):
        blob = bytes([i]) * SIZE
        cache.acquire(hash_bytes(blob), lambda: SIZE, lambda out, b=blob: out.write(b)).release()
    return cache


def test_files_left_in_the_cache_folders_break_no_fill_and_stay(tmp_path):
    directory = tmp_path / "c"
    _fill_three(str(directory))
    left = [directory / "objects" / "README", directory / "used" / "README",
            directory / "used" / "ab" / "abandon.txt"]
    (directory / "used" / "ab").mkdir(exist_ok=True)
    for path in left:
        path.write_text("mine")
    cache = _fill_three(str(directory))
    assert cache.counters.snapshot()["cache_evictions"] == 3
    assert all(path.read_text() == "mine" for path in left)


def test_an_object_id_outside_its_own_folder_is_left_alone(tmp_path):
    # found by an audit: objects/zz/<id> (never where a copy of <id> lives) was evicted
    directory = tmp_path / "c"
    _fill_three(str(directory))
    oid = hash_bytes(b"elsewhere")
    other = "zz" if oid[:2] != "zz" else "yy"
    stray = directory / "objects" / other / oid
    stray.parent.mkdir()
    stray.write_bytes(b"x" * SIZE)
    cache = _fill_three(str(directory))
    assert cache.counters.snapshot()["cache_evictions"] == 3
    assert stray.read_bytes() == b"x" * SIZE


def test_a_linked_folder_in_the_cache_is_not_evicted_through(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    blob = b"z" * SIZE
    oid = hash_bytes(blob)
    (elsewhere / oid[:2]).mkdir(parents=True)
    (elsewhere / oid[:2] / oid).write_bytes(blob)
    directory = tmp_path / "c"
    _fill_three(str(directory))
    os.symlink(elsewhere / oid[:2], directory / "objects" / oid[:2])
    os.symlink(elsewhere / oid[:2], directory / "used" / oid[:2])
    _fill_three(str(directory))
    assert (elsewhere / oid[:2] / oid).read_bytes() == blob


def test_a_fifo_or_link_in_a_copys_place_is_a_miss_the_fill_replaces(tmp_path):
    # found by an audit: a FIFO there hung every later job in its open, a link failed every
    # one ("Too many levels of symbolic links"); neither holds any data
    directory = tmp_path / "c"
    cache = _fill_three(str(directory))
    blob = b"q" * SIZE
    oid = hash_bytes(blob)
    target = tmp_path / "elsewhere"
    target.write_bytes(b"not yours")
    place = directory / "objects" / oid[:2] / oid
    place.parent.mkdir(exist_ok=True)
    for make in (os.mkfifo, lambda p: os.symlink(target, p)):
        make(place)
        assert cache.peek(oid) is None
        cache.acquire(oid, lambda: SIZE, lambda out: out.write(blob)).release()
        assert place.is_file() and not place.is_symlink() and place.read_bytes() == blob
        os.unlink(place)
    assert target.read_bytes() == b"not yours"
    # a folder there may hold someone's files: named, never removed, never waited on
    place.mkdir()
    (place / "mine").write_text("mine")
    with pytest.raises(StorageError, match=rf"cache copy .*{oid}: a folder in the copy's place"):
        cache.acquire(oid, lambda: SIZE, lambda out: out.write(blob))
    assert (place / "mine").read_text() == "mine"
