"""Decoded field values to tensors: zero-copy where the buffer allows."""

from __future__ import annotations

import contextlib
import itertools
import math
import mmap
import operator
import os
import re
import threading
import warnings
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from simstore.loaders._filerows import FileRows, close_fds, read_exactly

from simstore._buffers import BufferPool, libc, whole_pages

__all__ = [
    "number_tensor",
    "BufferPool",
    "ChunkBuffers",
    "ReleaseTracker",
    "SharedPool",
    "sample_bytes",
    "stacked_view",
    "to_tensors",
    "value_bytes",
]


def to_tensors(
    fields: Mapping[str, Any],
    *,
    zero_copy: bool,
    given: Mapping[str, torch.Tensor] | None = None,
    numbers: bool = True,
) -> dict[str, Any]:
    """Field values as tensors where they are arrays or numbers.

    An array's tensor shares its memory when the array is writable, or when ``zero_copy``
    is set; ``given`` holds tensors already made for some fields (rows of a chunk's
    buffers). Scalars become 0-d tensors, unless ``numbers`` is false: then Python numbers
    stay as they are (a collate makes one tensor per batch of them, far cheaper than one
    per sample). Strings, bytes and JSON stay as they are.
    """
    out: dict[str, Any] = {}
    for name, value in fields.items():
        if given and name in given:
            out[name] = given[name]
        elif isinstance(value, np.ndarray):
            out[name] = _array_to_tensor(value, zero_copy)
        elif isinstance(value, np.generic):
            out[name] = torch.from_numpy(np.asarray(value))  # keeps its dtype
        elif isinstance(value, bool | int | float):
            out[name] = number_tensor([value]).reshape(()) if numbers else value
        else:
            out[name] = value
    return out


def number_tensor(values: Sequence[bool | int | float]) -> torch.Tensor:
    """Python numbers as a tensor of the type a scalar field is stored in.

    A Python float is a float64 field's value and an int an int64's: ``torch.tensor``
    alone would make floats float32 (torch's default dtype) and lose half their digits.
    """
    if any(isinstance(v, float) for v in values):
        return torch.tensor(values, dtype=torch.float64)
    return torch.tensor(values)


def _array_to_tensor(arr: np.ndarray, zero_copy: bool) -> torch.Tensor:
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if arr.flags.writeable:
        return torch.from_numpy(arr)
    if not zero_copy:
        return torch.from_numpy(arr.copy())
    # A tensor over a read-only buffer: torch warns once per process that writing to it is
    # undefined; the loader documents that samples must not be modified in place when
    # zero_copy is on, so the warning is expected here and silenced.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(arr)


def value_bytes(value: Any) -> int:
    """Logical bytes of one value: a tensor's elements, a string's or bytes' length.

    A number counts its width: 8 for a Python int or float, as the tensor a sample makes
    of it.
    """
    if isinstance(value, torch.Tensor):
        return value.element_size() * value.nelement()
    if isinstance(value, bytes | str):
        return len(value)
    if isinstance(value, np.generic):
        return int(value.nbytes)
    if isinstance(value, bool):
        return 1
    if isinstance(value, int | float):
        return 8
    return 0


def sample_bytes(sample: Mapping[str, Any]) -> int:
    """Logical bytes of a sample's tensors, strings and bytes."""
    return sum(value_bytes(v) for v in sample.values())


POOL = BufferPool()
"""The process's pool of chunk-buffer memory (see :class:`BufferPool`: a chunk buffer of
large samples is tens of MiB, and reusing it more than halved some epochs here)."""


def _fresh_pool_after_fork() -> None:
    global POOL
    POOL = BufferPool(POOL.idle_bytes, POOL.min_bytes)


os.register_at_fork(after_in_child=_fresh_pool_after_fork)


SHARED_SLOTS = 256
"""Pooled shared-memory buffers per DataLoader worker (one release counter each)."""

SHARED_MIN_BYTES = 64 << 10
"""Smaller shared chunk buffers are not pooled: their batches travel by value in the
pickle (``BY_VALUE_BYTES`` in ``loaders/_streams.py``). A larger one outside the pool is
fresh shared memory that torch sends by descriptor, a handshake with the worker per
batch: with the pool starting at 1 MiB, batches of 16 to 64 samples of 8 KiB took 1.6x
to 2.7x as long with 2 workers (see docs/loader.md)."""


