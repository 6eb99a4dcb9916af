import os
import uuid

import fsspec
import pytest

from simstore.storage import FsspecStore, LocalStore, ObjectStore
from simstore.testing import ObjectStoreTests


class TestLocalStore(ObjectStoreTests):
    @pytest.fixture
    def store(self, tmp_path) -> ObjectStore:
        return LocalStore(str(tmp_path / "store"))

    def raw_get(self, store, key):
        with open(os.path.join(store.root, *key.split("/")), "rb") as f:
            return f.read()

    def raw_put(self, store, key, data):
        path = os.path.join(store.root, *key.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)

    def test_no_temporary_files_left(self, store):
        store.put("a/b", b"1")
        store.put_if_absent("a/c", b"2")
        store.compare_and_swap("a/d", None, b"3")
        names = [n for _, _, files in os.walk(store.root) for n in files]
        assert not [n for n in names if n.startswith(".tmp-")]

    def test_local_path(self, store):
        store.put("lp", b"x")
        path = store.local_path("lp")
        assert path is not None
        with open(path, "rb") as f:
            assert f.read() == b"x"
        assert store.local_path("missing") is None


class TestMemoryStore(ObjectStoreTests):
    @pytest.fixture
    def store(self) -> ObjectStore:
        return FsspecStore(f"memory://test-{uuid.uuid4().hex}")

    def raw_get(self, store, key):
        return fsspec.filesystem("memory").cat_file(f"{store.root}/{key}")

    def raw_put(self, store, key, data):
        fsspec.filesystem("memory").pipe_file(f"{store.root}/{key}", data)


def test_local_move_file_links_without_copy(tmp_path):
    store = LocalStore(str(tmp_path / "store"))
    scratch = store.scratch_dir()
    src = os.path.join(scratch, "shard.tmp")
    with open(src, "wb") as f:
        f.write(b"shard bytes")
    inode = os.stat(src).st_ino
    assert store.move_file("objects/ab/x", src) is True
    assert not os.path.exists(src)
    assert os.stat(store.local_path("objects/ab/x")).st_ino == inode  # linked, not copied
    again = os.path.join(scratch, "again.tmp")
    with open(again, "wb") as f:
        f.write(b"shard bytes")
    assert store.move_file("objects/ab/x", again) is False
    assert not os.path.exists(again)
    assert store.get("objects/ab/x") == b"shard bytes"
    assert list(store.list("")) == ["objects/ab/x"]  # scratch is not listed


def test_local_stale_scratch_is_temporary(tmp_path):
    import time

    store = LocalStore(str(tmp_path / "store"))
    work = os.path.join(store.scratch_dir(), "simstore-ingest-killed")
    os.makedirs(work)
    with open(os.path.join(work, "0.parquet"), "wb") as f:
        f.write(b"partial")
    assert list(store.list_temporary(time.time() - 3600)) == []
    assert list(store.list_temporary(time.time() + 1)) == [work]
