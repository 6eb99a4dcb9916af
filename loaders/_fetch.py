"""Getting a shard's bytes to its reader: direct local files, the disk cache, or ranged reads.

Three ways, chosen per store when a worker starts reading:

- ``local``: the store has a local path for the object (``LocalStore``): the reader opens
  that file; :meth:`ShardAccess.prepare` hashes it once per process when ``verify`` is on
  (which also pulls it into the page cache ahead of decoding).
- ``cache``: a remote store and a ``cache_dir``: :meth:`prepare` fills the disk cache
  (one hash-verified download per node: a single streamed GET where the store offers
  :class:`SupportsOpenRead`, as S3 does) and the reader opens the cached copy, which a
  hit does not hash again.
- ``ranged``: a remote store and no cache: the reader gets a :class:`~._ranged.RangedFile`, a
  seekable file whose reads become ranged GETs, aligned to blocks so that neighbouring
  ranges coalesce into one request. Only the bytes of the requested fields and rows are
  fetched; they cannot be hash-checked without the whole object (Parquet readers verify
  each page's CRC-32 instead; use a cache for whole-object verified reads).

Every remote read passes the process's :class:`RateLimiter` (``max_bandwidth``) and is
counted per tier.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO, Literal, Protocol, cast, runtime_checkable

from simstore.loaders._cache import CacheConfig, DamagedCopyError, PinnedCopy, ShardCache
from simstore.loaders._ranged import (
    MIN_RANGE_BLOCKS_BYTES,
    RangeBlocks,
    RangedFile,
    RateLimiter,
    billed_if_failed,
    count_retries,
    tier_of,
)
from simstore.loaders._stats import Counters
from simstore.loaders._trust import TrustTable, VerifiedTable, file_stamp

from simstore._verified import NodeRecords, stamp_info
from simstore.catalog._caps import Kind, max_bytes, read_capped
from simstore.errors import IntegrityError, NotFoundError, SimstoreError, StorageError
from simstore.hashing import hash_bytes, hash_file, object_key
from simstore.storage import ObjectStore

__all__ = [
    "AccessMode",
    "RangedFile",
    "RateLimiter",
    "ShardAccess",
    "ShardHandle",
    "tier_of",
]

AccessMode = Literal["local", "cache", "ranged"]
_UNKNOWN = object()  # a shard this process has not checked
_FILL_BLOCK_BYTES = 64 * 1024 * 1024
_STREAM_BLOCK_BYTES = 1024 * 1024


class ObjectStream(Protocol):
    """A whole object being read in order (``S3Store.open_read`` makes one)."""

    size_bytes: int
    requests: int

    def read(self, size: int) -> bytes:
        """The next bytes, at most ``size``; empty at the end."""
        ...

    def readinto(self, buffer: bytearray | memoryview) -> int:
        """Fill ``buffer`` with the next bytes (fewer only at the end); how many, 0 at the end."""
        ...

    def close(self) -> None:
        """Let go of the connection."""
        ...


@runtime_checkable
class SupportsOpenRead(Protocol):
    """Optional fast path of a remote store: stream a whole object with one GET.

    A cache fill then costs one request (no HEAD for the size, no ranged GETs) and holds
    one block in memory. Stores without it are read by HEAD and blocks of
    ``_FILL_BLOCK_BYTES``.
    """

    def open_read(self, key: str) -> ObjectStream:
        """Open the object for reading; raises ``NotFoundError`` when it is missing."""
        ...


def missing_text(store: ObjectStore, key: str, snapshot_id: str) -> str:
    """What to say of object ``key``, which snapshot ``snapshot_id`` names, gone from the store.

    Damage, as ``verify`` reports it, while the snapshot is there; once the snapshot
    itself is gone too, gc collected it after its last branch or tag was moved or
    deleted (it knows nothing of the jobs reading it), or the job was built from a node
    cache's copy of a snapshot another store wrote, and the text says so: ``verify`` of
    the store is clean then, and an operator would look for damage that is not there.
    """
    text = f"{store.url}: {key} is missing"
    if not snapshot_id:
        return text
    text += f"; referenced by snapshot {snapshot_id}"
    try:
        kept = store.exists(object_key(snapshot_id))
    except SimstoreError:  # the store cannot say: the error is the object's, as it was
        return text
    if kept:
        return text
    return (f"{text}, which is not in the store either: gc collected it once no branch "
            f"or tag reached it (keep a tag on a snapshot while jobs read it), or the job "
            f"reads another store than the one that wrote it")


FileIdentity = tuple[int, int, int, int]
"""A file's device, inode, size and modification time (ns): which file a path names."""


