"""A store on S3 and S3-compatible servers, with refs moved by conditional PUT.

This talks to S3 through botocore (the library s3fs itself rests on), not through s3fs:
botocore exposes the conditional-write headers (``IfNoneMatch``/``IfMatch`` on PutObject,
CompleteMultipartUpload and DeleteObject) that make compare-and-swap atomic across
machines, and it has no listing cache to defeat.

How each promise of :class:`~simstore.storage.ObjectStore` is kept:

- ``put`` is one PutObject (or a multipart upload, which S3 also publishes atomically).
- ``put_if_absent``/``put_file`` send ``If-None-Match: *``; a 412 means the object is
  there, so two writers racing on one content-addressed key both succeed and neither
  overwrites. When the object exists its LastModified is refreshed by copying it onto
  itself with ``MetadataDirective=REPLACE`` (never a conditional copy: servers differ).
- The version token is the ETag. ``compare_and_swap`` creates with ``If-None-Match: *``,
  updates with ``If-Match: <etag>`` and deletes with DeleteObject ``If-Match``; 412 and
  409 become ``ConflictError`` (and so does 404 on an ``If-Match``: the ref is gone).
- ``clock`` (gc's "now") is the server's: the LastModified of a probe object written
  for it, never this machine's time.
- Retries are ours, not botocore's (its own are switched off): they cover reading the
  body too, their backoff is configurable (full jitter, bounded by attempts and a
  deadline) and a retried conditional PUT whose first attempt landed gets a 412, which
  surfaces as ``ConflictError``; the catalog then re-reads the ref (as it does after a
  ``StorageError``: every retry's response may have been lost too).

Options are an s3fs-style dict (:class:`S3Options`, checked in ``_s3_options``); endpoint
and credentials otherwise come from the standard AWS environment and config files,
resolved by botocore.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import re
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar

try:
    from botocore import UNSIGNED
    from botocore.config import Config
    from botocore.exceptions import FlexibleChecksumError
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "s3:// stores need botocore; install the S3 extra: pip install 'simstore[s3]'"
    ) from exc

from simstore.errors import (
    ConflictError,
    InvalidInputError,
    NotFoundError,
    NotWritableError,
    ReadOnlyError,
    StorageError,
)
from simstore.storage._base import ObjectInfo, check_key, larger_than
from simstore.storage._fsspec import refuse_query_or_fragment
from simstore.storage._s3_answers import Refused, conflict_message
from simstore.storage._s3_files import (
    TRANSPORT_ERRORS,
    S3ObjectReader,
    TruncatedBody,
    checked_range,
    named_timeout,
    received_before,
    request_url,
)
from simstore.storage._s3_options import (
    CLIENT_ARGS,
    MaskedOptions,
    S3Options,
    extra_parameters,
    parse_tuning,
    secrets_of,
)
from simstore.storage._s3_session import add_parameters, s3_session
from simstore.storage._s3_upload import S3Uploads, Source, all_results
from simstore.storage._s3_watchdog import cut_at, cut_body, guard_release

__all__ = ["S3ObjectReader", "S3Options", "S3Store", "probe_conditional_writes"]

T = TypeVar("T")

_BUCKET = re.compile(r"[A-Za-z0-9._-]{1,255}")
"""The bucket names boto accepts (S3's own rules are narrower; S3-compatible stores'
vary): anything else fails every request with a validation error."""

_NO_CONDITIONAL_WRITES = (
    "the server does not support conditional writes (If-None-Match/If-Match on PutObject), "
    "so refs cannot be moved atomically; use a server that enforces them (AWS S3 does; "
    "probe_conditional_writes checks others) or a local store"
)


class S3Store(S3Uploads):
    """An :class:`~simstore.storage.ObjectStore` under ``s3://bucket/prefix``.

    ``storage_options`` is an :class:`S3Options` dict. The botocore client is made on first
    use in each process (botocore clients are thread-safe, so threads share it) and
    dropped when pickling; ``close`` releases its connections.
    """

    def __init__(
        self,
        url: str,
        *,
        storage_options: Mapping[str, Any] | None = None,
        read_only: bool = False,
    ) -> None:
        scheme, sep, rest = url.partition("://")
        if scheme not in ("s3", "s3a") or not sep:
            raise InvalidInputError(f"not an S3 URL: {url!r} (expected s3://bucket/prefix)")
        bucket, _, prefix = rest.partition("/")
        if not bucket or "@" in bucket or ":" in bucket:
            # Never echo the URL here: a user may have put credentials into it.
            raise InvalidInputError("S3 URL has no valid bucket (expected s3://bucket/prefix)")
        if not _BUCKET.fullmatch(bucket):
            raise InvalidInputError(
                f"s3://{bucket}: invalid bucket name {bucket!r}: letters, digits, '.', '-' "
                "and '_', 1 to 255 of them (expected s3://bucket/prefix)"
            )
        # as for every other store URL (in the bucket's name they are refused above):
        # keys are appended to the prefix, and s3fs would read ``?versionId=`` as a version
        refuse_query_or_fragment(url, prefix)
        self.bucket = bucket
        self.root = prefix.strip("/")
        self.url = f"s3://{bucket}/{self.root}" if self.root else f"s3://{bucket}"
        self.read_only = read_only
        self.storage_options: dict[str, Any] = MaskedOptions(storage_options or {})
        self._tuning = parse_tuning(self.storage_options)
        self._extra = extra_parameters(self.storage_options)
        self.supports_atomic_cas = self._tuning.conditional_writes
        self._secrets = secrets_of(self.storage_options)
        self._lock = threading.Lock()
        self._client: Any = None
        self._client_pid = -1
        self._session: Any = None
        self._rng = random.Random()
        self.on_retry: Callable[[str, int], None] | None = None
        """Told of every attempt that failed and is retried: its request class (``get``,
        ``range_get``, ``head``, ``list``, ``put``, ``delete``) and the bytes a cut-off
        body delivered. The call's last attempt is its caller's to count; the attempts
        before it were sent and billed too. Set by a loader for its counters; a listener
        of the calling thread (:meth:`retries_to`, as ``CountingStore`` uses) is told
        instead where one is set. Not pickled."""
        self._listener = threading.local()

    # -- lifecycle -----------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in ("_lock", "_client", "_session", "_rng", "_listener"):
            del state[name]
        state["on_retry"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._client = None
        self._client_pid = -1
        self._session = None
        self._rng = random.Random()
        self._listener = threading.local()

    def __repr__(self) -> str:
        return f"S3Store({self.url!r}, read_only={self.read_only})"

    def close(self) -> None:
        """Close the client's connections; a later call opens a new client."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    @property
    def _api(self) -> Any:
        """The botocore S3 client of this process, created on first use.

        A forked child (a DataLoader worker) makes its own client, with its own
        connections, but from the botocore session it inherited: the session holds the
        service model and endpoint rules already parsed. Parsing them again costs ~0.1 s
        in a fresh process and over a second in a forked one, whose first garbage
        collections walk the whole inherited heap (torch's included).
        """
        client = self._client
        if client is not None and self._client_pid == os.getpid():
            return client
        with self._lock:
            if self._client is None or self._client_pid != os.getpid():
                self._client = self._make_client()
                self._client_pid = os.getpid()
            return self._client

    def _make_client(self) -> Any:
        opts, tuning = self.storage_options, self._tuning
        config_kwargs: dict[str, Any] = {
            # threads of one process share the client: loader I/O threads, get_many,
            # multipart parts; a pool smaller than them opens and drops connections
            "max_pool_connections": max(32, 2 * tuning.multipart_concurrency),
            **dict(opts.get("config_kwargs") or {}),
            # Retries are ours (see the module docstring): botocore makes one attempt.
            "retries": {"total_max_attempts": 1, "mode": "standard"},
            "connect_timeout": tuning.connect_timeout_s,
            "read_timeout": tuning.read_timeout_s,
        }
        if opts.get("anon"):
            config_kwargs["signature_version"] = UNSIGNED
        kwargs: dict[str, Any] = dict(opts.get("client_kwargs") or {})
        for option, arg in CLIENT_ARGS:
            if opts.get(option) is not None:
                kwargs[arg] = opts[option]
        if "region_name" not in kwargs and os.environ.get("AWS_REGION"):
            # the AWS CLI's and SDKs' variable, which botocore does not read; it wins over
            # AWS_DEFAULT_REGION and the profile's region, as it does there
            kwargs["region_name"] = os.environ["AWS_REGION"]
        try:
            if self._session is None:
                self._session = s3_session(opts.get("profile"))
            client = self._session.create_client("s3", config=Config(**config_kwargs), **kwargs)
        except Exception as exc:
            raise StorageError(
                f"{self.url}: cannot create an S3 client: {self._scrub(str(exc))}"
            ) from exc
        if self._extra:
            client.meta.events.register(
                "provide-client-params.s3", functools.partial(add_parameters, self._extra)
            )
        return client

    # -- plumbing ------------------------------------------------------------------------
    def _object_key(self, key: str) -> str:
        check_key(key)
        return f"{self.root}/{key}" if self.root else key

    def _check_writable(self, key: str) -> str:
        obj = self._object_key(key)
        if self.read_only:
            raise ReadOnlyError(f"{self.url}: store is read-only, cannot write {key}")
        return obj

    # -- reads ---------------------------------------------------------------------------
    def get(
        self, key: str, byte_range: tuple[int, int] | None = None, *,
        max_bytes: int | None = None,
    ) -> bytes:
        """Read an object, or the half-open ``byte_range`` of it with one ranged GET.

        A range past the end is cut at the end, as a local file read is. With
        ``max_bytes``, a whole object larger than that is refused by the Content-Length
        of its GET, its body left unread (see ``ObjectStore.get``).
        """
        obj = self._object_key(key)
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": obj}
        if byte_range is not None:
            start, end = byte_range
            if start < 0 or end < start:
                raise InvalidInputError(f"{self.url}/{key}: bad byte range {byte_range}")
            if start == end:
                self.info(key)  # still a NotFoundError for a missing object
                return b""
            kwargs["Range"] = f"bytes={start}-{end - 1}"
        began = self._clock()
        try:
            return self._retry("read", key,
                               lambda: self._read_body(key, kwargs, began, max_bytes)[0],
                               since=began,
                               request="get" if byte_range is None else "range_get")
        except Refused as exc:
            if exc.is_not_found:
                raise NotFoundError(f"{self.url}: no object {key}") from exc.error
            if exc.code == "InvalidRange":
                return b""
            raise self._error("read", key, exc) from exc.error

    def body_bound(self, start: float, nbytes: int) -> float:
        """Seconds from now a body of ``nbytes``, read in a run begun at ``start``, may take.

        The later of the retry deadline and the body's size at ``min_read_bytes_per_second``:
        a slow body that keeps coming is read, one that trickles is cut off.
        """
        tuning = self._tuning
        left = tuning.retry_deadline_s - (self._clock() - start)
        return max(left, nbytes / tuning.min_read_bytes_per_second)

    def _read_body(
        self, key: str, kwargs: Mapping[str, Any], start: float, max_bytes: int | None = None,
    ) -> tuple[bytes, str]:
        response = self._api.get_object(**kwargs)
        body = guard_release(response["Body"])
        length = int(response.get("ContentLength") or 0)
        try:
            if max_bytes is not None and "Range" not in kwargs and length > max_bytes:
                # refused unread: closing the body drops its connection, not the next
                # request's, and asks nothing more of the server
                raise larger_than(self.url, key, max_bytes, length)
            # a body trickling in past its bound is cut off: it fails as a broken one, and
            # the retry loop, its deadline passed, gives up naming the object
            with cut_at(self.body_bound(start, length), lambda: cut_body(body)):
                data = bytes(body.read())
        except FlexibleChecksumError as exc:
            # the body arrived, damaged on the way: what a read again fixes, as a cut;
            # all of it was sent (and billed as egress)
            raise TruncatedBody(f"the body failed its checksum: {exc}",
                                int(response.get("ContentLength") or 0)) from exc
        except TRANSPORT_ERRORS as exc:
            # what the cut-off body delivered was still sent (and billed as egress)
            received = received_before(exc)
            named = named_timeout(exc, request_url(body) or f"s3://{self.bucket}/{kwargs['Key']}")
            for e in (exc, named):
                with contextlib.suppress(AttributeError, TypeError):
                    setattr(e, "received_bytes", received)  # noqa: B010
            if named is exc:
                raise
            raise named from exc
        finally:
            body.close()
        expected = response.get("ContentLength")
        if expected is not None and len(data) != int(expected):
            raise TruncatedBody(f"got {len(data)} of {expected} bytes", len(data))
        asked = kwargs.get("Range")
        if asked is not None:
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            data = checked_range(str(asked), response.get("ContentRange"), data, status)
        return data, str(response.get("ETag", ""))

    def get_many(
        self,
        requests: Sequence[str | tuple[str, tuple[int, int] | None]],
        *,
        max_workers: int = 8,
    ) -> list[bytes]:
        """Read many objects or byte ranges at once, in the order asked.

        An optional fast path (not part of the ObjectStore protocol): a pool of at most
        ``max_workers`` threads, made and closed by this call, hides per-request latency,
        which dominates small reads from S3. Each item is a key or ``(key, byte_range)``.
        Results are held in memory together: size batches accordingly. The first error
        is raised; requests not yet started are cancelled.
        """
        items = [(r, None) if isinstance(r, str) else r for r in requests]
        if max_workers <= 1 or len(items) <= 1:
            return [self.get(key, byte_range) for key, byte_range in items]
        listener = getattr(self._listener, "fn", None)  # the caller's, in the pool's threads

        def get(key: str, byte_range: tuple[int, int] | None) -> bytes:
            with self.retries_to(listener):
                return self.get(key, byte_range)

        with ThreadPoolExecutor(max_workers=min(max_workers, len(items))) as pool:
            return all_results([pool.submit(get, key, byte_range) for key, byte_range in items])

    def open_read(self, key: str) -> S3ObjectReader:
        """A sequential file over a whole object: one GET whose body is read as asked.

        An optional fast path (not part of the ObjectStore protocol) for copying large
        objects with bounded memory: nothing is buffered beyond the caller's reads. One
        whole-object GET is also what S3-compatible servers serve fastest (moto reads the
        whole object for every ranged GET). The GET is sent here, so a missing key raises
        ``NotFoundError`` now and ``size_bytes`` is known before the first read. A body
        cut off mid-way is resumed where it stopped, by a ranged GET with ``If-Match`` on
        the first response's ETag (bytes of a replaced object are never spliced in),
        except for an object named by its hash, whose bytes never change though its ETag
        may; see :class:`S3ObjectReader`. Close it, or use it in a ``with`` block.
        """
        return S3ObjectReader(self, key)

    def _get_object(
        self, key: str, kwargs: Mapping[str, Any], *, since: float | None = None
    ) -> Mapping[str, Any]:
        """One GetObject, retried (deadline from ``since``); the response, body unread."""
        try:
            response: Mapping[str, Any] = self._retry(
                "read", key, lambda: self._api.get_object(**kwargs), since=since,
                request="range_get" if "Range" in kwargs else "get",
            )
            return response
        except Refused as exc:
            if exc.is_not_found:
                raise NotFoundError(f"{self.url}: no object {key}") from exc.error
            if exc.is_precondition:
                raise StorageError(
                    f"{self.url}/{key}: read failed: the object changed while it was read"
                ) from exc.error
            raise self._error("read", key, exc) from exc.error

    def get_versioned(self, key: str, *, max_bytes: int | None = None) -> tuple[bytes, str]:
        """Read a ref and its version token, the ETag (``max_bytes``: as for ``get``)."""
        obj = self._object_key(key)
        kwargs = {"Bucket": self.bucket, "Key": obj}
        start = self._clock()
        try:
            return self._retry("read", key, lambda: self._read_body(key, kwargs, start, max_bytes),
                               since=start)
        except Refused as exc:
            if exc.is_not_found:
                raise NotFoundError(f"{self.url}: no object {key}") from exc.error
            raise self._error("read", key, exc) from exc.error

    def _head(self, key: str) -> Mapping[str, Any] | None:
        obj = self._object_key(key)
        try:
            return self._retry(  # type: ignore[no-any-return]
                "stat", key, lambda: self._api.head_object(Bucket=self.bucket, Key=obj)
            )
        except Refused as exc:
            if exc.is_not_found:
                return None
            raise self._error("stat", key, exc) from exc.error

    def exists(self, key: str) -> bool:
        """Whether the key exists (one HEAD request)."""
        return self._head(key) is not None

    def refresh(self, key: str) -> bool:
        """Refresh LastModified (gc's grace) by a copy onto itself; False when absent."""
        obj = self._check_writable(key)
        return self._refresh(key, obj)

    def info(self, key: str) -> ObjectInfo:
        """Size and LastModified (whole seconds on S3) of one object."""
        head = self._head(key)
        if head is None:
            raise NotFoundError(f"{self.url}: no object {key}")
        return ObjectInfo(key, int(head["ContentLength"]), head["LastModified"].timestamp())

    def list(self, prefix: str = "") -> Iterator[str]:
        """Keys starting with ``prefix``, in S3's (UTF-8 byte) order."""
        for info in self.list_info(prefix):
            yield info.key

    def list_info(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Infos of keys starting with ``prefix``: ListObjectsV2 pages, fetched as iterated.

        Nothing is cached; each page is retried on its own. Keys ending in ``/`` (folder
        markers written by consoles) are skipped.
        """
        base = f"{self.root}/" if self.root else ""
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": base + prefix}
        while True:
            page = self._list_page(prefix, dict(kwargs))
            for item in page.get("Contents", ()):
                key = str(item["Key"])[len(base) :]
                if key and not key.endswith("/"):
                    yield ObjectInfo(key, int(item["Size"]), item["LastModified"].timestamp())
            if not page.get("IsTruncated"):
                return
            kwargs["ContinuationToken"] = page["NextContinuationToken"]

    def _list_page(self, prefix: str, kwargs: dict[str, Any]) -> Mapping[str, Any]:
        try:
            return self._retry("list", prefix, lambda: self._api.list_objects_v2(**kwargs))
        except Refused as exc:
            raise self._error("list", prefix, exc) from exc.error

    def local_path(self, key: str) -> str | None:
        """Never local."""
        return None

    # -- writes --------------------------------------------------------------------------
    def put(self, key: str, data: bytes) -> None:
        """Write or overwrite an object (one PUT; multipart above the threshold)."""
        obj = self._check_writable(key)
        if len(data) > self._tuning.multipart_threshold_bytes:
            self._upload_multipart(key, obj, Source(len(data), data=data), if_absent=False)
            return
        self._put_object(key, {"Bucket": self.bucket, "Key": obj, "Body": data})

    def _put_object(self, key: str, kwargs: Mapping[str, Any]) -> str:
        """One PutObject, retried; returns the new ETag, raises ``Refused``."""
        response = self._retry("write", key, lambda: self._api.put_object(**kwargs))
        return str(response.get("ETag", ""))

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Write unless present (``If-None-Match: *``); when present, refresh LastModified."""
        obj = self._check_writable(key)
        if len(data) > self._tuning.multipart_threshold_bytes:
            return self._upload_if_absent(key, obj, Source(len(data), data=data))
        if not self._tuning.conditional_writes:
            return self._check_then_write(key, obj, lambda: self.put(key, data))
        for _ in range(3):
            try:
                self._put_object(
                    key, {"Bucket": self.bucket, "Key": obj, "Body": data, "IfNoneMatch": "*"}
                )
                return True
            except Refused as exc:
                if not exc.is_precondition:
                    raise self._error("write", key, exc) from exc.error
            if self._refresh(key, obj):
                return False
            # Deleted between our 412 and the copy (gc): write it again.
        raise StorageError(f"{self.url}/{key}: write failed: object keeps vanishing")

    def put_file(self, key: str, path: str) -> bool:
        """Upload a local file unless present; multipart above the threshold, from disk.

        A HEAD first skips uploading bytes the store already holds (content-addressed
        keys are often reused); the upload itself is still conditional.
        """
        obj = self._check_writable(key)
        try:
            source = Source(os.stat(path).st_size, path=path)
        except OSError as exc:
            raise StorageError(f"{self.url}/{key}: cannot read {path}: {exc}") from exc
        head = self._head(key)
        if head is not None and self._refresh(key, obj, int(head["ContentLength"])):
            return False
        return self._upload_if_absent(key, obj, source)

    def compare_and_swap(self, key: str, expected: str | None, data: bytes | None) -> str | None:
        """Replace the object whose ETag is ``expected`` by a conditional PUT or DELETE.

        ``expected=None`` creates (``If-None-Match: *``); otherwise ``If-Match: expected``.
        412 and 409 raise ``ConflictError``, as does 404 on ``If-Match`` (the ref is gone),
        and nothing else does. A retried request whose first attempt landed also gets a
        412: the caller re-reads the ref and finds its own value. Deleting with
        ``expected=None`` checks absence with a HEAD. Servers that ignore ``If-Match`` on
        DELETE delete unconditionally (see docs/storage-s3.md).
        """
        obj = self._check_writable(key)
        if not self.supports_atomic_cas:
            raise StorageError(
                f"{self.url}/{key}: compare-and-swap failed: {_NO_CONDITIONAL_WRITES}"
            )
        try:
            if data is None:
                if expected is None:
                    if self.exists(key):
                        raise ConflictError(
                            f"{self.url}/{key} changed concurrently "
                            "(expected version absent, found present)"
                        )
                    return None
                self._retry(
                    "delete",
                    key,
                    lambda: self._api.delete_object(Bucket=self.bucket, Key=obj, IfMatch=expected),
                )
                return None
            condition = {"IfNoneMatch": "*"} if expected is None else {"IfMatch": expected}
            return self._put_object(
                key, {"Bucket": self.bucket, "Key": obj, "Body": data, **condition}
            )
        except Refused as exc:
            if exc.is_precondition or (expected is not None and exc.is_not_found):
                raise ConflictError(conflict_message(self.url, key, expected, exc)) from exc.error
            if exc.is_not_implemented:
                raise StorageError(
                    f"{self.url}/{key}: compare-and-swap failed: {_NO_CONDITIONAL_WRITES}"
                ) from exc.error
            raise self._error("compare-and-swap", key, exc) from exc.error

    def delete(self, key: str) -> None:
        """Delete an object; a missing key is not an error."""
        obj = self._check_writable(key)
        try:
            self._retry("delete", key, lambda: self._api.delete_object(Bucket=self.bucket, Key=obj))
        except Refused as exc:
            if not exc.is_not_found:
                raise self._error("delete", key, exc) from exc.error

    def clock(self) -> float:
        """The server's time: the LastModified of a probe object written now.

        gc compares the LastModified of objects with this, so it must come from the
        server's clock, not this machine's (which may run ahead of it: gc would then
        delete what a writer stored within the grace period). Writes an empty object
        under ``_probe/``, reads its LastModified back with a HEAD and deletes it: three
        requests. LastModified has whole seconds, truncated, so the time returned is up
        to a second early: that errs on the safe side (an earlier "now" keeps more). A
        read-only store raises ``ReadOnlyError``, a write the server refuses (read-only
        credentials) ``NotWritableError``, a failing request ``StorageError``; each names
        the store and the reason.
        """
        key = f"_probe/clock-{uuid.uuid4().hex}"
        what = f"{self.url}: cannot read the server's clock"
        if self.read_only:
            raise ReadOnlyError(
                f"{what}: the store is read-only and the clock is read from a probe object "
                "written under _probe/"
            )
        obj = self._object_key(key)
        try:
            self._put_object(key, {"Bucket": self.bucket, "Key": obj, "Body": b""})
            head = self._retry(
                "stat", key, lambda: self._api.head_object(Bucket=self.bucket, Key=obj)
            )
            return float(head["LastModified"].timestamp())
        except Refused as exc:
            text = f"{what}: probe object {key}: {self._describe(exc)}"
            if exc.is_access_denied:  # gc needs to write; these credentials may not
                raise NotWritableError(
                    f"{text} (these credentials may not write the store)") from exc.error
            raise StorageError(text) from exc.error
        except StorageError as exc:
            raise type(exc)(f"{what}: {exc}") from exc
        finally:
            with contextlib.suppress(Exception):
                self.delete(key)

    def read_clock(self) -> float:
        """The server's time with no write: the ``Date`` of a one-key LIST's answer.

        For a gc dry run, whose credentials may only read (the probe of :meth:`clock`
        writes). Whole seconds, truncated, as LastModified; a failure ``StorageError``.
        """
        what = f"{self.url}: cannot read the server's clock"
        try:
            page = self._list_page("_probe/", {"Bucket": self.bucket, "MaxKeys": 1,
                                               "Prefix": self._object_key("_probe") + "/"})
            date = parsedate_to_datetime(page["ResponseMetadata"]["HTTPHeaders"]["date"])
        except StorageError as exc:  # refused, or the retries used up
            raise StorageError(f"{what}: {exc}") from exc
        except (KeyError, TypeError, ValueError) as exc:
            raise StorageError(f"{what}: its answer has no Date header") from exc
        return (date if date.tzinfo else date.replace(tzinfo=UTC)).timestamp()

    def probe_conditional_writes(self) -> bool:
        """Whether the server enforces conditional PutObject; record it on this store.

        Writes a fresh key under ``_probe/`` with ``If-None-Match: *`` twice (the second
        must fail with 412), then with ``If-Match`` on a wrong ETag (must fail with 412),
        and deletes the key: four requests. ``supports_atomic_cas`` takes the answer, so
        a store on a server without conditional writes refuses compare-and-swap from
        then on. The catalog's ``init`` records it; reopen such a store with
        ``storage_options={"conditional_writes": False}``. Transient failures that outlast
        the retries raise ``StorageError``; a read-only store raises ``ReadOnlyError``.
        """
        key = f"_probe/{uuid.uuid4().hex}"
        base = {"Bucket": self.bucket, "Key": self._check_writable(key), "Body": b"probe"}
        wrong_etag = '"' + "0" * 32 + '"'
        enforced = True
        try:
            try:
                self._put_object(key, {**base, "IfNoneMatch": "*"})
            except Refused as exc:
                if exc.is_not_implemented or exc.status == 400:
                    enforced = False  # the server rejects the header outright
                elif not exc.is_precondition:  # 412: an earlier attempt landed; fine
                    raise self._error("probe", key, exc) from exc.error
            for condition in ({"IfNoneMatch": "*"}, {"IfMatch": wrong_etag}):
                if not enforced:
                    break
                try:
                    self._put_object(key, {**base, **condition})
                    enforced = False  # the write went through: the condition was ignored
                except Refused as exc:
                    enforced = exc.is_precondition
        finally:
            with contextlib.suppress(Exception):
                self.delete(key)
        self.supports_atomic_cas = enforced
        return enforced


def probe_conditional_writes(store: S3Store) -> bool:
    """Whether the server behind ``store`` enforces conditional PutObject.

    The function form of :meth:`S3Store.probe_conditional_writes`.
    """
    return store.probe_conditional_writes()
