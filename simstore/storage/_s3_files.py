"""File objects of the S3 store: an upload's part read from disk, a download streamed.

- :class:`FileSlice`: ``length`` bytes of a local file, the body of one part of a
  multipart upload, read in blocks as botocore sends it.
- :class:`S3ObjectReader`: a whole object read by one streamed GET
  (:meth:`~simstore.storage._s3.S3Store.open_read`), resumed by a ranged GET when the body
  breaks off.

Also the transport failures every request of the store retries.
"""

from __future__ import annotations

import contextlib
import io
import time
from typing import TYPE_CHECKING, Any

from botocore.exceptions import (
    BotoCoreError,
    HTTPClientError,
    IncompleteReadError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError
from urllib3.exceptions import ProtocolError, ReadTimeoutError

from simstore.errors import StorageError

if TYPE_CHECKING:
    from simstore.storage._s3 import S3Store

__all__ = ["TRANSPORT_ERRORS", "FileSlice", "S3ObjectReader", "TruncatedBody"]

_MiB = 1024 * 1024


class TruncatedBody(Exception):
    """A response body shorter than its Content-Length (a connection cut mid-body)."""


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
    (``Range: bytes=<done>-``, ``If-Match: <etag>``) after the store's backoff; a
    failure that makes no progress counts against ``max_attempts`` and, once they are
    used up, raises ``StorageError`` naming the object.
    """

    def __init__(self, store: S3Store, key: str) -> None:
        super().__init__()
        self._store = store
        self.key = key
        self._obj = store._object_key(key)
        self._pos = 0
        self._body: Any = None
        self._etag = ""
        self.requests = 0
        self.size_bytes = 0
        self._request()

    def _request(self) -> None:
        kwargs: dict[str, Any] = {"Bucket": self._store.bucket, "Key": self._obj}
        if self._pos:
            kwargs["Range"] = f"bytes={self._pos}-"
            if self._etag:
                kwargs["IfMatch"] = self._etag
        response = self._store._get_object(self.key, kwargs)
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
        self._body = response["Body"]

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def read(self, size: int | None = -1) -> bytes:
        """The next ``size`` bytes at most (all the rest when ``size`` is negative)."""
        left = self.size_bytes - self._pos
        if size is None or size < 0:
            return b"".join(iter(lambda: self.read(_MiB), b""))
        if left <= 0 or size == 0:
            return b""
        failures = 0
        while True:
            try:
                if self._body is None:
                    self._request()
                data: bytes = self._body.read(min(size, left))
                if not data:
                    raise TruncatedBody(f"body ended at byte {self._pos} of {self.size_bytes}")
                self._pos += len(data)
                return data
            except TRANSPORT_ERRORS as exc:
                self._drop_body()
                failures += 1
                if failures >= self._store._tuning.max_attempts:
                    raise StorageError(
                        f"{self._store.url}/{self.key}: read failed after {failures} attempts "
                        f"at byte {self._pos} of {self.size_bytes}: "
                        f"{self._store._describe(exc)}"
                    ) from exc
                time.sleep(self._store._backoff_s(failures))
            except (BotoCoreError, OSError) as exc:
                self._drop_body()
                raise self._store._error("read", self.key, exc) from exc

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self.read(len(view))
        view[: len(data)] = data
        return len(data)

    def _drop_body(self) -> None:
        body, self._body = self._body, None
        if body is not None:
            with contextlib.suppress(Exception):
                body.close()

    def close(self) -> None:
        self._drop_body()
        super().close()