class SharedPool:
    """Shared-memory chunk buffers of one DataLoader worker, reused once released.

    Fresh shared memory costs about 0.55 ms per MiB here to fault in (tmpfs pages, zeroed
    one 4 KiB page at a time; 0.42 ms faulted in by one ``MADV_POPULATE_WRITE``, see
    :func:`_populate`), against 0.08 ms to rewrite memory already mapped: more than
    reading the samples themselves. A worker's batches are views of its chunk buffers and
    reach the main process as those buffers' shared memory, so a buffer may be written
    again only when (1) the worker has moved past its chunk (:meth:`retire`) and (2) the
    main process no longer maps any batch made from it. For (2) each buffer has a slot,
    and each batch sent carries the generation it gave every pooled slot of its chunk
    (:meth:`sent`); the main process's :class:`ReleaseTracker` raises the slot's counter
    in ``released`` (shared memory made before the workers start) to the highest
    generation below which every batch it received has been let go (torch's weak
    reference to the batch's storages has expired). A slot is reused only when its
    counter has reached its last generation.
    """

    def __init__(self, released: np.ndarray, idle_bytes: int = 128 << 20,
                 min_bytes: int | None = None, arena: SharedArena | None = None) -> None:
        self.released = released
        self.idle_bytes = idle_bytes
        self.min_bytes = SHARED_MIN_BYTES if min_bytes is None else min_bytes
        self.arena = arena
        """Where new buffers are carved first (a worker's :class:`SharedArena`)."""
        self._storages: list[torch.UntypedStorage | None] = []
        self._sent: list[int] = []
        self._idle: list[int] = []
        self._carved: set[int] = set()
        """Slots whose buffer is a region of the arena (kept: the arena cannot take it back)."""
        self._lock = threading.Lock()

    def storage(self, nbytes: int) -> tuple[int, torch.UntypedStorage]:
        """``(slot, storage)`` of at least ``nbytes``; slot -1 for one the pool does not keep."""
        size = -(-nbytes // 64) * 64  # any dtype's items fit a reused buffer's bytes
        if size < max(1, self.min_bytes):
            return -1, _new_shared(size)
        with self._lock:
            for slot in self._idle:
                st = self._storages[slot]
                if st is not None and size <= st.nbytes() <= 2 * size and self._free(slot):
                    self._idle.remove(slot)
                    return slot, st
            slot = self._new_slot()
            carved = self.arena.carve(size) if self.arena is not None and slot >= 0 else None
            storage = carved if carved is not None else _new_shared(size)
            if slot >= 0:
                self._storages[slot] = storage
                if carved is not None:
                    self._carved.add(slot)
            return slot, storage

    def _free(self, slot: int) -> bool:
        return int(self.released[slot]) >= self._sent[slot]

    def _new_slot(self) -> int:
        # a dropped buffer's slot, once released (a slot that is idle still has its buffer)
        for slot, st in enumerate(self._storages):
            if st is None and self._free(slot):
                return slot
        if len(self._storages) < len(self.released):
            self._storages.append(None)
            self._sent.append(0)
            return len(self._storages) - 1
        return -1

    def sent(self, slot: int) -> int:
        """A batch that may hold views of ``slot``'s buffer is being sent: its generation."""
        with self._lock:
            self._sent[slot] += 1
            return self._sent[slot]

    def retire(self, slot: int) -> None:
        """The worker is done with ``slot``'s buffer; keep it for reuse, within the budget."""
        with self._lock:
            self._idle.append(slot)
            loose = [s for s in self._idle if s not in self._carved]
            while loose and sum(self._size(s) for s in loose) > self.idle_bytes:
                old = loose.pop(0)
                self._idle.remove(old)
                self._storages[old] = None

    def _size(self, slot: int) -> int:
        st = self._storages[slot]
        return st.nbytes() if st is not None else 0


_TORCH_SHM_FILE = re.compile(r"torch_(\d+)_[0-9_]+")
"""A file torch makes in ``/dev/shm``: named for the process that made it."""
_TORCH_SHM_NAME = re.compile(rf"<(/{_TORCH_SHM_FILE.pattern})>")
"""The name torch gives a shared-memory file it makes, as its errors quote it."""


def _new_shared(nbytes: int) -> torch.UntypedStorage:
    try:
        storage: torch.UntypedStorage = torch.UntypedStorage._new_shared(nbytes)  # type: ignore[no-untyped-call]
    except RuntimeError as exc:
        _unlink_left(exc)
        raise
    if nbytes >= SHARED_MIN_BYTES:
        _populate(storage.data_ptr(), storage.nbytes())
    return storage


def _unlink_left(exc: RuntimeError) -> None:
    """Remove the ``/dev/shm`` file a failed torch allocation left behind, if any.

    torch names the file, sizes it, maps it and only then unlinks it: when the mapping is
    refused (an address-space limit) or the size cannot be had (a full ``/dev/shm``), the
    named file stays, a full-size one after a refused mapping, until someone removes it
    by hand. Only this process's own files (its pid is in their names) are removed.
    """
    found = _TORCH_SHM_NAME.search(str(exc))
    if found is None or int(found.group(2)) != os.getpid():
        return
    with contextlib.suppress(OSError):
        os.unlink(os.path.join("/dev/shm", found.group(1).lstrip("/")))


def remove_dead_process_files(pid: int) -> int:
    """Remove the ``/dev/shm`` files torch made in process ``pid``, which has died.

    torch names a file, sizes it, maps it and only then unlinks it: a worker killed in
    between (the OOM killer's SIGKILL) left one behind, a batch's size, for good. Nothing
    is removed while a process ``pid`` exists. Returns how many were.
    """
    from simstore.loaders._world import _alive

    if _alive(pid):
        return 0
    try:
        names = os.listdir("/dev/shm")
    except OSError:
        return 0
    removed = 0
    for name in names:
        found = _TORCH_SHM_FILE.fullmatch(name)
        if found is not None and int(found.group(1)) == pid:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join("/dev/shm", name))
                removed += 1
    return removed


