"""Shard rows as NumPy values: the decode side of the Arrow column layout (:mod:`._arrow`).

Rows of a Parquet or Lance shard's tables become field values, written where the caller's
``out`` says (a batch's memory) when it gives one: fixed-shape columns by one copy of their
flat values, blob columns from their bytes (byte-unshuffled where the plan says so),
checked against the plan's dtype and shape.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from simstore.errors import FormatError, one_line
from simstore.sample import FieldValue

from ._arrow import ColumnPlan

try:  # a shuffled tensor's bytes put back in C; else NumPy's transpose (same bytes)
    from simstore import _rows
except ImportError:  # pragma: no cover (built by every install with a C compiler)
    _rows = None  # type: ignore[assignment]

__all__ = [
    "Out",
    "blob_shapes",
    "byte_unshuffle",
    "decode_pieces",
    "decode_rows",
    "mapped_out",
    "scalar_out",
    "shifted_out",
    "uniform_shape",
]


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
