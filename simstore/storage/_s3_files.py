"""File objects of the S3 store: an upload's part read from disk, a download streamed.

- :class:`FileSlice`: ``length`` bytes of a local file, the body of one part of a
  multipart upload, read in blocks as botocore sends it.
- :class:`S3ObjectReader`: a whole object read by one streamed GET
  (:meth:`~simstore.storage._s3.S3Store.open_read`), resumed by a ranged GET when the body
  breaks off.

Also the transport failures every request of the store retries, which answers of the
server are worth retrying, what a body cut off mid-way delivered, and whether a ranged
reply is the range asked (:func:`checked_range`).
"""

from __future__ import annotations

import contextlib
import http.client
import io
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from botocore.exceptions import (
    BotoCoreError,
    HTTPClientError,
    IncompleteReadError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError
from botocore.exceptions import ReadTimeoutError as BotoReadTimeoutError
from urllib3.exceptions import ProtocolError, ReadTimeoutError

from simstore.errors import SimstoreError, StorageError
from simstore.hashing import is_object_key
from simstore.storage._base import never_sent
from simstore.storage._s3_watchdog import cut_at, cut_body, guard_release

if TYPE_CHECKING:
    from simstore.storage._s3 import S3Store

__all__ = [
    "TRANSPORT_ERRORS",
    "FileSlice",
    "S3ObjectReader",
    "TruncatedBody",
    "checked_range",
    "is_transient",
    "named_timeout",
    "received_before",
    "request_url",
]

_MiB = 1024 * 1024


class TruncatedBody(Exception):
    """A response body that is not what was asked: retried, as a cut connection is.

    Shorter than its Content-Length (a connection cut mid-body), another byte range than
    the one asked, or failing its checksum (damaged on the way). ``received_bytes``: what
    arrived of it all the same (sent, and billed as egress).
    """

    def __init__(self, message: str, received_bytes: int = 0) -> None:
        super().__init__(message)
        self.received_bytes = received_bytes


# Transport failures: botocore wraps most; urllib3's and the OS's may surface while a body
# is read. None of them is an answer of the server, so all are retried.
TRANSPORT_ERRORS = (
    HTTPClientError,
    BotoConnectionError,
    IncompleteReadError,
    ProtocolError,
    ReadTimeoutError,
    ConnectionError,
    TimeoutError,
    TruncatedBody,
)


class FileSlice(io.RawIOBase):
    """``length`` bytes of a local file from ``offset``: one part's body, read in blocks.

    botocore reads it as it sends, and seeks back to the start to retry or to checksum,
    so a part never sits whole in memory.
    """

    def __init__(self, path: str, offset: int, length: int) -> None:
        super().__init__()
        self._file = open(path, "rb")  # noqa: SIM115 - closed in close()
        self._offset, self._length, self._pos = offset, length, 0

    def __len__(self) -> int:
        return self._length

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._length}[whence]
        self._pos = min(max(0, base + pos), self._length)
        return self._pos

    def read(self, size: int | None = -1) -> bytes:
        left = self._length - self._pos
        n = left if size is None or size < 0 else min(size, left)
        if n <= 0:
            return b""
        self._file.seek(self._offset + self._pos)
        data = self._file.read(n)
        self._pos += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._file.close()
        super().close()