ARENA_BYTES = 256 << 20
"""Address space of each worker's :class:`SharedArena` (only pages written cost
memory); 0 turns arenas off."""

_ARENAS: weakref.WeakValueDictionary[str, SharedArena] = weakref.WeakValueDictionary()
"""This process's arenas by token: where a batch's arena references are looked up."""

_WORKER_ARENA: list[SharedArena | None] = [None]
"""The arena of the DataLoader worker this process is (set by its batch stream)."""


class SharedArena:
    """Shared memory that a DataLoader's main process maps before it starts a worker.

    A forked worker inherits the mapping; a spawned one (or one of a fork server) maps
    the same memory from the descriptor it is started with. It carves its pooled chunk
    buffers out of it (:meth:`carve`), and a batch whose tensors lie in it crosses to
    the main process as ``(offset, shape, strides, dtype)`` (:class:`InArena`), which the
    main process turns back into tensors over its own view of the same pages
    (:meth:`view`). Torch would instead send each buffer's file descriptor through a
    socket that a thread of the worker serves (a handshake per batch, slowest just when
    the worker's decode threads hold the GIL) and map it afresh in the main process,
    faulting its pages in again for every batch. That thread also needs two free
    descriptors of the worker per batch: without them the standard library's server
    retries for ever, printing a traceback each time, while the main process waits. Nothing
    is named: the memory is a ``memfd`` (an anonymous mapping where there is none), so a
    crash leaves nothing behind. A worker whose arena is full falls back to fresh shared
    memory. Regions are reused under :class:`SharedPool`'s release counters.
    """

    def __init__(self, nbytes: int, *, _fd: int | None = None, _token: str = "") -> None:
        self.nbytes = whole_pages(nbytes)
        self.token = _token or f"{os.getpid()}-{id(self):x}-{os.urandom(4).hex()}"
        self._fd: int | None = None
        """The memory's descriptor, kept to hand to spawned workers (None: none)."""
        if _fd is not None:  # a spawned worker: the main process's memory, mapped here
            try:
                self._map = mmap.mmap(_fd, self.nbytes, flags=mmap.MAP_SHARED)
            finally:
                os.close(_fd)
        elif hasattr(os, "memfd_create"):
            fd = os.memfd_create("simstore-arena", os.MFD_CLOEXEC)
            try:
                os.ftruncate(fd, self.nbytes)
                self._map = mmap.mmap(fd, self.nbytes, flags=mmap.MAP_SHARED)
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd
            weakref.finalize(self, os.close, fd)
        else:
            self._map = mmap.mmap(-1, self.nbytes,
                                  flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
        self.base = int(np.frombuffer(self._map, dtype=np.uint8, count=1)
                        .__array_interface__["data"][0])
        self._top = 0
        self._lock = threading.Lock()
        self._views: dict[int, tuple[int, int]] = {}
        """Byte ranges of this (main) process's live views of the arena, by view number."""
        self._numbers = itertools.count()
        self.reserved: list[tuple[int, int]] = []
        """Ranges a worker must not carve: views still alive when it was forked."""
        _ARENAS[self.token] = self

    def hold_views(self) -> None:
        """Before forking workers: keep their regions clear of the views still alive.

        A worker of a new epoch carves its buffers afresh; batches of an earlier epoch
        that the caller still holds (a loop's last batch, a list of kept ones) are views
        of regions a worker of that epoch carved, so the new workers skip those ranges.
        """
        with self._lock:
            self.reserved = sorted(self._views.values())

    def __reduce__(self) -> tuple[Any, ...]:
        """The arena as a worker being started gets it: by its descriptor.

        A worker started by spawn or a fork server gets the descriptor with its start
        (no socket, no thread); any other copy gets no arena and uses fresh shared memory.
        """
        from multiprocessing import context, reduction

        if self._fd is None or context.get_spawning_popen() is None:
            return (_no_arena, ())
        return (_spawned_arena, (reduction.DupFd(self._fd), self.nbytes, self.token,
                                 list(self.reserved)))

    def contains(self, address: int) -> bool:
        """Whether ``address`` lies in this arena."""
        return self.base <= address < self.base + self.nbytes

    def carve(self, nbytes: int) -> torch.UntypedStorage | None:
        """A new region of ``nbytes`` (its pages faulted in), or None when full."""
        size = whole_pages(max(1, nbytes))
        with self._lock:
            top = self._top
            for lo, hi in self.reserved:  # sorted by start
                if top < hi and lo < top + size:
                    top = whole_pages(hi)
            if top + size > self.nbytes:
                return None
            offset, self._top = top, top + size
        region = torch.frombuffer(self._map, dtype=torch.uint8, count=size, offset=offset)
        _populate(self.base + offset, size)
        return region.untyped_storage()

    def view(self, offset: int, shape: tuple[int, ...], stride: tuple[int, ...],
             dtype: torch.dtype) -> torch.Tensor:
        """The tensor of ``shape`` and ``stride`` (in items) at ``offset`` in the arena."""
        if not all(shape):
            return torch.empty(shape, dtype=dtype)
        span = 1 + sum((n - 1) * st for n, st in zip(shape, stride, strict=True))
        nbytes = span * dtype.itemsize
        # the tensor's storage holds this array (and so the mapping) while it lives
        window = np.frombuffer(self._map, dtype=np.uint8, count=nbytes, offset=offset)
        number = next(self._numbers)
        with self._lock:
            self._views[number] = (offset, offset + nbytes)
        weakref.finalize(window, self._view_gone, number)
        flat = torch.frombuffer(window, dtype=dtype, count=span)
        return flat.as_strided(shape, stride)

    def _view_gone(self, number: int) -> None:
        with self._lock:
            self._views.pop(number, None)


def _no_arena() -> None:
    return None


def _spawned_arena(fd: Any, nbytes: int, token: str,
                   reserved: list[tuple[int, int]]) -> SharedArena:
    """In a worker started by spawn or a fork server: its arena, mapped from ``fd``."""
    arena = SharedArena(nbytes, _fd=fd.detach(), _token=token)
    arena.reserved = reserved
    return arena


def set_worker_arena(arena: SharedArena | None) -> None:
    """Record the arena of this DataLoader worker (None: it has none)."""
    _WORKER_ARENA[0] = arena


def in_an_arena(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s memory lies in one of this process's arenas."""
    address = tensor.data_ptr()
    return any(a.contains(address) for a in list(_ARENAS.values()))


class InArena:
    """A tensor in the sending worker's arena, on its way to the main process."""

    __slots__ = ("token", "offset", "shape", "stride", "dtype")

    def __init__(self, token: str, offset: int, shape: tuple[int, ...],
                 stride: tuple[int, ...], dtype: torch.dtype) -> None:
        self.token, self.offset, self.shape, self.stride, self.dtype = (
            token, offset, shape, stride, dtype)

    def __reduce__(self) -> tuple[Any, ...]:
        return (InArena, (self.token, self.offset, self.shape, self.stride, self.dtype))

    @staticmethod
    def of(tensor: torch.Tensor) -> InArena | None:
        """The reference for ``tensor`` if it lies in this worker's arena, else None."""
        arena = _WORKER_ARENA[0]
        if arena is None or not arena.contains(tensor.data_ptr()):
            return None
        return InArena(arena.token, tensor.data_ptr() - arena.base, tuple(tensor.shape),
                       tuple(tensor.stride()), tensor.dtype)

    def tensor(self) -> torch.Tensor:
        """The tensor, over this (main) process's view of the arena."""
        arena = _ARENAS.get(self.token)
        if arena is None:
            raise RuntimeError(f"a batch refers to an arena this process does not have "
                               f"({self.token})")
        return arena.view(self.offset, self.shape, self.stride, self.dtype)


_MADV_POPULATE_WRITE = 23
"""Linux 5.14+: fault a range in for writing in one call."""


def _populate(addr: int, nbytes: int) -> bool:
    """Fault fresh shared memory in with one system call instead of a fault per page.

    The pages are allocated and zeroed either way; a worker then writes them without
    trapping once per 4 KiB (32 MiB: 13-15 ms against 16-18 ms here). Where the kernel
    lacks the call it fails and the pages fault in as they are written. Returns whether
    the kernel did it.
    """
    lib = libc()
    if lib is None:
        return False
    page = mmap.PAGESIZE
    start = addr - addr % page
    return bool(lib.madvise(start, nbytes + (addr - start), _MADV_POPULATE_WRITE) == 0)


class ReleaseTracker:
    """The main process's side of :class:`SharedPool`: which batches it has let go.

    ``track`` registers a received batch (its shared tensors' storages, by weak reference)
    with the ``(slot, generation)`` marks its worker gave it; ``poll`` raises each slot's
    counter in ``released[worker]`` to the highest generation whose batches, and all
    earlier ones of that slot, are gone. A batch whose tensors are no longer the shared
    ones (``pin_memory`` copied them, and dropped those) releases its marks at once.
    """

    def __init__(self, released: torch.Tensor) -> None:
        self.released = released.numpy()
        self._pending: dict[tuple[int, int], list[tuple[int, list[Any]]]] = {}
        self._seen: dict[tuple[int, int], int] = {}

    def track(self, worker: int, marks: tuple[tuple[int, int], ...], batch: Any) -> None:
        from torch.multiprocessing.reductions import StorageWeakRef

        refs = [
            StorageWeakRef(t.untyped_storage())  # type: ignore[no-untyped-call]
            for t in _shared_tensors(batch)
        ]
        for slot, gen in marks:
            key = (worker, slot)
            self._pending.setdefault(key, []).append((gen, refs))
            self._seen[key] = max(self._seen.get(key, 0), gen)

    def poll(self) -> None:
        for key, entries in self._pending.items():
            entries[:] = [(g, refs) for g, refs in entries if not all(r.expired() for r in refs)]
            done = min(g for g, _ in entries) - 1 if entries else self._seen[key]
            worker, slot = key
            if done > self.released[worker, slot]:
                self.released[worker, slot] = done


_SCALARS = frozenset({str, bytes, int, float, bool, type(None)})
"""Types that hold no tensor: a batch's list of keys is skipped at one set lookup each
(the ``Mapping`` check per key cost the main process 0.12 ms per batch of 256)."""


def _shared_tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value] if value.is_shared() or in_an_arena(value) else []  # type: ignore[no-untyped-call]
    if isinstance(value, Mapping):
        return [t for v in value.values() if type(v) not in _SCALARS
                for t in _shared_tensors(v)]
    if isinstance(value, list | tuple):
        return [t for v in value if type(v) not in _SCALARS for t in _shared_tensors(v)]
    return []


class ChunkBuffers:
    """One buffer per fixed-shape field of a decode chunk, that readers decode into.

    A reader that supports it (``read(..., out=...)``) asks for the array of sample ``slot``
    and field ``name`` before reading; the first ask for a field allocates ``(n, *shape)``
    and every equal-shaped ask gets a row of it. The sample's tensor is then that row of
    one tensor, so a batch of consecutive rows is a view of the buffer, not a copy (see
    :func:`stacked_view`). In a DataLoader worker the buffer lives in shared memory, so the
    batch crosses to the main process without being copied again.
    """

    def __init__(self, n: int, *, shared: bool, pool: SharedPool | None = None,
                 map_files: bool = False, defer_files: bool = False) -> None:
        self.n = n
        self.shared = shared
        self.map_files = map_files and not shared
        """Whether readers may map page-aligned file bytes into the (private) buffers."""
        self.defer_files = defer_files and shared
        """In a worker: whether a field all of whose chunks a reader can map gets a buffer
        of this process's own that is left unread, its rows' places in the files noted
        for the main process to map (see ``loaders._filerows``)."""
        self._private: set[str] = set()
        """Fields whose buffer is private memory left unread (``defer_files``)."""
        self._pieces: dict[str, dict[int, list[tuple[int, int, tuple[int, int], int]]]] = {}
        """Per private field and slot: ``(byte offset in row, bytes, file key, offset)``."""
        self._files: dict[tuple[int, int], int] = {}
        """Descriptors (duplicated) of the files noted, by ``(device, inode)``."""
        self._closer = weakref.finalize(self, _close_fds, self._files)
        self.pool = pool if shared else None
        self._slots: list[int] = []
        self._bufs: dict[str, tuple[torch.Tensor, np.ndarray] | None] = {}
        self._given: dict[str, list[np.ndarray | None]] = {}
        """Per field, the row given to each slot (None: not given)."""
        self._lock = threading.Lock()  # the shards of a chunk may decode on several threads

    def take(self, slot: int, name: str, shape: tuple[int, ...], dtype: np.dtype[Any], *,
             mappable: bool = False) -> Any:
        """A writable C-contiguous array for ``(slot, name)``, or None to allocate your own.

        ``mappable``: the reader will offer all of the value's bytes to :meth:`map_file`
        (with the checks done); the first ask for a field decides its buffer's kind.
        """
        with self._lock:
            entry = self._buffer(name, shape, dtype, mappable)
            if entry is None:
                return None
            array = entry[1]
            given = self._given_rows(name)
            if array.shape[1:] != tuple(shape) or array.dtype != dtype or given[slot] is not None:
                return None
            row = array[slot, ...]  # a view, also of a 1-D buffer's element
            given[slot] = row
            return row

    def take_many(
        self, slots: list[int], name: str, shape: tuple[int, ...], dtype: np.dtype[Any]
    ) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]] | None:
        """``(buffer, slots as an index array, row arrays)`` for several slots, or None.

        The caller fills ``buffer[index]`` in one scatter; the rows are registered as
        given, like :meth:`take`'s. None when any slot's field is already given.
        """
        with self._lock:
            entry = self._buffer(name, shape, dtype)
            if entry is None:
                return None
            array = entry[1]
            if array.shape[1:] != tuple(shape) or array.dtype != dtype:
                return None
            given = self._given_rows(name)
            if (not all(map(operator.is_, map(given.__getitem__, slots), itertools.repeat(None)))
                    or len(set(slots)) != len(slots)):
                return None
            rows = [array[slot, ...] for slot in slots]  # views, also of a 1-D buffer
            for slot, row in zip(slots, rows, strict=True):
                given[slot] = row
        return array, np.asarray(slots, dtype=np.intp), rows

    @property
    def maps_files(self) -> bool:
        """Whether :meth:`map_file` may take any bytes (False: it declines all of them)."""
        return self.defer_files if self.shared else self.map_files

    def map_file(self, array: np.ndarray, fd: int, offset: int, check: bool = True) -> bool:
        """Fill ``array`` (part of a row :meth:`take` gave) with file ``fd``'s bytes at ``offset``.

        With no workers (``map_files``): mapped in place of read (``BufferPool.map_file``).
        In a worker (``defer_files``), for a field with a private buffer and bytes the
        reader will not check (``check`` false): noted, not read, for the main process to
        map (:meth:`file_rows`), or read later if it cannot (:meth:`settle`). False: the
        caller reads the bytes.
        """
        if not self.shared:
            return self.map_files and POOL.map_file(array, fd, offset)
        if not self.defer_files or check or not array.flags.c_contiguous:
            return False
        page = mmap.PAGESIZE
        addr, nbytes = array.ctypes.data, array.nbytes
        with self._lock:
            for name in self._private:
                entry = self._bufs[name]
                assert entry is not None
                buf = entry[1]
                base = buf.ctypes.data
                if base <= addr < base + buf.nbytes:
                    break
            else:
                return False
            row_bytes = buf.nbytes // self.n
            slot, at = divmod(addr - base, row_bytes)
            if (row_bytes % page or at % page or nbytes % page or offset % page
                    or at + nbytes > row_bytes):
                return False
            st = os.fstat(fd)
            key = (st.st_dev, st.st_ino)
            if key not in self._files:
                self._files[key] = os.dup(fd)
            self._pieces.setdefault(name, {}).setdefault(slot, []).append(
                (at, nbytes, key, offset))
        return True

    def file_rows(self, name: str, lo: int, hi: int) -> FileRows | None:
        """Rows ``lo:hi`` of field ``name`` as a :class:`FileRows`, if all were noted whole."""
        with self._lock:
            if name not in self._private:
                return None
            entry = self._bufs[name]
            assert entry is not None
            buf = entry[1]
            row_bytes = buf.nbytes // self.n
            noted = self._pieces.get(name, {})
            pieces: list[tuple[int, int, int, int, int]] = []
            files: dict[tuple[int, int], int] = {}
            for slot in range(lo, hi):
                parts = noted.get(slot)
                if not parts or sum(p[1] for p in parts) != row_bytes:
                    return None
                for at, nbytes, key, offset in parts:
                    pieces.append((slot - lo, at, nbytes, files.setdefault(key, len(files)),
                                   offset))
            fds = [self._files[key] for key in files]
            for slot in range(lo, hi):
                noted.pop(slot)
        return FileRows((hi - lo, *buf.shape[1:]), buf.dtype.str, pieces, fds)

    def private_fields(self) -> set[str]:
        """The fields whose buffer is private memory with rows left unread."""
        with self._lock:
            return set(self._private)

    def settle(self, lo: int, hi: int) -> None:
        """Read the noted bytes of rows ``lo:hi`` into their buffers (for any other use).

        Before any view of a private buffer leaves the worker as a tensor, settle the
        whole chunk (``0, n``): torch sends a tensor by moving its whole storage into
        shared memory, a copy, after which the buffer's NumPy array (where this reads
        into) is no longer the memory later batches' views see.
        """
        with self._lock:
            for name, noted in self._pieces.items():
                entry = self._bufs[name]
                assert entry is not None
                rows = entry[1].reshape(self.n, -1).view(np.uint8)
                for slot in range(lo, hi):
                    for at, nbytes, key, offset in noted.pop(slot, ()):
                        read_exactly(self._files[key], rows[slot, at : at + nbytes], offset)

    def stand_in(self, slot: int, value: Mapping[str, Any]) -> dict[str, Any]:
        """Another slot's sample ``value`` copied into slot ``slot`` (its rows where it has them).

        For ``on_corrupt="skip"``: a field whose buffer has rows of its shape and type gets
        the copy in slot ``slot``'s row (given to that slot now, whether or not a read that
        then failed had taken it), so the batch stays a view of the buffer; any other
        array is copied on its own.
        """
        out: dict[str, Any] = {}
        for name, v in value.items():
            if not isinstance(v, np.ndarray | np.generic):
                out[name] = v
                continue
            with self._lock:
                entry = self._buffer(name, v.shape, v.dtype)
                array = entry[1] if entry is not None else None
                if array is not None and array.shape[1:] == v.shape and array.dtype == v.dtype:
                    array[slot] = v
                    row = array[slot, ...]  # a view, also of a 1-D buffer's element
                    self._given_rows(name)[slot] = row
                    out[name] = row
                    continue
            out[name] = v.copy()
        return out

    def _buffer(
        self, name: str, shape: tuple[int, ...], dtype: np.dtype[Any], mappable: bool = False
    ) -> tuple[torch.Tensor, np.ndarray] | None:
        """Field ``name``'s buffer, made on first ask."""
        if name not in self._bufs:
            dtype = np.dtype(dtype)
            if (mappable and (self.defer_files or self.map_files) and dtype.isnative
                    and dtype.kind in "biuf"):
                # its rows will be the files' pages (mapped here, or left unread for the
                # main process to map): memory of its own, never faulted in, so that it
                # costs no page faults, mapping frees none, and the pool's idle memory
                # stays for the chunks read after it
                array = POOL.array((self.n, *shape), dtype, fresh=True)
                self._bufs[name] = (torch.from_numpy(array), array)
                if self.defer_files:
                    self._private.add(name)
            else:
                self._bufs[name] = self._allocate(shape, dtype)
        return self._bufs[name]

    def _given_rows(self, name: str) -> list[np.ndarray | None]:
        rows = self._given.get(name)
        if rows is None:
            rows = self._given[name] = [None] * self.n
        return rows

    def _allocate(
        self, shape: tuple[int, ...], dtype: np.dtype[Any]
    ) -> tuple[torch.Tensor, np.ndarray] | None:
        if not dtype.isnative or dtype.kind not in "biuf":
            return None
        try:
            tdtype = torch.from_numpy(np.empty(0, dtype=dtype)).dtype
        except TypeError:
            return None
        if self.shared:
            # made in shared memory, as torch's own collate makes a worker's batch: moving
            # an empty tensor there with share_memory_() copies its zeros in too (0.78
            # against 0.55 ms per MiB here, page faults included)
            count = int(np.prod((self.n, *shape), dtype=np.int64))
            nbytes = count * dtype.itemsize
            if self.pool is not None:
                slot, storage = self.pool.storage(nbytes)
                if slot >= 0:
                    self._slots.append(slot)
            else:
                storage = _new_shared(nbytes)
            tensor = torch.empty(0, dtype=tdtype).set_(storage)[:count].view(self.n, *shape)
            return tensor, tensor.numpy()
        # pooled memory (see BufferPool)
        array = POOL.array((self.n, *shape), dtype)
        return torch.from_numpy(array), array

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A new tensor for a batch of this chunk (a field computed from its rows).

        In a DataLoader worker a large one is pooled shared memory, released with the
        chunk's buffers (:meth:`sent`, :meth:`retire`): it leaves as a view of memory the
        main process already maps, where fresh memory would be moved into new shared
        memory by torch (a copy, and its pages faulted in twice).
        """
        count = math.prod(shape)
        nbytes = count * dtype.itemsize
        pool = self.pool
        if pool is None or nbytes < SHARED_MIN_BYTES:
            return torch.empty(shape, dtype=dtype)
        slot, storage = pool.storage(nbytes)
        if slot < 0:
            return torch.empty(shape, dtype=dtype)
        with self._lock:
            self._slots.append(slot)
        return torch.empty(0, dtype=dtype).set_(storage)[:count].view(shape)

    def sent(self) -> tuple[tuple[int, int], ...]:
        """Marks for a batch of this chunk being sent.

        ``(slot, generation)`` for every pooled buffer of the chunk: a batch may hold
        views of any of them.
        """
        pool = self.pool
        if pool is None:
            return ()
        with self._lock:
            slots = list(self._slots)
        return tuple((slot, pool.sent(slot)) for slot in slots)

    def retire(self) -> None:
        """This chunk's batches are all made: its pooled buffers may be reused once released.

        The noted files' descriptors are closed (those of batches sent are in flight).
        """
        with self._lock:
            self._pieces.clear()
        self._closer()
        pool = self.pool
        if pool is None:
            return
        with self._lock:
            slots, self._slots = self._slots, []
        for slot in slots:
            pool.retire(slot)

    def rows(
        self, name: str, lo: int, hi: int, values: list[dict[str, Any]]
    ) -> torch.Tensor | None:
        """Rows ``lo:hi`` of field ``name``'s buffer, if they are those slots' values."""
        entry = self._bufs.get(name)
        if entry is None:
            return None
        rows = self._given_rows(name)[lo:hi]
        got = [v.get(name) for v in values[lo:hi]]
        # every slot given a row of the buffer, and each value that very row (one C loop)
        if not all(map(operator.is_not, rows, itertools.repeat(None))):
            return None
        if not all(map(operator.is_, got, rows)):
            return None
        return entry[0][lo:hi]

    def tensors(self, slot: int, fields: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """Rows of the buffers that slot ``slot``'s values are (by identity)."""
        out: dict[str, torch.Tensor] = {}
        for name, value in fields.items():
            given = self._given[name][slot] if name in self._given else None
            if given is not None and value is given:
                entry = self._bufs[name]
                assert entry is not None
                out[name] = entry[0][slot]
        return out


def _close_fds(files: dict[tuple[int, int], int]) -> None:
    close_fds(files.values())
    files.clear()


def stacked_view(values: list[torch.Tensor]) -> torch.Tensor | None:
    """The tensors as one ``(B, ...)`` view when they are consecutive rows of one buffer."""
    base = values[0]._base
    step = values[0].numel()
    if base is None or not base.is_contiguous() or step == 0 or base.numel() % step:
        return None
    first = values[0].storage_offset()
    for j, v in enumerate(values):
        if (
            v._base is not base
            or not v.is_contiguous()
            or v.dtype != base.dtype
            or v.shape != values[0].shape
            or v.storage_offset() != first + j * step
        ):
            return None
    start, rem = divmod(int(first) - int(base.storage_offset()), int(step))
    rows = base.view(-1, *values[0].shape)
    if rem or start < 0 or start + len(values) > rows.shape[0]:
        return None
    return rows[start : start + len(values)]
