"""Parquet, Lance and Zarr shards: the conformance suite, plus what each promises to stock readers."""

import io
import zipfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from simstore.formats import (
    LanceFormat,
    ParquetFormat,
    ZarrFormat,
    auto_chunks,
    get_format,
    list_formats,
    open_shard,
)
from simstore.formats.adapters import SlicedArray
from simstore.formats.testing import ShardFormatTests, assert_fields_equal, example_samples

from simstore.errors import FormatError, InvalidInputError
from simstore.ingest import ShardOptions
from simstore.sample import Sample, hash_sample


class TestParquet(ShardFormatTests):
    @pytest.fixture
    def shard_format(self):
        return ParquetFormat()


class TestParquetUncompressed(ShardFormatTests):
    @pytest.fixture
    def shard_format(self):
        return ParquetFormat(ShardOptions(compression="none", row_group_bytes=64))


class TestLance(ShardFormatTests):
    @pytest.fixture
    def shard_format(self):
        return LanceFormat()


class TestZarr(ShardFormatTests):
    @pytest.fixture
    def shard_format(self):
        return ZarrFormat(ShardOptions(chunk_bytes=64))


class TestZarrZstd(ShardFormatTests):
    @pytest.fixture
    def shard_format(self):
        return ZarrFormat(ShardOptions(compression="zstd:5"))


def test_registry_lists_the_builtin_formats():
    assert {"parquet", "lance", "zarr"} <= set(list_formats())
    assert isinstance(get_format("zarr"), ZarrFormat)
    with pytest.raises(InvalidInputError, match="unknown shard format 'nope'"):
        get_format("nope")


def test_open_shard_refuses_unknown_bytes(tmp_path):
    path = tmp_path / "x"
    path.write_bytes(b"not a shard at all")
    with pytest.raises(FormatError, match="not a shard of any installed format"):
        open_shard(path)


def test_stock_pyarrow_reads_parquet_with_fixed_shape_tensors(tmp_path):
    samples = example_samples()
    ParquetFormat().write(samples, str(tmp_path / "s.parquet"))
    table = pq.read_table(tmp_path / "s.parquet")
    assert table.column("__key__").to_pylist() == [s.key for s in samples]
    vel = table.column("velocity").combine_chunks()
    assert isinstance(vel.type, pa.FixedShapeTensorType)
    np.testing.assert_array_equal(
        vel.to_numpy_ndarray(), np.stack([s.fields["velocity"] for s in samples])
    )
    # varying shapes: raw little-endian bytes + shape (byte-shuffled under shuffle-zstd)
    from numcodecs import Shuffle

    points = table.column("points").to_pylist()[1]
    raw = Shuffle(elementsize=8).decode(points["data"])
    np.testing.assert_array_equal(
        np.frombuffer(raw, "<f8").reshape(points["shape"]), samples[1].fields["points"]
    )
    ParquetFormat(ShardOptions(compression="zstd")).write(samples, str(tmp_path / "z.parquet"))
    points = pq.read_table(tmp_path / "z.parquet").column("points").to_pylist()[1]
    np.testing.assert_array_equal(
        np.frombuffer(points["data"], "<f8").reshape(points["shape"]), samples[1].fields["points"]
    )


def test_parquet_shuffle_uses_byte_stream_split_for_floats(tmp_path):
    samples = example_samples()
    ParquetFormat(ShardOptions(compression="shuffle-zstd:1")).write(samples, str(tmp_path / "a"))
    meta = pq.ParquetFile(tmp_path / "a").metadata.row_group(0)
    encodings = {
        meta.column(i).path_in_schema: meta.column(i).encodings for i in range(meta.num_columns)
    }
    assert "BYTE_STREAM_SPLIT" in encodings["velocity.list.element"]
    assert "BYTE_STREAM_SPLIT" in encodings["dt"]
    assert "BYTE_STREAM_SPLIT" not in encodings["steps"]


def test_stock_lance_reads_lance_shards(tmp_path):
    import lance.file

    samples = example_samples()
    LanceFormat().write(samples, str(tmp_path / "s.lance"))
    table = lance.file.LanceFileReader(str(tmp_path / "s.lance")).read_all().to_table()
    assert table.column("__key__").to_pylist() == [s.key for s in samples]
    flat = np.array(table.column("velocity").to_pylist()[2], dtype=np.float32)
    np.testing.assert_array_equal(flat.reshape(3, 4, 2), samples[2].fields["velocity"])


