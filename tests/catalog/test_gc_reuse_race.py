"""gc against a writer that reuses the object it is deleting, at every step of the delete.

An ingest that writes bytes already stored (a shard of an earlier, abandoned run) finds the
object present, refreshes its time and commits a snapshot that references it. gc deletes
only objects older than its grace period, so the refresh must keep the object, wherever
between gc's check of the time and its delete the writer comes. Each test forces one
interleaving by running the writer from inside the step named.
"""

import os
import time

import pytest
from catalog_helpers import stage_samples

from simstore.catalog import Catalog, gc, verify
from simstore.hashing import object_key
from simstore.storage import LocalStore
from simstore.storage import _local as local_module

PAYLOAD = b"the bytes of a shard an abandoned ingest left behind"


def _old_object(cat, payload=PAYLOAD):
    """An unreachable object last written two hours ago; its id and its path."""
    oid, _ = cat.put_object(payload)
    path = os.path.join(cat.store.root, object_key(oid))
    then = time.time() - 7200
    os.utime(path, (then, then))
    return oid, path


def _reuse_and_commit(root):
    """A concurrent writer: stages a sample whose shard is PAYLOAD, and commits it."""
    writer = Catalog.open(root)
    stage_samples(writer, "ds", {"b": PAYLOAD})
    return writer.commit("ds", message="reuses the old shard").snapshot_id


@pytest.fixture
def store_cat(tmp_path):
    cat = Catalog.init(LocalStore(str(tmp_path / "s")))
    stage_samples(cat, "ds", {"a": b"A"})
    cat.commit("ds", message="one")
    return cat


def _hook(monkeypatch, name, when, action):
    """Run ``action`` once, right after (``when="after"``) or before os.<name> on a match."""
    real = getattr(os, name)
    done = []

    def hooked(*args, **kwargs):
        if when == "before" and not done and action.matches(args):
            done.append(action())
        result = real(*args, **kwargs)
        if when == "after" and not done and action.matches(args):
            done.append(action())
        return result

    monkeypatch.setattr(os, name, hooked)
    return done


def _gc_before_the_refresh(monkeypatch, store, key, path):
    """gc removes the object between a writer's check that it is present and its refresh."""
    def gc_now():
        return store.delete_unless_since(key, time.time() - 3600)

    return _hook(monkeypatch, "utime", "before",
                 _Action(gc_now, lambda args: bool(args) and args[0] == path))


class _Action:
    def __init__(self, fn, matches):
        self._fn, self.matches = fn, matches

    def __call__(self):
        return self._fn()


def test_a_writer_that_reuses_the_object_after_gc_set_it_aside_writes_it_again(
    monkeypatch, store_cat
):
    root = store_cat.store.root
    oid, path = _old_object(store_cat)
    # the writer comes right after gc renamed the object aside, before gc reads its time
    action = _Action(lambda: _reuse_and_commit(root),
                     lambda args: len(args) == 2 and args[0] == path)
    done = _hook(monkeypatch, "rename", "after", action)
    report = gc(Catalog.open(root), grace_s=3600)
    monkeypatch.undo()
    assert done, "the interleaving was not reached"
    assert os.path.isfile(path)  # written again by the writer
    assert verify(Catalog.open(root), "ds", deep=True).ok
    assert oid in report.deleted  # the old copy went; the writer's stays


def test_a_writer_that_refreshes_the_object_before_gc_reads_its_time_keeps_it(
    monkeypatch, store_cat
):
    root = store_cat.store.root
    oid, path = _old_object(store_cat)
    aside = []

    def matches(args):
        # gc's read of the time of the object it set aside
        return bool(args) and isinstance(args[0], str) and os.path.basename(
            args[0]).startswith(f"{local_module.TMP_PREFIX}gc-") and not aside

    def writer():
        aside.append(True)
        # the writer found the object just before the rename and refreshes it now: here
        # that lands on the file set aside (same inode)
        for name in os.listdir(os.path.dirname(path)):
            if name.startswith(f"{local_module.TMP_PREFIX}gc-"):
                os.utime(os.path.join(os.path.dirname(path), name))
        return True

    done = _hook(monkeypatch, "stat", "before", _Action(writer, matches))
    report = gc(Catalog.open(root), grace_s=3600)
    monkeypatch.undo()
    assert done, "the interleaving was not reached"
    assert os.path.isfile(path)  # put back
    assert oid not in report.deleted
    assert not [n for n in os.listdir(os.path.dirname(path))
                if n.startswith(local_module.TMP_PREFIX)]


