"""Storage backends behind one small ``ObjectStore`` protocol, and ``open_store``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from simstore.errors import InvalidInputError
from simstore.storage._base import ObjectInfo, ObjectStore, SupportsMoveFile, check_key
from simstore.storage._counting import CountingStore, Traffic, tier_of_url
from simstore.storage._fsspec import FsspecStore
from simstore.storage._local import LocalStore

__all__ = [
    "CountingStore",
    "FsspecStore",
    "LocalStore",
    "ObjectInfo",
    "ObjectStore",
    "SupportsMoveFile",
    "Traffic",
    "check_key",
    "open_store",
    "tier_of_url",
]


def open_store(
    url: str | os.PathLike[str] | ObjectStore,
    *,
    storage_options: Mapping[str, Any] | None = None,
    read_only: bool = False,
) -> ObjectStore:
    """Open the store at ``url``.

    ``url`` is a local path, ``file://``, ``memory://``, ``s3://bucket/prefix`` or any
    fsspec URL; an ``ObjectStore`` passed in is returned as it is.
    """
    if not isinstance(url, str | os.PathLike):
        return url
    text = os.fspath(url)
    if not text:
        raise InvalidInputError("empty store URL")
    if "://" not in text:
        return LocalStore(text, read_only=read_only)
    protocol = text.split("://", 1)[0]
    if protocol in ("file", "local"):
        return LocalStore(text.split("://", 1)[1], read_only=read_only)
    if protocol in ("s3", "s3a"):
        from simstore.storage._s3 import S3Store

        return S3Store(text, storage_options=storage_options, read_only=read_only)
    return FsspecStore(text, storage_options=storage_options, read_only=read_only)
