"""The mesh adapter on edge cases of real files written by meshio: cell indices past the
points, OBJ point clouds, polygons of several sizes, .pvd series out of time order or
with a bad timestep, and .vtp (which meshio does not read)."""

import warnings

import meshio
import numpy as np
import pytest
from simstore.formats.adapters import AutoAdapter, MeshAdapter
from source_files import gmsh_model

from simstore.errors import SourceError

RNG = np.random.default_rng(7)
POINTS = RNG.random((12, 3))


def _write(path, mesh):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        meshio.write(path, mesh)
    return str(path)


def _sample(path, key=None):
    (sample,) = MeshAdapter().iter_samples(str(path), key or path.name, {})
    return sample.fields


@pytest.mark.parametrize("bad, name", [(99, "vtu"), (4, "vtk"), (-1, "vtu")])
def test_a_cell_index_outside_the_points_names_the_file_and_the_cells(tmp_path, bad, name):
    path = tmp_path / f"oob.{name}"
    cells = [("line", np.array([[0, 1]])), ("triangle", np.array([[0, 1, 2], [0, 1, bad]]))]
    _write(path, meshio.Mesh(POINTS[:4], cells))
    with pytest.raises(SourceError) as err:
        _sample(path)
    assert str(err.value) == (
        f"{path}: field 'cells/triangle': index {bad} out of range for 4 points"
    )


def test_cells_using_every_point_are_kept(tmp_path):
    path = tmp_path / "ok.vtu"
    tris = np.array([[0, 1, 2], [1, 2, 3]])
    _write(path, meshio.Mesh(POINTS[:4], [("triangle", tris)]))
    np.testing.assert_array_equal(_sample(path)["cells/triangle"], tris)


def test_an_obj_point_cloud_is_its_points(tmp_path):
    path = tmp_path / "cloud.obj"
    _write(path, meshio.Mesh(POINTS[:7], []))
    read = meshio.read(path)
    assert read.cell_data == {"obj:group_ids": []}  # what the adapter has to cope with
    fields = _sample(path)
    assert sorted(fields) == ["metadata", "points"]
    np.testing.assert_array_equal(fields["points"], read.points)
    assert fields["metadata"]["cell_types"] == [] and fields["metadata"]["cell_counts"] == {}


def _polygon_mesh(path):
    """Polygons of 5, 6 and 5 nodes around a triangle block, each with cell data."""
    cells = [
        ("polygon", np.array([[0, 1, 2, 3, 4], [1, 2, 3, 4, 5]])),
        ("triangle", np.array([[0, 1, 2]])),
        ("polygon", np.array([[5, 6, 7, 8, 9, 10]])),
        ("polygon", np.array([[2, 3, 4, 5, 6]])),
    ]
    cell_data = {"c": [np.array([1.0, 2.0]), np.array([3.0]), np.array([4.0]), np.array([5.0])]}
    return _write(path, meshio.Mesh(POINTS, cells, cell_data=cell_data))


@pytest.mark.parametrize("suffix", [".vtu", ".vtk", ".obj", ".ply"])
def test_polygons_of_several_sizes_get_one_field_per_size(tmp_path, suffix):
    path = _polygon_mesh(tmp_path / f"poly{suffix}")
    read = meshio.read(path)
    assert [(c.type, c.data.shape[1]) for c in read.cells] == [
        ("polygon", 5), ("triangle", 3), ("polygon", 6), ("polygon", 5)
    ]
    fields = _sample(tmp_path / f"poly{suffix}")
    blocks = read.cells
    np.testing.assert_array_equal(
        fields["cells/polygon5"], np.concatenate([blocks[0].data, blocks[3].data])
    )
    np.testing.assert_array_equal(fields["cells/polygon6"], blocks[2].data)
    np.testing.assert_array_equal(fields["cells/triangle"], blocks[1].data)
    assert "cells/polygon" not in fields
    meta = fields["metadata"]
    assert meta["cell_types"] == ["polygon5", "polygon6", "triangle"]
    assert meta["cell_counts"] == {"polygon5": 3, "polygon6": 1, "triangle": 1}
    # cell data rows follow the cells fields: polygon5 (file order), polygon6, triangle
    for name, parts in read.cell_data.items():
        want = np.concatenate([parts[0], parts[3], parts[2], parts[1]])
        np.testing.assert_array_equal(fields[f"cell_data/{name}"], want)
    if suffix in (".vtu", ".vtk"):
        np.testing.assert_array_equal(fields["cell_data/c"], [1.0, 2.0, 5.0, 4.0, 3.0])


