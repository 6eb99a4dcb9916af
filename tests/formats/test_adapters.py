"""Source adapters on real files written by h5py, netCDF4, zarr, meshio and gmsh."""

import zipfile

import numpy as np
import pytest
import source_files as sf
from simstore.formats import get_adapter, list_adapters
from simstore.formats.adapters import (
    AutoAdapter,
    CadAdapter,
    HDF5Adapter,
    MeshAdapter,
    NetCDFAdapter,
    NpyAdapter,
    NpzAdapter,
    ZarrAdapter,
)
from simstore.formats.testing import SourceAdapterTests, assert_fields_equal

from simstore.errors import SourceError
from simstore.ingest import is_array_source


def h5_expected(d):
    return {
        "Re": np.float64(250.0),
        "solver": "demo-solver",
        "n_steps": np.int64(12),
        "metadata": {"field_names": ["density", "velocity"]},
        "time": d["time"],
        "grid/x": d["x"],
        "grid/y": d["y"],
        "grid/units": "m",
        "fields/density": d["density"],
        "fields/velocity": d["velocity"],
        "fields/velocity.units": "m/s",
    }


class TestHDF5(SourceAdapterTests):
    @pytest.fixture
    def adapter(self):
        return HDF5Adapter()

    @pytest.fixture
    def source(self, tmp_path):
        path = tmp_path / "run7.h5"
        d = sf.write_h5(path, big_endian=True)
        return path, "run7.h5", {"run7.h5": h5_expected(d)}

    @pytest.fixture
    def corrupt_source(self, tmp_path):
        good = tmp_path / "good.h5"
        sf.write_h5(good)
        bad = tmp_path / "truncated.h5"
        bad.write_bytes(good.read_bytes()[:1500])
        return bad


class TestHDF5Windows(TestHDF5):
    options = {"time_window": 4, "stride": 3}

    @pytest.fixture
    def source(self, tmp_path):
        path = tmp_path / "run7.h5"
        d = sf.write_h5(path)
        full = h5_expected(d)
        expected = {}
        for start in (0, 3, 6):
            fields = dict(full)
            for name in ("time", "fields/density", "fields/velocity"):
                fields[name] = full[name][start : start + 4]
            expected[f"run7.h5/t{start:04d}"] = fields
        return path, "run7.h5", expected


def test_hdf5_big_datasets_stay_in_the_file(tmp_path):
    path = tmp_path / "r.h5"
    d = sf.write_h5(path)
    samples = HDF5Adapter().iter_samples(str(path), "r.h5", {"max_in_memory_bytes": 100})
    lazy = next(samples).fields["fields/velocity"]  # valid while the iterator is open
    assert is_array_source(lazy)
    np.testing.assert_array_equal(lazy[(slice(2, 4),)], d["velocity"][2:4])
    samples.close()
    with pytest.raises(SourceError, match=r"r\.h5: field 'fields/velocity'"):
        lazy[(slice(0, 1),)]


def test_hdf5_unfiltered_chunks_are_read_without_a_chunk_cache(tmp_path):
    """Chunked, unfiltered datasets (in groups too) are opened with no chunk cache and
    read the same values in any box; a compressed one keeps HDF5's cache."""
    import h5py

    rng = np.random.default_rng(3)
    plain = rng.standard_normal((10, 24, 20)).astype(np.float32)
    with h5py.File(tmp_path / "c.h5", "w") as f:
        f.create_dataset("g/plain", data=plain, chunks=(1, 24, 20))
        f.create_dataset("packed", data=plain * 2, chunks=(4, 8, 8), compression="gzip")
    samples = HDF5Adapter().iter_samples(str(tmp_path / "c.h5"), "c.h5", {"max_in_memory_bytes": 8})
    fields = next(samples).fields
    caches = {n: fields[n]._handle.id.get_access_plist().get_chunk_cache() for n in ("g/plain", "packed")}
    assert caches["g/plain"][1] == 0 and caches["packed"][1] > 0
    for box in [(slice(0, 10),), (slice(3, 7), slice(5, 19), slice(2, 20)), (slice(9, 10),)]:
        np.testing.assert_array_equal(fields["g/plain"][box], plain[box])
        np.testing.assert_array_equal(fields["packed"][box], plain[box] * 2)
    samples.close()


