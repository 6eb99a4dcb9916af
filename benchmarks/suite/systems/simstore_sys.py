"""simstore: ``simstore.ingest`` of the pool's .npz files, read by ``SimDataLoader``.

Tiers: ``local`` (the store directory), ``memory`` (the same objects copied into fsspec's
``memory://`` before the clock starts), ``s3`` (the same objects uploaded to moto; read
with no cache (ranged GETs), or through the loader's disk cache, cold or warm).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from benchmarks.suite.systems.common import SHARD_BYTES


def write(pool: str, out: str, profile: str, options: dict[str, Any]) -> dict[str, Any]:
    from simstore.catalog import Catalog
    from simstore.ingest import ingest
    from simstore.storage import LocalStore

    cat = Catalog.init(LocalStore(out, fsync=False))
    # each system is one format: ingest's default sends samples with arrays over 128 KiB
    # to Zarr (simstore-zarr's rows show what that default reads like)
    result = ingest([pool], dataset=profile, store=cat, format=options.get("format", "parquet"),
                    compression=options.get("compression", "none"), shard_size=SHARD_BYTES,
                    zarr_threshold=1 << 40, snapshot=True, resume=False, progress=None)
    return {"shards": result.to_json().get("shards")}


def tier_imports(options: dict[str, Any]) -> tuple[str, ...]:
    """Modules that are part of the import cost on this tier: the S3 client library.

    simstore imports it when a store on S3 is opened, MosaicML Streaming and LitData with
    their package; importing it with the package here counts it for every system alike,
    in ``import_s`` and not in the first batch.
    """
    return ("simstore.storage._s3",) if options.get("tier") == "s3" else ()


def prepare(out: str, profile: str, options: dict[str, Any]) -> dict[str, Any]:
    """Untimed setup: the REF; the memory tier's copy; the S3 endpoint's options.

    Every tier reads ``profile@<snapshot id>``, as a reproducible training job pins its
    snapshot (the other systems read a fixed directory or prefix): on a warm cache that
    REF asks nothing of S3. The id is read here, from the local copy of the same objects.
    """
    from simstore.catalog import Catalog
    from simstore.storage import LocalStore

    ref = f"{profile}@{Catalog(LocalStore(out)).resolve(profile)}"
    return {**_prepare(out, options), "ref": ref}


def _prepare(out: str, options: dict[str, Any]) -> dict[str, Any]:
    tier = options.get("tier", "local")
    if tier == "memory":
        from simstore.storage import open_store

        store = open_store("memory://simstore-bench")
        for root, _dirs, files in os.walk(out):
            for name in files:
                path = os.path.join(root, name)
                with open(path, "rb") as f:
                    store.put(os.path.relpath(path, out), f.read())
        return {"store": "memory://simstore-bench"}
    if tier == "s3":
        opts = {"endpoint_url": options["endpoint_url"], "key": options["key"],
                "secret": options["secret"], "region_name": "us-east-1"}
        return {"store": options["url"], "storage_options": opts}
    return {"store": out}


def read_details(loader: Any) -> dict[str, Any]:
    """What the epoch did besides reading: shards hashed, trusted (opened from their page
    layouts), and read per tier."""
    stats = loader.stats()
    return {"shards_hashed": stats.get("shards_hashed"),
            "shards_trusted": stats.get("shards_trusted"),
            "shards_laid_out": stats.get("shards_laid_out"),
            "cache_hits": stats.get("cache_hits")}


def loader(out: str, profile: str, workers: int, batch_size: int | None,
           options: dict[str, Any], prepared: dict[str, Any]) -> Iterable[Any]:
    from simstore.loaders import SimDataLoader, SimDataset

    cache_dir = options.get("cache_dir")
    ds = SimDataset(prepared["store"], prepared["ref"], shuffle=True, seed=0, cache_dir=cache_dir,
                    cache_limit="8GiB" if cache_dir else None,
                    storage_options=prepared.get("storage_options"))
    return SimDataLoader(ds, batch_size=batch_size, num_workers=workers,
                         multiprocessing_context="fork" if workers else None)