def test_stock_zarr_opens_the_zip_and_windows_read_only_their_chunks(tmp_path):
    import zarr

    rng = np.random.default_rng(1)
    big = rng.standard_normal((8, 32, 32)).astype(np.float32)
    samples = [Sample("a", {"rho": big, "Re": 10.0, "name": "x"}), Sample("b", {"rho": big + 1})]
    ZarrFormat(ShardOptions(chunk_bytes=4096)).write(samples, str(tmp_path / "s.zarr.zip"))
    with zipfile.ZipFile(tmp_path / "s.zarr.zip") as zf:
        infos = zf.infolist()
        assert all(i.compress_type == zipfile.ZIP_STORED for i in infos)
        assert {i.date_time for i in infos} == {(1980, 1, 1, 0, 0, 0)}
    store = zarr.storage.ZipStore(str(tmp_path / "s.zarr.zip"), mode="r")
    root = zarr.open_group(store, mode="r")
    arr = root["1/rho"]
    assert arr.chunks == auto_chunks(big.shape, 4, 4096)
    np.testing.assert_array_equal(arr[2:5, 3:9, :], (big + 1)[2:5, 3:9, :])
    assert root["0"].attrs["simstore"]["key"] == "a"
    store.close()
    reader = open_shard(tmp_path / "s.zarr.zip")
    window = reader.read_slices(0, {"rho": (slice(1, 3), slice(0, 4), slice(5, 6))})
    np.testing.assert_array_equal(window["rho"], big[1:3, 0:4, 5:6])
    assert reader.array(1, "rho").shape == big.shape
    reader.close()


def test_zarr_writes_lazy_sources_slab_by_slab(tmp_path, monkeypatch):
    import simstore.formats._zarr_write as zarr_writer

    monkeypatch.setattr(zarr_writer, "SLAB_CHUNKS", 5)  # 40,960 bytes of 8 KiB chunks
    class Counting:
        """A sliceable handle that records how much each read returns."""

        def __init__(self, data):
            self.data, self.shape, self.dtype, self.reads = data, data.shape, data.dtype, []

        def __getitem__(self, box):
            out = self.data[box]
            self.reads.append(out.nbytes)
            return out

    data = np.arange(64 * 64 * 8, dtype=np.float64).reshape(64, 64, 8)
    handle = Counting(data)
    lazy = SlicedArray(handle, path="mem", field="big")
    fmt = ZarrFormat(ShardOptions(chunk_bytes=8192, compression="none"))
    result = fmt.write([Sample("k", {"big": lazy})], str(tmp_path / "s"))
    # one hashing pass in blocks of block_bytes, then the write reads slabs of whole
    # trailing axes, each at most SLAB_BYTES, reading every value once
    assert handle.reads[0] == data.nbytes
    assert len(handle.reads) > 2 and max(handle.reads[1:]) <= 5 * 8192
    assert sum(handle.reads[1:]) == data.nbytes
    assert result.samples[0].sample_hash == hash_sample(Sample("k", {"big": data}))
    reader = fmt.open(str(tmp_path / "s"))
    assert_fields_equal(next(iter(reader.read([0]))), {"big": data})
    reader.close()


def test_zarr_refuses_a_field_that_is_also_a_group(tmp_path):
    bad = Sample("k", {"a": np.zeros(2), "a/b": np.zeros(2)})
    with pytest.raises(InvalidInputError, match="both an array and a group"):
        ZarrFormat().write([bad], str(tmp_path / "s"))
    assert not (tmp_path / "s").exists()


def test_slabs_span_whole_trailing_axes_within_the_bound():
    from simstore.formats._zarr import slab_axes

    mib = 1 << 20
    assert slab_axes((64, 512, 512), (16, 128, 128), 4, mib) == 3  # chunk by chunk
    assert slab_axes((64, 512, 512), (16, 128, 128), 4, 16 * mib) == 1  # (16, 512, 512)
    assert slab_axes((16, 512, 512), (16, 128, 128), 4, 16 * mib) == 0  # the whole field
    assert slab_axes((4, 4096, 4096), (1, 1024, 1024), 4, 16 * mib) == 2  # (1, 1024, 4096)
    assert slab_axes((8, 8), (1, 1), 1 << 30, 16 * mib) == 2  # one chunk is the least


def test_auto_chunks_stay_under_target_and_near_cubic():
    # fields above CONTIGUOUS_FIELD_CHUNKS targets: near-cubic, for crops of big grids
    assert auto_chunks((64, 256, 256), 4, 1 << 20) == (64, 64, 64)
    assert auto_chunks((64, 1024, 1024), 4, 1 << 20) == (64, 64, 64)
    assert auto_chunks((10,), 8, 1 << 20) == (10,)


