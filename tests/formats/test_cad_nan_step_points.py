"""A STEP point coordinate spelled ``nan`` or ``inf`` is refused before OpenCASCADE reads it.

OpenCASCADE's STEP import spins on such a coordinate (``(nan,0.,0.)``, ``(NaN,...)``,
``(inf,...)``) until the adapter's time limit (900 s by default); the pre-import scan
only took digits for numbers and let them through.
"""

from __future__ import annotations

import pytest

from formats.adapters._cad_mesh import MeshError, _check_step_points

_STEP = """ISO-10303-21;
HEADER;
ENDSEC;
DATA;
#1 = CARTESIAN_POINT('',({x},0.,0.));
ENDSEC;
END-ISO-10303-21;
"""


@pytest.mark.parametrize("token", ["nan", "NaN", "-nan", "inf", "-Infinity", "1e400"])
def test_non_finite_step_coordinate_is_refused(tmp_path, token):
    path = tmp_path / "p.step"
    path.write_text(_STEP.format(x=token))
    with pytest.raises(MeshError, match="CARTESIAN_POINT #1 has coordinate"):
        _check_step_points(str(path))


def test_finite_coordinate_passes(tmp_path):
    path = tmp_path / "p.step"
    path.write_text(_STEP.format(x="1.5E3"))
    _check_step_points(str(path))
