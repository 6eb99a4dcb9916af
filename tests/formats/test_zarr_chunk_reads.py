"""How many calls a Zarr shard's chunk reads take, and that the shortcut they take (a
chunk's local header read with its data) gives way to the careful read on any zip whose
layout is not the writer's."""

import os
import zipfile

import numpy as np
from simstore.formats import open_shard
from simstore.loaders import SimDataset
from stored_samples import zarr_shard_of

_CHUNK = (1, 256, 256)
"""256 KiB of float32 a chunk: large enough for the writer to page-align it."""


def _store(tmp_path):
    """Four samples: ``u`` (four aligned chunks) and ``k``, a 0-d field (``k == i``)."""
    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(3)
    arrays = {}
    for i in range(4):
        u = rng.standard_normal((4, 256, 256)).astype(np.float32)
        arrays[f"r{i}"] = u
        np.savez(src / f"r{i}.npz", u=u, k=np.float64(i))
    store, _, path = zarr_shard_of(tmp_path, src, chunks={"u": _CHUNK})
    return store, path, arrays


def test_a_fresh_reader_reads_each_chunk_with_its_header_in_one_call(tmp_path, monkeypatch):
    _, path, arrays = _store(tmp_path)
    reader = open_shard(path)
    calls = []
    pread, preadv = os.pread, os.preadv

    def counted_pread(fd, n, offset):
        calls.append("pread")
        return pread(fd, n, offset)

    def counted_preadv(fd, buffers, offset):
        calls.append("preadv")
        return preadv(fd, buffers, offset)

    careful = []
    entry = reader._entry
    monkeypatch.setattr(os, "pread", counted_pread)
    monkeypatch.setattr(os, "preadv", counted_preadv)
    monkeypatch.setattr(reader, "_entry", lambda key: careful.append(key) or entry(key))
    try:
        [got] = reader.read([2])
        [again] = reader.read([2])
    finally:
        monkeypatch.undo()
        reader.close()
    np.testing.assert_array_equal(got["u"], arrays["r2"])
    np.testing.assert_array_equal(again["u"], arrays["r2"])
    assert float(got["k"]) == 2.0
    # the first read: the group's, u's and k's zarr.json, k's chunk (each with its local
    # header, one pread) and u's four chunks (each with its local header, one preadv);
    # the second: the nodes are parsed and the chunks' places known
    assert calls.count("preadv") == 8
    assert calls.count("pread") == 4 + 1  # k's chunk again, its data alone
    assert careful == []  # no entry read the careful way (a header read, a seek, a read)


def test_aligned_chunks_rezipped_without_their_padding_read_the_same(tmp_path):
    """A zip tool's copy of a shard has no padding records: a chunk's data is then not
    where the writer's layout puts it, which the header read with it gives away."""
    store, path, arrays = _store(tmp_path)
    rewritten = str(tmp_path / "rewritten.zip")
    with zipfile.ZipFile(path) as old, zipfile.ZipFile(rewritten, "w") as new:
        for info in old.infolist():
            copy = zipfile.ZipInfo(info.filename, info.date_time)
            copy.compress_type = zipfile.ZIP_STORED
            new.writestr(copy, old.read(info.filename))
    with zipfile.ZipFile(rewritten) as z:
        starts = [z.getinfo(f"{p}/u/c/{c}/0/0").header_offset + 30 + len(f"{p}/u/c/{c}/0/0")
                  for p in range(4) for c in range(4)]
    assert any(s % 4096 for s in starts)  # chunks that are no longer page-aligned
    os.chmod(path, 0o644)
    os.replace(rewritten, path)
    reader = open_shard(path)
    try:
        for p, got in zip(range(4), reader.read(range(4)), strict=True):
            np.testing.assert_array_equal(got["u"], arrays[f"r{p}"])
            assert float(got["k"]) == p
    finally:
        reader.close()
    for map_files in ("first", True, False):
        got = {s["__key__"]: s["u"].numpy() for s in
               SimDataset(store, "d", shuffle=False, verify=False, map_files=map_files)}
        assert sorted(got) == sorted(arrays)
        for key, u in arrays.items():
            np.testing.assert_array_equal(got[key], u)


def test_a_closed_reader_let_go_is_freed_without_the_cyclic_collector(tmp_path):
    """Found by an audit: a reader and its node metadata pointed at each other, so a closed
    reader let go (its files, zip index, decoders) waited for the cyclic collector; a
    long job kept megabytes of them between collections."""
    import gc
    import weakref

    _, path, arrays = _store(tmp_path)
    gc.disable()
    try:
        reader = open_shard(path)
        [got] = reader.read([1])
        np.testing.assert_array_equal(got["u"], arrays["r1"])
        reader.close()
        gone = weakref.ref(reader)
        del reader, got
        assert gone() is None
    finally:
        gc.enable()
