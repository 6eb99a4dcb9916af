"""Helpers the system modules share: tensors from arrays, worker identity, batching."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

SHARD_BYTES = 64 << 20  # every system's shard/chunk/file target, so the layouts compare


def worker() -> tuple[int, int]:
    """(worker index, worker count) inside a DataLoader worker, else (0, 1)."""
    import torch.utils.data

    info = torch.utils.data.get_worker_info()
    return (info.id, info.num_workers) if info is not None else (0, 1)


def to_tensors(sample: Mapping[str, Any]) -> dict[str, Any]:
    """NumPy arrays and scalars to tensors (zero copy where the array allows)."""
    import torch

    out: dict[str, Any] = {}
    for name, value in sample.items():
        if isinstance(value, np.ndarray):
            if not value.flags.writeable:
                value = value.copy()
            out[name] = torch.from_numpy(value)
        elif isinstance(value, np.generic | float | int):
            out[name] = torch.as_tensor(np.asarray(value))
        else:
            out[name] = value
    return out


def shuffle_buffer_samples(profile: str) -> int:
    """A shuffle buffer of about one 64 MiB shard (16 large, 1,000 small, 300 mesh samples)."""
    return {"large": 16, "small": 1000, "mesh": 300}[profile]


def rebatch(samples: Iterator[dict[str, Any]], batch_size: int | None) -> Iterator[Any]:
    """Samples as they come (``None``) or stacked into batches of ``batch_size``."""
    if batch_size is None:
        yield from samples
        return
    from torch.utils.data import default_collate

    buf: list[dict[str, Any]] = []
    for s in samples:
        buf.append(s)
        if len(buf) == batch_size:
            yield default_collate(buf)
            buf = []
    if buf:
        yield default_collate(buf)
