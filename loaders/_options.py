"""The reading options of a dataset, and parsing of the byte sizes users give."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field

from simstore.loaders._cache import CacheConfig
from simstore.loaders._pipeline import PrefetchConfig, ShardOpener
from simstore.loaders._plan import Remainder

from simstore.errors import InvalidInputError

__all__ = ["LoaderOptions", "cache_config", "parse_bytes"]


@dataclass(frozen=True, slots=True, kw_only=True)
class LoaderOptions:
    """How a dataset reads (shared by the sources of a mixture)."""

    remainder: Remainder = "pad"
    on_corrupt: str = "raise"
    cache: CacheConfig | None = None
    prefetch: PrefetchConfig = field(default_factory=PrefetchConfig)
    verify: bool = True
    max_bandwidth: float | None = None
    zero_copy: bool = True
    shard_opener: ShardOpener | None = None
    log_every_s: float | None = None


def parse_bytes(value: int | str | None, what: str) -> int | None:
    """Bytes from an int or a string such as ``"512MiB"`` or ``"20GB"``."""
    if value is None or isinstance(value, int):
        return value
    text = value.strip().replace(" ", "")
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
             "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "B": 1}
    for unit, scale in units.items():
        if text.endswith(unit):
            try:
                return int(float(text[: -len(unit)]) * scale)
            except ValueError:
                break
    raise InvalidInputError(f"invalid {what} {value!r}: give bytes or e.g. '512MiB', '20GB'")


def cache_config(
    cache_dir: str | os.PathLike[str] | None, limit: int | None
) -> CacheConfig | None:
    """The cache settings (default limit: 32 GiB or half the free space, the smaller)."""
    if cache_dir is None:
        if limit is not None:
            raise InvalidInputError("cache_limit given without cache_dir")
        return None
    directory = os.fspath(cache_dir)
    if limit is None:
        os.makedirs(directory, exist_ok=True)
        limit = min(32 << 30, shutil.disk_usage(directory).free // 2)
    return CacheConfig(directory=directory, limit_bytes=limit)
