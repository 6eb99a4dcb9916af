"""The reading options of a dataset, and parsing of the byte sizes users give."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from typing import Literal

from simstore.loaders._cache import CacheConfig, copies_bytes
from simstore.loaders._checks import parse_bytes, shown
from simstore.loaders._nodecache import LayoutCache
from simstore.loaders._partrows import PartRowsCache
from simstore.loaders._pipeline import PrefetchConfig, ShardOpener
from simstore.loaders._plan import Remainder

from simstore._verified import NodeRecords
from simstore.errors import InvalidInputError, StorageError

__all__ = ["LoaderOptions", "cache_config", "parse_bytes"]


@dataclass(frozen=True, slots=True, kw_only=True)
class LoaderOptions:
    """How a dataset reads (shared by the sources of a mixture)."""

    remainder: Remainder = "pad"
    on_corrupt: str = "raise"
    cache: CacheConfig | None = None
    prefetch: PrefetchConfig = field(default_factory=PrefetchConfig)
    verify: bool = True
    node: NodeRecords | None = None
    """Where whole-shard hash matches are remembered for later jobs (``verify_every_s``)."""
    part_rows: PartRowsCache | None = None
    """Where decoded manifest rows are kept for later jobs on the node."""
    layouts: LayoutCache | None = None
    """Where trusted shards' page layouts are kept for later jobs on the node (used only
    with ``node``: a layout is read only for a file a record trusts)."""
    max_bandwidth: float | None = None
    zero_copy: bool = True
    map_files: bool | Literal["first"] = "first"
    """Map large page-aligned chunks of local shard files into batches, not read them:
    every one (True), only those of an iteration's first chunk (``"first"``), none."""
    shard_opener: ShardOpener | None = None
    log_every_s: float | None = None


def cache_config(
    cache_dir: str | os.PathLike[str] | None, limit: int | None
) -> CacheConfig | None:
    """The cache settings; the default limit counts what the cache holds as its own.

    That default is the cache's copies plus half the free space, at most 32 GiB unless
    the cache holds more already. Checks the argument only: the directory is neither
    created nor claimed here, only listed when it is a cache (the free space is that of
    its nearest existing folder, the filesystem it will be made on). A
    dataset on a local store never reads the cache, so its ``cache_dir`` stays untouched;
    the cache is claimed (created, marked) by ``SimDataset`` for a remote store and
    otherwise by the first reader that needs it (see ``ShardCache``).
    """
    if cache_dir is None:
        if limit is not None:
            raise InvalidInputError("cache_limit given without cache_dir")
        return None
    if not isinstance(cache_dir, str | os.PathLike):
        raise InvalidInputError(f"cache_dir must be a directory path, got {shown(cache_dir)}")
    directory = os.fspath(cache_dir)
    if not isinstance(directory, str) or not directory:
        raise InvalidInputError(f"cache_dir must be a directory path, got {shown(cache_dir)}")
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise InvalidInputError(f"cache_dir {directory!r} exists and is not a directory")
    if limit is None:
        try:
            free = shutil.disk_usage(_nearest_folder(directory)).free
            # what the cache holds is its own (a warm cache on a disk it filled left
            # little free, and a default of half that emptied it at the job's end)
            held = copies_bytes(directory) if os.path.isdir(directory) else 0
        except OSError as exc:
            raise StorageError(f"cache_dir {directory!r}: {exc.strerror or exc}") from exc
        limit = max(held, min(32 << 30, held + free // 2))
        if limit <= 0:  # "cache_limit must be positive" named an argument never given
            raise StorageError(
                f"cache_dir {directory!r}: its disk has no free space and the cache holds "
                f"no copies, so there is no room for a default cache_limit; free some "
                f"space, or give cache_dir on another disk"
            )
    # absolute: the cache is claimed at construction and filled later, perhaps after the
    # job changed its working directory (a relative path then named a second cache)
    return CacheConfig(directory=os.path.abspath(directory), limit_bytes=limit)


def _nearest_folder(path: str) -> str:
    """``path`` if it is a folder, else its nearest ancestor that is one."""
    path = os.path.abspath(path)
    while not os.path.isdir(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path
