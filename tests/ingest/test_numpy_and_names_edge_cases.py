"""Edge cases of .npy/.npz sources, source names and field values, on real files.

Extended-precision dtypes, reserved field names, integers out of range, names that are
not UTF-8, symbolic links to directories, odd .npz members and headers that claim more
than the file holds: each is one line naming the file (and the field), which
``on_error="skip"`` skips and lists, or (links) is walked as documented.
"""

import io
import json
import os
import zipfile

import h5py
import numpy as np
import pytest
from simstore.formats.adapters import NpyAdapter, NpzAdapter

from simstore.errors import InvalidInputError, SourceError
from simstore.ingest import hash_sample_blocks, ingest
from simstore.ingest._sources import discover
from simstore.sample import Sample
from simstore.testing.adapters import add_adapters

FORMATS = ["parquet", "zarr"]


def _one_line(exc, *words):
    message = str(exc)
    assert "\n" not in message, message
    for w in words:
        assert w in message, message
    return message


def _keys(catalog, r):
    snap = catalog.snapshot(r.snapshot_id)
    return sorted(catalog.manifest(snap).column("key").to_pylist())


@pytest.fixture
def good(tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    np.save(root / "a_good.npy", np.arange(3.0))
    return root


# -- 1. dtypes that cannot be stored and read back exactly ------------------------------


def _longdouble_npy(root):
    np.save(root / "ld.npy", np.array([1.0, 1.0 + 2.0**-60], np.longdouble))
    return "ld.npy", "data"


def _longdouble_h5(root):
    with h5py.File(root / "ld.h5", "w") as f:
        f["x"] = np.array([1.0, 1.0 + 2.0**-60], np.longdouble)
    return "ld.h5", "x"


def _clongdouble_npz(root):
    np.savez(root / "cld.npz", z=np.array([1 + 2j], np.clongdouble))
    return "cld.npz", "z"


@pytest.mark.skipif(
    np.dtype(np.longdouble).itemsize <= 8, reason="longdouble is float64 here"
)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("make", [_longdouble_npy, _longdouble_h5, _clongdouble_npz])
def test_extended_precision_is_refused_naming_file_field_and_dtype(catalog, good, make, fmt):
    name, field = make(good)
    with pytest.raises(SourceError) as info:
        ingest([good], dataset="d", store=catalog, format=fmt)
    _one_line(info.value, name, f"field {field!r}", "unsupported", "complex" if name == "cld.npz"
              else "float128")
    r = ingest([good], dataset="d", store=catalog, format=fmt, snapshot=True, on_error="skip")
    assert [s.path.endswith(name) for s in r.files_skipped] == [True]
    assert _keys(catalog, r) == ["a_good"]


@pytest.mark.parametrize("attr", [
    np.complex128(1 + 2j),
    np.array([1 + 2j, 3 - 1j]),
    np.clongdouble(1 + 2j),
    np.array([1, 2], dtype=np.longdouble) / 3,
])
def test_a_complex_or_extended_attribute_is_refused_naming_it(catalog, good, attr):
    # attributes as arrays are: not converted (a complex one became its text in the
    # metadata; an array of longdouble never came back from its conversion to JSON)
    with h5py.File(good / "run.h5", "w") as f:
        f["x"] = np.arange(3.0)
        f.attrs["z"] = attr
    dtype = np.asarray(attr).dtype
    with pytest.raises(SourceError) as info:
        ingest([good], dataset="d", store=catalog)
    _one_line(info.value, "run.h5", "field 'z'", f"unsupported dtype {dtype}")


@pytest.mark.skipif(
    np.dtype(np.longdouble).itemsize <= 8, reason="longdouble is float64 here"
)
def test_the_npy_adapter_refuses_longdouble_itself(tmp_path):
    _longdouble_npy(tmp_path)
    with pytest.raises(SourceError) as info:
        list(NpyAdapter().iter_samples(str(tmp_path / "ld.npy"), "ld.npy", {}))
    _one_line(info.value, "ld.npy", "field 'data'", "unsupported dtype float128")


def test_a_longdouble_array_from_any_adapter_is_refused_by_ingest():
    # whatever hands it in: the central check, not only the adapters' own
    with pytest.raises(InvalidInputError) as info:
        hash_sample_blocks(Sample("k", {"v": np.zeros(2, np.longdouble)}))
    _one_line(info.value, "field 'v'", "unsupported dtype")
    with pytest.raises(InvalidInputError):
        hash_sample_blocks(Sample("k", {"s": np.longdouble(1.5)}))


# -- 3. integers an adapter hands in that no dtype holds --------------------------------


@pytest.fixture
def vals_adapter(monkeypatch):
    add_adapters(monkeypatch, {"vals": "json_values_adapter:JsonValuesAdapter"})


@pytest.mark.parametrize(
    "value", [2**64 - 1, 2**70, -(2**64), 10**400], ids=["u64max", "2^70", "-2^64", "10^400"]
)
def test_an_integer_out_of_int64_is_one_line_naming_file_and_field(
    catalog, tmp_path, vals_adapter, value
):
    root = tmp_path / "vals"
    root.mkdir()
    (root / "a_good.vals").write_text(json.dumps({"a": 7}))
    (root / "big.vals").write_text(json.dumps({"a": value}))
    with pytest.raises(SourceError) as info:
        ingest([root], dataset="d", store=catalog)
    _one_line(info.value, "big.vals", "field 'a'", "int64")
    r = ingest([root], dataset="d", store=catalog, snapshot=True, on_error="skip")
    assert [s.path.endswith("big.vals") for s in r.files_skipped] == [True]
    assert _keys(catalog, r) == ["a_good"]


def test_a_scalar_that_does_not_convert_names_its_field():
    with pytest.raises(InvalidInputError) as info:
        hash_sample_blocks(Sample("k", {"a": 2**64 - 1}))
    _one_line(info.value, "field 'a'", "int64")


# -- 4. reserved field names ------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("reserved", ["__key__", "__pad__"])
def test_a_reserved_field_name_is_refused_for_every_format(catalog, good, fmt, reserved):
    with h5py.File(good / "r.h5", "w") as f:
        f[reserved] = np.arange(3.0)
        f["x"] = np.arange(2)
    with pytest.raises(SourceError) as info:
        ingest([good], dataset="d", store=catalog, format=fmt)
    _one_line(info.value, "r.h5", f"field {reserved!r}", "reserved")
    r = ingest([good], dataset="d", store=catalog, format=fmt, snapshot=True, on_error="skip")
    assert [s.path.endswith("r.h5") for s in r.files_skipped] == [True]
    assert _keys(catalog, r) == ["a_good"]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(
    ("name", "words"),
    [("", ("empty name",)), ("p__present", ("'__present'",)), ("q__mask", ("'__mask'",)),
     ("r__offsets", ("'__offsets'",)), ("n" * 65530, ("65530 bytes", "4096")),
     ("a/../../x", ("'.' or '..' path segment",)), ("..", ("'.' or '..' path segment",)),
     ("/a", ("empty",)), ("a//b", ("empty",)), ("a/", ("empty",))],
    ids=["empty", "present", "mask", "offsets", "long", "dotdot", "dotdot-alone",
         "leading-slash", "double-slash", "trailing-slash"],
)
def test_names_no_shard_or_batch_carries_back_are_refused(catalog, good, fmt, name, words):
    # found by an audit: an empty name went into Lance and could not be read back; a
    # name ending in __present or __mask collided with the keys collate adds; a name of
    # 65,530 bytes crashed the Zarr writer (zip entry names) with a traceback; names with
    # '.', '..' or empty path segments made Zarr shards stock zarr-python refuses (and
    # zip entries such as 0/a/../../zarr.json, over the shard's root metadata)
    np.savez(good / "r.npz", **{name: np.arange(3.0), "x": np.arange(2)})
    with pytest.raises(SourceError) as info:
        ingest([good], dataset="d", store=catalog, format=fmt)
    _one_line(info.value, "r.npz", *words)
    r = ingest([good], dataset="d", store=catalog, format=fmt, snapshot=True, on_error="skip")
    assert [s.path.endswith("r.npz") for s in r.files_skipped] == [True]
    assert _keys(catalog, r) == ["a_good"]


# -- 2. source names that are not UTF-8 -------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_name_that_is_not_utf8_is_a_bad_source_not_a_crash(catalog, good, fmt):
    bad = os.path.join(os.fsencode(good), b"caf\xe9.npy")
    try:
        with open(bad, "wb") as f:
            np.save(f, np.arange(2))
    except OSError:
        pytest.skip("this file system refuses names that are not UTF-8")
    with pytest.raises(SourceError) as info:
        ingest([good], dataset="d", store=catalog, format=fmt)
    message = _one_line(info.value, "caf\\xe9.npy", "UTF-8")
    message.encode("utf-8")  # printable
    r = ingest([good], dataset="d", store=catalog, format=fmt, snapshot=True, on_error="skip")
    assert len(r.files_skipped) == 1
    assert "caf\\xe9.npy" in r.files_skipped[0].reason
    json.dumps(r.to_json())
    assert _keys(catalog, r) == ["a_good"]


# -- 13. symbolic links to directories ---------------------------------------------------


def test_links_to_directories_are_followed_and_each_directory_walked_once(tmp_path):
    root, other = tmp_path / "root", tmp_path / "other"
    (root / "sub").mkdir(parents=True)
    other.mkdir()
    np.save(root / "a.npy", np.arange(3))
    np.save(root / "sub" / "b.npy", np.arange(4))
    np.save(other / "c.npy", np.arange(5))
    os.symlink(other, root / "linkdir")  # followed
    os.symlink(other, root / "zlink")  # a second link to it: walked once, under linkdir
    os.symlink(root, root / "sub" / "loop")  # a loop: ends here
    os.symlink(root / "sub", root / "sub2")  # a link to a directory walked by name
    files, ignored = discover([str(root)], NpyAdapter())
    assert [f.key for f in files] == ["a.npy", "linkdir/c.npy", "sub/b.npy"]
    assert ignored == []


# -- 9. 0-d byte strings that are not UTF-8 ---------------------------------------------


def test_a_0d_byte_string_keeps_its_bytes_like_a_1d_one(tmp_path):
    path = tmp_path / "s.npz"
    np.savez(path, s0=np.array(b"\xff\xfeab"), t0=np.array(b"text"),
             s1=np.array([b"\xff", b"ok"]), u0=np.array("h\xe9llo"))
    sample = next(NpzAdapter().iter_samples(str(path), "s.npz", {}))
    assert sample.fields["s0"] == {"__bytes_hex__": "fffe6162"}
    assert bytes.fromhex(sample.fields["s0"]["__bytes_hex__"]) == b"\xff\xfeab"
    assert sample.fields["t0"] == "text"
    assert sample.fields["u0"] == "h\xe9llo"
    assert sample.fields["s1"] == {"values": [{"__bytes_hex__": "ff"}, "ok"]}


def test_a_0d_byte_string_is_stored_with_its_bytes(catalog, tmp_path, read):
    root = tmp_path / "src"
    root.mkdir()
    np.savez(root / "s.npz", s0=np.array(b"\xff\xfeab"))
    r = ingest([root], dataset="d", store=catalog, snapshot=True)
    _, samples = read(catalog, f"d@{r.snapshot_id}")
    assert samples["s"]["s0"] == {"__bytes_hex__": "fffe6162"}


# -- 7. string arrays read whole are capped ---------------------------------------------


def test_a_string_array_over_the_cap_is_refused_before_it_is_read(tmp_path, monkeypatch):
    import simstore.formats.adapters._limits as limits

    monkeypatch.setattr(limits, "MAX_WHOLE_VALUE_BYTES", 1000)
    np.save(tmp_path / "s.npy", np.array([b"x" * 100] * 20, dtype="S100"))
    with pytest.raises(SourceError) as info:
        list(NpyAdapter().iter_samples(str(tmp_path / "s.npy"), "s.npy", {}))
    _one_line(info.value, "s.npy", "field 'data'", "2,000 bytes")
    np.savez(tmp_path / "s.npz", names=np.array(["y" * 100] * 10))  # U100: 4,000 bytes
    with pytest.raises(SourceError) as info:
        list(NpzAdapter().iter_samples(str(tmp_path / "s.npz"), "s.npz", {}))
    _one_line(info.value, "s.npz", "field 'names'", "4,000 bytes")
    np.savez_compressed(tmp_path / "c.npz", names=np.array(["y" * 100] * 10))

    def never(*args, **kwargs):
        raise AssertionError("the strings were read")

    monkeypatch.setattr(np, "load", never)
    with pytest.raises(SourceError) as info:
        list(NpzAdapter().iter_samples(str(tmp_path / "c.npz"), "c.npz", {}))
    _one_line(info.value, "c.npz", "field 'names'", "4,000 bytes")
    monkeypatch.undo()
    monkeypatch.setattr(limits, "MAX_WHOLE_VALUE_BYTES", 1000)
    np.save(tmp_path / "ok.npy", np.array([b"x" * 10] * 10))  # under the cap: read
    sample = next(NpyAdapter().iter_samples(str(tmp_path / "ok.npy"), "ok.npy", {}))
    assert sample.fields["data"] == {"values": ["x" * 10] * 10}


# -- 14. .npz members: names as np.load gives them, non-arrays, headers that lie --------


def _member(shape, data, dtype="<f8"):
    b = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        b, {"descr": dtype, "fortran_order": False, "shape": shape}
    )
    return b.getvalue() + data


