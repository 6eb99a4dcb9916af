"""A manifest part's stream rows as plain arrays, and a node-local cache of them.

The loader needs four columns of a manifest part (key, shard, position, size) as NumPy
arrays. Decoding them from the part's Parquet bytes is most of a new process's wait for
its first batch's rows (Arrow's first Parquet read in a process: 2-3 ms for two parts of
6,144 rows, where their arrays load from a flat file in 0.4 ms). A part is immutable and
named by its content hash, so its decoded rows are too: :class:`PartRowsCache` keeps them
in a private folder of the node (beside the shard hash records, see
``simstore._verified``), and a later job on the node loads them without reading or
decoding the part.

An entry is one file, ``<part id>.rows``: a magic, an xxh3-64 checksum of the rest, a
JSON header (format version, part id, rows, the part's shard ids), then the arrays, each
8-byte aligned. An entry that does not check out (damaged, cut short, another part's,
another version) is a miss and is written again; the folder is a cache, held under a
byte limit by evicting the entries used longest ago.
"""

from __future__ import annotations

import bisect
import json
import os
import struct
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash
from simstore.loaders._nodecache import NodeCache

from simstore._verified import records_dir

__all__ = ["DEFAULT_ROWS_CACHE_BYTES", "PartRows", "PartRowsCache", "part_rows_cache"]

_MAGIC = b"SIMROWS\x00"
_VERSION = 1
_HEAD = struct.Struct("<8sQI")  # magic, xxh3-64 of everything after this, header length

DEFAULT_ROWS_CACHE_BYTES = 1 << 30
"""The cache's byte limit: 1 GiB holds the rows of about 3,000 parts of 8,192 rows."""

_ARRAYS = (("key_offsets", "<i8", 1), ("position", "<i8", 0), ("size_bytes", "<i8", 0),
           ("shard", "<i4", 0))
"""An entry's arrays after its header, in order: field, stored type, items past ``rows``
(each padded to 8 bytes; the keys' bytes follow them)."""


def _aligned(n: int) -> int:
    return (n + 7) & ~7


