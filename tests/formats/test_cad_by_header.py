"""A STEP file is claimed by its ``ISO-10303-21`` header whatever its name; gmsh picks its
reader by extension, so the cad adapter reads such a file through a link named for its
kind, and its errors still name the file itself."""

import shutil

import pytest
import source_files as sf
from simstore.formats.adapters import AutoAdapter, CadAdapter

from simstore.errors import SourceError


@pytest.fixture(scope="module")
def step_box(tmp_path_factory):
    path = tmp_path_factory.mktemp("cad") / "box.step"
    sf.write_step(path)
    return path


@pytest.mark.parametrize("name", ["box_rev2", "part.step.v2", "BOX.Step", "box.STP"])
def test_a_step_file_named_otherwise_is_read(tmp_path, step_box, name):
    path = tmp_path / name
    shutil.copy(step_box, path)
    head = path.read_bytes()[:64]
    assert AutoAdapter().resolve(str(path), head).name == "cad"
    (sample,) = CadAdapter().iter_samples(str(path), name, {"cad_tolerance": 0.2})
    f = sample.fields
    assert f["volume"] == pytest.approx(6.0, rel=1e-6)
    assert f["surface_area"] == pytest.approx(22.0, rel=1e-6)
    assert f["source_name"] == name
    assert f["metadata"]["format"] in ("step", "stp")
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # no link left beside it


def test_errors_of_a_step_file_named_otherwise_name_the_file(tmp_path):
    path = tmp_path / "broken_rev2"
    path.write_text("ISO-10303-21;\nHEADER;\nthis is not a model\nENDSEC;\n")
    with pytest.raises(SourceError) as err:
        list(CadAdapter().iter_samples(str(path), "broken_rev2", {}))
    message = str(err.value)
    assert message.startswith(f"{path}: not a readable CAD file: ")
    assert "part.step" not in message and "\n" not in message


def test_an_ingest_of_a_folder_takes_the_renamed_step(tmp_path, step_box):
    from simstore.catalog import Catalog
    from simstore.ingest import ingest

    root = tmp_path / "src"
    root.mkdir()
    shutil.copy(step_box, root / "box_rev2")
    shutil.copy(step_box, root / "box.step")
    catalog = Catalog.init(str(tmp_path / "store"))
    r = ingest([root], dataset="d", store=catalog, snapshot=True, on_error="skip",
               adapter_options={"cad_tolerance": "0.2"})
    assert r.files_skipped == ()
    keys = catalog.manifest(catalog.snapshot(r.snapshot_id)).column("key").to_pylist()
    assert sorted(keys) == ["box.step", "box_rev2"]
