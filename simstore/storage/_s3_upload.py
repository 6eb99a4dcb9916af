"""How an S3 store uploads an object and refreshes one it already holds.

An object above the multipart threshold goes up in parts, ``multipart_concurrency`` at a
time, and an upload that fails is aborted. ``If-None-Match: *`` makes an upload of a
content-addressed key write nothing when the key is there; the key's LastModified is
then refreshed (gc's grace period counts from it) by copying the object onto itself,
part by part above the 5 GiB a single copy takes.
"""

from __future__ import annotations

import contextlib
import io
import math
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from simstore.errors import StorageError
from simstore.storage._s3_answers import Refused
from simstore.storage._s3_files import FileSlice
from simstore.storage._s3_retry import S3Retries

__all__ = ["MAX_COPY_BYTES", "S3Uploads", "Source", "all_results"]

T = TypeVar("T")

_MiB = 1024 * 1024
# S3 limits: one CopyObject copies at most 5 GiB; an upload has at most 10,000 parts.
MAX_COPY_BYTES = 5 * 1024 * _MiB
MAX_PARTS = 10_000


class S3Uploads(S3Retries):
    """The uploads and refreshes of :class:`~simstore.storage._s3.S3Store` (its only user)."""

    bucket: str

    if TYPE_CHECKING:
        @property
        def _api(self) -> Any: ...

        def _head(self, key: str) -> Mapping[str, Any] | None: ...

    def _upload_if_absent(self, key: str, obj: str, source: Source) -> bool:
        if not self._tuning.conditional_writes:
            return self._check_then_write(key, obj, lambda: self._upload(key, obj, source, False))
        for _ in range(3):
            if self._upload(key, obj, source, if_absent=True):
                return True
            if self._refresh(key, obj, source.size_bytes):
                return False
        raise StorageError(f"{self.url}/{key}: upload failed: object keeps vanishing")

    def _check_then_write(self, key: str, obj: str, write: Callable[[], object]) -> bool:
        # Without conditional writes two racing writers may both write; for a
        # content-addressed key they write the same bytes, so nothing is lost.
        head = self._head(key)
        if head is not None and self._refresh(key, obj):
            return False
        write()
        return True

    def _upload(self, key: str, obj: str, source: Source, if_absent: bool) -> bool:
        """Upload ``source``; returns False when ``if_absent`` and the key exists."""
        if source.size_bytes > self._tuning.multipart_threshold_bytes:
            return self._upload_multipart(key, obj, source, if_absent)
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": obj}
        if if_absent:
            kwargs["IfNoneMatch"] = "*"

        def put() -> Any:
            with source.open(0, source.size_bytes) as body:
                return self._api.put_object(Body=body, **kwargs)

        try:
            self._retry("write", key, put)
            return True
        except Refused as exc:
            if if_absent and exc.is_precondition:
                return False
            raise self._error("write", key, exc) from exc.error

    def _upload_multipart(self, key: str, obj: str, source: Source, if_absent: bool) -> bool:
        """Upload in parts, ``multipart_concurrency`` at a time; abort on failure."""
        tuning, client = self._tuning, self._api
        size = source.size_bytes
        part_bytes = max(tuning.multipart_part_bytes, math.ceil(size / MAX_PARTS))
        checksum = client.meta.config.request_checksum_calculation != "when_required"
        create: dict[str, Any] = {"Bucket": self.bucket, "Key": obj}
        if checksum:
            create["ChecksumAlgorithm"] = "CRC32"
        try:
            upload_id = self._retry(
                "upload", key, lambda: client.create_multipart_upload(**create)
            )["UploadId"]
        except Refused as exc:
            raise self._error("upload", key, exc) from exc.error
        ids = {"Bucket": self.bucket, "Key": obj, "UploadId": upload_id}

        def upload_part(number: int) -> dict[str, Any]:
            offset = (number - 1) * part_bytes
            length = min(part_bytes, size - offset)

            def call() -> Any:
                with source.open(offset, length) as body:
                    return client.upload_part(PartNumber=number, Body=body, **ids)

            response = self._retry("upload", key, call)
            part = {"PartNumber": number, "ETag": response["ETag"]}
            if checksum and response.get("ChecksumCRC32"):
                part["ChecksumCRC32"] = response["ChecksumCRC32"]
            return part

        complete: dict[str, Any] = dict(ids)
        if if_absent:
            complete["IfNoneMatch"] = "*"
        try:
            n_parts = max(1, math.ceil(size / part_bytes))
            with ThreadPoolExecutor(max_workers=max(1, tuning.multipart_concurrency)) as pool:
                futures = [pool.submit(upload_part, n) for n in range(1, n_parts + 1)]
                complete["MultipartUpload"] = {"Parts": all_results(futures)}
            self._retry("upload", key, lambda: client.complete_multipart_upload(**complete))
            return True
        except Refused as exc:
            self._abort(key, ids)
            if if_absent and exc.is_precondition:
                return False
            if exc.code == "NoSuchUpload" and exc.attempts > 1 and self._head(key) is not None:
                return True  # an earlier attempt completed it; its response was lost
            raise self._error("upload", key, exc) from exc.error
        except BaseException:
            self._abort(key, ids)
            raise

    def _abort(self, key: str, ids: Mapping[str, Any]) -> None:
        """Abort a multipart upload, retried like any request; a final failure is swallowed.

        The error that made the upload fail is the one to report. Parts left by an abort
        that never got through (or by a writer that died) are removed by the bucket's
        ``AbortIncompleteMultipartUpload`` lifecycle rule (docs/storage-s3.md).
        """
        with contextlib.suppress(Exception):
            self._retry("abort upload", key, lambda: self._api.abort_multipart_upload(**ids))

    def _refresh(self, key: str, obj: str, size_bytes: int | None = None) -> bool:
        """Refresh LastModified by copying the object onto itself; False if it is gone."""
        if size_bytes is not None and size_bytes > MAX_COPY_BYTES:
            return self._refresh_multipart(key, obj, size_bytes)
        source = {"Bucket": self.bucket, "Key": obj}
        try:
            self._retry(
                "refresh",
                key,
                lambda: self._api.copy_object(
                    Bucket=self.bucket, Key=obj, CopySource=source, MetadataDirective="REPLACE"
                ),
            )
            return True
        except Refused as exc:
            if exc.is_not_found:
                return False
            if exc.code in ("InvalidRequest", "EntityTooLarge") and size_bytes is None:
                head = self._head(key)  # too large for one CopyObject
                return head is not None and self._refresh_multipart(
                    key, obj, int(head["ContentLength"])
                )
            raise self._error("refresh", key, exc) from exc.error

    def _refresh_multipart(self, key: str, obj: str, size_bytes: int) -> bool:
        """Copy an object over 5 GiB onto itself part by part (UploadPartCopy)."""
        client = self._api
        part_bytes = MAX_COPY_BYTES  # server-side: the largest parts, fewest requests
        try:
            upload_id = self._retry(
                "refresh",
                key,
                lambda: client.create_multipart_upload(Bucket=self.bucket, Key=obj),
            )["UploadId"]
        except Refused as exc:
            raise self._error("refresh", key, exc) from exc.error
        ids = {"Bucket": self.bucket, "Key": obj, "UploadId": upload_id}
        source = {"Bucket": self.bucket, "Key": obj}
        parts = []
        try:
            for number, offset in enumerate(range(0, size_bytes, part_bytes), start=1):
                last = min(offset + part_bytes, size_bytes) - 1
                response = self._retry(
                    "refresh",
                    key,
                    _bind(
                        client.upload_part_copy,
                        PartNumber=number,
                        CopySource=source,
                        CopySourceRange=f"bytes={offset}-{last}",
                        **ids,
                    ),
                )
                parts.append({"PartNumber": number, "ETag": response["CopyPartResult"]["ETag"]})
            self._retry(
                "refresh",
                key,
                lambda: client.complete_multipart_upload(MultipartUpload={"Parts": parts}, **ids),
            )
            return True
        except Refused as exc:
            self._abort(key, ids)
            if exc.is_not_found:
                return False
            raise self._error("refresh", key, exc) from exc.error
        except BaseException:
            self._abort(key, ids)
            raise


# -- helpers ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Source:
    """Bytes to upload, in a local file (``path``) or in memory (``data``)."""

    size_bytes: int
    path: str | None = None
    data: bytes = b""

    def open(self, offset: int, length: int) -> io.RawIOBase | io.BytesIO:
        """Open ``length`` bytes from ``offset`` as a fresh file object (one per attempt)."""
        if self.path is not None:
            return FileSlice(self.path, offset, length)
        return io.BytesIO(memoryview(self.data)[offset : offset + length])


def _bind(fn: Callable[..., T], **kwargs: Any) -> Callable[[], T]:
    """``fn`` bound to ``kwargs`` (loop-safe, unlike a lambda over loop variables)."""
    return lambda: fn(**kwargs)


def all_results(futures: Sequence[Future[T]]) -> list[T]:
    """Every future's result, in order; at the first failure the rest are cancelled."""
    try:
        return [f.result() for f in futures]
    except BaseException:
        for f in futures:
            f.cancel()
        raise
