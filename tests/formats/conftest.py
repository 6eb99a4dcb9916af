"""Fixtures of the format and adapter tests: real files written by h5py, netCDF4, zarr,
meshio and gmsh (see source_files.py)."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
