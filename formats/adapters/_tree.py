"""What the array-tree adapters (HDF5, NetCDF, Zarr) share: lazy slices, attributes, windows.

A source file is a tree of named arrays plus attributes. Each array becomes a field named
by its path; an array larger than ``max_in_memory_bytes`` stays in the file as a
:class:`SlicedArray` (an :class:`~simstore.ingest.ArraySource`) and is read slice by slice.
Attributes become parameters (scalars and strings) or, when they are lists, entries of the
sample's ``metadata`` JSON field: ``Re`` (root), ``grid/units`` (a group's) and
``velocity.units`` (an array's). Byte strings that are valid UTF-8 become ``str``; any
other byte string keeps its exact bytes: a ``bytes`` parameter, or in JSON metadata the
object ``{"__bytes_hex__": "<hex digits>"}`` (see :func:`json_safe`).

Time windows (``time_window`` N, ``stride`` S) cut arrays that have a time axis into
samples ``<key>/t<start>``, one per window, for trajectories laid out ``[time, x, y(, z)]``
(one trajectory per file; The Well's ``[trajectory, time, ...]`` files are refused, as is
any file none of whose fields of rank 2 or more runs along the time axis). The time axis
is axis 0; its length T comes from a named time dimension (NetCDF), else a 1-D array
named ``time``/``t`` (or ``time_name``), else the common first axis of the arrays of rank
3 or more. Arrays whose axis 0 has length T are windowed; the others (grids, constants)
are repeated in every window's sample.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from simstore import _buffers
from simstore.errors import InvalidInputError, SourceError
from simstore.sample import FieldValue, Sample

from ._limits import check_whole_value

__all__ = [
    "BYTES_HEX",
    "DEFAULT_MAX_IN_MEMORY",
    "MAX_CHUNK_BYTES",
    "TIME_OPTIONS",
    "ArrayEntry",
    "SlicedArray",
    "attribute_fields",
    "check_time_options",
    "json_safe",
    "native_dtype",
    "put_value",
    "read_strings",
    "text_or_bytes",
    "tree_sample_count",
    "tree_samples",
]

TIME_OPTIONS = frozenset({"time_window", "stride", "time_name"})
"""The options of adapters that cut a run into time windows (hdf5, netcdf, zarr)."""

DEFAULT_MAX_IN_MEMORY = 16 << 20

MAX_CHUNK_BYTES = 256 << 20
"""The largest chunk (decoded) of a compressed or chunk-encoded array that is read: a read
decodes whole chunks, so one chunk is held in memory whole."""

_CHUNK_REGION_MIN = 1 << 20
"""Chunks above this many bytes are decoded once per region (see ``SlicedArray``): HDF5's
default chunk cache (1 MiB) cannot hold them, and Zarr keeps none."""

REGION_BYTES = 64 << 20
"""The decoded chunks kept around a read (see ``SlicedArray._read_region``) hold at most
this many bytes, or two of the array's chunks if more: a layout whose chunks span the
window's axis (``(T, 4, nx)`` read in windows along T) made the region the whole array."""

_VLEN_SLOT = 16
"""Bytes a variable-length value takes in the file besides its own (an HDF5 heap id)."""

BYTES_HEX = "__bytes_hex__"
"""The key of the JSON object standing for a byte string that is not UTF-8 text."""


def text_or_bytes(value: bytes) -> str | bytes:
    """A byte string as text when it is valid UTF-8, else its exact bytes (never altered)."""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return bytes(value)


def text_of_str(value: str) -> str | bytes:
    """A ``str`` as stored: itself, or its bytes where it holds surrogates.

    h5py gives a variable-length string attribute whose bytes are not valid UTF-8 as a
    ``str`` of surrogate escapes, which no UTF-8 encoder takes: those are the bytes back
    (a ``bytes`` parameter, as a byte string that is not UTF-8 is everywhere else). A
    lone surrogate that is no such escape keeps its code units (``surrogatepass``).
    """
    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:
        pass
    try:
        return text_or_bytes(value.encode("utf-8", "surrogateescape"))
    except UnicodeEncodeError:
        return value.encode("utf-8", "surrogatepass")


