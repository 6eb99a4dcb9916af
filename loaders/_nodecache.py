"""A node-local folder of entries named by the content hash of what they were made from.

What a loader derives from an immutable object (a manifest part's decoded rows, a shard's
page layout) is itself immutable, so a later job on the node may load it instead of
deriving it again. :class:`NodeCache` keeps such entries, one file each, in a private
folder beside the shard hash records (see ``simstore._verified``), under a byte limit.

Safe with several processes and jobs at once: an entry is written to a temporary name
and renamed into place, a reader checks what it reads (each kind of entry carries its
own checksum), and eviction only removes entries (a reader that opened one before keeps
its bytes). Used only where the folder is this user's and writable by nobody else: an
entry decides which bytes are read.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import stat
import threading
import time
from typing import Any, ClassVar

__all__ = ["DEFAULT_LAYOUT_CACHE_BYTES", "LayoutCache", "NodeCache", "layout_cache"]

_log = logging.getLogger("simstore.loaders")

_RESCAN_FRACTION = 8
"""The folder is scanned for eviction about once per limit / this many bytes written."""

_draw = random.random

_STALE_TEMP_S = 3600.0
"""A temporary file this old was left by a writer that died: eviction removes it."""


class NodeCache:
    """Entries ``<name><suffix>`` in ``root``, evicted used-longest-ago past ``limit_bytes``."""

    suffix: ClassVar[str] = ".entry"
    unused: ClassVar[str] = "node cache not used"
    """What the log says, once, when the folder is not private."""

    def __init__(self, root: str, limit_bytes: int) -> None:
        self.root = root
        self.limit_bytes = limit_bytes
        self._usable: bool | None = None
        self._written = 0  # bytes this process wrote since its last scan
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        # a DataLoader worker looks at the folder itself
        return {"root": self.root, "limit_bytes": self.limit_bytes}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["root"], state["limit_bytes"])  # type: ignore[misc]

    def _path(self, name: str) -> str:
        return os.path.join(self.root, f"{name}{self.suffix}")

    def usable(self) -> bool:
        """Whether the folder is private to this user (looked at once per process)."""
        if self._usable is None:
            from simstore._verified import private_folder

            self._usable = private_folder(self.root, self.unused)
        return self._usable

    def read_entry(self, name: str) -> bytes | None:
        """The bytes of entry ``name`` (marked used now), or None."""
        if not self.usable():
            return None
        path = self._path(name)
        try:
            # not followed, and never waiting: a FIFO in an entry's place hung every job
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            with open(fd, "rb", closefd=False) as f:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    return None  # a later write_entry's rename replaces it (not a folder)
                data = f.read()
        except OSError:
            return None
        finally:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.utime(path)  # used now: evicted last
        return data

    def write_entry(self, name: str, data: bytes) -> bool:
        """Keep ``data`` as entry ``name``; False when it cannot (a full or read-only disk)."""
        if not self.usable():
            return False
        path = self._path(name)
        temp = f"{path}.{os.getpid()}-{threading.get_ident()}.tmp"
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
            os.replace(temp, path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            return False
        with self._lock:
            self._written += len(data)
            # after limit / 8 bytes written here; and, for the many jobs that each write a
            # few entries, at random with the chance a write's share of that: a scan
            # stats every entry (thousands on a busy node), too many to pay on every
            # process's first write
            due = (self._written * _RESCAN_FRACTION >= self.limit_bytes
                   or _draw() * self.limit_bytes < len(data) * _RESCAN_FRACTION)
            if due:
                self._written = 0
        if due:
            self.evict()
        return True

    def evict(self) -> int:
        """Remove the entries used longest ago until the rest fit the limit; how many.

        Also removes temporary files left by writers that died.
        """
        entries = []
        now = time.time()
        try:
            names = os.listdir(self.root)
        except OSError:
            return 0
        for name in names:
            path = os.path.join(self.root, name)
            try:
                st = os.stat(path)
            except OSError:
                continue
            if name.endswith(".tmp"):
                if now - st.st_mtime > _STALE_TEMP_S:
                    with contextlib.suppress(OSError):
                        os.unlink(path)
            elif name.endswith(self.suffix):
                entries.append((st.st_mtime, st.st_size, path))
        total = sum(size for _, size, _ in entries)
        gone = 0
        for _, size, path in sorted(entries):
            if total <= self.limit_bytes:
                break
            with contextlib.suppress(OSError):
                os.unlink(path)
                gone += 1
            total -= size
        return gone


DEFAULT_LAYOUT_CACHE_BYTES = 256 << 20
"""The layout cache's byte limit: a shard's page layout is 2-20 KiB."""


class LayoutCache(NodeCache):
    """Page layouts of shards whose files a job here trusted (see ``formats._layout``).

    An entry is named by its shard's id: a later job on the node opens a shard whose file
    it trusts from it, without opening the file in Arrow or walking its pages.
    """

    suffix = ".layout"
    unused = "shard page layouts not kept"

    def keep(self, shard_id: str, reader: object, name: str) -> bool:
        """Keep the layout a reader of ``shard_id`` gives (its ``layout_bytes``), if any.

        A layout saves a later open work: a reader that cannot give one (``name`` in the
        debug log says which) keeps nothing and fails nothing.
        """
        make = getattr(reader, "layout_bytes", None)
        if not callable(make):
            return False
        try:
            data = make(shard_id)
        except Exception as exc:
            _log.debug("%s: no page layout kept: %s", name, exc)
            return False
        return data is not None and self.write_entry(shard_id, data)

    def keep_file(self, shard_id: str, path: str) -> bool:
        """Keep the layout of a local shard file that has just hashed to ``shard_id``.

        For ``simstore verify --deep``, which records such files for the node's loaders:
        a later job then opens the shard from its layout as well as without a hash. False
        (nothing kept) where the folder is not usable or the file is not a shard whose
        reader gives a layout.
        """
        if not self.usable():
            return False
        from simstore.loaders._opener import FormatOpener

        try:
            reader = FormatOpener()(path)
        except Exception as exc:  # not a shard any format reads here: nothing to keep
            _log.debug("%s: no page layout kept: %s", path, exc)
            return False
        try:
            trust = getattr(reader, "trust", None)
            if not callable(trust):
                return False
            trust()  # its whole file matched its id: the caller's hash
            return self.keep(shard_id, reader, path)
        finally:
            close = getattr(reader, "close", None)
            if callable(close):
                close()


def layout_cache() -> LayoutCache | None:
    """The node's cache of shard page layouts, None where there is none.

    ``layouts/`` in the shard records' folder (``$SIMSTORE_VERIFIED_DIR``; set empty: none).
    """
    from simstore._verified import records_dir

    root = records_dir()
    if root is None:
        return None
    return LayoutCache(os.path.join(root, "layouts"), DEFAULT_LAYOUT_CACHE_BYTES)
