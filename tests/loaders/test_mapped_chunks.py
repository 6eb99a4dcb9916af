"""Large uncompressed Zarr chunks mapped from local shard files into batches (``map_files``).

The writer starts such chunks at page boundaries of the shard file; a loader with no
workers maps them into its chunk buffers, copy-on-write, in place of reading them. The
batches must hold exactly the source's values, never write to the file, outlive the
file's removal, and still fail on a damaged chunk.
"""

from __future__ import annotations

import gc
import hashlib
import mmap
import os

import numpy as np
import pytest
import torch
from simstore.formats._zarr import ZarrShardReader
from simstore.loaders import SimDataLoader, SimDataset, _tensors

from simstore._buffers import BufferPool
from simstore.catalog import Catalog
from simstore.errors import FormatError, SimstoreError, StorageError
from simstore.ingest import ingest
from tests.loaders.loader_helpers import refused, snapshot_shards

PAGE = mmap.PAGESIZE


def _write_sources(root: str, count: int = 6) -> dict[str, np.ndarray]:
    """``count`` .npz runs of one 1 MiB float32 field (a whole number of pages)."""
    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(7)
    values = {}
    for i in range(count):
        key = f"r{i:02d}"
        a = rng.standard_normal((256, 1024)).astype(np.float32)
        np.savez(os.path.join(root, f"{key}.npz"), u=a)
        values[key] = a
    return values


def _aligned_store(base: str, count: int = 6) -> tuple[str, dict[str, np.ndarray]]:
    """A new store at ``base/store`` of ``count`` such runs, uncompressed Zarr shards."""
    values = _write_sources(os.path.join(base, "src"), count)
    store = os.path.join(base, "store")
    Catalog.init(store)
    ingest([os.path.join(base, "src")], dataset="d", store=store, snapshot=True,
           format="zarr", compression="none")
    return store, values


@pytest.fixture(scope="module")
def zarr_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, np.ndarray]]:
    return _aligned_store(str(tmp_path_factory.mktemp("mapped")))


def _shard_paths(store: str) -> list[str]:
    return [os.path.join(store, "objects", s[:2], s) for s in snapshot_shards(store)]


def _digests(paths: list[str]) -> list[str]:
    out = []
    for p in paths:
        with open(p, "rb") as f:
            out.append(hashlib.sha256(f.read()).hexdigest())
    return out


def _epoch(store: str, **kw: object) -> list[dict[str, object]]:
    ds = SimDataset(store, "d", shuffle=True, seed=3, **kw)  # type: ignore[arg-type]
    return list(SimDataLoader(ds, batch_size=4, num_workers=0))


def _check(batches: list[dict[str, object]], values: dict[str, np.ndarray]) -> int:
    n = 0
    for b in batches:
        u = b["u"]
        assert isinstance(u, torch.Tensor)
        for key, row in zip(b["__key__"], u, strict=True):  # type: ignore[call-overload]
            np.testing.assert_array_equal(row.numpy(), values[key])
            n += 1
    return n


def test_the_writer_starts_large_stored_chunks_at_page_boundaries(zarr_store):
    import zipfile

    store, values = zarr_store
    (path,) = _shard_paths(store)
    with zipfile.ZipFile(path) as z:
        assert z.testzip() is None  # stock zipfile: every entry's CRC-32 holds
        big = [i for i in z.infolist() if i.file_size == 1 << 20]
        assert len(big) == len(values)
        with open(path, "rb") as f:
            for info in big:
                f.seek(info.header_offset)
                head = f.read(30)
                n, m = int.from_bytes(head[26:28], "little"), int.from_bytes(head[28:30], "little")
                assert (info.header_offset + 30 + n + m) % PAGE == 0
        small = [i for i in z.infolist() if i.file_size < 256 << 10]
        assert small and all(i.extra == b"" for i in small)


def test_stock_zarr_reads_the_aligned_shard(zarr_store):
    import zarr

    store, values = zarr_store
    (path,) = _shard_paths(store)
    root = zarr.open_group(zarr.storage.ZipStore(path, mode="r"), mode="r")
    seen = [np.asarray(root[f"{p}/u"][...]) for p in range(len(values))]
    assert sorted(a.tobytes() for a in seen) == sorted(a.tobytes() for a in values.values())


