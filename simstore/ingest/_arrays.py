"""Array sources (dense fields read in slices) and the streaming sample hash.

An adapter yields an :class:`ArraySource` instead of a numpy array for a field too big to
hold; everything here reads such a field in bounded blocks, so hashing, summarising and
sizing a sample never needs the whole array in memory.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np

from simstore.errors import InvalidInputError
from simstore.hashing import Hasher, ObjectId
from simstore.sample import FieldSpec, Sample, canonical_json, spec_of

__all__ = [
    "RESERVED_FIELD_NAMES",
    "MiB",
    "ArraySource",
    "hash_sample_blocks",
    "is_array_source",
    "iter_blocks",
    "sample_nbytes",
    "spec_of_value",
]

MiB = 1 << 20


@runtime_checkable
class ArraySource(Protocol):
    """A dense field too large to hold: shape, dtype and reads by slices.

    Adapters yield these instead of numpy arrays for big arrays (an HDF5 dataset, a Zarr
    array, a memory-mapped .npy). ``dtype`` must be a numeric or bool dtype in native byte
    order, and ``__getitem__`` takes a tuple of ``slice`` (step 1), one per axis, and returns
    a numpy array. A source is valid only while the adapter's iterator has not moved on.
    """

    @property
    def shape(self) -> tuple[int, ...]:
        """The array's shape."""
        ...

    @property
    def dtype(self) -> np.dtype[Any]:
        """The array's dtype (numeric or bool, native byte order)."""
        ...

    def __getitem__(self, key: tuple[slice, ...]) -> np.ndarray:
        """The values in a box of slices."""
        ...


# values that are never array sources: answered without the (slow) runtime protocol check
_PLAIN_VALUES = (np.ndarray, np.generic, str, bytes, bytearray, memoryview, bool, int, float, dict)


def is_array_source(value: object) -> bool:
    """Whether a field value is a lazy :class:`ArraySource` (not an in-memory array)."""
    return not isinstance(value, _PLAIN_VALUES) and isinstance(value, ArraySource)


def _native(arr: np.ndarray) -> np.ndarray:
    arr = np.ascontiguousarray(arr)
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("="))
    return arr


