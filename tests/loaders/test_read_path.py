"""The read path's economies: row groups decoded once, batches that are views, not copies."""

from __future__ import annotations

import os
import pickle
import random

import numpy as np
import pytest
import torch
from loader_helpers import commit_samples, make_samples, open_test_shard, write_npz_sources
from simstore.formats import ParquetFormat
from simstore.loaders import Collate, SimDataLoader, SimDataset, _streams, _tensors
from simstore.loaders._pipeline import _SlotAlloc
from simstore.loaders._tensors import BufferPool, ChunkBuffers, stacked_view
from simstore.loaders._workerstart import _forks

import simstore
from simstore._blockcache import BlockCache
from simstore.catalog import Catalog
from simstore.errors import IntegrityError
from simstore.hashing import object_key
from simstore.ingest import ShardOptions
from simstore.sample import Sample


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """16 .npz files: u is (8, 16, 16) float32 (8 KiB), p a scalar."""
    root = tmp_path_factory.mktemp("src")
    arrays = write_npz_sources(str(root), 16, seed=1)
    return str(root), arrays


def _ingest(tmp_path, sources, fmt, **options):
    root, arrays = sources
    store = str(tmp_path / f"store-{fmt}")
    Catalog.init(store)
    simstore.ingest([root], dataset="d", store=store, format=fmt, snapshot=True,
                    message="t", shard_size=40_000, **options)
    return store, arrays


def _shard(tmp_path, rows=40, row_group_bytes=4096):
    rng = np.random.default_rng(2)
    samples = [Sample(f"k{i:03d}", {"x": rng.standard_normal(256).astype(np.float32),
                                    "i": np.int64(i)}) for i in range(rows)]
    path = str(tmp_path / "s.parquet")
    ParquetFormat(ShardOptions(compression="none", row_group_bytes=row_group_bytes)).write(
        samples, path)
    return path, samples


def test_shuffled_reads_decode_each_row_group_once(tmp_path):
    path, samples = _shard(tmp_path)
    reader = ParquetFormat().open(path)
    groups = reader._pf.metadata.num_row_groups
    assert groups >= 8
    order = list(range(len(samples)))
    random.Random(0).shuffle(order)
    for i in range(0, len(order), 3):  # many small calls in shuffled order
        batch = order[i : i + 3]
        for p, got in zip(batch, reader.read(batch, ["x"]), strict=True):
            assert np.array_equal(got["x"], samples[p].fields["x"])
    assert reader.decodes == groups
    reader.close()


def test_a_small_shared_cache_bounds_memory_and_still_reads_right(tmp_path):
    path, samples = _shard(tmp_path)
    cache = BlockCache(2000)  # smaller than one row group: nothing is kept
    reader = ParquetFormat().open(path)
    reader.share_cache(cache)
    order = list(range(len(samples)))
    random.Random(1).shuffle(order)
    for p in order:
        (got,) = reader.read([p], ["x"])
        assert np.array_equal(got["x"], samples[p].fields["x"])
    assert cache.nbytes == 0
    assert reader.decodes == len(samples)
    reader.close()


def test_closing_a_reader_forgets_its_row_groups(tmp_path):
    path, samples = _shard(tmp_path)
    cache = BlockCache(64 << 20)
    reader = ParquetFormat().open(path)
    reader.share_cache(cache)
    list(reader.read(list(range(len(samples))), ["x"]))
    assert cache.nbytes > 0
    reader.close()
    assert cache.nbytes == 0


CASES = [
    ("parquet", {}, 0),
    ("parquet", {}, 2),
    ("parquet", {"row_group_bytes": 20_000}, 0),  # several row groups per shard
    ("parquet", {"row_group_bytes": 20_000}, 2),
    ("lance", {}, 0),  # lance is not fork-safe: its worker tests use spawn elsewhere
    ("zarr", {}, 0),
    ("zarr", {}, 2),
    ("zarr", {"chunks": {"u": (4, 8, 8)}}, 0),  # chunks that are not first-axis slabs
    ("zarr", {"chunks": {"u": (4, 8, 8)}}, 2),
]


@pytest.mark.parametrize("fmt,options,workers", CASES)
def test_batches_are_exact_views_of_decode_buffers(tmp_path, sources, fmt, options, workers):
    store, arrays = _ingest(tmp_path, sources, fmt, **options)
    ds = SimDataset(store, "d", seed=3)
    loader = SimDataLoader(ds, batch_size=4, num_workers=workers,
                           multiprocessing_context="fork" if workers else None)
    seen = {}
    views = 0
    for batch in loader:
        views += batch["u"]._base is not None
        for k, u in zip(batch["__key__"], batch["u"], strict=True):
            assert np.array_equal(u.numpy(), arrays[k]), k
            seen[k] = True
        batch["u"].zero_()  # a batch's rows are its own: later batches are unaffected
    assert sorted(seen) == sorted(arrays)
    if workers == 0:
        assert views == len(arrays) // 4


