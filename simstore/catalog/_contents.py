"""verify's sample check: every manifest row against the shard row it names.

A shard that hashes to its id holds the bytes its writer produced; whether those bytes
are the samples the manifest says they are is another question. ``verify --samples``
answers it: each shard a snapshot reaches is opened, the key stored at each position a
manifest row names is compared with the row's key, and the sample read there is hashed
the way ingest hashed it (:func:`simstore.ingest.hash_sample_blocks`) and compared with
the row's ``sample_hash``. That catches a writer or a tool that put rows in another order
than it recorded, a manifest part built against another shard, and a shard crafted to
decode differently from what its manifest promises.

Formats are reached through the entry-point group ``simstore.shard_formats`` only (core
never imports the formats package), and recognised by their first and last bytes.
"""

from __future__ import annotations

import os
import tempfile
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from simstore.errors import NotFoundError, SimstoreError, StorageError
from simstore.hashing import Hasher, object_key
from simstore.protocols import ShardFormat, ShardReader
from simstore.sample import Sample

__all__ = ["ROW_COLUMNS", "SampleMismatch", "ShardCheck", "check_shards", "hash_object"]

_HASH_BLOCK = 8 * 1024 * 1024

ROW_COLUMNS = ["shard", "position", "key", "sample_hash", "size_bytes"]
"""The manifest columns the sample check needs."""

# samples read from a shard at a time: at most this many logical bytes (or one sample)
_BATCH_BYTES = 64 * 1024 * 1024
_BATCH_ROWS = 4096
# shards checked at once: a remote store's downloads overlap the decoding of another
_THREADS = 2
# mismatches spelled out per shard (the count says how many there were)
_SHOWN = 3


def hash_object(cat: Any, oid: str, sink: IO[bytes] | None = None) -> tuple[str, int]:
    """``(xxh3-128 hex, bytes read)`` of object ``oid`` read whole; its bytes go to ``sink``.

    A remote object whose bytes do not hash to ``oid`` is read once more (``sink``
    emptied first) and the second reading's hash is the answer: bytes damaged on the
    way (a middlebox that cut a body and its length alike, which no check of the reply
    sees) are not the stored object's damage, which both readings show. The bytes read
    count both readings.
    """
    actual, size = _hash_object_once(cat, oid, sink)
    if actual != oid and cat.store.local_path(object_key(oid)) is None:
        if sink is not None:
            sink.seek(0)
            sink.truncate()
        actual, again = _hash_object_once(cat, oid, sink)
        size += again
    return actual, size


def _hash_object_once(cat: Any, oid: str, sink: IO[bytes] | None) -> tuple[str, int]:
    key = object_key(oid)
    h = Hasher()

    def take(block: bytes) -> None:
        h.update(block)
        if sink is not None:
            sink.write(block)

    path = cat.store.local_path(key)
    if path is not None:
        try:
            with open(path, "rb") as f:
                while block := f.read(_HASH_BLOCK):
                    take(block)
        except FileNotFoundError:
            raise NotFoundError(key) from None
        except OSError as exc:  # not this user's to read (a store written with umask 077)
            raise StorageError(f"{path}: cannot be read: {exc.strerror or exc}") from exc
        return h.hexdigest(), h.size_bytes
    open_read = getattr(cat.store, "open_read", None)
    if open_read is not None:
        # one whole-object GET read block by block (S3): no HEAD, no ranged GETs
        with open_read(key) as stream:
            while block := stream.read(_HASH_BLOCK):
                take(block)
        return h.hexdigest(), h.size_bytes
    size = cat.store.info(key).size_bytes
    start = 0
    while start < size:
        end = min(size, start + _HASH_BLOCK)
        take(cat.store.get(key, byte_range=(start, end)))
        start = end
    return h.hexdigest(), h.size_bytes


@dataclass(frozen=True, slots=True)
class SampleMismatch:
    """One manifest row the shard disagrees with."""

    position: int
    key: str
    what: str  # "key" or "content"
    found: str  # the shard's key, or the hash of what the shard holds there
    expected: str = ""  # for "content": the manifest's sample_hash


