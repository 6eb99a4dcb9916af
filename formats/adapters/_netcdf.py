"""The ``netcdf`` adapter (netCDF4): classic and NetCDF-4 files.

Variables become fields named by their path (``pressure``, ``group/pressure``); global,
group and variable attributes become parameters. Values are stored raw: automatic masking
and scaling are off, so a packed variable keeps its declared dtype and its
``scale_factor``/``add_offset`` are parameters (``var.scale_factor``). Character and
string variables become string parameters or metadata lists. The time axis for windows is
the dimension named by ``time_name``, else the first unlimited dimension, else one named
``time`` or ``t``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from simstore.errors import SourceError
from simstore.sample import FieldValue, Sample

from ._tree import ArrayEntry, SlicedArray, attribute_fields, json_safe, tree_samples

__all__ = ["NetCDFAdapter"]


def _netcdf4() -> Any:
    try:
        import netCDF4
    except ImportError as exc:
        raise ImportError(
            "the netcdf adapter needs netCDF4: pip install 'simstore[netcdf]'"
        ) from exc
    return netCDF4


def _groups(ds: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    yield prefix, ds
    for name in sorted(ds.groups):
        yield from _groups(ds.groups[name], f"{prefix}/{name}" if prefix else name)


def _check_classic_size(ds: Any, path: str) -> None:
    """Refuse a classic (NetCDF-3) file whose header declares more data than it holds.

    Classic files store every variable uncompressed and disjoint, so their bytes fit in
    the file. A corrupt header (fuzzing found one: a 204-byte file declaring a dimension
    of 3.6 billion) would otherwise have ingest read tens of GB of fill values.
    """
    if not str(getattr(ds, "data_model", "")).startswith("NETCDF3"):
        return
    size = os.path.getsize(path)
    total = 0
    biggest = ("", -1)
    for name, var in ds.variables.items():
        try:
            nbytes = int(var.size) * np.dtype(var.dtype).itemsize
        except TypeError:
            continue
        total += nbytes
        biggest = max(biggest, (name, nbytes), key=lambda item: item[1])
    if total > size:
        raise SourceError(
            f"{path}: field {biggest[0]!r}: the header declares {total} bytes of variables "
            f"but the file holds {size}: truncated or corrupt NetCDF file"
        )


class NetCDFAdapter:
    """NetCDF files (``.nc``, ``.nc4``, ``.cdf``, ``.netcdf`` or the classic signature)."""

    name = "netcdf"
    version = "1"
    extensions = (".nc", ".nc4", ".cdf", ".netcdf")

    def can_read(self, path: str, head: bytes) -> bool:
        """NetCDF by extension or by the classic ``CDF`` signature."""
        return head[:3] == b"CDF" or path.lower().endswith(self.extensions)

    def iter_samples(self, path: str, key: str, options: Mapping[str, Any]) -> Iterator[Sample]:
        """One sample per file, or one per time window."""
        nc = _netcdf4()
        try:
            ds = nc.Dataset(path, "r")
        except (OSError, RuntimeError, ValueError) as exc:
            raise SourceError(f"{path}: not a readable NetCDF file: {exc}") from exc
        try:
            _check_classic_size(ds, path)
            ds.set_auto_maskandscale(False)
            ds.set_always_mask(False)
            entries: list[ArrayEntry] = []
            params: dict[str, FieldValue] = {}
            metadata: dict[str, Any] = {}
            time_dim = options.get("time_name")
            if time_dim is None:
                unlimited = [d for d, dim in ds.dimensions.items() if dim.isunlimited()]
                named = [d for d in ("time", "t") if d in ds.dimensions]
                time_dim = (unlimited or named or [None])[0]
            for prefix, group in _groups(ds):
                attribute_fields(
                    prefix, {a: group.getncattr(a) for a in group.ncattrs()}, params, metadata
                )
                for vname in sorted(group.variables):
                    var = group.variables[vname]
                    name = f"{prefix}/{vname}" if prefix else vname
                    attribute_fields(
                        name,
                        {a: var.getncattr(a) for a in var.ncattrs()},
                        params,
                        metadata,
                        is_array=True,
                    )
                    dtype = np.dtype(var.dtype) if not isinstance(var.dtype, type) else None
                    if dtype is None or dtype.kind in "SUO":
                        value = var[...]
                        if dtype is not None and dtype.kind == "S":
                            value = nc.chartostring(value) if value.ndim else value
                        value = np.asarray(value)
                        if value.ndim == 0:
                            item = value.item()
                            params[name] = (
                                item.decode("utf-8", "replace")
                                if isinstance(item, bytes)
                                else str(item)
                            )
                        else:
                            metadata[name] = json_safe(value)
                        continue
                    if dtype.kind not in "biuf":
                        raise SourceError(
                            f"{path}: field {name!r}: unsupported NetCDF dtype {dtype}"
                        )
                    entries.append(
                        ArrayEntry(
                            name, SlicedArray(var, path=path, field=name), tuple(var.dimensions)
                        )
                    )
        except SourceError:
            ds.close()
            raise
        except (OSError, RuntimeError, KeyError, ValueError, IndexError) as exc:
            ds.close()
            raise SourceError(f"{path}: corrupt NetCDF structure: {exc}") from exc
        try:
            yield from tree_samples(
                path, key, entries, params, metadata, options, time_dim=time_dim
            )
        finally:
            ds.close()