@pytest.mark.parametrize("shapes", [[(8, 8)], [(8, 8), (4, 16)]], ids=["one-shape", "two"])
def test_reads_into_chunk_buffers_across_row_groups(tmp_path, shapes):
    """A read over many row groups gathers each piece into the chunk's buffer, or decodes
    per piece where row groups disagree on shape, with the right rows in the right slots."""
    rng = np.random.default_rng(5)
    samples = [
        Sample(f"k{i:03d}", {"u": rng.standard_normal(shapes[i * len(shapes) // 40])
                             .astype(np.float32), "i": np.int64(i)})
        for i in range(40)
    ]
    path = str(tmp_path / "s.parquet")
    ParquetFormat(ShardOptions(compression="none", row_group_bytes=1024)).write(samples, path)
    reader = ParquetFormat().open(path)
    assert reader._pf.metadata.num_row_groups >= 8
    positions = sorted(random.Random(1).sample(range(40), 24))
    shuffled = positions[::-1] + positions[:3]  # unsorted, with repeats
    for wanted in (positions, shuffled):
        bufs = ChunkBuffers(len(wanted), shared=False)
        got = list(reader.read(wanted, ["u", "i"], out=_SlotAlloc(bufs, list(range(len(wanted))))))
        for p, value in zip(wanted, got, strict=True):
            assert np.array_equal(value["u"], samples[p].fields["u"])
            assert value["i"] == samples[p].fields["i"]
        if len(shapes) == 1:  # every u is a row of the one buffer, slot by slot
            buffer = bufs._bufs["u"][1]
            for j, value in enumerate(got):
                if wanted.index(wanted[j]) == j:
                    assert np.shares_memory(value["u"], buffer[j])


def test_stacked_view_only_for_consecutive_rows_of_one_buffer():
    buf = torch.arange(24, dtype=torch.float32).reshape(6, 4)
    assert stacked_view([buf[1], buf[2], buf[3]]).data_ptr() == buf[1].data_ptr()
    assert stacked_view([buf[1], buf[3]]) is None
    assert stacked_view([buf[2], buf[1]]) is None
    other = buf.clone()
    assert stacked_view([buf[0], other[1]]) is None
    assert stacked_view([torch.zeros(4), torch.zeros(4)]) is None


def test_chunk_buffers_hand_out_one_row_per_slot_and_shape():
    bufs = ChunkBuffers(3, shared=False)
    a = bufs.take(0, "x", (2, 2), np.dtype(np.float32))
    assert a.shape == (2, 2) and a.flags.writeable
    assert bufs.take(0, "x", (2, 2), np.dtype(np.float32)) is None  # slot already given
    assert bufs.take(1, "x", (3, 2), np.dtype(np.float32)) is None  # another shape
    assert bufs.take(1, "x", (2, 2), np.dtype(np.float64)) is None  # another dtype
    assert bufs.take(0, "s", (), np.dtype(object)) is None
    a[...] = 7
    got = bufs.tensors(0, {"x": a, "y": np.zeros(2)})
    assert set(got) == {"x"} and torch.equal(got["x"], torch.full((2, 2), 7.0))
    assert bufs.tensors(0, {"x": a.copy()}) == {}  # not the handed-out array


def test_batched_numbers_match_stacked_per_sample_tensors(small):
    store, ref, _ = small  # "step" is a Python int per sample
    kw = {"shard_opener": open_test_shard, "seed": 5}
    per_sample = {s["__key__"]: s["step"] for s in SimDataset(store, ref, **kw)}
    assert all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in per_sample.values())
    seen = 0
    for batch in SimDataLoader(SimDataset(store, ref, **kw), batch_size=4):
        expected = torch.stack([per_sample[k] for k in batch["__key__"]])
        assert batch["step"].dtype == expected.dtype and torch.equal(batch["step"], expected)
        seen += len(batch["__key__"])
    assert seen == len(per_sample)
    custom = SimDataLoader(SimDataset(store, ref, **kw), batch_size=4, collate_fn=list)
    for samples in custom:
        assert all(isinstance(s["step"], torch.Tensor) for s in samples)


@pytest.fixture(scope="module")
def mesh_sources(tmp_path_factory):
    """12 .npz files: points (n, 3) with n varying, cells (m, 4) int32, u fixed, p a scalar."""
    root = tmp_path_factory.mktemp("mesh-src")
    rng = np.random.default_rng(7)
    for t in range(12):
        n = int(rng.integers(5, 40))
        np.savez(root / f"m{t:03d}.npz",
                 points=rng.standard_normal((n, 3)).astype(np.float32),
                 cells=rng.integers(0, n, (2 * n, 4)).astype(np.int32),
                 u=rng.standard_normal((4, 4)).astype(np.float32), p=np.float64(t))
    return str(root)


def _same(a, b):
    assert a.keys() == b.keys()
    for name in a:
        x, y = a[name], b[name]
        if isinstance(x, torch.Tensor):
            assert isinstance(y, torch.Tensor) and x.dtype == y.dtype and torch.equal(x, y), name
        else:
            assert x == y, name


@pytest.mark.parametrize("fmt", ["parquet", "lance", "zarr"])
@pytest.mark.parametrize("mesh", ["pad", "pack"])
@pytest.mark.parametrize("drop_last", [False, True])
def test_batches_made_in_the_reader_equal_batches_of_samples(
    tmp_path, mesh_sources, fmt, mesh, drop_last
):
    """Batches the workers make from their decode buffers equal a DataLoader's batches of
    single samples through the same collate, field by field, in order."""
    store = str(tmp_path / "store")
    Catalog.init(store)
    simstore.ingest([mesh_sources], dataset="m", store=store, format=fmt, snapshot=True,
                    message="t", shard_size=4_000)
    index = {"cells": "points"} if mesh == "pack" else {}
    made = SimDataLoader(SimDataset(store, "m", seed=2), batch_size=5, mesh=mesh,
                         index_fields=index, drop_last=drop_last)
    gathered = SimDataLoader(SimDataset(store, "m", seed=2), batch_size=5, drop_last=drop_last,
                             collate_fn=Collate(mesh=mesh, index_fields=index))
    ours, theirs = list(made), list(gathered)
    assert len(ours) == len(theirs) == (2 if drop_last else 3)
    for a, b in zip(ours, theirs, strict=True):
        _same(a, b)
    # the fixed-shape field of a reader-made batch is a view of its decode buffer
    assert all(b["u"]._base is not None for b in ours)


def test_fanned_out_reads_keep_order_and_finish_before_an_error():
    from concurrent.futures import ThreadPoolExecutor

    from simstore.loaders._pipeline import _map

    done = []

    def work(x):
        if x == 0:
            raise ValueError("first")
        done.append(x)
        return x * 10

    with ThreadPoolExecutor(2) as pool:
        assert _map(lambda x: x * 10, [3, 1, 2], pool) == [30, 10, 20]
        with pytest.raises(ValueError, match="first"):
            _map(work, [0, 1, 2, 3], pool)
        assert sorted(done) == [1, 2, 3]  # every other call had finished


def test_first_chunk_over_several_shards_reads_alike_on_one_or_two_threads(
    tmp_path, sources, monkeypatch
):
    """The first chunk's shards are read on spare threads; the batches are the same."""
    import simstore.loaders._pipeline as pipeline_mod
    import simstore.loaders._reading as dataset_mod
    from simstore.loaders._pipeline import PrefetchConfig

    store, _ = _ingest(tmp_path, sources, "parquet")
    monkeypatch.setattr(dataset_mod, "usable_cores", lambda: 4)
    calls = []
    plain = pipeline_mod._map

    def spy(fn, items, executor):
        calls.append((len(items), executor is not None))
        return plain(fn, items, executor)

    monkeypatch.setattr(pipeline_mod, "_map", spy)
    runs = []
    for threads in (1, 2):
        calls.clear()
        ds = SimDataset(store, "d", seed=3, prefetch=PrefetchConfig(decode_threads=threads))
        runs.append([(b["__key__"], b["u"].clone())
                     for b in SimDataLoader(ds, batch_size=16, num_workers=0)])
        fanned = [n for n, pooled in calls if pooled]
        assert fanned == ([] if threads == 1 else [calls[0][0]]) and calls[0][0] > 1
    # and chunks that start at the first of their shards, not a rotating one, read alike
    monkeypatch.setattr(pipeline_mod.ReaderPool, "rotation", lambda self: 0)
    ds = SimDataset(store, "d", seed=3)
    runs.append([(b["__key__"], b["u"].clone())
                 for b in SimDataLoader(ds, batch_size=16, num_workers=0)])
    for other in runs[1:]:
        assert [k for k, _ in runs[0]] == [k for k, _ in other]
        assert all(torch.equal(a, b) for (_, a), (_, b) in zip(runs[0], other, strict=True))


def test_a_workers_first_chunk_goes_out_before_more_work_starts(tmp_path, sources, monkeypatch):
    """In a DataLoader worker, the next chunk's decode (and the shards' hashes) start only
    when the second batch is asked for: the first leaves the process first."""
    import concurrent.futures

    import simstore.loaders._pipeline as pipeline_mod
    import simstore.loaders._reading as dataset_mod

    store, arrays = _ingest(tmp_path, sources, "parquet")
    submitted = []

    class Counting(concurrent.futures.ThreadPoolExecutor):
        def submit(self, fn, /, *args, **kwargs):
            if self._thread_name_prefix == "simstore-decode":
                submitted.append(fn)
            return super().submit(fn, *args, **kwargs)

    monkeypatch.setattr(pipeline_mod, "ThreadPoolExecutor", Counting)
    expected = [b["__key__"] for b in SimDataLoader(SimDataset(store, "d", seed=3),
                                                     batch_size=4, num_workers=0)]
    submitted.clear()
    monkeypatch.setattr(dataset_mod, "in_worker", lambda: True)  # read as a worker would
    it = iter(SimDataLoader(SimDataset(store, "d", seed=3), batch_size=4, num_workers=0))
    got = [next(it)["__key__"]]
    assert len(submitted) == 1  # the first chunk alone
    got.append(next(it)["__key__"])
    assert len(submitted) == 2  # the rest of the 16 samples: one more chunk
    got.extend(b["__key__"] for b in it)
    assert got == expected and len(arrays) == 16


def test_without_workers_the_chunks_ahead_of_the_first_two_are_resolved_while_they_go_out(
    tmp_path, sources, monkeypatch
):
    """The first batch waits for its own chunk's rows only: the next chunk is resolved on
    a decode thread (idle then) while the first batch is out, and the four after it while
    the second chunk is out; the others wait until the consumer asks again, and are
    resolved by it."""
    import threading

    import simstore.loaders._pipeline as pipeline_mod

    store, arrays = _ingest(tmp_path, sources, "parquet")
    resolved = []
    plain = pipeline_mod.Resolver.resolve
    consumer = threading.current_thread().name

    def counting(self, *args, **kwargs):
        resolved.append(threading.current_thread().name)
        return plain(self, *args, **kwargs)

    monkeypatch.setattr(pipeline_mod.Resolver, "resolve", counting)
    ds = SimDataset(store, "d", seed=5, prefetch={"chunk_samples": 2})
    it = iter(SimDataLoader(ds, batch_size=2, num_workers=0))
    got = [next(it)["__key__"]]
    assert resolved[0] == consumer and len(resolved) <= 2  # its own chunk, maybe the next
    got.extend(b["__key__"] for b in it)
    decode = [name.startswith("simstore-decode") for name in resolved]
    assert decode == [False] + [True] * 5 + [False] * 2, resolved  # 8 chunks of 2 samples
    assert resolved[-1] == consumer
    assert sorted(k for keys in got for k in keys) == sorted(arrays)


def test_a_group_that_fails_to_load_ahead_fails_the_batch_that_needs_it(tmp_path):
    """The chunk after the first is resolved on a decode thread while the first batch is
    out; its group's damaged manifest part fails the next batch, named, not the first."""
    store = str(tmp_path / "s")
    commit_samples(store, "ds", make_samples(300, runs=6), per_shard=25, target_rows=16)

    def dataset():
        return SimDataset(store, "ds@main", shuffle=True, seed=4, group_parts=1,
                          prefetch={"chunk_samples": 64}, shard_opener=open_test_shard)

    source = dataset()._sources[0]
    layout = source.layout(0)
    assert layout.group_starts[1] < 2 + 64  # the second chunk reaches the second group
    part = source.part_ids[layout.parts_of(1)[0]].decode()
    with open(os.path.join(store, object_key(part)), "r+b") as f:
        f.seek(20)
        f.write(b"\xff")
    it = iter(SimDataLoader(dataset(), batch_size=2, num_workers=0))
    assert len(next(it)["__key__"]) == 2  # the first group's rows are intact
    with pytest.raises(IntegrityError, match=part):
        next(it)


def test_a_worker_learns_when_its_first_batch_is_pickled():
    """The batch stream of a worker waits on this before it reads on (torch pickles the
    batch on a thread of the worker)."""
    import threading

    sent = threading.Event()
    _streams._FIRST_SENT[0] = sent
    try:
        tagged = _streams._Tagged({"u": torch.zeros(2)}, _streams._Tag(0, 2, {}))
        back = pickle.loads(pickle.dumps(tagged))
        assert sent.is_set() and _streams._FIRST_SENT[0] is None
        assert torch.equal(back.batch["u"], torch.zeros(2))
    finally:
        _streams._FIRST_SENT[0] = None


def test_buffer_pool_reuses_memory_only_once_every_view_is_gone():
    pool = BufferPool(idle_bytes=8 << 20, min_bytes=0)
    first = pool.array((4, 1024), np.dtype(np.float32))
    first[:] = 1.0
    held = torch.from_numpy(first)[1:3]  # a batch: a view of the chunk's buffer
    del first
    second = pool.array((4, 1024), np.dtype(np.float32))
    second[:] = 2.0  # fresh memory: the held view is not overwritten
    assert pool.reused == 0 and bool((held == 1.0).all())
    address = held.untyped_storage().data_ptr()
    del held
    third = pool.array((4, 1024), np.dtype(np.float32))
    assert pool.reused == 1 and third.__array_interface__["data"][0] == address
    # idle memory is bounded: past idle_bytes, the oldest idle mappings are unmapped
    small = BufferPool(idle_bytes=20_000, min_bytes=0)
    arrays = [small.array((4096,), np.dtype(np.uint8)) for _ in range(8)]
    del arrays
    assert sum(len(m) for m in small._idle) <= 20_000


@pytest.mark.parametrize("fmt", ["parquet", "zarr"])
def test_kept_batches_stay_intact_while_later_epochs_reuse_buffers(
    tmp_path, sources, fmt, monkeypatch
):
    pool = BufferPool(min_bytes=0)
    monkeypatch.setattr(_tensors, "POOL", pool)
    store, arrays = _ingest(tmp_path, sources, fmt)
    ds = SimDataset(store, "d", seed=5)
    kept = list(SimDataLoader(ds, batch_size=4))
    for epoch in (1, 2, 3):  # epoch 3 can reuse epoch 1's buffers (2's last batch is held)
        ds.set_epoch(epoch)
        for batch in SimDataLoader(ds, batch_size=4):
            batch["u"].mul_(-1.0)  # scribble on each later batch's memory
    assert pool.reused > 0
    for batch in kept:
        for k, u in zip(batch["__key__"], batch["u"], strict=True):
            assert np.array_equal(u.numpy(), arrays[k]), k


@pytest.fixture(scope="module")
def many_sources(tmp_path_factory):
    """64 .npz files like ``sources``'s."""
    root = tmp_path_factory.mktemp("src64")
    arrays = write_npz_sources(str(root), 64, seed=2)
    return str(root), arrays


def _storage_inode(t: torch.Tensor) -> int:
    fd, _size = t.untyped_storage()._share_fd_cpu_()
    return os.fstat(fd).st_ino


def _pooled_fork_loader(tmp_path, sources, fmt, monkeypatch, seed):
    """Two fork workers whose every tensor goes through their pooled buffers."""
    monkeypatch.setattr(_tensors, "SHARED_MIN_BYTES", 0)  # forked workers inherit it
    monkeypatch.setattr(_streams, "BY_VALUE_BYTES", -1)  # no tensor by value
    store, arrays = _ingest(tmp_path, sources, fmt)
    ds = SimDataset(store, "d", seed=seed, prefetch={"chunk_samples": 4, "chunks": 1})
    return SimDataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="fork"), arrays


