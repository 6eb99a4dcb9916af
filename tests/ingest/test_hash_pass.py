"""The source hash's pass over a file also takes the CRC-32s its adapter checks."""

import os
import zlib

import pytest

import simstore.ingest._filehash as sources
from simstore.ingest._filehash import hash_file, hash_file_checked


@pytest.mark.parametrize("size", [0, 100_000, 3 * (1 << 20) + 12_345])
def test_one_pass_gives_the_hash_and_each_ranges_crc(tmp_path, monkeypatch, size):
    # small windows and blocks, so ranges cross both
    monkeypatch.setattr(sources, "_HASH_WINDOW", 1 << 20)
    monkeypatch.setattr(sources, "_CHECK_BLOCK", 96 * 1024)
    path = tmp_path / "f.bin"
    data = os.urandom(size)
    path.write_bytes(data)
    ranges = [
        (0, size),  # the whole file
        (size // 3, size // 3),  # across windows and blocks
        ((1 << 20) - 5, 10),  # across a window's end (past the end of small files)
        (size // 2, 0),  # empty
        (size - 7, 20),  # past the end
        (size + 1, 1),
    ]
    oid, got_size, crcs = hash_file_checked(str(path), ranges)
    assert (oid, got_size) == hash_file(str(path))
    for (offset, n), crc in zip(ranges, crcs, strict=True):
        if offset + n <= size:
            assert crc == zlib.crc32(data[offset : offset + n]), (offset, n)
        else:
            assert crc is None, (offset, n)


@pytest.mark.parametrize("ranges", [[], [(0, 1 << 20)]])
def test_an_interrupt_during_a_blocks_hash_is_the_interrupt(tmp_path, monkeypatch, ranges):
    """A mapped file: the block being hashed is released before the map is closed, so
    Ctrl-C is raised as itself, not as the BufferError of closing a map still exported."""
    path = tmp_path / "big.bin"
    path.write_bytes(os.urandom(3 << 20))  # mapped: past the size read whole
    real = sources.Hasher

    class Interrupted(real):  # type: ignore[misc, valid-type]
        def update(self, data):
            raise KeyboardInterrupt

    monkeypatch.setattr(sources, "Hasher", Interrupted)
    with pytest.raises(KeyboardInterrupt):
        hash_file_checked(str(path), ranges)
