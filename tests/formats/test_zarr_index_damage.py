"""A Zarr shard whose zip index lost a chunk (a central directory entry renamed by one
flipped byte, which no CRC covers) is damaged: an error naming it, never the fill value."""

import os

import h5py
import numpy as np
import pytest
from simstore.formats import open_shard
from simstore.loaders import SimDataset
from stored_samples import zarr_shard_of

from simstore.errors import FormatError, IntegrityError


def test_a_chunk_missing_from_the_index_is_an_error_not_zeros(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(0)
    for i in range(6):
        np.savez(src / f"r{i}.npz", u=rng.standard_normal((4, 16, 16)).astype(np.float32))
    store, shard, path = zarr_shard_of(tmp_path, src, chunks={"u": (1, 16, 16)})
    with open(path, "rb") as f:
        data = bytearray(f.read())
    at = data.find(b"0/u/c/1/0/0", data.find(b"PK\x01\x02")) + len(b"0/u/c/")
    data[at] ^= 0x04  # the central directory's '0/u/c/1/0/0' becomes '0/u/c/5/0/0'
    os.chmod(path, 0o644)
    with open(path, "wb") as f:
        f.write(bytes(data))
    reader = open_shard(path)
    try:
        with pytest.raises(FormatError, match=r"zip entry 0/u/c/1/0/0 is missing .* damaged"):
            list(reader.read([0], fields=["u"]))
    finally:
        reader.close()
    for verify, error in ((False, FormatError), (True, IntegrityError)):
        seen = []
        with pytest.raises(error, match=shard):
            for sample in SimDataset(store, "d", shuffle=False, verify=verify, fields=["u"]):
                seen.append(sample["__key__"])
        assert "r0" not in seen  # the damaged sample was never handed out


def _zarr_shard(tmp_path, sample, attrs=None):
    """Four samples ``sample(i)`` (arrays by name) in an uncompressed Zarr shard.

    ``attrs(i)``: parameters (scalars, which a sample's group node holds): the samples
    are then HDF5 files, whose attributes become them. Returns the store, the shard's id
    and the shard's path.
    """
    src = tmp_path / "src"
    src.mkdir()
    for i in range(4):
        if attrs is None:
            np.savez(src / f"r{i}.npz", **sample(i))
            continue
        with h5py.File(src / f"r{i}.h5", "w") as f:
            for name, value in sample(i).items():
                f[name] = value
            f.attrs.update(attrs(i))
    return zarr_shard_of(tmp_path, src)


def _scalar_store(tmp_path):
    """A Zarr shard of samples with a 0-d field ``k`` (sample ``r<i>`` holds ``k == i``)."""
    return _zarr_shard(
        tmp_path, lambda i: {"k": np.array(float(i)), "u": np.full((8,), i, np.float32)})


def _flip_directory_name(path, name, at, new):
    """Change byte ``at`` of entry ``name`` in the central directory (no CRC covers it)."""
    with open(path, "rb") as f:
        data = bytearray(f.read())
    where = data.find(name.encode(), data.find(b"PK\x01\x02"))
    assert where > 0
    data[where + at] = ord(new)
    os.chmod(path, 0o644)
    with open(path, "wb") as f:
        f.write(bytes(data))


@pytest.mark.parametrize(
    ("at", "new", "error"),
    [
        (2, "j", "zip entry 1/k/c is missing"),  # '1/k/c' -> '1/j/c': r1's k gone
        (0, "0", "appears twice"),  # '1/k/c' -> '0/k/c': a second r0 k (r1's value)
        (0, "5", "is missing"),  # '1/k/c' -> '5/k/c': a sample the shard does not hold
    ],
)
def test_a_scalar_whose_index_entry_is_damaged_is_an_error_not_another_value(
    tmp_path, at, new, error
):
    store, shard, path = _scalar_store(tmp_path)
    _flip_directory_name(path, "1/k/c", at, new)
    with pytest.raises(FormatError, match=error):
        reader = open_shard(path)
        try:
            list(reader.read([0, 1], fields=["k"]))
        finally:
            reader.close()
    seen = []
    with pytest.raises((FormatError, IntegrityError), match=shard):
        for sample in SimDataset(store, "d", shuffle=False, fields=["k"]):
            seen.append((sample["__key__"], float(sample["k"])))
    assert all(float(key[1:]) == k for key, k in seen)  # nothing handed out was wrong


def test_an_index_entry_pointing_at_another_entry_is_an_error(tmp_path):
    """Two entries' names swapped in the central directory: each finds the other's
    local header, whose name gives the damage away."""
    _, _, path = _scalar_store(tmp_path)
    _flip_directory_name(path, "2/u/c/0", 0, "1")  # now two '1/u/c/0' ...
    _flip_directory_name(path, "1/u/c/0", 0, "2")  # ... the first of which becomes '2/u/c/0'
    reader = open_shard(path)
    try:
        with pytest.raises(FormatError, match=r"zip entry 1/u/c/0: its local header names"):
            list(reader.read([1], fields=["u"]))
    finally:
        reader.close()


def test_entries_with_an_extra_field_in_their_local_header_read_the_same(tmp_path):
    """Chunks are read with their local header in one call, which assumes the writer's
    layout (no extra field); a zip tool's rewrite that adds one is read the careful way."""
    import zipfile

    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(1)
    arrays = {f"r{i}": rng.standard_normal((4, 16, 16)).astype(np.float32) for i in range(4)}
    for key, u in arrays.items():
        np.savez(src / f"{key}.npz", u=u)
    store, shard, path = zarr_shard_of(tmp_path, src, chunks={"u": (1, 16, 16)})
    rewritten = str(tmp_path / "rewritten.zip")
    with zipfile.ZipFile(path) as old, zipfile.ZipFile(rewritten, "w") as new:
        for info in old.infolist():
            copy = zipfile.ZipInfo(info.filename, info.date_time)
            copy.compress_type = zipfile.ZIP_STORED
            copy.extra = b"\xca\xfe\x04\x00abcd"  # an unknown extra field, 4 bytes of data
            new.writestr(copy, old.read(info.filename))
    with open(rewritten, "rb") as f:
        assert f.read().count(b"\xca\xfe\x04\x00abcd") >= 2 * len(arrays)  # local + central
    os.chmod(path, 0o644)
    os.replace(rewritten, path)
    got = {s["__key__"]: s["u"].numpy() for s in
           SimDataset(store, "d", shuffle=False, verify=False, fields=["u"])}
    assert sorted(got) == sorted(arrays)
    for key, u in arrays.items():
        np.testing.assert_array_equal(got[key], u)


def _shard_of_two_fields(tmp_path):
    rng = np.random.default_rng(0)
    return _zarr_shard(tmp_path, lambda i: {"big": rng.standard_normal((64, 64)),
                                            "small": np.arange(3.0) + i})[2]


def _shard_of_two_fields_and_a_scalar(tmp_path):
    rng = np.random.default_rng(0)
    return _zarr_shard(tmp_path, lambda i: {"big": rng.standard_normal((64, 64)),
                                            "small": np.arange(3.0) + i},
                       attrs=lambda i: {"re": float(i) + 0.5})[2]


def test_a_sample_whose_group_entry_is_renamed_is_an_error_not_a_sample_without_scalars(
    tmp_path,
):
    # '0/zarr.json' -> '0/zars.json' in the central directory: the sample read as one
    # without its scalars (they are its group's attributes), no error
    path = _shard_of_two_fields_and_a_scalar(tmp_path)
    _flip_directory_name(path, "0/zarr.json", 5, "s")
    reader = open_shard(path)
    try:
        assert [s["re"] for s in reader.read([1])] == [1.5]  # the other samples read
        with pytest.raises(FormatError, match=r"sample at position 0: no 0/zarr.json"):
            list(reader.read([0], fields=["re"]))
    finally:
        reader.close()


def test_a_field_whose_node_entry_is_renamed_is_an_error_not_missing(tmp_path):
    # '0/big/zarr.json' -> '0/cig/zarr.json' in the central directory: the sample read
    # as if it never had the field (its chunks still there), with no error
    path = _shard_of_two_fields(tmp_path)
    with open(path, "rb") as f:
        data = bytearray(f.read())
    at = data.find(b"0/big/zarr.json", data.find(b"PK\x01\x02"))
    data[at + 2] ^= 0x01
    os.chmod(path, 0o644)
    with open(path, "wb") as f:
        f.write(bytes(data))
    reader = open_shard(path)
    try:
        with pytest.raises(FormatError, match=r"field 'big' has chunks but no 0/big/zarr.json"):
            list(reader.read([0]))
    finally:
        reader.close()


def test_no_flip_of_the_central_directory_reads_back_other_values(tmp_path):
    # every byte of the directory and its end record flipped in turn: an error, or the
    # very same samples (a flip of a field no reader uses), never a field lost or changed
    path = _shard_of_two_fields_and_a_scalar(tmp_path)
    with open(path, "rb") as f:
        base = f.read()
    reader = open_shard(path)
    want = list(reader.read(list(range(reader.num_samples))))
    reader.close()
    start = base.find(b"PK\x01\x02")
    damaged = str(tmp_path / "damaged.zip")
    wrong = []
    for off in range(start, len(base)):
        data = bytearray(base)
        data[off] ^= 0xFF
        with open(damaged, "wb") as f:
            f.write(bytes(data))
        try:
            r = open_shard(damaged)
            try:
                got = list(r.read(list(range(r.num_samples))))
            finally:
                r.close()
        except (FormatError, IntegrityError):
            continue  # damage named
        same = len(got) == len(want) and all(
            a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
            for a, b in zip(got, want, strict=True))
        if not same:
            wrong.append(off - start)
    assert wrong == []
