"""Shard readers of one reading process: opened lazily, hashed while read, kept open few.

:class:`ReaderPool` opens shard readers lazily (so nothing is open before a worker starts,
whatever the start method), keeps at most ``max_open_shards`` open, and runs each shard's
whole-object hash (a local file, a cache hit) in the background while its first chunks are
decoded, checking pages until the hash is in. Sibling workers share finished hashes
through :class:`~simstore.loaders._fetch.ShardAccess`.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, BinaryIO, TypeVar

from simstore.loaders._cache import DamagedCopyError
from simstore.loaders._checks import shown
from simstore.loaders._corrupt import CorruptShards
from simstore.loaders._fetch import ShardAccess, ShardHandle, names_file
from simstore.loaders._indexes import INDEXES
from simstore.loaders._nodecache import LayoutCache
from simstore.loaders._opener import FormatOpener

from simstore._blockcache import BlockCache
from simstore.errors import (
    FormatError,
    IntegrityError,
    InvalidInputError,
    NotFoundError,
    SimstoreError,
)
from simstore.hashing import object_key
from simstore.protocols import ShardReader

__all__ = ["HASH_FIRST_SHARE", "ReaderPool", "ShardOpener"]

log = logging.getLogger("simstore.loaders")
ShardOpener = Callable[[str | BinaryIO], ShardReader]
T = TypeVar("T")
_HASH_DELAY_S = 5.0
"""Longest a local shard's whole-object hash waits for the first chunk to be decoded."""
_HASH_THREADS = 1
"""Background whole-object hashes running at once in one reading process."""
HASH_FIRST_SHARE = 4
"""A read that would check at least 1/4 of a local shard's bytes page by page hashes the
whole shard first (xxh3 from the page cache: ~0.14 ms/MiB; Parquet's page CRC-32s add
~0.55 ms per MiB decoded, a 60 MiB shard's 16 row groups 45 against 12 ms)."""


@dataclass(frozen=True, slots=True)
class _Check:
    """A shard's whole-object hash (a local file, a cache hit), running while it is read."""

    future: Future[Any]
    redo: Callable[[], object]
    """The same hash, run here if the future never ran."""
    _redone: Future[Any] = field(default_factory=Future)
    """The outcome of ``redo``, run once: a wrong copy's hash takes it out of the cache,
    so a second run would find nothing to hash and hide the first run's error."""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def wait(self) -> bool:
        """The hash's outcome (IntegrityError if wrong); hashed here if it never ran.

        False: the copy could not be hashed (gone from the cache); its reader goes on
        checking pages.
        """
        if self.future.cancelled():  # never started (the I/O pool shut down, or taken back)
            with self._lock:
                if not self._redone.done():
                    try:
                        self._redone.set_result(self.redo())
                    except BaseException as exc:
                        self._redone.set_exception(exc)
            return self._redone.result() is not False
        return self.future.result() is not False


class _Published(Future[Any]):
    """A shard's whole-object hash (a local file, a cache copy) that a sibling worker runs.

    Nothing runs it here: :meth:`done` is true once the sibling has published the match
    (see ``VerifiedTable``), and :meth:`result` of one still unpublished runs ``work``
    (the hash) on the calling thread (a wrong hash is then this worker's error, as before).

    ``pinned`` (a cache hit): whether the copy's path still names the file this reader
    holds. The sibling's match is on the file at the path, which is another once the
    sibling has found the reader's copy damaged and filled a new one there: the result is
    then False (the reader's copy is gone, and it goes on checking its pages). Taken for
    the reader's own, that match trusted the damaged file, and wrong values came out.
    """

    def __init__(self, access: ShardAccess, shard_id: str, work: Callable[[], Any],
                 pinned: Callable[[], bool] | None = None) -> None:
        super().__init__()
        self._access = access
        self._shard_id = shard_id
        self._work = work
        self._pinned = pinned

    def done(self) -> bool:
        if super().done():
            return True
        if self._access.sibling_verified(self._shard_id):
            # the file is looked at after the match: a match on a new copy comes after
            # the reader's copy left the path
            mine = self._pinned is None or self._pinned()
            with contextlib.suppress(InvalidStateError):
                self.set_result(None if mine else False)
            return True
        return False

    def result(self, timeout: float | None = None) -> Any:
        if not self.done():
            try:
                value = self._work()
            except BaseException as exc:
                with contextlib.suppress(InvalidStateError):
                    self.set_exception(exc)
            else:
                with contextlib.suppress(InvalidStateError):
                    self.set_result(value)
        return super().result(timeout)


