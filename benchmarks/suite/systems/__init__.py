"""One module per system: ``write(pool, out, profile, options)`` and ``loader(...)``.

Each module imports its library inside those functions, so the runner can time imports
and the driver can list systems without importing any of them. ``MODULES`` names the
import that decides whether the system is installed in an interpreter.
"""

from __future__ import annotations

import importlib
from types import ModuleType

MODULES: dict[str, str] = {
    "simstore": "simstore.loaders",  # what a training script imports, as `litdata` is
    "mosaic": "streaming",
    "litdata": "litdata",
    "webdataset": "webdataset",
    "lance": "lance",
    "parquet": "pyarrow",
    "naive": "numpy",
}


def load(family: str) -> ModuleType:
    """The module of a system family (``simstore``, ``mosaic``, ...)."""
    if family not in MODULES:
        raise ValueError(f"unknown system {family!r}")
    return importlib.import_module(f"benchmarks.suite.systems.{family}_sys")
