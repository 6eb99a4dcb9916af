"""Ingesting folders of meshes written by meshio: a malformed .pvd is one bad file (skipped
with ``on_error="skip"``, else the ingest fails naming it), polygons of several sizes come
back through the loader as meshio read them, and cell indices past the points fail."""

import json
import warnings

import meshio
import numpy as np
import pytest
from click.testing import CliRunner
from simstore.cli import main

from simstore.errors import SourceError
from simstore.ingest import ingest

POINTS = np.random.default_rng(11).random((12, 3))
TRI = [("triangle", np.array([[0, 1, 2]]))]

BAD_PVDS = {
    "not-xml": (
        '<VTKFile type="Collection"><Collection><DataSet timestep="0" file="step0.vtu"/>',
        "run.pvd: not a readable .pvd collection: no element found",
    ),
    "bad-timestep": (
        '<VTKFile type="Collection"><Collection><DataSet timestep="abc" file="step0.vtu"/>'
        "</Collection></VTKFile>",
        "run.pvd: DataSet 0 (step0.vtu): timestep 'abc' is not a finite number",
    ),
}


@pytest.fixture(params=sorted(BAD_PVDS))
def bad_pvd(request, tmp_path):
    """A folder: a good mesh, and a .pvd (malformed) referencing another mesh."""
    root = tmp_path / "src"
    root.mkdir()
    meshio.write(root / "good.vtu", meshio.Mesh(POINTS[:4], TRI))
    meshio.write(root / "step0.vtu", meshio.Mesh(POINTS[:4], TRI))
    text, reason = BAD_PVDS[request.param]
    (root / "run.pvd").write_text(text)
    return root, request.param, reason


def test_a_malformed_pvd_is_skipped_and_listed_with_the_rest_ingested(catalog, bad_pvd):
    root, kind, reason = bad_pvd
    r = ingest([root], dataset="d", store=catalog, snapshot=True, on_error="skip")
    assert [s.path for s in r.files_skipped] == [str(root / "run.pvd")]
    skipped = r.files_skipped[0].reason
    assert skipped.startswith(str(root / "run.pvd")) and reason in skipped
    assert "\n" not in skipped
    keys = sorted(catalog.manifest(catalog.snapshot(r.snapshot_id)).column("key").to_pylist())
    # a .pvd that does not parse claims no file, one with a bad timestep keeps its own
    assert keys == (["good.vtu", "step0.vtu"] if kind == "not-xml" else ["good.vtu"])


def test_a_malformed_pvd_fails_the_ingest_with_one_line_and_stages_nothing(catalog, bad_pvd):
    root, _, reason = bad_pvd
    with pytest.raises(SourceError) as err:
        ingest([root], dataset="d", store=catalog, snapshot=True)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(str(root / "run.pvd")) and reason in message
    assert catalog.staged("d") == []
    assert catalog.branches("d").get_versioned("main")[0] is None


def test_cli_a_malformed_pvd_is_exit_8_or_skipped(tmp_path, bad_pvd):
    root, _, reason = bad_pvd
    store = str(tmp_path / "cli-store")
    runner = CliRunner()
    assert runner.invoke(main, ["--store", store, "init"]).exit_code == 0
    failed = runner.invoke(main, ["--store", store, "ingest", str(root), "--dataset", "d",
                                  "--snapshot", "-m", "x"])
    assert failed.exit_code == 8, failed.output
    lines = [line for line in failed.output.splitlines() if line.strip()]
    assert len(lines) == 1 and reason in lines[0], failed.output
    skipped = runner.invoke(main, ["--store", store, "ingest", str(root), "--dataset", "d",
                                   "--snapshot", "-m", "x", "--on-error", "skip", "--json"])
    assert skipped.exit_code == 0, skipped.output
    summary = json.loads(skipped.stdout)
    assert [s["path"] for s in summary["skipped"]] == [str(root / "run.pvd")]
    assert reason in summary["skipped"][0]["reason"] and summary["snapshot"]