class _Entry:
    __slots__ = ("checking", "dropped", "gone", "handle", "lock", "reader", "users")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reader: ShardReader | None = None
        self.handle: ShardHandle | None = None
        self.users = 0
        self.checking: _Check | None = None
        """The whole-object hash still running for a reader that checks its own pages."""
        self.gone = False
        """Its cache copy was taken out of the cache (as damaged) before it was hashed."""
        self.dropped = False
        """Taken out of the pool (:meth:`ReaderPool.drop`): its last user closes it."""

    def hashed(self, matched: bool) -> None:
        """The pending hash of the shard is done: trust the reader if it matched.

        False: its cache copy was gone (taken out as damaged by another process); the
        reader goes on checking pages, and a page error is then the damaged copy's.
        """
        self.checking = None
        if matched:
            _trust(self.reader)
        else:
            self.gone = True


class ReaderPool:
    """Open shard readers of one worker, at most ``max_open`` idle ones kept (LRU)."""

    def __init__(
        self,
        access: Sequence[ShardAccess],
        opener: ShardOpener,
        max_open: int,
        referenced_by: Sequence[str],
        decode_cache_bytes: int = 256 << 20,
        max_prepared: int = 8,
        layouts: LayoutCache | None = None,
    ) -> None:
        self.access = access
        self.layouts = layouts
        """Page layouts of trusted shards, kept on the node: a shard trusted when opened
        opens from its layout (the opener's ``open_laid_out``), and a reader trusted by
        the time it closes leaves its layout there (its ``layout_bytes``)."""
        self.opener = opener
        self.max_open = max_open
        self.referenced_by = referenced_by
        self.max_prepared = max(1, max_prepared)
        """The most shards prepared ahead of their readers at once; the chunks ahead may
        name more (a chunk of small shards names up to one per sample). Each prepared
        cache copy holds a descriptor (its pin), so past this they wait in ``_deferred``
        and are prepared as readers take the earlier ones."""
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[int, str], _Entry] = OrderedDict()
        self._prepared: dict[tuple[int, str], Future[ShardHandle | None]] = {}
        self._deferred: dict[tuple[int, str], None] = {}  # waiting, in order of use
        self._forgotten: set[tuple[int, str]] = set()  # found corrupt: never prepared again
        self._checked_after_close: list[tuple[tuple[int, str], _Check]] = []
        self._hash_now = threading.Event()
        self._hashing = threading.Semaphore(_HASH_THREADS)
        """Background hashes run one at a time: at ~7 GiB/s one thread keeps ahead of the
        reads, and all I/O threads hashing at once took every core just as the first
        batch was handed to the main process."""
        self._io: ThreadPoolExecutor | None = None
        """The I/O pool of the current epoch (where a cache hit's hash runs)."""
        self.blocks = BlockCache(decode_cache_bytes)
        self._turns = itertools.count()

    def rotation(self) -> int:
        """A new number for each call (thread-safe): where a chunk starts in its shards."""
        return next(self._turns)

    def is_pending(self, key: tuple[int, str]) -> bool:
        """Whether the shard is scheduled (cache fill, verification) and not yet open.

        A fetched copy waiting for its reader still holds its place in the cache.
        """
        with self._lock:
            return self._pending(key)

    def downloads(self, keys: Iterable[tuple[int, str]]) -> bool:
        """Whether any of these shards waits for a download into the disk cache."""
        return any(self.access[key[0]].downloads(key[1]) for key in keys)

    def is_known(self, key: tuple[int, str]) -> bool:
        """Whether the shard is open or its preparation is scheduled."""
        with self._lock:
            return key in self._entries or self._pending(key)

    def _pending(self, key: tuple[int, str]) -> bool:
        """Whether the shard is prepared or waits its turn, not yet open (locked)."""
        return key in self._prepared or key in self._deferred

    def schedule(self, key: tuple[int, str], pool: ThreadPoolExecutor) -> None:
        """Start preparing a shard (verify or cache fill) in the background.

        The whole-object hash of a local shard waits until the first chunk is decoded
        (:meth:`start_hashing`), or until a reader has to wait for background work: a
        Parquet reader checks its pages meanwhile, and the first batch does not share
        the cores with hashing. At most ``max_prepared`` shards are prepared at once;
        the others wait their turn, in order.
        """
        with self._lock:
            if key in self._entries or self._pending(key) or key in self._forgotten:
                return
            self._io = pool
            if len(self._prepared) >= self.max_prepared:
                self._deferred[key] = None
                return
            self._prepare(key, pool)

    def _prepare(self, key: tuple[int, str], pool: ThreadPoolExecutor) -> None:
        """Start preparing ``key`` (under the lock)."""
        access = self.access[key[0]]
        if access.verify and access.mode(key[1]) == "local":
            if not access.unchecked(key[1]):
                # hashed here already, or in an earlier epoch and unchanged: nothing
                # to wait for, and its reader is trusted from the start
                done: Future[ShardHandle | None] = Future()
                done.set_result(None)
                self._prepared[key] = done
            elif access.sibling_hashes(key[1]):
                self._prepared[key] = _Published(
                    access, key[1], functools.partial(access.prepare, key[1]))
            else:
                self._prepared[key] = pool.submit(
                    self._later, functools.partial(access.prepare, key[1])
                )
        else:
            self._prepared[key] = pool.submit(access.prepare, key[1])

    def _top_up(self) -> None:
        """Prepare deferred shards, in order, while fewer than ``max_prepared`` are (locked)."""
        while self._deferred and len(self._prepared) < self.max_prepared and self._io:
            nxt = next(iter(self._deferred))
            try:
                self._prepare(nxt, self._io)
            except RuntimeError:  # the epoch's I/O pool is shut down: opened when read
                break
            del self._deferred[nxt]

    def forget(self, key: tuple[int, str]) -> None:
        """Drop a scheduled shard no reader will open (one found corrupt).

        Its preparation is released (a cache copy's pin), its place goes to the next
        deferred shard, and it is not scheduled again (by the later chunks that name it).
        """
        with self._lock:
            self._forgotten.add(key)  # later chunks name it too: no download again
            prepared = self._prepared.pop(key, None)
            self._deferred.pop(key, None)
            self._top_up()
        if prepared is not None:
            _release(prepared)

    def _later(self, check: Callable[[], T]) -> T:
        """A background hash: once the first chunk is out, one at a time."""
        self._hash_now.wait(_HASH_DELAY_S)
        with self._hashing:
            return check()

    def start_hashing(self) -> None:
        """Let the local shards' whole-object hashes run (the first chunk is out)."""
        self._hash_now.set()

    @contextlib.contextmanager
    def reader(
        self, key: tuple[int, str], checks: Callable[[ShardReader], int] | None = None
    ) -> Iterator[ShardReader]:
        """Use the reader of a shard (opening it if needed); one user at a time.

        A local shard is hash-checked as a whole in the background (:meth:`schedule`).
        A reader that verifies each page it decodes (``verifies_pages``: Parquet's
        CRC-32s) starts reading before that hash is known, so the first batch does not
        wait for whole shards to be hashed; an error while the hash is pending waits for
        it (a wrong hash is the better error), and a wrong hash found later fails the
        next use of the shard, or :meth:`finish`. Any other reader waits for the hash.

        ``checks(reader)``, when given, says how many bytes the coming read would check
        page by page. When that is at least ``1 / HASH_FIRST_SHARE`` of the file, the
        hash runs here first and the read goes unchecked: hashing a file costs about a
        quarter of checking its pages' CRC-32s (a shuffled first chunk decodes every row
        group of a shard that holds one buffer of them).
        """
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = _Entry()
            entry.users += 1
            self._entries.move_to_end(key)
            # idle readers beyond max_open go before this one opens, not after its read:
            # else a read held max_open + 1 copies open while a prepared one took the slot
            # it left (prefetch.shards + max_open_shards + 1 pinned, over a cache so sized)
            evicted = self._evict_idle()
            prepared = self._prepared.pop(key, None)
            self._deferred.pop(key, None)  # not prepared yet: opened here, as it comes
        self._retire(evicted)  # their copies' pins released before more are prepared
        with self._lock:
            self._top_up()
        try:
            with entry.lock:
                if entry.reader is None:
                    self._open_entry(key, entry, prepared)
                    prepared = None
                elif prepared is not None:
                    _release(prepared)
                checking = entry.checking
                if checking is not None and checking.future.done():
                    # IntegrityError for a wrong hash, each use
                    entry.hashed(checking.wait())
                assert entry.reader is not None
                try:
                    if entry.checking is not None and checks is not None:
                        # reads the shard's metadata (a Zarr sample's zarr.json), which
                        # may be what is damaged: its error waits for the hash below
                        self._maybe_hash_first(entry, checks)
                    yield entry.reader
                except Exception as exc:
                    if entry.checking is not None:
                        self.start_hashing()
                        try:
                            entry.hashed(entry.checking.wait())
                        except IntegrityError as damaged:
                            if damaged is exc:  # the hash's own error, raised again: as is
                                raise
                            raise damaged from exc  # the hash says why the read failed
                    if entry.gone:
                        # the worker that took the copy out found it damaged, and this
                        # read found why: that is the better error
                        raise self._gone(key, _source(entry)) from exc
                    raise
        finally:
            with self._lock:
                entry.users -= 1
                orphan = entry.dropped and entry.users == 0
                evicted = self._evict_idle()
            if orphan:
                _close(entry)
            self._retire(evicted)

    def drop(self, key: tuple[int, str]) -> None:
        """Close the shard's reader over a damaged cache copy: its next use fills anew.

        The copy was taken out of the cache when its hash failed; the reader still maps
        it. A reader in use by another thread is closed by its last user, and a new
        entry opens for the next. Its page layout is not kept (it is the damaged copy's).
        """
        with self._lock:
            entry = self._entries.pop(key, None)
            prepared = self._prepared.pop(key, None)
            idle = False
            if entry is not None:
                entry.dropped, entry.checking = True, None
                idle = entry.users == 0
        if entry is not None and idle:
            _close(entry)
        if prepared is not None:
            _release(prepared)

    def _maybe_hash_first(self, entry: _Entry, checks: Callable[[ShardReader], int]) -> None:
        """Hash the shard now, then read it unchecked, if the read would check enough of it."""
        assert entry.reader is not None and entry.checking is not None
        source = _source(entry)
        if not isinstance(source, str):
            return
        try:
            size = os.path.getsize(source)
        except OSError:
            return
        if checks(entry.reader) * HASH_FIRST_SHARE < size:
            return
        check = entry.checking
        if not check.future.cancel():  # running (maybe waiting for the first chunk)
            self.start_hashing()
        # hashed here if it had not started; IntegrityError if wrong
        entry.hashed(check.wait())

    def _open_entry(
        self, key: tuple[int, str], entry: _Entry, prepared: Future[ShardHandle | None] | None
    ) -> None:
        access = self.access[key[0]]
        if prepared is not None and not prepared.done() and access.mode(key[1]) == "local":
            handle = access.open(key[1], None, verified=False)
            try:
                reader = self._open(key, handle)
            except Exception:
                self.start_hashing()
                prepared.result()  # a wrong hash is the better error
                raise
            entry.handle, entry.reader = handle, reader
            if getattr(reader, "verifies_pages", False):
                entry.checking = _Check(prepared, functools.partial(access.prepare, key[1]))
            else:
                self.start_hashing()
                prepared.result()
                _trust(reader)
            return
        if prepared is not None and not prepared.done():
            self.start_hashing()  # never wait on work queued behind delayed hashes
        handle_ready = prepared.result() if prepared is not None else None
        handle = access.open(key[1], handle_ready)
        source = handle.source
        check: Callable[[], bool] | None = None
        pinned: Callable[[], bool] | None = None
        if (not handle.trusted and access.verify and isinstance(source, str)
                and access.mode(key[1]) == "cache"):
            # a cache hit: hashed once in this process (or by the sibling worker that owns
            # it), like a local shard
            check = functools.partial(access.check_copy, key[1], source, handle.pinned)
            pinned = functools.partial(names_file, source, handle.pinned)
        try:
            reader = self._open(key, handle)
        except Exception as exc:
            if check is not None and not check():  # a damaged copy is the better error
                raise self._gone(key, source) from exc
            raise
        pages = bool(getattr(reader, "verifies_pages", False))
        hashing: Future[Any] | None = None
        if check is not None and pages and self._io is not None:
            try:
                hashing = (_Published(access, key[1], check, pinned)
                           if access.sibling_hashes(key[1])
                           else self._io.submit(self._later, check))
            except RuntimeError:  # that pool has shut down: hashed now, below
                hashing = None
        if check is not None and hashing is None:
            # a reader that checks nothing itself reads a hit only once it has hashed; so
            # does one with no epoch's pool to hash it meanwhile (a lookup: ``get``)
            try:
                if check():
                    _trust(reader)
                elif not pages:
                    raise self._gone(key, source)
            except BaseException:
                with contextlib.suppress(Exception):
                    reader.close()
                handle.release()
                raise
        entry.handle, entry.reader = handle, reader
        if handle.trusted:
            _trust(reader)
        elif check is not None and hashing is not None:
            entry.checking = _Check(hashing, check)

    def _gone(self, key: tuple[int, str], source: object) -> DamagedCopyError:
        """A pinned cache copy that vanished: another reader found it damaged."""
        return DamagedCopyError(
            f"{self._name(key)}: cache copy {source} was taken out of the cache as damaged "
            "before this reader could hash it"
        )

    def finish(self, corrupt: CorruptShards | None = None) -> None:
        """Wait for the hashes still running of shards already read; raise a wrong one.

        With ``corrupt`` (``on_corrupt="skip"``), a wrong one is recorded there instead. A
        cache copy found damaged now, after the shard's last read, is neither: its reads
        were checked page by page (a reader without page checks waits for the hash), it
        is out of the cache, and the next read fills a new copy from the store. It is
        logged and counted (``cache_damaged``), as a copy found damaged while read is.
        """
        self.start_hashing()
        with self._lock:
            checking = [(k, e.checking) for k, e in self._entries.items()
                        if e.checking is not None]
            checking += self._checked_after_close
            self._checked_after_close = []
        for key, check in checking:
            try:
                check.wait()
            except DamagedCopyError as exc:
                log.warning("%s: %s (its reads this epoch passed their page checks)",
                            self._name(key), exc)
                if exc.taken_out:
                    self.access[key[0]].counters.add("cache_damaged")
            except IntegrityError as exc:
                if corrupt is None:
                    raise
                corrupt.failed(key, exc)

    def _open(self, key: tuple[int, str], handle: ShardHandle) -> ShardReader:
        try:
            reader = (self._reopened(key, handle) or self._laid_out(key, handle)
                      or self.opener(handle.source))
        except NotFoundError as exc:
            # gone between its check and its open, or not a file (a folder in its place):
            # damage the snapshot names, as a shard found missing before its open is
            handle.release()
            raise self.access[key[0]].missing(key[1]) from exc
        except SimstoreError as exc:
            handle.release()
            raise type(exc)(f"{self._name(key)}: {exc}") from exc
        except Exception as exc:
            handle.release()
            raise FormatError(f"{self._name(key)} is not a readable shard: {exc}") from exc
        if reader is None or not callable(getattr(reader, "close", None)):
            # None was a bare AssertionError later; every reader the pool holds is closed
            handle.release()
            raise InvalidInputError(
                f"{self._name(key)}: shard_opener returned {shown(reader)}, not a shard "
                f"reader (an object with read() and close())"
            )
        copied = getattr(reader, "copy_id", None)
        if copied is not None and not handle.trusted and copied != key[1]:
            # a reader that copied the whole object (Lance, from a ranged file) hashed it
            with contextlib.suppress(Exception):
                reader.close()
            handle.release()
            raise IntegrityError(f"{self._name(key)} has hash {copied}, expected {key[1]}")
        self.access[key[0]].counters.add("shards_opened")
        share = getattr(reader, "share_cache", None)
        if callable(share):
            share(self.blocks)
        return reader

    def _reopened(self, key: tuple[int, str], handle: ShardHandle) -> ShardReader | None:
        """A trusted local shard opened from the index its last reader here left, or None.

        Trusted: its file hashed to the id the index was kept by (``loaders._indexes``).
        """
        if (not handle.trusted or not isinstance(handle.source, str)
                or not self._keeps_indexes(key)):
            return None
        index = INDEXES.take(key[1])
        if index is None:
            return None
        try:
            reader: ShardReader = index.reopen(handle.source)
        except Exception:  # opened the usual way next, with that open's own errors
            return None
        self.access[key[0]].counters.add("shards_reopened")
        return reader

    def _laid_out(self, key: tuple[int, str], handle: ShardHandle) -> ShardReader | None:
        """A trusted local shard opened from the page layout an earlier job kept, or None.

        Trusted: its file hashed to its id, so a layout named by the id is the file's.
        """
        laid = getattr(self.opener, "open_laid_out", None)
        if (self.layouts is None or not handle.trusted or not isinstance(handle.source, str)
                or not callable(laid)):
            return None
        data = self.layouts.read_entry(key[1])
        reader: ShardReader | None = laid(handle.source, data, key[1]) if data else None
        if reader is not None:
            self.access[key[0]].counters.add("shards_laid_out")
        return reader

    def _keep_layout(self, key: tuple[int, str], entry: _Entry) -> None:
        """Leave what a closing reader learnt for later readers.

        Its page layout for later jobs on the node, if it has a new one, and its index (a
        trusted one's) for later readers in this process.
        """
        if self.layouts is not None and entry.reader is not None:
            self.layouts.keep(key[1], entry.reader, self._name(key))
        take = getattr(entry.reader, "take_index", None)
        if callable(take) and self._keeps_indexes(key):
            index = take()
            if index is not None:
                INDEXES.keep(key[1], index)

    def _keeps_indexes(self, key: tuple[int, str]) -> bool:
        """Whether readers of ``key`` leave and use kept indexes.

        Only with simstore's own opener (not a caller's, nor a subclass of it), and where
        a trusted file is one that hashed to its id (not with ``verify=False``).
        """
        return type(self.opener) is FormatOpener and self.access[key[0]].verify

    def _name(self, key: tuple[int, str]) -> str:
        src, shard = key
        by = self.referenced_by[src]
        return f"{self.access[src].store.url}: shard {object_key(shard)} of snapshot {by}"

    def _evict_idle(self) -> list[tuple[tuple[int, str], _Entry]]:
        """Take idle readers beyond ``max_open`` out of the pool (locked).

        The caller closes them (:meth:`_retire`) once it has let go of the lock.
        """
        idle = [k for k, e in self._entries.items() if e.users == 0]
        out = []
        while len(self._entries) > self.max_open and idle:
            key = idle.pop(0)
            entry = self._entries.pop(key)
            if entry.checking is not None:
                self._checked_after_close.append((key, entry.checking))
                entry.checking = None
            out.append((key, entry))
        return out

    def _retire(self, evicted: list[tuple[tuple[int, str], _Entry]]) -> None:
        """Close readers taken out of the pool, each leaving its page layout first.

        Outside the pool's lock: a first job's layout walks the pages its reads did not
        take and writes a file, which no other reader's open should wait for.
        """
        for key, entry in evicted:
            self._keep_layout(key, entry)
            _close(entry)

    def close(self) -> None:
        """Close every reader and release every prepared shard."""
        with self._lock:
            entries = list(self._entries.items())
            prepared = list(self._prepared.values())
            self._entries.clear()
            self._prepared.clear()
            self._deferred.clear()
        for key, entry in entries:
            self._keep_layout(key, entry)
            _close(entry)
        for fut in prepared:
            _release(fut)
        for access in self.access:
            access.close()


def _trust(reader: ShardReader | None) -> None:
    """Let a reader skip its page checks: its shard's whole-object hash has matched."""
    trust = getattr(reader, "trust", None)
    if callable(trust):
        trust()


def _source(entry: _Entry) -> object:
    """What ``entry``'s reader reads: a local path, a file object, or None."""
    return entry.handle.source if entry.handle is not None else None


def _close(entry: _Entry) -> None:
    with entry.lock:
        if entry.reader is not None:
            with contextlib.suppress(Exception):
                entry.reader.close()
            entry.reader = None
        if entry.handle is not None:
            entry.handle.release()
            entry.handle = None


def _release(fut: Future[ShardHandle | None]) -> None:
    fut.cancel()
    if fut.cancelled():
        return
    with contextlib.suppress(Exception):
        handle = fut.result()
        if handle is not None:
            handle.release()