class S3ObjectReader(io.RawIOBase):
    """A read-only, sequential file over one object, read by one streamed GET.

    Made by :meth:`S3Store.open_read`. ``read(n)`` returns the body's bytes as they come
    (no copy into a caller's buffer); ``size_bytes`` is the object's size, ``requests``
    the GETs sent so far (1, plus one per resumption). When reading the body fails on
    the way (a reset, a timeout, a body cut short), the next GET asks for the rest
    (``Range: bytes=<done>-``, ``If-Match: <etag>``) after the store's backoff. Once a
    body has broken off, the reader takes what each receive brings, so every byte that
    arrived before the next break is kept and the read goes on from there.

    An object named by its hash (``objects/<2 hex>/<id>``) is resumed without
    ``If-Match``: its bytes never change, but its ETag does when it is copied onto
    itself (a writer's refresh of an object it reuses, gc's grace) after a multipart
    upload, and that 412 failed a reader whose object had not changed. Its readers hash
    what they stream (the loader's fills, ``verify``), so a damaged copy is still found.

    Each ``read`` call is one run of attempts, bounded as the store's requests are:
    failures that make no progress count against ``max_attempts``, and no retry starts
    once it would end past ``retry_deadline_s`` from the call's start (progress does not
    restart that clock). Then ``StorageError`` names the object and where it stopped.
    """

    def __init__(self, store: S3Store, key: str) -> None:
        super().__init__()
        self._store = store
        self.key = key
        self._obj = store._object_key(key)
        self._pos = 0
        self._body: Any = None
        self._etag = ""
        self._immutable = is_object_key(key)
        self._url = ""
        self._careful = False
        self.requests = 0
        self.size_bytes = 0
        self._request(None)

    def _request(self, since: float | None) -> None:
        kwargs: dict[str, Any] = {"Bucket": self._store.bucket, "Key": self._obj}
        if self._pos:
            kwargs["Range"] = f"bytes={self._pos}-"
            if self._etag and not self._immutable:
                kwargs["IfMatch"] = self._etag
        try:
            response = self._store._get_object(self.key, kwargs, since=since)
        except SimstoreError as exc:
            # the last attempt was sent (and billed) too, unless it never connected; the
            # ones before it were told to the store's listener as retries
            if not never_sent(exc):
                self.requests += 1
            raise
        self.requests += 1
        length = int(response.get("ContentLength") or 0)
        if not self._pos:
            self.size_bytes = length
            self._etag = str(response.get("ETag", ""))
        elif length != self.size_bytes - self._pos or not response.get("ContentRange"):
            response["Body"].close()
            raise StorageError(
                f"{self._store.url}/{self.key}: read failed: resuming at byte {self._pos} "
                f"of {self.size_bytes}, the server sent {length} bytes"
            )
        self._body = guard_release(response["Body"])
        self._url = self._url or request_url(self._body)

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def _read_some(self, n: int) -> bytes:
        """Up to ``n`` bytes of the body: all ``n`` at once, or once careful what arrives.

        A whole block read at once (in C, checked by botocore) is lost when the link
        resets before it is complete. Once a body has broken off, the reader takes what
        each receive brings (urllib3's ``read1``), so every byte that arrived before the
        next break is kept. Those bodies skip botocore's whole-object checksum (ranged
        resumptions carry none anyway); what the reader streams is named by its hash, which
        its users check (the loader's cache fill, ``verify``).
        """
        if self._careful:
            read1 = getattr(getattr(self._body, "_raw_stream", None), "read1", None)
            if read1 is not None:
                return bytes(read1(n))
        return bytes(self._body.read(n))

    def _receiver(self) -> http.client.HTTPResponse | None:
        """The body's HTTP response, to receive into a caller's buffer; None for the long way.

        urllib3's ``readinto`` reads a new ``bytes`` and copies it (after http.client made
        one and copied it once more); the response beneath it receives straight from the
        socket into the buffer. Taken for a plain body (a length, no chunking, no content
        encoding) that has not broken off before. botocore's checks are then not on the
        way: its length check is the loop's in :meth:`_attempts` (it stops at
        ``size_bytes`` and takes an early end for a cut body), and like a careful read
        (:meth:`_read_some`) it skips a whole-object checksum: the loader's fills check
        what they receive against the object's hash. 6 x 64 MiB from moto on loopback
        into files, 4 threads: 1,300-1,400 MiB/s and 0.21-0.24 s of CPU against
        780-1,140 MiB/s and 0.35-0.58 s through ``read``.
        """
        if self._careful:
            return None
        raw = getattr(self._body, "_raw_stream", None)
        fp = getattr(raw, "_fp", None)
        if (
            not isinstance(fp, http.client.HTTPResponse)
            or fp.chunked
            or fp.length is None
            or getattr(raw, "headers", {}).get("content-encoding")
        ):
            return None
        return fp

    def _finish_body(self) -> None:
        """The whole body has arrived: its connection goes back to the pool for reuse."""
        raw = getattr(self._body, "_raw_stream", None)
        fp = getattr(raw, "_fp", None)
        if isinstance(fp, http.client.HTTPResponse) and fp.isclosed():
            release = getattr(raw, "release_conn", None)
            if release is not None:
                release()

    def read(self, size: int | None = -1) -> bytes:
        """The next ``size`` bytes at most (all the rest when ``size`` is negative)."""
        if size is None or size < 0:
            return b"".join(iter(lambda: self.read(_MiB), b""))
        want = min(size, self.size_bytes - self._pos)
        if want <= 0:
            return b""
        got: list[bytes] = []

        def receive(n: int) -> int:
            got.append(self._read_some(n))
            return len(got[-1])

        self._attempts(want, receive)
        return got[0] if len(got) == 1 else b"".join(got)

    def readinto(self, buffer: Any) -> int:
        """Fill ``buffer`` with the next bytes (fewer only at the end); how many.

        Where the body allows it, the bytes are received straight into ``buffer``
        (:meth:`_receiver`): no ``bytes`` made or copied on the way.
        """
        view = memoryview(buffer).cast("B")
        want = min(len(view), self.size_bytes - self._pos)
        if want <= 0:
            return 0
        origin = self._pos

        def receive(n: int) -> int:
            at = self._pos - origin  # what this call has received so far
            fp = self._receiver()
            if fp is not None:
                got = fp.readinto(view[at : at + n])
                if got and self._pos + got == self.size_bytes:
                    self._finish_body()
            else:
                data = self._read_some(n)
                got = len(data)
                view[at : at + got] = data
            return got

        self._attempts(want, receive)
        return want

    def _attempts(self, want: int, receive: Callable[[int], int]) -> None:
        """Receive ``want`` bytes by ``receive(n) -> bytes received``, as one run of attempts.

        A failure on the way drops the body and, after the store's backoff, asks for the
        rest by a ranged GET; bounded as the store's requests are. When it gives up,
        nothing of this call counts: the next call starts where this one did.
        """
        store = self._store
        start, origin = store._clock(), self._pos
        done = failures = tries = 0
        mark = self._pos  # where the last failure left off
        # a body trickling in past its bound is cut off, whichever GET it came from
        with cut_at(store.body_bound(start, want), lambda: cut_body(self._body)):
            try:
                while done < want:
                    try:
                        if self._body is None:
                            self._request(start)
                        got = receive(want - done)
                        if not got:
                            raise TruncatedBody(
                                f"body ended at byte {self._pos} of {self.size_bytes}"
                            )
                        self._pos += got
                        done += got
                    except TRANSPORT_ERRORS as exc:
                        self._drop_body()
                        self._careful = True  # a link that broke once may break again
                        failures = failures + 1 if self._pos == mark else 1
                        mark = self._pos
                        tries += 1
                        store._wait_to_retry(
                            "read", self.key, failures, start,
                            named_timeout(exc, self._url or f"{store.url}/{self.key}"),
                            f" at byte {self._pos} of {self.size_bytes}", tries=tries,
                        )
                    except (BotoCoreError, OSError) as exc:
                        raise store._error("read", self.key, exc) from exc
            except BaseException:
                # nothing of this call reaches the caller: the next read starts where it did
                self._drop_body()
                self._pos = origin
                raise

    def _drop_body(self) -> None:
        body, self._body = self._body, None
        if body is not None:
            with contextlib.suppress(Exception):
                body.close()

    def close(self) -> None:
        self._drop_body()
        super().close()


