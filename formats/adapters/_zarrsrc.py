"""The ``zarr`` adapter: an existing Zarr group (v2 or v3; a directory or a .zip) as a source.

Arrays become fields named by their path in the group, attributes become parameters, and
arrays are read chunk-aligned slice by slice (see ``_tree``; windows work as for HDF5).
String arrays become string parameters (0-d) or metadata lists, as string datasets and
variables do in the HDF5 and NetCDF adapters. Consolidated metadata is not trusted: the
hierarchy is listed from the store itself, so an array added after
``zarr.consolidate_metadata`` is read like any other.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from simstore.errors import SourceError
from simstore.sample import FieldValue, Sample

from ._tree import (
    TIME_OPTIONS,
    ArrayEntry,
    SlicedArray,
    attribute_fields,
    check_time_options,
    json_safe,
    put_value,
    read_strings,
    text_or_bytes,
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
    fresh_arrays = True  # every array it yields is its sample's own (docs/adapters.md)
    libraries = ("zarr",)
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
        # the chunk files are checked where the samples are read, not again here
        store, entries, _, _ = self._open(path, check_chunks=False)
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
        path: str, *, check_chunks: bool = True
    ) -> tuple[Any, list[ArrayEntry], dict[str, FieldValue], dict[str, Any]]:
        """The group's zip store (None for a directory), arrays, parameters and metadata.

        ``check_chunks``: a directory store's chunk files are checked (see
        :func:`_check_chunk_files`).
        """
        import zarr

        from .._zarr_layout import blosc_without_start_method

        blosc_without_start_method()  # a source's chunks may be Blosc's
        store: Any = None
        try:
            # use_consolidated=False: consolidated metadata is a copy that nothing keeps up
            # to date, and an array written after it would be left out without a word
            if os.path.isdir(path):
                group = zarr.open_group(path, mode="r", use_consolidated=False)
            else:
                store = zarr.storage.ZipStore(path, mode="r")
                group = zarr.open_group(store, mode="r", use_consolidated=False)
            entries: list[ArrayEntry] = []
            params: dict[str, FieldValue] = {}
            metadata: dict[str, Any] = {}
            attribute_fields("", dict(group.attrs), params, metadata, path=path)
            members = sorted(group.members(max_depth=None), key=lambda m: m[0])
            for name, node in members:
                is_array = isinstance(node, zarr.Array)
                attribute_fields(
                    name, dict(node.attrs), params, metadata, is_array=is_array, path=path
                )
                if isinstance(node, zarr.Array):
                    kind = getattr(node.dtype, "kind", "")
                    if kind and kind in "SUOT":
                        put_value(path, name, _strings(node, name, path), params, metadata)
                        continue
                    if not kind or kind not in "biuf":
                        raise SourceError(
                            f"{path}: field {name!r}: unsupported Zarr dtype {node.dtype}"
                        )
                    if store is None and check_chunks:
                        _check_chunk_files(path, name, node)
                    # a read decodes whole chunks (Zarr keeps no chunk cache)
                    entries.append(
                        ArrayEntry(
                            name, SlicedArray(node, path=path, field=name, chunks=node.chunks)
                        )
                    )
        except SourceError:
            _close(store)
            raise
        except Exception as exc:  # zarr raises many kinds on a broken hierarchy
            _close(store)
            raise SourceError(f"{path}: not a readable Zarr group: {exc}") from exc
        return store, entries, params, metadata


def _close(store: Any) -> None:
    """Close the zip store a failed open leaves, if it opened.

    One that never opened its zip cannot close: ``ZipStore.close`` raised AttributeError
    in place of the reason the zip failed.
    """
    if store is not None:
        with contextlib.suppress(Exception):
            store.close()


_ZARR_METADATA = frozenset({"zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata"})


def _blosc_outermost(node: Any) -> bool:
    """Whether an array's stored chunks are Blosc frames (Blosc is the last codec)."""
    meta = node.metadata
    if getattr(meta, "zarr_format", 3) == 2:
        return getattr(meta.compressor, "codec_id", "") == "blosc"
    codecs: Sequence[Any] = tuple(getattr(meta, "codecs", ()))
    return bool(codecs) and type(codecs[-1]).__name__ == "BloscCodec"


def _check_chunk_files(path: str, name: str, node: Any) -> None:
    """Refuse an empty chunk file, or a Blosc one not the length its header declares.

    Zarr writes no empty chunk file (a chunk of fill values is left out), and reads one,
    as a sharded array's empty shard, as fill values: a copy cut short. Blosc decodes a
    frame cut short by reading past its end: the lost bytes came back as whatever memory
    held, or the process died (numcodecs #228). Each Blosc frame's 16-byte header declares
    its length (``cbytes``, at offset 12); reading that much of every chunk is cheap
    against decoding it.
    """
    blosc = _blosc_outermost(node)
    folder = os.path.join(path, *name.split("/"))
    for root, _dirs, files in os.walk(folder):
        for file in files:
            if file in _ZARR_METADATA:
                continue
            chunk = os.path.join(root, file)
            size = os.path.getsize(chunk)
            if size == 0:
                raise SourceError(
                    f"{path}: field {name!r}: chunk {os.path.relpath(chunk, folder)} is an "
                    "empty file (truncated or damaged)"
                )
            if not blosc:
                continue
            with open(chunk, "rb") as f:
                header = f.read(16)
            declared = int.from_bytes(header[12:16], "little") if len(header) == 16 else -1
            if declared != size:
                rel = os.path.relpath(chunk, folder)
                raise SourceError(
                    f"{path}: field {name!r}: chunk {rel} holds {size} bytes, its Blosc "
                    f"header declares {declared} (truncated or damaged)"
                )


def _strings(node: Any, name: str, path: str) -> Any:
    """A string array's values: one ``str`` (0-d array) or a JSON list.

    Fixed-length (``U``, ``S``), variable-length (``StringDType``, ``str``) and object
    arrays of strings are read whole (within the cap of ``_limits``), like string
    datasets in HDF5; byte strings that are
    not UTF-8 keep their exact bytes (see ``_tree.json_safe``). An object array holding
    anything but strings is refused.
    """
    try:
        values = read_strings(node, path, name, vlen=np.dtype(node.dtype).kind in "OT")
    except SourceError:
        raise
    except Exception as exc:  # zarr raises many kinds on a broken chunk
        raise SourceError(
            f"{path}: field {name!r}: unreadable string array: {' '.join(str(exc).split())}"
        ) from exc
    if values.dtype.kind == "O":
        for item in values.flat:
            if not isinstance(item, str | bytes):
                raise SourceError(
                    f"{path}: field {name!r}: unsupported Zarr object array holding "
                    f"{type(item).__name__} values (string arrays are read)"
                )
    if values.ndim == 0:
        item = values.item()
        return text_or_bytes(bytes(item)) if isinstance(item, bytes) else str(item)
    return json_safe(values)
