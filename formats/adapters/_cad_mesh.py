"""Meshing one CAD part with gmsh (OpenCASCADE), run as its own process by the cad adapter.

OpenCASCADE's readers crash the process (SIGSEGV) on some malformed STEP files, and can
spin on others; the ``cad`` adapter therefore runs this file as a separate interpreter
(``python _cad_mesh.py PATH TOLERANCE surface|volume OUT PARENT_PID``), with a time limit,
and turns a crash, a hang or an error into a ``SourceError`` naming the file; on Linux the
process dies with its parent, so a killed ingest leaves no mesher running. It imports only
numpy and gmsh (not simstore), so it starts in a fraction of a second, and it returns arrays
in an ``.npz`` read back with ``allow_pickle=False`` and everything else as JSON: nothing
crosses the process boundary as a pickle.

Coordinates beyond :data:`MAX_EXTENT` are refused before meshing (STEP points before the
import, every format's bounding box after it): fuzzing found that one corrupt coordinate
can keep OpenCASCADE's import or mesher busy for minutes, on some runs and not others.

Output: ``OUT.json`` holds ``{"error": message}`` or ``{"arrays": [names], "values":
{name: float}, "metadata": {...}}``, and ``OUT.npz`` the arrays as ``a0``, ``a1``, ...
"""

from __future__ import annotations

import json
import math
import mmap
import os
import re
import signal
import sys
import threading
from typing import Any

import numpy as np

MAX_EXTENT = 1e12
"""Largest coordinate and bounding-box diagonal meshed (file units: 1e6 km in millimetres)."""

_STEP_POINT = re.compile(
    rb"#(\d+)\s*=\s*CARTESIAN_POINT\s*\(\s*(?:'(?:[^']|'')*'|\$)\s*,\s*\(([^)]*)\)"
)
_LEADING_NUMBER = re.compile(
    rb"\s*([+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|(?i:nan|inf(?:inity)?)))"
)
"""The number at the start of a token, as a C reader takes it (``-1e308.`` is -1e308)."""


class MeshError(Exception):
    """A part that does not import or tessellate; the message names the file and field."""


def _diagonal(box: Any) -> float:
    """The length of a bounding box's diagonal, the same on every CPU.

    The diagonal sets the mesh size, so it must not depend on a BLAS dot product's kernel,
    which OpenBLAS picks by CPU.
    """
    return math.hypot(*(float(hi) - float(lo) for lo, hi in zip(box[:3], box[3:], strict=True)))


def _mesh_arrays(gmsh: Any, dim: int, etype: int) -> tuple[np.ndarray, np.ndarray]:
    """Node coordinates (N x 3) and 0-based connectivity of elements of one type."""
    tags, coords, _ = gmsh.model.mesh.getNodes()
    tags = np.asarray(tags, dtype=np.int64)
    xyz = np.asarray(coords, dtype=np.float64).reshape(-1, 3)
    order = np.argsort(tags)
    tags, xyz = tags[order], xyz[order]
    types, _, nodes = gmsh.model.mesh.getElements(dim)
    conn = [np.asarray(n, dtype=np.int64) for t, n in zip(types, nodes, strict=True) if t == etype]
    per = {2: 3, 4: 4}[etype]
    flat = np.concatenate(conn) if conn else np.zeros(0, dtype=np.int64)
    return xyz, np.searchsorted(tags, flat).reshape(-1, per)


def _surface(gmsh: Any) -> tuple[np.ndarray, np.ndarray]:
    gmsh.model.mesh.generate(2)
    return _mesh_arrays(gmsh, 2, 2)


def _import(gmsh: Any, path: str) -> None:
    try:
        gmsh.model.occ.importShapes(path)
        gmsh.model.occ.synchronize()
    except Exception as exc:  # gmsh raises plain Exception with OCC's message
        raise MeshError(f"{path}: not a readable CAD file: {exc}") from exc


def _check_step_points(path: str) -> None:
    """Refuse a STEP file with a point coordinate that is not finite or beyond MAX_EXTENT.

    Such a coordinate (fuzzing found ``1.E308`` in a placement's origin) can keep
    OpenCASCADE's STEP import busy for minutes before any bounding box can be checked. The
    file is scanned through a memory map, so a large file is not read into memory.
    """
    with open(path, "rb") as f:
        if f.read(12) != b"ISO-10303-21":
            return
        f.seek(0)
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            for match in _STEP_POINT.finditer(data):
                for token in match.group(2).split(b","):
                    # the leading number, as OpenCASCADE's reader takes it: fuzzing found
                    # "-1e308." (not a Python float) imported as -1e308, and the mesher spun
                    number = _LEADING_NUMBER.match(token)
                    if number is None:
                        continue  # not a number: the STEP reader reports it
                    value = float(number.group(1))  # the pattern is a float literal
                    if not abs(value) <= MAX_EXTENT:
                        what = (f"beyond {MAX_EXTENT:g} units from the origin"
                                if math.isfinite(value) else "not a finite number")
                        raise MeshError(
                            f"{path}: field 'points': CARTESIAN_POINT #{int(match.group(1))} "
                            f"has coordinate {token.decode(errors='replace').strip()}, {what}: "
                            "corrupt coordinates?"
                        )


