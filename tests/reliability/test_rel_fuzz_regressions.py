"""Inputs that fuzzing found to break a promise, kept as regression tests.

CAD parts with corrupt coordinates: a STEP file whose placement origin read ``1.E308``
kept OpenCASCADE's STEP import busy for minutes on some runs (on others it imported and
the mesher spun instead), so a fuzz case hung the worker past its time limit, and the
orphaned mesher went on after the worker was killed. The cad adapter now refuses a STEP
point beyond 1e12 units before the import and any part whose bounding box reaches beyond
it before meshing, and the mesher process dies with the process that started it.

Each case runs with ``cad_timeout_s`` well above a normal part's meshing time: a
regression shows as the adapter's time-limit error instead of the refusal the test
expects, not as a test that hangs.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
from simstore.formats.adapters import CadAdapter

from simstore.errors import SourceError

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "formats"))

import source_files as sf  # noqa: E402 - the adapter tests' own writers

OPTIONS = {"cad_tolerance": 0.1, "cad_timeout_s": 300}


def _box_step(tmp_path):
    path = tmp_path / "box.step"
    sf.write_step(path)
    return path.read_text()


def _point(text: str, entity: int | None = None, coords: str | None = None) -> re.Match[str]:
    """The CARTESIAN_POINT with that entity number, or the first with those coordinates."""
    for m in re.finditer(r"#(\d+) = CARTESIAN_POINT\('',\(([^)]*)\)\);", text):
        if int(m.group(1)) == entity or m.group(2) == coords:
            return m
    raise AssertionError(f"no such CARTESIAN_POINT in the seed: {entity} {coords}")


def _with_point(text: str, m: re.Match[str], coords: str) -> str:
    return text[: m.start(2)] + coords + text[m.end(2) :]


def _mesh(path):
    return list(CadAdapter().iter_samples(str(path), path.name, OPTIONS))


def _placement_origin(text: str) -> re.Match[str]:
    """The origin of the shape representation's placement (the point fuzzing hit)."""
    rep = re.search(r"ADVANCED_BREP_SHAPE_REPRESENTATION\('',\(#(\d+)", text)
    assert rep is not None
    axis = re.search(rf"#{rep.group(1)} = AXIS2_PLACEMENT_3D\('',#(\d+),", text)
    assert axis is not None
    return _point(text, entity=int(axis.group(1)))


@pytest.mark.parametrize("value", ["1.E308", "-1.E308", "1.E400", "2.E12"])
def test_step_placement_origin_beyond_the_extent_is_refused_before_import(tmp_path, value):
    text = _box_step(tmp_path)
    origin = _placement_origin(text)
    bad = tmp_path / "placed.step"
    bad.write_text(_with_point(text, origin, f"{value},0.,0."))
    with pytest.raises(SourceError) as err:
        _mesh(bad)
    message = str(err.value)
    assert message.startswith(f"{bad}: field 'points': CARTESIAN_POINT #{origin.group(1)} ")
    assert value in message and "corrupt coordinates" in message


@pytest.mark.parametrize("value", ["-1.E308", "2.E12", "-1e308.", "1E13.5"])
def test_step_vertex_beyond_the_extent_is_refused(tmp_path, value):
    """``-1e308.`` is no Python float, but OpenCASCADE reads it as -1e308 (a stress run's
    fuzzing: the mesher then ran past the harness's 30 s on a 15 KB part)."""
    text = _box_step(tmp_path)
    corner = _point(text, coords="0.,0.,3.")
    bad = tmp_path / "vertex.step"
    bad.write_text(_with_point(text, corner, f"0.,0.,{value}"))
    with pytest.raises(SourceError, match=r"vertex\.step: field 'points': CARTESIAN_POINT"):
        _mesh(bad)


def test_step_with_large_but_plausible_coordinates_still_meshes(tmp_path):
    text = _box_step(tmp_path)
    fine = tmp_path / "long.step"
    # a vertex at z = 3 moved to z = 1e11 (100,000 km in millimetres)
    fine.write_text(text.replace("(0.,0.,3.)", "(0.,0.,1.E11)", 1))
    (sample,) = _mesh(fine)
    assert sample.fields["bbox/zmax"] == pytest.approx(1e11)
    assert len(sample.fields["cells/triangle"]) > 0


def test_part_whose_bounding_box_reaches_beyond_the_extent_is_refused(tmp_path):
    """A BREP part is not scanned before the import: the bounding-box check refuses it."""
    import gmsh

    far = tmp_path / "far.brep"
    owned = not gmsh.isInitialized()
    if owned:
        gmsh.initialize(argv=["t"], readConfigFiles=False, run=False, interruptible=False)
    try:
        gmsh.option.setNumber("General.Terminal", 0)
        gmsh.model.add("far")
        gmsh.model.occ.addBox(2e12, 0, 0, 1, 2, 3)
        gmsh.model.occ.synchronize()
        gmsh.write(str(far))
    finally:
        if owned:
            gmsh.finalize()
        else:
            gmsh.model.remove()
    with pytest.raises(SourceError, match=r"far\.brep: field 'points': the part's bounding box"):
        _mesh(far)


def _is_mesher(p) -> bool:
    try:
        return "_cad_mesh.py" in " ".join(p.cmdline())
    except psutil.Error:
        return False


def test_mesher_dies_with_the_process_that_started_it(tmp_path):
    """SIGKILL a process in the middle of meshing a part: its mesher process goes too."""
    text = _box_step(tmp_path)
    part = tmp_path / "box.step"
    part.write_text(text)
    scratch = tmp_path / "scratch"  # the killed process cannot remove its folder
    scratch.mkdir()
    script = textwrap.dedent(
        f"""
        from simstore.formats.adapters._cad import mesh_isolated
        # a volume mesh this fine takes minutes: the kill comes first
        mesh_isolated({str(part)!r}, 1e-4, True, timeout_s=3600, tmp_dir={str(scratch)!r})
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script])
    mesher = None
    try:
        proc = psutil.Process(parent.pid)
        while mesher is None and parent.poll() is None:
            mesher = next((c for c in proc.children() if _is_mesher(c)), None)
            time.sleep(0.05)
        assert mesher is not None, f"the part was never meshed (exit {parent.returncode})"
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        try:
            mesher.wait(60)
        except psutil.TimeoutExpired:
            pytest.fail("the mesher went on after the process that started it was killed")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if mesher is not None and mesher.is_running():
            mesher.kill()