def test_hdf5_window_longer_than_the_run_names_the_file(tmp_path):
    path = tmp_path / "short.h5"
    sf.write_h5(path, t=3)
    with pytest.raises(SourceError, match=r"short\.h5: time axis has 3 steps"):
        list(HDF5Adapter().iter_samples(str(path), "short.h5", {"time_window": 5}))


class TestNetCDF(SourceAdapterTests):
    @pytest.fixture
    def adapter(self):
        return NetCDFAdapter()

    @pytest.fixture
    def source(self, tmp_path):
        path = tmp_path / "ocean.nc"
        d = sf.write_nc(path)
        return (
            path,
            "ocean.nc",
            {
                "ocean.nc": {
                    "title": "demo",
                    "Re": np.float64(250.0),
                    "time": d["time"],
                    "x": d["x"],
                    "fields/pressure": d["density"],
                    "fields/pressure.units": "Pa",
                }
            },
        )

    @pytest.fixture
    def corrupt_source(self, tmp_path):
        bad = tmp_path / "bad.nc"
        bad.write_bytes(b"CDF\x01" + b"\xff" * 40)
        return bad


def test_netcdf_windows_follow_the_unlimited_dimension(tmp_path):
    path = tmp_path / "ocean.nc"
    d = sf.write_nc(path)
    samples = list(
        NetCDFAdapter().iter_samples(str(path), "ocean.nc", {"time_window": 5, "stride": 5})
    )
    assert [s.key for s in samples] == ["ocean.nc/t0000", "ocean.nc/t0005"]
    np.testing.assert_array_equal(samples[1].fields["fields/pressure"], d["density"][5:10])
    np.testing.assert_array_equal(samples[1].fields["x"], d["x"])  # no time axis: repeated


class TestNpz(SourceAdapterTests):
    @pytest.fixture
    def adapter(self):
        return NpzAdapter()

    @pytest.fixture
    def source(self, tmp_path):
        (tmp_path / "a").mkdir()
        path = tmp_path / "a" / "case.npz"
        arrays = sf.write_npz(path)
        return path, "a/case.npz", {"a/case": arrays}

    @pytest.fixture
    def corrupt_source(self, tmp_path):
        bad = tmp_path / "bad.npz"
        bad.write_bytes(b"PK\x03\x04 broken")
        return bad


class TestNpzCompressed(TestNpz):
    options = {"max_in_memory_bytes": 64}  # big members are inflated to a temp file

    @pytest.fixture
    def source(self, tmp_path):
        path = tmp_path / "case.npz"
        arrays = sf.write_npz(path, compressed=True)
        return path, "case.npz", {"case": arrays}


def test_npz_object_arrays_are_refused_naming_the_field(tmp_path):
    path = tmp_path / "obj.npz"
    np.savez(path, good=np.zeros(3), bad=np.array([{"a": 1}], dtype=object))
    with pytest.raises(SourceError, match=r"obj\.npz: field 'bad': object arrays are refused"):
        list(NpzAdapter().iter_samples(str(path), "obj.npz", {}))


def test_npz_members_are_memory_mapped_when_big(tmp_path):
    path = tmp_path / "m.npz"
    arrays = sf.write_npz(path)
    sample = next(NpzAdapter().iter_samples(str(path), "m.npz", {"max_in_memory_bytes": 16}))
    assert is_array_source(sample.fields["u"])
    np.testing.assert_array_equal(sample.fields["u"][(slice(3, 5),)], arrays["u"][3:5])


class TestNpy(SourceAdapterTests):
    @pytest.fixture
    def adapter(self):
        return NpyAdapter()

    @pytest.fixture
    def source(self, tmp_path):
        path = tmp_path / "field.npy"
        data = np.arange(24, dtype=">i4").reshape(2, 3, 4)
        np.save(path, data)
        return path, "field.npy", {"field": {"data": data.astype("=i4")}}

    @pytest.fixture
    def corrupt_source(self, tmp_path):
        good = tmp_path / "g.npy"
        np.save(good, np.zeros(1000))
        bad = tmp_path / "truncated.npy"
        bad.write_bytes(good.read_bytes()[:500])
        return bad


