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
from loader_helpers import RemoteLikeStore
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
