"""simstore: versioned, content-addressed training data for physics foundation models.

``import simstore`` stays light (a few milliseconds: the command line's start, where a
Ctrl-C must already be one line, imports it first): the catalog, the loader
(``simstore.SimDataset``), the ingest entry point (``simstore.ingest``) and the rest are
loaded on first use through a module ``__getattr__``.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import TYPE_CHECKING, Any

if "pyarrow" not in sys.modules:
    # Arrow's default allocator (mimalloc in pyarrow's wheels) commits its arenas whole,
    # and where transparent huge pages are on, each 2 MiB of them is a zeroed huge page
    # at its first touch: a loader's first batch in a new process faulted in six, which
    # on a VM whose host had not backed them cost 25-70 ms. Committed as used, nothing
    # faults in a huge page. Read when pyarrow loads, so only before it is imported;
    # a job that imports pyarrow first can set it in its environment (docs/loader.md).
    os.environ.setdefault("MIMALLOC_ARENA_EAGER_COMMIT", "0")

from simstore.errors import (
    AlreadyExistsError,
    ConflictError,
    FormatError,
    IntegrityError,
    InvalidInputError,
    NotFoundError,
    NotWritableError,
    ReadOnlyError,
    SimstoreError,
    SourceError,
    StorageError,
    UnsupportedFormatError,
)

if TYPE_CHECKING:
    from simstore.catalog import Catalog, CommitResult, DiffResult, gc, verify
    from simstore.ingest import ingest
    from simstore.loaders import SimDataLoader, SimDataset
    from simstore.names import Ref, parse_ref
    from simstore.sample import FieldSpec, Sample
    from simstore.snapshot import Snapshot
    from simstore.storage import ObjectStore, open_store

__version__ = "0.1.0"

__all__ = [
    "AlreadyExistsError",
    "Catalog",
    "CommitResult",
    "ConflictError",
    "DiffResult",
    "FieldSpec",
    "FormatError",
    "IntegrityError",
    "InvalidInputError",
    "NotFoundError",
    "NotWritableError",
    "ObjectStore",
    "ReadOnlyError",
    "Ref",
    "Sample",
    "SimDataLoader",
    "SimDataset",
    "SimstoreError",
    "Snapshot",
    "SourceError",
    "StorageError",
    "UnsupportedFormatError",
    "gc",
    "ingest",
    "open_store",
    "parse_ref",
    "verify",
]

_LAZY = {
    "Catalog": "simstore.catalog",
    "CommitResult": "simstore.catalog",
    "DiffResult": "simstore.catalog",
    "gc": "simstore.catalog",
    "verify": "simstore.catalog",
    "Ref": "simstore.names",
    "parse_ref": "simstore.names",
    "FieldSpec": "simstore.sample",
    "Sample": "simstore.sample",
    "Snapshot": "simstore.snapshot",
    "ObjectStore": "simstore.storage",
    "open_store": "simstore.storage",
    "SimDataset": "simstore.loaders",
    "SimDataLoader": "simstore.loaders",
    "ingest": "simstore.ingest",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        # a submodule not imported yet (``simstore.stats`` after ``import simstore``)
        try:
            return importlib.import_module(f"simstore.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"simstore.{name}":
                raise
        raise AttributeError(f"module 'simstore' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # found once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
