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
