"""Arrow tables of the pool, as a Lance or Parquet user would lay them out, and back.

Fixed-shape tensors are Arrow's ``fixed_shape_tensor`` extension type (one row per
sample); variable-size mesh arrays are lists (``list<fixed_size_list<float32, 3>>`` for
points). No system-specific tricks: this is the plain layout each library documents.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from benchmarks.suite.data import iter_pool, pool_info
from benchmarks.suite.systems.common import SHARD_BYTES

ROW_GROUP_BYTES = 16 << 20


def rows_per_file(pool: str) -> tuple[int, int]:
    """(rows per ~64 MiB file, rows per ~16 MiB row group) for the pool's mean sample."""
    info = pool_info(pool)
    mean = int(info["logical_bytes"]) / int(info["samples"])
    return max(1, int(SHARD_BYTES // mean)), max(1, int(ROW_GROUP_BYTES // mean))


def _column(name: str, values: list[np.ndarray]) -> Any:
    import pyarrow as pa

    first = values[0]
    if first.ndim == 0:
        return pa.array([v.item() for v in values], pa.from_numpy_dtype(first.dtype))
    if name in ("points", "cells", "pressure"):  # variable length: lists
        flat = np.concatenate([v.reshape(-1) for v in values]) if values else first.reshape(-1)
        width = first.shape[1] if first.ndim == 2 else 1
        offsets = np.zeros(len(values) + 1, dtype=np.int32)
        offsets[1:] = np.cumsum([v.shape[0] for v in values])
        inner: Any = pa.array(flat)
        if first.ndim == 2:
            inner = pa.FixedSizeListArray.from_arrays(inner, width)
        return pa.ListArray.from_arrays(pa.array(offsets), inner)
    tensor_type = pa.fixed_shape_tensor(pa.from_numpy_dtype(first.dtype), first.shape)
    storage = pa.FixedSizeListArray.from_arrays(
        pa.array(np.stack(values).reshape(-1)), int(np.prod(first.shape)))
    return pa.ExtensionArray.from_storage(tensor_type, storage)


def batches(pool: str, rows: int) -> Iterator[Any]:
    """Record batches of ``rows`` samples, columns ``key`` then the pool's fields."""
    import pyarrow as pa

    keys: list[str] = []
    cols: dict[str, list[np.ndarray]] = {}
    for key, arrays in iter_pool(pool):
        keys.append(key)
        for name, arr in arrays.items():
            cols.setdefault(name, []).append(arr)
        if len(keys) == rows:
            yield pa.RecordBatch.from_pydict(
                {"key": keys, **{n: _column(n, v) for n, v in cols.items()}})
            keys, cols = [], {}
    if keys:
        yield pa.RecordBatch.from_pydict(
            {"key": keys, **{n: _column(n, v) for n, v in cols.items()}})


def schema(pool: str) -> Any:
    """The schema of :func:`batches` (from the first sample)."""
    return next(batches(pool, 1)).schema


def to_samples(batch: Any) -> Iterator[dict[str, Any]]:
    """Per-sample tensors from a record batch (or a dict of columns) of :func:`batches`."""
    import pyarrow as pa
    import torch

    names = batch.column_names if hasattr(batch, "column_names") else list(batch)
    columns: dict[str, Any] = {}
    n = 0
    for name in names:
        if name in ("key", "_rowid"):
            continue
        arr = batch[name]
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        n = len(arr)
        if isinstance(arr.type, pa.FixedShapeTensorType):
            columns[name] = torch.from_numpy(arr.to_numpy_ndarray())
        elif pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
            offsets = arr.offsets.to_numpy()
            inner = arr.values
            width = 1
            if pa.types.is_fixed_size_list(inner.type):
                width = inner.type.list_size
                inner = inner.flatten()
            flat = inner.to_numpy(zero_copy_only=False)
            columns[name] = [
                torch.from_numpy(flat[offsets[i] * width : offsets[i + 1] * width].reshape(
                    (-1, width) if width > 1 else (-1,)))
                for i in range(n)
            ]
        else:
            columns[name] = torch.from_numpy(arr.to_numpy(zero_copy_only=False))
    for i in range(n):
        yield {name: col[i] for name, col in columns.items()}


def to_batch(batch: Any) -> dict[str, Any]:
    """A record batch of fixed-shape columns as one dict of batched tensors (no copy)."""
    import pyarrow as pa
    import torch

    out: dict[str, Any] = {}
    names = batch.column_names if hasattr(batch, "column_names") else list(batch)
    for name in names:
        if name in ("key", "_rowid"):
            continue
        arr = batch[name]
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        if isinstance(arr.type, pa.FixedShapeTensorType):
            out[name] = torch.from_numpy(arr.to_numpy_ndarray())
        else:
            out[name] = torch.from_numpy(arr.to_numpy(zero_copy_only=False))
    return out
