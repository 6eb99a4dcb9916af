"""Catalog tier: refs, snapshots, staging, commit, diff, log, verify and gc."""

from simstore.catalog._catalog import (
    STORE_META_KEY,
    Catalog,
    CommitResult,
    DiffResult,
    StagedEntry,
    utc_now,
)
from simstore.catalog._maintenance import (
    GcReport,
    VerifyProblem,
    VerifyReport,
    gc,
    reachable_objects,
    verify,
)
from simstore.catalog._merge import CHANGES_SCHEMA
from simstore.catalog._refs import Branches, Tags

__all__ = [
    "CHANGES_SCHEMA",
    "STORE_META_KEY",
    "Branches",
    "Catalog",
    "CommitResult",
    "DiffResult",
    "GcReport",
    "StagedEntry",
    "Tags",
    "VerifyProblem",
    "VerifyReport",
    "gc",
    "reachable_objects",
    "utc_now",
    "verify",
]
