"""Manifests: one row per sample, sorted by key, cut into content-defined Parquet parts. Pure.

A row is ``(key, sample_hash, shard, position, size_bytes)``: the sample's key, its content
hash (16 raw bytes), the id of the shard holding it, its row position inside that shard
and its logical size in bytes.

Rows are sorted by key and cut into parts at content-defined boundaries: a part ends after
a row whose mixed sample hash is divisible by ``target_rows``, provided the part then holds
at least ``target_rows // 4`` rows, or when it reaches ``4 * target_rows`` rows. The cut
depends only on the rows, so a change to a few samples rewrites only the parts around
them, and two snapshots that share most samples share most part objects. That is what
lets ``diff`` and ``commit`` cost grow with the change rather than with the dataset.

Parts are Parquet with fixed writer settings, so equal rows give equal bytes.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TypedDict

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from simstore.errors import FormatError, version_error
from simstore.hashing import Hasher, ObjectId, hash_bytes, is_object_id

__all__ = [
    "DEFAULT_TARGET_ROWS",
    "MANIFEST_FORMAT_VERSION",
    "MANIFEST_SCHEMA",
    "ManifestRow",
    "PartCutter",
    "PartRef",
    "PartRefJSON",
    "content_digest",
    "decode_part",
    "empty_rows",
    "part_ref",
    "encode_part",
    "rows_from_list",
    "rows_to_list",
    "sort_rows",
]

MANIFEST_FORMAT_VERSION = 1
DEFAULT_TARGET_ROWS = 8192

MANIFEST_SCHEMA = pa.schema(
    [
        pa.field("key", pa.string(), nullable=False),
        pa.field("sample_hash", pa.binary(16), nullable=False),
        pa.field("shard", pa.string(), nullable=False),
        pa.field("position", pa.int64(), nullable=False),
        pa.field("size_bytes", pa.int64(), nullable=False),
    ],
    metadata={b"simstore.kind": b"manifest-part", b"simstore.format_version": b"1"},
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ManifestRow:
    """One sample's entry in a manifest."""

    key: str
    sample_hash: str
    shard: str
    position: int
    size_bytes: int


class PartRefJSON(TypedDict):
    """JSON shape of a :class:`PartRef` inside a snapshot."""

    id: str
    rows: int
    size_bytes: int
    sample_bytes: int
    first_key: str
    last_key: str
    content: str