def named_timeout(exc: Exception, url: str) -> Exception:
    """``exc``, naming ``url`` where botocore leaves the URL out.

    botocore raises a timeout while a body is read without the URL (its message ends
    ``endpoint URL: "None"``), and urllib3 names only the host; the caller knows which
    object it was reading. The new error keeps ``exc`` as its cause.
    """
    if isinstance(exc, BotoReadTimeoutError) and exc.kwargs.get("endpoint_url") is None:
        named: Exception = BotoReadTimeoutError(endpoint_url=url, error=exc.kwargs.get("error"))
    elif isinstance(exc, ReadTimeoutError) and not exc.url:  # urllib3's, from read1
        named = BotoReadTimeoutError(endpoint_url=url, error=exc)
    else:
        return exc
    named.__cause__ = exc
    return named


def request_url(body: Any) -> str:
    """The URL a streamed body was requested from (scheme, host, path), or ``""``."""
    raw = getattr(body, "_raw_stream", None)
    path = str(getattr(raw, "url", None) or "")
    if not path or "://" in path:
        return path
    pool = getattr(raw, "_pool", None)
    scheme, host, port = (getattr(pool, name, None) for name in ("scheme", "host", "port"))
    if not scheme or not host:
        return ""
    default = {"http": 80, "https": 443}.get(str(scheme))
    netloc = str(host) if port in (None, default) else f"{host}:{port}"
    return f"{scheme}://{netloc}{path}"