def file_identity(st: os.stat_result) -> FileIdentity:
    """The identity of the file ``st`` describes (see :data:`FileIdentity`)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def names_file(path: str, pinned: FileIdentity | None) -> bool:
    """Whether ``path`` still names the file ``pinned`` identifies (True with no pin)."""
    if pinned is None:
        return True
    try:
        return file_identity(os.stat(path)) == pinned
    except OSError:
        return False


@dataclass(slots=True)
class ShardHandle:
    """What a reader opens: a local path or a file object, and how to let go of it."""

    source: str | BinaryIO
    release: Callable[[], None]
    trusted: bool = False
    """Whether its reader may skip page CRC-32s: this process hashed the whole source to
    its id (a local shard checked, a cache copy filled here), or ``verify`` is off."""
    pinned: FileIdentity | None = None
    """A cache copy's identity when it was pinned: its check hashes that file only, not
    whatever file the path names by the time the check runs."""


class ShardAccess:
    """Fetches and opens shards of one store for one reading process (not shared)."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        counters: Counters,
        limiter: RateLimiter,
        cache: CacheConfig | None,
        verify: bool,
        referenced_by: str = "",
        block_bytes: int = 1 << 20,
        range_blocks: RangeBlocks | None = None,
        siblings: VerifiedTable | None = None,
        trusted: TrustTable | None = None,
        node: NodeRecords | None = None,
        job_start: float | None = None,
    ) -> None:
        self.store = store
        self.job_start = job_start
        """When the job started (``time.time()``): cache hits on copies filled before are
        warm hits (see ``ShardCache``); None counts none."""
        self.siblings = siblings
        """Where this DataLoader worker and its siblings share local shards' hashes."""
        self.trusted = trusted
        """Files hashed to their ids in earlier epochs of this job (see ``TrustTable``)."""
        self.node = node
        """Files hashed to their ids by earlier jobs on this node (see ``NodeRecords``)."""
        self.counters = counters
        self.limiter = limiter
        self.verify = verify
        self.referenced_by = referenced_by
        self.tier = tier_of(store)
        count_retries(store, counters, self.tier)
        self.block_bytes = block_bytes
        self.range_blocks = (range_blocks if range_blocks is not None
                             else RangeBlocks(MIN_RANGE_BLOCKS_BYTES))
        """Blocks of ranged reads, kept for all the ranged files of the reading process's
        sources at once (keyed by store and object)."""
        self._cache_config = cache
        self._cache: ShardCache | None = None
        self._local: dict[str, str | None] = {}
        self._verified: dict[str, int | None] = {}
        """Shards whose file hashed to their id in this process (or a sibling's), each
        with the :func:`file_stamp` of the file then: one changed since (a copy rewritten
        in place) is checked again at its next open, not trusted by its id alone."""
        self._lock = threading.Lock()

    def mode(self, shard_id: str) -> AccessMode:
        """How this shard is read: ``local`` when the store has a local file for it."""
        with self._lock:
            if shard_id not in self._local:
                self._local[shard_id] = self.store.local_path(object_key(shard_id))
            path = self._local[shard_id]
        if path is not None:
            return "local"
        return "cache" if self._cache_config is not None else "ranged"

    def downloads(self, shard_id: str) -> bool:
        """Whether opening this shard waits for a download into the disk cache.

        A remote shard whose copy is not (yet) there: a stat, so a sibling may be filling
        it meanwhile.
        """
        if self.mode(shard_id) != "cache":
            return False
        return not os.path.exists(self._shard_cache().path_of(shard_id))

    def _shard_cache(self) -> ShardCache:
        with self._lock:
            if self._cache is None:
                assert self._cache_config is not None
                self._cache = ShardCache(self._cache_config, self.counters,
                                         job_start=self.job_start)
                self._cache.fill_requests = self.fill_requests
            return self._cache

    def fill_requests(self, size: int) -> int:
        """The requests a cache fill of an object of ``size`` bytes sends (see ``_cached``).

        One streamed GET; a HEAD for the size and a GET per block of ``_FILL_BLOCK_BYTES``
        where the store does not stream or ``max_bandwidth`` paces the fill.
        """
        if isinstance(self.store, SupportsOpenRead) and not self.limiter.rate:
            return 1
        return 1 + max(1, -(-size // _FILL_BLOCK_BYTES))

    @contextlib.contextmanager
    def _referenced(self, shard_id: str) -> Iterator[None]:
        """A shard the snapshot names but the store lacks: damage, as ``verify`` says.

        Not the :class:`NotFoundError` of an unknown key or ref (exit 3, a
        ``LookupError``), which a caller may take for a normal miss.
        """
        try:
            yield
        except NotFoundError as exc:
            raise self.missing(shard_id) from exc

    def missing(self, shard_id: str) -> IntegrityError:
        """The error of a shard the snapshot names but the store lacks."""
        return IntegrityError(missing_text(self.store, object_key(shard_id), self.referenced_by))

    def prepare(self, shard_id: str) -> ShardHandle | None:
        """Background work before a shard is opened: verify it, or fill the cache."""
        with self._referenced(shard_id):
            return self._prepare(shard_id)

    def _prepare(self, shard_id: str) -> ShardHandle | None:
        mode = self.mode(shard_id)
        if mode == "local":
            self._verify_local(shard_id)
            return None
        if mode == "cache":
            return self._cached(shard_id)
        return None

    def open(
        self, shard_id: str, prepared: ShardHandle | None, *, verified: bool = True
    ) -> ShardHandle:
        """The source a reader opens for ``shard_id`` (using what :meth:`prepare` made).

        ``verified=False`` opens a local shard whose hash :meth:`prepare` is still
        checking (the caller answers for waiting on it).
        """
        if prepared is not None:
            if isinstance(prepared.source, str) and not names_file(prepared.source,
                                                                   prepared.pinned):
                # a cache copy taken out (found damaged) since it was prepared: a reader
                # of it could only fail; the copy at the path now, or a new fill, instead
                prepared.release()
            else:
                return prepared
        with self._referenced(shard_id):
            return self._open(shard_id, verified)

    def _open(self, shard_id: str, verified: bool) -> ShardHandle:
        key = object_key(shard_id)
        mode = self.mode(shard_id)
        if mode == "local":
            if verified:
                self._verify_local(shard_id)
            path = self._local[shard_id]
            assert path is not None
            return ShardHandle(path, _nothing, trusted=verified)
        if mode == "cache":
            return self._cached(shard_id)
        size = self._size(key)
        f = RangedFile(
            self.store,
            key,
            size,
            counters=self.counters,
            limiter=self.limiter,
            block_bytes=self.block_bytes,
            blocks=self.range_blocks,
        )
        return ShardHandle(cast(BinaryIO, f), f.close, trusted=not self.verify)

    def close(self) -> None:
        """Bring the cache back within its limit once this reader's pins are gone."""
        if self._cache is not None:
            self._cache.trim()

    # -- the modes ---------------------------------------------------------------------
    def _verify_local(self, shard_id: str) -> None:
        if not self.unchecked(shard_id) or self.sibling_verified(shard_id):
            return
        key = object_key(shard_id)
        path = self._local.get(shard_id) or self.store.local_path(key)
        if path is None:
            raise NotFoundError(f"{self.store.url}: no object {key}")
        try:
            with open(path, "rb") as f:
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_WILLNEED)
            wrong = self._hash_against(shard_id, path, self.tier)
        except FileNotFoundError:
            raise NotFoundError(f"{self.store.url}: no object {key}") from None
        except OSError as exc:
            raise StorageError(f"{self.store.url}/{key}: read failed: {exc}") from exc
        if wrong is not None:
            raise IntegrityError(
                f"{self.store.url}: {key} has hash {wrong}, expected {shard_id}{self._by()}"
            )

    def unchecked(self, shard_id: str) -> bool:
        """Whether ``shard_id`` still needs its whole-object hash in this process.

        Not if its file was hashed here (or by a sibling) and is unchanged since, or if
        the store's local file for it (or its cache copy) hashed to its id in an earlier
        epoch and is unchanged (``trusted``), or in an earlier job on this node within
        ``verify_every_s`` (``node``); unchanged: the same :func:`file_stamp`.
        """
        with self._lock:
            if not self.verify:
                return False
            known = self._verified.get(shard_id, _UNKNOWN)
            path = self._local.get(shard_id)
        if known is not _UNKNOWN:
            if known is None or known == self._stamp(shard_id, path):
                return False
            with self._lock:  # changed since it was checked here: checked again
                self._verified.pop(shard_id, None)
        if self.trusted is None and self.node is None:
            return True
        stamp = self._stamp(shard_id, path)
        if stamp is None:
            return True
        if self.trusted is None or not self.trusted.has(shard_id, stamp):
            if self.node is None or not self.node.has(shard_id, stamp):
                return True
            if self.trusted is not None:
                self.trusted.add(shard_id, stamp)
        with self._lock:
            self._verified[shard_id] = stamp
        self.counters.add("shards_trusted")
        return False

    def _stamp(self, shard_id: str, path: str | None) -> int | None:
        """The :func:`file_stamp` of the shard's local file, or of its cache copy."""
        if path is not None:
            return file_stamp(path)
        if self._cache_config is not None:
            return file_stamp(self._shard_cache().path_of(shard_id))
        return None

    def _hash_against(
        self, shard_id: str, path: str, tier: str, fd: int | None = None
    ) -> str | None:
        """Hash ``path`` (a read of ``tier``); None if it is ``shard_id``, else its hash.

        ``fd``: the file to hash, open (``path`` names it). A match is remembered: the
        shard is not hashed again in this process, nor by a later job on this node while
        the file is unchanged (``node``).
        """
        # the stamp before: a file changed while hashed is hashed again
        stamped_ns = time.time_ns()
        source = path if fd is None else fd
        info = stamp_info(source)
        actual, size = hash_file(source, pace=self._pace if self.limiter.rate else None)
        self.counters.add_read(tier, size)
        self.counters.add("shards_verified")
        if actual != shard_id:
            return actual
        self._matched(shard_id, info, stamped_ns)
        return None

    def _matched(
        self, shard_id: str, info: tuple[int, int] | None, stamped_ns: int | None
    ) -> None:
        """Remember that the file with stamp ``info`` holds ``shard_id``'s bytes.

        In this process, for this job's later epochs and sibling workers, and, given
        ``stamped_ns`` (when the stamp was taken), in the node's records (which refuse a
        file changed too recently).
        """
        with self._lock:
            self._verified[shard_id] = info[0] if info is not None else None
        if info is not None:
            if self.trusted is not None:
                self.trusted.add(shard_id, info[0])
            if self.node is not None and stamped_ns is not None:
                self.node.add(shard_id, info[0], info[1], stamped_ns)
            if self.siblings is not None:
                self.siblings.publish(shard_id, info[0])

    def _pace(self, nbytes: int) -> None:
        """A whole-shard hash reads the file: ``max_bandwidth`` caps it like any read."""
        self.counters.add("throttle_s", self.limiter.take(nbytes))

    def sibling_hashes(self, shard_id: str) -> bool:
        """Whether a sibling worker hashes this shard (this one waits for its word).

        Local shards and cache copies: the workers of one loader on one node read the
        same file for a shard id.
        """
        siblings = self.siblings
        return (siblings is not None and self.verify
                and self.mode(shard_id) in ("local", "cache") and not siblings.owns(shard_id))

    def sibling_verified(self, shard_id: str) -> bool:
        """Whether a sibling worker has published this shard's hash as matching."""
        siblings = self.siblings
        if siblings is None:
            return False
        # the match is for the file the sibling hashed, with its stamp: the file at the
        # path must have it still (one written in place since is hashed again; a reader
        # holding another, replaced since, is told apart by its pin: ``names_file``)
        stamp = self._stamp(shard_id, self._local.get(shard_id))
        if stamp is None or not siblings.has(shard_id, stamp):
            return False
        with self._lock:
            self._verified[shard_id] = stamp
        self.counters.add("shards_verified_by_sibling")
        return True

    def _by(self) -> str:
        return f"; referenced by snapshot {self.referenced_by}" if self.referenced_by else ""

    def settle_copy(self, shard_id: str) -> bool:
        """Hash the cache copy at the shard's path now, if unchecked; whether one went.

        For a shard about to be read again because its reader's copy was found damaged:
        the file at the path may be that same damaged file (rewritten in place: not the
        one the reader pinned, so "gone" to it), which a new reader would pin and fail
        on again. A damaged one is taken out here (True), and the read fills anew.
        """
        if not self.verify or self.mode(shard_id) != "cache":
            return False
        try:
            self.check_copy(shard_id, self._shard_cache().path_of(shard_id))
        except DamagedCopyError as exc:
            return exc.taken_out
        return False

    def check_copy(
        self, shard_id: str, path: str, pinned: FileIdentity | None = None
    ) -> bool:
        """Hash a cache hit's copy once in this process (its reader checks pages meanwhile).

        ``pinned``, the copy's identity when its reader's handle pinned it: only that file
        is hashed (and removed if damaged). Another process may have taken a damaged copy
        out and filled a good one at the same path since; hashing the good one would
        vouch for the damaged file the reader holds. A path that names another file now
        counts as gone.

        A copy was verified when it was filled, perhaps by another process long ago; this
        catches a copy damaged since. A wrong copy is taken out of the cache (the next use
        downloads it again) and raises :class:`IntegrityError`. True once the copy (here
        or in a sibling worker) hashed to its id; False when it is gone from the cache
        (evicted after its reader let go, or taken out as damaged by another process):
        it was not hashed, so its reader must go on checking pages.
        """
        if not names_file(path, pinned):
            # before any verdict on the shard: it may be a sibling's on a new copy filled
            # at this path after the reader's was taken out as damaged
            return False
        if not self.unchecked(shard_id) or self.sibling_verified(shard_id):
            return True
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise StorageError(f"cache copy {path}: read failed: {exc}") from exc
        try:
            if pinned is not None and file_identity(os.fstat(fd)) != pinned:
                return False  # replaced since it was pinned: the reader's copy is gone
            wrong = self._hash_against(shard_id, path, "cache", fd)
            if wrong is not None:
                raise self._remove_damaged(path, wrong, shard_id, fd)
        except OSError as exc:
            raise StorageError(f"cache copy {path}: read failed: {exc}") from exc
        finally:
            os.close(fd)
        return True

    def read_cached(
        self, object_id: str, *, fill: bool = True, starts_with: bytes = b"",
        kind: Kind = "manifest part",
    ) -> tuple[bytes, str] | None:
        """A small immutable object (a manifest part) from the disk cache, and its tier.

        ``kind``: what the object is (``"snapshot"``); one larger than any of its kind is
        refused before it is downloaded, an :class:`IntegrityError` (``_caps.py``).

        With a disk cache in front of a remote store, the node's copy is read: filled on a
        miss (one GET, hashed as it is written) and hashed on each hit, so a warm epoch
        reads nothing from the remote tier; the bytes returned match ``object_id``. A copy
        that no longer matches is taken out of the cache and raises
        :class:`IntegrityError`; the next read downloads it again. None when this store
        has no cache in front of it: read (and check) the object from the store; also None
        when the cached copy does not begin with ``starts_with`` (not read further, nor
        hashed), and with ``fill=False`` on a miss (nothing is asked of the store).
        """
        if self.mode(object_id) != "cache":
            return None
        key = object_key(object_id)
        fetched: list[bytes] = []

        by = self._by() if kind == "manifest part" else ""

        def size_bytes() -> int:
            with billed_if_failed(self.counters, self.tier):
                fetched.append(read_capped(self.store, key, kind, by=by))
            return len(fetched[0])

        downloaded = False

        def download(out: BinaryIO) -> None:
            # the bytes of the GET that told the size; a download again (the first did
            # not hash to the id) GETs the object anew, and its bytes are the answer
            nonlocal downloaded
            if downloaded or not fetched:
                with billed_if_failed(self.counters, self.tier):
                    fetched[:] = [read_capped(self.store, key, kind, by=by)]
            downloaded = True
            out.write(fetched[0])

        cache = self._shard_cache()
        if fill:
            copy = cache.acquire(object_id, size_bytes, download,
                                 referenced_by=self.referenced_by, counted_as="manifest_cache")
        else:
            peeked = cache.peek(object_id, counted_as="manifest_cache")
            if peeked is None:
                return None
            copy = peeked
        try:
            if not copy.hit:
                return fetched[0], self.tier
            try:
                # the pinned file itself, whatever its path names by now
                pinned = copy.fd
                with (open(pinned, "rb", closefd=False) if pinned is not None
                      else open(copy.path, "rb")) as f:
                    f.seek(0)
                    if starts_with and f.read(len(starts_with)) != starts_with:
                        return None
                    # a copy grown past any object of its kind is damage, not read whole
                    if os.fstat(f.fileno()).st_size > max_bytes(kind):
                        raise self._remove_damaged(
                            copy.path, "", object_id, pinned,
                            found=f"is larger than any {kind} simstore writes")
                    f.seek(0)
                    data = f.read()
                actual = hash_bytes(data)
                if actual != object_id:
                    raise self._remove_damaged(copy.path, actual, object_id, pinned)
            except OSError as exc:
                raise StorageError(f"cache copy {copy.path}: read failed: {exc}") from exc
        finally:
            copy.release()
        return data, "cache"

    def _remove_damaged(
        self, path: str, actual: str, object_id: str, fd: int | None = None, *,
        found: str = "",
    ) -> DamagedCopyError:
        """Take a cache copy that does not hash to its id out of the cache; the error.

        With ``fd`` (the damaged file, open), the path is removed only while it still
        names that file: a good copy another process filled there since stays. ``found``:
        what is wrong with it, where it was not hashed (else its hash ``actual``).
        """
        removed = False
        with contextlib.suppress(OSError):
            if fd is None or file_identity(os.stat(path))[:2] == file_identity(
                    os.fstat(fd))[:2]:
                os.unlink(path)
                removed = True
        error = DamagedCopyError(
            f"cache copy {path} {found or f'has hash {actual}'}, expected {object_id}"
            f"{self._by()} (removed from the cache)"
        )
        error.taken_out = removed
        return error

    def _size(self, key: str) -> int:
        with billed_if_failed(self.counters, self.tier):
            info = self.store.info(key)
        self.counters.add_read(self.tier, 0)
        return info.size_bytes

    def _cached(self, shard_id: str) -> ShardHandle:
        key = object_key(shard_id)
        streams: list[ObjectStream] = []
        sizes: list[int] = []

        def size_bytes() -> int:
            # asked only on a miss: a store that streams whole objects sends its one GET
            # now and learns the size from it; any other store answers a HEAD, and so
            # does one under max_bandwidth, whose fill then pays for each block before
            # its GET: a streamed GET's server sends at once into the socket's buffers
            # whether or not they are read (a cold start's fills took a whole 1.25 MiB
            # shard each in its first second at a 1 MiB/s cap)
            if isinstance(self.store, SupportsOpenRead) and not self.limiter.rate:
                with billed_if_failed(self.counters, self.tier):  # its first GET failed
                    streams.append(self.store.open_read(key))
                sizes.append(streams[-1].size_bytes)
            else:
                sizes.append(self._size(key))
            return sizes[-1]

        downloaded = False

        def download(out: BinaryIO) -> None:
            nonlocal downloaded
            if not sizes or (downloaded and streams):
                # the size (with a streaming store, its GET); again for a download again
                # (the first did not hash to the id): the first stream is read to its end
                size_bytes()
            downloaded = True
            if streams:
                self._copy_stream(streams[-1], out)
            else:
                self._copy_blocks(key, sizes[-1], out)

        cache = self._shard_cache()
        try:
            copy: PinnedCopy = cache.acquire(
                shard_id, size_bytes, download, referenced_by=self.referenced_by,
                filled=lambda fd: self._filled(shard_id, fd),
            )
        except IntegrityError as exc:
            # a fill that did not hash to the id: the store's object is damaged; the cache
            # knows no store, and a mixture's stores are told apart by it (ranged reads
            # of the same object named it)
            url = str(getattr(self.store, "url", ""))
            if not url or str(exc).startswith(url):
                raise
            raise IntegrityError(f"{url}: {exc}") from exc
        finally:
            for stream in streams:
                self.counters.add_read(self.tier, 0, requests=stream.requests)
                stream.close()
        # a fill is trusted (remembered in ``filled``, or verify=False); a hit while
        # unchecked, unless a sibling was still publishing the fill when the copy was found
        trusted = not self.unchecked(shard_id)
        if not trusted and copy.hit and self.trusted is not None:
            cache.settled(shard_id)
            trusted = not self.unchecked(shard_id)
        pinned = None if copy.fd is None else file_identity(os.fstat(copy.fd))
        # what vouches for the shard is the file at the path: trusted only while that is
        # still the copy pinned here (a sibling may have taken it out as damaged and
        # filled a new one there since it was pinned)
        trusted = trusted and names_file(copy.path, pinned)
        return ShardHandle(copy.path, copy.release, trusted=trusted, pinned=pinned)

    def _filled(self, shard_id: str, fd: int) -> None:
        """This process filled the copy open as ``fd`` with bytes that hashed to ``shard_id``.

        Its sibling workers and this job's later epochs trust the copy while its stamp is
        unchanged, as they trust a local file this job hashed (a sibling used to hash the
        copy again: 64 MiB per shard and worker on a cold epoch). The node's records
        wait for a later job's hash: a file changed this recently is not recorded
        (``SETTLED_S``).
        """
        if self.verify:
            self._matched(shard_id, stamp_info(fd), None)

    def _copy_stream(self, stream: ObjectStream, out: BinaryIO) -> None:
        """Copy a streamed object into ``out`` block by block, within ``max_bandwidth``.

        Each block is received into one buffer of the thread's, written from it and
        received into again: no ``bytes`` object per block (a cold epoch's fill is one
        of the CPU's main jobs, beside the server's on a shared node).
        """
        view = memoryview(_stream_buffer())
        while True:
            n = stream.readinto(view)
            if not n:
                return
            self.counters.add("throttle_s", self.limiter.take(n))
            self.counters.add_read(self.tier, n, requests=0)
            out.write(view[:n])

    def _copy_blocks(self, key: str, size: int, out: BinaryIO) -> None:
        """Copy an object into ``out`` by GETs of at most ``_FILL_BLOCK_BYTES``."""
        if size <= _FILL_BLOCK_BYTES:
            blocks = [(0, size)]
        else:
            blocks = [
                (lo, min(size, lo + _FILL_BLOCK_BYTES)) for lo in range(0, size, _FILL_BLOCK_BYTES)
            ]
        for lo, hi in blocks:
            self.counters.add("throttle_s", self.limiter.take(hi - lo))
            with billed_if_failed(self.counters, self.tier):
                data = (
                    self.store.get(key)
                    if len(blocks) == 1
                    else self.store.get(key, byte_range=(lo, hi))
                )
            self.counters.add_read(self.tier, len(data))
            out.write(data)


_BUFFERS = threading.local()


def _stream_buffer() -> bytearray:
    """This thread's block buffer for streamed fills (kept: fresh memory faults per page)."""
    buf: bytearray | None = getattr(_BUFFERS, "block", None)
    if buf is None:
        buf = _BUFFERS.block = bytearray(_STREAM_BLOCK_BYTES)
    return buf


def _nothing() -> None:
    return None
