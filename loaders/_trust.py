"""Which local shard files a job has hashed to their ids: tables its processes share.

:class:`TrustTable` holds the files hashed in this job, so later epochs trust them while
their stamp (:func:`file_stamp`) is unchanged; :class:`VerifiedTable` is where a
loader's workers publish the shards each of them hashed, so its siblings trust them
too. Both are arrays of 8-byte slots the loader makes (in shared memory, with workers);
the reads they save are made in :mod:`._fetch`.
"""

from __future__ import annotations

import numpy as np
import xxhash

from simstore._verified import stamp_info

__all__ = ["TRUSTED_SLOTS", "VERIFIED_SLOTS", "TrustTable", "VerifiedTable", "file_stamp"]


VERIFIED_SLOTS = 4096
"""Slots of the table in which a loader's workers publish the local shards they hashed."""


TRUSTED_SLOTS = 4096
"""Slots of a :class:`TrustTable` (8 bytes each)."""

_MASK63 = (1 << 63) - 1


def file_stamp(path: str) -> int | None:
    """A 63-bit digest of a file's identity and state, or None if it cannot be read.

    Device, inode, size, and modification and change times: a file rewritten, replaced
    or touched gets another stamp (the change time cannot be set back by a user).
    """
    info = stamp_info(path)
    return info[0] if info is not None else None


class TrustTable:
    """A store's local shard files hashed to their ids earlier in this job.

    A shard is hashed as a whole the first time a loader reads it; later epochs trust the
    same file without hashing it again, while its :func:`file_stamp` is unchanged (with
    4 MiB samples, hashing every shard again made each epoch 1.3-1.8x slower than not
    verifying at all). The table is the dataset's own without workers, and one table in
    shared memory per :class:`SimDataLoader` with workers, kept across epochs (each
    epoch's workers are new processes). A slot holds one 8-byte value made from the
    shard id and the stamp (one aligned store); two shards whose ids meet in a slot
    overwrite each other, which only costs a hash.
    """

    def __init__(self, table: np.ndarray, scope: int = 0) -> None:
        self.table = table
        self.scope = scope
        """Which source of a mixture (their stores are different files under one id)."""

    def scoped(self, scope: int) -> TrustTable:
        """The same table for the shards of source ``scope``."""
        return TrustTable(self.table, scope)

    def _slot_value(self, shard_id: str, stamp: int) -> tuple[int, int]:
        value = xxhash.xxh3_64_intdigest(f"{self.scope}:{shard_id}:{stamp}".encode())
        slot = (int(shard_id[16:24], 16) + self.scope) % len(self.table)
        return slot, (value & _MASK63) | 1

    def has(self, shard_id: str, stamp: int) -> bool:
        """Whether ``shard_id``'s file with this stamp hashed to its id in this job."""
        slot, value = self._slot_value(shard_id, stamp)
        return int(self.table[slot]) == value

    def add(self, shard_id: str, stamp: int) -> None:
        """Record that the file with this stamp hashed to ``shard_id``."""
        slot, value = self._slot_value(shard_id, stamp)
        self.table[slot] = value


class VerifiedTable(TrustTable):
    """Local shards whose whole-object hash one of a loader's workers has matched.

    A DataLoader's workers read the same shards (each takes every K-th batch of the same
    stream), and each hashed every shard it read: K times the hashing. The loader makes
    this table in shared memory before it starts the workers (as torch makes its own
    queues: nothing named, nothing left behind by a crash); worker ``w`` of ``K`` hashes
    the shards it *owns* (by their id, ``w`` mod ``K``) and publishes each match here,
    and its siblings read those shards with page checks until the match is published,
    then trust them. A shard whose owner has not published it when a sibling needs the
    answer (a wrong hash is the better error, the epoch's end) is hashed by that sibling
    itself, so every shard read is verified in every worker that read it, by someone.

    A match is published with the stamp of the file the owner hashed, as a
    :class:`TrustTable` records it: a sibling trusts it only for a file with that stamp,
    so a file written in place after the owner's hash is hashed again by whoever reads
    it next. Two shards whose ids meet in a slot overwrite each other, which only costs
    a hash.
    """

    def __init__(self, table: np.ndarray, worker: int, workers: int, scope: int = 0) -> None:
        super().__init__(table, scope)
        self.worker = worker
        self.workers = workers

    def scoped(self, scope: int) -> VerifiedTable:
        """The same table for the shards of source ``scope``."""
        return VerifiedTable(self.table, self.worker, self.workers, scope)

    def owns(self, shard_id: str) -> bool:
        """Whether this worker hashes ``shard_id`` for its siblings."""
        return int(shard_id[24:32], 16) % self.workers == self.worker

    def publish(self, shard_id: str, stamp: int) -> None:
        """Publish that the file with this stamp hashed to ``shard_id``."""
        self.add(shard_id, stamp)
