"""NetCDF files that were ingested wrong: truncated classic files, `_Encoding` character
variables, variable-length variables and text attributes that are not UTF-8.

Every file is written by netCDF4 (the damaged ones are then cut short the way an
interrupted copy cuts them), ingested into a local store and read back through the
shard reader.
"""

import netCDF4
import numpy as np
import pytest
from simstore.formats.adapters import NetCDFAdapter
from simstore.formats.adapters._tree import SlicedArray
from stored_samples import stored

from simstore.errors import SourceError

CLASSIC = ["NETCDF3_CLASSIC", "NETCDF3_64BIT_OFFSET", "NETCDF3_64BIT_DATA"]




def one_line(info, path, field):
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(str(path))
    assert f"field {field!r}" in message
    return message


# -- truncated classic files: netCDF-C reads the missing tail as zeros


@pytest.mark.parametrize("fmt", CLASSIC)
def test_a_classic_file_short_by_less_than_its_header_is_refused(tmp_path, fmt):
    """The last 6 of 1,000 doubles missing (48 bytes, less than the header): netCDF-C
    opens the file and reads zeros for them."""
    full = tmp_path / "full.nc"
    values = np.arange(1000.0) + 1
    with netCDF4.Dataset(full, "w", format=fmt) as ds:
        ds.createDimension("x", 1000)
        ds.createVariable("v", "f8", ("x",))[:] = values
    np.testing.assert_array_equal(stored(tmp_path / "a", full)["full.nc"]["v"], values)

    data = full.read_bytes()
    bad = tmp_path / "trunc.nc"
    bad.write_bytes(data[:-48])
    with netCDF4.Dataset(bad) as ds:  # what made this silent: netCDF-C reads it
        assert (ds["v"][-6:] == 0).all()
    with pytest.raises(SourceError) as info:
        next(NetCDFAdapter().iter_samples(str(bad), "trunc.nc", {}))
    message = one_line(info, bad, "v")
    assert f"ending at byte {len(data)}" in message
    assert f"the file holds {len(data) - 48}" in message
    with pytest.raises(SourceError):
        stored(tmp_path / "b", bad)


@pytest.mark.parametrize("fmt", CLASSIC)
def test_a_classic_file_missing_its_last_records_is_refused(tmp_path, fmt):
    """Record variables interleave: the last record of each lies at
    begin + (numrecs - 1) * recsize; cutting into the last one is caught for the
    variable whose values are lost."""
    full = tmp_path / "rec.nc"
    u = np.arange(5 * 3, dtype=np.float32).reshape(5, 3)
    w = np.arange(5, dtype=np.int16) + 7  # 2 bytes a record, padded to 4
    with netCDF4.Dataset(full, "w", format=fmt) as ds:
        ds.createDimension("t", None)
        ds.createDimension("x", 3)
        ds.createVariable("u", "f4", ("t", "x"))[:] = u
        ds.createVariable("w", "i2", ("t",))[:] = w
        ds.createVariable("c", "f8", ("x",))[:] = [1.5, 2.5, 3.5]
    got = stored(tmp_path / "a", full)["rec.nc"]
    np.testing.assert_array_equal(got["u"], u)
    np.testing.assert_array_equal(got["w"], w)

    data = full.read_bytes()
    (tmp_path / "pad.nc").write_bytes(data[:-2])  # only the last record's padding
    got = stored(tmp_path / "b", tmp_path / "pad.nc")["pad.nc"]
    np.testing.assert_array_equal(got["w"], w)

    bad = tmp_path / "cut.nc"
    bad.write_bytes(data[:-3])  # one byte of w's last value
    with pytest.raises(SourceError) as info:
        NetCDFAdapter().count_samples(str(bad), {})
    assert "5 records" in one_line(info, bad, "w")

    bad.write_bytes(data[:-8])  # w's last record and the end of u's
    with pytest.raises(SourceError) as info:
        next(NetCDFAdapter().iter_samples(str(bad), "cut.nc", {}))
    one_line(info, bad, "u")


def test_a_single_record_variable_has_unpadded_records(tmp_path):
    """With one record variable of bytes or shorts, records are not padded: 7 records of
    3 bytes end 21 bytes after its offset, and the file may end there."""
    full = tmp_path / "one.nc"
    b = np.arange(21, dtype=np.int8).reshape(7, 3)
    with netCDF4.Dataset(full, "w", format="NETCDF3_CLASSIC") as ds:
        ds.createDimension("t", None)
        ds.createDimension("x", 3)
        ds.createVariable("b", "i1", ("t", "x"))[:] = b
    np.testing.assert_array_equal(stored(tmp_path / "a", full)["one.nc"]["b"], b)
    data = full.read_bytes()
    (tmp_path / "bad.nc").write_bytes(data[:-1])
    with pytest.raises(SourceError) as info:
        NetCDFAdapter().count_samples(str(tmp_path / "bad.nc"), {})
    one_line(info, tmp_path / "bad.nc", "b")


