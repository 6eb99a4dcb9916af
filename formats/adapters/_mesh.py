"""The ``mesh`` adapter (meshio): VTK/VTU, ParaView .pvd series, Gmsh .msh, OBJ, PLY, STL, XDMF.

A mesh becomes the fields ``points`` (N x 3, or N x 2 for planar formats),
``cells/<type>`` (connectivity, int64, every block of that type concatenated; a type
whose blocks have different numbers of nodes, such as polygons of several sizes, gives
one field per size: ``cells/polygon5``, ``cells/polygon6``), ``point_data/<name>`` and
``cell_data/<name>`` (rows follow the cells fields in sorted type order, then size, each
field's blocks in file order), ``cell_sets/<name>`` (rows of the cells in that order) and
``point_sets/<name>`` (indices into the points), plus a ``metadata`` JSON field with the
cell field names (``cell_types``) and counts and the file's field data. A cell index
outside the points, or a fractional one, is a ``SourceError`` naming the file and its
``cells/<type>`` field; so is what meshio would drop (the cells of all but the last piece
of a VTU, OBJ elements other than faces). A .pvd collection or a
temporal XDMF file yields one sample per time step (``<key>/t0003``) with the step's time
as the parameter ``time``; a .pvd's steps are ordered by timestep (stable: data sets of
equal time keep their file order), and the files a .pvd or .xdmf references are its
companions and are not ingested on their own. meshio reads a file whole: a mesh sits in
memory while it is ingested (meshes are bounded by their own size, not by any time axis).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import threading
import warnings
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from simstore.errors import SourceError
from simstore.sample import Sample

from ._tree import json_safe, native_dtype

__all__ = ["MeshAdapter"]

_EXTS = (".vtk", ".vtu", ".pvd", ".msh", ".obj", ".ply", ".stl", ".xdmf", ".xmf")
"""Extensions meshio reads (5.3: no ``.vtp``; VTK PolyData is not among its formats)."""


def _meshio() -> Any:
    try:
        import meshio
    except ImportError as exc:
        raise ImportError("the mesh adapter needs meshio: pip install 'simstore[mesh]'") from exc
    return meshio


_OUTPUT_LOCK = threading.Lock()
"""Held while :func:`_quietly` has ``sys.stdout``/``sys.stderr`` swapped: the swap is the
whole process's, and two threads swapping at once (a dask worker with several threads)
would leave one of them restoring the other's buffer for good."""


def _reason(printed: str, banner: str) -> str:
    """The first meaningful line of what meshio printed while it failed.

    meshio ``print``s each reader's ``ReadError`` to stdout (``Expected ply``), then
    writes a ``Couldn't read file ... as ply`` banner to stderr with rich, wrapped at
    the console's width, and calls ``sys.exit``. The reader's line says why; the banner
    (its lines joined) is the fallback when a reader's error was empty.
    """
    for line in printed.splitlines():
        if line.strip():
            return line.strip()
    text = " ".join(banner.split()).removeprefix("Error: ")
    # the banner repeats the path our message starts with: keep the formats tried
    text = re.sub(r"^Couldn't read file .* as (.+)$", r"meshio could not read it as \1", text)
    return text or "the reader gave up on this file"


def _quietly(fn: Any, *args: Any) -> Any:
    """Call a meshio reader with what it prints captured, and every failure an exception.

    On bad input meshio prints to stdout and (through rich) to stderr, then calls
    ``sys.exit``: left alone, that put text before ``ingest --json``'s JSON on stdout
    and extra lines on stderr, and lost the reason. Its output is redirected at the
    Python level (rich writes to ``sys.stderr`` as it is when it prints), and the first
    meaningful line of it becomes the error's message. Its warnings are noise. Each
    ingest worker is a process; threads of one process take turns (``_OUTPUT_LOCK``).
    """
    out, err = io.StringIO(), io.StringIO()
    with _OUTPUT_LOCK, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                result = fn(*args)
        except SystemExit as exc:
            raise ValueError(_reason(out.getvalue(), err.getvalue())) from exc
        except Exception as exc:
            if str(exc).strip():
                raise
            # an empty ReadError(): what the reader printed is the only reason
            raise ValueError(_reason(out.getvalue(), err.getvalue())) from exc
    # meshio's Gmsh readers warn, and return what they read so far, when a section has
    # no closing line: a file cut short then lost its cells or data without an error
    unclosed = _UNCLOSED.search(" ".join(err.getvalue().split()))
    if unclosed:
        raise ValueError(f"{unclosed.group(0)} (cut short or malformed)")
    return result


