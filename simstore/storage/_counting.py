"""``CountingStore``: an ObjectStore that counts the requests and bytes passing through it.

Cost accounting needs to know what a job asked of each tier: how many GETs, ranged GETs,
PUTs, LISTs, HEADs and DELETEs, and how many bytes they moved. ``CountingStore(inner)``
wraps any :class:`~simstore.storage.ObjectStore`, is one itself, and records every call
into a :class:`Traffic` meter under a tier name (``s3``, ``local``, ``cache``...).
Several stores may share one meter, so a loader records its hot and cold tiers together.

What is counted is one request per protocol call, as a client sees it:

======================  ==========  =========================================
call                    class       bytes
======================  ==========  =========================================
get (whole)             get         bytes returned
get (byte_range)        range_get   bytes returned
get_versioned           get         bytes returned
get_many (fast path)    per item    bytes returned
put, put_if_absent      put         bytes sent
put_file                put         size of the file
compare_and_swap        put         bytes sent (``delete`` when data is None)
exists, info            head        0
delete                  delete      0
list, list_info         list        0; one request per 1,000 keys started
======================  ==========  =========================================

A backend may make more requests than the call suggests (an S3 upload above the
multipart threshold sends one per part, ``put_file`` on S3 sends a HEAD first, a
put-if-absent of an existing S3 object adds a copy to refresh its time); those are not
seen here, so counts are a floor for writes and exact for reads. Failed calls are
counted too: a request that got an error was still made and billed (calls refused
before sending, on a read-only store or with a bad key, are not), and so is every
attempt a backend retried before the call's last (an S3 store tells each one, with the
bytes a body cut off mid-way delivered, to the listener of the calling thread that
``retries_to`` sets). Reads through
``local_path`` bypass the store and are not counted.

The meter is thread-safe. A pickled store carries a copy of its meter, so each process
(DataLoader worker) counts its own traffic; merge the workers' :meth:`Traffic.usage`
values in the parent.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from simstore.cost import OpClass, OpUsage, TierUsage
from simstore.errors import InvalidInputError, ReadOnlyError
from simstore.storage._base import (
    ObjectInfo,
    ObjectStore,
    get_by_size,
    get_versioned_by_size,
    never_sent,
    takes_max_bytes,
)

__all__ = [
    "CountingStore",
    "LIST_PAGE_KEYS",
    "Traffic",
    "tier_of_url",
    "usage_from_json",
]

# ListObjectsV2 and GCS objects.list return at most 1,000 keys per request.
LIST_PAGE_KEYS = 1000
T = TypeVar("T")
_DONE = object()
# raised before a request is sent: not counted
_LOCAL_ERRORS = (ReadOnlyError, InvalidInputError)

_SCHEME_TIERS = {
    "s3": "s3",
    "s3a": "s3",
    "gs": "gcs",
    "gcs": "gcs",
    "file": "local",
    "local": "local",
    "memory": "memory",
}


def tier_of_url(url: str) -> str:
    """The tier a store URL lives on: ``s3``, ``gcs``, ``local``, ``memory`` or its scheme."""
    scheme, sep, _ = url.partition("://")
    if not sep:
        return "local"
    return _SCHEME_TIERS.get(scheme.lower(), scheme.lower())


class Traffic:
    """A thread-safe meter of requests and bytes per tier and request class."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, OpClass], list[int]] = {}

    def __getstate__(self) -> dict[str, Any]:
        with self._lock:
            return {"counts": {k: list(v) for k, v in self._counts.items()}}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._lock = threading.Lock()
        self._counts = {k: list(v) for k, v in state["counts"].items()}

    def __repr__(self) -> str:
        return f"Traffic({self.to_json()!r})"

    def record(self, tier: str, op: OpClass, size_bytes: int = 0, requests: int = 1) -> None:
        """Add ``requests`` requests of class ``op`` moving ``size_bytes`` on ``tier``."""
        key = (tier, op)
        with self._lock:
            counts = self._counts.get(key)
            if counts is None:
                self._counts[key] = [requests, size_bytes]
            else:
                counts[0] += requests
                counts[1] += size_bytes

    def add(self, usage: Sequence[TierUsage]) -> None:
        """Add usage counted elsewhere (another process's :meth:`usage`)."""
        for tu in usage:
            for op, u in tu.ops.items():
                self.record(tu.tier, op, u.bytes, u.requests)

    def reset(self) -> None:
        """Forget every count (e.g. between epochs)."""
        with self._lock:
            self._counts.clear()

    def usage(self) -> tuple[TierUsage, ...]:
        """An immutable copy of the counts, one :class:`TierUsage` per tier, sorted."""
        with self._lock:
            items = sorted(self._counts.items(), key=lambda kv: (kv[0][0], kv[0][1].value))
        tiers: dict[str, dict[OpClass, OpUsage]] = {}
        for (tier, op), (requests, size) in items:
            tiers.setdefault(tier, {})[op] = OpUsage(requests=requests, bytes=size)
        return tuple(TierUsage(tier=t, ops=ops) for t, ops in tiers.items())

    def tier(self, name: str) -> TierUsage:
        """The usage of one tier (empty when it saw nothing)."""
        for tu in self.usage():
            if tu.tier == name:
                return tu
        return TierUsage(tier=name)

    def to_json(self) -> dict[str, dict[str, dict[str, int]]]:
        """``{tier: {op: {"requests": n, "bytes": b}}}``: the run report's ``tiers`` shape."""
        return {
            tu.tier: {op: {"requests": u["requests"], "bytes": u["bytes"]} for op, u in ops.items()}
            for tu in self.usage()
            for ops in (tu.to_json(),)
        }


