"""Ranged reads without a cache: a large read uses the cached blocks at its ends.

A Zarr shard's small reads (a sample's metadata, a zip header) pull in the aligned block
around them; the sample's chunk read after them was fetched again in full, so a Zarr
store read without a cache fetched each sample's bytes about twice.
"""

from __future__ import annotations

import os

import numpy as np
from loader_helpers import RemoteLikeStore
from simstore.loaders import SimDataset
from simstore.loaders._fetch import RangedFile, RateLimiter
from simstore.loaders._ranged import RangeBlocks
from simstore.loaders._stats import Counters

from simstore.catalog import Catalog
from simstore.ingest import ingest
from simstore.storage import LocalStore

BLOCK = 1 << 20


class CountingStore(LocalStore):
    def __init__(self, root: str) -> None:
        super().__init__(root, fsync=False)
        self.ranges: list[tuple[int, int] | None] = []

    def get(
        self, key: str, byte_range: tuple[int, int] | None = None, *,
        max_bytes: int | None = None,
    ) -> bytes:
        self.ranges.append(byte_range)
        return super().get(key, byte_range, max_bytes=max_bytes)


def _file(tmp_path):
    store = CountingStore(str(tmp_path / "s"))
    data = np.random.default_rng(1).integers(0, 256, 5 * BLOCK + 123, np.uint8).tobytes()
    store.put("obj", data)
    f = RangedFile(store, "obj", len(data), counters=Counters(), limiter=RateLimiter(None),
                   block_bytes=BLOCK)
    return store, f, data


def _read(f, start, end):
    f.seek(start)
    return f.read(end - start)


def test_a_large_read_fetches_only_what_the_cached_blocks_at_its_ends_lack(tmp_path):
    store, f, data = _file(tmp_path)
    assert _read(f, 100, 200) == data[100:200]  # pulls block 0
    assert store.ranges == [(0, BLOCK)]
    assert _read(f, 150, 3 * BLOCK + 500) == data[150 : 3 * BLOCK + 500]
    assert store.ranges[1:] == [(BLOCK, 3 * BLOCK + 500)]  # block 0 not fetched again
    store.ranges.clear()
    assert _read(f, 4 * BLOCK + 10, 4 * BLOCK + 20) == data[4 * BLOCK + 10 : 4 * BLOCK + 20]
    assert _read(f, 2 * BLOCK, 4 * BLOCK + 7) == data[2 * BLOCK : 4 * BLOCK + 7]
    assert store.ranges == [(4 * BLOCK, 5 * BLOCK), (2 * BLOCK, 4 * BLOCK)]  # block 4's end
    store.ranges.clear()
    # held at both ends: only what lies between; held whole: nothing
    assert _read(f, 50, 4 * BLOCK + 900) == data[50 : 4 * BLOCK + 900]
    assert store.ranges == [(BLOCK, 4 * BLOCK)]
    store.ranges.clear()
    assert _read(f, 0, BLOCK) == data[:BLOCK]
    assert store.ranges == []


def test_the_objects_short_last_block_serves_a_read_to_its_end(tmp_path):
    store, f, data = _file(tmp_path)
    assert _read(f, 5 * BLOCK + 3, 5 * BLOCK + 9) == data[5 * BLOCK + 3 : 5 * BLOCK + 9]
    assert _read(f, 4 * BLOCK - 5, len(data)) == data[4 * BLOCK - 5 :]
    assert store.ranges == [(5 * BLOCK, len(data)), (4 * BLOCK - 5, 5 * BLOCK)]


def test_a_large_read_with_no_block_held_is_one_exact_request(tmp_path):
    store, f, data = _file(tmp_path)
    assert _read(f, 77, 2 * BLOCK + 5) == data[77 : 2 * BLOCK + 5]
    assert store.ranges == [(77, 2 * BLOCK + 5)]