def test_polygons_of_one_size_keep_the_type_name(tmp_path):
    path = tmp_path / "quads.vtu"
    blocks = [np.array([[0, 1, 2, 3, 4]]), np.array([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]])]
    _write(path, meshio.Mesh(
        POINTS, [("polygon", blocks[0]), ("polygon", blocks[1])],
        cell_data={"c": [np.array([1.0]), np.array([2.0, 3.0])]},
    ))
    fields = _sample(path)
    np.testing.assert_array_equal(fields["cells/polygon"], np.concatenate(blocks))
    assert not any(k.startswith("cells/polygon") and k != "cells/polygon" for k in fields)
    np.testing.assert_array_equal(fields["cell_data/c"], [1.0, 2.0, 3.0])


def _pvd(folder, entries):
    """A .pvd of ``(timestep, part, name)`` data sets; each file's point data is its name's
    number, so a sample tells which file it came from."""
    lines = []
    for t, part, name in entries:
        number = float(name.removeprefix("s").removesuffix(".vtu"))
        meshio.write(folder / name, meshio.Mesh(
            POINTS[:4], [("triangle", np.array([[0, 1, 2]]))],
            point_data={"n": np.full(4, number)},
        ))
        lines.append(f'<DataSet timestep="{t}" part="{part}" file="{name}"/>')
    (folder / "run.pvd").write_text(
        '<?xml version="1.0"?>\n<VTKFile type="Collection" version="0.1"><Collection>\n'
        + "\n".join(lines) + "\n</Collection></VTKFile>\n"
    )
    return folder / "run.pvd"


def test_pvd_steps_follow_their_timesteps_not_the_file_order(tmp_path):
    path = _pvd(tmp_path, [(0.2, 0, "s0.vtu"), (0.0, 0, "s1.vtu"), (0.1, 0, "s2.vtu"),
                           (1e-3, 0, "s3.vtu")])
    samples = list(MeshAdapter().iter_samples(str(path), "run.pvd", {}))
    assert [s.key for s in samples] == [f"run.pvd/t{i:04d}" for i in range(4)]
    assert [s.fields["time"] for s in samples] == [0.0, 1e-3, 0.1, 0.2]
    assert [s.fields["point_data/n"][0] for s in samples] == [1.0, 3.0, 2.0, 0.0]


def test_pvd_parts_of_one_step_stay_together_in_file_order(tmp_path):
    path = _pvd(tmp_path, [(1, 0, "s0.vtu"), (0, 0, "s1.vtu"), (1, 1, "s2.vtu"),
                           (0, 1, "s3.vtu")])
    samples = list(MeshAdapter().iter_samples(str(path), "run.pvd", {}))
    got = [(s.key, s.fields["time"], s.fields["part"], s.fields["point_data/n"][0])
           for s in samples]
    assert got == [
        ("run.pvd/t0000/p0000", 0.0, 0, 1.0),
        ("run.pvd/t0000/p0001", 0.0, 1, 3.0),
        ("run.pvd/t0001/p0000", 1.0, 0, 0.0),
        ("run.pvd/t0001/p0001", 1.0, 1, 2.0),
    ]


@pytest.mark.parametrize("timestep", ["abc", "nan", "inf", ""])
def test_a_pvd_timestep_that_is_no_number_is_a_source_error(tmp_path, timestep):
    path = _pvd(tmp_path, [(0, 0, "s0.vtu"), (timestep, 0, "s1.vtu")])
    with pytest.raises(SourceError) as err:
        list(MeshAdapter().iter_samples(str(path), "run.pvd", {}))
    message = str(err.value)
    assert "\n" not in message
    assert message == (
        f"{path}: DataSet 1 (s1.vtu): timestep {timestep!r} is not a finite number"
    )
    # its files are still its own: not ingested alone
    assert sorted(MeshAdapter().companions(str(path))) == [
        str(tmp_path / "s0.vtu"), str(tmp_path / "s1.vtu")
    ]


