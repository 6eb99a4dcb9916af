"""Samples, field specs and schemas. Pure.

A sample is a key (unique within a dataset) plus named fields. A field value is one of:

- ``tensor``: a numpy array of a numeric or bool dtype (a mesh is several tensor fields:
  ``points``, ``cells/<type>``, ``point_data/<name>``, ``cell_data/<name>``);
- ``scalar``: an int, float or bool parameter;
- ``string``: a str parameter;
- ``bytes``: opaque bytes (for example the original bytes of a CAD file);
- ``json``: a small JSON-serialisable dict (metadata).

The sample hash is computed here from a canonical, length-prefixed encoding of the field
names, kinds, dtypes, shapes and raw bytes, so it is the same whatever shard format stores
the sample, and equal content always gets an equal hash.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

import numpy as np

from simstore.errors import FormatError, InvalidInputError
from simstore.hashing import Hasher, ObjectId

__all__ = [
    "FieldKind",
    "FieldSpec",
    "FieldSpecJSON",
    "FieldValue",
    "Sample",
    "Schema",
    "field_kind",
    "hash_sample",
    "infer_schema",
    "merge_schema",
    "sample_size_bytes",
    "spec_of",
]

FieldKind = Literal["tensor", "scalar", "string", "bytes", "json"]
FieldValue = np.ndarray | int | float | bool | str | bytes | Mapping[str, object]

_NUMERIC_KINDS = "biuf"


@dataclass(frozen=True, slots=True)
class Sample:
    """One training sample: a key and its named field values."""

    key: str
    fields: Mapping[str, FieldValue] = field(default_factory=dict)


class FieldSpecJSON(TypedDict):
    """JSON shape of a :class:`FieldSpec`."""

    name: str
    kind: str
    dtype: str
    ndim: int


@dataclass(frozen=True, slots=True, kw_only=True)
class FieldSpec:
    """The type of one field: kind, dtype (tensor and scalar) and rank (tensor)."""

    name: str
    kind: FieldKind
    dtype: str = ""
    ndim: int = 0

    def to_json(self) -> FieldSpecJSON:
        """The JSON shape of this spec."""
        return {"name": self.name, "kind": self.kind, "dtype": self.dtype, "ndim": self.ndim}

    @classmethod
    def from_json(cls, obj: Mapping[str, object]) -> FieldSpec:
        """Parse the JSON shape; raise :class:`FormatError` when malformed."""
        try:
            kind = str(obj["kind"])
            if kind not in ("tensor", "scalar", "string", "bytes", "json"):
                raise ValueError(f"unknown kind {kind!r}")
            ndim = obj.get("ndim", 0)
            if not isinstance(ndim, int):
                raise ValueError("ndim is not an integer")
            return cls(
                name=str(obj["name"]),
                kind=kind,  # type: ignore[arg-type]
                dtype=str(obj.get("dtype", "")),
                ndim=ndim,
            )
        except (KeyError, ValueError, TypeError) as exc:
            raise FormatError(f"invalid field spec {obj!r}: {exc}") from exc

    def describe(self) -> str:
        """Human-readable type, for error messages (``tensor float32 rank 3``)."""
        if self.kind == "tensor":
            return f"tensor {self.dtype} rank {self.ndim}"
        if self.kind == "scalar":
            return f"scalar {self.dtype}"
        return self.kind


Schema = tuple[FieldSpec, ...]


def field_kind(value: object) -> FieldKind:
    """The kind of a field value; raise :class:`InvalidInputError` for unsupported values."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in _NUMERIC_KINDS:
            raise InvalidInputError(
                f"unsupported array dtype {value.dtype} (object and string arrays are refused)"
            )
        return "tensor"
    if isinstance(value, bool | int | float | np.generic):
        if isinstance(value, np.generic) and value.dtype.kind not in _NUMERIC_KINDS:
            raise InvalidInputError(f"unsupported scalar dtype {value.dtype}")
        return "scalar"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bytes | bytearray | memoryview):
        return "bytes"
    if isinstance(value, Mapping):
        return "json"
    raise InvalidInputError(f"unsupported field value of type {type(value).__name__}")


def _scalar_dtype(value: object) -> str:
    if isinstance(value, np.generic):
        return _dtype_name(value.dtype)
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int64"
    return "float64"


_DTYPE_NAMES: dict[np.dtype[Any], str] = {}