def test_auto_chunks_of_a_field_read_whole_are_contiguous_runs():
    # a 4 MiB field: one time step per chunk, each a contiguous slab of the array
    assert auto_chunks((4, 64, 64, 64), 4, 1 << 20) == (1, 64, 64, 64)
    # rows of a slab when a slab is over the target; a divisor of the axis when close
    assert auto_chunks((2, 1024, 1024), 4, 1 << 20) == (1, 256, 1024)
    assert auto_chunks((2, 5, 300, 300), 8, 1 << 20) == (1, 1, 300, 300)
    # a prime length takes a padded edge chunk rather than chunks of one element
    assert auto_chunks((1_000_003,), 8, 1 << 20) == (131072,)
    assert auto_chunks((0, 5), 8, 16) == (1, 1)
    for shape, itemsize in [((4, 64, 64, 64), 4), ((2, 1024, 1024), 4), ((999, 17), 8)]:
        chunk = auto_chunks(shape, itemsize, 1 << 20)
        assert int(np.prod(chunk)) * itemsize <= 1 << 20
        lead = next((i for i, c in enumerate(chunk) if c != 1), len(chunk) - 1)
        assert chunk[lead + 1 :] == shape[lead + 1 :]


@pytest.mark.parametrize(
    "shape,chunks",
    [((5, 6, 7), None), ((10, 6, 7), (4, 6, 7)), ((3, 10, 7), (1, 4, 7)), ((3, 4, 5), (2, 2, 5))],
)
def test_zarr_whole_reads_of_contiguous_and_other_chunkings(tmp_path, shape, chunks):
    rng = np.random.default_rng(3)
    data = rng.standard_normal(shape).astype(np.float32)
    opts = ShardOptions(chunk_bytes=64, compression="none", chunks={"x": chunks} if chunks else {})
    fmt = ZarrFormat(opts)
    fmt.write([Sample("a", {"x": data}), Sample("b", {"x": data * 2})], str(tmp_path / "s"))
    reader = fmt.open(str(tmp_path / "s"))
    got = [s["x"] for s in reader.read([1, 0])]
    np.testing.assert_array_equal(got[0], data * 2)
    np.testing.assert_array_equal(got[1], data)
    buf = np.full((2, *shape), np.nan, dtype=np.float32)
    list(reader.read([0, 1], out=lambda i, name, shp, dt: buf[i]))
    np.testing.assert_array_equal(buf, np.stack([data, data * 2]))
    assert reader.checked_bytes([0, 1]) == 2 * reader.checked_bytes([1], ["x"]) > 0
    reader.trust()
    assert reader.checked_bytes([0, 1]) == 0
    reader.close()


def test_columnar_shards_refuse_conflicting_specs_within_a_shard(tmp_path):
    a = Sample("a", {"x": np.zeros(3, np.float32)})
    b = Sample("b", {"x": np.zeros(3, np.float64)})
    with pytest.raises(InvalidInputError, match="field 'x' is tensor float64"):
        ParquetFormat().write([a, b], str(tmp_path / "s"))


def test_file_object_reads_do_not_need_a_path(tmp_path):
    samples = example_samples(3)
    buf = io.BytesIO()
    ZarrFormat().write(samples, str(tmp_path / "z"))
    buf.write((tmp_path / "z").read_bytes())
    reader = open_shard(buf, head=buf.getvalue()[:8], tail=buf.getvalue()[-8:])
    assert reader.keys() == [s.key for s in samples]
    reader.close()


@pytest.mark.parametrize("compression", ["none", "zstd:1", "shuffle-zstd:1"])
def test_zarr_windows_equal_numpy_slicing_and_stock_zarr(tmp_path, compression):
    rng = np.random.default_rng(5)
    data = rng.standard_normal((9, 10, 11)).astype(np.float32)
    ints = rng.integers(0, 100, size=(7, 5)).astype(np.int16)
    fmt = ZarrFormat(ShardOptions(compression=compression, chunk_bytes=256))
    fmt.write([Sample("a", {"f": data, "i": ints})], str(tmp_path / "s"))
    reader = fmt.open(str(tmp_path / "s"))
    try:
        for _ in range(20):
            box = []
            for n in data.shape:
                a = int(rng.integers(0, n))
                box.append(slice(a, int(rng.integers(a + 1, n + 1))))
            got = reader.read_slices(0, {"f": tuple(box), "i": (slice(2, 6),)})
            np.testing.assert_array_equal(got["f"], data[tuple(box)])
            np.testing.assert_array_equal(got["i"], ints[2:6])
            np.testing.assert_array_equal(reader.array(0, "f")[tuple(box)], data[tuple(box)])
        with pytest.raises(InvalidInputError, match="no tensor field 'nope'"):
            reader.read_slices(0, {"nope": (slice(0, 1),)})
    finally:
        reader.close()


