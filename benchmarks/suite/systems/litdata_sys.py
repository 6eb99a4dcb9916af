"""LitData: ``litdata.optimize`` (64 MiB chunks, no compression) read by
``StreamingDataset(shuffle=True)`` and ``StreamingDataLoader``. Runs in the peers'
virtualenv. S3: ``s3://...`` input with the endpoint in ``storage_options``. LitData reads
the index with boto3 but downloads chunks with obstore, which refuses a plain-http
endpoint (moto on loopback) unless ``allow_http`` is among its client options. LitData
has no setting that reaches them (boto3 rejects the key in ``storage_options``, and
obstore's store ignores ``AWS_ALLOW_HTTP`` when given explicit options), so for an http
endpoint the runner adds it to LitData's module-level obstore client options before the
DataLoader starts (forked workers inherit it)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import numpy as np

from benchmarks.suite.systems.common import SHARD_BYTES


def _item(arg: tuple[str, str]) -> dict[str, Any]:
    pool, key = arg
    with np.load(os.path.join(pool, key + ".npz")) as z:
        return {n: (z[n].item() if z[n].ndim == 0 else z[n]) for n in z.files}


def write(pool: str, out: str, profile: str, options: dict[str, Any]) -> dict[str, Any]:
    from litdata import optimize

    from benchmarks.suite.data import pool_info, sample_key

    keys = [sample_key(i) for i in range(int(pool_info(pool)["samples"]))]
    optimize(fn=_item, inputs=[(pool, k) for k in keys], output_dir=out,
             chunk_bytes=SHARD_BYTES, num_workers=1, mode="overwrite", verbose=False)
    return {}


def prepare(out: str, profile: str, options: dict[str, Any]) -> dict[str, Any]:
    return {}


def loader(out: str, profile: str, workers: int, batch_size: int | None,
           options: dict[str, Any], prepared: dict[str, Any]) -> Iterable[Any]:
    from litdata import StreamingDataLoader, StreamingDataset

    if options.get("tier") == "s3":
        if str(options["endpoint_url"]).startswith("http://"):
            from litdata.streaming import downloader

            downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = True  # type: ignore[index]
        storage = {"endpoint_url": options["endpoint_url"],
                   "aws_access_key_id": options["key"],
                   "aws_secret_access_key": options["secret"]}
        ds = StreamingDataset(options["url"], cache_dir=options["cache_dir"], shuffle=True,
                              seed=0, storage_options=storage)
    else:
        ds = StreamingDataset(out, shuffle=True, seed=0)
    if batch_size is None:  # StreamingDataLoader needs a batch size: batches of one, unwrapped
        return StreamingDataLoader(ds, batch_size=1, num_workers=workers, collate_fn=_only)
    return StreamingDataLoader(ds, batch_size=batch_size, num_workers=workers)


def _only(batch: list[Any]) -> Any:
    from torch.utils.data import default_convert

    return default_convert(batch[0])