def _dtype_name(dtype: np.dtype[Any]) -> str:
    """``str(dtype)``, remembered: numpy 2 builds the name in Python on every call."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES.setdefault(dtype, str(dtype))
    return name


def spec_of(name: str, value: FieldValue) -> FieldSpec:
    """The :class:`FieldSpec` of one field value."""
    if type(value) is np.ndarray and value.dtype.kind in _NUMERIC_KINDS:
        return FieldSpec(name=name, kind="tensor", dtype=_dtype_name(value.dtype), ndim=value.ndim)
    kind = field_kind(value)
    if kind == "tensor":
        assert isinstance(value, np.ndarray)
        return FieldSpec(name=name, kind="tensor", dtype=_dtype_name(value.dtype), ndim=value.ndim)
    if kind == "scalar":
        return FieldSpec(name=name, kind="scalar", dtype=_scalar_dtype(value))
    return FieldSpec(name=name, kind=kind)


def canonical_json(obj: object) -> bytes:
    """Canonical JSON bytes: sorted keys, no spaces, UTF-8, NaN refused."""
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def _put(h: Hasher, data: bytes | memoryview) -> None:
    h.update(struct.pack("<Q", len(data)))
    h.update(data)


def hash_sample(sample: Sample) -> ObjectId:
    """The content hash of a sample, independent of how or where it is stored.

    The key is not part of the hash: two keys holding equal content have equal hashes.
    """
    h = Hasher()
    h.update(b"simstore-sample-v1")
    for name in sorted(sample.fields):
        value = sample.fields[name]
        spec = spec_of(name, value)
        _put(h, name.encode("utf-8"))
        _put(h, spec.kind.encode())
        if spec.kind == "tensor":
            assert isinstance(value, np.ndarray)
            arr = np.ascontiguousarray(value)
            _put(
                h,
                arr.dtype.newbyteorder("<").str.encode()
                if arr.dtype.byteorder != "|"
                else arr.dtype.str.encode(),
            )
            _put(h, struct.pack(f"<{arr.ndim}q", *arr.shape))
            if arr.dtype.byteorder == ">":
                arr = arr.astype(arr.dtype.newbyteorder("<"))
            _put(h, arr.reshape(-1).view(np.uint8).data)
        elif spec.kind == "scalar":
            _put(h, spec.dtype.encode())
            _put(
                h,
                np.asarray(value, dtype=spec.dtype)
                .astype(np.dtype(spec.dtype).newbyteorder("<"))
                .tobytes(),
            )
        elif spec.kind == "string":
            assert isinstance(value, str)
            _put(h, value.encode("utf-8"))
        elif spec.kind == "bytes":
            _put(h, bytes(value))  # type: ignore[arg-type]
        else:
            _put(h, canonical_json(value))
    return h.hexdigest()


def sample_size_bytes(sample: Sample) -> int:
    """Logical size of a sample: the raw bytes of its field values."""
    total = 0
    for value in sample.fields.values():
        if isinstance(value, np.ndarray):
            total += value.nbytes
        elif isinstance(value, str):
            total += len(value.encode("utf-8"))
        elif isinstance(value, bytes | bytearray | memoryview):
            total += len(value)
        elif isinstance(value, Mapping):
            total += len(canonical_json(value))
        else:
            total += 8
    return total


def infer_schema(samples: Iterable[Sample]) -> Schema:
    """The schema of some samples (first spec seen per field), sorted by field name."""
    specs: dict[str, FieldSpec] = {}
    for sample in samples:
        for name, value in sample.fields.items():
            specs.setdefault(name, spec_of(name, value))
    return tuple(specs[n] for n in sorted(specs))


def merge_schema(
    old: Schema, new: Schema, *, source: str = "", allow_change: bool = False
) -> Schema:
    """Merge a new schema into an old one.

    New fields are added. A field whose kind, dtype or rank changes raises
    :class:`InvalidInputError` naming the field, the ``source`` and both types, unless
    ``allow_change`` (then the new type wins).
    """
    merged = {s.name: s for s in old}
    for spec in new:
        prev = merged.get(spec.name)
        if prev is not None and prev != spec and not allow_change:
            where = f"{source}: " if source else ""
            raise InvalidInputError(
                f"{where}field {spec.name!r} changes type from {prev.describe()} to "
                f"{spec.describe()} (use --allow-schema-change to accept)"
            )
        merged[spec.name] = spec
    return tuple(merged[n] for n in sorted(merged))
