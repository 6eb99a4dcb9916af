"""A file a source references (a .pvd's steps, an XDMF's HDF5 data) keys the journal and
is checked after reading, as the source itself is.

The journal and the change check looked at the .pvd alone: a step rewritten under an
unchanged .pvd re-ran as "reused, unchanged", and the snapshot kept the old values.
"""

import os
import time

import h5py
import meshio
import numpy as np
import pytest
import source_files
from simstore.formats.adapters import MeshAdapter

from simstore.errors import SourceError
from simstore.ingest import ingest
from simstore.ingest._records import SourceFile
from simstore.ingest._sources import ListedSource, discover


def _rewrite_step(folder, step, value):
    points, triangles, _ = source_files.small_mesh()
    path = folder / f"step_{step}.vtu"
    before = os.stat(path).st_mtime_ns
    meshio.Mesh(points, [("triangle", triangles)],
                point_data={"T": np.full(5, value, dtype=np.float64)}).write(path)
    if os.stat(path).st_mtime_ns == before:  # a coarse clock: make the change visible
        os.utime(path, ns=(before + 1_000_000, before + 1_000_000))


def test_a_step_rewritten_under_an_unchanged_pvd_is_ingested_again(catalog, tmp_path, read):
    folder = tmp_path / "series"
    folder.mkdir()
    source_files.write_pvd(folder, steps=2)
    first = ingest([folder], dataset="d", store=catalog, snapshot=True)
    _rewrite_step(folder, 1, 99.0)
    again = ingest([folder], dataset="d", store=catalog, snapshot=True)
    assert (again.files_reused, again.files_unchanged, again.samples_staged) == (0, 0, 2)
    assert again.snapshot_id != first.snapshot_id
    _, samples = read(catalog, f"d@{again.snapshot_id}")
    values = {k: v["point_data/T"].tolist() for k, v in samples.items()}
    assert values["series.pvd/t0001"] == [99.0] * 5
    assert values["series.pvd/t0000"] == [0.0, 1.0, 2.0, 3.0, 4.0]
    # nothing changed since: reused
    third = ingest([folder], dataset="d", store=catalog, snapshot=True)
    assert third.files_reused == 1 and third.snapshot_id == again.snapshot_id


def test_the_hdf5_data_of_an_xdmf_series_rewritten_in_place_is_ingested_again(
    catalog, tmp_path
):
    folder = tmp_path / "xd"
    folder.mkdir()
    source_files.write_xdmf_series(folder / "m.xdmf")
    (h5,) = [p for p in folder.iterdir() if p.suffix == ".h5"]
    ingest([folder], dataset="d", store=catalog, snapshot=True)
    time.sleep(0.01)
    with h5py.File(h5, "r+") as f:  # same size: values only
        name = next(n for n in f if isinstance(f[n], h5py.Dataset) and f[n].dtype.kind == "f")
        f[name][...] = 99
    again = ingest([folder], dataset="d", store=catalog, snapshot=True)
    assert again.files_reused == 0 and again.files_ingested == 1


def test_a_step_changed_while_its_pvd_is_read_fails_naming_it(tmp_path):
    folder = tmp_path / "series"
    folder.mkdir()
    source_files.write_pvd(folder, steps=2)
    (src,), _ = discover([str(folder)], MeshAdapter())
    assert isinstance(src, SourceFile)
    assert [os.path.basename(c[0]) for c in src.companions] == ["step_0.vtu", "step_1.vtu"]
    listed = ListedSource(src, same_host=True)
    listed.open()
    _rewrite_step(folder, 0, 7.0)
    with pytest.raises(SourceError) as info:
        listed.check()
    listed.close()
    message = str(info.value)
    assert message.startswith(str(folder / "series.pvd"))
    assert "step_0.vtu" in message and "step_1.vtu" not in message
    assert "changed since it was listed" in message


def test_pieces_of_a_file_keep_its_companions():
    from simstore.ingest._records import SourceFile
    from simstore.ingest._sources import _pieces

    src = SourceFile("/d/a.pvd", "a.pvd", 4000, 1, identity="1:2:3", file_size=4000,
                     companions=(("/d/s0.vtu", 10, 1, "1:5:3"),))
    pieces = _pieces(src, samples=40, shard_size=1000)
    assert len(pieces) == 4 and sum(p.size for p in pieces) == 4000
    assert all(p.companions == src.companions and p.identity == "1:2:3" for p in pieces)
    assert [(p.piece.start, p.piece.stop) for p in pieces] == [(0, 10), (10, 20), (20, 30),
                                                               (30, 40)]


def test_a_pvd_listing_itself_is_a_bad_file_not_dropped(catalog, tmp_path):
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "self.pvd").write_text(
        '<VTKFile type="Collection"><Collection>'
        '<DataSet timestep="0" file="self.pvd"/></Collection></VTKFile>'
    )
    result = ingest([folder], dataset="d", store=catalog, on_error="skip")
    (skipped,) = result.files_skipped
    assert "self.pvd" in str(skipped)


def test_the_hdf5_data_of_a_pvds_xdmf_step_rewritten_in_place_is_ingested_again(
    catalog, tmp_path, read
):
    folder = tmp_path / "px"
    folder.mkdir()
    points, triangles, _ = source_files.small_mesh()
    meshio.write(folder / "step.xdmf", meshio.Mesh(
        points, [("triangle", triangles)], point_data={"T": np.arange(5.0)}), data_format="HDF")
    (folder / "series.pvd").write_text(
        '<?xml version="1.0"?><VTKFile type="Collection" version="0.1"><Collection>'
        '<DataSet timestep="0" file="step.xdmf"/></Collection></VTKFile>')
    (h5,) = [p for p in folder.iterdir() if p.suffix == ".h5"]
    first = ingest([folder], dataset="d", store=catalog, snapshot=True)
    assert first.files_ingested == 1
    time.sleep(0.01)
    with h5py.File(h5, "r+") as f:  # same size: values only
        for name in f:
            if f[name].shape == (5,):
                f[name][...] = 99.0
    again = ingest([folder], dataset="d", store=catalog, snapshot=True)
    assert again.files_reused == 0 and again.files_ingested == 1
    _, samples = read(catalog, f"d@{again.snapshot_id}")
    assert samples["series.pvd/t0000"]["point_data/T"].tolist() == [99.0] * 5