@dataclass(slots=True)
class ShardCheck:
    """What checking one shard's rows found.

    ``error``: the shard could not be opened or read (or, fetched from a remote store,
    did not hash to its id); ``mismatches``: the first few rows it disagrees with, and
    ``mismatch_count`` how many there were in all.
    """

    shard: str
    rows: int = 0
    checked: int = 0
    bytes_read: int = 0
    """Logical bytes (manifest ``size_bytes``) of the rows naming this shard, for progress."""
    bytes_hashed: int = 0
    error: str | None = None
    mismatches: tuple[SampleMismatch, ...] = ()
    mismatch_count: int = 0
    parts: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """Whether every row matched."""
        return self.error is None and self.mismatch_count == 0

    def message(self, reached_by: str) -> str:
        """The problem line: the shard, what is wrong, and what reaches it."""
        key = object_key(self.shard)
        if self.error is not None:
            return f"{key}: {self.error}; referenced by {reached_by}"
        parts = ", ".join(self.parts[:3]) + (" ..." if len(self.parts) > 3 else "")
        shown = "; ".join(_describe(m) for m in self.mismatches)
        return (
            f"{key}: {self.mismatch_count} of {self.rows} manifest rows do not match the "
            f"shard ({shown}{'; ...' if self.mismatch_count > len(self.mismatches) else ''}); "
            f"manifest part{'s' if len(self.parts) > 1 else ''} {parts}; "
            f"referenced by {reached_by}"
        )


def _describe(m: SampleMismatch) -> str:
    if m.what == "key":
        return f"position {m.position} holds key {m.found!r}, the manifest says {m.key!r}"
    return (
        f"sample {m.key!r} at position {m.position} hashes to {m.found}, the manifest says "
        f"{m.expected}"
    )


def check_shards(
    cat: Any,
    rows: pa.Table,
    *,
    on_done: Callable[[ShardCheck], None],
) -> None:
    """Check every row of ``rows`` (:data:`ROW_COLUMNS` plus ``part``) against its shard.

    The caller leaves out the rows of shards it knows are missing or damaged. A shard of a
    local store is read where it lies (``verify --deep`` hashes it); a remote one is
    fetched once to a temporary file and hashed on the way, and is not read unless it
    matches its id. ``on_done`` gets each shard's result, in shard id order.
    """
    formats = _Formats()
    with tempfile.TemporaryDirectory(prefix="simstore-verify-") as tmp:
        with ThreadPoolExecutor(_THREADS, thread_name_prefix="simstore-verify") as pool:
            # a few shards in flight: each one's rows become Python objects only then
            pending: deque[Future[ShardCheck]] = deque()
            for group in _by_shard(rows):
                pending.append(pool.submit(_check_shard, cat, group, formats, tmp))
                if len(pending) >= 2 * _THREADS:
                    on_done(pending.popleft().result())
            while pending:
                on_done(pending.popleft().result())


@dataclass(slots=True)
class _Rows:
    shard: str
    positions: np.ndarray
    keys: list[str]
    hashes: list[bytes]
    sizes: np.ndarray
    parts: tuple[str, ...]
    listed_bytes: int = 0
    """``size_bytes`` of every manifest row naming this shard, a row listed twice twice."""


def _by_shard(rows: pa.Table) -> Iterator[_Rows]:
    """Each shard's distinct manifest rows, sorted by position (shards in id order).

    The rows are sorted once in Arrow; each shard's slice becomes Python objects only
    when it is yielded, so a manifest of millions of rows is not held twice.
    """
    if rows.num_rows == 0:
        return
    order = pc.sort_indices(rows, [("shard", "ascending"), ("position", "ascending")])
    rows = rows.take(order)
    shard_col = rows.column("shard").combine_chunks()
    # where the shard id changes: the run boundaries of the sorted column
    changes = pc.not_equal(shard_col.slice(1), shard_col.slice(0, len(shard_col) - 1))
    starts = [0, *(np.flatnonzero(changes.to_numpy(zero_copy_only=False)) + 1).tolist()]
    ends = [*starts[1:], rows.num_rows]
    for start, end in zip(starts, ends, strict=True):
        shard = str(shard_col[start].as_py())
        part = rows.slice(start, end - start)
        positions = part.column("position").to_numpy()
        keys = part.column("key").to_pylist()
        hashes = part.column("sample_hash").to_pylist()
        # several parts (snapshots) listing the same row: check it once
        seen: set[tuple[int, str, bytes]] = set()
        keep = []
        for i in range(end - start):
            row = (int(positions[i]), keys[i], hashes[i])
            if row not in seen:
                seen.add(row)
                keep.append(i)
        idx = np.asarray(keep, dtype=np.int64)
        yield _Rows(
            shard=shard,
            positions=positions[idx],
            keys=[keys[i] for i in keep],
            hashes=[hashes[i] for i in keep],
            sizes=part.column("size_bytes").to_numpy()[idx],
            parts=tuple(dict.fromkeys(str(p) for p in part.column("part").to_pylist())),
            listed_bytes=int(pc.sum(part.column("size_bytes")).as_py() or 0),
        )