def test_a_zarr_store_read_without_a_cache_fetches_its_bytes_about_once(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(2)
    for i in range(12):
        np.savez(src / f"run{i:02d}.npz",
                 big=rng.standard_normal((256, 1024)).astype(np.float32),  # 1 MiB, one chunk
                 u=rng.standard_normal(1000).astype(np.float32))
    root = str(tmp_path / "store")
    cat = Catalog.init(root)
    ingest([src], dataset="d", store=cat, format="zarr", compression="none", snapshot=True,
           shard_size=4 << 20)
    stored = sum(os.path.getsize(os.path.join(d, n))
                 for d, _, names in os.walk(os.path.join(root, "objects")) for n in names)
    ds = SimDataset(RemoteLikeStore(root), "d", shuffle=False, verify=False)
    got = {s["__key__"]: s["big"].numpy() for s in ds}
    assert len(got) == 12
    fetched = ds.stats()["tiers"]["fake-remote"]["bytes"]
    # the shards, the manifest and the snapshot's objects, each about once (it was 1.9x)
    assert fetched <= 1.1 * stored, (fetched, stored)


# -- the blocks kept for all the ranged files of a source -------------------------------

def test_the_files_of_a_source_share_their_blocks_within_one_budget(tmp_path):
    store = CountingStore(str(tmp_path / "s"))
    data = {k: os.urandom(4 * BLOCK) for k in ("a", "b")}
    for k, v in data.items():
        store.put(k, v)
    blocks = RangeBlocks(3 * BLOCK)

    def ranged(key: str) -> RangedFile:
        return RangedFile(store, key, 4 * BLOCK, counters=Counters(),
                          limiter=RateLimiter(None), block_bytes=BLOCK, blocks=blocks)

    a1, a2, b = ranged("a"), ranged("a"), ranged("b")
    assert _read(a1, 10, 20) == data["a"][10:20]
    assert _read(a2, 30, 40) == data["a"][30:40]  # the same object's block: no request
    assert store.ranges == [(0, BLOCK)]
    assert _read(b, BLOCK + 5, BLOCK + 9) == data["b"][BLOCK + 5 : BLOCK + 9]
    assert _read(b, 2 * BLOCK + 5, 2 * BLOCK + 9) == data["b"][2 * BLOCK + 5 : 2 * BLOCK + 9]
    assert blocks.nbytes == 3 * BLOCK
    assert _read(b, 3 * BLOCK + 5, 3 * BLOCK + 9) == data["b"][3 * BLOCK + 5 : 3 * BLOCK + 9]
    assert blocks.nbytes == 3 * BLOCK  # a's block, the least recently used, went
    store.ranges.clear()
    assert _read(a1, 50, 60) == data["a"][50:60]
    assert store.ranges == [(0, BLOCK)]


def test_a_shuffled_epoch_of_one_large_zarr_shard_fetches_it_about_once(tmp_path):
    # 640 samples of 64 KiB: one 40 MiB shard, shuffled uniformly (one buffer of blocks);
    # with 32 MiB of blocks per file, an epoch fetched it 3.2x
    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(3)
    for i in range(640):
        np.save(src / f"s{i:03d}.npy", rng.standard_normal(16384).astype(np.float32))
    root = str(tmp_path / "store")
    cat = Catalog.init(root)
    ingest([src], dataset="d", store=cat, format="zarr", compression="none", snapshot=True,
           shard_size=64 << 20)
    (shard,) = [os.path.join(d, n) for d, _, names in os.walk(os.path.join(root, "objects"))
                for n in names if os.path.getsize(os.path.join(d, n)) > 32 << 20]
    ds = SimDataset(RemoteLikeStore(root), "d", shuffle=True, seed=1, verify=False)
    assert sum(1 for _ in ds) == 640
    st = ds.stats()
    fetched = st["tiers"]["fake-remote"]["bytes"] - st["manifest_bytes"]
    assert fetched <= 1.1 * os.path.getsize(shard), (fetched, os.path.getsize(shard))


# -- a Zarr sample's entries fetched in one request ---------------------------------------

def test_will_read_fetches_an_extent_once_for_the_reads_inside_it(tmp_path):
    store, f, data = _file(tmp_path)
    f.will_read(100, 2 * BLOCK + 100)
    assert store.ranges == [(100, 2 * BLOCK + 100)]
    for lo, hi in ((100, 130), (BLOCK, BLOCK + 7), (300, 2 * BLOCK + 100)):
        assert _read(f, lo, hi) == data[lo:hi]
    assert len(store.ranges) == 1  # all served from the extent
    assert _read(f, 2 * BLOCK + 50, 2 * BLOCK + 150) == data[2 * BLOCK + 50 : 2 * BLOCK + 150]
    assert len(store.ranges) == 2  # past its end: the usual way
    f.done_reading()
    store.ranges.clear()
    assert _read(f, 3 * BLOCK + 100, 3 * BLOCK + 130) == data[3 * BLOCK + 100 : 3 * BLOCK + 130]
    assert store.ranges == [(3 * BLOCK, 4 * BLOCK)]
    store.ranges.clear()
    f.will_read(10, 1000)  # under a block: left to the blocks, which hold its neighbours too
    assert store.ranges == []


def test_a_zarr_sample_read_without_a_cache_is_one_request(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(4)
    for i in range(8):
        np.savez(src / f"run{i}.npz", x=rng.standard_normal((4, 64, 64, 64)).astype(np.float32),
                 t=np.float64(i))  # 4 MiB: four chunks of 1 MiB
    root = str(tmp_path / "store")
    cat = Catalog.init(root)
    ingest([src], dataset="d", store=cat, format="zarr", compression="none", snapshot=True,
           shard_size=64 << 20)
    class Counted(RemoteLikeStore):
        ranged = 0

        def get(self, key, byte_range=None, *, max_bytes=None):  # type: ignore[no-untyped-def]
            Counted.ranged += byte_range is not None
            return super().get(key, byte_range, max_bytes=max_bytes)

    ds = SimDataset(Counted(root), "d", shuffle=True, seed=2, verify=False)
    got = {s["__key__"]: s["x"].numpy() for s in ds}
    assert len(got) == 8
    # the shard's head and directory to open it, then one request per sample (it was
    # seven or eight: the block its metadata lies in, then each chunk)
    assert Counted.ranged == 2 + 8
    with np.load(src / "run3.npz") as z:
        np.testing.assert_array_equal(got["run3"], z["x"])


def _zarr_runs(tmp_path, n: int = 6) -> str:
    """A shard of ``n`` samples of 3 MiB (1 MiB chunks) and a scalar, as the writer lays it."""
    src = tmp_path / "zsrc"
    src.mkdir()
    rng = np.random.default_rng(5)
    for i in range(n):
        np.savez(src / f"r{i}.npz", x=rng.standard_normal((3, 256, 1024)).astype(np.float32),
                 p=np.float64(i))
    root = str(tmp_path / "zstore")
    ingest([src], dataset="d", store=Catalog.init(root), format="zarr", compression="none",
           snapshot=True, shard_size=64 << 20)
    (shard,) = [os.path.join(d, f) for d, _, names in os.walk(os.path.join(root, "objects"))
                for f in names if os.path.getsize(os.path.join(d, f)) > 8 << 20]
    return shard


def _rezipped(shard: str, dst: str, order) -> str:  # type: ignore[no-untyped-def]
    import zipfile

    with zipfile.ZipFile(shard) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for name in order(zin.namelist()):
            zout.writestr(name, zin.read(name))
    return dst


def test_only_the_writers_layout_is_read_a_sample_at_a_time(tmp_path):
    from simstore.formats._zarr import ZarrShardReader

    shard = _zarr_runs(tmp_path)
    own = ZarrShardReader(shard)
    try:
        spans = [own._extent(p) for p in range(own.num_samples)]
        assert all(s is not None for s in spans)
        assert [s[1] for s in spans[:-1]] == [s[0] for s in spans[1:]]  # end to end
    finally:
        own.close()

    def meta_first(names):  # type: ignore[no-untyped-def]
        return sorted(names, key=lambda n: (n == "zarr.json", not n.endswith("zarr.json"), n))

    for order in (sorted, meta_first):  # other writers' orders: each entry read as before
        other = ZarrShardReader(_rezipped(shard, str(tmp_path / f"{order.__name__}.zip"),
                                          order))
        try:
            spans = [other._extent(p) for p in range(other.num_samples)]
        finally:
            other.close()
        # none, or a sample's group document alone where it lies just before the root's
        # (sorted names): under a block, so nothing is fetched ahead
        assert all(s is None or s[1] - s[0] < 4096 for s in spans), spans
        assert sum(s is None for s in spans) >= 5


def test_a_block_cut_short_by_a_shrunk_object_ends_the_read(tmp_path):
    import threading

    store, f, data = _file(tmp_path)
    store.put("obj", data[: 2 * BLOCK + 100])  # the object shrank after its size was read
    assert _read(f, 2 * BLOCK + 10, 2 * BLOCK + 20) == data[2 * BLOCK + 10 : 2 * BLOCK + 20]
    got: list[bytes] = []
    reading = threading.Thread(target=lambda: got.append(_read(f, 2 * BLOCK + 50, 4 * BLOCK)),
                               daemon=True)
    reading.start()
    reading.join(10)
    assert got == [data[2 * BLOCK + 50 : 2 * BLOCK + 100]]  # short: the reader says so


def test_a_mixtures_sources_each_get_a_buffers_blocks():
    from simstore.loaders._ranged import MAX_RANGE_BLOCKS_BYTES, mixture_blocks_bytes

    assert mixture_blocks_bytes([80 << 20]) == 80 << 20
    assert mixture_blocks_bytes([80 << 20, 80 << 20]) == 160 << 20
    assert mixture_blocks_bytes([80 << 20] * 300) == MAX_RANGE_BLOCKS_BYTES
    assert mixture_blocks_bytes([1 << 30, 80 << 20]) == 1 << 30  # one source's own need


def test_fields_given_as_an_iterator_serve_every_sample(tmp_path):
    from simstore.formats._zarr import ZarrShardReader

    reader = ZarrShardReader(_zarr_runs(tmp_path))
    try:
        got = list(reader.read(range(reader.num_samples), iter(["p"])))
    finally:
        reader.close()
    assert [s["p"] for s in got] == [float(i) for i in range(len(got))]
