"""A local disk cache of remote shards, shared by the worker processes and jobs of a node.

Layout under the cache directory::

    simstore-cache.json      marker: the directory belongs to a simstore cache
    objects/<2 hex>/<id>     verified copies of shards, named by their hash
    used/<2 hex>/<id>        an empty file per copy: its modification time is the copy's last use
    tmp/<id>.<random>        fills in progress
    locks/<3 hex>            lock stripes (fcntl.flock)

Promises and how they are kept:

- *Atomic, verified fills.* A fill downloads into ``tmp/``, hashes the bytes as they
  arrive, and renames the file into ``objects/`` only when the hash matches the id; a
  mismatch raises :class:`IntegrityError` naming the object. Readers never see a partial
  copy.
- *One download per object.* A fill holds the exclusive lock of the object's stripe, so
  processes that want the same shard wait for one download and then hit.
- *LRU within a byte limit.* A copy's last use is the modification time of its file
  under ``used/``: a hit and a fill set it to now; a fill first evicts the copies of
  oldest last use until the new one fits (a copy without that file, from a cache of an
  earlier version, counts its own access time). The copy itself is never touched after
  its fill: its modification time says when it was filled, so a reader can tell a copy
  that was in the cache before its job started (a *warm* copy, see :class:`ShardCache`)
  from one its job filled, and its change time stays that of the fill, so a loader can
  recognise the same unchanged copy in a later job (see ``simstore._verified``). A copy in
  use (prefetched or open in a reader) is *pinned* by a shared ``flock`` on an open
  descriptor and is never evicted; eviction takes an exclusive non-blocking lock before
  unlinking, so it cannot race a reader. When pinned copies alone exceed the limit the
  fill goes ahead (counted as ``cache_over_limit``) rather than wait, so the cache
  cannot deadlock, and a reader trims the cache back to its limit when it finishes; a
  shard larger than the whole limit is an :class:`InvalidInputError`. Size the limit for
  at least the shards a node pins at once: (``prefetch.shards`` + ``max_open_shards``)
  per reading process.
- *Only cache copies are deleted*: names under ``objects/`` that are object ids, and
  ``tmp/`` files of dead fills. A non-empty directory without the marker is refused.
- *Crash safety.* Locks are ``flock`` locks, which the kernel drops with their process;
  nothing else records state. A dead fill leaves a ``tmp/`` file, removed by the next
  fill of that object or the next cache start, once its stripe lock is free.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO, TypeVar

from simstore.loaders._stats import Counters

from simstore._reserve import Reservation
from simstore.catalog import CACHE_MARKER_KEY, STORE_META_KEY
from simstore.errors import (
    FormatError,
    IntegrityError,
    InvalidInputError,
    StorageError,
    version_error,
    write_refused,
)
from simstore.hashing import Hasher, hash_bytes, is_object_id

__all__ = ["CacheConfig", "DamagedCopyError", "PinnedCopy", "ShardCache"]

MARKER = CACHE_MARKER_KEY
_CACHE_FORMAT_VERSION = 1
_MARKER_BODY = {"kind": "simstore-shard-cache", "format_version": _CACHE_FORMAT_VERSION}


class DamagedCopyError(IntegrityError):
    """A copy in the disk cache no longer hashes to its id; it was taken out of the cache.

    The node's copy is damaged, not (as far as is known) the store's object: a reader
    opens the shard again from a new fill (see ``read_chunk``). ``taken_out``: this
    process took it out (counted as ``cache_damaged``), not another that met it first.
    """

    taken_out = False


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheConfig:
    """Where the cache lives and how many bytes of copies it may hold."""

    directory: str
    limit_bytes: int

    def __post_init__(self) -> None:
        if self.limit_bytes <= 0:
            raise InvalidInputError(f"cache_limit must be positive, got {self.limit_bytes}")

    def node_id(self) -> str:
        """This cache among a run's reports: the same for every rank that shares it.

        The host's name, the folder's real path and its device and inode, hashed (16 hex
        digits): ranks of one node that read one copy each count it as a warm copy, and
        the cost accounting must know their counts overlap. No path is given away.
        """
        import socket

        folder = os.path.realpath(self.directory)
        try:
            st = os.stat(folder)
            where = f"{st.st_dev}:{st.st_ino}"
        except OSError:
            where = ""
        return hash_bytes(f"{socket.gethostname()}\0{folder}\0{where}".encode())[:16]


class PinnedCopy:
    """A cached copy held open (pinned against eviction) until :meth:`release`."""

    def __init__(self, path: str, fd: int, *, hit: bool, size: int = 0,
                 filled_ns: int = 0) -> None:
        self.path = path
        self.hit = hit
        self.size = size
        """The copy's bytes (what a hit saved fetching)."""
        self.filled_ns = filled_ns
        """When the copy was filled (its modification time, ns since the epoch)."""
        self._fd: int | None = fd

    @property
    def fd(self) -> int | None:
        """The descriptor that pins the copy (None once released).

        It holds the file itself, whatever its path names later (a damaged copy taken out
        and filled again).
        """
        return self._fd

    def release(self) -> None:
        """Unpin; the copy may then be evicted."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


# A fill writes the object into the given file; it returns nothing and raises on failure.
Download = Callable[[BinaryIO], None]
T = TypeVar("T")


class ShardCache:
    """The disk cache of one process; cheap to create, holds no lock between calls.

    ``job_start`` (seconds since the epoch, ``time.time()``): when the job reading through
    this cache started. A hit on a copy filled before then is a *warm* hit: besides the
    lookup's ``<counted_as>_hits``, the copy is given to ``counters.add_warm`` (each
    process keeps each copy once), so the job can count the distinct copies a cold cache
    would have had to fetch. None: no warm hits are told.

    ``writable=False`` opens the cache for a report (``du``), which only lists and
    stats: the directory is then not checked for write access, as every reader's is
    (a :class:`StorageError` naming it), nor its dead fills swept.
    """

    def __init__(
        self, config: CacheConfig, counters: Counters, *, job_start: float | None = None,
        writable: bool = True,
    ) -> None:
        self.config = config
        self.counters = counters
        self.job_start_ns = None if job_start is None else int(job_start * 1e9)
        self.fill_requests: Callable[[int], int] | None = None
        """The requests a shard's fill of so many bytes sends (set by its reader's
        :class:`~simstore.loaders._fetch.ShardAccess`); a warm copy is told with them.
        None: one."""
        self.root = os.path.abspath(config.directory)
        self._objects = os.path.join(self.root, "objects")
        self._tmp = os.path.join(self.root, "tmp")
        self._locks = os.path.join(self.root, "locks")
        self._used = os.path.join(self.root, "used")
        self._writable = writable
        self._job = job_identity()
        """Whose waiters take this process's failed fills (see :meth:`_note_failed_fill`)."""
        self._claim(writable)
        if writable:
            self._sweep_tmp()

    # -- setup -------------------------------------------------------------------------
    def _claim(self, writable: bool) -> None:
        marker = os.path.join(self.root, MARKER)
        if os.path.exists(os.path.join(self.root, STORE_META_KEY)):
            raise InvalidInputError(
                f"cache_dir {self.root} holds a simstore store ({STORE_META_KEY}): the "
                "cache's eviction would delete its objects; give a dedicated directory"
            )
        if not writable:  # a reader that writes nothing (du): nothing is made here
            if os.path.isdir(self.root) and os.path.exists(marker):
                self._check_marker(marker)
            elif os.path.isdir(self.root) and set(os.listdir(self.root)):
                raise self._foreign()
            return
        try:
            os.makedirs(self.root, exist_ok=True)
            if os.path.exists(marker):
                self._check_marker(marker)
            else:
                # other workers may be claiming the same new directory right now: a claim
                # writes its marker before any folder, so folders listed here without a
                # marker after the listing are foreign (a copy of a store's objects/)
                if set(os.listdir(self.root)) - {MARKER} and not os.path.exists(marker):
                    raise self._foreign()
                with contextlib.suppress(FileExistsError):
                    fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                    with os.fdopen(fd, "w") as f:
                        json.dump(_MARKER_BODY, f)
            for d in (self._objects, self._tmp, self._locks, self._used):
                os.makedirs(d, exist_ok=True)
            # every reader writes here (locks, fills, the LRU clock): a cache on a
            # read-only mount, or another user's, fails now, not at the first miss
            os.close(self._open_lock("evict"))
        except OSError as exc:
            why = exc.strerror or exc
            if write_refused(exc):
                why = (f"not writable ({why}): a job writes to the cache it reads through; "
                       "give a cache_dir it may write")
            raise StorageError(f"cache directory {self.root}: {why}") from exc

    def _foreign(self) -> InvalidInputError:
        """The error for a directory that holds something and no cache marker."""
        return InvalidInputError(
            f"cache_dir {self.root} is not empty and is not a simstore "
            f"cache (no {MARKER}); give an empty or dedicated directory"
        )

    def _check_marker(self, marker: str) -> None:
        """Refuse a marker that is not this simstore's cache's (another kind or version).

        An empty one is a claim under way (its writer made it, then writes its body).
        """
        try:
            with open(marker, "rb") as f:
                raw = f.read(1 << 16)
        except OSError as exc:
            raise StorageError(f"cache directory {self.root}: {MARKER}: "
                               f"{exc.strerror or exc}") from exc
        if not raw:
            return
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict) or body.get("kind") != _MARKER_BODY["kind"]:
            raise FormatError(
                f"cache directory {self.root}: {MARKER} is not a simstore shard cache's "
                "marker; give an empty or dedicated directory"
            )
        if body.get("format_version") != _CACHE_FORMAT_VERSION:
            raise version_error(f"cache directory {self.root} has cache",
                                body.get("format_version"), _CACHE_FORMAT_VERSION)

    def _open_lock(self, name: str) -> int:
        return os.open(os.path.join(self._locks, name), os.O_RDWR | os.O_CREAT, 0o644)

    @contextlib.contextmanager
    def _lock(self, name: str, *, blocking: bool = True) -> Iterator[bool]:
        try:
            fd = self._open_lock(name)
        except OSError as exc:
            raise StorageError(
                f"cache directory {self.root}: lock {name}: {exc.strerror or exc}"
            ) from exc
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)

    def _sweep_tmp(self) -> None:
        for name in _listdir(self._tmp):
            oid = name.split(".", 1)[0]
            if not is_object_id(oid):
                continue
            with self._lock(_stripe(oid), blocking=False) as held:
                if held:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(self._tmp, name))

    # -- lookups -----------------------------------------------------------------------
    def path_of(self, object_id: str) -> str:
        """Where the copy of ``object_id`` lives (whether or not it is there)."""
        return os.path.join(self._objects, object_id[:2], object_id)

    def used_path(self, object_id: str) -> str:
        """The file whose modification time is the last use of ``object_id``'s copy."""
        return os.path.join(self._used, object_id[:2], object_id)

    def _mark_used(self, object_id: str) -> None:
        """The copy of ``object_id`` is used now (the LRU clock; the copy is not touched).

        Setting the time to now needs write access only, so in a cache shared by several
        users a reader marks others' copies too where the files allow it.
        """
        path = self.used_path(object_id)
        try:
            os.utime(path)
        except FileNotFoundError:
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o666))
            except OSError:
                pass
        except OSError:
            pass

    def _pin(self, object_id: str, *, hit: bool) -> PinnedCopy | None:
        path = self.path_of(object_id)
        try:
            # O_NONBLOCK: a FIFO in the copy's place must not wait for a writer for ever
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # a link in the copy's place: a miss (below)
                return None
            raise StorageError(f"cache copy {path}: {exc.strerror or exc}") from exc
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            # no copy: a FIFO, socket or link holds no data and the fill's rename replaces
            # it; a folder it cannot replace, and may hold someone's files
            os.close(fd)
            if stat.S_ISDIR(st.st_mode):
                raise StorageError(f"cache copy {path}: a folder in the copy's place; "
                                   "it is no cache copy: move it out of the cache")
            return None
        fcntl.flock(fd, fcntl.LOCK_SH)
        st = os.fstat(fd)
        if st.st_nlink == 0:  # evicted between open and lock
            os.close(fd)
            return None
        self._mark_used(object_id)
        return PinnedCopy(path, fd, hit=hit, size=st.st_size, filled_ns=st.st_mtime_ns)

    def peek(self, object_id: str, *, counted_as: str = "cache") -> PinnedCopy | None:
        """A pinned copy of ``object_id`` if the cache holds one (counted as a hit), else None.

        Never fills: for a caller that would rather ask the store something else on a miss.
        """
        if not is_object_id(object_id):
            raise InvalidInputError(f"not an object id: {object_id!r}")
        pinned = self._pin(object_id, hit=True)
        if pinned is not None:
            self._count_hit(object_id, pinned, counted_as)
        return pinned

    def _count_hit(self, object_id: str, pinned: PinnedCopy, counted_as: str) -> None:
        self.counters.add(f"{counted_as}_hits")
        self.counters.add(f"{counted_as}_hit_bytes", pinned.size)
        if self.job_start_ns is not None and pinned.filled_ns < self.job_start_ns:
            fills = self.fill_requests if counted_as == "cache" else None
            self.counters.add_warm(counted_as, object_id, pinned.size,
                                   fills(pinned.size) if fills is not None else 1)

    def acquire(self, object_id: str, size_bytes: Callable[[], int], download: Download,
                *, referenced_by: str = "", counted_as: str = "cache",
                filled: Callable[[int], None] | None = None) -> PinnedCopy:
        """A pinned, verified copy of ``object_id``; fills it with ``download`` on a miss.

        ``size_bytes`` is asked only on a miss (it may cost a request). ``filled`` is
        called with the pinned descriptor of a copy this call filled, once the copy is in
        place and before the fill's lock is let go (see :meth:`settled`). Raises
        :class:`InvalidInputError` when the object is larger than the whole cache and
        :class:`IntegrityError` when the downloaded bytes do not hash to ``object_id``.
        Hits, misses and filled bytes are counted as ``<counted_as>_hits`` and so on
        (shards as ``cache_*``, manifest parts as ``manifest_cache_*``).
        """
        pinned = self.peek(object_id, counted_as=counted_as)
        if pinned is not None:
            return pinned
        before = self._failed_fill(object_id)
        with self._lock(_stripe(object_id)):
            pinned = self._pin(object_id, hit=True)
            if pinned is not None:  # another process filled it while we waited
                self._count_hit(object_id, pinned, counted_as)
                return pinned
            self._raise_failed_fill(object_id, before)
            from_store: list[StorageError] = []
            try:
                pinned = self._fill(object_id, _noting(size_bytes, from_store)(),
                                    _noting(download, from_store), referenced_by, counted_as)
            except StorageError as exc:
                if from_store:  # the store's failure, which the waiters would meet too;
                    self._note_failed_fill(object_id, exc)  # not this node's (a lock)
                raise
            if filled is not None:
                assert pinned.fd is not None
                try:
                    filled(pinned.fd)
                except BaseException:
                    pinned.release()
                    raise
        return pinned

    def _failed_note(self, object_id: str) -> str:
        return os.path.join(self._tmp, f"{object_id}.failed")

    def _note_failed_fill(self, object_id: str, exc: StorageError) -> None:
        """Leave why a fill failed for the processes waiting on its lock (held here).

        Each waiter used to run a whole fill of its own after it, retry deadline and all:
        with a store that fails a shard, the error of a job with 2 workers came after two
        deadlines, and every process on the node queued on the lock added one. A note is
        a new file each time (written aside, then renamed), so a waiter tells it from one
        it saw before it waited by its identity. It names the job that failed
        (:func:`job_identity`): a waiter of another job on the node (other credentials,
        another endpoint) runs its own fill rather than fail with this job's error.
        """
        note = self._failed_note(object_id)
        aside = f"{note}.{uuid.uuid4().hex}"
        try:
            with open(aside, "w") as f:
                f.write(f"{self._job}\n{exc}")
            os.replace(aside, note)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(aside)

    def _failed_fill(self, object_id: str) -> tuple[int, int] | None:
        """The identity of the note of the last failed fill of ``object_id``, if any."""
        try:
            st = os.stat(self._failed_note(object_id))
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns

    def _raise_failed_fill(self, object_id: str, before: tuple[int, int] | None) -> None:
        """Raise the failure of a fill of ``object_id`` that ended while this one waited."""
        now = self._failed_fill(object_id)
        if now is None or now == before:
            return  # none, or one from before this wait: this fill tries again
        try:
            with open(self._failed_note(object_id)) as f:
                job, _, message = f.read().partition("\n")
        except (OSError, UnicodeDecodeError):
            return
        if job != self._job:
            return  # another job's: its store or credentials may not be this one's
        raise StorageError(message)  # the same failure: the next read tries again

    def drop_if_not_size(self, object_id: str, size: int) -> bool:
        """Remove the copy of ``object_id`` if it is not ``size`` bytes; whether it did.

        A copy cut short or grown on the node's disk is fetched again, as a loader
        reading it would. Done under the lock the object's fills hold until their copy is
        renamed into place, so a good copy another process fills meanwhile stays.
        """
        if not is_object_id(object_id):
            raise InvalidInputError(f"not an object id: {object_id!r}")
        with self._lock(_stripe(object_id)):
            path = self.path_of(object_id)
            try:
                if os.stat(path).st_size == size:
                    return False
                os.unlink(path)
            except FileNotFoundError:
                return False
            except OSError as exc:
                raise StorageError(f"cache copy {path}: {exc.strerror or exc}") from exc
            with contextlib.suppress(OSError):
                os.unlink(self.used_path(object_id))
            return True

    def settled(self, object_id: str) -> None:
        """Wait until no fill of ``object_id`` is under way on this node.

        A copy is visible from its rename, a moment before its filler's ``filled`` has
        run: a reader that found it in that moment, and needs what ``filled`` publishes,
        waits here and looks again.
        """
        with self._lock(_stripe(object_id)):
            pass

    def _fill(
        self, object_id: str, size: int, download: Download, referenced_by: str,
        counted_as: str = "cache",
    ) -> PinnedCopy:
        if size > self.config.limit_bytes:
            # the manifest tier's objects are the snapshot and its manifest parts
            kind = "shard" if counted_as == "cache" else "catalog object"
            raise InvalidInputError(
                f"cache limit of {self.config.limit_bytes} bytes is smaller than {kind} "
                f"objects/{object_id[:2]}/{object_id} ({size} bytes, the size the store "
                "reports); raise cache_limit to at least a few shards (an object that was "
                "written smaller is damaged in the store: simstore verify --deep)"
            )
        for name in _listdir(self._tmp):  # dead fills of this object
            if name.startswith(object_id + "."):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self._tmp, name))
        tmp = os.path.join(self._tmp, f"{object_id}.{uuid.uuid4().hex}")
        hashings: list[_HashingWriter] = []
        try:
            with self._lock("evict"):
                self._make_room(size)
                # the fill's whole size is reserved at once (a file of that length, with
                # no blocks yet): every other fill's room-making counts it (usage_bytes
                # reads tmp/), where a fill counted only its bytes so far and fills side
                # by side each made room for itself alone, together going over the limit
                with open(tmp, "wb") as reserve:
                    reserve.truncate(size)
            # a miss whatever the fill's outcome from here: its download is made (billed)
            self.counters.add(f"{counted_as}_misses")
            with open(tmp, "r+b") as raw:
                # and its blocks, before the writes (1.3-1.4x faster writes into the page
                # cache on ext4, see simstore._reserve); a shorter download's are cut off
                self._room_on_disk(Reservation(raw.fileno(), step=0), size)
                for attempt in (1, 2):
                    hashing = _HashingWriter(raw)
                    hashings.append(hashing)
                    download(hashing)  # type: ignore[arg-type]
                    raw.truncate()  # a shorter download: what it did not write goes
                    actual = hashing.hasher.hexdigest()
                    if actual == object_id or attempt == 2:
                        break
                    # downloaded once more before it is called damaged: bytes damaged on
                    # the way (a body cut with its length alike, which no check of the
                    # reply sees) are not the stored object's damage, which both show
                    raw.seek(0)
            if actual != object_id:
                by = f"; referenced by snapshot {referenced_by}" if referenced_by else ""
                raise IntegrityError(
                    f"objects/{object_id[:2]}/{object_id} has hash {actual}, "
                    f"expected {object_id}{by}"
                )
            dest = self.path_of(object_id)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            # pin before the copy becomes visible, so no other fill can evict it first
            fd = os.open(tmp, os.O_RDONLY)
            fcntl.flock(fd, fcntl.LOCK_SH)
            try:
                # the modification time, the last write's, says when it was filled; the
                # rename under the eviction lock, so another fill's room-making sees the
                # copy either still filling (tmp/) or landed (objects/), never neither
                with self._lock("evict"):
                    os.replace(tmp, dest)
            except BaseException:  # the rename's, or its lock's (a StorageError)
                os.close(fd)
                raise
            self._mark_used(object_id)
        except OSError as exc:
            full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
            raise StorageError(
                f"cache fill of {object_id} in {self.root}: {exc.strerror or exc}"
                + ("; the disk is full past the copies that could be evicted (those "
                   "in use are not): free space on it, or lower prefetch (a reading "
                   "process pins prefetch.shards + max_open_shards copies)" if full else "")
            ) from exc
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            if hashings:  # downloaded, kept or not (a damaged object)
                self.counters.add(f"{counted_as}_fill_bytes",
                                  sum(h.hasher.size_bytes for h in hashings))
        return PinnedCopy(dest, fd, hit=False)

    # -- eviction ----------------------------------------------------------------------
    def _entries(self) -> list[tuple[int, int, str]]:
        """``(last use, bytes, path)`` of each copy (the last use in ns, see ``used_path``).

        ``used/`` files whose copy is gone (evicted by a process that died before it
        removed them, or taken out as damaged) are removed here.
        """
        out = []
        used: dict[str, int] = {}
        for d in _subfolders(self._used):
            for name in _listdir(d):
                if not is_object_id(name):
                    continue
                with contextlib.suppress(FileNotFoundError):
                    used[name] = os.lstat(os.path.join(d, name)).st_mtime_ns
        held = set()
        for name, path, st in _copies(self._objects):
            out.append((used.get(name, st.st_atime_ns), st.st_size, path))
            held.add(name)
        if self._writable:  # a report's listing changes nothing
            for name in used.keys() - held:
                with contextlib.suppress(OSError):
                    os.unlink(self.used_path(name))
        return out

    def _filling_bytes(self) -> int:
        """Bytes reserved by fills under way (``tmp/``)."""
        return sum(st.st_size for st in _fills(self._tmp))

    def usage_bytes(self, entries: list[tuple[int, int, str]] | None = None,
                    filling: int | None = None) -> int:
        """Bytes held by copies (``entries``) and fills (``filling``), listed when not given.

        Under the eviction lock (room-making) the two listings agree: a fill lands (its
        rename) under that lock too. When a fill's rename was outside it, a fill landing
        between the listings was counted by neither, and fills side by side took the
        cache a shard or two over its limit, uncounted. Outside the lock (``du``) the
        figure is as of the moment, fills listed first (a landing one may count twice).
        """
        if filling is None:
            filling = self._filling_bytes()
        if entries is None:
            entries = self._entries()
        return filling + sum(size for _, size, _ in entries)

    def trim(self) -> None:
        """Evict unpinned copies until the cache is within its limit again."""
        with self._lock("evict"):
            self._make_room(0)

    def _make_room(self, size: int) -> None:
        """Evict least recently used copies until a fill of ``size`` bytes fits the limit.

        The fill then claims its blocks on the disk (:meth:`_room_on_disk`).
        """
        # one listing of the cache per fill (it was two: the copies, then their bytes),
        # under the eviction lock, as fills land (see usage_bytes)
        filling = self._filling_bytes()
        entries = sorted(self._entries())  # least recently used first
        used = self.usage_bytes(entries, filling)
        for _used_ns, nbytes, path in entries:
            if used + size <= self.config.limit_bytes:
                return
            if self._evict(path):
                used -= nbytes
                self.counters.add("cache_evictions")
                self.counters.add("cache_evicted_bytes", nbytes)
        if size and used + size > self.config.limit_bytes:
            self.counters.add("cache_over_limit")

    def _room_on_disk(self, reservation: Reservation, size: int) -> None:
        """Claim a fill's ``size`` bytes of disk, evicting copies while the disk is full.

        The limit alone was not enough: copies pinned or mapped into batches past it (as
        the docs allow) can fill a small disk, and the next job, whose default limit
        counts what the cache holds as its own, then failed every fill on the full disk
        while it held copies it could evict (so did every later job). Asked of the file
        system itself (``fallocate``), not ``statvfs``: a root process may write into an
        ext4 disk's reserve, and a count of the space free to others emptied its cache at
        every fill. Where blocks cannot be reserved (ext2, NFS before 4.2, most FUSE file
        systems) the free space ``statvfs`` gives this process is the test: the blocks
        free to root for root, those free to others for anyone else.
        """
        def fits() -> bool:
            claimed = reservation.claim(size)
            return claimed is True or (claimed is None and not _disk_short(self._tmp, size))

        if fits():
            return
        with self._lock("evict"):
            for _used_ns, nbytes, path in sorted(self._entries()):
                if self._evict(path):
                    self.counters.add("cache_evictions")
                    self.counters.add("cache_evicted_bytes", nbytes)
                    if fits():
                        return

    def _evict(self, path: str) -> bool:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return False
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False  # pinned by a reader
            os.unlink(path)
            with contextlib.suppress(OSError):
                os.unlink(self.used_path(os.path.basename(path)))
            return True
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return False
            raise StorageError(f"cache eviction of {path}: {exc.strerror or exc}") from exc
        finally:
            os.close(fd)