def test_a_pvd_mixing_data_sets_with_and_without_a_timestep_is_a_source_error(tmp_path):
    # a position taken as a time could equal a real timestep and silently make a part
    path = _pvd(tmp_path, [(2.0, 0, "s0.vtu"), (0.0, 0, "s1.vtu"), (1.0, 0, "s3.vtu")])
    text = path.read_text().replace('timestep="0.0" part="0" file="s1.vtu"',
                                    'part="0" file="s1.vtu"')
    path.write_text(text)
    with pytest.raises(SourceError) as err:
        list(MeshAdapter().iter_samples(str(path), "run.pvd", {}))
    assert str(err.value) == (
        f"{path}: DataSet 1 (s1.vtu) has no timestep, while others have one: give every "
        "data set a timestep, or none"
    )


def test_a_pvd_without_timesteps_numbers_its_steps_by_position(tmp_path):
    path = _pvd(tmp_path, [(0, 0, "s0.vtu"), (0, 0, "s1.vtu")])
    path.write_text(path.read_text().replace('timestep="0" ', ""))
    samples = list(MeshAdapter().iter_samples(str(path), "run.pvd", {}))
    assert [(s.key, s.fields["time"]) for s in samples] == [
        ("run.pvd/t0000", 0.0), ("run.pvd/t0001", 1.0)]


def test_a_pvd_that_is_not_xml_is_a_source_error_also_for_its_companions(tmp_path):
    meshio.write(tmp_path / "s0.vtu", meshio.Mesh(POINTS[:4], [("triangle", [[0, 1, 2]])]))
    path = tmp_path / "run.pvd"
    path.write_text('<VTKFile type="Collection"><Collection><DataSet timestep="0" file="s0.vtu"/>')
    for call in (lambda: MeshAdapter().companions(str(path)),
                 lambda: list(MeshAdapter().iter_samples(str(path), "run.pvd", {}))):
        with pytest.raises(SourceError, match=r"run\.pvd: not a readable \.pvd collection: "):
            call()


def test_vtp_is_not_claimed_since_meshio_has_no_reader_for_it(tmp_path):
    path = tmp_path / "tri.vtp"
    path.write_text(
        '<?xml version="1.0"?><VTKFile type="PolyData" version="0.1"><PolyData>'
        '<Piece NumberOfPoints="3" NumberOfPolys="1"><Points><DataArray type="Float64" '
        'NumberOfComponents="3" format="ascii">0 0 0 1 0 0 0 1 0</DataArray></Points>'
        '<Polys><DataArray type="Int64" Name="connectivity" format="ascii">0 1 2</DataArray>'
        '<DataArray type="Int64" Name="offsets" format="ascii">3</DataArray></Polys>'
        "</Piece></PolyData></VTKFile>"
    )
    with pytest.raises(meshio.ReadError):
        meshio.read(path)
    head = path.read_bytes()[:64]
    assert ".vtp" not in MeshAdapter.extensions
    assert not MeshAdapter().can_read(str(path), head)
    assert AutoAdapter().resolve(str(path), head) is None


def _vtu_piece(points, connectivity, value, conn_type="Int64"):
    return (
        '<Piece NumberOfPoints="3" NumberOfCells="1">'
        f'<CellData><DataArray type="Float64" Name="c" format="ascii">{value}</DataArray>'
        "</CellData><Points>"
        f'<DataArray type="Float64" NumberOfComponents="3" format="ascii">{points}</DataArray>'
        f'</Points><Cells><DataArray type="{conn_type}" Name="connectivity" format="ascii">'
        f"{connectivity}</DataArray>"
        '<DataArray type="Int64" Name="offsets" format="ascii">3</DataArray>'
        '<DataArray type="UInt8" Name="types" format="ascii">5</DataArray></Cells></Piece>'
    )


def _vtu(path, *pieces):
    path.write_text(
        '<?xml version="1.0"?>\n<VTKFile type="UnstructuredGrid" version="0.1" '
        'byte_order="LittleEndian"><UnstructuredGrid>\n' + "\n".join(pieces)
        + "\n</UnstructuredGrid></VTKFile>\n"
    )
    return path


