"""Arrow arrays from NumPy arrays without ``pyarrow.array``'s first-call import.

``pa.array(ndarray)`` checks whether its argument is a ``numpy.ma.MaskedArray``, and that
attribute access imports ``numpy.ma`` (NumPy loads it lazily): 6-25 ms the first time in
a process, paid by an ingest's commit (a few columns it converts once, after the files
are done) and by each process's first Parquet shard. :func:`numpy_column` builds the same
array from the NumPy buffers directly.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

__all__ = ["numpy_column"]


def numpy_column(values: Any, mask: Any = None) -> pa.Array:
    """``pa.array(values, mask=mask)`` for a 1-d NumPy array (``mask``: True where null).

    Booleans and native-endian integers and floats are built from their buffers (the
    values shared where already contiguous, booleans packed into bits); any other array
    goes through ``pa.array``.
    """
    a = np.asarray(values)
    if a.dtype.kind in "biuf" and not a.dtype.isnative:
        a = a.astype(a.dtype.newbyteorder("="))  # Arrow refuses byte-swapped arrays
    if a.ndim != 1 or a.dtype.kind not in "biuf":
        return pa.array(a, mask=mask)
    if a.dtype.kind == "b":
        kind: pa.DataType = pa.bool_()
        data = np.packbits(a, bitorder="little")
    else:
        kind = pa.from_numpy_dtype(a.dtype)
        data = np.ascontiguousarray(a)
    validity = None
    nulls = 0
    if mask is not None:
        missing = np.asarray(mask, dtype=bool)
        if missing.shape != a.shape:
            raise ValueError(f"a mask of shape {missing.shape} for values of shape {a.shape}")
        nulls = int(missing.sum())
        if nulls:
            validity = pa.py_buffer(np.packbits(~missing, bitorder="little"))
    return pa.Array.from_buffers(kind, len(a), [validity, pa.py_buffer(data)],
                                 null_count=nulls)
