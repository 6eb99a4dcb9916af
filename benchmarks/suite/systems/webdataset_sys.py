"""WebDataset: ``ShardWriter`` tars of ~64 MiB (each array an ``.npy`` member), read by
``WebDataset(shardshuffle=...)`` with a shuffle buffer of about one shard, split over
workers by shard, ``.decode()`` (``np.load``) and batched by ``default_collate``.
S3: ``pipe:curl`` of each shard's URL on the endpoint (the documented way)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from benchmarks.suite.systems.common import SHARD_BYTES, shuffle_buffer_samples, to_tensors


def write(pool: str, out: str, profile: str, options: dict[str, Any]) -> dict[str, Any]:
    import webdataset as wds

    from benchmarks.suite.data import iter_pool

    os.makedirs(out, exist_ok=True)
    with wds.ShardWriter(os.path.join(out, "shard-%06d.tar"), maxsize=SHARD_BYTES,
                         verbose=0) as sink:
        for key, arrays in iter_pool(pool):
            sink.write({"__key__": key, **{f"{n}.npy": a for n, a in arrays.items()}})
    return {}


def prepare(out: str, profile: str, options: dict[str, Any]) -> dict[str, Any]:
    return {}


def _sample(raw: dict[str, Any]) -> dict[str, Any]:
    return to_tensors({k[:-4]: v for k, v in raw.items() if k.endswith(".npy")})


def loader(out: str, profile: str, workers: int, batch_size: int | None,
           options: dict[str, Any], prepared: dict[str, Any]) -> Iterable[Any]:
    import webdataset as wds
    from torch.utils.data import default_collate

    if options.get("tier") == "s3":
        urls = [f"pipe:curl -s {options['endpoint_url']}/{options['bucket']}/{k}"
                for k in options["keys"]]
    else:
        urls = sorted(os.path.join(out, n) for n in os.listdir(out) if n.endswith(".tar"))
    ds = (wds.WebDataset(urls, shardshuffle=len(urls), seed=0, nodesplitter=wds.single_node_only,
                         workersplitter=wds.split_by_worker, empty_check=False)
          .shuffle(shuffle_buffer_samples(profile), seed=0)
          .decode()
          .map(_sample))
    if batch_size is not None:
        ds = ds.batched(batch_size, collation_fn=default_collate, partial=True)
    return wds.WebLoader(ds, batch_size=None, num_workers=workers)
