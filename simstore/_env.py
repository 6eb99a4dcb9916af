"""Settings read from the environment, and what the process may run on."""

from __future__ import annotations

import os

_FALSE = frozenset({"", "0", "false", "no", "off"})


def env_debug() -> bool:
    """Whether ``SIMSTORE_DEBUG`` turns debug on (tracebacks, dask's own logs).

    Any value but ``0``, ``false``, ``no``, ``off`` (any case, blanks around ignored) or
    an empty one is on; unset is off.
    """
    return os.environ.get("SIMSTORE_DEBUG", "").strip().lower() not in _FALSE


def usable_cores() -> int:
    """CPUs this process may run on (its affinity where the platform says, else all)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def is_utf8(encoding: str | None) -> bool:
    """Whether ``encoding`` (a stream's, the file system's) names UTF-8 (``UTF-8``, ``utf8``)."""
    return (encoding or "").lower().replace("-", "") == "utf8"


WORKING_FOLDER_GONE = "the working directory no longer exists (deleted?): cd to one that does"
"""What the command line says, in one line, when started in a folder that was deleted."""


def working_folder_exists() -> bool:
    """Whether the working folder is still there (relative paths mean nothing otherwise)."""
    try:
        os.getcwd()
    except FileNotFoundError:
        return False
    return True