def _initialize(gmsh: Any) -> None:
    gmsh.initialize(argv=["simstore"], readConfigFiles=False, run=False, interruptible=False)
    # gmsh's initialize resets SIGPIPE to its default (terminate); Python ignores it so
    # that a write to a closed socket is an exception, not the death of the process
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)


def _settings(gmsh: Any) -> None:
    gmsh.option.setNumber("General.Terminal", 0)
    gmsh.option.setNumber("General.Verbosity", 0)
    gmsh.option.setNumber("General.NumThreads", 1)


def _mesh_size(gmsh: Any, size: float) -> None:
    """Elements of at most ``size``, finer where surfaces curve (12 per full turn)."""
    gmsh.option.setNumber("Mesh.MeshSizeMax", size)
    gmsh.option.setNumber("Mesh.MeshSizeFromCurvature", 12)


def mesh_part(gmsh: Any, path: str, tolerance: float, want_volume: bool) -> dict[str, Any]:
    """The sample fields of one part: a surface (or volume) mesh, bounding box and measures.

    Raises :class:`MeshError` naming the file and field when the part does not import,
    has no surface, lies beyond :data:`MAX_EXTENT` or does not tessellate.
    """
    _check_step_points(path)
    owned = not gmsh.isInitialized()
    if owned:
        _initialize(gmsh)
    model = f"simstore-{os.getpid()}-{threading.get_ident()}"
    try:
        _settings(gmsh)
        gmsh.model.add(model)
        _import(gmsh, path)
        surfaces = gmsh.model.getEntities(2)
        solids = gmsh.model.getEntities(3)
        if not surfaces:
            raise MeshError(f"{path}: field 'points': the part has no surfaces to tessellate")
        box = gmsh.model.getBoundingBox(-1, -1)
        diag = _diagonal(box)
        if not (np.abs(box) <= MAX_EXTENT).all() or not diag <= MAX_EXTENT:
            # a corrupt coordinate (fuzzing found -1e308) can keep OpenCASCADE's mesher
            # busy for minutes on some runs and not others; IGES and BREP parts get here
            raise MeshError(
                f"{path}: field 'points': the part's bounding box {list(box)} reaches beyond "
                f"{MAX_EXTENT:g} units from the origin: corrupt coordinates?"
            )
        # OpenCASCADE's quick box follows B-spline control polygons (an IGES cylinder
        # of radius 5 came out 6% wider, lopsided); bounds from its own triangulation are
        # the part's. Only after the check above: a corrupt coordinate would have it
        # triangulate something enormous first
        gmsh.option.setNumber("Geometry.OCCBoundsUseStl", 1)
        gmsh.model.occ.synchronize()  # entities' boxes are computed when synchronised
        box = gmsh.model.getBoundingBox(-1, -1)
        diag = _diagonal(box)
        size = diag * tolerance
        _mesh_size(gmsh, size)
        area = float(sum(gmsh.model.occ.getMass(2, t) for _, t in surfaces))
        volume = float(sum(gmsh.model.occ.getMass(3, t) for _, t in solids))
        try:
            points, triangles = _surface(gmsh)
        except Exception as exc:
            raise MeshError(f"{path}: field 'cells/triangle': tessellation failed: {exc}") from exc
        if len(triangles) == 0:
            raise MeshError(f"{path}: field 'cells/triangle': tessellation produced no triangles")
        fields: dict[str, Any] = {"points": points, "cells/triangle": triangles}
        meta: dict[str, Any] = {
            "mesh": "surface",
            "solids": len(solids),
            "surfaces": len(surfaces),
            "format": os.path.splitext(path)[1].lower().lstrip("."),
        }
        if want_volume and not solids:
            meta["reason"] = "the part has no solids"
        elif want_volume:
            _volume(gmsh, path, model, fields, meta, owned=owned, size=size)
        else:
            meta["reason"] = "volume mesh not requested (cad_mesh=surface)"
        lo, hi = box[:3], box[3:]
        for axis, a, b in zip("xyz", lo, hi, strict=True):
            fields[f"bbox/{axis}min"] = float(a)
            fields[f"bbox/{axis}max"] = float(b)
        fields["surface_area"] = area
        fields["volume"] = volume
        fields["mesh_size"] = size
        fields["metadata"] = meta
        return fields
    finally:
        if owned:
            gmsh.finalize()
        else:
            gmsh.model.remove()


