"""Decoded field values to tensors: zero-copy where the buffer allows."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

__all__ = ["sample_bytes", "to_tensors"]


def to_tensors(fields: Mapping[str, Any], *, zero_copy: bool) -> dict[str, Any]:
    """Field values as tensors where they are arrays or numbers.

    An array's tensor shares its memory when the array is writable, or when ``zero_copy``
    is set; scalars become 0-d tensors; strings, bytes and JSON stay as they are.
    """
    out: dict[str, Any] = {}
    for name, value in fields.items():
        if isinstance(value, np.ndarray):
            out[name] = _array_to_tensor(value, zero_copy)
        elif isinstance(value, np.generic):
            out[name] = torch.as_tensor(value.item())
        elif isinstance(value, bool | int | float):
            out[name] = torch.tensor(value)
        else:
            out[name] = value
    return out


def _array_to_tensor(arr: np.ndarray, zero_copy: bool) -> torch.Tensor:
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if arr.flags.writeable:
        return torch.from_numpy(arr)
    if not zero_copy:
        return torch.from_numpy(arr.copy())
    # A tensor over a read-only buffer: torch warns once per process that writing to it is
    # undefined; the loader documents that samples must not be modified in place when
    # zero_copy is on, so the warning is expected here and silenced.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(arr)


def sample_bytes(sample: Mapping[str, Any]) -> int:
    """Logical bytes of a sample's tensors, strings and bytes."""
    total = 0
    for value in sample.values():
        if isinstance(value, torch.Tensor):
            total += value.element_size() * value.nelement()
        elif isinstance(value, bytes | str):
            total += len(value)
    return total
