"""Scratch folders that say whether their owner lives: ingest builds shards in them.

A scratch folder ``simstore-ingest-XXXX`` holds a marker file, ``.owner``, that its
process keeps open under an exclusive ``flock`` for the folder's whole life (and writes
its pid and host into, for people). The kernel drops the lock when the process dies,
SIGKILL included, so a later process tells a killed ingest's folder from a live one by
trying the lock: taken, the owner is dead and the folder is garbage (a half-written shard
nothing reuses); refused, it is in use and left alone. No pid is compared, so a reused
pid never makes a dead folder look alive, nor a live one dead.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import functools
import os
import secrets
import shutil
import socket
import tempfile
import threading
import time
import weakref

__all__ = ["SCRATCH_PREFIX", "Scratch", "scratch_in_use", "sweep_scratch"]

SCRATCH_PREFIX = "simstore-ingest-"
OWNER_FILE = ".owner"
PENDING_OWNER_FILE = OWNER_FILE + ".new"
"""The marker while its process writes it (locked, then renamed to :data:`OWNER_FILE`)."""
UNMARKED_GRACE_S = 24 * 3600.0
"""A folder without a marker (made by a version before markers, or one being created this
instant) is removed by an ingest's sweep only when nothing in it changed for this long."""
STILLBORN_GRACE_S = 60.0
"""An empty folder without a marker (its process killed between making it and marking it,
microseconds apart) is removed once it is this old: it holds nothing to keep."""


class Scratch:
    """A fresh scratch folder under ``parent`` (the system temp dir when None), locked.

    Raises OSError when it cannot be created. :meth:`remove` deletes it and drops the lock
    (in that order, so no sweep sees it unlocked while it still exists).

    A folder is never left behind by its own process: an exception at any point of its
    making (Ctrl-C, or SIGTERM raised as one by the command line, between any two steps)
    removes it; a ``Scratch`` dropped without :meth:`remove` removes its folder when it
    is collected; and one still held when the interpreter exits, at exit. A process
    killed outright leaves one for the next sweep, as does a fork or forkserver
    multiprocessing child that leaves through ``os._exit`` (no exit functions run there).
    """

    def __init__(self, parent: str | None = None) -> None:
        where = tempfile.gettempdir() if parent is None else parent
        self._fd: int | None = None
        self._pid = os.getpid()
        self.path = ""
        with _HELD_LOCK:  # before the folder exists: from its making on, exit removes it
            _HELD.add(self)
        _remove_at_exit()
        try:
            for _ in range(_NAME_TRIES):
                # named before it is made, so an interrupt just after the mkdir finds it
                self.path = os.path.join(where, SCRATCH_PREFIX + secrets.token_hex(6))
                try:
                    os.mkdir(self.path, 0o700)
                except FileExistsError:
                    self.path = ""  # another's
                    continue
                break
            else:
                raise FileExistsError(f"{where}: no free scratch folder name in "
                                      f"{_NAME_TRIES} tries")
            # locked before it takes its name: a sweep never finds the marker unlocked
            pending = os.path.join(self.path, PENDING_OWNER_FILE)
            self._fd = os.open(pending, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                               0o644)
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a fresh file: always free
            os.write(self._fd, f"pid {os.getpid()} host {socket.gethostname()}\n".encode())
            os.rename(pending, os.path.join(self.path, OWNER_FILE))
        except BaseException:
            self.remove()
            raise

    def remove(self) -> None:
        """Delete the folder and let go of its lock; again, nothing.

        In a forked child, a copy only closes its descriptor: the folder is the parent's,
        and the lock (shared by the descriptors of both) stays the parent's alone.
        """
        if os.getpid() == self._pid:
            with _HELD_LOCK:
                _HELD.discard(self)
            path, self.path = self.path, ""
            if path:
                shutil.rmtree(path, ignore_errors=True)
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __del__(self) -> None:  # dropped without finishing (an interrupted run)
        try:
            self.remove()
        except Exception:  # at interpreter shutdown the modules it calls may be gone
            pass