@dataclass(frozen=True, slots=True, eq=False)
class PartRows:
    """One manifest part's stream columns, in the part's (key) order.

    ``key_offsets`` (``rows + 1`` int64) and ``key_data``: the keys as UTF-8, key ``i``
    at ``key_data[key_offsets[i]:key_offsets[i + 1]]``. ``shard``: each row's shard as
    an index into ``shard_ids``, numbered in order of first appearance in the rows.
    """

    key_offsets: np.ndarray
    key_data: bytes
    shard_ids: tuple[str, ...]
    shard: np.ndarray
    position: np.ndarray
    size_bytes: np.ndarray

    def __len__(self) -> int:
        return len(self.position)

    @classmethod
    def from_table(cls, table: pa.Table) -> PartRows:
        """The rows of a decoded part (``decode_part``'s stream columns)."""
        # the keys' own buffers, no cast: an Arrow kernel's first call in a process costs
        # more than a part's rows (a node's first job decodes its parts)
        column = table.column("key")
        keys = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
        # string (decode_part's type) or large_string: offsets of 32 or 64 bits
        width = np.int64 if pa.types.is_large_string(keys.type) else np.int32
        buffers = keys.buffers()
        offsets = np.frombuffer(buffers[1], dtype=width)[
            keys.offset:keys.offset + len(keys) + 1].astype(np.int64)
        data = buffers[2]
        start, end = int(offsets[0]), int(offsets[-1])
        ids, codes = shard_codes(table.column("shard"))
        return cls(
            key_offsets=offsets - start,
            key_data=bytes(memoryview(data)[start:end]) if data is not None else b"",
            shard_ids=ids,
            shard=codes.astype(np.int32),
            position=np.asarray(table.column("position").to_numpy(), dtype=np.int64),
            size_bytes=np.asarray(table.column("size_bytes").to_numpy(), dtype=np.int64),
        )

    def key(self, i: int) -> str:
        """Row ``i``'s key."""
        return self._key_bytes(i).decode()

    def _key_bytes(self, i: int) -> bytes:
        return self.key_data[int(self.key_offsets[i]):int(self.key_offsets[i + 1])]

    def find(self, key: str) -> int | None:
        """The row of ``key`` (rows are in key order, compared as UTF-8 bytes), or None."""
        want = key.encode()
        i = bisect.bisect_left(range(len(self)), want, key=self._key_bytes)
        return i if i < len(self) and self._key_bytes(i) == want else None

    def to_bytes(self, part_id: str) -> bytes:
        """The cache entry of these rows (see the module's note)."""
        n = len(self)
        header = json.dumps({"version": _VERSION, "part": part_id, "rows": n,
                             "key_bytes": len(self.key_data),
                             "shards": list(self.shard_ids)},
                            separators=(",", ":")).encode()
        header += b" " * (_aligned(_HEAD.size + len(header)) - _HEAD.size - len(header))
        arrays = []
        for name, dtype, _ in _ARRAYS:
            raw = np.ascontiguousarray(getattr(self, name), dtype=dtype).tobytes()
            arrays.append(raw + b"\0" * (_aligned(len(raw)) - len(raw)))
        body = b"".join((header, *arrays, self.key_data))
        return _HEAD.pack(_MAGIC, xxhash.xxh3_64_intdigest(body), len(header)) + body

    @classmethod
    def from_bytes(cls, data: bytes, part_id: str, rows: int) -> PartRows:
        """Rows from a cache entry; ValueError when it is not part ``part_id``'s ``rows``."""
        if len(data) < _HEAD.size:
            raise ValueError("shorter than its header")
        magic, checksum, head = _HEAD.unpack_from(data)
        if magic != _MAGIC:
            raise ValueError("not a rows entry")
        body = memoryview(data)[_HEAD.size:]
        if xxhash.xxh3_64_intdigest(body) != checksum:
            raise ValueError("checksum mismatch")
        try:
            meta = json.loads(bytes(body[:head]))
            version, part, n = meta["version"], meta["part"], meta["rows"]
            key_bytes, shards = meta["key_bytes"], meta["shards"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"bad header: {exc}") from None
        if version != _VERSION or part != part_id or n != rows:
            raise ValueError(f"holds {part!r} v{version} of {n} rows")
        if not (isinstance(key_bytes, int) and isinstance(shards, list)
                and all(isinstance(s, str) for s in shards)):
            raise ValueError("bad header")
        at = _HEAD.size + head
        counts = [n + extra for _, _, extra in _ARRAYS]
        spans = [_aligned(count * np.dtype(dtype).itemsize)
                 for count, (_, dtype, _) in zip(counts, _ARRAYS, strict=True)]
        if len(data) != at + sum(spans) + key_bytes:
            raise ValueError("wrong length")
        arrays = {}
        for count, span, (name, dtype, _) in zip(counts, spans, _ARRAYS, strict=True):
            arrays[name] = np.frombuffer(data, dtype=dtype, count=count, offset=at)
            at += span
        offsets, position = arrays["key_offsets"], arrays["position"]
        size_bytes, shard = arrays["size_bytes"], arrays["shard"]
        if (offsets[0] != 0 or offsets[-1] != key_bytes or (np.diff(offsets) < 0).any()
                or (n and (shard.min() < 0 or shard.max() >= len(shards)))
                or (n and (position.min() < 0 or size_bytes.min() < 0))):
            raise ValueError("inconsistent arrays")
        return cls(key_offsets=offsets, key_data=data[at:], shard_ids=tuple(shards),
                   shard=shard, position=position, size_bytes=size_bytes)


