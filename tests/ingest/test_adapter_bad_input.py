"""Damaged .npz members, malformed meshes and null HDF5 dataspaces: one line, nothing else.

Every file here is written by the real library (numpy, meshio, h5py) and then damaged
the way a disk or a copy damages files.
"""

import json
import os
import struct
import subprocess
import sys
import zipfile

import h5py
import meshio
import numpy as np
import pytest
from simstore.formats.adapters import HDF5Adapter, MeshAdapter, NpzAdapter

from simstore.errors import SourceError
from simstore.ingest import ingest


def member_data(path, name):
    """(offset, size) of a member's bytes in a zip file."""
    with zipfile.ZipFile(path) as zf, open(path, "rb") as f:
        info = zf.getinfo(name)
        f.seek(info.header_offset)
        local = f.read(30)
        n, m = struct.unpack("<HH", local[26:30])
        return info.header_offset + 30 + n + m, info.compress_size


def damage(path, offset, data):
    raw = bytearray(path.read_bytes())
    raw[offset : offset + len(data)] = data
    path.write_bytes(bytes(raw))


def samples(adapter, path, **options):
    return list(adapter.iter_samples(str(path), path.name, options))


def one_line_naming(exc_info, path, field):
    message = str(exc_info.value)
    assert "\n" not in message
    assert message.startswith(str(path))
    if field is not None:
        assert f"field {field!r}" in message
    return message


# -- stored .npz members (np.savez): the CRC-32 is checked before values are used


def test_corrupt_stored_npz_member_fails_the_ingest_naming_the_field(tmp_path, catalog):
    src = tmp_path / "c.npz"
    np.savez(src, a=np.arange(100.0))
    damage(src, 200, b"\xff" * 40)  # inside a's values: NaNs if read unchecked
    with pytest.raises(SourceError) as info:
        ingest([src], dataset="d", store=catalog, snapshot=True)
    message = one_line_naming(info, src, "a")
    assert "CRC-32" in message
    assert catalog.staged("d") == []
    assert catalog.branches("d").get_versioned("main")[0] is None


def test_corrupt_stored_npz_member_read_in_windows_is_refused_before_any_read(tmp_path):
    src = tmp_path / "big.npz"
    values = np.arange(1 << 16, dtype=np.float64)  # 512 KiB, over the limit below
    np.savez(src, a=np.ones(3), big=values)
    offset, size = member_data(src, "big.npy")
    damage(src, offset + size - 8, b"\x00\x00\x00\x00\x00\x00\xf8\x7f")  # the last one NaN
    with pytest.raises(SourceError) as info:
        samples(NpzAdapter(), src, max_in_memory_bytes=4096)
    assert "CRC-32" in one_line_naming(info, src, "big")


def test_corrupt_stored_npz_header_is_a_crc_error_too(tmp_path):
    src = tmp_path / "h.npz"
    np.savez(src, a=np.arange(10.0))
    offset, _ = member_data(src, "a.npy")
    damage(src, offset + 20, b"'fortran_order': True, ")
    with pytest.raises(SourceError) as info:
        samples(NpzAdapter(), src)
    assert "CRC-32" in one_line_naming(info, src, "a")


def test_intact_stored_npz_members_still_read_and_map(tmp_path):
    src = tmp_path / "ok.npz"
    small, big = np.arange(5.0), np.arange(1 << 18, dtype=np.float32)
    np.savez(src, small=small, big=big, empty=np.zeros((0, 3)))
    (sample,) = samples(NpzAdapter(), src)
    np.testing.assert_array_equal(sample.fields["small"], small)
    np.testing.assert_array_equal(sample.fields["big"], big)
    assert sample.fields["empty"].shape == (0, 3)
    (windowed,) = samples(NpzAdapter(), src, max_in_memory_bytes=4096)
    np.testing.assert_array_equal(windowed.fields["big"][(slice(10, 20),)], big[10:20])