def _assert_intact(batches, arrays):
    for batch in batches:
        for k, u in zip(batch["__key__"], batch["u"], strict=True):
            assert np.array_equal(u.numpy(), arrays[k]), k


@pytest.mark.parametrize("arena", [False, True])
@pytest.mark.parametrize("fmt", ["parquet", "zarr"])
def test_workers_reuse_shared_buffers_the_main_process_let_go(
    tmp_path, many_sources, fmt, arena, monkeypatch
):
    if not arena:  # each buffer its own shared memory, sent as a file descriptor
        monkeypatch.setattr(_tensors, "ARENA_BYTES", 0)
    loader, arrays = _pooled_fork_loader(tmp_path, many_sources, fmt, monkeypatch, 7)
    places, seen = [], []
    for batch in loader:
        if arena:  # a view of the worker's arena, mapped by this process before the fork
            assert _tensors.in_an_arena(batch["u"]) and not batch["u"].is_shared()
            places.append(batch["u"].data_ptr())
        else:
            assert batch["u"].is_shared() and not _tensors.in_an_arena(batch["u"])
            places.append(_storage_inode(batch["u"]))
        for k, u in zip(batch["__key__"], batch["u"], strict=True):
            assert np.array_equal(u.numpy(), arrays[k]), k
            seen.append(k)
        del batch
    assert sorted(seen) == sorted(arrays)
    assert len(set(places)) < len(places)  # some buffer carried more than one batch


