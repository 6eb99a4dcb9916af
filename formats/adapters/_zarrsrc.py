"""The ``zarr`` adapter: an existing Zarr group (v2 or v3; a directory or a .zip) as a source.

Arrays become fields named by their path in the group, attributes become parameters, and
arrays are read chunk-aligned slice by slice (see ``_tree``; windows work as for HDF5).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

from simstore.errors import SourceError
from simstore.sample import FieldValue, Sample

from ._tree import (
    TIME_OPTIONS,
    ArrayEntry,
    SlicedArray,
    attribute_fields,
    check_time_options,
    tree_sample_count,
    tree_samples,
)

__all__ = ["ZarrAdapter", "is_zarr_dir"]

_MARKERS = ("zarr.json", ".zgroup", ".zarray")


def is_zarr_dir(path: str) -> bool:
    """Whether ``path`` is a directory holding a Zarr hierarchy."""
    return os.path.isdir(path) and any(os.path.exists(os.path.join(path, m)) for m in _MARKERS)


class ZarrAdapter:
    """A Zarr group: a directory with ``zarr.json`` (or ``.zgroup``), or a ``.zarr.zip``."""

    name = "zarr"
    version = "1"
    extensions = (".zarr", ".zarr.zip")
    options = TIME_OPTIONS
    check_options = staticmethod(check_time_options)

    def can_read(self, path: str, head: bytes) -> bool:
        """A Zarr directory, or a zip named ``*.zarr.zip``."""
        return is_zarr_dir(path) or path.lower().endswith(".zarr.zip")

    supports_sample_ranges = True
    """Time windows can be read in ranges, so ingest cuts a large group into pieces that
    run on several workers (see ``simstore.ingest.SupportsSampleRanges``)."""

    def count_samples(self, path: str, options: Mapping[str, Any]) -> int:
        """How many samples :meth:`iter_samples` yields: 1, or the number of windows."""
        store, entries, _, _ = self._open(path)
        try:
            return tree_sample_count(path, entries, options)
        finally:
            if store is not None:
                store.close()

    def iter_samples(self, path: str, key: str, options: Mapping[str, Any]) -> Iterator[Sample]:
        """One sample per group, or one per time window (``sample_range``: some of them)."""
        store, entries, params, metadata = self._open(path)
        try:
            yield from tree_samples(path, key, entries, params, metadata, options)
        finally:
            if store is not None:
                store.close()

    @staticmethod
    def _open(
        path: str,
    ) -> tuple[Any, list[ArrayEntry], dict[str, FieldValue], dict[str, Any]]:
        """The group's zip store (None for a directory), arrays, parameters and metadata."""
        import zarr

        store: Any = None
        try:
            if os.path.isdir(path):
                group = zarr.open_group(path, mode="r")
            else:
                store = zarr.storage.ZipStore(path, mode="r")
                group = zarr.open_group(store, mode="r")
            entries: list[ArrayEntry] = []
            params: dict[str, FieldValue] = {}
            metadata: dict[str, Any] = {}
            attribute_fields("", dict(group.attrs), params, metadata)
            members = sorted(group.members(max_depth=None), key=lambda m: m[0])
            for name, node in members:
                is_array = isinstance(node, zarr.Array)
                attribute_fields(name, dict(node.attrs), params, metadata, is_array=is_array)
                if isinstance(node, zarr.Array):
                    if node.dtype.kind not in "biuf":
                        raise SourceError(
                            f"{path}: field {name!r}: unsupported Zarr dtype {node.dtype}"
                        )
                    entries.append(ArrayEntry(name, SlicedArray(node, path=path, field=name)))
        except SourceError:
            if store is not None:
                store.close()
            raise
        except Exception as exc:  # zarr raises many kinds on a broken hierarchy
            if store is not None:
                store.close()
            raise SourceError(f"{path}: not a readable Zarr group: {exc}") from exc
        return store, entries, params, metadata
