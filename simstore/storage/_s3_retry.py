"""How an S3 store retries a request, and how it names a failure.

Retries are the store's, not botocore's (its own are switched off, see ``_s3``): they
cover reading a body too, and their backoff is configurable (full jitter, bounded by
attempts and a deadline). Each failed attempt that reached the server is told to a
listener, so the cost meters bill it. The messages name the object and never a secret.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TypeVar

from botocore.exceptions import BotoCoreError, ClientError

from simstore.errors import NotWritableError, StorageError
from simstore.storage._base import never_sent
from simstore.storage._s3_answers import WRITE_OPS, Refused
from simstore.storage._s3_files import TRANSPORT_ERRORS, is_transient
from simstore.storage._s3_options import Tuning

__all__ = ["REQUEST_CLASS", "S3Retries"]

T = TypeVar("T")

REQUEST_CLASS = {
    "read": "get", "stat": "head", "list": "list", "write": "put", "upload": "put",
    "refresh": "put", "delete": "delete", "abort upload": "delete",
}
"""The request class (as ``simstore.cost.OpClass`` names it) of each ``_retry`` operation."""


class S3Retries:
    """The retrying and the failure messages of :class:`~simstore.storage._s3.S3Store`.

    A part of that class kept apart (it is its only user): the attributes below are set
    by its ``__init__``.
    """

    url: str
    _secrets: tuple[str, ...]
    _tuning: Tuning
    _rng: random.Random
    _listener: threading.local
    on_retry: Callable[[str, int], None] | None

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def _error(self, op: str, key: str, exc: BaseException) -> StorageError:
        text = f"{self.url}/{key}: {op} failed: {self._describe(exc)}"
        if op in WRITE_OPS and isinstance(exc, Refused) and exc.is_access_denied:
            # read-only credentials (a training job's role, often): exit 9, not 10
            return NotWritableError(f"{text} (these credentials may not write the store)")
        return StorageError(text)

    def _describe(self, exc: BaseException) -> str:
        if isinstance(exc, Refused):
            exc = exc.error
        response = getattr(exc, "response", None)
        if isinstance(response, Mapping):
            err = response.get("Error", {})
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", "?")
            code = str(err.get("Code", "?"))
            if status == 403 and code in ("403", "?"):
                # a HEAD's reply has no body, so no reason: say what a 403 there means
                text = ("AccessDenied (HTTP 403, no reason given in a HEAD's reply): the "
                        "credentials are wrong, expired, or may not read this bucket")
            else:
                text = f"{code} (HTTP {status}): {err.get('Message', '')}"
        else:
            text = f"{type(exc).__name__}: {exc}"
        return self._scrub(text.strip())

    def _retry(
        self,
        op: str,
        key: str,
        call: Callable[[], T],
        *,
        since: float | None = None,
        request: str | None = None,
    ) -> T:
        """Run ``call``, retrying transient failures with exponential backoff, full jitter.

        Raises ``Refused`` for a final answer of the server, and ``StorageError`` naming
        the object once attempts or the deadline run out, or for any other failure. The
        deadline counts from ``since`` (on :meth:`_clock`) when given: a request made
        within a longer run of attempts (a streamed read resuming) shares that run's.
        Each attempt that is retried is told to :attr:`on_retry` as a ``request`` (by
        default the class ``op`` is billed as).
        """
        start = self._clock() if since is None else since
        attempt = 0
        while True:
            attempt += 1
            try:
                return call()
            except ClientError as exc:
                if not is_transient(exc):
                    raise Refused(exc, attempt) from exc
                last: Exception = exc
            except TRANSPORT_ERRORS as exc:
                last = exc
            except (BotoCoreError, OSError) as exc:
                raise self._error(op, key, exc) from exc
            self._wait_to_retry(op, key, attempt, start, last)
            self._count_retry(request or REQUEST_CLASS.get(op, "get"), last)

    @contextlib.contextmanager
    def retries_to(self, listener: Callable[[str, int], None] | None) -> Iterator[None]:
        """Within this block, this thread's retried attempts are told to ``listener``.

        For a meter that counts its own calls (``CountingStore``): another meter on the
        same store, in another thread, keeps its own.
        """
        local = getattr(self, "_listener", None)
        if local is None:  # a store pickled by an older release
            local = self._listener = threading.local()
        before = getattr(local, "fn", None)
        local.fn = listener
        try:
            yield
        finally:
            local.fn = before

    def _count_retry(self, request: str, failed: Exception) -> None:
        """Tell the thread's listener, else :attr:`on_retry`, of a failed attempt.

        Never fails the read for it.
        """
        if never_sent(failed):  # a refused connect: nothing reached the server
            return
        local = getattr(self, "_listener", None)
        hook = getattr(local, "fn", None) if local is not None else None
        if hook is None:
            hook = getattr(self, "on_retry", None)  # a store pickled by an older release
        if hook is not None:
            with contextlib.suppress(Exception):
                hook(request, int(getattr(failed, "received_bytes", 0) or 0))

    def _wait_to_retry(
        self,
        op: str,
        key: str,
        attempt: int,
        start: float,
        last: Exception,
        where: str = "",
        *,
        tries: int | None = None,
    ) -> None:
        """Sleep before retry ``attempt`` (from 1) of a run that began at ``start``, or give up.

        Raises ``StorageError`` naming the object and the last error once ``max_attempts``
        attempts are made, or when the backoff would end past ``retry_deadline_s`` from
        ``start``. ``where`` is added after the attempts (a streamed read's position);
        ``tries``, the attempts the message counts, is ``attempt`` unless given (a streamed
        read counts only the failures that made no progress against ``max_attempts``).
        """
        tuning = self._tuning
        shown = attempt if tries is None else tries
        if attempt >= tuning.max_attempts:
            raise StorageError(
                f"{self.url}/{key}: {op} failed after {shown} attempts{where}: "
                f"{self._describe(last)}"
            ) from last
        delay = self._backoff_s(attempt)
        elapsed = self._clock() - start
        if elapsed + delay > tuning.retry_deadline_s:
            raise StorageError(
                f"{self.url}/{key}: {op} failed after {shown} attempts{where} in "
                f"{elapsed:.1f} s (retry deadline {tuning.retry_deadline_s} s reached): "
                f"{self._describe(last)}"
            ) from last
        self._sleep(delay)

    # The clock of the retry deadline and the backoff's sleep: seams for tests.
    def _clock(self) -> float:
        return time.monotonic()

    def _sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def _backoff_s(self, attempt: int) -> float:
        """The sleep before retry ``attempt`` (from 1): full jitter, exponential, capped."""
        tuning = self._tuning
        return self._rng.uniform(
            0.0, min(tuning.backoff_max_s, tuning.backoff_base_s * 2 ** (attempt - 1))
        )
