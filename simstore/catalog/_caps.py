"""The largest catalog object of each kind simstore reads; a larger one is damage.

Refs, store records, staging entries, snapshots and manifest parts are read whole. Each
kind has a size no simstore writer exceeds (the writers refuse to, see
:func:`check_written`), so an object past it is not one simstore wrote: a file planted
or grown in the store, a sparse file of gigabytes. It is refused by the size its read
reports, before its bytes are read (``ObjectStore.get``'s ``max_bytes``: no request
more), with one error naming it: an :class:`IntegrityError` for a snapshot or manifest
part (named by its hash, which it cannot have), a :class:`FormatError` for the rest,
as other damage to each kind is reported (``gc.json``, whose damage counts as a gc that
may be running, is read so too: see ``read_gc_state``). docs/format.md lists the caps.

Change sets (a whole ingest's rows), ingest journal records (a file's rows) and shards
grow with the data and have no cap here.
"""

from __future__ import annotations

from typing import Literal

from simstore._sizes import human_bytes
from simstore.errors import FormatError, IntegrityError, InvalidInputError
from simstore.storage import ObjectStore
from simstore.storage._base import get_at_most, get_versioned_at_most

__all__ = [
    "PART_MAX_BYTES",
    "RECORD_MAX_BYTES",
    "REF_MAX_BYTES",
    "SNAPSHOT_MAX_BYTES",
    "STAGING_MAX_BYTES",
    "Kind",
    "check_written",
    "max_bytes",
    "read_capped",
    "read_capped_versioned",
]

Kind = Literal["ref", "store record", "staging entry", "snapshot", "manifest part"]

_KiB = 1024
_MiB = 1024 * _KiB

REF_MAX_BYTES = 4 * _KiB
"""A branch or tag: ``{"format_version":1,"snapshot":"<id>"}``, 66 bytes."""
RECORD_MAX_BYTES = 64 * _KiB
"""``simstore.json`` and ``gc.json``: a few fixed fields, under 200 bytes."""
SNAPSHOT_MAX_BYTES = 1024 * _MiB
"""About 150 bytes per manifest part plus its two keys: a snapshot of 10 million samples
(about 1,000 parts) is about 0.2 MiB, one of a billion about 18 MiB (architecture.md).
Its lineage lists each source object an ingest stored (a CAD part's file) twice, about
72 bytes: 10 million CAD parts committed at once make a snapshot of about 0.7 GiB."""
PART_MAX_BYTES = 256 * _MiB
"""At most ``4 * target_rows`` rows (32,768 by default) of a key, 16 hash bytes, a shard
(dictionary-coded) and two integers, zstd-compressed: a few MiB at most at the
benchmark's keys (236 KiB on average at 10 million samples), under 140 MiB at 4 KiB
keys."""
STAGING_MAX_BYTES = 1024 * _MiB
"""35 bytes per shard an ingest wrote (its list of shard ids) and per source object it
stored (a CAD part's file), plus schema, statistics and lineage: 30 million of them,
against 160,000 shards for 10 million samples of 4 MiB in the default 256 MiB shards."""


def max_bytes(kind: Kind) -> int:
    """The cap of ``kind`` (read when called, so that a test may lower it)."""
    caps = {
        "ref": REF_MAX_BYTES,
        "store record": RECORD_MAX_BYTES,
        "staging entry": STAGING_MAX_BYTES,
        "snapshot": SNAPSHOT_MAX_BYTES,
        "manifest part": PART_MAX_BYTES,
    }
    return caps[kind]


def _refused(store: ObjectStore, key: str, kind: Kind, by: str) -> FormatError | IntegrityError:
    text = (f"{store.url}: {key} is larger than any {kind} simstore writes (at most "
            f"{human_bytes(max_bytes(kind))}), so it is damaged{by}")
    if kind in ("snapshot", "manifest part"):
        return IntegrityError(text)
    return FormatError(text)


def read_capped(store: ObjectStore, key: str, kind: Kind, *, by: str = "") -> bytes:
    """The object at ``key``, of ``kind``; refused unread when larger than its cap.

    ``by``: what names it, added to the error (``"; referenced by snapshot <id>"``).
    A missing object is the store's ``NotFoundError``, as for a plain read.
    """
    try:
        return get_at_most(store, key, max_bytes(kind))
    except FormatError as exc:
        raise _refused(store, key, kind, by) from exc


def read_capped_versioned(store: ObjectStore, key: str, kind: Kind) -> tuple[bytes, str]:
    """:func:`read_capped` with the version token ``compare_and_swap`` takes."""
    try:
        return get_versioned_at_most(store, key, max_bytes(kind))
    except FormatError as exc:
        raise _refused(store, key, kind, "") from exc


def check_written(kind: Kind, size_bytes: int, what: str, advice: str) -> None:
    """Refuse to write an object of ``kind`` larger than its readers take.

    ``what`` names it, ``advice`` says how to make it smaller. An
    :class:`InvalidInputError`: the arguments (``target_rows``, keys, the shards of one
    ingest) made it so large.
    """
    cap = max_bytes(kind)
    if size_bytes > cap:
        raise InvalidInputError(
            f"{what} would be {human_bytes(size_bytes)}, more than any {kind} simstore "
            f"reads ({human_bytes(cap)}): {advice}"
        )
