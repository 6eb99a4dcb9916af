"""Names of datasets, branches and tags, and the REF grammar. Pure.

A name is 1 to 200 characters of ``A-Z a-z 0-9 . _ -`` that does not start with ``.``
or ``-``. That rules out ``..``, ``/``, NUL and every other control character, so a name
can never reach outside the store's root when it becomes part of a key.

A REF is ``NAME`` (meaning ``NAME@main``) or ``NAME@REV`` where REV is a branch, a tag or
a snapshot id or unique prefix of one (at least 4 hex characters). A full snapshot id (32
hex characters) always names that snapshot: no branch or tag may take such a name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from simstore.errors import InvalidInputError

__all__ = ["DEFAULT_BRANCH", "MAX_NAME_LEN", "Ref", "check_name", "check_ref_name", "parse_ref"]

DEFAULT_BRANCH = "main"
MAX_NAME_LEN = 200
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")


def check_name(name: str, what: str = "name") -> str:
    """Return ``name`` if valid, else raise :class:`InvalidInputError` saying why.

    ``what`` names the thing in the message ("dataset name", "branch name", ...).
    """
    if not isinstance(name, str):
        raise InvalidInputError(f"invalid {what} {name!r}: must be a string")
    if not name:
        raise InvalidInputError(f"invalid {what} {name!r}: must not be empty")
    if len(name) > MAX_NAME_LEN:
        raise InvalidInputError(
            f"invalid {what} {name[:40]!r}...: {len(name)} characters, at most {MAX_NAME_LEN}"
        )
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise InvalidInputError(f"invalid {what} {name!r}: contains a control character")
    if not _NAME_RE.match(name) or ".." in name:
        raise InvalidInputError(
            f"invalid {what} {name!r}: use letters, digits, '.', '_' and '-' "
            "(no '/', '..', '@' or spaces; must not start with '.' or '-')"
        )
    return name


_FULL_ID_RE = re.compile(r"^[0-9A-Fa-f]{32}\Z")


def check_ref_name(name: str, what: str = "branch name") -> str:
    """:func:`check_name` for a branch or tag to be written: not 32 hex characters either.

    A REF whose revision is a full snapshot id names that snapshot before any branch or
    tag, so no branch or tag may take such a name.
    """
    check_name(name, what)
    if _FULL_ID_RE.match(name):
        raise InvalidInputError(
            f"invalid {what} {name!r}: 32 hex characters read as a snapshot id"
        )
    return name


@dataclass(frozen=True, slots=True, kw_only=True)
class Ref:
    """A parsed REF: a dataset and a revision (branch, tag or snapshot id prefix)."""

    dataset: str
    rev: str = DEFAULT_BRANCH

    @property
    def full_id(self) -> str | None:
        """The snapshot id the revision spells out in full (lower case), else None.

        Such a revision names that snapshot before any branch or tag (none may take such
        a name: :func:`check_ref_name`).
        """
        return self.rev.lower() if _FULL_ID_RE.match(self.rev) else None

    def __str__(self) -> str:
        return f"{self.dataset}@{self.rev}"


def parse_ref(text: str) -> Ref:
    """Parse ``NAME`` or ``NAME@REV``; raise :class:`InvalidInputError` when malformed."""
    if not isinstance(text, str) or not text:
        raise InvalidInputError(
            f"invalid ref {text!r}: expected NAME or NAME@BRANCH|TAG|SNAPSHOT as a string"
        )
    dataset, sep, rev = text.partition("@")
    check_name(dataset, "dataset name")
    if not sep:
        return Ref(dataset=dataset)
    check_name(rev, f"revision in ref {text!r}")
    return Ref(dataset=dataset, rev=rev)