def test_a_full_arena_falls_back_to_fresh_shared_memory(tmp_path, many_sources, monkeypatch):
    monkeypatch.setattr(_tensors, "ARENA_BYTES", 4096)  # room for one small buffer or none
    loader, arrays = _pooled_fork_loader(tmp_path, many_sources, "zarr", monkeypatch, 3)
    kept, seen, fresh = [], [], 0
    for batch in loader:
        fresh += int(batch["u"].is_shared())
        kept.append(batch)  # held: nothing may be written over them
    for batch in kept:
        for k, u in zip(batch["__key__"], batch["u"], strict=True):
            assert np.array_equal(u.numpy(), arrays[k]), k
            seen.append(k)
    assert sorted(seen) == sorted(arrays)
    assert fresh > 0


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_workers_that_do_not_fork_map_their_arena_from_its_descriptor(tmp_path, context):
    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(4)
    arrays = {f"a{i:02d}": rng.standard_normal((64, 1024)).astype(np.float32)
              for i in range(16)}  # 256 KiB each: a batch of 4 fills a pooled buffer
    for key, u in arrays.items():
        np.savez(src / f"{key}.npz", u=u)
    store, _ = _ingest(tmp_path, (str(src), arrays), "zarr")
    ds = SimDataset(store, "d", seed=5)
    loader = SimDataLoader(ds, batch_size=4, num_workers=1, multiprocessing_context=context)
    seen = []
    for _ in range(2):  # a later epoch's workers get the same arena
        for batch in loader:
            assert _tensors.in_an_arena(batch["u"])
            for k, u in zip(batch["__key__"], batch["u"], strict=True):
                assert np.array_equal(u.numpy(), arrays[k]), k
                seen.append(k)
    assert sorted(seen) == sorted(list(arrays) * 2)
    assert len(loader._stream.arenas) == 1  # type: ignore[attr-defined]


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_batches_over_what_travels_by_value_come_from_the_pool(tmp_path, many_sources, context):
    """16 samples of 8 KiB: each batch was fresh shared memory sent by descriptor (the
    pool started at 1 MiB), a handshake with the worker per batch."""
    store, arrays = _ingest(tmp_path, many_sources, "parquet")
    ds = SimDataset(store, "d", seed=3)
    seen = []
    for batch in SimDataLoader(ds, batch_size=16, num_workers=1,
                               multiprocessing_context=context):
        assert batch["u"].nbytes > _streams.BY_VALUE_BYTES
        assert _tensors.in_an_arena(batch["u"]) and not batch["u"].is_shared()
        for k, u in zip(batch["__key__"], batch["u"], strict=True):
            assert np.array_equal(u.numpy(), arrays[k]), k
            seen.append(k)
    assert sorted(seen) == sorted(arrays)