def check_time_options(options: Mapping[str, Any]) -> None:
    """Refuse a ``time_window`` or ``stride`` that is not a whole number of at least 1.

    The adapters' ``check_options``: ingest calls it before anything is read, so
    ``--option time_window=abc`` fails once instead of in every file, and ``0`` or
    ``2.5`` are errors rather than no windows or windows of 2.
    """
    for name in ("time_window", "stride"):
        raw = options.get(name)
        if raw is None:
            continue
        value = None
        if isinstance(raw, int | np.integer) and not isinstance(raw, bool):
            value = int(raw)
        elif isinstance(raw, str):
            try:
                value = int(raw.strip())
            except ValueError:
                value = None
        if value is None or value < 1:
            raise InvalidInputError(
                f"adapter option {name} {raw!r}: a whole number of time steps, at least 1"
            )


def native_dtype(dtype: Any) -> np.dtype[Any]:
    """The dtype in native byte order."""
    dt: np.dtype[Any] = np.dtype(dtype)
    if dt.byteorder not in ("=", "|"):
        dt = dt.newbyteorder("=")
    return dt


class SlicedArray:
    """An ArraySource over a sliceable handle (h5py Dataset, netCDF4 Variable, zarr Array).

    ``offset`` and ``length`` restrict axis 0 to a time window. Reads come back in native
    byte order; a read error becomes a :class:`SourceError` naming the file and field.

    ``mapper`` (the HDF5 adapter's, for values stored plainly in the file) gives a read
    of ``box`` as a read-only mapping of the file, or None to read it the usual way.

    ``chunks`` is the chunk shape of an array whose reads decode whole chunks (compressed
    HDF5 and NetCDF-4 datasets, Zarr arrays). A chunk over :data:`MAX_CHUNK_BYTES` is
    refused. One over 1 MiB is decoded once: a read decodes the chunks it touches whole
    (the box grown to chunk boundaries, a *region*) and keeps them for the next reads
    inside it, since a run of small blocks would otherwise decode a 256 MiB chunk again
    for each (83 s instead of 0.6 for one such gzip chunk read in 4 MiB blocks). The
    process keeps one region at a time, dropped when a read reaches its last value.
    """

    def __init__(
        self,
        handle: Any,
        *,
        path: str,
        field: str,
        offset: int = 0,
        length: int | None = None,
        chunks: Sequence[int] | None = None,
        mapper: Callable[[Any], np.ndarray | None] | None = None,
    ) -> None:
        self._handle = handle
        self._mapper = mapper
        self._path = path
        self._field = field
        self._offset = offset
        full = tuple(int(n) for n in handle.shape)
        if length is not None:
            full = (length, *full[1:])
        self._shape = full
        self._dtype = native_dtype(handle.dtype)
        self._chunks: tuple[int, ...] | None = None
        if chunks is not None and len(chunks) == len(full) and full:
            chunk_shape = tuple(max(1, int(c)) for c in chunks)
            chunk_bytes = math.prod(chunk_shape) * self._dtype.itemsize
            if chunk_bytes > MAX_CHUNK_BYTES:
                raise SourceError(
                    f"{path}: field {field!r}: one chunk {chunk_shape} holds "
                    f"{chunk_bytes:,} bytes decoded, and a read decodes whole chunks: the "
                    f"limit is {MAX_CHUNK_BYTES:,} (rechunk the array)"
                )
            if chunk_bytes > _CHUNK_REGION_MIN:
                self._chunks = chunk_shape

    @property
    def shape(self) -> tuple[int, ...]:
        """The (windowed) shape."""
        return self._shape

    @property
    def dtype(self) -> np.dtype[Any]:
        """The dtype in native byte order."""
        return self._dtype

    @property
    def nbytes(self) -> int:
        """Size of the values in bytes."""
        return math.prod(self._shape) * self._dtype.itemsize

    def window(self, start: int, length: int) -> SlicedArray:
        """The same source restricted to ``[start, start + length)`` on axis 0."""
        return SlicedArray(
            self._handle,
            path=self._path,
            field=self._field,
            offset=self._offset + start,
            length=length,
            chunks=self._chunks,
            mapper=self._mapper,
        )

    def __getitem__(self, key: tuple[slice, ...]) -> np.ndarray:
        """Read a box of slices (step 1)."""
        if len(self._shape) == 0:
            box: Any = ()
        else:
            if not isinstance(key, tuple):
                key = (key,)
            parts = list(key) + [slice(None)] * (len(self._shape) - len(key))
            s0 = parts[0]
            start, stop, _ = s0.indices(self._shape[0])
            parts[0] = slice(self._offset + start, self._offset + stop)
            box = tuple(parts)
        try:
            data = self._mapper(box) if self._mapper is not None and box else None
            if data is None and self._chunks is not None:
                data = self._read_region(box)
            if data is None:
                data = self._read_pooled(box)
            if data is None:
                data = np.asarray(self._handle[box])
            if data.dtype != self._dtype:
                data = data.astype(self._dtype)
        except Exception as exc:  # any reader failure means a bad source file
            raise SourceError(
                f"{self._path}: field {self._field!r}: read failed: {_one_line(exc)}"
            ) from exc
        return data

    def _read_pooled(self, box: Any) -> np.ndarray | None:
        """An h5py read of ``box`` into pooled memory (None: read it the plain way).

        h5py's slicing returns fresh memory for every read; ``read_direct`` fills an array
        given to it, here one of the process's pool (see ``simstore._buffers``), so a run
        of windows of the same size reads into pages faulted in once.
        """
        reader = getattr(self._handle, "read_direct", None)
        if reader is None or not box or self._dtype.kind not in "biuf":
            return None
        full = tuple(int(n) for n in self._handle.shape)
        bounds = (p.indices(n) for p, n in zip(box, full, strict=True))
        shape = tuple(max(0, b - a) for a, b, _ in bounds)
        if math.prod(shape) * self._dtype.itemsize < _buffers.POOL.min_bytes:
            return None
        out = _buffers.POOL.array(shape, self._dtype)
        reader(out, source_sel=box)
        return out

    def _read_region(self, box: Any) -> np.ndarray | None:
        """``box`` from the decoded chunks around it (None: read it the plain way).

        The chunks ``box`` touches are read whole once (HDF5 and Zarr decode them whole
        anyway) and kept in the process's one region slot, so the next reads inside them
        decode nothing; a read that ends at the region's last value drops it. A region
        over :data:`REGION_BYTES` and two chunks is not kept (the plain read decodes each
        of its chunks, for this read only).
        """
        chunks = self._chunks
        if not box or chunks is None:
            return None
        full = tuple(int(n) for n in self._handle.shape)
        bounds = [p.indices(n)[:2] for p, n in zip(box, full, strict=True)]
        if any(b <= a for a, b in bounds):
            return None
        held = _REGION[0]
        if (
            held is None
            or held[0] is not self._handle
            or not all(
                ra <= a and b <= rb for (a, b), (ra, rb) in zip(bounds, held[1], strict=True)
            )
        ):
            region = tuple(
                (a // c * c, min(n, -(-b // c) * c))
                for (a, b), c, n in zip(bounds, chunks, full, strict=True)
            )
            chunk_bytes = math.prod(chunks) * self._dtype.itemsize
            if math.prod(rb - ra for ra, rb in region) * self._dtype.itemsize > max(
                REGION_BYTES, 2 * chunk_bytes
            ):
                # memory stays bounded by the chunks, not the array: each read decodes
                # the chunks it touches again instead (slower for such a layout)
                return None
            # the old region's memory goes before the new one is read (this frame's
            # reference too: both regions were held at once, twice the bound)
            _REGION[0] = held = None
            values = np.asarray(self._handle[tuple(slice(ra, rb) for ra, rb in region)])
            held = (self._handle, region, values)
            _REGION[0] = held
        _, region, values = held
        out = np.array(
            values[
                tuple(slice(a - ra, b - ra) for (a, b), (ra, _) in zip(bounds, region, strict=True))
            ]
        )
        if all(b == rb for (_, b), (_, rb) in zip(bounds, region, strict=True)):
            _REGION[0] = None
        return out

    def read(self) -> np.ndarray:
        """The whole (windowed) array in memory."""
        # np.require, not np.ascontiguousarray: that one makes a 0-d array 1-d
        return np.require(self[tuple(slice(0, n) for n in self._shape)], requirements="C")


_REGION: list[tuple[Any, tuple[tuple[int, int], ...], np.ndarray] | None] = [None]
"""The decoded chunks last read whole (see ``SlicedArray._read_region``): handle, region
(start, stop per axis) and values; one per process."""


def release_region() -> None:
    """Drop the decoded chunks kept for the next reads (their array is done with)."""
    _REGION[0] = None


@dataclass(frozen=True, slots=True)
class ArrayEntry:
    """One numeric array of a source tree: its field name, reader and dimension names."""

    name: str
    array: SlicedArray
    dims: tuple[str, ...] | None = None


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def json_safe(value: Any) -> Any:
    """A JSON-serialisable version of an attribute value (NaN and Inf become strings).

    A byte string becomes text when it is valid UTF-8, else ``{"__bytes_hex__": hex}``
    holding its exact bytes (``bytes.fromhex`` gives them back). A mapping (a Zarr
    attribute holding a JSON object) stays a JSON object, its values made safe the same way.
    """
    if isinstance(value, np.ndarray):
        return json_safe(value.tolist())
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, bytes | np.bytes_):
        text = text_or_bytes(bytes(value))
        return text if isinstance(text, str) else {BYTES_HEX: text.hex()}
    if isinstance(value, np.generic):
        item = value.item()
        # longdouble's item() is itself: its text, never a loop
        return str(value) if isinstance(item, np.generic) else json_safe(item)
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, str):
        text = text_of_str(value)
        return text if isinstance(text, str) else {BYTES_HEX: text.hex()}
    if isinstance(value, int | float | bool) or value is None:
        return value
    if type(value).__name__ == "Empty" and hasattr(value, "dtype"):
        return None  # h5py.Empty: an attribute with a null dataspace holds no value
    return str(value)


