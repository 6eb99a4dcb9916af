"""Catalog tier: refs, snapshots, staging, commit, diff, log, verify and gc."""

from simstore.catalog._catalog import (
    CACHE_MARKER_KEY,
    STORE_META_KEY,
    Catalog,
    CommitResult,
    DiffResult,
    StagedEntry,
    utc_now,
)
from simstore.catalog._commit import taken_along
from simstore.catalog._gc import (
    GC_STATE_KEY,
    GcReport,
    gc,
    gc_overlapped,
    reachable_objects,
    read_gc_state,
)
from simstore.catalog._merge import CHANGES_SCHEMA
from simstore.catalog._refs import Branches, Tags
from simstore.catalog._verify import VerifyProblem, VerifyProgress, VerifyReport, verify

__all__ = [
    "CACHE_MARKER_KEY",
    "CHANGES_SCHEMA",
    "GC_STATE_KEY",
    "STORE_META_KEY",
    "Branches",
    "Catalog",
    "CommitResult",
    "DiffResult",
    "GcReport",
    "StagedEntry",
    "Tags",
    "VerifyProblem",
    "VerifyProgress",
    "VerifyReport",
    "gc",
    "gc_overlapped",
    "reachable_objects",
    "read_gc_state",
    "taken_along",
    "utc_now",
    "verify",
]