@pytest.mark.parametrize("persistent", [False, True])
def test_batches_kept_from_spawned_workers_arenas_stay_intact_in_later_epochs(
        tmp_path, many_sources, persistent):
    """A spawned worker of a later epoch carves its arena around the views the main
    process still holds (the ranges go with its start), as a forked one does."""
    store, arrays = _ingest(tmp_path, many_sources, "parquet")
    ds = SimDataset(store, "d", seed=9, prefetch={"chunk_samples": 16, "chunks": 1})
    loader = SimDataLoader(ds, batch_size=16, num_workers=1, multiprocessing_context="spawn",
                           persistent_workers=persistent)
    kept = []
    for batch in loader:
        assert _tensors.in_an_arena(batch["u"])
        kept.append((batch["__key__"], batch["u"]))
        kept.append((batch["__key__"][1:2], batch["u"][1:2]))  # a view of one row
    for epoch in (1, 2):
        ds.set_epoch(epoch)
        for batch in loader:
            assert _tensors.in_an_arena(batch["u"])
            batch["u"].mul_(-1.0)  # scribble on every later batch's memory
    for keys, u in kept:
        for k, row in zip(keys, u, strict=True):
            assert np.array_equal(row.numpy(), arrays[k]), k


def test_iterations_left_mid_chunk_give_their_buffers_back_to_the_pool(
        tmp_path, monkeypatch):
    """Found by a review: a chunk's buffers went back to the pool only when all its
    batches were made, so each iteration of persistent workers left early kept one for
    good, a region of the arena (then of /dev/shm once the arena was full)."""
    monkeypatch.setattr(_tensors, "ARENA_BYTES", 16 << 20)
    src = tmp_path / "src"
    src.mkdir()
    arrays = {f"a{i:02d}": np.full((64, 1024), i, dtype=np.float32) for i in range(64)}
    for key, u in arrays.items():  # 256 KiB each
        np.savez(src / f"{key}.npz", u=u)
    store, _ = _ingest(tmp_path, (str(src), arrays), "zarr")
    ds = SimDataset(store, "d", seed=1, prefetch={"chunk_samples": 16, "chunks": 1})
    loader = SimDataLoader(ds, batch_size=4, num_workers=1, multiprocessing_context="fork",
                           persistent_workers=True)
    for epoch in range(12):  # 4 MiB chunks, 4 batches each: 12 would fill the arena 3 times
        ds.set_epoch(epoch)
        for j, batch in enumerate(loader):
            assert _tensors.in_an_arena(batch["u"]), (epoch, j)
            for k, u in zip(batch["__key__"], batch["u"], strict=True):
                assert np.array_equal(u.numpy(), arrays[k]), k
            if j == 1:  # mid-chunk
                del batch  # the loop holds none of this chunk's buffers
                break


