"""The ``cad`` adapter (gmsh, which bundles OpenCASCADE): STEP, IGES and BREP parts.

One sample per file: a tessellated surface mesh (``points``, ``cells/triangle``) at a
configurable tolerance, the part's bounding box (``bbox/xmin`` ... ``bbox/zmax``, from
OpenCASCADE's own triangulation, whatever the tolerance: on a curved face it can lie
slightly inside the exact box, by up to about 0.2% of the radius of curvature), surface
area (``surface_area``) and volume (``volume``) as parameters, and ``source_object``: the
id of the original file's bytes, which the pipeline stores content-addressed next to the
shards (the adapter declares ``stores_source``) and lists in the snapshot's lineage.

Options: ``cad_tolerance`` (largest element size as a fraction of the bounding-box
diagonal, default 0.02; curvature adds elements where needed) and ``cad_mesh``
(``surface``, the default, or ``volume``). A volume mesh of a real assembly with
overlapping solids often fails; the adapter then meshes each solid on its own, and if that
fails too keeps only the surface. The sample's ``metadata`` says which (``mesh``:
``volume``, ``per-solid`` or ``surface``) and why. Option values are checked by
:meth:`CadAdapter.check_options`, which ingest calls before it reads anything.

A STEP file is recognised by its ``ISO-10303-21`` header whatever its name; gmsh picks
its reader by extension, so such a file is read through a link named ``part.step`` in the
part's temporary folder.

Each part is meshed in its own short-lived process (``_cad_mesh.py``, numpy and gmsh
only): OpenCASCADE crashes the process on some malformed STEP files (found by fuzzing),
and a crash there must be a ``SourceError`` naming the file, not the death of the ingest.
``cad_timeout_s`` (seconds, above 0 and finite; default 900) bounds one part's import and
meshing, and a part with a
coordinate beyond 1e12 units (a corrupt number, which can keep OpenCASCADE busy for
minutes) is refused before meshing with a ``SourceError`` naming the file.
"""

from __future__ import annotations

import json
import os
import shutil
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
_UPPER_EXTS = tuple(e.upper() for e in _EXTS)
_STEP_MAGIC = b"ISO-10303-21"
_MESHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_cad_mesh.py")
DEFAULT_TIMEOUT_S = 900.0


def _check_gmsh() -> None:
    try:
        import gmsh  # noqa: F401
    except ImportError as exc:
        raise ImportError("the cad adapter needs gmsh: pip install 'simstore[cad]'") from exc


def _suffix_for_gmsh(path: str) -> str | None:
    """The suffix gmsh needs to read ``path``, or None when its own name will do.

    gmsh picks its reader by the extension alone, in lower or upper case (``.step``,
    ``.STEP``; ``.Step`` is an "Unknown file type"). A STEP file known by its
    ``ISO-10303-21`` header whatever its name (``box_rev2``, ``part.step.v2``) needs
    ``.step``, one with a mixed-case extension that extension in lower case.
    """
    ext = os.path.splitext(path)[1]
    if ext in _EXTS or ext in _UPPER_EXTS:
        return None
    if ext.lower() in _EXTS:
        return ext.lower()
    try:
        with open(path, "rb") as f:
            head = f.read(len(_STEP_MAGIC))
    except OSError:
        return None  # the mesher names the file and says why
    return ".step" if head == _STEP_MAGIC else None


def _readable_name(path: str, tmp: str) -> str:
    r"""``path``, or a link (a copy where links fail) to it in ``tmp`` named for gmsh.

    gmsh also takes only names it can encode as UTF-8: a path that is not (a file under a
    folder named ``run\xff``) is read through a link too, with the file's own suffix.
    """
    suffix = _suffix_for_gmsh(path)
    if suffix is None:
        try:
            path.encode("utf-8")
            return path
        except UnicodeEncodeError:
            ext = os.path.splitext(os.path.basename(path))[1]
            suffix = ext if ext.isascii() and ext.isprintable() else ""
    alias = os.path.join(tmp, "part" + suffix)
    try:
        os.symlink(os.path.abspath(path), alias)
    except OSError:
        shutil.copyfile(path, alias)
    return alias


