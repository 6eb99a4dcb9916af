"""Shard formats (Parquet, Lance, Zarr v3) and source adapters, behind core's protocols.

Installed as ``simstore.formats``. Core's ingest pipeline never imports this package: it
finds the formats and adapters through the entry-point groups ``simstore.shard_formats``
and ``simstore.adapters``, which point here. Readers: :func:`open_shard` recognises a shard
by its magic bytes and returns a reader whose ``read(positions, fields)`` yields one
``{field: value}`` dict per sample; the Zarr reader also has ``read_slices`` for windows.
"""

from ._lance import LanceFormat, LanceShardReader
from ._parquet import ParquetFormat, ParquetShardReader
from ._registry import get_adapter, get_format, list_adapters, list_formats, open_shard
from ._zarr import ZarrFormat, ZarrShardReader, auto_chunks
from .adapters import (
    AutoAdapter,
    CadAdapter,
    HDF5Adapter,
    MeshAdapter,
    NetCDFAdapter,
    NpyAdapter,
    NpzAdapter,
    SlicedArray,
    ZarrAdapter,
)

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