def test_mapped_batches_hold_the_source_values_and_the_file_is_untouched(zarr_store):
    store, values = zarr_store
    paths = _shard_paths(store)
    before = _digests(paths)
    mapped = _tensors.POOL.mapped_bytes
    batches = _epoch(store, map_files=True)
    assert _tensors.POOL.mapped_bytes - mapped == len(values) << 20
    assert _check(batches, values) == len(values)
    for b in batches:  # the training loop writes into its batch: a private copy of the page
        b["u"].mul_(-2.0)  # type: ignore[union-attr]
    assert _digests(paths) == before
    assert _check(_epoch(store, map_files=True), values) == len(values)


def test_by_default_only_the_first_chunk_is_mapped_and_later_ones_reuse_memory(zarr_store):
    store, values = zarr_store
    few = {"chunk_samples": 2}  # a chunk holds whole batches: rows 0-3, then 4-5
    mapped = _tensors.POOL.mapped_bytes
    batches = _epoch(store, prefetch=few)
    assert [len(b["u"]) for b in batches] == [4, 2]  # type: ignore[arg-type]
    assert _check(batches, values) == len(values)
    assert _tensors.POOL.mapped_bytes - mapped == 4 << 20
    del batches
    # the first epoch's read chunk came back when its batch went: the next epoch's
    # second chunk is read into it
    reused = _tensors.POOL.reused
    assert _check(_epoch(store, prefetch=few), values) == len(values)
    assert _tensors.POOL.mapped_bytes - mapped == 8 << 20
    assert _tensors.POOL.reused > reused


def test_the_mapped_chunk_leaves_idle_memory_to_the_chunk_read_after_it(tmp_path, monkeypatch):
    store, values = _aligned_store(str(tmp_path), 8)
    pool = BufferPool()
    monkeypatch.setattr(_tensors, "POOL", pool)
    halves = {"chunk_samples": 4}  # rows 0-3 mapped, rows 4-7 read

    def epoch() -> tuple[int, int]:
        batches = _epoch(store, prefetch=halves)
        assert _check(batches, values) == len(values)
        return batches[0]["u"].data_ptr(), batches[1]["u"].data_ptr()  # type: ignore[union-attr]

    _, read_at = epoch()
    gc.collect()  # the batches are gone: the read chunk's memory is idle
    mapped = pool.mapped_bytes
    mapped_at, read_again_at = epoch()
    assert pool.mapped_bytes - mapped == 4 << 20
    # the mapped chunk got new memory; the read one the idle memory, already faulted in
    # (mapping over it would free those pages and leave the read chunk to fault new ones)
    assert read_again_at == read_at
    assert mapped_at != read_at


def test_map_files_false_reads_every_chunk(zarr_store):
    store, values = zarr_store
    mapped = _tensors.POOL.mapped_bytes
    assert _check(_epoch(store, map_files=False), values) == len(values)
    assert _tensors.POOL.mapped_bytes == mapped


def test_a_batch_outlives_its_shard_file(tmp_path):
    store, values = _aligned_store(str(tmp_path), 4)
    mapped = _tensors.POOL.mapped_bytes
    batches = _epoch(store)
    assert _tensors.POOL.mapped_bytes > mapped
    for p in _shard_paths(store):  # gc or a cache's eviction unlinks; the pages stay
        os.chmod(p, 0o644)
        os.unlink(p)
    assert _check(batches, values) == 4


def test_a_damaged_mapped_chunk_is_an_error_naming_the_shard(tmp_path):
    store, values = _aligned_store(str(tmp_path), 4)
    (shard,) = snapshot_shards(store)
    path = os.path.join(store, "objects", shard[:2], shard)
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:  # a byte in the middle of the first 1 MiB chunk
        data = f.read()
        at = data.index(values["r00"].tobytes()[:64]) + (1 << 19)
        f.seek(at)
        f.write(bytes([data[at] ^ 0xFF]))
    with pytest.raises(SimstoreError, match=shard):
        _epoch(store, verify_every_s=0)
    # the reader alone (no whole-shard hash first): the mapped chunk's CRC-32 fails
    pool = BufferPool(min_bytes=1)
    rows = pool.array((4, 256, 1024), np.dtype(np.float32))

    class Out:
        def __call__(self, i, name, shape, dtype):
            return rows[i]

        def map_file(self, array, fd, offset, check):
            return pool.map_file(array, fd, offset)

    reader = ZarrShardReader(path, name=f"shard {shard}")
    try:
        with pytest.raises(FormatError, match=f"shard {shard}: zip entry .* CRC-32"):
            list(reader.read(range(4), ["u"], out=Out()))
    finally:
        reader.close()
    assert pool.mapped_bytes > 0


