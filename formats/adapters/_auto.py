"""The ``auto`` adapter (the default): picks an adapter per file by extension, then magic bytes.

Built-in adapters are tried first in a fixed order (NetCDF before HDF5, since a NetCDF-4
file is an HDF5 file), by extension and then by each adapter's ``can_read`` on the file's
first bytes; any other installed adapter (entry-point group ``simstore.adapters``) comes
after, so a pipeline's own adapter is picked for the files only it recognises.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

from simstore.errors import SourceError
from simstore.ingest import load_adapters
from simstore.ingest._guard import check_options_of, claims
from simstore.ingest._sources import read_head  # one sniff: refuses pipes, names bad links
from simstore.protocols import SourceAdapter
from simstore.sample import Sample

__all__ = ["AutoAdapter", "read_head"]

_BUILTIN = ("netcdf", "hdf5", "npz", "npy", "zarr", "mesh", "cad")


class AutoAdapter:
    """Chooses the adapter for each file; ``resolve`` tells which."""

    name = "auto"
    version = "1"
    fresh_arrays = True  # every array it yields is its sample's own (docs/adapters.md)
    extensions: tuple[str, ...] = ()

    def __init__(self) -> None:
        self._adapters: list[SourceAdapter] | None = None

    def _candidates(self) -> list[SourceAdapter]:
        if self._adapters is None:
            installed = load_adapters()
            names = [n for n in _BUILTIN if n in installed]
            names += [n for n in installed if n not in names and n != self.name]
            self._adapters = [installed[n] for n in names]
        return self._adapters

    @property
    def options(self) -> frozenset[str] | None:
        """The options of every adapter this one may pick.

        An option is known to an ``auto`` ingest when some installed adapter takes it. None
        (any option) when an installed adapter does not declare its ``options``: an option
        may then be that adapter's.
        """
        accepted: set[str] = set()
        for adapter in self._candidates():
            declared = getattr(adapter, "options", None)
            if declared is None:
                return None
            accepted.update(declared)
        return frozenset(accepted)

    def check_options(self, options: Mapping[str, Any]) -> None:
        """Have every adapter this one may pick check the values of its own options.

        An adapter sees only the options it declares (all of them when it declares none),
        so a value is judged by the adapter that reads it; a bad one is an
        ``InvalidInputError`` before anything is read.
        """
        for adapter in self._candidates():
            declared = getattr(adapter, "options", None)
            check_options_of(
                adapter, {k: v for k, v in options.items() if declared is None or k in declared}
            )

    def resolve(self, path: str, head: bytes) -> SourceAdapter | None:
        """The adapter for this file (None when no installed adapter reads it).

        The first adapter whose extensions match and whose ``can_read`` agrees, else the
        first whose ``can_read`` accepts the name and first bytes. A directory is offered
        with a trailing separator (``case.h5/``), as the ingest pipeline offers it: only an
        adapter that reads directories by what they hold (Zarr) claims it, not one that
        judges by extension.
        """
        if not head and os.path.isdir(path):
            path = os.path.join(path, "")
        low = path.lower()
        candidates = self._candidates()
        for adapter in candidates:
            exts = tuple(getattr(adapter, "extensions", ()))
            if exts and low.endswith(exts) and claims(adapter, path, head):
                return adapter
        for adapter in candidates:
            if claims(adapter, path, head):
                return adapter
        return None

    def can_read(self, path: str, head: bytes) -> bool:
        """Whether any installed adapter reads this file."""
        return self.resolve(path, head) is not None

    def iter_samples(self, path: str, key: str, options: Mapping[str, Any]) -> Iterator[Sample]:
        """The samples of the adapter :meth:`resolve` picks."""
        adapter = self.resolve(path, read_head(path))
        if adapter is None:
            raise SourceError(f"{path}: no installed adapter reads this file")
        yield from adapter.iter_samples(path, key, options)
