"""A failed whole-part volume mesh must not leave the per-solid fallback meshing nothing.

gmsh keeps its meshing lock when ``generate`` raises, so every later ``generate`` in the
same process silently did nothing: a part whose volume mesh failed was stored as
``mesh: per-solid`` with no points, no triangles and no tetrahedra.
"""

from __future__ import annotations

import subprocess
import sys

from formats.adapters._cad import mesh_isolated

_BUILD = """
import sys, gmsh
gmsh.initialize(); gmsh.option.setNumber("General.Terminal", 0)
o = gmsh.model.occ
b1 = o.addBox(0, 0, 0, 1, 1, 1); b2 = o.addBox(0.5, 0.5, 0.5, 1, 1, 1)
o.synchronize()
s = [t for b in (b1, b2) for _, t in gmsh.model.getBoundary([(3, b)], oriented=False)]
o.remove([(3, b1), (3, b2)])
o.addVolume([o.addSurfaceLoop(s)])   # a solid whose shell intersects itself
o.addBox(5, 5, 5, 1, 1, 1)           # and a clean one
o.synchronize()
gmsh.write(sys.argv[1])
gmsh.finalize()
"""


def test_failed_volume_mesh_keeps_geometry(tmp_path):
    part = tmp_path / "selfint.brep"
    subprocess.run([sys.executable, "-c", _BUILD, str(part)], check=True, capture_output=True)
    fields = mesh_isolated(str(part), 0.05, True, timeout_s=120, tmp_dir=str(tmp_path))
    meta = fields["metadata"]
    assert "volume_error" in meta
    assert len(fields["points"]) > 0
    assert len(fields["cells/triangle"]) > 0
    # the self-intersecting solid has no volume mesh of its own either: the surface is
    # kept, and the metadata says why
    assert meta["mesh"] == "surface" and "cells/tetra" not in fields
    assert "per-solid mesh failed too" in meta["reason"]
