"""Finding shard formats and source adapters by name, and opening a shard by its bytes.

Everything is looked up through the entry-point groups ``simstore.shard_formats`` and
``simstore.adapters`` (the same ones the core ingest pipeline uses), so a format or
adapter a pipeline registers from its own package is found here too.
"""

from __future__ import annotations

import os
from typing import Any, BinaryIO

from simstore.errors import FormatError
from simstore.ingest import (
    ShardOptions,
    adapter_names,
    load_adapter,
    load_shard_format,
    probe_shard,
    shard_format_names,
)
from simstore.protocols import ShardFormat, ShardReader, SourceAdapter

__all__ = ["get_adapter", "get_format", "list_adapters", "list_formats", "open_shard"]

_BUILTIN_ORDER = ("parquet", "zarr", "lance")


def get_format(name: str, options: ShardOptions | None = None) -> ShardFormat:
    """The shard format registered as ``name`` (``parquet``, ``lance``, ``zarr``, ...)."""
    return load_shard_format(name, options)


def get_adapter(name: str) -> SourceAdapter:
    """The source adapter registered as ``name`` (``auto``, ``hdf5``, ``npz``, ...)."""
    return load_adapter(name)


def list_adapters() -> list[str]:
    """Names of every installed source adapter."""
    return adapter_names()


def list_formats() -> list[str]:
    """Names of every installed shard format."""
    return shard_format_names()


def open_shard(
    source: str | os.PathLike[str] | BinaryIO,
    *,
    head: bytes | None = None,
    tail: bytes | None = None,
) -> ShardReader:
    r"""Open a shard of any installed format, recognised by its magic bytes.

    ``source`` is a local path or a seekable binary file object; ``head`` and ``tail``
    (its first and last few bytes, if the caller already has them) save two small reads.
    Parquet starts and ends with ``PAR1``, a Zarr shard is a zip (``PK\\x03\\x04``) and a
    Lance file ends with ``LANC``. Raises :class:`FormatError` when no format claims it.
    """
    src: Any = os.fspath(source) if isinstance(source, os.PathLike) else source
    if head is None or tail is None:
        try:
            h, t = probe_shard(src)
        except OSError as exc:
            raise FormatError(
                f"cannot read shard {src if isinstance(src, str) else ''}: {exc}"
            ) from exc
        head = h if head is None else head
        tail = t if tail is None else tail
    # the built-in formats first, without a scan of the installed packages' entry points
    # (that scan costs tens of milliseconds, and a loader opens many shards)
    from ._lance import LanceFormat
    from ._parquet import ParquetFormat
    from ._zarr import ZarrFormat

    builtin: list[ShardFormat] = [ParquetFormat(), ZarrFormat(), LanceFormat()]
    for fmt in builtin:
        if fmt.sniff(head, tail):
            return fmt.open(src)
    names = [n for n in shard_format_names() if n not in _BUILTIN_ORDER]
    for name in names:
        fmt = load_shard_format(name)
        if fmt.sniff(head, tail):
            if not isinstance(src, str) and not fmt.supports_file_objects:
                raise FormatError(f"{name} shards cannot be read from a file object")
            return fmt.open(src)
    names = list(_BUILTIN_ORDER) + names
    shown = src if isinstance(src, str) else "file object"
    raise FormatError(
        f"{shown} is not a shard of any installed format ({', '.join(names)}): "
        f"head {head[:4]!r}, tail {tail[-4:]!r}"
    )