def test_a_vtu_of_two_pieces_is_refused_since_meshio_keeps_the_last_pieces_cells(tmp_path):
    path = _vtu(tmp_path / "two.vtu", _vtu_piece("0 0 0 1 0 0 0 1 0", "0 1 2", 1),
                _vtu_piece("5 0 0 6 0 0 5 1 0", "0 1 2", 2))
    read = meshio.read(path)
    assert len(read.points) == 6 and sum(len(c.data) for c in read.cells) == 1  # the loss
    with pytest.raises(SourceError) as err:
        _sample(path)
    assert str(err.value).startswith(f"{path}: 2 pieces declare 2 cells, of which meshio reads 1")


def test_a_vtu_of_one_piece_keeps_its_cells(tmp_path):
    path = _vtu(tmp_path / "one.vtu", _vtu_piece("0 0 0 1 0 0 0 1 0", "0 1 2", 1))
    fields = _sample(path)
    np.testing.assert_array_equal(fields["cells/triangle"], [[0, 1, 2]])
    np.testing.assert_array_equal(fields["cell_data/c"], [1.0])


def test_float_connectivity_must_be_whole_numbers(tmp_path):
    good = _vtu(tmp_path / "whole.vtu",
                _vtu_piece("0 0 0 1 0 0 0 1 0", "0 1 2", 1, conn_type="Float64"))
    np.testing.assert_array_equal(_sample(good)["cells/triangle"], [[0, 1, 2]])
    bad = _vtu(tmp_path / "frac.vtu",
               _vtu_piece("0 0 0 1 0 0 0 1 0", "0 1 1.9", 1, conn_type="Float64"))
    with pytest.raises(SourceError) as err:
        _sample(bad)
    assert str(err.value) == (
        f"{bad}: field 'cells/triangle': not integer connectivity: value 1.9 is no node index"
    )


@pytest.mark.parametrize("element", ["l 1 2", "p 3", "curv 0.0 1.0 1 2"])
def test_obj_elements_meshio_skips_are_refused_naming_the_line(tmp_path, element):
    path = tmp_path / "lines.obj"
    path.write_text("v 0 0 0\nv 1 0 0\nv 0 1 0\nf 1 2 3\n" + element + "\n")
    with pytest.raises(SourceError) as err:
        _sample(path)
    kind = element.split()[0]
    assert str(err.value).startswith(f"{path}: line 5: OBJ '{kind}' elements are not read")


def test_gmsh_physical_groups_are_cell_sets_and_a_cell_of_two_groups_is_in_both(tmp_path):
    path = tmp_path / "groups.msh"
    with gmsh_model("groups") as gmsh:
        surface = gmsh.model.occ.addRectangle(0, 0, 0, 1, 1)
        gmsh.model.occ.synchronize()
        gmsh.model.addPhysicalGroup(2, [surface], 1, name="fluid")
        gmsh.model.addPhysicalGroup(2, [surface], 2, name="heated")  # the same cells again
        gmsh.model.addPhysicalGroup(1, [1, 2], 3, name="walls")
        gmsh.option.setNumber("Mesh.MeshSizeMax", 0.5)
        gmsh.model.mesh.generate(2)
        gmsh.option.setNumber("Mesh.MshFileVersion", 4.1)
        gmsh.write(str(path))
    read = meshio.read(path)
    fields = _sample(path)
    triangles, lines = len(fields["cells/triangle"]), len(fields["cells/line"])
    # cell_data rows: the line blocks first (sorted type order), then the triangles
    np.testing.assert_array_equal(fields["cell_sets/fluid"], np.arange(lines, lines + triangles))
    np.testing.assert_array_equal(fields["cell_sets/heated"], fields["cell_sets/fluid"])
    np.testing.assert_array_equal(fields["cell_sets/walls"], np.arange(lines))
    # gmsh:physical holds one tag per cell: the second group shows only in its set
    assert set(fields["cell_data/gmsh:physical"][fields["cell_sets/heated"]]) == {1}
    assert "gmsh:bounding_entities" in read.cell_sets  # not cells: kept in the metadata
    assert not any(k.startswith("cell_sets/gmsh:") for k in fields)
    assert len(fields["metadata"]["gmsh:bounding_entities"]) == len(read.cells)


