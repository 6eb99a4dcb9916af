"""Samples as Arrow tables: the column layout shared by the Parquet and Lance shards.

One row per sample, the sample key in ``__key__`` and one column per field:

================  =====================================================================
field             column
================  =====================================================================
tensor, small     ``arrow.fixed_shape_tensor``, when every sample in the shard has one
                  shape of at most 64 KiB (parameter vectors, small grids)
tensor, other     ``struct<data: large_binary, shape: list<int64>>``: the raw
                  little-endian bytes and the shape; the dtype is in the schema metadata.
                  Under ``shuffle-zstd`` a float tensor's bytes are byte-shuffled
                  (``numcodecs.Shuffle(itemsize)``, recorded as ``shuffle``) before zstd
tensor, rank 0    the value type itself
scalar            the value type (int64, float64, bool, or the numpy scalar's dtype)
string            ``string``
bytes             ``large_binary``
json              ``string`` holding canonical JSON
================  =====================================================================

The schema carries one metadata entry, ``simstore``: JSON with the shard's kind and
format version, each column's field spec and encoding, and the shard's field statistics,
so a reader needs nothing but the file. (One entry, because Lance writes metadata maps in
hash order: two entries would make equal shards differ in bytes. For the same reason Lance
shards store uniform tensors as plain ``fixed_size_list``, not the extension type.) A sample
that lacks a field has a null there and reads back without it.
"""

from __future__ import annotations

import json
import math
import mmap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from simstore._columns import numpy_column
from simstore.errors import FormatError, InvalidInputError, one_line, version_error
from simstore.ingest import is_array_source, spec_of_value
from simstore.sample import FieldSpec, FieldValue, Sample, canonical_json

try:  # a shuffled tensor's bytes put back in C; else NumPy's transpose (same bytes)
    from simstore import _rows
except ImportError:  # pragma: no cover (built by every install with a C compiler)
    _rows = None  # type: ignore[assignment]

__all__ = [
    "KEY_COLUMN",
    "SHARD_FORMAT_VERSION",
    "ColumnPlan",
    "arrow_schema",
    "decode_pieces",
    "decode_rows",
    "encode_table",
    "mapped_out",
    "materialise",
    "memory_pool",
    "plan_columns",
    "plans_from_schema",
    "scalar_out",
    "shard_document",
    "shard_metadata",
    "shifted_out",
]

KEY_COLUMN = "__key__"
SHARD_FORMAT_VERSION = 1
Encoding = Literal["fixed", "blob", "plain", "string", "bytes", "json"]
ENCODINGS = ("fixed", "blob", "plain", "string", "bytes", "json")
SMALL_TENSOR_BYTES = 64 << 10


@dataclass(frozen=True, slots=True)
class ColumnPlan:
    """How one field is laid out as a column."""

    spec: FieldSpec
    encoding: Encoding
    shape: tuple[int, ...] = ()
    """fixed: the rows' shape; blob: the one shape of every row that has the field, where
    they share one (else ``()``: a blob is never 0-d)."""
    shuffle: int = 0  # blob: byte-shuffle element size (0: none)

    @property
    def name(self) -> str:
        """The field name (and column name)."""
        return self.spec.name


def memory_pool() -> pa.MemoryPool:
    """Arrow's allocator for shard reads and writes: jemalloc where pyarrow has it.

    pyarrow's default (mimalloc in current wheels) hands the freed 4-32 MiB buffers of a
    decoded row group or a written page back to the system at once, so every row group
    read faults in fresh pages: the first epoch of 8 KiB samples ran 1.4x slower with it
    (docs/performance.md). jemalloc keeps freed extents for reuse; the system allocator
    is the fallback where pyarrow was built without jemalloc. (Both are pyarrow's
    process-wide singletons.)
    """
    try:
        return pa.jemalloc_memory_pool()
    except NotImplementedError:
        return pa.system_memory_pool()


def materialise(value: object) -> FieldValue:
    """A field value in memory: a lazy array source is read whole (columnar shards only).

    An array over a source file's mapped pages is copied: a columnar writer encodes its
    samples when the shard closes, after the file's change check, and a file rewritten
    in place in between would put other bytes in the shard than its sample's hash says.
    """
    if is_array_source(value):
        src: Any = value
        value = np.ascontiguousarray(src[tuple(slice(0, n) for n in src.shape)])
    if isinstance(value, np.ndarray) and _maps_a_file(value):
        return value.copy()
    return value  # type: ignore[return-value]