def test_ingest_checks_stored_members_in_its_hash_pass_and_still_finds_damage(
    tmp_path, catalog, monkeypatch
):
    import simstore.formats.adapters._numpy as npz_module

    calls = []
    real = npz_module.crc32
    monkeypatch.setattr(npz_module, "crc32", lambda *a: calls.append(1) or real(*a))
    src = tmp_path / "src"
    src.mkdir()
    values = np.arange(1 << 18, dtype=np.float32)
    np.savez(src / "ok.npz", a=np.arange(5.0), big=values)
    r = ingest([src], dataset="d", store=catalog, snapshot=True)
    assert r.samples == 1
    assert calls == []  # the members' CRC-32s came from the hash's pass over the file
    # a damaged member is found all the same, named, and nothing is committed
    bad = src / "ok.npz"
    offset, size = member_data(bad, "big.npy")
    damage(bad, offset + size // 2, b"\x00\x00\xc0\x7f")  # a NaN mid-array
    with pytest.raises(SourceError) as info:
        ingest([src], dataset="e", store=catalog, snapshot=True)
    assert "CRC-32" in one_line_naming(info, bad, "big")
    assert catalog.branches("e").get_versioned("main")[0] is None


# -- compressed .npz members (np.savez_compressed): zlib and zipfile errors


def test_damaged_deflate_stream_names_the_field(tmp_path):
    src = tmp_path / "z.npz"
    np.savez_compressed(src, a=np.arange(100000.0))
    offset, _ = member_data(src, "a.npy")
    damage(src, offset, b"\xff")  # a first block of the reserved type 3: any zlib refuses it
    with pytest.raises(SourceError) as info:
        samples(NpzAdapter(), src)
    message = one_line_naming(info, src, "a")
    assert "unreadable array" in message and "decompressing" in message


@pytest.mark.parametrize("max_bytes", [1 << 30, 4096], ids=["in-memory", "inflated-to-disk"])
def test_bad_crc_of_a_compressed_member_names_the_field(tmp_path, max_bytes):
    src = tmp_path / "z.npz"
    np.savez_compressed(src, a=np.arange(10000.0))
    with zipfile.ZipFile(src) as zf:
        crc = zf.getinfo("a.npy").CRC
    raw = src.read_bytes()
    assert raw.count(struct.pack("<I", crc)) == 2  # the local and the central header
    src.write_bytes(raw.replace(struct.pack("<I", crc), struct.pack("<I", crc ^ 1)))
    with pytest.raises(SourceError) as info:
        samples(NpzAdapter(), src, max_in_memory_bytes=max_bytes)
    assert "CRC" in one_line_naming(info, src, "a")


# -- malformed meshes: meshio's prints are captured and its reason kept


def test_malformed_ply_gives_meshio_reason_and_prints_nothing(tmp_path, capfd):
    src = tmp_path / "bad.ply"
    src.write_text("not a ply file\n")
    with pytest.raises(SourceError) as info:
        samples(MeshAdapter(), src)
    assert one_line_naming(info, src, None).endswith("not a readable mesh: Expected ply")
    assert capfd.readouterr() == ("", "")


@pytest.mark.parametrize("name", ["empty.ply", "empty.vtu"])
def test_empty_mesh_file_says_so(tmp_path, capfd, name):
    src = tmp_path / name
    src.write_bytes(b"")
    with pytest.raises(SourceError) as info:
        samples(MeshAdapter(), src)
    assert "the file is empty" in one_line_naming(info, src, None)
    assert capfd.readouterr() == ("", "")


def test_truncated_vtu_names_the_format_and_prints_nothing(tmp_path, capfd):
    good = tmp_path / "good.vtu"
    meshio.Mesh(
        np.random.default_rng(0).random((10, 3)),
        [("triangle", np.array([[0, 1, 2], [3, 4, 5]]))],
        point_data={"u": np.arange(10.0)},
    ).write(good)
    src = tmp_path / "cut.vtu"
    src.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(SourceError) as info:
        samples(MeshAdapter(), src)
    assert "meshio could not read it as vtu" in one_line_naming(info, src, None)
    assert capfd.readouterr() == ("", "")


def cli(*args):
    env = {**os.environ, "COLUMNS": "60"}  # narrow: rich's banner would wrap onto more lines
    return subprocess.run(
        [sys.executable, "-m", "simstore.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_cli_json_stays_json_and_a_bad_mesh_is_one_stderr_line(tmp_path):
    folder = tmp_path / "d"
    folder.mkdir()
    np.savez(folder / "good.npz", x=np.arange(3.0))
    (folder / "bad.ply").write_text("garbage\n")
    store = str(tmp_path / "st")
    assert cli("--store", store, "init").returncode == 0
    r = cli("--store", store, "ingest", str(folder), "--dataset", "m", "--on-error", "skip",
            "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert [s["path"] for s in summary["skipped"]] == [str(folder / "bad.ply")]
    assert "Expected ply" in summary["skipped"][0]["reason"]
    r = cli("--store", store, "ingest", str(folder / "bad.ply"), "--dataset", "m2")
    assert r.returncode == 8
    assert r.stdout == ""
    assert r.stderr.count("\n") == 1 and "bad.ply" in r.stderr and "Expected ply" in r.stderr


# -- HDF5 null dataspace (h5py.Empty): refused, naming the dataset


@pytest.mark.parametrize("dtype", ["f8", "S10"])
def test_hdf5_null_dataspace_is_refused_naming_the_dataset(tmp_path, dtype):
    src = tmp_path / "n.h5"
    with h5py.File(src, "w") as f:
        f.create_dataset("x", data=np.arange(3.0))
        f.create_dataset("group/empty", data=h5py.Empty(dtype))
    with pytest.raises(SourceError) as info:
        samples(HDF5Adapter(), src)
    assert "null dataspace" in one_line_naming(info, src, "group/empty")


def test_hdf5_attribute_with_a_null_dataspace_is_null_metadata(tmp_path):
    from simstore.formats.adapters._tree import json_safe

    path = tmp_path / "a.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.arange(3.0)
        f.attrs["nothing"] = h5py.Empty("f8")
    with h5py.File(path, "r") as f:
        assert json_safe(f.attrs["nothing"]) is None


@pytest.mark.parametrize("fmt", ["parquet", "zarr"])
def test_a_0d_array_keeps_its_shape_on_every_read_path(tmp_path, fmt):
    """A stored .npz member at an odd offset, a compressed one and an HDF5 scalar dataset
    are read through the sliced path: each stays 0-d (rank 0 in the schema)."""
    from simstore.loaders import SimDataset

    from simstore.catalog import Catalog
    from simstore.ingest import ingest

    src = tmp_path / "src"
    src.mkdir()
    np.savez(src / "r.npz", x=np.array(1.5, "f4"), y=np.array(7, "i8"))
    np.savez_compressed(src / "c.npz", x=np.array(2.5, "f4"), y=np.array(8, "i8"))
    with h5py.File(src / "h.h5", "w") as f:
        f["x"] = np.float32(3.5)
        f["y"] = np.int64(9)
    cat = Catalog.init(str(tmp_path / "store"))
    ingest([str(src)], dataset="d", store=cat, format=fmt, snapshot=True)
    snap = cat.snapshot(cat.resolve("d"))
    assert {s.name: s.ndim for s in snap.schema} == {"x": 0, "y": 0}
    got = {s["__key__"]: (s["x"], s["y"]) for s in SimDataset(str(tmp_path / "store"), "d")}
    assert got.keys() == {"r", "c", "h.h5"}
    for key, (x, y) in got.items():
        assert x.shape == () and y.shape == ()
        assert (float(x), int(y)) == {"r": (1.5, 7), "c": (2.5, 8), "h.h5": (3.5, 9)}[key]
