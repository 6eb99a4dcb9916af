"""Discovery of source files, their content hashes, and the plan that cuts them into tasks.

The plan depends only on the files (their keys, sizes and, for very large files whose
adapter reads sample ranges, their sample counts) and the shard size, never on the engine
or the worker count, so every engine stores the same shards.
"""

from __future__ import annotations

import math
import mmap
import os
import stat
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from simstore.errors import InvalidInputError
from simstore.hashing import Hasher, ObjectId
from simstore.ingest._arrays import MiB
from simstore.ingest._records import Piece, SourceFile
from simstore.protocols import SourceAdapter

__all__ = [
    "SupportsSampleRanges",
    "discover",
    "hash_file",
    "hash_source",
    "plan_tasks",
    "read_head",
    "resolve_adapter",
    "sample_counter",
]


@runtime_checkable
class SupportsSampleRanges(Protocol):
    """Optional adapter capability: count a file's samples and read a range of them.

    An adapter that declares ``supports_sample_ranges = True`` lets ingest cut a very large
    file (more than twice ``shard_size``) into pieces that run as separate tasks, on
    several workers at once. Implementers keep this contract: ``count_samples(path,
    options)`` is the number of samples ``iter_samples(path, key, options)`` yields, and
    with ``options["sample_range"] = [start, stop]`` ``iter_samples`` yields exactly samples
    ``start`` to ``stop - 1`` of that sequence, with the same keys and values, reading
    (about) only what those samples need. Time windows of a trajectory are the model: the
    window count comes from the time axis, and a range of windows is a range of time steps.
    """

    supports_sample_ranges: bool

    def count_samples(self, path: str, options: Mapping[str, Any]) -> int:
        """How many samples the file yields under these options."""
        ...


def read_head(path: str) -> bytes:
    """The first 64 bytes of a file (adapters sniff them); empty for a directory."""
    try:
        with open(path, "rb") as f:
            return f.read(64)
    except (IsADirectoryError, PermissionError):  # Windows says PermissionError
        if os.path.isdir(path):
            return b""
        raise


_ADAPTER_TYPES: set[type] = set()  # types that passed the (slow) runtime protocol check


def resolve_adapter(adapter: SourceAdapter, path: str, head: bytes) -> SourceAdapter | None:
    """The adapter that reads ``path`` (``auto`` picks one), or None when none does."""
    resolve = getattr(adapter, "resolve", None)
    if callable(resolve):
        found = resolve(path, head)
        if found is None:
            return None
        if type(found) not in _ADAPTER_TYPES:
            if not isinstance(found, SourceAdapter):
                return None
            _ADAPTER_TYPES.add(type(found))
        return found  # type: ignore[no-any-return]
    return adapter if adapter.can_read(path, head) else None


def _stat(path: str) -> tuple[int, int]:
    st = os.stat(path)
    if stat.S_ISDIR(st.st_mode):
        size, mtime = 0, 0
        for root, _, files in os.walk(path):
            for name in files:
                st = os.stat(os.path.join(root, name))
                size += st.st_size
                mtime = max(mtime, st.st_mtime_ns)
        return size, mtime
    return st.st_size, st.st_mtime_ns


def discover(sources: Sequence[str], adapter: SourceAdapter) -> tuple[list[SourceFile], list[str]]:
    """Source files in key order, and the walked files no adapter reads."""
    found: dict[str, SourceFile] = {}
    walked: set[str] = set()
    ignored: list[str] = []
    claimed: set[str] = set()
    chosen: dict[str, SourceAdapter | None] = {}  # the adapter each walked file resolved to

    def add(path: str, key: str) -> None:
        if key in found and found[key].path != path:
            raise InvalidInputError(
                f"two sources map to the key {key!r}: {found[key].path} and {path}"
            )
        size, mtime = _stat(path)
        found[key] = SourceFile(path, key, size, mtime)

    for src in sources:
        path = os.path.abspath(os.fspath(src))
        if not os.path.exists(path):
            raise InvalidInputError(f"{src}: no such file or directory")
        if os.path.isdir(path) and resolve_adapter(adapter, path, b"") is None:
            for root, dirs, names in os.walk(path):
                dirs.sort()
                keep = []
                for d in dirs:
                    full = os.path.join(root, d)
                    if d.startswith("."):
                        continue
                    if resolve_adapter(adapter, full, b"") is not None:
                        add(full, os.path.relpath(full, path).replace(os.sep, "/"))
                        walked.add(full)
                    else:
                        keep.append(d)
                dirs[:] = keep
                for name in sorted(names):
                    if name.startswith("."):
                        continue
                    full = os.path.join(root, name)
                    picked = resolve_adapter(adapter, full, read_head(full))
                    if picked is None:
                        ignored.append(full)
                        continue
                    chosen[full] = picked
                    add(full, os.path.relpath(full, path).replace(os.sep, "/"))
                    walked.add(full)
        else:
            add(path, os.path.basename(path))
    for found_src in list(found.values()):
        picked = chosen.get(found_src.path)
        if picked is None:
            picked = resolve_adapter(adapter, found_src.path, read_head(found_src.path))
        companions = getattr(picked, "companions", None)
        if callable(companions):
            claimed.update(os.path.normpath(os.path.abspath(p)) for p in companions(found_src.path))
    files = [s for s in found.values() if not (s.path in walked and s.path in claimed)]
    return sorted(files, key=lambda s: s.key), sorted(ignored)


