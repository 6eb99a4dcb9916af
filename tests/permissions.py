"""Taking write access away for real, as root or not, for tests of unwritable stores.

Root writes anywhere whatever the modes, so as root the code under test runs in a forked
child that drops to an unprivileged user; otherwise the folder is made read-only by
``chmod`` and the code runs in this process.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator

NOBODY = 65534


def _outcome(fn: Callable[[], object]) -> tuple[str, str]:
    try:
        fn()
    except Exception as exc:  # the one outcome the test looks at, whatever it is
        return type(exc).__name__, str(exc)
    return "", ""


_CAP_DAC_READ_SEARCH = 2
_PR_SET_KEEPCAPS = 8
_CAPABILITY_V3 = 0x20080522


def _read_anywhere() -> None:
    """Keep, as the unprivileged user, the right to read (never write) any file.

    A user reads the software installed for it; a clone in a folder only its owner may
    enter (as ``mktemp -d`` makes) would hide the virtual environment, and every module
    not yet imported, from the child. ``CAP_DAC_READ_SEARCH`` passes read and search
    checks only: writes are refused as for any other user. Called after ``setuid`` with
    the capabilities kept (``PR_SET_KEEPCAPS``); where the kernel refuses, nothing changes.
    """
    import ctypes

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    bit = 1 << _CAP_DAC_READ_SEARCH
    data = (Data * 2)(Data(bit, bit, 0), Data(0, 0, 0))
    ctypes.CDLL(None, use_errno=True).capset(ctypes.byref(Header(_CAPABILITY_V3, 0)), data)


def _child(fn: Callable[[], object], before: Callable[[], object] | None, q) -> None:
    if before is not None:
        before()  # still root
    import ctypes

    ctypes.CDLL(None).prctl(_PR_SET_KEEPCAPS, 1, 0, 0, 0)
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)
    _read_anywhere()
    q.put(_outcome(fn))


def without_write_access(
    folder: str, fn: Callable[[], object], before: Callable[[], object] | None = None
) -> tuple[str, str]:
    """``fn()``'s error (type name, text) where ``folder`` may be read but not written."""
    for root, dirs, files in os.walk(folder):
        for name in [root, *(os.path.join(root, d) for d in dirs)]:
            os.chmod(name, 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o644)
    if os.geteuid() != 0:
        if before is not None:
            before()
        for root, _, files in os.walk(folder, topdown=False):
            for name in files:
                os.chmod(os.path.join(root, name), stat.S_IRUSR)
            os.chmod(root, stat.S_IRUSR | stat.S_IXUSR)
        try:
            return _outcome(fn)
        finally:
            for root, _, files in os.walk(folder):
                os.chmod(root, 0o755)
                for name in files:
                    os.chmod(os.path.join(root, name), 0o644)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(fn, before, q))
    p.start()
    try:
        return q.get(timeout=120)
    finally:
        p.join(timeout=30)


@contextlib.contextmanager
def traversable_folder() -> Iterator[str]:
    """A new folder any user may traverse (pytest's own are the owner's alone)."""
    d = tempfile.mkdtemp(prefix="simstore-ro-")
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        for root, _, _ in os.walk(d):
            os.chmod(root, 0o755)
        shutil.rmtree(d)