def test_a_writer_whose_refresh_finds_the_object_gone_writes_it_again(
    monkeypatch, store_cat
):
    store = store_cat.store
    oid, path = _old_object(store_cat)
    key = object_key(oid)
    done = _gc_before_the_refresh(monkeypatch, store, key, path)
    written = store.put_if_absent(key, PAYLOAD)
    monkeypatch.undo()
    assert done == ["deleted"]
    assert written is True  # not counted as present: it was gone
    assert os.path.isfile(path)
    with open(path, "rb") as f:
        assert f.read() == PAYLOAD


def test_move_file_whose_refresh_finds_the_object_gone_links_it_again(
    monkeypatch, store_cat, tmp_path
):
    store = store_cat.store
    oid, path = _old_object(store_cat)
    key = object_key(oid)
    scratch = os.path.join(store.scratch_dir(), "shard")
    with open(scratch, "wb") as f:
        f.write(PAYLOAD)
    done = _gc_before_the_refresh(monkeypatch, store, key, path)
    moved = store.move_file(key, scratch)
    monkeypatch.undo()
    assert done == ["deleted"]
    assert moved is True
    with open(path, "rb") as f:
        assert f.read() == PAYLOAD
    assert not os.path.exists(scratch)


def test_delete_unless_since_keeps_recent_and_says_what_it_did(store_cat):
    store = store_cat.store
    oid, path = _old_object(store_cat)
    key = object_key(oid)
    assert store.delete_unless_since(key, time.time() - 10_000) == "recent"
    assert os.path.isfile(path)
    assert store.delete_unless_since(key, time.time() - 3600) == "deleted"
    assert not os.path.exists(path)
    assert store.delete_unless_since(key, time.time() - 3600) == "gone"
    assert not [n for n in os.listdir(os.path.dirname(path))
                if n.startswith(local_module.TMP_PREFIX)]


class _Killed(BaseException):
    """gc's process dying where the hook raises it (nothing after it runs)."""


def test_an_object_a_killed_gc_left_aside_is_put_back_by_the_next(monkeypatch, store_cat):
    # was open in reliability.md: a writer reused the object just before gc set it aside,
    # gc died before it read the time there, and the writer's snapshot named an object
    # that stayed aside (only swept later as a temporary file)
    root = store_cat.store.root
    oid, path = _old_object(store_cat)

    def die():
        raise _Killed

    def set_aside(args):
        return bool(args) and isinstance(args[0], str) and os.path.basename(
            args[0]).startswith(f"{local_module.TMP_PREFIX}gc-")

    _hook(monkeypatch, "stat", "before", _Action(die, set_aside))
    with pytest.raises(_Killed):
        gc(Catalog.open(root), grace_s=3600)
    monkeypatch.undo()
    assert not os.path.exists(path)
    [aside] = [n for n in os.listdir(os.path.dirname(path)) if n.startswith(".tmp-gc-")]
    assert aside.endswith(f"-{oid}")  # named after the object it holds
    sid = _reuse_and_commit(root)  # the writer had found it (its refresh landed before)
    os.rename(os.path.join(os.path.dirname(path), aside), path)  # (as the writer saw it)
    os.rename(path, os.path.join(os.path.dirname(path), aside))  # the kill's state again
    assert not verify(Catalog.open(root), f"ds@{sid}", deep=True).ok  # missing meanwhile

    report = gc(Catalog.open(root), grace_s=0)  # a later gc, the aside long settled
    assert report.restored == []  # a live gc's aside is left alone...
    monkeypatch.setattr(local_module, "ASIDE_SETTLED_S", 0.0)
    report = gc(Catalog.open(root), grace_s=3600)  # ...a settled one is put back
    assert report.restored == [object_key(oid)]
    assert os.path.isfile(path) and oid not in report.deleted
    assert verify(Catalog.open(root), f"ds@{sid}", deep=True).ok
    assert report.to_json()["restored"] == [object_key(oid)]