class _ArenaMaps:
    """A transform that records how many arena mappings its process has."""

    def __call__(self, sample):
        with open("/proc/self/maps") as f:
            maps = sum("simstore-arena" in line for line in f)
        return {**sample, "maps": torch.tensor(maps)}


@pytest.mark.parametrize("persistent", [False, True])
def test_a_spawned_worker_keeps_only_its_own_arena_mapped(tmp_path, many_sources, persistent):
    """Found by a review: the stream a spawned worker starts with carries every worker's
    arena, and each worker mapped them all (address space for nothing)."""
    store, arrays = _ingest(tmp_path, many_sources, "parquet")
    ds = SimDataset(store, "d", seed=2, transform=_ArenaMaps())
    loader = SimDataLoader(ds, batch_size=8, num_workers=2, multiprocessing_context="spawn",
                           persistent_workers=persistent)
    for epoch in range(2):
        ds.set_epoch(epoch)
        maps = [int(m) for batch in loader for m in batch["maps"]]
        assert len(maps) == len(arrays)
        assert set(maps) == {1}, (epoch, sorted(set(maps)))


def _doubled(sample):
    return {**sample, "u": sample["u"] * 2}


def test_transformed_batches_over_what_travels_by_value_are_stacked_in_the_pool(
        tmp_path, many_sources):
    """A transform's samples are stacked into pooled memory from 64 KiB, as the chunk
    buffers are (from 1 MiB before: torch then sent each batch by descriptor)."""
    store, arrays = _ingest(tmp_path, many_sources, "parquet")
    ds = SimDataset(store, "d", seed=3, transform=_doubled)
    seen = []
    for batch in SimDataLoader(ds, batch_size=16, num_workers=1,
                               multiprocessing_context="fork"):
        assert _tensors.in_an_arena(batch["u"]), batch["u"].nbytes
        for k, u in zip(batch["__key__"], batch["u"], strict=True):
            assert np.array_equal(u.numpy(), arrays[k] * 2), k
            seen.append(k)
    assert sorted(seen) == sorted(arrays)


