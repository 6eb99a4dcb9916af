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
that lacks a field has a null there and reads back without it. This module plans and
encodes the columns; reading rows back into NumPy is :mod:`._arrow_decode`.
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
from simstore.errors import FormatError, InvalidInputError, version_error
from simstore.ingest import is_array_source, spec_of_value
from simstore.sample import FieldSpec, FieldValue, Sample, canonical_json

__all__ = [
    "KEY_COLUMN",
    "SHARD_FORMAT_VERSION",
    "ColumnPlan",
    "arrow_schema",
    "encode_table",
    "materialise",
    "memory_pool",
    "plan_columns",
    "plans_from_schema",
    "shard_document",
    "shard_metadata",
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
