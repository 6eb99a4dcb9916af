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
samples ``<key>/t<start>``, one per window, the way trajectory datasets such as The Well
lay out ``[time, x, y(, z)]`` fields. The time axis is axis 0; its length T comes from a
named time dimension (NetCDF), else a 1-D array named ``time``/``t`` (or ``time_name``),
else the common first axis of the arrays of rank 3 or more. Arrays whose axis 0 has length
T are windowed; the others (grids, constants) are repeated in every window's sample.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from simstore import _buffers
from simstore.errors import InvalidInputError, SourceError
from simstore.sample import FieldValue, Sample

__all__ = [
    "BYTES_HEX",
    "DEFAULT_MAX_IN_MEMORY",
    "TIME_OPTIONS",
    "ArrayEntry",
    "SlicedArray",
    "attribute_fields",
    "check_time_options",
    "json_safe",
    "native_dtype",
    "text_or_bytes",
    "tree_sample_count",
    "tree_samples",
]

TIME_OPTIONS = frozenset({"time_window", "stride", "time_name"})
"""The options of adapters that cut a run into time windows (hdf5, netcdf, zarr)."""

DEFAULT_MAX_IN_MEMORY = 16 << 20

BYTES_HEX = "__bytes_hex__"
"""The key of the JSON object standing for a byte string that is not UTF-8 text."""


def text_or_bytes(value: bytes) -> str | bytes:
    """A byte string as text when it is valid UTF-8, else its exact bytes (never altered)."""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return bytes(value)


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
    """

    def __init__(
        self, handle: Any, *, path: str, field: str, offset: int = 0, length: int | None = None
    ) -> None:
        self._handle = handle
        self._path = path
        self._field = field
        self._offset = offset
        full = tuple(int(n) for n in handle.shape)
        if length is not None:
            full = (length, *full[1:])
        self._shape = full
        self._dtype = native_dtype(handle.dtype)

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

    def read(self) -> np.ndarray:
        """The whole (windowed) array in memory."""
        # np.require, not np.ascontiguousarray: that one makes a 0-d array 1-d
        return np.require(self[tuple(slice(0, n) for n in self._shape)], requirements="C")


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
    holding its exact bytes (``bytes.fromhex`` gives them back).
    """
    if isinstance(value, np.ndarray):
        return json_safe(value.tolist())
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, bytes | np.bytes_):
        text = text_or_bytes(bytes(value))
        return text if isinstance(text, str) else {BYTES_HEX: text.hex()}
    if isinstance(value, np.generic):
        return json_safe(value.item())
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if type(value).__name__ == "Empty" and hasattr(value, "dtype"):
        return None  # h5py.Empty: an attribute with a null dataspace holds no value
    return str(value)


def attribute_fields(
    prefix: str,
    attrs: Mapping[str, Any],
    params: dict[str, Any],
    metadata: dict[str, Any],
    *,
    is_array: bool = False,
) -> None:
    """Add attributes as parameters or (lists, others) metadata entries.

    Names: a root attribute keeps its name (``Re``), a group's is ``group/name`` and an
    array's is ``array.name`` (``velocity.units``): an array field cannot also be a group.
    """
    sep = "." if is_array else "/"
    for name in sorted(attrs):
        key = f"{prefix}{sep}{name}" if prefix else name
        value = attrs[name]
        if isinstance(value, np.ndarray) and value.size == 1 and value.dtype.kind in "biufSU":
            value = value.reshape(()).item() if value.dtype.kind in "SU" else value.reshape(())[()]
        if isinstance(value, bytes | np.bytes_):
            params[key] = text_or_bytes(bytes(value))
        elif isinstance(value, str | np.str_):
            params[key] = str(value)
        elif isinstance(value, bool | np.bool_):
            params[key] = bool(value)
        elif isinstance(value, np.generic) and value.dtype.kind in "iuf":
            params[key] = value
        elif isinstance(value, int | float):
            params[key] = value
        else:
            metadata[key] = json_safe(value)


def _time_axis(
    path: str, entries: Sequence[ArrayEntry], time_name: str | None, time_dim: str | None
) -> tuple[int, list[bool]]:
    """(T, which entries are windowed)."""
    if time_dim is not None:
        lengths = {e.array.shape[0] for e in entries if e.dims and e.dims[0] == time_dim}
        if len(lengths) > 1:  # one dimension, one length: an adapter's bug, not the file's
            raise SourceError(f"{path}: the time dimension {time_dim!r} has lengths "
                              f"{sorted(lengths)}")
        if lengths:
            t = lengths.pop()
            return t, [bool(e.dims) and e.dims[0] == time_dim for e in entries]  # type: ignore[index]
    names = [time_name] if time_name else ["time", "t"]
    t_len: int | None = None
    for want in names:
        for e in entries:
            if e.name.rsplit("/", 1)[-1] == want and len(e.array.shape) == 1:
                t_len = e.array.shape[0]
                break
        if t_len is not None:
            break
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
    base: dict[str, Any] = dict(params)
    if metadata:
        base["metadata"] = dict(metadata)
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