def _npy_bytes(arr):
    b = io.BytesIO()
    np.lib.format.write_array(b, arr, allow_pickle=False)
    return b.getvalue()


@pytest.mark.parametrize("compression", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])
def test_npz_members_are_named_as_np_load_names_them(tmp_path, compression):
    path = tmp_path / "m.npz"
    with zipfile.ZipFile(path, "w", compression) as z:
        z.writestr("x.npy", _npy_bytes(np.arange(3.0)))
        z.writestr("y.NPY", _npy_bytes(np.arange(4)))
        z.writestr("plain", _npy_bytes(np.arange(2, dtype=np.int8)))
    with np.load(path) as npz:
        expected = {k: npz[k] for k in npz.files}
    sample = next(NpzAdapter().iter_samples(str(path), "m.npz", {}))
    assert sorted(sample.fields) == sorted(expected) == ["plain", "x", "y.NPY"]
    for k, v in expected.items():
        np.testing.assert_array_equal(sample.fields[k], v)


@pytest.mark.parametrize("compression", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])
def test_an_npz_member_that_is_no_array_is_refused_naming_it(tmp_path, compression):
    path = tmp_path / "extra.npz"
    with zipfile.ZipFile(path, "w", compression) as z:
        z.writestr("x.npy", _npy_bytes(np.arange(3.0)))
        z.writestr("notes.txt", b"hello")
    with pytest.raises(SourceError) as info:
        list(NpzAdapter().iter_samples(str(path), "extra.npz", {}))
    _one_line(info.value, "extra.npz", "'notes.txt'", "not a NumPy array")


