"""Source hashes taken ahead, while the reading thread waits for the shard writer.

A task hashes each source file before its adapter reads it (the hash is the file's
lineage, and the CAD adapter stores the file under it). Taken at the file's turn, that
hash is a pass over the whole file (about 15 ms for 128 MiB from the page cache) while
the writer thread, done with the last file's last sample, has nothing to do; and within
a file the reading thread waits for the writer before each hand-off (about 1 ms a sample
for 8 MiB samples into uncompressed shards). :class:`HashAhead` fills those waits: the
next file's hash advances a step at a time (a ``pread`` of 1 MiB and its hash) for as
long as the writer is busy, so by the file's turn its hash is done or mostly done.

It hashes one file ahead of the reader at most, never a file the reader has passed,
and only where the hash is the plain one (not a piece after a file's first, a folder, or
a file whose adapter takes its CRC-32s in the hash's pass). A hash taken ahead counts
only where the file's ``fstat`` matched its listing before and after the pass; the task
checks the file against the same listing when it opens it and after reading it (see
:class:`~simstore.ingest._sources.ListedSource`), so a file changed after its hash was
taken is refused as it is when it changes under a hash taken at its turn.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence

from simstore.hashing import Hasher
from simstore.ingest._records import SourceFile
from simstore.ingest._sources import listing_differs

STEP_BYTES = 1 << 20
"""Bytes read and hashed per step: a step costs about 100 us (the buffer stays in the
core's cache), so a wait ends at most that much late."""


class _Pass:
    """One file's hash under way: its descriptor, the hasher and how far it got."""

    __slots__ = ("fd", "hasher", "pos", "src")

    def __init__(self, src: SourceFile, fd: int) -> None:
        self.src = src
        self.fd = fd
        self.hasher = Hasher()
        self.pos = 0


class HashAhead:
    """The source hashes of the files a reader reaches next, taken in steps (see above).

    ``files``: every file the reader will reach, in its order (``same_host``: inode
    numbers count, as in the listing check). Shared by the tasks that run one after
    another in a process, so the first file of the next task is hashed in the last waits
    of this one. Used from the reading thread only.
    """

    def __init__(self, files: Sequence[SourceFile], same_host: bool) -> None:
        self._files = [
            f for f in files
            if f.identity and not f.identity.startswith("dir:")
            and (f.piece is None or f.piece.index == 0)
        ]
        self._where = {f.path: i for i, f in enumerate(self._files)}
        self._same_host = same_host
        self._next = 0  # the first of ``_files`` the reader has not reached
        self._pass: _Pass | None = None
        self._done: tuple[str, str, int] | None = None  # (path, hash, size) of a file ahead
        self._refused = ""  # the path of the file ahead found unwanted or changed
        self._buf: bytearray | None = None  # the step's buffer, made at the first step

    def reach(self, src: SourceFile, take: bool = True) -> tuple[str, int] | None:
        """The reader is at ``src``: its ``(hash, size)`` if taken ahead, else None.

        None too where the file is no longer as listed (the reader hashes it at its turn,
        and its listing check refuses it). A pass still under way on it is finished here
        (the part done is not redone); files ahead of the reader's place are left for
        :meth:`step`. ``take=False``: the reader passes ``src`` without reading it (its
        journal record is reused): a pass on it stops where it is.
        """
        path = src.path
        i = self._where.get(path, -1)
        if i < self._next:
            return None  # not hashed ahead (a folder, a later piece), or passed before
        self._next = i + 1
        p = self._pass
        if p is not None and p.src.path == path:
            if not take:
                self._drop()
                return None
            while self._pass is p:
                self._advance(p)
        done, self._done = self._done, None
        if done is None or done[0] != path:
            return None
        try:  # and still as listed now
            if listing_differs(src, os.stat(path), self._same_host):
                return None
        except OSError:
            return None
        return done[1], done[2]

    def step(self, wanted: Callable[[SourceFile], bool]) -> bool:
        """Take one step of the next file's hash; False when there is none to take.

        ``wanted(src)``: whether the reader will take ``src``'s plain hash (asked once,
        before the file's first step).
        """
        target = self._target()
        if target is None:
            return False
        p = self._pass
        if p is None or p.src is not target:
            self._drop()
            p = self._open(target, wanted)
            if p is None:
                return True
        self._advance(p)
        return True

    def close(self) -> None:
        """Close the file of a pass under way."""
        self._drop()

    # -- internals ---------------------------------------------------------------------
    def _target(self) -> SourceFile | None:
        """The file to hash ahead: the next one the reader reaches, if nothing is done."""
        if self._next >= len(self._files):
            return None
        src = self._files[self._next]
        if self._done is not None:
            if self._done[0] == src.path:
                return None  # one file ahead at most
            self._done = None  # a file the reader passed without taking it
        if self._refused == src.path:
            return None
        return src

    def _open(self, src: SourceFile, wanted: Callable[[SourceFile], bool]) -> _Pass | None:
        try:
            if not wanted(src):
                self._refused = src.path
                return None
            # no wait at the open if the path names a FIFO by now (its check refuses it)
            flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
            fd = os.open(src.path, flags)
        except (OSError, ValueError):
            self._refused = src.path  # the reader's own open says what is wrong
            return None
        self._pass = _Pass(src, fd)
        if not self._matches(self._pass):
            self._drop()
            self._refused = src.path
            return None
        return self._pass

    def _matches(self, p: _Pass) -> bool:
        try:
            return not listing_differs(p.src, os.fstat(p.fd), self._same_host)
        except OSError:
            return False

    def _advance(self, p: _Pass) -> None:
        """Read and hash ``p``'s next step; at the end, keep the hash if the file held."""
        if self._buf is None:
            self._buf = bytearray(STEP_BYTES)
        try:
            got = os.preadv(p.fd, [self._buf], p.pos)
        except OSError:
            self._drop()
            self._refused = p.src.path
            return
        if got:
            if p.pos + got > p.src.listed_size:
                # grown since it was listed: refused at its turn (its listing check), so
                # no more of it is read here (a file grown by gigabytes read them all)
                self._drop()
                self._refused = p.src.path
                return
            p.hasher.update(memoryview(self._buf)[:got])
            p.pos += got
            return
        if self._matches(p) and p.pos == p.src.listed_size:
            self._done = (p.src.path, str(p.hasher.hexdigest()), p.pos)
        else:
            self._refused = p.src.path
        self._drop()

    def _drop(self) -> None:
        p, self._pass = self._pass, None
        if p is not None:
            with contextlib.suppress(OSError):
                os.close(p.fd)
