"""simstore: versioned, content-addressed training data for physics foundation models.

``import simstore`` stays light: it never imports torch, and the loader
(``simstore.SimDataset``) and the ingest entry point (``simstore.ingest``) are loaded on
first use through a module ``__getattr__``.
"""

from __future__ import annotations

from typing import Any

from simstore.catalog import Catalog, CommitResult, DiffResult, gc, verify
from simstore.errors import (
    AlreadyExistsError,
    ConflictError,
    FormatError,
    IntegrityError,
    InvalidInputError,
    NotFoundError,
    ReadOnlyError,
    SimstoreError,
    SourceError,
    StorageError,
)
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
    "gc",
    "ingest",
    "open_store",
    "parse_ref",
    "verify",
]

_LAZY = {
    "SimDataset": ("simstore.loaders", "SimDataset"),
    "SimDataLoader": ("simstore.loaders", "SimDataLoader"),
    "ingest": ("simstore.ingest", "ingest"),
}


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'simstore' has no attribute {name!r}")
    import importlib

    module = importlib.import_module(target[0])
    return getattr(module, target[1])