def mesh_isolated(
    path: str, tolerance: float, want_volume: bool, *, timeout_s: float, tmp_dir: str | None
) -> dict[str, Any]:
    """Mesh one part in a separate process; its fields, or a SourceError naming the file.

    A crash of the CAD kernel (a signal), a run past ``timeout_s`` and an import or
    meshing error all become a :class:`SourceError`; the arrays come back through an
    ``.npz`` read with ``allow_pickle=False``. A file whose name gmsh cannot pick a
    reader by (a STEP file known by its header) is read through a link in the temporary
    folder named with the suffix of its kind; errors still name ``path``.
    """
    with tempfile.TemporaryDirectory(prefix="simstore-cad-", dir=tmp_dir) as tmp:
        out = os.path.join(tmp, "mesh")
        source = _readable_name(path, tmp)

        def named(message: str) -> str:
            return message if source == path else message.replace(source, path)

        cmd = [
            sys.executable,
            _MESHER,
            source,
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
                f"{': ' + named(tail[0]) if tail else ''})"
            ) from None
        if "error" in result:
            raise SourceError(named(str(result["error"])))
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
        tolerance = 0.02 if raw is None else float(_number(raw))
    except (TypeError, ValueError):
        tolerance = float("nan")
    if not 0 < tolerance <= 1:  # NaN fails too
        raise InvalidInputError(
            f"adapter option cad_tolerance {raw!r}: a fraction of the part's diagonal above 0 "
            "and at most 1"
        )
    mesh = str(options.get("cad_mesh") or "surface")
    if mesh not in ("surface", "volume"):
        raise InvalidInputError(f"adapter option cad_mesh {mesh!r}: 'surface' or 'volume'")
    return tolerance, mesh == "volume"


def _number(raw: Any) -> Any:
    """``raw`` unless it is a bool (``float(True)`` is 1.0, no number anyone meant)."""
    if isinstance(raw, bool):
        raise TypeError("a bool")
    return raw


def _timeout_s(options: Mapping[str, Any]) -> float:
    """``cad_timeout_s``, checked: a finite number of seconds above 0 (default 900).

    0 does not mean "no limit" (it is an error, like a negative number, NaN or
    infinity): a part that may take hours gets a large number instead.
    """
    raw = options.get("cad_timeout_s")
    if raw is None:
        return DEFAULT_TIMEOUT_S
    try:
        timeout = float(_number(raw))
    except (TypeError, ValueError):
        timeout = float("nan")
    if not 0 < timeout < float("inf"):  # NaN fails too
        raise InvalidInputError(
            f"adapter option cad_timeout_s {raw!r}: a finite number of seconds above 0 that "
            "one part may take to import and mesh"
        )
    return timeout


class CadAdapter:
    """CAD parts through gmsh/OpenCASCADE, each meshed in its own process."""

    name = "cad"
    version = "1"
    fresh_arrays = True  # every array it yields is its sample's own (docs/adapters.md)
    libraries = ("gmsh",)
    extensions = _EXTS
    options = frozenset({"cad_tolerance", "cad_mesh", "cad_timeout_s"})
    stores_source = True

    def can_read(self, path: str, head: bytes) -> bool:
        """STEP by its ``ISO-10303-21`` header or extension; IGES and BREP by extension."""
        return head.startswith(b"ISO-10303-21") or path.lower().endswith(_EXTS)

    @staticmethod
    def check_options(options: Mapping[str, Any]) -> None:
        """Refuse a bad ``cad_tolerance``, ``cad_mesh`` or ``cad_timeout_s`` value.

        Called by ingest before anything is read, so a bad value fails the ingest once
        (``InvalidInputError``) instead of every CAD file, one by one.
        """
        _mesh_options(options)
        _timeout_s(options)

    def iter_samples(self, path: str, key: str, options: Mapping[str, Any]) -> Iterator[Sample]:
        """The part's one sample."""
        tolerance, want_volume = _mesh_options(options)
        timeout_s = _timeout_s(options)
        source_hash = str(options.get("source_hash") or hash_file(path)[0])
        _check_gmsh()
        fields = mesh_isolated(
            path, tolerance, want_volume, timeout_s=timeout_s, tmp_dir=options.get("tmp_dir")
        )
        fields["source_object"] = source_hash
        fields["source_name"] = os.path.basename(path)
        yield Sample(key, fields)
