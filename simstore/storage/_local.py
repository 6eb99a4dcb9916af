"""A store in a local directory: the embedded default.

Objects are plain files under the root. Every write goes to a temporary file in the same
directory and is renamed (or hard-linked, for put-if-absent) into place, so a reader never
sees a partial object and a crash leaves at most a temporary file, which ``gc`` removes.
Refs change by compare-and-swap under an ``fcntl`` lock; the kernel drops the lock when its
holder dies, so a killed writer leaves nothing that blocks the next one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import stat
import time
import uuid
from collections.abc import Iterator

from simstore.errors import (
    ConflictError,
    NotFoundError,
    NotWritableError,
    ReadOnlyError,
    StorageError,
    write_refused,
)
from simstore.hashing import hash_bytes, is_object_id
from simstore.storage._base import ObjectInfo, check_key, larger_than
from simstore.storage._scratch import newest_mtime, scratch_in_use

__all__ = ["LocalStore"]

TMP_PREFIX = ".tmp-"
_TMP_TAIL = re.compile(r"(gc-)?[0-9a-f]{32}")
_ASIDE = re.compile(r"gc-[0-9a-f]{32}-([0-9a-f]{32})")
"""An object gc set aside (``delete_unless_since``): its tail names the object's file."""
ASIDE_SETTLED_S = 60.0
"""How long an object has been set aside before a later gc takes it for a killed gc's
and puts it back (a live gc holds one aside for microseconds)."""
_LOCK_DIR = ".locks"
SCRATCH_DIR = ".scratch"
# the operations that write: refused by the file system, they raise NotWritableError
_WRITES = frozenset({"write", "touch", "lock", "compare-and-swap", "delete"})


