"""The one exception tree of simstore.

Errors are grouped by what the caller does about them::

    SimstoreError                      code  exit
    ├── NotFoundError (LookupError)       1     3   snapshot, ref, object, sample key
    ├── AlreadyExistsError                2     4   tag or object that must not be overwritten
    ├── ConflictError                     3     5   lost a compare-and-swap; caller may retry
    ├── IntegrityError                    4     6   hash mismatch; names the object and snapshots
    ├── FormatError                       5     7   unreadable or unsupported on-storage data
    ├── SourceError                       6     8   bad input file at ingest; names file and why
    ├── InvalidInputError (ValueError)    7     2   bad argument
    ├── ReadOnlyError                     8     9   a write through a store opened read-only
    │   └── NotWritableError             11     9   a write the file system or S3 refused
    │                                                (also a StorageError)
    └── StorageError                      9    10   backend failure, original exception chained

Every error pickles (DataLoader workers re-raise them in the parent), carries a stable,
append-only ``code`` and the CLI maps each class to its ``exit_code``.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from typing import Any

__all__ = [
    "AlreadyExistsError",
    "ConflictError",
    "FormatError",
    "IntegrityError",
    "InvalidInputError",
    "NotFoundError",
    "NotWritableError",
    "ReadOnlyError",
    "SimstoreError",
    "SourceError",
    "StorageError",
    "UnsupportedFormatError",
]


class SimstoreError(Exception):
    """Root of every error simstore raises on purpose."""

    code: int = 0
    exit_code: int = 1

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __reduce__(self) -> tuple[type[SimstoreError], tuple[str]]:
        return (type(self), (self.message,))

    def __str__(self) -> str:
        return self.message


class NotFoundError(SimstoreError, LookupError):
    """A snapshot, ref, object, dataset or sample key does not exist."""

    code = 1
    exit_code = 3


class AlreadyExistsError(SimstoreError):
    """A tag, dataset or object that must not be overwritten already exists."""

    code = 2
    exit_code = 4


class ConflictError(SimstoreError):
    """A compare-and-swap lost against a concurrent writer; the caller may retry."""

    code = 3
    exit_code = 5


class IntegrityError(SimstoreError):
    """Stored bytes do not hash to their name; the message names the object."""

    code = 4
    exit_code = 6


class FormatError(SimstoreError):
    """On-storage data is unreadable, or of an unsupported format version."""

    code = 5
    exit_code = 7


class UnsupportedFormatError(FormatError):
    """On-storage data of a later format version than this simstore reads.

    Written by a newer simstore; not damage: ``on_corrupt="skip"`` raises it, skips nothing.
    The CLI exits with ``FormatError``'s status.
    """

    code = 10


def version_error(what: str, found: Any, reads: int) -> FormatError:
    """The error for ``what`` (``"<name> has shard"``) of format_version ``found``.

    This simstore reads version ``reads``: a later one is an :class:`UnsupportedFormatError`,
    anything else (no version, an earlier one, not a number) a plain :class:`FormatError`.
    """
    text = f"{what} format_version {found!r}, this simstore reads {reads}"
    if isinstance(found, int) and not isinstance(found, bool) and found > reads:
        return UnsupportedFormatError(f"{text}: written by a newer simstore, upgrade to read it")
    return FormatError(text)


class SourceError(SimstoreError):
    """A source file given to ingest is bad; the message names the file and what is wrong."""

    code = 6
    exit_code = 8


class InvalidInputError(SimstoreError, ValueError):
    """An argument is invalid: a name, a ref, an option value."""

    code = 7
    exit_code = 2


class ReadOnlyError(SimstoreError):
    """A write was attempted through a read-only store."""

    code = 8
    exit_code = 9


class StorageError(SimstoreError):
    """The storage backend failed; the original exception is chained."""

    code = 9
    exit_code = 10


def write_refused(exc: OSError) -> bool:
    """Whether the file system refused a write for want of permission.

    A read-only mount, another user's files: what a local write raises
    :class:`NotWritableError` for.
    """
    return exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM)


_EXHAUSTED = {errno.EMFILE: "this process's open files (ulimit -n)",
              errno.ENFILE: "the system's open files", errno.ENOMEM: "memory"}
_WORDS = {errno.EMFILE: "too many open files", errno.ENFILE: "too many open files in system",
          errno.ENOMEM: "cannot allocate memory"}
"""The C library's words for each (``strerror``), as libraries put them in messages."""


def exhausted(exc: BaseException) -> str | None:
    """What the process ran out of, if ``exc`` or one of its causes says so, else None.

    Out of descriptors or memory is the process's limit, not a bad source file: found by
    errno along the explicit causes (``raise ... from``), or in the text of a library's
    own ``OSError`` as its number with the system's words for it (h5py's ``errno = 24,
    error message = 'Too many open files'``, pyarrow's ``[Errno 24] Too many open
    files``). h5py takes its errno from the first ``errno = N`` of a message that names
    the file, so where its message is there only the number with the words counts: a
    file named ``run errno = 24, v2.h5`` is not a limit. Never read in simstore's own
    messages, which name paths.
    """
    for current in causes(exc):
        if isinstance(current, OSError) and not isinstance(current, SimstoreError):
            text = str(current).lower()
            worded = [what for number, what in _EXHAUSTED.items()
                      if any(f.format(n=number, words=_WORDS[number]) in text
                             for f in ("errno = {n}, error message = '{words}'",
                                       "[errno {n}] {words}"))]
            if worded:
                return worded[0]
            if current.errno in _EXHAUSTED and "errno = " not in text:
                return _EXHAUSTED[current.errno]
    return None


def causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and its explicit causes (``raise ... from``), each once, nearest first.

    Not the implicit context: an error handled on the way (``raise X from None``) is not
    what this one is about.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__


class NotWritableError(ReadOnlyError, StorageError):
    """The file system refused a write to the store: a read-only mount, no permission.

    A :class:`ReadOnlyError` (exit 9: the store is readable, this process may not write
    it) that is still a :class:`StorageError`, as the backend's other failures are.
    """

    code = 11


_LINE_BREAKS = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\"}


def one_line(text: str, *, exact: bool = False) -> str:
    r"""``text`` on one line: control characters and line separators as escapes.

    A newline in a path (a file named ``a\nb.npz``) is shown as ``\n``, not broken over
    two lines nor turned into a space (which named ``a b.npz``, another file); a
    library's multi-line message comes out with its breaks as ``\n`` too. A text that
    needs escapes has its backslashes doubled as well (as ``repr`` does), so a file
    named with a backslash and an ``n`` is not taken for one with a newline; a text
    that needs none is returned as it is. With ``exact``, a text holding a backslash is
    escaped too, so no two texts come out alike, as a listing of names needs: a name of
    a backslash and an ``n`` comes out as ``a\\nb``, one with a newline as ``a\nb``.
    """
    if text.isprintable() and not (exact and "\\" in text):
        return text
    out = []
    for ch in text:
        if ch in _LINE_BREAKS:
            out.append(_LINE_BREAKS[ch])
        elif ch.isprintable() or ch == " ":
            out.append(ch)
        else:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else
                       f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    return "".join(out)