def iter_blocks(array: np.ndarray | ArraySource, max_bytes: int) -> Iterator[np.ndarray]:
    """The array's values as C-ordered, contiguous, native-endian blocks of bounded size.

    Concatenating the blocks' bytes gives the array's C-order bytes. A block spans whole
    trailing axes: the outermost axis whose trailing extent fits in ``max_bytes`` is cut
    into slabs, and the axes before it are walked in order. A block is larger than
    ``max_bytes`` only when one row of the last axis is.
    """
    shape = tuple(int(n) for n in array.shape)
    itemsize = np.dtype(array.dtype).itemsize
    if len(shape) == 0:
        yield _native(np.asarray(array[()]).reshape(()))
        return
    if math.prod(shape) == 0:
        return
    k = len(shape) - 1
    for axis in range(len(shape)):
        if math.prod(shape[axis + 1 :]) * itemsize <= max_bytes:
            k = axis
            break
    row_bytes = max(1, math.prod(shape[k + 1 :]) * itemsize)
    step = max(1, max_bytes // row_bytes)
    tail = tuple(slice(0, n) for n in shape[k + 1 :])
    for outer in np.ndindex(*shape[:k]):
        head = tuple(slice(i, i + 1) for i in outer)
        for start in range(0, shape[k], step):
            box = (*head, slice(start, min(shape[k], start + step)), *tail)
            yield _native(np.asarray(array[box]))


RESERVED_FIELD_NAMES: dict[str, str] = {
    "__key__": "the sample's key (a column of every Parquet and Lance shard, and a "
    "key of every sample the loader gives)",
    "__pad__": "the flag the loader gives every sample to mark padding",
}
"""Names no field may take, and what each is used for: a field of such a name would be
overwritten by the loader (or refused by a shard format), so it is refused at ingest."""

RESERVED_FIELD_SUFFIXES: dict[str, str] = {
    "__present": "the flags the loader's collate adds for a field some samples lack",
    "__mask": "the mask the loader's collate adds for a padded field",
    "__offsets": "the offsets the loader's collate adds for a packed field",
}
"""Endings no field name may have: a batch holds ``<field><ending>`` beside the field."""

MAX_FIELD_NAME_BYTES = 4096
"""The longest field name (UTF-8 bytes): a Zarr shard names each field in zip entries of
at most 65,535 bytes, and no real field needs more than a path's worth."""


def check_field_name(name: str) -> None:
    """Refuse a field name no shard format and loader batch can carry back as it is."""
    if not isinstance(name, str):
        raise InvalidInputError(
            f"a field name must be text, not {type(name).__name__} ({name!r:.60}); "
            "name the field with a str")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: a name of bytes that are not UTF-8
        try:  # the bytes a file name decoded from, as \x escapes
            shown = name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        except UnicodeEncodeError:  # a surrogate no file name decodes to
            shown = name.encode("utf-8", "backslashreplace").decode("utf-8")
        raise InvalidInputError(
            f"the name {shown!r} is not UTF-8 text (a name of bytes that are not UTF-8, "
            "in the source); rename the field") from None
    if not name:
        raise InvalidInputError(
            "a field has an empty name (Lance cannot read such a column back); name it")
    if any(part in ("", ".", "..") for part in name.split("/")):
        raise InvalidInputError(
            f"the name {name!r} has an empty, '.' or '..' path segment: a Zarr shard "
            "stores a field at its path (a '/' nests a group), and stock Zarr readers "
            "refuse such paths; rename the field")
    used = RESERVED_FIELD_NAMES.get(name)
    if used is not None:
        raise InvalidInputError(f"the name {name!r} is reserved for {used}; rename the field")
    for ending, use in RESERVED_FIELD_SUFFIXES.items():
        if name.endswith(ending):
            raise InvalidInputError(
                f"the name {name!r} ends in {ending!r}, kept for {use}; rename the field")
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > MAX_FIELD_NAME_BYTES:
        raise InvalidInputError(
            f"a field name of {size} bytes ({name[:40]!r}...) is longer than "
            f"{MAX_FIELD_NAME_BYTES} bytes; rename the field")

_STORABLE_TYPES = frozenset(
    np.dtype(t).type
    for t in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
              "uint64", "float16", "float32", "float64")
)
"""The dtypes every shard format stores and the loader reads back exactly (as tensors)."""

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def _check_storable(dtype: np.dtype[Any]) -> None:
    """Refuse a numeric dtype that cannot be stored and read back exactly."""
    if dtype.type not in _STORABLE_TYPES:
        raise InvalidInputError(
            f"unsupported dtype {dtype}: no shard format stores it and reads it back "
            "exactly (it is not converted; convert it in the source, e.g. to float64)"
        )


def spec_of_value(name: str, value: object) -> FieldSpec:
    """The :class:`FieldSpec` of a field value, lazy array sources included.

    Raises :class:`InvalidInputError` for a name :func:`check_field_name` refuses,
    a dtype that cannot be stored and read back exactly (``float128``: extended
    precision), or a Python int outside the range of int64 (as which it is stored).
    """
    check_field_name(name)
    if isinstance(value, _PLAIN_VALUES):
        spec = spec_of(name, value)  # type: ignore[arg-type]
        if spec.kind == "tensor" or spec.kind == "scalar":
            if isinstance(value, np.ndarray | np.generic):
                _check_storable(value.dtype)
            elif isinstance(value, int) and not _INT64_MIN <= value <= _INT64_MAX:
                bits = value.bit_length()
                shown = str(value) if bits <= 128 else f"an integer of {bits} bits"
                raise InvalidInputError(
                    f"the integer value {shown} is out of the range of int64, as which an "
                    "integer parameter is stored"
                )
        return spec
    if is_array_source(value):
        src: ArraySource = value  # type: ignore[assignment]
        dtype = np.dtype(src.dtype)
        if dtype.kind not in "biuf":
            raise InvalidInputError(f"field {name!r}: unsupported array dtype {dtype}")
        _check_storable(dtype)
        return FieldSpec(name=name, kind="tensor", dtype=str(dtype), ndim=len(src.shape))
    return spec_of(name, value)  # type: ignore[arg-type]