class _Formats:
    """The installed shard formats, loaded once, recognised by their first and last bytes."""

    def __init__(self) -> None:
        from simstore.ingest import installed_shard_formats

        self.formats: list[ShardFormat] = installed_shard_formats()

    def open(self, path: str) -> ShardReader:
        from simstore.ingest import probe_shard, sniffed_format

        fmt = sniffed_format(self.formats, *probe_shard(path))
        if fmt is None:
            names = ", ".join(f.name for f in self.formats)
            raise SimstoreError(f"not a shard of any installed format ({names})")
        return fmt.open(path)


def _check_shard(
    cat: Any, rows: _Rows, formats: _Formats, tmp: str
) -> ShardCheck:
    check = ShardCheck(shard=rows.shard, rows=len(rows.keys), parts=rows.parts,
                       bytes_read=rows.listed_bytes)
    path = cat.store.local_path(object_key(rows.shard))
    fetched = None
    try:
        if path is None:
            path = fetched = os.path.join(tmp, rows.shard)
            with open(fetched, "wb") as sink:
                actual, size = hash_object(cat, rows.shard, sink)
            check.bytes_hashed = size
            if actual != rows.shard:
                check.error = f"has hash {actual}, expected {rows.shard}"
                return check
        reader = formats.open(path)
        try:
            _compare(reader, rows, check)
        finally:
            reader.close()
    except SimstoreError as exc:
        check.error = f"cannot be read: {exc}"
    except (OSError, ValueError, TypeError, KeyError, IndexError, MemoryError) as exc:
        check.error = f"cannot be read: {type(exc).__name__}: {' '.join(str(exc).split())}"
    finally:
        if fetched is not None and os.path.exists(fetched):
            os.unlink(fetched)
    return check


def _compare(reader: ShardReader, rows: _Rows, check: ShardCheck) -> None:
    from simstore.ingest import hash_sample_blocks

    found: list[SampleMismatch] = []
    bad: set[int] = set()  # row indices: a row wrong in key and content counts once

    def mismatch(i: int, m: SampleMismatch) -> None:
        bad.add(i)
        found.append(m)

    count = getattr(reader, "num_samples", None)
    if count is not None and len(rows.positions) and int(rows.positions[-1]) >= int(count):
        check.error = (
            f"the manifest names position {int(rows.positions[-1])}, the shard holds "
            f"{int(count)} samples"
        )
        return
    keys_of = getattr(reader, "keys", None)
    if callable(keys_of):
        stored = keys_of()
        for i, (pos, key) in enumerate(zip(rows.positions.tolist(), rows.keys, strict=True)):
            if pos >= len(stored):
                check.error = (
                    f"the manifest names position {pos}, the shard holds {len(stored)} keys"
                )
                return
            if stored[pos] != key:
                mismatch(i, SampleMismatch(pos, key, "key", str(stored[pos])))
    for lo, hi in _batches(rows.sizes):
        positions = rows.positions[lo:hi].tolist()
        for i, fields in enumerate(reader.read(positions), start=lo):
            digest = hash_sample_blocks(Sample(rows.keys[i], dict(fields)))
            check.checked += 1
            if bytes.fromhex(digest) != rows.hashes[i]:
                mismatch(i, SampleMismatch(int(rows.positions[i]), rows.keys[i], "content",
                                           digest, rows.hashes[i].hex()))
    check.mismatch_count = len(bad)
    check.mismatches = tuple(sorted(found, key=lambda m: m.position)[:_SHOWN])


def _batches(sizes: np.ndarray) -> Iterator[tuple[int, int]]:
    """``[lo, hi)`` runs of rows of at most ``_BATCH_BYTES`` logical bytes (at least one row)."""
    lo = 0
    n = len(sizes)
    while lo < n:
        hi = lo + 1
        total = int(sizes[lo])
        while hi < n and hi - lo < _BATCH_ROWS and total + int(sizes[hi]) <= _BATCH_BYTES:
            total += int(sizes[hi])
            hi += 1
        yield lo, hi
        lo = hi