class CountingStore:
    """An :class:`~simstore.storage.ObjectStore` that counts what passes to ``inner``.

    ``tier`` names the tier in the meter (default: from the URL, see :func:`tier_of_url`);
    ``traffic`` is the meter to record into (default: a new one, ``store.traffic``).
    Everything else is ``inner``'s: URL, read-only flag, CAS support, errors.
    """

    def __init__(
        self, inner: ObjectStore, *, tier: str | None = None, traffic: Traffic | None = None
    ) -> None:
        self.inner = inner
        self.url = inner.url
        self.read_only = inner.read_only
        self.tier = tier if tier is not None else tier_of_url(inner.url)
        self.traffic = traffic if traffic is not None else Traffic()

    def _retried(self, request: str, received: int) -> None:
        self._record(OpClass(request), received)

    def _counting_retries(self) -> contextlib.AbstractContextManager[None]:
        """Within it, ``inner``'s retried attempts in this thread count here (S3)."""
        retries_to = getattr(self.inner, "retries_to", None)
        return retries_to(self._retried) if callable(retries_to) else contextlib.nullcontext()

    def __repr__(self) -> str:
        return f"CountingStore({self.inner!r}, tier={self.tier!r})"

    @property
    def supports_atomic_cas(self) -> bool:
        """``inner``'s; setting it sets ``inner``'s (``Catalog.open`` may switch it off)."""
        return bool(self.inner.supports_atomic_cas)

    @supports_atomic_cas.setter
    def supports_atomic_cas(self, value: bool) -> None:
        self.inner.supports_atomic_cas = value

    def _record(self, op: OpClass, size_bytes: int = 0, requests: int = 1) -> None:
        self.traffic.record(self.tier, op, size_bytes, requests)

    def _call(
        self,
        op: OpClass,
        fn: Callable[[], T],
        *,
        sent_bytes: int = 0,
        read_bytes: Callable[[T], int] | None = None,
    ) -> T:
        """Run ``fn`` and count one request of ``op`` and its bytes.

        ``sent_bytes`` is what a write sends; ``read_bytes`` measures what a read got. A
        request that failed was still sent and billed, so it counts (with nothing read);
        errors raised before anything is sent (a read-only store, a bad key) do not.
        """
        try:
            with self._counting_retries():
                result = fn()
        except _LOCAL_ERRORS:
            raise
        except BaseException as exc:
            if not never_sent(exc):  # a refused connect reached no server
                self._record(op, sent_bytes)
            raise
        self._record(op, sent_bytes + (read_bytes(result) if read_bytes is not None else 0))
        return result

    # -- reads -------------------------------------------------------------------------
    def get(
        self, key: str, byte_range: tuple[int, int] | None = None, *,
        max_bytes: int | None = None,
    ) -> bytes:
        """Read through ``inner``; one GET (or ranged GET) of the bytes returned.

        A read refused for ``max_bytes`` counts as a GET of nothing (it was sent).
        """
        op = OpClass.GET if byte_range is None else OpClass.RANGE_GET
        if max_bytes is None or byte_range is not None:  # the bound is for whole reads
            return self._call(op, lambda: self.inner.get(key, byte_range), read_bytes=len)
        if not takes_max_bytes(self.inner.get):  # its size first: a HEAD, then the GET
            return get_by_size(self, key, max_bytes)
        return self._call(op, lambda: self.inner.get(key, max_bytes=max_bytes), read_bytes=len)

    def get_many(
        self,
        requests: Sequence[str | tuple[str, tuple[int, int] | None]],
        *,
        max_workers: int = 8,
    ) -> list[bytes]:
        """Read many keys or ``(key, byte_range)`` pairs, in order; each counts as one GET.

        Uses ``inner.get_many`` (S3's threaded fast path) when it has one, else reads one
        by one. When the fast path fails, every item is counted as sent.
        """
        items = [(r, None) if isinstance(r, str) else r for r in requests]
        fast = getattr(self.inner, "get_many", None)
        if not callable(fast):
            return [self.get(key, byte_range) for key, byte_range in items]
        try:
            with self._counting_retries():
                out: list[bytes] = list(fast(items, max_workers=max_workers))
        except _LOCAL_ERRORS:
            raise
        except BaseException:
            for _key, byte_range in items:
                self._record(OpClass.GET if byte_range is None else OpClass.RANGE_GET)
            raise
        for (_key, byte_range), data in zip(items, out, strict=True):
            self._record(OpClass.GET if byte_range is None else OpClass.RANGE_GET, len(data))
        return out

    def get_versioned(self, key: str, *, max_bytes: int | None = None) -> tuple[bytes, str]:
        """Read a ref and its version token; one GET."""
        if max_bytes is None:
            return self._call(
                OpClass.GET, lambda: self.inner.get_versioned(key), read_bytes=lambda r: len(r[0])
            )
        if not takes_max_bytes(self.inner.get_versioned):
            return get_versioned_by_size(self, key, max_bytes)
        return self._call(OpClass.GET, lambda: self.inner.get_versioned(key, max_bytes=max_bytes),
                          read_bytes=lambda r: len(r[0]))

    def exists(self, key: str) -> bool:
        """Whether the key exists; one HEAD."""
        return self._call(OpClass.HEAD, lambda: self.inner.exists(key))

    def refresh(self, key: str) -> bool:
        """Refresh the modification time; False when absent (one copy request on S3)."""
        refresh = getattr(self.inner, "refresh", None)
        if not callable(refresh):
            return self.exists(key)
        return bool(self._call(OpClass.PUT, lambda: refresh(key)))

    def info(self, key: str) -> ObjectInfo:
        """Size and modification time; one HEAD."""
        return self._call(OpClass.HEAD, lambda: self.inner.info(key))

    def list(self, prefix: str = "") -> Iterator[str]:
        """Keys under ``prefix``; one LIST per 1,000 keys started (at least one)."""
        yield from self._listing(self.inner.list(prefix))

    def list_info(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Infos under ``prefix``; one LIST per 1,000 keys started (at least one)."""
        yield from self._listing(self.inner.list_info(prefix))

    def _listing(self, items: Iterator[Any]) -> Iterator[Any]:
        self._record(OpClass.LIST)
        n = 0
        while True:
            with self._counting_retries():  # a page's request is made by this next()
                item = next(items, _DONE)
            if item is _DONE:
                return
            if n and n % LIST_PAGE_KEYS == 0:
                self._record(OpClass.LIST)
            n += 1
            yield item

    def local_path(self, key: str) -> str | None:
        """``inner``'s local path (reads through it are not counted)."""
        return self.inner.local_path(key)

    # -- writes ------------------------------------------------------------------------
    def put(self, key: str, data: bytes) -> None:
        """Write through ``inner``; one PUT of ``len(data)`` bytes."""
        self._call(OpClass.PUT, lambda: self.inner.put(key, data), sent_bytes=len(data))

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Conditional write; one PUT of ``len(data)`` bytes."""
        return self._call(
            OpClass.PUT, lambda: self.inner.put_if_absent(key, data), sent_bytes=len(data)
        )

    def put_file(self, key: str, path: str) -> bool:
        """Upload a local file unless present; one PUT of the file's size."""
        try:
            size = os.path.getsize(path)
        except OSError:
            size = 0  # inner raises the error that names the file
        return self._call(OpClass.PUT, lambda: self.inner.put_file(key, path), sent_bytes=size)

    def compare_and_swap(self, key: str, expected: str | None, data: bytes | None) -> str | None:
        """Conditional ref update; one PUT (one DELETE when ``data`` is None)."""
        op = OpClass.DELETE if data is None else OpClass.PUT
        size = 0 if data is None else len(data)
        return self._call(
            op, lambda: self.inner.compare_and_swap(key, expected, data), sent_bytes=size
        )

    def delete(self, key: str) -> None:
        """Delete; one DELETE."""
        self._call(OpClass.DELETE, lambda: self.inner.delete(key))

    # -- optional members of backends ----------------------------------------------------
    def probe_conditional_writes(self) -> bool:
        """``inner``'s probe when it has one (not counted), else its ``supports_atomic_cas``."""
        probe = getattr(self.inner, "probe_conditional_writes", None)
        if callable(probe):
            return bool(probe())
        return bool(self.inner.supports_atomic_cas)

    def clock(self) -> float:
        """``inner``'s clock (its probe requests on S3 are not counted, like the write probe)."""
        return self.inner.clock()

    def read_clock(self) -> float:
        """``inner``'s clock read with no write (a LIST on S3, counted), else :meth:`clock`."""
        read = getattr(self.inner, "read_clock", None)
        if not callable(read):
            return self.clock()
        return float(self._call(OpClass.LIST, read))

    def close(self) -> None:
        """Close ``inner`` when it has a ``close``."""
        close = getattr(self.inner, "close", None)
        if callable(close):
            close()


def usage_from_json(obj: Mapping[str, Any]) -> tuple[TierUsage, ...]:
    """Parse :meth:`Traffic.to_json`'s shape back into usage values."""
    return tuple(TierUsage.from_json(str(tier), body) for tier, body in obj.items())