_INT64 = (-(1 << 63), 1 << 63)
_UINT64_STOP = 1 << 64


def _claim(path: str, key: str, params: Mapping[str, Any], metadata: Mapping[str, Any]) -> None:
    """Refuse a second value for a parameter or metadata entry ``key``."""
    if key in params or key in metadata:
        raise SourceError(
            f"{path}: field {key!r} is given twice (by two of: an attribute, an array's "
            "attribute, a string or reference dataset): one would replace the other"
        )


def put_value(
    path: str, key: str, value: Any, params: dict[str, Any], metadata: dict[str, Any]
) -> None:
    """Add a string (or reference) array's value as a parameter or a metadata entry.

    ``str`` and ``bytes`` are parameters, lists metadata entries; a name that already has
    a value is an error naming it.
    """
    _claim(path, key, params, metadata)
    if isinstance(value, str | bytes):
        params[key] = value
    else:
        metadata[key] = value


def read_strings(handle: Any, path: str, field: str, *, vlen: bool) -> np.ndarray:
    """A string (or variable-length) array's values, read whole within the cap.

    Values that are read whole are capped (see ``_limits``): a fixed-size array is checked
    by its shape and item size before it is read; a variable-length one's size in the
    file is known only from its values, so it is read in slices of axis 0 and counted
    (each value's length plus its 16-byte slot), refused as soon as it passes the cap.
    """
    shape = tuple(int(n) for n in handle.shape)
    if not vlen:
        check_whole_value(path, field, math.prod(shape) * np.dtype(handle.dtype).itemsize)
    if not vlen or len(shape) == 0:
        return np.asarray(handle[...])
    row = max(1, math.prod(shape[1:]))
    step = max(1, (1 << 16) // row)
    parts = []
    nbytes = 0
    for start in range(0, shape[0], step):
        part = np.asarray(handle[start : start + step])
        nbytes += part.size * _VLEN_SLOT + sum(len(v) for v in part.flat)
        check_whole_value(path, field, nbytes)
        parts.append(part)
    if not parts:
        return np.asarray(handle[...])
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


_EXACT_FLOATS = (np.float16, np.float32, np.float64)


def _refuse_inexact(path: str, key: str, value: Any) -> None:
    """Refuse a complex or extended-precision attribute (a SourceError naming it).

    No shard format stores such values and reads them back exactly, and they are never
    converted (as arrays of those dtypes are not): a complex attribute became its text
    in the metadata, and an array of ``longdouble`` did not end.
    """
    dtype = getattr(value, "dtype", None)
    if isinstance(value, complex) or (
        isinstance(dtype, np.dtype)
        and (dtype.kind == "c" or (dtype.kind == "f" and dtype.type not in _EXACT_FLOATS))
    ):
        shown = dtype if isinstance(dtype, np.dtype) else "complex"
        raise SourceError(
            f"{path}: field {key!r}: unsupported dtype {shown} (complex and extended "
            "precision values are not converted: no shard format stores them and reads "
            "them back exactly)"
        )


def attribute_fields(
    prefix: str,
    attrs: Mapping[str, Any],
    params: dict[str, Any],
    metadata: dict[str, Any],
    *,
    is_array: bool = False,
    path: str = "",
) -> None:
    """Add attributes as parameters or (lists, others) metadata entries.

    Names: a root attribute keeps its name (``Re``), a group's is ``group/name`` and an
    array's is ``array.name`` (``velocity.units``): an array field cannot also be a group.
    A name that already has a value (a root attribute ``x.units`` and array ``x``'s
    ``units``) is an error naming it, never one value replacing the other. A Python int
    (Zarr's JSON attributes) is an int64 parameter, or uint64 from 2**63 to 2**64 - 1; one
    outside both ranges is kept exactly as a metadata entry, like other values no
    parameter holds.
    """
    sep = "." if is_array else "/"
    for name in sorted(attrs):
        key = f"{prefix}{sep}{name}" if prefix else name
        _claim(path, key, params, metadata)
        value = attrs[name]
        _refuse_inexact(path, key, value)
        if isinstance(value, np.ndarray) and value.size == 1 and value.dtype.kind in "biufSU":
            value = value.reshape(()).item() if value.dtype.kind in "SU" else value.reshape(())[()]
        if isinstance(value, bytes | np.bytes_):
            params[key] = text_or_bytes(bytes(value))
        elif isinstance(value, str | np.str_):
            params[key] = text_of_str(str(value))
        elif isinstance(value, bool | np.bool_):
            params[key] = bool(value)
        elif isinstance(value, np.generic) and value.dtype.kind in "iuf":
            params[key] = value
        elif isinstance(value, int) and not _INT64[0] <= value < _INT64[1]:
            if 0 <= value < _UINT64_STOP:
                params[key] = np.uint64(value)
            else:
                metadata[key] = value  # JSON holds any int exactly
        elif isinstance(value, int | float):
            params[key] = value
        else:
            metadata[key] = json_safe(value)


def _time_axis(
    path: str, entries: Sequence[ArrayEntry], time_name: str | None, time_dim: str | None
) -> tuple[int, list[bool]]:
    """(T, which entries are windowed)."""
    if time_dim is not None and time_name == time_dim and not any(
            e.dims and time_dim in e.dims for e in entries):
        # time_name names a variable, not a dimension: the dimension of its axis 0 is the
        # time dimension (else windows were cut by length, along any axis 0 as long), of
        # a 2-D one (date(time, two)) too, as its axis 0 is the time axis below
        named = [e for e in entries if time_name in (e.name, e.name.rsplit("/", 1)[-1])
                 and e.dims]
        if named:
            time_dim = named[0].dims[0]  # type: ignore[index]
    if time_dim is not None:
        lengths = {e.array.shape[0] for e in entries if e.dims and e.dims[0] == time_dim}
        if len(lengths) > 1:  # one dimension, one length: an adapter's bug, not the file's
            raise SourceError(
                f"{path}: the time dimension {time_dim!r} has lengths {sorted(lengths)}"
            )
        if lengths:
            t = lengths.pop()
            return t, [bool(e.dims) and e.dims[0] == time_dim for e in entries]  # type: ignore[index]
        # the dimension decides, not the length: variables that run along the time
        # dimension on another axis ([x, y, time]) must not have windows cut along
        # whatever axis 0 of the same length, or of another length, happens to be
        along = [(e.name, e.dims.index(time_dim), e.array.shape[e.dims.index(time_dim)])
                 for e in entries if e.dims and time_dim in e.dims]
        if along:
            name, axis, t = along[0]
            raise SourceError(
                f"{path}: time axis of {t} steps (dimension {time_dim!r}) is axis 0 of no "
                f"array (field {name!r} runs along it on axis {axis}): windows cut axis 0 "
                "only, so every field would repeat whole; put the time dimension first "
                "(ncpdq -a), or name the time axis (time_name)"
            )
    names = [time_name] if time_name else ["time", "t"]
    t_len: int | None = None
    for want in names:
        for e in entries:
            if want in (e.name, e.name.rsplit("/", 1)[-1]) and len(e.array.shape) == 1:
                t_len = e.array.shape[0]
                break
        if t_len is not None:
            break
    if t_len is None and time_name:
        # the named array's axis 0 is the time axis; a name that names nothing must not
        # fall back to a guessed axis
        named = [e for e in entries if time_name in (e.name, e.name.rsplit("/", 1)[-1])]
        if named and all(len(e.array.shape) >= 1 for e in named):
            t_len = named[0].array.shape[0]
        else:
            what = "dimension or array" if time_dim is not None else "array"
            found = "names a 0-d array" if named else f"names no numeric {what} of the file"
            raise SourceError(f"{path}: time_name {time_name!r} {found}: no time axis")
    if t_len is None:
        firsts = {e.array.shape[0] for e in entries if len(e.array.shape) >= 3}
        if len(firsts) != 1:
            raise SourceError(
                f"{path}: cannot tell the time axis for --time-window (first axes of the "
                f"rank>=3 arrays: {sorted(firsts) or 'none'}); name a 1-D time array with "
                "the time_name adapter option"
            )
        t_len = firsts.pop()
    return t_len, [len(e.array.shape) >= 1 and e.array.shape[0] == t_len for e in entries]


def _windows(
    path: str, entries: Sequence[ArrayEntry], options: Mapping[str, Any], time_dim: str | None
) -> tuple[range, int, list[bool]] | None:
    """The windows of the time axis, or None without ``time_window``.

    Returns (the first time step of each window, T, which entries are windowed).
    """
    window = options.get("time_window")
    if not window:
        return None
    n = int(window)
    stride = int(options.get("stride") or n)
    if n < 1 or stride < 1:
        raise SourceError(f"{path}: --time-window and --stride must be positive")
    t_len, windowed = _time_axis(path, entries, options.get("time_name"), time_dim)
    fields = [e for e in entries if len(e.array.shape) >= 2]
    if fields and not any(w for e, w in zip(entries, windowed, strict=True)
                          if len(e.array.shape) >= 2):
        # windows would cut only 1-D arrays (the time array itself) and repeat every field
        # whole: a time array longer than the fields' axis, or fields whose time axis is
        # not axis 0 (The Well's [trajectory, time, x, y] files)
        firsts = sorted({e.array.shape[0] for e in fields})
        raise SourceError(
            f"{path}: time axis of {t_len} steps is axis 0 of no array of rank 2 or more "
            f"(their first axes: {firsts}): windows cut axis 0 only, so every field would "
            "repeat whole; split trajectories into files, or name the time axis (time_name)"
        )
    if t_len < n:
        raise SourceError(f"{path}: time axis has {t_len} steps, fewer than --time-window {n}")
    return range(0, t_len - n + 1, stride), t_len, windowed


def _sample_range(options: Mapping[str, Any], count: int) -> tuple[int, int]:
    """``options["sample_range"]`` as ``(first, stop)`` within ``count`` (all by default)."""
    got = options.get("sample_range")
    if got is None:
        return 0, count
    first, stop = (int(v) for v in got)
    return max(0, first), min(count, stop)


def tree_sample_count(
    path: str,
    entries: Sequence[ArrayEntry],
    options: Mapping[str, Any],
    *,
    time_dim: str | None = None,
) -> int:
    """How many samples :func:`tree_samples` yields for these entries and options."""
    windows = _windows(path, entries, options, time_dim)
    return 1 if windows is None else len(windows[0])


def _value(array: SlicedArray, max_bytes: int) -> FieldValue | SlicedArray:
    return array.read() if array.nbytes <= max_bytes else array


def tree_samples(
    path: str,
    key: str,
    entries: Sequence[ArrayEntry],
    params: Mapping[str, FieldValue],
    metadata: Mapping[str, Any],
    options: Mapping[str, Any],
    *,
    time_dim: str | None = None,
) -> Iterator[Sample]:
    """The samples of one array tree: the whole file, or one per time window.

    ``options["sample_range"] = [first, stop]`` yields only samples ``first`` to ``stop - 1``
    of that sequence (a piece of a large file, see ``SupportsSampleRanges``), with the same
    keys and values, reading only their windows.
    """
    max_bytes = int(options.get("max_in_memory_bytes") or DEFAULT_MAX_IN_MEMORY)
    names = {e.name for e in entries}
    clash = sorted(names & set(params))
    if clash:
        raise SourceError(f"{path}: field {clash[0]!r} is both an array and an attribute")
    if metadata and ("metadata" in names or "metadata" in params):
        raise SourceError(
            f"{path}: field 'metadata' is both a dataset or attribute of the file and the "
            f"JSON field holding its list attributes (such as {min(metadata)!r})"
        )
    base: dict[str, Any] = dict(params)
    if metadata:
        base["metadata"] = dict(metadata)
    try:
        yield from _tree_samples(path, key, entries, base, options, time_dim, max_bytes)
    finally:
        release_region()


def _tree_samples(
    path: str,
    key: str,
    entries: Sequence[ArrayEntry],
    base: dict[str, Any],
    options: Mapping[str, Any],
    time_dim: str | None,
    max_bytes: int,
) -> Iterator[Sample]:
    windows = _windows(path, entries, options, time_dim)
    if windows is None:
        first, stop = _sample_range(options, 1)
        if first < stop:
            fields = dict(base)
            for e in entries:
                fields[e.name] = _value(e.array, max_bytes)
            yield Sample(key, fields)
        return
    starts, t_len, windowed = windows
    first, stop = _sample_range(options, len(starts))
    n = int(options["time_window"])
    constants = {
        e.name: _value(e.array, max_bytes) for e, w in zip(entries, windowed, strict=True) if not w
    }
    width = max(4, len(str(t_len - 1)))
    for start in starts[first:stop]:
        fields = dict(base)
        fields.update(constants)
        for e, w in zip(entries, windowed, strict=True):
            if w:
                fields[e.name] = _value(e.array.window(start, n), max_bytes)
        yield Sample(f"{key}/t{start:0{width}d}", fields)
