"""The ObjectStore protocol: the one small interface every storage backend implements."""

from __future__ import annotations

import contextlib
import inspect
import re
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from simstore.errors import FormatError, InvalidInputError

__all__ = ["ObjectInfo", "ObjectStore", "SupportsMoveFile", "check_key", "get_at_most",
           "get_by_size", "get_versioned_at_most", "get_versioned_by_size", "larger_than",
           "takes_max_bytes"]

_BAD_KEY = re.compile(r"[\x00-\x1f\x7f\\]")


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What a listing knows of an object: key, size and last-modified time (epoch seconds)."""

    key: str
    size_bytes: int
    mtime: float


def check_key(key: str) -> str:
    """Return ``key`` if it is a safe relative key, else raise :class:`InvalidInputError`.

    Keys are ``/``-separated, relative, with no empty, ``.`` or ``..`` segment and no
    control character or backslash: nothing can address a path outside the store's root.
    """
    if not key or key.startswith("/") or _BAD_KEY.search(key):
        raise InvalidInputError(f"invalid store key {key!r}")
    for seg in key.split("/"):
        if seg in ("", ".", ".."):
            raise InvalidInputError(f"invalid store key {key!r}: bad path segment {seg!r}")
    return key


def larger_than(url: str, key: str, max_bytes: int, size_bytes: int | None = None) -> FormatError:
    """The error of a read with ``max_bytes`` that found a larger object (see ``get``).

    ``size_bytes``: the object's size where the read was told it; None when it read
    ``max_bytes + 1`` bytes to find out.
    """
    size = f"{size_bytes} bytes, " if size_bytes is not None else ""
    return FormatError(f"{url}/{key} is {size}more than the {max_bytes} bytes this read takes")


def takes_max_bytes(method: Any) -> bool:
    """Whether a store's ``get``/``get_versioned`` names ``max_bytes`` among its parameters.

    A method taking ``**kwargs`` alone does not count: it may pass them on to a store
    that lacks the keyword (a wrapper of an older store).
    """
    func = getattr(method, "__func__", method)
    try:
        known = _TAKES_MAX_BYTES.get(func)
    except TypeError:  # a callable that cannot be a weak key
        known = None
    if known is None:
        try:
            params = inspect.signature(method).parameters
        except (TypeError, ValueError):
            params = {}  # type: ignore[assignment]
        known = "max_bytes" in params
        with contextlib.suppress(TypeError):
            _TAKES_MAX_BYTES[func] = known
    return known


_TAKES_MAX_BYTES: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def get_at_most(store: ObjectStore, key: str, max_bytes: int) -> bytes:
    """``store.get(key, max_bytes=max_bytes)``, also from a store written before the keyword.

    Such a store (see :func:`takes_max_bytes`) is read by :func:`get_by_size`.
    """
    if takes_max_bytes(store.get):
        return store.get(key, max_bytes=max_bytes)
    return get_by_size(store, key, max_bytes)


def get_versioned_at_most(store: ObjectStore, key: str, max_bytes: int) -> tuple[bytes, str]:
    """``store.get_versioned`` with ``max_bytes``, as :func:`get_at_most` reads."""
    if takes_max_bytes(store.get_versioned):
        return store.get_versioned(key, max_bytes=max_bytes)
    return get_versioned_by_size(store, key, max_bytes)


def get_by_size(store: ObjectStore, key: str, max_bytes: int) -> bytes:
    """``get`` with ``max_bytes`` from the object's size (``info``: a request more) first."""
    _check_size(store, key, max_bytes)
    data = store.get(key)
    if len(data) > max_bytes:  # grown since
        raise larger_than(store.url, key, max_bytes, len(data))
    return data


def get_versioned_by_size(store: ObjectStore, key: str, max_bytes: int) -> tuple[bytes, str]:
    """``get_versioned`` as :func:`get_by_size` reads."""
    _check_size(store, key, max_bytes)
    data, version = store.get_versioned(key)
    if len(data) > max_bytes:
        raise larger_than(store.url, key, max_bytes, len(data))
    return data, version


def _check_size(store: ObjectStore, key: str, max_bytes: int) -> None:
    size = store.info(key).size_bytes
    if size > max_bytes:
        raise larger_than(store.url, key, max_bytes, size)


