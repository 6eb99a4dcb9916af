"""Storage backends behind one small ``ObjectStore`` protocol, and ``open_store``."""

from __future__ import annotations

import os
import re
import urllib.parse
from collections.abc import Mapping
from typing import Any

from simstore.errors import InvalidInputError
from simstore.storage._base import ObjectInfo, ObjectStore, SupportsMoveFile, check_key
from simstore.storage._counting import CountingStore, Traffic, tier_of_url
from simstore.storage._fsspec import FsspecStore, refuse_query_or_fragment, without_passwords
from simstore.storage._local import LocalStore
from simstore.storage._scratch import Scratch, scratch_in_use, sweep_scratch

__all__ = [
    "CountingStore",
    "FsspecStore",
    "LocalStore",
    "ObjectInfo",
    "ObjectStore",
    "Scratch",
    "SupportsMoveFile",
    "Traffic",
    "check_key",
    "is_store",
    "local_path",
    "open_store",
    "scratch_in_use",
    "sweep_scratch",
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
    fsspec URL; an ``ObjectStore`` passed in is returned as it is. ``storage_options`` go
    to the S3 or fsspec backend; a local or ``memory://`` store takes none, and options
    given to one, or with a store already open, are an error rather than ignored.
    """
    if storage_options is not None and not isinstance(storage_options, Mapping):
        raise InvalidInputError(
            f"invalid storage_options {storage_options!r}: must map option names to values"
        )
    if not isinstance(read_only, bool):
        raise InvalidInputError(f"invalid read_only {read_only!r}: must be True or False")
    if not isinstance(url, str | os.PathLike):
        if not is_store(url):
            raise InvalidInputError(
                f"invalid store {url!r}: a path, a URL (s3://bucket/prefix) or an open store"
            )
        if storage_options:
            raise InvalidInputError(
                f"{getattr(url, 'url', url)}: storage options {_names(storage_options)} apply "
                "when a store is opened from its URL, not to a store already open"
            )
        return url
    text = os.fspath(url)
    if not isinstance(text, str):
        raise InvalidInputError(f"invalid store {url!r}: a path or URL as text, not bytes")
    if not text:
        raise InvalidInputError("empty store URL")
    path = local_path(text)
    if path is not None:
        _takes_no_options(text, "local", storage_options)
        return LocalStore(path, read_only=read_only)
    scheme, rest = text.split("://", 1)
    protocol = scheme.lower()  # URL schemes are case-insensitive: S3:// is s3://
    text = f"{protocol}://{rest}"
    if protocol == "memory":
        _takes_no_options(text, "memory://", storage_options)
        if not rest.strip("/"):
            # fsspec's memory filesystem is one per process: a store needs its own folder
            raise InvalidInputError(
                f"{text}: a memory:// store needs a name, e.g. memory://scratch")
    if protocol in ("s3", "s3a"):
        from simstore.storage._s3 import S3Store

        return S3Store(text, storage_options=storage_options, read_only=read_only)
    _check_fsspec_protocol(text, protocol)
    # a store's folder behind a web server is read, never written: HTTP has no listing
    # of its own, no conditional write, and a PUT is whatever that server makes of it
    return FsspecStore(text, storage_options=storage_options,
                       read_only=read_only or protocol in ("http", "https"))


_SCHEME_TYPO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
"""A path starting ``scheme:`` (``s3:/bucket/p``, ``s3:bucket``): a URL mistyped."""
_URL_SCHEMES = frozenset({
    "s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "http", "https", "file",
    "memory", "local", "hdfs", "webhdfs", "ftp", "sftp", "ssh", "oci", "r2",
})


def is_store(value: object) -> bool:
    """Whether ``value`` works as an open store: it reads, writes and lists objects.

    By what it does, not its class: a wrapper that passes calls on to a store (counting
    them, say) is one too. ``None``, a number or bytes given where a store belongs is not.
    """
    if value is None or isinstance(value, str | bytes | bytearray | int | float | os.PathLike):
        return False
    return all(callable(getattr(value, name, None)) for name in ("get", "put", "list_info"))


def local_path(url: str) -> str | None:
    """The folder a local store URL names, or None for a URL of another scheme.

    A plain path is taken as it is. A ``file://`` URL is read as RFC 8089 says: percent
    escapes are decoded (``file:///data/my%20store`` is ``/data/my store``) and a
    ``localhost`` authority is this machine (``file://localhost/data`` is ``/data``). Any
    other authority is refused with an :class:`InvalidInputError`: ``file://data/store``
    names the host ``data``, not the relative path ``data/store``, and a remote host's
    files are not this machine's. ``local://PATH`` (simstore's own) is the path as it is.
    Schemes are case-insensitive.
    """
    if "://" not in url:
        typo = _SCHEME_TYPO.match(url)
        if typo and typo.group(1).lower() in _URL_SCHEMES:
            raise InvalidInputError(
                f"{without_passwords(url)}: looks like a mistyped URL (write "
                f"{typo.group(1)}://...); for a local folder of that name, write "
                f"./{url}"
            )
        return url
    scheme, rest = url.split("://", 1)
    protocol = scheme.lower()
    if protocol == "local":
        return rest
    if protocol != "file":
        return None
    # as for every other store URL (a folder whose name holds one is written %3F or %23,
    # which RFC 8089 decodes)
    refuse_query_or_fragment(url, rest, "; write a folder name holding one as %3F or %23")
    host, slash, path = rest.partition("/")
    if host and host.lower() != "localhost":
        raise InvalidInputError(
            f"{url}: a file URL's host must be empty or localhost, got {host!r}; "
            "write file:///absolute/path, or a relative path as a plain path"
        )
    return urllib.parse.unquote(slash + path)


def _check_fsspec_protocol(url: str, protocol: str) -> None:
    """Refuse a scheme fsspec does not know, or whose package is not installed, by name."""
    import fsspec

    try:
        fsspec.get_filesystem_class(protocol)
    except ValueError:
        raise InvalidInputError(
            f"{without_passwords(url)}: unknown storage scheme {protocol + '://'!r}; give a "
            "local path, file://, memory://, s3://bucket/prefix or another fsspec URL"
        ) from None
    except ImportError as exc:
        raise InvalidInputError(
            f"{without_passwords(url)}: the {protocol + '://'!r} scheme needs a package "
            f"that is not installed: {exc}"
        ) from None


def _names(options: Mapping[str, Any]) -> str:
    return ", ".join(repr(k) for k in sorted(options, key=str))


def _takes_no_options(url: str, kind: str, options: Mapping[str, Any] | None) -> None:
    """Refuse storage options for a store that has none (they were once silently dropped)."""
    if options:
        plural = "s" if len(options) > 1 else ""
        raise InvalidInputError(
            f"{url}: a {kind} store takes no storage options; got storage option{plural} "
            f"{_names(options)}"
        )
