"""A byte-bounded LRU of decoded blocks (Parquet row groups), shareable between readers.

A shuffled read asks a shard for a few rows at a time, from all of its row groups in
turn; decoding a whole row group for each such visit multiplies the work by the row
group's rows (up to ~200x for 8 KiB samples in 16 MiB row groups). Readers therefore keep
decoded row groups here, under a key that includes the reader, and evict the least
recently used ones beyond ``limit_bytes``. A loader worker gives all its open readers one
cache, so the budget is per worker, not per shard; a reader opened alone gets its own.
Thread-safe: the loader decodes chunks on several threads.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

__all__ = ["BlockCache"]


class BlockCache:
    """Decoded blocks by key, least recently used evicted first beyond ``limit_bytes``."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = max(0, int(limit_bytes))
        self._lock = threading.Lock()
        self._items: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    @property
    def nbytes(self) -> int:
        """Bytes held now."""
        return self._bytes

    def get(self, key: Hashable) -> Any | None:
        """The block under ``key`` (refreshed as most recently used), or None."""
        with self._lock:
            item = self._items.get(key)
            if item is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return item[0]

    def contains(self, key: Hashable) -> bool:
        """Whether a block is kept under ``key`` (not counted as a hit or a miss)."""
        with self._lock:
            return key in self._items

    def put(self, key: Hashable, value: Any, nbytes: int) -> None:
        """Keep ``value``, evicting older blocks; a block over the whole limit is not kept."""
        if nbytes > self.limit_bytes:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._items[key] = (value, nbytes)
            self._bytes += nbytes
            while self._bytes > self.limit_bytes and self._items:
                _, (_, size) = self._items.popitem(last=False)
                self._bytes -= size

    def drop(self, owner: object) -> None:
        """Forget every block whose key starts with ``owner`` (a closed reader's)."""
        with self._lock:
            gone = [k for k in self._items if isinstance(k, tuple) and k and k[0] is owner]
            for k in gone:
                self._bytes -= self._items.pop(k)[1]