class TestZarrGroup(SourceAdapterTests):
    @pytest.fixture
    def adapter(self):
        return ZarrAdapter()

    @pytest.fixture
    def source(self, tmp_path):
        path = tmp_path / "run.zarr"
        d = sf.write_zarr_group(path)
        return (
            path,
            "run.zarr",
            {"run.zarr": {"Re": 250.0, "time": d["time"], "fields/density": d["density"]}},
        )

    @pytest.fixture
    def corrupt_source(self, tmp_path):
        bad = tmp_path / "bad.zarr"
        bad.mkdir()
        (bad / "zarr.json").write_text("{not json")
        return bad


MESHES = [".vtu", ".vtk", ".xdmf", ".stl", ".ply", ".obj"]


class TestMesh(SourceAdapterTests):
    @pytest.fixture
    def adapter(self):
        return MeshAdapter()

    @pytest.fixture(params=MESHES)
    def source(self, tmp_path, request):
        path = tmp_path / f"part{request.param}"
        expected = sf.write_mesh(path)
        got = dict(expected)
        got["metadata"] = None  # checked below
        return path, path.name, {path.name: expected}

    @pytest.fixture
    def corrupt_source(self, tmp_path):
        bad = tmp_path / "bad.stl"
        bad.write_text("solid x\nfacet normal 0 0 1\n outer loop\n vertex 0 0\nendsolid\n")
        return bad

    def test_samples_equal_the_source(self, adapter, source):
        path, key, expected = source
        (sample,) = adapter.iter_samples(str(path), key, {})
        fields = dict(sample.fields)
        meta = fields.pop("metadata")
        want = expected[key]
        for name in ("point_data/", "cell_data/"):
            for k in [k for k in fields if k.startswith(name) and k not in want]:
                fields.pop(k)  # format-specific extras (STL facet normals, ...)
        assert_fields_equal(
            {k: (v.astype(want[k].dtype) if k == "points" else v) for k, v in fields.items()}, want
        )
        assert meta["cell_types"] == sorted(k.split("/")[1] for k in want if k.startswith("cells/"))


def test_malformed_binary_stl_is_refused(tmp_path):
    bad = tmp_path / "empty.stl"
    bad.write_bytes(b"\x00" * 80 + b"\x05\x00\x00\x00" + b"\x00" * 20)
    with pytest.raises(SourceError, match=r"empty\.stl: not a readable mesh: its binary STL "
                       r"header says 5 triangles \(334 bytes\), the file has 104 bytes"):
        list(MeshAdapter().iter_samples(str(bad), "empty.stl", {}))


def test_stl_files_the_size_check_leaves_to_meshio(tmp_path):
    # ASCII with a UTF-8 byte order mark, and a binary file whose header starts "solid"
    # (as some exporters write it): read as before the size check of binary files
    text = (b"solid t\nfacet normal 0 0 1\n outer loop\n  vertex 0 0 0\n  vertex 1 0 0\n"
            b"  vertex 0 1 0\n endloop\nendfacet\nendsolid t\n")
    (tmp_path / "bom.stl").write_bytes(b"\xef\xbb\xbf" + text)
    tri = np.array([0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0], "<f4").tobytes() + b"\0\0"
    (tmp_path / "solid.stl").write_bytes(b"solid header".ljust(80, b" ")
                                         + (1).to_bytes(4, "little") + tri)
    for name in ("bom.stl", "solid.stl"):
        (sample,) = MeshAdapter().iter_samples(str(tmp_path / name), name, {})
        assert sample.fields["points"].shape == (3, 3), name
        assert sample.fields["cells/triangle"].tolist() == [[0, 1, 2]], name


def test_gmsh_msh_written_by_gmsh(tmp_path):
    path = tmp_path / "square.msh"
    sf.write_msh_with_gmsh(path)
    (sample,) = MeshAdapter().iter_samples(str(path), "square.msh", {})
    tris = sample.fields["cells/triangle"]
    assert tris.dtype == np.int64 and tris.shape[1] == 3 and len(tris) >= 2
    pts = sample.fields["points"]
    assert pts.shape[1] == 3 and pts.min() == 0.0 and pts.max() == 1.0


