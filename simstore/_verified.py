"""Whole-shard hash matches remembered on this node, so that a new job need not hash again.

A loader with ``verify=True`` hashes each shard file it reads (a local store's file, or a
cache copy) once and, within the job, trusts the same file afterwards while its stamp
(:func:`stamp_info`) is unchanged. :class:`NodeRecords` carries that across jobs (for a
local store's files and cache copies alike), and from ``simstore verify --deep`` of a
local store to the jobs after it: a match is recorded as an empty file named by the
shard id and the stamp, whose modification time is when the hash matched. A later job
on the node trusts a file whose stamp has a record younger than ``verify_every_s`` and
hashes it otherwise (then refreshes the record). A file written,
replaced, truncated or touched since has another stamp, so its record does not apply;
what no stamp sees is a disk that damages a file without writing to it, which the age
limit bounds and ``simstore verify --deep`` finds (and then forgets the shard's records).

Records are only written for files whose last change is at least :data:`SETTLED_S` old
at the time their stamp was taken: file times come from a coarse clock, so a write in
the same tick as the stamp could leave the stamp unchanged.

The records' folder must belong to the user and be writable by nobody else (a record
skips a check); a folder that is not is not used, and nothing is remembered.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import struct
import time
from dataclasses import dataclass, field

import xxhash

__all__ = [
    "DEFAULT_VERIFY_EVERY_S",
    "NodeRecords",
    "SETTLED_S",
    "node_records",
    "private_folder",
    "records_dir",
    "stamp_info",
]

DEFAULT_VERIFY_EVERY_S = 86_400.0
"""How long a recorded match is trusted by later jobs on the node (a day)."""

SETTLED_S = 2.0
"""A file changed less than this long before its stamp was taken is not recorded."""

ENV_DIR = "SIMSTORE_VERIFIED_DIR"

_MASK63 = (1 << 63) - 1


def stamp_info(path: str | int) -> tuple[int, int] | None:
    """``(stamp, last change in ns)`` of a file, or None if it cannot be read.

    The stamp is a 63-bit digest of the file's device, inode, size, and modification and
    change times: a file rewritten, replaced or touched gets another (the change time
    cannot be set back by a user), and so does a file replaced by another that got the
    same inode number. A loader's cache copies qualify as a store's files do: the cache
    keeps its LRU clock beside them, never in them, so a copy's times stay its fill's.
    ``path`` may be an open descriptor: the stamp of the file it holds.
    """
    try:
        st = os.fstat(path) if isinstance(path, int) else os.stat(path)
    except OSError:
        return None
    ctime = st.st_ctime_ns
    # the last 0 is where versions before marked cache copies: older records stay valid
    packed = struct.pack("<6q", st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, ctime, 0)
    return xxhash.xxh3_64_intdigest(packed) & _MASK63, max(st.st_mtime_ns, ctime)


def records_dir() -> str | None:
    """Where this user's records live, or None for nowhere.

    ``$SIMSTORE_VERIFIED_DIR`` (set empty: nowhere), else
    ``$XDG_CACHE_HOME/simstore/verified`` (an absolute path; a relative one is ignored, as
    the XDG specification says), else ``~/.cache/simstore/verified``; nowhere when the
    home folder is not an existing absolute folder (it is never created).
    """
    explicit = os.environ.get(ENV_DIR)
    if explicit is not None:
        return os.path.abspath(explicit) if explicit.strip() else None
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        home = os.path.expanduser("~")
        if not os.path.isabs(home) or os.path.normpath(home) == os.sep or not os.path.isdir(home):
            return None
        base = os.path.join(home, ".cache")
    return os.path.join(base, "simstore", "verified")


def private_folder(path: str, unused: str) -> bool:
    """Whether ``path`` is this user's folder that nobody else can write (made if missing).

    Never on a system without file owners. Where it is not, says so in the
    ``simstore.loaders`` log: ``unused`` (what goes without it), the folder and why.
    """
    why = ""
    if not hasattr(os, "getuid"):
        why = "no file owners to check on this system"
    else:
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
            st = os.stat(path)
        except OSError as exc:
            why = str(exc)
        else:
            if not (stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()
                    and not st.st_mode & 0o022):
                why = "not a folder of this user's that only it can write"
    if why:
        logging.getLogger("simstore.loaders").warning("%s: %s: %s", unused, path, why)
    return not why


def node_records(verify: bool, verify_every_s: float) -> NodeRecords | None:
    """The records a dataset uses: none without ``verify`` or with ``verify_every_s=0``."""
    root = records_dir() if verify and verify_every_s > 0 else None
    return NodeRecords(root, verify_every_s) if root is not None else None


@dataclass
class NodeRecords:
    """One user's records of shard files whose whole-object hash matched on this node."""

    root: str
    max_age_s: float
    _usable: bool | None = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict[str, object]:
        # a DataLoader worker looks at the folder itself
        return {"root": self.root, "max_age_s": self.max_age_s, "_usable": None}

    def _path(self, shard_id: str, stamp: int) -> str:
        return os.path.join(self.root, shard_id[:2], f"{shard_id}-{stamp:016x}")

    def usable(self) -> bool:
        """Whether the folder is this user's and writable by nobody else (or can be made).

        Looked at once per process; a folder that is not usable is said once, in the
        ``simstore.loaders`` log (then every job hashes every shard it reads).
        """
        if self._usable is None:
            self._usable = private_folder(self.root, "shard hash records not used")
        return self._usable

    def has(self, shard_id: str, stamp: int) -> bool:
        """Whether the file with this stamp hashed to ``shard_id`` within ``max_age_s``."""
        if not self.usable():
            return False
        try:
            st = os.stat(self._path(shard_id, stamp))
        except OSError:
            return False
        # a record from the future (the clock went back) is not trusted either
        return 0.0 <= time.time() - st.st_mtime < self.max_age_s

    def add(self, shard_id: str, stamp: int, changed_ns: int, stamped_ns: int) -> bool:
        """Record that the file with this stamp hashed to ``shard_id`` (now).

        ``changed_ns``: the file's last change (the later of its modification and change
        times) and ``stamped_ns``: when the stamp was taken (``time.time_ns()``). A
        failure to write (a full or read-only disk) leaves nothing recorded: the next job
        hashes. Returns whether a record was written.
        """
        if stamped_ns - changed_ns < SETTLED_S * 1e9 or not self.usable():
            return False
        path = self._path(shard_id, stamp)
        try:
            # the folder again (deleted meanwhile): made private whatever the umask
            for folder in (self.root, os.path.dirname(path)):
                if not os.path.isdir(folder):
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(folder, 0o700)
                    os.chmod(folder, 0o700)
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
            os.utime(path)  # an existing record: its age starts again
        except OSError:
            return False
        return True

    def forget(self, shard_id: str) -> int:
        """Remove every record of ``shard_id`` (its file was found damaged); how many."""
        folder = os.path.join(self.root, shard_id[:2])
        try:
            names = [n for n in os.listdir(folder) if n.startswith(shard_id + "-")]
        except OSError:
            return 0
        gone = 0
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(folder, name))
                gone += 1
        return gone
