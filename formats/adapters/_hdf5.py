"""The ``hdf5`` adapter (h5py): a file is a simulation run.

Datasets become fields named by their path (``velocity``, ``group/pressure``); attributes
of the file, groups and datasets become parameters (``Re``, ``group/units``,
``velocity.units``). Big datasets are read in slices, never whole; ``time_window`` and
``stride`` cut time-dependent datasets into one sample per window (see ``_tree``).
Datasets stored without filters whose reads are runs of the file's bytes (contiguous
ones, and ones chunked by whole rows of their first axis whose chunks lie one after
another) are mapped, not read (:class:`_FileRows`); other unfiltered chunked ones are
read with no chunk cache (straight into the result); compressed ones keep HDF5's chunk
cache.
String datasets become string parameters (scalar) or metadata lists. A dataset with a
null dataspace (``h5py.Empty``) is refused with an error naming it.

Every link path that leads to a dataset is a field: a second hard link or a soft link to
a dataset is a second field with the same values, so adding an alias never renames a
field. A dangling soft link, a link that leads back into a group that contains it (a
cycle), and an external link (to another file, not followed) are errors naming the link;
so are, naming the field, a virtual dataset and one with external raw storage (their
values live in other files), and a variable-length numeric dataset.
Object references become the referenced objects' paths (``/velocity``; a null reference
``""``); region references are refused. Byte strings that are not UTF-8 keep their exact
bytes (see ``_tree.json_safe``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from simstore.errors import SourceError
from simstore.sample import FieldValue, Sample

from ._limits import check_whole_value
from ._numpy import FileArray
from ._tree import (
    TIME_OPTIONS,
    ArrayEntry,
    SlicedArray,
    attribute_fields,
    check_time_options,
    json_safe,
    put_value,
    read_strings,
    text_or_bytes,
    tree_sample_count,
    tree_samples,
)

__all__ = ["HDF5_MAGIC", "HDF5Adapter"]

HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"

_MAX_LINK_PATHS = 1_000_000
"""Link paths one file may have: aliases of groups multiply paths (30 nested groups of
two hard links each would make 2^30), so a file past this is refused, not walked."""


def _h5py() -> Any:
    try:
        import h5py
    except ImportError as exc:
        raise ImportError("the hdf5 adapter needs h5py: pip install 'simstore[hdf5]'") from exc
    return h5py


def _uncached(h5py: Any, f: Any, name: str) -> Any:
    """Dataset ``name`` of ``f`` opened again with no chunk cache.

    For chunks stored unfiltered the cache only adds a copy: without it HDF5 reads a
    selection's bytes straight into the result (a 768 MiB run chunked by time step read
    in windows of four: 0.16 s against 0.23 s). The caller has closed its own handle of
    the dataset (HDF5 hands an open dataset's existing handle to a second open, with
    the first one's cache).
    """
    dapl = h5py.h5p.create(h5py.h5p.DATASET_ACCESS)
    dapl.set_chunk_cache(0, 0, 1.0)
    return h5py.Dataset(h5py.h5d.open(f.id, name.encode(), dapl))


class HDF5Adapter:
    """HDF5 files (``.h5``, ``.hdf5``, ``.hdf``, ``.he5`` or the HDF5 signature)."""

    name = "hdf5"
    version = "2"
    fresh_arrays = True  # every array it yields is its sample's own (docs/adapters.md)
    libraries = ("h5py",)
    extensions = (".h5", ".hdf5", ".hdf", ".he5")
    options = TIME_OPTIONS
    check_options = staticmethod(check_time_options)

    def can_read(self, path: str, head: bytes) -> bool:
        """HDF5 by extension or by the 8-byte HDF5 signature."""
        return head.startswith(HDF5_MAGIC) or path.lower().endswith(self.extensions)

    supports_sample_ranges = True
    """Time windows of a run can be read in ranges, so ingest cuts a large file into
    pieces that run on several workers (see ``simstore.ingest.SupportsSampleRanges``)."""

    def count_samples(self, path: str, options: Mapping[str, Any]) -> int:
        """How many samples :meth:`iter_samples` yields: 1, or the number of windows."""
        with self._open(path) as f:
            entries, _, _ = self._tree(f, path)
            return tree_sample_count(path, entries, options)

    def iter_samples(self, path: str, key: str, options: Mapping[str, Any]) -> Iterator[Sample]:
        """One sample per file, or one per time window (``sample_range``: some of them)."""
        with self._open(path) as f:
            entries, params, metadata = self._tree(f, path)
            yield from tree_samples(path, key, entries, params, metadata, options)

    @staticmethod
    def _open(path: str) -> Any:
        h5py = _h5py()
        try:
            return h5py.File(path, "r")
        except (OSError, ValueError) as exc:
            raise SourceError(f"{path}: not a readable HDF5 file: {exc}") from exc

    @staticmethod
    def _tree(f: Any, path: str) -> tuple[list[ArrayEntry], dict[str, FieldValue], dict[str, Any]]:
        """The file's arrays, parameters and metadata."""
        h5py = _h5py()
        entries: list[ArrayEntry] = []
        params: dict[str, FieldValue] = {}
        metadata: dict[str, Any] = {}
        try:
            attribute_fields("", _attributes(h5py, f, f, "", path), params, metadata, path=path)
            for name in _link_paths(h5py, f, path):
                obj = f[name]
                is_array = isinstance(obj, h5py.Dataset)
                attribute_fields(
                    name,
                    _attributes(h5py, f, obj, name, path),
                    params,
                    metadata,
                    is_array=is_array,
                    path=path,
                )
                if not isinstance(obj, h5py.Dataset):
                    continue
                if obj.shape is None:
                    # a null dataspace (h5py.Empty): valid HDF5 that holds no values, not
                    # even an empty array. Dropping it would lose a field without a word,
                    # and no value stands for it, so the file is refused (see
                    # docs/adapters.md)
                    raise SourceError(
                        f"{path}: field {name!r}: the dataset has a null dataspace "
                        "(h5py.Empty: no shape and no values), which no field can hold"
                    )
                _check_storage(obj, name, path)
                dtype = obj.dtype
                if h5py.check_ref_dtype(dtype) is not None:
                    check_whole_value(path, name, obj.size * dtype.itemsize)
                    refs = _references(h5py, f, obj[()], name, path)
                    put_value(path, name, refs, params, metadata)
                    continue
                is_string = h5py.check_string_dtype(dtype) is not None
                if _vlen_of_non_strings(h5py, dtype):
                    # as the NetCDF adapter does: a list per element has no array form,
                    # and as JSON it would lose its dtype and have NaN as a string
                    raise SourceError(
                        f"{path}: field {name!r}: unsupported HDF5 type (variable-length "
                        f"{np.dtype(h5py.check_vlen_dtype(dtype))}): only fixed-size "
                        "numeric, bool and string datasets are read"
                    )
                if is_string or dtype.kind in "SUO":
                    vlen = dtype.kind == "O"
                    value = read_strings(obj, path, name, vlen=vlen)
                    if value.ndim == 0:
                        value = value.item()
                    if isinstance(value, bytes | np.bytes_):
                        put_value(path, name, text_or_bytes(bytes(value)), params, metadata)
                    elif isinstance(value, str | np.str_):
                        put_value(path, name, str(value), params, metadata)
                    else:
                        put_value(path, name, json_safe(np.asarray(value)), params, metadata)
                    continue
                if dtype.kind not in "biuf":
                    raise SourceError(
                        f"{path}: field {name!r}: unsupported HDF5 dtype {dtype} "
                        "(numeric, bool and string datasets are read)"
                    )
                chunks = None
                if obj.chunks is not None and not obj.id.get_create_plist().get_nfilters():
                    del obj
                    obj = _uncached(h5py, f, name)
                elif obj.chunks is not None:
                    chunks = obj.chunks  # filtered: a read decodes whole chunks
                entries.append(
                    ArrayEntry(
                        name,
                        SlicedArray(
                            obj, path=path, field=name, chunks=chunks,
                            mapper=_FileRows.of(h5py, f, obj, path),
                        ),
                    )
                )
        except SourceError:
            raise
        except (OSError, RuntimeError, KeyError, ValueError) as exc:
            raise SourceError(f"{path}: corrupt HDF5 structure: {exc}") from exc
        return entries, params, metadata


MAP_MIN_BYTES = 1 << 20
"""Reads of at least this many bytes are mapped where the file allows (smaller ones cost
less read than mapped)."""


class _FileRows:
    """Reads of an unfiltered dataset mapped from its file, where its bytes allow.

    HDF5 stores an unfiltered dataset's values as they are in memory: a contiguous one in
    one run of the file, a chunked one chunk by chunk. A read of whole rows of the first
    axis (every value of the other axes: what ingest reads, time steps or the whole
    field) is then one run of the file's bytes when the dataset is contiguous, or chunked
    by whole rows with the chunks it spans one after another in the file (as HDF5
    allocates them when a dataset is written in order). Such a read is a read-only
    mapping of the file's pages (``FileArray.mapped``), not a copy into memory: 768 MiB
    of a run chunked by time step, ingested into Zarr, cost the HDF5 read ~0.19 CPU-s
    as copies. Any other read (a box of part of a row, chunks apart or not yet written,
    a small read) returns None and goes the usual way. Offsets are HDF5's, absolute in
    the file (a user block included).
    """

    def __init__(self, dsid: Any, path: str, shape: tuple[int, ...], dtype: np.dtype[Any],
                 offset: int | None, rows_per_chunk: int) -> None:
        self._dsid = dsid
        self._path = path
        self._shape = shape
        self._dtype = dtype
        self._offset = offset  # contiguous: where the values start; chunked: None
        self._k = rows_per_chunk
        self._row_bytes = math.prod(shape[1:]) * dtype.itemsize

    @classmethod
    def of(cls, h5py: Any, f: Any, obj: Any, path: str) -> _FileRows | None:
        """The mapper of dataset ``obj`` of file ``f``, or None where its bytes are not plain."""
        try:
            dtype = np.dtype(obj.dtype)
            shape = tuple(int(n) for n in obj.shape)
            plist = obj.id.get_create_plist()
            if (
                dtype.kind not in "iuf"
                or not dtype.isnative
                # the stored type must be the memory type bit for bit: a 12-bit int16
                # (H5Tset_precision) needs HDF5's sign extension, not its raw bytes
                or not obj.id.get_type().equal(h5py.h5t.py_create(dtype))
                or not shape
                or plist.get_nfilters()
                or plist.get_external_count()
                or f.id.get_access_plist().get_driver() != h5py.h5fd.SEC2
            ):
                return None
            layout = plist.get_layout()
            if layout == h5py.h5d.CONTIGUOUS:
                offset = obj.id.get_offset()
                return None if offset is None else cls(obj.id, path, shape, dtype, offset, 0)
            chunks = obj.chunks
            if layout != h5py.h5d.CHUNKED or chunks is None:
                return None
            if tuple(int(c) for c in chunks[1:]) != shape[1:]:
                return None  # a chunk is not whole rows: its rows are not one run
            return cls(obj.id, path, shape, dtype, None, int(chunks[0]))
        except (AttributeError, OSError, RuntimeError, ValueError, TypeError):
            return None  # an h5py or HDF5 without these calls: read as before

    def __call__(self, box: Any) -> np.ndarray | None:
        """The values of ``box`` (slices over the whole dataset) mapped, or None."""
        if not isinstance(box, tuple) or len(box) != len(self._shape):
            return None
        bounds = [p.indices(n)[:2] for p, n in zip(box, self._shape, strict=True)]
        if any(b != (0, n) for b, n in zip(bounds[1:], self._shape[1:], strict=True)):
            return None
        t0, t1 = bounds[0]
        size = (t1 - t0) * self._row_bytes
        if t1 <= t0 or size < MAP_MIN_BYTES:
            return None
        start = self._start(t0, t1)
        if start is None:
            return None
        return FileArray(self._path, start, (t1 - t0, *self._shape[1:]), self._dtype,
                         False).mapped()

    def _start(self, t0: int, t1: int) -> int | None:
        """Where row ``t0`` starts in the file when rows ``t0`` to ``t1`` are one run."""
        if self._offset is not None:
            return self._offset + t0 * self._row_bytes
        k = self._k
        chunk_bytes = k * self._row_bytes
        first = None
        for c in range(t0 // k, (t1 - 1) // k + 1):
            info = self._dsid.get_chunk_info_by_coord((c * k,) + (0,) * (len(self._shape) - 1))
            if info.byte_offset is None or info.size != chunk_bytes:
                return None  # not written yet (fill values), or not stored plainly
            if first is None:
                first = info.byte_offset - (c * k) * self._row_bytes
            elif info.byte_offset != first + c * chunk_bytes:
                return None  # chunks apart in the file
        return None if first is None else first + t0 * self._row_bytes


def _check_storage(obj: Any, name: str, path: str) -> None:
    """Refuse a dataset whose values live in other files (virtual or external storage).

    Like an external link, such a dataset reads files that are not the source: they may
    be elsewhere, change on their own or be ingested twice, and HDF5 reads a missing
    virtual source as fill values without an error.
    """
    if obj.is_virtual:
        try:
            files = sorted({str(m.file_name) for m in obj.virtual_sources()})
        except (OSError, RuntimeError, ValueError):
            files = []
        raise SourceError(
            f"{path}: field {name!r}: a virtual dataset (values mapped from "
            f"{', '.join(map(repr, files)) or 'other datasets'}): virtual datasets are not "
            "read; ingest the source files, or copy the values in"
        )
    if obj.external:
        files = sorted({str(e[0]) for e in obj.external})
        raise SourceError(
            f"{path}: field {name!r}: raw values stored in external file(s) "
            f"{', '.join(map(repr, files))}: external storage is not read; copy the "
            "values into the file"
        )
    _check_filters(obj, name, path)


def _check_filters(obj: Any, name: str, path: str) -> None:
    """Refuse a dataset compressed by a filter this HDF5 cannot load, naming the filter.

    HDF5 looks for such a filter (Blosc, Zstandard, LZ4, bitshuffle: ``hdf5plugin``) only
    when a chunk is read, and its error names the plugin folder it searched, not the
    filter.
    """
    import h5py

    plist = obj.id.get_create_plist()
    for i in range(plist.get_nfilters()):
        code, _flags, _values, label = plist.get_filter(i)
        if not h5py.h5z.filter_avail(code):
            shown = label.decode("latin-1") if isinstance(label, bytes) and label else ""
            raise SourceError(
                f"{path}: field {name!r}: compressed with HDF5 filter {code}"
                f"{f' ({shown})' if shown else ''}, which is not available here "
                "(`pip install hdf5plugin` provides the common ones)"
            )


def _link_paths(h5py: Any, f: Any, path: str) -> list[str]:
    """Every link path below the root, sorted (each one opens with ``f[path]``).

    Hard and soft links are followed, so an object with several names appears once per
    name (h5py's ``visit`` and ``visit_links`` give each object, or each group's links,
    once, and skip soft links). A dangling soft link, a link back into a group that
    contains it, and an external link are errors naming the link. No dataset stays open
    (see ``_uncached``).
    """
    out: list[str] = []

    # depth first with a stack of its own: a file may nest groups deeper than Python's
    # recursion limit
    pending: list[tuple[Any, str, tuple[Any, ...]]] = [(f, "", (f,))]
    while pending:
        group, prefix, above = pending.pop()
        for link_name in sorted(_text_name(path, n, f"a link in {prefix or '/'}")
                                for n in group.keys()):
            where = f"{prefix}/{link_name}" if prefix else link_name
            link = group.get(link_name, getlink=True)
            if isinstance(link, h5py.ExternalLink):
                raise SourceError(
                    f"{path}: link {where!r}: an external link to {link.path!r} in file "
                    f"{link.filename!r}: external links are not followed; ingest the "
                    "target file"
                )
            if isinstance(link, h5py.SoftLink):
                obj = group.get(link_name)
                if obj is None:
                    raise SourceError(
                        f"{path}: link {where!r}: a dangling soft link to {link.path!r} "
                        "(no such object)"
                    )
                how = f"a soft link to {link.path!r}"
            elif isinstance(link, h5py.HardLink):
                obj = group.get(link_name)
                how = "a hard link"
            else:
                raise SourceError(f"{path}: link {where!r}: an unsupported kind of link ({link!r})")
            if isinstance(obj, h5py.Group) and any(obj.id == g.id for g in above):
                raise SourceError(
                    f"{path}: link {where!r}: {how} makes a cycle (it leads back to a "
                    "group that contains it)"
                )
            out.append(where)
            if len(out) > _MAX_LINK_PATHS:
                raise SourceError(
                    f"{path}: more than {_MAX_LINK_PATHS} link paths (groups linked under "
                    "many names multiply them)"
                )
            if isinstance(obj, h5py.Group):
                pending.append((obj, where, (*above, obj)))
            del obj
    out.sort()
    return out


def _text_name(path: str, name: object, what: str) -> str:
    """An HDF5 link or attribute name as text; one that is not UTF-8 is refused.

    HDF5 keeps names as bytes; h5py hands one that is not UTF-8 back as ``bytes``, which
    became a field named after its Python repr, or failed the ingest with a traceback.
    """
    if isinstance(name, str):
        return name
    shown = bytes(name).decode("utf-8", "backslashreplace")  # type: ignore[call-overload]
    raise SourceError(
        f"{path}: {what}: the name {shown!r} is not UTF-8 text; rename it in the file"
    )


def _attributes(h5py: Any, f: Any, obj: Any, name: str, path: str) -> dict[str, Any]:
    """An object's attributes, object references as the referenced objects' paths."""
    out: dict[str, Any] = {}
    for attr in obj.attrs:
        attr = _text_name(path, attr, f"an attribute of {name or '/'}")
        value = obj.attrs[attr]
        dtype = obj.attrs.get_id(attr).dtype
        field = f"{name}{'.' if isinstance(obj, h5py.Dataset) else '/'}{attr}" if name else attr
        if h5py.check_ref_dtype(dtype) is not None:
            value = _references(h5py, f, value, field, path)
        elif dtype.names or _vlen_of_non_strings(h5py, dtype):
            value = _nested(h5py, f, value, dtype, field, path)
        out[attr] = value
    return out


def _vlen_of_non_strings(h5py: Any, dtype: np.dtype[Any]) -> bool:
    """Whether ``dtype`` is variable-length of something other than strings.

    (By identity: ``np.dtype("f8") == None`` is true, NumPy reading None as float64.)
    """
    base = h5py.check_vlen_dtype(dtype)
    return base is not None and base is not str and base is not bytes


def _exact(dtype: np.dtype[Any]) -> bool:
    """Whether values of ``dtype`` have an exact JSON form (no complex, no float128)."""
    return dtype.kind in "biuSU" or (dtype.kind == "f" and dtype.itemsize <= 8)


def _nested(
    h5py: Any, f: Any, value: Any, dtype: np.dtype[Any], field: str, path: str
) -> Any:
    """A compound or variable-length attribute as JSON-ready values.

    A compound record becomes ``{member: value}`` (its member names kept), a
    variable-length list of references (``DIMENSION_LIST``, which names each axis's
    dimension scales) lists of the scales' paths. Values that have no exact JSON form
    (complex, extended precision) and variable-length numbers (ragged: a NaN among them
    would pass ``--nan error`` as a string) are refused, as they are as datasets.
    """

    def plain(v: Any) -> Any:
        if isinstance(v, h5py.Reference | h5py.RegionReference):
            return _references(h5py, f, v, field, path)
        if isinstance(v, np.void) and v.dtype.names:
            return {m: plain(v[m]) for m in v.dtype.names}
        if isinstance(v, np.ndarray):
            if v.dtype.names or v.dtype == object:
                return [plain(x) for x in v] if v.ndim else plain(v[()])
            if _exact(v.dtype):
                return v
        elif isinstance(v, bytes | str | bool | int | float):
            return v
        elif isinstance(v, np.generic) and _exact(v.dtype):
            return v
        raise SourceError(
            f"{path}: field {field!r}: an attribute value of type "
            f"{getattr(v, 'dtype', type(v).__name__)} has no exact form (complex, extended "
            "precision and variable-length numbers are not read)"
        )

    base = h5py.check_vlen_dtype(dtype)  # the attribute's declared type (values: objects)
    if _vlen_of_non_strings(h5py, dtype) and h5py.check_ref_dtype(base) is None:
        raise SourceError(
            f"{path}: field {field!r}: a variable-length attribute of {np.dtype(base)} "
            "(ragged numbers) is not read"
        )
    return plain(value)


def _references(h5py: Any, f: Any, value: Any, field: str, path: str) -> str | list[Any]:
    """Object references as the paths of the objects (``""`` for a null reference).

    A scalar gives one string, an array a nested list. Region references (a selection of
    a dataset) have no such form and are refused.
    """
    arr = np.asarray(value, dtype=object)

    def one(ref: Any) -> str:
        if isinstance(ref, h5py.RegionReference):
            raise SourceError(f"{path}: field {field!r}: HDF5 region references are not supported")
        if not isinstance(ref, h5py.Reference):
            raise SourceError(f"{path}: field {field!r}: not an HDF5 reference: {ref!r}")
        if not ref:
            return ""
        try:
            return str(f[ref].name)
        except (KeyError, ValueError, OSError, RuntimeError) as exc:
            raise SourceError(
                f"{path}: field {field!r}: an object reference that leads nowhere: "
                f"{' '.join(str(exc).split())}"
            ) from exc

    if arr.ndim == 0:
        return one(arr[()])
    paths = np.empty(arr.shape, dtype=object)
    for index, ref in np.ndenumerate(arr):
        paths[index] = one(ref)
    result: list[Any] = paths.tolist()
    return result
