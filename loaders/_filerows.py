"""Batch rows that a DataLoader worker leaves in the shard file, mapped by the main process.

With no workers, a large page-aligned Zarr chunk is mapped from its shard file straight
into the batch (``BufferPool.map_file``). A worker cannot do that for the main process:
its memory is its own, and the shared memory its batches usually travel in would need
the bytes copied in. So a worker whose shards' checks have passed does not read such a
chunk at all: the batch carries a :class:`FileRows` (where each row's bytes lie in which
file) in place of the tensor, the worker sends the files' descriptors over a Unix socket
made for it before it started (:class:`FdChannel`, ``SCM_RIGHTS``: the kernel passes
the open files, so a file unlinked meanwhile, a cache copy evicted, is still the same
file), and the main process maps the rows into a tensor of its own pool
(:func:`resolve_batch`). Nothing is named and nothing outlives the processes: a crash
leaves no state behind.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

from simstore._buffers import BufferPool
from simstore.errors import StorageError

__all__ = ["FdChannel", "FileRows", "close_fds", "read_exactly", "resolve_batch"]

_HEAD = struct.Struct("<QII")
"""A message's head: the batch's token, the index of its first descriptor, the total."""

MAX_FDS = 250
"""Descriptors per message (the kernel takes at most 253 in one)."""

RECEIVE_TIMEOUT_S = 120.0
"""The longest the main process waits for descriptors its batch says were sent."""


class FileRows:
    """A batch field's rows as ``(row, byte offset in row, bytes, file number, file offset)``.

    ``shape`` is the batch tensor's, ``dtype`` its NumPy dtype string; ``files`` counts
    the distinct files, whose descriptors travel beside the batch under ``token``
    (``fd_base``: the position of this field's first one among the batch's).
    ``fds``, in the worker only, are the descriptors to send.
    """

    __slots__ = ("dtype", "fd_base", "fds", "files", "pieces", "shape", "token")

    def __init__(self, shape: tuple[int, ...], dtype: str,
                 pieces: list[tuple[int, int, int, int, int]], fds: Sequence[int]) -> None:
        self.shape, self.dtype, self.pieces = shape, dtype, pieces
        self.fds = list(fds)
        self.files = len(self.fds)
        self.token = 0
        self.fd_base = 0

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuilt, (self.shape, self.dtype, self.pieces, self.files, self.token,
                           self.fd_base))

    def tensor(self, fds: Sequence[int], pool: BufferPool) -> torch.Tensor:
        """The rows, mapped from ``fds`` (this field's descriptors) into ``pool`` memory.

        A piece the pool cannot map is read instead. The memory is new (never faulted
        in): mapping over it frees nothing, and the pool's idle memory stays for batches
        that are read.
        """
        array = pool.array(self.shape, np.dtype(self.dtype), fresh=True)
        rows = array.reshape(self.shape[0], -1).view(np.uint8)
        for row, at, nbytes, file, offset in self.pieces:
            part = rows[row, at : at + nbytes]
            if not pool.map_file(part, fds[file], offset):
                read_exactly(fds[file], part, offset)
        return torch.from_numpy(array)


def read_exactly(fd: int, out: np.ndarray, offset: int) -> None:
    """Fill ``out`` (bytes) from file ``fd`` at ``offset``; a short file is a StorageError."""
    got = os.preadv(fd, [out.data], offset)
    if got != out.nbytes:
        raise StorageError(f"a shard file ended {out.nbytes - got} bytes short of a chunk "
                           f"at offset {offset}")


def _rebuilt(shape: tuple[int, ...], dtype: str, pieces: list[tuple[int, int, int, int, int]],
             files: int, token: int, fd_base: int) -> FileRows:
    out = FileRows(shape, dtype, pieces, ())
    out.files, out.token, out.fd_base = files, token, fd_base
    return out


class FdChannel:
    """A socket pair over which one worker sends its batches' file descriptors.

    Made by the main process before it starts the worker: a forked worker inherits it, a
    worker started by spawn or a fork server gets its end's descriptor with its start
    (any other copy is None: a socket does not survive a pickle). Messages are
    datagrams, so each batch's descriptors arrive whole and in the order sent.
    """

    def __init__(self, *, _worker_fd: int | None = None) -> None:
        self._token = 0
        self._main: socket.socket | None = None
        if _worker_fd is not None:  # a spawned worker's end, from its start
            self._worker = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM, fileno=_worker_fd)
            return
        self._main, self._worker = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._main.settimeout(RECEIVE_TIMEOUT_S)

    def __reduce__(self) -> tuple[Any, ...]:
        """The channel as a worker being started gets it: its end, by descriptor."""
        from multiprocessing import context, reduction

        if self._main is None or context.get_spawning_popen() is None:
            return (_no_channel, ())
        return (_spawned_channel, (reduction.DupFd(self._worker.fileno()),))

    def send(self, rows: Sequence[FileRows]) -> None:
        """In the worker: send ``rows``' descriptors under a new token that they record."""
        self._token += 1
        fds: list[int] = []
        for r in rows:
            r.token, r.fd_base = self._token, len(fds)
            fds.extend(r.fds)
        for start in range(0, len(fds), MAX_FDS):
            part = fds[start : start + MAX_FDS]
            socket.send_fds(self._worker, [_HEAD.pack(self._token, start, len(fds))], part)

    def receive(self, token: int, count: int) -> list[int]:
        """In the main process: the ``count`` descriptors sent under ``token`` (now ours).

        Descriptors of an earlier token (a batch that was never delivered) are closed.
        """
        if self._main is None:
            raise StorageError("a DataLoader worker's descriptor channel has no main end")
        got: list[int] = []
        while len(got) < count:
            try:
                msg, fds, flags, _ = socket.recv_fds(self._main, _HEAD.size, MAX_FDS)
            except TimeoutError as exc:
                close_fds(got)
                raise StorageError(
                    f"a DataLoader worker's batch refers to {count} shard files whose "
                    f"descriptors did not arrive within {RECEIVE_TIMEOUT_S:.0f} s") from exc
            if flags & socket.MSG_CTRUNC or len(msg) != _HEAD.size:
                close_fds(fds)
                close_fds(got)
                raise StorageError("a DataLoader worker's shard file descriptors arrived "
                                   "cut short (is the process's open-file limit reached?)")
            sent, start, total = _HEAD.unpack(msg)
            if sent != token:
                close_fds(fds)
                continue
            if start != len(got) or total != count:
                close_fds(fds)
                close_fds(got)
                raise StorageError(f"a DataLoader worker sent descriptors {start}.. of "
                                   f"{total} where {len(got)}.. of {count} were due")
            got.extend(fds)
        return got

    def close(self) -> None:
        """Close both ends (descriptors still in flight are closed with them)."""
        if self._main is not None:
            self._main.close()
        self._worker.close()


def _no_channel() -> None:
    return None


def _spawned_channel(fd: Any) -> FdChannel:
    """In a worker started by spawn or a fork server: its end of the channel."""
    return FdChannel(_worker_fd=fd.detach())


def close_fds(fds: Iterable[int]) -> None:
    """Close each of ``fds`` (one already closed is passed over)."""
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def file_rows_of(batch: Any) -> list[FileRows]:
    """The :class:`FileRows` among a batch's fields (a batch is a dict)."""
    if type(batch) is not dict:
        return []
    return [v for v in batch.values() if type(v) is FileRows]


def resolve_batch(batch: dict[str, Any], rows: list[FileRows], channel: FdChannel | None,
                  pool: BufferPool, pin: bool) -> None:
    """In the main process: replace ``batch``'s :class:`FileRows` by mapped tensors."""
    if channel is None:
        raise StorageError("a batch refers to shard files, but this loader has no channel "
                           "to its worker")
    token = rows[0].token
    total = sum(r.files for r in rows)
    fds = channel.receive(token, total)
    try:
        for name, value in list(batch.items()):
            if type(value) is FileRows:
                tensor = value.tensor(fds[value.fd_base : value.fd_base + value.files], pool)
                batch[name] = tensor.pin_memory() if pin else tensor
    finally:
        close_fds(fds)