def _volume(
    gmsh: Any,
    path: str,
    model: str,
    fields: dict[str, Any],
    meta: dict[str, Any],
    *,
    owned: bool,
    size: float,
) -> None:
    """Add ``cells/tetra``: the whole model, else each solid alone, else nothing.

    gmsh keeps its meshing lock when ``generate`` raises: every later ``generate`` logs
    "I'm busy! Ask me that later..." and meshes nothing, without an error. Where this
    process owns gmsh it is started afresh before the per-solid meshes; either way a
    solid that comes back without tetrahedra is a failure, never an empty mesh.
    """
    solids = [t for _, t in gmsh.model.getEntities(3)]
    try:
        gmsh.model.mesh.generate(3)
        points, tets = _mesh_arrays(gmsh, 3, 4)
        if len(tets):
            pts2, tris = _mesh_arrays(gmsh, 2, 2)
            fields.update({"points": pts2, "cells/triangle": tris, "cells/tetra": tets})
            meta["mesh"] = "volume"
            return
        whole_error = "volume mesh produced no tetrahedra"
    except Exception as exc:  # overlapping solids: OCC/gmsh 3-D meshing errors
        whole_error = str(exc)
        if owned:
            gmsh.finalize()  # releases the meshing lock the failed generate kept
            _initialize(gmsh)
            _settings(gmsh)
            _mesh_size(gmsh, size)
            gmsh.model.add(model)
    meta["volume_error"] = whole_error
    all_points: list[np.ndarray] = []
    all_tris: list[np.ndarray] = []
    all_tets: list[np.ndarray] = []
    offset = 0
    try:
        for tag in solids:
            gmsh.model.add(f"{model}-solid{tag}")
            _import(gmsh, path)
            others = [(3, t) for _, t in gmsh.model.getEntities(3) if t != tag]
            if others:
                gmsh.model.occ.remove(others, recursive=True)
                gmsh.model.occ.synchronize()
            gmsh.model.mesh.generate(3)
            pts, tets = _mesh_arrays(gmsh, 3, 4)
            if len(tets) == 0:
                raise MeshError(f"solid {tag}: volume mesh produced no tetrahedra")
            _, tris = _mesh_arrays(gmsh, 2, 2)
            gmsh.model.remove()
            gmsh.model.setCurrent(model)
            all_points.append(pts)
            all_tris.append(tris + offset)
            all_tets.append(tets + offset)
            offset += len(pts)
    except Exception as exc:
        meta["mesh"] = "surface"
        meta["reason"] = f"volume mesh failed ({whole_error}); per-solid mesh failed too ({exc})"
        gmsh.model.setCurrent(model)
        return
    fields["points"] = np.concatenate(all_points)
    fields["cells/triangle"] = np.concatenate(all_tris)
    fields["cells/tetra"] = np.concatenate(all_tets)
    meta["mesh"] = "per-solid"
    meta["reason"] = f"volume mesh of the whole part failed: {whole_error}"


def _gmsh() -> Any:
    import gmsh

    return gmsh


def _die_with_parent(parent: int) -> None:
    """Have the kernel kill this process when the process that started it dies (Linux).

    The adapter's time limit lives in the parent: a parent killed mid-part (an ingest
    stopped with SIGKILL) would otherwise leave this process meshing a malformed part,
    possibly for hours, with nobody waiting for the result.
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


def main(argv: list[str]) -> int:
    """Mesh ``argv = [path, tolerance, surface|volume, out]``; 0 unless the writing fails."""
    path, tolerance, mode, out = argv[0], float(argv[1]), argv[2], argv[3]
    try:
        fields = mesh_part(_gmsh(), path, tolerance, mode == "volume")
        arrays = sorted(k for k, v in fields.items() if isinstance(v, np.ndarray))
        np.savez(out + ".npz", **{f"a{i}": fields[k] for i, k in enumerate(arrays)})
        result: dict[str, Any] = {
            "arrays": arrays,
            "values": {
                k: float(v)
                for k, v in fields.items()
                if k != "metadata" and not isinstance(v, np.ndarray)
            },
            "metadata": fields["metadata"],
        }
    except MeshError as exc:
        result = {"error": str(exc)}
    except Exception as exc:  # gmsh raises plain Exception with OCC's message
        result = {"error": f"{path}: field 'points': CAD meshing failed: {exc}"}
    tmp = out + ".json.tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, out + ".json")
    return 0


if __name__ == "__main__":
    # the adapter passes its pid: one read here could already be a reaper's
    _die_with_parent(int(sys.argv[5]) if len(sys.argv) > 5 else os.getppid())
    sys.exit(main(sys.argv[1:5]))
