"""Array-tree adapters (HDF5, NetCDF, Zarr): values that were replaced, altered or read
without bound, and options that were ignored, without a word.

Files are written by h5py, netCDF4 and zarr; what ingest stores is read back through the
shard reader.
"""

import json

import h5py
import netCDF4
import numpy as np
import pytest
import zarr
from simstore.formats.adapters import HDF5Adapter, NetCDFAdapter, ZarrAdapter, _limits, _tree
from stored_samples import stored

from simstore.errors import SourceError


def refused(adapter, path, options=None):
    with pytest.raises(SourceError) as info:
        list(adapter.iter_samples(str(path), "k", options or {}))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(str(path))
    return message


def samples(adapter, path, options=None):
    return list(adapter.iter_samples(str(path), "k", options or {}))


# -- 5: two values under one name


def test_a_dataset_named_metadata_does_not_replace_the_json_metadata(tmp_path):
    path = tmp_path / "m.h5"
    with h5py.File(path, "w") as f:
        f["metadata"] = np.arange(3)
        f.attrs["history"] = [1, 2]
    message = refused(HDF5Adapter(), path)
    assert "'metadata'" in message and "'history'" in message


def test_a_group_attribute_and_a_string_dataset_of_one_name_are_refused(tmp_path):
    path = tmp_path / "s.h5"
    with h5py.File(path, "w") as f:
        g = f.create_group("g")
        g.attrs["s"] = "from-attribute"
        g["s"] = "from-dataset"
        f["x"] = np.arange(2)
    assert "field 'g/s' is given twice" in refused(HDF5Adapter(), path)


def test_a_root_attribute_named_like_an_array_attribute_is_refused(tmp_path):
    path = tmp_path / "e.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.arange(3)
        f.attrs["x.units"] = "m"
        f["x"].attrs["units"] = "s"
    assert "field 'x.units' is given twice" in refused(HDF5Adapter(), path)


def test_zarr_attributes_of_one_name_are_refused(tmp_path):
    path = tmp_path / "a.zarr"
    g = zarr.open_group(str(path), mode="w", zarr_format=3)
    g.create_array("x", shape=(2,), dtype="f4")[:] = 1
    g.attrs["x.units"] = "m"
    g["x"].attrs["units"] = "s"
    assert "field 'x.units' is given twice" in refused(ZarrAdapter(), path)


# -- 6: datasets whose values live in other files


def test_virtual_and_external_datasets_are_refused_naming_the_field(tmp_path):
    src = tmp_path / "src.h5"
    with h5py.File(src, "w") as f:
        f["data"] = np.arange(1, 11, dtype=np.float32)
    for target in (src, tmp_path / "missing.h5"):
        path = tmp_path / "vds.h5"
        with h5py.File(path, "w") as f:
            layout = h5py.VirtualLayout(shape=(10,), dtype=np.float32)
            layout[:] = h5py.VirtualSource(str(target), "data", shape=(10,))
            f.create_virtual_dataset("v", layout, fillvalue=0)
        message = refused(HDF5Adapter(), path)
        assert "field 'v': a virtual dataset" in message and str(target) in message
    raw = tmp_path / "raw.bin"
    np.arange(5, dtype="<i4").tofile(raw)
    path = tmp_path / "ext.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("e", shape=(5,), dtype="<i4", external=[(str(raw), 0, 20)])
    message = refused(HDF5Adapter(), path)
    assert "field 'e': raw values stored in external file" in message and "raw.bin" in message


# -- 10 and 3: Zarr attributes that are JSON objects or big ints


def test_a_zarr_dict_attribute_stays_json(tmp_path):
    (tmp_path / "src").mkdir()
    g = zarr.open_group(str(tmp_path / "src" / "a.zarr"), mode="w", zarr_format=3)
    g.create_array("x", shape=(2,), dtype="f4")[:] = 1
    g.attrs["nested"] = {"a": {"b": [1, None, float("nan")]}}
    got = stored(tmp_path, tmp_path / "src")["a.zarr"]
    meta = got["metadata"]
    meta = json.loads(meta) if isinstance(meta, str | bytes) else meta
    assert meta["nested"] == {"a": {"b": [1, None, "NaN"]}}


@pytest.mark.parametrize(
    ("value", "want"),
    [(2**63 - 1, np.int64), (-(2**63), np.int64), (2**63, np.uint64), (2**64 - 1, np.uint64)],
)
def test_int_attributes_up_to_uint64_are_parameters(tmp_path, value, want):
    path = tmp_path / "a.zarr"
    g = zarr.open_group(str(path), mode="w", zarr_format=3)
    g.create_array("x", shape=(2,), dtype="f4")[:] = 1
    g.attrs["seed"] = value
    (sample,) = samples(ZarrAdapter(), path)
    got = np.asarray(sample.fields["seed"])
    assert got.astype(want) == value and int(got) == value
    assert np.result_type(got) in (np.dtype(want), np.dtype(np.int64))
    (tmp_path / "src").mkdir()
    g = zarr.open_group(str(tmp_path / "src" / "b.zarr"), mode="w", zarr_format=3)
    g.create_array("x", shape=(2,), dtype="f4")[:] = 1
    g.attrs["seed"] = value
    stored_seed = np.asarray(stored(tmp_path, tmp_path / "src")["b.zarr"]["seed"])
    assert stored_seed.dtype == want and int(stored_seed) == value