# -- character variables with _Encoding (what xarray writes for strings)


def _chars(words, strlen):
    """The NC_CHAR array of ``words`` in UTF-8, NUL-padded to ``strlen`` bytes."""
    raw = b"".join(w.encode().ljust(strlen, b"\0") for w in words)
    return np.frombuffer(raw, dtype="S1").reshape(len(words), strlen)


def _labels(path, words, encoding, strlen=6):
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("n", len(words))
        ds.createDimension("strlen", strlen)
        v = ds.createVariable("labels", "S1", ("n", "strlen"))
        v[:] = _chars(words, strlen)
        if encoding is not None:
            v._Encoding = encoding
        s = ds.createVariable("name", "S1", ("strlen",))
        s[:] = _chars(words[:1], strlen)[0]
        if encoding is not None:
            s._Encoding = encoding


@pytest.mark.parametrize("words", [["ab", "cde"], ["é", "b", "naïf"]])
def test_encoded_character_variables_read_as_the_same_strings(tmp_path, words):
    (tmp_path / "src").mkdir()
    _labels(tmp_path / "src" / "plain.nc", words, None)
    _labels(tmp_path / "src" / "enc.nc", words, "utf-8")
    with netCDF4.Dataset(tmp_path / "src" / "enc.nc") as ds:  # netCDF4 joins them itself
        assert ds["labels"][:].tolist() == words
    got = stored(tmp_path, tmp_path / "src")
    assert got["plain.nc"]["metadata"] == {"labels": words}
    assert got["enc.nc"]["metadata"] == {"labels": words}
    assert got["plain.nc"]["name"] == got["enc.nc"]["name"] == words[0]
    assert got["enc.nc"]["labels._Encoding"] == "utf-8"


def test_character_data_invalid_in_its_encoding_names_the_field(tmp_path):
    path = tmp_path / "bad.nc"
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("n", 2)
        ds.createDimension("strlen", 2)
        v = ds.createVariable("labels", "S1", ("n", "strlen"))
        v.set_auto_chartostring(False)
        v[:] = np.array([[b"o", b"k"], [b"\xff", b"\xfe"]])
        v._Encoding = "ascii"
    with pytest.raises(SourceError) as info:
        next(NetCDFAdapter().iter_samples(str(path), "bad.nc", {}))
    assert "'ascii'" in one_line(info, path, "labels")


def test_undeclared_character_data_that_is_not_utf8_keeps_its_bytes(tmp_path):
    (tmp_path / "src").mkdir()
    path = tmp_path / "src" / "raw.nc"
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("n", 2)
        ds.createDimension("strlen", 3)
        v = ds.createVariable("labels", "S1", ("n", "strlen"))
        v[:] = np.array([[b"o", b"k", b""], [b"\xff", b"\x00", b"\x01"]])
        s = ds.createVariable("tag", "S1", ("strlen",))
        s[:] = np.array([b"\xde", b"\xad", b"\xbe"])
    got = stored(tmp_path, tmp_path / "src")["raw.nc"]
    assert got["metadata"] == {"labels": ["ok", {"__bytes_hex__": "ff0001"}]}
    assert got["tag"] == b"\xde\xad\xbe"


def test_text_attributes_that_are_not_utf8_keep_their_bytes(tmp_path):
    """netCDF4 decodes text attributes with replacement characters; the adapter keeps the
    bytes. Valid UTF-8 (and NC_STRING lists) read as before."""
    (tmp_path / "src").mkdir()
    path = tmp_path / "src" / "attrs.nc"
    with netCDF4.Dataset(path, "w", format="NETCDF3_CLASSIC") as ds:
        ds.title = "démo"
        ds.setncattr("raw", b"\xffA\x01")
        ds.createDimension("x", 2)
        ds.createVariable("v", "f8", ("x",))[:] = [1.0, 2.0]
    with netCDF4.Dataset(path) as ds:
        assert ds.raw != "\xffA\x01"  # what netCDF4 alone gives: a replacement character
    with netCDF4.Dataset(tmp_path / "src" / "list.nc", "w") as ds:
        ds.setncattr_string("names", ["inlet", "outlét"])
    got = stored(tmp_path, tmp_path / "src")
    assert got["attrs.nc"]["title"] == "démo"
    assert got["attrs.nc"]["raw"] == b"\xffA\x01"
    assert got["list.nc"]["metadata"] == {"names": ["inlet", "outlét"]}


# -- variable-length variables