@pytest.mark.parametrize("bad", ["yes", "First", 1, None])
def test_map_files_must_be_first_or_a_bool(zarr_store, bad):
    store, _ = zarr_store
    refused("map_files", SimDataset, store, "d", map_files=bad)


# -- BufferPool.map_file ---------------------------------------------------------------

@pytest.fixture()
def page_file(tmp_path):
    path = tmp_path / "pages.bin"
    data = np.arange(4 * PAGE // 4, dtype=np.int32)
    path.write_bytes(data.tobytes())
    fd = os.open(path, os.O_RDONLY)
    yield fd, data
    os.close(fd)


@pytest.mark.skipif(not os.uname().sysname == "Linux", reason="mapping is Linux-only")
def test_pool_maps_whole_pages_of_its_own_arrays_only(page_file):
    fd, data = page_file
    pool = BufferPool(min_bytes=1)
    a = pool.array((4, PAGE // 4), np.dtype(np.int32))
    assert pool.map_file(a[1:3], fd, PAGE)
    np.testing.assert_array_equal(a[1:3].reshape(-1), data[PAGE // 4 : 3 * PAGE // 4])
    assert pool.mapped_bytes == 2 * PAGE
    # refused, nothing changed: not the pool's memory, not page-aligned, a part page
    assert not pool.map_file(np.empty((4, PAGE // 4), np.int32)[1], fd, 0)
    assert not pool.map_file(a[0], fd, 100)
    assert not pool.map_file(a.reshape(-1)[1 : PAGE // 4 + 1], fd, 0)
    assert not pool.map_file(a[0, : PAGE // 8], fd, 0)
    assert pool.mapped_bytes == 2 * PAGE


@pytest.mark.skipif(not os.uname().sysname == "Linux", reason="mapping is Linux-only")
def test_pool_does_not_reuse_memory_that_held_file_pages(page_file):
    fd, data = page_file
    pool = BufferPool(min_bytes=1)
    a = pool.array((4, PAGE // 4), np.dtype(np.int32))
    assert pool.map_file(a, fd, 0)
    del a
    b = pool.array((4, PAGE // 4), np.dtype(np.int32))
    assert pool.reused == 0
    b[...] = -1
    with os.fdopen(os.dup(fd), "rb") as f:
        assert f.read() == data.tobytes()
    del b
    c = pool.array((4, PAGE // 4), np.dtype(np.int32))  # plain memory comes back
    assert pool.reused == 1
    del c


def test_a_fresh_array_takes_no_idle_memory_and_is_not_kept():
    pool = BufferPool(min_bytes=1)
    a = pool.array((4, PAGE), np.dtype(np.uint8))
    del a  # idle now
    fresh = pool.array((4, PAGE), np.dtype(np.uint8), fresh=True)
    assert pool.reused == 0
    del fresh  # its pages were never touched: not kept for a later array
    b = pool.array((4, PAGE), np.dtype(np.uint8))
    c = pool.array((4, PAGE), np.dtype(np.uint8))
    assert pool.reused == 1  # only the first array's memory came back
    del b, c


@pytest.mark.skipif(not os.uname().sysname == "Linux", reason="mapping is Linux-only")
def test_a_failed_mapping_leaves_usable_memory(tmp_path):
    pool = BufferPool(min_bytes=1)
    a = pool.array((2, PAGE), np.dtype(np.uint8))
    r, w = os.pipe()  # a pipe cannot be mapped
    try:
        assert not pool.map_file(a[0], r, 0)
    finally:
        os.close(r)
        os.close(w)
    a[...] = 7
    assert int(a.sum()) == 7 * 2 * PAGE
    assert pool.mapped_bytes == 0


# -- DataLoader workers: rows left in the files, mapped by the main process -------------

def _worker_epoch(store: str, workers: int = 2, context: str = "fork",
                  **kw: object) -> list[dict[str, object]]:
    ds = SimDataset(store, "d", shuffle=True, seed=5, **kw)  # type: ignore[arg-type]
    return list(SimDataLoader(ds, batch_size=2, num_workers=workers,
                              multiprocessing_context=context))


@pytest.mark.parametrize("context", ["fork", "spawn", "forkserver"])
def test_workers_leave_mapped_rows_to_the_main_process(zarr_store, context):
    """Workers of every start method send the shard files' descriptors, not the rows."""
    store, values = zarr_store
    paths = _shard_paths(store)
    before = _digests(paths)
    mapped = _tensors.POOL.mapped_bytes
    # verify=False: every chunk goes unchecked from the first, so all are left unread
    batches = _worker_epoch(store, verify=False, map_files=True, context=context)
    assert _tensors.POOL.mapped_bytes - mapped == len(values) << 20
    assert _check(batches, values) == len(values)
    for b in batches:
        assert b["u"].is_contiguous()  # type: ignore[union-attr]
        b["u"].neg_()  # type: ignore[union-attr]
    assert _digests(paths) == before
    for p in paths:  # the mappings hold the files' pages, not their names
        os.rename(p, p + ".moved")
    try:
        for b in batches:
            b["u"].neg_()  # type: ignore[union-attr]
        assert _check(batches, values) == len(values)
    finally:
        for p in paths:
            os.rename(p + ".moved", p)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_leave_only_their_first_chunk_by_default(zarr_store, context):
    store, values = zarr_store
    mapped = _tensors.POOL.mapped_bytes
    batches = _worker_epoch(store, verify=False, prefetch={"chunk_samples": 2},
                            context=context)
    # each worker's first chunk: two rows of its three
    assert _tensors.POOL.mapped_bytes - mapped == 4 << 20
    assert _check(batches, values) == len(values)


def test_fork_workers_with_checks_give_the_same_values(zarr_store):
    store, values = zarr_store
    assert _check(_worker_epoch(store, verify_every_s=0), values) == len(values)


def test_map_files_false_keeps_workers_batches_in_shared_memory(zarr_store):
    store, values = zarr_store
    mapped = _tensors.POOL.mapped_bytes
    assert _check(_worker_epoch(store, verify=False, map_files=False), values) == len(values)
    assert _tensors.POOL.mapped_bytes == mapped


def test_a_transform_reads_the_rows_in_the_worker(zarr_store):
    store, values = zarr_store
    mapped = _tensors.POOL.mapped_bytes
    batches = _worker_epoch(store, verify=False, transform=_negate)
    assert _tensors.POOL.mapped_bytes == mapped
    assert _check([{**b, "u": -b["u"]} for b in batches], values) == len(values)  # type: ignore[operator]


def _negate(sample: dict[str, object]) -> dict[str, object]:
    return {**sample, "u": -sample["u"]}  # type: ignore[operator]


def _aligned_and_compressed(base: str, count: int, names: tuple[str, str]
                            ) -> tuple[str, dict[str, np.ndarray]]:
    """A store with ``count`` uncompressed runs ``r..`` in dataset ``names[0]`` and
    ``count`` zstd-compressed runs ``b..`` in ``names[1]`` (both Zarr)."""
    values = _write_sources(os.path.join(base, "a"), count)
    rng = np.random.default_rng(2)
    os.makedirs(os.path.join(base, "b"))
    for i in range(count):
        v = rng.standard_normal((256, 1024)).astype(np.float32) + 100
        np.savez(os.path.join(base, "b", f"b{i:02d}.npz"), u=v)
        values[f"b{i:02d}"] = v
    store = os.path.join(base, "store")
    Catalog.init(store)
    for src, name, codec in (("a", names[0], "none"), ("b", names[1], "zstd")):
        ingest([os.path.join(base, src)], dataset=name, store=store, snapshot=True,
               format="zarr", compression=codec)
    return store, values


def test_batches_mixing_mapped_and_decoded_rows(tmp_path):
    """A compressed snapshot and an aligned one in one dataset: chunks mix decoded rows
    (read in the worker) with rows left in the files; every value still arrives."""
    store, values = _aligned_and_compressed(str(tmp_path), 4, ("d", "d"))
    batches = _worker_epoch(store, verify=False, window_shards=2)
    assert _check(batches, values) == 8


@pytest.mark.parametrize("verify", [False, True])
def test_a_mixture_of_mapped_and_compressed_shards_in_fork_workers(tmp_path, verify):
    """Chunks whose private buffer sends some batches as rows left in the files and others
    as tensors (decoded rows beside noted ones): torch moves a tensor's whole storage
    into shared memory when it sends it, so every noted row must be read before that."""
    store, values = _aligned_and_compressed(str(tmp_path), 12, ("a", "b"))
    mix = SimDataset.mix([SimDataset(store, "a", seed=3, verify=verify),
                          SimDataset(store, "b", seed=4, verify=verify)], seed=1)
    batches = list(SimDataLoader(mix, batch_size=2, num_workers=2,
                                 multiprocessing_context="fork"))
    assert _check(batches, values) == 24


# -- the channel ------------------------------------------------------------------------

def test_channel_passes_open_files_across_a_fork(tmp_path, monkeypatch):
    from simstore.loaders import _filerows

    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * PAGE + b"y" * PAGE)
    channel = _filerows.FdChannel()
    pid = os.fork()
    if pid == 0:  # the worker: two batches, the first never claimed
        try:
            for _ in range(2):
                fd = os.open(path, os.O_RDONLY)
                rows = _filerows.FileRows((1, PAGE), "|u1", [(0, 0, PAGE, 0, PAGE)], [fd])
                channel.send([rows])
                os.close(fd)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    os.unlink(path)  # what was sent is the open file, not its name
    fds = channel.receive(2, 1)
    try:
        assert os.pread(fds[0], PAGE, PAGE) == b"y" * PAGE
    finally:
        os.close(fds[0])
    monkeypatch.setattr(_filerows, "RECEIVE_TIMEOUT_S", 0.2)
    late = _filerows.FdChannel()
    with pytest.raises(StorageError, match="did not arrive within"):
        late.receive(1, 1)
    late.close()
    channel.close()


def test_chunk_buffers_note_read_or_hand_over_rows(page_file):
    fd, data = page_file
    buffers = _tensors.ChunkBuffers(3, shared=True, defer_files=True)
    f32 = np.dtype(np.float32)
    row0 = buffers.take(0, "u", (PAGE // 4,), f32, mappable=True)
    assert not buffers.map_file(row0, fd, PAGE, check=True)  # bytes due now: read them
    assert buffers.map_file(row0, fd, PAGE, check=False)
    row1 = buffers.take(1, "u", (PAGE // 4,), f32)
    row1[...] = 5.0  # decoded here, not noted
    row2 = buffers.take(2, "u", (PAGE // 4,), f32)
    assert buffers.map_file(row2, fd, 3 * PAGE, check=False)
    assert buffers.file_rows("u", 0, 2) is None  # row 1 is in memory only
    handed = buffers.file_rows("u", 2, 3)
    assert handed is not None and handed.shape == (1, PAGE // 4) and handed.files == 1
    assert handed.pieces == [(0, 0, PAGE, 0, 3 * PAGE)]
    buffers.settle(0, 3)
    np.testing.assert_array_equal(row0.view(np.int32), data[PAGE // 4 : PAGE // 2])
    assert (row1 == 5.0).all()
    pool = BufferPool(min_bytes=1)
    idle = pool.array((1, PAGE // 4), f32)
    del idle  # memory already faulted in stays for rows that are read
    got = handed.tensor(handed.fds, pool)
    assert pool.mapped_bytes == PAGE and pool.reused == 0
    np.testing.assert_array_equal(got.numpy().view(np.int32)[0], data[3 * PAGE // 4 :])
    buffers.retire()
    with pytest.raises(OSError):
        os.fstat(handed.fds[0])  # the noted file's duplicate is closed with the chunk
