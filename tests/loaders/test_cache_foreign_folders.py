"""A cache directory is claimed only when it is empty or already a simstore cache.

docs/loader.md: "a non-empty directory without the marker is refused". A directory that
held only an ``objects/`` folder (a copy of a store's objects, say) was taken for a cache
being claimed by a sibling worker: it got a marker, and eviction deleted its files.
"""

from __future__ import annotations

import pytest
from simstore.loaders._cache import MARKER, CacheConfig, ShardCache
from simstore.loaders._stats import Counters

from simstore.errors import InvalidInputError
from simstore.hashing import hash_bytes

SIZE = 1000


def _cache(directory: str) -> ShardCache:
    return ShardCache(CacheConfig(directory=directory, limit_bytes=2 * SIZE), Counters())


def test_a_directory_holding_only_an_objects_folder_is_refused(tmp_path):
    blob = b"x" * SIZE
    oid = hash_bytes(blob)
    kept = tmp_path / "backup" / "objects" / oid[:2] / oid
    kept.parent.mkdir(parents=True)
    kept.write_bytes(blob)
    with pytest.raises(InvalidInputError, match="not a simstore cache"):
        _cache(str(tmp_path / "backup"))
    assert kept.read_bytes() == blob
    assert not (tmp_path / "backup" / MARKER).exists()


def test_a_claimed_cache_is_opened_again(tmp_path):
    directory = str(tmp_path / "c")
    first = _cache(directory)  # marker, then its folders
    second = _cache(directory)
    blob = b"y" * SIZE
    second.acquire(hash_bytes(blob), lambda: SIZE, lambda out: out.write(blob)).release()
    assert first.peek(hash_bytes(blob)) is not None
