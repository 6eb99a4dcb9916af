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

Each part is meshed in its own short-lived process (``_cad_mesh.py``, numpy and gmsh
only): OpenCASCADE crashes the process on some malformed STEP files (found by fuzzing),
and a crash there must be a ``SourceError`` naming the file, not the death of the ingest.
``cad_timeout_s`` (default 900) bounds one part's import and meshing, and a part with a
coordinate beyond 1e12 units (a corrupt number, which can keep OpenCASCADE busy for
minutes) is refused before meshing with a ``SourceError`` naming the file.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from simstore.errors import InvalidInputError, SourceError
from simstore.hashing import hash_file
from simstore.sample import Sample

__all__ = ["CadAdapter"]

_EXTS = (".step", ".stp", ".iges", ".igs", ".brep", ".brp")
_MESHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_cad_mesh.py")
DEFAULT_TIMEOUT_S = 900.0


def _check_gmsh() -> None:
    try:
        import gmsh  # noqa: F401
    except ImportError as exc:
        raise ImportError("the cad adapter needs gmsh: pip install 'simstore[cad]'") from exc


def mesh_isolated(
    path: str, tolerance: float, want_volume: bool, *, timeout_s: float, tmp_dir: str | None
) -> dict[str, Any]:
    """Mesh one part in a separate process; its fields, or a SourceError naming the file.

    A crash of the CAD kernel (a signal), a run past ``timeout_s`` and an import or
    meshing error all become a :class:`SourceError`; the arrays come back through an
    ``.npz`` read with ``allow_pickle=False``.
    """
    with tempfile.TemporaryDirectory(prefix="simstore-cad-", dir=tmp_dir) as tmp:
        out = os.path.join(tmp, "mesh")
        cmd = [
            sys.executable,
            _MESHER,
            path,
            repr(tolerance),
            "volume" if want_volume else "surface",
            out,
            str(os.getpid()),
        ]
        try:
            proc = subprocess.run(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise SourceError(
                f"{path}: field 'points': CAD import and meshing took longer than "
                f"{timeout_s:g} s (raise the adapter option cad_timeout_s for huge parts)"
            ) from None
        if proc.returncode < 0:
            name = signal.Signals(-proc.returncode).name
            raise SourceError(
                f"{path}: field 'points': the CAD kernel crashed reading this file ({name}); "
                "it is malformed or uses something OpenCASCADE cannot read"
            )
        try:
            with open(out + ".json") as f:
                result = json.load(f)
        except (OSError, ValueError):
            tail = proc.stderr.decode(errors="replace").strip().splitlines()[-1:]
            raise SourceError(
                f"{path}: field 'points': CAD meshing failed (exit {proc.returncode}"
                f"{': ' + tail[0] if tail else ''})"
            ) from None
        if "error" in result:
            raise SourceError(str(result["error"]))
        fields: dict[str, Any] = {k: float(v) for k, v in result["values"].items()}
        with np.load(out + ".npz", allow_pickle=False) as arrays:
            for i, name in enumerate(result["arrays"]):
                fields[name] = arrays[f"a{i}"]
        fields["metadata"] = result["metadata"]
        return fields


def _mesh_options(options: Mapping[str, Any]) -> tuple[float, bool]:
    """``(cad_tolerance, whether cad_mesh asks for a volume mesh)``, checked.

    A tolerance is a fraction of the bounding-box diagonal: a number above 0 and at most
    1 (0 or a negative one used to become the default, or a size gmsh ignored while the
    sample recorded it). ``cad_mesh`` is ``surface`` or ``volume``.
    """
    raw = options.get("cad_tolerance")
    try:
        tolerance = 0.02 if raw is None else float(raw)
    except (TypeError, ValueError):
        tolerance = float("nan")
    if not 0 < tolerance <= 1:  # NaN fails too
        raise InvalidInputError(
            f"cad_tolerance {raw!r}: a fraction of the part's diagonal above 0 and at most 1"
        )
    mesh = str(options.get("cad_mesh") or "surface")
    if mesh not in ("surface", "volume"):
        raise InvalidInputError(f"cad_mesh {mesh!r}: 'surface' or 'volume'")
    return tolerance, mesh == "volume"


class CadAdapter:
    """CAD parts through gmsh/OpenCASCADE, each meshed in its own process."""

    name = "cad"
    version = "1"
    extensions = _EXTS
    options = frozenset({"cad_tolerance", "cad_mesh", "cad_timeout_s"})
    stores_source = True

    def can_read(self, path: str, head: bytes) -> bool:
        """STEP by its ``ISO-10303-21`` header or extension; IGES and BREP by extension."""
        return head.startswith(b"ISO-10303-21") or path.lower().endswith(_EXTS)

    def iter_samples(self, path: str, key: str, options: Mapping[str, Any]) -> Iterator[Sample]:
        """The part's one sample."""
        tolerance, want_volume = _mesh_options(options)
        timeout_s = float(options.get("cad_timeout_s") or DEFAULT_TIMEOUT_S)
        source_hash = str(options.get("source_hash") or hash_file(path)[0])
        _check_gmsh()
        fields = mesh_isolated(
            path, tolerance, want_volume, timeout_s=timeout_s, tmp_dir=options.get("tmp_dir")
        )
        fields["source_object"] = source_hash
        fields["source_name"] = os.path.basename(path)
        yield Sample(key, fields)
