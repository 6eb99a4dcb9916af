"""Shard formats (Parquet, Lance, Zarr v3) and source adapters, behind core's protocols.

Installed as ``simstore.formats``. Core's ingest pipeline never imports this package: it
finds the formats and adapters through the entry-point groups ``simstore.shard_formats``
and ``simstore.adapters``, which point here. Readers: :func:`open_shard` recognises a shard
by its magic bytes and returns a reader whose ``read(positions, fields)`` yields one
``{field: value}`` dict per sample; the Zarr reader also has ``read_slices`` for windows.
"""

from importlib import import_module
from typing import Any

# Names load on first use (PEP 562), so a reader of Parquet shards does not import the
# Zarr, Lance and source-adapter modules (and their libraries) it never touches.
_WHERE = {
    "LanceFormat": "._lance",
    "LanceShardReader": "._lance",
    "ParquetFormat": "._parquet",
    "ParquetShardReader": "._parquet",
    "get_adapter": "._registry",
    "get_format": "._registry",
    "list_adapters": "._registry",
    "list_formats": "._registry",
    "open_shard": "._registry",
    "ZarrFormat": "._zarr",
    "ZarrShardReader": "._zarr",
    "auto_chunks": "._zarr",
    "AutoAdapter": ".adapters",
    "CadAdapter": ".adapters",
    "HDF5Adapter": ".adapters",
    "MeshAdapter": ".adapters",
    "NetCDFAdapter": ".adapters",
    "NpyAdapter": ".adapters",
    "NpzAdapter": ".adapters",
    "SlicedArray": ".adapters",
    "ZarrAdapter": ".adapters",
}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(where, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "AutoAdapter",
    "CadAdapter",
    "HDF5Adapter",
    "LanceFormat",
    "LanceShardReader",
    "MeshAdapter",
    "NetCDFAdapter",
    "NpyAdapter",
    "NpzAdapter",
    "ParquetFormat",
    "ParquetShardReader",
    "SlicedArray",
    "ZarrAdapter",
    "ZarrFormat",
    "ZarrShardReader",
    "auto_chunks",
    "get_adapter",
    "get_format",
    "list_adapters",
    "list_formats",
    "open_shard",
]