class _HashingWriter:
    """A write-only file that hashes what passes through it."""

    def __init__(self, raw: BinaryIO) -> None:
        self.raw = raw
        self.hasher = Hasher()

    def write(self, data: bytes | bytearray | memoryview) -> int:
        self.hasher.update(data)
        return self.raw.write(data)


def copies_bytes(directory: str) -> int:
    """Bytes of the copies a cache at ``directory`` holds; 0 where there is no cache.

    Only lists (the cache is not claimed, no ``used/`` file is removed): for the default
    limit, which counts what the cache holds as its own.
    """
    if not os.path.isfile(os.path.join(directory, MARKER)):
        return 0
    return sum(st.st_size for _, _, st in _copies(os.path.join(directory, "objects")))


def _copies(objects: str) -> Iterator[tuple[str, str, os.stat_result]]:
    """``(object id, path, lstat)`` of each copy under a cache's ``objects/`` folder.

    Names that are not object ids, ids outside their own folder (``objects/<id[:2]>/``)
    and entries that are not regular files are no copies;
    a copy evicted while the folder is listed is passed over.
    """
    for folder in _subfolders(objects):
        for name in _listdir(folder):
            if not is_object_id(name) or os.path.basename(folder) != name[:2]:
                continue  # an id in another's folder is never a copy: someone else's file
            path = os.path.join(folder, name)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode):
                yield name, path, st