def _maps_a_file(array: np.ndarray) -> bool:
    """Whether ``array`` is a view of a memory mapping (a source file's pages)."""
    base: object = array.base
    while base is not None:
        if isinstance(base, mmap.mmap):
            return True
        if isinstance(base, memoryview):
            base = base.obj
        elif isinstance(base, np.ndarray):
            base = base.base
        else:
            return False
    return False


def plan_columns(
    samples: Sequence[Sample], *, shuffle: bool = False, fixed_bytes: int = SMALL_TENSOR_BYTES,
    fixed_ok: Callable[[np.dtype[Any], tuple[int, ...]], bool] | None = None,
) -> list[ColumnPlan]:
    """The column layout of some samples; one spec per field or InvalidInputError.

    Large tensors are blobs (raw bytes): Parquet writes and reads those at memory speed,
    while a list column of floats costs a definition level per value, several times
    slower. Uniform tensors of at most ``fixed_bytes`` per sample become fixed-shape
    tensor columns. ``shuffle`` byte-shuffles float blobs (the ``shuffle-zstd`` codec).
    ``fixed_ok(dtype, shape)``, where given, may also refuse a fixed-shape column (one the
    format's writer cannot write): the field is then a blob.
    """
    specs: dict[str, FieldSpec] = {}
    shapes: dict[str, tuple[int, ...] | None] = {}
    for sample in samples:
        for name, value in sample.fields.items():
            if name == KEY_COLUMN:
                raise InvalidInputError(
                    f"sample {sample.key!r}: field name {KEY_COLUMN} is reserved"
                )
            spec = spec_of_value(name, value)
            prev = specs.setdefault(name, spec)
            if prev != spec:
                raise InvalidInputError(
                    f"sample {sample.key!r}: field {name!r} is {spec.describe()}, but earlier "
                    f"samples of this shard have {prev.describe()}"
                )
            if spec.kind == "tensor":
                shape = tuple(int(n) for n in value.shape)  # type: ignore[union-attr]
                if name not in shapes:
                    shapes[name] = shape
                elif shapes[name] != shape:
                    shapes[name] = None
    plans = []
    for name in sorted(specs):
        spec = specs[name]
        if spec.kind == "tensor":
            uniform = shapes[name]
            itemsize = np.dtype(spec.dtype).itemsize
            if spec.ndim == 0:
                plans.append(ColumnPlan(spec, "plain"))
            elif (
                uniform is not None
                and 0 < math.prod(uniform) * itemsize <= fixed_bytes
                and (fixed_ok is None or fixed_ok(np.dtype(spec.dtype), uniform))
            ):
                plans.append(ColumnPlan(spec, "fixed", uniform))
            else:
                kind = np.dtype(spec.dtype).kind
                size = itemsize if shuffle and kind == "f" and itemsize > 1 else 0
                # a blob records its rows' one shape where they share it: a reader of the
                # pages then needs no Arrow decode of the shapes (formats/_parquet.py)
                plans.append(ColumnPlan(spec, "blob", uniform or (), shuffle=size))
        elif spec.kind == "scalar":
            plans.append(ColumnPlan(spec, "plain"))
        else:
            plans.append(ColumnPlan(spec, spec.kind))
    return plans


def _value_type(dtype: str) -> pa.DataType:
    return pa.from_numpy_dtype(np.dtype(dtype))


def _arrow_type(plan: ColumnPlan, tensor_extension: bool = True) -> pa.DataType:
    enc = plan.encoding
    if enc == "fixed":
        value = _value_type(plan.spec.dtype)
        if tensor_extension:
            return pa.fixed_shape_tensor(value, list(plan.shape))
        return pa.list_(value, math.prod(plan.shape))
    if enc == "blob":
        return pa.struct(
            [pa.field("data", pa.large_binary()), pa.field("shape", pa.list_(pa.int64()))]
        )
    if enc == "plain":
        return _value_type(plan.spec.dtype)
    if enc == "bytes":
        return pa.large_binary()
    return pa.string()