def test_variable_length_variables_are_refused_naming_the_field(tmp_path):
    path = tmp_path / "vlen.nc"
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("n", 2)
        ds.createVariable("ok", "f8", ("n",))[:] = [1.0, 2.0]
        v = ds.createVariable("ragged", ds.createVLType(np.int32, "vi"), ("n",))
        v[0] = np.arange(3, dtype="i4")
        v[1] = np.arange(1, dtype="i4")
    with pytest.raises(SourceError) as info:
        NetCDFAdapter().count_samples(str(path), {})
    assert "unsupported NetCDF type (variable-length" in one_line(info, path, "ragged")
    with pytest.raises(SourceError) as info:
        stored(tmp_path, path)
    one_line(info, path, "ragged")


def test_a_value_conversion_failure_in_a_sliced_read_names_the_field(tmp_path):
    """SlicedArray converts what a handle returns to its dtype: a ragged object array
    cannot be, and the error says which field."""
    path = tmp_path / "vlen.nc"
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("n", 2)
        v = ds.createVariable("ragged", ds.createVLType(np.int32, "vi"), ("n",))
        v[0] = np.arange(3, dtype="i4")
        v[1] = np.arange(1, dtype="i4")
    with netCDF4.Dataset(path) as ds:
        array = SlicedArray(ds["ragged"], path=str(path), field="ragged")
        with pytest.raises(SourceError) as info:
            array.read()
    assert "read failed" in one_line(info, path, "ragged")


# -- what netCDF4 does not show, and NetCDF-4 files named otherwise


def _nc4(path):
    with netCDF4.Dataset(path, "w", format="NETCDF4") as ds:
        ds.createDimension("Time", None)
        ds.createDimension("x", 3)
        ds.createVariable("x", "f8", ("x",))[:] = [9.0, 8.0, 7.0]
        v = ds.createVariable("u", "f4", ("Time", "x"))
        v[:] = np.arange(6, dtype=np.float32).reshape(2, 3)
    return path


def test_a_netcdf4_file_without_a_netcdf_name_is_read_as_netcdf(tmp_path):
    """A WRF-style name (no extension): ``auto`` gave it to the HDF5 adapter, which
    stored netCDF-C's stand-in of zeros as ``x`` and the real ``x`` as
    ``_nc4_non_coord_x``, plus netCDF-C's internal attributes."""
    from simstore.formats.adapters import AutoAdapter
    from simstore.formats.adapters._auto import read_head

    (tmp_path / "named").mkdir()
    named = _nc4(tmp_path / "named" / "run.nc")
    bare = tmp_path / "bare" / "wrfout_d01_2000-01-01_00:00:00"
    bare.parent.mkdir()
    bare.write_bytes(named.read_bytes())
    assert AutoAdapter().resolve(str(bare), read_head(str(bare))).name == "netcdf"
    want, got = stored(tmp_path / "s1", named.parent), stored(tmp_path / "s2", bare.parent)
    assert [sorted(f) for f in want.values()] == [sorted(f) for f in got.values()]
    (fields,) = got.values()
    assert "_nc4_non_coord_x" not in fields and not any("_Netcdf4" in k for k in fields)
    np.testing.assert_array_equal(fields["x"], [9.0, 8.0, 7.0])
    # a plain HDF5 file is still the HDF5 adapter's
    import h5py

    with h5py.File(tmp_path / "plain", "w") as f:
        f["a"] = np.ones(3)
    plain = str(tmp_path / "plain")
    assert AutoAdapter().resolve(plain, read_head(plain)).name == "hdf5"


@pytest.mark.parametrize("kind", ["opaque", "reference"])
def test_variables_netcdf_cannot_read_are_refused_not_dropped(tmp_path, kind):
    """netCDF4 skips an opaque variable with a warning, and netCDF-C hides a dataset of
    object references: the file was stored without them, exit 0."""
    import h5py

    path = _nc4(tmp_path / f"{kind}.nc")
    with h5py.File(path, "a") as f:
        if kind == "opaque":
            f.create_dataset("blob", data=np.array([b"ab", b"cd"], dtype="V2"))
        else:
            f.create_dataset("blob", data=np.array([f["u"].ref], dtype=h5py.ref_dtype))
    with pytest.raises(SourceError) as info:
        list(NetCDFAdapter().iter_samples(str(path), "k", {}))
    one_line(info, path, "blob")


def test_a_nan_fill_value_is_no_nan_in_the_data_for_nan_error(tmp_path):
    """xarray writes _FillValue = NaN for float variables: --nan error refused every such
    file though no value was NaN; a NaN in the values is still refused."""
    from simstore.catalog import Catalog
    from simstore.ingest import ingest

    src = tmp_path / "src"
    src.mkdir()
    with netCDF4.Dataset(src / "a.nc", "w") as ds:
        ds.createDimension("x", 3)
        v = ds.createVariable("sst", "f4", ("x",), fill_value=np.float32("nan"))
        v.missing_value = np.float32("nan")
        v[:] = [1.0, 2.0, 3.0]
    catalog = Catalog.init(str(tmp_path / "store"))
    r = ingest([src], dataset="d", store=catalog, nan="error")
    assert r.samples_staged == 1
    with netCDF4.Dataset(src / "b.nc", "w") as ds:
        ds.createDimension("x", 3)
        ds.createVariable("sst", "f4", ("x",))[:] = [1.0, np.nan, 3.0]
    with pytest.raises(SourceError, match=r"b\.nc: field 'sst': 1 NaN"):
        ingest([src / "b.nc"], dataset="d", store=catalog, nan="error")