def test_an_arena_copied_outside_a_worker_start_is_no_arena():
    arena = _tensors.SharedArena(1 << 20)
    assert pickle.loads(pickle.dumps(arena)) is None  # its memory stays this process's


def test_arena_views_rebuild_strided_tensors_and_empty_ones():
    arena = _tensors.SharedArena(1 << 20)
    storage = arena.carve(4096)
    assert storage is not None and arena.contains(storage.data_ptr())
    src = torch.empty(0, dtype=torch.float32).set_(storage)[:1024].view(32, 32)
    src.copy_(torch.arange(1024, dtype=torch.float32).view(32, 32))
    for t in (src, src[::2, 1::3], src.t(), src[5]):
        ref = _tensors.InArena(arena.token, t.data_ptr() - arena.base, tuple(t.shape),
                               tuple(t.stride()), t.dtype)
        back = pickle.loads(pickle.dumps(ref)).tensor()
        assert torch.equal(back, t) and back.data_ptr() == t.data_ptr()
    assert arena.view(0, (0, 3), (3, 1), torch.float32).shape == (0, 3)
    assert arena.carve(2 << 20) is None  # past the arena's end: the caller falls back
    with pytest.raises(RuntimeError, match="arena"):
        _tensors.InArena("gone", 0, (1,), (1,), torch.float32).tensor()


@pytest.mark.parametrize("fmt", ["parquet", "zarr"])
def test_batches_and_views_kept_in_the_main_process_stay_intact_with_workers(
    tmp_path, many_sources, fmt, monkeypatch
):
    monkeypatch.setattr(_tensors, "SHARED_MIN_BYTES", 0)
    monkeypatch.setattr(_streams, "BY_VALUE_BYTES", -1)
    store, arrays = _ingest(tmp_path, many_sources, fmt)
    ds = SimDataset(store, "d", seed=9, prefetch={"chunk_samples": 4, "chunks": 1})
    kept = []
    for i, batch in enumerate(SimDataLoader(ds, batch_size=4, num_workers=2,
                                            multiprocessing_context="fork")):
        if i % 2:  # keep a view of some rows only: it holds the shared buffer too
            kept.append((batch["__key__"][1:3], batch["u"][1:3]))
        else:
            kept.append((batch["__key__"], batch["u"]))
        del batch
    for epoch in (1, 2):
        ds.set_epoch(epoch)
        for batch in SimDataLoader(ds, batch_size=4, num_workers=2,
                                   multiprocessing_context="fork"):
            batch["u"].mul_(-1.0)  # scribble on every later batch's shared memory
    for keys, u in kept:
        for k, row in zip(keys, u, strict=True):
            assert np.array_equal(row.numpy(), arrays[k]), k


def test_small_tensors_leave_workers_by_value_and_large_ones_in_shared_memory(
    tmp_path, many_sources, monkeypatch
):
    store, arrays = _ingest(tmp_path, many_sources, "parquet")
    row = next(iter(arrays.values())).nbytes
    for limit, shared in ((5 * row - 1, True), (5 * row, False)):  # a batch of "u": 5 rows
        monkeypatch.setattr(_streams, "BY_VALUE_BYTES", limit)  # forked workers inherit it
        ds = SimDataset(store, "d", seed=3)
        got = {}
        for batch in SimDataLoader(ds, batch_size=5, num_workers=2,
                                   multiprocessing_context="fork"):
            full = len(batch["__key__"]) == 5  # the last batch may be short, under the limit
            in_shared = batch["u"].is_shared() or _tensors.in_an_arena(batch["u"])
            assert in_shared == (shared and full)
            assert not batch["__pad__"].is_shared()  # a few bytes: by value
            for k, u in zip(batch["__key__"], batch["u"], strict=True):
                got[k] = u.numpy().copy()
        assert sorted(got) == sorted(arrays)
        for k, u in got.items():
            assert np.array_equal(u, arrays[k]), k


def test_decode_depth_defaults_by_process_and_keeps_an_explicit_value():
    from simstore.loaders._pipeline import PrefetchConfig, decode_depth

    auto = PrefetchConfig()
    assert decode_depth(auto, 0, 2) == 4  # the main process, no workers
    assert [decode_depth(auto, w, c) for w, c in [(2, 2), (4, 8), (2, 16), (8, 2)]] == [
        1, 2, 4, 1,
    ]
    assert decode_depth(PrefetchConfig(chunks=3), 2, 2) == 3


def test_chunk_limit_defaults_by_process_and_keeps_an_explicit_value():
    from simstore.loaders._pipeline import PrefetchConfig, chunk_limit

    auto = PrefetchConfig()
    assert chunk_limit(auto, in_worker=False) == 2048
    assert chunk_limit(auto, in_worker=True) == 64
    assert chunk_limit(PrefetchConfig(chunk_samples=8), in_worker=False) == 8
    assert chunk_limit(PrefetchConfig(chunk_samples=8), in_worker=True) == 8