def test_zarr_entries_are_the_bytes_zipfile_writes_with_valid_crcs(tmp_path, monkeypatch):
    from simstore.formats import _zip

    rng = np.random.default_rng(4)
    samples = [
        Sample(f"k{i}", {"u": rng.standard_normal((3, 40, 50)).astype(np.float32), "Re": 1.5})
        for i in range(3)
    ]
    fmt = ZarrFormat(ShardOptions(chunk_bytes=8192, compression="none"))
    fmt.write(samples, str(tmp_path / "fast"))
    with zipfile.ZipFile(tmp_path / "fast") as zf:
        assert zf.testzip() is None  # every entry's CRC-32 checks out with zlib's
    monkeypatch.setattr(_zip, "write_stored", lambda zf, info, data: zf.writestr(info, data))
    fmt.write(samples, str(tmp_path / "stock"))
    assert (tmp_path / "fast").read_bytes() == (tmp_path / "stock").read_bytes()


def test_a_zarr_shard_is_hashed_as_it_is_written(tmp_path, monkeypatch):
    """The writer's object id is the file's (so ingest need not read it again); a write
    that seeks back over what it wrote (zipfile's own ``writestr``) leaves no id."""
    from simstore.formats import _zip

    from simstore.hashing import hash_file

    rng = np.random.default_rng(5)
    samples = [
        Sample(f"k{i}", {"u": rng.standard_normal((2, 300, 400)).astype(np.float32), "n": i})
        for i in range(3)
    ]
    fmt = ZarrFormat(ShardOptions(chunk_bytes=96 << 10, compression="none"))
    writer = fmt.open_writer(str(tmp_path / "a"))
    for s in samples:
        writer.add(s, sample_hash=hash_sample(s), size_bytes=0)
    result = writer.close()
    assert result.object_id == hash_file(str(tmp_path / "a"))[0]
    monkeypatch.setattr(_zip, "write_stored", lambda zf, info, data: zf.writestr(info, data))
    writer = fmt.open_writer(str(tmp_path / "b"))
    writer.add(samples[0], sample_hash=hash_sample(samples[0]), size_bytes=0)
    assert writer.close().object_id is None


def test_hashing_file_counts_small_and_large_writes_and_gives_up_on_seeking_back(tmp_path):
    from simstore.formats._zip import HashingFile

    from simstore.hashing import hash_bytes

    parts = [b"h" * 10, bytes(range(256)) * 1024, b"t" * 70_000, b"", b"x"]
    f = HashingFile(str(tmp_path / "f"))
    for p in parts:
        assert f.write(p) == len(p)
    assert f.tell() == sum(map(len, parts))
    assert f.seek(f.tell()) == f.tell()  # to where it is: nothing changes
    assert f.object_id() == hash_bytes(b"".join(parts))
    f.close()
    assert (tmp_path / "f").read_bytes() == b"".join(parts)
    g = HashingFile(str(tmp_path / "g"))
    g.write(b"abcdef")
    g.seek(2)
    g.write(b"Z")
    assert g.object_id() is None
    g.close()
    assert (tmp_path / "g").read_bytes() == b"abZdef"


@pytest.mark.parametrize("source", ["path", "file object"])
def test_parquet_row_groups_decode_into_the_shard_memory_pool(tmp_path, source):
    # pyarrow's default allocator hands freed row groups back to the system at once; the
    # reader decodes into memory_pool() instead (jemalloc, or the system allocator)
    from simstore.formats._arrow import memory_pool

    samples = [Sample(f"s{i}", {"x": np.full(4096, i, np.float32)}) for i in range(64)]
    path = tmp_path / "p"
    ParquetFormat(ShardOptions(compression="none")).write(samples, str(path))
    f = open(path, "rb") if source == "file object" else None
    reader = open_shard(f if f is not None else str(path))
    pool = memory_pool()
    before = pool.bytes_allocated()
    table = reader._row_group(0, ("x",))
    assert pool.bytes_allocated() - before >= 64 * 4096 * 4
    assert [row["x"][0] for row in reader.read(range(0, 64, 9), ["x"])] == list(range(0, 64, 9))
    del table
    reader.close()
    if f is not None:
        assert not f.closed  # the caller's file stays the caller's
        f.close()