@runtime_checkable
class ObjectStore(Protocol):
    """A flat key/value store of immutable objects and small mutable refs.

    Implementers must keep these contracts:

    - ``get`` returns the whole object or the half-open ``byte_range`` ``(start, end)``;
      a missing key raises ``NotFoundError`` naming the store and key. With
      ``max_bytes`` (whole reads, and ``get_versioned``), an object larger than that is
      refused with ``FormatError`` naming the store, key and size, without being read
      into memory: by the size the read itself reports (a file's, a response's
      Content-Length), so it costs no request more, or else by reading at most
      ``max_bytes + 1`` bytes. The catalog reads its small objects so (a ref planted as
      a huge file is damage, not something to read whole), through :func:`get_at_most`,
      which also serves a store whose methods lack the keyword (by ``info`` first).
    - ``put`` writes atomically: a reader sees the old object, the new one or none, never
      a partial one. ``put_if_absent``/``put_file`` return whether they wrote; when the
      object already exists they refresh its modification time, so garbage collection's
      grace period protects an object a writer has just reused. Stores may also offer
      ``refresh(key) -> bool`` (refresh the time of an object a writer reuses without
      writing it; False when absent): ingest uses it for shards a journal record names,
      and falls back to ``exists`` where it is missing.
    - ``get_versioned``/``compare_and_swap`` implement atomic ref updates: the swap
      succeeds only when the current version token equals ``expected`` (``None``: the key
      must not exist) and otherwise raises ``ConflictError``. ``data=None`` deletes.
    - ``list``/``list_info`` iterate keys under a prefix with no hidden cache.
    - ``clock`` is the store's "now", on the clock its modification times come from, so
      ``gc`` compares times of one clock: this machine's for a local store, the server's
      for a remote one (whose clock may differ from this machine's). It must never be
      later than that clock (a later "now" lets gc delete what a writer has just
      stored); earlier only keeps garbage longer. When it cannot be read it raises
      (``StorageError``, ``ReadOnlyError``), never guesses from the local clock.
    - Backend exceptions are wrapped in ``StorageError`` (original chained).
    - Instances pickle (DataLoader workers, process pools) and open handles lazily.
    """

    url: str
    read_only: bool
    supports_atomic_cas: bool

    def get(
        self, key: str, byte_range: tuple[int, int] | None = None, *,
        max_bytes: int | None = None,
    ) -> bytes:
        """Read an object, or a half-open byte range of it; at most ``max_bytes`` whole."""
        ...

    def get_versioned(self, key: str, *, max_bytes: int | None = None) -> tuple[bytes, str]:
        """Read a small mutable object and the version token to pass to ``compare_and_swap``."""
        ...

    def put(self, key: str, data: bytes) -> None:
        """Write (or overwrite) an object atomically."""
        ...

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Write unless the key exists; returns whether it wrote."""
        ...

    def put_file(self, key: str, path: str) -> bool:
        """Upload a local file unless the key exists; returns whether it wrote."""
        ...

    def compare_and_swap(self, key: str, expected: str | None, data: bytes | None) -> str | None:
        """Atomically replace the object whose version is ``expected``; returns the new one."""
        ...

    def exists(self, key: str) -> bool:
        """Whether the key exists."""
        ...

    def info(self, key: str) -> ObjectInfo:
        """Size and modification time of one object."""
        ...

    def delete(self, key: str) -> None:
        """Delete an object; a missing key is not an error."""
        ...

    def list(self, prefix: str = "") -> Iterator[str]:
        """Iterate keys starting with ``prefix``."""
        ...

    def list_info(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Iterate :class:`ObjectInfo` of keys starting with ``prefix``."""
        ...

    def local_path(self, key: str) -> str | None:
        """A local filesystem path holding the object, for zero-copy reads; else None."""
        ...

    def clock(self) -> float:
        """The store's current time in epoch seconds, on the clock of its ``mtime``s.

        May cost requests (S3 writes, reads and deletes a probe object); see above.
        """
        ...


@runtime_checkable
class SupportsMoveFile(Protocol):
    """Optional fast path: take ownership of a local file instead of copying it.

    A writer that builds an object in ``scratch_dir()`` (same filesystem as the store)
    hands it over with ``move_file``, which links it into place when the key is absent
    (atomic, no copy) and removes the caller's file either way.
    """

    def scratch_dir(self) -> str:
        """A directory on the store's filesystem for objects under construction."""
        ...

    def move_file(self, key: str, path: str) -> bool:
        """Move a local file in unless the key exists; returns whether it wrote."""
        ...


_NOT_SENT = frozenset({
    ("botocore.exceptions", "EndpointConnectionError"),
    ("botocore.exceptions", "ConnectTimeoutError"),
    ("urllib3.exceptions", "ConnectTimeoutError"),  # and NewConnectionError, beneath it
    ("builtins", "ConnectionRefusedError"),
})
"""Failures before a request left (by class, so that no client library is imported)."""


def never_sent(exc: BaseException | None) -> bool:
    """Whether the failed request ``exc`` (or what it was raised from) never left.

    A refused or timed-out connect reached no server, and no store bills it as a request.
    """
    seen = 0
    while exc is not None and seen < 8:
        if any((k.__module__, k.__name__) in _NOT_SENT for k in type(exc).__mro__):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False