_UNCLOSED = re.compile(r"\$\w+ not closed by \$End\w+")


def _native(arr: Any) -> np.ndarray:
    """Contiguous, native byte order (legacy VTK files are big-endian)."""
    out = np.ascontiguousarray(arr)
    return out.astype(native_dtype(out.dtype), copy=False)


def _connectivity(path: str, block: Any) -> np.ndarray:
    """A block's connectivity as int64; a fractional or non-finite index is an error.

    A file may store connectivity as floats (a VTU ``Float64`` array): a cast alone would
    truncate ``2.9`` to node 2, so each value must be a whole number.
    """
    try:
        raw = np.asarray(block.data)
    except ValueError as exc:
        # a polyhedron block (meshio: one list of faces per cell) whose faces differ in
        # size is ragged: no cells x nodes array, as with faces of one size below
        raise SourceError(
            f"{path}: field 'cells/{block.type}': connectivity is not cells x nodes "
            f"(cells of faces of different sizes): {' '.join(str(exc).split())}"
        ) from exc
    if raw.dtype.kind == "f":
        with np.errstate(invalid="ignore"):
            whole = np.isfinite(raw) & (raw == np.trunc(raw)) & (np.abs(raw) < 2.0**53)
        if not whole.all():
            raise SourceError(
                f"{path}: field 'cells/{block.type}': not integer connectivity: value "
                f"{float(raw[~whole].flat[0])!r} is no node index"
            )
    elif raw.dtype.kind not in "iub":
        try:
            return np.asarray(block.data, dtype=np.int64)
        except (TypeError, ValueError) as exc:
            raise SourceError(
                f"{path}: field 'cells/{block.type}': not integer connectivity: {exc}"
            ) from exc
    return raw.astype(np.int64)


def _cell_blocks(
    path: str, cells: Sequence[Any], n_points: int
) -> list[tuple[int, str, np.ndarray]]:
    """``(index in cells, field suffix, connectivity)`` of each block, in stored order.

    A type whose blocks all have one width (nodes per cell) keeps its name (``triangle``);
    a type whose blocks differ in width (meshio splits polygons of different sizes into
    blocks of one size each) gets one name per width (``polygon5``, ``polygon6``). Blocks
    are ordered by type, then width, then file order: the order of ``cell_data`` rows.
    Every index must point at a point (checked by each block's minimum and maximum).
    """
    blocks: list[tuple[str, int, np.ndarray]] = []
    for block in cells:
        data = _connectivity(path, block)
        if data.ndim != 2:
            raise SourceError(
                f"{path}: field 'cells/{block.type}': connectivity of shape {data.shape}, "
                "not cells x nodes"
            )
        _check_range(path, f"cells/{block.type}", data, n_points, "points")
        blocks.append((str(block.type), data.shape[1], data))
    widths: dict[str, set[int]] = {}
    for ctype, width, _ in blocks:
        widths.setdefault(ctype, set()).add(width)
    split = {t for t, w in widths.items() if len(w) > 1}
    order = sorted(
        range(len(blocks)),
        key=lambda i: (blocks[i][0], blocks[i][1] if blocks[i][0] in split else 0, i),
    )
    out = []
    for i in order:
        ctype, width, data = blocks[i]
        name = f"{ctype}{width}" if ctype in split else ctype
        if ctype in split and name in widths:
            raise SourceError(
                f"{path}: field 'cells/{name}': {ctype} blocks of {width} nodes would take "
                f"the name of the file's own {name} cells"
            )
        out.append((i, name, data))
    return out


