"""Shard writers reserve disk blocks ahead of their writes and give back what is left."""

import os

import numpy as np
import pytest
from blocks import allocated, holds_no_block_past_its_end
from simstore.formats import ParquetFormat, ZarrFormat

from simstore._reserve import Reservation
from simstore.ingest import ShardOptions
from simstore.sample import Sample


def test_a_reservation_allocates_past_the_end_and_gives_back_the_rest(tmp_path):
    path = tmp_path / "f"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        r = Reservation(fd, step=1 << 20)
        r.ahead(100)
        assert r.end == 100 + (1 << 20)
        assert os.fstat(fd).st_size == 0  # the size is left alone
        assert allocated(path) >= 1 << 20
        os.write(fd, b"x" * 100)
        r.ahead(100)  # within what is reserved: nothing more
        assert r.end == 100 + (1 << 20)
        r.release(100)
        assert os.fstat(fd).st_size == 100
        assert holds_no_block_past_its_end(path)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"x" * 100


def test_a_descriptor_that_cannot_reserve_is_written_as_before():
    read, write = os.pipe()
    try:
        r = Reservation(write)
        r.ahead(1 << 20)  # a pipe has no blocks: refused, and not asked again
        assert r.end == 0
        assert r._fallocate is None
        r.release(0)
        os.write(write, b"ok")
        assert os.read(read, 2) == b"ok"
    finally:
        os.close(read)
        os.close(write)


@pytest.mark.parametrize("fmt", [ParquetFormat, ZarrFormat])
def test_a_finished_shard_holds_no_block_past_its_end(tmp_path, fmt):
    samples = [
        Sample(f"s{i}", {"x": np.full((64, 1024), i, np.float32), "n": np.int64(i)})
        for i in range(8)
    ]
    path = tmp_path / "shard"
    fmt(ShardOptions(compression="none")).write(samples, str(path))
    assert os.stat(path).st_size > 8 * 64 * 1024 * 4
    assert holds_no_block_past_its_end(path)
    reader = fmt(ShardOptions()).open(str(path))
    assert [int(row["n"]) for row in reader.read(range(8), ["n"])] == list(range(8))
    reader.close()


def test_a_disk_that_fills_part_way_keeps_no_reserved_block(tmp_path):
    import ctypes
    import errno

    from simstore._reserve import _fallocate

    path = tmp_path / "f"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    real = _fallocate()

    def fills_half_way(fd, mode, offset, length):  # as a nearly full disk would
        real(fd, mode, offset, length // 2)
        ctypes.set_errno(errno.ENOSPC)
        return -1

    try:
        r = Reservation(fd, step=4 << 20)
        r._fallocate = fills_half_way
        r.ahead(10)
        assert allocated(path) >= 2 << 20  # half of it was allocated
        assert r._fallocate is None  # and nothing more is asked
        os.write(fd, b"y" * 10)
        r.release(10)
        assert holds_no_block_past_its_end(path)
    finally:
        os.close(fd)


def test_a_zip_shard_file_reserves_each_large_write_exactly(tmp_path):
    from simstore.formats._zip import HashingFile

    path = tmp_path / "z"
    f = HashingFile(str(path))
    f.write(b"x" * (1 << 20))
    assert allocated(path) >= 1 << 20  # reserved before it was written
    assert f._reserved.end == 1 << 20  # and no further
    f.close()
    assert os.stat(path).st_size == 1 << 20
    assert holds_no_block_past_its_end(path)


@pytest.mark.parametrize("fmt", [ParquetFormat, ZarrFormat])
@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_a_shard_writer_gives_nothing_back_with_a_truncate(tmp_path, monkeypatch, fmt,
                                                           compression):
    # a truncate that frees reserved blocks waits, on ext4 in ordered mode, for the
    # writeback the journal is committing: up to 123 ms each under sustained writes,
    # 0.3 s of a 3 GiB ingest in 32 MiB shards
    from simstore import _reserve

    cuts: list[int] = []
    real = os.ftruncate
    monkeypatch.setattr(_reserve.os, "ftruncate", lambda fd, n: (cuts.append(n), real(fd, n)))
    samples = [Sample(f"s{i}", {"x": np.full((512, 1024), i, np.float32)}) for i in range(6)]
    path = tmp_path / "shard"
    fmt(ShardOptions(compression=compression)).write(samples, str(path))
    assert cuts == []
    assert holds_no_block_past_its_end(path)