_HASH_WINDOW = 64 * MiB  # a multiple of mmap.ALLOCATIONGRANULARITY
# MAP_POPULATE maps a window's pages in one call instead of one fault per page (~2x faster)
_MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
_READ_WHOLE = 256 << 10


def hash_file(path: str) -> tuple[ObjectId, int]:
    """xxh3-128 id and size of a local file, equal to :func:`simstore.hashing.hash_file`.

    Hashes memory-mapped windows of 64 MiB, unmapping each before the next: no copy into
    Python buffers (about 8x faster than reading blocks here; a window's pages are mapped
    up front where the platform can) and mapped pages never exceed one window, so the
    resident memory stays bounded.
    """
    h = Hasher()
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size <= _READ_WHOLE:  # a small file: one read costs less than mapping it
            h.update(f.read())
            return h.hexdigest(), size
        for start in range(0, size, _HASH_WINDOW):
            length = min(_HASH_WINDOW, size - start)
            with mmap.mmap(
                f.fileno(), length, flags=_MAP_FLAGS, prot=mmap.PROT_READ, offset=start
            ) as m:
                # Release the view explicitly: a sampling profiler (dask's workers run one)
                # may still hold the frame that received it, and a live export makes
                # closing the map fail with BufferError.
                view = memoryview(m)
                try:
                    h.update(view)
                finally:
                    view.release()
    return h.hexdigest(), size


def hash_source(path: str) -> tuple[str, int]:
    """Content hash and size of a source file, or of a directory (sorted names and hashes)."""
    try:
        oid, size = hash_file(path)
        return str(oid), size
    except (IsADirectoryError, PermissionError):
        if not os.path.isdir(path):
            raise
    h = Hasher()
    total = 0
    entries = []
    for root, _, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            entries.append((os.path.relpath(full, path).replace(os.sep, "/"), full))
    for rel, full in sorted(entries):
        oid, size = hash_file(full)
        total += size
        h.update(f"{rel}\0{oid}\0{size}\n".encode())
    return str(h.hexdigest()), total


def sample_counter(
    adapter: SourceAdapter, options: Mapping[str, Any]
) -> Callable[[SourceFile], int | None]:
    """``count(file)``: the file's sample count when its adapter reads ranges, else None.

    A file the adapter cannot count (unreadable, corrupt) is not cut: its task will give
    the error that names the file and what is wrong.
    """

    def count(src: SourceFile) -> int | None:
        try:
            found = resolve_adapter(adapter, src.path, read_head(src.path))
            if not isinstance(found, SupportsSampleRanges) or not found.supports_sample_ranges:
                return None
            return int(found.count_samples(src.path, options))
        except Exception:  # the file's own task reports what is wrong
            return None

    return count


def _pieces(src: SourceFile, samples: int, shard_size: int) -> list[SourceFile]:
    """The file cut into about ``shard_size`` source bytes per piece, by sample ranges."""
    count = min(samples, math.ceil(src.size / shard_size))
    bounds = [i * samples // count for i in range(count + 1)]
    shares = [src.size * b // samples for b in bounds]
    return [
        SourceFile(
            src.path,
            src.key,
            shares[i + 1] - shares[i],
            src.mtime_ns,
            Piece(index=i, count=count, start=bounds[i], stop=bounds[i + 1]),
        )
        for i in range(count)
    ]


def plan_tasks(
    files: Sequence[SourceFile],
    shard_size: int,
    count_samples: Callable[[SourceFile], int | None] | None = None,
    piece_bytes: int = 0,
) -> list[list[SourceFile]]:
    """Runs of files in key order with about ``shard_size`` source bytes each.

    With ``count_samples`` (see :func:`sample_counter`), a file of more than twice
    ``max(shard_size, piece_bytes)`` bytes that it can count is cut into pieces of about
    that many bytes, one task each, so one huge file spreads over many workers. (Each
    piece opens its file again: ``piece_bytes`` keeps that cost small against the piece's
    work however small the shards are.)
    """
    piece = max(shard_size, piece_bytes)
    tasks: list[list[SourceFile]] = []
    current: list[SourceFile] = []
    acc = 0
    for f in files:
        samples = None
        if count_samples is not None and f.size > 2 * piece:
            samples = count_samples(f)
        if samples is not None and samples > 1:
            if current:
                tasks.append(current)
                current, acc = [], 0
            tasks.extend([p] for p in _pieces(f, samples, piece))
            continue
        current.append(f)
        acc += f.size
        if acc >= shard_size:
            tasks.append(current)
            current, acc = [], 0
    if current:
        tasks.append(current)
    return tasks
