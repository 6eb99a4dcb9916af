"""Shard indexes kept in this process from one reader of a shard to the next.

A Zarr shard's reader parses the zip's directory when it opens and each sample's
``zarr.json`` as it reads it; a shard of 4,096 samples of 8 KiB cost as much again in
this as in its reads. A loader opens its shards afresh each epoch, so when a reader of a
trusted file (hashed to the shard's id) closes, what it learnt (its ``take_index()``) is
kept here by the shard's id, and the next reader of a trusted file with that id, in any
later epoch or dataset of this process, starts from it (``index.reopen(path)``).

Bounded: at most :data:`KEPT_INDEX_BYTES` of estimated memory per process, least recently
kept out first; an index larger than that is not kept. An index is taken out while a
reader uses it (a reader fills its tables further), so two readers never share one. A
forked process starts with its parent's (copy-on-write) and keeps its own from then on.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import Any, Protocol

__all__ = ["INDEXES", "KEPT_INDEX_BYTES", "IndexCache", "ShardIndex"]

KEPT_INDEX_BYTES = 64 << 20
"""The memory a process's kept indexes may hold, estimated: the indexes of about 16 shards
of 4,096 small samples, or of thousands of shards of 4 MiB samples."""


class ShardIndex(Protocol):
    """What a trusted reader leaves for the next reader of the same bytes."""

    @property
    def nbytes(self) -> int: ...

    def reopen(self, path: str) -> Any: ...


class IndexCache:
    """Indexes by shard id, taken out while used, within a byte budget (LRU)."""

    def __init__(self, budget: int = KEPT_INDEX_BYTES) -> None:
        self.budget = budget
        self._lock = threading.Lock()
        self._kept: OrderedDict[str, ShardIndex] = OrderedDict()
        self._bytes = 0

    def take(self, shard_id: str) -> ShardIndex | None:
        """The index kept for ``shard_id``, taken out (None: none kept)."""
        with self._lock:
            index = self._kept.pop(shard_id, None)
            if index is not None:
                self._bytes -= index.nbytes
            return index

    def keep(self, shard_id: str, index: ShardIndex) -> None:
        """Keep ``index`` (a closed reader's), the oldest ones going past the budget."""
        size = index.nbytes
        with self._lock:
            old = self._kept.pop(shard_id, None)
            if old is not None:
                self._bytes -= old.nbytes
            if size > self.budget:
                return
            self._kept[shard_id] = index
            self._bytes += size
            while self._bytes > self.budget:
                _, out = self._kept.popitem(last=False)
                self._bytes -= out.nbytes

    @property
    def nbytes(self) -> int:
        """The estimated memory of the indexes kept."""
        with self._lock:
            return self._bytes

    def __len__(self) -> int:
        with self._lock:
            return len(self._kept)

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()
            self._bytes = 0

    def _after_fork(self) -> None:
        self._lock = threading.Lock()  # another thread may have held it at the fork
        # and may have been between a change and its count
        self._bytes = sum(index.nbytes for index in self._kept.values())


INDEXES = IndexCache()
"""This process's kept indexes."""

os.register_at_fork(after_in_child=INDEXES._after_fork)