class LocalStore:
    """An :class:`~simstore.storage.ObjectStore` over a local directory."""

    supports_atomic_cas = True

    def __init__(self, root: str, *, read_only: bool = False, fsync: bool = True) -> None:
        self.root = os.path.abspath(root)
        self.url = self.root
        self.read_only = read_only
        self.fsync = fsync

    def __repr__(self) -> str:
        return f"LocalStore({self.root!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LocalStore) and other.root == self.root

    def __hash__(self) -> int:
        return hash(("local", self.root))

    # -- helpers -----------------------------------------------------------------------
    def _path(self, key: str) -> str:
        return os.path.join(self.root, *check_key(key).split("/"))

    def _check_writable(self, key: str) -> None:
        check_key(key)
        if self.read_only:
            raise ReadOnlyError(f"{self.url}: store is read-only, cannot write {key}")

    def _error(self, op: str, key: str, exc: OSError) -> StorageError:
        if exc.errno == errno.ENOSPC:
            return StorageError(f"{self.url}/{key}: {op} failed: no space left on device")
        if op in _WRITES and write_refused(exc):
            return NotWritableError(
                f"{self.url}/{key}: {op} failed: {exc.strerror or exc} (this process may "
                "read the store but not write it)"
            )
        return StorageError(f"{self.url}/{key}: {op} failed: {exc.strerror or exc}")

    def _write_tmp(self, path: str, data: bytes | None, src: str | None = None) -> str:
        directory = os.path.dirname(path)
        os.makedirs(directory, exist_ok=True)
        tmp = os.path.join(directory, f"{TMP_PREFIX}{uuid.uuid4().hex}")
        try:
            if src is not None:
                shutil.copyfile(src, tmp)
                if self.fsync:
                    fd = os.open(tmp, os.O_RDONLY)
                    try:
                        os.fsync(fd)
                    finally:
                        os.close(fd)
            else:
                with open(tmp, "wb") as f:
                    f.write(data or b"")
                    if self.fsync:
                        f.flush()
                        os.fsync(f.fileno())
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return tmp

    def _fsync_dir(self, directory: str) -> None:
        if not self.fsync:
            return
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # -- reads -------------------------------------------------------------------------
    def get(
        self, key: str, byte_range: tuple[int, int] | None = None, *,
        max_bytes: int | None = None,
    ) -> bytes:
        """Read an object or a half-open byte range of it (see ``ObjectStore.get``)."""
        path = self._path(key)
        try:
            # O_NONBLOCK: opening a FIFO planted as an object must not wait for a writer;
            # its type is checked on the descriptor, before a file object is made of it
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            try:
                st = os.fstat(fd)
                if stat.S_ISDIR(st.st_mode):
                    raise NotFoundError(f"{self.url}: no object {key}")
                if not stat.S_ISREG(st.st_mode):
                    # a FIFO, or a link to /dev/zero: read without end, or never answered
                    raise StorageError(f"{self.url}/{key}: read failed: not a regular file")
                if byte_range is None and max_bytes is not None and st.st_size > max_bytes:
                    raise larger_than(self.url, key, max_bytes, st.st_size)
                f = os.fdopen(fd, "rb")
            except BaseException:
                os.close(fd)
                raise
            with f:
                if byte_range is None:
                    if max_bytes is None:
                        return f.read()
                    # as long as it is (a read of the cap would allocate the cap), then
                    # on to the cap only if it grew since the fstat
                    data = f.read(st.st_size + 1)
                    if len(data) > st.st_size:
                        data += f.read(max_bytes + 1 - len(data))
                    if len(data) > max_bytes:
                        raise larger_than(self.url, key, max_bytes)
                    return data
                start, end = byte_range
                f.seek(start)
                return f.read(max(0, end - start))
        except FileNotFoundError as exc:
            raise NotFoundError(f"{self.url}: no object {key}") from exc
        except OSError as exc:
            raise self._error("read", key, exc) from exc

    def get_versioned(self, key: str, *, max_bytes: int | None = None) -> tuple[bytes, str]:
        """Read a ref and its version token (the hash of its bytes)."""
        data = self.get(key, max_bytes=max_bytes)
        return data, hash_bytes(data)

    def exists(self, key: str) -> bool:
        """Whether the key exists as a file."""
        return os.path.isfile(self._path(key))

    def refresh(self, key: str) -> bool:
        """Refresh an object's modification time (gc's grace); False when it is absent."""
        self._check_writable(key)
        try:
            os.utime(self._path(key))
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise self._error("touch", key, exc) from exc
        return True

    def info(self, key: str) -> ObjectInfo:
        """Size and modification time."""
        try:
            st = os.stat(self._path(key))
        except FileNotFoundError as exc:
            raise NotFoundError(f"{self.url}: no object {key}") from exc
        except OSError as exc:
            raise self._error("stat", key, exc) from exc
        return ObjectInfo(key, st.st_size, st.st_mtime)

    def local_path(self, key: str) -> str | None:
        """The file holding the object, if it exists."""
        path = self._path(key)
        return path if os.path.isfile(path) else None

    def clock(self) -> float:
        """This machine's time: the files' modification times come from the same clock.

        The kernel stamps a file with a coarse copy of the clock ``time.time`` reads
        finely, so a file written before this call never looks newer than its result.
        """
        return time.time()

    def list(self, prefix: str = "") -> Iterator[str]:
        """Keys under ``prefix``, in sorted order, skipping temporary files."""
        for info in self.list_info(prefix):
            yield info.key

    def list_info(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Infos of keys under ``prefix``, in sorted order, skipping temporary files."""
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        start = os.path.join(self.root, *base.split("/")) if base else self.root
        if base and self._through_link(base):
            # a linked folder is not walked, here as below (``_walk``): a store whose
            # objects/ links to another store's would have gc delete that store's objects
            return
        yield from self._walk(start, base, prefix)

    def _through_link(self, rel: str) -> bool:
        """Whether a folder on the way from the root to ``rel`` is a symbolic link."""
        path = self.root
        for seg in rel.split("/"):
            path = os.path.join(path, seg)
            if os.path.islink(path):
                return True
        return False

    def list_temporary(self, older_than: float) -> Iterator[str]:
        """Paths of temporary files and scratch entries left by killed writers.

        Only entries last modified before ``older_than`` are listed; a scratch entry may
        be a directory (a killed ingest's working folder), never one whose ingest is alive
        (it holds the folder's lock: see :class:`~simstore.storage.Scratch`).
        """
        scratch = os.path.join(self.root, SCRATCH_DIR)
        for dirpath, dirs, files in os.walk(self.root):
            if dirpath == scratch:
                for name in sorted(dirs + files):
                    path = os.path.join(dirpath, name)
                    with contextlib.suppress(OSError):
                        if newest_mtime(path) < older_than and not (
                            name in dirs and scratch_in_use(path)
                        ):
                            yield path
                dirs[:] = []
                continue
            for name in files:
                # named as _write_tmp names them, not any file that starts the same way;
                # not an object gc set aside (``.tmp-gc-<run>-<id>``): the next gc puts it
                # back (``restore_set_aside``), as a writer may have reused it
                if name.startswith(TMP_PREFIX) and _TMP_TAIL.fullmatch(name[len(TMP_PREFIX):]):
                    path = os.path.join(dirpath, name)
                    with contextlib.suppress(OSError):
                        if os.stat(path).st_mtime < older_than:
                            yield path

    def folders(self, prefix: str) -> tuple[str, ...]:
        """Keys under ``prefix`` that are folders, sorted (links are not followed).

        An object store has no folders of its own: a catalog asks where its layout puts an
        object (a ref), to tell a folder standing there from no object at all.
        """
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        if base and self._through_link(base):
            return ()
        found = []
        stack = [(os.path.join(self.root, *base.split("/")) if base else self.root, base)]
        while stack:
            directory, rel = stack.pop()
            try:
                entries = list(os.scandir(directory))
            except (FileNotFoundError, NotADirectoryError):
                continue
            except OSError as exc:
                raise self._error("list", rel, exc) from exc
            for entry in entries:
                key = f"{rel}/{entry.name}" if rel else entry.name
                if entry.name.startswith(".") or not entry.is_dir(follow_symlinks=False):
                    continue
                if key.startswith(prefix):
                    found.append(key)
                if key.startswith(prefix) or prefix.startswith(key + "/"):
                    stack.append((entry.path, key))
        return tuple(sorted(found))

    def _walk(self, directory: str, rel: str, prefix: str) -> Iterator[ObjectInfo]:
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as exc:
            raise self._error("list", rel, exc) from exc
        for entry in entries:
            if entry.name.startswith("."):
                continue
            key = f"{rel}/{entry.name}" if rel else entry.name
            if entry.is_dir(follow_symlinks=False):
                if key.startswith(prefix) or prefix.startswith(key + "/"):
                    yield from self._walk(entry.path, key, prefix)
            elif key.startswith(prefix):
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                yield ObjectInfo(key, st.st_size, st.st_mtime)

    # -- writes ------------------------------------------------------------------------
    def put(self, key: str, data: bytes) -> None:
        """Write atomically by rename."""
        self._check_writable(key)
        path = self._path(key)
        try:
            tmp = self._write_tmp(path, data)
            os.replace(tmp, path)
            self._fsync_dir(os.path.dirname(path))
        except OSError as exc:
            raise self._error("write", key, exc) from exc

    def _link_new(self, src: str, dest: str) -> bool:
        """Hard-link ``src`` at ``dest``: True; False when ``dest`` is there (refreshed).

        An object found there but removed (by gc) before its refresh is linked again, not
        counted present (see ``_touch``). Other errors are raised.
        """
        while True:
            try:
                os.link(src, dest)
                return True
            except FileExistsError:
                if self._touch(dest):
                    return False

    def _link_into_place(self, key: str, path: str, tmp: str) -> bool:
        try:
            if not self._link_new(tmp, path):
                return False
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        self._fsync_dir(os.path.dirname(path))
        return True

    def _touch(self, path: str) -> bool:
        """Refresh a present object's time (a writer reuses it: gc must see it as new).

        False when the file is gone: ``gc`` removed it between the writer's check and this
        refresh, and the writer must write it after all, not count it present. Another
        error (a store the writer may not change times in) counts as present.
        """
        try:
            os.utime(path)
        except FileNotFoundError:
            return False
        except OSError:
            pass
        return True

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Write unless present (exclusive hard link); refresh mtime when present."""
        self._check_writable(key)
        path = self._path(key)
        if os.path.isfile(path) and self._touch(path):
            return False
        try:
            return self._link_into_place(key, path, self._write_tmp(path, data))
        except OSError as exc:
            raise self._error("write", key, exc) from exc

    def put_file(self, key: str, path: str) -> bool:
        """Copy a local file in unless present; refresh mtime when present."""
        self._check_writable(key)
        dest = self._path(key)
        if os.path.isfile(dest) and self._touch(dest):
            return False
        try:
            return self._link_into_place(key, dest, self._write_tmp(dest, None, src=path))
        except OSError as exc:
            raise self._error("write", key, exc) from exc

    def scratch_dir(self) -> str:
        """``<root>/.scratch``: same filesystem as the objects, so ``move_file`` is a link."""
        path = os.path.join(self.root, SCRATCH_DIR)
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as exc:
            raise self._error("write", SCRATCH_DIR, exc) from exc
        return path

    def move_file(self, key: str, path: str) -> bool:
        """Hard-link a local file into place unless present, then remove the original.

        No byte is copied when ``path`` is on the store's filesystem (see
        :meth:`scratch_dir`); across filesystems it falls back to a copy.
        """
        self._check_writable(key)
        dest = self._path(key)
        try:
            if os.path.isfile(dest) and self._touch(dest):
                return False
            if self.fsync:
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            try:
                if not self._link_new(path, dest):
                    return False
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                    raise
                return self.put_file(key, path)
            self._fsync_dir(os.path.dirname(dest))
            return True
        except OSError as exc:
            raise self._error("write", key, exc) from exc
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)

    def compare_and_swap(self, key: str, expected: str | None, data: bytes | None) -> str | None:
        """Swap under an exclusive ``fcntl`` lock; the version token is the content hash."""
        self._check_writable(key)
        path = self._path(key)
        lock_dir = os.path.join(self.root, _LOCK_DIR)
        try:
            os.makedirs(lock_dir, exist_ok=True)
            lock_path = os.path.join(lock_dir, hash_bytes(key.encode()))
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise self._error("lock", key, exc) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                with open(path, "rb") as f:
                    current: str | None = hash_bytes(f.read())
            except FileNotFoundError:
                current = None
            if current != expected:
                raise ConflictError(
                    f"{self.url}/{key} changed concurrently "
                    f"(expected version {expected or 'absent'}, found {current or 'absent'})"
                )
            if data is None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                self._fsync_dir(os.path.dirname(path))
                return None
            tmp = self._write_tmp(path, data)
            os.replace(tmp, path)
            self._fsync_dir(os.path.dirname(path))
            return hash_bytes(data)
        except OSError as exc:
            raise self._error("compare-and-swap", key, exc) from exc
        finally:
            os.close(fd)

    def delete_unless_since(self, key: str, cutoff: float) -> str:
        """Delete ``key`` unless written or reused since ``cutoff``, against writers at once.

        For ``gc``: reading the time and then deleting leaves a moment in which a writer
        reuses the object (it finds it present and refreshes its time) and commits a
        snapshot that references it, and the delete then takes it. Here the file is
        first renamed aside (a hidden temporary name in its folder) and its time read
        there: a writer that refreshed it before the rename is seen (the file goes back),
        one that refreshes it after finds it gone and writes it again (see ``_touch``),
        one that looks after the rename writes it anew. Returns ``"deleted"``,
        ``"recent"`` (kept) or ``"gone"`` (not there). A crash while the file is aside
        leaves the object aside, named after it: the next ``gc`` puts it back first
        (:meth:`restore_set_aside`) and judges it again.
        """
        self._check_writable(key)
        path = self._path(key)
        # named after the object, so that a gc killed here can have it put back by the
        # next (``restore_set_aside``): a writer may have reused it just before the rename
        base = os.path.basename(path)
        tail = f"-{base}" if is_object_id(base) else ""
        aside = os.path.join(os.path.dirname(path), f"{TMP_PREFIX}gc-{uuid.uuid4().hex}{tail}")
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            return "gone"
        except OSError as exc:
            raise self._error("delete", key, exc) from exc
        try:
            if os.stat(aside).st_mtime >= cutoff:
                os.rename(aside, path)  # a copy written meanwhile has the same bytes
                return "recent"
            os.unlink(aside)
        except OSError as exc:
            raise self._error("delete", key, exc) from exc
        return "deleted"

    def restore_set_aside(self, settled_s: float | None = None) -> tuple[str, ...]:
        """Put back the objects a killed gc left aside; the keys put back.

        An aside changed more than ``settled_s`` ago (:data:`ASIDE_SETTLED_S` by default;
        its change time is the rename's) goes
        back to its object's name, unless the object is there again (a writer wrote it
        anew: the aside, of the same bytes, is removed). For gc, before it lists: the
        object is then judged again, and one a writer reused stays.
        """
        self._check_writable("objects")
        settled = ASIDE_SETTLED_S if settled_s is None else settled_s
        restored: list[str] = []
        now = time.time()
        if self._through_link("objects"):  # not walked, as gc's listing does not walk it
            return ()
        # gc sets aside only what it lists, objects: their folders are all to walk
        for dirpath, dirs, files in os.walk(os.path.join(self.root, "objects")):
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            for name in files:
                found = _ASIDE.fullmatch(name[len(TMP_PREFIX):]) if name.startswith(
                    TMP_PREFIX) else None
                if found is None:
                    continue
                aside = os.path.join(dirpath, name)
                target = os.path.join(dirpath, found.group(1))
                with contextlib.suppress(FileNotFoundError):
                    if now - os.stat(aside).st_ctime < settled:
                        continue  # a live gc's, this moment
                    if os.path.exists(target):
                        os.unlink(aside)
                        continue
                    os.rename(aside, target)
                    restored.append(os.path.relpath(target, self.root).replace(os.sep, "/"))
        return tuple(sorted(restored))

    def delete(self, key: str) -> None:
        """Delete a file; missing is fine. Empty parent directories are left."""
        self._check_writable(key)
        try:
            os.unlink(self._path(key))
        except FileNotFoundError:
            return
        except OSError as exc:
            raise self._error("delete", key, exc) from exc