def mesh_fields(
    path: str,
    points: np.ndarray,
    cells: Sequence[Any],
    point_data: Mapping[str, Any],
    cell_data: Mapping[str, Sequence[Any]],
    field_data: Mapping[str, Any] | None = None,
    cell_sets: Mapping[str, Sequence[Any]] | None = None,
    point_sets: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Sample fields of one mesh (see the module docstring for the layout)."""
    points = _native(points)
    if points.ndim != 2 or points.shape[0] == 0:
        raise SourceError(f"{path}: field 'points': mesh has no points (malformed or empty file)")
    n_points = points.shape[0]
    blocks = _cell_blocks(path, cells, n_points)
    order = [i for i, _, _ in blocks]  # cell_data rows follow the cells in this order
    by_type: dict[str, list[np.ndarray]] = {}
    for _, name, data in blocks:
        by_type.setdefault(name, []).append(data)
    fields: dict[str, Any] = {"points": points}
    for ctype, arrays in by_type.items():
        fields[f"cells/{ctype}"] = np.ascontiguousarray(np.concatenate(arrays, axis=0))
    for name in sorted(point_data):
        arr = _native(point_data[name])
        if arr.shape[:1] != (n_points,):
            raise SourceError(
                f"{path}: field 'point_data/{name}': {arr.shape[0] if arr.ndim else 0} values "
                f"for {n_points} points"
            )
        fields[f"point_data/{name}"] = arr
    for name in sorted(cell_data):
        parts = cell_data[name]
        if len(parts) == 0:  # an OBJ point cloud: meshio gives obj:group_ids = []
            continue
        if len(parts) != len(cells):
            raise SourceError(
                f"{path}: field 'cell_data/{name}': {len(parts)} blocks for "
                f"{len(cells)} cell blocks"
            )
        for i in order:
            rows = np.shape(parts[i])[:1]
            if rows != (len(cells[i].data),):
                raise SourceError(
                    f"{path}: field 'cell_data/{name}': {rows[0] if rows else 0} values for "
                    f"{len(cells[i].data)} {cells[i].type} cells"
                )
        try:
            arr = np.concatenate([np.asarray(parts[i]) for i in order], axis=0)
        except (ValueError, IndexError) as exc:
            raise SourceError(
                f"{path}: field 'cell_data/{name}': blocks do not line up: {exc}"
            ) from exc
        fields[f"cell_data/{name}"] = _native(arr)
    sets = dict(cell_sets or {})
    # meshio keeps each Gmsh entity's bounding entities (signed entity tags, one list per
    # block) among the cell sets: they are no cells, so they go to the metadata
    bounding = sets.pop("gmsh:bounding_entities", None)
    for name in sorted(sets):
        fields[f"cell_sets/{name}"] = _cell_set(path, name, sets[name], cells, order)
    for name in sorted(point_sets or {}):
        idx = _indices(path, f"point_sets/{name}", (point_sets or {})[name], n_points, "points")
        fields[f"point_sets/{name}"] = idx
    for name, value in list(fields.items()):
        if isinstance(value, np.ndarray) and value.dtype.kind not in "biuf":
            raise SourceError(f"{path}: field {name!r}: unsupported dtype {value.dtype}")
    meta: dict[str, Any] = {
        "cell_types": sorted(by_type),
        "cell_counts": {t: int(sum(b.shape[0] for b in bl)) for t, bl in by_type.items()},
    }
    if field_data:
        meta["field_data"] = {k: json_safe(np.asarray(v)) for k, v in sorted(field_data.items())}
    if bounding is not None and len(bounding) == len(cells):
        # per cell block, in the order of the cell_data rows
        meta["gmsh:bounding_entities"] = [
            None if bounding[i] is None else json_safe(np.asarray(bounding[i])) for i in order
        ]
    fields["metadata"] = meta
    return fields


def _indices(path: str, field: str, values: Any, size: int, what: str) -> np.ndarray:
    """``values`` as int64 indices into ``size`` items; anything else names the field."""
    raw = np.asarray(values)
    if raw.size == 0:
        return np.zeros(0, dtype=np.int64)
    if raw.ndim != 1 or raw.dtype.kind not in "iu":
        raise SourceError(
            f"{path}: field {field!r}: not a list of indices ({raw.dtype}, shape {raw.shape})"
        )
    idx = raw.astype(np.int64)
    _check_range(path, field, idx, size, what)
    return idx


def _check_range(path: str, field: str, idx: np.ndarray, size: int, what: str) -> None:
    """Every index of ``idx`` points at one of ``size`` items, or the field is named."""
    if idx.size:
        low, high = int(idx.min()), int(idx.max())
        if low < 0 or high >= size:
            raise SourceError(
                f"{path}: field {field!r}: index {low if low < 0 else high} out of range for "
                f"{size} {what}"
            )


def _cell_set(
    path: str, name: str, parts: Sequence[Any], cells: Sequence[Any], order: Sequence[int]
) -> np.ndarray:
    """A cell set as rows of the cells in ``cell_data`` order (blocks in ``order``).

    meshio gives a set as one index array per cell block (None or empty where the set has
    no cells of that block); each becomes the block's rows in the order the cells fields
    and ``cell_data`` rows follow, so ``cell_data/<x>[cell_sets/<name>]`` are the set's.
    """
    field = f"cell_sets/{name}"
    if len(parts) != len(cells):
        raise SourceError(
            f"{path}: field {field!r}: {len(parts)} blocks for {len(cells)} cell blocks"
        )
    start: dict[int, int] = {}
    row = 0
    for i in order:
        start[i] = row
        row += len(cells[i].data)
    out = [
        _indices(path, field, parts[i], len(cells[i].data), f"{cells[i].type} cells") + start[i]
        for i in order
        if parts[i] is not None
    ]
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def _pvd_entries(path: str) -> list[tuple[str | None, str]]:
    """``(timestep as written, file path)`` of each ``DataSet`` of a .pvd, in file order."""
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError) as exc:
        raise SourceError(f"{path}: not a readable .pvd collection: {exc}") from exc
    return [
        (ds.get("timestep"), os.path.join(os.path.dirname(path), file))
        for ds in root.iter("DataSet")
        if (file := ds.get("file"))
    ]


def _pvd_datasets(path: str) -> list[tuple[float, str]]:
    """``(time, file path)`` of each data set, sorted by time.

    The sort is stable: data sets of equal time (the parts of one step) keep their file
    order. With no ``timestep`` anywhere, each data set's position in the file is its
    time. A timestep that is not a finite number, or a file where some data sets have a
    timestep and others none (a position could equal a real time and silently make a
    part of that step), is a :class:`SourceError` naming the file and the data set.
    """
    out: list[tuple[float, str]] = []
    entries = list(_pvd_entries(path))
    timed = [raw is not None for raw, _ in entries]
    if any(timed) and not all(timed):
        i = timed.index(False)
        raise SourceError(
            f"{path}: DataSet {i} ({os.path.basename(entries[i][1])}) has no timestep, "
            "while others have one: give every data set a timestep, or none"
        )
    for raw, file in entries:
        try:
            t = float(len(out) if raw is None else raw)
        except ValueError:
            t = float("nan")
        if not np.isfinite(t):
            raise SourceError(
                f"{path}: DataSet {len(out)} ({os.path.basename(file)}): timestep {raw!r} "
                "is not a finite number"
            )
        out.append((t, file))
    return sorted(out, key=lambda d: d[0])


def _xdmf_is_temporal(path: str) -> bool:
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError):
        return False
    return any(g.get("CollectionType") == "Temporal" for g in root.iter("Grid"))


def _xdmf_heavy_files(path: str) -> list[str]:
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError):
        return []
    out = set()
    for item in root.iter("DataItem"):
        if (item.get("Format") or "").upper() == "HDF" and item.text and ":" in item.text:
            out.add(os.path.join(os.path.dirname(path), item.text.strip().split(":", 1)[0]))
    return sorted(out)


_OBJ_IGNORED = (b"l", b"p", b"curv", b"curv2", b"surf")
"""OBJ element statements meshio skips (it reads vertices and faces): lines, points,
free-form curves and surfaces. A file with any of them is refused rather than stored
without them."""


def _check_obj_elements(path: str) -> None:
    """Refuse an OBJ file whose elements meshio would drop, naming the first one."""
    try:
        with open(path, "rb") as f:
            for number, line in enumerate(f, 1):
                word = line.split(None, 1)[:1]
                if word and word[0] in _OBJ_IGNORED:
                    kind = word[0].decode()
                    raise SourceError(
                        f"{path}: line {number}: OBJ {kind!r} elements are not read (meshio "
                        "reads faces only); remove them, or convert the file (to .vtu)"
                    )
    except OSError as exc:
        raise SourceError(f"{path}: not a readable mesh: {exc}") from exc


def _check_binary_stl(path: str) -> None:
    """Refuse a binary STL whose size is not what its triangle count says.

    meshio reads an STL as binary only when its size is exactly 84 + 50 x the count in
    its header, and as ASCII otherwise: a cut-short binary file then failed as text, with
    a message quoting its bytes. A file that starts with ``solid`` is taken to be ASCII,
    as meshio takes it.
    """
    try:
        with open(path, "rb") as f:
            head = f.read(84)
            size = os.fstat(f.fileno()).st_size
    except OSError as exc:
        raise SourceError(f"{path}: not a readable mesh: {exc}") from exc
    text = head[3:] if head.startswith(b"\xef\xbb\xbf") else head  # a UTF-8 BOM
    if len(head) == 0:
        return
    if text.lstrip()[:5].lower() == b"solid":
        if len(head) == 84 and 84 + 50 * int.from_bytes(head[80:84], "little") == size:
            return  # a binary STL whose header starts with "solid": meshio reads it so
        # an ASCII STL has no facet count: one cut short between facets read as a smaller
        # surface, so it must end as the format says, with its endsolid line
        with open(path, "rb") as f:
            f.seek(max(0, size - 4096))
            lines = f.read().rstrip().splitlines()
        if not lines or not lines[-1].lstrip().lower().startswith(b"endsolid"):
            raise SourceError(
                f"{path}: not a readable mesh: an ASCII STL ends with an endsolid line, "
                "this one does not (cut short or malformed)"
            )
        return
    if len(head) < 84:
        raise SourceError(
            f"{path}: not a readable mesh: a binary STL has an 84-byte header, this file "
            f"has {size} bytes"
        )
    count = int.from_bytes(head[80:84], "little")
    if 84 + 50 * count != size:
        raise SourceError(
            f"{path}: not a readable mesh: its binary STL header says {count} triangles "
            f"({84 + 50 * count} bytes), the file has {size} bytes (cut short or malformed)"
        )


_PLY_ELEMENT = re.compile(rb"element\s+(vertex|face)\s+(\d+)")


def _check_ply_header(path: str) -> dict[str, int] | None:
    """The ``vertex`` and ``face`` counts a PLY header declares; no ``end_header`` refused.

    meshio 5.3 reads the header with a loop that skips empty lines until it finds a
    significant one, and at the end of the file ``readline`` gives empty lines for ever:
    a file cut short in its header (``ply``, a newline, nothing more) hung the ingest.
    None for a file that does not start with ``ply`` (meshio says so: "Expected ply").
    """
    counts: dict[str, int] = {}
    try:
        with open(path, "rb") as f:
            head = f.read(_PLY_HEADER_MAX)
    except OSError as exc:
        raise SourceError(f"{path}: not a readable mesh: {exc}") from exc
    if not head.startswith(b"ply"):
        return None
    for line in head.splitlines():
        word = line.strip()
        if word == b"end_header":
            return counts
        m = _PLY_ELEMENT.fullmatch(word)
        if m:
            counts[m.group(1).decode()] = int(m.group(2))
    raise SourceError(
        f"{path}: not a readable mesh: its PLY header has no end_header line in its first "
        f"{_PLY_HEADER_MAX >> 20} MiB (cut short or malformed)"
    )


_PLY_HEADER_MAX = 1 << 20
"""The bytes a PLY header is looked for in (headers are lines of text, a few hundred bytes)."""


def _check_ply_counts(path: str, declared: Mapping[str, int], mesh: Any) -> None:
    """Refuse a PLY file of fewer vertices or faces than its header declares.

    meshio reads a binary PLY's body with ``f.read(n)``, which gives what is left of a
    file cut short: it then returned the vertices that were there and no faces.
    """
    got = {"vertex": len(mesh.points), "face": sum(len(b.data) for b in mesh.cells)}
    for element, count in declared.items():
        if got[element] != count:
            raise SourceError(
                f"{path}: not a readable mesh: its PLY header declares {count} "
                f"{element} elements, meshio read {got[element]} (cut short or malformed)"
            )


_PIECE = re.compile(rb"<Piece\b[^>]*?\bNumberOfCells\s*=\s*[\"'](\d+)[\"']")


def _check_vtu_pieces(path: str, cells_read: int) -> None:
    """Refuse a VTU of several pieces whose cells meshio did not all read.

    meshio 5.3 reads every ``<Piece>``'s points and point data but keeps the cells (and
    cell data) of the last piece only. The pieces' declared ``NumberOfCells`` (in the XML
    before any appended binary data) must add up to the cells read.
    """
    declared: list[int] = []
    seen = 0  # file offset up to which matches are taken
    carry, offset = b"", 0  # the last bytes of the previous block, and where they start
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            text = carry + block
            end = text.find(b"<AppendedData")
            body = text if end < 0 else text[:end]
            for m in _PIECE.finditer(body):
                if offset + m.start() >= seen:  # not already taken from the overlap
                    declared.append(int(m.group(1)))
                    seen = offset + m.end()
            if end >= 0:
                break
            # a tag cut by the block's end is found whole in the next, with these bytes
            keep = min(len(text), 4096)
            carry, offset = text[-keep:], offset + len(text) - keep
    if len(declared) > 1 and sum(declared) != cells_read:
        raise SourceError(
            f"{path}: {len(declared)} pieces declare {sum(declared)} cells, of which meshio "
            f"reads {cells_read} (the last piece's); write one piece per file (a .pvd "
            "lists them as the parts of a step)"
        )


class MeshAdapter:
    """Meshes meshio reads, recognised by extension."""

    name = "mesh"
    version = "2"
    fresh_arrays = True  # every array it yields is its sample's own (docs/adapters.md)
    libraries = ("meshio",)
    extensions = _EXTS
    options: frozenset[str] = frozenset()

    def can_read(self, path: str, head: bytes) -> bool:
        """Mesh files by extension."""
        return path.lower().endswith(_EXTS)

    def companions(self, path: str) -> list[str]:
        """Files a .pvd or .xdmf references (ingested as part of it, never alone)."""
        low = path.lower()
        if low.endswith(".pvd"):
            # the files alone: a bad timestep is the .pvd's own error, its steps are still its;
            # and what its XDMF steps reference in turn (their HDF5 data), which it reads too
            out = []
            for _, f in _pvd_entries(path):
                out.append(os.path.normpath(f))
                if f.lower().endswith((".xdmf", ".xmf")):
                    out.extend(os.path.normpath(h) for h in _xdmf_heavy_files(f))
            return out
        if low.endswith((".xdmf", ".xmf")):
            return [os.path.normpath(f) for f in _xdmf_heavy_files(path)]
        return []

    def iter_samples(self, path: str, key: str, options: Mapping[str, Any]) -> Iterator[Sample]:
        """One sample per mesh, or one per time step of a series."""
        meshio = _meshio()
        low = path.lower()
        if low.endswith(".pvd"):
            datasets = _pvd_datasets(path)
            if not datasets:
                raise SourceError(f"{path}: .pvd collection lists no data sets")
            # a time step may have several parts (a partitioned mesh): one sample per part,
            # keyed t<step>/p<part> with a ``part`` field; one part per step keeps t<step>
            steps: dict[float, list[str]] = {}
            for t, file in datasets:
                steps.setdefault(t, []).append(file)
            width = max(4, len(str(len(steps) - 1)))
            parted = any(len(files) > 1 for files in steps.values())
            for i, (t, files) in enumerate(steps.items()):
                for j, file in enumerate(files):
                    try:
                        mesh = self._read(meshio, file)
                        fields = self._fields(file, mesh)
                    except SourceError as exc:
                        # the collection is the file the caller named: the error says so
                        raise SourceError(f"{path}: data set {exc}") from exc
                    fields["time"] = float(t)
                    if parted:
                        fields["part"] = j
                    step_key = f"{key}/t{i:0{width}d}"
                    yield Sample(f"{step_key}/p{j:04d}" if parted else step_key, fields)
            return
        if low.endswith((".xdmf", ".xmf")) and _xdmf_is_temporal(path):
            try:
                reader = _quietly(meshio.xdmf.TimeSeriesReader, path)
                points, cells = _quietly(reader.read_points_cells)
                n = reader.num_steps
            except Exception as exc:  # meshio raises many kinds on bad XML or data
                raise SourceError(f"{path}: not a readable XDMF time series: {exc}") from exc
            width = max(4, len(str(n - 1)))
            for k in range(n):
                try:
                    t, pdata, cdata = _quietly(reader.read_data, k)
                except Exception as exc:
                    raise SourceError(f"{path}: time step {k} is unreadable: {exc}") from exc
                fields = mesh_fields(path, points, cells, pdata, cdata)
                fields["time"] = float(t)
                yield Sample(f"{key}/t{k:0{width}d}", fields)
            return
        mesh = self._read(meshio, path)
        yield Sample(key, self._fields(path, mesh))

    def _read(self, meshio: Any, path: str) -> Any:
        low = path.lower()
        if low.endswith(".obj"):
            _check_obj_elements(path)
        elif low.endswith(".stl"):
            _check_binary_stl(path)
        ply_counts = (
            _check_ply_header(path)
            if low.endswith(".ply") and os.path.isfile(path) and os.path.getsize(path) > 0
            else None
        )
        try:
            if os.path.getsize(path) == 0:  # meshio's readers say nothing useful of it
                raise ValueError("the file is empty")
            mesh = _quietly(meshio.read, path)
        except Exception as exc:  # meshio raises ReadError, ValueError, KeyError, ...
            # one line: numpy's loadtxt errors (an ASCII PLY cut short) span several
            raise SourceError(f"{path}: not a readable mesh: {' '.join(str(exc).split())}") from exc
        if ply_counts is not None:
            _check_ply_counts(path, ply_counts, mesh)
        if low.endswith(".vtu"):
            _check_vtu_pieces(path, sum(len(block.data) for block in mesh.cells))
        return mesh

    def _fields(self, path: str, mesh: Any) -> dict[str, Any]:
        return mesh_fields(
            path, mesh.points, mesh.cells, mesh.point_data, mesh.cell_data, mesh.field_data,
            mesh.cell_sets, mesh.point_sets,
        )