def _subfolders(path: str) -> Iterator[str]:
    """The entries of ``path`` that are folders, not links to one.

    Not files someone left there (they broke every listing), nor links (eviction would
    delete what they point at).
    """
    for name in _listdir(path):
        sub = os.path.join(path, name)
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISDIR(os.lstat(sub).st_mode):
                yield sub


def _noting(fn: Callable[..., T], failures: list[StorageError]) -> Callable[..., T]:
    """``fn``, adding each ``StorageError`` it raises to ``failures`` on the way out."""

    def call(*args: Any) -> T:
        try:
            return fn(*args)
        except StorageError as exc:
            failures.append(exc)
            raise

    return call


def _stripe(object_id: str) -> str:
    return object_id[:3]


def _disk_short(folder: str, size: int) -> bool:
    """Whether the disk of ``folder`` has less than ``size`` bytes this process may write.

    For a file system that cannot reserve blocks: the fills under way in ``folder`` (this
    one's among them) have their length, not their blocks, so what they have still to
    write is what must fit. False when the disk cannot say.
    """
    try:
        st = os.statvfs(folder)
    except OSError:
        return False
    free = (st.f_bfree if hasattr(os, "geteuid") and os.geteuid() == 0 else st.f_bavail)
    pending = sum(max(0, fill.st_size - fill.st_blocks * 512) for fill in _fills(folder))
    need = max(size, pending)
    # and the file system's own blocks for them: ext2's indirect blocks are 0.4% of a
    # file in 1 KiB blocks, and a folder made for a copy takes a block; without this
    # margin two fills that fit to the byte failed their last writes (ENOSPC)
    return free * st.f_frsize < need + need // 128 + 16 * st.f_frsize