def test_cell_and_point_sets_out_of_range_name_the_set(tmp_path):
    from simstore.formats.adapters._mesh import mesh_fields

    cells = [meshio.CellBlock("triangle", np.array([[0, 1, 2], [1, 2, 3]]))]
    ok = mesh_fields("m.vtu", POINTS[:4], cells, {}, {}, None,
                     {"s": [np.array([1])]}, {"corners": np.array([0, 3])})
    np.testing.assert_array_equal(ok["cell_sets/s"], [1])
    np.testing.assert_array_equal(ok["point_sets/corners"], [0, 3])
    with pytest.raises(SourceError) as err:
        mesh_fields("m.vtu", POINTS[:4], cells, {}, {}, None, {"s": [np.array([2])]})
    assert str(err.value) == "m.vtu: field 'cell_sets/s': index 2 out of range for 2 triangle cells"
    with pytest.raises(SourceError) as err:
        mesh_fields("m.vtu", POINTS[:4], cells, {}, {}, None, None, {"p": np.array([4])})
    assert str(err.value) == "m.vtu: field 'point_sets/p': index 4 out of range for 4 points"


def test_pieces_are_counted_across_the_scans_blocks(tmp_path):
    """The pieces' declarations are scanned block by block (not the whole file at once):
    a second <Piece> tag cut by a block's end is still counted."""
    head = ('<?xml version="1.0"?>\n<VTKFile type="UnstructuredGrid" version="0.1" '
            'byte_order="LittleEndian"><UnstructuredGrid>\n')
    first = _vtu_piece("0 0 0 1 0 0 0 1 0", "0 1 2", 1)
    before = head + first + "<!--"
    pad = (1 << 20) - 10 - len(before) - len("-->")
    text = (before + "x" * pad + "-->" + _vtu_piece("5 0 0 6 0 0 5 1 0", "0 1 2", 2)
            + "\n</UnstructuredGrid></VTKFile>\n")
    assert text.index("<Piece", len(before)) == (1 << 20) - 10  # straddles the first block
    path = tmp_path / "padded.vtu"
    path.write_text(text)
    with pytest.raises(SourceError, match=r"2 pieces declare 2 cells, of which meshio reads 1"):
        _sample(path)


def test_cell_set_rows_follow_the_cell_data_order_not_the_files_block_order():
    """Blocks triangle, line, triangle: cell_data rows (and set rows) run the line block
    first, then the two triangle blocks in file order."""
    from simstore.formats.adapters._mesh import mesh_fields

    cells = [meshio.CellBlock("triangle", np.array([[0, 1, 2], [1, 2, 3]])),
             meshio.CellBlock("line", np.array([[0, 1], [1, 2], [2, 3]])),
             meshio.CellBlock("triangle", np.array([[0, 2, 3]]))]
    tag = [np.array([10, 11]), np.array([20, 21, 22]), np.array([30])]
    sets = {"s": [np.array([1]), np.array([0, 2]), np.array([0])]}
    fields = mesh_fields("m.vtu", POINTS[:4], cells, {}, {"tag": tag}, None, sets)
    np.testing.assert_array_equal(fields["cell_data/tag"], [20, 21, 22, 10, 11, 30])
    np.testing.assert_array_equal(fields["cell_data/tag"][fields["cell_sets/s"]],
                                  [20, 22, 11, 30])


def test_a_pvd_whose_data_set_does_not_read_is_named_with_it(tmp_path):
    # found by an audit: the error named only the missing data set, not the .pvd given
    path = _pvd(tmp_path, [(0, 0, "s0.vtu"), (1, 0, "s1.vtu")])
    (tmp_path / "s1.vtu").unlink()
    with pytest.raises(SourceError) as err:
        list(MeshAdapter().iter_samples(str(path), "run.pvd", {}))
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: data set {tmp_path / 's1.vtu'}: not a readable mesh")


def test_a_polyhedron_of_faces_of_different_sizes_is_a_source_error_naming_the_cells(tmp_path):
    # a prism: two triangles and three quads; meshio reads it as a list of face arrays
    faces = [np.array(f) for f in ([0, 1, 2], [3, 4, 5], [0, 1, 4, 3], [1, 2, 5, 4],
                                   [0, 2, 5, 3])]
    path = tmp_path / "prism.vtu"
    _write(path, meshio.Mesh(POINTS[:6], [("polyhedron6", [faces])]))
    with pytest.raises(SourceError) as err:
        _sample(path)
    assert str(err.value).startswith(
        f"{path}: field 'cells/polyhedron6': connectivity is not cells x nodes"
    )