_NAME_TRIES = 100

_HELD: weakref.WeakSet[Scratch] = weakref.WeakSet()
"""The scratch folders this process made and has not removed (forked children inherit
the set, and leave its folders alone: :meth:`Scratch.remove` checks the pid)."""
_HELD_LOCK = threading.Lock()
"""Taken to change :data:`_HELD` or copy it (threads make folders while exit runs)."""


@functools.cache
def _remove_at_exit() -> None:
    """Remove, at interpreter exit, every scratch folder this process still holds."""
    def remove_held() -> None:
        with _HELD_LOCK:
            held = list(_HELD)
        for scratch in held:
            scratch.remove()

    atexit.register(remove_held)


def scratch_in_use(path: str) -> bool | None:
    """Whether a live process holds the scratch folder ``path``; None without a marker.

    Takes the owner's lock for a moment when it is free (so two sweeps never both see a
    folder as dead) and gives it back.
    """
    return _locked(os.path.join(path, OWNER_FILE))


def _locked(marker: str) -> bool | None:
    """Whether a live process holds the lock of the file ``marker``; None if it is missing.

    A file that cannot be opened or locked counts as held: never removed on a guess.
    """
    try:
        fd = os.open(marker, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError:
        return True  # unreadable: not ours to judge
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True  # held (BlockingIOError), or a filesystem without locks
    finally:
        os.close(fd)
    return False


def newest_mtime(path: str) -> float:
    """Latest modification time of a file, or of anything inside a directory (itself too)."""
    newest = os.lstat(path).st_mtime
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                newest = max(newest, os.lstat(os.path.join(dirpath, name)).st_mtime)
        with contextlib.suppress(OSError):
            newest = max(newest, os.lstat(dirpath).st_mtime)
    return newest


def sweep_scratch(
    parent: str | None = None, *, unmarked_before: float | None = None, dry_run: bool = False
) -> list[str]:
    """Remove the scratch folders under ``parent`` whose owner died; the paths removed.

    ``parent``: the system temp dir when None. A folder whose owner lives is kept; one
    without a marker only when something in it changed after ``unmarked_before`` (epoch
    seconds; :data:`UNMARKED_GRACE_S` ago when None). ``dry_run``: list, remove nothing.
    Never raises: a folder that cannot be read or removed is skipped.
    """
    parent = parent if parent is not None else tempfile.gettempdir()
    cutoff = time.time() - UNMARKED_GRACE_S if unmarked_before is None else unmarked_before
    try:
        entries = [e for e in os.scandir(parent) if e.name.startswith(SCRATCH_PREFIX)]
    except OSError:
        return []
    removed = []
    for entry in sorted(entries, key=lambda e: e.name):
        try:
            if not entry.is_dir(follow_symlinks=False):
                continue
            in_use = scratch_in_use(entry.path)
            if in_use:
                continue
            if in_use is None:
                newest = newest_mtime(entry.path)
                if newest >= cutoff and not _stillborn(entry.path, newest):
                    continue
        except OSError:
            continue
        if not dry_run:
            shutil.rmtree(entry.path, ignore_errors=True)
            if os.path.lexists(entry.path):
                continue
        removed.append(entry.path)
    return removed


def _stillborn(path: str, newest: float) -> bool:
    """Whether ``path`` is a scratch folder whose process died as it was being made.

    Nothing in it but, at most, the marker it was writing (``.owner.new``, unlocked), and
    nothing changed for :data:`STILLBORN_GRACE_S` (``newest``: its latest change, as
    ``newest_mtime`` found it): a live process locks that file the moment it creates it
    and renames it at once.
    """
    if time.time() - newest < STILLBORN_GRACE_S:
        return False
    try:
        names = os.listdir(path)
    except OSError:
        return False
    if set(names) - {PENDING_OWNER_FILE}:
        return False
    # listed and now gone: renamed by a live owner, keep it
    return not names or _locked(os.path.join(path, PENDING_OWNER_FILE)) is False
