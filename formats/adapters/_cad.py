"""The ``cad`` adapter (gmsh, which bundles OpenCASCADE): STEP, IGES and BREP parts.

One sample per file: a tessellated surface mesh (``points``, ``cells/triangle``) at a
configurable tolerance, the part's bounding box (``bbox/xmin`` ... ``bbox/zmax``), surface
area (``surface_area``) and volume (``volume``) as parameters, and ``source_object``: the
id of the original file's bytes, which the pipeline stores content-addressed next to the
shards (the adapter declares ``stores_source``) and lists in the snapshot's lineage.

Options: ``cad_tolerance`` (largest element size as a fraction of the bounding-box
diagonal, default 0.02; curvature adds elements where needed) and ``cad_mesh``
(``surface``, the default, or ``volume``). A volume mesh of a real assembly with
overlapping solids often fails; the adapter then meshes each solid on its own, and if that
fails too keeps only the surface. The sample's ``metadata`` says which (``mesh``:
``volume``, ``per-solid`` or ``surface``) and why.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from simstore.errors import SourceError
from simstore.hashing import hash_file
from simstore.sample import Sample

__all__ = ["CadAdapter"]

_EXTS = (".step", ".stp", ".iges", ".igs", ".brep", ".brp")
_LOCK = threading.Lock()  # gmsh is one global state per process; serialise its users


def _gmsh() -> Any:
    try:
        import gmsh
    except ImportError as exc:
        raise ImportError("the cad adapter needs gmsh: pip install 'simstore[cad]'") from exc
    return gmsh


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


class CadAdapter:
    """CAD parts through gmsh/OpenCASCADE."""

    name = "cad"
    version = "1"
    extensions = _EXTS
    stores_source = True

    def can_read(self, path: str, head: bytes) -> bool:
        """STEP by its ``ISO-10303-21`` header or extension; IGES and BREP by extension."""
        return head.startswith(b"ISO-10303-21") or path.lower().endswith(_EXTS)

    def iter_samples(self, path: str, key: str, options: Mapping[str, Any]) -> Iterator[Sample]:
        """The part's one sample."""
        tolerance = float(options.get("cad_tolerance") or 0.02)
        want_volume = str(options.get("cad_mesh") or "surface") == "volume"
        source_hash = str(options.get("source_hash") or hash_file(path)[0])
        gmsh = _gmsh()
        with _LOCK:
            fields = self._run(gmsh, path, tolerance, want_volume)
        fields["source_object"] = source_hash
        fields["source_name"] = os.path.basename(path)
        yield Sample(key, fields)

    def _import(self, gmsh: Any, path: str) -> None:
        try:
            gmsh.model.occ.importShapes(path)
            gmsh.model.occ.synchronize()
        except Exception as exc:  # gmsh raises plain Exception with OCC's message
            raise SourceError(f"{path}: field 'points': CAD import failed: {exc}") from exc

    def _run(self, gmsh: Any, path: str, tolerance: float, want_volume: bool) -> dict[str, Any]:
        owned = not gmsh.isInitialized()
        if owned:
            gmsh.initialize(
                argv=["simstore"], readConfigFiles=False, run=False, interruptible=False
            )
        model = f"simstore-{os.getpid()}-{threading.get_ident()}"
        try:
            gmsh.option.setNumber("General.Terminal", 0)
            gmsh.option.setNumber("General.Verbosity", 0)
            gmsh.option.setNumber("General.NumThreads", 1)
            gmsh.model.add(model)
            self._import(gmsh, path)
            surfaces = gmsh.model.getEntities(2)
            solids = gmsh.model.getEntities(3)
            if not surfaces:
                raise SourceError(f"{path}: field 'points': the part has no surfaces to tessellate")
            box = gmsh.model.getBoundingBox(-1, -1)
            diag = float(np.linalg.norm(np.subtract(box[3:], box[:3])))
            size = max(diag * tolerance, 1e-12)
            gmsh.option.setNumber("Mesh.MeshSizeMax", size)
            gmsh.option.setNumber("Mesh.MeshSizeFromCurvature", 12)
            area = float(sum(gmsh.model.occ.getMass(2, t) for _, t in surfaces))
            volume = float(sum(gmsh.model.occ.getMass(3, t) for _, t in solids))
            try:
                points, triangles = _surface(gmsh)
            except Exception as exc:
                raise SourceError(
                    f"{path}: field 'cells/triangle': tessellation failed: {exc}"
                ) from exc
            if len(triangles) == 0:
                raise SourceError(
                    f"{path}: field 'cells/triangle': tessellation produced no triangles"
                )
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
                self._volume(gmsh, path, model, fields, meta)
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
        self, gmsh: Any, path: str, model: str, fields: dict[str, Any], meta: dict[str, Any]
    ) -> None:
        """Add ``cells/tetra``: the whole model, else each solid alone, else nothing."""
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
        meta["volume_error"] = whole_error
        solids = [t for _, t in gmsh.model.getEntities(3)]
        all_points: list[np.ndarray] = []
        all_tris: list[np.ndarray] = []
        all_tets: list[np.ndarray] = []
        offset = 0
        try:
            for tag in solids:
                gmsh.model.add(f"{model}-solid{tag}")
                self._import(gmsh, path)
                others = [(3, t) for _, t in gmsh.model.getEntities(3) if t != tag]
                if others:
                    gmsh.model.occ.remove(others, recursive=True)
                    gmsh.model.occ.synchronize()
                gmsh.model.mesh.generate(3)
                pts, tets = _mesh_arrays(gmsh, 3, 4)
                _, tris = _mesh_arrays(gmsh, 2, 2)
                gmsh.model.remove()
                gmsh.model.setCurrent(model)
                all_points.append(pts)
                all_tris.append(tris + offset)
                all_tets.append(tets + offset)
                offset += len(pts)
        except Exception as exc:
            meta["mesh"] = "surface"
            meta["reason"] = (
                f"volume mesh failed ({whole_error}); per-solid mesh failed too ({exc})"
            )
            gmsh.model.setCurrent(model)
            return
        fields["points"] = np.concatenate(all_points)
        fields["cells/triangle"] = np.concatenate(all_tris)
        fields["cells/tetra"] = np.concatenate(all_tets)
        meta["mesh"] = "per-solid"
        meta["reason"] = f"volume mesh of the whole part failed: {whole_error}"
