"""Source adapters: each reads one kind of file and yields samples.

Every adapter here is registered in the entry-point group ``simstore.adapters`` under its
``name``; see docs/adapters.md for writing one in another package.
"""

from ._auto import AutoAdapter, read_head
from ._cad import CadAdapter
from ._hdf5 import HDF5Adapter
from ._mesh import MeshAdapter
from ._netcdf import NetCDFAdapter
from ._numpy import NpyAdapter, NpzAdapter
from ._tree import SlicedArray
from ._zarrsrc import ZarrAdapter

__all__ = [
    "AutoAdapter",
    "CadAdapter",
    "HDF5Adapter",
    "MeshAdapter",
    "NetCDFAdapter",
    "NpyAdapter",
    "NpzAdapter",
    "SlicedArray",
    "ZarrAdapter",
    "read_head",
]