def _put(h: Hasher, data: bytes | memoryview) -> None:
    h.update(struct.pack("<Q", len(data)))
    h.update(data)


def _le_str(dtype: np.dtype[Any]) -> bytes:
    if dtype.byteorder == "|":
        return dtype.str.encode()
    return dtype.newbyteorder("<").str.encode()


BlockObserver = Callable[[str, np.ndarray, tuple[int, ...]], None]
ScalarObserver = Callable[[str, object], None]


def hash_sample_blocks(
    sample: Sample,
    block_bytes: int = 4 * MiB,
    *,
    on_block: BlockObserver | None = None,
    on_scalar: ScalarObserver | None = None,
) -> ObjectId:
    """The content hash of a sample, equal to :func:`simstore.sample.hash_sample`.

    Lazy :class:`ArraySource` fields are read in blocks of ``block_bytes``, so hashing a
    field of any size takes bounded memory. ``on_block(name, block, shape)`` sees every
    tensor block and ``on_scalar(name, value)`` every scalar, so statistics come from the
    same single pass. (This mirrors hash_sample's canonical encoding; a test pins the two
    equal.)
    """
    h = Hasher()
    h.update(b"simstore-sample-v1")
    for name in sorted(sample.fields):
        value = sample.fields[name]
        try:
            spec = spec_of_value(name, value)
        except InvalidInputError as exc:
            if exc.message.startswith("field "):
                raise
            raise InvalidInputError(f"field {name!r}: {exc.message}") from exc
        _put(h, name.encode("utf-8"))
        _put(h, spec.kind.encode())
        if spec.kind == "tensor":
            arr: np.ndarray | ArraySource = value  # type: ignore[assignment]
            dtype = np.dtype(arr.dtype)
            full = tuple(int(n) for n in arr.shape)
            # hash_sample hashes np.ascontiguousarray(value), which is at least 1-d
            shape = full or (1,)
            _put(h, _le_str(dtype))
            _put(h, struct.pack(f"<{len(shape)}q", *shape))
            h.update(struct.pack("<Q", math.prod(shape) * dtype.itemsize))
            for block in iter_blocks(arr, block_bytes):
                if on_block is not None:
                    on_block(name, block, full)
                if block.dtype.byteorder == ">":
                    block = block.astype(block.dtype.newbyteorder("<"))
                h.update(np.ascontiguousarray(block).data.cast("B"))
        elif spec.kind == "scalar":
            try:
                # first: a value that does not convert never reaches the statistics
                data = (
                    np.asarray(value, dtype=spec.dtype)
                    .astype(np.dtype(spec.dtype).newbyteorder("<"))
                    .tobytes()
                )
            except (OverflowError, ValueError, TypeError) as exc:
                raise InvalidInputError(
                    f"field {name!r}: the value does not convert to {spec.dtype}: "
                    f"{type(exc).__name__}: {' '.join(str(exc).split())}"
                ) from exc
            if on_scalar is not None:
                on_scalar(name, value)
            _put(h, spec.dtype.encode())
            _put(h, data)
        elif spec.kind == "string":
            _put(h, str(value).encode("utf-8"))
        elif spec.kind == "bytes":
            _put(h, bytes(value))  # type: ignore[arg-type]
        else:
            _put(h, canonical_json(value))
    return h.hexdigest()


def sample_nbytes(sample: Sample) -> int:
    """Logical size of a sample, lazy array sources included (see sample_size_bytes)."""
    return sum(_value_nbytes(v) for v in sample.fields.values())


def _value_nbytes(value: object) -> int:
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if is_array_source(value):
        src: ArraySource = value  # type: ignore[assignment]
        return math.prod(src.shape) * np.dtype(src.dtype).itemsize
    if isinstance(value, str):
        return len(value.encode("utf-8"))
    if isinstance(value, bytes | bytearray | memoryview):
        return len(value)
    if isinstance(value, Mapping):
        return len(canonical_json(value))
    return 8
