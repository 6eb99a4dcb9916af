"""``on_corrupt="skip"``: the shards a reading process found corrupt, and stand-ins.

Used by :func:`simstore.loaders._pipeline.read_chunk`; see docs/loader.md (Where the bytes
come from) for what the option promises.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import re
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
from simstore.loaders._stats import Counters

from simstore.errors import (
    FormatError,
    IntegrityError,
    NotFoundError,
    SimstoreError,
    StorageError,
    UnsupportedFormatError,
    causes,
)
from simstore.hashing import object_key

if TYPE_CHECKING:
    from simstore.loaders._pipeline import Chunk, OutBuffers

__all__ = ["CorruptFound", "CorruptShards", "resource_error", "short_of_resources",
           "short_of_threads", "shortage"]

_THREADS_TEXT = ("failed to launch worker thread", "can't start new thread")
"""What a library says, with no errno, when the process cannot start a thread (Arrow's
decode pool under ``ulimit -v`` or ``ulimit -u``, Python's ``threading``): never a
shard's bytes either."""
_SHARED_MEMORY_TEXT = ("unable to allocate shared memory", "unable to mmap",
                       "unable to open shared memory object", "unable to resize file")
"""How torch says it could not make a buffer in shared memory (a full ``/dev/shm``, an
address-space limit, no descriptor left): the errno ends the message, as ``(28)``."""
_TRAILING_ERRNO = re.compile(r"\((\d+)\)\s*$")

_ADVICE = {
    "threads": "raise the process's thread limit (ulimit -u, a container's pids limit)",
    "shared memory": "give /dev/shm more room (a container's --shm-size) or lower "
                     "prefetch or num_workers (docs/operations.md)",
    "disk space": "free space where the loader writes: its cache_dir, and the temp folder "
                  "($TMPDIR), where Lance shards read without a cache_dir are copied",
    "memory": "raise the memory or address-space limit (ulimit -v, a container's) or "
              "lower prefetch or num_workers",
    "file descriptors": "raise the open-file limit (ulimit -n) or lower "
                        "prefetch={'max_open_shards': ...}",
    "file size": "raise the process's file-size limit (ulimit -f)",
    "permission": "the loader's files (its cache_dir, the temp folder) must be this "
                  "user's to read and write",
}
_RESOURCE = {errno.EMFILE: "file descriptors", errno.ENFILE: "file descriptors",
             errno.ENOMEM: "memory", errno.EACCES: "permission", errno.EPERM: "permission",
             errno.ENOSPC: "disk space", errno.EDQUOT: "disk space",
             errno.EROFS: "disk space", errno.EFBIG: "file size"}
"""Errors of the reading process or its machine, never of a shard's bytes, and the
resource each says the process ran short of."""


def _errno_of(exc: BaseException) -> int | None:
    """The errno an error of the OS or a library carries: its own, or in its text."""
    if isinstance(exc, OSError) and exc.errno is not None:
        return exc.errno
    if isinstance(exc, SimstoreError):
        return None  # simstore's messages name paths and URLs: no errno is read in them
    text = str(exc).lower()
    for e in _RESOURCE:
        if f"[errno {e}]" in text:  # a library's OSError that gives no errno (pyarrow)
            return e
    if any(t in text for t in _SHARED_MEMORY_TEXT):
        found = _TRAILING_ERRNO.search(text)
        if found is not None:
            return int(found.group(1))
    return None


def _short_of(exc: BaseException) -> tuple[str, BaseException] | None:
    """What the reading process ran short of, and the error that says it; None if not."""
    for current in causes(exc):
        if isinstance(current, IntegrityError):
            return None
        if not isinstance(current, SimstoreError):
            text = str(current).lower()
            if any(t in text for t in _THREADS_TEXT):
                return "threads", current
            number = _errno_of(current)
            if number in _RESOURCE:
                if number in (errno.ENOSPC, errno.EDQUOT) and any(
                    t in text for t in _SHARED_MEMORY_TEXT
                ):
                    return "shared memory", current  # /dev/shm full
                return _RESOURCE[number], current
    return None


@contextlib.contextmanager
def short_of_resources(where: str) -> Iterator[None]:
    """Raise a :func:`resource_error` in place of an error that is one (``where``)."""
    try:
        yield
    except Exception as exc:
        short = resource_error(exc, where)
        if short is None:
            raise
        raise short from exc


@contextlib.contextmanager
def short_of_threads(where: str) -> Iterator[None]:
    """A thread this process could not start, outside a shard's read, said as such.

    Python says ``RuntimeError: can't start new thread`` (a container's pids limit, an
    address-space limit on the thread's stack) from whichever pool was growing: the
    error names what was being read (``where``) and the limit to raise.
    """
    try:
        yield
    except RuntimeError as exc:
        short = shortage(exc)
        if short is None or short[0] != "threads":
            raise
        raise StorageError(
            f"{where}: the loader could not start a thread ({exc}): {short[1]}"
        ) from exc


def shortage(exc: BaseException) -> tuple[str, str] | None:
    """What the process ran short of, as ``exc`` says it, and what to raise; None if not."""
    short = _short_of(exc)
    return None if short is None else (short[0], _ADVICE[short[0]])


def resource_error(exc: BaseException, where: str) -> StorageError | None:
    """The error to raise for ``exc`` when the reading process ran short of something.

    Out of descriptors, shared memory, disk space or memory, a thread it could not start:
    the shard is intact, and the error (one line) says which resource and what to do
    rather than blame the shard ``where`` names. None when ``exc`` is not such an error.
    """
    short = _short_of(exc)
    if short is None:
        return None
    resource, cause = short
    said = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
    return StorageError(
        f"{where}: the read failed for want of {resource} in this process, not for damage "
        f"to the shard ({said}): {_ADVICE[resource]}"
    )


log = logging.getLogger("simstore.loaders")
Decoded = dict[str, Any]


class CorruptFound:
    """The shards one reading process found corrupt, kept across its epochs.

    Kept by the dataset (one per process: it pickles empty, so a DataLoader worker keeps
    its own, across epochs when its workers persist), so a damaged shard is logged,
    counted and downloaded once per reading process, not once per epoch.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.shards: dict[tuple[int, str], str] = {}

    def __reduce__(self) -> tuple[Any, ...]:
        return (CorruptFound, ())


class CorruptShards:
    """``on_corrupt="skip"``: the shards found corrupt in this reading process.

    A shard whose read fails its checks (:class:`IntegrityError`: a wrong hash;
    :class:`FormatError`: an unreadable shard, row group or page; :class:`NotFoundError`:
    gone from the store) is logged once, counted (``corrupt_shards``), and not read again
    by this process: its samples in every later chunk are stood in for as well (see
    :func:`~simstore.loaders._pipeline.read_chunk`). Errors of the storage itself
    (timeouts, throttling past the retries) are not corruption and still fail the read,
    nor are the reading process's own limits (:meth:`environmental`).
    """

    SKIPPED = (IntegrityError, FormatError, NotFoundError)

    @staticmethod
    def environmental(exc: BaseException) -> bool:
        """Whether ``exc`` comes from the reading process or its machine, not the shard.

        Out of file descriptors, a mapping refused for want of memory, no permission: a
        reader wraps such an ``OSError`` in a :class:`FormatError` like any unreadable
        shard, but the shard is intact, and skipping it would drop healthy samples; so is
        a thread the process could not start. Found
        by errno along the explicit causes (``raise ... from``), or by the ``[Errno N]``
        of a library's own ``OSError`` that gives no errno (pyarrow); never in simstore's
        messages, which name paths and URLs. A wrong hash (:class:`IntegrityError`) is the
        shard's, whatever else failed before it. A ``MemoryError`` is not counted: damaged
        metadata can ask for any size. A shard of a later format version
        (:class:`UnsupportedFormatError`) is intact too, too new for this simstore: skipped,
        a job on an older install would drop a newer ingest's samples from every epoch.
        """
        for current in causes(exc):
            if isinstance(current, IntegrityError):
                return False
            if isinstance(current, UnsupportedFormatError):
                return True
        return _short_of(exc) is not None

    def __init__(
        self, counters: Counters, probe: Callable[[], Decoded | None] | None = None,
        found: CorruptFound | None = None,
    ) -> None:
        self.counters = counters
        self.probe = probe
        """Finds an intact sample elsewhere in the stream (for a chunk with none)."""
        found = CorruptFound() if found is None else found
        self._bad = found.shards
        """The process's corrupt shards (``found``, shared by its epochs)."""
        self._lock = found.lock
        self._spare: Decoded | None = None

    def known(self) -> list[tuple[int, str]]:
        """The shards found corrupt so far (in this epoch or an earlier one)."""
        with self._lock:
            return list(self._bad)

    def is_bad(self, key: tuple[int, str]) -> bool:
        """Whether shard ``key`` (source, shard id) was found corrupt."""
        return key in self._bad

    def intact(self, chunk: Chunk) -> list[bool]:
        """Per slot of ``chunk``, whether its shard is not known to be corrupt."""
        ok = [True] * len(chunk)
        for read in chunk.reads:
            if self.is_bad((read.source, read.shard_id)):
                for o in read.out.tolist():
                    ok[o] = False
        return ok

    def failed(self, key: tuple[int, str], exc: Exception) -> None:
        """Record shard ``key``'s failure (once per shard)."""
        with self._lock:
            if key in self._bad:
                return
            self._bad[key] = str(exc)
        self.counters.add("corrupt_shards")
        log.warning("on_corrupt='skip': skipping the samples of a corrupt shard: %s", exc)

    def stand_in(self, chunk: Chunk, values: list[Decoded], slots: list[int],
                 buffers: OutBuffers | None) -> None:
        """Fill ``slots`` (samples of corrupt shards) with copies of an intact sample.

        The copies are marked as padding (``__pad__``), as the samples that even out the
        ranks are, so every rank still delivers its share and a training loop that masks
        padding leaves them out; their keys stay those of the skipped samples.
        """
        good = _first_intact(values, slots)
        model = values[good] if good is not None else self.spare()
        if model is None:
            shards = sorted({r.shard_id for r in chunk.reads})
            raise IntegrityError(
                f"on_corrupt='skip': the samples of corrupt shards "
                f"({', '.join(object_key(s) for s in shards)}) need a stand-in, and no "
                f"intact sample is left in the stream"
            )
        copy = getattr(buffers, "stand_in", None)
        for o in slots:
            values[o] = copy(o, model) if callable(copy) else _copied(model)
            chunk.is_pad[o] = True
        self.counters.add("corrupt_samples", len(slots))

    def keep(self, values: list[Decoded], skipped: list[int]) -> None:
        """Keep a copy of one intact sample of a chunk, the first time there is one."""
        if self._spare is not None:
            return
        good = _first_intact(values, skipped)
        if good is not None:
            self._spare = _copied(values[good])

    def spare(self) -> Decoded | None:
        """An intact sample read earlier, else one the probe finds, else None."""
        if self._spare is None and self.probe is not None:
            found = self.probe()
            if found is not None and self._spare is None:
                self._spare = _copied(found)
        return self._spare


def _first_intact(values: list[Decoded], skipped: list[int]) -> int | None:
    """The first slot of a chunk's ``values`` that is not one of the ``skipped`` ones."""
    bad = set(skipped)
    return next((j for j in range(len(values)) if j not in bad), None)


def _copied(value: Decoded) -> Decoded:
    """A sample's fields with arrays copied (a chunk's buffers are reused later)."""
    return {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in value.items()}
