"""What the S3 server's final answers mean: a refusal, a precondition, a denied write.

:class:`Refused` wraps an answer that retrying cannot change; :func:`access_denied` tells
a write refused for want of permission (read-only credentials) from other failures.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["WRITE_OPS", "Refused", "access_denied"]

_PRECONDITION_CODES = frozenset({"PreconditionFailed", "ConditionalRequestConflict"})


class Refused(Exception):
    """The server refused a request for a reason retrying cannot fix."""

    def __init__(self, error: Exception, attempts: int) -> None:
        super().__init__(str(error))
        self.error = error
        self.attempts = attempts
        response: Mapping[str, Any] = getattr(error, "response", None) or {}
        self.code = str(response.get("Error", {}).get("Code", ""))
        self.status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)

    @property
    def is_not_found(self) -> bool:
        """No such key (HEAD answers a bare 404); not a missing bucket."""
        return self.code in ("NoSuchKey", "NotFound", "404")

    @property
    def is_precondition(self) -> bool:
        """412 (a condition did not hold) or 409 (a concurrent conditional write won)."""
        return self.status in (409, 412) or self.code in _PRECONDITION_CODES

    @property
    def is_not_implemented(self) -> bool:
        """The server does not implement what was asked (e.g. a conditional header)."""
        return self.status == 501 or self.code == "NotImplemented"


WRITE_OPS = frozenset(
    {"write", "upload", "refresh", "compare-and-swap", "delete", "probe", "abort upload"}
)
"""The ``_retry`` operations that write: refused with 403 AccessDenied, NotWritableError."""


def access_denied(exc: BaseException) -> bool:
    """Whether the server's final answer was 403 AccessDenied (or its bucket-wide kin)."""
    if isinstance(exc, Refused):
        exc = exc.error
    response = getattr(exc, "response", None)
    if not isinstance(response, Mapping):
        return False
    code = response.get("Error", {}).get("Code")
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code in ("AccessDenied", "AllAccessDisabled") or (code is None and status == 403)
