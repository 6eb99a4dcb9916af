"""A re-run that checks more than the run that journaled a file reads the file again.

The journal lets a re-run skip finished files; a record written under ``--nan allow`` or
``--allow-schema-change`` does not vouch that the file passes ``--nan error`` or keeps its
fields' types, so a stricter re-run must refuse the file exactly as it would without the
journal, while a re-run with the same or looser checks still reuses every record.
"""

import json

import meshio
import numpy as np
from click.testing import CliRunner
from simstore.cli import main

from simstore.catalog import Catalog


def _ingest(store, src, *flags):
    return CliRunner().invoke(
        main, ["--store", store, "ingest", str(src), "--dataset", "d", "--json",
               "--no-progress", *flags]
    )


def _store(tmp_path):
    store = str(tmp_path / "store")
    assert CliRunner().invoke(main, ["--store", store, "init"]).exit_code == 0
    src = tmp_path / "src"
    src.mkdir()
    return store, src


def test_nan_error_after_a_journaled_run_that_allowed_nan(tmp_path):
    store, src = _store(tmp_path)
    np.savez(src / "a0.npz", u=np.zeros((4, 4), np.float32))
    nan = np.zeros((4, 4), np.float32)
    nan[1, 2] = np.nan
    np.savez(src / "a1.npz", u=nan)
    np.savez(src / "z.npz", u=np.zeros((4, 4), np.int64))  # breaks the schema: run fails
    first = _ingest(store, src)
    assert first.exit_code == 8, first.output  # a0 and a1 journaled, z refused
    (src / "z.npz").unlink()
    strict = _ingest(store, src, "--nan", "error", "--snapshot", "-m", "x")
    assert strict.exit_code == 8, strict.output
    lines = [line for line in strict.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "a1.npz: field 'u': 1 NaN" in lines[0]
    cat = Catalog.open(store)
    assert cat.staged("d") == [] and cat.branches("d").names() == []
    # the same checks as the journaled run: every record serves
    same = _ingest(store, src)
    assert same.exit_code == 0, same.output
    assert json.loads(same.output)["files_reused"] == 2


def test_a_run_without_allow_schema_change_after_one_with_it(tmp_path):
    store, src = _store(tmp_path)
    pts = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0]], float)
    cells = [("triangle", np.array([[0, 1, 2]]))]
    # a series whose own steps change a field's type: refused unless allowed
    for i, dtype in enumerate((np.float32, np.float64)):
        meshio.write(str(src / f"s{i}.vtu"),
                     meshio.Mesh(pts, cells, point_data={"p": np.arange(3, dtype=dtype)}))
    (src / "s.pvd").write_text(
        '<?xml version="1.0"?><VTKFile type="Collection" version="0.1"><Collection>'
        '<DataSet timestep="0" file="s0.vtu"/><DataSet timestep="1" file="s1.vtu"/>'
        "</Collection></VTKFile>"
    )
    (src / "zbad.vtu").write_text("not a mesh")
    first = _ingest(store, src, "--allow-schema-change")
    assert first.exit_code == 8, first.output  # the series journaled, zbad refused
    (src / "zbad.vtu").unlink()
    strict = _ingest(store, src, "--snapshot", "-m", "x")
    assert strict.exit_code == 8, strict.output
    assert "s.pvd: field 'point_data/p' changes type" in strict.output
    assert Catalog.open(store).branches("d").names() == []
    allowed = _ingest(store, src, "--allow-schema-change")
    assert allowed.exit_code == 0, allowed.output
    assert json.loads(allowed.output)["files_reused"] == 1
