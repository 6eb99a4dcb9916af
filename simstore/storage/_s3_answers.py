"""What the S3 server's final answers mean: a refusal, a precondition, a denied write.

:class:`Refused` wraps an answer that retrying cannot change, and tells a precondition, a
missing key or a write refused for want of permission (read-only credentials) apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["WRITE_OPS", "Refused", "conflict_message"]

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

    @property
    def is_access_denied(self) -> bool:
        """403 AccessDenied (or its bucket-wide kin): these credentials may not do this."""
        return self.code in ("AccessDenied", "AllAccessDisabled") or (
            not self.code and self.status == 403)


WRITE_OPS = frozenset(
    {"write", "upload", "refresh", "compare-and-swap", "delete", "probe", "abort upload"}
)
"""The ``_retry`` operations that write: refused with 403 AccessDenied, NotWritableError."""


def conflict_message(url: str, key: str, expected: str | None, exc: Refused) -> str:
    """The text of a conditional write refused because the object was not as expected."""
    found = "present" if expected is None else "a different version, or none"
    text = (
        f"{url}/{key} changed concurrently (expected version {expected or 'absent'}, found {found})"
    )
    if exc.attempts > 1:
        text += (
            f"; the request was sent {exc.attempts} times and an earlier attempt may have "
            "landed: re-read the ref"
        )
    return text
