"""The software a file was ingested with: the versions its shards' bytes depend on.

Equal samples give equal shard bytes for one set of these versions, not across them: a
Parquet file names the version of the library that wrote it (``created_by``), and a new
release of a writer may choose other encodings or page layouts. So each file's result
carries the versions of the process that read it and wrote its shards (a worker of a
dask cluster may differ from the driver's machine), its journal record keeps them, and an
ingest's lineage lists them (see docs/operations.md, "Upgrading simstore or its
libraries").

Which distributions count: simstore, NumPy (statistics), pyarrow (manifest parts, Arrow
buffers), xxhash (object ids), and what the adapter and the shard formats name in their
optional ``libraries`` attribute (distribution names, as ``pip`` knows them).
"""

from __future__ import annotations

import functools
import platform
from collections.abc import Iterable
from importlib import metadata

__all__ = ["BASE_LIBRARIES", "libraries_of", "software"]

BASE_LIBRARIES = ("simstore", "numpy", "pyarrow", "xxhash")
"""Distributions every ingest's bytes depend on, whatever the adapter and format."""


def libraries_of(*plugins: object) -> tuple[str, ...]:
    """The distributions that adapters and shard formats name in ``libraries``.

    A plugin without the attribute names none; anything but strings is ignored, so a
    third-party plugin cannot break an ingest through it.
    """
    names: list[str] = []
    for plugin in plugins:
        declared = getattr(plugin, "libraries", ())
        if isinstance(declared, str):
            declared = (declared,)
        if isinstance(declared, Iterable):
            names.extend(n for n in declared if isinstance(n, str) and n)
    return tuple(names)


@functools.cache
def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except (metadata.PackageNotFoundError, ValueError):
        return "not installed"


@functools.cache
def _software(names: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    versions = {name: _version(name) for name in names}
    versions["python"] = platform.python_version()
    return tuple(sorted(versions.items()))


def software(libraries: Iterable[str] = ()) -> dict[str, str]:
    """``{distribution: version}`` of :data:`BASE_LIBRARIES`, ``libraries`` and Python."""
    names = tuple(sorted({*BASE_LIBRARIES, *libraries}))
    return dict(_software(names))
