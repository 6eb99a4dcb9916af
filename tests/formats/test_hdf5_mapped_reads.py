"""HDF5 values stored plainly are mapped from the file, not copied; every other layout is
read as before, and both give h5py's values bit for bit.

Files are written by h5py in each layout an HDF5 writer produces: contiguous, chunked by
whole rows (one or several per chunk, an edge chunk), chunked in boxes, compressed,
partly written (fill values), with chunks out of order in the file, big-endian, and
behind a user block. Reads go through the adapter's arrays as ingest makes them, and
through a whole ingest into the store.
"""

import h5py
import numpy as np
import pytest
from simstore.formats.adapters import HDF5Adapter
from stored_samples import same, stored

MiB = 1 << 20
ROWS, N = 20, 256  # a row of 256 x 256 float32: 256 KiB; 20 rows: 5 MiB


def values(seed=0, dtype="<f4"):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((ROWS, N, N)).astype(dtype)


def arrays(path):
    """{field: SlicedArray} of the file, as the adapter gives them to ingest."""
    adapter = HDF5Adapter()
    handle = adapter._open(str(path))
    entries, _, _ = adapter._tree(handle, str(path))
    return handle, {e.name: e.array for e in entries}


@pytest.mark.parametrize("userblock", [0, 4096])
def test_plain_layouts_are_mapped_and_give_the_files_values(tmp_path, userblock):
    path = tmp_path / "run.h5"
    data = values()
    with h5py.File(path, "w", userblock_size=userblock) as f:
        f.create_dataset("contiguous", data=data)
        f.create_dataset("by_row", data=data, chunks=(1, N, N))
        f.create_dataset("by_three_rows", data=data, chunks=(3, N, N))  # an edge chunk
    handle, got = arrays(path)
    try:
        for name, arr in got.items():
            whole = arr.read()
            same(whole, data)
            assert not whole.flags.writeable, name  # a read-only mapping of the file
            part = arr[(slice(4, 19),)]  # rows inside chunks at both ends
            same(part, data[4:19])
            assert not part.flags.writeable, name
            window = arr.window(5, 16)
            same(window.read(), data[5:21])
            same(window[(slice(2, 12),)], data[7:17])
            # a read of part of each row, or a small one, is read, not mapped
            box = arr[(slice(0, ROWS), slice(3, 70))]
            same(box, data[:, 3:70])
            assert box.flags.writeable
            small = arr[(slice(2, 5),)]
            same(small, data[2:5])
            assert small.flags.writeable
    finally:
        handle.close()


def test_other_layouts_are_read_with_the_same_values(tmp_path):
    path = tmp_path / "run.h5"
    data = values(1)
    with h5py.File(path, "w") as f:
        f.create_dataset("boxes", data=data, chunks=(2, N // 2, N // 2))
        f.create_dataset("gzip", data=data, chunks=(1, N, N), compression="gzip")
        f.create_dataset("big_endian", data=values(1, ">f4"), chunks=(1, N, N))
        partial = f.create_dataset("partial", shape=data.shape, dtype="f4", chunks=(1, N, N),
                                   fillvalue=7.5)
        partial[:10] = data[:10]  # rows 10 on were never written: fill values
        # chunks written last row first lie in the file in the opposite order
        backwards = f.create_dataset("backwards", shape=data.shape, dtype="f4",
                                     chunks=(1, N, N))
        for row in reversed(range(ROWS)):
            backwards[row] = data[row]
    expected = {
        "boxes": data,
        "gzip": data,
        "big_endian": data,
        "partial": np.concatenate([data[:10], np.full((ROWS - 10, N, N), 7.5, "f4")]),
        "backwards": data,
    }
    handle, got = arrays(path)
    try:
        for name, want in expected.items():
            whole = got[name].read()
            same(whole, want)
            assert whole.flags.writeable, name  # read into memory, not mapped
            same(got[name][(slice(9, 12),)], want[9:12])  # across the written edge
        # the written rows of the partial dataset are one run: mapped
        head = got["partial"][(slice(0, 10),)]
        same(head, data[:10])
        assert not head.flags.writeable
    finally:
        handle.close()


def test_a_mapped_run_ingests_into_the_same_samples(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    data = values(2)
    with h5py.File(src / "run.h5", "w") as f:
        f.create_dataset("density", data=data, chunks=(1, N, N))
        f.create_dataset("pressure", data=data * 2)
        f.create_dataset("gzip", data=data, chunks=(1, N, N), compression="gzip")
    window = MiB // (N * N * 4)  # windows of 1 MiB: mapped
    got = stored(tmp_path, src, time_window=window, stride=2)
    assert sorted(got) == [f"run.h5/t{t:04d}" for t in range(0, ROWS - window + 1, 2)]
    for key, fields in got.items():
        t = int(key.rsplit("/t", 1)[1])
        same(fields["density"], data[t : t + window])
        same(fields["pressure"], data[t : t + window] * 2)
        same(fields["gzip"], data[t : t + window])


def test_integers_of_reduced_precision_are_read_through_hdf5(tmp_path):
    """An int16 stored with 12 bits of precision (H5Tset_precision): its raw bytes are not
    the values (HDF5 sign-extends them), and mapping them gave 4095 for -1."""
    path = tmp_path / "run.h5"
    data = np.tile(np.array([-1, -2048, 2047, 5], dtype="<i2"), ROWS * N * N // 4)
    data = data.reshape(ROWS, N, N)
    with h5py.File(path, "w") as f:
        stored_type = h5py.h5t.STD_I16LE.copy()
        stored_type.set_precision(12)
        dsid = h5py.h5d.create(f.id, b"v", stored_type, h5py.h5s.create_simple(data.shape))
        dsid.write(h5py.h5s.ALL, h5py.h5s.ALL, data)
    handle, got = arrays(path)
    try:
        same(got["v"].read(), data)
        same(got["v"][(slice(3, 5),)], data[3:5])
    finally:
        handle.close()