_TRANSIENT_CODES = frozenset(
    {
        "SlowDown", "Throttling", "ThrottlingException", "ThrottledException",
        "RequestThrottled", "RequestThrottledException", "TooManyRequestsException",
        "RequestLimitExceeded", "BandwidthLimitExceeded", "RequestTimeout",
        "RequestTimeoutException", "InternalError", "ServiceUnavailable",
        "PriorRequestNotComplete",
    }
)  # fmt: skip
_TRANSIENT_STATUS = frozenset({429, 500, 502, 503, 504})


def is_transient(exc: Exception) -> bool:
    """Whether a ClientError is worth retrying: throttling, timeouts, 5xx (and 429)."""
    response: Mapping[str, Any] = getattr(exc, "response", None) or {}
    code = str(response.get("Error", {}).get("Code", ""))
    status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return code in _TRANSIENT_CODES or status in _TRANSIENT_STATUS


def received_before(exc: BaseException) -> int:
    """Bytes a body cut off mid-way delivered, from the error's chain (0 when unknown).

    http.client's ``IncompleteRead`` holds the partial bytes (urllib3's, their count);
    botocore and urllib3 wrap it in their own errors.
    """
    seen: set[int] = set()
    todo: list[object] = [exc]
    while todo:
        e = todo.pop()
        if not isinstance(e, BaseException) or id(e) in seen:
            continue
        seen.add(id(e))
        partial = getattr(e, "partial", None)
        if isinstance(partial, bytes | bytearray):
            return len(partial)
        if isinstance(partial, int) and not isinstance(partial, bool):
            return partial
        todo += [*e.args, e.__cause__, e.__context__]
    return 0


_RANGE_ASKED = re.compile(r"bytes=(\d+)-(\d+)")
_RANGE_GIVEN = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


def checked_range(asked: str, given: object, data: bytes, status: object = 206) -> bytes:
    """The bytes of range ``asked`` in a ranged GET's body, checked against what was sent.

    A body whose Content-Length was cut along with it (a proxy that shortens both) passes
    the length check; its ``Content-Range`` then names fewer bytes than were asked of an
    object long enough to hold them, and the read is retried (``TruncatedBody``). A server
    that ignores ranges answers 200 with the whole object and no ``Content-Range``: the
    range is cut from it (a 206 without one is taken as it is: nothing to check it by).
    """
    want = _RANGE_ASKED.fullmatch(asked)
    if want is None:  # not a range this store asks (an open-ended resume is checked there)
        return data
    start, last = int(want.group(1)), int(want.group(2))
    if given is None:
        # 200: the whole object, of which this is the range
        return data[start:last + 1] if status == 200 else data
    got = _RANGE_GIVEN.fullmatch(str(given))
    if got is None:
        raise TruncatedBody(f"asked for {asked}, the reply's Content-Range is {given!r}")
    first, end = int(got.group(1)), int(got.group(2))
    total = None if got.group(3) == "*" else int(got.group(3))
    expected_end = last if total is None else min(last, total - 1)
    if first != start or end != expected_end or len(data) != end - first + 1:
        raise TruncatedBody(
            f"asked for {asked}, got bytes {first}-{end} of {total} ({len(data)} bytes)",
            len(data))
    return data