def test_pvd_series_gives_one_sample_per_step_and_claims_its_files(tmp_path):
    expected = sf.write_pvd(tmp_path)
    adapter = MeshAdapter()
    samples = list(adapter.iter_samples(str(tmp_path / "series.pvd"), "series.pvd", {}))
    assert [s.key for s in samples] == [f"series.pvd/t{i:04d}" for i in range(3)]
    for s, want in zip(samples, expected, strict=False):
        assert s.fields["time"] == pytest.approx(0.1 * samples.index(s))
        assert_fields_equal({k: s.fields[k] for k in want}, want)
    assert len(adapter.companions(str(tmp_path / "series.pvd"))) == 3


def test_xdmf_time_series(tmp_path):
    expected = sf.write_xdmf_series(tmp_path / "ts.xdmf")
    adapter = MeshAdapter()
    samples = list(adapter.iter_samples(str(tmp_path / "ts.xdmf"), "ts.xdmf", {}))
    assert [s.key for s in samples] == ["ts.xdmf/t0000", "ts.xdmf/t0001"]
    for s, want in zip(samples, expected, strict=False):
        assert_fields_equal({k: s.fields[k] for k in want}, want)
    assert [p.endswith("ts.h5") for p in adapter.companions(str(tmp_path / "ts.xdmf"))] == [True]


@pytest.fixture
def step_file(tmp_path):
    path = tmp_path / "box.step"
    sf.write_step(path)
    return path


def test_cad_step_tessellates_with_measures_and_source_id(step_file):
    from simstore.hashing import hash_file

    (sample,) = CadAdapter().iter_samples(str(step_file), "box.step", {"cad_tolerance": 0.1})
    f = sample.fields
    assert f["volume"] == pytest.approx(6.0, rel=1e-6)
    assert f["surface_area"] == pytest.approx(22.0, rel=1e-6)
    assert (f["bbox/xmax"], f["bbox/ymax"], f["bbox/zmax"]) == pytest.approx((1, 2, 3), abs=1e-6)
    assert f["source_object"] == hash_file(str(step_file))[0]
    tris, pts = f["cells/triangle"], f["points"]
    assert tris.max() < len(pts) and len(tris) > 12
    # every triangle lies on the box surface
    centroids = pts[tris].mean(axis=1)
    on_face = np.isclose(centroids, 0, atol=1e-9) | np.isclose(centroids, [1, 2, 3], atol=1e-9)
    assert on_face.any(axis=1).all()
    assert f["metadata"]["mesh"] == "surface"


def test_cad_finer_tolerance_gives_more_triangles(step_file):
    coarse = next(CadAdapter().iter_samples(str(step_file), "b", {"cad_tolerance": 0.2}))
    fine = next(CadAdapter().iter_samples(str(step_file), "b", {"cad_tolerance": 0.05}))
    assert len(fine.fields["cells/triangle"]) > len(coarse.fields["cells/triangle"])


@pytest.mark.parametrize(
    "options, words",
    [({"cad_tolerance": 0}, "cad_tolerance 0"), ({"cad_tolerance": -0.05}, "cad_tolerance"),
     ({"cad_tolerance": "fine"}, "cad_tolerance"), ({"cad_tolerance": float("nan")}, "above 0"),
     ({"cad_mesh": "volumes"}, "cad_mesh 'volumes'")],
)
def test_cad_mesh_options_are_checked(step_file, options, words):
    from simstore.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match=words):
        next(CadAdapter().iter_samples(str(step_file), "b", options))


def test_an_iges_cylinders_bounding_box_is_the_parts(tmp_path):
    """IGES brings B-spline surfaces, whose quick box follows their control polygon."""
    import gmsh

    path = tmp_path / "cyl.iges"
    # not interruptible: gmsh would set SIGINT to its default (the end of the process)
    # for the rest of the test session
    gmsh.initialize(readConfigFiles=False, interruptible=False)
    try:
        gmsh.option.setNumber("General.Terminal", 0)
        gmsh.model.add("cyl")
        gmsh.model.occ.addCylinder(0, 0, 0, 0, 0, 10, 5)
        gmsh.model.occ.synchronize()
        gmsh.write(str(path))
    finally:
        gmsh.finalize()
    (sample,) = CadAdapter().iter_samples(str(path), "c", {"cad_tolerance": 0.1})
    f = sample.fields
    got = [f[f"bbox/{a}{m}"] for m in ("min", "max") for a in "xyz"]
    assert got == pytest.approx([-5, -5, 0, 5, 5, 10], abs=1e-3)
    assert f["mesh_size"] == pytest.approx(0.1 * np.linalg.norm([10, 10, 10]), rel=1e-3)