# -- time windows: the time dimension decides, not axis 0's length


@pytest.mark.parametrize("options", [{}, {"time_name": "time"}])
def test_a_time_dimension_on_no_variable_s_first_axis_is_refused(tmp_path, options):
    """[x, y, time] fields without a `time` variable: windows were cut along x (8 of the
    10 steps' keys, each window 4 rows of x), or time_name 'time' was said to name no
    dimension."""
    path = tmp_path / "tlast.nc"
    with netCDF4.Dataset(path, "w", format="NETCDF4") as ds:
        ds.createDimension("time", None)
        ds.createDimension("x", 8)
        ds.createDimension("y", 5)
        ds.createVariable("u", "f4", ("x", "y", "time"))[:, :, 0:10] = np.ones((8, 5, 10))
    with pytest.raises(SourceError) as info:
        list(NetCDFAdapter().iter_samples(str(path), "k", {"time_window": 4, **options}))
    message = one_line(info, path, "u")
    assert "time axis of 10 steps (dimension 'time') is axis 0 of no array" in message
    assert "on axis 2" in message
    with netCDF4.Dataset(path, "a") as ds:  # the same run with time first is windowed
        ds.createVariable("v", "f4", ("time", "y"))[0:10] = np.ones((10, 5))
    keys = [s.key for s in NetCDFAdapter().iter_samples(str(path), "k", {"time_window": 4})]
    assert keys == ["k/t0000", "k/t0004"]


def test_a_time_name_naming_a_variable_windows_along_its_dimension_only(tmp_path):
    """time_name naming a variable (`date` along `time`), not a dimension: u's axis 0 (x)
    is as long as the time axis but is not it; windows were cut along x."""
    path = tmp_path / "named.nc"
    with netCDF4.Dataset(path, "w", format="NETCDF4") as ds:
        ds.createDimension("time", 10)
        ds.createDimension("x", 10)
        ds.createDimension("y", 5)
        ds.createVariable("date", "f8", ("time",))[:] = np.arange(10)
        ds.createVariable("u", "f4", ("x", "y", "time"))[:] = np.ones((10, 5, 10))
    options = {"time_window": 4, "time_name": "date"}
    with pytest.raises(SourceError, match="axis 0 of no array"):
        list(NetCDFAdapter().iter_samples(str(path), "k", options))
    with netCDF4.Dataset(path, "a") as ds:  # a field along time on axis 0 is windowed
        ds.createVariable("v", "f4", ("time", "y"))[:] = np.arange(50).reshape(10, 5)
    samples = list(NetCDFAdapter().iter_samples(str(path), "k", options))
    assert [s.key for s in samples] == ["k/t0000", "k/t0004"]
    assert samples[1].fields["v"].tolist() == np.arange(20, 40).reshape(4, 5).tolist()
    assert samples[1].fields["date"].tolist() == [4.0, 5.0, 6.0, 7.0]


def test_a_time_name_naming_a_2d_variable_windows_along_its_first_dimension(tmp_path):
    """time_name naming a variable of rank 2 (`date(time, two)`): the dimension of its
    axis 0 is the time dimension, as for a 1-D one; u's axis 0 (x) is as long, not time."""
    path = tmp_path / "named2d.nc"
    with netCDF4.Dataset(path, "w", format="NETCDF4") as ds:
        ds.createDimension("time", 10)
        ds.createDimension("x", 10)
        ds.createDimension("y", 5)
        ds.createDimension("two", 2)
        ds.createVariable("date", "f8", ("time", "two"))[:] = np.arange(20).reshape(10, 2)
        ds.createVariable("u", "f4", ("x", "y"))[:] = np.arange(50).reshape(10, 5)
        ds.createVariable("v", "f4", ("time", "y"))[:] = np.arange(50).reshape(10, 5)
    options = {"time_window": 4, "time_name": "date"}
    samples = list(NetCDFAdapter().iter_samples(str(path), "k", options))
    assert [s.key for s in samples] == ["k/t0000", "k/t0004"]
    assert samples[1].fields["u"].shape == (10, 5)  # along x: whole in every window
    assert samples[1].fields["v"].tolist() == np.arange(20, 40).reshape(4, 5).tolist()
    assert samples[1].fields["date"].tolist() == np.arange(8, 16).reshape(4, 2).tolist()
