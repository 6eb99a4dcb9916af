"""A manifest part larger than any simstore writes stops the loader with an
``IntegrityError`` naming it, before its bytes are read: from the store, and through a
disk cache's fill.

Found by an audit of planted objects: a part grown into a sparse file of gigabytes was
read whole (its hash then failed, or memory ran out first). The cap is
``simstore/catalog/_caps.py``'s; the part here is one byte over it (sparse: no disk).
"""

from __future__ import annotations

import os

import pytest
from loader_helpers import RemoteLikeStore, open_test_shard
from simstore.loaders import SimDataset

from simstore.catalog import Catalog
from simstore.errors import IntegrityError
from simstore.hashing import object_key

PART_CAP = 256 << 20


def _grow_a_part(store: str, ref: str) -> str:
    cat = Catalog.open(store)
    sid = cat.resolve(ref)
    key = object_key(cat.snapshot(sid).parts[0].id)
    os.truncate(os.path.join(store, *key.split("/")), PART_CAP + 1)
    return key


@pytest.mark.parametrize("cached", [False, True])
def test_a_part_over_the_cap_stops_the_loader_naming_it(small, tmp_path, cached):
    store, ref, _ = small
    key = _grow_a_part(store, ref)
    ds = (SimDataset(RemoteLikeStore(store), ref, cache_dir=str(tmp_path / "cache"),
                     cache_limit="1GiB") if cached else SimDataset(store, ref))
    with pytest.raises(IntegrityError) as info:
        list(ds)
    message = str(info.value)
    assert key in message and "larger than any manifest part simstore writes" in message


@pytest.mark.parametrize("kind", ["manifest part", "snapshot"])
def test_a_cache_copy_grown_past_the_cap_is_taken_out_unread(small, tmp_path, kind):
    """Found by a review: a node's cached copy of a part or snapshot grown since its fill
    (a sparse file of gigabytes) was read whole on a hit before its hash was checked, a
    bare MemoryError. It is damage: taken out of the cache by its size, and read again."""
    store, ref, _ = small
    cache = str(tmp_path / "cache")
    remote = RemoteLikeStore(store)

    def epoch() -> SimDataset:
        ds = SimDataset(remote, ref, cache_dir=cache, cache_limit="1GiB",
                        shard_opener=open_test_shard)
        assert len(list(ds)) == ds.num_samples > 0
        return ds

    epoch()
    cat = Catalog.open(store)
    sid = cat.resolve(ref)
    oid = sid if kind == "snapshot" else cat.snapshot(sid).parts[0].id
    copy = os.path.join(cache, "objects", oid[:2], oid)
    os.chmod(copy, 0o644)
    os.truncate(copy, (PART_CAP if kind == "manifest part" else 1 << 30) + 1)
    if kind == "manifest part":
        with pytest.raises(IntegrityError) as info:
            epoch()
        message = str(info.value)
        assert copy in message and "removed from the cache" in message
        assert f"is larger than any {kind} simstore writes" in message
    else:  # a snapshot's damaged copy is passed over for the store's
        epoch()
    assert not os.path.exists(copy) or os.path.getsize(copy) < 1 << 20
    epoch()  # read again from the store
    assert os.path.getsize(copy) < 1 << 20