@pytest.mark.slow
def test_cad_volume_mesh_of_overlapping_solids_says_what_it_did(tmp_path):
    path = tmp_path / "assembly.step"
    sf.write_step(path, overlapping=True)
    (sample,) = CadAdapter().iter_samples(
        str(path), "a", {"cad_tolerance": 0.2, "cad_mesh": "volume"}
    )
    meta = sample.fields["metadata"]
    assert meta["solids"] == 2
    assert meta["mesh"] in ("volume", "per-solid", "surface")
    if meta["mesh"] != "surface":
        tets = sample.fields["cells/tetra"]
        assert tets.shape[1] == 4 and tets.max() < len(sample.fields["points"])
    else:
        assert "failed" in meta["reason"]


def test_cad_garbage_step_is_a_source_error(tmp_path):
    bad = tmp_path / "broken.step"
    bad.write_text("ISO-10303-21;\nHEADER;\nthis is not a model\nENDSEC;\n")
    with pytest.raises(SourceError, match=r"broken\.step: not a readable CAD file: "):
        list(CadAdapter().iter_samples(str(bad), "broken.step", {}))


def test_auto_picks_by_extension_and_magic(tmp_path):
    sf.write_h5(tmp_path / "a.h5")
    sf.write_h5(tmp_path / "no_extension")
    sf.write_nc(tmp_path / "b.nc")
    np.save(tmp_path / "c.npy", np.zeros(2))
    sf.write_npz(tmp_path / "d.npz")
    sf.write_mesh(tmp_path / "e.stl")
    sf.write_zarr_group(tmp_path / "f.zarr")
    (tmp_path / "notes.txt").write_text("hello")
    auto = AutoAdapter()

    def pick(name):
        path = tmp_path / name
        head = b"" if path.is_dir() else path.read_bytes()[:64]
        found = auto.resolve(str(path), head)
        return found.name if found else None

    assert [
        pick(n)
        for n in ["a.h5", "no_extension", "b.nc", "c.npy", "d.npz", "e.stl", "f.zarr", "notes.txt"]
    ] == ["hdf5", "hdf5", "netcdf", "npy", "npz", "mesh", "zarr", None]


def test_registry_lists_every_builtin_adapter():
    assert {"auto", "hdf5", "netcdf", "npz", "npy", "zarr", "mesh", "cad"} <= set(list_adapters())
    assert get_adapter("hdf5").name == "hdf5"


def test_npz_zip_of_something_else_names_the_field(tmp_path):
    path = tmp_path / "odd.npz"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("x.npy", b"not an npy header")
    with pytest.raises(SourceError, match=r"odd\.npz: field 'x'"):
        list(NpzAdapter().iter_samples(str(path), "odd.npz", {}))


@pytest.mark.parametrize("order", ["C", "F"])
def test_npy_file_array_reads_any_box_without_mapping_the_file(tmp_path, order):
    from simstore.formats.adapters._numpy import FileArray

    data = np.asarray(np.arange(5 * 6 * 7, dtype=">f4").reshape(5, 6, 7), order=order)
    np.save(tmp_path / "a.npy", data)
    src = next(NpyAdapter().iter_samples(str(tmp_path / "a.npy"), "a.npy", {"max_in_memory_bytes": 8}))
    lazy = src.fields["data"]
    assert isinstance(lazy._handle, FileArray)
    rng = np.random.default_rng(0)
    for _ in range(25):
        box = []
        for n in data.shape:
            a = int(rng.integers(0, n))
            box.append(slice(a, int(rng.integers(a + 1, n + 1))))
        np.testing.assert_array_equal(lazy[tuple(box)], data[tuple(box)])
    assert lazy[tuple(box)].dtype == np.dtype("float32")  # native byte order


@pytest.mark.parametrize("order", ["C", "F"])
def test_an_in_memory_npy_array_is_a_view_of_the_file_pages(tmp_path, order):
    """Within the in-memory limit an aligned .npy becomes a read-only mapped view (no
    copy into fresh memory); it outlives the adapter's file handle; Fortran order comes
    back in C order."""
    import gc

    data = np.asarray(np.arange(6 * 7 * 3, dtype="<f4").reshape(6, 7, 3), order=order)
    np.save(tmp_path / "a.npy", data)
    sample = next(NpyAdapter().iter_samples(str(tmp_path / "a.npy"), "a.npy", {}))
    gc.collect()  # the FileArray and its descriptor are gone; the mapping stays
    got = sample.fields["data"]
    np.testing.assert_array_equal(got, data)
    assert got.flags.c_contiguous
    if order == "C":
        assert not got.flags.owndata and not got.flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            got[0, 0, 0] = 1.0


