"""The ``npz`` and ``npy`` adapters: one sample per file.

The key is the file's path relative to the ingest root without its extension; an .npz's
fields are its arrays' names as ``np.load`` gives them (``x.npy`` is ``x``, ``y.NPY`` is
``y.NPY``; a member that is no array is refused, naming it), an .npy's single field is
``data``. Pickles are never read (``allow_pickle=False``): an object array is refused with
an error naming the field, and so is a dtype no shard stores exactly (``float128``). A
header that claims more values than the bytes after it hold is refused before anything
is allocated. String arrays are read whole, up to the cap of :mod:`._limits`.
Arrays stored plainly (every .npy, and the members of an .npz written by ``np.savez``) are
read straight from the file: one that fits the in-memory limit and sits aligned in the
file (every .npy), or is 1 MiB or more (the members of an .npz), becomes a read-only view
of the file's pages (a shared read-only mapping, populated at once), any other is read
with ``pread`` (a large one in slices), so resident memory never holds more of a source
than the limit. A large member
of a compressed .npz is first inflated to a temporary .npy file, never into memory.

Every .npz member's CRC-32 is checked before any of its values are used: ``zipfile``
checks a compressed member's as it inflates it, and a stored member, which is read
straight from the file and never through ``zipfile``, is checked here when it is opened
(see :func:`_check_stored_crc`). A damaged member is an error naming it, never NaNs in
a snapshot.
"""

from __future__ import annotations

import math
import mmap
import os
import resource
import shutil
import struct
import tempfile
import threading
import tokenize
import weakref
import zipfile
import zlib
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from simstore import _buffers
from simstore.errors import SourceError
from simstore.sample import Sample

from .._zip import crc32
from ._limits import check_whole_value
from ._tree import DEFAULT_MAX_IN_MEMORY, SlicedArray, json_safe

__all__ = ["NPY_MAGIC", "NpyAdapter", "NpzAdapter"]

NPY_MAGIC = b"\x93NUMPY"

MAP_MISALIGNED_BYTES = 1 << 20
"""A plainly stored array this large becomes a view of the file's pages even when its
values sit misaligned in the file (see :attr:`FileArray.aligned`); smaller ones are read."""


