"""A trusted shard's page layout, kept and used by a later open instead of the Arrow file.

A reader opened from a layout reads the same rows as one opened from the file, without
opening the file in Arrow for a read from the pages; anything else it reads opens the
file then. A layout that does not fit (damaged, another shard's, a file of another size,
a page outside the file) is refused, so the shard opens as usual.
"""

from __future__ import annotations

import os
import shutil
import struct

import numpy as np
import pytest
from simstore.formats import ParquetFormat, open_shard
from simstore.formats._layout import ShardLayout
from test_parquet_pages import BulkOut, _samples, _write

SHARD = "ab" * 16


def _trusted(path):
    reader = open_shard(path)
    reader.trust()
    return reader


def _bulk(reader, positions, fields=("u", "Re")):
    return list(reader.read(positions, list(fields), out=BulkOut(len(positions))))


def test_a_reader_from_a_layout_reads_the_same_rows_without_opening_the_file(tmp_path):
    samples = _samples(40)
    path = _write(tmp_path, samples)
    first = _trusted(path)
    assert first.layout_bytes(SHARD) is not None
    data = first.layout_bytes(SHARD)
    positions = [int(p) for p in np.random.default_rng(3).permutation(40)[:30]]
    want = _bulk(first, positions)
    laid = ParquetFormat().open_laid_out(path, data, SHARD)
    assert laid is not None
    laid.trust()
    got = _bulk(laid, positions)
    assert laid._file is None  # no Arrow file opened: rows from the pages alone
    assert laid.paged_reads == 1 and laid.direct_rows == len(positions)
    assert laid.num_samples == first.num_samples == 40
    assert laid.schema == first.schema
    for g, w, p in zip(got, want, positions, strict=True):
        np.testing.assert_array_equal(g["u"], samples[p].fields["u"])
        np.testing.assert_array_equal(g["u"], w["u"])
        assert g["Re"] == w["Re"] == float(p)
    # a read the pages cannot serve (the keys, strings) opens the file then
    assert laid.keys() == [s.key for s in samples]
    assert laid._file is not None
    assert laid.layout_bytes(SHARD) is None  # opened from one: nothing new to keep
    laid.close()
    first.close()


def test_only_a_trusted_reader_gives_its_layout(tmp_path):
    path = _write(tmp_path, _samples(10))
    reader = open_shard(path)
    assert reader.layout_bytes(SHARD) is None  # its bytes not yet hashed to an id
    reader.trust()
    assert ShardLayout.from_bytes(reader.layout_bytes(SHARD), SHARD).counts
    reader.close()


def test_a_layout_of_a_compressed_shard_keeps_only_the_plain_fields(tmp_path):
    # zstd pages are decoded; the scalar column is plain in every row group
    samples = _samples(12)
    path = _write(tmp_path, samples, compression="zstd")
    reader = _trusted(path)
    data = reader.layout_bytes(SHARD)
    layout = ShardLayout.from_bytes(data, SHARD)
    assert all(got is None for (_g, leaf, _s), got in layout.pages.items()
               if layout.columns["u"] is not None and leaf == layout.columns["u"].leaf)
    laid = ParquetFormat().open_laid_out(path, data, SHARD)
    laid.trust()
    got = _bulk(laid, [5, 1, 9])
    for g, p in zip(got, [5, 1, 9], strict=True):
        np.testing.assert_array_equal(g["u"], samples[p].fields["u"])
        assert g["Re"] == float(p)
    reader.close()
    laid.close()


def _layout(tmp_path):
    path = _write(tmp_path, _samples(20))
    reader = _trusted(path)
    data = reader.layout_bytes(SHARD)
    reader.close()
    return path, data


def test_a_damaged_or_misplaced_layout_is_refused(tmp_path):
    path, data = _layout(tmp_path)
    fmt = ParquetFormat()
    assert fmt.open_laid_out(path, data, SHARD) is not None
    flipped = bytearray(data)
    flipped[-3] ^= 0x10
    assert fmt.open_laid_out(path, bytes(flipped), SHARD) is None  # checksum
    assert fmt.open_laid_out(path, data[:-8], SHARD) is None  # cut short
    assert fmt.open_laid_out(path, data, "cd" * 16) is None  # another shard's
    assert fmt.open_laid_out(path, b"not a layout", SHARD) is None
    other = str(tmp_path / "other.parquet")
    shutil.copy(path, other)
    with open(other, "ab") as f:
        f.write(b"\0")
    assert fmt.open_laid_out(other, data, SHARD) is None  # a file of another size


def _resealed(data: bytes, edit) -> bytes:
    """``data`` with its arrays changed by ``edit`` and its checksum made right again."""
    import xxhash
    from simstore.formats import _layout

    magic, _sum, head, schema = _layout._HEAD.unpack_from(data)
    body = bytearray(data[_layout._HEAD.size:])
    edit(body)
    return _layout._HEAD.pack(magic, xxhash.xxh3_64_intdigest(bytes(body)), head,
                              schema) + bytes(body)


def test_a_layout_whose_pages_lie_outside_the_file_is_refused(tmp_path):
    path, data = _layout(tmp_path)
    size = os.path.getsize(path)

    def far(body: bytearray) -> None:  # the last page's value offset past the file's end
        struct.pack_into("<q", body, len(body) - 8, size)

    def unordered(body: bytearray) -> None:  # a group's first page not at its row 0
        layout = ShardLayout.from_bytes(data, SHARD)
        pages = sum(1 for v in layout.pages.values() if v is not None)
        n = sum(len(v[0]) for (g, leaf, s), v in layout.pages.items()
                if v is not None and leaf == layout.columns["u"].leaf)
        assert pages and n
        # the blob column's arrays come last: its first rows, then its value offsets
        struct.pack_into("<q", body, len(body) - 16 * n, 1)

    for edit in (far, unordered):
        bad = _resealed(data, edit)
        with pytest.raises(ValueError):
            ShardLayout.from_bytes(bad, SHARD)
        assert ParquetFormat().open_laid_out(path, bad, SHARD) is None