def test_misaligned_npz_members_are_read_when_small_and_mapped_when_big(tmp_path):
    """``np.savez`` puts members at odd offsets: small ones are read into aligned memory
    (cheaper than a mapping), ones of 1 MiB and more become a read-only view of the
    file's pages however they sit (ingest's work on them costs the same misaligned, and
    the read is saved); all equal their source."""
    from simstore.formats.adapters._numpy import (
        MAP_MISALIGNED_BYTES,
        FileArray,
        _file_array,
        _local_data_offset,
    )

    path = tmp_path / "a.npz"
    arrays = {
        "x": np.arange(1000, dtype=np.float64),
        "yy": np.ones((4, 5), np.float32),
        "large": np.random.default_rng(2).standard_normal((3, 300, 301)).astype(np.float32),
    }
    np.savez(path, **arrays)
    with zipfile.ZipFile(path) as zf, open(path, "rb") as raw:
        offsets = {
            i.filename[:-4]: _file_array(str(path), _local_data_offset(raw, i), i.filename)
            for i in zf.infolist()
        }
    assert all(isinstance(a, FileArray) for a in offsets.values())
    assert not all(a.aligned for a in offsets.values())
    sample = next(NpzAdapter().iter_samples(str(path), "a.npz", {}))
    assert not offsets["large"].aligned and arrays["large"].nbytes >= MAP_MISALIGNED_BYTES
    for name, want in arrays.items():
        got = sample.fields[name]
        np.testing.assert_array_equal(got, want)
        if name == "large":
            assert not got.flags.aligned and not got.flags.owndata
            assert not got.flags.writeable
        else:
            assert got.flags.aligned
            if not offsets[name].aligned:
                assert got.flags.owndata


def test_big_source_reads_land_in_pooled_memory_and_kept_arrays_stay_intact(tmp_path, monkeypatch):
    """Misaligned .npz members read rather than mapped (all of them here, with the mapping
    threshold out of reach) and HDF5 windows of 1 MiB and more are read into the
    process's pool: memory comes back only once every view of an array is gone, so an
    array a caller keeps is never overwritten by a later read, and a released one is
    reused. Big-endian HDF5 data arrives in native byte order."""
    import h5py
    from simstore.formats.adapters import _numpy

    from simstore import _buffers

    pool = _buffers.BufferPool()
    monkeypatch.setattr(_buffers, "POOL", pool)
    monkeypatch.setattr(_numpy, "MAP_MISALIGNED_BYTES", 1 << 62)
    rng = np.random.default_rng(11)
    runs = [rng.standard_normal((4, 256, 256)).astype(np.float32) for _ in range(3)]
    for i, run in enumerate(runs):
        np.savez(tmp_path / f"r{i}.npz", u=run)
    with h5py.File(tmp_path / "w.h5", "w") as f:
        f.create_dataset("u", data=np.concatenate(runs).astype(">f4"), chunks=(1, 256, 256))

    def npz(i):
        return next(NpzAdapter().iter_samples(str(tmp_path / f"r{i}.npz"), f"r{i}", {})).fields["u"]

    kept = npz(0)
    second = npz(1)
    assert pool.reused == 0 and not np.shares_memory(kept, second)
    np.testing.assert_array_equal(kept, runs[0])
    del second
    third = npz(2)
    assert pool.reused == 1
    np.testing.assert_array_equal(third, runs[2])
    np.testing.assert_array_equal(kept, runs[0])
    del third

    windows = HDF5Adapter().iter_samples(str(tmp_path / "w.h5"), "w.h5", {"time_window": 4})
    got = [next(windows).fields["u"] for _ in range(3)]  # all three kept
    windows.close()
    for window, run in zip(got, runs, strict=True):
        assert window.dtype == np.dtype("float32") and window.dtype.isnative
        np.testing.assert_array_equal(window, run)
    assert pool.reused == 2  # the .npz read memory (released above) came back for h5py