def _fills(folder: str) -> Iterator[os.stat_result]:
    """The ``lstat`` of each fill under way in a cache's ``tmp/`` ``folder``."""
    for name in _listdir(folder):
        with contextlib.suppress(FileNotFoundError):
            yield os.lstat(os.path.join(folder, name))


def _listdir(path: str) -> list[str]:
    """The names in folder ``path``, none if it is gone.

    A folder that cannot be listed (out of descriptors, say) is a StorageError naming it:
    it escaped as a bare ``OSError``.
    """
    try:
        return sorted(os.listdir(path))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise StorageError(f"cache folder {path}: cannot be listed: {exc.strerror or exc}") \
            from exc


def job_identity() -> str:
    """The job this process reads for, as far as a node can tell: who shares failed fills.

    The distributed job whose rendezvous this process joins (``MASTER_ADDR`` and
    ``MASTER_PORT``, which torchrun sets for every rank it starts, each in a session of
    its own), else the Slurm job step (``SLURM_JOB_ID``, ``SLURM_STEP_ID``), else the
    process group (a training process, its DataLoader workers and whatever else one
    shell command started). Jobs these cannot tell apart (two started by one script
    without sessions of their own) share their failed fills, as every job did before.
    """
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if addr and port:
        return f"rendezvous {addr}:{port}"
    slurm = os.environ.get("SLURM_JOB_ID")
    if slurm:
        return f"slurm {slurm}.{os.environ.get('SLURM_STEP_ID', '')}"
    return f"process group {os.getpgrp()}"