def shard_codes(column: pa.ChunkedArray) -> tuple[tuple[str, ...], np.ndarray]:
    """``(shard ids, each row's code)``, coded in order of first appearance in the rows.

    The order is part of the stream: ``group_order`` numbers a group's pieces by their
    codes. A part's dictionary is already in that order (a Parquet writer adds values
    as it meets them), but unifying dictionaries need not keep it, nor a dictionary that
    holds values no row uses; so the codes are renumbered here, in O(rows): the first row
    of each code found, and the codes ranked by it.
    """
    if not pa.types.is_dictionary(column.type):
        column = pc.dictionary_encode(column)
    if column.num_chunks == 1:  # a part of one row group: its dictionary as it is
        combined = column.chunk(0)
    else:
        column = column.unify_dictionaries()
        combined = column.combine_chunks()
    indices = np.asarray(combined.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
    m = len(combined.dictionary)
    n = len(indices)
    first = np.full(m, n, dtype=np.int64)
    np.minimum.at(first, indices, np.arange(n, dtype=np.int64))
    used = np.flatnonzero(first < n)
    used = used[np.argsort(first[used], kind="stable")]
    rank = np.empty(m, dtype=np.int64)
    rank[used] = np.arange(len(used), dtype=np.int64)
    values = combined.dictionary.to_pylist()  # one per shard the part names
    return tuple(values[i] for i in used.tolist()), rank[indices]


def combine(parts: list[PartRows]) -> PartRows:
    """Parts' rows one after another, the shards coded in order of first appearance.

    Each part's ids are in order of their first row in the part, so taking the parts in
    order and each part's ids in order meets every id at its first row overall.
    """
    if len(parts) == 1:
        return parts[0]
    codes: dict[str, int] = {}
    recoded = []
    for p in parts:
        mapping = np.fromiter((codes.setdefault(s, len(codes)) for s in p.shard_ids),
                              dtype=np.int32, count=len(p.shard_ids))
        recoded.append(mapping[p.shard])
    offsets = [parts[0].key_offsets[:-1]]
    base = int(parts[0].key_offsets[-1])
    for p in parts[1:]:
        offsets.append(p.key_offsets[:-1] + base)
        base += int(p.key_offsets[-1])
    offsets.append(np.array([base], dtype=np.int64))
    return PartRows(
        key_offsets=np.concatenate(offsets),
        key_data=b"".join(p.key_data for p in parts),
        shard_ids=tuple(codes),
        shard=np.concatenate(recoded),
        position=np.concatenate([p.position for p in parts]),
        size_bytes=np.concatenate([p.size_bytes for p in parts]),
    )


class PartRowsCache(NodeCache):
    """Decoded manifest rows kept on this node for later jobs, under a byte limit.

    An entry decides which shards and byte ranges are read, so the folder is used only
    where it is this user's and writable by nobody else (see :class:`NodeCache`).
    """

    suffix = ".rows"
    unused = "manifest rows not cached"

    def __init__(self, root: str, limit_bytes: int = DEFAULT_ROWS_CACHE_BYTES) -> None:
        super().__init__(root, limit_bytes)

    def get(self, part_id: str, rows: int) -> PartRows | None:
        """The cached rows of ``part_id`` (``rows`` of them), or None."""
        data = self.read_entry(part_id)
        if data is None:
            return None
        try:
            return PartRows.from_bytes(data, part_id, rows)
        except ValueError:
            return None  # rewritten by the caller's put

    def put(self, part_id: str, rows: PartRows) -> bool:
        """Keep ``rows`` for later jobs; False when it cannot (a full or read-only disk)."""
        if not self.usable():
            return False
        return self.write_entry(part_id, rows.to_bytes(part_id))

    def keep_table(self, part_id: str, table: pa.Table) -> bool:
        """Keep the stream rows of a decoded part that has just hashed to ``part_id``.

        For ``simstore verify --deep``, which decodes every part it checks: a later job on
        the node then loads them as it would after reading the part itself. False
        (nothing kept) where the folder is not usable, the table is not a part's stream
        columns, or it cannot be written.
        """
        if not self.usable():
            return False
        try:
            rows = PartRows.from_table(table)
        except (KeyError, ValueError, pa.ArrowException):  # not a part's stream columns
            return False
        return self.put(part_id, rows)


def part_rows_cache() -> PartRowsCache | None:
    """The node's cache of decoded manifest rows, None where there is none.

    ``rows/`` in the shard records' folder (``$SIMSTORE_VERIFIED_DIR``; set empty: none).
    """
    root = records_dir()
    return PartRowsCache(os.path.join(root, "rows")) if root is not None else None
