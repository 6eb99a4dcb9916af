"""gc takes "now" from the store (``ObjectStore.clock``); a local store's is this machine's.

The S3 side (a local clock running ahead of the server's) is in tests/s3.
"""

import hashlib
import os
import time

from catalog_helpers import stage_samples

from simstore.catalog import Catalog, gc, verify
from simstore.hashing import object_key
from simstore.storage import LocalStore

HOUR_S = 3600.0


def _age(cat, key, seconds):
    path = os.path.join(cat.store.root, key)
    then = time.time() - seconds
    os.utime(path, (then, then))
    return path


def _temporary(cat, name, age_s):
    # named as the store names its temporary files: .tmp-<32 hex digits>
    path = os.path.join(cat.store.root, "objects", f".tmp-{hashlib.md5(name.encode()).hexdigest()}")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(b"half written")
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


def test_local_store_clock_is_this_machines():
    before = time.time()
    now = LocalStore("unused").clock()
    assert before <= now <= time.time()


def test_gc_on_a_local_store_behaves_as_before(cat):
    stage_samples(cat, "ds", {"a": b"kept" * 20})
    sid = cat.commit("ds", message="m").snapshot_id
    old, _ = cat.put_object(b"garbage from two hours ago")
    fresh, _ = cat.put_object(b"a writer's shard, stored just now")
    _age(cat, object_key(old), 2 * HOUR_S)
    old_tmp = _temporary(cat, "killed-writer", 2 * HOUR_S)
    fresh_tmp = _temporary(cat, "live-writer", 0)

    report = gc(cat, grace_s=HOUR_S)

    assert old in report.deleted and not cat.store.exists(object_key(old))
    assert fresh not in report.deleted and cat.store.exists(object_key(fresh))
    assert report.temporary_removed >= 1
    assert not os.path.exists(old_tmp) and os.path.exists(fresh_tmp)
    assert verify(cat, f"ds@{sid}", deep=True).ok
    # an explicit ``now`` is still taken as it is
    report = gc(cat, grace_s=HOUR_S, now=time.time() + 2 * HOUR_S)
    assert fresh in report.deleted and not os.path.exists(fresh_tmp)
    assert verify(cat, f"ds@{sid}", deep=True).ok


class BehindStore(LocalStore):
    """A local store whose clock runs two hours behind this machine's (as a server's may)."""

    def clock(self) -> float:
        return super().clock() - 2 * HOUR_S


def test_gc_cutoff_for_objects_and_temporaries_comes_from_the_store(tmp_path):
    root = str(tmp_path / "store")
    Catalog.init(root)
    cat = Catalog(BehindStore(root))
    recent, _ = cat.put_object(b"90 minutes old here, recent by the store's clock")
    ancient, _ = cat.put_object(b"four hours old by any clock")
    _age(cat, object_key(recent), 1.5 * HOUR_S)
    _age(cat, object_key(ancient), 4 * HOUR_S)
    recent_tmp = _temporary(cat, "recent", 1.5 * HOUR_S)
    ancient_tmp = _temporary(cat, "ancient", 4 * HOUR_S)

    report = gc(cat, grace_s=HOUR_S)

    assert report.deleted == [ancient] and report.kept_recent == 1
    assert cat.store.exists(object_key(recent))
    assert os.path.exists(recent_tmp) and not os.path.exists(ancient_tmp)