def check_column_types(
    schema: pa.Schema, plans: Mapping[str, ColumnPlan], source: str,
    columns: Mapping[str, str] | None = None,
) -> None:
    """Refuse a numeric column stored as another type than its plan says.

    The values of a ``plain`` or ``fixed`` column are cast to the plan's dtype when read:
    a column the writer never made (a float64 column under an int64 plan, in a crafted
    shard) would be read as wrong values without a word. The other encodings fail on
    their own when their type is not the plan's. ``columns`` maps a field to the column
    that holds it where the names differ (Lance's escaped names).
    """
    names = set(schema.names)  # a fresh list per call: once here, not once per column
    for name, plan in plans.items():
        column = columns.get(name, name) if columns else name
        if plan.encoding not in ("plain", "fixed") or column not in names:
            continue
        actual = schema.field(column).type
        if isinstance(actual, pa.BaseExtensionType):
            actual = actual.storage_type
        expected = _arrow_type(plan, tensor_extension=False)
        if not actual.equals(expected):
            raise FormatError(
                f"{source}: column {column!r} is stored as {actual}, where its plan says "
                f"{expected}"
            )


def shard_metadata(plans: Sequence[ColumnPlan], stats: Mapping[str, Any] | None) -> bytes:
    """The one ``simstore`` schema-metadata value: kind, version, columns, statistics."""
    columns = [
        {**p.spec.to_json(), "encoding": p.encoding, "shape": list(p.shape), "shuffle": p.shuffle}
        for p in plans
    ]
    doc = {
        "kind": "shard",
        "format_version": SHARD_FORMAT_VERSION,
        "columns": columns,
        "stats": dict(stats or {}),
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def arrow_schema(
    plans: Sequence[ColumnPlan],
    stats: Mapping[str, Any] | None = None,
    *,
    tensor_extension: bool = True,
    field_metadata: Mapping[bytes, bytes] | None = None,
) -> pa.Schema:
    """The Arrow schema of a shard: ``__key__`` then one column per plan.

    ``field_metadata`` (at most one entry, see the module docstring) goes on every column.
    """
    fm = dict(field_metadata) if field_metadata else None
    fields = [pa.field(KEY_COLUMN, pa.string(), nullable=False, metadata=fm)]
    for plan in plans:
        fields.append(
            pa.field(plan.name, _arrow_type(plan, tensor_extension), nullable=True, metadata=fm)
        )
    return pa.schema(fields, metadata={b"simstore": shard_metadata(plans, stats)})


def _mask(missing: list[bool]) -> pa.Array | None:
    return pa.array(missing, pa.bool_()) if any(missing) else None


def _encode_column(
    plan: ColumnPlan, values: list[Any], arrow_type: pa.DataType
) -> pa.Array | pa.ChunkedArray:
    missing = [v is None for v in values]
    mask = _mask(missing)
    enc = plan.encoding
    if enc in ("fixed", "blob", "plain"):
        dtype = np.dtype(plan.spec.dtype)
        if enc == "plain":
            flat = np.array(
                [np.asarray(v, dtype=dtype).reshape(()) if v is not None else 0 for v in values],
                dtype=dtype,
            )
            return numpy_column(flat, mask=np.array(missing) if any(missing) else None)
        arrays = [
            np.ascontiguousarray(np.asarray(v, dtype=dtype)) if v is not None else None
            for v in values
        ]
        if enc == "fixed":
            size = math.prod(plan.shape)
            zeros = np.zeros(size, dtype=dtype)
            flat = np.concatenate([a.reshape(-1) if a is not None else zeros for a in arrays])
            storage = pa.FixedSizeListArray.from_arrays(numpy_column(flat), size, mask=mask)
            if isinstance(arrow_type, pa.ExtensionType):
                return pa.ExtensionArray.from_storage(arrow_type, storage)
            return storage
        return _blob_struct(arrays, plan.shuffle, missing)
    if enc == "bytes":
        return pa.array([bytes(v) if v is not None else None for v in values], pa.large_binary())
    if enc == "json":
        return pa.array(
            [canonical_json(v).decode("utf-8") if v is not None else None for v in values],
            pa.string(),
        )
    return pa.array(values, pa.string())


def _le_bytes(a: np.ndarray, shuffle: int) -> np.ndarray:
    """A tensor's little-endian bytes as uint8, byte-shuffled when ``shuffle``."""
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    raw = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    if shuffle:
        from numcodecs import Shuffle

        return np.frombuffer(Shuffle(elementsize=shuffle).encode(raw), dtype=np.uint8)
    return raw


_ZERO_COPY_ROW_BYTES = 1 << 20


def _binary(parts: Sequence[np.ndarray]) -> pa.Array:
    offsets = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum([p.size for p in parts], out=offsets[1:])
    data = (
        parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else np.zeros(0, np.uint8)
    )
    return pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), len(parts), [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )


def _blob_struct(
    arrays: Sequence[np.ndarray | None], shuffle: int, missing: Sequence[bool]
) -> pa.Array | pa.ChunkedArray:
    """The ``struct<data, shape>`` column of some tensors.

    Big rows (1 MiB or more on average) become one chunk each that wraps the tensor's
    own buffer, so the bytes are not copied before Parquet writes them; small rows are
    concatenated into one chunk.
    """
    parts = [_le_bytes(a, shuffle) if a is not None else np.zeros(0, np.uint8) for a in arrays]
    shapes = [list(a.shape) if a is not None else [] for a in arrays]
    groups = (
        [[i] for i in range(len(parts))]
        if parts and sum(p.size for p in parts) >= _ZERO_COPY_ROW_BYTES * len(parts)
        else [list(range(len(parts)))]
    )
    chunks = []
    for g in groups:
        data = _binary([parts[i] for i in g])
        shape = pa.array([shapes[i] for i in g], pa.list_(pa.int64()))
        m = [missing[i] for i in g]
        mask = pa.array(m, pa.bool_()) if any(m) else None
        chunks.append(pa.StructArray.from_arrays([data, shape], names=["data", "shape"], mask=mask))
    return chunks[0] if len(chunks) == 1 else pa.chunked_array(chunks)


def encode_table(
    samples: Sequence[Sample], plans: Sequence[ColumnPlan], schema: pa.Schema
) -> pa.Table:
    """One table of samples laid out by ``plans`` (lazy fields are read whole)."""
    columns: list[pa.Array | pa.ChunkedArray] = [pa.array([s.key for s in samples], pa.string())]
    for plan in plans:
        values = [
            materialise(s.fields[plan.name]) if plan.name in s.fields else None for s in samples
        ]
        columns.append(_encode_column(plan, values, schema.field(plan.name).type))
    return pa.Table.from_arrays(columns, schema=schema)


def plans_from_schema(schema: pa.Schema, *, source: str = "shard") -> dict[str, ColumnPlan]:
    """Column plans recorded in a shard's schema; FormatError when it is not a simstore shard."""
    doc = shard_document(schema, source=source)
    plans: dict[str, ColumnPlan] = {}
    try:
        for col in doc["columns"]:
            spec = FieldSpec.from_json(col)
            encoding = str(col["encoding"])
            if encoding not in ENCODINGS:
                raise ValueError(f"unknown encoding {encoding!r}")
            shape = tuple(int(n) for n in col.get("shape", []))
            shuffle = int(col.get("shuffle", 0))
            plans[spec.name] = ColumnPlan(spec, encoding, shape, shuffle)  # type: ignore[arg-type]
    except (KeyError, TypeError, ValueError) as exc:
        raise FormatError(f"{source}: malformed simstore column metadata: {exc}") from exc
    return plans


def shard_document(schema: pa.Schema, *, source: str = "shard") -> dict[str, Any]:
    """The parsed ``simstore`` schema metadata of a columnar shard (FormatError if absent)."""
    raw = (schema.metadata or {}).get(b"simstore")
    if raw is None:
        raise FormatError(f"{source} is not a simstore shard (no simstore schema metadata)")
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # or nested too deeply
        raise FormatError(f"{source}: simstore schema metadata is not JSON") from exc
    if not isinstance(doc, dict) or doc.get("kind") != "shard":
        raise FormatError(f"{source} is not a simstore shard")
    if doc.get("format_version") != SHARD_FORMAT_VERSION:
        raise version_error(f"{source} has shard", doc.get("format_version"),
                            SHARD_FORMAT_VERSION)
    return doc


def scalar_out(value: Any, dtype: str) -> Any:
    """A scalar as read back: Python int/float/bool for the default dtypes, else numpy."""
    if dtype in ("int64", "float64"):
        return value.item() if isinstance(value, np.generic) else value
    if dtype == "bool":
        return bool(value)
    return np.dtype(dtype).type(value)


Out = Callable[[int, str, tuple[int, ...], np.dtype[Any]], Any]
"""``out(i, field, shape, dtype)``: a writable C-contiguous array for row ``i``, or None.

An ``out`` may also have ``many(rows, field, shape, dtype)``, giving ``(buffer, index,
row arrays)`` to fill several equal-shaped rows in one scatter ``buffer[index] = ...``.
"""


