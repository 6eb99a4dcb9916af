"""MosaicML Streaming: ``MDSWriter`` (64 MiB shards, no compression) read by
``StreamingDataset(local=..., shuffle=True)`` (its default py1e shuffle) through a plain
``DataLoader``. Runs in the peers' virtualenv (see benchmarks/README.md on torchvision).
S3: ``remote=s3://...`` with ``S3_ENDPOINT_URL`` set, a fresh ``local`` cache folder."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from benchmarks.suite.systems.common import SHARD_BYTES


def _columns(arrays: dict[str, Any]) -> dict[str, str]:
    cols = {}
    for name, arr in arrays.items():
        if arr.ndim == 0:
            cols[name] = str(arr.dtype)
        elif name == "cells":
            cols[name] = "bytes"  # MDS cannot encode an empty array (point clouds have none)
        elif name in ("points", "pressure"):
            cols[name] = f"ndarray:{arr.dtype}"  # variable shape
        else:
            cols[name] = f"ndarray:{arr.dtype}:{','.join(map(str, arr.shape))}"
    return cols


def _record(arrays: dict[str, Any]) -> dict[str, Any]:
    return {n: (a.item() if a.ndim == 0 else a.tobytes() if n == "cells" else a)
            for n, a in arrays.items()}


def _dataset_class() -> Any:
    """``StreamingDataset`` that turns the ``cells`` bytes back into an int32 [m, 4] array."""
    import numpy as np
    from streaming import StreamingDataset

    class MeshStreamingDataset(StreamingDataset):  # type: ignore[misc]
        def get_item(self, idx: int, retry: int = 7) -> Any:
            sample = super().get_item(idx, retry)
            if "cells" in sample:
                sample["cells"] = np.frombuffer(sample["cells"], np.int32).reshape(-1, 4)
            return sample

    return MeshStreamingDataset


def write(pool: str, out: str, profile: str, options: dict[str, Any]) -> dict[str, Any]:
    from streaming import MDSWriter

    from benchmarks.suite.data import iter_pool

    samples = iter_pool(pool)
    key, first = next(samples)
    with MDSWriter(out=out, columns=_columns(first), compression=None,
                   size_limit=SHARD_BYTES) as w:
        w.write(_record(first))
        for _key, arrays in samples:
            w.write(_record(arrays))
    return {}


def prepare(out: str, profile: str, options: dict[str, Any]) -> dict[str, Any]:
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    return {}


def loader(out: str, profile: str, workers: int, batch_size: int | None,
           options: dict[str, Any], prepared: dict[str, Any]) -> Iterable[Any]:
    from torch.utils.data import DataLoader

    StreamingDataset = _dataset_class()

    if options.get("tier") == "s3":
        ds = StreamingDataset(remote=options["url"], local=options["cache_dir"], shuffle=True,
                              shuffle_seed=0, batch_size=batch_size or 1)
    else:
        ds = StreamingDataset(local=out, shuffle=True, shuffle_seed=0, batch_size=batch_size or 1)
    return DataLoader(ds, batch_size=batch_size, num_workers=workers)
