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
import re
import shutil
import tempfile
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from simstore.errors import SourceError
from simstore.sample import FieldValue, Sample

from ._cdf_header import check_classic_header
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

__all__ = ["NetCDFAdapter"]


def _netcdf4() -> Any:
    try:
        import netCDF4
    except ImportError as exc:
        raise ImportError(
            "the netcdf adapter needs netCDF4: pip install 'simstore[netcdf]'"
        ) from exc
    return netCDF4


def _open_dataset(nc: Any, path: str) -> Any:
    r"""``netCDF4.Dataset(path, "r")``, also for a path that is not valid UTF-8.

    netCDF4 takes only names it can encode as UTF-8, so a file under a folder named with
    other bytes (``/data/run\xff/a.nc``, which Python holds as lone surrogates) is opened
    through a symbolic link with a UTF-8 name, removed once the file is open (netCDF-C
    keeps its own descriptor).
    """
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        pass
    else:
        return nc.Dataset(path, "r")
    folder = tempfile.mkdtemp(prefix="simstore-nc-")
    try:
        alias = os.path.join(folder, "source.nc")
        os.symlink(os.fsencode(os.path.abspath(path)), os.fsencode(alias))
        return nc.Dataset(alias, "r")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _groups(ds: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    yield prefix, ds
    for name in sorted(ds.groups):
        yield from _groups(ds.groups[name], f"{prefix}/{name}" if prefix else name)


def _attributes(obj: Any) -> dict[str, Any]:
    """A group's or variable's attributes, text ones with their exact bytes.

    netCDF4 decodes text attributes as UTF-8 with replacement characters; read as
    Latin-1 (one character per byte) and encoded back, they are the file's bytes (less
    the NUL characters netCDF4 strips), which ``attribute_fields`` turns into text when
    they are UTF-8 and keeps as bytes otherwise.
    """
    out: dict[str, Any] = {}
    for name in obj.ncattrs():
        value = obj.getncattr(name, encoding="latin-1")
        if isinstance(value, str):
            value = value.encode("latin-1")
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            value = [v.encode("latin-1") for v in value]
        out[name] = value
    return out


def _string_values(nc: Any, var: Any, name: str, path: str) -> Any:
    """A character or string variable's values: one ``str`` (or ``bytes``), or a JSON list.

    A character (NC_CHAR) variable's last axis is the string length. Its raw characters
    are read (netCDF4's own conversion off: with an ``_Encoding`` attribute it would
    hand back strings already) and joined once. Declared ``_Encoding`` text is decoded
    with that encoding, strictly; undeclared characters are text when they are valid
    UTF-8 (ASCII included), else they keep their exact bytes (see ``_tree.json_safe``).
    """
    encoding = None
    is_char = not isinstance(var.dtype, type) and np.dtype(var.dtype).kind == "S"
    try:
        if is_char:
            var.set_auto_chartostring(False)
            if "_Encoding" in var.ncattrs():
                encoding = str(var.getncattr("_Encoding"))
            raw = read_strings(var, path, name, vlen=False)
            words = nc.chartostring(raw, encoding="bytes") if raw.ndim else raw
            if encoding is not None:
                words = np.vectorize(lambda b: bytes(b).decode(encoding), otypes=[object])(words)
        else:
            words = read_strings(var, path, name, vlen=True)
    except (LookupError, UnicodeDecodeError) as exc:
        what = f"its _Encoding {encoding!r}" if encoding is not None else "UTF-8"
        raise SourceError(
            f"{path}: field {name!r}: character data that is not valid text in {what}: "
            f"{' '.join(str(exc).split())}"
        ) from exc
    except (OSError, RuntimeError, ValueError, TypeError, IndexError) as exc:
        raise SourceError(
            f"{path}: field {name!r}: unreadable string variable: {' '.join(str(exc).split())}"
        ) from exc
    if words.ndim == 0:
        item = words.item() if isinstance(words, np.ndarray) else words
        return text_or_bytes(bytes(item)) if isinstance(item, bytes) else str(item)
    return json_safe(words)


def _hdf5_view(ds: Any, path: str) -> Any:
    """The file opened with h5py too when it is NetCDF-4 (an HDF5 file), else None.

    netCDF4 reads a window of a [time, y, x] variable at about 1 GB/s here, h5py's
    ``read_direct`` into reused memory at about 4.5 (768 MiB of windows: 0.74 against 0.17
    CPU-seconds), so the numeric variables whose HDF5 dataset matches them exactly are
    read through h5py; everything else (metadata, names, dimensions) still comes from
    netCDF4. None where h5py cannot open the file (classic NetCDF-3, h5py missing).
    """
    if not str(getattr(ds, "data_model", "")).startswith("NETCDF4"):
        return None
    try:
        import h5py

        return h5py.File(path, "r")
    except (ImportError, OSError, ValueError):
        return None


def _hdf5_dataset(h5: Any, name: str, var: Any, dtype: np.dtype[Any]) -> Any:
    """The HDF5 dataset holding variable ``name`` exactly (same shape and type), or None.

    A variable along an unlimited dimension may be shorter in the file than netCDF4
    reports (it pads with fill values up to the dimension's length): such a variable, and
    any whose type or shape differs, is read through netCDF4.
    """
    if h5 is None:
        return None
    try:
        # netCDF-C keeps a variable named like a dimension it does not run along under
        # ``_nc4_non_coord_<name>``; the dataset called ``<name>`` is then the dimension's
        # marker (no values, perhaps the very same shape and type)
        parent, _, leaf = name.rpartition("/")
        hidden = f"{parent}/_nc4_non_coord_{leaf}" if parent else f"_nc4_non_coord_{leaf}"
        dset = h5.get(hidden)
        if dset is None:
            dset = h5.get(name)
            if dset is not None and _is_dimension_marker(dset):
                return None
        if dset is None or not hasattr(dset, "read_direct"):
            return None
        if tuple(dset.shape) != tuple(var.shape):
            return None
        if np.dtype(dset.dtype).newbyteorder("=") != dtype.newbyteorder("="):
            return None
        return dset
    except (OSError, KeyError, ValueError, TypeError):
        return None


def _decoded_chunks(var: Any) -> tuple[int, ...] | None:
    """The chunk shape of a compressed (filtered) NetCDF-4 variable, else None.

    A read of such a variable decodes whole chunks, with netCDF4 and h5py alike (see
    ``_tree.SlicedArray``); an uncompressed or classic variable reads only its bytes.
    """
    try:
        chunking = var.chunking()
        filters = var.filters() or {}
    except (AttributeError, RuntimeError, ValueError):
        return None
    if not isinstance(chunking, list | tuple):
        return None
    if not any(v for k, v in filters.items() if k not in ("complevel",)):
        return None
    return tuple(int(c) for c in chunking)


def _dimension_names(var: Any) -> tuple[str, ...]:
    """A variable's dimensions, a group's own ones named with the group's path.

    The time axis is a root dimension (``time``); a group may define a dimension of the
    same name and another length, which is not it (``/sub/time``).
    """
    try:
        dims = var.get_dims()
    except (AttributeError, RuntimeError, KeyError):
        return tuple(var.dimensions)
    out = []
    for d in dims:
        where = d.group().path
        out.append(d.name if where == "/" else f"{where}/{d.name}")
    return tuple(out)


def _is_dimension_marker(dset: Any) -> bool:
    """Whether an HDF5 dataset is netCDF-C's stand-in for a dimension (no variable's values)."""
    try:
        label = dset.attrs.get("NAME")
    except (OSError, KeyError, TypeError):
        return False
    if isinstance(label, np.ndarray):
        label = label.tobytes()
    if isinstance(label, bytes):
        label = label.decode("latin-1")
    return isinstance(label, str) and label.startswith("This is a netCDF dimension but not")


_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_NETCDF_MARKS = ("_Netcdf4Dimid", "_Netcdf4Coordinates")


def _written_by_netcdf(path: str) -> bool:
    """Whether an HDF5 file is NetCDF-4: netCDF-C's root attribute or dimension marks.

    Read as plain HDF5 such a file shows netCDF-C's internals (dimension stand-ins of
    zeros, renamed variables, object references) in place of its variables.
    """
    try:
        import h5py

        with h5py.File(path, "r") as f:
            if "_NCProperties" in f.attrs:
                return True
            for name in f:
                obj = f.get(name)
                if isinstance(obj, h5py.Dataset) and (
                    any(mark in obj.attrs for mark in _NETCDF_MARKS)
                    or _is_dimension_marker(obj)
                ):
                    return True
    except Exception:  # not HDF5 after all, damaged, h5py missing: not ours to claim
        return False
    return False


def _check_all_read(path: str, ds: Any, h5: Any) -> None:
    """Refuse a NetCDF-4 file holding an HDF5 dataset netCDF4 does not show as a variable.

    netCDF-C hides datasets of types it cannot map (object references, some opaque
    types; netCDF4 warns and skips others): they would be dropped without a word. Its own
    datasets (dimension stand-ins, ``_nc4_non_coord_`` renames) are not variables.
    """
    import h5py

    for prefix, group in _groups(ds):
        hgroup = h5[prefix] if prefix else h5
        for name in hgroup:
            obj = hgroup.get(name)
            if not isinstance(obj, h5py.Dataset):
                continue
            own = name.removeprefix("_nc4_non_coord_")
            if own in group.variables or _is_dimension_marker(obj):
                continue
            field = f"{prefix}/{name}" if prefix else name
            raise SourceError(
                f"{path}: field {field!r}: an HDF5 dataset of type {obj.dtype} that netCDF "
                "does not read as a variable; read the file with --adapter hdf5"
            )


_SKIPPED = re.compile(r"variable '(.+?)' has unsupported datatype")


class NetCDFAdapter:
    """NetCDF files (``.nc``, ``.nc4``, ``.cdf``, ``.netcdf`` or the classic signature)."""

    name = "netcdf"
    version = "1"
    fresh_arrays = True  # every array it yields is its sample's own (docs/adapters.md)
    libraries = ("netCDF4", "h5py")
    extensions = (".nc", ".nc4", ".cdf", ".netcdf")
    options = TIME_OPTIONS
    check_options = staticmethod(check_time_options)

    def can_read(self, path: str, head: bytes) -> bool:
        """NetCDF by extension, classic ``CDF`` signature, or HDF5 file netCDF-C wrote.

        The last is a NetCDF-4 file named otherwise, as WRF's ``wrfout_d01_...``.
        """
        if head[:3] == b"CDF" or path.lower().endswith(self.extensions):
            return True
        return head.startswith(_HDF5_SIGNATURE) and _written_by_netcdf(path)

    supports_sample_ranges = True
    """Time windows can be read in ranges, so ingest cuts a large file into pieces that run
    on several workers (see ``simstore.ingest.SupportsSampleRanges``)."""

    def count_samples(self, path: str, options: Mapping[str, Any]) -> int:
        """How many samples :meth:`iter_samples` yields: 1, or the number of windows."""
        ds, h5, entries, _, _, time_dim = self._prepare(path, options, fast_reads=False)
        try:
            return tree_sample_count(path, entries, options, time_dim=time_dim)
        finally:
            _close(ds, h5)

    def iter_samples(self, path: str, key: str, options: Mapping[str, Any]) -> Iterator[Sample]:
        """One sample per file, or one per time window (``sample_range``: some of them)."""
        ds, h5, entries, params, metadata, time_dim = self._prepare(path, options)
        try:
            yield from tree_samples(
                path, key, entries, params, metadata, options, time_dim=time_dim
            )
        finally:
            _close(ds, h5)

    @staticmethod
    def _prepare(
        path: str, options: Mapping[str, Any], *, fast_reads: bool = True
    ) -> tuple[Any, Any, list[ArrayEntry], dict[str, FieldValue], dict[str, Any], str | None]:
        """The open file (and its h5py view), its arrays, parameters, metadata, time axis."""
        nc = _netcdf4()
        # before netCDF-C allocates what a header declares, or reads a truncated file's
        # missing values as fill values
        check_classic_header(path)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                ds = _open_dataset(nc, path)
        except (OSError, RuntimeError, ValueError) as exc:
            raise SourceError(f"{path}: not a readable NetCDF file: {exc}") from exc
        for warning in caught:
            skipped = _SKIPPED.search(str(warning.message))
            if skipped is not None:  # netCDF4 leaves such a variable out with a warning
                ds.close()
                raise SourceError(
                    f"{path}: field {skipped.group(1)!r}: unsupported NetCDF type (netCDF4 "
                    "cannot read this variable's type)"
                )
            warnings.warn_explicit(warning.message, warning.category, warning.filename,
                                   warning.lineno)
        h5 = None
        try:
            h5 = _hdf5_view(ds, path) if fast_reads else None
            if h5 is not None:
                _check_all_read(path, ds, h5)
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
                attribute_fields(prefix, _attributes(group), params, metadata, path=path)
                for vname in sorted(group.variables):
                    var = group.variables[vname]
                    name = f"{prefix}/{vname}" if prefix else vname
                    attribute_fields(
                        name,
                        _attributes(var),
                        params,
                        metadata,
                        is_array=True,
                        path=path,
                    )
                    if getattr(var, "_isvlen", False) and var.dtype is not str:
                        raise SourceError(
                            f"{path}: field {name!r}: unsupported NetCDF type (variable-length "
                            f"{np.dtype(var.dtype)}): only fixed-size numeric, character and "
                            "string variables are read"
                        )
                    dtype = np.dtype(var.dtype) if not isinstance(var.dtype, type) else None
                    if dtype is None or dtype.kind in "SUO":
                        value = _string_values(nc, var, name, path)
                        put_value(path, name, value, params, metadata)
                        continue
                    if dtype.kind not in "biuf":
                        raise SourceError(
                            f"{path}: field {name!r}: unsupported NetCDF dtype {dtype}"
                        )
                    handle = _hdf5_dataset(h5, name, var, dtype)
                    entries.append(
                        ArrayEntry(
                            name,
                            SlicedArray(
                                var if handle is None else handle,
                                path=path,
                                field=name,
                                chunks=_decoded_chunks(var),
                            ),
                            _dimension_names(var),
                        )
                    )
        except SourceError:
            _close(ds, h5)
            raise
        except (OSError, RuntimeError, KeyError, ValueError, IndexError) as exc:
            _close(ds, h5)
            raise SourceError(f"{path}: corrupt NetCDF structure: {exc}") from exc
        return ds, h5, entries, params, metadata, time_dim


def _close(ds: Any, h5: Any) -> None:
    ds.close()
    if h5 is not None:
        h5.close()