class _MapBudget:
    """How many file mappings this process may hold at once; past it, arrays are read.

    CPython's ``mmap`` keeps a duplicate of the file descriptor it maps until the mapping
    goes, and a mapped array lives until its shard is written: a shard of many small
    files held a descriptor per file, and an ingest of 20,000 one-sample files failed
    with "Too many open files" (the limit here was 20,000; 1,024 is common). Mappings are
    an optimisation (the values are the same read), so at most a quarter of the soft
    limit on open files is spent on them, and any more arrays are read into memory.
    """

    def __init__(self) -> None:
        # reentrant: a mapping's finalizer (give_back) may run from a garbage collection
        # that starts inside take(), on the same thread
        self._lock = threading.RLock()
        self._live = 0
        self._most: int | None = None

    def most(self) -> int:
        """The most mappings held at once: a quarter of the soft limit on open files."""
        if self._most is None:
            soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
            self._most = 4096 if soft == resource.RLIM_INFINITY else max(soft // 4, 8)
        return self._most

    def take(self) -> bool:
        """Whether one more mapping may be made (then :meth:`give_back` when it goes)."""
        with self._lock:
            if self._live >= self.most():
                return False
            self._live += 1
            return True

    def give_back(self) -> None:
        with self._lock:
            self._live -= 1


MAPS = _MapBudget()

CRC_WINDOW_BYTES = 64 << 20
"""A stored .npz member's CRC-32 is computed over mappings of at most this many bytes at a
time, so checking a member larger than memory keeps little of it resident."""


def _strip(key: str, ext: str) -> str:
    return key[: -len(ext)] if key.lower().endswith(ext) else key


def _header(f: Any, path: str, name: str) -> tuple[tuple[int, ...], bool, np.dtype[Any]]:
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
    except (ValueError, OSError, SyntaxError, tokenize.TokenError) as exc:
        # a damaged header dict fails numpy's parse with any of these; a TokenError's
        # str() is the tuple of its message and position
        reason = exc.args[0] if isinstance(exc, tokenize.TokenError) and exc.args else exc
        raise SourceError(f"{path}: field {name!r}: not a valid .npy array: {reason}") from exc
    return tuple(shape), bool(fortran), np.dtype(dtype)


def _check_dtype(dtype: np.dtype[Any], path: str, name: str) -> None:
    if dtype.hasobject:
        raise SourceError(
            f"{path}: field {name!r}: object arrays are refused (they are pickles, "
            "which simstore never reads)"
        )
    if dtype.kind not in "biufSU":
        raise SourceError(f"{path}: field {name!r}: unsupported dtype {dtype}")
    if dtype.kind == "f" and dtype.type not in _FLOAT_TYPES:
        raise SourceError(
            f"{path}: field {name!r}: unsupported dtype {dtype} (extended precision: no "
            "shard format stores it and reads it back exactly, and it is not converted)"
        )


_FLOAT_TYPES = (np.float16, np.float32, np.float64)


class FileArray:
    """An array stored plainly in a file (C or Fortran order).

    A box is read by ``pread`` as runs of contiguous bytes straight into the result's
    buffer, so a read of part of a large array holds only that part. :meth:`mapped` gives
    the whole array without a copy instead.
    """

    def __init__(
        self, path: str, offset: int, shape: tuple[int, ...], dtype: np.dtype[Any], fortran: bool
    ) -> None:
        self.shape = tuple(int(n) for n in shape)
        self.dtype = np.dtype(dtype)
        self._fortran = fortran
        self._offset = offset
        self._count = int(np.prod(self.shape, dtype=np.int64))
        need = offset + self._count * self.dtype.itemsize
        if os.path.getsize(path) < need:
            raise ValueError(f"file is truncated: {os.path.getsize(path)} bytes, need {need}")
        fd = os.open(path, os.O_RDONLY)
        self._fd = fd
        weakref.finalize(self, os.close, fd)

    @property
    def aligned(self) -> bool:
        """Whether the values start at a multiple of their dtype's alignment in the file.

        A mapped array shares the file's alignment: the members of an .npz written by
        ``np.savez`` sit at odd offsets (its zip headers are not padded), every .npy's
        values at a multiple of 64. What ingest does with a large array costs the same
        misaligned (16 MiB of float32: statistics 6.0 against 5.8 ms, hashing 0.95
        against 0.83, cutting Zarr chunks 2.5 either way) and saves the read into
        memory (2.1 ms), so :data:`MAP_MISALIGNED_BYTES` and more are mapped either way;
        a small misaligned one is read, which costs less than a mapping.
        """
        return self._offset % self.dtype.alignment == 0

    def mapped(self) -> np.ndarray:
        """The whole array as a read-only view of the file's pages, in C order.

        The region is mapped shared and read-only with ``MAP_POPULATE`` (its pages are
        entered in one call instead of one fault each) and unmapped when the last view of
        it goes: against a ``pread`` into fresh memory this saves the copy and the zeroing
        of the fresh pages (about half the adapter's CPU for 16 MiB arrays). A file that
        cannot be mapped (a pipe, some network file systems) is read instead, and so is
        any array past the process's budget of mappings (see :class:`_MapBudget`). The file's
        size was checked when it was opened; a file truncated by another process while
        it is being ingested ends the process (SIGBUS), as it would for any mapped read.
        """
        size = self._count * self.dtype.itemsize
        start = self._offset - self._offset % mmap.ALLOCATIONGRANULARITY
        if not MAPS.take():  # as many mappings (each holding a descriptor) as allowed
            return np.require(self[()], requirements="C")  # keeps a 0-d array 0-d
        try:
            region = mmap.mmap(
                self._fd,
                self._offset - start + size,
                flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                prot=mmap.PROT_READ,
                offset=start,
            )
        except (OSError, ValueError):
            MAPS.give_back()
            return np.require(self[()], requirements="C")  # keeps a 0-d array 0-d
        weakref.finalize(region, MAPS.give_back)
        flat = np.frombuffer(region, dtype=self.dtype, count=self._count,
                             offset=self._offset - start)
        if self._fortran:
            return np.require(flat.reshape(self.shape[::-1]).T, requirements="C")
        return flat.reshape(self.shape)

    def __getitem__(self, key: Any) -> np.ndarray:
        """The values in a box of slices (step 1)."""
        if not isinstance(key, tuple):
            key = (key,)
        parts = list(key) + [slice(None)] * (len(self.shape) - len(key))
        box = [p.indices(n)[:2] for p, n in zip(parts, self.shape, strict=True)]
        if self._fortran:
            return self._read_c(self.shape[::-1], box[::-1]).T
        return self._read_c(self.shape, box)

    def _read_c(self, shape: tuple[int, ...], box: list[tuple[int, int]]) -> np.ndarray:
        out_shape = tuple(max(0, b - a) for a, b in box)
        # pooled memory: a run of 16 MiB arrays reads into pages faulted in once, not a
        # fresh zeroed page per 4 KiB per array (see simstore._buffers)
        out = _buffers.POOL.array(out_shape, self.dtype)
        if out.size == 0:
            return out
        if not shape:
            os.preadv(self._fd, [out.reshape(1).data.cast("B")], self._offset)
            return out
        k = max((i for i, (a, b) in enumerate(box) if (a, b) != (0, shape[i])), default=0)
        strides = [int(np.prod(shape[i + 1 :], dtype=np.int64)) for i in range(len(shape))]
        run = out_shape[k] * strides[k]
        flat = out.reshape(-1)
        item = self.dtype.itemsize
        pos = 0
        for idx in np.ndindex(*out_shape[:k]):
            start = sum((box[i][0] + j) * strides[i] for i, j in enumerate(idx))
            start += box[k][0] * strides[k]
            view = flat[pos : pos + run].data.cast("B")
            got = os.preadv(self._fd, [view], self._offset + start * item)
            if got != run * item:
                raise OSError(f"short read: {got} of {run * item} bytes")
            pos += run
        return out


def _value(arr: Any, path: str, name: str, max_bytes: int) -> Any:
    """A field value: strings as str/JSON, small arrays in memory, big ones as slices."""
    if arr.dtype.kind in "SU":
        # read whole into a str or a JSON list (several times the source's bytes): capped
        check_whole_value(path, name, math.prod(arr.shape) * arr.dtype.itemsize)
        arr = arr if isinstance(arr, np.ndarray) else arr[tuple(slice(0, n) for n in arr.shape)]
        if arr.ndim == 0:
            # text, or (bytes that are not UTF-8) {"__bytes_hex__": ...}, as in a 1-d array
            item = arr.item()
            return json_safe(item) if isinstance(item, bytes) else str(item)
        return {"values": json_safe(np.asarray(arr))}
    src = SlicedArray(arr, path=path, field=name)
    if src.nbytes > max_bytes:
        return src
    if (
        isinstance(arr, FileArray)
        and arr.dtype.isnative
        and (arr.aligned or src.nbytes >= MAP_MISALIGNED_BYTES)
    ):
        return arr.mapped()
    return src.read()


def _check_size(
    shape: tuple[int, ...], dtype: np.dtype[Any], available: int, path: str, name: str
) -> None:
    """Refuse a header that claims more values than the ``available`` bytes after it hold.

    Checked before anything is allocated: a damaged (or hostile) header that claims
    10^13 values is an error naming the field, never a MemoryError.
    """
    need = math.prod(shape) * dtype.itemsize
    if need > available:
        raise SourceError(
            f"{path}: field {name!r}: the header claims shape {shape} of {dtype} "
            f"({need:,} bytes), but only {max(available, 0):,} bytes follow it "
            "(truncated or corrupt)"
        )


def _file_array(
    path: str, offset: int, name: str, *, end: int | None = None, data_path: str | None = None
) -> FileArray | np.ndarray:
    """The array whose .npy header is at ``offset`` of ``data_path`` (default: ``path``).

    ``end``: where its bytes end in that file (an .npz member's end), else the file's end.
    Errors name ``path``, the source file.
    """
    data_path = data_path or path
    with open(data_path, "rb") as f:
        f.seek(offset)
        shape, fortran, dtype = _header(f, path, name)
        data_offset = f.tell()
    _check_dtype(dtype, path, name)
    if end is not None:
        _check_size(shape, dtype, end - data_offset, path, name)
    if np.prod(shape, dtype=np.int64) == 0 or dtype.itemsize == 0:
        return np.zeros(shape, dtype=dtype)
    return FileArray(data_path, data_offset, shape, dtype, fortran)


def _member_field(zf: zipfile.ZipFile, info: zipfile.ZipInfo, path: str) -> str:
    """The field an .npz member gives, named as ``np.load`` names it; refuse a non-array.

    ``np.load`` names a member ``x.npy`` ``x`` and any other member by its whole name
    (``y.NPY``), and reads every member that starts with the .npy magic as an array. So
    does this; a member that is no .npy array (``notes.txt``) is refused, naming it, not
    dropped unseen.
    """
    name = info.filename
    if name.endswith(".npy"):
        return name[: -len(".npy")]
    try:
        with zf.open(info) as member:
            head = member.read(len(NPY_MAGIC))
    except (OSError, EOFError, zipfile.BadZipFile, zlib.error, RuntimeError) as exc:
        raise SourceError(f"{path}: member {name!r}: unreadable: {exc}") from exc
    if head != NPY_MAGIC:
        raise SourceError(
            f"{path}: member {name!r} is not a NumPy array (.npy); an .npz is read as "
            "arrays only"
        )
    return name


class NpyAdapter:
    """One ``.npy`` array per file, as the field ``data``."""

    name = "npy"
    version = "1"
    fresh_arrays = True  # every array it yields is its sample's own (docs/adapters.md)
    extensions = (".npy",)
    options = frozenset({"npy_field"})

    def can_read(self, path: str, head: bytes) -> bool:
        """``.npy`` by extension or the NumPy magic."""
        return head.startswith(NPY_MAGIC) or path.lower().endswith(".npy")

    def iter_samples(self, path: str, key: str, options: Mapping[str, Any]) -> Iterator[Sample]:
        """The file's one sample."""
        max_bytes = int(options.get("max_in_memory_bytes") or DEFAULT_MAX_IN_MEMORY)
        field = str(options.get("npy_field") or "data")
        try:
            arr = _file_array(path, 0, field)
        except OSError as exc:
            raise SourceError(f"{path}: unreadable .npy file: {exc}") from exc
        except ValueError as exc:
            raise SourceError(f"{path}: field {field!r}: truncated or corrupt .npy: {exc}") from exc
        yield Sample(_strip(key, ".npy"), {field: _value(arr, path, field, max_bytes)})


def _local_data_offset(f: Any, info: zipfile.ZipInfo) -> int:
    f.seek(info.header_offset)
    local = f.read(30)
    if local[:4] != b"PK\x03\x04":
        raise zipfile.BadZipFile(f"bad local header for {info.filename}")
    name_len, extra_len = struct.unpack("<HH", local[26:30])
    return int(info.header_offset + 30 + name_len + extra_len)


def _check_stored_crc(
    raw: Any, info: zipfile.ZipInfo, offset: int, known: int | None = None
) -> None:
    """Check a stored member's bytes (at ``offset`` of the open file ``raw``) against its CRC-32.

    A stored member is mapped or read with ``pread`` straight from the file, never through
    ``zipfile``, which is what checks a member's CRC-32; unchecked, a damaged member
    gave its garbage (NaNs) to the snapshot. The check runs once, when the member is
    opened and before any of its values are used, so every later read (the whole array
    mapped, or windows of a large one) reads checked bytes. It maps the member
    :data:`CRC_WINDOW_BYTES` at a time (ISA-L's CRC-32 and the page faults: about 0.2 s
    per GiB here), so the file is read from disk once and the values then come from the
    page cache. A file that cannot be mapped is read in the same windows instead.
    ``known``: the CRC-32 of those bytes taken already (in ingest's hash of the file, see
    :meth:`NpzAdapter.crc_ranges`), only compared.
    """
    size = int(info.compress_size)
    fd = raw.fileno()
    if os.fstat(fd).st_size < offset + size:
        raise ValueError(f"file is truncated: the member needs {offset + size} bytes")
    if known is not None:  # taken in ingest's hash of the file (``crc_ranges``)
        _compare_crc(info, known)
        return
    crc = 0
    pos = offset
    end = offset + size
    while pos < end:
        start = pos - pos % mmap.ALLOCATIONGRANULARITY
        stop = min(end, start + CRC_WINDOW_BYTES)
        try:
            with mmap.mmap(fd, stop - start, flags=mmap.MAP_SHARED,
                           prot=mmap.PROT_READ, offset=start) as region:
                with memoryview(region) as view:
                    crc = crc32(view[pos - start :], crc)
        except (OSError, ValueError):  # not mappable: a pipe, some network file systems
            chunk = os.pread(fd, stop - pos, pos)
            if len(chunk) != stop - pos:
                raise ValueError("file is truncated inside the member") from None
            crc = crc32(chunk, crc)
        pos = stop
    _compare_crc(info, crc)


def _compare_crc(info: zipfile.ZipInfo, crc: int) -> None:
    if crc != info.CRC:
        raise ValueError(
            f"CRC-32 mismatch: the archive records {info.CRC:08x}, the stored bytes give "
            f"{crc:08x} (the member is corrupt)"
        )


class NpzAdapter:
    """An ``.npz`` archive per file; its arrays are the sample's fields."""

    name = "npz"
    version = "1"
    fresh_arrays = True  # every array it yields is its sample's own (docs/adapters.md)
    extensions = (".npz",)
    options: frozenset[str] = frozenset()

    def can_read(self, path: str, head: bytes) -> bool:
        """``.npz`` by extension (it is a zip file)."""
        return path.lower().endswith(".npz")

    def crc_ranges(self, path: str) -> list[tuple[int, int]]:
        """Where the stored members' bytes are: ``(offset, size)``, checked by CRC-32.

        Ingest takes their CRC-32s in its hash of the file (one pass over its bytes, not
        two) and gives them to :meth:`iter_samples` as ``options["checked_crcs"]``.
        """
        with zipfile.ZipFile(path) as zf, open(path, "rb") as raw:
            return [
                (_local_data_offset(raw, info), int(info.compress_size))
                for info in zf.infolist()
                if info.compress_type == zipfile.ZIP_STORED and not info.is_dir()
            ]

    def iter_samples(self, path: str, key: str, options: Mapping[str, Any]) -> Iterator[Sample]:
        """The archive's one sample."""
        max_bytes = int(options.get("max_in_memory_bytes") or DEFAULT_MAX_IN_MEMORY)
        # CRC-32s ingest took in its hash of the file, by (offset, size) (``crc_ranges``)
        checked: Mapping[tuple[int, int], int] = options.get("checked_crcs") or {}
        tmp_dir: str | None = None
        try:
            try:
                zf = zipfile.ZipFile(path)
                infos = sorted(zf.infolist(), key=lambda i: i.filename)
            except (zipfile.BadZipFile, OSError, EOFError) as exc:
                raise SourceError(f"{path}: not a readable .npz (zip) file: {exc}") from exc
            fields: dict[str, Any] = {}
            members: dict[str, str] = {}  # field name -> the member that gave it
            with zf, open(path, "rb") as raw:
                for info in infos:
                    if info.is_dir():
                        continue
                    name = _member_field(zf, info, path)
                    if name in members:
                        raise SourceError(
                            f"{path}: members {members[name]!r} and {info.filename!r} both "
                            f"give field {name!r}"
                        )
                    members[name] = info.filename
                    try:
                        if info.compress_type == zipfile.ZIP_STORED:
                            offset = _local_data_offset(raw, info)
                            _check_stored_crc(
                                raw, info, offset,
                                checked.get((offset, int(info.compress_size))),
                            )
                            arr = _file_array(path, offset, name, end=offset + info.file_size)
                        elif info.file_size <= max_bytes:
                            with zf.open(info) as member:
                                shape, fortran, dtype = _header(member, path, name)
                                _check_dtype(dtype, path, name)
                                _check_size(shape, dtype, info.file_size - member.tell(),
                                            path, name)
                                if dtype.kind in "SU":  # refused before np.load reads it
                                    check_whole_value(
                                        path, name, math.prod(shape) * dtype.itemsize
                                    )
                            with zf.open(info) as member:
                                arr = np.load(member, allow_pickle=False)
                                # to the member's end: zipfile checks the CRC-32 there
                                member.read()
                        else:
                            tmp_dir = tmp_dir or tempfile.mkdtemp(
                                prefix="simstore-npz-", dir=options.get("tmp_dir")
                            )
                            target = os.path.join(tmp_dir, f"{len(fields)}.npy")
                            with zf.open(info) as member, open(target, "wb") as out:
                                shutil.copyfileobj(member, out, 4 << 20)
                            arr = _file_array(path, 0, name, end=info.file_size,
                                              data_path=target)
                    except SourceError:
                        raise
                    except (
                        ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error
                    ) as exc:  # zlib.error: a damaged deflate stream
                        raise SourceError(
                            f"{path}: field {name!r}: unreadable array: {exc}"
                        ) from exc
                    fields[name] = _value(arr, path, name, max_bytes)
                yield Sample(_strip(key, ".npz"), fields)
        finally:
            if tmp_dir:
                shutil.rmtree(tmp_dir, ignore_errors=True)