def test_polygons_of_several_sizes_read_back_as_meshio_reads_them(catalog, tmp_path):
    from simstore.loaders import SimDataset

    root = tmp_path / "src"
    root.mkdir()
    cells = [
        ("polygon", np.array([[0, 1, 2, 3, 4]])),
        ("quad", np.array([[0, 1, 2, 3]])),
        ("polygon", np.array([[5, 6, 7, 8, 9, 10], [4, 5, 6, 7, 8, 9]])),
        ("polygon", np.array([[1, 2, 3, 4, 5], [2, 3, 4, 5, 6]])),
    ]
    cell_data = {"id": [np.array([1]), np.array([2]), np.array([3, 4]), np.array([5, 6])]}
    meshio.write(root / "poly.vtu", meshio.Mesh(POINTS, cells, cell_data=cell_data))
    # every block one width: the field keeps the type's name, as before
    meshio.write(root / "same.vtu", meshio.Mesh(POINTS, cells[:2]))
    ingest([root], dataset="d", store=catalog, snapshot=True)
    got = {s["__key__"]: s for s in SimDataset(catalog.store.url, "d", shuffle=False)}
    read = meshio.read(root / "poly.vtu")
    blocks = read.cells
    poly = got["poly.vtu"]
    np.testing.assert_array_equal(poly["points"], read.points)
    np.testing.assert_array_equal(
        poly["cells/polygon5"], np.concatenate([blocks[0].data, blocks[3].data])
    )
    np.testing.assert_array_equal(poly["cells/polygon6"], blocks[2].data)
    np.testing.assert_array_equal(poly["cells/quad"], blocks[1].data)
    parts = read.cell_data["id"]
    # polygon5 (file order), polygon6, quad: the order of the cells fields
    np.testing.assert_array_equal(
        poly["cell_data/id"], np.concatenate([parts[0], parts[3], parts[2], parts[1]])
    )
    np.testing.assert_array_equal(poly["cell_data/id"], [1, 5, 6, 3, 4, 2])
    same = got["same.vtu"]
    np.testing.assert_array_equal(same["cells/polygon"], blocks[0].data)
    assert "cells/polygon5" not in same


def test_an_obj_point_cloud_ingests_as_points(catalog, tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        meshio.write(root / "cloud.obj", meshio.Mesh(POINTS[:7], []))
        meshio.write(root / "cloud.ply", meshio.Mesh(POINTS[:7], []))
    r = ingest([root], dataset="d", store=catalog, snapshot=True)
    assert r.samples == 2 and r.files_skipped == ()
    schema = {f.name for f in catalog.snapshot(r.snapshot_id).schema}
    assert schema == {"points", "metadata"}


def test_cell_indices_past_the_points_fail_the_ingest_naming_the_cells(catalog, tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    meshio.write(root / "ok.vtu", meshio.Mesh(POINTS[:4], TRI))
    meshio.write(root / "oob.vtu", meshio.Mesh(
        POINTS[:4], [("triangle", np.array([[0, 1, 99], [0, 1, 2]]))]
    ))
    with pytest.raises(SourceError) as err:
        ingest([root], dataset="d", store=catalog, snapshot=True)
    assert str(err.value) == (
        f"{root / 'oob.vtu'}: field 'cells/triangle': index 99 out of range for 4 points"
    )
    assert catalog.staged("d") == []
    r = ingest([root], dataset="d", store=catalog, snapshot=True, on_error="skip")
    assert [s.path for s in r.files_skipped] == [str(root / "oob.vtu")]
    assert sorted(catalog.manifest(catalog.snapshot(r.snapshot_id)).column("key").to_pylist()) \
        == ["ok.vtu"]


def test_a_vtp_file_is_listed_as_ignored_not_failed(catalog, tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    meshio.write(root / "ok.vtu", meshio.Mesh(POINTS[:4], TRI))
    (root / "surface.vtp").write_text('<?xml version="1.0"?><VTKFile type="PolyData"/>')
    r = ingest([root], dataset="d", store=catalog, snapshot=True)
    assert r.files_skipped == () and r.samples == 1
    assert r.to_json()["ignored"] == [str(root / "surface.vtp")]