def test_zarr_reader_index_equals_zipfiles_and_other_zips_still_open(tmp_path, monkeypatch):
    import json

    from simstore.formats import _zip

    samples = example_samples(5, seed=3)
    ZarrFormat(ShardOptions(chunk_bytes=4096)).write(samples, str(tmp_path / "s"))
    with zipfile.ZipFile(tmp_path / "s") as zf:
        # the same entries re-zipped: another order, deflated, Zip64 local headers, the
        # root's keys in another order (so its consolidated metadata is what the reader
        # parses)
        with zipfile.ZipFile(tmp_path / "other", "w", zipfile.ZIP_DEFLATED) as out:
            for info in reversed(zf.infolist()):
                data = zf.read(info)
                if info.filename == "zarr.json":
                    data = json.dumps({"zarr_format": 3, **json.loads(data)}).encode()
                with out.open(info.filename, "w", force_zip64=True) as w:
                    w.write(data)
    for path in ("s", "other"):
        with zipfile.ZipFile(tmp_path / path) as zf, open(tmp_path / path, "rb") as f:
            index = _zip.zip_index(f)
            assert index is not None
            assert {n: tuple(i) for n, i in index.items()} == {
                i.filename: (i.header_offset, i.compress_size, i.compress_type, i.CRC)
                for i in zf.infolist()
            }
    for fallback in (False, True):  # fallback: zipfile reads the directory
        if fallback:
            monkeypatch.setattr(_zip, "zip_index", lambda f: None)
        for path in ("s", "other"):
            reader = ZarrFormat().open(str(tmp_path / path))
            try:
                assert reader.keys() == [s.key for s in samples]
                for got, want in zip(reader.read(range(len(samples))), samples, strict=True):
                    assert_fields_equal(got, want.fields)
            finally:
                reader.close()


@pytest.mark.parametrize("compression", ["none", "zstd:1"])
def test_zarr_gathers_boxes_of_every_size_and_dtype_into_right_chunks(tmp_path, compression):
    """Chunks cut from the middle of a field (and padded at its edges) are gathered into one
    buffer the writer reuses (from the ingest memory pool past 1 MiB): every chunk
    of every field, across dtypes, sizes and samples, still holds its own values."""
    import zarr

    rng = np.random.default_rng(9)
    samples = [
        Sample(
            f"k{i}",
            {
                # 28 MiB of float64: near-cubic 2 MiB chunks, partial at the far edges
                "p": rng.standard_normal((40, 300, 310)),
                # int16 after it: smaller items in the same (larger) buffer
                "mask": rng.integers(-999, 999, size=(9, 700, 650), dtype=np.int16),
                "u": rng.standard_normal((33, 129)).astype(np.float32),
            },
        )
        for i in range(2)
    ]
    fmt = ZarrFormat(ShardOptions(chunk_bytes=2 << 20, compression=compression))
    fmt.write(samples, str(tmp_path / "s.zarr.zip"))
    # the same samples after other values passed through the (pooled, reused) buffer: the
    # same bytes, padding included
    fmt.write([Sample("z", {"p": np.full((40, 300, 310), 7.0)})], str(tmp_path / "other"))
    fmt.write(samples, str(tmp_path / "again"))
    assert (tmp_path / "again").read_bytes() == (tmp_path / "s.zarr.zip").read_bytes()
    if compression == "none":  # an edge chunk's padding is the fill value, not leftovers
        with zipfile.ZipFile(tmp_path / "again") as zf:
            edge = np.frombuffer(zf.read("1/p/c/0/3/3"), dtype="<f8").reshape(40, 75, 78)
        np.testing.assert_array_equal(
            edge[:, :, : 310 - 3 * 78], samples[1].fields["p"][:, 225:, 234:]
        )
        assert not edge[:, :, 310 - 3 * 78 :].any()
    store = zarr.storage.ZipStore(str(tmp_path / "s.zarr.zip"), mode="r")
    root = zarr.open_group(store, mode="r")
    for i, s in enumerate(samples):
        for name, want in s.fields.items():
            arr = root[f"{i}/{name}"]
            if name == "p":
                # boxes from the middle, and partial ones at an edge
                assert arr.chunks[1:] != want.shape[1:]
                assert any(n % c for n, c in zip(want.shape, arr.chunks, strict=True))
            np.testing.assert_array_equal(arr[...], want)
    store.close()
    reader = open_shard(tmp_path / "s.zarr.zip")
    np.testing.assert_array_equal(
        reader.read_slices(1, {"p": (slice(30, 40), slice(250, 300), slice(0, 310))})["p"],
        samples[1].fields["p"][30:40, 250:300],
    )
    reader.close()