def test_netcdf4_variables_are_read_through_h5py_where_the_dataset_matches(tmp_path):
    """A NetCDF-4 file is an HDF5 file: numeric variables whose HDF5 dataset has their
    shape and type are read with h5py (faster, into reused memory); a variable shorter
    than its unlimited dimension (netCDF4 pads it with fill values), and every variable
    of a classic file, are read with netCDF4. Values are the same either way."""
    import h5py
    import netCDF4

    rng = np.random.default_rng(12)
    u = rng.standard_normal((6, 8, 5)).astype(np.float32)
    short = rng.standard_normal((3, 8)).astype(">f8")
    path = tmp_path / "g.nc"
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("time", None)
        ds.createDimension("y", 8)
        ds.createDimension("x", 5)
        grp = ds.createGroup("flow")
        grp.createVariable("u", "f4", ("time", "y", "x"))[:] = u
        v = ds.createVariable("short", np.dtype(">f8"), ("time", "y"), fill_value=-7.0, endian="big")
        v[0:3] = short
    with netCDF4.Dataset(tmp_path / "c.nc", "w", format="NETCDF3_CLASSIC") as ds:
        ds.createDimension("y", 8)
        ds.createVariable("w", "f4", ("y",))[:] = u[0, :, 0]

    samples = NetCDFAdapter().iter_samples(str(path), "g.nc", {"max_in_memory_bytes": 8})
    fields = next(samples).fields
    assert isinstance(fields["flow/u"]._handle, h5py.Dataset)
    assert not isinstance(fields["short"]._handle, h5py.Dataset)  # 3 of 6 steps written
    np.testing.assert_array_equal(fields["flow/u"][(slice(1, 5),)], u[1:5])
    got = fields["short"][(slice(0, 6),)]
    np.testing.assert_array_equal(got[:3], short)
    assert (got[3:] == -7.0).all() and got.dtype.isnative
    samples.close()

    classic = NetCDFAdapter().iter_samples(
        str(tmp_path / "c.nc"), "c.nc", {"max_in_memory_bytes": 8}
    )
    w = next(classic).fields["w"]
    assert not isinstance(w._handle, h5py.Dataset)
    np.testing.assert_array_equal(w[(slice(0, 8),)], u[0, :, 0])
    classic.close()


@pytest.mark.parametrize("fmt", ["NETCDF3_CLASSIC", "NETCDF3_64BIT_OFFSET", "NETCDF3_64BIT_DATA"])
def test_classic_netcdf_headers_are_bounds_checked_before_netcdf_c_reads_them(tmp_path, fmt):
    """netCDF-C allocates what a classic header declares before checking the file holds
    it (fuzzing: a 204-byte file whose attribute claimed 2^30 characters cost 1 GiB of
    memory). Valid headers of each classic version pass; a count that the file cannot
    hold is a one-line error naming the file, and netCDF-C never sees it."""
    import netCDF4
    from simstore.formats.adapters._cdf_header import check_classic_header

    path = tmp_path / "c.nc"
    with netCDF4.Dataset(path, "w", format=fmt) as ds:
        ds.createDimension("t", None)
        ds.createDimension("x", 7)
        ds.title = "classic"
        ds.levels = np.arange(5, dtype="f8")
        v = ds.createVariable("u", "f4", ("t", "x"))
        v[0:3] = np.ones((3, 7), dtype=np.float32)
        v.units = "m/s"
        ds.createVariable("s", "f8").assignValue(1.5)
        if fmt == "NETCDF3_64BIT_DATA":
            q = ds.createVariable("q", "u8", ("x",))
            q[:] = np.arange(7, dtype=np.uint64)
            q.flags = np.array([1, 2], dtype=np.uint16)
    check_classic_header(str(path))  # a valid header passes
    fields = next(NetCDFAdapter().iter_samples(str(path), "c.nc", {})).fields
    np.testing.assert_array_equal(np.asarray(fields["u"][(slice(0, 3),)]), np.ones((3, 7)))

    data = bytearray(path.read_bytes())
    at = data.index(b"title") - (8 if fmt == "NETCDF3_64BIT_DATA" else 4)  # its name length
    count_at = at + (8 if fmt == "NETCDF3_64BIT_DATA" else 4) + 8 + 4  # name, padding, type
    width = 8 if fmt == "NETCDF3_64BIT_DATA" else 4
    assert int.from_bytes(data[count_at : count_at + width], "big") == len("classic")
    data[count_at : count_at + width] = (1 << 30).to_bytes(width, "big")
    bad = tmp_path / "bad.nc"
    bad.write_bytes(bytes(data))
    with pytest.raises(SourceError, match=r"bad\.nc: corrupt NetCDF header: .*1073741824"):
        next(NetCDFAdapter().iter_samples(str(bad), "bad.nc", {}))
    bad.write_bytes(bytes(data[:40]))  # a header cut short
    with pytest.raises(SourceError, match=r"bad\.nc: corrupt NetCDF header"):
        NetCDFAdapter().count_samples(str(bad), {})