@pytest.mark.parametrize("value", [2**64, 2**70, -(2**63) - 1, -(2**64)])
def test_int_attributes_past_uint64_are_kept_exactly_as_metadata(tmp_path, value):
    (tmp_path / "src").mkdir()
    g = zarr.open_group(str(tmp_path / "src" / "a.zarr"), mode="w", zarr_format=3)
    g.create_array("x", shape=(2,), dtype="f4")[:] = 1
    g.attrs["a"] = value
    got = stored(tmp_path, tmp_path / "src")["a.zarr"]
    assert "a" not in got
    meta = got["metadata"]
    meta = json.loads(meta) if isinstance(meta, str | bytes) else meta
    assert meta["a"] == value and type(meta["a"]) is int


# -- 11: variable-length numeric HDF5 data


def test_hdf5_variable_length_numeric_data_is_refused(tmp_path):
    path = tmp_path / "vlen.h5"
    with h5py.File(path, "w") as f:
        ds = f.create_dataset("v", (2,), dtype=h5py.vlen_dtype(np.float64))
        ds[0] = [1.0, np.nan]
        ds[1] = [2.0]
    message = refused(HDF5Adapter(), path)
    assert "field 'v': unsupported HDF5 type (variable-length float64)" in message


def test_hdf5_variable_length_strings_are_still_read(tmp_path):
    path = tmp_path / "s.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("names", data=["a", "bé"], dtype=h5py.string_dtype())
        f["one"] = "x"
        f["x"] = np.arange(2)
    (sample,) = samples(HDF5Adapter(), path)
    assert sample.fields["one"] == "x"
    assert sample.fields["metadata"]["names"] == ["a", "bé"]


@pytest.mark.parametrize("encoding", ["utf-8", "ascii"])
def test_hdf5_string_attributes_that_are_not_utf8_keep_their_bytes(tmp_path, encoding):
    # h5py gives such a variable-length attribute as a str of surrogate escapes, which
    # failed the whole file at encoding ("surrogates not allowed"), naming no field
    src = tmp_path / "src"
    src.mkdir()
    with h5py.File(src / "a.h5", "w") as f:
        f.attrs.create("s", b"\xff", dtype=h5py.string_dtype(encoding))
        f.attrs.create("names", [b"ok", b"\xc3("], dtype=h5py.string_dtype(encoding))
        f.attrs.create("fine", "caf\u00e9".encode(), dtype=h5py.string_dtype("utf-8"))
        f["x"] = np.arange(3.0)
    fields = stored(tmp_path, src)["a.h5"]
    assert fields["s"] == b"\xff"
    assert fields["metadata"]["names"] == ["ok", {"__bytes_hex__": "c328"}]
    assert fields["fine"] == "caf\u00e9"


def test_text_of_str_gives_back_the_escaped_bytes_and_keeps_lone_surrogates():
    assert _tree.text_of_str("plain") == "plain"
    assert _tree.text_of_str(b"\xff".decode("utf-8", "surrogateescape")) == b"\xff"
    assert _tree.text_of_str("\ud800") == "\ud800".encode("utf-8", "surrogatepass")


# -- 12: time_name that names nothing


def test_a_time_name_that_names_nothing_is_refused(tmp_path):
    path = tmp_path / "r.h5"
    with h5py.File(path, "w") as f:
        f["u"] = np.arange(24, dtype=np.float32).reshape(6, 2, 2)
        f["time"] = np.arange(6.0)
    options = {"time_window": 2, "time_name": "nosuch"}
    assert "time_name 'nosuch' names no numeric array" in refused(HDF5Adapter(), path, options)
    # a named array of rank 3 gives its axis 0
    assert len(samples(HDF5Adapter(), path, {"time_window": 2, "time_name": "u"})) == 3
    assert len(samples(HDF5Adapter(), path, {"time_window": 2, "time_name": "time"})) == 3


def test_a_netcdf_time_name_that_names_nothing_is_refused(tmp_path):
    path = tmp_path / "r.nc"
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("time", 6)
        ds.createDimension("x", 2)
        ds.createVariable("u", "f4", ("time", "x"))[:] = np.ones((6, 2))
    message = refused(NetCDFAdapter(), path, {"time_window": 2, "time_name": "nosuch"})
    assert "time_name 'nosuch' names no numeric dimension or array" in message
    assert len(samples(NetCDFAdapter(), path, {"time_window": 2, "time_name": "time"})) == 3


# -- 7: strings read whole are capped


@pytest.fixture
def small_cap(monkeypatch):
    monkeypatch.setattr(_limits, "MAX_WHOLE_VALUE_BYTES", 1000)


