"""Mesh files cut short: a bad file with a one-line error, never a hang or a smaller mesh."""

import signal
import warnings

import meshio
import numpy as np
import pytest
from simstore.formats.adapters import MeshAdapter

from simstore.errors import SourceError

RNG = np.random.default_rng(3)
POINTS = RNG.random((10, 3))
CELLS = [("triangle", np.array([[0, 1, 2], [3, 4, 5]])), ("quad", np.array([[0, 1, 2, 3]]))]


def _write(path, **kw):
    mesh = meshio.Mesh(POINTS, CELLS, point_data={"u": RNG.random(10)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        meshio.write(path, mesh, **kw)
    return path.read_bytes()


def _read(path):
    def hung(*_):
        raise TimeoutError(f"reading {path} hung")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(10)
    try:
        return list(MeshAdapter().iter_samples(str(path), path.name, {}))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_a_gmsh_file_cut_in_its_nodes_is_a_bad_file_not_a_point_cloud(tmp_path):
    data = _write(tmp_path / "full.msh", file_format="gmsh22", binary=True)
    path = tmp_path / "cut.msh"
    path.write_bytes(data[: data.index(b"$EndNodes")])
    with pytest.raises(SourceError, match=r"cut\.msh: .*\$Nodes not closed by \$EndNodes"):
        _read(path)


@pytest.mark.parametrize("size", [3, 4, 20, 40])
def test_a_ply_cut_in_its_header_is_refused_not_read_for_ever(tmp_path, size):
    data = _write(tmp_path / "full.ply")
    path = tmp_path / "cut.ply"
    path.write_bytes(data[:size])
    with pytest.raises(SourceError, match=r"cut\.ply: .*no end_header"):
        _read(path)


def test_a_binary_ply_cut_in_its_vertices_is_refused(tmp_path):
    data = _write(tmp_path / "full.ply", binary=True)
    path = tmp_path / "cut.ply"
    path.write_bytes(data[: data.index(b"end_header\n") + 11 + 32])
    with pytest.raises(SourceError, match=r"declares 10 vertex elements, meshio read 1"):
        _read(path)


def test_a_binary_ply_cut_in_its_faces_is_refused(tmp_path):
    data = _write(tmp_path / "full.ply", binary=True)
    path = tmp_path / "cut.ply"
    path.write_bytes(data[:-10])
    with pytest.raises(SourceError, match=r"cut\.ply: not a readable mesh"):
        _read(path)


def test_an_ascii_ply_cut_in_a_vertex_line_is_a_one_line_error(tmp_path):
    data = _write(tmp_path / "full.ply", binary=False)
    path = tmp_path / "cut.ply"
    body = data.index(b"end_header\n") + 11
    path.write_bytes(data[: data.index(b"\n", body) + 6])  # in the second vertex line
    with pytest.raises(SourceError) as err:
        _read(path)
    assert "\n" not in str(err.value) and str(err.value).startswith(f"{path}: ")


def test_whole_files_still_read(tmp_path):
    for name, kw in [("a.msh", {"file_format": "gmsh22", "binary": True}),
                     ("b.ply", {"binary": True}), ("c.ply", {"binary": False})]:
        _write(tmp_path / name, **kw)
        (sample,) = _read(tmp_path / name)
        np.testing.assert_array_equal(sample.fields["points"], POINTS)
        np.testing.assert_array_equal(sample.fields["cells/quad"], CELLS[1][1])


def test_an_ascii_stl_cut_between_facets_is_refused(tmp_path):
    tris = [("triangle", np.arange(9).reshape(3, 3))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        meshio.write(tmp_path / "full.stl", meshio.Mesh(POINTS[:9], tris), binary=False)
    data = (tmp_path / "full.stl").read_bytes()
    path = tmp_path / "cut.stl"
    path.write_bytes(data[: data.index(b"endfacet") + 9])
    with pytest.raises(SourceError, match=r"cut\.stl: .*endsolid"):
        _read(path)
    (sample,) = _read(tmp_path / "full.stl")
    assert sample.fields["cells/triangle"].shape == (3, 3)


def test_a_binary_stl_whose_header_starts_with_solid_still_reads(tmp_path):
    tris = [("triangle", np.arange(9).reshape(3, 3))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        meshio.write(tmp_path / "bin.stl", meshio.Mesh(POINTS[:9], tris), binary=True)
    data = bytearray((tmp_path / "bin.stl").read_bytes())
    data[:80] = b"solid exported by a CAD tool".ljust(80, b" ")  # as some exporters write
    path = tmp_path / "solid-header.stl"
    path.write_bytes(bytes(data))
    (sample,) = _read(path)
    assert sample.fields["cells/triangle"].shape == (3, 3)
    np.testing.assert_array_equal(sample.fields["points"],
                                  meshio.read(tmp_path / "bin.stl").points)
