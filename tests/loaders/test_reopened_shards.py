"""A Zarr shard opened again in a later epoch starts from what its last reader learnt.

A trusted reader (its file hashed to the shard's id) leaves its parsed directory and
metadata in the process's kept indexes when it closes; the next reader of a trusted file
with that id starts from them, reading no directory and no sample's ``zarr.json`` again.
The samples are the same either way; an untrusted file, ``verify=False`` or a caller's
``shard_opener`` never uses one, and the kept indexes stay within their byte budget.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from loader_helpers import snapshot_shards, write_npz_sources
from simstore.formats import _zarr
from simstore.formats._zarr import ZarrShardReader
from simstore.loaders import SimDataLoader, SimDataset, _indexes
from simstore.loaders._opener import FormatOpener

from simstore.catalog import Catalog
from simstore.errors import IntegrityError
from simstore.ingest import ingest


@pytest.fixture(scope="module")
def zarr_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, np.ndarray]]:
    """24 samples of 8 KiB in several uncompressed Zarr shards."""
    src = str(tmp_path_factory.mktemp("src"))
    values = write_npz_sources(src, 24, seed=4)
    store = str(tmp_path_factory.mktemp("store") / "s")
    Catalog.init(store)
    ingest([src], dataset="d", store=store, format="zarr", compression="none",
           shard_size=60_000, snapshot=True)
    return store, values


def _shard_path(store: str, shard: str) -> str:
    return os.path.join(store, "objects", shard[:2], shard)


def _epochs(ds: SimDataset, n: int, workers: int = 0) -> list[tuple[dict[str, np.ndarray], dict]]:
    """(samples by key, stats so far) after each of ``n`` epochs of one loader."""
    extra = {"persistent_workers": True, "multiprocessing_context": "fork"} if workers else {}
    loader = SimDataLoader(ds, batch_size=4, num_workers=workers, **extra)
    out = []
    for e in range(n):
        ds.set_epoch(e)
        seen: dict[str, np.ndarray] = {}
        for batch in loader:
            for key, value in zip(batch["__key__"], batch["u"], strict=True):
                seen[key] = value.numpy().copy()
        out.append((seen, ds.stats()))
    return out


def _same(seen: dict[str, np.ndarray], values: dict[str, np.ndarray]) -> None:
    assert seen.keys() == values.keys()
    for key, value in values.items():
        np.testing.assert_array_equal(seen[key], value)


@pytest.mark.parametrize("workers", [0, 2])
def test_later_epochs_reopen_every_shard_from_its_index(zarr_store, workers):
    store, values = zarr_store
    shards = snapshot_shards(store)
    assert len(shards) > 2
    (first, st1), (second, st2), (third, st3) = _epochs(
        SimDataset(store, "d", seed=1), 3, workers)
    assert st1["shards_reopened"] == 0
    # every shard's reader of the first epoch was trusted by its close: each worker
    # reopens the shards it reads again
    assert st2["shards_reopened"] >= len(shards)
    assert st3["shards_reopened"] - st2["shards_reopened"] >= len(shards)
    for seen in (first, second, third):
        _same(seen, values)


def test_a_reopened_reader_reads_no_directory_and_no_metadata(zarr_store, monkeypatch):
    store, _ = zarr_store
    path = _shard_path(store, snapshot_shards(store)[0])
    reader = ZarrShardReader(path)
    want = list(reader.read(range(reader.num_samples)))
    assert reader.take_index() is None  # not trusted: it checks its pages
    reader.trust()
    index = reader.take_index()
    reader.close()
    assert index is not None and index.nbytes > 0

    def no_directory(*args: object) -> None:
        raise AssertionError("the directory was read again")

    reads: list[str] = []
    small = ZarrShardReader._small_entry

    def counted(self: ZarrShardReader, key: str) -> bytes | None:
        reads.append(key)
        return small(self, key)

    monkeypatch.setattr(_zarr._zip, "zip_index", no_directory)
    monkeypatch.setattr(ZarrShardReader, "_small_entry", counted)
    again = index.reopen(path)
    try:
        assert not again.verifies_pages
        got = list(again.read(range(again.num_samples)))
    finally:
        again.close()
    assert not [k for k in reads if k.endswith("zarr.json")]
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a.keys() == b.keys()
        np.testing.assert_array_equal(a["u"], b["u"])
        assert a["p"] == b["p"]


def test_an_index_of_another_size_is_not_used(zarr_store, tmp_path):
    store, _ = zarr_store
    a, b = snapshot_shards(store)[:2]
    first = ZarrShardReader(_shard_path(store, a))
    first.trust()
    list(first.read(range(first.num_samples)))
    index = first.take_index()
    first.close()
    assert index is not None
    other = _shard_path(store, b)
    assert os.path.getsize(other) != index.file_size
    reader = index.reopen(other)  # parsed from its own file
    try:
        assert reader.keys() == _keys_read_afresh(other)
    finally:
        reader.close()


def _keys_read_afresh(path: str) -> list[str]:
    reader = ZarrShardReader(path)
    try:
        return reader.keys()
    finally:
        reader.close()


def test_untrusted_or_unverified_reads_keep_no_index(zarr_store):
    store, values = zarr_store
    (seen, st), = _epochs(SimDataset(store, "d", seed=1, verify=False), 1)
    _same(seen, values)
    assert len(_indexes.INDEXES) == 0
    (_, st), (_, st2) = _epochs(SimDataset(store, "d", seed=1, verify=False), 2)
    assert st2["shards_reopened"] == 0


def test_a_callers_shard_opener_gets_no_kept_index(zarr_store):
    store, values = zarr_store
    opened: list[str] = []

    class Opener(FormatOpener):
        def __call__(self, source):  # type: ignore[no-untyped-def]
            opened.append(source)
            return super().__call__(source)

    first, second = _epochs(SimDataset(store, "d", seed=1, shard_opener=Opener()), 2)
    _same(second[0], values)
    assert second[1]["shards_reopened"] == 0
    assert len(opened) >= 2 * len(snapshot_shards(store))
    assert len(_indexes.INDEXES) == 0


def test_a_shard_changed_since_its_index_is_hashed_and_refused(zarr_store, tmp_path):
    import shutil

    store, values = zarr_store
    copy = str(tmp_path / "copy")
    shutil.copytree(store, copy)
    shards = snapshot_shards(copy)
    ds = SimDataset(copy, "d", seed=1)
    loader = SimDataLoader(ds, batch_size=4)
    _same({k: v.numpy().copy() for b in loader for k, v in zip(b["__key__"], b["u"],
                                                                  strict=True)}, values)
    assert len(_indexes.INDEXES) == len(shards)
    victim = _shard_path(copy, shards[0])
    os.chmod(victim, 0o644)
    with open(victim, "r+b") as f:  # the first sample's metadata: damage no index covers
        data = f.read()
        at = data.index(b'"node_type"')
        f.seek(at)
        f.write(b'"NODE_TYPE"')
    ds.set_epoch(1)
    with pytest.raises(IntegrityError, match=f"{shards[0]}.*has hash"):
        list(loader)


def test_an_index_counts_the_string_fields_it_holds(tmp_path):
    # a sample's group zarr.json holds its strings whole: 60 of 20,000 characters here,
    # five times what the per-entry estimate alone would say the index holds
    src = tmp_path / "src"
    src.mkdir()
    for t in range(60):
        np.savez(src / f"t{t:02d}.npz", u=np.full(4, t, np.float32),
                 s=np.array(f"{t:05d}" * 4000))
    store = str(tmp_path / "store")
    Catalog.init(store)
    ingest([str(src)], dataset="d", store=store, format="zarr", compression="none",
           snapshot=True)
    ds = SimDataset(store, "d", seed=1)
    loader = SimDataLoader(ds, batch_size=8)
    for e in range(2):  # the second epoch's readers were trusted from the start
        ds.set_epoch(e)
        assert sum(len(b["__key__"]) for b in loader) == 60
    assert len(_indexes.INDEXES) >= 1
    assert _indexes.INDEXES.nbytes >= 60 * 20_000


def test_kept_indexes_stay_within_their_budget():
    class Index:
        def __init__(self, nbytes: int) -> None:
            self.nbytes = nbytes

        def reopen(self, path: str) -> None:
            return None

    cache = _indexes.IndexCache(budget=100)
    cache.keep("a", Index(40))
    cache.keep("b", Index(40))
    assert cache.nbytes == 80 and len(cache) == 2
    cache.keep("c", Index(40))  # over the budget: the least recently kept goes
    assert cache.take("a") is None and cache.nbytes == 80
    cache.keep("huge", Index(101))  # larger than the whole budget: not kept
    assert cache.take("huge") is None and cache.nbytes == 80
    got = cache.take("b")
    assert got is not None and got.nbytes == 40
    assert cache.take("b") is None  # taken out while a reader uses it
    assert cache.nbytes == 40 and len(cache) == 1
    cache.keep("c", Index(10))  # kept again: replaces its old entry
    assert cache.nbytes == 10 and len(cache) == 1