@dataclass(frozen=True, slots=True, kw_only=True)
class PartRef:
    """A manifest part as a snapshot lists it.

    ``id`` names the part object; ``content`` is a digest of only its keys and sample
    hashes (not shard or position), so equal content written differently compares equal.
    """

    id: ObjectId
    rows: int
    size_bytes: int
    sample_bytes: int
    first_key: str
    last_key: str
    content: str

    def to_json(self) -> PartRefJSON:
        """The JSON shape."""
        return {
            "id": self.id,
            "rows": self.rows,
            "size_bytes": self.size_bytes,
            "sample_bytes": self.sample_bytes,
            "first_key": self.first_key,
            "last_key": self.last_key,
            "content": self.content,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, object]) -> PartRef:
        """Parse the JSON shape; raise :class:`FormatError` when malformed.

        Ids must be object ids and counts non-negative integers: a part entry names keys
        in the store, so nothing else may reach ``objects/``.
        """
        try:
            part_id, content = obj["id"], obj["content"]
            if not (isinstance(part_id, str) and is_object_id(part_id)):
                raise ValueError(f"id {part_id!r} is not an object id")
            if not (isinstance(content, str) and is_object_id(content)):
                raise ValueError(f"content {content!r} is not a digest")
            counts = {name: obj[name] for name in ("rows", "size_bytes", "sample_bytes")}
            for name, value in counts.items():
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise ValueError(f"{name} {value!r} is not a non-negative integer")
            first, last = obj["first_key"], obj["last_key"]
            if not (isinstance(first, str) and isinstance(last, str)):
                raise ValueError("first_key and last_key must be strings")
            return cls(
                id=ObjectId(part_id),
                rows=int(counts["rows"]),  # type: ignore[call-overload]
                size_bytes=int(counts["size_bytes"]),  # type: ignore[call-overload]
                sample_bytes=int(counts["sample_bytes"]),  # type: ignore[call-overload]
                first_key=first,
                last_key=last,
                content=content,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise FormatError(f"invalid manifest part entry: {exc}") from exc


def empty_rows() -> pa.Table:
    """A manifest table with no rows."""
    return MANIFEST_SCHEMA.empty_table()


def rows_from_list(rows: Iterable[ManifestRow]) -> pa.Table:
    """Build a manifest table from rows (not sorted)."""
    rows = list(rows)
    return pa.table(
        {
            "key": pa.array([r.key for r in rows], pa.string()),
            "sample_hash": pa.array([bytes.fromhex(r.sample_hash) for r in rows], pa.binary(16)),
            "shard": pa.array([r.shard for r in rows], pa.string()),
            "position": pa.array([r.position for r in rows], pa.int64()),
            "size_bytes": pa.array([r.size_bytes for r in rows], pa.int64()),
        },
        schema=MANIFEST_SCHEMA,
    )


def rows_to_list(table: pa.Table) -> list[ManifestRow]:
    """The rows of a manifest table as :class:`ManifestRow` values."""
    cols = table.to_pydict()
    return [
        ManifestRow(key=k, sample_hash=h.hex(), shard=s, position=p, size_bytes=b)
        for k, h, s, p, b in zip(
            cols["key"],
            cols["sample_hash"],
            cols["shard"],
            cols["position"],
            cols["size_bytes"],
            strict=True,
        )
    ]


def sort_rows(table: pa.Table) -> pa.Table:
    """Sort a manifest table by key (byte order of UTF-8, which is code point order)."""
    if table.num_rows <= 1:
        return table
    return table.sort_by([("key", "ascending")])


def encode_part(table: pa.Table) -> bytes:
    """Encode a sorted manifest table as one part's Parquet bytes (deterministic)."""
    table = table.cast(MANIFEST_SCHEMA)
    buf = io.BytesIO()
    pq.write_table(
        table,
        buf,
        compression="zstd",
        compression_level=3,
        use_dictionary=["shard"],
        write_statistics=["key"],
        row_group_size=max(1, table.num_rows),
    )
    return buf.getvalue()


def decode_part(
    data: bytes, *, object_id: str = "", columns: Iterable[str] | None = None
) -> pa.Table:
    """Decode one part's bytes; raise :class:`FormatError` naming the object when bad.

    ``columns``: only these (of :data:`MANIFEST_SCHEMA`), for a reader that needs no
    more (the loader's stream reads four); ``shard`` then comes back dictionary-encoded,
    as it is stored, its values made once per distinct shard rather than once per row
    (two parts of 6,144 rows decoded and combined in 5-6 ms against 16-21 whole, in a
    new process). The rows are checked as for the whole part, on the columns read.
    """
    name = f"manifest part {object_id}" if object_id else "manifest part"
    names = MANIFEST_SCHEMA.names if columns is None else list(columns)
    unknown = [c for c in names if c not in MANIFEST_SCHEMA.names]
    if unknown:
        raise ValueError(f"manifest parts have no column {unknown[0]!r}")
    as_dictionary = ["shard"] if columns is not None and "shard" in names else None
    try:
        # ParquetFile, not read_table: no dataset machinery (pyarrow.dataset's import
        # alone costs more than decoding a part); on the calling thread: starting Arrow's
        # thread pool cost a fresh process's first read up to 17 ms, for parts of
        # thousands of rows that decode in a few milliseconds
        pf = pq.ParquetFile(pa.BufferReader(data), read_dictionary=as_dictionary)
        meta = pf.schema_arrow.metadata or {}
        if meta.get(b"simstore.kind") != b"manifest-part":  # (not caught below)
            raise FormatError(f"{name} is not a simstore manifest part")
        version = meta.get(b"simstore.format_version", b"?").decode(errors="replace")
        if version != str(MANIFEST_FORMAT_VERSION):
            found = int(version) if version.isascii() and version.isdecimal() else version
            raise version_error(f"{name} has", found, MANIFEST_FORMAT_VERSION)
        table = pf.read(columns=names, use_threads=False)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise FormatError(f"{name} is not a readable Parquet file: {exc}") from exc
    for column in names:
        # every column is required; a null would fail the cast below with a bare error
        if column in table.column_names and table.column(column).null_count:
            raise FormatError(f"{name} has a null {column}")
    try:
        wanted = pa.schema([_read_type(MANIFEST_SCHEMA.field(c), as_dictionary)
                            for c in names], metadata=MANIFEST_SCHEMA.metadata)
        table = table.select(names).cast(wanted)
    except (pa.ArrowException, KeyError) as exc:
        raise FormatError(f"{name} has unexpected columns: {exc}") from exc
    try:
        # Parquet readers do not check that strings are UTF-8: a damaged key would surface
        # later as a UnicodeDecodeError far from the part that holds it
        table.validate(full=True)
    except pa.ArrowException as exc:
        raise FormatError(f"{name} holds invalid values: {exc}") from exc
    problem = _row_problem(table)
    if problem:
        raise FormatError(f"{name} {problem}")
    return table


def _read_type(field: pa.Field, as_dictionary: list[str] | None) -> pa.Field:
    """``field`` as :func:`decode_part` returns it (``shard`` maybe dictionary-encoded)."""
    if as_dictionary and field.name in as_dictionary:
        return field.with_type(pa.dictionary(pa.int32(), field.type))
    return field


def _row_problem(table: pa.Table) -> str:
    """What makes these rows unusable, or ``""``.

    Keys must increase strictly, shard ids be object ids, positions and sizes be
    non-negative (readers index shards with them).
    """
    n = table.num_rows
    if n == 0:
        return ""
    names = table.column_names
    keys = table.column("key") if "key" in names else None
    if keys is not None and n > 1 and not pc.all(
            pc.greater(keys.slice(1), keys.slice(0, n - 1))).as_py():
        return "has keys out of order or repeated"
    if "shard" in names:
        column = table.column("shard")
        if pa.types.is_dictionary(column.type):
            # the ids used: a dictionary may hold more values than its rows use
            column = column.unify_dictionaries().combine_chunks()
            shards = column.dictionary.take(pc.unique(column.indices))
        else:
            shards = pc.unique(column)
        bad = pc.invert(pc.match_substring_regex(shards, r"^[0-9a-f]{32}$"))
        if pc.any(bad).as_py():
            return f"names an invalid shard id {shards.filter(bad)[0].as_py()!r}"
    for column in ("position", "size_bytes"):
        if column in names and pc.min(table.column(column)).as_py() < 0:
            return f"has a negative {column}"
    return ""


def _boundaries(hashes: pa.Array | pa.ChunkedArray, target_rows: int) -> np.ndarray:
    """Positions (0-based) of rows after which a content-defined cut falls."""
    if isinstance(hashes, pa.ChunkedArray):
        hashes = hashes.combine_chunks()
    n = len(hashes)
    if n == 0:
        return np.empty(0, dtype=np.int64)
    buf = hashes.buffers()[1]
    raw = np.frombuffer(buf, dtype=np.uint8, count=16 * (n + hashes.offset))
    words = np.ascontiguousarray(raw[16 * hashes.offset :]).view("<u8").reshape(n, 2)
    # mix both halves with a 64-bit finaliser so structured hashes still cut evenly
    x = words[:, 0] ^ words[:, 1]
    s33 = np.uint64(33)
    with np.errstate(over="ignore"):
        x = x ^ (x >> s33)
        x = x * np.uint64(0xFF51AFD7ED558CCD)
        x = x ^ (x >> s33)
        x = x * np.uint64(0xC4CEB9FE1A85EC53)
        x = x ^ (x >> s33)
    return np.flatnonzero(x % np.uint64(target_rows) == 0)


class PartCutter:
    """Cuts a stream of sorted manifest rows into parts; feed tables, then ``finish``.

    The cut depends only on the rows fed, and ``is_clean`` tells whether the cutter sits on
    a part boundary (nothing pending), which is when a caller may splice in a parent part
    verbatim and get the same result as recomputing it.
    """

    def __init__(self, target_rows: int = DEFAULT_TARGET_ROWS) -> None:
        if target_rows < 1:
            raise ValueError("target_rows must be at least 1")
        self.target_rows = target_rows
        self.max_rows = 4 * target_rows
        self.min_rows = max(1, target_rows // 4)
        self._pending: list[pa.Table] = []
        self._pending_rows = 0

    @property
    def is_clean(self) -> bool:
        """Whether no rows are pending (the next row starts a new part)."""
        return self._pending_rows == 0

    def feed(self, table: pa.Table) -> Iterator[pa.Table]:
        """Add sorted rows; yield each part that is complete."""
        start = 0
        n = table.num_rows
        cuts = _boundaries(table.column("sample_hash"), self.target_rows)
        ci = 0
        while start < n:
            room = self.max_rows - self._pending_rows
            # the first natural cut that leaves a part of at least min_rows
            need = start + max(0, self.min_rows - self._pending_rows - 1)
            while ci < len(cuts) and cuts[ci] < need:
                ci += 1
            end = int(cuts[ci]) + 1 if ci < len(cuts) else n + 1
            if end - start > room:
                end = start + room
            if end <= n:
                self._pending.append(table.slice(start, end - start))
                start = end
                yield self._flush()
            else:
                self._pending.append(table.slice(start))
                self._pending_rows += n - start
                start = n

    def finish(self) -> Iterator[pa.Table]:
        """Yield the last, partial part, if any."""
        if self._pending_rows or self._pending:
            part = self._flush()
            if part.num_rows:
                yield part

    def _flush(self) -> pa.Table:
        part = pa.concat_tables(self._pending) if len(self._pending) != 1 else self._pending[0]
        self._pending = []
        self._pending_rows = 0
        return part.combine_chunks()


def content_digest(table: pa.Table) -> str:
    """Digest of a manifest table's keys and sample hashes only (vectorised)."""
    keys = table.column("key").combine_chunks()
    hashes = table.column("sample_hash").combine_chunks()
    n = len(keys)
    h = Hasher()
    h.update(b"simstore-manifest-content-v1")
    if n:
        offsets = np.frombuffer(keys.buffers()[1], dtype=np.int32)[
            keys.offset : keys.offset + n + 1
        ]
        data = keys.buffers()[2]
        h.update((offsets - offsets[0]).astype("<i8").tobytes())
        h.update(memoryview(data)[int(offsets[0]) : int(offsets[-1])])
        raw = memoryview(hashes.buffers()[1])[16 * hashes.offset : 16 * (hashes.offset + n)]
        h.update(raw)
    return h.hexdigest()


def part_ref(table: pa.Table, data: bytes) -> PartRef:
    """The :class:`PartRef` of an encoded part."""
    keys = table.column("key")
    return PartRef(
        content=content_digest(table),
        id=hash_bytes(data),
        rows=table.num_rows,
        size_bytes=len(data),
        sample_bytes=int(pc.sum(table.column("size_bytes")).as_py() or 0),
        first_key=str(keys[0].as_py()),
        last_key=str(keys[-1].as_py()),
    )