def _nc_samples(tmp_path, write, **options):
    import netCDF4
    from simstore.loaders import SimDataset

    from simstore.catalog import Catalog
    from simstore.ingest import ingest

    src = tmp_path / "src"
    src.mkdir()
    with netCDF4.Dataset(src / "f.nc", "w", format="NETCDF4") as ds:
        write(ds)
    store = str(tmp_path / "store")
    ingest([str(src)], dataset="d", store=Catalog.init(store), snapshot=True, **options)
    return list(SimDataset(store, "d", shuffle=False))


def test_netcdf_variable_named_like_another_dimension_reads_its_values(tmp_path):
    """netCDF-C keeps it as _nc4_non_coord_x; the dataset 'x' is the dimension's marker,
    of the same shape and type, and holds no values."""

    def write(ds):
        ds.createDimension("x", 3)
        ds.createDimension("y", 3)
        ds.createVariable("x", "f4", ("y",))[:] = [10, 20, 30]
        g = ds.createGroup("g")
        g.createDimension("z", 2)
        g.createDimension("w", 2)
        g.createVariable("z", "f8", ("w",))[:] = [1.5, 2.5]

    (s,) = _nc_samples(tmp_path, write)
    np.testing.assert_array_equal(s["x"].numpy(), [10, 20, 30])
    np.testing.assert_array_equal(s["g/z"].numpy(), [1.5, 2.5])


def test_netcdf_windows_follow_the_root_time_dimension_not_a_groups_own(tmp_path):
    def write(ds):
        ds.createDimension("time", None)
        ds.createVariable("v", "f8", ("time",))[:] = range(6)
        g = ds.createGroup("sub")
        g.createDimension("time", 3)
        g.createVariable("w", "f8", ("time",))[:] = [100, 101, 102]

    got = _nc_samples(tmp_path, write, time_window=2)
    assert [s["__key__"] for s in got] == ["f.nc/t0000", "f.nc/t0002", "f.nc/t0004"]
    assert [s["v"].tolist() for s in got] == [[0, 1], [2, 3], [4, 5]]
    assert all(s["sub/w"].tolist() == [100, 101, 102] for s in got)


def test_a_pvd_with_several_parts_per_step_keys_steps_and_parts(tmp_path):
    import meshio
    from simstore.formats.adapters import MeshAdapter

    entries = []
    for step in range(2):
        for part in range(2):
            name = f"s{step}p{part}.vtu"
            meshio.write_points_cells(
                str(tmp_path / name), np.random.default_rng(step).random((4, 3)),
                [("triangle", np.array([[0, 1, 2]]))],
                point_data={"u": np.full(4, 10.0 * step + part)})
            entries.append(f'<DataSet timestep="{step}" part="{part}" file="{name}"/>')
    (tmp_path / "multi.pvd").write_text(
        '<VTKFile type="Collection" version="0.1"><Collection>'
        + "".join(entries) + "</Collection></VTKFile>")
    got = list(MeshAdapter().iter_samples(str(tmp_path / "multi.pvd"), "multi.pvd", {}))
    assert [s.key for s in got] == ["multi.pvd/t0000/p0000", "multi.pvd/t0000/p0001",
                                    "multi.pvd/t0001/p0000", "multi.pvd/t0001/p0001"]
    assert [(s.fields["time"], s.fields["part"], float(s.fields["point_data/u"][0]))
            for s in got] == [(0.0, 0, 0.0), (0.0, 1, 1.0), (1.0, 0, 10.0), (1.0, 1, 11.0)]
