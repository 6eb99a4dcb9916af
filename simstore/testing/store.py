"""Conformance suite for ``ObjectStore`` implementations.

Subclass :class:`ObjectStoreTests`, provide a ``store`` fixture returning a fresh, empty,
writable store, and the back-door hooks ``raw_get``/``raw_put`` that bypass the API under
test (to check that the API writes what it says and reads what is there).
"""

from __future__ import annotations

import pickle
import threading
import time
from typing import Any

import pytest

from simstore.errors import (
    ConflictError,
    FormatError,
    InvalidInputError,
    NotFoundError,
    ReadOnlyError,
    SimstoreError,
)
from simstore.hashing import hash_bytes
from simstore.storage import ObjectStore, open_store

__all__ = ["ObjectStoreTests"]


class ObjectStoreTests:
    """Behaviour every ObjectStore must show. Subclasses supply fixtures."""

    @pytest.fixture
    def store(self) -> ObjectStore:  # pragma: no cover - overridden
        raise NotImplementedError

    def raw_get(self, store: ObjectStore, key: str) -> bytes:  # pragma: no cover
        raise NotImplementedError

    def raw_put(self, store: ObjectStore, key: str, data: bytes) -> None:  # pragma: no cover
        raise NotImplementedError

    def read_only_copy(self, store: ObjectStore) -> ObjectStore:
        """A read-only view of the same store (override when the URL is not enough)."""
        opts: Any = getattr(store, "storage_options", None)
        return open_store(store.url, storage_options=opts, read_only=True)

    # -- get / put ---------------------------------------------------------------------
    def test_put_then_get(self, store: ObjectStore) -> None:
        store.put("a/b/c", b"hello")
        assert store.get("a/b/c") == b"hello"
        assert self.raw_get(store, "a/b/c") == b"hello"

    def test_get_reads_backdoor_writes(self, store: ObjectStore) -> None:
        self.raw_put(store, "x/y", b"raw bytes")
        assert store.get("x/y") == b"raw bytes"

    def test_put_overwrites(self, store: ObjectStore) -> None:
        store.put("k", b"one")
        store.put("k", b"two")
        assert store.get("k") == b"two"

    def test_empty_object(self, store: ObjectStore) -> None:
        store.put("empty", b"")
        assert store.get("empty") == b""
        assert store.exists("empty")

    def test_byte_range(self, store: ObjectStore) -> None:
        data = bytes(range(256)) * 10
        store.put("r", data)
        assert store.get("r", byte_range=(10, 20)) == data[10:20]
        assert store.get("r", byte_range=(0, len(data))) == data
        assert store.get("r", byte_range=(2550, 2560)) == data[2550:2560]

    def test_max_bytes_refuses_a_larger_object(self, store: ObjectStore) -> None:
        store.put("small", b"0123456789")
        store.put("empty", b"")
        assert store.get("small", max_bytes=10) == b"0123456789"
        assert store.get("small", max_bytes=1000) == b"0123456789"
        assert store.get("empty", max_bytes=0) == b""
        with pytest.raises(FormatError, match="small.*more than the 9 "):
            store.get("small", max_bytes=9)
        with pytest.raises(NotFoundError, match="gone"):
            store.get("gone", max_bytes=9)
        # a range is read as asked: the bound is for whole objects
        assert store.get("small", byte_range=(2, 8), max_bytes=1) == b"234567"

    def test_max_bytes_keeps_the_version_token(self, store: ObjectStore) -> None:
        version = store.compare_and_swap("ref", None, b"1234")
        assert store.get_versioned("ref", max_bytes=4) == (b"1234", version)
        with pytest.raises(FormatError, match="ref.*more than the 3 "):
            store.get_versioned("ref", max_bytes=3)
        assert store.compare_and_swap("ref", version, b"5678") is not None

    def test_missing_raises_not_found_naming_key(self, store: ObjectStore) -> None:
        with pytest.raises(NotFoundError, match="no/such/key"):
            store.get("no/such/key")
        assert not store.exists("no/such/key")
        with pytest.raises(NotFoundError):
            store.info("no/such/key")

    def test_invalid_keys_refused(self, store: ObjectStore) -> None:
        for key in ["", "/abs", "a/../b", "a//b", "a/./b", "nul\x00", "back\\slash"]:
            with pytest.raises(InvalidInputError):
                store.put(key, b"x")

    # -- put_if_absent / put_file ------------------------------------------------------
    def test_put_if_absent(self, store: ObjectStore) -> None:
        assert store.put_if_absent("obj", b"first") is True
        assert store.put_if_absent("obj", b"second") is False
        assert store.get("obj") == b"first"

    def test_put_if_absent_refreshes_mtime(self, store: ObjectStore) -> None:
        store.put_if_absent("obj", b"data")
        before = store.info("obj").mtime
        time.sleep(1.1)
        store.put_if_absent("obj", b"data")
        assert store.info("obj").mtime > before

    def test_refresh_moves_mtime_and_reports_absence(self, store: ObjectStore) -> None:
        refresh = getattr(store, "refresh", None)
        assert callable(refresh), "a store of simstore's own offers refresh"
        assert refresh("nothing/here") is False
        store.put("obj", b"data")
        before = store.info("obj").mtime
        time.sleep(1.1)
        assert refresh("obj") is True
        assert store.info("obj").mtime > before
        assert store.get("obj") == b"data"

    def test_put_file(self, store: ObjectStore, tmp_path: Any) -> None:
        src = tmp_path / "src.bin"
        src.write_bytes(b"file body" * 1000)
        assert store.put_file("files/one", str(src)) is True
        assert store.get("files/one") == b"file body" * 1000
        assert store.put_file("files/one", str(src)) is False

    def test_concurrent_put_if_absent_one_winner(self, store: ObjectStore) -> None:
        results: list[bool] = []
        lock = threading.Lock()

        def worker(i: int) -> None:
            won = store.put_if_absent("race", f"writer {i}".encode())
            with lock:
                results.append(won)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results.count(True) == 1
        assert store.get("race").startswith(b"writer ")

    # -- compare and swap --------------------------------------------------------------
    def test_cas_create_update_delete(self, store: ObjectStore) -> None:
        v1 = store.compare_and_swap("ref", None, b"1")
        assert v1 is not None
        data, version = store.get_versioned("ref")
        assert data == b"1" and version == v1
        v2 = store.compare_and_swap("ref", v1, b"2")
        assert store.get("ref") == b"2"
        with pytest.raises(ConflictError, match="ref"):
            store.compare_and_swap("ref", v1, b"3")
        assert store.get("ref") == b"2"
        assert store.compare_and_swap("ref", v2, None) is None
        assert not store.exists("ref")

    def test_cas_create_conflicts_when_present(self, store: ObjectStore) -> None:
        store.compare_and_swap("ref", None, b"1")
        with pytest.raises(ConflictError):
            store.compare_and_swap("ref", None, b"2")
        assert store.get("ref") == b"1"

    def test_cas_concurrent_increments_lose_nothing(self, store: ObjectStore) -> None:
        store.compare_and_swap("counter", None, b"0")
        n_threads, n_incs = 4, 10

        def worker() -> None:
            done = 0
            while done < n_incs:
                data, version = store.get_versioned("counter")
                try:
                    store.compare_and_swap("counter", version, str(int(data) + 1).encode())
                    done += 1
                except ConflictError:
                    continue

        threads = [threading.Thread(target=worker) for _ in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert int(store.get("counter")) == n_threads * n_incs

    # -- listing, delete, info ---------------------------------------------------------
    def test_list_prefix(self, store: ObjectStore) -> None:
        for key in ["p/a", "p/b/c", "q/a", "pz"]:
            store.put(key, key.encode())
        assert sorted(store.list("p/")) == ["p/a", "p/b/c"]
        assert sorted(store.list("p")) == ["p/a", "p/b/c", "pz"]
        assert sorted(store.list("")) == ["p/a", "p/b/c", "pz", "q/a"]
        assert list(store.list("nothing/")) == []

    def test_list_info_sizes(self, store: ObjectStore) -> None:
        store.put("s/one", b"1")
        store.put("s/three", b"333")
        infos = {i.key: i.size_bytes for i in store.list_info("s/")}
        assert infos == {"s/one": 1, "s/three": 3}
        assert store.info("s/three").size_bytes == 3

    def test_delete(self, store: ObjectStore) -> None:
        store.put("d", b"x")
        store.delete("d")
        assert not store.exists("d")
        store.delete("d")  # missing is fine

    # -- pickling and read-only --------------------------------------------------------
    def test_pickle_round_trip(self, store: ObjectStore) -> None:
        store.put("pk", b"pickled")
        clone = pickle.loads(pickle.dumps(store))
        assert clone.get("pk") == b"pickled"
        clone.put("pk2", b"from clone")
        assert store.get("pk2") == b"from clone"

    def test_read_only_refuses_writes(self, store: ObjectStore) -> None:
        store.put("ro", b"x")
        ro = self.read_only_copy(store)
        assert ro.get("ro") == b"x"
        for op in (
            lambda: ro.put("ro2", b"y"),
            lambda: ro.put_if_absent("ro3", b"y"),
            lambda: ro.compare_and_swap("ro4", None, b"y"),
            lambda: ro.delete("ro"),
        ):
            with pytest.raises(ReadOnlyError):
                op()
        assert store.get("ro") == b"x"

    def test_errors_are_simstore_errors_and_pickle(self, store: ObjectStore) -> None:
        with pytest.raises(SimstoreError) as info:
            store.get("missing")
        clone = pickle.loads(pickle.dumps(info.value))
        assert type(clone) is type(info.value) and str(clone) == str(info.value)

    def test_content_addressed_roundtrip(self, store: ObjectStore) -> None:
        data = b"content" * 100
        key = f"objects/{hash_bytes(data)[:2]}/{hash_bytes(data)}"
        store.put_if_absent(key, data)
        assert hash_bytes(store.get(key)) == hash_bytes(data)