def test_zip_index_fast_path_agrees_with_the_loop_and_declines_what_it_cannot_read(
    tmp_path,
):
    import struct

    from simstore.formats import _zip

    def listing(path):
        with zipfile.ZipFile(path) as zf:
            return {i.filename: (i.header_offset, i.compress_size, i.compress_type, i.CRC)
                    for i in zf.infolist()}

    def directory(path):
        data = (tmp_path / path).read_bytes()
        _, _, _, count, size, offset = struct.unpack("<4H2L", data[-22 + 4:-22 + 20])
        return data[offset:offset + size], count

    plain = tmp_path / "plain.zip"
    with zipfile.ZipFile(plain, "w", zipfile.ZIP_STORED) as zf:
        for i in range(300):
            zf.writestr(f"{i}/u/c/{i % 7}", bytes([i % 251]) * (i % 13))
        zf.writestr("extra", b"x" * 5, compress_type=zipfile.ZIP_DEFLATED)
    odd = tmp_path / "odd.zip"
    with zipfile.ZipFile(odd, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("a", b"1")
        zf.writestr("PK\x01\x02 inside a name", b"2")  # a signature's bytes in a name
        zf.writestr("caf\u00e9", b"3")  # a UTF-8 name
    fast = _zip._directory(*directory("plain.zip"))
    assert fast is not None
    assert {n: tuple(e) for n, e in fast.items()} == listing(plain)
    assert "0/u/c/0" in fast and "missing" not in fast and len(fast) == 301
    assert _zip._directory(*directory("odd.zip")) is None  # the loop reads it
    for path in (plain, odd):
        with open(path, "rb") as f:
            got = _zip.zip_index(f)
        assert got is not None and {n: tuple(e) for n, e in got.items()} == listing(path)


def test_zarr_checked_bytes_are_the_chunk_entries_of_the_asked_samples(tmp_path):
    # found from each field's chunk grid; the same as summing the zip's chunk entries
    samples = [
        Sample(key=f"s{i}", fields={
            "u": np.full((8, 24), i, dtype=np.float32),  # several chunks of 64 bytes
            "w": np.float64(i),  # a 0-d field: one chunk, "c"
            **({"extra": np.arange(i + 1, dtype=np.int16)} if i % 2 else {}),
        })
        for i in range(6)
    ]
    path = str(tmp_path / "z")
    ZarrFormat(ShardOptions(chunk_bytes=64)).write(samples, path)
    with zipfile.ZipFile(path) as zf:
        sizes = {i.filename: i.compress_size for i in zf.infolist()}

    def entries(p, names):
        return sum(n for k, n in sizes.items() for f in names
                   if k == f"{p}/{f}/c" or k.startswith(f"{p}/{f}/c/"))

    reader = ZarrFormat().open(path)
    try:
        arrays = [n for n, s in reader._specs.items() if s.kind in ("tensor", "bytes")]
        assert {"u", "extra"} <= set(arrays)
        for positions, fields in (([0, 1, 2, 3, 4, 5], None), ([1, 3, 3], ["extra"]),
                                  ([2], ["u", "w"]), ([4, 0], ["missing"])):
            names = [n for n in arrays if fields is None or n in fields]
            want = sum(entries(p, names) for p in set(positions))
            assert reader.checked_bytes(positions, fields) == want
        assert reader.checked_bytes([0, 1], None) > 0
    finally:
        reader.close()


def test_blosc_chunks_are_the_same_bytes_every_time(monkeypatch):
    """numcodecs' Blosc is multi-threaded by default and then its bytes vary from call to
    call; a shard's chunks must not (equal samples, equal object ids). Importing zarr
    turns Blosc's threads off process-wide; an ingest worker need not import it."""
    from numcodecs import blosc
    from simstore.formats._zarr_layout import ChunkCodec

    monkeypatch.setattr(blosc, "use_threads", None)  # numcodecs' default

    values = np.random.default_rng(0).random((64, 64, 32)).astype(np.float32)  # 512 KiB
    codec = ChunkCodec("shuffle-zstd", values.dtype)
    assert codec.codecs[-1]["name"] == "blosc"
    outputs = {bytes(codec.encode(values)) for _ in range(40)}
    assert len(outputs) == 1
    from numcodecs import Blosc

    decoded = np.frombuffer(Blosc().decode(outputs.pop()), dtype=np.float32)
    np.testing.assert_array_equal(decoded.reshape(values.shape), values)


def _bits(value, dtype):
    return np.asarray(value, dtype=dtype).tobytes().hex()


NON_FINITE_SCALARS = {
    # name: (little-endian bytes of the value, dtype)
    "nan64_sign": ("000000000000f8ff", "float64"),  # 0.0 / 0.0 on x86
    "nan64_payload": ("214365870000f07f", "float64"),  # signalling, with a payload
    "nan64_quiet": ("000000000000f87f", "float64"),  # float("nan")
    "nan32_sign": ("0000c0ff", "float32"),  # np.float32(-np.nan)
    "nan32_payload": ("0100c07f", "float32"),
    "nan32_signalling": ("0100807f", "float32"),
    "nan16_payload": ("01fe", "float16"),
    "inf64": ("000000000000f07f", "float64"),
    "minus_inf64": ("000000000000f0ff", "float64"),
    "minus_inf32": ("000080ff", "float32"),
    "minus_zero64": ("0000000000000080", "float64"),
}


def _non_finite_fields():
    out = {}
    for name, (raw, dtype) in NON_FINITE_SCALARS.items():
        value = np.frombuffer(bytes.fromhex(raw), dtype=dtype)[0]
        out[name] = float(value) if dtype == "float64" else value
    return out


@pytest.mark.parametrize(
    "fmt",
    [ParquetFormat(), LanceFormat(), ZarrFormat(), ZarrFormat(ShardOptions(compression="none"))],
    ids=["parquet", "lance", "zarr", "zarr-none"],
)
def test_non_finite_scalars_read_back_bit_for_bit(tmp_path, fmt):
    # a NaN's sign and payload and the infinities survive a shard: the read sample hashes
    # to what was written (Zarr kept scalars in JSON and gave back float("nan") for any NaN)
    fields = {**_non_finite_fields(), "u": np.arange(3, dtype=np.float32), "Re": 1e-300}
    sample = Sample("k", fields)
    fmt.write([sample], str(tmp_path / "s"))
    reader = fmt.open(str(tmp_path / "s"))
    got = next(iter(reader.read([0])))
    reader.close()
    for name, (raw, dtype) in NON_FINITE_SCALARS.items():
        assert _bits(got[name], dtype) == raw, name
        assert type(got[name]) is (float if dtype == "float64" else np.dtype(dtype).type)
    assert got["Re"] == 1e-300
    assert hash_sample(Sample("k", got)) == hash_sample(sample)


def test_zarr_spells_a_nan_other_than_float_nan_as_its_raw_bits(tmp_path):
    """The documented spelling (docs/format-shards.md): finite values are JSON numbers as
    before, infinities and float("nan") Zarr's strings as before, any other NaN "0x" and
    its bits in hex; stock zarr-python users decode it as the docs say."""
    import zarr

    fields = {
        **_non_finite_fields(),
        "Re": 250.5,
        "f32": np.float32(0.1),
        "n": 7,
        "flag": True,
    }
    ZarrFormat().write([Sample("k", fields)], str(tmp_path / "s"))
    store = zarr.storage.ZipStore(str(tmp_path / "s"), mode="r")
    scalars = zarr.open_group(store, mode="r")["0"].attrs["simstore"]["scalars"]
    store.close()
    assert scalars["nan64_sign"] == ["float64", "0xfff8000000000000"]
    assert scalars["nan64_payload"] == ["float64", "0x7ff0000087654321"]
    assert scalars["nan32_sign"] == ["float32", "0xffc00000"]
    assert scalars["nan32_payload"] == ["float32", "0x7fc00001"]
    assert scalars["nan16_payload"] == ["float16", "0xfe01"]
    assert scalars["nan64_quiet"] == ["float64", "NaN"]
    assert scalars["inf64"] == ["float64", "Infinity"]
    assert scalars["minus_inf32"] == ["float32", "-Infinity"]
    assert scalars["minus_zero64"] == ["float64", -0.0]
    assert scalars["Re"] == ["float64", 250.5]
    assert scalars["f32"] == ["float32", float(np.float32(0.1))]
    assert scalars["n"] == ["int64", 7] and scalars["flag"] == ["bool", True]

    def decode(dtype, value):  # the recipe of docs/format-shards.md
        if isinstance(value, str) and value.startswith("0x"):  # a NaN's raw bits
            big = np.dtype(dtype).newbyteorder(">")
            raw = int(value, 16).to_bytes(big.itemsize, "big")
            return np.frombuffer(raw, dtype=big).astype(dtype)[0]
        return np.array(float(value) if isinstance(value, str) else value, dtype=dtype)[()]

    for name, (raw, dtype) in NON_FINITE_SCALARS.items():
        assert _bits(decode(*scalars[name]), dtype) == raw, name


def test_zarr_reads_the_nan_string_of_shards_written_before_raw_bits():
    from simstore.formats._zarr_layout import scalar_from_json

    for dtype in ("float64", "float32", "float16"):
        assert _bits(scalar_from_json("NaN", dtype), dtype) == _bits(np.nan, dtype)
        assert scalar_from_json("-Infinity", dtype) == -np.inf
    for bad, dtype in (("0x7fc0", "float32"), ("0xfff8zz0000000000", "float64"), ("nan", "float64"),
                       ("0x0000000000000001", "int64")):
        with pytest.raises(ValueError, match="is not a"):
            scalar_from_json(bad, dtype)


def _field_and_group_shard(path):
    """A Zarr shard holding array 'fields' in sample 0 and group 'fields' (with array
    'fields/density') in sample 1, as writers before the cross-sample check wrote it."""
    from simstore.ingest import hash_sample_blocks, sample_nbytes

    writer = ZarrFormat().open_writer(path)
    for sample in (Sample("a", {"fields": np.ones((2, 3), np.float32), "Re": 1.0}),
                   Sample("b", {"fields/density": np.zeros((2, 3), np.float32), "Re": 2.0})):
        writer._arrays.clear()  # what the writer checks now (see the test below)
        writer._groups.clear()
        writer.add(sample, sample_hash=hash_sample_blocks(sample), size_bytes=sample_nbytes(sample))
    writer.close()


def test_zarr_reader_names_shard_and_field_where_a_field_is_a_group(tmp_path):
    path = str(tmp_path / "s")
    _field_and_group_shard(path)
    reader = open_shard(path)
    try:
        got = next(iter(reader.read([0])))
        np.testing.assert_array_equal(got["fields"], np.ones((2, 3), np.float32))
        for read in (lambda: next(iter(reader.read([1]))),
                     lambda: next(iter(reader.read([1], ["fields"]))),
                     lambda: reader.read_slices(1, {"fields": (slice(0, 1),)}),
                     lambda: reader.array(1, "fields")):
            with pytest.raises(FormatError) as info:
                read()
            assert path in str(info.value) and "field 'fields'" in str(info.value)
            assert "group" in str(info.value) and "position 1" in str(info.value)
        # the fields that are not in the way still read
        got = next(iter(reader.read([1], ["fields/density", "Re"])))
        assert got["Re"] == 2.0 and got["fields/density"].shape == (2, 3)
    finally:
        reader.close()


def test_zarr_writer_refuses_a_field_that_is_a_group_in_another_sample(tmp_path):
    for first, second in (("fields", "fields/density"), ("a/b/c", "a/b"), ("a/b", "a")):
        samples = [Sample("x", {first: np.zeros(2)}), Sample("y", {second: np.zeros(2)})]
        with pytest.raises(InvalidInputError, match="array in some samples of this shard"):
            ZarrFormat().write(samples, str(tmp_path / "s"))
        assert not (tmp_path / "s").exists()
    ZarrFormat().write([Sample("x", {"a/b": np.zeros(2)}), Sample("y", {"a/c": np.zeros(2)})],
                       str(tmp_path / "s"))


@pytest.mark.parametrize("fmt", [ParquetFormat, LanceFormat, ZarrFormat])
def test_big_endian_tensors_of_every_layout_read_back_their_values(tmp_path, fmt):
    # an HDF5 or NetCDF file may hold big-endian arrays: a 0-d one (a plain column) was
    # refused by Arrow ("byte-swapped arrays not supported") with a bare error
    values = {"zero": np.array(1.5, dtype=">f8"), "small": np.arange(4, dtype=">i4"),
              "big": np.arange(70_000, dtype=">f4")}
    samples = [Sample(f"s{i}", {k: np.asarray(v + i, dtype=v.dtype) for k, v in values.items()})
               for i in range(3)]
    path = str(tmp_path / "shard")
    fmt(ShardOptions()).write(samples, path)
    reader = fmt().open(path)
    for i, row in enumerate(reader.read(range(3), list(values))):
        for name, value in values.items():
            np.testing.assert_array_equal(np.asarray(row[name]), value + i)
    reader.close()
