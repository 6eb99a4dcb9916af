"""Bodies that keep arriving past their read's deadline are cut off.

``read_timeout_s`` bounds each wait for the socket, and the retry deadline is checked
when an attempt fails. A body that trickles in (a few bytes inside every read timeout)
never fails, so neither bound ended it: a shard read at 80 B/s took its read for ever.
One daemon thread per process keeps the deadlines of the reads under way and, at a
deadline, shuts the socket of the body still being read: the read then fails as a broken
body does, and the retry loop finds its deadline passed and raises the ``StorageError``
that names the object.

A cut never meets a connection that has gone back to the pool (where another request
may hold it at once): the cut, and the body's return of its connection, take turns on a
lock of the body's (:func:`guard_release`), and a block's end waits for a cut under way
and stops any later one.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["cut_body", "cut_at", "guard_release"]


def _socket_of(body: Any) -> socket.socket | None:
    """The socket under a botocore body (urllib3's response over http.client's), or None."""
    raw = getattr(body, "_raw_stream", body)
    conn = getattr(raw, "_connection", None)
    sock = getattr(conn, "sock", None)
    if isinstance(sock, socket.socket):
        return sock
    fp = getattr(getattr(raw, "_fp", None), "fp", None)
    sock = getattr(getattr(fp, "raw", None), "_sock", None)
    return sock if isinstance(sock, socket.socket) else None


def guard_release(body: Any) -> Any:
    """``body``, its return of its connection to the pool and a cut made exclusive.

    urllib3 gives a body's connection back to the pool as the body's last byte is read
    (or the reader says it is done), and another request may take it at once: a cut
    that had found the socket just before would shut it under that request, which then
    fails and is sent again. Both now go through one lock of the body's, and once the
    connection is back the body has no socket to cut.
    """
    raw = getattr(body, "_raw_stream", body)
    release = getattr(type(raw), "release_conn", None)
    if not callable(release) or getattr(raw, "_simstore_cut_lock", None) is not None:
        return body
    try:
        # the wrapper holds the response weakly: kept on the response, a strong reference
        # would make a cycle that only the cycle collector frees (with its socket)
        ref = weakref.ref(raw)
    except TypeError:
        return body
    lock = threading.Lock()

    def release_conn() -> None:
        target = ref()
        if target is not None:
            with lock:
                release(target)

    raw._simstore_cut_lock = lock
    raw.release_conn = release_conn
    return body


def cut_body(body: Any) -> None:
    """Shut the socket a body arrives on: a read blocked in it returns at once."""
    lock = getattr(getattr(body, "_raw_stream", body), "_simstore_cut_lock", None)
    with lock if lock is not None else contextlib.nullcontext():
        sock = _socket_of(body)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


class _Watchdog:
    """Deadlines (``time.monotonic``) of the reads under way, and the thread keeping them."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, list[Any]]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None
        self._forgotten = 0  # entries in the heap whose read has ended

    def watch(self, at: float, cut: Callable[[], None]) -> list[Any]:
        entry: list[Any] = [cut, threading.Lock()]  # the lock: the cut against forget
        with self._cond:
            heapq.heappush(self._heap, (at, next(self._order), entry))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="simstore-s3-deadlines",
                                                daemon=True)
                self._thread.start()
            self._cond.notify()
        return entry

    def forget(self, entry: list[Any]) -> None:
        """The read has ended: its entry goes when it reaches the top of the heap.

        Or sooner, in a compaction once most of the heap is such entries: reads end long
        before their deadline, and a busy process makes thousands a second. A cut under
        way ends first, and none starts after: what follows the read (the next read of a
        body kept open, say) is never cut.
        """
        with entry[1], self._cond:  # the watchdog never takes _cond under an entry's lock
            entry[0] = None
            self._forgotten += 1
            if self._forgotten > 1024 and 2 * self._forgotten > len(self._heap):
                self._heap = [e for e in self._heap if e[2][0] is not None]
                heapq.heapify(self._heap)
                self._forgotten = 0

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._heap and self._heap[0][2][0] is None:
                    heapq.heappop(self._heap)
                    self._forgotten = max(0, self._forgotten - 1)
                if not self._heap:
                    self._cond.wait(60.0)
                    continue
                wait = self._heap[0][0] - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                _, _, entry = heapq.heappop(self._heap)
                self._forgotten -= 1  # counted again when its read ends and forgets it
            with entry[1]:
                cut, entry[0] = entry[0], None
                if cut is not None:
                    with contextlib.suppress(Exception):
                        cut()

    def _after_fork(self) -> None:
        # the child has none of the parent's reads, nor its thread; its lock may be held
        self.__init__()  # type: ignore[misc]


_WATCHDOG = _Watchdog()
os.register_at_fork(after_in_child=_WATCHDOG._after_fork)


@contextlib.contextmanager
def cut_at(seconds: float, cut: Callable[[], None]) -> Iterator[None]:
    """Within this block, ``cut()`` is called if the block runs ``seconds`` from now."""
    entry = _WATCHDOG.watch(time.monotonic() + max(0.0, seconds), cut)
    try:
        yield
    finally:
        _WATCHDOG.forget(entry)