def test_two_npz_members_of_one_field_are_refused(tmp_path):
    path = tmp_path / "dup.npz"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("x", _npy_bytes(np.arange(3.0)))
        z.writestr("x.npy", _npy_bytes(np.arange(3.0)))
    with pytest.raises(SourceError) as info:
        list(NpzAdapter().iter_samples(str(path), "dup.npz", {}))
    _one_line(info.value, "dup.npz", "'x'", "'x.npy'")


@pytest.mark.parametrize("compression", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])
@pytest.mark.parametrize("shape", [(10**13,), (20 * 2**30 // 8,), (9,)])
def test_an_npz_header_claiming_more_than_the_member_holds_names_the_field(
    tmp_path, compression, shape
):
    path = tmp_path / "huge.npz"
    with zipfile.ZipFile(path, "w", compression) as z:
        z.writestr("x.npy", _member(shape, b"\0" * 64))  # 8 float64 values
        # what follows the member in the file must not be taken for its values
        z.writestr("zz.npy", _npy_bytes(np.ones(4096)))
    with pytest.raises(SourceError) as info:
        list(NpzAdapter().iter_samples(str(path), "huge.npz", {}))
    _one_line(info.value, "huge.npz", "field 'x'", "64 bytes")


def test_an_npz_of_odd_members_is_skipped_and_listed(catalog, good):
    with zipfile.ZipFile(good / "extra.npz", "w") as z:
        z.writestr("x.npy", _npy_bytes(np.arange(3.0)))
        z.writestr("notes.txt", b"hello")
    r = ingest([good], dataset="d", store=catalog, snapshot=True, on_error="skip")
    assert [s.path.endswith("extra.npz") for s in r.files_skipped] == [True]
    assert _keys(catalog, r) == ["a_good"]