def test_string_values_over_the_cap_are_refused_before_being_read(tmp_path, small_cap):
    h5 = tmp_path / "s.h5"
    with h5py.File(h5, "w") as f:
        f["fixed"] = np.full(200, b"x" * 10, dtype="S10")
    assert "field 'fixed': 2,000 bytes of strings" in refused(HDF5Adapter(), h5)
    with h5py.File(h5, "w") as f:
        f.create_dataset("vlen", data=["y" * 10] * 200, dtype=h5py.string_dtype())
    assert "field 'vlen':" in refused(HDF5Adapter(), h5)
    nc = tmp_path / "s.nc"
    with netCDF4.Dataset(nc, "w") as ds:
        ds.createDimension("n", 200)
        ds.createDimension("len", 10)
        ds.createVariable("chars", "S1", ("n", "len"))[:] = np.full((200, 10), b"c")
    assert "field 'chars':" in refused(NetCDFAdapter(), nc)
    with netCDF4.Dataset(nc, "w") as ds:
        ds.createDimension("n", 200)
        ds.createVariable("strs", str, ("n",))[:] = np.array(["z" * 10] * 200, dtype=object)
    assert "field 'strs':" in refused(NetCDFAdapter(), nc)
    z = tmp_path / "s.zarr"
    g = zarr.open_group(str(z), mode="w", zarr_format=3)
    g.create_array("strs", shape=(200,), dtype=str)[:] = np.array(["w" * 10] * 200)
    assert "field 'strs':" in refused(ZarrAdapter(), z)


def test_string_values_under_the_cap_are_read_in_full(tmp_path, small_cap):
    path = tmp_path / "s.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("vlen", data=["ab", "c", "d"] * 10, dtype=h5py.string_dtype())
    (sample,) = samples(HDF5Adapter(), path)
    assert sample.fields["metadata"]["vlen"] == ["ab", "c", "d"] * 10


# -- 8: big compressed chunks


class _Counting:
    """A handle that counts reads (what each read decodes: every chunk it touches)."""

    def __init__(self, handle):
        self.handle, self.reads = handle, []
        self.shape, self.dtype = handle.shape, handle.dtype

    def __getitem__(self, box):
        self.reads.append(box)
        return self.handle[box]


def _blocks(array, rows):
    return np.concatenate([array[(slice(i, i + rows),)] for i in range(0, array.shape[0], rows)])


@pytest.mark.parametrize("kind", ["hdf5", "zarr"])
def test_a_big_chunk_is_decoded_once_for_a_run_of_small_reads(tmp_path, kind):
    values = np.arange(1 << 19, dtype=np.float64)  # 4 MiB, one chunk
    if kind == "hdf5":
        path = tmp_path / "c.h5"
        with h5py.File(path, "w") as f:
            f.create_dataset("x", data=values, chunks=values.shape, compression="gzip")
        (entry,), _, _ = HDF5Adapter._tree(h5py.File(path, "r"), str(path))
    else:
        path = tmp_path / "c.zarr"
        g = zarr.open_group(str(path), mode="w", zarr_format=3)
        g.create_array("x", shape=values.shape, dtype="f8", chunks=values.shape)[:] = values
        _, (entry,), _, _ = ZarrAdapter._open(str(path))
    counting = _Counting(entry.array._handle)
    array = _tree.SlicedArray(counting, path="p", field="x", chunks=entry.array._chunks)
    assert np.array_equal(_blocks(array, 1 << 14), values)  # 32 reads of 128 KiB
    assert len(counting.reads) == 1
    assert _tree._REGION[0] is None  # the last read dropped the region
    window = array.window(1000, 70000)
    assert np.array_equal(_blocks(window, 7000), values[1000:71000])
    assert len(counting.reads) == 2


def test_a_chunk_over_the_cap_is_refused_naming_the_field(tmp_path, monkeypatch):
    monkeypatch.setattr(_tree, "MAX_CHUNK_BYTES", 1 << 20)
    path = tmp_path / "c.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", shape=(1 << 18,), dtype="f8", chunks=(1 << 18,), compression="gzip")
    message = refused(HDF5Adapter(), path)
    assert "field 'x': one chunk (262144,) holds 2,097,152 bytes decoded" in message


@pytest.mark.parametrize("layout", ["well", "time_longer"])
def test_windows_that_would_cut_no_field_are_refused(tmp_path, layout):
    """The Well's [trajectory, time, x, y] fields, or a time array one step longer than
    the fields' axis: only the time array was windowed, every field repeated whole, exit 0."""
    path = tmp_path / "run.h5"
    with h5py.File(path, "w") as f:
        if layout == "well":
            f["dimensions/time"] = np.arange(10.0)
            f["t0_fields/density"] = np.ones((2, 10, 8, 8))
        else:
            f["time"] = np.arange(11.0)
            f["u"] = np.ones((10, 4, 4))
    with pytest.raises(SourceError, match=r"run\.h5: time axis of (10|11) steps is axis 0 of "
                                          r"no array of rank 2 or more"):
        list(HDF5Adapter().iter_samples(str(path), "k", {"time_window": 4, "stride": 4}))