def test_fresh_shared_buffers_are_faulted_in_at_once_and_zeroed():
    import ctypes
    import mmap

    from simstore.loaders._tensors import _new_shared

    from simstore._buffers import libc as _libc

    nbytes = 4 << 20
    storage = _new_shared(nbytes)
    array = torch.empty(0, dtype=torch.uint8).set_(storage).numpy()
    libc = _libc()
    assert libc is not None  # Linux
    page = mmap.PAGESIZE
    start = storage.data_ptr() - storage.data_ptr() % page
    length = nbytes + storage.data_ptr() - start
    resident = (ctypes.c_ubyte * (-(-length // page)))()
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    assert libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(length), resident) == 0
    # every page is in memory before anything was written (MADV_POPULATE_WRITE)
    assert all(b & 1 for b in resident)
    assert not array.any()
    array[::page] = 7
    assert int(array.sum()) == 7 * len(range(0, nbytes, page))


@pytest.mark.parametrize("fmt", ["parquet", "zarr"])
def test_batches_kept_from_an_epoch_survive_the_next_epochs_workers(
    tmp_path, many_sources, fmt, monkeypatch
):
    loader, arrays = _pooled_fork_loader(tmp_path, many_sources, fmt, monkeypatch, 11)
    kept: list[dict] = []
    for epoch in range(3):
        loader.set_epoch(epoch)
        for i, batch in enumerate(loader):
            assert _tensors.in_an_arena(batch["u"])
            if i % 3 == epoch:
                kept.append(batch)  # some batches of every epoch outlive it
        # ``batch``, the loop's last, is still held when the next epoch's workers start
    _assert_intact(kept, arrays)
    assert len(kept) >= 3


@pytest.mark.parametrize("fmt", ["parquet", "zarr"])
def test_an_iterator_left_running_does_not_share_arenas_with_the_next(
    tmp_path, many_sources, fmt, monkeypatch
):
    loader, arrays = _pooled_fork_loader(tmp_path, many_sources, fmt, monkeypatch, 13)
    first = iter(loader)
    held = [next(first)]  # its workers stay alive, decoding ahead into their buffers
    second = list(loader)  # a second iterator while the first one's workers run
    held += list(first)
    assert len(held) > 1 and second
    _assert_intact(held + second, arrays)  # whichever iterator made them


def test_asking_the_default_start_method_does_not_fix_it(tmp_path, many_sources):
    import multiprocessing

    store, arrays = _ingest(tmp_path, many_sources, "zarr")
    before = multiprocessing.get_start_method(allow_none=True)
    loader = SimDataLoader(SimDataset(store, "d", seed=2), batch_size=8, num_workers=1)
    default = before or multiprocessing.get_all_start_methods()[0]
    assert len(loader._worker_arenas()) == 1  # whatever the start method
    assert _forks(loader) == (default == "fork")
    # asking did not fix the process's start method for the caller
    assert multiprocessing.get_start_method(allow_none=True) == before


@pytest.mark.parametrize("fmt", ["parquet", "zarr"])
def test_json_fields_and_float64_parameters_read_back_as_stored(tmp_path, fmt):
    """HDF5 runs with a list attribute (a JSON metadata field) and float64 attributes (scalar
    parameters): a shuffled read (the chunk decode asks every column for an array layout)
    gives the JSON as Python values and the parameters as float64, to the last digit."""
    import h5py

    src = tmp_path / "src"
    src.mkdir()
    res = [0.1 + i / 3 for i in range(6)]
    for i, re in enumerate(res):
        with h5py.File(src / f"run{i}.h5", "w") as f:
            f["u"] = np.full((4, 4), float(i), dtype=np.float32)
            f.attrs["Re"] = re
            f.attrs["tags"] = ["a", "b"]
    store = str(tmp_path / "store")
    Catalog.init(store)
    simstore.ingest([str(src)], dataset="h", store=store, format=fmt, snapshot=True,
                    message="t")
    samples = list(SimDataset(store, "h", seed=1))
    assert len(samples) == 6
    for s in samples:
        i = int(s["u"][0, 0])
        assert s["Re"].dtype == torch.float64 and s["Re"].item() == res[i]
        assert isinstance(s["metadata"], dict)
    batch = next(iter(SimDataLoader(SimDataset(store, "h", seed=1), batch_size=3)))
    assert batch["Re"].dtype == torch.float64
    assert len(batch["metadata"]) == 3 and isinstance(batch["metadata"][0], dict)


def test_the_release_tracker_finds_shared_tensors_among_keys_and_parameters():
    """A batch's list of keys and its scalar parameters hold no tensor: the main process
    skips them (it walks every batch it receives), and still finds every shared tensor,
    at any depth, among them."""
    from simstore.loaders._tensors import _shared_tensors

    shared = [torch.zeros(4).share_memory_() for _ in range(4)]
    private = torch.zeros(4)
    batch = {
        "__key__": [f"k{i}" for i in range(256)],
        "u": shared[0],
        "p": [1.5, 2, None, True, b"x", private],
        "nested": ("name", {"deep": [shared[1], "s", [shared[2]]]}),
        "mesh": [{"points": shared[3], "name": "a"}],
    }
    found = _shared_tensors(batch)
    assert [t.data_ptr() for t in found] == [t.data_ptr() for t in shared]
    assert _shared_tensors({"__key__": ["a", "b"], "p": 3.0}) == []