def _many(
    out: Out | None, n: int, name: str, shape: tuple[int, ...], dtype: np.dtype[Any]
) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]] | None:
    many = getattr(out, "many", None)
    if many is None or n == 0:
        return None
    got: tuple[np.ndarray, np.ndarray, list[np.ndarray]] | None = many(
        range(n), name, shape, dtype
    )
    return got


class _Mapped:
    """``out`` seen through an index map: row ``i`` here is row ``index(i)`` there."""

    __slots__ = ("_by", "_index", "_out", "many")

    def __init__(self, out: Out, by: int = 0, index: Sequence[int] | None = None) -> None:
        self._out = out
        self._by = by
        self._index = index
        inner = getattr(out, "many", None)
        self.many = self._many if inner is not None else None

    def _at(self, i: int) -> int:
        return self._index[i] if self._index is not None else i + self._by

    def __call__(self, i: int, name: str, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        return self._out(self._at(i), name, shape, dtype)

    def _many(self, rows: Sequence[int], name: str, shape: tuple[int, ...],
              dtype: np.dtype[Any]) -> Any:
        return self._out.many([self._at(i) for i in rows], name, shape, dtype)  # type: ignore[attr-defined]


def shifted_out(out: Out, by: int) -> Out:
    """``out`` for rows numbered from ``by``: row ``i`` here is row ``i + by`` there."""
    return out if by == 0 else _Mapped(out, by=by)


def mapped_out(out: Out, index: Sequence[int]) -> Out:
    """``out`` through an index map: row ``i`` here is row ``index[i]`` there."""
    return _Mapped(out, index=index)


def _fixed_values(plan: ColumnPlan, col: pa.Array) -> pa.Array:
    """The flat values under a fixed-shape column's rows (``len(col) * prod(shape)``)."""
    storage = col.storage if isinstance(col, pa.ExtensionArray) else col
    size = math.prod(plan.shape)
    return storage.values.slice(storage.offset * size, len(col) * size)


def _blob_buffers(col: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A blob column's ``(bytes, byte offsets, shape offsets, shape values)`` as arrays.

    Row ``r``'s bytes are ``bytes[offsets[r]:offsets[r + 1]]`` and its shape
    ``shape values[shape offsets[r]:shape offsets[r + 1]]``.
    """
    data = col.field("data")
    shape_at, shape_values = blob_shapes(col.field("shape"), len(col))
    bufs = data.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int64)[data.offset : data.offset + len(data) + 1]
    buf = bufs[2]
    raw = np.frombuffer(buf, dtype=np.uint8) if buf is not None else np.zeros(0, np.uint8)
    return raw, offsets, shape_at, shape_values


def blob_shapes(shape_col: pa.Array, n: int) -> tuple[np.ndarray, np.ndarray]:
    """A blob column's ``shape`` child of ``n`` rows as ``(offsets, values)``.

    Row ``r``'s shape is ``values[offsets[r]:offsets[r + 1]]``.
    """
    shape_at = np.frombuffer(shape_col.buffers()[1], dtype=np.int32)[
        shape_col.offset : shape_col.offset + n + 1
    ]
    return shape_at, shape_col.values.to_numpy(zero_copy_only=False)


def uniform_shape(
    shape_at: np.ndarray, shape_values: np.ndarray, n: int
) -> tuple[int, ...] | None:
    """The one shape of ``n`` rows (see :func:`blob_shapes`), or None if they differ."""
    ndims = np.diff(shape_at)
    if (ndims != ndims[0]).any():
        return None
    d = int(ndims[0])
    start = int(shape_at[0])
    dims = shape_values[start : start + d * n].reshape(n, d)
    if d and (dims != dims[0]).any():
        return None
    return tuple(int(x) for x in dims[0]) if d else ()


def _decode_column(
    plan: ColumnPlan, col: pa.Array, rows: np.ndarray | None = None, out: Out | None = None
) -> list[Any]:
    """Values of ``col`` at ``rows`` (all rows when None); tensors into ``out`` where given."""
    n = len(col) if rows is None else len(rows)
    idx = np.arange(n) if rows is None else rows
    if col.null_count:
        all_nulls = col.is_null().to_numpy(zero_copy_only=False)
        nulls = all_nulls if rows is None else all_nulls[rows]
    else:
        nulls = np.zeros(n, bool)
    enc = plan.encoding
    if enc == "fixed":
        values = _fixed_values(plan, col)
        if values.null_count:  # take() leaves null children under null rows
            values = values.fill_null(False if pa.types.is_boolean(values.type) else 0)
        flat = values.to_numpy(zero_copy_only=False)
        arr = flat.reshape((len(col), *plan.shape))
        native = np.dtype(plan.spec.dtype)
        result: list[Any] = [None] * n
        rest = []
        for i in range(n):
            if nulls[i]:
                continue
            target = out(i, plan.name, tuple(plan.shape), native) if out is not None else None
            if target is None:
                rest.append(i)
            else:
                target[...] = arr[idx[i]]
                result[i] = target
        if rest:
            sel = arr if rows is None else arr[idx]
            if not sel.flags.writeable:
                sel = sel.copy()
            for i in rest:
                result[i] = sel[i]
        return result
    if enc == "blob":
        return _decode_blob(plan, col, nulls, idx, out)
    sub = col if rows is None else col.take(pa.array(rows, type=pa.int64()))
    if enc == "plain":
        fill = False if pa.types.is_boolean(sub.type) else 0
        vals = sub.fill_null(fill).to_numpy(zero_copy_only=False)
        plain: list[Any] = [None] * n
        for i in range(n):
            if not nulls[i]:
                if plan.spec.kind == "tensor":
                    plain[i] = np.array(vals[i], dtype=plan.spec.dtype)
                else:
                    plain[i] = scalar_out(vals[i], plan.spec.dtype)
        return plain
    py = sub.to_pylist()
    if enc == "json":
        try:
            return [json.loads(v) if v is not None else None for v in py]
        except (ValueError, RecursionError) as exc:  # a crafted shard: not JSON, or too deep
            raise FormatError(f"field {plan.spec.name!r} holds a value that is not "
                              f"readable JSON: {one_line(str(exc))}") from exc
    return list(py)


def _decode_blob(
    plan: ColumnPlan, col: pa.Array, nulls: np.ndarray, idx: np.ndarray, out: Out | None
) -> list[Any]:
    """Tensors of a blob column's rows ``idx``, each copied once.

    A row goes into the array ``out`` gives for it, else into one buffer per call that the
    remaining rows are views of.
    """
    raw, offsets, shape_at, shape_values = _blob_buffers(col)
    dtype = np.dtype(plan.spec.dtype).newbyteorder("<")
    native = np.dtype(plan.spec.dtype)
    shuffle = plan.shuffle  # byte-shuffled elements of this size (0: not shuffled)
    n = len(idx)
    result: list[Any] = [None] * n
    rest: list[tuple[int, tuple[int, ...]]] = []
    for i in range(n):
        if nulls[i]:
            continue
        r = int(idx[i])
        shape = tuple(shape_values[int(shape_at[r]) : int(shape_at[r + 1])].tolist())
        target = None
        if out is not None and (not shuffle or dtype == native):
            target = out(i, plan.name, shape, native)
        if target is None:
            rest.append((i, shape))
            continue
        part = raw[int(offsets[r]) : int(offsets[r + 1])]
        _check_size(plan, part.size, shape, dtype)
        if shuffle:
            byte_unshuffle(part, shuffle, target.reshape(-1).view(np.uint8))
        elif dtype == native:
            target.reshape(-1).view(np.uint8)[:] = part
        else:
            target[...] = part.view(dtype).reshape(shape)
        result[i] = target
    if not rest:
        return result
    spans = [(int(offsets[int(idx[i])]), int(offsets[int(idx[i]) + 1])) for i, _ in rest]
    flat = np.empty(sum(b - a for a, b in spans), dtype=np.uint8)
    at = 0
    for (i, shape), (a, b) in zip(rest, spans, strict=True):
        _check_size(plan, b - a, shape, dtype)
        part = flat[at : at + b - a]
        part[:] = raw[a:b]
        at += b - a
        if shuffle:
            part = byte_unshuffle(part, shuffle, np.empty(b - a, dtype=np.uint8))
        arr = part.view(dtype).reshape(shape)
        result[i] = arr if dtype == native else arr.astype(native)
    return result


def byte_unshuffle(raw: np.ndarray, size: int, out: np.ndarray) -> np.ndarray:
    """Undo a byte shuffle of ``size``-byte elements from ``raw`` into ``out``; return ``out``.

    ``numcodecs.Shuffle(size)``'s layout: byte ``j`` of every element, then byte ``j + 1``,
    ...; ``out`` is uint8, as long as ``raw``.

    Not through numcodecs: its import (9-10 ms here) would fall inside a fresh process's
    first batch of a compressed shard. The C version is 12x numcodecs' speed for float32
    (4 MiB: 0.08 against 1.04 ms); without it, NumPy's transpose gives the same bytes.
    """
    n = raw.size // size
    if raw.size != n * size or out.size != raw.size:
        raise ValueError(f"{raw.size} bytes are not whole elements of {size}")
    if _rows is not None:
        _rows.unshuffle(np.ascontiguousarray(raw), out, size)
    else:
        out.reshape(n, size)[...] = raw.reshape(size, n).T
    return out


def _check_size(plan: ColumnPlan, size: int, shape: tuple[int, ...],
                dtype: np.dtype[Any]) -> None:
    """Raise :class:`FormatError` unless a blob of ``size`` bytes holds ``shape`` values."""
    need = math.prod(shape) * dtype.itemsize
    if size != need:
        raise FormatError(
            f"field {plan.name!r}: a value of {size} bytes where its shape {list(shape)} "
            f"needs {need}"
        )


Piece = tuple[pa.Table, "np.ndarray | None", int, "dict[str, Any] | None"]
"""``(table, rows, count, memo)``: rows ``rows`` of ``table`` (None: all), ``count`` of
them, and the dict kept with a cached table (None for a table read for this call)."""


def decode_rows(
    table: pa.Table,
    plans: Mapping[str, ColumnPlan],
    rows: np.ndarray | None = None,
    out: Out | None = None,
    *,
    memo: dict[str, Any] | None = None,
) -> list[dict[str, FieldValue]]:
    """Field dicts of rows ``rows`` of ``table`` (all when None); its columns: fields in ``plans``.

    Arrays are writable: rows of ``out``'s arrays where it gives them, else copies that
    share one buffer per column. With an ``out`` that has ``many``, a column whose rows
    all have one shape is scattered into its buffer in one step. ``memo``, a dict that
    lives as long as ``table`` (a reader keeps it with a cached row group), holds what
    decoding a column prepared, so reading a few rows of a cached table many times does
    that work once.
    """
    n = table.num_rows if rows is None else len(rows)
    return decode_pieces([(table, rows, n, memo)], plans, out)


def decode_pieces(
    pieces: Sequence[Piece], plans: Mapping[str, ColumnPlan], out: Out | None = None
) -> list[dict[str, FieldValue]]:
    """Field dicts of several tables' rows, in order: :func:`decode_rows` over ``pieces``.

    The pieces (one per row group a read touches, all with the same columns) are decoded
    column by column. With an ``out`` that has ``many``, a column whose rows have one
    shape in every piece asks ``out`` for all its rows at once and is gathered piece by
    piece into that buffer: a shuffled read takes a few rows from each of many row
    groups, and this keeps the work per piece to one gather.
    """
    n = sum(p[2] for p in pieces)
    result: list[dict[str, FieldValue]] = [{} for _ in range(n)]
    if not pieces:
        return result
    bulk = out is not None and getattr(out, "many", None) is not None
    for name in pieces[0][0].column_names:
        plan = plans.get(name)
        if plan is None:
            continue
        prepared: list[Any] = []
        if bulk:
            assert out is not None
            prepared = [_prepared(plan, table, name, memo) for table, _, _, memo in pieces]
            parts = [(p, rows, count) for p, (_, rows, count, _) in zip(prepared, pieces,
                                                                         strict=True)]
            if all(p is not False for p in prepared) and _decode_prepared(
                plan, parts, n, out, result
            ):
                continue
        done = 0
        for k, (table, rows, count, _) in enumerate(pieces):
            part = result[done : done + count]
            part_out = shifted_out(out, done) if out is not None else None
            if not (
                part_out is not None
                and prepared
                and prepared[k] is not False
                and _decode_prepared(plan, [(prepared[k], rows, count)], count, part_out, part)
            ):
                values = _decode_column(plan, _column(table, name), rows, part_out)
                for i, value in enumerate(values):
                    if value is not None:
                        part[i][name] = value
            done += count
    return result


def _prepared(
    plan: ColumnPlan, table: pa.Table, name: str, memo: dict[str, Any] | None
) -> tuple[np.ndarray, tuple[int, ...], Any] | Literal[False]:
    """:func:`_prepare` of a table's column, kept in its memo (a cached table is read often)."""
    prepared: tuple[np.ndarray, tuple[int, ...], Any] | Literal[False] | None = (
        memo.get(name) if memo is not None else None
    )
    if prepared is None:
        prepared = _prepare(plan, _column(table, name))
        if memo is not None:
            memo[name] = prepared
    return prepared


def _column(table: pa.Table, name: str) -> pa.Array:
    chunked = table.column(name)
    return chunked.chunk(0) if chunked.num_chunks == 1 else chunked.combine_chunks()


def _prepare(
    plan: ColumnPlan, col: pa.Array
) -> tuple[np.ndarray, tuple[int, ...], Any] | Literal[False]:
    """``(rows matrix, shape, dtype)`` of a column whose rows are all one shape, or False.

    The matrix's row ``r`` holds row ``r``'s value (a fixed column: the values; a blob
    column of equal-sized rows: its bytes; a plain column of 0-d numeric tensors: the
    values, one per row); nulls, byte-swapped, shuffled or ragged columns are False and go
    through :func:`_decode_column`.
    """
    if col.null_count or len(col) == 0 or plan.encoding not in ("fixed", "blob", "plain"):
        return False  # strings, bytes and JSON have no array layout
    # 0-d tensors (a .npz's or an HDF5 file's scalar arrays) scatter into a column buffer
    # like fixed values: no per-row array and no stack of them per batch. Scalar
    # parameters read back as Python numbers, so they stay per row
    if plan.encoding == "plain" and (plan.spec.kind != "tensor" or plan.spec.ndim != 0):
        return False
    native = np.dtype(plan.spec.dtype)
    if plan.encoding == "plain":
        if native.kind not in "biuf":
            return False
        arr = col.to_numpy(zero_copy_only=False)
        return (arr, (), native) if arr.dtype == native else False
    if plan.encoding == "fixed":
        values = _fixed_values(plan, col)
        if values.null_count:
            return False
        arr = values.to_numpy(zero_copy_only=False).reshape((len(col), *plan.shape))
        return (arr, tuple(plan.shape), native) if arr.dtype == native else False
    if plan.encoding != "blob" or plan.shuffle or np.dtype(plan.spec.dtype).newbyteorder(
        "<"
    ) != native:
        return False
    raw, offsets, shape_at, shape_values = _blob_buffers(col)
    shape = uniform_shape(shape_at, shape_values, len(col))
    if shape is None:
        return False
    width = math.prod(shape) * native.itemsize
    if width == 0 or (np.diff(offsets) != width).any() or len(raw) < int(offsets[-1]):
        return False
    base = int(offsets[0])
    return raw[base : base + width * len(col)].reshape(len(col), width), shape, native


def _decode_prepared(
    plan: ColumnPlan,
    parts: Sequence[tuple[tuple[np.ndarray, tuple[int, ...], Any], np.ndarray | None, int]],
    n: int,
    out: Out,
    result: list[dict[str, FieldValue]],
) -> bool:
    """Prepared pieces of a column scattered into ``out``'s buffer; False if it declines.

    ``parts`` are ``(prepared, rows, count)`` per piece, ``n`` rows in all. The pieces
    must agree on shape and dtype; if they do not, or ``out`` declines, nothing is written.
    """
    shape, native = parts[0][0][1], parts[0][0][2]
    if any(p[1] != shape or p[2] != native for p, _, _ in parts):
        return False
    bulk = _many(out, n, plan.name, shape, native)
    if bulk is None:
        return False
    buffer, index, rows_out = bulk
    fixed = plan.encoding != "blob"  # values, not bytes
    target = buffer if fixed else buffer.reshape(len(buffer), -1).view(np.uint8)
    done = 0
    for (matrix, _, _), rows, count in parts:
        where = index[done : done + count]
        if fixed or matrix.shape[1] < (64 << 10):
            target[where] = matrix if rows is None else matrix[rows]
        else:  # large rows: one copy each, no gathered temporary
            picks = range(count) if rows is None else rows.tolist()
            for k, r in zip(where.tolist(), picks, strict=True):
                target[k] = matrix[r]
        done += count
    name = plan.name
    for i, row in enumerate(rows_out):
        result[i][name] = row
    return True
